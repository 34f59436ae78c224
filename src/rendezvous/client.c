/*
 * client.c - a node's side of the rendezvous (see rendezvous.h).
 *
 * DESIGN.  Registration is synchronous in rdv_client_new().  Afterwards
 * the client's one event loop (a thread named unisum-rdv) serves the
 * scheduler connection: it hands DECLARE replies to the one request in
 * flight (requests are serialised by `request_lock`), counts
 * BARRIER_DONEs for the barrier this node is in (a barrier is no request:
 * a caller may stop waiting and come back, while declarations go on), and
 * turns SHUTDOWN and ERROR notices, or a lost scheduler, into a call of
 * the notice callback.  A timer of the same loop tells the scheduler this
 * node is alive every heartbeat_ms and declares the scheduler lost when
 * it has been silent for timeout_ms.  Every thread sends through the
 * connection's queue (loop_conn_send: never blocking, at most
 * LOOP_CONN_CAP unread).  Lock order: request_lock, then lock.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "log/log.h"
#include "loop/conn.h"
#include "loop/loop.h"
#include "rendezvous/client_int.h"
#include "rendezvous/rdv_proto.h"
#include "rendezvous/rendezvous.h"
#include "placement/placement.h"
#include "timing/timing.h"
#include "wire/wire.h"

/* Sends a message to the scheduler: blocking while the connection is
 * not yet the loop's (registration), else queued, from any thread.  A
 * scheduler that left LOOP_CONN_CAP bytes unread is as good as lost. */
static int rdv_send(struct rdv_client *c, const struct wire_hdr *h, const void *payload)
{
	pthread_mutex_lock(&c->send_lock);
	int rc = c->lc == NULL	 ? c->tp->send(c->conn, h, payload)	/* registering */
		 : c->resuming ? rdv_resume_hold(c, h, payload)
				 : loop_conn_send(c->lc, h, payload);
	pthread_mutex_unlock(&c->send_lock);
	return rc == TP_AGAIN ? UNISUM_ECONN : rc;
}

/* Sends an ERROR about the job (key 0) or about the tensor of `key`. */
static void rdv_send_error(struct rdv_client *c, uint64_t key, int err, const char *why)
{
	struct wire_buf b;
	wire_buf_init(&b);
	struct wire_hdr h = {.sender = c->id, .key = key};
	if (wire_error_build(&h, &b, err, why) == 0)
		rdv_send(c, &h, b.data);
	wire_buf_fini(&b);
}

/* Reads one message with its payload (malloc'd, NULL when empty). */
static int rdv_recv(struct rdv_client *c, struct wire_hdr *h, void **payload, char *why, size_t len)
{
	*payload = NULL;
	int rc = c->tp->recv_header(c->conn, h, why, len);
	if (rc != 0)
		return rc;
	if (h->payload_len == 0)
		return 0;
	*payload = malloc(h->payload_len);
	if (*payload == NULL)
		return UNISUM_ENOMEM;
	rc = c->tp->recv_payload(c->conn, *payload, h->payload_len);
	if (rc != 0) {
		free(*payload);
		*payload = NULL;
		snprintf(why, len, "connection closed");
	}
	return rc;
}

static void rdv_fail(struct rdv_client *c, int err, const char *why)
{
	pthread_mutex_lock(&c->lock);
	bool first = c->failed == 0;
	if (first) {
		c->failed = err;
		snprintf(c->failed_why, sizeof c->failed_why, "%s", why);
	}
	pthread_cond_broadcast(&c->replied);
	bool closing = c->closing;
	pthread_mutex_unlock(&c->lock);
	if (first && c->notice != NULL && !(closing && err == UNISUM_ECONN))
		c->notice(c->notice_arg, err, why);
}

/* A TUNE: handed to the callback, or kept for it (in order) when worker 0
 * posted before this worker set it (rdv_client_on_tune).  0 or
 * UNISUM_EPROTO for a malformed one. */
static int rdv_on_tune(struct rdv_client *c, const struct wire_hdr *h, const void *payload)
{
	struct rdv_tune t;
	if (rdv_tune_decode(payload, h->payload_len, h->round, &t) != 0)
		return UNISUM_EPROTO;
	pthread_mutex_lock(&c->lock);
	if ((int64_t)t.epoch <= c->tune_seen) {
		/* Posted again to a restarted scheduler: had it. */
		pthread_mutex_unlock(&c->lock);
		return 0;
	}
	c->tune_seen = (int64_t)t.epoch;
	rdv_tune_fn fn = c->tune;
	void *arg = c->tune_arg;
	if (fn == NULL) {
		struct rdv_tune *e = realloc(c->early, (size_t)(c->nearly + 1) * sizeof *e);
		if (e != NULL) {
			c->early = e;
			c->early[c->nearly++] = t;
		}
	}
	pthread_mutex_unlock(&c->lock);
	if (fn != NULL)
		fn(arg, &t);
	return 0;
}

/* A join event: handed to the callback, or kept for it (in order). */
static void rdv_on_join_event(struct rdv_client *c, int event, int rank,
			      const struct rdv_announce *a)
{
	pthread_mutex_lock(&c->lock);
	rdv_join_fn fn = c->join;
	void *arg = c->join_arg;
	if (fn == NULL) {
		struct rdv_join_event_rec *e =
			realloc(c->early_join, (size_t)(c->nearly_join + 1) * sizeof *e);
		if (e != NULL) {
			c->early_join = e;
			e[c->nearly_join] = (struct rdv_join_event_rec){.event = event, .rank = rank};
			if (a != NULL)
				e[c->nearly_join].a = *a;
			c->nearly_join++;
		}
	}
	pthread_mutex_unlock(&c->lock);
	if (fn != NULL)
		fn(arg, event, rank, a);
}

void rdv_client_on_join(struct rdv_client *c, rdv_join_fn fn, void *arg)
{
	pthread_mutex_lock(&c->lock);
	for (int i = 0; i < c->nearly_join; i++) {
		const struct rdv_join_event_rec *e = &c->early_join[i];
		fn(arg, e->event, e->rank, e->event == RDV_ANNOUNCED ? &e->a : NULL);
	}
	free(c->early_join);
	c->early_join = NULL;
	c->nearly_join = 0;
	c->join_arg = arg;
	c->join = fn;
	pthread_mutex_unlock(&c->lock);
}

/* A FAILOVER (workers): handed to the callback, or kept for it (in
 * order).  A MIGRATE (`migrate`, servers): to its callback, if any.
 * Frees f's arrays. */
static void rdv_on_failover(struct rdv_client *c, struct rdv_failover *f, bool migrate)
{
	if (!migrate)
		rdv_held_failover(c, f);
	pthread_mutex_lock(&c->lock);
	rdv_failover_fn fn = migrate ? c->migrate : c->failover;
	void *arg = migrate ? c->migrate_arg : c->failover_arg;
	if (fn == NULL && !migrate) {
		struct rdv_failover *e = realloc(c->early_fo, (size_t)(c->nearly_fo + 1) * sizeof *e);
		if (e != NULL) {
			c->early_fo = e;
			e[c->nearly_fo++] = *f;
			f->keys = NULL;		/* kept */
			f->servers = NULL;
		}
	}
	pthread_mutex_unlock(&c->lock);
	if (fn != NULL)
		fn(arg, f);
	free(f->keys);
	free(f->servers);
}

void rdv_client_on_failover(struct rdv_client *c, rdv_failover_fn fn, void *arg)
{
	pthread_mutex_lock(&c->lock);
	for (int i = 0; i < c->nearly_fo; i++) {
		fn(arg, &c->early_fo[i]);
		free(c->early_fo[i].keys);
		free(c->early_fo[i].servers);
	}
	free(c->early_fo);
	c->early_fo = NULL;
	c->nearly_fo = 0;
	c->failover_arg = arg;
	c->failover = fn;
	pthread_mutex_unlock(&c->lock);
}

void rdv_client_on_migrate(struct rdv_client *c, rdv_failover_fn fn, void *arg)
{
	pthread_mutex_lock(&c->lock);
	c->migrate_arg = arg;
	c->migrate = fn;
	pthread_mutex_unlock(&c->lock);
}

void rdv_client_on_rejoin(struct rdv_client *c, rdv_rejoin_fn fn, void *arg)
{
	pthread_mutex_lock(&c->lock);
	c->rejoin_arg = arg;
	c->rejoin = fn;
	pthread_mutex_unlock(&c->lock);
}

/* A REJOIN: the replacement's entry replaces the lost server's in the
 * address book, then the callback hears of it.  0 or UNISUM_EPROTO. */
static int rdv_on_rejoin(struct rdv_client *c, const struct wire_hdr *h, const void *payload)
{
	uint32_t id, local_size, n;
	struct rdv_node *nodes = NULL;
	if (rdv_book_decode(payload, h->payload_len, &id, &local_size, &nodes, &n) != 0)
		return UNISUM_EPROTO;
	int rc = n == 1 && nodes[0].role == CONFIG_ROLE_SERVER && nodes[0].rank == (int)h->aux
			 ? 0 : UNISUM_EPROTO;
	struct rdv_node *at = NULL;
	pthread_mutex_lock(&c->lock);
	for (int i = 0; rc == 0 && i < c->nnodes && at == NULL; i++)
		if (c->nodes[i].role == CONFIG_ROLE_SERVER && c->nodes[i].rank == nodes[0].rank)
			at = &c->nodes[i];
	if (at != NULL)
		*at = nodes[0];
	if (at != NULL && c->lost_servers != NULL && nodes[0].rank < c->num_servers)
		c->lost_servers[nodes[0].rank] = 0;
	rdv_rejoin_fn fn = c->rejoin;
	void *arg = c->rejoin_arg;
	pthread_mutex_unlock(&c->lock);
	if (rc == 0 && at != NULL && fn != NULL)
		fn(arg, &nodes[0]);
	free(nodes);
	return rc == 0 && at == NULL ? UNISUM_EPROTO : rc;
}

int rdv_client_join(struct rdv_client *c)
{
	struct wire_hdr h = {.type = WIRE_JOIN, .sender = c->id};
	pthread_mutex_lock(&c->lock);
	c->joined = true;
	pthread_mutex_unlock(&c->lock);
	return rdv_send(c, &h, NULL);
}

int rdv_client_announce(struct rdv_client *c, const struct rdv_announce *a)
{
	struct wire_buf b;
	wire_buf_init(&b);
	struct wire_hdr h = {.sender = c->id};
	rdv_announce_encode(a, &h, &b);
	int rc = b.failed ? UNISUM_ENOMEM : rdv_send(c, &h, b.data);
	wire_buf_fini(&b);
	return rc;
}

/* A TUNE, ANNOUNCE, FAILOVER, MIGRATE or REJOIN from the scheduler (its
 * payload freed here): false, after failing the client, when it is
 * malformed. */
static bool rdv_on_decoded(struct rdv_client *c, const struct wire_hdr *h, void *payload)
{
	int bad = 0;
	const char *what = "";

	if (h->type == WIRE_TUNE) {
		bad = rdv_on_tune(c, h, payload) ? UNISUM_EPROTO : 0;
		what = "a malformed TUNE";
	} else if (h->type == WIRE_ANNOUNCE) {
		struct rdv_announce a;
		bad = rdv_announce_decode(h, payload, h->payload_len, &a) ? UNISUM_EPROTO : 0;
		what = "on a malformed ANNOUNCE";
		if (!bad)
			rdv_on_join_event(c, RDV_ANNOUNCED, -1, &a);
	} else if (h->type == WIRE_REJOIN) {
		bad = rdv_on_rejoin(c, h, payload);
		what = "a malformed REJOIN";
	} else {
		struct rdv_failover f;
		bad = rdv_failover_decode(h, payload, h->payload_len, &f);
		what = "a malformed FAILOVER or MIGRATE";
		if (!bad)
			rdv_on_failover(c, &f, h->type == WIRE_MIGRATE);
	}
	free(payload);
	if (bad) {
		char msg[160];
		snprintf(msg, sizeof msg, "the scheduler %s%s (is every node the same unisum "
			 "version?)", h->type == WIRE_ANNOUNCE ? "passed " : "sent ", what);
		rdv_fail(c, bad, msg);
	}
	return bad == 0;
}

/* A REFORM, SHUTDOWN or ERROR from the scheduler (its payload freed
 * here): false when it ends this client's part in the job (the client
 * failed with its reason), true for a tensor's ERROR, after which the job
 * goes on. */
static bool rdv_on_ending(struct rdv_client *c, const struct wire_hdr *h, void *payload)
{
	char text[768], msg[900];

	if (h->type == WIRE_SHUTDOWN) {
		free(payload);
		/* Servers take UNISUM_ESHUTDOWN as their clean stop. */
		rdv_fail(c, UNISUM_ESHUTDOWN, "the scheduler ended the job: every worker is done");
		return false;
	}
	wire_error_decode(payload, h->payload_len, text, sizeof text);
	free(payload);
	if (h->type == WIRE_REFORM) {
		/* Elastic: the job re-forms.  Say we come back (the scheduler
		 * then waits for this node), and fail what waits here with
		 * UNISUM_EMEMBERSHIP. */
		struct wire_hdr ack = {.type = WIRE_REFORM, .sender = c->id, .aux = h->aux};
		rdv_send(c, &ack, NULL);
		snprintf(msg, sizeof msg, "the job re-forms (generation %u): %s", h->aux, text);
		rdv_fail(c, UNISUM_EMEMBERSHIP, msg);
		return false;
	}
	if (h->key != 0) {
		/* One tensor is unusable; the job goes on. */
		if (c->tensor_error != NULL)
			c->tensor_error(c->notice_arg, h->key, text);
		return true;
	}
	rdv_fail(c, log_known_error(-(int)h->aux, UNISUM_EREMOTE), text);
	return false;
}

/* The answer to the DECLARE in flight (its payload taken): for the
 * requester, and kept for a restarted scheduler now, on the thread that
 * reports them, so no resume misses it.  One that comes when none is in
 * flight is dropped: a DECLARE sent again to a restarted scheduler whose
 * first answer came after all. */
static void rdv_on_declare_reply(struct rdv_client *c, const struct wire_hdr *h, void *payload)
{
	pthread_mutex_lock(&c->lock);
	if (!c->req_active) {
		pthread_mutex_unlock(&c->lock);
		free(payload);
		return;
	}
	c->req_active = false;
	rdv_held_reply(c, h, payload);
	free(c->reply_payload);
	c->reply_hdr = *h;
	c->reply_payload = payload;
	c->have_reply = true;
	pthread_cond_broadcast(&c->replied);
	pthread_mutex_unlock(&c->lock);
}

/* A message from the scheduler (on the client's loop): answers to
 * barriers and declarations, autotune settings, join and failover events,
 * the end of the job.  Any end (SHUTDOWN, a job-level ERROR, REFORM)
 * fails the client with its reason (rdv_fail), which wakes every waiter;
 * then the connection is read no more, and stays open until
 * rdv_client_free. */
static int rdv_on_message(struct loop_conn *lc, const struct wire_hdr *hp, void *data, char *why,
			  size_t len)
{
	struct rdv_client *c = loop_conn_arg(lc);
	atomic_store(&c->last_rx_ms, timing_now_ms());
	struct wire_hdr h = *hp;
	void *payload = NULL;	/* its own: kept by what it answers */
	if (h.payload_len > 0 && (payload = malloc(h.payload_len)) == NULL) {
		snprintf(why, len, "out of memory for a %u-byte message", (unsigned)h.payload_len);
		return UNISUM_ENOMEM;
	}
	if (payload != NULL)
		memcpy(payload, data, h.payload_len);
	bool go_on = true;
	switch (h.type) {
	case WIRE_BARRIER_DONE:
		free(payload);
		pthread_mutex_lock(&c->lock);
		if (h.aux < 4 && c->barrier_done[h.aux] != c->barrier_entered[h.aux])
			c->barrier_done[h.aux]++;
		pthread_cond_broadcast(&c->replied);
		pthread_mutex_unlock(&c->lock);
		break;
	case WIRE_DECLARE:
		rdv_on_declare_reply(c, &h, payload);
		break;
	case WIRE_ADDRBOOK:
		go_on = rdv_resume_done(c, &h, payload) == 0;
		free(payload);
		if (!go_on)
			rdv_fail(c, UNISUM_EPROTO, "the scheduler sent an address book that is not "
				 "this node's, or unasked (is every node the same unisum version?)");
		break;
	case WIRE_JOIN:
	case WIRE_JOIN_DONE:
		free(payload);
		if (h.type == WIRE_JOIN_DONE) {
			pthread_mutex_lock(&c->lock);
			c->joined = false;
			pthread_mutex_unlock(&c->lock);
		}
		rdv_on_join_event(c, h.type == WIRE_JOIN ? RDV_JOINED : RDV_JOIN_DONE,
				  (int)h.aux, NULL);
		break;
	case WIRE_RESIZE:
		free(payload);
		atomic_store(&c->waiting, (int)h.aux);
		break;
	case WIRE_TUNE:
	case WIRE_ANNOUNCE:
	case WIRE_FAILOVER:
	case WIRE_MIGRATE:
	case WIRE_REJOIN:
		go_on = rdv_on_decoded(c, &h, payload);
		break;
	case WIRE_REFORM:
	case WIRE_SHUTDOWN:
	case WIRE_ERROR:
		go_on = rdv_on_ending(c, &h, payload);
		break;
	case WIRE_HEARTBEAT:
		atomic_store(&c->metrics_asked, (h.aux & 1) != 0);
		/* fall through */
	default:
		free(payload);
		break;
	}
	if (!go_on)
		loop_conn_pause(lc);
	return 0;
}

/* The redial timer, while the scheduler is lost (client_resume.c). */
static void rdv_redial(struct loop_timer *t)
{
	struct rdv_client *c = t->arg;
	char why[1100];
	int rc = rdv_resume_try(c, why, sizeof why);
	if (rc != 0)
		loop_timer_stop(c->pool.loops[0], t);
	if (rc < 0)
		rdv_fail(c, rc, why);
}

/* The scheduler connection ended: the scheduler is lost, unless this
 * client failed or closes already (rdv_fail keeps the first reason). */
static void rdv_on_closed(struct loop_conn *lc, int rc, const char *why)
{
	struct rdv_client *c = loop_conn_arg(lc);
	if (rdv_resume_start(c, rc, why)) {
		loop_timer_start(c->pool.loops[0], &c->redial, RDV_REDIAL_MS, RDV_REDIAL_MS,
				 rdv_redial, c);
		return;
	}
	char msg[400];
	snprintf(msg, sizeof msg, "lost the scheduler at %s: %s (did the scheduler or launcher exit?)",
		 loop_conn_peer(lc), why);
	rdv_fail(c, rc == UNISUM_EPROTO || rc == UNISUM_ENOMEM ? rc : UNISUM_ECONN, msg);
}

const struct loop_conn_ops rdv_conn_ops = {.on_message = rdv_on_message,
						   .on_closed = rdv_on_closed};

/* The counters the scheduler asked for, into b (metrics.h): the process's,
 * then the node's own through its callback (called without the lock: it
 * takes the worker's or server's). */
static void rdv_beat_metrics(struct rdv_client *c, struct wire_buf *b)
{
	pthread_mutex_lock(&c->lock);
	rdv_metrics_fn fn = c->metrics;
	void *arg = c->metrics_arg;
	pthread_mutex_unlock(&c->lock);
	uint32_t nservers = (uint32_t)rdv_client_num_servers(c);
	struct rdv_metrics m = {.nservers = nservers};
	m.server_bytes = calloc(nservers ? nservers : 1, sizeof *m.server_bytes);
	m.server_pulled = calloc(nservers ? nservers : 1, sizeof *m.server_pulled);
	if (nservers <= RDV_METRICS_MAX_SERVERS && m.server_bytes != NULL && m.server_pulled != NULL) {
		rdv_metrics_process(&m);
		if (fn != NULL)
			fn(arg, &m);
		rdv_metrics_encode(&m, b);
	}
	rdv_metrics_free(&m);
}

void rdv_client_on_metrics(struct rdv_client *c, rdv_metrics_fn fn, void *arg)
{
	pthread_mutex_lock(&c->lock);
	c->metrics = fn;
	c->metrics_arg = arg;
	pthread_mutex_unlock(&c->lock);
}

/* The heartbeat, a timer of the client's loop: says this node is alive,
 * or declares the scheduler lost when it has been silent too long. */
static void rdv_beat(struct loop_timer *t)
{
	struct rdv_client *c = t->arg;
	pthread_mutex_lock(&c->lock);
	bool over = c->closing || c->failed != 0;
	pthread_mutex_lock(&c->send_lock);
	bool resuming = c->resuming;
	pthread_mutex_unlock(&c->send_lock);
	pthread_mutex_unlock(&c->lock);
	if (over) {
		loop_timer_stop(c->pool.loops[0], t);
		return;
	}
	if (resuming)
		return;		/* the redial timer watches the time */
	int64_t silent = timing_now_ms() - atomic_load(&c->last_rx_ms);
	if (silent >= c->timeout_ms) {
		char msg[400];
		snprintf(msg, sizeof msg,
			 "the scheduler at %s has sent nothing for %lld ms: it is hung, stopped "
			 "or cut off (UNISUM_TIMEOUT_MS=%d)",
			 loop_conn_peer(c->lc), (long long)silent, c->timeout_ms);
		rdv_fail(c, UNISUM_ETIMEDOUT, msg);
		loop_conn_close(c->lc, UNISUM_ETIMEDOUT, msg);
		return;
	}
	struct wire_hdr hb = {.type = WIRE_HEARTBEAT, .sender = c->id};
	struct wire_buf b;
	wire_buf_init(&b);
	if (atomic_load(&c->metrics_asked))
		rdv_beat_metrics(c, &b);
	hb.payload_len = b.failed ? 0 : b.len;
	rdv_send(c, &hb, b.data);
	wire_buf_fini(&b);
}

/* Posted to the client's loop: serve the connection and start the
 * heartbeat there, so that nothing it calls runs before c->lc is set. */
static void rdv_serve(void *arg)
{
	struct rdv_client *c = arg;
	struct loop *l = c->pool.loops[0];
	int rc = loop_conn_new(l, c->tp, c->conn, false, &rdv_conn_ops, c, &c->lc);
	if (rc == 0)
		loop_timer_start(l, &c->beat, c->heartbeat_ms, c->heartbeat_ms, rdv_beat, c);
	pthread_mutex_lock(&c->lock);
	c->serving = rc == 0 ? 1 : rc;
	pthread_cond_broadcast(&c->replied);
	pthread_mutex_unlock(&c->lock);
}

static int rdv_register(struct rdv_client *c, const struct config *cfg, int listen_port)
{
	bool worker = cfg->role == CONFIG_ROLE_WORKER;
	struct rdv_register m = {.role = cfg->role, .req_rank = worker ? cfg->worker_id : cfg->server_id,
				 .port = listen_port, .local_rank = worker ? cfg->local_rank : 0,
				 .local_size = worker ? cfg->local_size : 1, .pid = (int)getpid(),
				 .rack = cfg->rack};
	if (strlen(cfg->node_host) >= sizeof m.host)
		return log_fail(UNISUM_ECONFIG, "this node's address '%s' (UNISUM_NODE_HOST) is longer "
				"than %zu characters", cfg->node_host, sizeof m.host - 1);
	memcpy(m.host, cfg->node_host, strlen(cfg->node_host) + 1);
	snprintf(m.transport, sizeof m.transport, "%s", cfg->transport[0] ? cfg->transport : "tcp");
	rdv_host_identity(m.host_id, sizeof m.host_id);
	c->reg = m;
	struct wire_buf b;
	wire_buf_init(&b);
	rdv_register_encode(&m, &b);
	if (b.failed) {
		wire_buf_fini(&b);
		return UNISUM_ENOMEM;
	}
	struct wire_hdr h = {.type = WIRE_REGISTER, .payload_len = b.len};
	int rc = rdv_send(c, &h, b.data);
	wire_buf_fini(&b);
	if (rc != 0)
		return log_fail(rc, "lost the scheduler at %s while registering", c->tp->peer_name(c->conn));

	void *payload;
	char why[256];
	rc = rdv_recv(c, &h, &payload, why, sizeof why);
	if (rc != 0)
		return log_fail(rc, "no address book from the scheduler at %s: %s",
				c->tp->peer_name(c->conn), why);
	if (h.type == WIRE_ERROR) {
		char text[512];
		wire_error_decode(payload, h.payload_len, text, sizeof text);
		free(payload);
		return log_fail(UNISUM_EREMOTE, "the scheduler refused the job: %s", text);
	}
	uint32_t local_size = 0, n = 0;
	c->gen = h.round;
	rc = h.type == WIRE_ADDRBOOK ? rdv_book_decode(payload, h.payload_len, &c->id, &local_size,
						       &c->nodes, &n)
				     : UNISUM_EPROTO;
	free(payload);
	if (rc == UNISUM_ENOMEM)
		return rc;
	if (rc != 0 || local_size < 1 || local_size > RDV_MAX_LOCAL_SIZE)
		return log_fail(UNISUM_EPROTO, "the scheduler sent a malformed address book");
	c->local_size = (int)local_size;
	int L = c->local_size, workers = 0;
	bool consistent = true;
	for (uint32_t i = 0; i < n; i++) {
		struct rdv_node *node = &c->nodes[i];
		if (node->id == c->id)
			c->rank = node->rank;
		/* A worker's machine and local rank follow from its rank. */
		if (node->role == CONFIG_ROLE_WORKER) {
			workers++;
			consistent &= node->rank >= 0 && node->machine == node->rank / L &&
				      node->local_rank == node->rank % L;
		} else {
			consistent &= node->machine == -1 && node->local_rank == 0;
		}
	}
	c->nnodes = (int)n;
	c->num_machines = workers / L;
	c->num_servers = (int)n - workers;
	c->lost_servers = calloc((size_t)(c->num_servers > 0 ? c->num_servers : 1), 1);
	if (c->lost_servers == NULL)
		return UNISUM_ENOMEM;
	if (!consistent || workers % L != 0)
		return log_fail(UNISUM_EPROTO, "the scheduler sent a malformed address book");
	return 0;
}

/* Starts the client's loop and hands it the connection.  0, or an error
 * (logged; a thread that cannot start is named to the scheduler with the
 * limit, while the connection is still blocking). */
static int rdv_start_loop(struct rdv_client *c)
{
	int thread_rc;
	c->pool = (struct loop_pool){.name = "unisum-rdv"};
	int rc = loop_pool_start(&c->pool, 1, &thread_rc);
	if (thread_rc != 0) {
		char limits[384], why[640];
		log_thread_limits(thread_rc, limits, sizeof limits);
		snprintf(why, sizeof why, "%s %d (pid %d) cannot start its scheduler thread: %s",
			 c->role == CONFIG_ROLE_WORKER ? "worker" : "server", c->rank, (int)getpid(),
			 limits);
		rdv_send_error(c, 0, UNISUM_ESYS, why);	/* blocking: no loop serves it */
		return log_fail(UNISUM_ESYS, "%s", why);
	}
	if (rc == 0)
		rc = loop_post(c->pool.loops[0], rdv_serve, c);
	if (rc != 0)
		return log_fail(rc, "cannot start the scheduler connection's loop: %s", log_last_error());
	pthread_mutex_lock(&c->lock);
	while (c->serving == 0)
		pthread_cond_wait(&c->replied, &c->lock);
	rc = c->serving == 1 ? 0 : c->serving;
	pthread_mutex_unlock(&c->lock);
	return rc != 0 ? log_fail(rc, "cannot watch the scheduler connection") : 0;
}

int rdv_client_new(const struct config *cfg, int listen_port, rdv_notice_fn notice,
		   rdv_tensor_error_fn tensor_error, void *notice_arg, struct rdv_client **out)
{
	struct rdv_client *c = calloc(1, sizeof *c);
	if (c == NULL)
		return UNISUM_ENOMEM;
	c->tp = transport_tcp();
	c->role = cfg->role;
	c->notice = notice;
	c->tensor_error = tensor_error;
	c->notice_arg = notice_arg;
	pthread_mutex_init(&c->request_lock, NULL);
	pthread_mutex_init(&c->lock, NULL);
	pthread_mutex_init(&c->send_lock, NULL);
	timing_cond_init(&c->replied);
	c->beat.slot = c->redial.slot = -1;
	c->tune_seen = -1;
	snprintf(c->sched_host, sizeof c->sched_host, "%s", cfg->scheduler_host);
	c->sched_port = cfg->scheduler_port;

	int rc = transport_connect(c->tp, cfg->scheduler_host, cfg->scheduler_port, cfg->timeout_ms,
				   &c->conn);
	if (rc != 0)
		goto out_free;
	rc = rdv_register(c, cfg, listen_port);
	if (rc != 0)
		goto out_conn;
	c->heartbeat_ms = cfg->heartbeat_ms;
	c->timeout_ms = cfg->timeout_ms;
	atomic_store(&c->last_rx_ms, timing_now_ms());
	rc = rdv_start_loop(c);
	if (rc != 0)
		goto out_conn;
	*out = c;
	return 0;

out_conn:
	loop_pool_free(&c->pool);
	if (c->lc != NULL)
		loop_conn_free(c->lc);	/* c->conn too */
	else
		c->tp->conn_free(c->conn);
out_free:
	free(c->nodes);
	free(c->lost_servers);
	pthread_mutex_destroy(&c->send_lock);
	free(c);
	return rc;
}

int rdv_client_waiting(struct rdv_client *c)
{
	return atomic_load(&c->waiting);
}

int rdv_client_resize(struct rdv_client *c)
{
	pthread_mutex_lock(&c->lock);
	int rc = c->failed;
	pthread_mutex_unlock(&c->lock);
	if (rc != 0)
		return rc;
	struct wire_hdr h = {.type = WIRE_RESIZE, .sender = c->id};
	return rdv_send(c, &h, NULL);
}

int rdv_client_wait_failed(struct rdv_client *c, int timeout_ms)
{
	struct timespec until = timing_deadline(timeout_ms);
	pthread_mutex_lock(&c->lock);
	while (c->failed == 0 &&
	       pthread_cond_timedwait(&c->replied, &c->lock, &until) != ETIMEDOUT)
		;
	int rc = c->failed;
	pthread_mutex_unlock(&c->lock);
	return rc;
}

/* Sends a request and waits for its reply (type `want`).  On success the
 * reply payload (malloc'd or NULL) goes to *payload. */
static int rdv_request(struct rdv_client *c, const struct wire_hdr *req, const void *req_payload,
		       int want, struct wire_hdr *reply, void **payload)
{
	pthread_mutex_lock(&c->request_lock);
	pthread_mutex_lock(&c->lock);
	int rc = c->failed;
	if (rc == 0)
		rc = rdv_request_keep(c, req, req_payload);
	if (rc == 0)	/* held while resuming: sent once the scheduler is back */
		rc = rdv_send(c, req, req_payload);
	if (rc != 0)
		c->req_active = false;
	pthread_mutex_unlock(&c->lock);
	if (rc == 0) {
		pthread_mutex_lock(&c->lock);
		while (!c->have_reply && c->failed == 0)
			pthread_cond_wait(&c->replied, &c->lock);
		c->req_active = false;	/* failed: nothing to send again */
		if (c->have_reply) {
			*reply = c->reply_hdr;
			*payload = c->reply_payload;
			c->reply_payload = NULL;
			c->have_reply = false;
			if (reply->type != want) {
				free(*payload);
				rc = UNISUM_EPROTO;
			}
		} else {
			rc = c->failed;
		}
		pthread_mutex_unlock(&c->lock);
	}
	if (rc != 0) {
		pthread_mutex_lock(&c->lock);
		const char *why = c->failed ? c->failed_why : "the scheduler sent an unexpected reply";
		log_set_last_error("%s", why);
		pthread_mutex_unlock(&c->lock);
	}
	pthread_mutex_unlock(&c->request_lock);
	return rc;
}

int rdv_client_barrier_wait(struct rdv_client *c, int group, int timeout_ms)
{
	pthread_mutex_lock(&c->lock);
	int rc = c->failed;
	bool enter = rc == 0 && !c->barrier_waiting[group] &&
		     c->barrier_done[group] == c->barrier_entered[group];
	if (enter) {
		/* Entered and sent under the lock: a resume (client_resume.c)
		 * sees both or neither. */
		c->barrier_entered[group]++;
		struct wire_hdr h = {.type = WIRE_BARRIER, .sender = c->id, .aux = (uint32_t)group};
		int sent = rdv_send(c, &h, NULL);
		if (sent != 0) {
			c->barrier_entered[group]--;
			pthread_mutex_unlock(&c->lock);
			log_set_last_error("cannot reach the scheduler to enter a barrier");
			return sent;
		}
	}
	pthread_mutex_unlock(&c->lock);
	struct timespec until = timing_deadline(timeout_ms >= 0 ? timeout_ms : 0);
	pthread_mutex_lock(&c->lock);
	int timed_out = 0;
	while (c->barrier_done[group] != c->barrier_entered[group] && c->failed == 0 && !timed_out)
		timed_out = timeout_ms < 0 ? pthread_cond_wait(&c->replied, &c->lock)
					   : pthread_cond_timedwait(&c->replied, &c->lock, &until);
	if (c->barrier_done[group] == c->barrier_entered[group])
		rc = 1;
	else if (c->failed != 0) {
		rc = c->failed;
		log_set_last_error("%s", c->failed_why);
	} else
		rc = 0;
	c->barrier_waiting[group] = rc == 0;
	pthread_mutex_unlock(&c->lock);
	return rc;
}

int rdv_client_barrier(struct rdv_client *c, int group)
{
	int rc = rdv_client_barrier_wait(c, group, -1);
	return rc == 1 ? 0 : rc;
}

int rdv_client_declare(struct rdv_client *c, const char *name, unisum_dtype dtype,
		       uint64_t count, uint64_t partition_bytes, uint64_t *key_base,
		       uint32_t *nparts, struct placement_part **parts_out, uint32_t **servers_out,
		       char *why, size_t why_len)
{
	return rdv_client_declare_homed(c, name, dtype, count, partition_bytes, 0, NULL, NULL, NULL,
					0, NULL, -1, key_base, nparts, parts_out, servers_out, why, why_len);
}

int rdv_client_declare_homed(struct rdv_client *c, const char *name, unisum_dtype dtype,
			     uint64_t count, uint64_t partition_bytes, uint32_t nseg,
			     const uint64_t *seg_counts, const uint32_t *seg_owners,
			     const struct rdv_shape *shape, uint32_t sync, const char *compression,
			     int rack, uint64_t *key_base, uint32_t *nparts,
			     struct placement_part **parts_out,
			     uint32_t **servers_out, char *why, size_t why_len)
{
	*nparts = 0;
	*parts_out = NULL;
	*servers_out = NULL;
	struct wire_buf b;
	wire_buf_init(&b);
	struct rdv_segs segs = {.n = nseg, .counts = (uint64_t *)seg_counts,
				.owners = (uint32_t *)seg_owners};
	rdv_declare_encode(&b, name, partition_bytes, &segs, shape, rack, compression);
	if (b.failed) {
		wire_buf_fini(&b);
		return UNISUM_ENOMEM;
	}
	struct wire_hdr h = {.type = WIRE_DECLARE, .sender = c->id, .dtype = (uint8_t)dtype,
			     .count = count, .aux = sync, .payload_len = b.len}, reply = {0};
	void *payload = NULL;
	int rc = rdv_request(c, &h, b.data, WIRE_DECLARE, &reply, &payload);
	wire_buf_fini(&b);
	if (rc != 0) {
		snprintf(why, why_len, "%s", log_last_error());
		return rc;
	}
	int status;
	uint32_t n;
	struct placement_part *parts;
	uint32_t *servers;
	rc = rdv_declare_reply_decode(payload, reply.payload_len, &status, why, why_len, &n, &parts,
				      &servers);
	free(payload);
	if (rc == UNISUM_ENOMEM)
		return rc;
	if (rc == 0 && status != 0)
		return log_known_error(status, UNISUM_EREMOTE);
	/* The cut must cover the tensor exactly with partitions no larger
	 * than asked for, or a worker would read past its buffer. */
	size_t esize = unisum_dtype_size(dtype);
	uint64_t most = esize ? partition_bytes / esize : 0, off = 0;
	bool ok = rc == 0 && (n == 0) == (count == 0);
	for (uint32_t i = 0; ok && i < n; i++) {
		ok = parts[i].count > 0 && parts[i].count <= most && parts[i].count <= count - off;
		off += ok ? parts[i].count : 0;
	}
	if (!ok || off != count || reply.key != placement_tensor_key(name)) {
		free(parts);
		free(servers);
		snprintf(why, why_len, "the scheduler's placement of '%s' does not cover its %llu "
			 "elements in partitions of at most %llu bytes (is every node the same unisum "
			 "version?)", name, (unsigned long long)count, (unsigned long long)partition_bytes);
		return UNISUM_EPROTO;
	}
	*key_base = reply.key;
	*nparts = n;
	*parts_out = parts;
	*servers_out = servers;
	return 0;
}

void rdv_client_on_tune(struct rdv_client *c, rdv_tune_fn fn, void *arg)
{
	/* Under the lock, so no TUNE slips between the replay and the switch;
	 * the callback runs with it held only here, once per early TUNE. */
	pthread_mutex_lock(&c->lock);
	for (int i = 0; i < c->nearly; i++)
		fn(arg, &c->early[i]);
	free(c->early);
	c->early = NULL;
	c->nearly = 0;
	c->tune_arg = arg;
	c->tune = fn;
	pthread_mutex_unlock(&c->lock);
}

int rdv_client_post_tune(struct rdv_client *c, const struct rdv_tune *t)
{
	struct wire_buf b;
	wire_buf_init(&b);
	rdv_tune_encode(t, &b);
	struct wire_hdr h = {.type = WIRE_TUNE, .sender = c->id, .round = t->epoch,
			     .payload_len = b.len};
	pthread_mutex_lock(&c->lock);	/* kept and sent as one, for a resume */
	rdv_posted_add(c, t);
	int rc = b.failed ? UNISUM_ENOMEM : rdv_send(c, &h, b.data);
	pthread_mutex_unlock(&c->lock);
	wire_buf_fini(&b);
	return rc;
}

void rdv_client_fail_job(struct rdv_client *c, int err, const char *why)
{
	rdv_send_error(c, 0, err, why);
}

void rdv_client_poison_tensor(struct rdv_client *c, uint64_t key, const char *why)
{
	rdv_send_error(c, key, UNISUM_EMISMATCH, why);
}

void rdv_client_forget(struct rdv_client *c, uint64_t key)
{
	struct wire_hdr h = {.type = WIRE_RETIRE, .sender = c->id, .key = key};
	rdv_held_forget(c, key);
	rdv_send(c, &h, NULL);
}

void rdv_client_free(struct rdv_client *c)
{
	if (c == NULL)
		return;
	pthread_mutex_lock(&c->lock);
	c->closing = true;
	bool failed = c->failed != 0;
	pthread_cond_broadcast(&c->replied);
	pthread_mutex_unlock(&c->lock);
	if (c->role == CONFIG_ROLE_WORKER && !failed) {
		struct wire_hdr h = {.type = WIRE_SHUTDOWN, .sender = c->id};
		/* Under send_lock: a resume does not swap the connection meanwhile. */
		pthread_mutex_lock(&c->send_lock);
		if (!c->resuming && loop_conn_send(c->lc, &h, NULL) == 0)
			loop_conn_flush(c->lc, 1000);
		pthread_mutex_unlock(&c->send_lock);
	}
	pthread_mutex_lock(&c->send_lock);
	loop_conn_shutdown(c->lc);
	pthread_mutex_unlock(&c->send_lock);
	loop_pool_halt(&c->pool);	/* its thread joined: nothing else runs */
	loop_timer_stop(c->pool.loops[0], &c->beat);
	loop_timer_stop(c->pool.loops[0], &c->redial);
	loop_conn_free(c->lc);		/* c->conn too */
	loop_pool_free(&c->pool);
	free(c->reply_payload);
	free(c->early);
	free(c->early_join);
	for (int i = 0; i < c->nearly_fo; i++) {
		free(c->early_fo[i].keys);
		free(c->early_fo[i].servers);
	}
	free(c->early_fo);
	free(c->nodes);
	rdv_held_free(c);
	pthread_mutex_destroy(&c->send_lock);
	pthread_mutex_destroy(&c->request_lock);
	pthread_mutex_destroy(&c->lock);
	pthread_cond_destroy(&c->replied);
	free(c);
}
