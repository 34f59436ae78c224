/*
 * worker.c - a worker of a job as a handle (worker.h): joining and
 * leaving, the tensor table, starting and completing operations, the
 * local path's hooks.  api.c puts unisum.h over the process's one
 * worker; tests may run several in one process.  The server connections and the
 * PUSH and PULL stages are in conns.c, cuts and autotune in cuts.c, the
 * state they share in worker_int.h.
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
 * Locks.  `w->lock` guards the tensor table, the operations and `failed`;
 * a connection's `lock` guards its queue and pending table.  Order:
 * w->lock, then a connection's lock.  No lock is held during socket I/O.
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
#include "worker/worker_int.h"
#include "transport/auth.h"
#include "transport/transport.h"
#include "unisum.h"
#include "wire/wire.h"

/* The scheduler says the job failed (or was lost): fail everything. */
static void wk_notice(void *arg, int err, const char *why)
{
	struct worker *w = arg;
	pthread_mutex_lock(&w->lock);
	if (w->failed == 0) {
		w->failed = err == UNISUM_ESHUTDOWN ? UNISUM_ECONN : err;
		snprintf(w->failed_why, sizeof w->failed_why, "%s", why);
		pthread_cond_broadcast(&w->failed_cond);
	}
	if (w->tuner != NULL)
		tune_stop(w->tuner);
	/* Unblock every connection (their threads fail the pending jobs),
	 * unless they are still being set up or already being torn down. */
	if (w->conns_live)
		for (int s = 0; s < w->nservers; s++)
			w->conns[s].tp->conn_shutdown(w->conns[s].conn);
	pthread_mutex_unlock(&w->lock);
	if (err == UNISUM_EMEMBERSHIP)
		LOG_WARN("%s: operations fail until unisum_rejoin()", why);
	else
		LOG_ERROR("%s", why);
}


/* ---- the local path's hooks (src/worker/local.c) ------------------------- */

/* Local root of several machines: partition `part` of the machine's sum is
 * in the operation's output; it goes to the PUSH stage like any other. */
static void wk_local_push(void *ctx, uint32_t part)
{
	struct wk_op *op = ctx;
	struct worker *w = op->w;
	const struct wk_layout *L = op->L;
	const struct placement_part *p = &L->parts[part];
	struct wk_tensor *t = op->t;
	uint8_t *at = (uint8_t *)op->out + p->offset * t->esize;
	struct wk_job *j = malloc(sizeof *j);
	int rc = UNISUM_ENOMEM;
	bool push, pull;
	wk_job_sets(op, p->offset, p->count, &push, &pull);
	/* A compressed tensor: the machine's sum is compressed here, once. */
	struct compress_state *cs = j != NULL ? wk_comp_state(t, L, part, &rc) : NULL;
	if (j != NULL && rc == 0) {
		*j = (struct wk_job){.entry = {.priority = t->priority,
					       .key = wk_push_order(op, L, part),
					       .bytes = push ? wk_push_bytes(t, p->count, cs) : 0},
				     .type = JOB_PUSH_PULL, .server = (int)L->servers[part], .part = part,
				     .kept = L->kept != NULL ? &L->kept[part] : NULL,
				     .key = L->key + part, .round = op->wire_round, .dtype = t->dtype,
				     .count = p->count, .in = push ? at : NULL, .out = at,
				     .divisor = (op->flags & UNISUM_AVERAGE) ? w->size : 1,
				     .skip_pull = !pull, .wire_op = op->wire_op, .cs = cs, .op = op,
				     .t_queued = op->traced ? trace_now_us() : 0};
		rc = sched_push(&w->push_q, &j->entry);
	}
	if (rc != 0) {
		free(j);
		char why[512];
		snprintf(why, sizeof why, "worker %d, tensor '%s': %s", w->rank, t->name,
			 rc == UNISUM_ENOMEM ? "out of memory" : log_last_error());
		local_pulled(op->local, part, rc, why);
	}
}

/* The operation is complete on this worker. */
static void wk_local_done(void *ctx, int err, const char *why)
{
	struct wk_op *op = ctx;
	struct worker *w = op->w;
	/* Its partitions never counted down here: complete it as the last. */
	pthread_mutex_lock(&w->lock);
	op->remaining = 1;
	pthread_mutex_unlock(&w->lock);
	wk_op_part_done(op, err, why);
}

static int wk_local_failed(void *arg, char *why, size_t len)
{
	struct worker *w = arg;
	pthread_mutex_lock(&w->lock);
	int err = w->failed;
	if (err != 0)
		snprintf(why, len, "%s%s", err == UNISUM_EMEMBERSHIP ? "" : "the job failed: ",
			 w->failed_why);
	pthread_mutex_unlock(&w->lock);
	return err;
}

/* The scheduler says tensor `key` can never be summed (reader thread). */
static void wk_tensor_error(void *arg, uint64_t key, const char *why)
{
	struct worker *w = arg;
	pthread_mutex_lock(&w->lock);
	struct wk_poison *p = realloc(w->poison, (size_t)(w->npoison + 1) * sizeof *p);
	if (p != NULL) {
		w->poison = p;
		p[w->npoison].key = key;
		snprintf(p[w->npoison].why, sizeof p[w->npoison].why, "%s", why);
		w->npoison++;
	}
	pthread_mutex_unlock(&w->lock);
}

static int wk_local_poisoned(void *arg, uint64_t key, char *why, size_t len)
{
	struct worker *w = arg;
	int rc = 0;
	pthread_mutex_lock(&w->lock);
	for (int i = 0; i < w->npoison && rc == 0; i++) {
		if (w->poison[i].key == key) {
			snprintf(why, len, "%s", w->poison[i].why);
			rc = UNISUM_EMISMATCH;
		}
	}
	pthread_mutex_unlock(&w->lock);
	return rc;
}

static void wk_local_poison(void *arg, uint64_t key, const char *why)
{
	struct worker *w = arg;
	rdv_client_poison_tensor(w->rdv, key, why);
}

static void wk_local_fail_job(void *arg, int err, const char *why)
{
	struct worker *w = arg;
	rdv_client_fail_job(w->rdv, err, why);
}

static int wk_local_start(struct worker *w)
{
	char job[SHM_JOB_MAX + 1];
	config_job_id(&w->cfg, job, sizeof job);
	struct local_cfg lcfg = {.job = job, .machine = w->cfg.worker_id,
				 .machines = w->cfg.num_workers, .local_rank = w->cfg.local_rank,
				 .local_size = w->cfg.local_size, .rank = w->rank,
				 .timeout_ms = w->cfg.timeout_ms, .stall_warn_ms = w->cfg.stall_warn_ms,
				 .stall_abort_ms = w->cfg.stall_abort_ms,
				 .stage_bytes = w->cfg.local_stage_bytes,
				 .arena_bytes = w->cfg.local_arena_bytes};
	struct local_hooks hooks = {.arg = w, .push = wk_local_push, .done = wk_local_done,
				    .poison = wk_local_poison, .fail_job = wk_local_fail_job,
				    .failed = wk_local_failed, .poisoned = wk_local_poisoned};
	return local_start(&lcfg, &hooks, &w->lc);
}

/* ---- joining and leaving -------------------------------------------------- */

/* 0 while w is in its job, else UNISUM_ENOTINIT with a message. */
static int wk_require_init(const struct worker *w)
{
	return w != NULL && w->initialized ? 0 : log_fail(UNISUM_ENOTINIT, "call unisum_init() first");
}

static void wk_tensor_free(struct wk_tensor *t)
{
	if (t == NULL)
		return;
	for (int c = 0; c < t->ncuts; c++) {
		wk_layout_free_cs(&t->cuts[c]);
		wk_kept_free(&t->cuts[c]);
		free(t->cuts[c].parts);
		free(t->cuts[c].servers);
	}
	free(t->cuts);
	free(t->ranks);
	free(t->dssync_live);
	free(t);
}

/* Frees what an operation (or the template of one) owns beside itself. */
static void wk_op_free_owned(const struct wk_op *op)
{
	free(op->direct);
	free(op->segs.counts);
	free(op->segs.owners);
	free(op->own_spans);
	free(op->push_spans);
	free(op->pull_spans);
	free(op->scratch);
	free(op->phase_left);
	for (int i = 0; i < op->npulls; i++)
		free(op->pulls[i]);
	free(op->pulls);
}

static void wk_op_free(struct wk_op *op)
{
	while (op->held != NULL) {	/* never supplied: its operation failed */
		struct wk_job *j = op->held;
		op->held = j->next;
		free(j);
	}
	wk_op_free_owned(op);
	free(op);
}

static void wk_free_all(struct worker *w)
{
	for (int i = 0; i < w->ntensors; i++)
		wk_tensor_free(w->tensors[i]);
	free(w->tensors);
	free(w->poison);
	w->poison = NULL;
	w->npoison = 0;
	free(w->racks);
	w->racks = NULL;
	w->racks_known = false;
	for (int i = 0; i < w->nops; i++)
		wk_op_free(w->ops[i]);
	free(w->ops);
	w->tensors = NULL;
	w->ops = NULL;
	w->ntensors = w->captensors = w->nops = w->capops = 0;
	for (int i = 0; i < w->npsets; i++)
		free(w->psets[i].ranks);
	free(w->psets);
	w->psets = NULL;
	w->npsets = w->next_pset = 0;
}

/* A worker not yet in a job: its locks, and its conditions, whose timed
 * waits run on the monotonic clock.  NULL when out of memory. */
static struct worker *wk_new(const struct config *cfg)
{
	struct worker *w = calloc(1, sizeof *w);
	if (w == NULL)
		return NULL;
	pthread_mutex_init(&w->lock, NULL);
	pthread_mutex_init(&w->connect_lock, NULL);
	pthread_mutex_init(&w->meter.lock, NULL);
	timing_cond_init(&w->done_cond);
	timing_cond_init(&w->failed_cond);
	timing_cond_init(&w->join_cond);
	pthread_cond_init(&w->tune_cond, NULL);
	w->cfg = *cfg;
	return w;
}

void worker_free(struct worker *w)
{
	if (w == NULL)
		return;
	pthread_mutex_destroy(&w->lock);
	pthread_mutex_destroy(&w->connect_lock);
	pthread_mutex_destroy(&w->meter.lock);
	pthread_cond_destroy(&w->done_cond);
	pthread_cond_destroy(&w->failed_cond);
	pthread_cond_destroy(&w->join_cond);
	free(w->announced);
	free(w->retired);
	free(w->moved);
	wk_gone_kept_free(w);
	free(w->lost);
	pthread_cond_destroy(&w->tune_cond);
	free(w);
}

/* Starts the PUSH stage's thread and, under autotune, the tuner's. */
static int wk_start_threads(struct worker *w)
{
	if (pthread_create(&w->push_thread, NULL, wk_push_main, w) != 0)
		return log_fail(UNISUM_ESYS, "worker %d cannot start its PUSH thread", w->rank);
	w->push_started = true;
	w->tune_stop = false;
	w->tune_started = w->cfg.autotune &&
			  pthread_create(&w->tune_thread, NULL, wk_tune_main, w) == 0;
	if (w->cfg.autotune && !w->tune_started)
		LOG_WARN("cannot start the autotune thread: operations whose cut is new start on the "
			 "caller's thread");
	return 0;
}

/* Joins the job through the scheduler: w->rank and the roles of this
 * worker, the tuner, the PUSH queue.  0 or an error (logged); undone by
 * wk_unjoin. */
static int wk_join_job(struct worker *w)
{
	if (auth_set_secret(w->cfg.secret) != 0)
		return log_fail(UNISUM_ESYS, "unisum_init: libsodium cannot start");
	w->nservers = w->cfg.num_servers;
	int rc = rdv_client_new(&w->cfg, 0, wk_notice, wk_tensor_error, w, &w->rdv);
	if (rc != 0)
		return log_fail(rc, "unisum_init: cannot join the job through the scheduler at %s:%d: %s",
				w->cfg.scheduler_host, w->cfg.scheduler_port, log_last_error());
	w->rank = rdv_client_rank(w->rdv);
	if (w->cfg.elastic) {
		/* The generation's size, not the one the process started with. */
		w->cfg.num_workers = rdv_client_num_machines(w->rdv);
		w->cfg.num_servers = w->nservers = rdv_client_num_servers(w->rdv);
	}
	w->size = w->cfg.num_workers * w->cfg.local_size;
	w->local = w->cfg.local_size > 1;
	w->to_servers = !w->local || (w->cfg.num_workers > 1 && w->cfg.local_rank == 0);
	rc = wk_tuner_new(w);	/* TUNEs that came meanwhile wait in the client */
	if (rc == 0)
		rdv_client_on_tune(w->rdv, wk_on_tune, w);
	rdv_client_on_join(w->rdv, wk_on_join, w);	/* so do join events */
	/* Server failover: every worker keeps the last reply of what it pushes. */
	w->keep_replies = w->cfg.server_failover && w->nservers > 1 && w->cfg.num_workers > 1;
	rdv_client_on_failover(w->rdv, wk_on_failover, w);
	rdv_client_on_rejoin(w->rdv, wk_on_rejoin, w);
	if (rc == 0)
		rc = sched_init(&w->push_q, w->cfg.credit_bytes);
	if (rc != 0) {
		/* The client's reader thread hands TUNEs to the tuner: it goes first. */
		rdv_client_free(w->rdv);
		w->rdv = NULL;
		tune_free(w->tuner);
		w->tuner = NULL;
		return log_fail(rc, "unisum_init: out of memory");
	}
	return 0;
}

/* Undoes wk_join_job (every thread that uses them stopped). */
static void wk_unjoin(struct worker *w)
{
	sched_fini(&w->push_q);
	rdv_client_free(w->rdv);	/* before the tuner: see wk_join_job */
	w->rdv = NULL;
	tune_free(w->tuner);
	w->tuner = NULL;
}

int worker_join(const struct config *cfg, struct worker **out)
{
	struct worker *w = wk_new(cfg);
	if (w == NULL)
		return log_fail(UNISUM_ENOMEM, "unisum_init: out of memory");
	int rc = wk_join_job(w);
	if (rc != 0)
		goto out_free;
	if (w->local && (rc = wk_local_start(w)) != 0)
		goto out_unjoin;
	rc = w->to_servers ? wk_connect_servers(w) : 0;
	if (rc == 0)
		rc = wk_start_threads(w);
	if (rc != 0)
		goto out_close_conns;
	w->initialized = true;
	LOG_INFO("joined as worker %d of %d (local rank %d of %d) with %d servers", w->rank, w->size,
		 w->cfg.local_rank, w->cfg.local_size, w->nservers);
	*out = w;
	return 0;

out_close_conns:
	wk_close_conns(w);
	local_stop(w->lc);
out_unjoin:
	wk_unjoin(w);
out_free:
	worker_free(w);
	return rc;
}

bool wk_busy_but_nothing(const struct worker *w, bool pushed)
{
	for (int i = 0; i < w->nops; i++) {
		const struct wk_op *op = w->ops[i];
		if (!op->done && (!op->nothing || (pushed && op->nothing_unacked > 0)))
			return true;
	}
	return false;
}

void wk_nothing_pushed(struct worker *w, struct wk_op *op)
{
	if (op->nothing_unacked > 0 && --op->nothing_unacked == 0)
		pthread_cond_broadcast(&w->done_cond);
}

int worker_leave(struct worker *w)
{
	if (wk_require_init(w) != 0)
		return UNISUM_ENOTINIT;
	/* Operations the caller never waited on must finish before their
	 * buffers' owner goes away. */
	wk_supply_nothing(w);
	pthread_mutex_lock(&w->lock);
	while (wk_busy_but_nothing(w, true))
		pthread_cond_wait(&w->done_cond, &w->lock);
	int failed = w->failed;
	w->tune_stop = true;
	pthread_cond_signal(&w->tune_cond);
	struct local *lc = w->lc;
	w->lc = NULL;	/* worker_alloc looks under the lock */
	pthread_mutex_unlock(&w->lock);
	/* Every operation is done, so the autotune thread's queue and the PUSH
	 * stage's are empty. */
	if (w->tune_started)
		pthread_join(w->tune_thread, NULL);
	w->tune_started = false;
	local_stop(lc);
	sched_close(&w->push_q);
	if (w->push_started)
		pthread_join(w->push_thread, NULL);
	w->push_started = false;
	wk_close_conns(w);
	wk_unjoin(w);
	wk_free_all(w);
	pthread_mutex_lock(&w->lock);
	w->initialized = false;
	pthread_mutex_unlock(&w->lock);
	return failed;
}

const struct config *worker_config(const struct worker *w)
{
	return &w->cfg;
}

int worker_membership_changed(struct worker *w)
{
	if (wk_require_init(w) != 0)
		return UNISUM_ENOTINIT;
	pthread_mutex_lock(&w->lock);
	int failed = w->failed;
	pthread_mutex_unlock(&w->lock);
	if (failed != 0)
		return failed == UNISUM_EMEMBERSHIP ? 1 : failed;
	return w->cfg.elastic && rdv_client_waiting(w->rdv) > 0;
}

int worker_end_membership(struct worker *w)
{
	if (wk_require_init(w) != 0)
		return UNISUM_ENOTINIT;
	if (!w->cfg.elastic)
		return log_fail(UNISUM_EINVAL, "unisum_rejoin: this is not an elastic job (UNISUM_ELASTIC=1, "
				"`unisum launch --elastic`)");
	pthread_mutex_lock(&w->lock);
	int failed = w->failed;
	pthread_mutex_unlock(&w->lock);
	if (failed == 0) {
		/* Ask for the re-form (workers wait to join), and wait for it. */
		rdv_client_resize(w->rdv);
		failed = rdv_client_wait_failed(w->rdv, w->cfg.timeout_ms);
	}
	if (failed == UNISUM_EMEMBERSHIP)
		return 0;
	if (failed == 0)
		return log_fail(UNISUM_ETIMEDOUT, "unisum_rejoin: the scheduler did not re-form the job "
				"within UNISUM_TIMEOUT_MS=%d", w->cfg.timeout_ms);
	return log_fail(failed, "unisum_rejoin: the job failed, it cannot re-form: %s", w->failed_why);
}

bool worker_busy(struct worker *w)
{
	if (w == NULL)
		return false;
	pthread_mutex_lock(&w->lock);
	bool busy = w->failed != 0;
	for (int i = 0; i < w->nops && !busy; i++)
		busy = !w->ops[i]->done;
	pthread_mutex_unlock(&w->lock);
	return busy;
}

int worker_rank(const struct worker *w)
{
	return w != NULL && w->initialized ? w->rank : UNISUM_ENOTINIT;
}

int worker_size(const struct worker *w)
{
	return w != NULL && w->initialized ? w->size : UNISUM_ENOTINIT;
}

int worker_local_rank(const struct worker *w)
{
	return w != NULL && w->initialized ? w->cfg.local_rank : UNISUM_ENOTINIT;
}

int worker_local_size(const struct worker *w)
{
	return w != NULL && w->initialized ? w->cfg.local_size : UNISUM_ENOTINIT;
}

/* ---- tensors ---------------------------------------------------------------- */

/* Files tensor t under an id: the first free one (an undeclared tensor's)
 * or a new one.  Returns its id (*filed), or the id of a tensor of the
 * same name another thread declared meanwhile (t is not filed), or
 * UNISUM_ENOMEM. */
static int wk_tensor_insert(struct wk_tensor *t, bool *filed)
{
	struct worker *w = t->w;
	*filed = false;
	pthread_mutex_lock(&w->lock);
	int id = -1;
	for (int i = 0; i < w->ntensors; i++) {
		if (w->tensors[i] == NULL) {
			if (id < 0)
				id = i;
		} else if (strcmp(w->tensors[i]->name, t->name) == 0) {
			pthread_mutex_unlock(&w->lock);
			return i;
		}
	}
	if (id < 0 && w->ntensors == w->captensors) {
		int cap = w->captensors ? w->captensors * 2 : 64;
		struct wk_tensor **nt = realloc(w->tensors, (size_t)cap * sizeof *nt);
		if (nt == NULL) {
			pthread_mutex_unlock(&w->lock);
			return UNISUM_ENOMEM;
		}
		w->tensors = nt;
		w->captensors = cap;
	}
	if (id < 0)
		id = w->ntensors++;
	t->index = id;
	t->life = wk_next_life(w, t->name);
	w->tensors[id] = t;
	*filed = true;
	wk_redeclare_late(w, t, 0);
	pthread_mutex_unlock(&w->lock);
	return id;
}

/* The id of tensor `name` if w has it (UNISUM_EMISMATCH when with another
 * shape or sync mode), or -1. */
static int wk_tensor_known(struct worker *w, const char *name, unisum_dtype dtype, size_t count,
			   uint32_t sync, const char *comp)
{
	pthread_mutex_lock(&w->lock);
	for (int i = 0; i < w->ntensors; i++) {
		struct wk_tensor *t = w->tensors[i];
		if (t == NULL || strcmp(t->name, name) != 0)
			continue;
		pthread_mutex_unlock(&w->lock);
		if (t->dtype != dtype || t->count != count)
			return log_fail(UNISUM_EMISMATCH, "worker %d declared tensor '%s' twice: as %s[%llu] "
					"and now as %s[%zu]", w->rank, name, unisum_dtype_name(t->dtype),
					(unsigned long long)t->count, unisum_dtype_name(dtype), count);
		char a[32], b[32];
		if (t->sync != sync)
			return log_fail(UNISUM_EMISMATCH, "worker %d declared tensor '%s' twice: %s and "
					"now %s", w->rank, name, wire_sync_text(t->sync, a, sizeof a),
					wire_sync_text(sync, b, sizeof b));
		if (strcmp(t->comp_text, comp) != 0)
			return log_fail(UNISUM_EMISMATCH, "worker %d declared tensor '%s' twice: "
					"compressed '%s' and now '%s'", w->rank, name,
					t->comp_text[0] ? t->comp_text : "none",
					comp[0] ? comp : "none");
		return i;
	}
	pthread_mutex_unlock(&w->lock);
	return -1;
}

int worker_declare(struct worker *w, const char *name, unisum_dtype dtype, size_t count,
		   int priority)
{
	return worker_declare_shaped(w, name, dtype, count, NULL, priority);
}

int worker_declare_shaped(struct worker *w, const char *name, unisum_dtype dtype, size_t count,
			  const struct rdv_shape *shape, int priority)
{
	return worker_declare_in(w, 0, name, dtype, count, shape, priority);
}

/* ---- process sets ------------------------------------------------------------ */

static int wk_declare(struct worker *w, const char *name, unisum_dtype dtype, size_t count,
		      const struct rdv_shape *shape, int priority, int *ranks, int nranks,
		      uint32_t sync, const struct compress_spec *comp);

/*
 * A process set's tensor is its own tensor: its wire name is the user's
 * name under a prefix that hashes the set's ranks, so the scheduler gives
 * it its own keys and rounds, placed like any tensor.  Each member pushes
 * every partition itself (a local root over its machine's connections,
 * any other rank over connections it opens at its first such tensor) and
 * the server sums the members' pushes in rank order; the machine's local
 * reduce serves the global set only.  Non-members never hear of it.
 */

static int wk_int_cmp(const void *a, const void *b)
{
	int x = *(const int *)a, y = *(const int *)b;
	return (x > y) - (x < y);
}

int worker_process_set_add(struct worker *w, const int *ranks, int n)
{
	if (wk_require_init(w) != 0)
		return UNISUM_ENOTINIT;
	if (ranks == NULL || n < 1 || n > w->size)
		return log_fail(UNISUM_EINVAL, "unisum_process_set_add: give 1 to %d ranks (got %d)",
				w->size, n);
	int *sorted = malloc((size_t)n * sizeof *sorted);
	if (sorted == NULL)
		return UNISUM_ENOMEM;
	memcpy(sorted, ranks, (size_t)n * sizeof *sorted);
	qsort(sorted, (size_t)n, sizeof *sorted, wk_int_cmp);
	for (int i = 0; i < n; i++) {
		if (sorted[i] < 0 || sorted[i] >= w->size || (i > 0 && sorted[i] == sorted[i - 1])) {
			int bad = sorted[i];
			free(sorted);
			return log_fail(UNISUM_EINVAL, "unisum_process_set_add: rank %d is %s", bad,
					bad < 0 || bad >= w->size ? "not a rank of this job"
								  : "given twice");
		}
	}
	pthread_mutex_lock(&w->lock);
	for (int i = 0; i < w->npsets; i++) {
		const struct wk_pset *p = &w->psets[i];
		if (p->n == n && memcmp(p->ranks, sorted, (size_t)n * sizeof *sorted) == 0) {
			int id = p->id;
			pthread_mutex_unlock(&w->lock);
			free(sorted);
			return log_fail(UNISUM_EINVAL, "unisum_process_set_add: these ranks are process "
					"set %d already", id);
		}
	}
	struct wk_pset *ps = realloc(w->psets, (size_t)(w->npsets + 1) * sizeof *ps);
	if (ps == NULL) {
		pthread_mutex_unlock(&w->lock);
		free(sorted);
		return UNISUM_ENOMEM;
	}
	w->psets = ps;
	int id = ++w->next_pset;
	w->psets[w->npsets++] = (struct wk_pset){.id = id, .n = n, .ranks = sorted};
	pthread_mutex_unlock(&w->lock);
	return id;
}

int worker_process_set_remove(struct worker *w, int set)
{
	if (wk_require_init(w) != 0)
		return UNISUM_ENOTINIT;
	pthread_mutex_lock(&w->lock);
	int i = 0;
	while (i < w->npsets && w->psets[i].id != set)
		i++;
	if (i == w->npsets) {
		pthread_mutex_unlock(&w->lock);
		return log_fail(UNISUM_EINVAL, "unisum_process_set_remove: no process set %d%s", set,
				set == 0 ? " (0 is the global set, which stays)" : "");
	}
	struct wk_pset p = w->psets[i];
	/* Its tensors go with it; none may have an operation in flight. */
	for (int t = 0; t < w->ntensors; t++) {
		struct wk_tensor *x = w->tensors[t];
		if (x != NULL && x->nranks == p.n && memcmp(x->ranks, p.ranks, (size_t)p.n * sizeof (int)) == 0 &&
		    x->busy) {
			pthread_mutex_unlock(&w->lock);
			return log_fail(UNISUM_EBUSY, "unisum_process_set_remove: tensor '%s' of process "
					"set %d has an operation in flight", x->name, set);
		}
	}
	w->psets[i] = w->psets[--w->npsets];
	int *mine = NULL, nmine = 0;
	for (int t = 0; t < w->ntensors; t++) {
		struct wk_tensor *x = w->tensors[t];
		if (x != NULL && x->nranks == p.n &&
		    memcmp(x->ranks, p.ranks, (size_t)p.n * sizeof (int)) == 0) {
			int *m = realloc(mine, (size_t)(nmine + 1) * sizeof *m);
			if (m != NULL) {
				mine = m;
				mine[nmine++] = t;
			}
		}
	}
	pthread_mutex_unlock(&w->lock);
	int rc = 0;
	for (int k = 0; k < nmine; k++) {
		int r = worker_undeclare(w, mine[k]);
		if (r != 0 && rc == 0)
			rc = r;
	}
	free(mine);
	free(p.ranks);
	return rc;
}

/* Opens this worker's server connections if it has none (it is not its
 * machine's local root): a process set's members each push.  0 or an
 * error (logged). */
static int wk_ensure_conns(struct worker *w)
{
	pthread_mutex_lock(&w->connect_lock);
	int rc = 0;
	if (w->conns == NULL) {
		if (w->nservers == 0) {
			rc = log_fail(UNISUM_ECONFIG, "worker %d: a process set's tensors are summed on the "
				      "servers, and this job has none (UNISUM_NUM_SERVER=0)", w->rank);
		} else {
			rc = wk_connect_servers(w);
			if (rc != 0)
				wk_close_conns(w);
		}
	}
	pthread_mutex_unlock(&w->connect_lock);
	return rc;
}

int wk_rank_rack(struct worker *w, int r)
{
	const struct rdv_node *n = rdv_client_worker(w->rdv, r);
	return n != NULL ? n->rack : -1;
}

int wk_set_rack(struct worker *w, const int *ranks, int n)
{
	/* Boyer-Moore: the only rack that can hold more than half. */
	int cand = -1, votes = 0;
	for (int i = 0; i < n; i++) {
		int r = wk_rank_rack(w, ranks[i]);
		if (votes == 0)
			cand = r;
		votes += r == cand ? 1 : -1;
	}
	int count = 0;
	for (int i = 0; i < n && cand >= 0; i++)
		count += wk_rank_rack(w, ranks[i]) == cand;
	/* All but one at most: a DS-Sync group with its one traveller.  A
	 * set spread wider keeps every server (racks of 5 and 3 on the first
	 * rack's servers alone would send all of the 3's data across). */
	return cand >= 0 && 2 * count > n && count >= n - 1 ? cand : -1;
}

/* The wire name of tensor `name` of the process set of sorted `ranks`
 * (n of them) into wire (len bytes): "set:<n>:<FNV-1a of the ranks>/NAME",
 * whatever the set's id; the size comes first, so the scheduler forgets
 * the tensor once that many workers undeclared it (sched_on_forget).  0,
 * or UNISUM_EINVAL (logged, naming `what`) when it does not fit. */
static int wk_set_wire_name(const int *ranks, int n, const char *name, char *wire, size_t len,
			    const char *what)
{
	uint64_t h = 0xcbf29ce484222325ull;
	for (int k = 0; k < n; k++) {
		h ^= (uint64_t)(uint32_t)ranks[k];
		h *= 0x100000001b3ull;
	}
	int prefix = snprintf(wire, len, "set:%d:%016llx/", n, (unsigned long long)h);
	if ((size_t)snprintf(wire, len, "set:%d:%016llx/%s", n, (unsigned long long)h, name) >= len)
		return log_fail(UNISUM_EINVAL, "%s: the name '%s' is too long for a process set's "
				"tensor (at most %zu characters)", what, name, len - 1 - (size_t)prefix);
	return 0;
}

/* The ranks of process set `set` (a copy, *n of them) for a tensor of
 * it, with its wire name in wire (len bytes); NULL with *rc set. */
static int *wk_pset_for(struct worker *w, int set, const char *name, char *wire, size_t len,
			int *n, int *rc)
{
	pthread_mutex_lock(&w->lock);
	int i = 0;
	while (i < w->npsets && w->psets[i].id != set)
		i++;
	int *ranks = NULL;
	bool member = false;
	if (i < w->npsets) {
		*n = w->psets[i].n;
		ranks = malloc((size_t)*n * sizeof *ranks);
		if (ranks != NULL)
			memcpy(ranks, w->psets[i].ranks, (size_t)*n * sizeof *ranks);
		for (int k = 0; ranks != NULL && k < *n; k++)
			member = member || ranks[k] == w->rank;
	}
	pthread_mutex_unlock(&w->lock);
	if (i == w->npsets) {
		*rc = log_fail(UNISUM_EINVAL, "unisum_declare_in('%s'): worker %d has no process set %d "
			       "(add it with unisum_process_set_add)", name, w->rank, set);
		return NULL;
	}
	if (ranks == NULL) {
		*rc = UNISUM_ENOMEM;
		return NULL;
	}
	if (!member) {
		free(ranks);
		*rc = log_fail(UNISUM_EINVAL, "unisum_declare_in('%s'): worker %d is not in process "
			       "set %d", name, w->rank, set);
		return NULL;
	}
	if (wk_set_wire_name(ranks, *n, name, wire, len, "unisum_declare_in") != 0) {
		free(ranks);
		*rc = UNISUM_EINVAL;
		return NULL;
	}
	*rc = wk_ensure_conns(w);
	if (*rc != 0) {
		free(ranks);
		return NULL;
	}
	return ranks;
}

int worker_declare_in(struct worker *w, int set, const char *name, unisum_dtype dtype,
		      size_t count, const struct rdv_shape *shape, int priority)
{
	if (wk_require_init(w) != 0)
		return UNISUM_ENOTINIT;
	if (name == NULL || name[0] == '\0' || strlen(name) >= sizeof ((struct wk_tensor *)0)->name)
		return log_fail(UNISUM_EINVAL, "unisum_declare: the name must have 1 to 255 characters");
	char wire[sizeof ((struct wk_tensor *)0)->name];
	int *ranks = NULL, nranks = 0;
	if (set != 0) {
		int rc;
		ranks = wk_pset_for(w, set, name, wire, sizeof wire, &nranks, &rc);
		if (ranks == NULL)
			return rc;
		name = wire;
	}
	return wk_declare(w, name, dtype, count, shape, priority, ranks, nranks, WIRE_SYNC_LOCKSTEP,
			  NULL);
}

_Static_assert(COMPRESS_SPEC_MAX < WIRE_SPEC_MAX, "a canonical spec must fit DECLARE's");

int worker_declare_ex(struct worker *w, const char *name, unisum_dtype dtype, size_t count,
		      int priority, const char *compression)
{
	if (wk_require_init(w) != 0)
		return UNISUM_ENOTINIT;
	if (name == NULL || name[0] == '\0' || strlen(name) >= sizeof ((struct wk_tensor *)0)->name)
		return log_fail(UNISUM_EINVAL, "unisum_declare: the name must have 1 to 255 characters");
	struct compress_spec spec = {.kind = COMPRESS_NONE};
	char err[256];
	if (compression != NULL && compression[0] != '\0' && strcmp(compression, "none") != 0 &&
	    compress_spec_parse(compression, &spec, err, sizeof err) != 0)
		return log_fail(UNISUM_EINVAL, "unisum_declare_ex('%s'): compression '%s': %s", name,
				compression, err);
	if (spec.kind != COMPRESS_NONE && dtype != UNISUM_FLOAT32)
		return log_fail(UNISUM_EINVAL, "unisum_declare_ex('%s'): compression '%s' takes "
				"float32 tensors, not %s", name, compression, unisum_dtype_name(dtype));
	size_t part = (size_t)(w->cfg.partition_bytes / 4);
	if (spec.kind != COMPRESS_NONE &&
	    compress_codec_of(spec.kind)->bytes(&spec, part) > WIRE_MAX_DATA_PAYLOAD)
		return log_fail(UNISUM_EINVAL, "unisum_declare_ex('%s'): compression '%s' encodes a "
				"partition of UNISUM_PARTITION_BYTES=%llu in more than the 1 GiB a message "
				"carries", name, compression,
				(unsigned long long)w->cfg.partition_bytes);
	if (spec.kind != COMPRESS_NONE && (uint64_t)count * 4 < w->cfg.min_compress_bytes) {
		/* As BytePS: small tensors cost more to compress than to send. */
		LOG_DEBUG("tensor '%s' (%zu bytes) is below UNISUM_MIN_COMPRESS_BYTES=%llu: "
			  "uncompressed", name, count * 4,
			  (unsigned long long)w->cfg.min_compress_bytes);
		spec.kind = COMPRESS_NONE;
	}
	return wk_declare(w, name, dtype, count, NULL, priority, NULL, 0, WIRE_SYNC_LOCKSTEP,
			  spec.kind != COMPRESS_NONE ? &spec : NULL);
}

int worker_declare_sync(struct worker *w, const char *name, unisum_dtype dtype, size_t count,
			int priority, const char *sync)
{
	if (wk_require_init(w) != 0)
		return UNISUM_ENOTINIT;
	if (sync == NULL)
		sync = w->cfg.sync;
	uint32_t mode;
	int g;
	if (wire_sync_parse(sync, &mode, &g) != 0)
		return log_fail(UNISUM_EINVAL, "unisum_declare_sync('%s'): unknown sync mode '%s' "
				"(sync, async, ssp:S with S a staleness bound, or dssync:G with G a group "
				"size)", name != NULL ? name : "", sync);
	if (g > 0) {
		/* The tensor itself is global and lock-step: the global steps
		 * run on it; the groups' steps on their own set tensors. */
		int id = worker_declare(w, name, dtype, count, priority);
		if (id < 0)
			return id;
		pthread_mutex_lock(&w->lock);
		struct wk_tensor *t = w->tensors[id];
		int rc = t->dssync_g == 0 && t->dssync_step > 0 ? UNISUM_EMISMATCH : id;
		if (t->dssync_g != 0 && t->dssync_g != g)
			rc = UNISUM_EMISMATCH;
		t->dssync_g = rc == id ? g : t->dssync_g;
		t->dssync_every = (uint32_t)w->cfg.dssync_every;
		pthread_mutex_unlock(&w->lock);
		if (rc < 0)
			return log_fail(rc, "unisum_declare_sync('%s'): declared already in another "
					"mode", name);
		return id;
	}
	if (!wire_sync_held(mode))
		return worker_declare(w, name, dtype, count, priority);
	if (name == NULL || name[0] == '\0' || strlen(name) >= sizeof ((struct wk_tensor *)0)->name)
		return log_fail(UNISUM_EINVAL, "unisum_declare: the name must have 1 to 255 characters");
	/* Every rank is its own contributor, as in a process set of all. */
	int *ranks = malloc((size_t)w->size * sizeof *ranks);
	if (ranks == NULL)
		return UNISUM_ENOMEM;
	for (int r = 0; r < w->size; r++)
		ranks[r] = r;
	int rc = wk_ensure_conns(w);
	if (rc != 0) {
		free(ranks);
		return rc;
	}
	return wk_declare(w, name, dtype, count, NULL, priority, ranks, w->size, mode, NULL);
}

/* Declares tensor `name` of the process set `ranks` (NULL: the global
 * set), which it takes over, in sync mode `sync`. */
static int wk_declare(struct worker *w, const char *name, unisum_dtype dtype, size_t count,
		      const struct rdv_shape *shape, int priority, int *ranks, int nranks,
		      uint32_t sync, const struct compress_spec *comp)
{
	size_t esize = unisum_dtype_size(dtype);
	int rc = -1;
	char comp_text[WIRE_SPEC_MAX] = "";
	if (comp != NULL)
		compress_spec_format(comp, comp_text, sizeof comp_text);
	if (esize == 0)
		rc = log_fail(UNISUM_EINVAL, "unisum_declare('%s'): unknown dtype %d", name, (int)dtype);
	else if (esize > w->cfg.partition_bytes)
		rc = log_fail(UNISUM_ECONFIG, "UNISUM_PARTITION_BYTES=%llu is smaller than one %s element",
			      (unsigned long long)w->cfg.partition_bytes, unisum_dtype_name(dtype));
	else
		rc = wk_tensor_known(w, name, dtype, count, sync, comp_text);
	struct wk_tensor *t = rc == -1 ? calloc(1, sizeof *t) : NULL;
	if (t == NULL) {
		free(ranks);
		return rc == -1 ? UNISUM_ENOMEM : rc;
	}
	t->ranks = ranks;
	t->nranks = nranks;
	t->sync = sync;
	if (comp != NULL)
		t->comp = *comp;
	memcpy(t->comp_text, comp_text, sizeof comp_text);
	t->w = w;
	snprintf(t->name, sizeof t->name, "%s", name);
	t->dtype = dtype;
	t->count = count;
	t->esize = esize;
	t->priority = priority;
	if (shape != NULL)
		t->shape = *shape;
	t->cuts = calloc(1, sizeof *t->cuts);
	rc = t->cuts == NULL ? UNISUM_ENOMEM
			     : wk_cut(t, name, w->cfg.partition_bytes, NULL, &t->cuts[0]);
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
		wk_kept_free(&t->cuts[0]);
		free(t->cuts[0].parts);
		free(t->cuts[0].servers);
	}
	free(t->cuts);
	free(t->ranks);
	free(t);
	return rc;
}

void worker_trace_names(struct worker *w)
{
	pthread_mutex_lock(&w->lock);
	for (int i = 0; i < w->ntensors; i++) {
		const struct wk_tensor *t = w->tensors[i];
		if (t != NULL && t->ncuts > 0)
			trace_name_tensor(i, t->name, t->cuts[t->ncuts - 1].nparts);
	}
	pthread_mutex_unlock(&w->lock);
}

/* unisum_undeclare; with `retire`, the undeclare of a dssync group's
 * tensor after its step (wk_dssync_retire): nothing, quietly, unless it
 * is still to go and nothing of it is in flight (its group came back
 * meanwhile: the release of that step retires it, if it is to go then). */
static int wk_undeclare(struct worker *w, int tensor, bool retire)
{
	pthread_mutex_lock(&w->lock);
	struct wk_tensor *t = tensor >= 0 && tensor < w->ntensors ? w->tensors[tensor] : NULL;
	int rc = 0;
	if (retire) {
		bool held = t == NULL || !t->dssync_retire || t->busy;
		for (int i = 0; i < w->nops && !held; i++)
			held = w->ops[i]->t == t;
		if (held)
			goto out_unlock;
	}
	if (t == NULL) {
		rc = log_fail(UNISUM_EINVAL, "unisum_undeclare: worker %d has no tensor id %d (never "
			      "declared, or undeclared already)", w->rank, tensor);
		goto out_unlock;
	}
	bool held = t->busy;
	for (int i = 0; i < w->nops && !held; i++)
		held = w->ops[i]->t == t;
	if (held) {
		rc = log_fail(UNISUM_EBUSY, "unisum_undeclare: worker %d, tensor '%s' has an operation "
			      "not yet waited for; wait for its handle first", w->rank, t->name);
		goto out_unlock;
	}
	w->tensors[tensor] = NULL;
	if (!t->dssync_group)	/* never announced: a joined worker runs no group */
		wk_note_retired(w, t->name, t->life, t->round);
	wk_keep_gone(w, t);
	pthread_mutex_unlock(&w->lock);
	/* Each cut is its own declaration: every place that holds it lets
	 * go.  Nothing is in flight, so the servers' replies are all here. */
	wk_retire_cuts(t, NULL);
	for (int c = 0; c < t->ncuts; c++) {
		if (w->local && t->nranks == 0)
			local_forget(w->lc, t->cuts[c].key);
		rdv_client_forget(w->rdv, t->cuts[c].key);
	}
	wk_tensor_free(t);
	return 0;

out_unlock:
	pthread_mutex_unlock(&w->lock);
	return rc;
}

int worker_undeclare(struct worker *w, int tensor)
{
	if (wk_require_init(w) != 0)
		return UNISUM_ENOTINIT;
	return wk_undeclare(w, tensor, false);
}

/* ---- operations -------------------------------------------------------------- */

/* Files a new operation of tensor `tensor` (w->lock held): *opp and its
 * handle, or an error (logged). */
static int wk_op_file(struct worker *w, int tensor, struct wk_op *op)
{
	if (w->failed != 0)
		return log_fail(w->failed, "worker %d: the job has failed: %s", w->rank, w->failed_why);
	if (tensor < 0 || tensor >= w->ntensors || w->tensors[tensor] == NULL)
		return log_fail(UNISUM_EINVAL, "worker %d: tensor id %d was never declared, or was "
				"undeclared; call unisum_declare() first", w->rank, tensor);
	struct wk_tensor *t = w->tensors[tensor];
	if (t->busy)
		return log_fail(UNISUM_EBUSY, "worker %d: tensor '%s' already has a push_pull in flight; "
				"wait for it before starting the next", w->rank, t->name);
	if (wire_sync_held(t->sync) &&
	    (op->wire_op != WIRE_OP(WIRE_OP_SUM, 0) || op->flags != 0 || op->push_spans != NULL ||
	     op->direct != NULL || op->in == NULL))
		return log_fail(UNISUM_EINVAL, "worker %d: tensor '%s' is %s: only push_pull with "
				"flags 0 runs on it (the first sets its value, from rank 0; each later "
				"one adds a delta)", w->rank, t->name,
				WIRE_SYNC_KIND(t->sync) == WIRE_SYNC_SSP ? "SSP" : "async");
	if (t->comp.kind != COMPRESS_NONE &&
	    ((WIRE_OP_KIND(op->wire_op) != WIRE_OP_SUM &&
	      WIRE_OP_KIND(op->wire_op) != WIRE_OP_AVERAGE) ||
	     op->push_spans != NULL || op->direct != NULL || op->in == NULL))
		return log_fail(UNISUM_EINVAL, "worker %d: tensor '%s' is compressed (%s): only "
				"push_pull, a sum or an average, runs on it", w->rank, t->name,
				t->comp_text);
	if (w->join_seen && !w->joined && t->nranks == 0 && !wk_reduces(op->wire_op))
		return log_fail(UNISUM_EINVAL, "worker %d: tensor '%s': a rank has joined "
				"(unisum_join), and until every rank has, only push_pull runs: "
				"a broadcast or gathering collective needs every rank's data",
				w->rank, t->name);
	if (w->nops == w->capops) {
		int cap = w->capops ? w->capops * 2 : 64;
		struct wk_op **no = realloc(w->ops, (size_t)cap * sizeof *no);
		if (no == NULL)
			return UNISUM_ENOMEM;
		w->ops = no;
		w->capops = cap;
	}
	op->w = w;
	op->handle = ++w->next_handle;
	op->t = t;
	op->round = t->round++;
	t->busy = true;
	op->traced = trace_wants(op->round);
	op->t_start = op->traced ? trace_now_us() : 0;
	w->ops[w->nops++] = op;
	return 0;
}

/* Starts operation `tmpl` (its buffers, flags, collective, and for the
 * gathering collectives its spans, scratch and final copy, which become
 * the operation's): `in` NULL means "contribute zeros" (broadcast from
 * another root).  Every worker of the round must start the same
 * collective, or the round fails on all of them.  Never waits on the
 * network: under autotune an operation whose cut is not ready goes to
 * wk_tune_main. */
static int wk_start(struct worker *w, int tensor, const struct wk_op *tmpl, unisum_handle *h)
{
	struct wk_op *op = calloc(1, sizeof *op);
	if (op == NULL) {
		wk_op_free_owned(tmpl);
		return UNISUM_ENOMEM;
	}
	*op = *tmpl;
	pthread_mutex_lock(&w->lock);
	int rc = wk_op_file(w, tensor, op);
	if (rc == 0)
		*h = op->handle;
	/* A rank has joined: it contributes zeros once told (join.c). */
	struct rdv_announce announce;
	bool announcing = rc == 0 && w->join_seen && !w->joined && op->t->nranks == 0;
	if (announcing)
		wk_announce_fill(op, &announce);
	pthread_mutex_unlock(&w->lock);
	if (rc != 0) {
		wk_op_free(op);
		return rc;
	}
	/* Only now: a refused call leaves `out` alone (it may be another
	 * operation's, in flight). */
	if (op->own_bytes > 0 && !op->deferred)
		memmove(op->own_to, op->own_from, op->own_bytes);
	if (announcing)
		rdv_client_announce(w->rdv, &announce);

	/* The cut of this round: the declared one, or autotune's for its
	 * epoch, or a gathering collective's homed cut. */
	const struct wk_layout *L = &op->t->cuts[0];
	if (op->segs.n > 0) {
		L = wk_homed_cut(op->t, &op->segs, &rc);
		if (L == NULL) {
			wk_op_fail(op, rc, log_last_error());
			return 0;
		}
	} else if (w->cfg.autotune && op->t->nranks == 0 && op->t->comp.kind == COMPRESS_NONE) {
		/* A process set's tensors keep their declared cut: autotune
		 * settles the global set's, which every rank runs.  So do
		 * compressed tensors: their momentum and error feedback live
		 * per partition of the cut, on the workers and the servers. */
		if (w->rank == 0)
			tune_saw_round(w->tuner, op->round);
		L = wk_tuned_cut(op, false, &rc);
		if (L == NULL && rc == 0 && !w->tune_started)
			L = wk_tuned_cut(op, true, &rc);	/* no thread to wait on */
		if (L == NULL && rc != 0) {
			wk_op_fail(op, rc, log_last_error());
			return 0;
		}
		if (L == NULL) {
			pthread_mutex_lock(&w->lock);
			if (w->tune_tail != NULL)
				w->tune_tail->tune_next = op;
			else
				w->tune_head = op;
			w->tune_tail = op;
			pthread_cond_signal(&w->tune_cond);
			pthread_mutex_unlock(&w->lock);
			return 0;
		}
	}
	wk_launch(op, L);
	return 0;
}

#define WK_OP_FLAGS (UNISUM_MIN | UNISUM_MAX | UNISUM_PRODUCT)

/* ---- divide and shuffle ------------------------------------------------ */

static uint64_t wk_splitmix(uint64_t *x)
{
	uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* Shuffles a[0..n) with the generator x (Fisher-Yates). */
static void wk_shuffle(int *a, int n, uint64_t *x)
{
	for (int i = n - 1; i > 0; i--) {
		int j = (int)(wk_splitmix(x) % (uint64_t)(i + 1));
		int t = a[i];
		a[i] = a[j];
		a[j] = t;
	}
}

bool wk_dssync_crosses(const struct wk_dssync_topo *topo, uint64_t step)
{
	return topo == NULL || topo->rack == NULL || (topo->cross_every > 0 &&
						     (step + 1) % topo->cross_every == 0);
}

/* Within racks: each rack's ranks (racks by id, ranks in order) shuffled
 * on their own and cut in runs of g: gid[rank], and for each group its
 * rack, its place among its rack's groups and its first member (in the
 * shuffled order).  Returns the number of groups. */
static int wk_dssync_by_rack(const struct wk_dssync_topo *topo, int n, int g, uint64_t *x,
			     int *order, int *gid, int *grack, int *gplace, int *gfirst)
{
	int base = 0, done = 0, last = -1;
	while (done < n) {
		int next = -1;	/* the smallest rack id above `last` */
		for (int i = 0; i < n; i++)
			if (topo->rack[i] > last && (next < 0 || topo->rack[i] < next))
				next = topo->rack[i];
		int m = 0;
		for (int i = 0; i < n; i++)
			if (topo->rack[i] == next)
				order[m++] = i;
		wk_shuffle(order, m, x);
		for (int i = 0; i < m; i++) {
			int k = base + i / g;
			gid[order[i]] = k;
			if (i % g == 0) {
				grack[k] = next;
				gplace[k] = i / g;
				gfirst[k] = order[i];
			}
		}
		base += (m + g - 1) / g;
		done += m;
		last = next;
	}
	return base;
}

int wk_dssync_group(uint64_t seed, uint64_t step, int n, int g, int rank,
		    const struct wk_dssync_topo *topo, int *ranks)
{
	size_t each = (size_t)(n > 0 ? n : 1);
	int *order = malloc(6 * each * sizeof *order);
	if (order == NULL)
		return UNISUM_ENOMEM;
	int *gid = order + each, *grack = gid + each, *gplace = grack + each,
	    *gfirst = gplace + each, *ring = gfirst + each;
	uint64_t x = seed ^ (step * 0xd1b54a32d192ed03ull);
	bool crosses = wk_dssync_crosses(topo, step);
	bool travel = false;
	int ng = 0, left = 0;	/* groups, travelling groups */
	if (topo != NULL && topo->rack != NULL) {
		ng = wk_dssync_by_rack(topo, n, g, &x, order, gid, grack, gplace, gfirst);
		/* Across racks, one member of each group travels to the next
		 * group in an order that alternates racks while it can (by
		 * place in their rack, then rack): every group keeps all but
		 * one of its members and, with racks of as many groups, takes
		 * one from another rack, so its sum crosses the uplink once
		 * each way (placed on its rack, wk_set_rack), where a shuffle
		 * of everyone makes every group span the racks.  A group of
		 * one member stays as it is; with fewer than two groups to
		 * travel between, or all of them in one rack, the shuffle of
		 * everyone. */
		int *size = ring;
		memset(size, 0, (size_t)ng * sizeof *size);
		for (int i = 0; i < n; i++)
			size[gid[i]]++;
		int first = -1;
		for (int k = 0; k < ng; k++) {
			if (size[k] < 2) {
				gplace[k] = -1;		/* not travelling */
				continue;
			}
			left++;
			if (first < 0)
				first = k;
			else if (grack[k] != grack[first])
				travel = crosses;
		}
	}
	if (travel) {
		/* ring[0..m): the travelling groups by (place in their rack,
		 * rack); the groups are numbered by rack, then place. */
		int m = 0;
		for (int place = 0; m < left; place++)
			for (int k = 0; k < ng; k++)
				if (gplace[k] == place)
					ring[m++] = k;
		for (int i = m - 1; i > 0; i--)
			gid[gfirst[ring[i - 1]]] = ring[i];
		gid[gfirst[ring[m - 1]]] = ring[0];
	} else if (crosses) {
		/* Every rank with every other: one shuffle, cut in runs of g. */
		x = seed ^ (step * 0xd1b54a32d192ed03ull);
		for (int i = 0; i < n; i++)
			order[i] = i;
		wk_shuffle(order, n, &x);
		for (int i = 0; i < n; i++)
			gid[order[i]] = i / g;
	}
	int m = 0;
	for (int i = 0; i < n; i++)	/* ascending: the set's ranks are sorted */
		if (gid[i] == gid[rank])
			ranks[m++] = i;
	free(order);
	return m;
}

/* The racks of every rank (UNISUM_RACK, from the scheduler's address
 * book): *topo, its rack NULL when no worker set one (the scheduler made
 * sure every worker set one, or none did). */
static int wk_dssync_topology(struct worker *w, struct wk_dssync_topo *topo)
{
	pthread_mutex_lock(&w->lock);
	if (!w->racks_known) {
		int *racks = malloc((size_t)w->size * sizeof *racks);
		if (racks == NULL) {
			pthread_mutex_unlock(&w->lock);
			return UNISUM_ENOMEM;
		}
		for (int r = 0; r < w->size; r++)
			racks[r] = wk_rank_rack(w, r);
		if (racks[0] < 0) {
			free(racks);
			racks = NULL;
		}
		w->racks = racks;
		w->racks_known = true;
	}
	topo->rack = w->racks;
	pthread_mutex_unlock(&w->lock);
	topo->cross_every = (uint32_t)w->cfg.dssync_cross_every;
	return 0;
}

/* The live set tensor of dssync tensor `tensor`'s group ranks[0..m), or
 * -1 (w->lock held).  Forgets the ids of group tensors that are gone. */
static int wk_dssync_live(struct worker *w, int tensor, const int *ranks, int m)
{
	struct wk_tensor *base = tensor >= 0 && tensor < w->ntensors ? w->tensors[tensor] : NULL;
	for (int i = 0; base != NULL && i < base->dssync_nlive;) {
		const struct wk_dssync_life *l = &base->dssync_live[i];
		const struct wk_tensor *gt = l->id < w->ntensors ? w->tensors[l->id] : NULL;
		if (gt == NULL || wk_name_hash(gt->name) != l->name_hash) {
			base->dssync_live[i] = base->dssync_live[--base->dssync_nlive];
			continue;	/* undeclared (its id may serve another name now) */
		}
		if (gt->nranks == m && memcmp(gt->ranks, ranks, (size_t)m * sizeof *ranks) == 0)
			return l->id;
		i++;
	}
	return -1;
}

/* Files group tensor gt under its dssync tensor base (w->lock held). */
static int wk_dssync_remember(struct wk_tensor *base, const struct wk_tensor *gt)
{
	if (base->dssync_nlive == base->dssync_cap) {
		int cap = base->dssync_cap ? 2 * base->dssync_cap : 8;
		struct wk_dssync_life *nl = realloc(base->dssync_live, (size_t)cap * sizeof *nl);
		if (nl == NULL)
			return UNISUM_ENOMEM;
		base->dssync_live = nl;
		base->dssync_cap = cap;
	}
	base->dssync_live[base->dssync_nlive++] =
		(struct wk_dssync_life){.id = gt->index, .name_hash = wk_name_hash(gt->name)};
	return 0;
}

/* The tensor a push_pull on dssync tensor `tensor` runs on: its group's
 * set tensor at this step (declared on first use: a scheduler round
 * trip), or itself on a global step.  0 with *target, or an error. */
static int wk_dssync_target(struct worker *w, int tensor, int *target, uint64_t *taken)
{
	*target = tensor;
	*taken = UINT64_MAX;
	pthread_mutex_lock(&w->lock);
	struct wk_tensor *t = tensor >= 0 && tensor < w->ntensors ? w->tensors[tensor] : NULL;
	if (t == NULL || t->dssync_g == 0 || w->joined) {
		/* A joined worker runs exactly what was announced to it. */
		pthread_mutex_unlock(&w->lock);
		return 0;	/* wk_start explains a bad id */
	}
	/* Taken now, given back if the operation does not start (the group
	 * of every later step would differ from the other ranks' else). */
	uint64_t step = *taken = t->dssync_step++;
	int g = t->dssync_g;
	uint32_t every = t->dssync_every;
	char name[WK_NAME_MAX];
	snprintf(name, sizeof name, "%s", t->name);
	unisum_dtype dtype = t->dtype;
	size_t count = (size_t)t->count;
	int priority = t->priority;
	pthread_mutex_unlock(&w->lock);
	if (every > 0 && (step + 1) % every == 0)
		return 0;	/* the global average */
	int *ranks = malloc((size_t)w->size * sizeof *ranks);
	if (ranks == NULL)
		return UNISUM_ENOMEM;
	char job[128];
	config_job_id(&w->cfg, job, sizeof job);
	struct wk_dssync_topo topo;
	int rc = wk_dssync_topology(w, &topo);
	if (rc != 0) {
		free(ranks);
		return rc;
	}
	uint64_t seed = wk_name_hash(job);
	int m = wk_dssync_group(seed, step, w->size, g, w->rank, &topo, ranks);
	if (m < 0) {
		free(ranks);
		return m;
	}
	/* Keep the group's set tensor while the group comes back within
	 * UNISUM_DSSYNC_KEEP steps, else undeclare it once this step is released.
	 * Every member decides alike: groups partition the ranks, so when the
	 * group comes back for one member it does for all.  A rank so holds at
	 * most UNISUM_DSSYNC_KEEP + 1 of them per tensor. */
	bool keep = false;
	int *next = malloc((size_t)w->size * sizeof *next);
	if (next == NULL) {
		free(ranks);
		return UNISUM_ENOMEM;
	}
	for (uint64_t s = step + 1; !keep && s <= step + (uint64_t)w->cfg.dssync_keep; s++) {
		if (every > 0 && (s + 1) % every == 0)
			continue;	/* global */
		int m2 = wk_dssync_group(seed, s, w->size, g, w->rank, &topo, next);
		keep = m2 == m && memcmp(next, ranks, (size_t)m * sizeof *ranks) == 0;
	}
	free(next);
	/* The group's set tensor while it lives; else a new one, whose name
	 * carries the step it starts at ("set:<m>:<hash>/NAME@<step>"), the
	 * same on every member: a group that comes back after its tensor went
	 * gets a new name, so no declaration ever meets the undeclares of the
	 * last one (which the scheduler and servers may still be counting). */
	pthread_mutex_lock(&w->lock);
	int id = wk_dssync_live(w, tensor, ranks, m);
	if (id >= 0)
		w->tensors[id]->dssync_retire = !keep;
	pthread_mutex_unlock(&w->lock);
	if (id >= 0) {
		free(ranks);
		*target = id;
		return 0;
	}
	char wire[WK_NAME_MAX];
	if (wk_set_wire_name(ranks, m, name, wire, sizeof wire, "unisum_push_pull (dssync)") != 0 ||
	    (size_t)snprintf(wire + strlen(wire), sizeof wire - strlen(wire), "@%llu",
			     (unsigned long long)step) >= sizeof wire - strlen(wire)) {
		free(ranks);
		return log_fail(UNISUM_EINVAL, "unisum_push_pull (dssync): the name of '%s''s group "
				"tensor is longer than %d characters", name, WK_NAME_MAX - 1);
	}
	rc = wk_ensure_conns(w);
	if (rc != 0) {
		free(ranks);
		return rc;
	}
	id = wk_declare(w, wire, dtype, count, NULL, priority, ranks, m,
			WIRE_SYNC_LOCKSTEP, NULL);	/* takes ranks */
	if (id < 0)
		return id;
	pthread_mutex_lock(&w->lock);
	struct wk_tensor *gt = w->tensors[id], *base = w->tensors[tensor];
	if (gt != NULL) {
		gt->dssync_group = true;
		gt->dssync_retire = !keep;
	}
	rc = base != NULL && gt != NULL ? wk_dssync_remember(base, gt) : 0;
	pthread_mutex_unlock(&w->lock);
	if (rc != 0)
		return rc;
	*target = id;
	return 0;
}

int worker_push_pull_async(struct worker *w, int tensor, const void *in, void *out, int flags,
			   unisum_handle *h)
{
	if (wk_require_init(w) != 0)
		return UNISUM_ENOTINIT;
	int reduce = flags & (UNISUM_AVERAGE | WK_OP_FLAGS);
	if (in == NULL || out == NULL || h == NULL || (flags & ~(UNISUM_AVERAGE | WK_OP_FLAGS)) != 0 ||
	    (reduce & (reduce - 1)) != 0)
		return log_fail(UNISUM_EINVAL, "unisum_push_pull: in, out and the handle must not be "
				"NULL, and flags may hold one of UNISUM_AVERAGE, UNISUM_MIN, UNISUM_MAX "
				"and UNISUM_PRODUCT (worker %d, tensor %d, flags 0x%x)", w->rank, tensor,
				flags);
	uint32_t kind = flags & UNISUM_AVERAGE ? WIRE_OP_AVERAGE
			: flags & UNISUM_MIN   ? WIRE_OP_MIN
			: flags & UNISUM_MAX   ? WIRE_OP_MAX
			: flags & UNISUM_PRODUCT ? WIRE_OP_PRODUCT
					       : WIRE_OP_SUM;
	int target;
	uint64_t step;
	int rc = wk_dssync_target(w, tensor, &target, &step);
	struct wk_op tmpl = {.flags = flags & UNISUM_AVERAGE, .in = in, .out = out,
			     .wire_op = WIRE_OP(kind, 0)};
	if (rc == 0)
		rc = wk_start(w, target, &tmpl, h);
	if (rc != 0 && step != UINT64_MAX) {
		pthread_mutex_lock(&w->lock);
		struct wk_tensor *t = w->tensors[tensor];
		if (t != NULL && t->dssync_step == step + 1)
			t->dssync_step = step;
		pthread_mutex_unlock(&w->lock);
	}
	return rc;
}

int worker_broadcast_async(struct worker *w, int tensor, void *buf, int root_rank,
			   unisum_handle *h)
{
	if (wk_require_init(w) != 0)
		return UNISUM_ENOTINIT;
	if (buf == NULL || h == NULL || root_rank < 0 || root_rank >= w->size)
		return log_fail(UNISUM_EINVAL, "unisum_broadcast: buf and the handle must not be NULL "
				"and root_rank %d must be in [0, %d) (worker %d, tensor %d)", root_rank,
				w->size, w->rank, tensor);
	pthread_mutex_lock(&w->lock);
	const struct wk_tensor *t = tensor >= 0 && tensor < w->ntensors ? w->tensors[tensor] : NULL;
	bool member = t == NULL || t->nranks == 0;
	for (int i = 0; !member && i < t->nranks; i++)
		member = t->ranks[i] == root_rank;
	pthread_mutex_unlock(&w->lock);
	if (!member)
		return log_fail(UNISUM_EINVAL, "unisum_broadcast: root_rank %d is not in the process set "
				"of tensor %d (worker %d)", root_rank, tensor, w->rank);
	struct wk_op tmpl = {.in = w->rank == root_rank ? buf : NULL, .out = buf,
			     .wire_op = WIRE_OP(WIRE_OP_BROADCAST, (uint32_t)root_rank)};
	return wk_start(w, tensor, &tmpl, h);
}

/* ---- allgather, reduce-scatter, alltoall ---------------------------------- */

/*
 * They run on the same rounds as a push_pull, with two differences per
 * partition (wk_job_sets): a machine pushes ZERO (nothing) for partitions
 * holding none of its elements, and pulls with SKIP (nothing comes back)
 * those holding none of the elements it wants.  Allgather and alltoall
 * are folded with a bitwise OR (each rank's buffer is zero outside its own
 * elements, so the OR is the concatenation, bit for bit, whatever the
 * dtype); reduce-scatter is a sum.  The layout (every rank's counts) is
 * hashed into the collective's root field, so ranks that pass different
 * counts fail like ranks that call different collectives.
 */

/* The tensor's element count and size (w->lock taken here), or an error. */
static int wk_tensor_shape(struct worker *w, int tensor, uint64_t *count, size_t *esize,
			   const char *what)
{
	int rc = 0;
	pthread_mutex_lock(&w->lock);
	if (tensor < 0 || tensor >= w->ntensors || w->tensors[tensor] == NULL) {
		rc = log_fail(UNISUM_EINVAL, "%s: tensor id %d was never declared, or was undeclared "
			      "(worker %d)", what, tensor, w->rank);
	} else if (wire_sync_held(w->tensors[tensor]->sync)) {
		rc = log_fail(UNISUM_EINVAL, "%s: tensor '%s' is async: only push_pull with flags 0 "
			      "runs on it (worker %d)", what, w->tensors[tensor]->name, w->rank);
	} else if (w->tensors[tensor]->nranks > 0) {
		rc = log_fail(UNISUM_EINVAL, "%s: tensor '%s' belongs to a process set; the gathering "
			      "collectives of the C API run on the global set (worker %d)", what,
			      w->tensors[tensor]->name, w->rank);
	} else {
		*count = w->tensors[tensor]->count;
		*esize = w->tensors[tensor]->esize;
	}
	pthread_mutex_unlock(&w->lock);
	return rc;
}

/* 24 bits of FNV-1a over the counts: the layout in the collective. */
static uint32_t wk_layout_hash(const uint64_t *counts, size_t n)
{
	uint64_t x = 0xcbf29ce484222325ull;
	for (size_t i = 0; i < n; i++) {
		for (int b = 0; b < 8; b++) {
			x ^= (counts[i] >> (8 * b)) & 0xff;
			x *= 0x100000001b3ull;
		}
	}
	return (uint32_t)((x ^ (x >> 24) ^ (x >> 48)) & WIRE_OP_MAX_ROOT);
}

/* Checks the arguments every gathering collective shares and that the
 * counts (n of them) add up to the tensor: *total, *esize. */
static int wk_gather_args(struct worker *w, int tensor, const void *in, const void *out,
			  const uint64_t *counts, size_t n, unisum_handle *h, const char *what,
			  uint64_t *total, size_t *esize)
{
	if (wk_require_init(w) != 0)
		return UNISUM_ENOTINIT;
	if (out == NULL || counts == NULL || h == NULL || in == NULL)
		return log_fail(UNISUM_EINVAL, "%s: in, out, counts and the handle must not be NULL "
				"(worker %d, tensor %d)", what, w->rank, tensor);
	uint64_t count = 0;
	int rc = wk_tensor_shape(w, tensor, &count, esize, what);
	if (rc != 0)
		return rc;
	uint64_t sum = 0;
	for (size_t i = 0; i < n; i++) {
		if (counts[i] > count || sum + counts[i] > count)
			sum = count + 1;
		else
			sum += counts[i];
	}
	if (sum != count)
		return log_fail(UNISUM_EINVAL, "%s: the counts add up to %s%llu elements, but the tensor "
				"was declared with %llu (worker %d, tensor %d)", what,
				sum > count ? "more than " : "", (unsigned long long)(sum > count ? count : sum),
				(unsigned long long)count, w->rank, tensor);
	*total = count;
	return 0;
}

/* The machine of this rank covers ranks [m * L, min(m * L + L, size)). */
static void wk_machine_ranks(const struct worker *w, int *first, int *end)
{
	int L = w->cfg.local_size > 0 ? w->cfg.local_size : 1;
	*first = w->rank / L * L;
	*end = *first + L < w->size ? *first + L : w->size;
}

/* The segments of a gathering collective (wk_segs): n of them, segment i
 * counts[i] elements of rank ranks[i] (NULL: rank i), owned by its
 * machine.  0 or UNISUM_ENOMEM. */
static int wk_segs_set(const struct worker *w, struct wk_segs *sg, uint32_t n,
		       const uint64_t *counts, const int *ranks, uint64_t pbytes)
{
	int L = w->cfg.local_size > 0 ? w->cfg.local_size : 1;
	sg->counts = malloc((n ? n : 1) * sizeof *sg->counts);
	sg->owners = malloc((n ? n : 1) * sizeof *sg->owners);
	if (sg->counts == NULL || sg->owners == NULL) {
		free(sg->counts);
		free(sg->owners);
		*sg = (struct wk_segs){0};
		return UNISUM_ENOMEM;
	}
	uint64_t x = 0xcbf29ce484222325ull;
	for (uint32_t i = 0; i <= n; i++) {	/* the segments, then pbytes */
		if (i < n) {
			sg->counts[i] = counts[i];
			sg->owners[i] = (uint32_t)((ranks != NULL ? ranks[i] : (int)i) / L);
		}
		uint64_t v[2] = {i < n ? sg->counts[i] : pbytes, i < n ? sg->owners[i] : 0};
		for (int k = 0; k < 2; k++)
			for (int b = 0; b < 8; b++) {
				x ^= (v[k] >> (8 * b)) & 0xff;
				x *= 0x100000001b3ull;
			}
	}
	sg->n = n;
	sg->pbytes = pbytes;
	sg->hash = x ? x : 1;
	return 0;
}

/* A span list of one span, or NULL when out of memory. */
static struct wk_span *wk_one_span(uint64_t lo, uint64_t hi, int *n)
{
	struct wk_span *sp = malloc(sizeof *sp);
	if (sp != NULL) {
		sp->lo = lo;
		sp->hi = hi;
	}
	*n = 1;
	return sp;
}

static int wk_find_op(const struct worker *w, unisum_handle h);

/* The partition size of an allgather's homed cut on one worker per
 * machine, whose pulls go in ring phases (wk_phases_plan), or 0 for no
 * phases (the tensor's partition size).  A phase's PULLs go once the
 * phase before has one partition left, so a phase should span several:
 * partitions of WK_PHASE_BYTES (or UNISUM_PARTITION_BYTES when smaller),
 * when the largest rank's rows make at most WK_PHASE_MOST of them.  On
 * the emulated cluster (bench/README.md) such phases took 3.5-4% off
 * allgathers of 1 to 4 MiB a rank, and cost 1-2% at 16 MiB, where the
 * ranks' phases drift apart.  Fewer than 3 ranks have one phase.  By
 * default (UNISUM_ALLGATHER_PHASES=-1) only when the servers are on 3
 * hosts or more: on one host there are no links to spare, and the
 * smaller partitions and the waits cost 15-20% (loopback, 4 workers).
 * Every rank computes the same from the same counts and address book. */
#define WK_PHASE_BYTES (256u << 10)
#define WK_PHASE_MOST 16
static uint64_t wk_phase_pbytes(const struct worker *w, const uint64_t *counts, size_t n,
				size_t es)
{
	int on = w->cfg.allgather_phases;
	if (n < 3 || on == 0 || (on < 0 && w->server_hosts < 3))
		return 0;
	uint64_t piece = w->cfg.partition_bytes < WK_PHASE_BYTES ? w->cfg.partition_bytes
								  : WK_PHASE_BYTES;
	uint64_t most = 0;
	for (size_t r = 0; r < n; r++)
		most = counts[r] > most ? counts[r] : most;
	return most * es <= WK_PHASE_MOST * piece ? piece : 0;
}

/* An allgather, or (`deferred`: unisum_allgather_begin, `in` NULL) one
 * whose own rows come later (worker_allgather_supply). */
static int wk_allgather(struct worker *w, int tensor, const void *in, void *out,
			const uint64_t *counts, bool deferred, unisum_handle *h)
{
	uint64_t total;
	size_t es;
	const char *what = deferred ? "unisum_allgather_begin" : "unisum_allgather";
	int rc = wk_gather_args(w, tensor, deferred ? out : in, out, counts,
				w != NULL ? (size_t)w->size : 0, h, what, &total, &es);
	if (rc != 0)
		return rc;
	if (deferred && w->local)
		return log_fail(UNISUM_EINVAL, "%s: runs with one worker a machine only (worker %d has "
				"%d on its machine); use unisum_allgather_async", what, w->rank,
				w->cfg.local_size);
	if (deferred) {
		/* Refused as every gathering collective is while a rank has
		 * joined, but not logged: it is begun ahead of a call, which
		 * says so itself if it comes. */
		pthread_mutex_lock(&w->lock);
		bool joining = w->join_seen && !w->joined;
		pthread_mutex_unlock(&w->lock);
		if (joining) {
			log_set_last_error("%s: a rank has joined (unisum_join), and until every rank "
					   "has, only push_pull runs (worker %d)", what, w->rank);
			return UNISUM_EINVAL;
		}
	}
	int n = w->size, first, end;
	wk_machine_ranks(w, &first, &end);
	uint64_t lo = 0, mlo = 0, mhi = 0;
	struct wk_span own = {0, 0};
	uint64_t rot = 0;
	if (!w->local) {
		/* One worker per machine: this rank's rows go out from `in`,
		 * every row comes straight into `out`. */
		struct wk_op tmpl = {.in = in, .out = out, .deferred = deferred,
				     .wire_op = WIRE_OP(WIRE_OP_ALLGATHER,
							wk_layout_hash(counts, (size_t)n))};
		tmpl.direct = calloc((size_t)n, sizeof *tmpl.direct);
		if (tmpl.direct == NULL || wk_segs_set(w, &tmpl.segs, (uint32_t)n, counts, NULL,
						   wk_phase_pbytes(w, counts, (size_t)n, es)) != 0) {
			free(tmpl.direct);
			return UNISUM_ENOMEM;
		}
		for (int r = 0; r < n; r++) {
			/* Its own rows it copies into `out` (wk_start) rather than
			 * pulls back from the server, which still needs them, for
			 * the others; they go out from there: `in` may lie inside
			 * `out`, where the others' rows land. */
			bool own = r == w->rank;
			uint8_t *at = (uint8_t *)out + lo * es;
			if (own) {
				tmpl.own_from = in;
				tmpl.own_to = at;
				tmpl.own_bytes = counts[r] * es;
			}
			tmpl.direct[r] = (struct wk_direct){lo, lo + counts[r], own ? at : NULL,
							    own ? NULL : at};
			if (r == end)
				tmpl.rot_offset = lo;
			lo += counts[r];
		}
		tmpl.ndirect = n;
		/* Its pulls in ring phases (wk_phases_plan), for the global set. */
		if (tmpl.segs.pbytes != 0)
			tmpl.nphases = n;
		return wk_start(w, tensor, &tmpl, h);
	}
	for (int r = 0; r < n; r++) {
		if (r == first)
			mlo = lo;
		if (r == end)
			rot = lo;
		if (r == w->rank) {
			/* This rank's rows in place (wk_start); wk_launch zeroes the
			 * rest of the partitions this machine pushes (OR with zero
			 * keeps the others' bits). */
			own = (struct wk_span){lo, lo + counts[r]};
		}
		lo += counts[r];
		if (r == end - 1)
			mhi = lo;
	}
	struct wk_op tmpl = {.in = out, .out = out, .rot_offset = rot,
			     .own_from = in, .own_to = (uint8_t *)out + own.lo * es,
			     .own_bytes = (own.hi - own.lo) * es,
			     .wire_op = WIRE_OP(WIRE_OP_ALLGATHER, wk_layout_hash(counts, (size_t)n))};
	tmpl.push_spans = wk_one_span(mlo, mhi, &tmpl.npush_spans);
	tmpl.own_spans = wk_one_span(own.lo, own.hi, &tmpl.nown_spans);
	if (tmpl.push_spans == NULL || tmpl.own_spans == NULL ||
	    wk_segs_set(w, &tmpl.segs, (uint32_t)n, counts, NULL, 0) != 0) {
		free(tmpl.push_spans);
		free(tmpl.own_spans);
		return UNISUM_ENOMEM;
	}
	return wk_start(w, tensor, &tmpl, h);
}

int worker_allgather_async(struct worker *w, int tensor, const void *in, void *out,
			   const uint64_t *counts, unisum_handle *h)
{
	return wk_allgather(w, tensor, in, out, counts, false, h);
}

int worker_allgather_begin(struct worker *w, int tensor, void *out, const uint64_t *counts,
			   unisum_handle *h)
{
	return wk_allgather(w, tensor, NULL, out, counts, true, h);
}

/* Takes the held jobs of operation op, begun and not supplied, marking it
 * supplied (w->lock held); NULL if it has none (a refused cut failed it). */
static struct wk_job *wk_take_held(struct wk_op *op)
{
	struct wk_job *held = op->held;
	op->held = NULL;
	op->supplied = true;
	return held;
}

/* Queues held jobs (from wk_take_held) on the PUSH stage. */
static void wk_queue_held(struct worker *w, struct wk_op *op, struct wk_job *held)
{
	while (held != NULL) {
		struct wk_job *j = held;
		held = j->next;
		j->next = NULL;
		int rc = sched_push(&w->push_q, &j->entry);
		if (rc != 0) {
			free(j);
			char why[512];
			snprintf(why, sizeof why, "worker %d, tensor '%s': out of memory", w->rank,
				 op->t->name);
			wk_op_part_done(op, rc, why);
		}
	}
}

int worker_allgather_supply(struct worker *w, unisum_handle h, const void *in)
{
	if (wk_require_init(w) != 0)
		return UNISUM_ENOTINIT;
	pthread_mutex_lock(&w->lock);
	int i = wk_find_op(w, h);
	struct wk_op *op = i >= 0 ? w->ops[i] : NULL;
	int rc = 0;
	if (op == NULL || !op->deferred)
		rc = log_fail(UNISUM_EINVAL, "unisum_allgather_supply: handle %lld is %s (worker %d)",
			      (long long)h, op == NULL ? "unknown or already released" :
			      "not an allgather begun with unisum_allgather_begin", w->rank);
	else if (op->supplied)
		rc = log_fail(UNISUM_EINVAL, "unisum_allgather_supply: handle %lld has its rows "
			      "already (worker %d)", (long long)h, w->rank);
	else if (in == NULL && op->own_bytes > 0)
		rc = log_fail(UNISUM_EINVAL, "unisum_allgather_supply: in must not be NULL: this rank "
			      "has %zu bytes of rows (worker %d)", op->own_bytes, w->rank);
	struct wk_job *held = rc == 0 ? wk_take_held(op) : NULL;
	if (rc == 0)
		wk_begun_go(w, op);	/* its first phase, if it still waits */
	/* Rows apart from `out` (the usual case) go out from `in` itself,
	 * and are copied into their place in `out` while they flow, not
	 * before: the copy counts as one more part, so the operation cannot
	 * complete before it. */
	uintptr_t lo = (uintptr_t)in, out = (uintptr_t)op->out;
	size_t total = (size_t)op->t->count * op->t->esize;
	bool apart = held != NULL && op->own_bytes > 0 &&
		     (lo + op->own_bytes <= out || lo >= out + total);
	if (apart)
		op->remaining++;
	pthread_mutex_unlock(&w->lock);
	if (held == NULL)
		return rc;
	if (!apart) {
		/* Its held jobs keep it in flight (so alive) until queued. */
		memmove(op->own_to, in, op->own_bytes);
		wk_queue_held(w, op, held);
		return 0;
	}
	for (struct wk_job *j = held; j != NULL; j = j->next)
		j->in = (const uint8_t *)in + ((const uint8_t *)j->in - (const uint8_t *)op->own_to);
	wk_queue_held(w, op, held);
	memcpy(op->own_to, in, op->own_bytes);
	wk_op_part_done(op, 0, NULL);
	return 0;
}

void wk_supply_nothing(struct worker *w)
{
	for (;;) {
		pthread_mutex_lock(&w->lock);
		struct wk_op *op = NULL;
		for (int i = 0; i < w->nops && op == NULL; i++)
			if (w->ops[i]->deferred && !w->ops[i]->supplied)
				op = w->ops[i];
		struct wk_job *held = op != NULL ? wk_take_held(op) : NULL;
		if (op != NULL) {
			op->nothing = true;
			wk_begun_go(w, op);
			for (struct wk_job *j = held; j != NULL; j = j->next) {
				j->in = NULL;	/* ZERO: nothing of this machine's */
				j->entry.bytes = 0;
				j->nothing = true;
				op->nothing_unacked++;
			}
		}
		pthread_mutex_unlock(&w->lock);
		if (op == NULL)
			return;
		wk_queue_held(w, op, held);
	}
}

int worker_reduce_scatter_async(struct worker *w, int tensor, const void *in, void *out,
				const uint64_t *counts, int flags, unisum_handle *h)
{
	uint64_t total;
	size_t es;
	int rc = wk_gather_args(w, tensor, in, out, counts, w != NULL ? (size_t)w->size : 0, h,
				"unisum_reduce_scatter", &total, &es);
	if (rc != 0)
		return rc;
	if ((flags & ~UNISUM_AVERAGE) != 0)
		return log_fail(UNISUM_EINVAL, "unisum_reduce_scatter: flags may only hold "
				"UNISUM_AVERAGE (worker %d, tensor %d)", w->rank, tensor);
	int n = w->size, first, end;
	wk_machine_ranks(w, &first, &end);
	uint64_t lo = 0, mlo = 0, mhi = 0, mine = 0, rot = 0;
	for (int r = 0; r < n; r++) {
		if (r == first)
			mlo = lo;
		if (r == end)
			rot = lo;
		if (r == w->rank)
			mine = lo;
		lo += counts[r];
		if (r == end - 1)
			mhi = lo;
	}
	uint32_t kind = flags & UNISUM_AVERAGE ? WIRE_OP_REDUCESCATTER_AVERAGE : WIRE_OP_REDUCESCATTER;
	struct wk_op tmpl = {.flags = flags, .in = in, .rot_offset = rot,
			     .wire_op = WIRE_OP(kind, wk_layout_hash(counts, (size_t)n))};
	if (!w->local) {
		/* One worker per machine: everything goes out from `in`, this
		 * rank's slice comes straight into `out`. */
		tmpl.out = out;
		tmpl.direct = calloc((size_t)n, sizeof *tmpl.direct);
		if (tmpl.direct == NULL || wk_segs_set(w, &tmpl.segs, (uint32_t)n, counts, NULL, 0) != 0) {
			free(tmpl.direct);
			return UNISUM_ENOMEM;
		}
		lo = 0;
		for (int r = 0; r < n; r++) {
			tmpl.direct[r] = (struct wk_direct){lo, lo + counts[r],
							    (const uint8_t *)in + lo * es,
							    r == w->rank ? out : NULL};
			lo += counts[r];
		}
		tmpl.ndirect = n;
		return wk_start(w, tensor, &tmpl, h);
	}
	tmpl.scratch = malloc(total * es > 0 ? total * es : 1);
	tmpl.pull_spans = wk_one_span(mlo, mhi, &tmpl.npull_spans);
	if (tmpl.scratch == NULL || tmpl.pull_spans == NULL ||
	    wk_segs_set(w, &tmpl.segs, (uint32_t)n, counts, NULL, 0) != 0) {
		free(tmpl.scratch);
		free(tmpl.pull_spans);
		return UNISUM_ENOMEM;
	}
	tmpl.out = tmpl.scratch;
	tmpl.copy_from = (uint8_t *)tmpl.scratch + mine * es;
	tmpl.copy_to = out;
	tmpl.copy_bytes = counts[w->rank] * es;
	return wk_start(w, tensor, &tmpl, h);
}

static int wk_span_cmp(const void *a, const void *b)
{
	const struct wk_span *x = a, *y = b;
	return x->lo < y->lo ? -1 : x->lo > y->lo;
}

int worker_alltoall_async(struct worker *w, int tensor, const void *in, void *out,
			  const uint64_t *counts, unisum_handle *h)
{
	uint64_t total;
	size_t es;
	size_t n = w != NULL ? (size_t)w->size : 0;
	int rc = wk_gather_args(w, tensor, in, out, counts, n * n, h, "unisum_alltoall", &total, &es);
	if (rc != 0)
		return rc;
	/* The tensor holds the blocks by destination, then source: block
	 * (s, d) at base[d] + the blocks of sources before s to d.  Its
	 * segments are those blocks, each owned by its destination's
	 * machine. */
	int first, end;
	wk_machine_ranks(w, &first, &end);
	size_t me = (size_t)w->rank;
	struct wk_op tmpl = {.wire_op = WIRE_OP(WIRE_OP_ALLTOALL, wk_layout_hash(counts, n * n))};
	uint64_t *base = calloc(n + 1, sizeof *base);
	uint64_t *seg_counts = calloc(n * n + 1, sizeof *seg_counts);
	int *seg_ranks = calloc(n * n + 1, sizeof *seg_ranks);
	rc = base == NULL || seg_counts == NULL || seg_ranks == NULL ? UNISUM_ENOMEM : 0;
	for (size_t d = 0; rc == 0 && d < n; d++) {
		base[d + 1] = base[d];
		for (size_t s = 0; s < n; s++) {
			base[d + 1] += counts[s * n + d];
			seg_counts[d * n + s] = counts[s * n + d];
			seg_ranks[d * n + s] = (int)d;
		}
	}
	if (rc == 0)
		rc = wk_segs_set(w, &tmpl.segs, (uint32_t)(n * n), seg_counts, seg_ranks, 0);
	free(seg_counts);
	free(seg_ranks);
	if (rc == 0)
		tmpl.rot_offset = (size_t)end < n ? base[end] : 0;
	if (rc == 0 && !w->local) {
		/* One worker per machine: each block goes out of `in` and comes
		 * into `out` where it lies there. */
		tmpl.in = in;
		tmpl.out = out;
		tmpl.direct = calloc(n * n + 1, sizeof *tmpl.direct);
		rc = tmpl.direct == NULL ? UNISUM_ENOMEM : 0;
		uint64_t *sent_at = calloc(n + 1, sizeof *sent_at), got_at = 0;
		rc = rc == 0 && sent_at == NULL ? UNISUM_ENOMEM : rc;
		for (size_t d = 0; rc == 0 && d < n; d++)
			sent_at[d + 1] = sent_at[d] + counts[me * n + d];
		for (size_t d = 0; rc == 0 && d < n; d++) {
			uint64_t at = base[d];
			for (size_t s = 0; s < n; s++) {
				uint64_t c = counts[s * n + d];
				tmpl.direct[d * n + s] = (struct wk_direct){
					at, at + c,
					s == me ? (const uint8_t *)in + sent_at[d] * es : NULL,
					d == me ? (uint8_t *)out + got_at * es : NULL};
				if (d == me)
					got_at += c;
				at += c;
			}
		}
		tmpl.ndirect = (int)(n * n);
		free(sent_at);
		free(base);
		if (rc != 0) {
			free(tmpl.direct);
			free(tmpl.segs.counts);
			free(tmpl.segs.owners);
			return rc;
		}
		return wk_start(w, tensor, &tmpl, h);
	}
	/* Several workers per machine: the machine's local reduce ORs every
	 * rank's blocks, so each rank places its own in a scratch buffer of
	 * the whole tensor (wk_launch zeroes the rest of the partitions the
	 * machine pushes), and copies out what it receives. */
	struct wk_span *push = calloc(n * (size_t)(end - first) + 1, sizeof *push);
	struct wk_span *own = calloc(n + 1, sizeof *own);
	void *scratch = malloc(total * es > 0 ? total * es : 1);
	if (rc != 0 || push == NULL || own == NULL || scratch == NULL) {
		free(base);
		free(push);
		free(own);
		free(scratch);
		free(tmpl.segs.counts);
		free(tmpl.segs.owners);
		return UNISUM_ENOMEM;
	}
	int npush = 0, nown = 0;
	uint64_t sent = 0;
	for (size_t d = 0; d < n; d++) {
		uint64_t at = base[d];
		for (size_t s = 0; s < n; s++) {
			uint64_t c = counts[s * n + d];
			if (s == me) {
				memcpy((uint8_t *)scratch + at * es, (const uint8_t *)in + sent * es, c * es);
				sent += c;
				if (c > 0)
					own[nown++] = (struct wk_span){at, at + c};
			}
			if ((int)s >= first && (int)s < end && c > 0)
				push[npush++] = (struct wk_span){at, at + c};
			at += c;
		}
	}
	qsort(push, (size_t)npush, sizeof *push, wk_span_cmp);
	tmpl.in = scratch;
	tmpl.out = scratch;
	tmpl.scratch = scratch;
	tmpl.push_spans = push;
	tmpl.npush_spans = npush;
	tmpl.own_spans = own;
	tmpl.nown_spans = nown;
	tmpl.copy_from = (uint8_t *)scratch + base[me] * es;
	tmpl.copy_to = out;
	tmpl.copy_bytes = (base[me + 1] - base[me]) * es;
	tmpl.pull_spans = wk_one_span(base[first], base[end], &tmpl.npull_spans);
	free(base);
	if (tmpl.pull_spans == NULL) {
		free(push);
		free(own);
		free(scratch);
		free(tmpl.segs.counts);
		free(tmpl.segs.owners);
		return UNISUM_ENOMEM;
	}
	return wk_start(w, tensor, &tmpl, h);
}

/* Finds an unreleased operation; call with w->lock held. */
static int wk_find_op(const struct worker *w, unisum_handle h)
{
	for (int i = 0; i < w->nops; i++)
		if (w->ops[i]->handle == h)
			return i;
	return -1;
}

/* Undeclares dssync group set tensor `id` (-1: nothing) after its step
 * (wk_undeclare's `retire`). */
static void wk_dssync_retire(struct worker *w, int id)
{
	if (id >= 0)
		(void)wk_undeclare(w, id, true);
}

/* Releases finished operation i (w->lock held): its result.  *retire: the
 * id of a dssync group's set tensor to undeclare now (wk_dssync_target
 * decided that its group does not come back soon), else -1. */
static int wk_release(struct worker *w, int i, int *retire)
{
	struct wk_op *op = w->ops[i];
	w->ops[i] = w->ops[--w->nops];
	int rc = op->error;
	*retire = rc == 0 && op->t->dssync_retire ? op->t->index : -1;
	if (rc == 0 && op->join_refused) {
		rc = UNISUM_EINVAL;
		snprintf(op->why, sizeof op->why, "a rank joined (unisum_join) while this broadcast "
			 "was in flight; it completed with the joined rank's zeros, but until every "
			 "rank has joined, only push_pull runs");
	}
	char quoted[260];
	snprintf(quoted, sizeof quoted, "'%s'", op->t->name);
	if (rc != 0 && strstr(op->why, quoted) != NULL)
		log_fail(rc, "worker %d: %s", w->rank, op->why);	/* it names the tensor */
	else if (rc != 0)
		log_fail(rc, "worker %d, tensor '%s': %s", w->rank, op->t->name, op->why);
	wk_op_free(op);
	return rc;
}

/* The index *i of handle h's operation, which a wait (`what`) may wait
 * for: 0, or UNISUM_EINVAL (logged) for an unknown or released handle and
 * for an allgather begun and not supplied, which could never end
 * (w->lock held). */
static int wk_waitable(const struct worker *w, unisum_handle h, const char *what, int *i)
{
	*i = wk_find_op(w, h);
	if (*i < 0)
		return log_fail(UNISUM_EINVAL, "%s: unknown or already released handle %lld", what,
				(long long)h);
	const struct wk_op *op = w->ops[*i];
	if (op->deferred && !op->supplied && !op->done)
		return log_fail(UNISUM_EINVAL, "%s: handle %lld is an allgather begun and not "
				"supplied (unisum_allgather_supply): it cannot complete until then",
				what, (long long)h);
	return 0;
}

int worker_poll_timeout(struct worker *w, unisum_handle h, int timeout_ms)
{
	if (wk_require_init(w) != 0)
		return UNISUM_ENOTINIT;
	if (timeout_ms < 0)
		return log_fail(UNISUM_EINVAL, "unisum_poll_timeout: timeout_ms must not be negative, "
				"got %d", timeout_ms);
	struct timespec until = timing_deadline(timeout_ms);
	pthread_mutex_lock(&w->lock);
	int i, rc = wk_waitable(w, h, "unisum_poll", &i), retire = -1;
	if (rc == 0) {
		struct wk_op *op = w->ops[i];
		int timed_out = 0;
		while (!op->done && timeout_ms > 0 && !timed_out)
			timed_out = pthread_cond_timedwait(&w->done_cond, &w->lock, &until);
		if (!op->done) {
			rc = 0;
		} else {
			rc = wk_release(w, wk_find_op(w, h), &retire);
			if (rc == 0)
				rc = 1;
		}
	}
	pthread_mutex_unlock(&w->lock);
	wk_dssync_retire(w, retire);
	return rc;
}

int worker_wait(struct worker *w, unisum_handle h)
{
	if (wk_require_init(w) != 0)
		return UNISUM_ENOTINIT;
	pthread_mutex_lock(&w->lock);
	int i, rc = wk_waitable(w, h, "unisum_wait", &i), retire = -1;
	if (rc == 0) {
		struct wk_op *op = w->ops[i];
		while (!op->done)
			pthread_cond_wait(&w->done_cond, &w->lock);
		rc = wk_release(w, wk_find_op(w, h), &retire);
	}
	pthread_mutex_unlock(&w->lock);
	wk_dssync_retire(w, retire);
	return rc;
}

/* ---- the rest ------------------------------------------------------------------ */

int worker_get_stats(struct worker *w, unisum_stats *out)
{
	if (wk_require_init(w) != 0)
		return UNISUM_ENOTINIT;
	if (out == NULL)
		return log_fail(UNISUM_EINVAL, "unisum_get_stats: out must not be NULL");
	struct sched_stats st;
	sched_stats(&w->push_q, &st);
	uint64_t pbytes = tune_partition_bytes(w->tuner);
	*out = (unisum_stats){.credit_bytes = st.credit, .partition_bytes = pbytes,
			      .max_inflight_bytes = st.max_inflight, .partitions_sent = st.taken,
			      .bytes_pulled = atomic_load(&w->bytes_pulled),
			      .operations = atomic_load(&w->operations),
			      .nservers = w->nservers};
	/* Under the lock: worker_leave takes lc and the connections away
	 * under it. */
	pthread_mutex_lock(&w->lock);
	out->local_bytes = w->lc != NULL ? local_summed_bytes(w->lc) : 0;
	for (int s = 0; s < w->nservers && w->conns != NULL; s++) {
		uint64_t bytes = atomic_load(&w->conns[s].bytes_pushed);

		out->bytes_pushed += bytes;
		if (s < UNISUM_STATS_SERVERS)
			out->server_bytes[s] = bytes;
	}
	pthread_mutex_unlock(&w->lock);
	return 0;
}

void *worker_alloc(struct worker *w, size_t bytes)
{
	void *p = NULL;
	if (w != NULL) {
		/* Under the lock: worker_leave takes lc away under it first. */
		pthread_mutex_lock(&w->lock);
		if (w->initialized && w->lc != NULL)
			p = local_alloc(w->lc, bytes);
		pthread_mutex_unlock(&w->lock);
	}
	return p;
}

int worker_barrier_timeout(struct worker *w, int timeout_ms)
{
	if (wk_require_init(w) != 0)
		return UNISUM_ENOTINIT;
	if (timeout_ms < 0)
		return log_fail(UNISUM_EINVAL, "unisum_barrier_timeout: timeout_ms must not be negative, "
				"got %d", timeout_ms);
	int rc = rdv_client_barrier_wait(w->rdv, RDV_GROUP_WORKERS, timeout_ms);
	if (rc < 0)
		return log_fail(rc, "unisum_barrier on worker %d: %s", w->rank, log_last_error());
	return rc;
}

int worker_barrier(struct worker *w)
{
	if (wk_require_init(w) != 0)
		return UNISUM_ENOTINIT;
	int rc = rdv_client_barrier(w->rdv, RDV_GROUP_WORKERS);
	if (rc != 0)
		return log_fail(rc, "unisum_barrier on worker %d: %s", w->rank, log_last_error());
	return 0;
}
