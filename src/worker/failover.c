/*
 * failover.c - the worker's side of server failover
 * (UNISUM_SERVER_FAILOVER): where moved keys live, the replies kept for
 * a new server, and the hand-over of a lost server's work.
 *
 * DESIGN.  The scheduler answers a lost server with FAILOVER: the keys it
 * held and the live server each one moved to (wk_on_failover records
 * them in w->moved and w->lost[dead], and cuts this worker's connection
 * to it, in case the server is only silent).  The connection's receiving
 * thread then ends in wk_conn_fail, which waits for that FAILOVER (or the
 * job's failure) and calls wk_hand_over: for every partition of a moved
 * key that this worker pushes, a DECLARE_CHECK to its new server carrying
 * the round the worker pushes next (wk_kept.pulled), then a RESTORE of
 * the last sum it received from the lost server, if any; then every
 * PUSH_PULL job that was waiting on the lost server goes to the new one,
 * behind them on the same connection, and is pushed again.  The new server
 * so learns, from each machine, the round it is at; a round that some
 * machines completed (their RESTORE is its sum) is answered to the others
 * from that sum, and a round that none completed is summed from the
 * re-pushes.  Lock-step rounds keep the machines at most one round apart
 * on a key, which is what makes this exact.  A reply goes into the kept
 * buffer first and only then into the caller's output: a push made from
 * the output (in place, the local path) stays intact if the server dies
 * in the middle of its reply.  Jobs that reach a lost server's connection
 * later follow w->moved (wk_route).
 */
#include <stdlib.h>
#include <string.h>

#include "log/log.h"
#include "timing/timing.h"
#include "wire/wire.h"
#include "worker/worker_int.h"

static size_t wk_moved_slot(uint64_t key, size_t cap)
{
	key ^= key >> 31;
	key *= 0x9e3779b97f4a7c15ull;
	return (size_t)(key >> 17) & (cap - 1);
}

uint32_t wk_server_of(const struct worker *w, uint64_t key, uint32_t placed)
{
	if (w->nmoved == 0)
		return placed;
	for (size_t i = wk_moved_slot(key, w->capmoved);; i = (i + 1) & (w->capmoved - 1)) {
		if (w->moved[i].key == key)
			return w->moved[i].ready ? w->moved[i].server : w->moved[i].from;
		if (w->moved[i].key == 0)
			return placed;
	}
}

/* Lost server `dead`'s hand-over is done: its keys' jobs go to their new
 * servers from now on (w->lock held). */
static void wk_moved_ready(struct worker *w, int dead)
{
	for (size_t i = 0; i < w->capmoved; i++)
		if (w->moved[i].key != 0 && (int)w->moved[i].from == dead)
			w->moved[i].ready = true;
}

/* Records that `key` lives on `server` now (w->lock held).  0 or
 * UNISUM_ENOMEM. */
static int wk_moved_put(struct worker *w, uint64_t key, uint32_t server, uint32_t from)
{
	if (2 * (w->nmoved + 1) > w->capmoved) {
		size_t cap = w->capmoved ? 2 * w->capmoved : 1024;
		struct wk_moved *m = calloc(cap, sizeof *m);
		if (m == NULL)
			return UNISUM_ENOMEM;
		for (size_t i = 0; i < w->capmoved; i++) {
			if (w->moved[i].key == 0)
				continue;
			size_t j = wk_moved_slot(w->moved[i].key, cap);
			while (m[j].key != 0)
				j = (j + 1) & (cap - 1);
			m[j] = w->moved[i];
		}
		free(w->moved);
		w->moved = m;
		w->capmoved = cap;
	}
	size_t i = wk_moved_slot(key, w->capmoved);
	while (w->moved[i].key != 0 && w->moved[i].key != key)
		i = (i + 1) & (w->capmoved - 1);
	if (w->moved[i].key == 0)
		w->nmoved++;
	w->moved[i] = (struct wk_moved){.key = key, .server = server, .from = from};
	return 0;
}

void wk_moved_forget(struct worker *w, uint64_t key, uint32_t n)
{
	for (uint32_t k = 0; w->nmoved > 0 && k < n; k++) {
		size_t cap = w->capmoved, i = wk_moved_slot(key + k, cap);
		while (w->moved[i].key != 0 && w->moved[i].key != key + k)
			i = (i + 1) & (cap - 1);
		if (w->moved[i].key == 0)
			continue;
		/* Backward-shift deletion keeps every probe chain whole. */
		w->moved[i].key = 0;
		w->nmoved--;
		for (size_t j = (i + 1) & (cap - 1); w->moved[j].key != 0; j = (j + 1) & (cap - 1)) {
			size_t home = wk_moved_slot(w->moved[j].key, cap);
			bool between = i <= j ? (home > i && home <= j) : (home > i || home <= j);
			if (!between) {
				w->moved[i] = w->moved[j];
				w->moved[j].key = 0;
				i = j;
			}
		}
	}
}

void wk_on_rejoin(void *arg, const struct rdv_node *node)
{
	struct worker *w = arg;
	pthread_mutex_lock(&w->lock);
	bool live = w->conns_live && w->conns != NULL && node->rank >= 0 && node->rank < w->nservers;
	pthread_mutex_unlock(&w->lock);
	if (!live)
		return;	/* no connections (not a local root): nothing to do */
	struct wk_conn *c = &w->conns[node->rank];
	int rc = wk_reconnect(w, c, node);
	if (rc != 0) {
		char why[300];
		snprintf(why, sizeof why, "worker %d cannot reach the replacement of server %d at %s:%d: "
			 "%s", w->rank, node->rank, node->host, node->port, log_last_error());
		rdv_client_fail_job(w->rdv, rc, why);
		return;
	}
	pthread_mutex_lock(&w->lock);
	pthread_cond_broadcast(&w->failed_cond);	/* jobs waiting for it (wk_route) */
	pthread_mutex_unlock(&w->lock);
	LOG_INFO("worker %d: server %d is back at %s:%d", w->rank, node->rank, node->host, node->port);
}

int wk_move_key(struct worker *w, struct wk_conn *c, struct wk_job *j, int to)
{
	struct wk_tensor *t = j->op->t;
	struct wk_conn *dst = &w->conns[to];
	pthread_mutex_lock(&w->lock);
	int rc = wk_moved_put(w, j->key, (uint32_t)to, (uint32_t)c->server);
	if (rc == 0) {
		struct wk_moved *m = &w->moved[0];
		for (size_t i = wk_moved_slot(j->key, w->capmoved);; i = (i + 1) & (w->capmoved - 1))
			if ((m = &w->moved[i])->key == j->key)
				break;
		m->ready = true;
		atomic_store(&w->any_moved, true);
	}
	/* The scheduler sent the replacement's REJOIN before its MIGRATE, but
	 * on another connection: wait until this worker followed it. */
	struct timespec until = timing_deadline(w->cfg.timeout_ms);
	bool up = false;
	while (rc == 0 && w->failed == 0) {
		pthread_mutex_lock(&dst->lock);
		up = !dst->dead;
		pthread_mutex_unlock(&dst->lock);
		if (up || pthread_cond_timedwait(&w->failed_cond, &w->lock, &until) != 0)
			break;
	}
	pthread_mutex_unlock(&w->lock);
	if (rc != 0)
		return rc;
	if (!up)
		return log_fail(UNISUM_ECONN, "server %d, where key 0x%llx moved, is not back", to,
				(unsigned long long)j->key);
	struct wk_job *d = calloc(1, sizeof *d);
	struct wk_job *r = calloc(1, sizeof *r);
	if (d == NULL || r == NULL) {
		free(d);
		free(r);
		return UNISUM_ENOMEM;
	}
	*d = (struct wk_job){.type = JOB_DECLARE, .key = j->key, .dtype = j->dtype, .count = j->count,
			     .round = j->round, .name = strdup(t->name), .nranks = t->nranks,
			     .sync = t->sync};
	if (t->nranks > 0 && (d->ranks = malloc((size_t)t->nranks * sizeof *d->ranks)) != NULL)
		memcpy(d->ranks, t->ranks, (size_t)t->nranks * sizeof *d->ranks);
	rc = d->name != NULL && (t->nranks == 0 || d->ranks != NULL) ? wk_enqueue(dst, d)
								      : UNISUM_ENOMEM;
	if (rc != 0) {
		free(d->name);
		free(d->ranks);
		free(d);
		free(r);
		return rc;
	}
	/* Every reply of the key from c's server has come: it may forget it. */
	*r = (struct wk_job){.type = JOB_RETIRE, .key = j->key, .round = j->round};
	if (wk_enqueue(c, r) != 0)
		free(r);
	return 0;
}

struct wk_pair {
	uint64_t key;
	uint32_t to;
};

static int wk_pair_cmp(const void *a, const void *b)
{
	uint64_t x = ((const struct wk_pair *)a)->key, y = ((const struct wk_pair *)b)->key;
	return x < y ? -1 : x > y;
}

void wk_on_failover(void *arg, const struct rdv_failover *f)
{
	struct worker *w = arg;
	if (f->dead < 0 || f->dead >= w->nservers) {
		LOG_ERROR("the scheduler sent a FAILOVER of server %d of %d", f->dead, w->nservers);
		return;
	}
	struct wk_pair *pairs = malloc((f->n ? f->n : 1) * sizeof *pairs);
	uint64_t *keys = malloc((f->n ? f->n : 1) * sizeof *keys);
	uint32_t *to = malloc((f->n ? f->n : 1) * sizeof *to);
	int rc = pairs != NULL && keys != NULL && to != NULL ? 0 : UNISUM_ENOMEM;
	for (uint32_t i = 0; rc == 0 && i < f->n; i++) {
		if (f->servers[i] >= (uint32_t)w->nservers || (int)f->servers[i] == f->dead)
			rc = UNISUM_EPROTO;
		pairs[i] = (struct wk_pair){.key = f->keys[i], .to = f->servers[i]};
	}
	if (rc == 0)
		qsort(pairs, f->n, sizeof *pairs, wk_pair_cmp);
	for (uint32_t i = 0; rc == 0 && i < f->n; i++) {
		keys[i] = pairs[i].key;
		to[i] = pairs[i].to;
	}
	free(pairs);
	pthread_mutex_lock(&w->lock);
	if (rc == 0 && w->lost == NULL &&
	    (w->lost = calloc((size_t)w->nservers, sizeof *w->lost)) == NULL)
		rc = UNISUM_ENOMEM;
	for (uint32_t i = 0; rc == 0 && i < f->n; i++)
		rc = wk_moved_put(w, keys[i], to[i], (uint32_t)f->dead);
	if (rc == 0 && f->n > 0)
		atomic_store(&w->any_moved, true);
	if (rc == 0)
		w->failovers++;
	if (rc == 0) {
		struct wk_lost *l = &w->lost[f->dead];
		free(l->keys);
		free(l->to);
		*l = (struct wk_lost){.known = true, .n = f->n, .keys = keys, .to = to};
		keys = NULL;
		to = NULL;
		LOG_WARN("worker %d: failover %u: server %d is lost, its %u partitions moved", w->rank,
			 f->number, f->dead, f->n);
	}
	/* Whoever waits for it (wk_conn_fail) looks again. */
	pthread_cond_broadcast(&w->failed_cond);
	struct wk_conn *c = w->conns_live && w->conns != NULL ? &w->conns[f->dead] : NULL;
	pthread_mutex_unlock(&w->lock);
	free(keys);
	free(to);
	if (rc != 0) {
		char why[200];
		snprintf(why, sizeof why, "worker %d cannot follow failover %u of server %d: %s", w->rank,
			 f->number, f->dead, rc == UNISUM_ENOMEM ? "out of memory" : "a malformed FAILOVER");
		rdv_client_fail_job(w->rdv, rc, why);
		return;
	}
	/* The server may only be silent: cut it off, so that its connection's
	 * thread ends and hands its work over. */
	if (c != NULL && c->conn != NULL)
		c->tp->conn_shutdown(c->conn);
}

int wk_kept_init(const struct wk_tensor *t, struct wk_layout *L)
{
	const struct worker *w = t->w;
	bool pushes = t->nranks > 0 || w->to_servers;
	if (!w->keep_replies || !pushes || L->nparts == 0)
		return 0;
	L->kept = calloc(L->nparts, sizeof *L->kept);
	return L->kept != NULL ? 0 : UNISUM_ENOMEM;
}

void wk_kept_free(struct wk_layout *L)
{
	for (uint32_t i = 0; L->kept != NULL && i < L->nparts; i++)
		free(L->kept[i].data);
	free(L->kept);
	L->kept = NULL;
}

/* The new server of `key`, moved from the lost server l, or -1. */
static int wk_lost_to(const struct wk_lost *l, uint64_t key)
{
	size_t lo = 0, hi = l->n;
	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		if (l->keys[mid] < key)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo < l->n && l->keys[lo] == key ? (int)l->to[lo] : -1;
}

/* Queues, on the new server of partition i of cut L of tensor t, the
 * DECLARE_CHECK of its key at the round this worker pushes next, and the
 * RESTORE of the last sum it received.  0 or an error (w->lock held). */
static int wk_redeclare(struct worker *w, struct wk_tensor *t, struct wk_layout *L, uint32_t i,
			int to, const char *wire_name)
{
	struct wk_kept *k = &L->kept[i];
	struct wk_job *j = calloc(1, sizeof *j);
	if (j == NULL)
		return UNISUM_ENOMEM;
	*j = (struct wk_job){.type = JOB_DECLARE, .key = L->key + i, .dtype = t->dtype,
			     .count = L->parts[i].count, .round = k->pulled, .name = strdup(wire_name),
			     .nranks = t->nranks, .sync = t->sync};
	if (t->nranks > 0 && (j->ranks = malloc((size_t)t->nranks * sizeof *j->ranks)) != NULL)
		memcpy(j->ranks, t->ranks, (size_t)t->nranks * sizeof *j->ranks);
	int rc = j->name != NULL && (t->nranks == 0 || j->ranks != NULL)
			 ? wk_enqueue(&w->conns[to], j) : UNISUM_ENOMEM;
	if (rc != 0) {
		free(j->name);
		free(j->ranks);
		free(j);
		return rc;
	}
	if (k->pulled == 0 || k->data == NULL)
		return 0;
	j = calloc(1, sizeof *j);
	if (j == NULL)
		return UNISUM_ENOMEM;
	/* k->data is not written again before this is sent: the next reply
	 * of the key answers a push queued behind it. */
	*j = (struct wk_job){.type = JOB_RESTORE, .key = L->key + i, .dtype = t->dtype,
			     .count = L->parts[i].count, .round = k->pulled - 1, .in = k->data};
	rc = wk_enqueue(&w->conns[to], j);
	if (rc != 0)
		free(j);
	return rc;
}

/* The name a cut was declared under (as wk_cut's callers name it). */
static void wk_cut_name(const struct wk_tensor *t, int c, char *buf, size_t len)
{
	if (c == 0)
		snprintf(buf, len, "%s", t->name);
	else
		snprintf(buf, len, "%s@%llu", t->name, (unsigned long long)t->cuts[c].pbytes);
}

void wk_redeclare_late(struct worker *w, struct wk_tensor *t, int c)
{
	struct wk_layout *L = &t->cuts[c];
	if (w->lost == NULL || L->kept == NULL || L->homed != 0)
		return;
	char name[WK_NAME_MAX + 32];
	wk_cut_name(t, c, name, sizeof name);
	for (uint32_t i = 0; i < L->nparts; i++) {
		uint32_t s = L->servers[i];
		if (!w->lost[s].known)
			continue;
		/* Its hand-over is done (else it will find this cut itself):
		 * the DECLARE_CHECK may have gone to the lost server. */
		uint32_t to = wk_server_of(w, L->key + i, s);
		if (to != s && wk_redeclare(w, t, L, i, (int)to, name) != 0)
			LOG_WARN("worker %d cannot declare '%s' on server %u after a failover", w->rank,
				 name, to);
	}
}

/* At most this many gone pieces, and bytes, are kept (the oldest go). */
#define WK_GONE_MAX 1024
#define WK_GONE_BYTES (64u << 20)

static void wk_gone_drop(struct worker *w, int i)
{
	w->gone_kept_bytes -= w->gone_kept[i].count * unisum_dtype_size(w->gone_kept[i].dtype);
	free(w->gone_kept[i].data);
	memmove(&w->gone_kept[i], &w->gone_kept[i + 1],
		(size_t)(w->ngone_kept - i - 1) * sizeof *w->gone_kept);
	w->ngone_kept--;
}

void wk_keep_gone(struct worker *w, struct wk_tensor *t)
{
	if (t->nranks > 0 || t->sync != 0)
		return;	/* process sets and async: not restored (see wk_hand_over) */
	for (int c = 0; c < t->ncuts; c++) {
		struct wk_layout *L = &t->cuts[c];
		for (uint32_t i = 0; L->kept != NULL && L->homed == 0 && i < L->nparts; i++) {
			struct wk_kept *k = &L->kept[i];
			size_t bytes = L->parts[i].count * t->esize;
			if (k->data == NULL || k->pulled == 0 || bytes > WK_GONE_BYTES)
				continue;
			if (w->gone_kept == NULL &&
			    (w->gone_kept = calloc(WK_GONE_MAX, sizeof *w->gone_kept)) == NULL)
				return;
			while (w->ngone_kept > 0 && (w->ngone_kept == WK_GONE_MAX ||
						     w->gone_kept_bytes + bytes > WK_GONE_BYTES))
				wk_gone_drop(w, 0);
			w->gone_kept[w->ngone_kept++] = (struct wk_gone_kept){
				.key = L->key + i, .count = L->parts[i].count, .dtype = t->dtype,
				.pulled = k->pulled, .sync = t->sync, .data = k->data};
			w->gone_kept_bytes += bytes;
			k->data = NULL;
		}
	}
}

void wk_gone_kept_free(struct worker *w)
{
	while (w->ngone_kept > 0)
		wk_gone_drop(w, w->ngone_kept - 1);
	free(w->gone_kept);
	w->gone_kept = NULL;
}

/* An undeclared tensor's piece that the lost server held: its new server
 * gets the DECLARE_CHECK, the RESTORE of its last round, and this worker's
 * RETIRE (it is done with it), for a worker that still waits for that
 * round.  0 or an error (w->lock held). */
static int wk_restore_gone(struct worker *w, const struct wk_gone_kept *g, int to)
{
	struct wk_job *d = calloc(1, sizeof *d), *r = calloc(1, sizeof *r),
		      *x = calloc(1, sizeof *x);
	uint8_t *copy = malloc(g->count * unisum_dtype_size(g->dtype) + 1);
	if (d == NULL || r == NULL || x == NULL || copy == NULL) {
		free(d);
		free(r);
		free(x);
		free(copy);
		return UNISUM_ENOMEM;
	}
	memcpy(copy, g->data, g->count * unisum_dtype_size(g->dtype));
	*d = (struct wk_job){.type = JOB_DECLARE, .key = g->key, .dtype = g->dtype, .count = g->count,
			     .round = g->pulled, .name = strdup("(undeclared)"), .sync = g->sync};
	*r = (struct wk_job){.type = JOB_RESTORE, .key = g->key, .dtype = g->dtype, .count = g->count,
			     .round = g->pulled - 1, .in = copy, .owned = copy};
	*x = (struct wk_job){.type = JOB_RETIRE, .key = g->key, .round = g->pulled};
	struct wk_conn *c = &w->conns[to];
	int rc = d->name != NULL ? wk_enqueue(c, d) : UNISUM_ENOMEM;
	if (rc != 0) {
		free(d->name);
		free(d);
		free(r);
		free(x);
		free(copy);
		return rc;
	}
	if (wk_enqueue(c, r) != 0) {
		free(r);
		free(copy);
	}
	if (wk_enqueue(c, x) != 0)
		free(x);
	return 0;
}

int wk_hand_over(struct worker *w, int dead)
{
	int rc = 0, n = 0;
	pthread_mutex_lock(&w->lock);
	const struct wk_lost *l = &w->lost[dead];
	for (int ti = 0; ti < w->ntensors && rc == 0; ti++) {
		struct wk_tensor *t = w->tensors[ti];
		if (t == NULL)
			continue;
		for (int c = 0; c < t->ncuts && rc == 0; c++) {
			struct wk_layout *L = &t->cuts[c];
			if (L->kept == NULL || L->retired)
				continue;
			char name[WK_NAME_MAX + 32];
			wk_cut_name(t, c, name, sizeof name);
			for (uint32_t i = 0; i < L->nparts && rc == 0; i++) {
				int to = wk_lost_to(l, L->key + i);
				if (to < 0)
					continue;
				rc = wk_redeclare(w, t, L, i, to, name);
				n++;
			}
		}
	}
	for (int i = 0; i < w->ngone_kept && rc == 0;) {
		int to = wk_lost_to(l, w->gone_kept[i].key);
		if (to < 0) {
			i++;
			continue;
		}
		LOG_DEBUG("worker %d: key 0x%llx, undeclared here, restored on server %d at round %u",
			  w->rank, (unsigned long long)w->gone_kept[i].key, to, w->gone_kept[i].pulled - 1);
		rc = wk_restore_gone(w, &w->gone_kept[i], to);
		wk_gone_drop(w, i);
		n++;
	}
	/* Jobs that come from now on go where their keys went, behind these
	 * declarations. */
	wk_moved_ready(w, dead);
	pthread_mutex_unlock(&w->lock);
	if (rc == 0)
		LOG_INFO("worker %d: %d partitions of lost server %d declared on their new servers",
			 w->rank, n, dead);
	return rc;
}
