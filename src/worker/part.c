/*
 * part.c - an operation's partitions: which this machine pushes and
 * pulls, their place in the PUSH stage's order, zeroing what is not this
 * rank's, completing one, and freeing an operation.
 *
 * What cuts.c needs of an operation as it launches a cut, and what the
 * connection layer calls (through its upcalls) as a partition ends; it
 * calls nothing above phase.c.  Filing, starting and waiting are op.c's.
 * The state it shares with the rest of the worker is in worker_int.h.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include "trace/trace.h"
#include "worker/worker_int.h"

/* Frees what an operation (or the template of one) owns beside itself. */
void wk_op_free_owned(const struct wk_op *op)
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

void wk_op_free(struct wk_op *op)
{
	while (op->held != NULL) {	/* never supplied: its operation failed */
		struct wk_job *j = op->held;
		op->held = j->next;
		free(j);
	}
	wk_op_free_owned(op);
	free(op);
}

/* Completes one partition of an operation (err 0 or negative). */
void wk_op_part_done(struct wk_op *op, int err, const char *why)
{
	struct worker *w = op->w;
	pthread_mutex_lock(&w->lock);
	if (err != 0 && op->error == 0) {
		op->error = err;
		snprintf(op->why, sizeof op->why, "%s", why);
	}
	if (--op->remaining == 0) {
		if (op->copy_bytes > 0 && op->error == 0) {
			/* This rank's part of the result goes to the caller; no
			 * other thread touches the operation until it is done. */
			pthread_mutex_unlock(&w->lock);
			memcpy(op->copy_to, op->copy_from, op->copy_bytes);
			pthread_mutex_lock(&w->lock);
		}
		if (op->traced)
			trace_span(TRACE_TENSOR, op->t->index, 0, op->round, op->t->cuts[0].key,
				   op->t->count * op->t->esize, 0, op->t_start, trace_now_us());
		op->done = true;
		op->t->busy = false;
		if (op->error == 0) {
			atomic_fetch_add(&w->operations, 1);
			wk_stats_done(w, op);
		}
		pthread_cond_broadcast(&w->done_cond);
		wk_begun_release(w);
	}
	pthread_mutex_unlock(&w->lock);
}

/* Whether spans (sorted, disjoint; NULL: all) meet [lo, hi). */
static bool wk_spans_meet(const struct wk_span *sp, int n, uint64_t lo, uint64_t hi)
{
	if (sp == NULL)
		return true;
	for (int i = 0; i < n && sp[i].lo < hi; i++)
		if (sp[i].hi > lo)
			return true;
	return false;
}

/* Whether this machine pushes data for the partition of [offset, offset +
 * count) (else ZERO) and pulls its result (else a PULL with SKIP). */
void wk_job_sets(const struct wk_op *op, uint64_t offset, uint64_t count, bool *push, bool *pull)
{
	*push = wk_spans_meet(op->push_spans, op->npush_spans, offset, offset + count);
	*pull = wk_spans_meet(op->pull_spans, op->npull_spans, offset, offset + count);
}

/* Allgather and alltoall: zeroes what is not this rank's in every
 * partition of cut L that this machine pushes, so that the OR on the
 * servers (and in the local reduce) keeps the other ranks' bits.  Only
 * those partitions: the others are pushed ZERO and their bytes here never
 * read. */
void wk_zero_pushed(const struct wk_op *op, const struct wk_layout *L)
{
	if (op->own_spans == NULL || op->direct != NULL)
		return;	/* direct: every partition pushed is wholly this rank's */
	size_t es = op->t->esize;
	uint8_t *buf = (uint8_t *)op->in;	/* the operation's own buffer (out or scratch) */
	const struct wk_span *own = op->own_spans;
	int k = 0;
	for (uint32_t i = 0; i < L->nparts; i++) {
		uint64_t lo = L->parts[i].offset, hi = lo + L->parts[i].count;
		bool push, pull;
		wk_job_sets(op, lo, L->parts[i].count, &push, &pull);
		if (!push)
			continue;
		while (k > 0 && own[k - 1].hi > lo)
			k--;
		uint64_t at = lo;
		for (; k < op->nown_spans && own[k].lo < hi; k++) {
			if (own[k].hi <= at)
				continue;
			if (own[k].lo > at)
				memset(buf + at * es, 0, (own[k].lo - at) * es);
			at = own[k].hi;
		}
		if (at < hi)
			memset(buf + at * es, 0, (hi - at) * es);
	}
}

/* Where partition `part` of cut L goes in the PUSH stage's order (its
 * sched key).  Ordinarily its key.  On a homed cut the partitions of one
 * machine's segments lie on one server, so if every machine pushed them
 * in key order, all would push to server 0's host at once, then all to
 * the next: one busy link at a time.  Machine m starts at the segments
 * of machine m + 1 instead (op->rot_offset) and wraps around, so at each
 * moment every machine pushes to another host, as a ring does. */
uint64_t wk_push_order(const struct wk_op *op, const struct wk_layout *L, uint32_t part)
{
	if (L->homed == 0 || op->rot_offset == 0 || L->nparts == 0)
		return L->key + part;
	uint32_t start = 0;
	while (start < L->nparts && L->parts[start].offset < op->rot_offset)
		start++;
	return L->key + (part + L->nparts - start % L->nparts) % L->nparts;
}

void wk_nothing_pushed(struct worker *w, struct wk_op *op)
{
	if (op->nothing_unacked > 0 && --op->nothing_unacked == 0)
		pthread_cond_broadcast(&w->done_cond);
}
