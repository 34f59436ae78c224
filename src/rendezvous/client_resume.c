/*
 * client_resume.c - a node's side of a scheduler restart (issue 52; see
 * sched_resume.c for the scheduler's).
 *
 * DESIGN.  When the scheduler's connection closes without a SHUTDOWN or
 * an ERROR, its process died: a restarted one may come back at the same
 * address (a Kubernetes pod, systemd, `unisum launch`).  The node keeps
 * running (its pushes and pulls never touch the scheduler) and its
 * client's loop redials every RDV_REDIAL_MS until UNISUM_TIMEOUT_MS has
 * passed since the loss; then it fails naming the scheduler, as before.
 * Once connected it registers again with what it knows (REGISTER's resume
 * part: identity, rank, the book's generation and sizes, its barriers,
 * its join, the servers it heard were lost) and, a worker, sends HELD for
 * every tensor it declared: the request and the placement as it stands.
 * The scheduler answers with an ADDRBOOK of the node's own entry; then
 * what waited goes out: the request in flight (a DECLARE: sent again, its
 * answer may have been lost), a barrier entered since the report, worker
 * 0's TUNEs (each worker drops a TUNE of an epoch it had), and the rest
 * of what was sent meanwhile (the outbox).  Heartbeats and barriers sent
 * while resuming are dropped: the report carries the barriers.
 *
 * Locks: `lock` then `send_lock`.  `resuming` and `lc` change under both,
 * on the loop's thread; a sender reads them under send_lock.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log/log.h"
#include "loop/conn.h"
#include "loop/loop.h"
#include "rendezvous/client_int.h"
#include "rendezvous/rdv_proto.h"
#include "timing/timing.h"
#include "wire/wire.h"

#define RDV_DIAL_MS 200		/* one try's bound (a refused connect fails at once) */
#define RDV_MAX_POSTED 64	/* worker 0's TUNEs kept to post again */

/* A tensor this worker declared, for the HELD it sends a restarted
 * scheduler. */
struct rdv_held {
	uint64_t key;
	struct wire_hdr h;		/* the DECLARE request's header */
	void *req;			/* its payload */
	size_t req_len;
	uint32_t nparts;
	struct placement_part *parts;	/* the cut as the scheduler sent it */
	uint32_t *servers;		/* where each piece lives now (failovers moved some) */
};

static void rdv_held_clear(struct rdv_held *t)
{
	free(t->req);
	free(t->parts);
	free(t->servers);
}

/* Keeps tensor `key`: request h (payload req) and its cut (c->lock held). */
static void rdv_held_add(struct rdv_client *c, const struct wire_hdr *h, const void *req,
			 uint64_t key, uint32_t n, const struct placement_part *parts,
			 const uint32_t *servers)
{
	struct rdv_held t = {.key = key, .h = *h, .req_len = h->payload_len, .nparts = n};
	t.req = malloc(t.req_len ? t.req_len : 1);
	t.parts = malloc((n ? n : 1) * sizeof *t.parts);
	t.servers = malloc((n ? n : 1) * sizeof *t.servers);
	struct rdv_held *grown = realloc(c->held, (size_t)(c->nheld + 1) * sizeof *grown);
	if (grown != NULL)
		c->held = grown;
	if (grown == NULL || t.req == NULL || t.parts == NULL || t.servers == NULL) {
		/* A restarted scheduler would not know it: say so now. */
		LOG_WARN("out of memory keeping a tensor's placement: a restarted scheduler cannot "
			 "resume this job");
		c->held_lost = true;
		rdv_held_clear(&t);
	} else {
		if (t.req_len > 0)
			memcpy(t.req, req, t.req_len);
		if (n > 0) {	/* an empty tensor has no cut */
			memcpy(t.parts, parts, n * sizeof *t.parts);
			memcpy(t.servers, servers, n * sizeof *t.servers);
		}
		c->held[c->nheld++] = t;
	}
}

void rdv_held_reply(struct rdv_client *c, const struct wire_hdr *reply, const void *payload)
{
	int status;
	char why[8];
	uint32_t n;
	struct placement_part *parts = NULL;
	uint32_t *servers = NULL;
	int rc = rdv_declare_reply_decode(payload, reply->payload_len, &status, why, sizeof why, &n,
					  &parts, &servers);
	if (rc == UNISUM_ENOMEM)
		c->held_lost = true;
	if (rc == 0 && status == 0)	/* a refusal holds nothing */
		rdv_held_add(c, &c->req_hdr, c->req_payload, reply->key, n, parts, servers);
	free(parts);
	free(servers);
}

void rdv_held_forget(struct rdv_client *c, uint64_t key)
{
	pthread_mutex_lock(&c->lock);
	for (int i = 0; i < c->nheld; i++) {
		if (c->held[i].key == key) {
			rdv_held_clear(&c->held[i]);
			c->held[i] = c->held[--c->nheld];
			break;
		}
	}
	pthread_mutex_unlock(&c->lock);
}

void rdv_held_failover(struct rdv_client *c, const struct rdv_failover *f)
{
	pthread_mutex_lock(&c->lock);
	for (uint32_t k = 0; k < f->n; k++)
		for (int i = 0; i < c->nheld; i++) {
			struct rdv_held *t = &c->held[i];
			if (f->keys[k] >= t->key && f->keys[k] - t->key < t->nparts)
				t->servers[f->keys[k] - t->key] = f->servers[k];
		}
	if (c->lost_servers != NULL && f->dead >= 0 && f->dead < c->num_servers)
		c->lost_servers[f->dead] = 1;
	if (f->number > c->failovers)
		c->failovers = f->number;
	pthread_mutex_unlock(&c->lock);
}

void rdv_held_free(struct rdv_client *c)
{
	for (int i = 0; i < c->nheld; i++)
		rdv_held_clear(&c->held[i]);
	free(c->held);
	for (int i = 0; i < c->noutbox; i++)
		free(c->outbox[i].payload);
	free(c->outbox);
	free(c->posted);
	free(c->req_payload);
	free(c->lost_servers);
}

void rdv_posted_add(struct rdv_client *c, const struct rdv_tune *t)
{
	if (c->nposted == RDV_MAX_POSTED) {
		memmove(c->posted, c->posted + 1, (RDV_MAX_POSTED - 1) * sizeof *c->posted);
		c->nposted--;
	}
	struct rdv_tune *grown = c->posted != NULL ? c->posted
						   : malloc(RDV_MAX_POSTED * sizeof *grown);
	if (grown != NULL) {
		c->posted = grown;
		c->posted[c->nposted++] = *t;
	}
}

int rdv_resume_hold(struct rdv_client *c, const struct wire_hdr *h, const void *payload)
{
	switch (h->type) {
	case WIRE_HEARTBEAT:
	case WIRE_BARRIER:	/* the resume's report carries it, or rdv_resume_done sends it */
	case WIRE_DECLARE:	/* the request in flight: sent again */
	case WIRE_TUNE:		/* posted again */
		return 0;
	case WIRE_SHUTDOWN:	/* no goodbye: a worker missing at the resume left */
		return UNISUM_ECONN;
	default:
		break;
	}
	struct rdv_outbox *grown = realloc(c->outbox, (size_t)(c->noutbox + 1) * sizeof *grown);
	void *copy = h->payload_len ? malloc(h->payload_len) : NULL;
	if (grown == NULL || (h->payload_len && copy == NULL)) {
		if (grown != NULL)
			c->outbox = grown;
		free(copy);
		return UNISUM_ENOMEM;
	}
	c->outbox = grown;
	if (copy != NULL)
		memcpy(copy, payload, h->payload_len);
	c->outbox[c->noutbox++] = (struct rdv_outbox){.h = *h, .payload = copy};
	return 0;
}

bool rdv_resume_start(struct rdv_client *c, int rc, const char *why)
{
	pthread_mutex_lock(&c->lock);
	bool go = rc == UNISUM_ECONN && !c->closing && c->failed == 0;
	if (go) {
		pthread_mutex_lock(&c->send_lock);
		bool first = !c->resuming;
		c->resuming = true;
		c->dialed = false;
		pthread_mutex_unlock(&c->send_lock);
		if (first) {	/* the wait counts from the first loss */
			c->lost_ms = timing_now_ms();
			snprintf(c->lost_why, sizeof c->lost_why, "%s", why);
			LOG_WARN("lost the scheduler at %s:%d (%s): waiting up to %d ms "
				 "(UNISUM_TIMEOUT_MS) for it to come back", c->sched_host, c->sched_port,
				 why, c->timeout_ms);
		}
	}
	pthread_mutex_unlock(&c->lock);
	return go;
}

/* REGISTER's resume part: what this node knows (c->lock held). */
static void rdv_resume_report(struct rdv_client *c, struct rdv_resume *z)
{
	*z = (struct rdv_resume){.on = 1, .id = c->id, .rank = (uint32_t)c->rank, .gen = c->gen,
				 .local_size = (uint32_t)c->local_size,
				 .workers = (uint32_t)(c->num_machines * c->local_size),
				 .servers = (uint32_t)c->num_servers, .joined = c->joined,
				 .failovers = c->failovers, .held = (uint32_t)c->nheld};
	for (int g = 0; g < 4; g++) {
		z->entered[g] = c->barrier_entered[g];
		z->done[g] = c->barrier_done[g];
		c->reported_entered[g] = c->barrier_entered[g];
	}
	for (int r = 0; c->lost_servers != NULL && r < c->num_servers; r++)
		if (c->lost_servers[r] && z->nlost < RDV_MAX_LOST)
			z->lost[z->nlost++] = (uint32_t)r;
}

/* Queues a HELD for tensor t on lc. */
static int rdv_resume_held(struct rdv_client *c, struct loop_conn *lc, const struct rdv_held *t)
{
	struct wire_buf b;
	wire_buf_init(&b);
	rdv_held_encode(&b, t->req, t->req_len, t->nparts, t->parts, t->servers);
	struct wire_hdr h = {.type = WIRE_HELD, .sender = c->id, .key = t->key, .dtype = t->h.dtype,
			     .count = t->h.count, .aux = t->h.aux, .payload_len = b.len};
	int rc = b.failed ? UNISUM_ENOMEM
		 : b.len > WIRE_MAX_CONTROL_PAYLOAD ? UNISUM_EINVAL
						     : loop_conn_send(lc, &h, b.data);
	wire_buf_fini(&b);
	return rc;
}

/* Registers again on lc and queues a HELD per tensor, as one under the
 * lock: the report counts the HELDs that follow it.  0 or an error. */
static int rdv_resume_register(struct rdv_client *c, struct loop_conn *lc)
{
	struct wire_buf b;
	wire_buf_init(&b);
	pthread_mutex_lock(&c->lock);
	struct rdv_register m = c->reg;
	rdv_resume_report(c, &m.resume);
	rdv_register_encode(&m, &b);
	struct wire_hdr h = {.type = WIRE_REGISTER, .sender = c->id, .payload_len = b.len};
	int rc = c->held_lost || b.failed ? UNISUM_ENOMEM : loop_conn_send(lc, &h, b.data);
	for (int i = 0; i < c->nheld && rc == 0; i++)
		rc = rdv_resume_held(c, lc, &c->held[i]);
	pthread_mutex_unlock(&c->lock);
	wire_buf_fini(&b);
	return rc;
}

/* The loss has lasted UNISUM_TIMEOUT_MS: why the node fails, naming it. */
static int rdv_resume_give_up(struct rdv_client *c, char *msg, size_t len)
{
	snprintf(msg, len,
		 "lost the scheduler at %s:%d (%s) and it did not come back within %d ms "
		 "(UNISUM_TIMEOUT_MS): did the scheduler or launcher exit? A restarted scheduler "
		 "must listen at the same address", c->sched_host, c->sched_port, c->lost_why,
		 c->timeout_ms);
	return UNISUM_ECONN;
}

int rdv_resume_try(struct rdv_client *c, char *why, size_t len)
{
	pthread_mutex_lock(&c->lock);
	bool over = c->closing || c->failed != 0;
	pthread_mutex_lock(&c->send_lock);
	over |= !c->resuming;
	bool dialed = c->dialed;
	pthread_mutex_unlock(&c->send_lock);
	int64_t lost_for = timing_now_ms() - c->lost_ms;
	pthread_mutex_unlock(&c->lock);
	if (!over && lost_for >= c->timeout_ms)
		return rdv_resume_give_up(c, why, len);
	if (over)
		return 1;
	if (dialed)
		return 0;	/* registered again: waiting for the answer */
	struct tp_conn *conn;
	log_hush(true);		/* refused until it listens: expected */
	int dial = transport_connect(c->tp, c->sched_host, c->sched_port, RDV_DIAL_MS, &conn);
	log_hush(false);
	if (dial != 0)
		return 0;
	struct loop_conn *lc = NULL;
	int rc = loop_conn_new(c->pool.loops[0], c->tp, conn, false, &rdv_conn_ops, c, &lc);
	if (rc != 0) {
		c->tp->conn_free(conn);
		return 0;
	}
	if ((rc = rdv_resume_register(c, lc)) != 0) {
		loop_conn_free(lc);
		snprintf(why, len, "cannot tell the restarted scheduler this node's state: %s",
			 rc == UNISUM_EINVAL ? "one's declaration is over the 1 MiB control limit"
					     : "out of memory");
		return rc;
	}
	pthread_mutex_lock(&c->lock);
	pthread_mutex_lock(&c->send_lock);
	struct loop_conn *old = c->lc;
	c->lc = lc;
	c->conn = conn;
	c->dialed = true;
	pthread_mutex_unlock(&c->send_lock);
	pthread_mutex_unlock(&c->lock);
	loop_conn_free(old);
	return 0;
}

/* Sends what waited for the scheduler (both locks held). */
static void rdv_resume_flush(struct rdv_client *c)
{
	/* Unanswered: sent to the lost scheduler, or held while resuming. */
	if (c->req_active && !c->have_reply)
		loop_conn_send(c->lc, &c->req_hdr, c->req_payload);
	for (int g = 0; g < 4; g++) {
		if (c->barrier_entered[g] > c->reported_entered[g] &&
		    c->barrier_entered[g] != c->barrier_done[g]) {
			struct wire_hdr h = {.type = WIRE_BARRIER, .sender = c->id, .aux = (uint32_t)g};
			loop_conn_send(c->lc, &h, NULL);
		}
	}
	for (int i = 0; i < c->nposted; i++) {
		struct wire_buf b;
		wire_buf_init(&b);
		rdv_tune_encode(&c->posted[i], &b);
		struct wire_hdr h = {.type = WIRE_TUNE, .sender = c->id, .round = c->posted[i].epoch,
				     .payload_len = b.len};
		if (!b.failed)
			loop_conn_send(c->lc, &h, b.data);
		wire_buf_fini(&b);
	}
	for (int i = 0; i < c->noutbox; i++) {
		loop_conn_send(c->lc, &c->outbox[i].h, c->outbox[i].payload);
		free(c->outbox[i].payload);
	}
	c->noutbox = 0;
}

int rdv_resume_done(struct rdv_client *c, const struct wire_hdr *h, const void *payload)
{
	uint32_t id, local_size, n;
	struct rdv_node *nodes = NULL;
	int rc = rdv_book_decode(payload, h->payload_len, &id, &local_size, &nodes, &n);
	free(nodes);
	if (rc != 0 || id != c->id || (int)local_size != c->local_size)
		return UNISUM_EPROTO;
	pthread_mutex_lock(&c->lock);
	pthread_mutex_lock(&c->send_lock);
	bool was = c->resuming && c->dialed;
	if (was) {
		c->resuming = false;
		rdv_resume_flush(c);
	}
	pthread_mutex_unlock(&c->send_lock);
	int64_t lost_for = timing_now_ms() - c->lost_ms;
	pthread_mutex_unlock(&c->lock);
	if (was) {
		atomic_store(&c->last_rx_ms, timing_now_ms());
		loop_timer_stop(c->pool.loops[0], &c->redial);
		LOG_WARN("the scheduler at %s:%d is back: resumed %lld ms after its loss",
			 c->sched_host, c->sched_port, (long long)lost_for);
	}
	return was ? 0 : UNISUM_EPROTO;
}

int rdv_request_keep(struct rdv_client *c, const struct wire_hdr *req, const void *payload)
{
	free(c->req_payload);
	c->req_payload = NULL;
	if (req->payload_len && (c->req_payload = malloc(req->payload_len)) == NULL)
		return UNISUM_ENOMEM;
	if (req->payload_len)
		memcpy(c->req_payload, payload, req->payload_len);
	c->req_hdr = *req;
	c->req_active = true;
	return 0;
}
