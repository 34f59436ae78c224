/*
 * worker.c - the worker side of unisum: the public C API of unisum.h.
 *
 * DESIGN.  Every partition of a push_pull goes through the stages of
 * docs/ARCHITECTURE.md section 2.  LOCAL_REDUCE and LOCAL_BROADCAST have work only
 * when several workers share a machine (UNISUM_LOCAL_SIZE > 1): then
 * local.c sums the machine's inputs in shared memory, only the local root
 * pushes (wk_local_push, from its output buffer, where the machine's sum
 * lies) and local.c completes the operation (wk_local_done) once every
 * local rank has the result; with one machine in the job nothing goes to
 * a server at all.  The PUSH stage is one thread taking partitions from a queue
 * ordered by (priority, key) and gated by the credit
 * (UNISUM_SCHEDULING_CREDIT bytes in flight, src/sched): a high-priority
 * partition queued behind a long low-priority backlog is the next one out
 * as soon as any credit comes back, and no more bytes than the credit ever
 * wait in the sockets.  It hands each partition to its server's
 * connection, whose sending thread writes PUSH (straight from the caller's
 * input buffer) followed by PULL.  The PULL stage is the connection's
 * receiving thread: it reads the PULL_REPLY straight into the caller's
 * output buffer, divides for UNISUM_AVERAGE while the data is hot in
 * cache, gives the credit back, and completes the operation when its last
 * partition arrives.  With UNISUM_TRACE_ON every stage's span goes to the
 * timeline (src/trace).
 *
 * A job lives in its connection's pending table from the moment the PUSH
 * stage hands it over until its reply arrives or the connection dies; only the
 * receiving thread completes jobs, so once an operation is reported done
 * no thread touches the caller's buffers again.  When a connection dies,
 * its receiving thread first stops the sending thread, then fails every
 * pending job with an error that names the server.
 *
 * Locks.  `wk.lock` guards the tensor table, the operations and `failed`;
 * a connection's `lock` guards its queue and pending table.  Order:
 * wk.lock, then a connection's lock.  No lock is held during socket I/O.
 */
#include <endian.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "config/config.h"
#include "log/log.h"
#include "placement/placement.h"
#include "reducer/reducer.h"
#include "rendezvous/rendezvous.h"
#include "sched/sched.h"
#include "trace/trace.h"
#include "shm/shm.h"
#include "timing/timing.h"
#include "worker/local.h"
#include "worker/tune.h"
#include "transport/auth.h"
#include "transport/transport.h"
#include "unisum.h"
#include "wire/wire.h"

/* One cut of a tensor into partitions, with its keys and servers. */
struct wk_layout {
	uint64_t pbytes;		/* the partition size it was cut for */
	uint64_t key;			/* partition i has key + i */
	uint32_t nparts;
	struct placement_part *parts;
	uint32_t *servers;		/* server rank of each partition */
	uint32_t rounds;		/* rounds done with this cut: the wire's round */
	bool retired;			/* autotune settled elsewhere: servers freed it */
};

struct wk_tensor {
	int index;			/* tensor id */
	char name[256];
	unisum_dtype dtype;
	uint64_t count;
	size_t esize;
	int priority;
	struct wk_layout *cuts;		/* [0]: UNISUM_PARTITION_BYTES; more for autotune */
	int ncuts;
	uint32_t round;			/* next round (training step) */
	bool busy;			/* an operation is in flight */
};

struct wk_op {
	unisum_handle handle;
	struct wk_tensor *t;
	int flags;
	const void *in;			/* the caller's buffers (in NULL: contribute zeros) */
	void *out;
	uint32_t wire_op;		/* its collective (WIRE_OP()), on every push */
	uint32_t remaining;		/* partitions not yet completed */
	int error;			/* first error of any partition */
	char why[512];			/* its message */
	bool done;
	uint32_t round;
	bool traced;			/* its round is on the timeline */
	int64_t t_start;		/* when it started (trace clock) */
	struct wk_op *tune_next;	/* in the autotune thread's queue */
	/* The local path (several workers on this machine): */
	struct local_op *local;		/* its LOCAL_REDUCE/BROADCAST state, or NULL */
	const struct wk_layout *L;	/* its cut (stable while it is in flight) */
	uint32_t wire_round;
};

enum wk_job_type { JOB_DECLARE, JOB_PUSH_PULL, JOB_RETIRE };

struct wk_job {
	struct sched_entry entry;	/* PUSH_PULL: priority, key, bytes, order */
	int type;			/* enum wk_job_type */
	int server;			/* the connection it goes to */
	uint32_t part;			/* partition index within its tensor */
	uint64_t key;
	uint32_t round;
	unisum_dtype dtype;
	uint64_t count;
	const void *in;			/* push from here (NULL: a ZERO push) */
	void *out;			/* reply goes here */
	int divisor;			/* UNISUM_AVERAGE: divide by this, else 1 */
	uint32_t wire_op;		/* the collective, WIRE_OP(): the PUSH's aux */
	struct wk_op *op;		/* NULL for DECLARE jobs */
	char *name;			/* DECLARE jobs: the tensor's name (owned) */
	struct wk_job *pending_next;	/* chain in the pending table */
	struct wk_job *next;		/* chain in its connection's send queue */
	int64_t t_queued, t_taken;	/* trace clock: entered, left the PUSH queue */
	int64_t t_pushed;		/* PUSH written (set under the conn's lock) */
	bool credit_back;		/* PUSH_ACK came: its bytes left the credit */
};

struct wk_conn {
	int server;			/* server rank */
	char label[128];		/* "server 0 (127.0.0.1:4000)" */
	struct tp_conn *conn;
	bool ipc;			/* same host: data by cross-memory attach */
	pid_t server_pid;		/* ... to and from this process */
	pthread_t send_thread, recv_thread;
	pthread_mutex_t lock;		/* queue, pending, dead */
	pthread_cond_t cond;		/* queue non-empty or dead */
	struct wk_job *qhead, *qtail;	/* send queue, in the PUSH stage's order */
	struct wk_job **pending;	/* key -> job, chained hash */
	size_t npending_buckets;
	bool dead;			/* the connection failed or closed */
	bool closing;			/* unisum_shutdown() closed it */
	bool threads_started;		/* both threads run; the receiver joins the sender */
	char dead_why[700];		/* why, for the errors of later calls */
};

static struct {
	pthread_mutex_t lock;		/* everything below but conns' own state */
	pthread_cond_t done_cond;	/* an operation completed */
	pthread_cond_t failed_cond;	/* `failed` was set */
	bool initialized;
	bool left;			/* unisum_shutdown() ran: this process is done with the job */
	struct config cfg;
	const struct transport_ops *tp;
	struct rdv_client *rdv;
	int rank, size, nservers;
	bool local;			/* several workers on this machine: src/worker/local.c */
	bool to_servers;		/* this worker talks to the servers (a machine's root) */
	struct wk_conn *conns;		/* [nservers] */
	bool conns_live;		/* every conn is set up and not yet torn down */
	struct wk_tensor **tensors;
	int ntensors, captensors;
	struct wk_op **ops;		/* operations not yet released */
	int nops, capops;
	unisum_handle next_handle;
	struct sched_queue push_q;	/* the PUSH stage: priority and credit */
	struct tuner *tuner;		/* the settings of each epoch (src/worker/tune.c) */
	pthread_t tune_thread;		/* autotune: operations waiting for their cut */
	bool tune_started, tune_stop;
	pthread_cond_t tune_cond;	/* its queue is not empty, or it is to stop */
	struct wk_op *tune_head, *tune_tail;
	pthread_t push_thread;
	bool push_started;
	int failed;			/* the job failed: every call returns it */
	char failed_why[512];
	struct wk_poison {
		uint64_t key;
		char why[512];
	} *poison;			/* tensors that can never be summed (scheduler) */
	int npoison;
} wk = {.lock = PTHREAD_MUTEX_INITIALIZER, .done_cond = PTHREAD_COND_INITIALIZER,
      .failed_cond = PTHREAD_COND_INITIALIZER};

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

/* ---- completion --------------------------------------------------------- */

/* Completes one partition of an operation (err 0 or negative). */
static void op_part_done(struct wk_op *op, int err, const char *why)
{
	pthread_mutex_lock(&wk.lock);
	if (err != 0 && op->error == 0) {
		op->error = err;
		snprintf(op->why, sizeof op->why, "%s", why);
	}
	if (--op->remaining == 0) {
		if (op->traced)
			trace_span(TRACE_TENSOR, op->t->index, 0, op->round, op->t->cuts[0].key,
				   op->t->count * op->t->esize, 0, op->t_start, trace_now_us());
		op->done = true;
		op->t->busy = false;
		pthread_cond_broadcast(&wk.done_cond);
	}
	pthread_mutex_unlock(&wk.lock);
}

/* Ends a PUSH_PULL job taken from the PUSH stage, however it ended: gives
 * its credit back, puts its spans on the timeline, completes its part of
 * the operation and frees it. */
static void wk_job_finish(struct wk_job *j, int err, const char *why)
{
	bool released_now = !j->credit_back;
	size_t inflight = released_now ? sched_release(&wk.push_q, j->entry.bytes) : 0;
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
	if (op->local != NULL)
		local_pulled(op->local, j->part, err, why);
	else
		op_part_done(op, err, why);
	free(j);
}

/* ---- connection threads ------------------------------------------------- */

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

		int rc;
		if (j->type == JOB_RETIRE) {
			struct wire_hdr h = {.type = WIRE_RETIRE, .sender = rdv_client_id(wk.rdv),
					     .key = j->key, .round = j->round};
			rc = wk.tp->send(c->conn, &h, NULL);
			free(j);
		} else if (j->type == JOB_DECLARE) {
			/* The name lets the server say which tensor stalls. */
			struct wire_buf b;
			wire_buf_init(&b);
			wire_declare_check_encode(&b, j->name);
			struct wire_hdr h = {.type = WIRE_DECLARE_CHECK, .sender = rdv_client_id(wk.rdv),
					     .key = j->key, .count = j->count, .dtype = (uint8_t)j->dtype,
					     .payload_len = b.len};
			rc = b.failed ? UNISUM_ENOMEM : wk.tp->send(c->conn, &h, b.data);
			wire_buf_fini(&b);
			free(j->name);
			free(j);
		} else {
			/* Build both headers first: once PULL is on its way the reply may
			 * complete (and free) the job before send() returns. */
			struct wire_hdr push = {.type = WIRE_PUSH, .sender = rdv_client_id(wk.rdv),
						.round = j->round, .key = j->key, .count = j->count,
						.dtype = (uint8_t)j->dtype, .aux = j->wire_op};
			const void *payload = j->in;
			uint64_t addr = htole64((uint64_t)(uintptr_t)j->in);
			if (payload == NULL) {
				push.flags = WIRE_FLAG_ZERO;
			} else if (c->ipc) {
				/* The server copies the data from here itself. */
				push.flags = WIRE_FLAG_IPC;
				push.payload_len = WIRE_IPC_PAYLOAD;
				payload = &addr;
			} else {
				push.payload_len = j->count * unisum_dtype_size(j->dtype);
			}
			struct wire_hdr pull = push;
			pull.type = WIRE_PULL;
			pull.flags = 0;
			pull.aux = 0;
			pull.count = 0;
			pull.payload_len = 0;
			bool traced = j->op->traced;
			rc = wk.tp->send(c->conn, &push, payload);
			if (rc == 0 && traced) {
				/* Under the lock: the receiving thread reads it after
				 * taking the job from the pending table. */
				pthread_mutex_lock(&c->lock);
				j->t_pushed = trace_now_us();
				pthread_mutex_unlock(&c->lock);
			}
			if (rc == 0)
				rc = wk.tp->send(c->conn, &pull, NULL);
		}
		if (rc != 0) {
			/* The receiving thread notices the broken socket and cleans up. */
			wk.tp->conn_shutdown(c->conn);
			return NULL;
		}
	}
}

/* Marks the connection dead, stops its sender, fails every pending job. */
static void wk_conn_fail(struct wk_conn *c, const char *why)
{
	/* A server hanging up mid-job is usually the echo of another node's
	 * death, which the scheduler is about to announce: give its notice a
	 * moment, so the error names the root cause rather than the echo. */
	char root[640];
	pthread_mutex_lock(&wk.lock);
	pthread_mutex_lock(&c->lock);
	bool closing = c->closing;
	pthread_mutex_unlock(&c->lock);
	if (wk.failed == 0 && !closing) {
		struct timespec until = timing_deadline(2000);
		while (wk.failed == 0 &&
		       pthread_cond_timedwait(&wk.failed_cond, &wk.lock, &until) == 0)
			;
	}
	if (wk.failed != 0) {
		snprintf(root, sizeof root, "the job failed: %s", wk.failed_why);
		why = root;
	}
	pthread_mutex_unlock(&wk.lock);
	pthread_mutex_lock(&c->lock);
	c->dead = true;
	if (c->dead_why[0] == '\0')
		snprintf(c->dead_why, sizeof c->dead_why, "%s", why);
	pthread_cond_broadcast(&c->cond);
	pthread_mutex_unlock(&c->lock);
	wk.tp->conn_shutdown(c->conn);
	pthread_join(c->send_thread, NULL);

	pthread_mutex_lock(&c->lock);
	/* Queued PUSH_PULL jobs are also pending and finished below; DECLARE
	 * jobs are only queued. */
	for (struct wk_job *j; (j = fifo_pop(c)) != NULL;) {
		if (j->type != JOB_PUSH_PULL) {
			free(j->name);
			free(j);
		}
	}
	struct wk_job *all = NULL;
	for (size_t i = 0; i < c->npending_buckets; i++) {
		while (c->pending[i]) {
			struct wk_job *j = c->pending[i];
			c->pending[i] = j->pending_next;
			j->pending_next = all;
			all = j;
		}
	}
	pthread_mutex_unlock(&c->lock);
	if (!closing && all != NULL)
		LOG_ERROR("%s", c->dead_why);
	pthread_mutex_lock(&wk.lock);
	int err = wk.failed != 0 ? wk.failed : UNISUM_ECONN;	/* the root cause's code */
	pthread_mutex_unlock(&wk.lock);
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

/* IPC reply: the PULL_REPLY's payload is the address of the sum in the
 * server's memory, valid until this worker's next push of the key. */
static int wk_ipc_read(struct wk_conn *c, void *dst, size_t bytes, char *msg, size_t len)
{
	uint64_t addr;
	if (wk.tp->recv_payload(c->conn, &addr, sizeof addr) != 0) {
		snprintf(msg, len, "%s: the connection closed in the middle of a reply", c->label);
		return UNISUM_ECONN;
	}
	int rc = shm_vm_copy(c->server_pid, false, dst, le64toh(addr), bytes);
	if (rc == 0)
		return 0;
	snprintf(msg, len, "worker %d cannot read a reply from the memory of %s (pid %d) with "
		 "process_vm_readv: %s; set UNISUM_IPC=0 to send the data through the socket",
		 wk.rank, c->label, (int)c->server_pid, strerror(-rc));
	return rc == -ESRCH ? UNISUM_ECONN : UNISUM_ESYS;
}

/* An ERROR from the server of c: with key 0 it refused this worker (1,
 * msg set: the connection ends); with a key one partition failed (its
 * tensor is poisoned) and the connection goes on (0). */
static int wk_on_error(struct wk_conn *c, const struct wire_hdr *h, char *msg, size_t len)
{
	char text[400] = "";
	void *p = malloc(h->payload_len + 1);
	if (p != NULL && wk.tp->recv_payload(c->conn, p, h->payload_len) == 0)
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
	pthread_mutex_lock(&c->lock);
	struct wk_job *j = pending_find(c, h->key);
	bool ok = j != NULL && j->round == h->round && !j->credit_back;
	if (ok)
		j->credit_back = true;
	size_t bytes = ok ? j->entry.bytes : 0;
	bool traced = ok && j->op->traced;
	uint32_t step = ok ? j->op->round : 0;
	pthread_mutex_unlock(&c->lock);
	if (!ok) {
		snprintf(msg, len, "%s acknowledged a push of key 0x%llx round %u that this worker did "
			 "not make", c->label, (unsigned long long)h->key, h->round);
		return 1;
	}
	size_t inflight = sched_release(&wk.push_q, bytes);
	if (traced) {
		int64_t now = trace_now_us();
		trace_span(TRACE_INFLIGHT, 0, 0, step, 0, inflight, 0, now, now);
	}
	return 0;
}

/* A PULL_REPLY: the sum goes straight into the caller's output (read from
 * the server's memory in IPC mode), divided there for an average.  0, or
 * 1 with msg set when the connection cannot go on. */
static int wk_on_pull_reply(struct wk_conn *c, const struct wire_hdr *h, char *msg, size_t len)
{
	struct wk_job *j = wk_take_answered(c, h, msg, len);
	if (j == NULL)
		return 1;
	size_t bytes = j->count * unisum_dtype_size(j->dtype);
	if (h->flags & WIRE_FLAG_ZERO) {
		memset(j->out, 0, bytes);
	} else if (h->flags & WIRE_FLAG_IPC) {
		int rc = c->ipc ? wk_ipc_read(c, j->out, bytes, msg, len) : UNISUM_EPROTO;
		if (rc == UNISUM_EPROTO)
			snprintf(msg, len, "%s sent an IPC reply on a connection without IPC", c->label);
		if (rc == UNISUM_ECONN) {
			/* The server is gone: its job fails with the others, named
			 * by the root cause (wk_conn_fail). */
			pthread_mutex_lock(&c->lock);
			pending_add(c, j);
			pthread_mutex_unlock(&c->lock);
			snprintf(msg, len, "%s: the server exited in the middle of a reply", c->label);
			return 1;
		}
		if (rc != 0) {
			wk_job_finish(j, rc, msg);
			return 1;
		}
	} else if (wk.tp->recv_payload(c->conn, j->out, bytes) != 0) {
		snprintf(msg, len, "%s: the connection closed in the middle of a reply", c->label);
		wk_job_finish(j, UNISUM_ECONN, msg);
		return 1;
	}
	if (j->divisor > 1)
		reducer_divide(j->out, j->count, j->dtype, j->divisor);
	wk_job_finish(j, 0, NULL);
	return 0;
}

/* The PULL stage of one server connection (see the DESIGN above). */
static void *wk_recv_main(void *arg)
{
	struct wk_conn *c = arg;
	char why[400] = "", msg[512];
	for (int stop = 0; !stop;) {
		struct wire_hdr h;
		int rc = wk.tp->recv_header(c->conn, &h, why, sizeof why);
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
static int wk_enqueue(struct wk_conn *c, struct wk_job *j)
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
static void *wk_push_main(void *arg)
{
	(void)arg;
	for (;;) {
		struct sched_entry *e = sched_pop(&wk.push_q);
		if (e == NULL)
			return NULL;
		struct wk_job *j = (struct wk_job *)((char *)e - offsetof(struct wk_job, entry));
		struct wk_conn *c = &wk.conns[j->server];
		/* Once handed over, the job may complete and be freed at any
		 * moment: keep what the timeline needs. */
		bool traced = j->op->traced;
		uint32_t round = j->op->round;
		size_t inflight = e->inflight;
		int64_t now = traced ? trace_now_us() : 0;
		j->t_taken = now;
		pthread_mutex_lock(&c->lock);
		bool dead = c->dead;
		if (!dead) {
			pending_add(c, j);
			fifo_push(c, j);
			pthread_cond_signal(&c->cond);
		}
		pthread_mutex_unlock(&c->lock);
		if (dead) {
			char why[sizeof c->dead_why];
			pthread_mutex_lock(&c->lock);
			snprintf(why, sizeof why, "%s", c->dead_why);
			pthread_mutex_unlock(&c->lock);
			pthread_mutex_lock(&wk.lock);
			int err = wk.failed != 0 ? wk.failed : UNISUM_ECONN;
			pthread_mutex_unlock(&wk.lock);
			wk_job_finish(j, err, why);
		} else if (traced) {
			trace_span(TRACE_INFLIGHT, 0, 0, round, 0, inflight, 0, now, now);
		}
	}
}

static int wk_connect_servers(void)
{
	wk.conns = calloc((size_t)wk.nservers, sizeof *wk.conns);
	if (wk.conns == NULL)
		return UNISUM_ENOMEM;
	for (int s = 0; s < wk.nservers; s++) {
		struct wk_conn *c = &wk.conns[s];
		const struct rdv_node *n = rdv_client_server(wk.rdv, s);
		c->server = s;
		c->npending_buckets = 1024;
		c->pending = calloc(c->npending_buckets, sizeof *c->pending);
		if (n == NULL || c->pending == NULL)
			return UNISUM_ENOMEM;
		snprintf(c->label, sizeof c->label, "server %d (%s:%d)", s, n->host, n->port);
		pthread_mutex_init(&c->lock, NULL);
		pthread_cond_init(&c->cond, NULL);
		int rc = wk.tp->connect(n->host, n->port, wk.cfg.timeout_ms, &c->conn);
		if (rc != 0)
			return log_fail(rc, "worker %d cannot reach %s: %s", wk.rank, c->label,
					log_last_error());
		/* A server on this host (same boot, network and pid namespaces)
		 * gets our data by address: we ask for IPC in the hello. */
		c->ipc = wk.cfg.ipc && rdv_client_same_host(wk.rdv, n);
		c->server_pid = n->pid;
		if (c->ipc)
			LOG_INFO("worker %d passes data to %s by address (IPC: same host)", wk.rank, c->label);
		uint32_t flags = htole32(c->ipc ? 1u : 0u);
		struct wire_hdr hello = {.type = WIRE_REGISTER, .sender = rdv_client_id(wk.rdv),
					 .payload_len = c->ipc ? sizeof flags : 0};
		rc = wk.tp->send(c->conn, &hello, c->ipc ? &flags : NULL);
		if (rc != 0)
			return log_fail(rc, "worker %d lost %s while saying hello", wk.rank, c->label);
		if (pthread_create(&c->send_thread, NULL, wk_send_main, c) != 0)
			return UNISUM_ESYS;
		if (pthread_create(&c->recv_thread, NULL, wk_recv_main, c) != 0) {
			/* Stop the sender we just started. */
			pthread_mutex_lock(&c->lock);
			c->dead = true;
			pthread_cond_broadcast(&c->cond);
			pthread_mutex_unlock(&c->lock);
			pthread_join(c->send_thread, NULL);
			return UNISUM_ESYS;
		}
		c->threads_started = true;
	}
	pthread_mutex_lock(&wk.lock);
	wk.conns_live = true;
	pthread_mutex_unlock(&wk.lock);
	return 0;
}

/* The scheduler says the job failed (or was lost): fail everything. */
static void wk_notice(void *arg, int err, const char *why)
{
	(void)arg;
	pthread_mutex_lock(&wk.lock);
	if (wk.failed == 0) {
		wk.failed = err == UNISUM_ESHUTDOWN ? UNISUM_ECONN : err;
		snprintf(wk.failed_why, sizeof wk.failed_why, "%s", why);
		pthread_cond_broadcast(&wk.failed_cond);
	}
	if (wk.tuner != NULL)
		tune_stop(wk.tuner);
	/* Unblock every connection (their threads fail the pending jobs),
	 * unless they are still being set up or already being torn down. */
	if (wk.conns_live)
		for (int s = 0; s < wk.nservers; s++)
			wk.tp->conn_shutdown(wk.conns[s].conn);
	pthread_mutex_unlock(&wk.lock);
	LOG_ERROR("%s", why);
}


/* ---- the local path's hooks (src/worker/local.c) ------------------------- */

/* Local root of several machines: partition `part` of the machine's sum is
 * in the operation's output; it goes to the PUSH stage like any other. */
static void wk_local_push(void *ctx, uint32_t part)
{
	struct wk_op *op = ctx;
	const struct wk_layout *L = op->L;
	const struct placement_part *p = &L->parts[part];
	struct wk_tensor *t = op->t;
	uint8_t *at = (uint8_t *)op->out + p->offset * t->esize;
	struct wk_job *j = malloc(sizeof *j);
	int rc = UNISUM_ENOMEM;
	if (j != NULL) {
		*j = (struct wk_job){.entry = {.priority = t->priority, .key = L->key + part,
					       .bytes = p->count * t->esize},
				     .type = JOB_PUSH_PULL, .server = (int)L->servers[part], .part = part,
				     .key = L->key + part, .round = op->wire_round, .dtype = t->dtype,
				     .count = p->count, .in = at, .out = at,
				     .divisor = (op->flags & UNISUM_AVERAGE) ? wk.size : 1,
				     .wire_op = op->wire_op, .op = op,
				     .t_queued = op->traced ? trace_now_us() : 0};
		rc = sched_push(&wk.push_q, &j->entry);
	}
	if (rc != 0) {
		free(j);
		char why[512];
		snprintf(why, sizeof why, "worker %d, tensor '%s': %s", wk.rank, t->name,
			 rc == UNISUM_ENOMEM ? "out of memory" : log_last_error());
		local_pulled(op->local, part, rc, why);
	}
}

/* The operation is complete on this worker. */
static void wk_local_done(void *ctx, int err, const char *why)
{
	struct wk_op *op = ctx;
	/* Its partitions never counted down here: complete it as the last. */
	pthread_mutex_lock(&wk.lock);
	op->remaining = 1;
	pthread_mutex_unlock(&wk.lock);
	op_part_done(op, err, why);
}

static int wk_local_failed(char *why, size_t len)
{
	pthread_mutex_lock(&wk.lock);
	int err = wk.failed;
	if (err != 0)
		snprintf(why, len, "the job failed: %s", wk.failed_why);
	pthread_mutex_unlock(&wk.lock);
	return err;
}

/* The scheduler says tensor `key` can never be summed (reader thread). */
static void wk_tensor_error(void *arg, uint64_t key, const char *why)
{
	(void)arg;
	pthread_mutex_lock(&wk.lock);
	struct wk_poison *p = realloc(wk.poison, (size_t)(wk.npoison + 1) * sizeof *p);
	if (p != NULL) {
		wk.poison = p;
		p[wk.npoison].key = key;
		snprintf(p[wk.npoison].why, sizeof p[wk.npoison].why, "%s", why);
		wk.npoison++;
	}
	pthread_mutex_unlock(&wk.lock);
}

static int wk_local_poisoned(uint64_t key, char *why, size_t len)
{
	int rc = 0;
	pthread_mutex_lock(&wk.lock);
	for (int i = 0; i < wk.npoison && rc == 0; i++) {
		if (wk.poison[i].key == key) {
			snprintf(why, len, "%s", wk.poison[i].why);
			rc = UNISUM_EMISMATCH;
		}
	}
	pthread_mutex_unlock(&wk.lock);
	return rc;
}

static void wk_local_poison(uint64_t key, const char *why)
{
	rdv_client_poison_tensor(wk.rdv, key, why);
}

static void wk_local_fail_job(int err, const char *why)
{
	rdv_client_fail_job(wk.rdv, err, why);
}

static int wk_local_start(void)
{
	char job[SHM_JOB_MAX + 1];
	config_job_id(&wk.cfg, job, sizeof job);
	struct local_cfg lcfg = {.job = job, .machine = wk.cfg.worker_id,
				 .machines = wk.cfg.num_workers, .local_rank = wk.cfg.local_rank,
				 .local_size = wk.cfg.local_size, .rank = wk.rank,
				 .timeout_ms = wk.cfg.timeout_ms, .stall_warn_ms = wk.cfg.stall_warn_ms,
				 .stall_abort_ms = wk.cfg.stall_abort_ms,
				 .stage_bytes = wk.cfg.local_stage_bytes,
				 .arena_bytes = wk.cfg.local_arena_bytes};
	struct local_hooks hooks = {.push = wk_local_push, .done = wk_local_done,
				    .poison = wk_local_poison, .fail_job = wk_local_fail_job,
				    .failed = wk_local_failed, .poisoned = wk_local_poisoned};
	return local_start(&lcfg, &hooks);
}

/* ---- public API --------------------------------------------------------- */

/* 0 when unisum_init() has run, else UNISUM_ENOTINIT with a message. */
static int wk_require_init(void)
{
	return wk.initialized ? 0 : log_fail(UNISUM_ENOTINIT, "call unisum_init() first");
}

static void wk_tensor_free(struct wk_tensor *t)
{
	if (t == NULL)
		return;
	for (int c = 0; c < t->ncuts; c++) {
		free(t->cuts[c].parts);
		free(t->cuts[c].servers);
	}
	free(t->cuts);
	free(t);
}

static void wk_free_all(void)
{
	for (int i = 0; i < wk.ntensors; i++)
		wk_tensor_free(wk.tensors[i]);
	free(wk.tensors);
	free(wk.poison);
	wk.poison = NULL;
	wk.npoison = 0;
	for (int i = 0; i < wk.nops; i++)
		free(wk.ops[i]);
	free(wk.ops);
	wk.tensors = NULL;
	wk.ops = NULL;
	wk.ntensors = wk.captensors = wk.nops = wk.capops = 0;
}

/* Stops and frees every server connection (after their threads ran). */
static void wk_close_conns(void)
{
	pthread_mutex_lock(&wk.lock);
	wk.conns_live = false;	/* the scheduler's notice keeps off from now on */
	pthread_mutex_unlock(&wk.lock);
	if (wk.conns == NULL)
		return;
	for (int s = 0; s < wk.nservers; s++) {
		struct wk_conn *c = &wk.conns[s];
		if (c->conn != NULL) {
			pthread_mutex_lock(&c->lock);
			c->closing = true;
			pthread_mutex_unlock(&c->lock);
			wk.tp->conn_shutdown(c->conn);
			if (c->threads_started)
				pthread_join(c->recv_thread, NULL);
			wk.tp->conn_free(c->conn);
			pthread_mutex_destroy(&c->lock);
			pthread_cond_destroy(&c->cond);
		}
		free(c->pending);
	}
	free(wk.conns);
	wk.conns = NULL;
}

/* ---- autotune (src/worker/tune.c) ----------------------------------------- */

static void *wk_tune_main(void *arg);

/* A setting worker 0 posted, passed on by the scheduler (reader thread). */
static void wk_on_tune(void *arg, const struct rdv_tune *t)
{
	(void)arg;
	tune_on_setting(wk.tuner, t);
}

static int wk_tune_post(void *arg, const struct rdv_tune *t)
{
	(void)arg;
	return rdv_client_post_tune(wk.rdv, t);
}

static void wk_tune_fail_job(void *arg, int err, const char *why)
{
	(void)arg;
	rdv_client_fail_job(wk.rdv, err, why);
}

static void wk_tune_set_credit(void *arg, uint64_t credit)
{
	(void)arg;
	sched_set_credit(&wk.push_q, credit);
}

static int wk_tuner_new(void)
{
	struct tune_cfg cfg = {.rank = wk.rank, .on = wk.cfg.autotune != 0,
			       .steps = (uint32_t)wk.cfg.autotune_steps, .timeout_ms = wk.cfg.timeout_ms,
			       .first = {wk.cfg.partition_bytes, wk.cfg.credit_bytes}};
	struct tune_hooks hooks = {.post = wk_tune_post, .fail_job = wk_tune_fail_job,
				   .set_credit = wk_tune_set_credit};
	tune_free(wk.tuner);
	wk.tuner = NULL;
	return tune_new(&cfg, &hooks, &wk.tuner);
}

/* The condition variables with timed waits, made once to wait on the
 * monotonic clock. */
static pthread_once_t wk_conds_once = PTHREAD_ONCE_INIT;

static void wk_conds_init(void)
{
	timing_cond_init(&wk.done_cond);
	timing_cond_init(&wk.failed_cond);
	pthread_cond_init(&wk.tune_cond, NULL);
}

/* Reads the worker's configuration from the environment.  0, or an error
 * with err naming the variable. */
static int wk_configure(char *err, size_t len)
{
	int rc = config_load(&wk.cfg, err, len);
	if (rc == 0 && wk.cfg.role == CONFIG_ROLE_NONE)
		wk.cfg.role = CONFIG_ROLE_WORKER;
	if (rc == 0 && wk.cfg.role != CONFIG_ROLE_WORKER) {
		snprintf(err, len, "UNISUM_ROLE=%s: unisum_init() is for workers; run `unisum %s` for "
			 "that role", config_role_name(wk.cfg.role), config_role_name(wk.cfg.role));
		rc = UNISUM_ECONFIG;
	}
	if (rc == 0)
		rc = config_require(&wk.cfg, CONFIG_ROLE_WORKER, err, len);
	return rc;
}

int unisum_init(void)
{
	char err[512];
	pthread_once(&wk_conds_once, wk_conds_init);
	if (wk.initialized)
		return 0;
	if (wk.left)
		return log_fail(UNISUM_ESHUTDOWN, "unisum_init: this process left the job with "
				"unisum_shutdown() already, and a job cannot be joined twice (the "
				"scheduler counted this worker done, and the servers stop once every "
				"worker is); call unisum_init() once per process and unisum_shutdown() "
				"at its end");
	int rc = wk_configure(err, sizeof err);
	if (rc != 0)
		return log_fail(rc, "unisum_init: %s", err);
	log_set_level(wk.cfg.log_level);
	log_set_identity("worker", wk.cfg.worker_id);
	if (auth_set_secret(wk.cfg.secret) != 0)
		return log_fail(UNISUM_ESYS, "unisum_init: libsodium cannot start");

	wk.tp = transport_tcp();
	wk.failed = 0;
	wk.nservers = wk.cfg.num_servers;
	rc = rdv_client_new(&wk.cfg, 0, wk_notice, wk_tensor_error, NULL, &wk.rdv);
	if (rc != 0)
		return log_fail(rc, "unisum_init: cannot join the job through the scheduler at %s:%d: %s",
				wk.cfg.scheduler_host, wk.cfg.scheduler_port, log_last_error());
	wk.rank = rdv_client_rank(wk.rdv);
	wk.size = wk.cfg.num_workers * wk.cfg.local_size;
	wk.local = wk.cfg.local_size > 1;
	wk.to_servers = !wk.local || (wk.cfg.num_workers > 1 && wk.cfg.local_rank == 0);
	log_set_identity("worker", wk.rank);
	rc = wk_tuner_new();	/* TUNEs that came meanwhile wait in the client */
	if (rc != 0) {
		rc = log_fail(rc, "unisum_init: out of memory");
		goto out_free_rdv;
	}
	rdv_client_on_tune(wk.rdv, wk_on_tune, NULL);
	if ((rc = trace_open(&wk.cfg, wk.rank)) != 0)
		goto out_free_rdv;
	if ((rc = sched_init(&wk.push_q, wk.cfg.credit_bytes)) != 0)
		goto out_close_trace;
	if (wk.local && (rc = wk_local_start()) != 0)
		goto out_fini_sched;
	rc = wk.to_servers ? wk_connect_servers() : 0;
	if (rc == 0 && pthread_create(&wk.push_thread, NULL, wk_push_main, NULL) != 0)
		rc = UNISUM_ESYS;
	if (rc != 0)
		goto out_close_conns;
	wk.push_started = true;
	wk.tune_stop = false;
	wk.tune_started = wk.cfg.autotune &&
			  pthread_create(&wk.tune_thread, NULL, wk_tune_main, NULL) == 0;
	if (wk.cfg.autotune && !wk.tune_started)
		LOG_WARN("cannot start the autotune thread: operations whose cut is new start on the "
			 "caller's thread");
	wk.initialized = true;
	LOG_INFO("joined as worker %d of %d (local rank %d of %d) with %d servers", wk.rank, wk.size,
		 wk.cfg.local_rank, wk.cfg.local_size, wk.nservers);
	return 0;

out_close_conns:
	wk_close_conns();
	local_stop();
out_fini_sched:
	sched_fini(&wk.push_q);
out_close_trace:
	trace_close();
out_free_rdv:
	/* The client's reader thread hands TUNEs to the tuner: it goes first. */
	rdv_client_free(wk.rdv);
	wk.rdv = NULL;
	tune_free(wk.tuner);
	wk.tuner = NULL;
	return rc;
}

int unisum_shutdown(void)
{
	if (!wk.initialized)
		return wk_require_init();
	/* Operations the caller never waited on must finish before their
	 * buffers' owner goes away. */
	pthread_mutex_lock(&wk.lock);
	for (int i = 0; i < wk.nops; i++)
		while (!wk.ops[i]->done)
			pthread_cond_wait(&wk.done_cond, &wk.lock);
	int failed = wk.failed;
	wk.tune_stop = true;
	pthread_cond_signal(&wk.tune_cond);
	pthread_mutex_unlock(&wk.lock);
	/* Every operation is done, so the autotune thread's queue and the PUSH
	 * stage's are empty. */
	if (wk.tune_started)
		pthread_join(wk.tune_thread, NULL);
	wk.tune_started = false;
	local_stop();
	sched_close(&wk.push_q);
	if (wk.push_started)
		pthread_join(wk.push_thread, NULL);
	wk.push_started = false;
	wk_close_conns();
	sched_fini(&wk.push_q);
	trace_close();
	rdv_client_free(wk.rdv);
	wk.rdv = NULL;
	tune_free(wk.tuner);
	wk.tuner = NULL;
	wk_free_all();
	wk.initialized = false;
	wk.left = true;
	return failed;
}

int unisum_rank(void)
{
	return wk.initialized ? wk.rank : UNISUM_ENOTINIT;
}

int unisum_size(void)
{
	return wk.initialized ? wk.size : UNISUM_ENOTINIT;
}

int unisum_local_rank(void)
{
	return wk.initialized ? wk.cfg.local_rank : UNISUM_ENOTINIT;
}

int unisum_local_size(void)
{
	return wk.initialized ? wk.cfg.local_size : UNISUM_ENOTINIT;
}

/* Cuts tensor t into partitions of at most `pbytes`, declares that cut
 * with the scheduler under `wire_name` (which places it and gives its
 * keys), and tells each partition's server what to expect, ahead of any
 * push of it.  Fills *L; 0 or a negative error (logged). */
static int wk_cut(const struct wk_tensor *t, const char *wire_name, uint64_t pbytes,
		  struct wk_layout *L)
{
	uint64_t nparts = placement_nparts(t->count, t->esize, pbytes);
	if (nparts > PLACEMENT_MAX_PARTS)
		return log_fail(UNISUM_EINVAL, "unisum_declare('%s'): %llu elements make %llu "
				"partitions of %llu bytes, more than %u; raise UNISUM_PARTITION_BYTES",
				t->name, (unsigned long long)t->count, (unsigned long long)nparts,
				(unsigned long long)pbytes, PLACEMENT_MAX_PARTS);
	*L = (struct wk_layout){.pbytes = pbytes};
	char why[768];
	int rc = rdv_client_declare(wk.rdv, wire_name, t->dtype, t->count, pbytes, &L->key,
				    &L->nparts, &L->parts, &L->servers, why, sizeof why);
	if (rc != 0) {
		rc = log_fail(rc, "unisum_declare('%s') on worker %d: %s", wire_name, wk.rank, why);
		goto out_free;
	}
	for (uint32_t i = 0; i < L->nparts; i++) {
		if (!wk.to_servers)
			break;	/* the local root tells them */
		if (L->servers[i] >= (uint32_t)wk.nservers) {
			rc = log_fail(UNISUM_EPROTO, "the scheduler placed '%s' on server %u of %d",
				      wire_name, L->servers[i], wk.nservers);
			goto out_free;
		}
		struct wk_job *j = calloc(1, sizeof *j);
		if (j == NULL) {
			rc = UNISUM_ENOMEM;
			goto out_free;
		}
		*j = (struct wk_job){.type = JOB_DECLARE, .key = L->key + i, .dtype = t->dtype,
				     .count = L->parts[i].count, .name = strdup(wire_name)};
		rc = j->name != NULL ? wk_enqueue(&wk.conns[L->servers[i]], j) : UNISUM_ENOMEM;
		if (rc != 0) {
			free(j->name);
			free(j);
			rc = log_fail(rc, "unisum_declare('%s') on worker %d: %s", wire_name, wk.rank,
				      log_last_error());
			goto out_free;
		}
	}
	return 0;

out_free:
	free(L->parts);
	free(L->servers);
	L->parts = NULL;
	L->servers = NULL;
	return rc;
}

/* Files tensor t under an id: the first free one (an undeclared tensor's)
 * or a new one.  Returns its id (*filed), or the id of a tensor of the
 * same name another thread declared meanwhile (t is not filed), or
 * UNISUM_ENOMEM. */
static int wk_tensor_insert(struct wk_tensor *t, bool *filed)
{
	*filed = false;
	pthread_mutex_lock(&wk.lock);
	int id = -1;
	for (int i = 0; i < wk.ntensors; i++) {
		if (wk.tensors[i] == NULL) {
			if (id < 0)
				id = i;
		} else if (strcmp(wk.tensors[i]->name, t->name) == 0) {
			pthread_mutex_unlock(&wk.lock);
			return i;
		}
	}
	if (id < 0 && wk.ntensors == wk.captensors) {
		int cap = wk.captensors ? wk.captensors * 2 : 64;
		struct wk_tensor **nt = realloc(wk.tensors, (size_t)cap * sizeof *nt);
		if (nt == NULL) {
			pthread_mutex_unlock(&wk.lock);
			return UNISUM_ENOMEM;
		}
		wk.tensors = nt;
		wk.captensors = cap;
	}
	if (id < 0)
		id = wk.ntensors++;
	t->index = id;
	wk.tensors[id] = t;
	*filed = true;
	pthread_mutex_unlock(&wk.lock);
	return id;
}

int unisum_declare(const char *name, unisum_dtype dtype, size_t count, int priority)
{
	if (!wk.initialized)
		return wk_require_init();
	if (name == NULL || name[0] == '\0' || strlen(name) >= sizeof ((struct wk_tensor *)0)->name)
		return log_fail(UNISUM_EINVAL, "unisum_declare: the name must have 1 to 255 characters");
	size_t esize = unisum_dtype_size(dtype);
	if (esize == 0)
		return log_fail(UNISUM_EINVAL, "unisum_declare('%s'): unknown dtype %d", name, (int)dtype);
	if (esize > wk.cfg.partition_bytes)
		return log_fail(UNISUM_ECONFIG, "UNISUM_PARTITION_BYTES=%llu is smaller than one %s element",
				(unsigned long long)wk.cfg.partition_bytes, unisum_dtype_name(dtype));

	pthread_mutex_lock(&wk.lock);
	for (int i = 0; i < wk.ntensors; i++) {
		struct wk_tensor *t = wk.tensors[i];
		if (t == NULL || strcmp(t->name, name) != 0)
			continue;
		pthread_mutex_unlock(&wk.lock);
		if (t->dtype != dtype || t->count != count)
			return log_fail(UNISUM_EMISMATCH, "worker %d declared tensor '%s' twice: as %s[%llu] "
					"and now as %s[%zu]", wk.rank, name, unisum_dtype_name(t->dtype),
					(unsigned long long)t->count, unisum_dtype_name(dtype), count);
		return i;
	}
	pthread_mutex_unlock(&wk.lock);

	struct wk_tensor *t = calloc(1, sizeof *t);
	if (t == NULL)
		return UNISUM_ENOMEM;
	snprintf(t->name, sizeof t->name, "%s", name);
	t->dtype = dtype;
	t->count = count;
	t->esize = esize;
	t->priority = priority;
	t->cuts = calloc(1, sizeof *t->cuts);
	int rc = t->cuts == NULL ? UNISUM_ENOMEM : wk_cut(t, name, wk.cfg.partition_bytes, &t->cuts[0]);
	if (rc != 0)
		goto out_free;
	t->ncuts = 1;
	bool filed;
	rc = wk_tensor_insert(t, &filed);
	if (!filed)
		goto out_free;	/* failed, or another thread declared it meanwhile */
	trace_name_tensor(rc, t->name, t->cuts[0].nparts);
	return rc;

out_free:
	if (t->cuts != NULL) {
		free(t->cuts[0].parts);
		free(t->cuts[0].servers);
	}
	free(t->cuts);
	free(t);
	return rc;
}

/* ---- autotune ---------------------------------------------------------- */

/* A setting worker 0 posted, passed on by the scheduler (reader thread). */
/* Autotune has settled on cut L of tensor t (or t is undeclared: L is
 * NULL): tells the servers of every other cut that this worker is done
 * with it, so once every worker is they free its buffers.  This worker's
 * last round on those cuts has completed (the tensor's previous operation
 * is done), so it has every reply of theirs.  Called by the thread that
 * owns t's current round. */
static void wk_retire_cuts(struct wk_tensor *t, const struct wk_layout *L)
{
	for (int c = 0; c < t->ncuts; c++) {
		struct wk_layout *old = &t->cuts[c];
		if (old == L || old->retired)
			continue;
		old->retired = true;
		for (uint32_t i = 0; wk.to_servers && i < old->nparts; i++) {
			struct wk_job *j = calloc(1, sizeof *j);
			if (j == NULL)
				return;	/* the server keeps the buffers: memory, not results */
			*j = (struct wk_job){.type = JOB_RETIRE, .key = old->key + i, .round = old->rounds};
			if (wk_enqueue(&wk.conns[old->servers[i]], j) != 0)
				free(j);
		}
	}
}

/* The cut of tensor t for partition size pbytes when it needs no
 * declaration: one made before, or the declared cut when pbytes cannot
 * have its own (a name too long to carry the size, or too many
 * partitions: every worker decides the same); NULL when it is new. */
static const struct wk_layout *wk_cut_known(const struct wk_tensor *t, uint64_t pbytes)
{
	for (int i = 0; i < t->ncuts; i++)
		if (t->cuts[i].pbytes == pbytes)
			return &t->cuts[i];
	int len = snprintf(NULL, 0, "%s@%llu", t->name, (unsigned long long)pbytes);
	if (len >= 256 || placement_nparts(t->count, t->esize, pbytes) > PLACEMENT_MAX_PARTS)
		return &t->cuts[0];
	return NULL;
}

static bool wk_cut_is_new(const struct wk_tensor *t, uint64_t pbytes)
{
	return wk_cut_known(t, pbytes) == NULL;
}

/* The cut of tensor t for partition size pbytes, declared now if it is
 * new (a scheduler round trip).  Called by the thread that owns t's
 * current round. */
static const struct wk_layout *wk_cut_for(struct wk_tensor *t, uint64_t pbytes, int *rc)
{
	*rc = 0;
	const struct wk_layout *known = wk_cut_known(t, pbytes);
	if (known != NULL)
		return known;
	char wire_name[256];
	if (snprintf(wire_name, sizeof wire_name, "%s@%llu", t->name, (unsigned long long)pbytes) >=
	    (int)sizeof wire_name)
		return &t->cuts[0];	/* cannot happen: wk_cut_known said it fits */
	struct wk_layout L;
	*rc = wk_cut(t, wire_name, pbytes, &L);
	if (*rc != 0)
		return NULL;
	struct wk_layout *cuts = realloc(t->cuts, (size_t)(t->ncuts + 1) * sizeof *cuts);
	if (cuts == NULL) {
		free(L.parts);
		free(L.servers);
		*rc = UNISUM_ENOMEM;
		return NULL;
	}
	/* Only this thread reads t->cuts while the round is in flight. */
	pthread_mutex_lock(&wk.lock);
	t->cuts = cuts;
	t->cuts[t->ncuts] = L;
	const struct wk_layout *got = &t->cuts[t->ncuts++];
	pthread_mutex_unlock(&wk.lock);
	trace_name_tensor(t->index, t->name, L.nparts);
	return got;
}

/* Operation op fails before any of it started: err, with why naming the
 * tensor.  Nothing else holds it. */
static void wk_op_fail(struct wk_op *op, int err, const char *what)
{
	pthread_mutex_lock(&wk.lock);
	op->error = err;
	snprintf(op->why, sizeof op->why, "worker %d, tensor '%s': %s", wk.rank, op->t->name, what);
	op->done = true;
	op->t->busy = false;
	pthread_cond_broadcast(&wk.done_cond);
	pthread_mutex_unlock(&wk.lock);
}

/* Hands operation op, on cut L, to its first stage: LOCAL_REDUCE, or the
 * PUSH queue.  Never waits. */
static void wk_launch(struct wk_op *op, const struct wk_layout *L)
{
	struct wk_tensor *t = op->t;
	int rc;
	/* Servers count rounds per key, so each cut counts its own. */
	uint32_t wire_round = ((struct wk_layout *)L)->rounds++;
	int divisor = (op->flags & UNISUM_AVERAGE) ? wk.size : 1;
	if (wk.local && L->nparts > 0) {
		op->L = L;
		op->wire_round = wire_round;
		struct local_req req = {.key = L->key, .round = wire_round, .dtype = t->dtype,
					.in = op->in, .out = op->out, .nparts = L->nparts,
					.parts = L->parts, .divisor = divisor, .priority = t->priority,
					.ctx = op, .traced = op->traced, .tensor = t->index,
					.step = op->round, .wire_op = op->wire_op, .name = t->name};
		/* Under wk.lock: the done hook may run before local_submit returns. */
		pthread_mutex_lock(&wk.lock);
		rc = local_submit(&req, &op->local);
		if (rc != 0) {
			op->error = rc;
			snprintf(op->why, sizeof op->why, "%s", log_last_error());
			op->done = true;
			t->busy = false;
			pthread_cond_broadcast(&wk.done_cond);
		}
		pthread_mutex_unlock(&wk.lock);
		return;
	}
	pthread_mutex_lock(&wk.lock);
	op->remaining = L->nparts;
	op->done = L->nparts == 0;
	t->busy = !op->done;
	if (op->done)
		pthread_cond_broadcast(&wk.done_cond);
	pthread_mutex_unlock(&wk.lock);

	/* Once its last partition is queued the operation may complete and
	 * the tensor's next round re-cut it: nothing of L is read after. */
	uint32_t nparts = L->nparts;
	for (uint32_t i = 0; i < nparts; i++) {
		struct wk_job *j = malloc(sizeof *j);
		const struct placement_part *p = &L->parts[i];
		size_t off = p->offset * t->esize;
		if (j != NULL) {
			*j = (struct wk_job){.entry = {.priority = t->priority, .key = L->key + i,
						       .bytes = p->count * t->esize},
					     .type = JOB_PUSH_PULL, .server = (int)L->servers[i], .part = i,
					     .key = L->key + i, .round = wire_round, .dtype = t->dtype,
					     .count = p->count,
					     .in = op->in ? (const uint8_t *)op->in + off : NULL,
					     .out = (uint8_t *)op->out + off, .divisor = divisor,
					     .wire_op = op->wire_op, .op = op, .t_queued = op->t_start};
			rc = sched_push(&wk.push_q, &j->entry);
		} else {
			rc = UNISUM_ENOMEM;
		}
		if (rc != 0) {
			/* The operation fails; partitions already queued finish on their own. */
			free(j);
			char why[512];
			snprintf(why, sizeof why, "worker %d, tensor '%s': %s", wk.rank, t->name,
				 rc == UNISUM_ENOMEM ? "out of memory" : log_last_error());
			op_part_done(op, rc, why);
		}
	}
}

/* Autotune: the cut of op's round for its epoch, declaring it with the
 * scheduler if it is new, and waiting for worker 0's setting if need be
 * (so only wk_tune_main calls it with wait).  NULL when it must wait but
 * may not, or on an error (*rc). */
static const struct wk_layout *wk_tuned_cut(struct wk_op *op, bool wait, int *rc)
{
	struct wk_tensor *t = op->t;
	uint32_t epoch = op->round / (uint32_t)wk.cfg.autotune_steps;
	struct tune_setting set = {0};
	bool final = false;
	*rc = 0;
	if (!wait && !tune_setting_now(wk.tuner, epoch, &set, &final))
		return NULL;
	if (wait)
		*rc = tune_setting_of(wk.tuner, epoch, &set, &final);
	if (*rc != 0)
		return NULL;
	if (!wait && wk_cut_is_new(t, set.pbytes))
		return NULL;
	const struct wk_layout *L = wk_cut_for(t, set.pbytes, rc);
	if (*rc == 0 && final)
		wk_retire_cuts(t, L);
	return *rc == 0 ? L : NULL;
}

/* The autotune thread: operations whose setting has not come yet or whose
 * cut is new wait here for the setting and the declaration, so that
 * starting an operation never waits on the network. */
static void *wk_tune_main(void *arg)
{
	(void)arg;
	for (;;) {
		pthread_mutex_lock(&wk.lock);
		while (wk.tune_head == NULL && !wk.tune_stop)
			pthread_cond_wait(&wk.tune_cond, &wk.lock);
		struct wk_op *op = wk.tune_head;
		if (op == NULL) {
			pthread_mutex_unlock(&wk.lock);
			return NULL;
		}
		wk.tune_head = op->tune_next;
		if (wk.tune_head == NULL)
			wk.tune_tail = NULL;
		pthread_mutex_unlock(&wk.lock);
		int rc;
		const struct wk_layout *L = wk_tuned_cut(op, true, &rc);
		if (L != NULL)
			wk_launch(op, L);
		else
			wk_op_fail(op, rc, rc == UNISUM_ECONN ? "the job failed while waiting for the "
					   "autotune setting" : log_last_error());
	}
}

/* Starts an operation: `in` NULL means "contribute zeros" (broadcast from
 * another root).  wire_op is the collective (WIRE_OP()): every worker of
 * the round must start the same one, or the round fails on all of them.
 * Never waits on the network: under autotune an operation whose cut is
 * not ready goes to wk_tune_main. */
static int wk_start(int tensor, const void *in, void *out, int flags, uint32_t wire_op,
		    unisum_handle *h)
{
	if (!wk.initialized)
		return wk_require_init();
	if (h == NULL || out == NULL || (flags & ~UNISUM_AVERAGE) != 0)
		return log_fail(UNISUM_EINVAL, "unisum_push_pull: out and the handle must not be NULL and "
				"flags may only hold UNISUM_AVERAGE (worker %d, tensor %d)", wk.rank, tensor);
	struct wk_op *op = calloc(1, sizeof *op);
	if (op == NULL)
		return UNISUM_ENOMEM;

	pthread_mutex_lock(&wk.lock);
	int rc = 0;
	if (wk.failed != 0) {
		rc = log_fail(wk.failed, "worker %d: the job has failed: %s", wk.rank, wk.failed_why);
		goto out_unlock;
	}
	if (tensor < 0 || tensor >= wk.ntensors || wk.tensors[tensor] == NULL) {
		rc = log_fail(UNISUM_EINVAL, "worker %d: tensor id %d was never declared, or was "
			      "undeclared; call unisum_declare() first", wk.rank, tensor);
		goto out_unlock;
	}
	struct wk_tensor *t = wk.tensors[tensor];
	if (t->busy) {
		rc = log_fail(UNISUM_EBUSY, "worker %d: tensor '%s' already has a push_pull in flight; wait "
			      "for it before starting the next", wk.rank, t->name);
		goto out_unlock;
	}
	if (wk.nops == wk.capops) {
		int cap = wk.capops ? wk.capops * 2 : 64;
		struct wk_op **no = realloc(wk.ops, (size_t)cap * sizeof *no);
		if (no == NULL) {
			rc = UNISUM_ENOMEM;
			goto out_unlock;
		}
		wk.ops = no;
		wk.capops = cap;
	}
	*op = (struct wk_op){.handle = ++wk.next_handle, .t = t, .flags = flags, .round = t->round++,
			     .in = in, .out = out, .wire_op = wire_op};
	t->busy = true;
	op->traced = trace_wants(op->round);
	op->t_start = op->traced ? trace_now_us() : 0;
	wk.ops[wk.nops++] = op;
	*h = op->handle;
	pthread_mutex_unlock(&wk.lock);

	/* The cut of this round: the declared one, or autotune's for its epoch. */
	const struct wk_layout *L = &t->cuts[0];
	if (wk.cfg.autotune) {
		if (wk.rank == 0)
			tune_saw_round(wk.tuner, op->round);
		L = wk_tuned_cut(op, false, &rc);
		if (L == NULL && rc == 0 && !wk.tune_started)
			L = wk_tuned_cut(op, true, &rc);	/* no thread to wait on */
		if (L == NULL && rc != 0) {
			wk_op_fail(op, rc, log_last_error());
			return 0;
		}
		if (L == NULL) {
			pthread_mutex_lock(&wk.lock);
			if (wk.tune_tail != NULL)
				wk.tune_tail->tune_next = op;
			else
				wk.tune_head = op;
			wk.tune_tail = op;
			pthread_cond_signal(&wk.tune_cond);
			pthread_mutex_unlock(&wk.lock);
			return 0;
		}
	}
	wk_launch(op, L);
	return 0;

out_unlock:
	pthread_mutex_unlock(&wk.lock);
	free(op);
	return rc;
}

int unisum_push_pull_async(int tensor, const void *in, void *out, int flags, unisum_handle *h)
{
	if (in == NULL)
		return log_fail(UNISUM_EINVAL, "unisum_push_pull: in must not be NULL (tensor %d)", tensor);
	uint32_t wire_op = WIRE_OP((flags & UNISUM_AVERAGE) ? WIRE_OP_AVERAGE : WIRE_OP_SUM, 0);
	return wk_start(tensor, in, out, flags, wire_op, h);
}

/* Finds an unreleased operation; call with wk.lock held. */
static int wk_find_op(unisum_handle h)
{
	for (int i = 0; i < wk.nops; i++)
		if (wk.ops[i]->handle == h)
			return i;
	return -1;
}

/* Releases a completed operation and returns its status; wk.lock held. */
static int wk_release(int i)
{
	struct wk_op *op = wk.ops[i];
	wk.ops[i] = wk.ops[--wk.nops];
	int rc = op->error;
	char quoted[260];
	snprintf(quoted, sizeof quoted, "'%s'", op->t->name);
	if (rc != 0 && strstr(op->why, quoted) != NULL)
		log_fail(rc, "worker %d: %s", wk.rank, op->why);	/* it names the tensor */
	else if (rc != 0)
		log_fail(rc, "worker %d, tensor '%s': %s", wk.rank, op->t->name, op->why);
	free(op);
	return rc;
}

int unisum_poll_timeout(unisum_handle h, int timeout_ms)
{
	if (!wk.initialized)
		return wk_require_init();
	if (timeout_ms < 0)
		return log_fail(UNISUM_EINVAL, "unisum_poll_timeout: timeout_ms must not be negative, "
				"got %d", timeout_ms);
	struct timespec until = timing_deadline(timeout_ms);
	pthread_mutex_lock(&wk.lock);
	int i = wk_find_op(h), rc;
	if (i < 0) {
		rc = log_fail(UNISUM_EINVAL, "unisum_poll: unknown or already released handle %lld",
			      (long long)h);
	} else {
		struct wk_op *op = wk.ops[i];
		int timed_out = 0;
		while (!op->done && timeout_ms > 0 && !timed_out)
			timed_out = pthread_cond_timedwait(&wk.done_cond, &wk.lock, &until);
		if (!op->done) {
			rc = 0;
		} else {
			rc = wk_release(wk_find_op(h));
			if (rc == 0)
				rc = 1;
		}
	}
	pthread_mutex_unlock(&wk.lock);
	return rc;
}

int unisum_poll(unisum_handle h)
{
	return unisum_poll_timeout(h, 0);
}

int unisum_wait(unisum_handle h)
{
	if (!wk.initialized)
		return wk_require_init();
	pthread_mutex_lock(&wk.lock);
	int i = wk_find_op(h), rc;
	if (i < 0) {
		rc = log_fail(UNISUM_EINVAL, "unisum_wait: unknown or already released handle %lld",
			      (long long)h);
	} else {
		struct wk_op *op = wk.ops[i];
		while (!op->done)
			pthread_cond_wait(&wk.done_cond, &wk.lock);
		rc = wk_release(wk_find_op(h));
	}
	pthread_mutex_unlock(&wk.lock);
	return rc;
}

int unisum_push_pull(int tensor, const void *in, void *out, int flags)
{
	unisum_handle h;
	int rc = unisum_push_pull_async(tensor, in, out, flags, &h);
	return rc != 0 ? rc : unisum_wait(h);
}

int unisum_broadcast_async(int tensor, void *buf, int root_rank, unisum_handle *h)
{
	if (!wk.initialized)
		return wk_require_init();
	if (buf == NULL || root_rank < 0 || root_rank >= wk.size)
		return log_fail(UNISUM_EINVAL, "unisum_broadcast: buf must not be NULL and root_rank %d "
				"must be in [0, %d) (worker %d, tensor %d)", root_rank, wk.size, wk.rank,
				tensor);
	return wk_start(tensor, wk.rank == root_rank ? buf : NULL, buf, 0,
			WIRE_OP(WIRE_OP_BROADCAST, (uint32_t)root_rank), h);
}

int unisum_broadcast(int tensor, void *buf, int root_rank)
{
	unisum_handle h;
	int rc = unisum_broadcast_async(tensor, buf, root_rank, &h);
	return rc != 0 ? rc : unisum_wait(h);
}

int unisum_undeclare(int tensor)
{
	if (!wk.initialized)
		return wk_require_init();
	pthread_mutex_lock(&wk.lock);
	struct wk_tensor *t = tensor >= 0 && tensor < wk.ntensors ? wk.tensors[tensor] : NULL;
	int rc = 0;
	if (t == NULL) {
		rc = log_fail(UNISUM_EINVAL, "unisum_undeclare: worker %d has no tensor id %d (never "
			      "declared, or undeclared already)", wk.rank, tensor);
		goto out_unlock;
	}
	bool held = t->busy;
	for (int i = 0; i < wk.nops && !held; i++)
		held = wk.ops[i]->t == t;
	if (held) {
		rc = log_fail(UNISUM_EBUSY, "unisum_undeclare: worker %d, tensor '%s' has an operation "
			      "not yet waited for; wait for its handle first", wk.rank, t->name);
		goto out_unlock;
	}
	wk.tensors[tensor] = NULL;
	pthread_mutex_unlock(&wk.lock);
	/* Each cut is its own declaration: every place that holds it lets
	 * go.  Nothing is in flight, so the servers' replies are all here. */
	wk_retire_cuts(t, NULL);
	for (int c = 0; c < t->ncuts; c++) {
		if (wk.local)
			local_forget(t->cuts[c].key);
		rdv_client_forget(wk.rdv, t->cuts[c].key);
	}
	wk_tensor_free(t);
	return 0;

out_unlock:
	pthread_mutex_unlock(&wk.lock);
	return rc;
}

int unisum_get_stats(unisum_stats *out)
{
	if (!wk.initialized)
		return wk_require_init();
	if (out == NULL)
		return log_fail(UNISUM_EINVAL, "unisum_get_stats: out must not be NULL");
	struct sched_stats st;
	sched_stats(&wk.push_q, &st);
	uint64_t pbytes = tune_partition_bytes(wk.tuner);
	*out = (unisum_stats){.credit_bytes = st.credit, .partition_bytes = pbytes,
			      .max_inflight_bytes = st.max_inflight, .partitions_sent = st.taken};
	return 0;
}

void *unisum_alloc(size_t bytes)
{
	pthread_mutex_lock(&wk.lock);
	bool local = wk.initialized && wk.local;
	pthread_mutex_unlock(&wk.lock);
	void *p = local ? local_alloc(bytes) : NULL;
	if (p == NULL) {
		size_t round = bytes == 0 ? 64 : (bytes + 63) & ~(size_t)63;
		p = round < bytes ? NULL : aligned_alloc(64, round);
	}
	return p;
}

void unisum_free(void *p)
{
	if (p != NULL && !local_free(p))
		free(p);
}

int unisum_barrier_timeout(int timeout_ms)
{
	if (!wk.initialized)
		return wk_require_init();
	if (timeout_ms < 0)
		return log_fail(UNISUM_EINVAL, "unisum_barrier_timeout: timeout_ms must not be negative, "
				"got %d", timeout_ms);
	int rc = rdv_client_barrier_wait(wk.rdv, RDV_GROUP_WORKERS, timeout_ms);
	if (rc < 0)
		return log_fail(rc, "unisum_barrier on worker %d: %s", wk.rank, log_last_error());
	return rc;
}

int unisum_barrier(void)
{
	if (!wk.initialized)
		return wk_require_init();
	int rc = rdv_client_barrier(wk.rdv, RDV_GROUP_WORKERS);
	if (rc != 0)
		return log_fail(rc, "unisum_barrier on worker %d: %s", wk.rank, log_last_error());
	return 0;
}
