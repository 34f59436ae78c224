/*
 * replica.c - copies of a server's async and SSP keys, and of its
 * compressed keys' error feedback, on a backup server
 * (UNISUM_REPLICAS=1), so that a lost server's keys move with every
 * acknowledged update kept (issue 52).  A compressed key's versions are
 * its rounds (srv_copy_encoded; ARCHITECTURE section 5): a reply of
 * round r waits for the feedback after round r - 1, and the new home
 * sums a round the copy lacks again from the workers' kept pushes.
 *
 * DESIGN.  The backup of server s is the next server by rank that s has
 * not lost (a replacement never is one); the scheduler moves a lost
 * server's async and SSP keys to that same server (sched_failover).  A
 * thread of s's own dials it (srv_backup_main: a dial blocks, and a loop
 * must not), sends a hello, and hands the connection (a "link") to one
 * of s's loops; when the link closes, that backup is lost for good and
 * the thread dials the next.
 *
 * Consistency rule: a pull's reply is sent only once the backup holds a
 * version of the value with the puller's push before its last in it; the
 * worker keeps its last push answered (wk_keep_push) until the next
 * reply, and sends it again to the new home after a failover (RESTORE).
 * So every update a worker saw answered is on two servers or in its own
 * memory; one it did not see answered is re-pushed too (its operation
 * did not end), and the new home drops a re-push its copy already holds
 * (k->base): every update is in the value exactly once.  Each push makes
 * a new version (k->ver); the key's engine sends the newest to the
 * backup after aggregation (a COPY: the value and, for each contributor,
 * how many of its pushes the value holds), one at a time per key, and
 * the backup answers COPY_ACK.  A version goes when a reply waits for it
 * (rare: the one it needs is a step old), or half a step after the first
 * push the backup lacks (srv_copy_due_ms: a step is contributor 0's time
 * between pushes), so that one COPY covers every worker's push of the
 * step, sent while they compute (OSDI'14's replication after
 * aggregation: async has no rounds to aggregate, so time does).
 *
 * The backup keeps each key's newest COPY (srv->copies, under srv->lock)
 * until the failover's first DECLARE_CHECK of the key here takes it; the
 * key's engine installs it before its first event.  A worker whose
 * declaration says it had more pushes answered than the copy holds (the
 * backup was lost too, or was still catching up) fails the job, naming
 * the key (key.c).  When the backup changes, every key's state is sent
 * to the new one (COPY_AGAIN) while training goes on; its replies wait
 * for that copy.  With no server left to be a backup, replies go at once.
 * A backup whose link from a primary closes with no FAILOVER of that
 * primary within the timeout (it lives: a network's blip) drops its
 * copies, stale from then on (srv_backup_chores).
 */
#include <endian.h>
#include <pthread.h>
#include <sys/prctl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log/log.h"
#include "server/srv_int.h"
#include "timing/timing.h"
#include "transport/transport.h"
#include "wire/wire.h"

#define SRV_BACKUP_DIAL_MS 2000	/* one dial of a backup at most */

/* ---- the primary's side: the link ---------------------------------------- */

/* A COPY on its way: its payload is owned, freed once sent or dropped. */
struct srv_copy_msg {
	struct loop_conn_msg msg;
	uint8_t *data;
};

static void srv_copy_msg_release(struct loop_conn_msg *m)
{
	struct srv_copy_msg *cm = (struct srv_copy_msg *)m;	/* msg is its first member */
	free(cm->data);
	free(cm);
}

/* Posts COPY_AGAIN for link gen to every async key (the backup changed). */
static void srv_copy_again_all(struct server *srv, uint32_t gen)
{
	pthread_mutex_lock(&srv->lock);
	for (size_t i = 0; i < srv->nbuckets; i++)
		for (struct srv_key *k = srv->buckets[i]; k; k = k->next)
			if (srv_key_replicated(srv, k) && srv_post(srv, EVENT_COPY_AGAIN, k, (int)gen, 0, false, 0,
						       NULL) != 0)
				LOG_ERROR("out of memory: key 0x%llx is not copied to the new backup",
					  (unsigned long long)k->key);
	pthread_mutex_unlock(&srv->lock);
}

/* A COPY_ACK on link L: the key's engine hears of it (a key gone since
 * is no longer in the table: dropped). */
static int srv_link_msg(struct loop_conn *lc, const struct wire_hdr *h, void *payload, char *why,
			size_t len)
{
	(void)payload;
	struct srv_link *L = loop_conn_arg(lc);
	struct server *srv = L->srv;
	if (h->type != WIRE_COPY_ACK) {
		snprintf(why, len, "unexpected %s from backup server %d", wire_type_name(h->type),
			 L->rank);
		return UNISUM_EPROTO;
	}
	pthread_mutex_lock(&srv->lock);
	struct srv_key *k = srv_key_find(srv, h->key);
	int rc = k != NULL && srv_key_replicated(srv, k)
			 ? srv_post(srv, EVENT_COPY_HELD, k, (int)L->gen, h->round, false, 0, NULL)
			 : 0;
	pthread_mutex_unlock(&srv->lock);
	if (rc != 0)
		snprintf(why, len, "out of memory");
	return rc;
}

/* The link closed: that backup is lost for good; the thread dials the
 * next (unless the job is ending). */
static void srv_link_closed(struct loop_conn *lc, int rc, const char *why)
{
	struct srv_link *L = loop_conn_arg(lc);
	struct server *srv = L->srv;
	struct srv_backup *b = &srv->backup;
	bool stopping = atomic_load(&srv->stopping);
	pthread_mutex_lock(&b->lock);
	if (b->lc == lc) {
		b->dead[L->rank] = 1;
		b->lc = NULL;
		b->state = BACKUP_DIALING;
		b->want = !stopping;
		pthread_cond_signal(&b->cond);
	}
	pthread_mutex_unlock(&b->lock);
	/* (INFO: the scheduler names a lost server; a job's end closes
	 * links too.) */
	if (!stopping)
		LOG_INFO("server %d lost its backup, server %d (%s): the next server gets its copies",
			 srv->rank, L->rank, rc == UNISUM_ECONN ? "connection closed" : why);
}

static const struct loop_conn_ops srv_link_ops = {
	.on_message = srv_link_msg,
	.on_closed = srv_link_closed,
};

/* The next server after this one that it has not lost, or -1 (b->lock
 * held). */
static int srv_backup_pick(const struct server *srv)
{
	const struct srv_backup *b = &srv->backup;
	for (int i = 1; i < b->nservers; i++) {
		int r = (srv->rank + i) % b->nservers;
		if (!b->dead[r])
			return r;
	}
	return -1;
}

/* Dials server r and makes it the backup: 0, or an error (r is then
 * lost to this server). */
static int srv_backup_dial(struct server *srv, int r)
{
	struct srv_backup *b = &srv->backup;
	const struct rdv_node *n = rdv_client_server(srv->rdv, r);
	if (n == NULL)
		return UNISUM_EINVAL;
	struct tp_conn *conn = NULL;
	/* In short tries, so that a job that ends meanwhile (its servers
	 * refusing as they stop) does not hold this thread, and the
	 * server's stop, for the whole of SRV_BACKUP_DIAL_MS. */
	int64_t until = timing_now_ms() + SRV_BACKUP_DIAL_MS;
	int rc;
	log_hush(true);	/* the caller says what matters */
	while ((rc = transport_connect(srv->tp, n->host, n->port, 200, &conn)) == UNISUM_ECONN &&
	       timing_now_ms() < until && !atomic_load(&srv->stopping))
		usleep(50 * 1000);
	log_hush(false);
	if (rc != 0)
		return rc;
	struct srv_link *L = calloc(1, sizeof *L);
	if (L == NULL) {
		srv->tp->conn_free(conn);
		return UNISUM_ENOMEM;
	}
	L->srv = srv;
	L->rank = r;
	unsigned pick = atomic_fetch_add(&srv->next_loop, 1) % (unsigned)srv->pool.n;
	pthread_mutex_lock(&b->lock);
	L->gen = atomic_load(&b->gen) + 1;
	rc = loop_conn_new(srv->pool.loops[pick], srv->tp, conn, false, &srv_link_ops, L,
			   &L->lc);
	if (rc != 0) {
		pthread_mutex_unlock(&b->lock);
		srv->tp->conn_free(conn);
		free(L);
		return rc;
	}
	L->next = b->links;
	b->links = L;
	struct wire_hdr hello = {.type = WIRE_REGISTER, .sender = srv->id};
	/* A FAILOVER of r may have come while it was dialled. */
	rc = b->dead[r] ? UNISUM_ECONN : loop_conn_send(L->lc, &hello, NULL);
	if (rc != 0)
		loop_conn_shutdown(L->lc);
	if (rc == 0) {
		b->lc = L->lc;
		b->rank = r;
		b->state = BACKUP_UP;
		atomic_store(&b->gen, L->gen);
	}
	pthread_mutex_unlock(&b->lock);
	return rc;
}

/* Whether the job goes on after a backup was lost or refused (b->lock
 * held): at a job's end the servers that stop first close their links
 * and refuse dials, and a moment's wait tells (no word then). */
static bool srv_backup_going_on(struct server *srv)
{
	struct srv_backup *b = &srv->backup;
	struct timespec until = timing_deadline(200);
	while (!b->stop && pthread_cond_timedwait(&b->cond, &b->lock, &until) == 0)
		;
	return !b->stop && !atomic_load(&srv->stopping);
}

/* How long a primary's link may be closed before its copies here are
 * stale: the scheduler fails a lost server over within its timeout. */
static int64_t srv_stale_after_ms(const struct server *srv)
{
	return (int64_t)srv->cfg->timeout_ms + 2000;
}

/* Drops the copies of every primary whose link closed long enough ago
 * with no FAILOVER of it, and cuts the test's link when due; when the
 * next of these is due, or 0 (b->lock held, let go meanwhile). */
static int64_t srv_backup_chores(struct server *srv)
{
	struct srv_backup *b = &srv->backup;
	int64_t now = timing_now_ms(), next = 0;
	if (b->cut_at != 0 && now >= b->cut_at && b->state == BACKUP_UP) {
		LOG_WARN("UNISUM_TEST_CUT_BACKUP_MS: server %d cuts its link to its backup, server %d",
			 srv->rank, b->rank);
		loop_conn_shutdown(b->lc);
		b->cut_at = 0;
	}
	if (b->cut_at != 0)
		next = b->cut_at;
	for (int r = 0; r < b->nservers; r++) {
		int64_t due = b->gone_ms[r] != 0 ? b->gone_ms[r] + srv_stale_after_ms(srv) : 0;
		if (due == 0 || now < due) {
			next = due != 0 && (next == 0 || due < next) ? due : next;
			continue;
		}
		b->gone_ms[r] = 0;
		pthread_mutex_unlock(&b->lock);
		int n = srv_copies_drop_from(srv, (uint32_t)r);
		LOG_INFO("server %d dropped the %d copies of server %d: its link closed and it was "
			 "not failed over, so it lives and copies to another server (these are stale "
			 "from then on, and must not be taken over)", srv->rank, n, r);
		pthread_mutex_lock(&b->lock);
	}
	return next;
}

/* Waits until a backup is wanted or the thread stops, doing the chores
 * when due (b->lock held). */
static void srv_backup_wait(struct server *srv)
{
	struct srv_backup *b = &srv->backup;
	while (!b->stop && !b->want) {
		int64_t next = srv_backup_chores(srv);
		if (b->stop || b->want)
			break;
		if (next == 0) {
			pthread_cond_wait(&b->cond, &b->lock);
		} else {
			int64_t wait = next - timing_now_ms();
			struct timespec until = timing_deadline(wait > 0 ? (int)wait : 0);
			pthread_cond_timedwait(&b->cond, &b->lock, &until);
		}
	}
}

/* The backup's thread: dials the next backup whenever one is wanted. */
static void *srv_backup_main(void *arg)
{
	prctl(PR_SET_NAME, "unisum-backup"); /* for top -H, perf and gdb */
	struct server *srv = arg;
	struct srv_backup *b = &srv->backup;
	pthread_mutex_lock(&b->lock);
	for (;;) {
		srv_backup_wait(srv);
		if (b->stop)
			break;
		b->want = false;
		int r = srv_backup_pick(srv);
		pthread_mutex_unlock(&b->lock);
		int rc = r < 0 ? UNISUM_ECONN : srv_backup_dial(srv, r);
		pthread_mutex_lock(&b->lock);
		if (rc != 0 && r >= 0) {
			if (srv_backup_going_on(srv))
				LOG_WARN("server %d cannot reach server %d as its backup (%s): trying "
					 "the next", srv->rank, r, log_last_error());
			b->dead[r] = 1;
			b->want = true;
			continue;
		}
		if (r < 0) {
			b->state = BACKUP_NONE;
			atomic_fetch_add(&b->gen, 1);
		} else {
			LOG_INFO("server %d copies its async keys to server %d", srv->rank, r);
			if (b->cut_ms > 0) {	/* (tests only: once) */
				b->cut_at = timing_now_ms() + b->cut_ms;
				b->cut_ms = 0;
			}
		}
		uint32_t gen = atomic_load(&b->gen);
		pthread_mutex_unlock(&b->lock);
		srv_copy_again_all(srv, gen);
		pthread_mutex_lock(&b->lock);
		if (r < 0 && srv_backup_going_on(srv))
			LOG_WARN("server %d has no server left to copy its async keys to", srv->rank);
	}
	pthread_mutex_unlock(&b->lock);
	return NULL;
}

/* The scheduler failed server f->dead over (on the client's thread): no
 * backup again; if it is the backup now (alive but silent, or its link
 * would have closed), the link is cut and the next one dialled. */
static void srv_backup_on_failover(void *arg, const struct rdv_failover *f)
{
	struct server *srv = arg;
	struct srv_backup *b = &srv->backup;
	pthread_mutex_lock(&b->lock);
	if (f->dead >= 0 && f->dead < b->nservers) {
		b->failed[f->dead] = 1;	/* its copies here are its keys' now */
		b->gone_ms[f->dead] = 0;
		b->dead[f->dead] = 1;
		if (b->state == BACKUP_UP && b->rank == f->dead)
			loop_conn_shutdown(b->lc);
	}
	pthread_mutex_unlock(&b->lock);
}

int srv_backup_init(struct server *srv)
{
	struct srv_backup *b = &srv->backup;
	b->nservers = rdv_client_num_servers(srv->rdv);
	bool on = srv->cfg->replicas && srv->cfg->server_failover && !srv->cfg->elastic &&
		  b->nservers > 1;
	if (!on)
		return 0;
	b->dead = calloc((size_t)b->nservers, 1);
	b->failed = calloc((size_t)b->nservers, 1);
	b->gone_ms = calloc((size_t)b->nservers, sizeof *b->gone_ms);
	if (b->dead == NULL || b->failed == NULL || b->gone_ms == NULL) {
		free(b->dead);
		free(b->failed);
		free(b->gone_ms);
		b->dead = b->failed = NULL;
		b->gone_ms = NULL;
		return UNISUM_ENOMEM;
	}
	const char *cut = getenv("UNISUM_TEST_CUT_BACKUP_MS");
	b->cut_ms = cut != NULL ? atol(cut) : 0;
	b->dead[srv->rank] = 1;
	pthread_mutex_init(&b->lock, NULL);
	if (timing_cond_init(&b->cond) != 0) {	/* timed waits on the monotonic clock */
		pthread_mutex_destroy(&b->lock);
		free(b->dead);
		b->dead = NULL;
		return UNISUM_ENOMEM;
	}
	b->state = BACKUP_DIALING;
	b->want = true;
	b->inited = true;
	srv->replicate = true;
	rdv_client_on_failover(srv->rdv, srv_backup_on_failover, srv);
	return 0;
}

int srv_backup_start(struct server *srv)
{
	struct srv_backup *b = &srv->backup;
	if (!srv->replicate)
		return 0;
	int e = pthread_create(&b->thread, NULL, srv_backup_main, srv);
	if (e != 0)
		return e;
	b->started = true;
	return 0;
}

/* After the loops halted: the thread ends and the links are freed. */
void srv_backup_stop(struct server *srv)
{
	struct srv_backup *b = &srv->backup;
	if (b->started) {
		b->started = false;
		pthread_mutex_lock(&b->lock);
		b->stop = true;
		pthread_cond_signal(&b->cond);
		pthread_mutex_unlock(&b->lock);
		pthread_join(b->thread, NULL);
		pthread_mutex_lock(&b->lock);	/* the engines still run: no link from now on */
		b->state = BACKUP_NONE;
		b->lc = NULL;
		pthread_mutex_unlock(&b->lock);
	}
	while (b->links != NULL) {
		struct srv_link *L = b->links;
		b->links = L->next;
		loop_conn_free(L->lc);
		free(L);
	}
}

/* After the engines stopped. */
void srv_backup_free(struct server *srv)
{
	struct srv_backup *b = &srv->backup;
	if (b->inited) {
		pthread_mutex_destroy(&b->lock);
		pthread_cond_destroy(&b->cond);
		b->inited = false;
	}
	free(b->dead);
	free(b->failed);
	free(b->gone_ms);
	b->dead = b->failed = NULL;
	b->gone_ms = NULL;
	srv_copies_free(srv);
}

/* ---- the primary's side: a key's copies (its engine) --------------------- */

/* Key k's newest version as a COPY's payload into data (srv_copy_bytes
 * of it) and header h: an async key's value and clocks; a compressed
 * key's error feedback and the encoding of round ver - 1. */
static size_t srv_copy_bytes(const struct srv_key *k)
{
	if (k->server_held)
		return k->bytes + 4 * (size_t)k->nc;
	return k->bytes + (k->ver_zero ? 0 : k->wire_bytes);
}

static void srv_copy_fill(const struct server *srv, const struct srv_key *k, uint8_t *data,
			  struct wire_hdr *h)
{
	*h = (struct wire_hdr){.type = WIRE_COPY, .sender = srv->id, .round = k->ver,
			       .key = k->key, .count = k->count, .dtype = (uint8_t)k->dtype,
			       .payload_len = srv_copy_bytes(k)};
	if (!k->server_held) {
		memcpy(data, k->cstate.residual, k->bytes);
		if (!k->ver_zero)
			memcpy(data + k->bytes, k->slot[(k->ver - 1) & 1].enc, k->wire_bytes);
		h->flags = WIRE_FLAG_COMPRESSED;	/* no encoding after it: ZERO */
		return;
	}
	memcpy(data, k->value, k->bytes);
	for (int w = 0; w < k->nc; w++) {
		uint32_t have = htole32((k->first_seen[w] + k->clock[w]) |
					(k->gone[w] ? 0x80000000u : 0));
		memcpy(data + k->bytes + 4 * (size_t)w, &have, 4);
	}
	h->aux = (uint32_t)k->nc;
}

/* Sends key k's newest version to the backup, when the link is up
 * (false: it is not; a COPY_AGAIN will come). */
static bool srv_copy_send(struct server *srv, struct srv_key *k)
{
	struct srv_backup *b = &srv->backup;
	bool up = atomic_load(&b->state) == BACKUP_UP && atomic_load(&b->gen) == k->ver_gen;
	if (!up)	/* (checked again below, under the lock: it may go meanwhile) */
		return false;
	size_t bytes = srv_copy_bytes(k);
	struct srv_copy_msg *cm = malloc(sizeof *cm);
	uint8_t *data = malloc(bytes ? bytes : 1);
	if (cm == NULL || data == NULL) {
		free(cm);
		free(data);
		srv_out_of_memory(srv, "for a copy of a key for the backup");
		return false;
	}
	*cm = (struct srv_copy_msg){.data = data};
	srv_copy_fill(srv, k, data, &cm->msg.tx.hdr);
	cm->msg.tx.payload = data;
	cm->msg.release = srv_copy_msg_release;
	/* Sent under b->lock, so that srv_backup_stop cannot free the link
	 * meanwhile (a send never calls on_closed). */
	pthread_mutex_lock(&b->lock);
	up = b->state == BACKUP_UP && atomic_load(&b->gen) == k->ver_gen;
	if (up) {
		k->ver_sent = k->ver;
		loop_conn_send_msg(b->lc, &cm->msg);	/* a closed one releases it */
	}
	pthread_mutex_unlock(&b->lock);
	if (!up)
		srv_copy_msg_release(&cm->msg);
	return up;
}

/* Whether key k has a version to copy: an async key's value is set, a
 * compressed key encoded a round. */
static bool srv_copy_has(const struct srv_key *k)
{
	return k->server_held ? k->value != NULL : k->ver > 0;
}

/* The version contributor w's reply of `round` waits for: an async
 * key's, the one with its push before its last; a compressed key's,
 * the error feedback of the round before. */
static uint32_t srv_copy_need(const struct srv_key *k, int w, uint32_t round)
{
	return k->server_held ? k->need[w] : round;
}

bool srv_copy_gate(struct server *srv, struct srv_key *k, int w, uint32_t round, bool skip)
{
	if (!srv_key_replicated(srv, k) || !srv_copy_has(k))
		return false;
	struct srv_backup *b = &srv->backup;
	int state = atomic_load(&b->state);
	uint32_t gen = atomic_load(&b->gen);
	if (state == BACKUP_NONE)
		return false;
	if (k->ver_gen != gen) {
		/* A key declared after the link came up (or whose COPY_AGAIN
		 * is still queued): that backup holds none of it yet. */
		k->ver_gen = gen;
		k->ver_sent = k->ver_held = 0;
	}
	if (k->ver_held >= srv_copy_need(k, w, round))
		return false;
	/* The newest goes (unless one is on its way, or the link is down):
	 * every push since the last one sent rides along. */
	if (k->ver_sent == k->ver_held && k->ver_sent < k->ver)
		srv_copy_send(srv, k);
	k->copy_wait[w] = skip ? 2 : 1;
	k->copy_round[w] = round;
	return true;
}

void srv_copy_held(struct server *srv, struct srv_key *k, uint32_t gen, uint32_t ver,
		   void (*answer)(struct server *, struct srv_key *, int, uint32_t, bool))
{
	struct srv_backup *b = &srv->backup;
	if (ver == 0 && gen < k->ver_gen) {
		return;	/* an older link's COPY_AGAIN, behind the gate's newer one */
	} else if (ver == 0 && gen == k->ver_gen) {
		/* The gate met this link first. */
	} else if (ver == 0) {	/* a new link (or none): it holds nothing yet */
		k->ver_gen = gen;
		k->ver_sent = k->ver_held = 0;
	} else if (gen != k->ver_gen || ver <= k->ver_held) {
		return;	/* an old link's, or an old version's */
	} else {
		k->ver_held = ver;
	}
	bool none = atomic_load(&b->state) == BACKUP_NONE;
	bool waiting = false;	/* then the next version goes now, else when idle */
	for (int w = 0; w < k->nc; w++) {
		bool behind = !none && k->ver_held < srv_copy_need(k, w, k->copy_round[w]);
		if (k->copy_wait[w] && behind)
			waiting = true;
		if (!k->copy_wait[w] || behind)
			continue;
		bool skip = k->copy_wait[w] == 2;
		k->copy_wait[w] = 0;
		answer(srv, k, w, k->copy_round[w], skip);
	}
	/* A compressed key's newest goes at once: the next round's replies
	 * need it. */
	if ((waiting || !k->server_held) && srv_copy_has(k) && k->ver > k->ver_held &&
	    k->ver_sent <= k->ver_held)
		srv_copy_send(srv, k);
}

static int64_t srv_copy_due_ms(const struct srv_key *k)
{
	int64_t half = k->step_ms / 2;
	return k->push_ms + (half < SRV_COPY_MIN_MS ? SRV_COPY_MIN_MS
			     : half > SRV_COPY_MAX_MS ? SRV_COPY_MAX_MS : half);
}

static void srv_copy_idle(struct server *srv, struct srv_key *k)
{
	if (k->value != NULL && k->ver > k->ver_held && k->ver_sent <= k->ver_held)
		srv_copy_send(srv, k);
}

void srv_copy_versioned(struct srv_key *k, uint32_t round, bool zero)
{
	k->ver = round + 1;
	k->ver_zero = zero;
}

void srv_copy_encoded(struct server *srv, struct srv_key *k)
{
	if (!srv_key_replicated(srv, k))
		return;
	struct srv_backup *b = &srv->backup;
	uint32_t gen = atomic_load(&b->gen);
	if (atomic_load(&b->state) == BACKUP_NONE)
		return;
	if (k->ver_gen != gen) {	/* as the gate does: that backup holds none of it */
		k->ver_gen = gen;
		k->ver_sent = k->ver_held = 0;
	}
	if (k->ver_sent <= k->ver_held)	/* else the acknowledgement sends it */
		srv_copy_send(srv, k);
}

void srv_copy_pushed(struct srv_key *k, int w)
{
	k->need[w] = k->last[w];
	k->last[w] = ++k->ver;
	int64_t now = timing_now_ms();
	if (!k->copy_dirty)	/* the first push the backup lacks: its copy is due later */
		k->push_ms = now;
	if (w == 0 && k->push0_ms != 0)	/* a step, for when copies are due */
		k->step_ms = (3 * k->step_ms + (now - k->push0_ms)) / 4;
	if (w == 0)
		k->push0_ms = now;
}

void srv_copy_list(struct srv_engine *e, struct srv_key *k)
{
	if (!k->server_held || !e->srv->replicate || k->copy_dirty || k->ver <= k->ver_sent)
		return;
	k->copy_dirty = true;
	k->dirty_next = e->dirty;
	e->dirty = k;
	if (e->copy_due == 0 || srv_copy_due_ms(k) < e->copy_due)
		e->copy_due = srv_copy_due_ms(k);
}

int64_t srv_copies_due(struct srv_engine *e)
{
	int64_t now = timing_now_ms(), due = 0;
	for (struct srv_key **at = &e->dirty; *at != NULL;) {
		struct srv_key *k = *at;
		int64_t at_ms = srv_copy_due_ms(k);
		if (now < at_ms) {
			if (due == 0 || at_ms < due)
				due = at_ms;
			at = &k->dirty_next;
			continue;
		}
		*at = k->dirty_next;
		k->copy_dirty = false;
		srv_copy_idle(e->srv, k);	/* one on its way: its ack adds k again */
	}
	return due;
}

void srv_copy_unlist(struct srv_engine *e, struct srv_key *k)
{
	for (struct srv_key **at = &e->dirty; k->copy_dirty && *at != NULL; at = &(*at)->dirty_next)
		if (*at == k) {
			*at = k->dirty_next;
			k->copy_dirty = false;
			break;
		}
}

void srv_copy_forget(struct server *srv, struct srv_key *k)
{
	struct srv_backup *b = &srv->backup;
	if (!srv_key_replicated(srv, k))
		return;
	struct wire_hdr h = {.type = WIRE_COPY, .sender = srv->id, .key = k->key,
			     .dtype = (uint8_t)k->dtype};
	pthread_mutex_lock(&b->lock);
	if (b->state == BACKUP_UP)
		loop_conn_send(b->lc, &h, NULL);	/* best effort: a lost backup forgets all */
	pthread_mutex_unlock(&b->lock);
}

/* A compressed key's copy: the error feedback, and round ver - 1 as a
 * round restored (its re-pushes dropped, its pulls answered from the
 * encoding, as the lost server would have).  0 or UNISUM_ENOMEM. */
static int srv_copy_install_compressed(struct srv_key *k, const struct srv_copy *c)
{
	memcpy(k->cstate.residual, c->data, k->bytes);
	k->ver = c->ver;
	k->ver_zero = c->len == k->bytes;
	if (c->ver == 0)
		return 0;
	struct srv_slot *s = &k->slot[(c->ver - 1) & 1];
	if (!k->ver_zero) {
		if (s->enc == NULL && (s->enc = malloc(k->wire_bytes)) == NULL)
			return UNISUM_ENOMEM;
		memcpy(s->enc, c->data + k->bytes, k->wire_bytes);
	}
	s->active = s->ready = s->restored = true;
	s->round = c->ver - 1;
	s->result = k->ver_zero ? RESULT_ZERO : RESULT_OWNED;
	s->next = k->nc;
	s->replies = 0;
	s->started_ms = timing_now_ms();
	memset(s->arrived, 1, (size_t)k->nc);
	return 0;
}

int srv_copy_install(struct srv_key *k)
{
	struct srv_copy *c = k->copy;
	k->copy = NULL;
	if (!k->server_held) {
		int rc = srv_copy_install_compressed(k, c);
		LOG_INFO("key 0x%llx of '%s': error feedback taken over from server %u's copy "
			 "(after round %u)", (unsigned long long)k->key, k->name ? k->name : "?",
			 c->from, c->ver - 1);
		free(c->data);
		free(c);
		return rc;
	}
	srv_key_buf_free(k, k->value);
	k->value = srv_key_buf(k, k->bytes);
	if (k->value == NULL) {
		free(c->data);
		free(c);
		return UNISUM_ENOMEM;
	}
	memcpy(k->value, c->data, k->bytes);
	for (int w = 0; w < k->nc; w++) {
		bool gone;
		uint32_t have = srv_copy_pushes(c, k->bytes, w, &gone);
		k->gone[w] = gone;
		k->first_seen[w] = have > 0;
		k->clock[w] = have > 0 ? have - 1 : 0;
		/* The next replies wait for this server's own backup. */
		k->need[w] = k->last[w] = 1;
	}
	k->ver = 1;
	LOG_INFO("key 0x%llx of '%s': taken over from server %u's copy (version %u)",
		 (unsigned long long)k->key, k->name ? k->name : "?", c->from, c->ver);
	free(c->data);
	free(c);
	return 0;
}

/* ---- the backup's side ---------------------------------------------------- */

void srv_copies_link_closed(struct server *srv, int r)
{
	struct srv_backup *b = &srv->backup;
	if (!srv->replicate || r < 0 || r >= b->nservers || atomic_load(&srv->stopping))
		return;
	pthread_mutex_lock(&b->lock);
	if (!b->failed[r]) {
		b->gone_ms[r] = timing_now_ms();
		pthread_cond_signal(&b->cond);
	}
	pthread_mutex_unlock(&b->lock);
}

int srv_copy_head(struct server *srv, struct srv_conn *c, const struct wire_hdr *h, char *why,
		  size_t len)
{
	(void)srv;
	if (h->type != WIRE_COPY) {
		snprintf(why, len, "unexpected %s from a server", wire_type_name(h->type));
		return UNISUM_EPROTO;
	}
	if (h->payload_len == 0)
		return 0;
	c->pend = (struct srv_pend){.kind = PEND_BUF, .buf = malloc(h->payload_len)};
	if (c->pend.buf == NULL) {
		snprintf(why, len, "out of memory for a %llu-byte copy of key 0x%llx",
			 (unsigned long long)h->payload_len, (unsigned long long)h->key);
		return UNISUM_ENOMEM;
	}
	return 0;
}

int srv_copy_message(struct server *srv, struct srv_conn *c, const struct wire_hdr *h, char *why,
		     size_t len)
{
	const struct rdv_node *n = rdv_client_node_by_id(srv->rdv, h->sender);
	if (h->count == 0) {
		srv_copy_drop(srv, h->key);
		return 0;
	}
	struct srv_copy *cp = malloc(sizeof *cp);
	if (cp == NULL) {
		snprintf(why, len, "out of memory for a copy of key 0x%llx", (unsigned long long)h->key);
		return UNISUM_ENOMEM;
	}
	*cp = (struct srv_copy){.key = h->key, .from = n != NULL ? (uint32_t)n->rank : 0,
				.ver = h->round, .dtype = h->dtype, .count = h->count,
				.nc = h->aux, .flags = h->flags, .len = h->payload_len,
				.data = c->pend.buf};
	c->pend.buf = NULL;
	c->pend.kind = PEND_NONE;
	int rc = srv_copy_put(srv, cp);
	if (rc != 0) {
		free(cp->data);
		free(cp);
		snprintf(why, len, "out of memory for a copy of key 0x%llx", (unsigned long long)h->key);
		return rc;
	}
	struct wire_hdr ack = {.type = WIRE_COPY_ACK, .sender = srv->id, .round = h->round,
			       .key = h->key};
	rc = loop_conn_send(c->lc, &ack, NULL);
	if (rc != 0)	/* a server that does not read its acknowledgements */
		snprintf(why, len, "cannot acknowledge a copy: %s", unisum_strerror(rc));
	return rc == TP_AGAIN ? UNISUM_ECONN : rc;
}
