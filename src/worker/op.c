/*
 * op.c - operations: filing one, starting its partitions and waiting for it (part.c completes it).
 * The state it shares with the rest of the worker is in worker_int.h.
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
	op->t_start = trace_now_us();
	wk_stats_started(w, op);
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
int wk_start(struct worker *w, int tensor, const struct wk_op *tmpl, unisum_handle *h)
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

/* Finds an unreleased operation; call with w->lock held. */
int wk_find_op(const struct worker *w, unisum_handle h)
{
	for (int i = 0; i < w->nops; i++)
		if (w->ops[i]->handle == h)
			return i;
	return -1;
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
 * (w->lock held).  Also when it did end: a rank with no rows of its own
 * may have every other row before it supplies (unisum.h's contract is
 * still "not until supplied", whatever the timing); a failure, though, is
 * its answer. */
static int wk_waitable(const struct worker *w, unisum_handle h, const char *what, int *i)
{
	*i = wk_find_op(w, h);
	if (*i < 0)
		return log_fail(UNISUM_EINVAL, "%s: unknown or already released handle %lld", what,
				(long long)h);
	const struct wk_op *op = w->ops[*i];
	if (op->deferred && !op->supplied && !(op->done && op->error != 0))
		return log_fail(UNISUM_EINVAL, "%s: handle %lld is an allgather begun and not "
				"supplied (unisum_allgather_supply): it cannot complete until then",
				what, (long long)h);
	return 0;
}

/* An operation's failure goes to its caller only once the transport
 * reads none of the buffers lent before it (UCX: a push handed to it
 * before its link was shut; transport.h's lent_settle): the caller may
 * free them then, and a freed buffer sent after all would be summed as
 * this worker's push by a server the job kept (elastic jobs, failover).
 * Bounded; not under w->lock; not for a wait refused (no operation). */
#define WK_LENT_SETTLE_MS 2000

static void wk_settle_if_failed(struct worker *w, bool op_failed)
{
	int left = op_failed ? transport_lent_settle(w->tp, WK_LENT_SETTLE_MS) : 0;
	if (left > 0)
		LOG_WARN("worker %d: %d lent send(s) still under way %d ms after an operation "
			 "failed; its buffers go back to the caller all the same", w->rank, left,
			 WK_LENT_SETTLE_MS);
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
	bool failed = false;
	if (rc == 0) {
		struct wk_op *op = w->ops[i];
		int timed_out = 0;
		while (!op->done && timeout_ms > 0 && !timed_out)
			timed_out = pthread_cond_timedwait(&w->done_cond, &w->lock, &until);
		if (!op->done) {
			rc = 0;
		} else {
			rc = wk_release(w, wk_find_op(w, h), &retire);
			failed = rc < 0;
			if (rc == 0)
				rc = 1;
		}
	}
	pthread_mutex_unlock(&w->lock);
	wk_dssync_retire(w, retire);
	wk_settle_if_failed(w, failed);
	return rc;
}

int worker_wait(struct worker *w, unisum_handle h)
{
	if (wk_require_init(w) != 0)
		return UNISUM_ENOTINIT;
	pthread_mutex_lock(&w->lock);
	int i, rc = wk_waitable(w, h, "unisum_wait", &i), retire = -1;
	bool failed = false;
	if (rc == 0) {
		struct wk_op *op = w->ops[i];
		while (!op->done)
			pthread_cond_wait(&w->done_cond, &w->lock);
		rc = wk_release(w, wk_find_op(w, h), &retire);
		failed = rc < 0;
	}
	pthread_mutex_unlock(&w->lock);
	wk_dssync_retire(w, retire);
	wk_settle_if_failed(w, failed);
	return rc;
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
