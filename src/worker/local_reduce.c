/*
 * local_reduce.c - LOCAL_REDUCE and LOCAL_BROADCAST: each rank sums its
 * slice of every partition straight from its peers' buffers (cross-memory
 * attach, or plain loads from their arenas), writes it where it belongs,
 * and, with several machines, copies the result from the local root.  See
 * local.c's DESIGN.
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

/* ---- copies ---------------------------------------------------------------- */

/* Copies to memory that another core reads next: non-temporal stores skip
 * reading the destination into this core's cache first. */
static void lc_copy_nt(void *dst, const void *src, size_t n)
{
#ifdef __SSE2__
	char *d = dst;
	const char *s = src;
	size_t head = (16 - ((uintptr_t)d & 15)) & 15;
	if (head > n)
		head = n;
	memcpy(d, s, head);
	d += head;
	s += head;
	n -= head;
	size_t i = 0;
	for (; i + 64 <= n; i += 64) {
		__m128i a = _mm_loadu_si128((const __m128i *)(s + i));
		__m128i b = _mm_loadu_si128((const __m128i *)(s + i + 16));
		__m128i c = _mm_loadu_si128((const __m128i *)(s + i + 32));
		__m128i e = _mm_loadu_si128((const __m128i *)(s + i + 48));
		_mm_stream_si128((__m128i *)(d + i), a);
		_mm_stream_si128((__m128i *)(d + i + 16), b);
		_mm_stream_si128((__m128i *)(d + i + 32), c);
		_mm_stream_si128((__m128i *)(d + i + 48), e);
	}
	memcpy(d + i, s + i, n - i);
	_mm_sfence();
#else
	memcpy(dst, src, n);
#endif
}

static int lc_vm(bool write, struct local_op *op, int q, void *local, uint64_t remote, size_t n)
{
	struct local *lc = op->lc;
	pid_t pid = op->peers[q].pid;
	int rc = shm_vm_copy(pid, write, local, remote, n);
	if (rc == 0)
		return 0;
	if (rc == -ESRCH)
		lc_fail(op, UNISUM_ECONN, "worker %d (local rank %d of machine %d, pid %d) died while "
			"worker %d was summing with it", lc_rank_of(lc, q), q, lc->cfg.machine, (int)pid,
			lc->cfg.rank);
	else
		lc_fail(op, UNISUM_ESYS, "worker %d cannot %s the memory of worker %d (pid %d) with %s: "
			"%s; the local reduce needs cross-memory attach (a container without "
			"CAP_SYS_PTRACE or kernel.yama.ptrace_scope >= 2 forbids it); run with "
			"UNISUM_LOCAL_SIZE=1 (`unisum launch --local-size 1`) to go through the servers "
			"instead", lc->cfg.rank, write ? "write" : "read", lc_rank_of(lc, q), (int)pid,
			write ? "process_vm_writev" : "process_vm_readv", strerror(-rc));
	return lc_err(op);
}

/* ---- LOCAL_REDUCE --------------------------------------------------------- */

/* Elements [*s, *e) of a partition of `count` that local rank r sums:
 * equal slices, cut on 64-byte boundaries. */
static void lc_slice(uint64_t count, size_t esize, int r, int L, uint64_t *s, uint64_t *e)
{
	uint64_t align = 64 / esize;
	uint64_t per = (count + (uint64_t)L - 1) / (uint64_t)L;
	per = (per + align - 1) / align * align;
	uint64_t a = per * (uint64_t)r, b = a + per;
	*s = a < count ? a : count;
	*e = b < count ? b : count;
}

/* Sums (or folds with the collective's reduction: min, max, product, the
 * OR of an allgather) elements [off, off + n) of every rank's input, in
 * rank order, into dst (n * esize <= LC_CHUNK). */
static int lc_sum_chunk(struct local_op *op, void *dst, uint64_t off, size_t n, size_t esize)
{
	struct local *lc = op->lc;
	const int me = lc->cfg.local_rank;
	const reducer_op red = (reducer_op)wire_op_reduction(op->req.wire_op);
	size_t bytes = n * esize;
	const void *first = NULL;
	int have = 0, tmp = 0;
	for (int q = 0; q < lc->cfg.local_size; q++) {
		const void *src;
		if (q == me) {
			if (op->req.in == NULL)
				continue;
			src = (const char *)op->req.in + off * esize;
		} else if (op->peers[q].in == 0) {
			continue;
		} else if (op->peers[q].in_map != NULL) {
			src = op->peers[q].in_map + off * esize;	/* unisum_alloc: read in place */
		} else if (op->peers[q].region != NULL) {
			src = op->peers[q].region + off * esize;	/* it staged our slice */
		} else {
			/* A second peer needs the other buffer while the first waits. */
			void *buf = lc->tmp[tmp];
			int rc = lc_vm(false, op, q, buf, op->peers[q].in + off * esize, bytes);
			if (rc != 0)
				return rc;
			if (have == 0)
				tmp ^= 1;
			src = buf;
		}
		if (have == 0)
			first = src;
		else if (have == 1)
			reducer_fold(red, dst, first, src, n, op->req.dtype);
		else
			reducer_fold_into(red, dst, src, n, op->req.dtype);
		have++;
	}
	if (have == 0)
		memset(dst, 0, bytes);
	else if (have == 1 && first != dst)
		memcpy(dst, first, bytes);
	atomic_fetch_add(&lc->summed_bytes, (uint64_t)have * bytes);
	return 0;
}

/* Root of several machines: pushes every partition from *next on that all
 * ranks have summed; with `wait`, waits for them all. */
static int lc_push_ready(struct local_op *op, uint32_t *next, bool wait)
{
	struct local *lc = op->lc;
	while (*next < op->req.nparts) {
		uint32_t want = *next + 1;
		int rc = lc_cond_reduced(op, &want);
		if (rc == 0 && wait)
			rc = lc_wait(op, lc_cond_reduced, &want, "the machine's local sum") == 0 ? 1 : -1;
		if (rc < 0)
			return lc_err(op);
		if (rc == 0)
			return 0;
		pthread_mutex_lock(&lc->lock);
		op->pushed++;
		pthread_mutex_unlock(&lc->lock);
		lc->hooks.push(op->req.ctx, (*next)++);
	}
	return 0;
}

/* Staging: copies this rank's input slices of partition p that the other
 * ranks sum into its region, at their places in the tensor. */
void lc_stage(struct local_op *op, uint8_t *region, uint32_t p)
{
	struct local *lc = op->lc;
	const struct placement_part *part = &op->req.parts[p];
	const size_t esize = unisum_dtype_size(op->req.dtype);
	if (op->req.in != NULL) {
		for (int r = 0; r < lc->cfg.local_size; r++) {
			if (r == lc->cfg.local_rank)
				continue;
			uint64_t s, e;
			lc_slice(part->count, esize, r, lc->cfg.local_size, &s, &e);
			size_t off = (size_t)(part->offset + s) * esize;
			lc_copy_nt(region + off, (const uint8_t *)op->req.in + off, (size_t)(e - s) * esize);
		}
	}
	atomic_store_explicit(&op->mine->staged, lc_pack(op->req.round, p + 1), memory_order_release);
	lc_post(lc);
}

uint8_t *lc_my_region(const struct local_op *op)
{
	const struct local *lc = op->lc;
	return op->region != 0 ? (uint8_t *)shm_seg_data(&lc->arenas[lc->cfg.local_rank]) + op->region - 1
			       : NULL;
}

int lc_reduce(struct local_op *op)
{
	struct local *lc = op->lc;
	const int me = lc->cfg.local_rank, L = lc->cfg.local_size;
	const bool one_machine = lc->cfg.machines == 1;
	const size_t esize = unisum_dtype_size(op->req.dtype);
	const size_t chunk = LC_CHUNK / esize;
	int rc = lc_wait(op, lc_cond_posted, NULL, "the other local workers to start this push_pull");
	if (rc != 0)
		return rc;
	uint8_t *region = lc_my_region(op);
	uint32_t next_push = 0;
	int64_t t0 = op->req.traced ? trace_now_us() : 0;
	for (uint32_t p = 0; p < op->req.nparts; p++) {
		const struct placement_part *part = &op->req.parts[p];
		uint32_t want = p + 1;
		if ((rc = lc_wait(op, lc_cond_staged, &want, "the other local workers' staging")) != 0)
			return rc;
		uint64_t s, e;
		lc_slice(part->count, esize, me, L, &s, &e);
		for (uint64_t at = part->offset + s; at < part->offset + e; at += chunk) {
			size_t n = (size_t)(part->offset + e - at < chunk ? part->offset + e - at : chunk);
			size_t bytes = n * esize;
			void *dst = one_machine || me == 0 ? (char *)op->req.out + at * esize : lc->acc;
			/* In place, the sum of the ranks before this one would
			 * overwrite its own input before it is added: sum aside. */
			bool alias = op->req.in != NULL && me > 0 &&
				     dst == (const char *)op->req.in + at * esize;
			rc = lc_sum_chunk(op, alias ? lc->acc : dst, at, n, esize);
			if (rc == 0 && alias)
				memcpy(dst, lc->acc, bytes);
			if (rc == 0 && one_machine && op->req.divisor > 1)
				reducer_divide(dst, n, op->req.dtype, op->req.divisor);
			if (rc == 0 && region != NULL) {
				/* The others copy this slice's sum from here. */
				lc_copy_nt(region + at * esize, dst, bytes);
				continue;
			}
			for (int q = 0; rc == 0 && q < L; q++) {
				if (q == me || !(one_machine || q == 0))
					continue;
				if (op->peers[q].out_map != NULL)
					lc_copy_nt(op->peers[q].out_map + at * esize, dst, bytes);
				else
					rc = lc_vm(true, op, q, dst, op->peers[q].out + at * esize, bytes);
			}
			if (rc != 0)
				return rc;
		}
		atomic_store_explicit(&op->mine->reduced, lc_pack(op->req.round, p + 1),
				      memory_order_release);
		lc_post(lc);
		if (op->req.traced) {
			int64_t t1 = trace_now_us();
			trace_span(TRACE_LOCAL_REDUCE, op->req.tensor, p, op->req.step,
				   op->req.key + p, part->count * esize, 0, t0, t1);
			t0 = t1;
		}
		if (!one_machine && me == 0 && (rc = lc_push_ready(op, &next_push, false)) != 0)
			return rc;
	}
	if (!one_machine && me == 0)
		return lc_push_ready(op, &next_push, true);
	return 0;
}

/* ---- LOCAL_BROADCAST ------------------------------------------------------ */

/* Several machines, not the root: every reply is in the root's output. */
static int lc_cond_root_pulled(struct local_op *op, void *arg)
{
	(void)arg;
	int err = lc_peer_failed(op, 0);
	if (err != 0)
		return err;
	op->blocker = 0;
	return lc_count(&op->peers[0].e->pulled, op->req.round) >= op->req.nparts;
}

/* Every other rank has let go of this round's buffers (copied the result,
 * or gave up). */
int lc_cond_let_go(struct local_op *op, void *arg)
{
	struct local *lc = op->lc;
	(void)arg;
	for (int q = 0; q < lc->cfg.local_size; q++) {
		if (q == lc->cfg.local_rank)
			continue;
		struct lc_entry *e = op->peers[q].e;
		op->blocker = q;
		if (e != NULL && lc_count(&e->bcast, op->req.round) == 0 &&
		    shm_pid_is_alive(op->peers[q].pid))
			return 0;
	}
	return 1;
}

/* The root's own replies are all in (process-local wait). */
static void lc_await_pulls(struct local_op *op)
{
	struct local *lc = op->lc;
	pthread_mutex_lock(&lc->lock);
	while (op->npulled < op->pushed) {
		struct timespec until = timing_deadline(LC_SLICE_MS);
		pthread_cond_timedwait(&lc->cond, &lc->lock, &until);
	}
	pthread_mutex_unlock(&lc->lock);
}

/* After a failure: marks this rank's part failed and gives the peers a
 * moment to stop touching its buffers before the caller gets them back. */
static void lc_quiesce(struct local_op *op)
{
	struct local *lc = op->lc;
	int err = lc_err(op);
	atomic_store(&op->mine->err, err != 0 ? err : UNISUM_ECONN);
	atomic_store_explicit(&op->mine->bcast, lc_pack(op->req.round, 1), memory_order_release);
	lc_post(lc);
	/* A peer that has not posted this round yet is not waited for: it
	 * sees this error before it reads anything here (lc_cond_posted). */
	atomic_thread_fence(memory_order_seq_cst);
	int64_t until = timing_now_ms() + LC_QUIESCE_MS;
	while (timing_now_ms() < until) {
		bool busy = false;
		for (int q = 0; q < lc->cfg.local_size && !busy; q++) {
			struct lc_peer *p = &op->peers[q];
			if (q == lc->cfg.local_rank || p->e == NULL || !shm_pid_is_alive(p->pid))
				continue;
			if (atomic_load_explicit(&p->e->round, memory_order_acquire) != op->req.round)
				continue;
			busy = atomic_load(&p->e->err) == 0 &&
			       (lc_count(&p->e->reduced, op->req.round) < op->req.nparts ||
				lc_count(&p->e->bcast, op->req.round) == 0);
		}
		if (!busy)
			return;
		uint32_t seq = shm_flag_load(&lc->seg->flag);
		shm_flag_wait(&lc->seg->flag, seq + 1, LC_SLICE_MS);
	}
}

/* This rank's LOCAL_BROADCAST spans: one per partition, from `since`. */
static void lc_trace_bcast(const struct local_op *op, int64_t since)
{
	if (!op->req.traced)
		return;
	int64_t now = trace_now_us();
	size_t esize = unisum_dtype_size(op->req.dtype);
	for (uint32_t p = 0; p < op->req.nparts; p++)
		trace_span(TRACE_LOCAL_BROADCAST, op->req.tensor, p, op->req.step, op->req.key + p,
			   op->req.parts[p].count * esize, 0, since, now);
}

void lc_broadcast(struct local_op *op)
{
	struct local *lc = op->lc;
	const int me = lc->cfg.local_rank;
	const bool one_machine = lc->cfg.machines == 1;
	int64_t since = op->req.traced ? trace_now_us() : 0;
	bool ok = lc_err(op) == 0;
	if (ok && one_machine) {
		/* Ranks that stage leave their slice's sum in their region, the
		 * others write it into this rank's output themselves. */
		const size_t esize = unisum_dtype_size(op->req.dtype);
		for (uint32_t p = 0; p < op->req.nparts; p++) {
			uint32_t want = p + 1;
			if (lc_wait(op, lc_cond_reduced, &want, "the other local workers' sums") != 0)
				break;
			/* In place, the slices copied in below are what this rank's
			 * staging thread read for the others; their sums imply it
			 * finished, and this acquire says so to this process too
			 * (ThreadSanitizer cannot see through the other ranks). */
			while (op->region != 0 && lc_count(&op->mine->staged, op->req.round) < want)
				sched_yield();
			const struct placement_part *part = &op->req.parts[p];
			for (int r = 0; r < lc->cfg.local_size; r++) {
				if (r == me || op->peers[r].region == NULL)
					continue;
				uint64_t s, e;
				lc_slice(part->count, esize, r, lc->cfg.local_size, &s, &e);
				size_t off = (size_t)(part->offset + s) * esize;
				memcpy((uint8_t *)op->req.out + off, op->peers[r].region + off,
				       (size_t)(e - s) * esize);
			}
		}
	} else if (ok && me != 0) {
		if (lc_wait(op, lc_cond_root_pulled, NULL, "the local root's pull") == 0) {
			size_t bytes = 0;
			for (uint32_t p = 0; p < op->req.nparts; p++)
				bytes += op->req.parts[p].count;
			bytes *= unisum_dtype_size(op->req.dtype);
			if (op->peers[0].out_map != NULL)
				memcpy(op->req.out, op->peers[0].out_map, bytes);
			else
				lc_vm(false, op, 0, op->req.out, op->peers[0].out, bytes);
		}
	}
	if (!one_machine && me == 0) {
		/* Replies write into the output until the last one is in. */
		lc_await_pulls(op);
	}
	if (lc_err(op) != 0) {
		lc_quiesce(op);
	} else {
		atomic_store_explicit(&op->mine->bcast, lc_pack(op->req.round, 1), memory_order_release);
		lc_post(lc);
	}
	lc_trace_bcast(op, since);
}
