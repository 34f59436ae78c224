/*
 * local_wait.c - the machine segment's table and the waits of the local
 * path: finding, claiming and burying a rank's entry of a key (local.c's
 * DESIGN, "Entries of undeclared tensors"), a local operation's error,
 * and waiting on the peers (DESIGN, "Waiting") for the conditions of the
 * stages.  Below local_reduce.c and local.c, which both wait here; the
 * state they share is in lc_int.h.
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "log/log.h"
#include "shm/shm.h"
#include "timing/timing.h"
#include "wire/wire.h"
#include "worker/lc_int.h"
#include "worker/local.h"

/* ---- the table ----------------------------------------------------------- */

static size_t lc_slot(uint64_t key)
{
	uint64_t h = key * 0x9e3779b97f4a7c15ull;
	return (size_t)(h >> 40) % LC_TABLE;
}

/* Rank q's entry for `key`, or NULL when it has none (yet). */
struct lc_entry *lc_find(struct local *lc, int q, uint64_t key)
{
	struct lc_entry *t = lc->seg->ranks[q].table;
	for (size_t i = 0, s = lc_slot(key); i < LC_TABLE; i++, s = (s + 1) % LC_TABLE) {
		uint64_t k = atomic_load_explicit(&t[s].key, memory_order_acquire);
		if (k == key + 1)
			return &t[s];
		if (k == 0)
			return NULL;
	}
	return NULL;
}

/* Frees this rank's entry e.  A slot followed by a free one is free again
 * (no key's probe goes through it: it would stop at the next one anyway),
 * and so, going back, is every tombstone before it; otherwise it becomes
 * a tombstone, which lookups pass over.  Without this, one-shot keys would
 * fill the table with tombstones and every miss would scan all of it. */
void lc_bury(struct local *lc, struct lc_entry *e)
{
	struct lc_entry *t = lc->seg->ranks[lc->cfg.local_rank].table;
	size_t s = (size_t)(e - t);
	if (atomic_load_explicit(&t[(s + 1) % LC_TABLE].key, memory_order_relaxed) != 0) {
		atomic_store_explicit(&e->key, LC_TOMB, memory_order_release);
		return;
	}
	for (size_t n = 0; n < LC_TABLE; n++, s = (s + LC_TABLE - 1) % LC_TABLE) {
		if (&t[s] != e && atomic_load_explicit(&t[s].key, memory_order_relaxed) != LC_TOMB)
			break;
		atomic_store_explicit(&t[s].key, 0, memory_order_release);
	}
}

/* Turns this rank's entries of undeclared keys into tombstones once no
 * peer can read them any more (lc->lock held). */
void lc_reclaim(struct local *lc)
{
	for (int i = 0; i < lc->nforgot;) {
		uint64_t key = lc->forgot[i];
		bool all = true;
		for (int q = 0; q < lc->cfg.local_size && all; q++) {
			struct lc_entry *e = q == lc->cfg.local_rank ? NULL : lc_find(lc, q, key);
			all = e == NULL || atomic_load(&e->retired);
		}
		if (!all) {
			i++;
			continue;
		}
		struct lc_entry *mine = lc_find(lc, lc->cfg.local_rank, key);
		if (mine != NULL)
			lc_bury(lc, mine);
		lc->forgot[i] = lc->forgot[--lc->nforgot];
	}
}

/* This rank's entry for `key`, claimed now if new, in a free slot or a
 * tombstone (lc->lock held). */
struct lc_entry *lc_claim(struct local *lc, uint64_t key, bool *fresh)
{
	struct lc_entry *t = lc->seg->ranks[lc->cfg.local_rank].table, *tomb = NULL;
	*fresh = false;
	lc_reclaim(lc);
	for (size_t i = 0, s = lc_slot(key); i < LC_TABLE; i++, s = (s + 1) % LC_TABLE) {
		uint64_t k = atomic_load_explicit(&t[s].key, memory_order_relaxed);
		if (k == key + 1)
			return &t[s];
		if (k == LC_TOMB && tomb == NULL)
			tomb = &t[s];
		if (k == 0) {
			*fresh = true;
			return tomb != NULL ? tomb : &t[s];
		}
	}
	*fresh = tomb != NULL;
	return tomb;
}

/* ---- errors and waiting ---------------------------------------------------- */

void lc_fail(struct local_op *op, int err, const char *fmt, ...)
{
	struct local *lc = op->lc;
	pthread_mutex_lock(&lc->lock);
	if (op->err == 0) {
		op->err = err;
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(op->why, sizeof op->why, fmt, ap);
		va_end(ap);
	}
	pthread_mutex_unlock(&lc->lock);
}

int lc_err(struct local_op *op)
{
	struct local *lc = op->lc;
	pthread_mutex_lock(&lc->lock);
	int err = op->err;
	pthread_mutex_unlock(&lc->lock);
	return err;
}



/* Waits until cond holds, the job fails or a peer dies.  0 or the error
 * (recorded in op). */
int lc_wait(struct local_op *op, lc_cond_fn cond, void *arg, const char *what)
{
	struct local *lc = op->lc;
	int64_t start = timing_now_ms(), next_check = start;
	bool warned = false;
	for (;;) {
		uint32_t seq = shm_flag_load(&lc->seg->flag);
		int rc = cond(op, arg);
		if (rc > 0)
			return 0;
		if (rc < 0)
			return rc;
		int64_t now = timing_now_ms();
		if (now >= next_check) {
			char why[512];
			int f = lc->hooks.failed(lc->hooks.arg, why, sizeof why);
			if (f == 0)
				f = lc->hooks.poisoned(lc->hooks.arg, op->req.key, why, sizeof why);
			if (f != 0) {
				lc_fail(op, f, "%s", why);
				return f;
			}
			/* Only the rank waited for matters: others may have
			 * finished every call and exited. */
			int q = op->blocker;
			pid_t pid = atomic_load(&lc->seg->ranks[q].pid);
			if (!shm_pid_is_alive(pid)) {
				/* It may have done its part and exited since cond
				 * looked (this thread was preempted): its stores
				 * came before its exit, so look once more. */
				if ((rc = cond(op, arg)) != 0)
					return rc > 0 ? 0 : rc;
				if (op->blocker != q)
					continue;	/* held up by another rank now */
				lc_fail(op, UNISUM_ECONN, "worker %d (local rank %d of machine %d, pid %d) "
					"exited or died while worker %d was waiting for %s", lc_rank_of(lc, q),
					q, lc->cfg.machine, (int)pid, lc->cfg.rank, what);
				return UNISUM_ECONN;
			}
			if (!warned && now - start >= lc->cfg.stall_warn_ms) {
				log_count_stall();
				LOG_WARN("stall: worker %d has waited %lld ms for %s: tensor '%s' round %u "
					 "(held up by worker %d, local rank %d). Does every worker "
					 "push every tensor every round?", lc->cfg.rank,
					 (long long)(now - start), what, op->req.name, op->req.round,
					 lc_rank_of(lc, q), q);
				warned = true;
			}
			if (lc->cfg.stall_abort_ms > 0 && now - start >= lc->cfg.stall_abort_ms) {
				char msg[512];
				snprintf(msg, sizeof msg, "stall: tensor '%s' round %u has waited %lld ms "
					 "on machine %d for worker %d, which has not got there "
					 "(UNISUM_STALL_ABORT_MS=%d: failing the job). Does every worker "
					 "push every tensor every round?", op->req.name, op->req.round,
					 (long long)(now - start), lc->cfg.machine, lc_rank_of(lc, q),
					 lc->cfg.stall_abort_ms);
				LOG_ERROR("%s", msg);
				lc->hooks.fail_job(lc->hooks.arg, UNISUM_ETIMEDOUT, msg);
				lc_fail(op, UNISUM_ETIMEDOUT, "%s", msg);
				return UNISUM_ETIMEDOUT;
			}
			next_check = now + LC_SLICE_MS;
		}
		rc = shm_flag_wait(&lc->seg->flag, seq + 1, LC_SLICE_MS);
		if (rc != 0 && rc != UNISUM_ETIMEDOUT) {
			lc_fail(op, rc, "worker %d cannot wait on the machine's shared memory", lc->cfg.rank);
			return rc;
		}
	}
}

/* Peer q's part of this round failed: its error, else 0. */
int lc_peer_failed(struct local_op *op, int q)
{
	struct local *lc = op->lc;
	struct lc_entry *e = op->peers[q].e;
	if (e == NULL || atomic_load_explicit(&e->round, memory_order_acquire) != op->req.round)
		return 0;
	int err = atomic_load(&e->err);
	if (err == 0)
		return 0;
	/* A peer gives up when the job fails, usually a moment before the
	 * scheduler's notice reaches this rank: name the root cause if it comes. */
	char why[512];
	for (int i = 0; i < 200; i++) {
		int f = lc->hooks.failed(lc->hooks.arg, why, sizeof why);
		if (f == 0)
			f = lc->hooks.poisoned(lc->hooks.arg, op->req.key, why, sizeof why);
		if (f != 0) {
			lc_fail(op, f, "%s", why);
			return f;
		}
		usleep(10000);
	}
	lc_fail(op, err, "worker %d (local rank %d of machine %d) failed its part of tensor '%s' "
		"round %u: %s", lc_rank_of(lc, q), q, lc->cfg.machine, op->req.name, op->req.round,
		unisum_strerror(err));
	return err;
}

/* Every peer has posted this round and the collectives agree: takes the
 * peers' buffers (1), or fails (the error) when a peer has given up on
 * the round already (the job failed): it may have its buffers back, so
 * none of them is touched.  That peer set its error before it looked
 * whether this rank had posted the round (lc_quiesce), and this rank
 * posted before it looks at the errors: one of the two sees the other. */
static int lc_take_buffers(struct local_op *op)
{
	struct local *lc = op->lc;
	atomic_thread_fence(memory_order_seq_cst);
	for (int q = 0; q < lc->cfg.local_size; q++) {
		int err = q != lc->cfg.local_rank ? lc_peer_failed(op, q) : 0;
		if (err != 0)
			return err;
	}
	for (int q = 0; q < lc->cfg.local_size; q++) {
		struct lc_peer *p = &op->peers[q];
		p->pid = atomic_load(&lc->seg->ranks[q].pid);
		p->in = atomic_load(&p->e->in);
		p->out = atomic_load(&p->e->out);
		uint64_t region = atomic_load(&p->e->region);
		p->region = region != 0 && lc->arenas != NULL
				    ? (uint8_t *)shm_seg_data(&lc->arenas[q]) + region - 1
				    : NULL;
		uint64_t in_arena = atomic_load(&p->e->in_arena);
		uint64_t out_arena = atomic_load(&p->e->out_arena);
		uint8_t *base = lc->arenas != NULL ? shm_seg_data(&lc->arenas[q]) : NULL;
		p->in_map = in_arena != 0 && base != NULL ? base + in_arena - 1 : NULL;
		p->out_map = out_arena != 0 && base != NULL ? base + out_arena - 1 : NULL;
		if ((p->in_map != NULL || p->out_map != NULL) && q != lc->cfg.local_rank &&
		    !atomic_exchange(&lc->said_direct, true))
			LOG_INFO("worker %d: worker %d's buffers lie in its shared arena (unisum_alloc): "
				 "summing them with plain loads and stores", lc->cfg.rank, lc_rank_of(lc, q));
	}
	return 1;
}

/* Every peer has posted this round: their buffers are known. */
int lc_cond_posted(struct local_op *op, void *arg)
{
	struct local *lc = op->lc;
	(void)arg;
	for (int q = 0; q < lc->cfg.local_size; q++) {
		struct lc_peer *p = &op->peers[q];
		op->blocker = q;
		if (p->e == NULL && (p->e = lc_find(lc, q, op->req.key)) == NULL)
			return 0;
		if (atomic_load_explicit(&p->e->retired, memory_order_acquire)) {
			/* The peer's entry of an earlier declaration of this
			 * name, undeclared: it has not started this one yet
			 * (it reuses that entry, or buries it and takes
			 * another, so look it up again). */
			p->e = NULL;
			return 0;
		}
		uint32_t r = atomic_load_explicit(&p->e->round, memory_order_acquire);
		if (r != op->req.round) {
			if ((int32_t)(r - op->req.round) > 0) {
				lc_fail(op, UNISUM_EPROTO, "worker %d is already past round %u of tensor "
					"'%s' that worker %d is starting: the workers of machine %d disagree "
					"on their push_pull calls", lc_rank_of(lc, q), op->req.round,
					op->req.name, lc->cfg.rank, lc->cfg.machine);
				return UNISUM_EPROTO;
			}
			return 0;
		}
	}
	/* Before a byte is combined: do all ranks run the same collective?
	 * Each rank compares every rank with local rank 0, so all of them
	 * fail with the same message. */
	uint32_t first = atomic_load(&op->peers[0].e->wire_op);
	for (int q = 1; q < lc->cfg.local_size; q++) {
		uint32_t other = atomic_load(&op->peers[q].e->wire_op);
		if (other != first) {
			char a[64], b[64];
			lc_fail(op, UNISUM_EMISMATCH, "tensor '%s' round %u: worker %d called %s but worker "
				"%d %s; every worker must call the same collective (a broadcast: with the "
				"same root)", op->req.name, op->req.round, lc_rank_of(lc, 0),
				wire_op_describe(first, a, sizeof a), lc_rank_of(lc, q),
				wire_op_describe(other, b, sizeof b));
			if (lc->cfg.machines > 1 && lc->cfg.local_rank == 0) {
				pthread_mutex_lock(&lc->lock);
				char why[512];
				snprintf(why, sizeof why, "%s", op->why);
				pthread_mutex_unlock(&lc->lock);
				lc->hooks.poison(lc->hooks.arg, op->req.key, why);
			}
			return UNISUM_EMISMATCH;
		}
	}
	return lc_take_buffers(op);
}

/* Every rank (stagers_only: every other rank that stages its input) has
 * counted up to `want` partitions this round in the counter at offset
 * `counter` of its entry. */
static int lc_cond_counted(struct local_op *op, uint32_t want, size_t counter, bool stagers_only)
{
	struct local *lc = op->lc;
	for (int q = 0; q < lc->cfg.local_size; q++) {
		const struct lc_peer *p = &op->peers[q];
		if (stagers_only && (q == lc->cfg.local_rank || p->region == NULL || p->in == 0))
			continue;
		int err = lc_peer_failed(op, q);
		if (err != 0)
			return err;
		op->blocker = q;
		const _Atomic uint64_t *c = (const _Atomic uint64_t *)((const char *)p->e + counter);
		if (lc_count(c, op->req.round) < want)
			return 0;
	}
	return 1;
}

/* Every rank has summed its slice of partitions up to *arg (exclusive). */
int lc_cond_reduced(struct local_op *op, void *arg)
{
	return lc_cond_counted(op, *(const uint32_t *)arg, offsetof(struct lc_entry, reduced), false);
}

/* Every rank that stages has staged partitions up to *arg (exclusive). */
int lc_cond_staged(struct local_op *op, void *arg)
{
	return lc_cond_counted(op, *(const uint32_t *)arg, offsetof(struct lc_entry, staged), true);
}
