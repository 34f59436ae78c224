/*
 * announce.c - the news of joins (join.c's DESIGN says why): announcing
 * the push_pulls (and pushed gathering collectives) in flight when a rank
 * joins, queueing those announced to a joined worker, poisoning a
 * gathering collective a join strands, and
 * the lives of names (which declaration of a name a round belongs to).
 *
 * It runs on the scheduler client's loop thread (wk_on_join) and under
 * the worker's lock, and calls nothing but the scheduler client, so that
 * op.c, tensor.c and cuts.c below join.c may use it.  unisum_join itself
 * (contributing zeros, waiting for the others) is join.c's.
 * The state it shares with the rest of the worker is in worker_int.h.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "log/log.h"
#include "wire/wire.h"
#include "worker/worker_int.h"

bool wk_reduces(uint32_t wire_op)
{
	switch (WIRE_OP_KIND(wire_op)) {
	case WIRE_OP_SUM:
	case WIRE_OP_AVERAGE:
	case WIRE_OP_MIN:
	case WIRE_OP_MAX:
	case WIRE_OP_PRODUCT:
		return true;
	default:
		return false;
	}
}

/* What a joined worker takes part in: the reductions, and (only when in
 * flight as it joined) broadcasts, where it is not the root or sends
 * zeros. */
bool wk_join_runs(uint32_t wire_op)
{
	return wk_reduces(wire_op) || WIRE_OP_KIND(wire_op) == WIRE_OP_BROADCAST;
}

void wk_announce_fill(const struct wk_op *op, struct rdv_announce *a)
{
	const struct wk_tensor *t = op->t;
	memset(a, 0, sizeof *a);
	snprintf(a->name, sizeof a->name, "%s", t->name);
	a->dtype = t->dtype;
	a->count = t->count;
	a->round = op->round;
	a->wire_op = op->wire_op;
	a->life = t->life;
	a->key = t->ncuts > 0 ? t->cuts[0].key : 0;
	a->shape = t->shape;
}

/* Rank `rank` joined (the client's loop thread): what this worker has in
 * flight is announced to it, or poisoned. */
static void wk_on_joined(struct worker *w, int rank)
{
	/* Announce what is in flight: the new joiner has heard of none of it,
	 * and it may wait for it. */
	struct rdv_announce *list = NULL;
	int n = 0;
	pthread_mutex_lock(&w->lock);
	w->join_seen = true;
	if (!w->joined && w->nops > 0)
		list = malloc((size_t)w->nops * sizeof *list);
	uint64_t *poison = w->nops > 0 ? malloc((size_t)w->nops * sizeof *poison) : NULL;
	char (*pnames)[WK_NAME_MAX] = w->nops > 0 ? malloc((size_t)w->nops * WK_NAME_MAX) : NULL;
	int np = 0;
	for (int i = 0; !w->joined && i < w->nops; i++) {
		struct wk_op *op = w->ops[i];
		/* An allgather begun and not supplied (or supplied nothing
		 * by this worker's own join) is not a call in flight
		 * (unisum_allgather_begin): it ends with zeros once every
		 * rank has joined or supplied it. */
		if (op->done || op->t->nranks != 0 ||
		    (op->deferred && (!op->supplied || op->nothing)))
			continue;
		if (!wk_join_runs(op->wire_op) && (!op->launched || list == NULL)) {
			/* A gathering collective this worker has not pushed yet:
			 * the joined rank cannot have run it, so it can never
			 * complete. */
			op->join_poison = true;
			op->join_rank = rank;
			if (op->launched && poison != NULL && pnames != NULL) {
				poison[np] = op->t->cuts[0].key;
				snprintf(pnames[np++], WK_NAME_MAX, "%s", op->t->name);
			}
			continue;
		}
		if (list == NULL)
			continue;
		/* A gathering collective pushed already is announced too: the
		 * joined rank may have run this round before it joined (this
		 * worker still pulling it), and only it knows; it poisons the
		 * tensor if not (join.c). */
		wk_announce_fill(op, &list[n++]);
		/* A broadcast needs every rank's part: it completes with the
		 * joined rank's zeros, and then fails, as it would have had it
		 * started a moment later. */
		op->join_refused = WIRE_OP_KIND(op->wire_op) == WIRE_OP_BROADCAST;
	}
	pthread_mutex_unlock(&w->lock);
	for (int i = 0; i < np; i++)
		wk_join_poison(w, poison[i], pnames[i], rank);
	free(poison);
	free(pnames);
	/* A gathering collective whose announcement could not go out is
	 * poisoned here, as the joined rank cannot judge it. */
	for (int i = 0; i < n; i++)
		if (rdv_client_announce(w->rdv, &list[i]) != 0 && !wk_join_runs(list[i].wire_op) &&
		    list[i].key != 0)
			wk_join_poison(w, list[i].key, list[i].name, rank);
	free(list);
}

/* The scheduler's join events (the client's loop thread). */
void wk_on_join(void *arg, int event, int rank, const struct rdv_announce *a)
{
	struct worker *w = arg;
	if (event == RDV_JOINED) {
		if (rank != w->rank)
			wk_on_joined(w, rank);
		return;
	}
	pthread_mutex_lock(&w->lock);
	if (event == RDV_ANNOUNCED && w->joined) {
		if (w->nannounced == w->capannounced) {
			int cap = w->capannounced ? 2 * w->capannounced : 16;
			struct rdv_announce *q = realloc(w->announced, (size_t)cap * sizeof *q);
			if (q == NULL) {
				pthread_mutex_unlock(&w->lock);
				LOG_ERROR("worker %d: out of memory queueing a push_pull to join", w->rank);
				return;
			}
			w->announced = q;
			w->capannounced = cap;
		}
		w->announced[w->nannounced++] = *a;
	} else if (event == RDV_JOIN_DONE) {
		/* Here, on the client's loop thread, in order with the JOINED of a
		 * next join, which sets it again. */
		w->join_seen = false;
		w->join_done = true;
		w->join_last = rank;
	}
	pthread_cond_broadcast(&w->join_cond);
	pthread_mutex_unlock(&w->lock);
}

/* Poisons tensor `tensor` (`key`: its declaration's), whose gathering
 * collective was in flight when rank `rank` joined, and with it every cut
 * of it, the collectives' homed cuts among them: the one in flight fails
 * on every rank, and a later one is refused on every rank, rather than
 * declared (NAME#K, counted per rank) by the ranks that ran this one and
 * waited for by the rank that joined instead. */
void wk_join_poison(struct worker *w, uint64_t key, const char *tensor, int rank)
{
	char why[WK_NAME_MAX + 256];
	snprintf(why, sizeof why, "rank %d joined (unisum_join) while a gathering collective of "
		 "tensor '%s' was in flight; it needs every rank's data, so it fails on every rank "
		 "(and the tensor with it)", rank, tensor);
	LOG_WARN("worker %d: %s", w->rank, why);
	rdv_client_poison_tensor(w->rdv, key, why);
}

uint64_t wk_name_hash(const char *name)
{
	uint64_t h = 0xcbf29ce484222325ull;
	for (const unsigned char *p = (const unsigned char *)name; *p; p++) {
		h ^= *p;
		h *= 0x100000001b3ull;
	}
	return h;
}

/* Tensor `name`, in its declaration number `life`, was undeclared after
 * `rounds` rounds (w->lock held): a late announcement of one of those
 * rounds is no reason to declare it again (the scheduler would refuse a
 * one-shot name).  The life tells that declaration from a later one of
 * the same name, whose rounds start again at 0 (its key is the same: a
 * hash of the name). */
void wk_note_retired(struct worker *w, const char *name, uint64_t life, uint32_t rounds)
{
	if (w->retired == NULL && (w->retired = calloc(WK_RETIRED, sizeof *w->retired)) == NULL)
		return;
	w->retired[w->retired_at++ % WK_RETIRED] =
		(struct wk_retired){.name_hash = wk_name_hash(name), .life = life, .rounds = rounds};
}

/* The number of a new declaration of `name` (w->lock held): one more than
 * the latest undeclared one this worker remembers, else 1.  Every worker
 * that declared and undeclared the name alike counts alike. */
uint64_t wk_next_life(struct worker *w, const char *name)
{
	uint64_t h = wk_name_hash(name), life = 0;
	for (uint32_t i = 0; w->retired != NULL && i < WK_RETIRED; i++)
		if (w->retired[i].name_hash == h && w->retired[i].life > life)
			life = w->retired[i].life;
	return life + 1;
}
