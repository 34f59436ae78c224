/*
 * gather.c - the gathering collectives: allgather (with its begun rounds and ring phases), reduce-scatter and alltoall, on push_pull's rounds.
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
/* Why an allgather begun ahead (unisum_allgather_begin) is refused: it
 * runs with one worker a machine only (logged), and is refused as every
 * gathering collective is while a rank has joined, but not logged: it is
 * begun ahead of a call, which says so itself if it comes.  0 when it is
 * not. */
static int wk_begin_refused(struct worker *w, const char *what)
{
	if (w->local)
		return log_fail(UNISUM_EINVAL, "%s: runs with one worker a machine only (worker %d has "
				"%d on its machine); use unisum_allgather_async", what, w->rank,
				w->cfg.local_size);
	pthread_mutex_lock(&w->lock);
	bool joining = w->join_seen && !w->joined;
	pthread_mutex_unlock(&w->lock);
	if (joining) {
		log_set_last_error("%s: a rank has joined (unisum_join), and until every rank "
				   "has, only push_pull runs (worker %d)", what, w->rank);
		return UNISUM_EINVAL;
	}
	return 0;
}

/* An allgather with one worker per machine: this rank's rows go out from
 * `in`, every row comes straight into `out`; its pulls run in ring phases
 * (wk_phases_plan) for the global set.  See wk_allgather. */
static int wk_allgather_direct(struct worker *w, int tensor, const void *in, void *out,
			       const uint64_t *counts, bool deferred, size_t es, unisum_handle *h)
{
	int n = w->size, first, end;
	uint64_t lo = 0;
	wk_machine_ranks(w, &first, &end);
	struct wk_op tmpl = {.in = in, .out = out, .deferred = deferred,
			     .wire_op = WIRE_OP(WIRE_OP_ALLGATHER, wk_layout_hash(counts, (size_t)n))};
	tmpl.direct = calloc((size_t)n, sizeof *tmpl.direct);
	if (tmpl.direct == NULL || wk_segs_set(w, &tmpl.segs, (uint32_t)n, counts, NULL,
					   wk_phase_pbytes(w, counts, (size_t)n, es)) != 0) {
		free(tmpl.direct);
		return UNISUM_ENOMEM;
	}
	for (int r = 0; r < n; r++) {
		/* Its own rows it copies into `out` (wk_start) rather than
		 * pulls back from the server, which still needs them, for the
		 * others; they go out from there: `in` may lie inside `out`,
		 * where the others' rows land. */
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
	if (tmpl.segs.pbytes != 0)
		tmpl.nphases = n;
	return wk_start(w, tensor, &tmpl, h);
}

/* Allgather of every rank's counts[r] rows of `tensor` (from `in`, or
 * `deferred`: supplied later, unisum_allgather_supply) into `out`, in rank
 * order.  With several workers a machine, each rank's rows go into place
 * in `out` and the machine pushes its ranks' rows (the local reduce ORs
 * them).  0 with *h, or an error (logged). */
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
	if (deferred && (rc = wk_begin_refused(w, what)) != 0)
		return rc;
	int n = w->size, first, end;
	wk_machine_ranks(w, &first, &end);
	uint64_t lo = 0, mlo = 0, mhi = 0;
	struct wk_span own = {0, 0};
	uint64_t rot = 0;
	if (!w->local)
		return wk_allgather_direct(w, tensor, in, out, counts, deferred, es, h);
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
		int rc = pushq_push(&w->push_q, &j->entry);
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

/* Alltoall with one worker per machine: each block goes out of `in` and
 * comes into `out` where it lies there (tmpl->direct).  0 or
 * UNISUM_ENOMEM (tmpl->direct then freed). */
static int wk_alltoall_direct(const struct worker *w, struct wk_op *tmpl, const void *in,
			      void *out, const uint64_t *counts, const uint64_t *base, size_t es)
{
	size_t n = (size_t)w->size, me = (size_t)w->rank;
	uint64_t *sent_at = calloc(n + 1, sizeof *sent_at), got_at = 0;
	tmpl->in = in;
	tmpl->out = out;
	tmpl->direct = calloc(n * n + 1, sizeof *tmpl->direct);
	if (tmpl->direct == NULL || sent_at == NULL) {
		free(tmpl->direct);
		tmpl->direct = NULL;
		free(sent_at);
		return UNISUM_ENOMEM;
	}
	for (size_t d = 0; d < n; d++)
		sent_at[d + 1] = sent_at[d] + counts[me * n + d];
	for (size_t d = 0; d < n; d++) {
		uint64_t at = base[d];
		for (size_t s = 0; s < n; s++) {
			uint64_t c = counts[s * n + d];
			tmpl->direct[d * n + s] = (struct wk_direct){
				at, at + c,
				s == me ? (const uint8_t *)in + sent_at[d] * es : NULL,
				d == me ? (uint8_t *)out + got_at * es : NULL};
			if (d == me)
				got_at += c;
			at += c;
		}
	}
	tmpl->ndirect = (int)(n * n);
	free(sent_at);
	return 0;
}

/* Alltoall with several workers per machine: the machine's local reduce
 * ORs every rank's blocks, so each rank places its own in a scratch
 * buffer of the whole tensor (`total` elements; wk_launch zeroes the rest
 * of the partitions the machine pushes), and copies out what it
 * receives.  Ranks [first, end) are this machine's.  0 or UNISUM_ENOMEM
 * (what it allocated freed). */
static int wk_alltoall_scratch(const struct worker *w, struct wk_op *tmpl, const void *in,
			       void *out, const uint64_t *counts, const uint64_t *base,
			       uint64_t total, size_t es, int first, int end)
{
	size_t n = (size_t)w->size, me = (size_t)w->rank;
	struct wk_span *push = calloc(n * (size_t)(end - first) + 1, sizeof *push);
	struct wk_span *own = calloc(n + 1, sizeof *own);
	void *scratch = malloc(total * es > 0 ? total * es : 1);
	int npush = 0, nown = 0;
	uint64_t sent = 0;
	tmpl->pull_spans = wk_one_span(base[first], base[end], &tmpl->npull_spans);
	if (push == NULL || own == NULL || scratch == NULL || tmpl->pull_spans == NULL) {
		free(push);
		free(own);
		free(scratch);
		free(tmpl->pull_spans);
		tmpl->pull_spans = NULL;
		return UNISUM_ENOMEM;
	}
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
	tmpl->in = scratch;
	tmpl->out = scratch;
	tmpl->scratch = scratch;
	tmpl->push_spans = push;
	tmpl->npush_spans = npush;
	tmpl->own_spans = own;
	tmpl->nown_spans = nown;
	tmpl->copy_from = (uint8_t *)scratch + base[me] * es;
	tmpl->copy_to = out;
	tmpl->copy_bytes = (base[me + 1] - base[me]) * es;
	return 0;
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
	if (rc == 0)
		rc = w->local ? wk_alltoall_scratch(w, &tmpl, in, out, counts, base, total, es, first,
						    end)
			      : wk_alltoall_direct(w, &tmpl, in, out, counts, base, es);
	free(base);
	if (rc != 0) {
		free(tmpl.segs.counts);
		free(tmpl.segs.owners);
		return rc;
	}
	return wk_start(w, tensor, &tmpl, h);
}
