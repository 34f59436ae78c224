/*
 * join.c - unisum_join (Horovod's join): a worker that has run out of data
 * joins, and from then on contributes zeros to every push_pull the others
 * run, until every worker has joined; then each gets the rank that joined
 * last.
 *
 * DESIGN
 *
 * A joined worker does not know which push_pulls the others will run, so
 * they tell it, through the scheduler.  When worker j joins (JOIN), the
 * scheduler tells every worker (RDV_JOINED).  A worker that has not joined
 * then announces (ANNOUNCE: name, dtype, count, shape, round, collective)
 * every push_pull of the global set it has in flight, and from then on
 * each one it starts (wk_op_file), both under the worker's lock, so each
 * is announced at least once.  The scheduler passes announcements to the
 * workers that have joined.  A joined worker runs each announced push_pull
 * itself, with zeros, through the ordinary path (its machine's local
 * reduce included), declaring the tensor if it never had: the tensor's
 * round says whether it already ran that round (several workers announce
 * the same one, and each new joiner makes the others announce again what
 * is still in flight).  The other collectives need every rank's data, so
 * while a rank has joined a worker that has not refuses them
 * (UNISUM_EINVAL), as Horovod does; a broadcast that was already in flight
 * is announced too, runs with the joined rank's zeros (its rounds stay in
 * step) and then fails at its wait (wk_release).  A gathering collective
 * started before the news came would wait for the joined rank for ever,
 * unless the joined rank ran that round before joining (a worker still
 * pulling it as a faster one joined).  One not pushed yet cannot have
 * been run: the worker poisons its tensor (the scheduler tells every
 * server, and every rank's wait fails with the reason), at once or, when
 * its cut is not known yet, at its launch.  One pushed is announced, with
 * its tensor's key, and the joined rank, which alone knows whether it ran
 * that round (its tensor's round), poisons it if not.  The PyTorch
 * plugin's exchange of shapes, a push_pull, comes first and usually
 * carries the news.
 *
 * A joined worker's contribution is the reduction's identity: zero for a
 * sum or an average (Horovod's "zeros"), +inf (or the integer maximum)
 * for a minimum, -inf (the minimum) for a maximum, one for a product, so
 * that a joined rank never changes a result.
 *
 * A worker joins only once its own operations are complete (they may wait
 * on joined workers, which contribute on announcement).  So when the last
 * worker joins, every real operation is complete, and the scheduler's
 * JOIN_DONE ends every worker's join once its zero contributions are in.
 * Average divides by the whole job's size, as in Horovod.
 */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "log/log.h"
#include "timing/timing.h"
#include "wire/wire.h"
#include "worker/worker_int.h"

/* Fills count elements of dtype at buf with the identity of the reduction
 * `kind` (a joined worker's contribution). */
static void wk_fill_identity(void *buf, unisum_dtype dtype, uint64_t count, uint32_t kind)
{
	if (kind != WIRE_OP_MIN && kind != WIRE_OP_MAX && kind != WIRE_OP_PRODUCT)
		return;	/* zero: calloc's */
	int w = kind == WIRE_OP_MIN ? 0 : kind == WIRE_OP_MAX ? 1 : 2;
	static const uint16_t f16[3] = {0x7c00, 0xfc00, 0x3c00};	/* +inf, -inf, 1 */
	static const uint16_t bf16[3] = {0x7f80, 0xff80, 0x3f80};
	for (uint64_t i = 0; i < count; i++) {
		switch (dtype) {
		case UNISUM_FLOAT32:
			((float *)buf)[i] = w == 0 ? INFINITY : w == 1 ? -INFINITY : 1.0f;
			break;
		case UNISUM_FLOAT64:
			((double *)buf)[i] = w == 0 ? INFINITY : w == 1 ? -INFINITY : 1.0;
			break;
		case UNISUM_FLOAT16:
			((uint16_t *)buf)[i] = f16[w];
			break;
		case UNISUM_BFLOAT16:
			((uint16_t *)buf)[i] = bf16[w];
			break;
		case UNISUM_INT32:
			((int32_t *)buf)[i] = w == 0 ? INT32_MAX : w == 1 ? INT32_MIN : 1;
			break;
		case UNISUM_INT64:
			((int64_t *)buf)[i] = w == 0 ? INT64_MAX : w == 1 ? INT64_MIN : 1;
			break;
		default:
			return;
		}
	}
}

/* Whether this worker ran round `round` of declaration `life` of `name`
 * and undeclared it since. */
static bool wk_ran_and_retired(struct worker *w, const char *name, uint64_t life, uint32_t round)
{
	uint64_t h = wk_name_hash(name);
	pthread_mutex_lock(&w->lock);
	bool ran = false;
	for (uint32_t i = 0; w->retired != NULL && i < WK_RETIRED && !ran; i++)
		ran = w->retired[i].name_hash == h && w->retired[i].life == life &&
		      w->retired[i].rounds > round;
	pthread_mutex_unlock(&w->lock);
	return ran;
}

/* A push_pull of zeros this joined worker runs for the others. */
struct wk_zero {
	int tensor;
	unisum_handle h;	/* 0 once waited for */
	void *in, *out;
};

static int wk_zero_wait(struct worker *w, struct wk_zero *z)
{
	int rc = z->h != 0 ? worker_wait(w, z->h) : 0;
	z->h = 0;
	free(z->in);
	free(z->out);
	z->in = z->out = NULL;
	return rc;
}

/* An announced round of a gathering collective, which a joined rank does
 * not run: another worker was still pulling it when this one joined.  If
 * this worker ran that round before joining, it completes there; if not,
 * it never can, and this worker poisons the tensor (every rank's wait
 * fails, naming the join). */
static void wk_join_gather_check(struct worker *w, const struct rdv_announce *a)
{
	if (wk_ran_and_retired(w, a->name, a->life, a->round))
		return;
	pthread_mutex_lock(&w->lock);
	bool ran = false;
	for (int i = 0; i < w->ntensors && !ran; i++) {
		const struct wk_tensor *t = w->tensors[i];
		ran = t != NULL && t->life == a->life && t->round > a->round &&
		      strcmp(t->name, a->name) == 0;
	}
	pthread_mutex_unlock(&w->lock);
	if (!ran && a->key != 0)
		wk_join_poison(w, a->key, a->name, w->rank);
}

/* Runs announced round a->round of a->name with zeros, unless this worker
 * ran it already.  0 or an error (logged). */
static int wk_join_contribute(struct worker *w, const struct rdv_announce *a,
			      struct wk_zero **zs, int *nz)
{
	if (!wk_join_runs(a->wire_op)) {
		wk_join_gather_check(w, a);
		return 0;
	}
	if (wk_ran_and_retired(w, a->name, a->life, a->round))
		return 0;	/* announced again, after this worker was done with it */
	/* A compressed tensor: a joined rank's zeros would go through its
	 * momentum and error feedback, which are not zero.  Refused on every
	 * rank, clearly, rather than summed wrongly or left waiting. */
	uint64_t comp_key = 0;
	char comp[WIRE_SPEC_MAX] = "";
	pthread_mutex_lock(&w->lock);
	for (int i = 0; i < w->ntensors && comp_key == 0; i++) {
		const struct wk_tensor *t = w->tensors[i];
		if (t != NULL && t->comp.kind != COMPRESS_NONE && t->ncuts > 0 &&
		    strcmp(t->name, a->name) == 0) {
			comp_key = t->cuts[0].key;
			snprintf(comp, sizeof comp, "%s", t->comp_text);
		}
	}
	pthread_mutex_unlock(&w->lock);
	if (comp_key != 0) {
		char why[WK_NAME_MAX + WIRE_SPEC_MAX + 200];
		snprintf(why, sizeof why, "rank %d joined (unisum_join) while tensor '%s', compressed "
			 "'%s', was in flight: a joined rank cannot contribute zeros through a "
			 "compressor's momentum and error feedback, so the tensor fails on every rank",
			 w->rank, a->name, comp);
		rdv_client_poison_tensor(w->rdv, comp_key, why);
		return log_fail(UNISUM_EINVAL, "unisum_join on worker %d: %s", w->rank, why);
	}
	int id = worker_declare_shaped(w, a->name, a->dtype, (size_t)a->count,
				       a->shape.ndim > 0 ? &a->shape : NULL, 0);
	if (id < 0)
		return log_fail(id, "unisum_join on worker %d: cannot run '%s' for the others: %s",
				w->rank, a->name, log_last_error());
	for (int i = 0; i < *nz; i++) {
		if ((*zs)[i].tensor == id && (*zs)[i].h != 0) {
			int rc = wk_zero_wait(w, &(*zs)[i]);
			if (rc != 0)
				return rc;
		}
	}
	pthread_mutex_lock(&w->lock);
	uint32_t next = w->tensors[id]->round;
	size_t esize = w->tensors[id]->esize;
	pthread_mutex_unlock(&w->lock);
	if (next > a->round)
		return 0;	/* ran it already: announced by another worker too */
	if (next < a->round)
		return log_fail(UNISUM_EPROTO, "unisum_join on worker %d: '%s' is at round %u here but "
				"another worker runs round %u", w->rank, a->name, next, a->round);
	struct wk_zero *more = realloc(*zs, (size_t)(*nz + 1) * sizeof *more);
	if (more == NULL)
		return UNISUM_ENOMEM;
	*zs = more;
	size_t bytes = (size_t)a->count * esize + 1;
	struct wk_zero z = {.tensor = id, .in = calloc(1, bytes), .out = malloc(bytes)};
	uint32_t kind = WIRE_OP_KIND(a->wire_op);
	if (z.in != NULL)
		wk_fill_identity(z.in, a->dtype, a->count, kind);
	int flags = kind == WIRE_OP_AVERAGE ? UNISUM_AVERAGE
		    : kind == WIRE_OP_MIN   ? UNISUM_MIN
		    : kind == WIRE_OP_MAX   ? UNISUM_MAX
		    : kind == WIRE_OP_PRODUCT ? UNISUM_PRODUCT
					    : 0;
	int rc = z.in == NULL || z.out == NULL ? UNISUM_ENOMEM
		 : kind == WIRE_OP_BROADCAST
			 ? worker_broadcast_async(w, id, z.in, (int)WIRE_OP_ROOT(a->wire_op), &z.h)
			 : worker_push_pull_async(w, id, z.in, z.out, flags, &z.h);
	if (rc != 0) {
		free(z.in);
		free(z.out);
		return rc;
	}
	(*zs)[(*nz)++] = z;
	return 0;
}

/* A join that ended on an error leaves announcements unread (w->joined
 * false: no more come): a gathering collective among them would wait for
 * this worker's rows for ever, so each is judged as the loop would have
 * (the push_pulls fail with the job, or are announced again to the next
 * joiner). */
static void wk_join_drain_gathers(struct worker *w)
{
	for (;;) {
		pthread_mutex_lock(&w->lock);
		if (w->nannounced == 0) {
			pthread_mutex_unlock(&w->lock);
			return;
		}
		struct rdv_announce a = w->announced[--w->nannounced];
		pthread_mutex_unlock(&w->lock);
		if (!wk_join_runs(a.wire_op))
			wk_join_gather_check(w, &a);
	}
}

int worker_join_wait(struct worker *w)
{
	if (w == NULL || !w->initialized)
		return log_fail(UNISUM_ENOTINIT, "call unisum_init() first");
	pthread_mutex_lock(&w->lock);
	if (w->joined) {
		pthread_mutex_unlock(&w->lock);
		return log_fail(UNISUM_EINVAL, "unisum_join: worker %d is in unisum_join already",
				w->rank);
	}
	/* Its own operations first (see DESIGN).  Those begun without their
	 * rows get none (unisum_allgather_begin), and are not waited for: the
	 * others' rows of that round come with the others' next call or
	 * their join, while they may wait for this worker's join first. */
	pthread_mutex_unlock(&w->lock);
	wk_supply_nothing(w);
	pthread_mutex_lock(&w->lock);
	while (wk_busy_but_nothing(w, false) && w->failed == 0) {
		struct timespec until = timing_deadline(100);
		pthread_cond_timedwait(&w->done_cond, &w->lock, &until);
	}
	int rc = w->failed;
	if (rc == 0) {
		w->joined = true;
		w->join_done = false;
		w->nannounced = 0;
	}
	pthread_mutex_unlock(&w->lock);
	if (rc != 0)
		return log_fail(rc, "unisum_join on worker %d: the job has failed", w->rank);
	rc = rdv_client_join(w->rdv);
	struct wk_zero *zs = NULL;
	int nz = 0;
	while (rc == 0) {
		pthread_mutex_lock(&w->lock);
		while (w->nannounced == 0 && !w->join_done && w->failed == 0) {
			struct timespec until = timing_deadline(100);
			pthread_cond_timedwait(&w->join_cond, &w->lock, &until);
		}
		if (w->failed != 0) {
			rc = log_fail(w->failed, "unisum_join on worker %d: %s", w->rank, w->failed_why);
			pthread_mutex_unlock(&w->lock);
			break;
		}
		if (w->nannounced == 0) {
			pthread_mutex_unlock(&w->lock);
			break;	/* everyone joined, and every announcement is handled */
		}
		struct rdv_announce a = w->announced[0];
		memmove(w->announced, w->announced + 1, (size_t)--w->nannounced * sizeof a);
		pthread_mutex_unlock(&w->lock);
		rc = wk_join_contribute(w, &a, &zs, &nz);
	}
	for (int i = 0; i < nz; i++) {
		int r = wk_zero_wait(w, &zs[i]);
		if (rc == 0)
			rc = r;
	}
	free(zs);
	pthread_mutex_lock(&w->lock);
	int last = w->join_last;
	/* join_seen stays: the client's loop thread cleared it at JOIN_DONE, and a
	 * JOINED of the next join may have set it again since. */
	w->joined = false;	/* no announcement is queued from here on */
	w->join_done = false;
	pthread_mutex_unlock(&w->lock);
	wk_join_drain_gathers(w);
	return rc != 0 ? rc : last;
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
