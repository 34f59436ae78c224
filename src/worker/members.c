/*
 * members.c - who takes part in a tensor: a process set's ranks and its
 * tensors' wire names, the racks of ranks (where a set's sums live), and
 * the server connections a set's member opens.
 *
 * Below tensor.c, dssync.c and cuts.c, which ask it; above conns.c only.
 * Adding and removing sets (unisum_process_set_add/remove) is pset.c's.
 * The state it shares with the rest of the worker is in worker_int.h.
 */
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "log/log.h"
#include "rendezvous/rendezvous.h"
#include "worker/worker_int.h"

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
int *wk_pset_for(struct worker *w, int set, const char *name, char *wire, size_t len,
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
