/*
 * local.c - LOCAL_REDUCE and LOCAL_BROADCAST over cross-memory attach.
 * See local.h for what the stages do.  This file holds the stage
 * threads and local.h's functions; the segment's table and the waits are
 * in local_wait.c, the sums and copies in local_reduce.c, the arenas in
 * local_arena.c, the state they share in lc_int.h.
 *
 * DESIGN
 *
 * Segment.  One per machine, "m<machine>" of the job: a header with the
 * shared futex flag, then per local rank its pid and a table of LC_TABLE
 * entries, one per cut key that rank has used.  An entry holds the latest
 * round that rank posted for the key, its buffers for that round and its
 * progress counters, each packed as (round << 32) | count so a reader can
 * tell this round's count from a stale or a later one.  Only the owning
 * rank writes its entries (single writer: no locks across processes); it
 * resets an entry's counters and buffers before it publishes the new round
 * with a release store, and readers load the round with acquire first.
 *
 * Entries of undeclared tensors.  local_forget marks this rank's entry
 * retired; the entry is freed (lc_bury: empty again, or a tombstone that
 * lookups pass over and a later key reuses) once every rank's entry of
 * that key is retired or gone, so no peer can still be reading it: a rank
 * undeclares only with no operation of the tensor in flight.
 *
 * Why a rank may reuse an entry without hearing from its peers: a rank
 * completes round k only after every peer is finished with its buffers of
 * round k (one machine: every rank has summed and written every slice; several
 * machines: the root waits for every peer's copy of the result, and every
 * other rank's buffers are read before the root can push).  A counter of a
 * later round therefore means "done" to a reader of round k.
 *
 * Waiting.  Every state change posts the flag; a waiter checks its
 * condition, then sleeps on the flag for at most LC_SLICE_MS, and between
 * sleeps checks the job's failure and whether its peers are alive.  No wait
 * is unbounded and no core spins while idle.
 *
 * Threads.  The reduce stage and the broadcast stage are one thread each,
 * each taking operations in (priority, submission) order.  The root's
 * replies arrive on the worker's connection threads (local_pulled).
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#include "log/log.h"
#include "reducer/reducer.h"
#include "shm/shm.h"
#include "timing/timing.h"
#include "trace/trace.h"
#include "wire/wire.h"
#include "worker/lc_int.h"
#include "worker/local.h"




static size_t lc_seg_bytes(int local_size)
{
	return sizeof(struct lc_seg) + (size_t)local_size * sizeof(struct lc_rank);
}




/* ---- stage threads -------------------------------------------------------- */

static void q_push(struct lc_queue *q, struct local_op *op)
{
	struct local *lc = op->lc;
	struct local_op **pp = &q->head;
	while (*pp != NULL && ((*pp)->req.priority > op->req.priority ||
			       ((*pp)->req.priority == op->req.priority && (*pp)->seq < op->seq)))
		pp = &(*pp)->next;
	op->next = *pp;
	*pp = op;
	pthread_cond_broadcast(&lc->cond);
}

static struct local_op *q_pop(struct local *lc, struct lc_queue *q)
{
	pthread_mutex_lock(&lc->lock);
	while (q->head == NULL && !q->closed)
		pthread_cond_wait(&lc->cond, &lc->lock);
	struct local_op *op = q->head;
	if (op != NULL)
		q->head = op->next;
	pthread_mutex_unlock(&lc->lock);
	return op;
}

static void *lc_reduce_main(void *arg)
{
	prctl(PR_SET_NAME, "unisum-lreduce"); /* for top -H, perf and gdb */
	struct local *lc = arg;
	struct local_op *op;
	while ((op = q_pop(lc, &lc->reduce_q)) != NULL) {
		lc_reduce(op);
		pthread_mutex_lock(&lc->lock);
		q_push(&lc->bcast_q, op);
		pthread_mutex_unlock(&lc->lock);
	}
	return NULL;
}

/* The staging thread: copies every staged operation's slices for the
 * other ranks, partition by partition, in submission order.  It waits for
 * nobody, so a rank summing (in its own priority order) never waits for a
 * peer that waits for it. */
static void *lc_stage_main(void *arg)
{
	prctl(PR_SET_NAME, "unisum-lstage"); /* for top -H, perf and gdb */
	struct local *lc = arg;
	for (;;) {
		pthread_mutex_lock(&lc->lock);
		while (lc->stage_head == NULL && !lc->reduce_q.closed)
			pthread_cond_wait(&lc->cond, &lc->lock);
		struct local_op *op = lc->stage_head;
		if (op != NULL && (lc->stage_head = op->stage_next) == NULL)
			lc->stage_tail = NULL;
		pthread_mutex_unlock(&lc->lock);
		if (op == NULL)
			return NULL;
		uint8_t *region = lc_my_region(op);
		for (uint32_t p = 0; p < op->req.nparts; p++)
			lc_stage(op, region, p);
		pthread_mutex_lock(&lc->lock);
		op->staged = true;
		pthread_cond_broadcast(&lc->cond);
		pthread_mutex_unlock(&lc->lock);
	}
}

static void lc_complete(struct local_op *op)
{
	struct local *lc = op->lc;
	pthread_mutex_lock(&lc->lock);
	while (op->region != 0 && !op->staged)
		pthread_cond_wait(&lc->cond, &lc->lock);	/* a failed op, ended early */
	pthread_mutex_unlock(&lc->lock);
	int err = lc_err(op);	/* after the last reply: no more writers */
	lc_region_give(lc, op->region);
	lc->hooks.done(op->req.ctx, err, op->why);
	free(op->peers);
	free(op);
}

/* Whether others still read this rank's memory after it has the result:
 * the root's output (several machines) or a stager's region. */
static bool lc_lent(const struct local_op *op)
{
	const struct local *lc = op->lc;
	return (lc->cfg.machines > 1 && lc->cfg.local_rank == 0) || op->region != 0;
}

static void *lc_bcast_main(void *arg)
{
	prctl(PR_SET_NAME, "unisum-lbcast"); /* for top -H, perf and gdb */
	struct local *lc = arg;
	struct local_op *op;
	while ((op = q_pop(lc, &lc->bcast_q)) != NULL) {
		lc_broadcast(op);
		if (!lc_lent(op)) {
			lc_complete(op);
			continue;
		}
		/* Waiting here for the others to copy would let two ranks wait on
		 * each other's next operation: the finisher waits for all at once. */
		pthread_mutex_lock(&lc->lock);
		op->next = lc->finish;
		lc->finish = op;
		pthread_cond_broadcast(&lc->cond);
		pthread_mutex_unlock(&lc->lock);
	}
	return NULL;
}

/* Completes lent operations once every other rank has let go of them (a
 * dead rank has), in whatever order that happens. */
static void *lc_finish_main(void *arg)
{
	prctl(PR_SET_NAME, "unisum-lfinish"); /* for top -H, perf and gdb */
	struct local *lc = arg;
	int64_t failed_at = 0;
	for (;;) {
		/* Once the job has failed, a peer that is alive but stuck (stopped,
		 * say) gets LC_QUIESCE_MS to let go, not forever.  (Asked before
		 * taking lc->lock: the hook takes the worker's lock, which is
		 * taken before lc->lock.) */
		char why[512];
		if (failed_at == 0 && lc->hooks.failed(lc->hooks.arg, why, sizeof why) != 0)
			failed_at = timing_now_ms();
		bool give_up = failed_at != 0 && timing_now_ms() - failed_at > LC_QUIESCE_MS;
		pthread_mutex_lock(&lc->lock);
		while (lc->finish == NULL && !lc->bcast_q.closed)
			pthread_cond_wait(&lc->cond, &lc->lock);
		if (lc->finish == NULL) {
			pthread_mutex_unlock(&lc->lock);
			return NULL;
		}
		uint32_t seq = shm_flag_load(&lc->seg->flag);
		struct local_op **pp = &lc->finish, *ready = NULL;
		while (*pp != NULL) {
			struct local_op *op = *pp;
			if (give_up || lc_cond_let_go(op, NULL)) {
				*pp = op->next;
				op->next = ready;
				ready = op;
			} else {
				pp = &op->next;
			}
		}
		bool waiting = lc->finish != NULL;
		pthread_mutex_unlock(&lc->lock);
		while (ready != NULL) {
			struct local_op *op = ready;
			ready = op->next;
			lc_complete(op);
		}
		if (waiting)
			shm_flag_wait(&lc->seg->flag, seq + 1, LC_SLICE_MS);
	}
}

/* ---- public ---------------------------------------------------------------- */

static bool lc_spawn(struct local *lc, pthread_t *t, void *(*fn)(void *), bool *started)
{
	*started = pthread_create(t, NULL, fn, lc) == 0;
	return *started;
}

/* Waits (bounded) until every local rank has mapped the segment. */
static int lc_await_attached(struct local *lc)
{
	int64_t until = timing_now_ms() + lc->cfg.timeout_ms;
	for (;;) {
		uint32_t seq = shm_flag_load(&lc->seg->flag);
		int missing = -1;
		for (int q = 0; q < lc->cfg.local_size && missing < 0; q++)
			if (!atomic_load(&lc->seg->ranks[q].attached))
				missing = q;
		if (missing < 0)
			return 0;
		char why[512];
		int f = lc->hooks.failed(lc->hooks.arg, why, sizeof why);
		if (f != 0)
			return log_fail(f, "worker %d: %s", lc->cfg.rank, why);
		int64_t left = until - timing_now_ms();
		if (left <= 0)
			return log_fail(UNISUM_ETIMEDOUT, "worker %d (local rank %d of machine %d) waited "
					"UNISUM_TIMEOUT_MS=%d ms for local rank %d (worker %d) to map the "
					"machine's shared memory", lc->cfg.rank, lc->cfg.local_rank,
					lc->cfg.machine, lc->cfg.timeout_ms, missing, lc_rank_of(lc, missing));
		shm_flag_wait(&lc->seg->flag, seq + 1, left < LC_SLICE_MS ? (int)left : LC_SLICE_MS);
	}
}

/* Unmaps everything (but its own arena while local_alloc memory of it is
 * out: the process's list keeps it) and frees lc. */
static void lc_unmap(struct local *lc)
{
	if (lc->arenas != NULL) {
		lc_arena_unregister(lc);
		for (int q = 0; q < lc->cfg.local_size; q++)
			shm_seg_close(&lc->arenas[q]);
	}
	free(lc->arenas);
	free(lc->used);
	free(lc->forgot);
	for (int i = 0; i < 2; i++)
		free(lc->tmp[i]);
	free(lc->acc);
	shm_seg_close(&lc->shm);
	pthread_cond_destroy(&lc->cond);
	pthread_mutex_destroy(&lc->lock);
	free(lc);
}

/* Maps the machine's control segment "m<machine>" (local rank 0 creates
 * it; the others open it and wait for its magic).  0 or an error. */
static int lc_map_segment(struct local *lc, const struct local_cfg *cfg, const char *what)
{
	size_t bytes = lc_seg_bytes(cfg->local_size);
	if (cfg->local_rank == 0) {
		int rc = shm_seg_create(lc->job, what, bytes, &lc->shm);
		if (rc == 0) {
			lc->seg = shm_seg_data(&lc->shm);
			lc->seg->local_size = (uint32_t)cfg->local_size;
			atomic_store_explicit(&lc->seg->magic, LC_MAGIC, memory_order_release);
		}
		return rc;
	}
	int rc = shm_seg_open(lc->job, what, cfg->timeout_ms, &lc->shm);
	if (rc != 0)
		return rc;
	lc->seg = shm_seg_data(&lc->shm);
	/* The root writes the magic just after creating it. */
	int64_t until = timing_now_ms() + cfg->timeout_ms;
	while (atomic_load_explicit(&lc->seg->magic, memory_order_acquire) != LC_MAGIC &&
	       timing_now_ms() < until)
		usleep(1000);
	if (atomic_load(&lc->seg->magic) != LC_MAGIC || lc->seg->local_size != (uint32_t)cfg->local_size ||
	    shm_seg_size(&lc->shm) != bytes)
		return log_fail(UNISUM_ECONFIG, "worker %d: the shared memory of machine %d (job %s) is "
				"for %u local workers, this one says UNISUM_LOCAL_SIZE=%d", cfg->rank,
				cfg->machine, lc->job, lc->seg->local_size, cfg->local_size);
	return 0;
}

/* Creates this rank's arena "m<machine>.a<rank>" (named in `arena`) and
 * maps every peer's.  0 or an error. */
static int lc_map_arenas(struct local *lc, const struct local_cfg *cfg, const char *arena)
{
	/* Every rank's arena, mapped by all before anyone is attached; the
	 * pages are taken as staging and unisum_alloc touch them. */
	lc->arenas = calloc((size_t)cfg->local_size, sizeof *lc->arenas);
	int rc = lc->arenas == NULL ? UNISUM_ENOMEM : 0;
	if (rc == 0)
		rc = shm_seg_create_sparse(lc->job, arena, cfg->arena_bytes, &lc->arenas[cfg->local_rank]);
	for (int q = 0; rc == 0 && q < cfg->local_size; q++) {
		char name[48];
		snprintf(name, sizeof name, "m%d.a%d", cfg->machine, q);
		if (q != cfg->local_rank)
			rc = shm_seg_open(lc->job, name, cfg->timeout_ms, &lc->arenas[q]);
	}
	return rc;
}

/* Starts the stage threads; lc_stop_threads joins whichever started.  0,
 * or UNISUM_ESYS naming the one that did not. */
static int lc_spawn_all(struct local *lc, const struct local_cfg *cfg)
{
	lc->started = true;
	const char *failed =
		!lc_spawn(lc, &lc->reduce_thread, lc_reduce_main, &lc->reduce_started)   ? "reduce"
		: !lc_spawn(lc, &lc->finish_thread, lc_finish_main, &lc->finish_started) ? "finishing"
		: !lc_spawn(lc, &lc->bcast_thread, lc_bcast_main, &lc->bcast_started)    ? "broadcast"
		: lc->staging && !lc_spawn(lc, &lc->stage_thread, lc_stage_main, &lc->stage_started)
			? "staging"
			: NULL;
	if (failed == NULL)
		return 0;
	return log_fail(UNISUM_ESYS, "worker %d cannot start the local %s thread", cfg->rank, failed);
}

/* A handle with its lock, its condition (timed waits on the monotonic
 * clock) and its configuration, or NULL. */
static struct local *lc_new(const struct local_cfg *cfg, const struct local_hooks *hooks)
{
	struct local *lc = calloc(1, sizeof *lc);
	if (lc == NULL)
		return NULL;
	pthread_mutex_init(&lc->lock, NULL);
	timing_cond_init(&lc->cond);
	lc->cfg = *cfg;
	lc->hooks = *hooks;
	snprintf(lc->job, sizeof lc->job, "%s", cfg->job);
	lc->cfg.job = lc->job;
	return lc;
}

/* Maps the segment and the arenas, waits for every rank to have them and
 * removes their names.  0 or an error (logged); lc_unmap undoes it. */
static int lc_attach(struct local *lc, const struct local_cfg *cfg)
{
	char what[32], arena[48];
	snprintf(what, sizeof what, "m%d", cfg->machine);
	snprintf(arena, sizeof arena, "m%d.a%d", cfg->machine, cfg->local_rank);
	int rc = lc_map_segment(lc, cfg, what);
	if (rc != 0)
		return log_fail(rc, "worker %d (local rank %d of machine %d) cannot set up the machine's "
				"shared memory (job %s): %s", cfg->rank, cfg->local_rank, cfg->machine,
				lc->job, log_last_error());
	lc->staging = cfg->machines == 1 && cfg->stage_bytes != 0 && cfg->arena_bytes != 0;
	if (cfg->arena_bytes != 0 && (rc = lc_map_arenas(lc, cfg, arena)) == 0)
		rc = lc_arena_register(lc);
	if (rc != 0) {
		shm_seg_unlink(lc->job, arena);
		if (cfg->local_rank == 0)
			shm_seg_unlink(lc->job, what);
		return log_fail(rc, "worker %d cannot map the machine's staging areas (job %s): %s",
				cfg->rank, lc->job, log_last_error());
	}
	struct lc_rank *mine = &lc->seg->ranks[cfg->local_rank];
	atomic_store(&mine->pid, (int32_t)getpid());
	atomic_store(&mine->attached, 1);
	lc_post(lc);
	lc->tmp[0] = aligned_alloc(64, LC_CHUNK);
	lc->tmp[1] = aligned_alloc(64, LC_CHUNK);
	lc->acc = aligned_alloc(64, LC_CHUNK);
	rc = lc->tmp[0] && lc->tmp[1] && lc->acc ? lc_await_attached(lc) : UNISUM_ENOMEM;
	/* Everyone has them mapped: the names can go, so no crash leaves them. */
	if (cfg->local_rank == 0)
		shm_seg_unlink(lc->job, what);
	if (lc->arenas != NULL)
		shm_seg_unlink(lc->job, arena);
	return rc;
}

/* Joins the stage threads: the reduce and staging threads end when the
 * reduce queue closes, the broadcast and finishing threads when the
 * broadcast queue does. */
static void lc_stop_threads(struct local *lc)
{
	pthread_mutex_lock(&lc->lock);
	lc->reduce_q.closed = true;
	pthread_cond_broadcast(&lc->cond);
	pthread_mutex_unlock(&lc->lock);
	if (lc->reduce_started)
		pthread_join(lc->reduce_thread, NULL);
	if (lc->stage_started)
		pthread_join(lc->stage_thread, NULL);
	pthread_mutex_lock(&lc->lock);
	lc->bcast_q.closed = true;
	pthread_cond_broadcast(&lc->cond);
	pthread_mutex_unlock(&lc->lock);
	if (lc->bcast_started)
		pthread_join(lc->bcast_thread, NULL);
	if (lc->finish_started)
		pthread_join(lc->finish_thread, NULL);
	lc->started = false;
}

int local_start(const struct local_cfg *cfg, const struct local_hooks *hooks, struct local **out)
{
	struct local *lc = lc_new(cfg, hooks);
	if (lc == NULL)
		return log_fail(UNISUM_ENOMEM, "worker %d: out of memory", cfg->rank);
	/* Peers read and write this process's buffers: under Yama's
	 * ptrace_scope 1 that needs our leave (EINVAL without Yama). */
	prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
	int rc = lc_attach(lc, cfg);
	if (rc == 0 && (rc = lc_spawn_all(lc, cfg)) != 0)
		lc_stop_threads(lc);
	if (rc != 0) {
		lc_unmap(lc);
		return rc;
	}
	LOG_INFO("local rank %d of %d on machine %d: shared-memory reduce ready", cfg->local_rank,
		 cfg->local_size, cfg->machine);
	*out = lc;
	return 0;
}

void local_stop(struct local *lc)
{
	if (lc == NULL)
		return;
	lc_stop_threads(lc);
	lc_unmap(lc);
}

int local_submit(struct local *lc, const struct local_req *req, struct local_op **out)
{
	struct local_op *op = calloc(1, sizeof *op);
	struct lc_peer *peers = calloc((size_t)lc->cfg.local_size, sizeof *peers);
	if (op == NULL || peers == NULL) {
		free(op);
		free(peers);
		return log_fail(UNISUM_ENOMEM, "worker %d: out of memory", lc->cfg.rank);
	}
	op->lc = lc;
	op->req = *req;
	op->peers = peers;
	pthread_mutex_lock(&lc->lock);
	bool fresh;
	struct lc_entry *e = lc_claim(lc, req->key, &fresh);
	if (e == NULL) {
		pthread_mutex_unlock(&lc->lock);
		free(op);
		free(peers);
		return log_fail(UNISUM_ENOMEM, "worker %d: more than %d tensor cuts on the local path",
				lc->cfg.rank, LC_TABLE);
	}
	for (uint32_t p = 0; p < req->nparts; p++)
		op->bytes += req->parts[p].count * unisum_dtype_size(req->dtype);
	uint64_t in_arena = lc_arena_offset(lc, req->in, op->bytes);
	uint64_t out_arena = lc_arena_offset(lc, req->out, op->bytes);
	if (lc->staging && op->bytes >= lc->cfg.stage_bytes && req->in != NULL && in_arena == 0)
		op->region = lc_region_take(lc, op->bytes);
	/* Reset everything of the new round, then publish it. */
	atomic_store(&e->err, 0);
	atomic_store(&e->in_arena, in_arena);
	atomic_store(&e->out_arena, out_arena);
	atomic_store(&e->region, op->region);
	atomic_store(&e->staged, lc_pack(req->round, 0));
	atomic_store(&e->in, (uint64_t)(uintptr_t)req->in);
	atomic_store(&e->out, (uint64_t)(uintptr_t)req->out);
	atomic_store(&e->wire_op, req->wire_op);
	atomic_store(&e->reduced, lc_pack(req->round, 0));
	atomic_store(&e->pulled, lc_pack(req->round, 0));
	atomic_store(&e->bcast, lc_pack(req->round, 0));
	atomic_store_explicit(&e->round, req->round, memory_order_release);
	if (!fresh && atomic_load(&e->retired)) {
		/* A name declared again after every rank here undeclared it, and
		 * before this rank buried its old entry: the entry lives again
		 * (and leaves the list of those to bury). */
		for (int i = 0; i < lc->nforgot; i++) {
			if (lc->forgot[i] == req->key) {
				lc->forgot[i] = lc->forgot[--lc->nforgot];
				break;
			}
		}
		/* After the new round: a peer that sees it live reads the
		 * new round. */
		atomic_store_explicit(&e->retired, 0, memory_order_release);
	}
	if (fresh) {
		atomic_store(&e->retired, 0);
		atomic_store_explicit(&e->key, req->key + 1, memory_order_release);
	}
	op->mine = e;
	op->seq = lc->next_seq++;
	*out = op;
	q_push(&lc->reduce_q, op);
	if (op->region != 0) {
		if (lc->stage_tail != NULL)
			lc->stage_tail->stage_next = op;
		else
			lc->stage_head = op;
		lc->stage_tail = op;
	}
	pthread_mutex_unlock(&lc->lock);
	lc_post(lc);
	return 0;
}

void local_forget(struct local *lc, uint64_t key)
{
	pthread_mutex_lock(&lc->lock);
	struct lc_entry *e = lc->started ? lc_find(lc, lc->cfg.local_rank, key) : NULL;
	if (e != NULL) {
		atomic_store(&e->retired, 1);
		if (lc->nforgot == lc->capforgot) {
			int cap = lc->capforgot ? 2 * lc->capforgot : 64;
			uint64_t *f = realloc(lc->forgot, (size_t)cap * sizeof *f);
			if (f != NULL) {
				lc->forgot = f;
				lc->capforgot = cap;
			}
		}
		/* Out of memory: the entry stays, only its slot is lost. */
		if (lc->nforgot < lc->capforgot)
			lc->forgot[lc->nforgot++] = key;
		lc_reclaim(lc);
	}
	pthread_mutex_unlock(&lc->lock);
}

void local_pulled(struct local_op *op, uint32_t part, int err, const char *why)
{
	struct local *lc = op->lc;
	(void)part;
	pthread_mutex_lock(&lc->lock);
	if (err != 0 && op->err == 0) {
		op->err = err;
		snprintf(op->why, sizeof op->why, "%s", why ? why : unisum_strerror(err));
	}
	uint32_t n = ++op->npulled;
	if (err != 0)
		atomic_store(&op->mine->err, err);
	atomic_store_explicit(&op->mine->pulled, lc_pack(op->req.round, n), memory_order_release);
	/* Posted under the lock: once it is released the operation may
	 * complete, the job shut down and the segment go. */
	lc_post(lc);
	pthread_cond_broadcast(&lc->cond);
	pthread_mutex_unlock(&lc->lock);
}

uint64_t local_summed_bytes(struct local *lc)
{
	return atomic_load(&lc->summed_bytes);
}
