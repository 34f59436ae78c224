/*
 * dssync.c - divide and shuffle (UNISUM_SYNC=dssync:G): each step's groups, derived from the step and the job, and their tensors.
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

/* The group of this rank at `step` of a dssync tensor of groups of g
 * (every `every`-th step global), in ranks[] (w->size of room): its size,
 * or an error.  *keep: whether the same group comes back within
 * UNISUM_DSSYNC_KEEP steps, so its set tensor is kept; every member
 * decides alike: groups partition the ranks, so when the group comes back
 * for one member it does for all.  A rank so holds at most
 * UNISUM_DSSYNC_KEEP + 1 of them per tensor. */
static int wk_dssync_members(struct worker *w, uint64_t step, int g, uint32_t every, int *ranks,
			     bool *keep)
{
	char job[128];
	config_job_id(&w->cfg, job, sizeof job);
	struct wk_dssync_topo topo;
	int rc = wk_dssync_topology(w, &topo);
	if (rc != 0)
		return rc;
	uint64_t seed = wk_name_hash(job);
	int m = wk_dssync_group(seed, step, w->size, g, w->rank, &topo, ranks);
	if (m < 0)
		return m;
	int *next = malloc((size_t)w->size * sizeof *next);
	if (next == NULL)
		return UNISUM_ENOMEM;
	*keep = false;
	for (uint64_t s = step + 1; !*keep && s <= step + (uint64_t)w->cfg.dssync_keep; s++) {
		if (every > 0 && (s + 1) % every == 0)
			continue;	/* global */
		int m2 = wk_dssync_group(seed, s, w->size, g, w->rank, &topo, next);
		*keep = m2 == m && memcmp(next, ranks, (size_t)m * sizeof *ranks) == 0;
	}
	free(next);
	return m;
}

/* Declares the set tensor of group ranks[0, m) for dssync tensor `tensor`
 * (named `name`, of dtype, count and priority) at `step`: its name
 * carries the step it starts at ("set:<m>:<hash>/NAME@<step>"), the same
 * on every member, so a group that comes back after its tensor went gets
 * a new name, and no declaration ever meets the undeclares of the last
 * one (which the scheduler and servers may still be counting).  Takes
 * ranks.  Its id, or an error. */
static int wk_dssync_declare(struct worker *w, int tensor, int *ranks, int m, uint64_t step,
			     const char *name, unisum_dtype dtype, size_t count, int priority,
			     bool keep)
{
	char wire[WK_NAME_MAX];
	if (wk_set_wire_name(ranks, m, name, wire, sizeof wire, "unisum_push_pull (dssync)") != 0 ||
	    (size_t)snprintf(wire + strlen(wire), sizeof wire - strlen(wire), "@%llu",
			     (unsigned long long)step) >= sizeof wire - strlen(wire)) {
		free(ranks);
		return log_fail(UNISUM_EINVAL, "unisum_push_pull (dssync): the name of '%s''s group "
				"tensor is longer than %d characters", name, WK_NAME_MAX - 1);
	}
	int rc = wk_ensure_conns(w);
	if (rc != 0) {
		free(ranks);
		return rc;
	}
	int id = wk_declare(w, wire, dtype, count, NULL, priority, ranks, m,
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
	return rc != 0 ? rc : id;
}

/* The tensor a push_pull on dssync tensor `tensor` runs on: its group's
 * set tensor at this step (declared on first use: a scheduler round
 * trip), or itself on a global step.  0 with *target, or an error. */
int wk_dssync_target(struct worker *w, int tensor, int *target, uint64_t *taken)
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
	bool keep;
	int m = wk_dssync_members(w, step, g, every, ranks, &keep);
	if (m < 0) {
		free(ranks);
		return m;
	}
	/* The group's set tensor while it lives; else a new one. */
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
	id = wk_dssync_declare(w, tensor, ranks, m, step, name, dtype, count, priority, keep);
	if (id < 0)
		return id;
	*target = id;
	return 0;
}

/* Undeclares dssync group set tensor `id` (-1: nothing) after its step
 * (wk_undeclare's `retire`). */
void wk_dssync_retire(struct worker *w, int id)
{
	if (id >= 0)
		(void)wk_undeclare(w, id, true);
}
