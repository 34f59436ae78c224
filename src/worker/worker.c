/*
 * worker.c - a worker of a job as a handle (worker.h): joining and leaving
 * its job, the scheduler's failure notice, the local path's hooks, stats,
 * barriers.  api.c puts unisum.h over the process's one worker; tests may
 * run several in one process.  The rest of the API is in tensor.c (the
 * tensor table), pset.c (process sets), op.c (operations), dssync.c
 * (divide and shuffle), gather.c (allgather, reduce-scatter, alltoall)
 * and join.c; the server connections and the PUSH and PULL stages in
 * conns.c, cuts and autotune in cuts.c; worker_int.h lists every file in
 * its layer and holds the state they share.
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
 * (UNISUM_SCHEDULING_CREDIT bytes in flight, src/pushq): a high-priority
 * partition queued behind a long low-priority backlog is the next one out
 * as soon as any credit comes back, and no more bytes than the credit ever
 * wait in the sockets.  It hands each partition to its server's
 * connection and writes PUSH (straight from the caller's input buffer)
 * followed by PULL; what the socket does not take at once, the
 * connection's I/O loop writes later.  The PULL stage is that loop: it
 * reads the PULL_REPLY straight into the caller's
 * output buffer, divides for UNISUM_AVERAGE while the data is hot in
 * cache, gives the credit back, and completes the operation when its last
 * partition arrives.  With UNISUM_TRACE_ON every stage's span goes to the
 * timeline (src/trace).
 *
 * A job lives in its connection's pending table from the moment the PUSH
 * stage hands it over until its reply arrives or the connection dies; only
 * the connection's loop (its replies) and the reaper (its end) complete
 * jobs, so once an operation is reported done no thread touches the
 * caller's buffers again.  When a connection dies, its loop hands it to
 * the reaper (links.c), which fails every pending job with an error that
 * names the server, or hands them to where a failover moved their keys.
 *
 * Locks.  `w->lock` guards the tensor table, the operations and `failed`;
 * a connection's `lock` guards its pending table, and is held while a job
 * is written (non-blocking: what the socket does not take waits in the
 * connection's queue, under its own lock).  Order: w->lock, then a
 * connection's lock, then its queue's.
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

#include "config/config.h"
#include "log/log.h"
#include "placement/placement.h"
#include "reducer/reducer.h"
#include "rendezvous/rendezvous.h"
#include "pushq/pushq.h"
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
			if (w->conns[s].conn != NULL)
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
		rc = pushq_push(&w->push_q, &j->entry);
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

/* The scheduler says tensor `key` can never be summed (the client's loop thread). */
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

/* The connection layer's calls up (worker_int.h): the worker is where
 * the layers meet, so it is the one that knows them all. */
static const struct wk_conn_upcalls wk_upcalls = {
	.part_done = wk_op_part_done,
	.phase_step = wk_phase_step,
	.nothing_pushed = wk_nothing_pushed,
	.hand_over = wk_hand_over,
	.move_key = wk_move_key,
	.server_of = wk_server_of,
};

/* A worker not yet in a job: its locks, and its conditions, whose timed
 * waits run on the monotonic clock, and the connection layer's calls up.
 * NULL when out of memory. */
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
	pthread_cond_init(&w->reap_cond, NULL);
	w->cfg = *cfg;
	w->up = &wk_upcalls;
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
	pthread_cond_destroy(&w->reap_cond);
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
	int rc = pthread_create(&w->push_thread, NULL, wk_push_main, w);
	if (rc != 0) {
		char limits[384], why[640];
		log_thread_limits(rc, limits, sizeof limits);
		snprintf(why, sizeof why, "worker %d (pid %d) cannot start its PUSH thread: %s",
			 w->rank, (int)getpid(), limits);
		rdv_client_fail_job(w->rdv, UNISUM_ESYS, why);
		return log_fail(UNISUM_ESYS, "%s", why);
	}
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
	/* One machine needs no sums restored, but an async key's new server
	 * needs its rounds (UNISUM_REPLICAS). */
	w->keep_replies = w->cfg.server_failover && w->nservers > 1 &&
			  (w->cfg.num_workers > 1 || (w->cfg.replicas && !w->cfg.elastic));
	rdv_client_on_failover(w->rdv, wk_on_failover, w);
	rdv_client_on_rejoin(w->rdv, wk_on_rejoin, w);
	if (rc == 0)
		rc = pushq_init(&w->push_q, w->cfg.credit_bytes);
	if (rc != 0) {
		/* The client's loop thread hands TUNEs to the tuner: it goes first. */
		rdv_client_free(w->rdv);
		w->rdv = NULL;
		tune_free(w->tuner);
		w->tuner = NULL;
		return log_fail(rc, "unisum_init: out of memory");
	}
	/* Last: the client's loop thread reads the tuner and the PUSH queue. */
	rdv_client_on_metrics(w->rdv, wk_metrics, w);
	return 0;
}

/* Undoes wk_join_job (every thread that uses them stopped). */
static void wk_unjoin(struct worker *w)
{
	rdv_client_free(w->rdv);	/* before the tuner and the queue: see wk_join_job */
	w->rdv = NULL;
	pushq_fini(&w->push_q);
	tune_free(w->tuner);
	w->tuner = NULL;
}

int worker_join(const struct config *cfg, struct worker **out)
{
	struct worker *w = wk_new(cfg);
	if (w == NULL)
		return log_fail(UNISUM_ENOMEM, "unisum_init: out of memory");
	char why[512];
	int rc = (w->tp = transport_named(w->cfg.transport, why, sizeof why)) == NULL
			 ? log_fail(UNISUM_ECONFIG, "unisum_init: %s", why)
			 : wk_join_job(w);
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
	pushq_close(&w->push_q);
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

int worker_out_of_memory(struct worker *w, int rc)
{
	if (w == NULL || rc != UNISUM_ENOMEM)
		return rc;
	pthread_mutex_lock(&w->lock);
	bool first = w->failed == 0 && !w->oom_told;	/* not the job's failure, told */
	w->oom_told = true;
	pthread_mutex_unlock(&w->lock);
	if (!first)
		return rc;
	char limits[400], why[1200];
	log_memory_limits(limits, sizeof limits);
	snprintf(why, sizeof why, "worker %d (pid %d) is out of memory: %s (%s)", w->rank,
		 (int)getpid(), log_last_error(), limits);
	rdv_client_fail_job(w->rdv, UNISUM_ENOMEM, why);
	return log_fail(rc, "%s", why);
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

/* ---- the rest ------------------------------------------------------------------ */

/* The transport that registered worker_alloc's memory, for
 * worker_alloc_forget, which has no worker; NULL while none did. */
static const struct transport_ops *_Atomic wk_alloc_tp;

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
	if (p != NULL) {
		/* Not under w->lock: a registration waits for the UCX thread. */
		atomic_store(&wk_alloc_tp, w->tp);
		transport_mem_register(w->tp, p, bytes);
	}
	return p;
}

void worker_alloc_forget(void *p)
{
	transport_mem_unregister(atomic_load(&wk_alloc_tp), p);
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
