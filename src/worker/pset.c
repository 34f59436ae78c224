/*
 * pset.c - process sets and racks: a set's own tensors (their wire names, their members' connections) and declaring a tensor in a set.
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
#include "sched/sched.h"
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
 * A process set's tensor is its own tensor: its wire name is the user's
 * name under a prefix that hashes the set's ranks, so the scheduler gives
 * it its own keys and rounds, placed like any tensor.  Each member pushes
 * every partition itself (a local root over its machine's connections,
 * any other rank over connections it opens at its first such tensor) and
 * the server sums the members' pushes in rank order; the machine's local
 * reduce serves the global set only.  Non-members never hear of it.
 */

static int wk_int_cmp(const void *a, const void *b)
{
	int x = *(const int *)a, y = *(const int *)b;
	return (x > y) - (x < y);
}

int worker_process_set_add(struct worker *w, const int *ranks, int n)
{
	if (wk_require_init(w) != 0)
		return UNISUM_ENOTINIT;
	if (ranks == NULL || n < 1 || n > w->size)
		return log_fail(UNISUM_EINVAL, "unisum_process_set_add: give 1 to %d ranks (got %d)",
				w->size, n);
	int *sorted = malloc((size_t)n * sizeof *sorted);
	if (sorted == NULL)
		return UNISUM_ENOMEM;
	memcpy(sorted, ranks, (size_t)n * sizeof *sorted);
	qsort(sorted, (size_t)n, sizeof *sorted, wk_int_cmp);
	for (int i = 0; i < n; i++) {
		if (sorted[i] < 0 || sorted[i] >= w->size || (i > 0 && sorted[i] == sorted[i - 1])) {
			int bad = sorted[i];
			free(sorted);
			return log_fail(UNISUM_EINVAL, "unisum_process_set_add: rank %d is %s", bad,
					bad < 0 || bad >= w->size ? "not a rank of this job"
								  : "given twice");
		}
	}
	pthread_mutex_lock(&w->lock);
	for (int i = 0; i < w->npsets; i++) {
		const struct wk_pset *p = &w->psets[i];
		if (p->n == n && memcmp(p->ranks, sorted, (size_t)n * sizeof *sorted) == 0) {
			int id = p->id;
			pthread_mutex_unlock(&w->lock);
			free(sorted);
			return log_fail(UNISUM_EINVAL, "unisum_process_set_add: these ranks are process "
					"set %d already", id);
		}
	}
	struct wk_pset *ps = realloc(w->psets, (size_t)(w->npsets + 1) * sizeof *ps);
	if (ps == NULL) {
		pthread_mutex_unlock(&w->lock);
		free(sorted);
		return UNISUM_ENOMEM;
	}
	w->psets = ps;
	int id = ++w->next_pset;
	w->psets[w->npsets++] = (struct wk_pset){.id = id, .n = n, .ranks = sorted};
	pthread_mutex_unlock(&w->lock);
	return id;
}

int worker_process_set_remove(struct worker *w, int set)
{
	if (wk_require_init(w) != 0)
		return UNISUM_ENOTINIT;
	pthread_mutex_lock(&w->lock);
	int i = 0;
	while (i < w->npsets && w->psets[i].id != set)
		i++;
	if (i == w->npsets) {
		pthread_mutex_unlock(&w->lock);
		return log_fail(UNISUM_EINVAL, "unisum_process_set_remove: no process set %d%s", set,
				set == 0 ? " (0 is the global set, which stays)" : "");
	}
	struct wk_pset p = w->psets[i];
	/* Its tensors go with it; none may have an operation in flight. */
	for (int t = 0; t < w->ntensors; t++) {
		struct wk_tensor *x = w->tensors[t];
		if (x != NULL && x->nranks == p.n && memcmp(x->ranks, p.ranks, (size_t)p.n * sizeof (int)) == 0 &&
		    x->busy) {
			pthread_mutex_unlock(&w->lock);
			return log_fail(UNISUM_EBUSY, "unisum_process_set_remove: tensor '%s' of process "
					"set %d has an operation in flight", x->name, set);
		}
	}
	w->psets[i] = w->psets[--w->npsets];
	int *mine = NULL, nmine = 0;
	for (int t = 0; t < w->ntensors; t++) {
		struct wk_tensor *x = w->tensors[t];
		if (x != NULL && x->nranks == p.n &&
		    memcmp(x->ranks, p.ranks, (size_t)p.n * sizeof (int)) == 0) {
			int *m = realloc(mine, (size_t)(nmine + 1) * sizeof *m);
			if (m != NULL) {
				mine = m;
				mine[nmine++] = t;
			}
		}
	}
	pthread_mutex_unlock(&w->lock);
	int rc = 0;
	for (int k = 0; k < nmine; k++) {
		int r = worker_undeclare(w, mine[k]);
		if (r != 0 && rc == 0)
			rc = r;
	}
	free(mine);
	free(p.ranks);
	return rc;
}

/* Opens this worker's server connections if it has none (it is not its
 * machine's local root): a process set's members each push.  0 or an
 * error (logged). */
int wk_ensure_conns(struct worker *w)
{
	pthread_mutex_lock(&w->connect_lock);
	int rc = 0;
	if (w->conns == NULL) {
		if (w->nservers == 0) {
			rc = log_fail(UNISUM_ECONFIG, "worker %d: a process set's tensors are summed on the "
				      "servers, and this job has none (UNISUM_NUM_SERVER=0)", w->rank);
		} else {
			rc = wk_connect_servers(w);
			if (rc != 0)
				wk_close_conns(w);
		}
	}
	pthread_mutex_unlock(&w->connect_lock);
	return rc;
}

int wk_rank_rack(struct worker *w, int r)
{
	const struct rdv_node *n = rdv_client_worker(w->rdv, r);
	return n != NULL ? n->rack : -1;
}

int wk_set_rack(struct worker *w, const int *ranks, int n)
{
	/* Boyer-Moore: the only rack that can hold more than half. */
	int cand = -1, votes = 0;
	for (int i = 0; i < n; i++) {
		int r = wk_rank_rack(w, ranks[i]);
		if (votes == 0)
			cand = r;
		votes += r == cand ? 1 : -1;
	}
	int count = 0;
	for (int i = 0; i < n && cand >= 0; i++)
		count += wk_rank_rack(w, ranks[i]) == cand;
	/* All but one at most: a DS-Sync group with its one traveller.  A
	 * set spread wider keeps every server (racks of 5 and 3 on the first
	 * rack's servers alone would send all of the 3's data across). */
	return cand >= 0 && 2 * count > n && count >= n - 1 ? cand : -1;
}

/* The wire name of tensor `name` of the process set of sorted `ranks`
 * (n of them) into wire (len bytes): "set:<n>:<FNV-1a of the ranks>/NAME",
 * whatever the set's id; the size comes first, so the scheduler forgets
 * the tensor once that many workers undeclared it (sched_on_forget).  0,
 * or UNISUM_EINVAL (logged, naming `what`) when it does not fit. */
int wk_set_wire_name(const int *ranks, int n, const char *name, char *wire, size_t len,
		     const char *what)
{
	uint64_t h = 0xcbf29ce484222325ull;
	for (int k = 0; k < n; k++) {
		h ^= (uint64_t)(uint32_t)ranks[k];
		h *= 0x100000001b3ull;
	}
	int prefix = snprintf(wire, len, "set:%d:%016llx/", n, (unsigned long long)h);
	if ((size_t)snprintf(wire, len, "set:%d:%016llx/%s", n, (unsigned long long)h, name) >= len)
		return log_fail(UNISUM_EINVAL, "%s: the name '%s' is too long for a process set's "
				"tensor (at most %zu characters)", what, name, len - 1 - (size_t)prefix);
	return 0;
}

/* The ranks of process set `set` (a copy, *n of them) for a tensor of
 * it, with its wire name in wire (len bytes); NULL with *rc set. */
static int *wk_pset_for(struct worker *w, int set, const char *name, char *wire, size_t len,
			int *n, int *rc)
{
	pthread_mutex_lock(&w->lock);
	int i = 0;
	while (i < w->npsets && w->psets[i].id != set)
		i++;
	int *ranks = NULL;
	bool member = false;
	if (i < w->npsets) {
		*n = w->psets[i].n;
		ranks = malloc((size_t)*n * sizeof *ranks);
		if (ranks != NULL)
			memcpy(ranks, w->psets[i].ranks, (size_t)*n * sizeof *ranks);
		for (int k = 0; ranks != NULL && k < *n; k++)
			member = member || ranks[k] == w->rank;
	}
	pthread_mutex_unlock(&w->lock);
	if (i == w->npsets) {
		*rc = log_fail(UNISUM_EINVAL, "unisum_declare_in('%s'): worker %d has no process set %d "
			       "(add it with unisum_process_set_add)", name, w->rank, set);
		return NULL;
	}
	if (ranks == NULL) {
		*rc = UNISUM_ENOMEM;
		return NULL;
	}
	if (!member) {
		free(ranks);
		*rc = log_fail(UNISUM_EINVAL, "unisum_declare_in('%s'): worker %d is not in process "
			       "set %d", name, w->rank, set);
		return NULL;
	}
	if (wk_set_wire_name(ranks, *n, name, wire, len, "unisum_declare_in") != 0) {
		free(ranks);
		*rc = UNISUM_EINVAL;
		return NULL;
	}
	*rc = wk_ensure_conns(w);
	if (*rc != 0) {
		free(ranks);
		return NULL;
	}
	return ranks;
}

int worker_declare_in(struct worker *w, int set, const char *name, unisum_dtype dtype,
		      size_t count, const struct rdv_shape *shape, int priority)
{
	if (wk_require_init(w) != 0)
		return UNISUM_ENOTINIT;
	if (name == NULL || name[0] == '\0' || strlen(name) >= sizeof ((struct wk_tensor *)0)->name)
		return log_fail(UNISUM_EINVAL, "unisum_declare: the name must have 1 to 255 characters");
	char wire[sizeof ((struct wk_tensor *)0)->name];
	int *ranks = NULL, nranks = 0;
	if (set != 0) {
		int rc;
		ranks = wk_pset_for(w, set, name, wire, sizeof wire, &nranks, &rc);
		if (ranks == NULL)
			return rc;
		name = wire;
	}
	return wk_declare(w, name, dtype, count, shape, priority, ranks, nranks, WIRE_SYNC_LOCKSTEP,
			  NULL);
}

_Static_assert(COMPRESS_SPEC_MAX < WIRE_SPEC_MAX, "a canonical spec must fit DECLARE's");

