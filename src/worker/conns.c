/*
 * conns.c - the worker's server connections: the PUSH stage (one thread
 * taking partitions in priority order under the credit), each
 * connection's sending thread (PUSH, then PULL) and receiving thread (the
 * PULL stage: replies straight into the caller's output), the pending
 * table, and how a job ends (part.c completes its operation when its
 * last partition does, through the upcall w->up->part_done).  See
 * worker.c's DESIGN.
 */
#include <endian.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "compress/compress.h"
#include "log/log.h"
#include "reducer/reducer.h"
#include "timing/timing.h"
#include "trace/trace.h"
#include "wire/wire.h"
#include "worker/worker_int.h"

/* A kept reply goes to the output in slices of this many bytes (a
 * multiple of every element size). */
#define WK_COPY_SLICE 65536u

/* ---- send queue and pending table --------------------------------------- */

/* Appends to a connection's send queue; the caller holds its lock. */
static void fifo_push(struct wk_conn *c, struct wk_job *j)
{
	j->next = NULL;
	if (c->qtail != NULL)
		c->qtail->next = j;
	else
		c->qhead = j;
	c->qtail = j;
}

static struct wk_job *fifo_pop(struct wk_conn *c)
{
	struct wk_job *j = c->qhead;
	if (j != NULL) {
		c->qhead = j->next;
		if (c->qhead == NULL)
			c->qtail = NULL;
	}
	return j;
}

static size_t pending_slot(const struct wk_conn *c, uint64_t key)
{
	key ^= key >> 29;
	key *= 0xbf58476d1ce4e5b9ull;
	key ^= key >> 32;
	return (size_t)(key & (c->npending_buckets - 1));
}

static void pending_add(struct wk_conn *c, struct wk_job *j)
{
	size_t s = pending_slot(c, j->key);
	j->pending_next = c->pending[s];
	c->pending[s] = j;
}

/* The pending job of `key` (left in the table), or NULL. */
static struct wk_job *pending_find(struct wk_conn *c, uint64_t key)
{
	for (struct wk_job *j = c->pending[pending_slot(c, key)]; j; j = j->pending_next)
		if (j->key == key && j->type == JOB_PUSH_PULL)
			return j;
	return NULL;
}

/* Removes and returns the pending job of `key`, or NULL. */
static struct wk_job *pending_take(struct wk_conn *c, uint64_t key)
{
	struct wk_job **pp = &c->pending[pending_slot(c, key)];
	for (; *pp; pp = &(*pp)->pending_next) {
		struct wk_job *j = *pp;
		if (j->key == key && j->type == JOB_PUSH_PULL) {
			*pp = j->pending_next;
			return j;
		}
	}
	return NULL;
}

/* Ends a PUSH_PULL job taken from the PUSH stage, however it ended: gives
 * its credit back, puts its spans on the timeline, completes its part of
 * the operation and frees it. */
static void wk_job_finish(struct wk_job *j, int err, const char *why)
{
	struct worker *w = j->op->w;
	bool released_now = !j->credit_back;
	size_t inflight = released_now ? pushq_release(&w->push_q, j->entry.bytes) : 0;
	struct wk_op *op = j->op;
	if (op->traced) {
		int64_t now = trace_now_us();
		int ti = op->t->index;
		uint32_t step = op->round;	/* j->round counts the rounds of its cut */
		trace_span(TRACE_QUEUE, ti, j->part, step, j->key, j->entry.bytes, j->entry.order,
			   j->t_queued, j->t_taken);
		if (j->t_pushed != 0) {
			trace_span(TRACE_PUSH, ti, j->part, step, j->key, j->entry.bytes,
				   j->entry.order, j->t_taken, j->t_pushed);
			trace_span(TRACE_PULL, ti, j->part, step, j->key, j->entry.bytes, 0,
				   j->t_pushed, now);
		}
		if (released_now)
			trace_span(TRACE_INFLIGHT, ti, 0, step, 0, inflight, 0, now, now);
	}
	if (j->nothing) {	/* failed before its acknowledgement */
		j->nothing = false;
		pthread_mutex_lock(&w->lock);
		w->up->nothing_pushed(w, op);
		pthread_mutex_unlock(&w->lock);
	}
	if (j->phase > 0)
		w->up->phase_step(w, op, j->phase);
	if (op->local != NULL)
		local_pulled(op->local, j->part, err, why);
	else
		w->up->part_done(op, err, why);
	free(j);
}

/* ---- connection threads ------------------------------------------------- */

/* Sends job j, a RESTORE, a held PULL, a RETIRE or a DECLARE_CHECK, and
 * frees it.  0 or the transport's error.  On c's sending thread. */
static int wk_send_control(struct wk_conn *c, struct wk_job *j)
{
	struct worker *w = c->w;
	int rc;

	if (j->type == JOB_RESTORE) {
		struct wire_hdr h = {.type = WIRE_RESTORE, .sender = rdv_client_id(w->rdv),
				     .key = j->key, .round = j->round, .count = j->count,
				     .dtype = (uint8_t)j->dtype,
				     .payload_len = j->count * unisum_dtype_size(j->dtype)};
		rc = c->tp->send(c->conn, &h, j->in);
		free(j->owned);
		free(j);
	} else if (j->type == JOB_PULL) {
		/* A held PULL's phase came (wk_phase_step): it goes now
		 * if its PUSH went out, else with its PUSH; not at all
		 * if its job ended. */
		pthread_mutex_lock(&c->lock);
		struct wk_job *pj = pending_find(c, j->key);
		bool go = pj != NULL && pj->round == j->round && pj->pull_waiting;
		if (go)
			pj->pull_waiting = false;
		pthread_mutex_unlock(&c->lock);
		struct wire_hdr h = {.type = WIRE_PULL, .sender = rdv_client_id(w->rdv),
				     .key = j->key, .round = j->round, .dtype = (uint8_t)j->dtype};
		free(j);
		rc = go ? c->tp->send(c->conn, &h, NULL) : 0;
	} else if (j->type == JOB_RETIRE) {
		struct wire_hdr h = {.type = WIRE_RETIRE, .sender = rdv_client_id(w->rdv),
				     .key = j->key, .round = j->round};
		rc = c->tp->send(c->conn, &h, NULL);
		free(j);
	} else {	/* JOB_DECLARE */
		/* The name lets the server say which tensor stalls. */
		struct wire_buf b;
		wire_buf_init(&b);
		wire_declare_check_encode(&b, j->name, j->ranks, j->nranks, j->spec);
		struct wire_hdr h = {.type = WIRE_DECLARE_CHECK, .sender = rdv_client_id(w->rdv),
				     .key = j->key, .count = j->count, .dtype = (uint8_t)j->dtype,
				     .aux = j->sync, .payload_len = b.len, .round = j->round};
		rc = b.failed ? UNISUM_ENOMEM : c->tp->send(c->conn, &h, b.data);
		wire_buf_fini(&b);
		free(j->name);
		free(j->spec);
		free(j->ranks);
		free(j);
	}
	return rc;
}

/* Sends PUSH_PULL job j: its PUSH (from the caller's buffer, or
 * compressed, or ZERO), then its PULL unless the PULL's ring phase has
 * not come.  The job stays in the pending table for the receiving thread,
 * which may complete it as soon as its PULL is out.  0 or an error.  On
 * c's sending thread. */
static int wk_send_push(struct wk_conn *c, struct wk_job *j)
{
	struct worker *w = c->w;
	int rc;

	/* Build both headers first: once PULL is on its way the reply may
	 * complete (and free) the job before send() returns. */
	struct wire_hdr push = {.type = WIRE_PUSH, .sender = rdv_client_id(w->rdv),
				.round = j->round, .key = j->key, .count = j->count,
				.dtype = (uint8_t)j->dtype, .aux = j->wire_op};
	/* Over IPC the transport passes j->in by address: it stays
	 * as it is until the reply arrives. */
	const void *payload = j->in;
	void *encoded = NULL;
	if (payload == NULL) {
		push.flags = WIRE_FLAG_ZERO;
	} else if (j->cs != NULL) {
		/* A compressed partition: its encoding goes through
		 * the socket (IPC too), so it is freed once sent. */
		push.flags = WIRE_FLAG_COMPRESSED;
		push.payload_len = wk_push_bytes(j->op->t, j->count, j->cs);
		encoded = malloc(push.payload_len);
		if (encoded == NULL) {
			LOG_ERROR("%s: out of memory compressing a push", c->label);
			return UNISUM_ENOMEM;
		}
		compress_state_encode(j->cs, j->in,
				      encoded, compress_draw_seed(&j->cs->spec, j->key,
							  j->round, w->rank));
		payload = encoded;
	} else {
		push.payload_len = j->count * unisum_dtype_size(j->dtype);
	}
	struct wire_hdr pull = push;
	pull.type = WIRE_PULL;
	pull.flags = j->skip_pull ? WIRE_FLAG_SKIP : 0;
	pull.aux = 0;
	pull.count = 0;
	pull.payload_len = 0;
	bool traced = j->op->traced;
	/* Its PULL's phase has not come: it stays back.  (A
	 * phased job is never routed again: failover does not
	 * move a gathering collective's keys, it fails the job.) */
	pthread_mutex_lock(&c->lock);
	bool held = j->phase > atomic_load(&j->op->phase_sent);
	j->pull_waiting = held;
	pthread_mutex_unlock(&c->lock);
	if (wk_metering(w) && c->tp == transport_tcp() && payload != NULL)
		wk_meter_sent(c, j);
	rc = c->tp->send(c->conn, &push, payload);
	free(encoded);
	if (rc == 0 && payload != NULL)
		atomic_fetch_add(&c->bytes_pushed, push.payload_len);
	if (rc == 0 && traced) {
		/* Under the lock: the receiving thread reads it after
		 * taking the job from the pending table. */
		pthread_mutex_lock(&c->lock);
		j->t_pushed = trace_now_us();
		pthread_mutex_unlock(&c->lock);
	}
	if (rc == 0 && !held)
		rc = c->tp->send(c->conn, &pull, NULL);
	return rc;
}

/* A connection's sending thread: owns the sending side of c->conn, takes
 * c's queue in order (PUSH_PULL jobs the PUSH stage routed here, and the
 * control jobs queued straight on it: DECLARE_CHECK, RETIRE, RESTORE, a
 * held PULL) and writes each, with no lock held.  Blocks on c->cond while
 * the queue is empty, and in the transport's send.  Ends when c is dead,
 * or at the first failed send, shutting the socket down so that the
 * receiving thread notices and fails what is pending. */
static void *wk_send_main(void *arg)
{
	struct wk_conn *c = arg;
	for (;;) {
		pthread_mutex_lock(&c->lock);
		while (c->qhead == NULL && !c->dead)
			pthread_cond_wait(&c->cond, &c->lock);
		if (c->dead) {
			pthread_mutex_unlock(&c->lock);
			return NULL;
		}
		struct wk_job *j = fifo_pop(c);
		pthread_mutex_unlock(&c->lock);

		int rc = j->type == JOB_PUSH_PULL ? wk_send_push(c, j) : wk_send_control(c, j);
		if (rc != 0) {
			/* The receiving thread notices the broken socket and cleans up. */
			c->tp->conn_shutdown(c->conn);
			return NULL;
		}
	}
}

/* The first step of wk_conn_fail: a server hanging up mid-job is usually
 * the echo of another node's death, which the scheduler is about to
 * announce: its notice gets a moment, so the error names the root cause
 * (copied into root, and *why pointed at it) rather than the echo.  With
 * failover the scheduler answers a lost server with FAILOVER (or fails the
 * job); it notices within UNISUM_TIMEOUT_MS.  Returns whether c's server
 * failed over; *closing: whether the worker is closing its connections. */
static bool wk_conn_await_notice(struct wk_conn *c, const char **why, char *root, size_t len,
				 bool *closing)
{
	struct worker *w = c->w;
	pthread_mutex_lock(&w->lock);
	pthread_mutex_lock(&c->lock);
	*closing = c->closing;
	pthread_mutex_unlock(&c->lock);
	int wait_ms = w->keep_replies ? w->cfg.timeout_ms + 2000 : 2000;
	if (w->failed == 0 && !*closing) {
		struct timespec until = timing_deadline(wait_ms);
		while (w->failed == 0 && !(w->lost != NULL && w->lost[c->server]) &&
		       pthread_cond_timedwait(&w->failed_cond, &w->lock, &until) == 0)
			;
	}
	bool failover = w->failed == 0 && !*closing && w->lost != NULL && w->lost[c->server];
	if (w->failed != 0) {
		snprintf(root, len, "%s%s",
			 w->failed == UNISUM_EMEMBERSHIP ? "" : "the job failed: ", w->failed_why);
		*why = root;
	}
	pthread_mutex_unlock(&w->lock);
	return failover;
}

/* Dead connection c (its sender stopped): frees the jobs only queued on
 * it (DECLARE and the other control jobs; queued PUSH_PULL jobs are also
 * pending) and returns every pending job, linked by pending_next. */
static struct wk_job *wk_conn_drain(struct wk_conn *c)
{
	struct wk_job *all = NULL;
	pthread_mutex_lock(&c->lock);
	for (struct wk_job *j; (j = fifo_pop(c)) != NULL;) {
		if (j->type != JOB_PUSH_PULL) {
			free(j->owned);
			free(j->name);
			free(j->spec);
			free(j->ranks);
			free(j);
		}
	}
	for (size_t i = 0; i < c->npending_buckets; i++) {
		while (c->pending[i]) {
			struct wk_job *j = c->pending[i];
			c->pending[i] = j->pending_next;
			j->pending_next = all;
			all = j;
		}
	}
	pthread_mutex_unlock(&c->lock);
	return all;
}

/* c's server failed over: its keys live elsewhere now, declared there
 * first (wk_hand_over), then every job of `all` and every job parked on c
 * meanwhile goes there too, behind the declarations; from now on jobs for
 * it follow their keys. */
static void wk_conn_hand_over(struct wk_conn *c, struct wk_job *all)
{
	struct worker *w = c->w;
	int rc = w->up->hand_over(w, c->server);
	if (rc != 0) {
		char msg[300];
		snprintf(msg, sizeof msg, "worker %d cannot move the work of lost %s: %s", w->rank,
			 c->label, rc == UNISUM_ENOMEM ? "out of memory" : log_last_error());
		rdv_client_fail_job(w->rdv, rc, msg);
	}
	pthread_mutex_lock(&c->lock);
	c->handed_over = true;
	c->parking = false;
	while (c->parked != NULL) {
		struct wk_job *j = c->parked;
		c->parked = j->pending_next;
		j->pending_next = all;
		all = j;
	}
	pthread_mutex_unlock(&c->lock);
	while (all) {
		struct wk_job *j = all;
		all = j->pending_next;
		j->repushed = true;
		wk_route(w, j);
	}
}

/* Marks the connection dead, stops its sender, fails every pending job
 * (or, when its server failed over, sends them where their keys went).
 * On c's receiving thread, as it ends. */
static void wk_conn_fail(struct wk_conn *c, const char *why)
{
	struct worker *w = c->w;
	char root[640];
	bool closing;
	bool failover = wk_conn_await_notice(c, &why, root, sizeof root, &closing);
	pthread_mutex_lock(&c->lock);
	c->dead = true;
	c->parking = failover;
	if (c->dead_why[0] == '\0')
		snprintf(c->dead_why, sizeof c->dead_why, "%s", why);
	pthread_cond_broadcast(&c->cond);
	pthread_mutex_unlock(&c->lock);
	c->tp->conn_shutdown(c->conn);
	pthread_join(c->send_thread, NULL);

	struct wk_job *all = wk_conn_drain(c);
	if (failover) {
		wk_conn_hand_over(c, all);
		return;
	}
	pthread_mutex_lock(&w->lock);
	int err = w->failed != 0 ? w->failed : UNISUM_ECONN;	/* the root cause's code */
	pthread_mutex_unlock(&w->lock);
	if (!closing && all != NULL && err != UNISUM_EMEMBERSHIP)
		LOG_ERROR("%s", c->dead_why);
	while (all) {
		struct wk_job *j = all;
		all = j->pending_next;
		wk_job_finish(j, err, c->dead_why);
	}
}

/* Takes the pending job that a PULL_REPLY or per-key ERROR answers.  When
 * this worker never asked for it (unknown key, other round, other shape),
 * fails that job if there is one, writes why to msg and returns NULL: the
 * connection is then broken. */
static struct wk_job *wk_take_answered(struct wk_conn *c, const struct wire_hdr *h, char *msg,
				       size_t len)
{
	pthread_mutex_lock(&c->lock);
	struct wk_job *j = pending_take(c, h->key);
	pthread_mutex_unlock(&c->lock);
	bool reply = h->type == WIRE_PULL_REPLY;
	if (j != NULL && j->round == h->round &&
	    (!reply || (j->dtype == h->dtype && j->count == h->count)))
		return j;
	snprintf(msg, len, "%s sent %s for key 0x%llx round %u that this worker did not ask for",
		 c->label, reply ? "a reply" : "an error", (unsigned long long)h->key, h->round);
	if (j != NULL)
		wk_job_finish(j, UNISUM_EPROTO, msg);
	return NULL;
}

/* An ERROR from the server of c: with key 0 it refused this worker (1,
 * msg set: the connection ends); with a key one partition failed (its
 * tensor is poisoned) and the connection goes on (0). */
static int wk_on_error(struct wk_conn *c, const struct wire_hdr *h, char *msg, size_t len)
{
	char text[400] = "";
	void *p = malloc(h->payload_len + 1);
	if (p != NULL && c->tp->recv_payload(c->conn, p, h->payload_len) == 0)
		wire_error_decode(p, h->payload_len, text, sizeof text);
	free(p);
	if (h->key == 0) {
		snprintf(msg, len, "%s rejected this worker: %s", c->label, text);
		return 1;
	}
	struct wk_job *j = wk_take_answered(c, h, msg, len);
	if (j == NULL)
		return 1;
	wk_job_finish(j, log_known_error(-(int)h->aux, UNISUM_EREMOTE), text);
	return 0;
}

/* A PUSH_ACK: the server has the push, its bytes leave the credit.  0, or
 * 1 with msg set for an ack of nothing this worker pushed. */
static int wk_on_push_ack(struct wk_conn *c, const struct wire_hdr *h, char *msg, size_t len)
{
	struct worker *w = c->w;
	pthread_mutex_lock(&c->lock);
	struct wk_job *j = pending_find(c, h->key);
	bool ok = j != NULL && j->round == h->round && (!j->credit_back || j->repushed);
	/* A job pushed again after a failover may have had its credit back
	 * from the lost server: its second ack releases nothing. */
	bool release = ok && !j->credit_back;
	if (ok) {
		j->credit_back = true;
		j->repushed = false;
	}
	bool nothing = ok && j->nothing;
	struct wk_op *nothing_op = nothing ? j->op : NULL;	/* in flight: its SKIP reply comes later */
	if (nothing)
		j->nothing = false;
	size_t bytes = release ? j->entry.bytes : 0;
	bool traced = ok && j->op->traced;
	uint32_t step = ok ? j->op->round : 0;
	int64_t sent = ok ? j->t_sent_us : 0;
	pthread_mutex_unlock(&c->lock);
	if (nothing_op != NULL) {
		pthread_mutex_lock(&w->lock);
		w->up->nothing_pushed(w, nothing_op);
		pthread_mutex_unlock(&w->lock);
	}
	if (!ok) {
		snprintf(msg, len, "%s acknowledged a push of key 0x%llx round %u that this worker did "
			 "not make", c->label, (unsigned long long)h->key, h->round);
		return 1;
	}
	if (sent != 0)
		wk_meter_acked(w, bytes, sent);
	else if (wk_metering(w) && c->tp == transport_ipc())
		wk_meter_local(w, bytes);
	size_t inflight = pushq_release(&w->push_q, bytes);
	if (traced) {
		int64_t now = trace_now_us();
		trace_span(TRACE_INFLIGHT, 0, 0, step, 0, inflight, 0, now, now);
	}
	return 0;
}

/* A compressed PULL_REPLY of job j: its encoding, checked, decoded into
 * the job's output.  0; -1 when the job failed on it and the connection
 * goes on (the payload was read: a wrong length, bytes that are not an
 * encoding); 1 with msg set when the connection cannot go on. */
static int wk_take_compressed(struct wk_conn *c, const struct wire_hdr *h, struct wk_job *j,
			      char *msg, size_t len)
{
	if (j->cs == NULL || !(h->flags & WIRE_FLAG_COMPRESSED)) {
		snprintf(msg, len, "%s answered a pull of key 0x%llx round %u %s", c->label,
			 (unsigned long long)h->key, h->round,
			 j->cs == NULL ? "of an uncompressed tensor with a compressed sum"
				       : "of a compressed tensor with an uncompressed sum");
		wk_job_finish(j, UNISUM_EPROTO, msg);
		return 1;
	}
	const struct compress_spec *spec = &j->cs->spec;
	const struct compress_codec *codec = compress_codec_of(spec->kind);
	size_t want = codec->bytes(spec, (size_t)j->count);
	void *enc = h->payload_len == want ? malloc(want ? want : 1) : NULL;
	int rc = c->tp->recv_payload(c->conn, enc, h->payload_len);
	if (rc != 0) {
		free(enc);
		if (rc == UNISUM_ECONN) {
			pthread_mutex_lock(&c->lock);
			pending_add(c, j);
			pthread_mutex_unlock(&c->lock);
		} else {
			wk_job_finish(j, rc, log_last_error());
		}
		snprintf(msg, len, "%s: the connection closed in the middle of a reply", c->label);
		return 1;
	}
	char why[512];
	if (h->payload_len != want)
		snprintf(why, sizeof why, "%s sent a %s sum of %llu bytes for key 0x%llx round %u, "
			 "but %llu elements encode in %zu", c->label, codec->name,
			 (unsigned long long)h->payload_len, (unsigned long long)h->key, h->round,
			 (unsigned long long)j->count, want);
	else if (enc == NULL)
		snprintf(why, sizeof why, "out of memory for a compressed reply of %s", c->label);
	else if (codec->decode(spec, enc, want, j->out, (size_t)j->count,
			       compress_draw_seed(spec, h->key, h->round, -1)) != 0)
		snprintf(why, sizeof why, "%s sent a %s sum for key 0x%llx round %u that is not an "
			 "encoding of %llu elements", c->label, codec->name,
			 (unsigned long long)h->key, h->round, (unsigned long long)j->count);
	else
		why[0] = '\0';
	int code = enc == NULL && h->payload_len == want ? UNISUM_ENOMEM : UNISUM_EPROTO;
	free(enc);
	if (why[0] != '\0') {
		LOG_ERROR("%s", why);
		wk_job_finish(j, code, why);
		return -1;
	}
	return 0;
}

/* A PULL_REPLY: the sum goes straight into the caller's output (read from
 * the server's memory over IPC), divided there for an average.  0, or
 * 1 with msg set when the connection cannot go on. */
static int wk_on_pull_reply(struct wk_conn *c, const struct wire_hdr *h, char *msg, size_t len)
{
	struct worker *w = c->w;
	struct wk_job *j = wk_take_answered(c, h, msg, len);
	if (j == NULL)
		return 1;
	size_t bytes = j->count * unisum_dtype_size(j->dtype);
	if ((h->flags & WIRE_FLAG_SKIP) != j->skip_pull * WIRE_FLAG_SKIP) {
		snprintf(msg, len, "%s answered a pull of key 0x%llx round %u %s", c->label,
			 (unsigned long long)h->key, h->round,
			 j->skip_pull ? "that skips the data with data" : "without its data");
		wk_job_finish(j, UNISUM_EPROTO, msg);
		return 1;
	}
	if (j->skip_pull) {
		if (j->kept != NULL)
			j->kept->pulled = j->round + 1;
		wk_job_finish(j, 0, NULL);
		return 0;
	}
	/* Failover: the reply lands in the kept buffer, then in the output
	 * (which a push may come from: a lost server's half reply must not
	 * overwrite it). */
	uint8_t *into = j->out;
	if (j->kept != NULL && j->cs == NULL) {
		if (j->kept->data == NULL)
			j->kept->data = malloc(bytes ? bytes : 1);
		if (j->kept->data != NULL)
			into = j->kept->data;
	}
	if (h->flags & WIRE_FLAG_COMPRESSED || j->cs != NULL) {
		int rc = wk_take_compressed(c, h, j, msg, len);
		if (rc != 0)
			return rc > 0;
		bytes = h->payload_len;
	} else if (h->flags & WIRE_FLAG_ZERO) {
		memset(into, 0, bytes);
	} else {
		int rc = c->tp->recv_payload(c->conn, into, bytes);
		if (rc == UNISUM_ECONN) {
			/* The server is gone: its job fails with the others, named
			 * by the root cause (wk_conn_fail). */
			pthread_mutex_lock(&c->lock);
			pending_add(c, j);
			pthread_mutex_unlock(&c->lock);
			snprintf(msg, len, "%s: the connection closed in the middle of a reply", c->label);
			return 1;
		}
		if (rc != 0) {
			snprintf(msg, len, "worker %d cannot take a reply of %s: %s", w->rank, c->label,
				 log_last_error());
			wk_job_finish(j, rc, msg);
			return 1;
		}
	}
	if (!(h->flags & WIRE_FLAG_ZERO))
		atomic_fetch_add(&w->bytes_pulled, bytes);
	if (j->kept != NULL)
		j->kept->pulled = j->round + 1;
	if (into != j->out) {
		/* Copied in slices that stay in cache for the division, so
		 * an average costs the memory traffic it did without the
		 * kept copy (receive, then divide in place). */
		size_t es = unisum_dtype_size(j->dtype), total = j->count * es;
		for (size_t at = 0; at < total; at += WK_COPY_SLICE) {
			size_t n = total - at < WK_COPY_SLICE ? total - at : WK_COPY_SLICE;
			memcpy((uint8_t *)j->out + at, into + at, n);
			if (j->divisor > 1)
				reducer_divide((uint8_t *)j->out + at, n / es, j->dtype, j->divisor);
		}
	} else if (j->divisor > 1) {
		reducer_divide(j->out, j->count, j->dtype, j->divisor);
	}
	wk_job_finish(j, 0, NULL);
	return 0;
}

/* A MOVED (the key went to a replacement server, failover.c): the push
 * counts as acknowledged, the key is declared on its new server at this
 * round and retired here, and the job goes there.  0, or 1 with msg set
 * when nothing of this worker's was pushed under that key and round. */
static int wk_on_moved(struct wk_conn *c, const struct wire_hdr *h, char *msg, size_t len)
{
	struct worker *w = c->w;
	pthread_mutex_lock(&c->lock);
	struct wk_job *j = pending_take(c, h->key);
	pthread_mutex_unlock(&c->lock);
	if (j == NULL || j->round != h->round || h->aux >= (uint32_t)w->nservers ||
	    (int)h->aux == c->server) {
		snprintf(msg, len, "%s moved key 0x%llx round %u that this worker did not push there",
			 c->label, (unsigned long long)h->key, h->round);
		if (j != NULL)
			wk_job_finish(j, UNISUM_EPROTO, msg);
		return 1;
	}
	if (!j->credit_back) {
		j->credit_back = true;
		pushq_release(&w->push_q, j->entry.bytes);
	}
	j->repushed = true;
	int rc = w->up->move_key(w, c, j, (int)h->aux);
	if (rc != 0) {
		snprintf(msg, len, "worker %d cannot move key 0x%llx to server %u: %s", w->rank,
			 (unsigned long long)h->key, h->aux, log_last_error());
		wk_job_finish(j, rc, msg);
		return 0;
	}
	wk_route(w, j);
	return 0;
}

/* The PULL stage of one server connection (see the DESIGN above). */
static void *wk_recv_main(void *arg)
{
	struct wk_conn *c = arg;
	char why[400] = "", msg[512];
	for (int stop = 0; !stop;) {
		struct wire_hdr h;
		int rc = c->tp->recv_header(c->conn, &h, why, sizeof why);
		if (rc != 0) {
			snprintf(msg, sizeof msg, "%s: %s", c->label,
				 rc == UNISUM_EPROTO ? why : "the connection closed (did the server exit?)");
			break;
		}
		if (h.type == WIRE_ERROR)
			stop = wk_on_error(c, &h, msg, sizeof msg);
		else if (h.type == WIRE_PUSH_ACK)
			stop = wk_on_push_ack(c, &h, msg, sizeof msg);
		else if (h.type == WIRE_PULL_REPLY)
			stop = wk_on_pull_reply(c, &h, msg, sizeof msg);
		else if (h.type == WIRE_MOVED)
			stop = wk_on_moved(c, &h, msg, sizeof msg);
		else {
			snprintf(msg, sizeof msg, "%s sent an unexpected %s", c->label, wire_type_name(h.type));
			stop = 1;
		}
	}
	wk_conn_fail(c, msg);
	return NULL;
}

/* Queues a DECLARE job straight on its server's connection (ahead of
 * every push the PUSH stage hands over later).  Returns UNISUM_ECONN (with
 * the reason in the last error) when the connection is dead. */
int wk_enqueue(struct wk_conn *c, struct wk_job *j)
{
	pthread_mutex_lock(&c->lock);
	int rc = 0;
	if (c->dead) {
		log_set_last_error("%s", c->dead_why);
		rc = UNISUM_ECONN;
	} else {
		fifo_push(c, j);
		pthread_cond_signal(&c->cond);
	}
	pthread_mutex_unlock(&c->lock);
	return rc;
}

/* The PUSH stage: takes partitions in (priority, key) order as the credit
 * allows and hands each to its server's connection. */
void *wk_push_main(void *arg)
{
	struct worker *w = arg;
	for (;;) {
		struct pushq_entry *e = pushq_pop(&w->push_q);
		if (e == NULL)
			return NULL;
		struct wk_job *j = (struct wk_job *)((char *)e - offsetof(struct wk_job, entry));
		/* Once handed over, the job may complete and be freed at any
		 * moment: keep what the timeline needs. */
		bool traced = j->op->traced;
		uint32_t round = j->op->round;
		size_t inflight = e->inflight;
		int64_t now = traced ? trace_now_us() : 0;
		j->t_taken = now;
		wk_route(w, j);
		if (traced)
			trace_span(TRACE_INFLIGHT, 0, 0, round, 0, inflight, 0, now, now);
	}
}

size_t wk_push_bytes(const struct wk_tensor *t, uint64_t count, const struct compress_state *cs)
{
	if (cs == NULL)
		return (size_t)count * t->esize;
	return compress_codec_of(cs->spec.kind)->bytes(&cs->spec, (size_t)count);
}

void wk_route(struct worker *w, struct wk_job *j)
{
	for (int hops = 0;; hops++) {
		if (atomic_load(&w->any_moved)) {
			/* A failover moved keys: its key may live elsewhere. */
			pthread_mutex_lock(&w->lock);
			j->server = (int)w->up->server_of(w, j->key, (uint32_t)j->server);
			pthread_mutex_unlock(&w->lock);
		}
		struct wk_conn *c = &w->conns[j->server];
		pthread_mutex_lock(&c->lock);
		bool dead = c->dead, moved = c->handed_over;
		if (!dead) {
			pending_add(c, j);
			fifo_push(c, j);
			pthread_cond_signal(&c->cond);
		} else if (c->parking) {
			/* Its hand-over is under way (wk_conn_fail). */
			j->pending_next = c->parked;
			c->parked = j;
			pthread_mutex_unlock(&c->lock);
			return;
		}
		char why[sizeof c->dead_why];
		snprintf(why, sizeof why, "%s", dead ? c->dead_why : "");
		pthread_mutex_unlock(&c->lock);
		if (!dead)
			return;
		pthread_mutex_lock(&w->lock);
		uint32_t to = (uint32_t)j->server;
		if (moved)
			to = w->up->server_of(w, j->key, to);
		/* The key went back to a lost server's replacement (MIGRATE)
		 * whose REJOIN this worker has not followed yet: wait for it. */
		bool back = false;
		struct timespec until = timing_deadline(w->cfg.timeout_ms);
		while (moved && to == (uint32_t)j->server && w->failed == 0 && !back) {
			if (pthread_cond_timedwait(&w->failed_cond, &w->lock, &until) != 0)
				break;
			pthread_mutex_lock(&c->lock);
			back = !c->dead;
			pthread_mutex_unlock(&c->lock);
		}
		int err = w->failed != 0 ? w->failed : UNISUM_ECONN;
		pthread_mutex_unlock(&w->lock);
		if (back && hops < w->nservers)
			continue;
		if (to == (uint32_t)j->server || hops >= w->nservers) {
			wk_job_finish(j, err, why);
			return;
		}
		j->server = (int)to;
	}
}

/* Connects c to server n and says hello: over IPC when n shares this
 * host (same boot, network and pid namespaces) and UNISUM_IPC allows,
 * else (or when n does not listen for IPC) over TCP. */
static int wk_connect_one(struct worker *w, struct wk_conn *c, const struct rdv_node *n)
{
	int rc = UNISUM_ECONN;
	if (w->cfg.ipc && rdv_client_same_host(w->rdv, n)) {
		c->tp = transport_ipc();
		rc = c->tp->connect(n->host, n->port, 0, &c->conn);
		if (rc == 0)
			LOG_INFO("worker %d passes data to %s by address (IPC: same host)", w->rank,
				 c->label);
		else
			LOG_INFO("worker %d reaches %s over TCP: %s", w->rank, c->label, log_last_error());
	}
	if (rc != 0) {
		c->tp = transport_tcp();
		rc = c->tp->connect(n->host, n->port, w->cfg.timeout_ms, &c->conn);
	}
	if (rc == UNISUM_ESYS) {
		/* Out of descriptors (named in the last error): every process
		 * of the job hears it, not of a worker that left. */
		char why[640];
		snprintf(why, sizeof why, "worker %d (pid %d) cannot open its connection to %s: %s",
			 w->rank, (int)getpid(), c->label, log_last_error());
		rdv_client_fail_job(w->rdv, UNISUM_ESYS, why);
		return log_fail(rc, "%s", why);
	}
	if (rc != 0)
		return log_fail(rc, "worker %d cannot reach %s: %s", w->rank, c->label, log_last_error());
	struct wire_hdr hello = {.type = WIRE_REGISTER, .sender = rdv_client_id(w->rdv)};
	rc = c->tp->send(c->conn, &hello, NULL);
	if (rc != 0)
		return log_fail(rc, "worker %d lost %s while saying hello", w->rank, c->label);
	return 0;
}

/* A connection's threads could not start (pthread_create's rc): names
 * the limits here and, through the scheduler, to every process of the
 * job, which would otherwise see this worker leave. */
static int wk_no_thread(const struct wk_conn *c, int rc)
{
	char limits[384], why[640];
	log_thread_limits(rc, limits, sizeof limits);
	snprintf(why, sizeof why, "worker %d (pid %d) cannot start the threads for its connection "
		 "to %s: %s", c->w->rank, (int)getpid(), c->label, limits);
	rdv_client_fail_job(c->w->rdv, UNISUM_ESYS, why);
	return log_fail(UNISUM_ESYS, "%s", why);
}

int wk_reconnect(struct worker *w, struct wk_conn *c, const struct rdv_node *n)
{
	pthread_mutex_lock(&c->lock);
	bool gone = c->dead && c->handed_over && !c->parking;
	pthread_mutex_unlock(&c->lock);
	if (!gone)
		return log_fail(UNISUM_EPROTO, "server %d is not a lost one here", n->rank);
	/* Its receiving thread handed its work over and ends (its sender has). */
	if (c->threads_started)
		pthread_join(c->recv_thread, NULL);
	c->threads_started = false;
	if (c->conn != NULL)
		c->tp->conn_free(c->conn);
	c->conn = NULL;
	snprintf(c->label, sizeof c->label, "server %d (%s:%d)", c->server, n->host, n->port);
	int rc = wk_connect_one(w, c, n);
	if (rc != 0)
		return rc;
	/* Counted anew: the bytes this server got since it came back. */
	atomic_store(&c->bytes_pushed, 0);
	pthread_mutex_lock(&c->lock);
	c->dead = false;
	c->handed_over = false;
	c->dead_why[0] = '\0';
	pthread_mutex_unlock(&c->lock);
	if ((rc = pthread_create(&c->send_thread, NULL, wk_send_main, c)) != 0)
		return wk_no_thread(c, rc);
	if ((rc = pthread_create(&c->recv_thread, NULL, wk_recv_main, c)) != 0)
		return wk_no_thread(c, rc);	/* the sender ends with the job */
	c->threads_started = true;
	return 0;
}

int wk_connect_servers(struct worker *w)
{
	w->conns = calloc((size_t)w->nservers, sizeof *w->conns);
	if (w->conns == NULL)
		return UNISUM_ENOMEM;
	/* Every worker counts them from the same address book. */
	w->server_hosts = 0;
	for (int s = 0; s < w->nservers; s++) {
		const struct rdv_node *n = rdv_client_server(w->rdv, s), *m;
		bool seen = false;
		for (int t = 0; n != NULL && t < s && !seen; t++)
			seen = (m = rdv_client_server(w->rdv, t)) != NULL &&
			       strcmp(m->host_id, n->host_id) == 0;
		w->server_hosts += n != NULL && !seen;
	}
	for (int s = 0; s < w->nservers; s++) {
		struct wk_conn *c = &w->conns[s];
		const struct rdv_node *n = rdv_client_server(w->rdv, s);
		c->w = w;
		c->server = s;
		c->npending_buckets = 1024;
		c->pending = calloc(c->npending_buckets, sizeof *c->pending);
		if (n == NULL || c->pending == NULL)
			return UNISUM_ENOMEM;
		snprintf(c->label, sizeof c->label, "server %d (%s:%d)", s, n->host, n->port);
		pthread_mutex_init(&c->lock, NULL);
		pthread_cond_init(&c->cond, NULL);
		int rc = wk_connect_one(w, c, n);
		if (rc != 0)
			return rc;
		if ((rc = pthread_create(&c->send_thread, NULL, wk_send_main, c)) != 0)
			return wk_no_thread(c, rc);
		if ((rc = pthread_create(&c->recv_thread, NULL, wk_recv_main, c)) != 0) {
			/* Stop the sender we just started. */
			pthread_mutex_lock(&c->lock);
			c->dead = true;
			pthread_cond_broadcast(&c->cond);
			pthread_mutex_unlock(&c->lock);
			pthread_join(c->send_thread, NULL);
			return wk_no_thread(c, rc);
		}
		c->threads_started = true;
	}
	pthread_mutex_lock(&w->lock);
	w->conns_live = true;
	pthread_mutex_unlock(&w->lock);
	return 0;
}

/* Stops and frees every server connection (after their threads ran). */
void wk_close_conns(struct worker *w)
{
	pthread_mutex_lock(&w->lock);
	w->conns_live = false;	/* the scheduler's notice keeps off from now on */
	pthread_mutex_unlock(&w->lock);
	if (w->conns == NULL)
		return;
	for (int s = 0; s < w->nservers; s++) {
		struct wk_conn *c = &w->conns[s];
		if (c->conn != NULL) {
			pthread_mutex_lock(&c->lock);
			c->closing = true;
			pthread_mutex_unlock(&c->lock);
			c->tp->conn_shutdown(c->conn);
			if (c->threads_started)
				pthread_join(c->recv_thread, NULL);
			c->tp->conn_free(c->conn);
			pthread_mutex_destroy(&c->lock);
			pthread_cond_destroy(&c->cond);
		}
		free(c->pending);
	}
	/* Under the lock: unisum_get_stats reads the counters under it. */
	pthread_mutex_lock(&w->lock);
	struct wk_conn *conns = w->conns;
	w->conns = NULL;
	pthread_mutex_unlock(&w->lock);
	free(conns);
}
