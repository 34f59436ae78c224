/*
 * server.c - the Summation Service: receives pushes, sums them, answers
 * pulls.
 *
 * DESIGN.  Threads:
 *   - the main thread accepts worker connections;
 *   - each connection has a receiving thread (validates every message,
 *     receives PUSH payloads straight into the key's per-worker buffer,
 *     hands events to the key's engine) and a sending thread (writes
 *     PULL_REPLYs straight from the key's sum buffer);
 *   - engine threads sum.  Every key is pinned to one engine, chosen by
 *     byte balance when it is declared, so one key's events are handled in
 *     order by one thread and its sums need no lock.
 *
 * Machines.  A machine's workers reduce among themselves; only its local
 * root (local rank 0) connects here and pushes the machine's sum.  So
 * "worker w" below is machine w: the server sums one push per machine
 * (UNISUM_NUM_WORKER of them) per key and round, and with one worker per
 * machine a machine is simply a worker.
 *
 * Rounds.  Each worker pushes round 0, 1, 2, ... of a key, each push
 * followed by a pull of the same round.  A key keeps two round slots
 * (round & 1): a worker can only push round r+1 after it received the sum
 * of round r, so at most rounds r and r+1 are alive and they never mix.
 *
 * Summation order.  Contributions are folded in machine order
 * (((w0 + w1) + w2) + ...), whatever order they arrive in: results are
 * bitwise reproducible from run to run and equal a reference summed in the
 * same order.  The first contribution is not copied: the sum of w0 and w1
 * goes straight into the slot's accumulator (dst = a + b), later ones are
 * added in place.  A lone contribution (one worker, or a broadcast root) is
 * copied into the accumulator once every push is in.  A push
 * flagged ZERO (a broadcast from another root) is skipped.
 *
 * Buffer lifetimes.  A worker's push buffer of a key is rewritten only by
 * its next push of that key, which comes after that worker received the
 * previous sum, which is after every push of that round was folded.  A
 * slot's accumulator is rewritten two rounds later, after every worker
 * received it (same argument).  So the sending threads can write straight
 * from these buffers without copies.
 *
 * Stalls.  Each engine looks over its keys about once a second: a round
 * that some workers pushed and others not for UNISUM_STALL_WARN_MS is
 * logged with the tensor, the round and the missing ranks; with
 * UNISUM_STALL_ABORT_MS the server asks the scheduler to fail the job, so
 * every rank gets that message instead of waiting forever.
 *
 * Locks.  `srv->lock` guards the key table and the worker -> connection
 * table; a connection's `qlock` guards its send queue; an engine's `lock`
 * its event queue.  Order: srv->lock, then qlock.  No lock is held while
 * summing or doing socket I/O.
 */
#include "server/server.h"

#include <endian.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "log/log.h"
#include "reducer/reducer.h"
#include "rendezvous/rendezvous.h"
#include "shm/shm.h"
#include "timing/timing.h"
#include "transport/transport.h"
#include "wire/wire.h"

enum srv_result {
	RESULT_NONE,		/* nothing folded yet */
	RESULT_ZERO,		/* only ZERO contributions so far */
	RESULT_BORROWED,	/* the sum is worker `borrowed`'s push buffer */
	RESULT_OWNED,		/* the sum is in `acc` */
};

/* One round of a key, owned by the key's engine thread. */
struct srv_slot {
	bool active;		/* holds a round in progress */
	uint32_t round;		/* which one */
	int next;		/* next worker rank to fold */
	int result;		/* enum srv_result */
	int borrowed;		/* worker whose buffer is the sum (RESULT_BORROWED) */
	bool ready;		/* every worker folded */
	int replies;		/* pull replies queued */
	uint8_t *arrived;	/* [W] pushed this round */
	uint8_t *zero;		/* [W] pushed a ZERO contribution */
	uint8_t *pull_waiting;	/* [W] pulled before the round was ready */
	uint8_t *acc;		/* accumulator, key bytes, allocated on first use */
	int64_t started_ms;	/* when the round's first push arrived */
	uint32_t wire_op;	/* the collective of that push (WIRE_OP()) ... */
	int op_worker;		/* ... and who sent it: every other push must agree */
	int stall_level;	/* 0, 1 = warned, 2 = aborted */
};

struct srv_key {
	uint64_t key;
	int dtype;
	uint64_t count;
	size_t bytes;		/* count x element size */
	int engine;		/* engine thread that owns the key */
	uint32_t *next_round;	/* [W] next round worker w may push; its conn thread's */
	uint8_t **push_buf;	/* [W] worker w's push buffer; written by its conn thread */
	struct srv_slot slot[2];	/* engine-owned */
	const char *poison;	/* engine-owned: why every pull fails, or NULL */
	char *own_poison;	/* engine-owned: the text of a disagreement found here */
	uint8_t *retired;	/* [W] worker w sent RETIRE; its conn thread's */
	int nretired;		/* engine-owned: RETIREs seen; at W the buffers go */
	char *name;		/* the tensor's name, for stall reports */
	struct srv_key *next;	/* hash chain */
};

enum srv_event_type { EVENT_PUSH, EVENT_PULL, EVENT_POISON, EVENT_RETIRE, EVENT_FREE };

struct srv_event {
	int type;		/* enum srv_event_type */
	struct srv_key *key;
	int worker;
	uint32_t round;
	bool zero;		/* PUSH flagged ZERO */
	uint32_t wire_op;	/* PUSH: its collective (the header's aux) */
	const char *why;	/* POISON: the reason (owned by the server) */
	struct srv_event *next;
};

struct srv_engine {
	struct server *srv;
	pthread_t thread;
	pthread_mutex_t lock;	/* the queue */
	pthread_cond_t cond;
	struct srv_event *head, *tail;
	bool stop;		/* finish the queue, then exit */
	bool joined;		/* exited: posts are dropped */
	uint64_t bytes;		/* bytes of keys pinned here (under srv->lock) */
	struct srv_key **keys;	/* keys pinned here (under srv->lock) */
	size_t nkeys, capkeys;
};

struct srv_reply {
	struct wire_hdr hdr;
	const void *payload;	/* what follows the header */
	void *owned;		/* freed after sending (error texts), or NULL */
	struct srv_reply *next;
};

struct srv_conn {
	struct server *srv;
	struct tp_conn *conn;
	pthread_t recv_thread, send_thread;
	bool send_started;
	int worker;		/* its machine after hello, -1 before */
	bool ipc;		/* same host: data by cross-memory attach (WIRE_FLAG_IPC) */
	pid_t peer_pid;		/* ... from and to this process */
	pthread_mutex_t qlock;	/* the reply queue */
	pthread_cond_t qcond;
	struct srv_reply *head, *tail;
	struct srv_reply *last_ack;	/* the last PUSH_ACK still queued, or NULL */
	bool closing;		/* no more replies; the sender exits */
	atomic_bool finished;	/* the receiving thread has ended */
	struct srv_conn *next;	/* all connections, for the final join */
};

struct server {
	const struct config *cfg;
	const struct transport_ops *tp;
	struct rdv_client *rdv;
	struct tp_listener *listener;
	int nworkers;		/* worker machines: one push each per key and round */
	int local_size;		/* workers per machine (names in messages) */
	uint32_t id;		/* this server's node id */
	int rank;
	pthread_mutex_t lock;	/* keys, by_worker, conns, stop state */
	struct srv_key **buckets;	/* key hash table */
	size_t nbuckets, nkeys;
	struct srv_conn **by_worker;	/* [W] live connection of each machine's local root */
	struct srv_conn *conns;	/* every connection ever accepted */
	struct srv_engine *engines;
	int nengines;
	struct srv_poison *poisoned;	/* tensors that can never be summed */
	atomic_bool stopping;
	atomic_int job_error;	/* the notice's error, 0 while running */
	atomic_bool told;	/* job_error came from the scheduler's notice */
};

/* A tensor whose workers disagree on its shape (the scheduler says so):
 * every pull of its keys is answered with an error instead of a sum. */
struct srv_poison {
	uint64_t tensor;	/* key >> 16 */
	char *why;		/* both shapes, for the workers' errors */
	struct srv_poison *next;
};

/* How messages name machine m so that a user can find it: "worker N" with
 * one worker per machine, else "machine M (worker rank R)", R being the
 * rank of its local root.  Writes and returns buf. */
static const char *srv_worker_name(const struct server *srv, int m, char *buf, size_t len)
{
	if (m < 0)
		snprintf(buf, len, "a worker before its hello");
	else if (srv->local_size > 1)
		snprintf(buf, len, "machine %d (worker rank %d)", m, m * srv->local_size);
	else
		snprintf(buf, len, "worker %d", m);
	return buf;
}

/* ---- key table ---------------------------------------------------------- */

static size_t srv_hash(uint64_t key, size_t n)
{
	key ^= key >> 33;
	key *= 0xff51afd7ed558ccdull;
	key ^= key >> 33;
	return (size_t)(key & (n - 1));
}

/* Looks a key up; call with srv->lock held. */
static struct srv_key *srv_key_find(struct server *srv, uint64_t key)
{
	for (struct srv_key *k = srv->buckets[srv_hash(key, srv->nbuckets)]; k; k = k->next)
		if (k->key == key)
			return k;
	return NULL;
}

static int srv_key_grow(struct server *srv)
{
	size_t n = srv->nbuckets * 2;
	struct srv_key **b = calloc(n, sizeof *b);
	if (b == NULL)
		return UNISUM_ENOMEM;
	for (size_t i = 0; i < srv->nbuckets; i++) {
		struct srv_key *k = srv->buckets[i];
		while (k) {
			struct srv_key *next = k->next;
			size_t h = srv_hash(k->key, n);
			k->next = b[h];
			b[h] = k;
			k = next;
		}
	}
	free(srv->buckets);
	srv->buckets = b;
	srv->nbuckets = n;
	return 0;
}

static void srv_key_free(struct srv_key *k, int nworkers)
{
	if (k == NULL)
		return;
	if (k->push_buf)
		for (int w = 0; w < nworkers; w++)
			free(k->push_buf[w]);
	for (int i = 0; i < 2; i++) {
		free(k->slot[i].arrived);
		free(k->slot[i].zero);
		free(k->slot[i].pull_waiting);
		free(k->slot[i].acc);
	}
	free(k->push_buf);
	free(k->next_round);
	free(k->retired);
	free(k->name);
	free(k->own_poison);
	free(k);
}

static int srv_engine_grow(struct srv_engine *e)
{
	size_t cap = e->capkeys ? 2 * e->capkeys : 64;
	struct srv_key **keys = realloc(e->keys, cap * sizeof *keys);
	if (keys == NULL)
		return UNISUM_ENOMEM;
	e->keys = keys;
	e->capkeys = cap;
	return 0;
}

/* Declares key h->key of tensor `name` (idempotent when the shape
 * matches).  Returns 0, or UNISUM_EMISMATCH / UNISUM_ENOMEM with `why` set. */
static int srv_key_declare(struct server *srv, struct srv_conn *c, const struct wire_hdr *h,
			   const char *name, char *why, size_t len)
{
	int rc = 0;
	size_t W = (size_t)srv->nworkers;
	pthread_mutex_lock(&srv->lock);
	struct srv_key *k = srv_key_find(srv, h->key);
	if (h->count > WIRE_MAX_DATA_PAYLOAD / unisum_dtype_size(h->dtype)) {
		snprintf(why, len, "key 0x%llx declared with %llu elements, more than one 1 GiB partition",
			 (unsigned long long)h->key, (unsigned long long)h->count);
		rc = UNISUM_EPROTO;
		goto out_unlock;
	}
	if (k != NULL) {
		if (k->retired[c->worker]) {
			snprintf(why, len, "key 0x%llx of '%s' declared again by a worker that undeclared it, "
				 "before every worker had", (unsigned long long)h->key, name);
			rc = UNISUM_EPROTO;
		} else if (k->dtype != h->dtype || k->count != h->count) {
			snprintf(why, len, "key 0x%llx is %s[%llu] here but the worker declared %s[%llu]",
				 (unsigned long long)h->key, unisum_dtype_name(k->dtype),
				 (unsigned long long)k->count, unisum_dtype_name(h->dtype),
				 (unsigned long long)h->count);
			rc = UNISUM_EMISMATCH;
		}
		goto out_unlock;
	}
	if (srv->nkeys + 1 > srv->nbuckets && srv_key_grow(srv) != 0) {
		rc = UNISUM_ENOMEM;
		goto out_unlock;
	}
	k = calloc(1, sizeof *k);
	if (k == NULL) {
		rc = UNISUM_ENOMEM;
		goto out_unlock;
	}
	k->next_round = calloc(W, sizeof *k->next_round);
	k->push_buf = calloc(W, sizeof *k->push_buf);
	k->retired = calloc(W, 1);
	bool ok = k->next_round && k->push_buf && k->retired;
	for (int i = 0; i < 2; i++) {
		k->slot[i].arrived = calloc(W, 1);
		k->slot[i].zero = calloc(W, 1);
		k->slot[i].pull_waiting = calloc(W, 1);
		ok = ok && k->slot[i].arrived && k->slot[i].zero && k->slot[i].pull_waiting;
	}
	if (!ok) {
		srv_key_free(k, srv->nworkers);
		rc = UNISUM_ENOMEM;
		goto out_unlock;
	}
	k->key = h->key;
	k->dtype = h->dtype;
	k->count = h->count;
	k->bytes = h->count * unisum_dtype_size(h->dtype);
	int best = 0;
	for (int e = 1; e < srv->nengines; e++)
		if (srv->engines[e].bytes < srv->engines[best].bytes)
			best = e;
	struct srv_engine *e = &srv->engines[best];
	k->name = strdup(name);
	if (k->name == NULL || (e->nkeys == e->capkeys && srv_engine_grow(e) != 0)) {
		srv_key_free(k, srv->nworkers);
		rc = UNISUM_ENOMEM;
		goto out_unlock;
	}
	e->keys[e->nkeys++] = k;
	k->engine = best;
	e->bytes += k->bytes;
	size_t b = srv_hash(k->key, srv->nbuckets);
	k->next = srv->buckets[b];
	srv->buckets[b] = k;
	srv->nkeys++;
out_unlock:
	if (rc == UNISUM_ENOMEM)
		snprintf(why, len, "out of memory declaring key 0x%llx", (unsigned long long)h->key);
	pthread_mutex_unlock(&srv->lock);
	return rc;
}

/* ---- sending ------------------------------------------------------------ */

/* Appends a reply to a connection's queue, unless it is closing.  `owned`
 * (may be NULL) is freed once the reply is sent or dropped.  A PUSH_ACK
 * goes ahead of every queued sum (behind earlier acks): the worker's credit
 * waits on it, and behind megabytes of replies on a slow link the pushes
 * would stall while the replies drain, so pushing and pulling would take
 * turns instead of sharing the full-duplex link.  The ack of a key still
 * precedes that key's reply, which is queued only after this push. */
static void srv_conn_enqueue(struct srv_conn *c, const struct wire_hdr *h, const void *payload,
			     void *owned)
{
	struct srv_reply *r = malloc(sizeof *r);
	if (r == NULL) {
		char name[64];
		LOG_ERROR("out of memory queuing a reply to %s",
			  srv_worker_name(c->srv, c->worker, name, sizeof name));
		free(owned);
		return;
	}
	*r = (struct srv_reply){.hdr = *h, .payload = payload, .owned = owned};
	pthread_mutex_lock(&c->qlock);
	if (c->closing) {
		free(r->owned);
		free(r);
	} else if (h->type == WIRE_PUSH_ACK) {
		struct srv_reply **at = c->last_ack ? &c->last_ack->next : &c->head;
		r->next = *at;
		*at = r;
		if (r->next == NULL)
			c->tail = r;
		c->last_ack = r;
		pthread_cond_signal(&c->qcond);
	} else {
		if (c->tail)
			c->tail->next = r;
		else
			c->head = r;
		c->tail = r;
		pthread_cond_signal(&c->qcond);
	}
	pthread_mutex_unlock(&c->qlock);
}

/* Tells a worker its PUSH arrived (it counts the bytes against its credit
 * until then).  Queued ahead of the sum's reply, so it always comes first. */
static void srv_ack_push(struct server *srv, struct srv_conn *c, const struct wire_hdr *push)
{
	struct wire_hdr ack = {.type = WIRE_PUSH_ACK, .sender = srv->id, .round = push->round,
			       .key = push->key};
	srv_conn_enqueue(c, &ack, NULL, NULL);
}

/* Queues a reply to worker w; dropped when its connection is gone. */
static void srv_queue_reply(struct server *srv, int w, const struct wire_hdr *h, const void *payload)
{
	pthread_mutex_lock(&srv->lock);
	struct srv_conn *c = srv->by_worker[w];
	if (c != NULL && c->ipc && h->type == WIRE_PULL_REPLY && h->payload_len != 0) {
		/* IPC: the worker copies the sum from here itself; the buffer
		 * stays as it is until that worker's next push of the key. */
		uint64_t *addr = malloc(sizeof *addr);
		struct wire_hdr ih = *h;
		ih.flags |= WIRE_FLAG_IPC;
		ih.payload_len = WIRE_IPC_PAYLOAD;
		if (addr != NULL) {
			*addr = htole64((uint64_t)(uintptr_t)payload);
			srv_conn_enqueue(c, &ih, addr, addr);
		} else {
			LOG_ERROR("out of memory queuing a reply");
		}
	} else if (c != NULL) {
		srv_conn_enqueue(c, h, payload, NULL);
	}
	pthread_mutex_unlock(&srv->lock);
}

/* IPC push: copies `bytes` from the worker's address `from` into dst. */
static int srv_ipc_read(struct srv_conn *c, void *dst, uint64_t from, size_t bytes, char *why,
			size_t len)
{
	int rc = shm_vm_copy(c->peer_pid, false, dst, from, bytes);
	if (rc == 0)
		return 0;
	snprintf(why, len, "cannot read a push from the memory of pid %d (same host, UNISUM_IPC=1) "
		 "with process_vm_readv: %s; set UNISUM_IPC=0 to send the data through the socket",
		 (int)c->peer_pid, strerror(-rc));
	return rc == -ESRCH ? UNISUM_ECONN : UNISUM_ESYS;
}

/* Writes queued replies in order; after `closing` it drains what is left
 * (an ERROR explaining the close goes out last) and exits. */
static void *srv_send_main(void *arg)
{
	struct srv_conn *c = arg;
	struct server *srv = c->srv;
	bool broken = false;
	for (;;) {
		pthread_mutex_lock(&c->qlock);
		while (c->head == NULL && !c->closing)
			pthread_cond_wait(&c->qcond, &c->qlock);
		struct srv_reply *r = c->head;
		if (r == NULL) {
			pthread_mutex_unlock(&c->qlock);
			return NULL;
		}
		c->head = r->next;
		if (c->head == NULL)
			c->tail = NULL;
		if (c->last_ack == r)
			c->last_ack = NULL;
		pthread_mutex_unlock(&c->qlock);
		if (!broken && srv->tp->send(c->conn, &r->hdr, r->payload) != 0) {
			broken = true;
			char name[64];
			LOG_INFO("sending to %s (%s) failed; closing its connection",
				 srv_worker_name(srv, c->worker, name, sizeof name), srv->tp->peer_name(c->conn));
			srv->tp->conn_shutdown(c->conn);
		}
		free(r->owned);
		free(r);
	}
}

/* ---- engines ------------------------------------------------------------ */

/* How often an engine looks for stalls: a quarter of the shortest limit,
 * at most once a second. */
static int srv_stall_period_ms(const struct server *srv)
{
	int limit = srv->cfg->stall_warn_ms;
	if (srv->cfg->stall_abort_ms > 0 && srv->cfg->stall_abort_ms < limit)
		limit = srv->cfg->stall_abort_ms;
	return limit / 4 < 1000 ? (limit / 4 > 5 ? limit / 4 : 5) : 1000;
}

static void srv_reply_pull(struct server *srv, struct srv_key *k, struct srv_slot *s, int w)
{
	struct wire_hdr h = {.type = WIRE_PULL_REPLY, .sender = srv->id, .round = s->round,
			     .key = k->key, .count = k->count, .dtype = (uint8_t)k->dtype};
	const void *payload = NULL;
	if (s->result == RESULT_ZERO) {
		h.flags = WIRE_FLAG_ZERO;
	} else {
		h.payload_len = k->bytes;
		payload = s->result == RESULT_OWNED ? s->acc : k->push_buf[s->borrowed];
	}
	srv_queue_reply(srv, w, &h, payload);
	if (++s->replies == srv->nworkers) {
		/* Everyone has its reply queued: the slot is free for round + 2. */
		s->active = false;
		s->ready = false;
		s->replies = 0;
		s->next = 0;
		s->result = RESULT_NONE;
		memset(s->arrived, 0, (size_t)srv->nworkers);
		memset(s->zero, 0, (size_t)srv->nworkers);
	}
}

/* Answers worker w's pull of key k with an error instead of a sum. */
static void srv_reply_error(struct server *srv, struct srv_conn *c, int w, uint64_t key, uint32_t round,
			    int err, const char *why)
{
	struct wire_buf b;
	wire_buf_init(&b);
	struct wire_hdr h = {.sender = srv->id, .key = key, .round = round};
	if (wire_error_build(&h, &b, err, why) == 0) {
		if (c != NULL) {
			srv_conn_enqueue(c, &h, b.data, b.data);
		} else {
			pthread_mutex_lock(&srv->lock);
			struct srv_conn *to = srv->by_worker[w];
			if (to != NULL)
				srv_conn_enqueue(to, &h, b.data, b.data);
			else
				free(b.data);
			pthread_mutex_unlock(&srv->lock);
		}
		b.data = NULL;
	}
	wire_buf_fini(&b);
}

static void srv_on_poison(struct server *srv, struct srv_key *k, const char *why)
{
	k->poison = why;
	for (int i = 0; i < 2; i++) {
		struct srv_slot *s = &k->slot[i];
		for (int w = 0; w < srv->nworkers; w++) {
			if (s->pull_waiting[w]) {
				s->pull_waiting[w] = 0;
				srv_reply_error(srv, NULL, w, k->key, s->round, UNISUM_EMISMATCH, why);
			}
		}
	}
}

static bool srv_slot_acc(struct srv_key *k, struct srv_slot *s)
{
	if (s->acc == NULL)
		s->acc = malloc(k->bytes ? k->bytes : 1);
	return s->acc != NULL;
}

/* Folds worker w's contribution into the slot's sum. */
static int srv_fold(struct srv_key *k, struct srv_slot *s, int w)
{
	if (s->zero[w]) {
		if (s->result == RESULT_NONE)
			s->result = RESULT_ZERO;
		return 0;
	}
	switch (s->result) {
	case RESULT_NONE:
	case RESULT_ZERO:
		s->result = RESULT_BORROWED;
		s->borrowed = w;
		return 0;
	case RESULT_BORROWED:
		if (!srv_slot_acc(k, s))
			return UNISUM_ENOMEM;
		reducer_sum(s->acc, k->push_buf[s->borrowed], k->push_buf[w], k->count, k->dtype);
		s->result = RESULT_OWNED;
		return 0;
	default:
		reducer_sum_into(s->acc, k->push_buf[w], k->count, k->dtype);
		return 0;
	}
}

/* Two pushes of one round ask for different collectives (a broadcast from
 * two roots, a sum against an average): nothing of the key is ever summed
 * again, and every pull, waiting or to come, gets this error. */
static void srv_op_mismatch(struct server *srv, struct srv_key *k, const struct srv_slot *s,
			    const struct srv_event *ev)
{
	char a[64], b[64], first[64], other[64], msg[768];
	snprintf(msg, sizeof msg,
		 "tensor '%s' (partition %u) round %u: %s called %s but %s %s; every worker must "
		 "call the same collective (a broadcast: with the same root)",
		 k->name ? k->name : "?", (unsigned)(k->key & 0xffff), s->round,
		 srv_worker_name(srv, s->op_worker, first, sizeof first),
		 wire_op_describe(s->wire_op, a, sizeof a),
		 srv_worker_name(srv, ev->worker, other, sizeof other),
		 wire_op_describe(ev->wire_op, b, sizeof b));
	LOG_ERROR("%s", msg);
	k->own_poison = strdup(msg);
	srv_on_poison(srv, k, k->own_poison ? k->own_poison : "the workers disagree on the collective");
	/* Everyone else holding the tensor learns it through the scheduler:
	 * the workers of a machine waiting for their root, the other
	 * partitions' servers. */
	rdv_client_poison_tensor(srv->rdv, k->key & ~(uint64_t)0xffff, msg);
}

static void srv_on_push(struct server *srv, struct srv_key *k, const struct srv_event *ev)
{
	struct srv_slot *s = &k->slot[ev->round & 1];
	if (k->poison != NULL)
		return;	/* never summed: its pull gets the error */
	if (!s->active) {
		s->active = true;
		s->round = ev->round;
		s->started_ms = timing_now_ms();
		s->stall_level = 0;
		s->wire_op = ev->wire_op;
		s->op_worker = ev->worker;
	} else if (ev->wire_op != s->wire_op) {
		srv_op_mismatch(srv, k, s, ev);
		return;
	}
	s->arrived[ev->worker] = 1;
	s->zero[ev->worker] = ev->zero;
	while (s->next < srv->nworkers && s->arrived[s->next]) {
		if (srv_fold(k, s, s->next) != 0) {
			LOG_ERROR("out of memory summing key 0x%llx", (unsigned long long)k->key);
			atomic_store(&srv->job_error, UNISUM_ENOMEM);
			return;
		}
		s->next++;
	}
	if (s->next < srv->nworkers)
		return;
	/* Every worker folded.  A borrowed sum is copied out: its owner may
	 * push its next round before the others have received this one, and
	 * even a lone worker's next push would land in the buffer that its
	 * reply is still being sent from if it pushed without waiting. */
	if (s->result == RESULT_BORROWED) {
		if (!srv_slot_acc(k, s)) {
			atomic_store(&srv->job_error, UNISUM_ENOMEM);
			return;
		}
		memcpy(s->acc, k->push_buf[s->borrowed], k->bytes);
		s->result = RESULT_OWNED;
	}
	s->ready = true;
	for (int w = 0; w < srv->nworkers; w++) {
		if (s->pull_waiting[w]) {
			s->pull_waiting[w] = 0;
			srv_reply_pull(srv, k, s, w);
		}
	}
}

static void srv_on_pull(struct server *srv, struct srv_key *k, const struct srv_event *ev)
{
	struct srv_slot *s = &k->slot[ev->round & 1];
	if (k->poison != NULL)
		srv_reply_error(srv, NULL, ev->worker, k->key, ev->round, UNISUM_EMISMATCH, k->poison);
	else if (s->active && s->round == ev->round && s->ready)
		srv_reply_pull(srv, k, s, ev->worker);
	else
		s->pull_waiting[ev->worker] = 1;
}

static int srv_post(struct server *srv, int type, struct srv_key *k, int w, uint32_t round, bool zero,
		    uint32_t wire_op, const char *why);

/* A worker is done with key k for good (an autotune cut it left, or it
 * undeclared the tensor).  Once every worker is, nothing will push, pull
 * or send from its buffers again: each RETIRE came after its worker
 * received every reply of the key, on the same connection, so its events
 * are all processed.  The key leaves the table at once (nobody can post
 * an event for it after that) and is freed by an event behind any that
 * were posted before. */
static void srv_on_retire(struct server *srv, struct srv_key *k)
{
	if (++k->nretired < srv->nworkers)
		return;
	LOG_INFO("every worker retired '%s' (key 0x%llx): its %zu-byte buffers are freed",
		 k->name ? k->name : "?", (unsigned long long)k->key, k->bytes);
	pthread_mutex_lock(&srv->lock);
	struct srv_key **at = &srv->buckets[srv_hash(k->key, srv->nbuckets)];
	while (*at != NULL && *at != k)
		at = &(*at)->next;
	if (*at != NULL)
		*at = k->next;
	srv->nkeys--;
	struct srv_engine *e = &srv->engines[k->engine];
	for (size_t i = 0; i < e->nkeys; i++) {
		if (e->keys[i] == k) {
			e->keys[i] = e->keys[--e->nkeys];
			break;
		}
	}
	e->bytes -= k->bytes;
	pthread_mutex_unlock(&srv->lock);
	if (srv_post(srv, EVENT_FREE, k, 0, 0, false, 0, NULL) != 0) {
		/* Out of memory for the event: keep the key's memory rather
		 * than free it under a queued event. */
		LOG_WARN("out of memory freeing key 0x%llx: it stays allocated",
			 (unsigned long long)k->key);
	}
}

/* Reports rounds of this engine's keys that some workers pushed and others
 * have not, for longer than the stall limits (see DESIGN above). */
static void srv_check_stalls(struct server *srv, struct srv_engine *e)
{
	int64_t now = timing_now_ms();
	const struct config *cfg = srv->cfg;
	char abort_msg[768] = "";	/* the first stall past the abort limit */
	pthread_mutex_lock(&srv->lock);
	for (size_t i = 0; i < e->nkeys; i++) {
		struct srv_key *k = e->keys[i];
		for (int j = 0; j < 2; j++) {
			struct srv_slot *s = &k->slot[j];
			if (!s->active || s->ready || k->poison != NULL)
				continue;
			int64_t waited = now - s->started_ms;
			int level = cfg->stall_abort_ms > 0 && waited >= cfg->stall_abort_ms ? 2
				    : waited >= cfg->stall_warn_ms			  ? 1
											  : 0;
			if (level <= s->stall_level)
				continue;
			s->stall_level = level;
			/* "worker(s) 1, 3", or with several workers per machine
			 * "machine(s) 1 (worker rank 4), 3 (worker rank 12)". */
			char missing[256] = "", msg[768];
			size_t n = 0;
			int L = srv->local_size;
			for (int w = 0; w < srv->nworkers && n < sizeof missing - 40; w++) {
				if (s->arrived[w])
					continue;
				if (L > 1)
					n += (size_t)snprintf(missing + n, sizeof missing - n,
							      "%s%d (worker rank %d)", n ? ", " : "", w, w * L);
				else
					n += (size_t)snprintf(missing + n, sizeof missing - n, "%s%d",
							      n ? ", " : "", w);
			}
			snprintf(msg, sizeof msg,
				 "stall: tensor '%s' (partition %u) round %u has waited %lld ms for %s %s, "
				 "which have not pushed it; the others have. Does every worker push "
				 "every tensor every round?",
				 k->name, (unsigned)(k->key & 0xffff), s->round, (long long)waited,
				 L > 1 ? "machine(s)" : "worker(s)", missing);
			if (level == 1) {
				LOG_WARN("%s", msg);
			} else {
				LOG_ERROR("%s (UNISUM_STALL_ABORT_MS=%d: failing the job)", msg,
					  cfg->stall_abort_ms);
				if (abort_msg[0] == '\0')
					snprintf(abort_msg, sizeof abort_msg, "%s", msg);
			}
		}
	}
	pthread_mutex_unlock(&srv->lock);
	/* Socket I/O after the lock is let go. */
	if (abort_msg[0] != '\0')
		rdv_client_fail_job(srv->rdv, UNISUM_ETIMEDOUT, abort_msg);
}

static void *srv_engine_main(void *arg)
{
	struct srv_engine *e = arg;
	int64_t next_check = timing_now_ms() + srv_stall_period_ms(e->srv);
	for (;;) {
		if (timing_now_ms() >= next_check) {
			srv_check_stalls(e->srv, e);
			next_check = timing_now_ms() + srv_stall_period_ms(e->srv);
		}
		pthread_mutex_lock(&e->lock);
		while (e->head == NULL && !e->stop && timing_now_ms() < next_check) {
			struct timespec until = timing_deadline(200);
			pthread_cond_timedwait(&e->cond, &e->lock, &until);
		}
		struct srv_event *ev = e->head;
		if (ev == NULL && e->stop) {
			pthread_mutex_unlock(&e->lock);
			return NULL;
		}
		if (ev == NULL) {
			pthread_mutex_unlock(&e->lock);
			continue;
		}
		e->head = ev->next;
		if (e->head == NULL)
			e->tail = NULL;
		pthread_mutex_unlock(&e->lock);
		if (ev->type == EVENT_PUSH)
			srv_on_push(e->srv, ev->key, ev);
		else if (ev->type == EVENT_PULL)
			srv_on_pull(e->srv, ev->key, ev);
		else if (ev->type == EVENT_RETIRE)
			srv_on_retire(e->srv, ev->key);
		else if (ev->type == EVENT_FREE)
			srv_key_free(ev->key, e->srv->nworkers);
		else
			srv_on_poison(e->srv, ev->key, ev->why);
		free(ev);
	}
}

static int srv_post(struct server *srv, int type, struct srv_key *k, int w, uint32_t round, bool zero,
		    uint32_t wire_op, const char *why)
{
	struct srv_event *ev = malloc(sizeof *ev);
	if (ev == NULL)
		return UNISUM_ENOMEM;
	*ev = (struct srv_event){.type = type, .key = k, .worker = w, .round = round, .zero = zero,
				 .wire_op = wire_op, .why = why};
	struct srv_engine *e = &srv->engines[k->engine];
	pthread_mutex_lock(&e->lock);
	if (e->joined) {
		/* Shutting down (a late poison from the scheduler): nobody
		 * would take it. */
		pthread_mutex_unlock(&e->lock);
		free(ev);
		return 0;
	}
	if (e->tail)
		e->tail->next = ev;
	else
		e->head = ev;
	e->tail = ev;
	pthread_cond_signal(&e->cond);
	pthread_mutex_unlock(&e->lock);
	return 0;
}

/* ---- receiving ---------------------------------------------------------- */

/* Handles the hello; returns 0 and sets c->worker, or UNISUM_EPROTO. */
static int srv_on_hello(struct server *srv, struct srv_conn *c, const struct wire_hdr *h, char *why,
			size_t len)
{
	/* The hello's payload: nothing (TCP), or u32 flags with bit 0 asking
	 * for IPC (the worker saw from the address book that we share a host). */
	uint32_t flags = 0;
	if (h->type != WIRE_REGISTER || (h->payload_len != 0 && h->payload_len != sizeof flags)) {
		snprintf(why, len, "first message is %s, expected a worker hello", wire_type_name(h->type));
		return UNISUM_EPROTO;
	}
	if (h->payload_len != 0 && srv->tp->recv_payload(c->conn, &flags, sizeof flags) != 0) {
		snprintf(why, len, "connection closed in the middle of a hello");
		return UNISUM_ECONN;
	}
	flags = le32toh(flags);
	const struct rdv_node *n = rdv_client_node_by_id(srv->rdv, h->sender);
	if (n == NULL || n->role != CONFIG_ROLE_WORKER) {
		snprintf(why, len, "hello from node id %u, which is not a worker of this job", h->sender);
		return UNISUM_EPROTO;
	}
	if (n->local_rank != 0) {
		snprintf(why, len,
			 "worker rank %d is local rank %d of machine %d; only a machine's local root talks "
			 "to servers", n->rank, n->local_rank, n->machine);
		return UNISUM_EPROTO;
	}
	if (n->machine < 0 || n->machine >= srv->nworkers) {
		snprintf(why, len, "worker rank %d is on machine %d, but this job has %d machines",
			 n->rank, n->machine, srv->nworkers);
		return UNISUM_EPROTO;
	}
	if (flags & ~1u) {
		snprintf(why, len, "hello with unknown flags 0x%x", flags);
		return UNISUM_EPROTO;
	}
	if (flags & 1u) {
		if (!rdv_client_same_host(srv->rdv, n)) {
			snprintf(why, len, "worker rank %d asks for IPC but is not on this host (%s)",
				 n->rank, n->host_id);
			return UNISUM_EPROTO;
		}
		c->ipc = true;
		c->peer_pid = n->pid;
	}
	pthread_mutex_lock(&srv->lock);
	int rc = 0;
	if (srv->by_worker[n->machine] != NULL) {
		char name[64];
		snprintf(why, len, "a second connection claims to be %s",
			 srv_worker_name(srv, n->machine, name, sizeof name));
		rc = UNISUM_EPROTO;
	} else {
		srv->by_worker[n->machine] = c;
		c->worker = n->machine;
	}
	pthread_mutex_unlock(&srv->lock);
	return rc;
}

/* Why the tensor of `key` was poisoned by the scheduler, or NULL.  The
 * text lives as long as the server. */
static const char *srv_poison_of(struct server *srv, uint64_t key)
{
	pthread_mutex_lock(&srv->lock);
	struct srv_poison *p = srv->poisoned;
	while (p != NULL && p->tensor != key >> 16)
		p = p->next;
	pthread_mutex_unlock(&srv->lock);
	return p != NULL ? p->why : NULL;
}

/* The scheduler says tensor `key`'s workers disagree on its shape: fail
 * every pull of it, now and later. */
static void srv_tensor_error(void *arg, uint64_t key, const char *why)
{
	struct server *srv = arg;
	struct srv_poison *p = calloc(1, sizeof *p);
	char *text = strdup(why);
	if (p == NULL || text == NULL) {
		free(p);
		free(text);
		LOG_ERROR("out of memory recording a bad tensor: %s", why);
		return;
	}
	p->tensor = key >> 16;
	p->why = text;
	LOG_WARN("%s", why);
	pthread_mutex_lock(&srv->lock);
	p->next = srv->poisoned;
	srv->poisoned = p;
	for (size_t i = 0; i < srv->nbuckets; i++)
		for (struct srv_key *k = srv->buckets[i]; k; k = k->next)
			if (k->key >> 16 == p->tensor)
				srv_post(srv, EVENT_POISON, k, 0, 0, false, 0, p->why);
	pthread_mutex_unlock(&srv->lock);
}

/* Validates a PUSH or PULL against the key's state; returns the key or
 * NULL with `why` set. */
static struct srv_key *srv_check_data(struct server *srv, struct srv_conn *c, const struct wire_hdr *h,
				      char *why, size_t len)
{
	/* A key this worker has not retired stays in the table until it does
	 * (on this thread): once the check below passes, k stays valid. */
	pthread_mutex_lock(&srv->lock);
	struct srv_key *k = srv_key_find(srv, h->key);
	bool retired = k != NULL && k->retired[c->worker];
	pthread_mutex_unlock(&srv->lock);
	if (k == NULL) {
		snprintf(why, len, "%s of undeclared key 0x%llx", wire_type_name(h->type),
			 (unsigned long long)h->key);
		return NULL;
	}
	if (retired) {
		snprintf(why, len, "%s of key 0x%llx, which this worker retired",
			 wire_type_name(h->type), (unsigned long long)h->key);
		return NULL;
	}
	if (h->dtype != k->dtype || (h->type == WIRE_PUSH && h->count != k->count)) {
		snprintf(why, len, "%s of key 0x%llx as %s[%llu], declared %s[%llu]",
			 wire_type_name(h->type), (unsigned long long)h->key, unisum_dtype_name(h->dtype),
			 (unsigned long long)h->count, unisum_dtype_name(k->dtype),
			 (unsigned long long)k->count);
		return NULL;
	}
	uint32_t expect = k->next_round[c->worker] - (h->type == WIRE_PULL ? 1 : 0);
	if (h->round != expect || (h->type == WIRE_PULL && k->next_round[c->worker] == 0)) {
		snprintf(why, len, "%s of key 0x%llx for round %u, expected round %u",
			 wire_type_name(h->type), (unsigned long long)h->key, h->round, expect);
		return NULL;
	}
	return k;
}

/* A DECLARE_CHECK: the piece's key, dtype, count and its tensor's name. */
static int srv_on_declare_check(struct server *srv, struct srv_conn *c, const struct wire_hdr *h,
				char *why, size_t len)
{
	char name[256] = "";
	void *p = h->payload_len ? malloc(h->payload_len) : NULL;
	if (h->payload_len && p == NULL)
		return UNISUM_ENOMEM;
	if (h->payload_len && srv->tp->recv_payload(c->conn, p, h->payload_len) != 0) {
		free(p);
		snprintf(why, len, "connection closed in the middle of a declaration");
		return UNISUM_ECONN;
	}
	int bad = wire_declare_check_decode(p, h->payload_len, name, sizeof name);
	free(p);
	if (bad) {
		snprintf(why, len, "DECLARE_CHECK of key 0x%llx without a valid tensor name",
			 (unsigned long long)h->key);
		return UNISUM_EPROTO;
	}
	return srv_key_declare(srv, c, h, name, why, len);
}

/* Receives a push's data into worker c's buffer of key k: straight off
 * the socket (zero-copy receive), or read from the worker's memory at
 * the address the payload gives (IPC). */
static int srv_receive_push(struct server *srv, struct srv_conn *c, struct srv_key *k,
			    const struct wire_hdr *h, char *why, size_t len)
{
	if (k->push_buf[c->worker] == NULL)
		k->push_buf[c->worker] = malloc(k->bytes ? k->bytes : 1);
	if (k->push_buf[c->worker] == NULL) {
		snprintf(why, len, "out of memory for a %zu-byte push", k->bytes);
		return UNISUM_ENOMEM;
	}
	if (!(h->flags & WIRE_FLAG_IPC)) {
		if (srv->tp->recv_payload(c->conn, k->push_buf[c->worker], h->payload_len) == 0)
			return 0;
		snprintf(why, len, "connection closed in the middle of a push");
		return UNISUM_ECONN;
	}
	uint64_t addr;
	if (!c->ipc) {
		snprintf(why, len, "an IPC push from a worker that did not ask for IPC");
		return UNISUM_EPROTO;
	}
	if (srv->tp->recv_payload(c->conn, &addr, sizeof addr) != 0) {
		snprintf(why, len, "connection closed in the middle of a push");
		return UNISUM_ECONN;
	}
	return srv_ipc_read(c, k->push_buf[c->worker], le64toh(addr), k->bytes, why, len);
}

static int srv_on_push_msg(struct server *srv, struct srv_conn *c, const struct wire_hdr *h,
			   char *why, size_t len)
{
	struct srv_key *k = srv_check_data(srv, c, h, why, len);
	if (k == NULL)
		return UNISUM_EPROTO;
	if (srv_poison_of(srv, k->key) != NULL) {
		/* Never summed; the pull that follows gets the error. */
		k->next_round[c->worker]++;
		if (srv->tp->recv_payload(c->conn, NULL, h->payload_len) != 0)
			return UNISUM_ECONN;
		srv_ack_push(srv, c, h);
		return 0;
	}
	if (!(h->flags & WIRE_FLAG_ZERO)) {
		int rc = srv_receive_push(srv, c, k, h, why, len);
		if (rc != 0)
			return rc;
	}
	k->next_round[c->worker]++;
	/* The worker's credit comes back now, whatever the other workers
	 * do: acknowledging only summed pushes would let two workers wait
	 * on each other's credit. */
	srv_ack_push(srv, c, h);
	return srv_post(srv, EVENT_PUSH, k, c->worker, h->round, h->flags & WIRE_FLAG_ZERO, h->aux, NULL);
}

static int srv_on_pull_msg(struct server *srv, struct srv_conn *c, const struct wire_hdr *h,
			   char *why, size_t len)
{
	struct srv_key *k = srv_check_data(srv, c, h, why, len);
	if (k == NULL)
		return UNISUM_EPROTO;
	const char *poison = srv_poison_of(srv, k->key);
	if (poison != NULL) {
		srv_reply_error(srv, c, c->worker, k->key, h->round, UNISUM_EMISMATCH, poison);
		return 0;
	}
	return srv_post(srv, EVENT_PULL, k, c->worker, h->round, false, 0, NULL);
}

static int srv_on_retire_msg(struct server *srv, struct srv_conn *c, const struct wire_hdr *h,
			     char *why, size_t len)
{
	pthread_mutex_lock(&srv->lock);
	struct srv_key *k = srv_key_find(srv, h->key);
	bool retired = k != NULL && k->retired[c->worker];
	if (k != NULL)
		k->retired[c->worker] = 1;
	pthread_mutex_unlock(&srv->lock);
	if (k == NULL || retired) {
		snprintf(why, len, "RETIRE of %s key 0x%llx", k == NULL ? "undeclared" : "retired",
			 (unsigned long long)h->key);
		return UNISUM_EPROTO;
	}
	/* From now on this connection never touches the key's buffers. */
	return srv_post(srv, EVENT_RETIRE, k, c->worker, h->round, false, 0, NULL);
}

static int srv_on_message(struct server *srv, struct srv_conn *c, const struct wire_hdr *h, char *why,
			  size_t len)
{
	switch (h->type) {
	case WIRE_DECLARE_CHECK:
		return srv_on_declare_check(srv, c, h, why, len);
	case WIRE_PUSH:
		return srv_on_push_msg(srv, c, h, why, len);
	case WIRE_PULL:
		return srv_on_pull_msg(srv, c, h, why, len);
	case WIRE_RETIRE:
		return srv_on_retire_msg(srv, c, h, why, len);
	case WIRE_HEARTBEAT:
		return 0;
	default:
		snprintf(why, len, "unexpected %s from a worker", wire_type_name(h->type));
		return UNISUM_EPROTO;
	}
}

static void *srv_recv_main(void *arg)
{
	struct srv_conn *c = arg;
	struct server *srv = c->srv;
	char why[512] = "";
	/* Nobody without the job secret gets a byte read as a message. */
	int rc = srv->tp->authenticate(c->conn, why, sizeof why);
	for (; rc == 0;) {
		struct wire_hdr h;
		rc = srv->tp->recv_header(c->conn, &h, why, sizeof why);
		if (rc != 0)
			break;
		if (c->worker < 0)
			rc = srv_on_hello(srv, c, &h, why, sizeof why);
		else
			rc = srv_on_message(srv, c, &h, why, sizeof why);
		if (rc != 0)
			break;
	}
	const char *peer = srv->tp->peer_name(c->conn);
	char name[64];
	srv_worker_name(srv, c->worker, name, sizeof name);
	if (rc == UNISUM_ECONN && !atomic_load(&srv->stopping))
		LOG_INFO("%s (%s) disconnected", name, peer);
	else if (rc != UNISUM_ECONN && rc != 0) {
		if (c->worker >= 0)
			LOG_ERROR("closing the connection of %s (%s): %s", name, peer, why);
		else
			LOG_ERROR("closing a connection from %s: %s", peer, why);
		if (c->worker >= 0)	/* tell the worker why before hanging up */
			srv_reply_error(srv, c, c->worker, 0, 0, rc, why);
	}
	pthread_mutex_lock(&srv->lock);
	if (c->worker >= 0 && srv->by_worker[c->worker] == c)
		srv->by_worker[c->worker] = NULL;
	pthread_mutex_unlock(&srv->lock);
	/* Let the sender drain (the ERROR above goes out last), then hang up. */
	pthread_mutex_lock(&c->qlock);
	c->closing = true;
	pthread_cond_signal(&c->qcond);
	pthread_mutex_unlock(&c->qlock);
	if (rc == UNISUM_ECONN)
		srv->tp->conn_shutdown(c->conn);
	pthread_join(c->send_thread, NULL);
	c->send_started = false;
	srv->tp->conn_shutdown(c->conn);
	atomic_store(&c->finished, true);
	return NULL;
}

/* ---- lifecycle ---------------------------------------------------------- */

static void srv_notice(void *arg, int err, const char *why)
{
	struct server *srv = arg;
	if (err != UNISUM_ESHUTDOWN) {
		LOG_ERROR("stopping: %s", why);
		int none = 0;
		if (atomic_compare_exchange_strong(&srv->job_error, &none, err))
			atomic_store(&srv->told, true);
	} else {
		LOG_INFO("stopping: %s", why);
	}
	atomic_store(&srv->stopping, true);
	srv->tp->listener_shutdown(srv->listener);
}

static void srv_conn_free(struct server *srv, struct srv_conn *c)
{
	pthread_join(c->recv_thread, NULL);
	if (c->send_started)
		pthread_join(c->send_thread, NULL);
	for (struct srv_reply *r = c->head; r;) {
		struct srv_reply *next = r->next;
		free(r->owned);
		free(r);
		r = next;
	}
	srv->tp->conn_free(c->conn);
	pthread_mutex_destroy(&c->qlock);
	pthread_cond_destroy(&c->qcond);
	free(c);
}

/* Frees connections whose threads have ended (strangers that were
 * rejected), so a stream of bad connections cannot grow memory. */
static void srv_reap(struct server *srv)
{
	pthread_mutex_lock(&srv->lock);
	struct srv_conn **pp = &srv->conns;
	while (*pp) {
		struct srv_conn *c = *pp;
		if (atomic_load(&c->finished)) {
			*pp = c->next;
			pthread_mutex_unlock(&srv->lock);
			srv_conn_free(srv, c);
			pthread_mutex_lock(&srv->lock);
			pp = &srv->conns;
			continue;
		}
		pp = &c->next;
	}
	pthread_mutex_unlock(&srv->lock);
}

static void srv_accept_loop(struct server *srv)
{
	for (;;) {
		struct tp_conn *tc;
		int rc = srv->tp->accept(srv->listener, &tc);
		if (rc != 0)
			return;
		srv_reap(srv);
		struct srv_conn *c = calloc(1, sizeof *c);
		if (c == NULL) {
			srv->tp->conn_free(tc);
			continue;
		}
		c->srv = srv;
		c->conn = tc;
		c->worker = -1;
		pthread_mutex_init(&c->qlock, NULL);
		pthread_cond_init(&c->qcond, NULL);
		atomic_init(&c->finished, false);
		if (pthread_create(&c->send_thread, NULL, srv_send_main, c) == 0)
			c->send_started = true;
		if (!c->send_started || pthread_create(&c->recv_thread, NULL, srv_recv_main, c) != 0) {
			LOG_ERROR("cannot start threads for a connection from %s", srv->tp->peer_name(tc));
			pthread_mutex_lock(&c->qlock);
			c->closing = true;
			pthread_cond_signal(&c->qcond);
			pthread_mutex_unlock(&c->qlock);
			if (c->send_started)
				pthread_join(c->send_thread, NULL);
			srv->tp->conn_free(tc);
			free(c);
			continue;
		}
		pthread_mutex_lock(&srv->lock);
		c->next = srv->conns;
		srv->conns = c;
		pthread_mutex_unlock(&srv->lock);
	}
}

/* A server for cfg, with its tables and no thread yet; NULL when out of
 * memory. */
static struct server *srv_new(const struct config *cfg)
{
	struct server *srv = calloc(1, sizeof *srv);
	if (srv == NULL)
		return NULL;
	srv->cfg = cfg;
	srv->tp = transport_tcp();
	srv->nworkers = cfg->num_workers;
	srv->nengines = cfg->engine_threads;
	pthread_mutex_init(&srv->lock, NULL);
	srv->nbuckets = 1024;
	srv->buckets = calloc(srv->nbuckets, sizeof *srv->buckets);
	srv->by_worker = calloc((size_t)srv->nworkers, sizeof *srv->by_worker);
	srv->engines = calloc((size_t)srv->nengines, sizeof *srv->engines);
	if (srv->buckets == NULL || srv->by_worker == NULL || srv->engines == NULL) {
		free(srv->buckets);
		free(srv->by_worker);
		free(srv->engines);
		pthread_mutex_destroy(&srv->lock);
		free(srv);
		return NULL;
	}
	return srv;
}

/* Frees what srv_new made and every key left. */
static void srv_free(struct server *srv)
{
	for (size_t i = 0; i < srv->nbuckets; i++)
		for (struct srv_key *k = srv->buckets[i]; k;) {
			struct srv_key *next = k->next;
			srv_key_free(k, srv->nworkers);
			k = next;
		}
	free(srv->buckets);
	while (srv->poisoned) {
		struct srv_poison *p = srv->poisoned;
		srv->poisoned = p->next;
		free(p->why);
		free(p);
	}
	free(srv->by_worker);
	free(srv->engines);
	pthread_mutex_destroy(&srv->lock);
	free(srv);
}

/* Starts the engine threads; *started counts those running.  0 or
 * UNISUM_ESYS. */
static int srv_start_engines(struct server *srv, int *started)
{
	for (*started = 0; *started < srv->nengines; (*started)++) {
		struct srv_engine *e = &srv->engines[*started];
		e->srv = srv;
		pthread_mutex_init(&e->lock, NULL);
		timing_cond_init(&e->cond);
		if (pthread_create(&e->thread, NULL, srv_engine_main, e) != 0)
			return UNISUM_ESYS;
	}
	return 0;
}

/* Stops and joins the first `started` engines once their queues are
 * empty; later posts are dropped.  (A queued EVENT_FREE's key is out of
 * the table: freed here.) */
static void srv_stop_engines(struct server *srv, int started)
{
	for (int i = 0; i < started; i++) {
		struct srv_engine *e = &srv->engines[i];
		pthread_mutex_lock(&e->lock);
		e->stop = true;
		pthread_cond_signal(&e->cond);
		pthread_mutex_unlock(&e->lock);
		pthread_join(e->thread, NULL);
		pthread_mutex_lock(&e->lock);
		e->joined = true;
		pthread_mutex_unlock(&e->lock);
		free(e->keys);
		for (struct srv_event *ev = e->head; ev;) {
			struct srv_event *next = ev->next;
			if (ev->type == EVENT_FREE)
				srv_key_free(ev->key, srv->nworkers);
			free(ev);
			ev = next;
		}
	}
}

/* Registers with the scheduler as listening on bind_host:port and checks
 * that the job has the machines this server expects.  0 or an error
 * (logged; the client is freed). */
static int srv_join(struct server *srv, const char *bind_host, int port)
{
	int rc = rdv_client_new(srv->cfg, port, srv_notice, srv_tensor_error, srv, &srv->rdv);
	if (rc != 0)
		return rc;
	srv->id = rdv_client_id(srv->rdv);
	srv->rank = rdv_client_rank(srv->rdv);
	srv->local_size = rdv_client_local_size(srv->rdv);
	log_set_identity("server", srv->rank);
	if (rdv_client_num_machines(srv->rdv) != srv->nworkers) {
		char why[256];
		snprintf(why, sizeof why,
			 "server %d has UNISUM_NUM_WORKER=%d but the job has %d worker machines: give "
			 "every process the same UNISUM_NUM_WORKER (machines, not worker processes)",
			 srv->rank, srv->nworkers, rdv_client_num_machines(srv->rdv));
		rc = log_fail(UNISUM_ECONFIG, "%s", why);
		rdv_client_fail_job(srv->rdv, UNISUM_ECONFIG, why);
		rdv_client_free(srv->rdv);
		srv->rdv = NULL;
		return rc;
	}
	LOG_INFO("listening on %s:%d with %d engine threads, reducer %s", bind_host, port,
		 srv->nengines, reducer_isa_name(reducer_active_isa()));
	return 0;
}

/* The job ended: hangs up on every worker and joins its threads. */
static void srv_hang_up(struct server *srv)
{
	atomic_store(&srv->stopping, true);
	pthread_mutex_lock(&srv->lock);
	for (struct srv_conn *c = srv->conns; c; c = c->next)
		srv->tp->conn_shutdown(c->conn);
	pthread_mutex_unlock(&srv->lock);
	while (srv->conns) {
		struct srv_conn *c = srv->conns;
		srv->conns = c->next;
		srv_conn_free(srv, c);
	}
}

int server_run(const struct config *cfg, bool *elsewhere)
{
	if (elsewhere != NULL)
		*elsewhere = false;
	struct server *srv = srv_new(cfg);
	if (srv == NULL)
		return UNISUM_ENOMEM;
	int started = 0, port = 0;
	const char *bind_host = cfg->bind[0] ? cfg->bind : cfg->node_host;
	int rc = srv->tp->listen(bind_host, cfg->port, &srv->listener, &port);
	if (rc != 0)
		goto out_free;
	rc = srv_start_engines(srv, &started);
	if (rc == 0)
		rc = srv_join(srv, bind_host, port);
	if (rc != 0)
		goto out_stop_engines;

	srv_accept_loop(srv);

	/* Engines tell the scheduler of stalls and disagreements: they stop
	 * before its client goes. */
	srv_hang_up(srv);
	srv_stop_engines(srv, started);
	rdv_client_free(srv->rdv);
	rc = atomic_load(&srv->job_error);
	started = 0;
out_stop_engines:
	srv_stop_engines(srv, started);
	srv->tp->listener_free(srv->listener);
out_free:
	if (elsewhere != NULL && rc != 0)
		*elsewhere = atomic_load(&srv->told);
	srv_free(srv);
	return rc;
}
