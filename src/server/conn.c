/*
 * conn.c - a worker's connection to the server: the receiving thread
 * (authenticates, validates every message against the key's state,
 * receives pushes straight into the key's buffers or reads them by
 * address, hands events to the engines) and the sending thread (acks
 * first, then replies straight from the sums).  See server.c's DESIGN.
 */
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
#include "server/srv_int.h"
#include "shm/shm.h"
#include "timing/timing.h"
#include "transport/transport.h"
#include "wire/wire.h"

/* ---- sending ------------------------------------------------------------ */

/* A reply sent or dropped: what it owned goes, its key is unpinned. */
void srv_reply_free(struct srv_reply *r)
{
	free(r->owned);
	if (r->pin != NULL)
		srv_key_unpin(r->pin);
	free(r);
}

/* Appends a reply to a connection's queue, unless it is closing.  `owned`
 * (may be NULL) is freed once the reply is sent or dropped; `pin` (may be
 * NULL), the key whose memory the payload is, stays allocated until then.  A PUSH_ACK
 * goes ahead of every queued sum (behind earlier acks): the worker's credit
 * waits on it, and behind megabytes of replies on a slow link the pushes
 * would stall while the replies drain, so pushing and pulling would take
 * turns instead of sharing the full-duplex link.  The ack of a key still
 * precedes that key's reply, which is queued only after this push. */
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
	*r = (struct srv_reply){.hdr = *h, .payload = payload, .owned = owned, .pin = pin};
	pthread_mutex_lock(&c->qlock);
	if (c->closing) {
		srv_reply_free(r);
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
	srv_conn_enqueue(c, &ack, NULL, NULL, NULL);
}

/* Queues a reply to peer p (srv_int.h); dropped when its connection is gone. */
void srv_queue_reply(struct server *srv, int p, const struct wire_hdr *h, struct srv_key *k,
		     const void *payload)
{
	pthread_mutex_lock(&srv->lock);
	struct srv_conn *c = srv->by_worker[p];
	/* Over IPC the worker copies the sum from the payload itself: the
	 * buffer stays as it is until that worker's next push of the key. */
	if (c != NULL)
		srv_conn_enqueue(c, h, payload, NULL, payload != NULL ? k : NULL);
	pthread_mutex_unlock(&srv->lock);
}

/* Writes queued replies in order; after `closing` it drains what is left
 * (an ERROR explaining the close goes out last) and exits. */
void *srv_send_main(void *arg)
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
		if (!broken && c->tp->send(c->conn, &r->hdr, r->payload) != 0) {
			broken = true;
			char name[64];
			LOG_INFO("sending to %s (%s) failed; closing its connection",
				 srv_worker_name(srv, c->worker, name, sizeof name), c->tp->peer_name(c->conn));
			c->tp->conn_shutdown(c->conn);
		}
		srv_reply_free(r);
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
		srv->left[peer] = false;
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

/* A DECLARE_CHECK: the piece's key, dtype, count and its tensor's name. */
static int srv_on_declare_check(struct server *srv, struct srv_conn *c, const struct wire_hdr *h,
				char *why, size_t len)
{
	char name[256] = "", spec[WIRE_SPEC_MAX] = "";
	int R = srv->nworkers * srv->local_size, n = 0;
	int *members = malloc((size_t)R * sizeof *members);
	void *p = h->payload_len ? malloc(h->payload_len) : NULL;
	if (members == NULL) {
		free(p);
		return UNISUM_ENOMEM;
	}
	if (h->payload_len && p == NULL) {
		free(members);
		return UNISUM_ENOMEM;
	}
	if (h->payload_len && c->tp->recv_payload(c->conn, p, h->payload_len) != 0) {
		free(p);
		free(members);
		snprintf(why, len, "connection closed in the middle of a declaration");
		return UNISUM_ECONN;
	}
	int bad = wire_declare_check_decode(p, h->payload_len, name, sizeof name, members, R, &n,
					    spec, sizeof spec);
	free(p);
	if (bad || (n > 0 && members[n - 1] >= R)) {
		free(members);
		snprintf(why, len, "DECLARE_CHECK of key 0x%llx without a valid tensor name and process "
			 "set (ranks below %d, increasing)", (unsigned long long)h->key, R);
		return UNISUM_EPROTO;
	}
	int rc = srv_key_declare(srv, c, h, name, members, n, spec, why, len);
	free(members);
	return rc;
}

/* Receives a push's data into worker c's buffer of key k: straight off
 * the socket (zero-copy receive), or, over IPC, read from the worker's
 * memory by the transport. */
static int srv_receive_push(struct srv_conn *c, struct srv_key *k, int w,
			    const struct wire_hdr *h, char *why, size_t len)
{
	size_t bytes = k->comp.kind != COMPRESS_NONE ? k->wire_bytes : k->bytes;
	if (k->push_buf[w] == NULL)
		k->push_buf[w] = malloc(bytes ? bytes : 1);
	if (k->push_buf[w] == NULL) {
		snprintf(why, len, "out of memory for a %zu-byte push", bytes);
		return UNISUM_ENOMEM;
	}
	int rc = c->tp->recv_payload(c->conn, k->push_buf[w], h->payload_len);
	if (rc == UNISUM_ECONN)
		snprintf(why, len, "connection closed in the middle of a push");
	else if (rc != 0)
		snprintf(why, len, "%s", log_last_error());
	return rc;
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
	int rc = c->tp->recv_payload(c->conn, NULL, h->payload_len);
	if (rc != 0)
		return rc;
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

static int srv_on_push_msg(struct server *srv, struct srv_conn *c, const struct wire_hdr *h,
			   char *why, size_t len)
{
	int w;
	struct srv_key *k = srv_check_data(srv, c, h, &w, why, len);
	if (k == NULL)
		return UNISUM_EPROTO;
	if (srv_moved(srv, k, h->round, true)) {
		if (c->tp->recv_payload(c->conn, NULL, h->payload_len) != 0)
			return UNISUM_ECONN;
		struct wire_hdr moved = {.type = WIRE_MOVED, .sender = srv->id, .round = h->round,
					 .key = h->key, .aux = (uint32_t)k->moved_to};
		srv_conn_enqueue(c, &moved, NULL, NULL, NULL);
		return 0;
	}
	if (srv_poison_of(srv, k->key) != NULL) {
		/* Never summed; the pull that follows gets the error. */
		k->next_round[w]++;
		if (c->tp->recv_payload(c->conn, NULL, h->payload_len) != 0)
			return UNISUM_ECONN;
		srv_ack_push(srv, c, h);
		return 0;
	}
	if (!srv_push_encoding_fits(k, h))
		return srv_refuse_push(srv, c, k, w, h);
	if (!(h->flags & WIRE_FLAG_ZERO)) {
		int rc = srv_receive_push(c, k, w, h, why, len);
		if (rc != 0)
			return rc;
	}
	k->next_round[w]++;
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

/* A RESTORE (failover): the sum of the round this worker last received
 * from a lost server, for the workers that did not. */
static int srv_on_restore_msg(struct server *srv, struct srv_conn *c, const struct wire_hdr *h,
			      char *why, size_t len)
{
	int w;
	struct srv_key *k = srv_check_data(srv, c, h, &w, why, len);
	if (k == NULL)
		return UNISUM_EPROTO;
	if (k->comp.kind != COMPRESS_NONE || k->server_held) {
		snprintf(why, len, "RESTORE of key 0x%llx of '%s', which is %s", (unsigned long long)h->key,
			 k->name, k->server_held ? "async" : "compressed");
		return UNISUM_EPROTO;
	}
	uint8_t *data = malloc(k->bytes ? k->bytes : 1);
	if (data == NULL) {
		snprintf(why, len, "out of memory for a %zu-byte RESTORE", k->bytes);
		return UNISUM_ENOMEM;
	}
	int rc = c->tp->recv_payload(c->conn, data, h->payload_len);
	if (rc != 0) {
		free(data);
		snprintf(why, len, "connection closed in the middle of a RESTORE");
		return rc;
	}
	rc = srv_post(srv, EVENT_RESTORE, k, w, h->round, false, 0, (const char *)data);
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
	case WIRE_RESTORE:
		return srv_on_restore_msg(srv, c, h, why, len);
	case WIRE_HEARTBEAT:
		return 0;
	default:
		snprintf(why, len, "unexpected %s from a worker", wire_type_name(h->type));
		return UNISUM_EPROTO;
	}
}

/* A worker connection's receiving thread, one per connection.  Serves:
 * authenticates the peer, takes its HELLO, then reads each message and
 * hands it to its handler (DECLARE_CHECK, PUSH into the key's buffer,
 * PULL, RETIRE, RESTORE), which queues events for the key's engine.  Owns
 * the connection's reading side; a malformed message or a read error
 * closes this connection alone, naming the worker.  Blocks in
 * recv_header and on the payloads it reads. */
void *srv_recv_main(void *arg)
{
	struct srv_conn *c = arg;
	struct server *srv = c->srv;
	char why[512] = "";
	/* Nobody without the job secret gets a byte read as a message. */
	int rc = c->tp->authenticate(c->conn, why, sizeof why);
	for (; rc == 0;) {
		struct wire_hdr h;
		rc = c->tp->recv_header(c->conn, &h, why, sizeof why);
		if (rc != 0)
			break;
		if (c->worker < 0)
			rc = srv_on_hello(srv, c, &h, why, sizeof why);
		else
			rc = srv_on_message(srv, c, &h, why, sizeof why);
		if (rc != 0)
			break;
	}
	const char *peer = c->tp->peer_name(c->conn);
	char name[64];
	srv_worker_name(srv, c->worker, name, sizeof name);
	if (rc == UNISUM_ECONN && !atomic_load(&srv->stopping))
		LOG_INFO("%s (%s) disconnected", name, peer);
	else if (rc != UNISUM_ECONN && rc != 0) {
		if (c->worker >= 0)
			LOG_ERROR("closing the connection of %s (%s): %s", name, peer, why);
		else
			LOG_ERROR("closing a connection from %s: %s", peer, why);
		/* Tell the worker why before hanging up (a worker of another
		 * wire version then names both versions). */
		if (rc != UNISUM_EAUTH)
			srv_reply_error(srv, c, c->worker, 0, 0, rc, why);
	}
	pthread_mutex_lock(&srv->lock);
	if (c->worker >= 0 && srv->by_worker[c->worker] == c) {
		srv->by_worker[c->worker] = NULL;
		/* Rounds still waiting for it never end; in an elastic job the
		 * scheduler re-forms the job without it instead. */
		srv->left[c->worker] = !srv->cfg->elastic;
	}
	pthread_mutex_unlock(&srv->lock);
	/* Let the sender drain (the ERROR above goes out last), then hang up. */
	pthread_mutex_lock(&c->qlock);
	c->closing = true;
	pthread_cond_signal(&c->qcond);
	pthread_mutex_unlock(&c->qlock);
	if (rc == UNISUM_ECONN)
		c->tp->conn_shutdown(c->conn);
	pthread_join(c->send_thread, NULL);
	c->send_started = false;
	c->tp->conn_shutdown(c->conn);
	atomic_store(&c->finished, true);
	return NULL;
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
			pthread_mutex_lock(&srv->lock);
			struct srv_conn *to = srv->by_worker[p];
			if (to != NULL)
				srv_conn_enqueue(to, &h, b.data, b.data, NULL);
			else
				free(b.data);
			pthread_mutex_unlock(&srv->lock);
		}
		b.data = NULL;
	}
	wire_buf_fini(&b);
}
