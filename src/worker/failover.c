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

/* Where `key` moved (w->lock held), or NULL. */
static struct wk_moved *wk_moved_find(const struct worker *w, uint64_t key)
{
	if (w->nmoved == 0)
		return NULL;
	for (size_t i = wk_moved_slot(key, w->capmoved);; i = (i + 1) & (w->capmoved - 1)) {
		if (w->moved[i].key == key)
			return &w->moved[i];
		if (w->moved[i].key == 0)
			return NULL;
	}
}

uint32_t wk_server_of(const struct worker *w, uint64_t key, uint32_t placed)
{
	const struct wk_moved *m = wk_moved_find(w, key);
	return m == NULL ? placed : m->ready ? m->server : m->from;
}

/* Lost server `dead`'s hand-over is done: its keys' jobs go to their new
 * servers from now on (w->lock held). */
static void wk_moved_ready(struct worker *w, int dead)
{
	for (size_t i = 0; i < w->capmoved; i++)
		if (w->moved[i].key != 0 && (int)w->moved[i].from == dead)
			w->moved[i].ready = true;
}

/* Records that `key` moved from `from` to `server` (w->lock held), its
 * jobs to follow once `ready`.  0 or UNISUM_ENOMEM. */
static int wk_moved_put(struct worker *w, uint64_t key, uint32_t server, uint32_t from, bool ready)
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
	w->moved[i] = (struct wk_moved){.key = key, .server = server, .from = from, .ready = ready};
	atomic_store(&w->any_moved, true);
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

/* Queues on c the DECLARE_CHECK of piece `key` at `round` (the round this
 * worker pushes next there).  0 or an error, nothing left queued. */
static int wk_queue_declare(struct wk_conn *c, uint64_t key, unisum_dtype dtype, uint64_t count,
			    uint32_t round, const char *name, const struct wk_tensor *t)
{
	struct wk_job *d = calloc(1, sizeof *d);
	if (d == NULL)
		return UNISUM_ENOMEM;
	int nranks = t != NULL ? t->nranks : 0;
	*d = (struct wk_job){.type = JOB_DECLARE, .key = key, .dtype = dtype, .count = count,
			     .round = round, .name = strdup(name), .nranks = nranks,
			     .sync = t != NULL ? t->sync : 0};
	if (nranks > 0 && (d->ranks = malloc((size_t)nranks * sizeof *d->ranks)) != NULL)
		memcpy(d->ranks, t->ranks, (size_t)nranks * sizeof *d->ranks);
	bool spec_ok = t == NULL || t->comp_text[0] == '\0' ||
		       (d->spec = strdup(t->comp_text)) != NULL;
	int rc = d->name != NULL && spec_ok && (nranks == 0 || d->ranks != NULL) ? wk_enqueue(c, d)
										   : UNISUM_ENOMEM;
	if (rc != 0) {
		free(d->name);
		free(d->ranks);
		free(d->spec);
		free(d);
	}
	return rc;
}

/* Queues on c a job of `type` (RESTORE, its payload `in` and what of it
 * to free once sent, `owned`; RETIRE) for piece `key`.  0 or an error. */
/* Queues on c a job made as *tmpl.  0 or an error. */
static int wk_queue(struct wk_conn *c, const struct wk_job *tmpl)
{
	struct wk_job *j = malloc(sizeof *j);
	if (j == NULL)
		return UNISUM_ENOMEM;
	*j = *tmpl;
	int rc = wk_enqueue(c, j);
	if (rc != 0)
		free(j);
	return rc;
}

static int wk_queue_job(struct wk_conn *c, int type, uint64_t key, unisum_dtype dtype,
			uint64_t count, uint32_t round, const void *in, void *owned, size_t len)
{
	return wk_queue(c, &(struct wk_job){.type = type, .key = key, .dtype = dtype,
					    .count = count, .round = round, .in = in,
					    .owned = owned, .restore_len = len});
}

/* Queues on c the RESTORE of a homed cut's piece `key`: this worker's
 * push of `round`, answered by a lost server (data, NULL: ZERO; its
 * collective op), which the new server sums again.  0 or an error. */
static int wk_queue_pushed(struct wk_conn *c, uint64_t key, unisum_dtype dtype, uint64_t count,
			   uint32_t round, const void *data, uint32_t op)
{
	return wk_queue(c, &(struct wk_job){.type = JOB_RESTORE, .key = key, .dtype = dtype,
					    .count = count, .round = round, .in = data,
					    .wire_op = op,
					    .restore_flags = (uint16_t)(WIRE_FLAG_PUSHED |
									(data == NULL ? WIRE_FLAG_ZERO
										      : 0))});
}

int wk_move_key(struct worker *w, struct wk_conn *c, struct wk_job *j, int to)
{
	struct wk_tensor *t = j->op->t;
	struct wk_conn *dst = &w->conns[to];
	pthread_mutex_lock(&w->lock);
	int rc = wk_moved_put(w, j->key, (uint32_t)to, (uint32_t)c->server, true);
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
	rc = wk_queue_declare(dst, j->key, j->dtype, j->count, j->round, t->name, t);
	/* Every reply of the key from c's server has come: it may forget it. */
	if (rc == 0)
		wk_queue_job(c, JOB_RETIRE, j->key, 0, 0, j->round, NULL, NULL, 0);
	return rc;
}

void wk_on_failover(void *arg, const struct rdv_failover *f)
{
	struct worker *w = arg;
	if (f->dead < 0 || f->dead >= w->nservers) {
		LOG_ERROR("the scheduler sent a FAILOVER of server %d of %d", f->dead, w->nservers);
		return;
	}
	int rc = 0;
	for (uint32_t i = 0; i < f->n; i++)
		if (f->servers[i] >= (uint32_t)w->nservers || (int)f->servers[i] == f->dead)
			rc = UNISUM_EPROTO;
	pthread_mutex_lock(&w->lock);
	if (rc == 0 && w->lost == NULL && (w->lost = calloc((size_t)w->nservers, 1)) == NULL)
		rc = UNISUM_ENOMEM;
	/* Jobs follow once the lost server's hand-over is done (wk_hand_over). */
	for (uint32_t i = 0; rc == 0 && i < f->n; i++)
		rc = wk_moved_put(w, f->keys[i], f->servers[i], (uint32_t)f->dead, false);
	if (rc == 0) {
		w->failovers++;
		w->lost[f->dead] = true;
		LOG_WARN("worker %d: failover %u: server %d is lost, its %u partitions moved", w->rank,
			 f->number, f->dead, f->n);
	}
	/* Whoever waits for it (wk_conn_fail) looks again. */
	pthread_cond_broadcast(&w->failed_cond);
	struct wk_conn *c = w->conns_live && w->conns != NULL ? &w->conns[f->dead] : NULL;
	pthread_mutex_unlock(&w->lock);
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
	/* A homed cut's last pushes cost a copy of every push: kept only
	 * with UNISUM_GATHER_FAILOVER (without, a failover fails the job:
	 * sched_unmovable). */
	if (L->homed != 0 && !w->cfg.gather_failover)
		return 0;
	/* One machine restores no sums (its re-pushes are the round); an
	 * async key's new server needs its last push (replicas), and a
	 * compressed one's re-push its encoding as first sent (L->cs comes
	 * with the first push: the spec says). */
	if (t->sync == 0 && w->cfg.num_workers <= 1 && t->comp_text[0] == '\0')
		return 0;
	L->kept = calloc(L->nparts, sizeof *L->kept);
	if (L->kept == NULL)
		return UNISUM_ENOMEM;
	/* A homed cut (a gathering collective's) keeps its last push answered,
	 * as its machines pull with SKIP what they do not need: no one reply
	 * is the round, but every machine's push is (a ZERO one is a flag;
	 * the others' buffers come with their first data push). */
	for (uint32_t i = 0; L->homed != 0 && i < L->nparts; i++)
		L->kept[i].homed = L->kept[i].keeps_push = true;
	/* An async key's two push buffers (wk_keep_push), made now: a push
	 * that could not be kept would be lost to a failover. */
	for (uint32_t i = 0; t->sync != 0 && L->homed == 0 && i < L->nparts; i++) {
		size_t bytes = L->parts[i].count * unisum_dtype_size(t->dtype);
		struct wk_kept *k = &L->kept[i];
		k->keeps_push = true;
		k->data = malloc(bytes ? bytes : 1);
		k->stage = malloc(bytes ? bytes : 1);
		if (k->data == NULL || k->stage == NULL) {
			wk_kept_free(L);
			return UNISUM_ENOMEM;
		}
	}
	return 0;
}

void wk_kept_free(struct wk_layout *L)
{
	for (uint32_t i = 0; L->kept != NULL && i < L->nparts; i++) {
		free(L->kept[i].data);
		free(L->kept[i].stage);
	}
	free(L->kept);
	L->kept = NULL;
}

/* The server `key` moved to from lost server `dead`, or -1 (w->lock held). */
static int wk_moved_from(const struct worker *w, uint64_t key, int dead)
{
	const struct wk_moved *m = wk_moved_find(w, key);
	return m != NULL && (int)m->from == dead ? (int)m->server : -1;
}

/* Queues, on the new server of partition i of cut L of tensor t, the
 * DECLARE_CHECK of its key at the round this worker pushes next, and the
 * RESTORE of the last sum it received (of an async key, with replicas:
 * its last push answered, which the new server's copy may not hold,
 * replica.c).  0 or an error (w->lock held). */
static int wk_redeclare(struct worker *w, struct wk_tensor *t, struct wk_layout *L, uint32_t i,
			int to, const char *wire_name)
{
	struct wk_kept *k = &L->kept[i];
	struct wk_conn *c = &w->conns[to];
	int rc = wk_queue_declare(c, L->key + i, t->dtype, L->parts[i].count, k->pulled, wire_name,
				  t);
	if (rc == 0 && k->homed && k->pulled > 0 && (k->data != NULL || k->zero))
		return wk_queue_pushed(c, L->key + i, t->dtype, L->parts[i].count, k->pulled - 1,
				       k->zero ? NULL : k->data, k->op);
	if (rc != 0 || k->pulled == 0 || k->data == NULL || k->homed)
		return rc;
	/* k->data is not written again before this is sent: the next reply
	 * of the key answers a push queued behind it. */
	return wk_queue_job(c, JOB_RESTORE, L->key + i, t->dtype, L->parts[i].count, k->pulled - 1,
			    k->data, NULL, L->cs != NULL ? k->len : 0);
}

/* The name a cut was declared under (as wk_cut's callers name it). */
static void wk_cut_name(const struct wk_tensor *t, int c, char *buf, size_t len)
{
	if (t->cuts[c].homed != 0)
		snprintf(buf, len, "%.200s#%u", t->name, t->cuts[c].homed_no);
	else if (c == 0)
		snprintf(buf, len, "%s", t->name);
	else
		snprintf(buf, len, "%s@%llu", t->name, (unsigned long long)t->cuts[c].pbytes);
}

void wk_redeclare_late(struct worker *w, struct wk_tensor *t, int c)
{
	struct wk_layout *L = &t->cuts[c];
	if (w->lost == NULL || L->kept == NULL)
		return;
	char name[WK_NAME_MAX + 32];
	wk_cut_name(t, c, name, sizeof name);
	for (uint32_t i = 0; i < L->nparts; i++) {
		uint32_t s = L->servers[i];
		if (!w->lost[s])
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
	if (t->nranks > 0 || t->sync != 0 || t->comp_text[0] != '\0')
		return;	/* process sets, async, compressed: not restored (see wk_hand_over) */
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
	struct wk_conn *c = &w->conns[to];
	size_t bytes = g->count * unisum_dtype_size(g->dtype);
	uint8_t *copy = malloc(bytes + 1);
	if (copy == NULL)
		return UNISUM_ENOMEM;
	memcpy(copy, g->data, bytes);
	int rc = wk_queue_declare(c, g->key, g->dtype, g->count, g->pulled, "(undeclared)", NULL);
	if (rc == 0 &&
	    wk_queue_job(c, JOB_RESTORE, g->key, g->dtype, g->count, g->pulled - 1, copy, copy, 0) ==
		    0)
		copy = NULL;
	free(copy);
	if (rc == 0)
		wk_queue_job(c, JOB_RETIRE, g->key, 0, 0, g->pulled, NULL, NULL, 0);
	return rc;
}

int wk_hand_over(struct worker *w, int dead)
{
	int rc = 0, n = 0;
	pthread_mutex_lock(&w->lock);
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
				int to = wk_moved_from(w, L->key + i, dead);
				if (to < 0)
					continue;
				rc = wk_redeclare(w, t, L, i, to, name);
				n++;
			}
		}
	}
	for (int i = 0; i < w->ngone_kept && rc == 0;) {
		int to = wk_moved_from(w, w->gone_kept[i].key, dead);
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
