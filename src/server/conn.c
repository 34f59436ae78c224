/*
 * conn.c - a worker's connection to the server, served by one of the
 * server's event loops (loop/conn.h): the loop authenticates, checks
 * every message's header against the key's state before its payload is
 * read, receives pushes straight into the key's buffers (or reads them
 * by address), and hands events to the engines; replies go out without
 * a copy, acks first, then sums straight from the keys' buffers.  See
 * server.c's DESIGN.
 */
#include <endian.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <unistd.h>

#include "log/log.h"
#include "reducer/reducer.h"
#include "rendezvous/rendezvous.h"
#include "server/srv_int.h"
#include "shm/shm.h"
#include "timing/timing.h"
#include "transport/transport.h"
#include "wire/wire.h"

/* ---- sending ------------------------------------------------------------ */

/* A reply sent or dropped: what it owned goes, its key is unpinned. */
static void srv_reply_release(struct loop_conn_msg *m)
{
	struct srv_reply *r = (struct srv_reply *)m;	/* msg is its first member */
	free(r->owned);
	if (r->pin != NULL)
		srv_key_unpin(r->pin);
	free(r);
}

/* Sends a reply on a connection (queued behind what is not yet out).
 * `owned` (may be NULL) is freed once the reply is sent or dropped; `pin`
 * (may be NULL), the key whose memory the payload is, stays allocated
 * until then.  A PUSH_ACK goes ahead of every queued sum (behind earlier
 * acks): the worker's credit waits on it, and behind megabytes of replies
 * on a slow link the pushes would stall while the replies drain, so
 * pushing and pulling would take turns instead of sharing the
 * full-duplex link.  The ack of a key still precedes that key's reply,
 * which is queued only after this push.  Any thread. */
void srv_conn_enqueue(struct srv_conn *c, const struct wire_hdr *h, const void *payload,
			     void *owned, struct srv_key *pin)
{
	struct srv_reply *r = malloc(sizeof *r);
	if (r == NULL) {
		char name[64];
		LOG_ERROR("out of memory queuing a reply to %s",
			  srv_worker_name(c->srv, c->worker, name, sizeof name));
		free(owned);
		return;
	}
	if (pin != NULL)
		atomic_fetch_add(&pin->pins, 1);
	*r = (struct srv_reply){.owned = owned, .pin = pin};
	r->msg.tx.hdr = *h;
	r->msg.tx.payload = payload;
	r->msg.urgent = h->type == WIRE_PUSH_ACK;
	r->msg.release = srv_reply_release;
	loop_conn_send_msg(c->lc, &r->msg);	/* a closed one releases it */
}

/* Tells a worker its PUSH arrived (it counts the bytes against its credit
 * until then).  Queued ahead of the sum's reply, so it always comes first. */
static void srv_ack_push(struct server *srv, struct srv_conn *c, const struct wire_hdr *push)
{
	struct wire_hdr ack = {.type = WIRE_PUSH_ACK, .sender = srv->id, .round = push->round,
			       .key = push->key};
	srv_conn_enqueue(c, &ack, NULL, NULL, NULL);
}

/* Peer p's connection, held until srv_conn_put (it is not freed while
 * a reply is being sent on it), or NULL when it is gone. */
static struct srv_conn *srv_conn_get(struct server *srv, int p)
{
	pthread_mutex_lock(&srv->lock);
	struct srv_conn *c = srv->by_worker[p];
	if (c != NULL)
		atomic_fetch_add(&c->refs, 1);
	pthread_mutex_unlock(&srv->lock);
	return c;
}

static void srv_conn_put(struct srv_conn *c)
{
	atomic_fetch_sub(&c->refs, 1);
}

/* Queues a reply to peer p (srv_int.h); dropped when its connection is
 * gone.  No lock is held while the socket takes it. */
void srv_queue_reply(struct server *srv, int p, const struct wire_hdr *h, struct srv_key *k,
		     const void *payload)
{
	struct srv_conn *c = srv_conn_get(srv, p);
	/* Over IPC the worker copies the sum from the payload itself: the
	 * buffer stays as it is until that worker's next push of the key. */
	if (c != NULL) {
		srv_conn_enqueue(c, h, payload, NULL, payload != NULL ? k : NULL);
		srv_conn_put(c);
	}
}

/* ---- receiving ---------------------------------------------------------- */

/* Handles the hello; returns 0 and sets c->worker (its peer index: the
 * machine of a local root, nworkers + rank for another rank, which pushes
 * only the tensors of its process sets), or UNISUM_EPROTO. */
static int srv_on_hello(struct server *srv, struct srv_conn *c, const struct wire_hdr *h, char *why,
			size_t len)
{
	if (h->type != WIRE_REGISTER || h->payload_len != 0) {
		snprintf(why, len, "first message is %s with %llu payload bytes, expected a worker "
			 "hello (REGISTER, no payload)", wire_type_name(h->type),
			 (unsigned long long)h->payload_len);
		return UNISUM_EPROTO;
	}
	const struct rdv_node *n = rdv_client_node_by_id(srv->rdv, h->sender);
	if (n != NULL && n->role == CONFIG_ROLE_SERVER && srv->replicate && n->rank != srv->rank) {
		c->from_server = true;	/* this one is its backup: it sends COPYs */
		c->from_rank = n->rank;
		c->worker = srv->npeers;
		LOG_INFO("server %d backs up server %d", srv->rank, n->rank);
		return 0;
	}
	if (n == NULL || n->role != CONFIG_ROLE_WORKER) {
		snprintf(why, len, "hello from node id %u, which is not a worker of this job", h->sender);
		return UNISUM_EPROTO;
	}
	if (n->machine < 0 || n->machine >= srv->nworkers || n->rank < 0 ||
	    n->rank >= srv->nworkers * srv->local_size) {
		snprintf(why, len, "worker rank %d is on machine %d, but this job has %d machines of "
			 "%d workers", n->rank, n->machine, srv->nworkers, srv->local_size);
		return UNISUM_EPROTO;
	}
	int peer = srv_rank_peer(srv, n->rank);
	pthread_mutex_lock(&srv->lock);
	int rc = 0;
	if (srv->by_worker[peer] != NULL) {
		char name[64];
		snprintf(why, len, "a second connection claims to be %s",
			 srv_worker_name(srv, peer, name, sizeof name));
		rc = UNISUM_EPROTO;
	} else {
		srv->by_worker[peer] = c;
		c->worker = peer;
		/* A rank whose lazy connections failed part way closed them all
		 * and tries again later (wk_ensure_conns): it is back. */
		srv->left[peer] = 0;
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
void srv_tensor_error(void *arg, uint64_t key, const char *why)
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

/* Why peer c cannot push key k (it is not one of its contributors). */
static void srv_not_contributor(struct server *srv, const struct srv_conn *c, const struct srv_key *k,
				const struct wire_hdr *h, char *why, size_t len)
{
	char name[64];
	srv_worker_name(srv, c->worker, name, sizeof name);
	if (k->peer == NULL)
		snprintf(why, len, "%s of key 0x%llx of '%s' from %s: only a machine's local root "
			 "pushes the tensors of the global set", wire_type_name(h->type),
			 (unsigned long long)h->key, k->name, name);
	else
		snprintf(why, len, "%s of key 0x%llx of '%s' from %s, which is not in the tensor's "
			 "process set", wire_type_name(h->type), (unsigned long long)h->key, k->name, name);
}

/* Validates a PUSH or PULL against the key's state; returns the key and
 * the sender's contributor index *w, or NULL with `why` set. */
static struct srv_key *srv_check_data(struct server *srv, struct srv_conn *c, const struct wire_hdr *h,
				      int *w, char *why, size_t len)
{
	/* A key this worker has not retired stays in the table until it does
	 * (on this thread): once the check below passes, k stays valid. */
	pthread_mutex_lock(&srv->lock);
	struct srv_key *k = srv_key_find(srv, h->key);
	*w = k != NULL ? srv_key_contrib(k, c->worker) : -1;
	bool retired = *w >= 0 && k->retired[*w];
	if (k != NULL && *w < 0)
		srv_not_contributor(srv, c, k, h, why, len);	/* under the lock: k may go */
	pthread_mutex_unlock(&srv->lock);
	if (k == NULL) {
		snprintf(why, len, "%s of undeclared key 0x%llx", wire_type_name(h->type),
			 (unsigned long long)h->key);
		return NULL;
	}
	if (*w < 0)
		return NULL;
	if (retired) {
		snprintf(why, len, "%s of key 0x%llx, which this worker retired",
			 wire_type_name(h->type), (unsigned long long)h->key);
		return NULL;
	}
	bool data = h->type == WIRE_PUSH || h->type == WIRE_RESTORE;
	if (h->dtype != k->dtype || (data && h->count != k->count)) {
		snprintf(why, len, "%s of key 0x%llx as %s[%llu], declared %s[%llu]",
			 wire_type_name(h->type), (unsigned long long)h->key, unisum_dtype_name(h->dtype),
			 (unsigned long long)h->count, unisum_dtype_name(k->dtype),
			 (unsigned long long)k->count);
		return NULL;
	}
	/* A PULL, and a RESTORE (the round this worker received last), are of
	 * the round it pushed last. */
	bool last = h->type == WIRE_PULL || h->type == WIRE_RESTORE;
	uint32_t expect = k->next_round[*w] - (last ? 1 : 0);
	if (h->round != expect || (last && k->next_round[*w] == 0)) {
		snprintf(why, len, "%s of key 0x%llx for round %u, expected round %u",
			 wire_type_name(h->type), (unsigned long long)h->key, h->round, expect);
		return NULL;
	}
	return k;
}

/* A DECLARE_CHECK (its payload p): the piece's key, dtype, count and its
 * tensor's name. */
static int srv_on_declare_check(struct server *srv, struct srv_conn *c, const struct wire_hdr *h,
				const void *p, char *why, size_t len)
{
	char name[256] = "", spec[WIRE_SPEC_MAX] = "";
	int R = srv->nworkers * srv->local_size, n = 0;
	int *members = malloc((size_t)R * sizeof *members);
	if (members == NULL)
		return UNISUM_ENOMEM;
	int bad = wire_declare_check_decode(p, h->payload_len, name, sizeof name, members, R, &n,
					    spec, sizeof spec);
	if (bad || (n > 0 && members[n - 1] >= R)) {
		free(members);
		snprintf(why, len, "DECLARE_CHECK of key 0x%llx without a valid tensor name and process "
			 "set (ranks below %d, increasing)", (unsigned long long)h->key, R);
		return UNISUM_EPROTO;
	}
	int rc = srv_key_declare(srv, c, h, name, members, n, spec, why, len);
	free(members);
	if (rc == UNISUM_EREMOTE) {
		/* An acknowledged update has no copy left: the job fails,
		 * naming the key, through the scheduler. */
		LOG_ERROR("%s", why);
		rdv_client_fail_job(srv->rdv, UNISUM_ECONN, why);
		return 0;
	}
	return rc;
}

/* Contributor w's buffer of key k, where its pushes are received:
 * straight off the socket (zero-copy receive), or, over IPC, read from
 * the worker's memory by the transport.  NULL with why when out of
 * memory. */
static uint8_t *srv_push_buf(struct srv_key *k, int w, char *why, size_t len)
{
	size_t bytes = k->comp.kind != COMPRESS_NONE ? k->wire_bytes : k->bytes;
	if (k->push_buf[w] == NULL)
		k->push_buf[w] = srv_key_buf(k, bytes);
	if (k->push_buf[w] == NULL)
		snprintf(why, len, "out of memory for a %zu-byte push", bytes);
	return k->push_buf[w];
}

/* Whether a push of key k is what the key takes as compressed bytes: a
 * raw key takes none, a compressed key only its codec's encoding. */
static bool srv_push_encoding_fits(const struct srv_key *k, const struct wire_hdr *h)
{
	bool flagged = (h->flags & WIRE_FLAG_COMPRESSED) != 0;
	if (k->comp.kind == COMPRESS_NONE)
		return !flagged;
	return flagged && h->payload_len == k->wire_bytes;
}

/* A push that does not fit its key's encoding (srv_push_encoding_fits) is
 * read and dropped, and the key refused: every pull of it fails with the
 * reason, while the connection and the other keys go on.  What the bytes
 * of a push that fits decode to is checked by the engine as it sums. */
static int srv_refuse_push(struct server *srv, struct srv_conn *c, struct srv_key *k, int w,
			   const struct wire_hdr *h)
{
	int rc;
	k->next_round[w]++;
	srv_ack_push(srv, c, h);
	char msg[512], who[64];
	srv_worker_name(srv, c->worker, who, sizeof who);
	if (k->comp.kind == COMPRESS_NONE)
		snprintf(msg, sizeof msg, "tensor '%s' (partition %u) round %u: %s pushed a compressed "
			 "partition, but the tensor was declared uncompressed; the tensor is refused",
			 k->name, (unsigned)(k->key & 0xffff), h->round, who);
	else if (!(h->flags & WIRE_FLAG_COMPRESSED))
		snprintf(msg, sizeof msg, "tensor '%s' (partition %u) round %u: %s pushed an "
			 "uncompressed partition, but the tensor was declared '%s'; the tensor is "
			 "refused", k->name, (unsigned)(k->key & 0xffff), h->round, who, k->comp_text);
	else
		snprintf(msg, sizeof msg, "tensor '%s' (partition %u) round %u: %s pushed %llu bytes, "
			 "but %llu elements compressed '%s' take %zu; the tensor is refused", k->name,
			 (unsigned)(k->key & 0xffff), h->round, who, (unsigned long long)h->payload_len,
			 (unsigned long long)k->count, k->comp_text, k->wire_bytes);
	char *text = strdup(msg);
	if (text == NULL)
		return UNISUM_ENOMEM;
	rc = srv_post(srv, EVENT_REFUSE, k, w, h->round, false, 0, text);
	if (rc != 0)
		free(text);
	return rc;
}

/* MIGRATE: each key goes to a replacement server from the first round
 * that no push here has been accepted for (nor any worker declared it
 * completed). */
void srv_on_migrate(void *arg, const struct rdv_failover *f)
{
	struct server *srv = arg;
	int n = 0;
	pthread_mutex_lock(&srv->lock);
	for (uint32_t i = 0; i < f->n; i++) {
		struct srv_key *k = srv_key_find(srv, f->keys[i]);
		if (k == NULL || k->moved_to >= 0 || k->server_held || k->comp.kind != COMPRESS_NONE)
			continue;
		uint32_t at = k->claimed;
		for (int w = 0; w < k->nc; w++)
			if (k->next_round[w] > at)
				at = k->next_round[w];
		k->moved_at = at;
		k->moved_to = (int)f->servers[i];
		n++;
	}
	pthread_mutex_unlock(&srv->lock);
	LOG_INFO("%d keys move to server %d from their next round", n, f->dead);
}

/* Whether a push or pull of key k, round `round`, goes to the server k
 * moved to (the push is then refused with MOVED, the pull dropped); else,
 * for a push, claims the round here.  Under srv->lock. */
static bool srv_moved(struct server *srv, struct srv_key *k, uint32_t round, bool push)
{
	pthread_mutex_lock(&srv->lock);
	bool moved = k->moved_to >= 0 && round >= k->moved_at;
	if (!moved && push && round + 1 > k->claimed)
		k->claimed = round + 1;
	pthread_mutex_unlock(&srv->lock);
	return moved;
}

/* A PUSH's header: checked, and what its payload is for (c->pend). */
static int srv_push_head(struct server *srv, struct srv_conn *c, const struct wire_hdr *h,
			 char *why, size_t len)
{
	int w;
	struct srv_key *k = srv_check_data(srv, c, h, &w, why, len);
	if (k == NULL)
		return UNISUM_EPROTO;
	c->pend = (struct srv_pend){.kind = PEND_PUSH, .k = k, .w = w};
	if (srv_moved(srv, k, h->round, true))
		c->pend.kind = PEND_MOVED;
	else if (srv_poison_of(srv, k->key) != NULL)
		c->pend.kind = PEND_POISON;	/* never summed; the pull that follows gets the error */
	else if (!srv_push_encoding_fits(k, h))
		c->pend.kind = PEND_REFUSE;
	else if (!(h->flags & WIRE_FLAG_ZERO) && h->payload_len > 0 &&
		 (c->pend.buf = srv_push_buf(k, w, why, len)) == NULL)
		return UNISUM_ENOMEM;
	return 0;
}

/* A whole PUSH's own part: summed, acknowledged, or refused. */
static int srv_push_handle(struct server *srv, struct srv_conn *c, const struct wire_hdr *h)
{
	struct srv_key *k = c->pend.k;
	int w = c->pend.w;
	switch (c->pend.kind) {
	case PEND_MOVED: {
		struct wire_hdr moved = {.type = WIRE_MOVED, .sender = srv->id, .round = h->round,
					 .key = h->key, .aux = (uint32_t)k->moved_to};
		srv_conn_enqueue(c, &moved, NULL, NULL, NULL);
		return 0;
	}
	case PEND_POISON:
		k->next_round[w]++;
		srv_ack_push(srv, c, h);
		return 0;
	case PEND_REFUSE:
		return srv_refuse_push(srv, c, k, w, h);
	default:
		break;
	}
	k->next_round[w]++;
	if (!(h->flags & WIRE_FLAG_ZERO))
		atomic_fetch_add(&srv->bytes_in, k->comp.kind != COMPRESS_NONE ? k->wire_bytes : k->bytes);
	/* The worker's credit comes back now, whatever the other workers
	 * do: acknowledging only summed pushes would let two workers wait
	 * on each other's credit. */
	srv_ack_push(srv, c, h);
	return srv_post(srv, EVENT_PUSH, k, w, h->round, h->flags & WIRE_FLAG_ZERO, h->aux, NULL);
}

static int srv_on_pull_msg(struct server *srv, struct srv_conn *c, const struct wire_hdr *h,
			   char *why, size_t len)
{
	pthread_mutex_lock(&srv->lock);
	struct srv_key *mk = srv_key_find(srv, h->key);
	bool moved = mk != NULL && mk->moved_to >= 0 && h->round >= mk->moved_at;
	pthread_mutex_unlock(&srv->lock);
	if (moved)
		return 0;	/* its push was refused: the worker pulls it elsewhere */
	int w;
	struct srv_key *k = srv_check_data(srv, c, h, &w, why, len);
	if (k == NULL)
		return UNISUM_EPROTO;
	const char *poison = srv_poison_of(srv, k->key);
	if (poison != NULL) {
		srv_reply_error(srv, c, c->worker, k->key, h->round, UNISUM_EMISMATCH, poison);
		return 0;
	}
	/* The event's `zero` says SKIP: answer without the data. */
	return srv_post(srv, EVENT_PULL, k, w, h->round, (h->flags & WIRE_FLAG_SKIP) != 0, 0, NULL);
}

/* A whole PUSH (srv_push_head said what it is for), and the PULL it
 * carries (WIRE_FLAG_PULL): handled as the PULL the worker would have
 * sent right after it. */
static int srv_push_done(struct server *srv, struct srv_conn *c, const struct wire_hdr *h,
			 char *why, size_t len)
{
	int rc = srv_push_handle(srv, c, h);
	if (rc != 0 || !(h->flags & WIRE_FLAG_PULL))
		return rc;
	struct wire_hdr pull = *h;
	pull.type = WIRE_PULL;
	pull.flags = 0;
	pull.aux = 0;
	pull.count = 0;
	pull.payload_len = 0;
	return srv_on_pull_msg(srv, c, &pull, why, len);
}

/* A RESTORE's header (failover: the sum of the round this worker last
 * received from a lost server, for the workers that did not; of an async
 * key, with replicas, the worker's last push that server answered):
 * checked, and a buffer for the bytes (c->pend). */
static int srv_restore_head(struct server *srv, struct srv_conn *c, const struct wire_hdr *h,
			    char *why, size_t len)
{
	int w;
	struct srv_key *k = srv_check_data(srv, c, h, &w, why, len);
	if (k == NULL)
		return UNISUM_EPROTO;
	/* A compressed key's: the worker's last push answered, encoded; a
	 * PUSHED one's: its last push answered (ZERO: none). */
	bool comp = k->comp.kind != COMPRESS_NONE, pushed = (h->flags & WIRE_FLAG_PUSHED) != 0;
	size_t want = comp ? k->wire_bytes : (h->flags & WIRE_FLAG_ZERO) ? 0 : k->bytes;
	if ((k->server_held && (!srv->replicate || pushed)) || h->payload_len != want ||
	    comp != ((h->flags & WIRE_FLAG_COMPRESSED) != 0)) {
		snprintf(why, len, "RESTORE of key 0x%llx of '%s', which is %s", (unsigned long long)h->key,
			 k->name, k->server_held ? "async" : comp ? "compressed otherwise"
			 : "of another size");
		return UNISUM_EPROTO;
	}
	c->pend = (struct srv_pend){.kind = PEND_BUF, .k = k, .w = w};
	if (want == 0)
		return 0;
	c->pend.buf = malloc(want ? want : 1);
	if (c->pend.buf == NULL) {
		snprintf(why, len, "out of memory for a %zu-byte RESTORE", want);
		return UNISUM_ENOMEM;
	}
	return 0;
}

/* A whole RESTORE: its sum goes to the key's engine. */
static int srv_restore_done(struct server *srv, struct srv_conn *c, const struct wire_hdr *h)
{
	uint8_t *data = c->pend.buf;
	c->pend.buf = NULL;
	bool pushed = (h->flags & WIRE_FLAG_PUSHED) != 0;
	int rc = srv_post(srv, pushed ? EVENT_RESTORE_PUSH : EVENT_RESTORE, c->pend.k, c->pend.w,
			  h->round, (h->flags & WIRE_FLAG_ZERO) != 0, pushed ? h->aux : 0,
			  (const char *)data);
	if (rc != 0)
		free(data);
	return rc;
}

static int srv_on_retire_msg(struct server *srv, struct srv_conn *c, const struct wire_hdr *h,
			     char *why, size_t len)
{
	pthread_mutex_lock(&srv->lock);
	struct srv_key *k = srv_key_find(srv, h->key);
	int w = k != NULL ? srv_key_contrib(k, c->worker) : -1;
	bool retired = w >= 0 && k->retired[w];
	if (w >= 0)
		k->retired[w] = 1;
	else if (k != NULL)
		srv_not_contributor(srv, c, k, h, why, len);
	pthread_mutex_unlock(&srv->lock);
	if (k != NULL && w < 0)
		return UNISUM_EPROTO;
	if (k == NULL || retired) {
		snprintf(why, len, "RETIRE of %s key 0x%llx", k == NULL ? "undeclared" : "retired",
			 (unsigned long long)h->key);
		return UNISUM_EPROTO;
	}
	/* From now on this connection never touches the key's buffers. */
	return srv_post(srv, EVENT_RETIRE, k, w, h->round, false, 0, NULL);
}

/* A message's header came (c->pend is clear): checked where its payload
 * decides where that goes, and what the payload is for (c->pend). */
static int srv_head(struct server *srv, struct srv_conn *c, const struct wire_hdr *h, char *why,
		    size_t len)
{
	switch (h->type) {
	case WIRE_PUSH:
		return srv_push_head(srv, c, h, why, len);
	case WIRE_RESTORE:
		return srv_restore_head(srv, c, h, why, len);
	case WIRE_DECLARE_CHECK:
		c->pend.kind = PEND_BUF;
		c->pend.buf = malloc(h->payload_len ? h->payload_len : 1);
		if (c->pend.buf == NULL) {
			snprintf(why, len, "out of memory for a %llu-byte declaration",
				 (unsigned long long)h->payload_len);
			return UNISUM_ENOMEM;
		}
		return 0;
	default:
		return 0;	/* nothing to place: a payload is dropped */
	}
}

/* A whole message from worker c (srv_head ran on its header). */
static int srv_on_message(struct server *srv, struct srv_conn *c, const struct wire_hdr *h, char *why,
			  size_t len)
{
	switch (h->type) {
	case WIRE_DECLARE_CHECK:
		return srv_on_declare_check(srv, c, h, c->pend.buf, why, len);
	case WIRE_PUSH:
		return srv_push_done(srv, c, h, why, len);
	case WIRE_PULL:
		return srv_on_pull_msg(srv, c, h, why, len);
	case WIRE_RETIRE:
		return srv_on_retire_msg(srv, c, h, why, len);
	case WIRE_RESTORE:
		return srv_restore_done(srv, c, h);
	case WIRE_HEARTBEAT:
		return 0;
	default:
		snprintf(why, len, "unexpected %s from a worker", wire_type_name(h->type));
		return UNISUM_EPROTO;
	}
}

/* ---- the connection on its loop ------------------------------------------ */

/* The loop serves a worker's connection: it authenticates the peer (no
 * byte of one without the job secret is read as a message), takes its
 * HELLO, then reads each message and hands it to its handler
 * (DECLARE_CHECK, PUSH into the key's buffer, PULL, RETIRE, RESTORE),
 * which queues events for the key's engine.  A message's header is
 * checked before its payload is read (srv_head), so a push goes straight
 * into the key's buffer.  A malformed message or a read error closes this
 * connection alone, naming the worker. */
static int srv_on_header(struct loop_conn *lc, struct tp_rx *rx, char *why, size_t len)
{
	struct srv_conn *c = loop_conn_arg(lc);
	if (c->worker < 0)
		return srv_on_hello(c->srv, c, &rx->hdr, why, len);	/* no payload: refused */
	int rc = c->from_server ? srv_copy_head(c->srv, c, &rx->hdr, why, len)
				: srv_head(c->srv, c, &rx->hdr, why, len);
	rx->dst = c->pend.kind == PEND_PUSH || c->pend.kind == PEND_BUF ? c->pend.buf : NULL;
	return rc;
}

/* The held DECLARE_CHECK's timer: once the key is gone (or the wait is
 * over), it is handled, and reading resumes. */
static void srv_held_retry(struct loop_timer *t)
{
	struct srv_conn *c = t->arg;
	struct server *srv = c->srv;
	if (srv_key_awaits_retires(srv, c, c->held_h.key) && !atomic_load(&srv->stopping) &&
	    timing_now_ms() < c->held_until_ms)
		return;
	loop_timer_stop(c->loop, &c->held_timer);
	char why[512] = "";
	c->pend = (struct srv_pend){.kind = PEND_BUF, .buf = c->held};
	c->held = NULL;
	int rc = srv_on_message(srv, c, &c->held_h, why, sizeof why);
	free(c->pend.buf);
	c->pend = (struct srv_pend){0};
	if (rc != 0)
		loop_conn_close(c->lc, rc, why);
	else
		loop_conn_resume(c->lc);
}

/* A DECLARE_CHECK of a key this worker undeclared while the others have
 * not all: held (the loop serves the others meanwhile, whose RETIREs free
 * the key).  Whether it was. */
static bool srv_hold_declare(struct server *srv, struct srv_conn *c, const struct wire_hdr *h)
{
	if (h->type != WIRE_DECLARE_CHECK || !srv_key_awaits_retires(srv, c, h->key))
		return false;
	c->held_h = *h;
	c->held = c->pend.buf;
	c->pend = (struct srv_pend){0};
	c->held_until_ms = timing_now_ms() + srv->cfg->timeout_ms;
	loop_conn_pause(c->lc);
	loop_timer_start(c->loop, &c->held_timer, 10, 10, srv_held_retry, c);
	return true;
}

static int srv_on_msg(struct loop_conn *lc, const struct wire_hdr *h, void *payload, char *why,
		      size_t len)
{
	(void)payload;	/* where srv_on_header put it */
	struct srv_conn *c = loop_conn_arg(lc);
	struct server *srv = c->srv;
	if (c->worker < 0)
		return srv_on_hello(srv, c, h, why, len);
	int rc = 0;
	if (c->from_server) {
		if (h->payload_len == 0)
			rc = srv_copy_head(srv, c, h, why, len);
		if (rc == 0)
			rc = srv_copy_message(srv, c, h, why, len);
		free(c->pend.buf);
		c->pend = (struct srv_pend){0};
		return rc;
	}
	if (h->payload_len == 0)	/* srv_on_header was not called */
		rc = srv_head(srv, c, h, why, len);
	if (rc == 0 && srv_hold_declare(srv, c, h))
		return 0;
	if (rc == 0)
		rc = srv_on_message(srv, c, h, why, len);
	if (c->pend.kind == PEND_BUF)
		free(c->pend.buf);
	c->pend = (struct srv_pend){0};
	return rc;
}

/* The loop is done with c (posted by srv_on_closed): it may be freed. */
static void srv_conn_done(void *arg)
{
	struct srv_conn *c = arg;
	atomic_store(&c->finished, true);
}

/* The connection ended: logged, a last word to the worker (why it was
 * closed: a worker of another wire version then names both versions),
 * and its peer no longer served. */
static void srv_on_closed(struct loop_conn *lc, int rc, const char *why)
{
	struct srv_conn *c = loop_conn_arg(lc);
	struct server *srv = c->srv;
	if (c->pend.kind == PEND_BUF)
		free(c->pend.buf);
	c->pend = (struct srv_pend){0};
	loop_timer_stop(c->loop, &c->held_timer);
	free(c->held);
	c->held = NULL;
	const char *peer = c->tp->peer_name(c->conn);
	char name[64];
	srv_worker_name(srv, c->worker, name, sizeof name);
	if (rc == UNISUM_ENOMEM)	/* the job ends: every process names this one */
		srv_out_of_memory(srv, why);
	if (rc == UNISUM_ECONN && !atomic_load(&srv->stopping)) {
		LOG_INFO("%s (%s) disconnected", name, peer);
	} else if (rc != UNISUM_ECONN && rc != 0) {
		if (c->worker >= 0)
			LOG_ERROR("closing the connection of %s (%s): %s", name, peer, why);
		else
			LOG_ERROR("closing a connection from %s: %s", peer, why);
		if (rc != UNISUM_EAUTH) {
			srv_reply_error(srv, c, c->worker, 0, 0, rc, why);
			loop_conn_flush(lc, 200);
		}
	}
	if (c->from_server)
		srv_copies_link_closed(srv, c->from_rank);
	pthread_mutex_lock(&srv->lock);
	if (c->worker >= 0 && !c->from_server && srv->by_worker[c->worker] == c) {
		srv->by_worker[c->worker] = NULL;
		/* Rounds still waiting for it never end; in an elastic job the
		 * scheduler re-forms the job without it instead. */
		srv->left[c->worker] = srv->cfg->elastic ? 0 : timing_now_ms();
	}
	pthread_mutex_unlock(&srv->lock);
	if (loop_post(c->loop, srv_conn_done, c) != 0)
		LOG_ERROR("out of memory: the connection of %s is kept until the server stops", name);
}

static const struct loop_conn_ops srv_conn_ops = {
	.on_header = srv_on_header,
	.on_message = srv_on_msg,
	.on_closed = srv_on_closed,
};

void srv_conn_start(void *arg)
{
	struct srv_conn *c = arg;
	c->held_timer.slot = -1;
	int rc = loop_conn_new(c->loop, c->tp, c->conn, true, &srv_conn_ops, c, &c->lc);
	if (rc != 0) {
		LOG_ERROR("cannot serve the connection from %s: %s", c->tp->peer_name(c->conn),
			  unisum_strerror(rc));
		c->tp->conn_free(c->conn);
		c->conn = NULL;
		atomic_store(&c->finished, true);
	}
}

/* Answers peer p's pull of key `key` with an error instead of a sum (on
 * connection c when the caller has it). */
void srv_reply_error(struct server *srv, struct srv_conn *c, int p, uint64_t key, uint32_t round,
			    int err, const char *why)
{
	struct wire_buf b;
	wire_buf_init(&b);
	struct wire_hdr h = {.sender = srv->id, .key = key, .round = round};
	if (wire_error_build(&h, &b, err, why) == 0) {
		if (c != NULL) {
			srv_conn_enqueue(c, &h, b.data, b.data, NULL);
		} else {
			struct srv_conn *to = srv_conn_get(srv, p);
			if (to != NULL) {
				srv_conn_enqueue(to, &h, b.data, b.data, NULL);
				srv_conn_put(to);
			} else {
				free(b.data);
			}
		}
		b.data = NULL;
	}
	wire_buf_fini(&b);
}
