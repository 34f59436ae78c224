/*
 * cuts.c - which partitions a round uses and where it starts: a tensor's
 * cuts (each a declaration with the scheduler, "name@bytes" for
 * autotune's), autotune's settings and thread (an operation whose cut is
 * not ready waits there, never in the caller's thread), and the hand-off
 * of an operation to LOCAL_REDUCE or the PUSH queue.  See worker.c's
 * DESIGN.
 */
#include <endian.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/prctl.h>

#include "log/log.h"
#include "reducer/reducer.h"
#include "shm/shm.h"
#include "timing/timing.h"
#include "trace/trace.h"
#include "wire/wire.h"
#include "worker/worker_int.h"

/* ---- autotune (src/worker/tune.c) ----------------------------------------- */

/* A setting worker 0 posted, passed on by the scheduler (the client's loop thread). */
void wk_on_tune(void *arg, const struct rdv_tune *t)
{
	struct worker *w = arg;
	tune_on_setting(w->tuner, t);
}

static int wk_tune_post(void *arg, const struct rdv_tune *t)
{
	struct worker *w = arg;
	return rdv_client_post_tune(w->rdv, t);
}

static void wk_tune_fail_job(void *arg, int err, const char *why)
{
	struct worker *w = arg;
	rdv_client_fail_job(w->rdv, err, why);
}

static void wk_tune_set_credit(void *arg, uint64_t credit)
{
	struct worker *w = arg;
	pushq_set_credit(&w->push_q, credit);
}

static void wk_tune_measure(void *arg, struct tune_meas *m)
{
	wk_meter_read(arg, m);
}

int wk_tuner_new(struct worker *w)
{
	struct tune_cfg cfg = {.rank = w->rank, .on = w->cfg.autotune != 0,
			       .fit = w->cfg.autotune == 2,
			       .steps = (uint32_t)w->cfg.autotune_steps, .timeout_ms = w->cfg.timeout_ms,
			       .set_by = w->cfg.autotune_set_by[0] ? w->cfg.autotune_set_by : NULL,
			       .first = {w->cfg.partition_bytes, w->cfg.credit_bytes}};
	struct tune_hooks hooks = {.arg = w, .post = wk_tune_post, .fail_job = wk_tune_fail_job,
				   .set_credit = wk_tune_set_credit, .measure = wk_tune_measure};
	if (w->rank == 0 && w->cfg.autotune_auto && w->cfg.autotune == 2)
		LOG_INFO("UNISUM_AUTOTUNE is not set: fit mode fits the partition size and credit to "
			 "the network it measures, starting from %llu B and %llu B",
			 (unsigned long long)cfg.first.pbytes, (unsigned long long)cfg.first.credit);
	else if (w->rank == 0 && w->cfg.autotune_auto)
		LOG_INFO("UNISUM_AUTOTUNE is not set and %s is: partition %llu B and credit %llu B "
			 "hold for good", w->cfg.autotune_set_by, (unsigned long long)cfg.first.pbytes,
			 (unsigned long long)cfg.first.credit);
	/* The client's loop thread may already be failing the job
	 * (wk_notice stops the tuner under w->lock): publish it there. */
	struct tuner *tu;
	int rc = tune_new(&cfg, &hooks, &tu);
	if (rc != 0)
		return rc;
	pthread_mutex_lock(&w->lock);
	w->tuner = tu;
	if (w->failed != 0)
		tune_stop(tu);
	pthread_mutex_unlock(&w->lock);
	return 0;
}

/* Tells piece i of cut L of tensor t (named wire_name) to its server
 * (DECLARE_CHECK), or to where it moved when that server was lost since.
 * 0 or an error (logged). */
static int wk_declare_piece(const struct wk_tensor *t, const char *wire_name,
			    const struct wk_layout *L, uint32_t i)
{
	struct worker *w = t->w;
	struct wk_job *j = calloc(1, sizeof *j);
	if (j == NULL)
		return UNISUM_ENOMEM;
	*j = (struct wk_job){.type = JOB_DECLARE, .key = L->key + i, .dtype = t->dtype,
			     .count = L->parts[i].count, .name = strdup(wire_name),
			     .nranks = t->nranks, .sync = t->sync,
			     .spec = t->comp_text[0] ? strdup(t->comp_text) : NULL};
	if (t->nranks > 0 && (j->ranks = malloc((size_t)t->nranks * sizeof *j->ranks)) != NULL)
		memcpy(j->ranks, t->ranks, (size_t)t->nranks * sizeof *j->ranks);
	/* A piece placed on a server lost since goes where it moved. */
	pthread_mutex_lock(&w->lock);
	uint32_t to = wk_server_of(w, j->key, L->servers[i]);
	pthread_mutex_unlock(&w->lock);
	int rc = j->name != NULL && (t->nranks == 0 || j->ranks != NULL) &&
				 (t->comp_text[0] == '\0' || j->spec != NULL)
			 ? wk_enqueue(&w->conns[to], j)
			 : UNISUM_ENOMEM;
	if (rc == 0)
		return 0;
	free(j->name);
	free(j->spec);
	free(j->ranks);
	free(j);
	/* Placed on a server lost since, whose hand-over is under way or
	 * done: the piece is declared where it moved once the cut is filed
	 * (wk_hand_over, wk_redeclare_late). */
	struct wk_conn *c = &w->conns[to];
	pthread_mutex_lock(&c->lock);
	bool moving = c->dead && (c->parking || c->handed_over);
	pthread_mutex_unlock(&c->lock);
	if (rc == UNISUM_ECONN && moving)
		return 0;
	return log_fail(rc, "unisum_declare('%s') on worker %d: %s", wire_name, w->rank,
			log_last_error());
}

/* Cuts tensor t into partitions of at most `pbytes`, declares that cut
 * with the scheduler under `wire_name` (which places it and gives its
 * keys), and tells each partition's server what to expect, ahead of any
 * push of it.  Fills *L; 0 or a negative error (logged). */
int wk_cut(const struct wk_tensor *t, const char *wire_name, uint64_t pbytes,
	   const struct wk_segs *segs, struct wk_layout *L)
{
	struct worker *w = t->w;
	uint64_t nparts = placement_nparts(t->count, t->esize, pbytes);
	if (segs == NULL && nparts > PLACEMENT_MAX_PARTS)
		return log_fail(UNISUM_EINVAL, "unisum_declare('%s'): %llu elements make %llu "
				"partitions of %llu bytes, more than %u; raise UNISUM_PARTITION_BYTES",
				t->name, (unsigned long long)t->count, (unsigned long long)nparts,
				(unsigned long long)pbytes, PLACEMENT_MAX_PARTS);
	*L = (struct wk_layout){.pbytes = pbytes, .homed = segs != NULL ? segs->hash : 0};
	char why[768];
	pthread_mutex_lock(&w->lock);
	uint32_t failovers = w->failovers;
	pthread_mutex_unlock(&w->lock);
	/* The shape goes with the first cut, the tensor's own declaration. */
	int rc = rdv_client_declare_homed(w->rdv, wire_name, t->dtype, t->count, pbytes,
					  segs != NULL ? segs->n : 0, segs != NULL ? segs->counts : NULL,
					  segs != NULL ? segs->owners : NULL,
					  t->ncuts == 0 ? &t->shape : NULL, t->sync, t->comp_text,
					  segs == NULL ? wk_set_rack(w, t->ranks, t->nranks) : -1, &L->key,
					  &L->nparts,
					  &L->parts, &L->servers, why, sizeof why);
	if (rc != 0) {
		rc = log_fail(rc, "unisum_declare('%s') on worker %d: %s", wire_name, w->rank, why);
		goto out_free;
	}
	/* A fresh placement: where earlier keys of this name had moved to no
	 * longer matters (every worker forgets it alike), unless a failover
	 * came meanwhile, which the placement may predate. */
	pthread_mutex_lock(&w->lock);
	if (w->failovers == failovers)
		wk_moved_forget(w, L->key, L->nparts);
	pthread_mutex_unlock(&w->lock);
	for (uint32_t i = 0; i < L->nparts && (w->to_servers || t->nranks > 0); i++) {
		/* (Else the local root tells them; a process set's members each do.) */
		if (L->servers[i] >= (uint32_t)w->nservers) {
			rc = log_fail(UNISUM_EPROTO, "the scheduler placed '%s' on server %u of %d",
				      wire_name, L->servers[i], w->nservers);
			goto out_free;
		}
		rc = wk_declare_piece(t, wire_name, L, i);
		if (rc != 0)
			goto out_free;
	}
	rc = wk_kept_init(t, L);
	if (rc == 0)
		return 0;

out_free:
	free(L->parts);
	free(L->servers);
	L->parts = NULL;
	L->servers = NULL;
	return rc;
}

/* ---- compression ------------------------------------------------------ */

struct compress_state *wk_comp_state(const struct wk_tensor *t, const struct wk_layout *L,
				     uint32_t part, int *rc)
{
	*rc = 0;
	if (t->comp.kind == COMPRESS_NONE)
		return NULL;
	/* One round of the tensor at a time (t->busy): the states are set up
	 * by the first, which every later one follows (the operation's
	 * completion, under the worker's lock, orders them). */
	struct wk_layout *M = (struct wk_layout *)L;
	if (M->cs == NULL) {
		struct compress_state *cs = calloc(M->nparts ? M->nparts : 1, sizeof *cs);
		if (cs == NULL) {
			*rc = UNISUM_ENOMEM;
			return NULL;
		}
		for (uint32_t i = 0; i < M->nparts; i++) {
			if (compress_state_init(&cs[i], &t->comp, M->parts[i].count, true) != 0) {
				for (uint32_t k = 0; k < i; k++)
					compress_state_free(&cs[k]);
				free(cs);
				*rc = UNISUM_ENOMEM;
				return NULL;
			}
		}
		M->cs = cs;
	}
	return &M->cs[part];
}

void wk_layout_free_cs(struct wk_layout *L)
{
	for (uint32_t i = 0; L->cs != NULL && i < L->nparts; i++)
		compress_state_free(&L->cs[i]);
	free(L->cs);
	L->cs = NULL;
}

/* ---- autotune ---------------------------------------------------------- */

/* Autotune has settled on cut L of tensor t (or t is undeclared: L is
 * NULL): tells the servers of every other cut that this worker is done
 * with it, so once every worker is they free its buffers.  This worker's
 * last round on those cuts has completed (the tensor's previous operation
 * is done), so it has every reply of theirs.  Called by the thread that
 * owns t's current round. */
void wk_retire_cuts(struct wk_tensor *t, const struct wk_layout *L)
{
	struct worker *w = t->w;
	for (int c = 0; c < t->ncuts; c++) {
		struct wk_layout *old = &t->cuts[c];
		/* Autotune's choice leaves the homed cuts alone: they are the
		 * gathering collectives', not a partition size's. */
		if (old == L || old->retired || (L != NULL && old->homed != 0))
			continue;
		old->retired = true;
		for (uint32_t i = 0; (w->to_servers || t->nranks > 0) && i < old->nparts; i++) {
			struct wk_job *j = calloc(1, sizeof *j);
			if (j == NULL)
				return;	/* the server keeps the buffers: memory, not results */
			*j = (struct wk_job){.type = JOB_RETIRE, .key = old->key + i, .round = old->rounds};
			if (wk_enqueue(&w->conns[old->servers[i]], j) != 0)
				free(j);
		}
	}
}

/* The cut of tensor t for partition size pbytes when it needs no
 * declaration: one made before, or the declared cut when pbytes cannot
 * have its own (a name too long to carry the size, or too many
 * partitions: every worker decides the same); NULL when it is new. */
static const struct wk_layout *wk_cut_known(const struct wk_tensor *t, uint64_t pbytes)
{
	for (int i = 0; i < t->ncuts; i++)
		if (t->cuts[i].pbytes == pbytes && t->cuts[i].homed == 0)
			return &t->cuts[i];
	int len = snprintf(NULL, 0, "%s@%llu", t->name, (unsigned long long)pbytes);
	if (len >= 256 || placement_nparts(t->count, t->esize, pbytes) > PLACEMENT_MAX_PARTS)
		return &t->cuts[0];
	return NULL;
}

static bool wk_cut_is_new(const struct wk_tensor *t, uint64_t pbytes)
{
	return wk_cut_known(t, pbytes) == NULL;
}

static const struct wk_layout *wk_add_cut(struct wk_tensor *t, const struct wk_layout *Lp,
					  int *rc);

/* The homed cut of tensor t for a gathering collective's segments (see
 * placement_place_homed), declared now under "NAME#K" (its K-th layout) if it is new (a
 * scheduler round trip, in the caller's thread).  Called by the thread
 * that owns t's current round. */
const struct wk_layout *wk_homed_cut(struct wk_tensor *t, const struct wk_segs *segs, int *rc)
{
	*rc = 0;
	for (int i = 0; i < t->ncuts; i++)
		if (t->cuts[i].homed == segs->hash)
			return &t->cuts[i];
	/* Named by the order layouts come in, not by their hash: a rank that
	 * passes another layout than the others then declares the same name
	 * with other segments, and the scheduler refuses it on every rank.
	 * A refused name counts too: the ranks whose declaration went through
	 * and those refused go on to the same next name. */
	char wire_name[256];
	snprintf(wire_name, sizeof wire_name, "%.200s#%u", t->name, t->nhomed++);
	struct wk_layout L;
	*rc = wk_cut(t, wire_name, segs->pbytes != 0 ? segs->pbytes : t->cuts[0].pbytes, segs, &L);
	if (*rc != 0)
		return NULL;
	L.homed_no = t->nhomed - 1;	/* (failover declares it again by name) */
	return wk_add_cut(t, &L, rc);
}

/* The cut of tensor t for partition size pbytes, declared now if it is
 * new (a scheduler round trip).  Called by the thread that owns t's
 * current round. */
static const struct wk_layout *wk_cut_for(struct wk_tensor *t, uint64_t pbytes, int *rc)
{
	*rc = 0;
	const struct wk_layout *known = wk_cut_known(t, pbytes);
	if (known != NULL)
		return known;
	char wire_name[256];
	if (snprintf(wire_name, sizeof wire_name, "%s@%llu", t->name, (unsigned long long)pbytes) >=
	    (int)sizeof wire_name)
		return &t->cuts[0];	/* cannot happen: wk_cut_known said it fits */
	struct wk_layout L;
	*rc = wk_cut(t, wire_name, pbytes, NULL, &L);
	if (*rc != 0)
		return NULL;
	return wk_add_cut(t, &L, rc);
}

/* Files cut L (declared) among t's cuts; the new entry, or NULL (*rc). */
static const struct wk_layout *wk_add_cut(struct wk_tensor *t, const struct wk_layout *Lp,
					  int *rc)
{
	struct worker *w = t->w;
	struct wk_layout L = *Lp;
	/* Only this thread changes t->cuts while the round is in flight; a
	 * failover's hand-over reads them under the lock. */
	pthread_mutex_lock(&w->lock);
	struct wk_layout *cuts = realloc(t->cuts, (size_t)(t->ncuts + 1) * sizeof *cuts);
	if (cuts == NULL) {
		pthread_mutex_unlock(&w->lock);
		free(L.parts);
		free(L.servers);
		wk_kept_free(&L);
		*rc = UNISUM_ENOMEM;
		return NULL;
	}
	t->cuts = cuts;
	t->cuts[t->ncuts] = L;
	const struct wk_layout *got = &t->cuts[t->ncuts++];
	wk_redeclare_late(w, t, t->ncuts - 1);
	pthread_mutex_unlock(&w->lock);
	trace_name_tensor(t->index, t->name, L.nparts);
	return got;
}

/* Operation op fails before any of it started: err, with why naming the
 * tensor.  Nothing else holds it. */
void wk_op_fail(struct wk_op *op, int err, const char *what)
{
	struct worker *w = op->w;
	pthread_mutex_lock(&w->lock);
	op->error = err;
	snprintf(op->why, sizeof op->why, "worker %d, tensor '%s': %s", w->rank, op->t->name, what);
	op->done = true;
	op->t->busy = false;
	pthread_cond_broadcast(&w->done_cond);
	wk_begun_release(w);
	pthread_mutex_unlock(&w->lock);
}

/* The ring phase of op's partition p, in segment d (wk_launch's walk):
 * the rows of rank (this rank + phase) mod n; 0: none (no phases, or not
 * pulled). */
static int wk_phase_of(const struct wk_op *op, int d, const struct placement_part *p)
{
	if (op->nphases == 0 || op->direct == NULL || d >= op->ndirect)
		return 0;
	const struct wk_direct *g = &op->direct[d];
	if (g->dst == NULL || g->lo > p->offset || p->offset + p->count > g->hi)
		return 0;	/* this rank's own rows, or (never) across segments */
	return (d - op->w->rank + op->nphases) % op->nphases;
}

/* Ring phases of op (nphases ranks, one worker per machine): counts each
 * phase's pulled partitions and makes a JOB_PULL for each PULL of the
 * phases that wait, before any job is queued (a reply may come at once).
 * A phase goes once the one before has at most one partition left;
 * phases of at most one partition go at once; a begun round's first
 * phase waits as well (wk_begun_release).  0 or UNISUM_ENOMEM. */
static int wk_phases_plan(struct wk_op *op, const struct wk_layout *L, uint32_t round)
{
	int n = op->nphases;
	op->phase_left = calloc((size_t)n, sizeof *op->phase_left);
	op->pulls = calloc(L->nparts ? L->nparts : 1, sizeof *op->pulls);
	if (op->phase_left == NULL || op->pulls == NULL)
		return UNISUM_ENOMEM;
	int d = 0;
	for (uint32_t i = 0; i < L->nparts; i++) {
		const struct placement_part *p = &L->parts[i];
		while (d < op->ndirect && op->direct[d].hi <= p->offset)
			d++;
		int phase = wk_phase_of(op, d, p);
		if (phase == 0)
			continue;
		op->phase_left[phase]++;
		if (phase < (op->deferred ? 1 : 2))
			continue;
		struct wk_job *j = calloc(1, sizeof *j);
		if (j == NULL)
			return UNISUM_ENOMEM;
		*j = (struct wk_job){.type = JOB_PULL, .server = (int)L->servers[i], .key = L->key + i,
				     .round = round, .dtype = op->t->dtype, .phase = phase};
		op->pulls[op->npulls++] = j;
	}
	int sent = 1;
	while (sent + 1 < n && op->phase_left[sent] <= 1)
		sent++;
	/* A begun round's first phase waits too (wk_op.pulls_held). */
	op->pulls_held = op->deferred;
	atomic_store(&op->phase_sent, op->deferred ? 0 : sent);
	return 0;
}

/* wk_launch on a machine of several workers: the machine's local reduce
 * takes op (its root then pushes the sum).  Under w->lock: the done hook
 * may run before local_submit returns. */
static void wk_launch_local(struct wk_op *op, const struct wk_layout *L, uint32_t wire_round,
			    int divisor)
{
	struct worker *w = op->w;
	struct wk_tensor *t = op->t;
	op->L = L;
	op->wire_round = wire_round;
	struct local_req req = {.key = L->key, .round = wire_round, .dtype = t->dtype,
				.in = op->in, .out = op->out, .nparts = L->nparts,
				.parts = L->parts, .divisor = divisor, .priority = t->priority,
				.ctx = op, .traced = op->traced, .tensor = t->index,
				.step = op->round, .wire_op = op->wire_op, .name = t->name};
	pthread_mutex_lock(&w->lock);
	int rc = local_submit(w->lc, &req, &op->local);
	if (rc != 0) {
		op->error = rc;
		snprintf(op->why, sizeof op->why, "%s", log_last_error());
		op->done = true;
		t->busy = false;
		pthread_cond_broadcast(&w->done_cond);
	}
	pthread_mutex_unlock(&w->lock);
}

/* The PUSH_PULL job of partition i of op's cut L (round wire_round), or
 * NULL with *rc set (out of memory).  *d walks op->direct across the
 * partitions (the homed cut never puts a partition across segments);
 * *push: whether it pushes data. */
static struct wk_job *wk_job_make(struct wk_op *op, const struct wk_layout *L, uint32_t i,
				  uint32_t wire_round, int divisor, int *d, bool *push, int *rc)
{
	struct wk_tensor *t = op->t;
	const struct placement_part *p = &L->parts[i];
	size_t off = p->offset * t->esize;
	bool pull;
	wk_job_sets(op, p->offset, p->count, push, &pull);
	*push = *push && op->in != NULL;
	const uint8_t *src = op->in ? (const uint8_t *)op->in + off : NULL;
	uint8_t *dst = (uint8_t *)op->out + off;
	if (op->direct != NULL) {
		while (*d < op->ndirect && op->direct[*d].hi <= p->offset)
			(*d)++;
		const struct wk_direct *g = *d < op->ndirect ? &op->direct[*d] : NULL;
		bool inside = g != NULL && g->lo <= p->offset && p->offset + p->count <= g->hi;
		size_t at = inside ? (p->offset - g->lo) * t->esize : 0;
		src = inside && g->src != NULL ? g->src + at : NULL;
		dst = inside && g->dst != NULL ? g->dst + at : NULL;
		*push = src != NULL;
		pull = dst != NULL;
	}
	*rc = 0;
	struct wk_job *j = malloc(sizeof *j);
	struct compress_state *cs = j != NULL ? wk_comp_state(t, L, i, rc) : NULL;
	if (j == NULL || *rc != 0) {
		free(j);
		*rc = UNISUM_ENOMEM;
		return NULL;
	}
	*j = (struct wk_job){.entry = {.priority = t->priority, .key = wk_push_order(op, L, i),
				       .bytes = *push ? wk_push_bytes(t, p->count, cs) : 0},
			     .type = JOB_PUSH_PULL, .server = (int)L->servers[i], .part = i,
			     .kept = L->kept != NULL ? &((struct wk_layout *)L)->kept[i] : NULL,
			     .key = L->key + i, .round = wire_round, .dtype = t->dtype,
			     .count = p->count, .in = *push ? src : NULL, .out = dst,
			     .divisor = divisor, .skip_pull = !pull, .wire_op = op->wire_op, .cs = cs,
			     .op = op, .t_queued = op->t_start, .phase = wk_phase_of(op, *d, p)};
	return j;
}

/* Hands operation op, on cut L, to its first stage: LOCAL_REDUCE, or the
 * PUSH queue.  Never waits. */
void wk_launch(struct wk_op *op, const struct wk_layout *L)
{
	struct worker *w = op->w;
	struct wk_tensor *t = op->t;
	int rc;
	/* Servers count rounds per key, so each cut counts its own. */
	uint32_t wire_round = ((struct wk_layout *)L)->rounds++;
	int divisor = !(op->flags & UNISUM_AVERAGE) ? 1 : t->nranks > 0 ? t->nranks : w->size;
	pthread_mutex_lock(&w->lock);
	op->launched = true;
	bool poison = op->join_poison;
	uint64_t base = t->cuts[0].key;
	pthread_mutex_unlock(&w->lock);
	if (poison)
		wk_join_poison(w, base, t->name, op->join_rank);
	wk_zero_pushed(op, L);
	/* A process set's members push on their own: no local reduce. */
	if (w->local && L->nparts > 0 && t->nranks == 0) {
		wk_launch_local(op, L, wire_round, divisor);
		return;
	}
	/* Before the operation may be done (no partitions): then it is its
	 * caller's to release. */
	if (op->nphases > 0 && wk_phases_plan(op, L, wire_round) != 0) {
		/* Out of memory: every PULL at once. */
		op->nphases = 0;
		atomic_store(&op->phase_sent, 0);
	}
	pthread_mutex_lock(&w->lock);
	op->remaining = L->nparts;
	op->done = L->nparts == 0;
	t->busy = !op->done;
	if (op->done)
		pthread_cond_broadcast(&w->done_cond);
	/* A begun round's first phase goes now if nothing else is in
	 * flight (its JOB_PULLs find no PUSH yet: each PUSH takes its PULL
	 * along). */
	if (op->pulls_held)
		wk_begun_release(w);
	pthread_mutex_unlock(&w->lock);

	/* Once its last partition is queued the operation may complete and
	 * the tensor's next round re-cut it: nothing of L is read after. */
	uint32_t nparts = L->nparts;
	int d = 0;
	for (uint32_t i = 0; i < nparts; i++) {
		bool push;
		struct wk_job *j = wk_job_make(op, L, i, wire_round, divisor, &d, &push, &rc);
		int phase = j != NULL ? j->phase : wk_phase_of(op, d, &L->parts[i]);
		if (j != NULL && op->deferred && push) {
			/* This rank's rows come later (worker_allgather_supply). */
			pthread_mutex_lock(&w->lock);
			j->next = op->held;
			op->held = j;
			pthread_mutex_unlock(&w->lock);
			continue;
		}
		if (j != NULL)
			rc = pushq_push(&w->push_q, &j->entry);
		if (rc != 0) {
			/* The operation fails; partitions already queued finish on their own. */
			free(j);
			if (phase > 0)
				wk_phase_step(w, op, phase);
			char why[512];
			snprintf(why, sizeof why, "worker %d, tensor '%s': %s", w->rank, t->name,
				 rc == UNISUM_ENOMEM ? "out of memory" : log_last_error());
			wk_op_part_done(op, rc, why);
		}
	}
}

/* Autotune: the cut of op's round for its epoch, declaring it with the
 * scheduler if it is new, and waiting for worker 0's setting if need be
 * (so only wk_tune_main calls it with wait).  NULL when it must wait but
 * may not, or on an error (*rc). */
const struct wk_layout *wk_tuned_cut(struct wk_op *op, bool wait, int *rc)
{
	struct worker *w = op->w;
	struct wk_tensor *t = op->t;
	uint32_t epoch = tune_epoch_of(w->tuner, op->round);
	struct tune_setting set = {0};
	bool final = false;
	*rc = 0;
	if (!wait && !tune_setting_now(w->tuner, epoch, &set, &final))
		return NULL;
	if (wait)
		*rc = tune_setting_of(w->tuner, epoch, &set, &final);
	if (*rc != 0)
		return NULL;
	if (!wait && wk_cut_is_new(t, set.pbytes))
		return NULL;
	const struct wk_layout *L = wk_cut_for(t, set.pbytes, rc);
	if (*rc == 0 && final)
		wk_retire_cuts(t, L);
	return *rc == 0 ? L : NULL;
}

/* The autotune thread: operations whose setting has not come yet or whose
 * cut is new wait here for the setting and the declaration, so that
 * starting an operation never waits on the network. */
void *wk_tune_main(void *arg)
{
	prctl(PR_SET_NAME, "unisum-tune"); /* for top -H, perf and gdb */
	struct worker *w = arg;
	for (;;) {
		pthread_mutex_lock(&w->lock);
		while (w->tune_head == NULL && !w->tune_stop)
			pthread_cond_wait(&w->tune_cond, &w->lock);
		struct wk_op *op = w->tune_head;
		if (op == NULL) {
			pthread_mutex_unlock(&w->lock);
			return NULL;
		}
		w->tune_head = op->tune_next;
		if (w->tune_head == NULL)
			w->tune_tail = NULL;
		pthread_mutex_unlock(&w->lock);
		int rc;
		const struct wk_layout *L = wk_tuned_cut(op, true, &rc);
		if (L != NULL)
			wk_launch(op, L);
		else
			wk_op_fail(op, rc, rc == UNISUM_ECONN ? "the job failed while waiting for the "
					   "autotune setting" : log_last_error());
	}
}
