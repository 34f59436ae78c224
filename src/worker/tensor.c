/*
 * tensor.c - the worker's tensor table: declaring (the scheduler's cut and the servers' keys), looking up and undeclaring tensors.
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

/* Files tensor t under an id: the first free one (an undeclared tensor's)
 * or a new one.  Returns its id (*filed), or the id of a tensor of the
 * same name another thread declared meanwhile (t is not filed), or
 * UNISUM_ENOMEM. */
int wk_tensor_insert(struct wk_tensor *t, bool *filed)
{
	struct worker *w = t->w;
	*filed = false;
	pthread_mutex_lock(&w->lock);
	int id = -1;
	for (int i = 0; i < w->ntensors; i++) {
		if (w->tensors[i] == NULL) {
			if (id < 0)
				id = i;
		} else if (strcmp(w->tensors[i]->name, t->name) == 0) {
			pthread_mutex_unlock(&w->lock);
			return i;
		}
	}
	if (id < 0 && w->ntensors == w->captensors) {
		int cap = w->captensors ? w->captensors * 2 : 64;
		struct wk_tensor **nt = realloc(w->tensors, (size_t)cap * sizeof *nt);
		if (nt == NULL) {
			pthread_mutex_unlock(&w->lock);
			return UNISUM_ENOMEM;
		}
		w->tensors = nt;
		w->captensors = cap;
	}
	if (id < 0)
		id = w->ntensors++;
	t->index = id;
	t->life = wk_next_life(w, t->name);
	w->tensors[id] = t;
	*filed = true;
	wk_redeclare_late(w, t, 0);
	pthread_mutex_unlock(&w->lock);
	return id;
}

/* The id of tensor `name` if w has it (UNISUM_EMISMATCH when with another
 * shape or sync mode), or -1. */
int wk_tensor_known(struct worker *w, const char *name, unisum_dtype dtype, size_t count,
		    uint32_t sync, const char *comp)
{
	pthread_mutex_lock(&w->lock);
	for (int i = 0; i < w->ntensors; i++) {
		struct wk_tensor *t = w->tensors[i];
		if (t == NULL || strcmp(t->name, name) != 0)
			continue;
		pthread_mutex_unlock(&w->lock);
		if (t->dtype != dtype || t->count != count)
			return log_fail(UNISUM_EMISMATCH, "worker %d declared tensor '%s' twice: as %s[%llu] "
					"and now as %s[%zu]", w->rank, name, unisum_dtype_name(t->dtype),
					(unsigned long long)t->count, unisum_dtype_name(dtype), count);
		char a[32], b[32];
		if (t->sync != sync)
			return log_fail(UNISUM_EMISMATCH, "worker %d declared tensor '%s' twice: %s and "
					"now %s", w->rank, name, wire_sync_text(t->sync, a, sizeof a),
					wire_sync_text(sync, b, sizeof b));
		if (strcmp(t->comp_text, comp) != 0)
			return log_fail(UNISUM_EMISMATCH, "worker %d declared tensor '%s' twice: "
					"compressed '%s' and now '%s'", w->rank, name,
					t->comp_text[0] ? t->comp_text : "none",
					comp[0] ? comp : "none");
		return i;
	}
	pthread_mutex_unlock(&w->lock);
	return -1;
}

int worker_declare(struct worker *w, const char *name, unisum_dtype dtype, size_t count,
		   int priority)
{
	return worker_declare_shaped(w, name, dtype, count, NULL, priority);
}

int worker_declare_shaped(struct worker *w, const char *name, unisum_dtype dtype, size_t count,
			  const struct rdv_shape *shape, int priority)
{
	return worker_declare_in(w, 0, name, dtype, count, shape, priority);
}

int worker_declare_ex(struct worker *w, const char *name, unisum_dtype dtype, size_t count,
		      int priority, const char *compression)
{
	if (wk_require_init(w) != 0)
		return UNISUM_ENOTINIT;
	if (name == NULL || name[0] == '\0' || strlen(name) >= sizeof ((struct wk_tensor *)0)->name)
		return log_fail(UNISUM_EINVAL, "unisum_declare: the name must have 1 to 255 characters");
	struct compress_spec spec = {.kind = COMPRESS_NONE};
	char err[256];
	if (compression != NULL && compression[0] != '\0' && strcmp(compression, "none") != 0 &&
	    compress_spec_parse(compression, &spec, err, sizeof err) != 0)
		return log_fail(UNISUM_EINVAL, "unisum_declare_ex('%s'): compression '%s': %s", name,
				compression, err);
	if (spec.kind != COMPRESS_NONE && dtype != UNISUM_FLOAT32)
		return log_fail(UNISUM_EINVAL, "unisum_declare_ex('%s'): compression '%s' takes "
				"float32 tensors, not %s", name, compression, unisum_dtype_name(dtype));
	size_t part = (size_t)(w->cfg.partition_bytes / 4);
	if (spec.kind != COMPRESS_NONE &&
	    compress_codec_of(spec.kind)->bytes(&spec, part) > WIRE_MAX_DATA_PAYLOAD)
		return log_fail(UNISUM_EINVAL, "unisum_declare_ex('%s'): compression '%s' encodes a "
				"partition of UNISUM_PARTITION_BYTES=%llu in more than the 1 GiB a message "
				"carries", name, compression,
				(unsigned long long)w->cfg.partition_bytes);
	if (spec.kind != COMPRESS_NONE && (uint64_t)count * 4 < w->cfg.min_compress_bytes) {
		/* As BytePS: small tensors cost more to compress than to send. */
		LOG_DEBUG("tensor '%s' (%zu bytes) is below UNISUM_MIN_COMPRESS_BYTES=%llu: "
			  "uncompressed", name, count * 4,
			  (unsigned long long)w->cfg.min_compress_bytes);
		spec.kind = COMPRESS_NONE;
	}
	return wk_declare(w, name, dtype, count, NULL, priority, NULL, 0, WIRE_SYNC_LOCKSTEP,
			  spec.kind != COMPRESS_NONE ? &spec : NULL);
}

int worker_declare_sync(struct worker *w, const char *name, unisum_dtype dtype, size_t count,
			int priority, const char *sync)
{
	if (wk_require_init(w) != 0)
		return UNISUM_ENOTINIT;
	if (sync == NULL)
		sync = w->cfg.sync;
	uint32_t mode;
	int g;
	if (wire_sync_parse(sync, &mode, &g) != 0)
		return log_fail(UNISUM_EINVAL, "unisum_declare_sync('%s'): unknown sync mode '%s' "
				"(sync, async, ssp:S with S a staleness bound, or dssync:G with G a group "
				"size)", name != NULL ? name : "", sync);
	if (g > 0) {
		/* The tensor itself is global and lock-step: the global steps
		 * run on it; the groups' steps on their own set tensors. */
		int id = worker_declare(w, name, dtype, count, priority);
		if (id < 0)
			return id;
		pthread_mutex_lock(&w->lock);
		struct wk_tensor *t = w->tensors[id];
		int rc = t->dssync_g == 0 && t->dssync_step > 0 ? UNISUM_EMISMATCH : id;
		if (t->dssync_g != 0 && t->dssync_g != g)
			rc = UNISUM_EMISMATCH;
		t->dssync_g = rc == id ? g : t->dssync_g;
		t->dssync_every = (uint32_t)w->cfg.dssync_every;
		pthread_mutex_unlock(&w->lock);
		if (rc < 0)
			return log_fail(rc, "unisum_declare_sync('%s'): declared already in another "
					"mode", name);
		return id;
	}
	if (!wire_sync_held(mode))
		return worker_declare(w, name, dtype, count, priority);
	if (name == NULL || name[0] == '\0' || strlen(name) >= sizeof ((struct wk_tensor *)0)->name)
		return log_fail(UNISUM_EINVAL, "unisum_declare: the name must have 1 to 255 characters");
	/* Every rank is its own contributor, as in a process set of all. */
	int *ranks = malloc((size_t)w->size * sizeof *ranks);
	if (ranks == NULL)
		return UNISUM_ENOMEM;
	for (int r = 0; r < w->size; r++)
		ranks[r] = r;
	int rc = wk_ensure_conns(w);
	if (rc != 0) {
		free(ranks);
		return rc;
	}
	return wk_declare(w, name, dtype, count, NULL, priority, ranks, w->size, mode, NULL);
}

/* Declares tensor `name` of the process set `ranks` (NULL: the global
 * set), which it takes over, in sync mode `sync`. */
int wk_declare(struct worker *w, const char *name, unisum_dtype dtype, size_t count,
	       const struct rdv_shape *shape, int priority, int *ranks, int nranks,
	       uint32_t sync, const struct compress_spec *comp)
{
	size_t esize = unisum_dtype_size(dtype);
	int rc = -1;
	char comp_text[WIRE_SPEC_MAX] = "";
	if (comp != NULL)
		compress_spec_format(comp, comp_text, sizeof comp_text);
	if (esize == 0)
		rc = log_fail(UNISUM_EINVAL, "unisum_declare('%s'): unknown dtype %d", name, (int)dtype);
	else if (esize > w->cfg.partition_bytes)
		rc = log_fail(UNISUM_ECONFIG, "UNISUM_PARTITION_BYTES=%llu is smaller than one %s element",
			      (unsigned long long)w->cfg.partition_bytes, unisum_dtype_name(dtype));
	else
		rc = wk_tensor_known(w, name, dtype, count, sync, comp_text);
	struct wk_tensor *t = rc == -1 ? calloc(1, sizeof *t) : NULL;
	if (t == NULL) {
		free(ranks);
		return rc == -1 ? UNISUM_ENOMEM : rc;
	}
	t->ranks = ranks;
	t->nranks = nranks;
	t->sync = sync;
	if (comp != NULL)
		t->comp = *comp;
	memcpy(t->comp_text, comp_text, sizeof comp_text);
	t->w = w;
	snprintf(t->name, sizeof t->name, "%s", name);
	t->dtype = dtype;
	t->count = count;
	t->esize = esize;
	t->priority = priority;
	if (shape != NULL)
		t->shape = *shape;
	t->cuts = calloc(1, sizeof *t->cuts);
	rc = t->cuts == NULL ? UNISUM_ENOMEM
			     : wk_cut(t, name, w->cfg.partition_bytes, NULL, &t->cuts[0]);
	if (rc != 0)
		goto out_free;
	t->ncuts = 1;
	bool filed;
	rc = wk_tensor_insert(t, &filed);
	if (!filed)
		goto out_free;	/* failed, or another thread declared it meanwhile */
	trace_name_tensor(rc, t->name, t->cuts[0].nparts);
	return rc;

out_free:
	if (t->cuts != NULL) {
		wk_kept_free(&t->cuts[0]);
		free(t->cuts[0].parts);
		free(t->cuts[0].servers);
	}
	free(t->cuts);
	free(t->ranks);
	free(t);
	return rc;
}

void worker_trace_names(struct worker *w)
{
	pthread_mutex_lock(&w->lock);
	for (int i = 0; i < w->ntensors; i++) {
		const struct wk_tensor *t = w->tensors[i];
		if (t != NULL && t->ncuts > 0)
			trace_name_tensor(i, t->name, t->cuts[t->ncuts - 1].nparts);
	}
	pthread_mutex_unlock(&w->lock);
}

/* unisum_undeclare; with `retire`, the undeclare of a dssync group's
 * tensor after its step (wk_dssync_retire): nothing, quietly, unless it
 * is still to go and nothing of it is in flight (its group came back
 * meanwhile: the release of that step retires it, if it is to go then). */
int wk_undeclare(struct worker *w, int tensor, bool retire)
{
	pthread_mutex_lock(&w->lock);
	struct wk_tensor *t = tensor >= 0 && tensor < w->ntensors ? w->tensors[tensor] : NULL;
	int rc = 0;
	if (retire) {
		bool held = t == NULL || !t->dssync_retire || t->busy;
		for (int i = 0; i < w->nops && !held; i++)
			held = w->ops[i]->t == t;
		if (held)
			goto out_unlock;
	}
	if (t == NULL) {
		rc = log_fail(UNISUM_EINVAL, "unisum_undeclare: worker %d has no tensor id %d (never "
			      "declared, or undeclared already)", w->rank, tensor);
		goto out_unlock;
	}
	bool held = t->busy;
	for (int i = 0; i < w->nops && !held; i++)
		held = w->ops[i]->t == t;
	if (held) {
		rc = log_fail(UNISUM_EBUSY, "unisum_undeclare: worker %d, tensor '%s' has an operation "
			      "not yet waited for; wait for its handle first", w->rank, t->name);
		goto out_unlock;
	}
	w->tensors[tensor] = NULL;
	if (!t->dssync_group)	/* never announced: a joined worker runs no group */
		wk_note_retired(w, t->name, t->life, t->round);
	wk_keep_gone(w, t);
	pthread_mutex_unlock(&w->lock);
	/* Each cut is its own declaration: every place that holds it lets
	 * go.  Nothing is in flight, so the servers' replies are all here. */
	wk_retire_cuts(t, NULL);
	for (int c = 0; c < t->ncuts; c++) {
		if (w->local && t->nranks == 0)
			local_forget(w->lc, t->cuts[c].key);
		rdv_client_forget(w->rdv, t->cuts[c].key);
	}
	wk_tensor_free(t);
	return 0;

out_unlock:
	pthread_mutex_unlock(&w->lock);
	return rc;
}

int worker_undeclare(struct worker *w, int tensor)
{
	if (wk_require_init(w) != 0)
		return UNISUM_ENOTINIT;
	return wk_undeclare(w, tensor, false);
}

void wk_tensor_free(struct wk_tensor *t)
{
	if (t == NULL)
		return;
	for (int c = 0; c < t->ncuts; c++) {
		wk_layout_free_cs(&t->cuts[c]);
		wk_kept_free(&t->cuts[c]);
		free(t->cuts[c].parts);
		free(t->cuts[c].servers);
	}
	free(t->cuts);
	free(t->ranks);
	free(t->dssync_live);
	free(t);
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
