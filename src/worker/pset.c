/*
 * pset.c - adding and removing process sets (a set's ranks, wire names, racks and connections are members.c's; declaring a tensor in a set is tensor.c's).
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

_Static_assert(COMPRESS_SPEC_MAX < WIRE_SPEC_MAX, "a canonical spec must fit DECLARE's");

