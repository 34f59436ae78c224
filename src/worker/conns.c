/*
 * conns.c - the worker's server connections: the PUSH stage (one thread
 * taking partitions in priority order under the credit), sending a job
 * (PUSH, then PULL) from whichever thread routes or queues it, the
 * replies as the connection's I/O loop receives them (the PULL stage:
 * straight into the caller's output), the pending table, how a job ends
 * (part.c completes its operation when its last partition does, through
 * the upcall w->up->part_done), and how a connection ends
 * (wk_conn_fail, on the reaper's thread).  links.c opens, serves and
 * closes the connections.  See worker.c's DESIGN.
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
#include <sys/prctl.h>

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
	free(j->enc);
	free(j);
}

/* ---- sending -------------------------------------------------------------- */

/* A message to a server, queued on its connection without a copy. */
struct wk_msg {
	struct loop_conn_msg m;		/* first */
	void *owned;			/* freed once sent or dropped */
};

static void wk_msg_release(struct loop_conn_msg *m)
{
	struct wk_msg *x = (struct wk_msg *)m;
	free(x->owned);
	free(x);
}

/* Sends h and its payload on c: not copied, so the payload stays as it is
 * until the message is sent (`owned`, which may be it, is freed then).
 * The socket takes what it can at once, the loop the rest.  0, or
 * UNISUM_ECONN (the connection ended: its loop tells the reaper) /
 * UNISUM_ENOMEM.  c->lock held. */
static int wk_send(struct wk_conn *c, const struct wire_hdr *h, const void *payload, void *owned)
{
	struct wk_msg *x = calloc(1, sizeof *x);
	if (x == NULL) {
		free(owned);
		return UNISUM_ENOMEM;
	}
	x->m.tx.hdr = *h;
	x->m.tx.payload = h->payload_len > 0 ? payload : NULL;
	x->m.release = wk_msg_release;
	x->owned = owned;
	return loop_conn_send_msg(c->lc, &x->m);
}

/* Sends job j, a RESTORE, a held PULL, a RETIRE or a DECLARE_CHECK, and
 * frees it.  0 or the transport's error.  c->lock held. */
static int wk_send_control(struct wk_conn *c, struct wk_job *j)
{
	struct worker *w = c->w;
	int rc;

	if (j->type == JOB_RESTORE) {
		struct wire_hdr h = {.type = WIRE_RESTORE, .sender = rdv_client_id(w->rdv),
				     .key = j->key, .round = j->round, .count = j->count,
				     .dtype = (uint8_t)j->dtype,
				     .flags = j->restore_len > 0 ? WIRE_FLAG_COMPRESSED
								 : j->restore_flags,
				     .aux = j->wire_op,
				     .payload_len = j->restore_len > 0 ? j->restore_len
						    : (j->restore_flags & WIRE_FLAG_ZERO)
							    ? 0
							    : j->count * unisum_dtype_size(j->dtype)};
		rc = wk_send(c, &h, j->in, j->owned);
		free(j);
	} else if (j->type == JOB_PULL) {
		/* A held PULL's phase came (wk_phase_step): it goes now
		 * if its PUSH went out, else with its PUSH; not at all
		 * if its job ended. */
		struct wk_job *pj = pending_find(c, j->key);
		bool go = pj != NULL && pj->round == j->round && pj->pull_waiting;
		if (go)
			pj->pull_waiting = false;
		struct wire_hdr h = {.type = WIRE_PULL, .sender = rdv_client_id(w->rdv),
				     .key = j->key, .round = j->round, .dtype = (uint8_t)j->dtype};
		free(j);
		rc = go ? wk_send(c, &h, NULL, NULL) : 0;
	} else if (j->type == JOB_RETIRE) {
		struct wire_hdr h = {.type = WIRE_RETIRE, .sender = rdv_client_id(w->rdv),
				     .key = j->key, .round = j->round};
		rc = wk_send(c, &h, NULL, NULL);
		free(j);
	} else {	/* JOB_DECLARE */
		/* The name lets the server say which tensor stalls. */
		struct wire_buf b;
		wire_buf_init(&b);
		wire_declare_check_encode(&b, j->name, j->ranks, j->nranks, j->spec);
		struct wire_hdr h = {.type = WIRE_DECLARE_CHECK, .sender = rdv_client_id(w->rdv),
				     .key = j->key, .count = j->count, .dtype = (uint8_t)j->dtype,
				     .aux = j->sync, .payload_len = b.len, .round = j->round};
		if (b.failed) {
			rc = UNISUM_ENOMEM;
		} else {
			rc = wk_send(c, &h, b.data, b.data);
			b.data = NULL;
		}
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
 * not come.  The job stays in the pending table for the reply, which
 * may complete it once c->lock is let go.  0 or an error.  c->lock
 * held. */
static int wk_send_push(struct wk_conn *c, struct wk_job *j)
{
	struct worker *w = c->w;
	int rc;

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
		push.flags = WIRE_FLAG_COMPRESSED;
		push.payload_len = wk_push_bytes(j->op->t, j->count, j->cs);
		if (wk_encode_push(c, j, push.payload_len, &encoded) != 0)
			return UNISUM_ENOMEM;
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
	/* Its PULL's phase has not come: it stays back.  A push again
	 * after a failover takes its PULL along: the phase's JOB_PULL may
	 * have gone to the lost server, and one that comes later finds it
	 * sent (wk_send_control). */
	bool held = !j->repushed && j->phase > atomic_load(&j->op->phase_sent);
	j->pull_waiting = held;
	/* The PULL rides on the PUSH (one message, one send fewer) unless
	 * it waits for its phase or wants nothing back. */
	bool with_pull = !held && !j->skip_pull;
	if (with_pull)
		push.flags |= WIRE_FLAG_PULL;
	if (wk_metering(w) && c->tp != transport_ipc() && payload != NULL)
		wk_meter_sent(c, j);
	/* Over IPC the transport passes j->in by address, over TCP the
	 * socket takes it as it can: either way it stays as it is until
	 * the reply, which comes after the whole push. */
	rc = wk_send(c, &push, payload, encoded);
	if (rc == 0 && payload != NULL)
		atomic_fetch_add(&c->bytes_pushed, push.payload_len);
	if (rc == 0 && traced)
		j->t_pushed = trace_now_us();	/* the reply reads it under c->lock */
	if (rc == 0 && !held && !with_pull)
		rc = wk_send(c, &pull, NULL, NULL);
	return rc;
}

bool wk_await_lost(struct worker *w, int s, int wait_ms)
{
	struct timespec until = timing_deadline(wait_ms);
	while (w->failed == 0 && !(w->lost != NULL && w->lost[s]) &&
	       pthread_cond_timedwait(&w->failed_cond, &w->lock, &until) == 0)
		;
	return w->failed == 0 && w->lost != NULL && w->lost[s];
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
	bool failover = !*closing && wk_await_lost(w, c->server, wait_ms);
	if (w->failed != 0) {
		snprintf(root, len, "%s%s",
			 w->failed == UNISUM_EMEMBERSHIP ? "" : "the job failed: ", w->failed_why);
		*why = root;
	}
	pthread_mutex_unlock(&w->lock);
	return failover;
}

/* Dead connection c: returns every pending job, linked by
 * pending_next. */
static struct wk_job *wk_conn_drain(struct wk_conn *c)
{
	struct wk_job *all = NULL;
	pthread_mutex_lock(&c->lock);
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

/* Marks the connection dead, fails every pending job (or, when its
 * server failed over, sends them where their keys went), then marks it
 * reaped.  On the reaper's thread, once the connection ended. */
static void wk_conn_fail_jobs(struct wk_conn *c, const char *why)
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
	pthread_mutex_unlock(&c->lock);

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

/* Moved job j goes on to server `to`, declared there first. */
static void wk_job_move(struct wk_conn *c, struct wk_job *j, int to)
{
	struct worker *w = c->w;
	uint64_t key = j->key;
	int rc = w->up->move_key(w, c, j, to);
	if (rc != 0) {
		char msg[512];
		snprintf(msg, sizeof msg, "worker %d cannot move key 0x%llx to server %d: %s", w->rank,
			 (unsigned long long)key, to, log_last_error());
		wk_job_finish(j, rc, msg);
		return;
	}
	wk_route(w, j);
}

static void wk_task_do(const struct wk_task *t)
{
	struct wk_conn *c = t->c;
	struct worker *w = c->w;
	if (t->j != NULL) {
		wk_job_move(c, t->j, t->to);
		return;
	}
	wk_conn_fail_jobs(c, c->end_why);
	pthread_mutex_lock(&w->lock);
	c->reaped = true;
	pthread_cond_broadcast(&w->reap_cond);
	pthread_mutex_unlock(&w->lock);
}

void wk_task_run(struct wk_task *t)
{
	wk_task_do(t);
	free(t);
}

/* Queues task (c, j, to) for the reaper; 0 or UNISUM_ENOMEM. */
static int wk_task_queue(struct wk_conn *c, struct wk_job *j, int to)
{
	struct worker *w = c->w;
	struct wk_task *t = calloc(1, sizeof *t);
	if (t == NULL)
		return UNISUM_ENOMEM;
	*t = (struct wk_task){.c = c, .j = j, .to = to};
	pthread_mutex_lock(&w->lock);
	if (w->tasks_tail != NULL)
		w->tasks_tail->next = t;
	else
		w->tasks = t;
	w->tasks_tail = t;
	pthread_cond_broadcast(&w->reap_cond);
	pthread_mutex_unlock(&w->lock);
	return 0;
}

/* ---- replies, on the connection's loop ------------------------------------ */

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

/* An ERROR from the server of c (its payload in c->rx_buf): with key 0
 * it refused this worker (1, msg set: the connection ends); with a key
 * one partition failed (its tensor is poisoned) and the connection goes
 * on (0). */
static int wk_on_error(struct wk_conn *c, const struct wire_hdr *h, char *msg, size_t len)
{
	char text[400] = "";
	if (c->rx_buf != NULL)
		wire_error_decode(c->rx_buf, h->payload_len, text, sizeof text);
	if (h->key == 0) {
		snprintf(msg, len, "%s rejected this worker: %s", c->label, text);
		return 1;
	}
	struct wk_job *j = wk_take_answered(c, h, msg, len);
	if (j == NULL)
		return 1;
	/* A server out of memory is no allocation of this process's: its
	 * callers get UNISUM_EREMOTE, not UNISUM_ENOMEM (worker_out_of_memory). */
	int err = log_known_error(-(int)h->aux, UNISUM_EREMOTE);
	wk_job_finish(j, err == UNISUM_ENOMEM ? UNISUM_EREMOTE : err, text);
	return 0;
}

/* Sends the job of entry e, taken from the PUSH queue, to its server. */
static void wk_push_one(struct worker *w, struct pushq_entry *e)
{
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
	/* The loop sends what the credit now lets go itself, rather than
	 * wake the PUSH thread: two context switches and two futex calls a
	 * partition (issue 50).  Not once a failover moved keys: routing may
	 * then wait for a replacement server, which no loop may; the PUSH
	 * thread is woken for what fits (a release of nothing). */
	size_t inflight = pushq_release_quiet(&w->push_q, bytes);
	if (traced) {
		int64_t now = trace_now_us();
		trace_span(TRACE_INFLIGHT, 0, 0, step, 0, inflight, 0, now, now);
	}
	struct pushq_entry *e;
	while (!atomic_load(&w->any_moved) && (e = pushq_try_pop(&w->push_q)) != NULL)
		wk_push_one(w, e);
	if (atomic_load(&w->any_moved))
		pushq_release(&w->push_q, 0);
	return 0;
}

/* A compressed PULL_REPLY's header, for job j: whether the reply and the
 * tensor agree on being compressed (else j fails, 1 with msg set: the
 * connection cannot go on), and a buffer for an encoding of the right
 * length (c->rx_buf; none for another length, which then fails j
 * alone).  0, or 1. */
static int wk_compressed_head(struct wk_conn *c, const struct wire_hdr *h, struct wk_job *j,
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
	size_t want = compress_codec_of(spec->kind)->bytes(spec, (size_t)j->count);
	c->rx_buf = h->payload_len == want ? malloc(want ? want : 1) : NULL;
	return 0;
}

/* A compressed PULL_REPLY of job j, received into c->rx_buf: checked and
 * decoded into the job's output.  0; -1 when the job failed on it and
 * the connection goes on (a wrong length, bytes that are not an
 * encoding). */
static int wk_take_compressed(struct wk_conn *c, const struct wire_hdr *h, struct wk_job *j)
{
	const struct compress_spec *spec = &j->cs->spec;
	const struct compress_codec *codec = compress_codec_of(spec->kind);
	size_t want = codec->bytes(spec, (size_t)j->count);
	void *enc = c->rx_buf;
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
	if (why[0] != '\0') {
		LOG_ERROR("%s", why);
		wk_job_finish(j, code, why);
		return -1;
	}
	return 0;
}

/* A PULL_REPLY's header: takes its job and says where the sum goes
 * (c->rx_job, c->rx_into; a compressed one into c->rx_buf).  0, or 1
 * with msg set when the connection cannot go on. */
static int wk_pull_reply_head(struct wk_conn *c, const struct wire_hdr *h, char *msg, size_t len)
{
	struct wk_job *j = wk_take_answered(c, h, msg, len);
	if (j == NULL)
		return 1;
	if ((h->flags & WIRE_FLAG_SKIP) != j->skip_pull * WIRE_FLAG_SKIP) {
		snprintf(msg, len, "%s answered a pull of key 0x%llx round %u %s", c->label,
			 (unsigned long long)h->key, h->round,
			 j->skip_pull ? "that skips the data with data" : "without its data");
		wk_job_finish(j, UNISUM_EPROTO, msg);
		return 1;
	}
	c->rx_job = j;
	if (j->kept != NULL && j->kept->keeps_push)
		wk_keep_push(j);
	if (j->skip_pull || (h->flags & WIRE_FLAG_ZERO))
		return 0;
	if (h->flags & WIRE_FLAG_COMPRESSED || j->cs != NULL) {
		c->rx_job = NULL;
		if (wk_compressed_head(c, h, j, msg, len) != 0)
			return 1;
		c->rx_job = j;
		return 0;
	}
	/* Failover: the reply lands in the kept buffer, then in the output
	 * (which a push may come from: a lost server's half reply must not
	 * overwrite it). */
	size_t bytes = j->count * unisum_dtype_size(j->dtype);
	c->rx_into = j->out;
	if (j->kept != NULL && !j->kept->keeps_push) {
		if (j->kept->data == NULL)
			j->kept->data = malloc(bytes ? bytes : 1);
		if (j->kept->data != NULL)
			c->rx_into = j->kept->data;
	}
	if (h->payload_len != bytes) {
		snprintf(msg, len, "%s sent %llu bytes for key 0x%llx round %u, expected %zu", c->label,
			 (unsigned long long)h->payload_len, (unsigned long long)h->key, h->round, bytes);
		c->rx_job = NULL;
		wk_job_finish(j, UNISUM_EPROTO, msg);
		return 1;
	}
	return 0;
}

/* A whole PULL_REPLY (wk_pull_reply_head took its job): the sum went
 * straight into the caller's output (read from the server's memory over
 * IPC), divided there for an average, and the job ends. */
static void wk_on_pull_reply(struct wk_conn *c, const struct wire_hdr *h)
{
	struct worker *w = c->w;
	struct wk_job *j = c->rx_job;
	uint8_t *into = c->rx_into;
	c->rx_job = NULL;
	size_t bytes = j->count * unisum_dtype_size(j->dtype);
	if (j->skip_pull) {
		if (j->kept != NULL)
			wk_kept_answered(j);
		wk_job_finish(j, 0, NULL);
		return;
	}
	if (h->flags & WIRE_FLAG_COMPRESSED || j->cs != NULL) {
		if (wk_take_compressed(c, h, j) != 0)
			return;
		bytes = h->payload_len;
		into = j->out;
	} else if (h->flags & WIRE_FLAG_ZERO) {
		into = j->out;
		memset(into, 0, bytes);
	}
	if (!(h->flags & WIRE_FLAG_ZERO)) {
		atomic_fetch_add(&w->bytes_pulled, bytes);
		atomic_fetch_add(&c->bytes_pulled, bytes);
	}
	if (j->kept != NULL)
		wk_kept_answered(j);
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
	/* Declaring it there may wait for the server's REJOIN: the reaper's. */
	if (wk_task_queue(c, j, (int)h->aux) != 0)
		wk_job_finish(j, UNISUM_ENOMEM, "out of memory moving a key");
	return 0;
}

/* A message's header came (with a payload): where the payload goes.  A
 * reply to this worker it never asked for ends the connection (why). */
static int wk_head(struct wk_conn *c, const struct wire_hdr *h, void **dst, char *why, size_t len)
{
	*dst = NULL;
	if (h->type == WIRE_ERROR) {
		c->rx_buf = malloc(h->payload_len + 1);
		*dst = c->rx_buf;
	} else if (h->type == WIRE_PULL_REPLY) {
		if (wk_pull_reply_head(c, h, why, len) != 0)
			return UNISUM_EPROTO;
		*dst = c->rx_buf != NULL ? c->rx_buf : c->rx_job != NULL ? c->rx_into : NULL;
	}
	return 0;
}

static int wk_on_header(struct loop_conn *lc, struct tp_rx *rx, char *why, size_t len)
{
	return wk_head(loop_conn_arg(lc), &rx->hdr, &rx->dst, why, len);
}

/* The PULL stage of one server connection: each message from the server
 * (see the DESIGN above), on the connection's loop. */
static int wk_on_message(struct loop_conn *lc, const struct wire_hdr *h, void *payload, char *why,
			 size_t len)
{
	(void)payload;	/* where wk_head put it */
	struct wk_conn *c = loop_conn_arg(lc);
	void *dst;
	int stop = 0;
	if (h->payload_len == 0 && wk_head(c, h, &dst, why, len) != 0)
		return UNISUM_EPROTO;
	if (h->type == WIRE_ERROR)
		stop = wk_on_error(c, h, why, len);
	else if (h->type == WIRE_PUSH_ACK)
		stop = wk_on_push_ack(c, h, why, len);
	else if (h->type == WIRE_PULL_REPLY && c->rx_job != NULL)
		wk_on_pull_reply(c, h);
	else if (h->type == WIRE_MOVED)
		stop = wk_on_moved(c, h, why, len);
	else if (h->type != WIRE_PULL_REPLY) {
		snprintf(why, len, "%s sent an unexpected %s", c->label, wire_type_name(h->type));
		stop = 1;
	}
	free(c->rx_buf);
	c->rx_buf = NULL;
	return stop ? UNISUM_EPROTO : 0;
}

/* Queues ended connection c for the reaper. */
static void wk_conn_to_reaper(void *arg)
{
	struct wk_conn *c = arg;
	if (wk_task_queue(c, NULL, 0) != 0) {
		LOG_ERROR("out of memory: %s", c->end_why);
		wk_task_do(&(struct wk_task){.c = c});
	}
}

/* The connection ended (on its loop's thread): a reply half received
 * goes back to the pending table, so that it fails with the others,
 * named by the root cause; the reaper takes the connection (wk_conn_fail
 * may wait for the scheduler's word, which no loop may). */
static void wk_on_closed(struct loop_conn *lc, int rc, const char *why)
{
	struct wk_conn *c = loop_conn_arg(lc);
	if (c->rx_job != NULL) {
		pthread_mutex_lock(&c->lock);
		pending_add(c, c->rx_job);
		pthread_mutex_unlock(&c->lock);
		c->rx_job = NULL;
	}
	free(c->rx_buf);
	c->rx_buf = NULL;
	if (rc == UNISUM_ECONN)
		snprintf(c->end_why, sizeof c->end_why, "%s: the connection closed (did the server "
			 "exit?)", c->label);
	else if (strstr(why, c->label) != NULL)
		snprintf(c->end_why, sizeof c->end_why, "%s", why);
	else
		snprintf(c->end_why, sizeof c->end_why, "%s: %s", c->label, why);
	/* Once the loop is done with it (a posted call runs after this one
	 * has returned): the reaper may then free it. */
	if (loop_post(c->loop, wk_conn_to_reaper, c) != 0)
		wk_conn_to_reaper(c);
}

const struct loop_conn_ops wk_conn_ops = {
	.on_header = wk_on_header,
	.on_message = wk_on_message,
	.on_closed = wk_on_closed,
};

/* Sends a control job (DECLARE, RESTORE, RETIRE, a held PULL) on its
 * server's connection now (ahead of every push the PUSH stage hands over
 * later), and frees it.  Returns UNISUM_ECONN (with the reason in the last
 * error) when the connection is dead: the job is then the caller's. */
int wk_enqueue(struct wk_conn *c, struct wk_job *j)
{
	pthread_mutex_lock(&c->lock);
	int rc = 0;
	if (c->dead) {
		log_set_last_error("%s", c->dead_why);
		rc = UNISUM_ECONN;	/* j stays the caller's */
	} else if (wk_send_control(c, j) != 0) {
		/* Its loop sees the end and the reaper fails what is pending. */
		c->tp->conn_shutdown(c->conn);
	}
	pthread_mutex_unlock(&c->lock);
	return rc;
}

/* The PUSH stage: takes partitions in (priority, key) order as the credit
 * allows and hands each to its server's connection. */
void *wk_push_main(void *arg)
{
	prctl(PR_SET_NAME, "unisum-push"); /* for top -H, perf and gdb */
	struct worker *w = arg;
	for (;;) {
		struct pushq_entry *e = pushq_pop(&w->push_q);
		if (e == NULL)
			return NULL;
		wk_push_one(w, e);
	}
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
			/* A failed send: its loop sees the end, and the
			 * reaper fails j with what else is pending. */
			if (wk_send_push(c, j) != 0)
				c->tp->conn_shutdown(c->conn);
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
