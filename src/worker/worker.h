/*
 * worker.h - a worker as a handle.  The C API of unisum.h drives the one
 * worker of its process (api.c); tests run several ranks in one process
 * with these, as Gloo's tests do.  Each function is its unisum_* twin of
 * unisum.h on worker w, and returns what it returns; a worker that left
 * (or NULL) answers UNISUM_ENOTINIT.
 *
 * Per process, not per worker: the log's level and identity, the job
 * secret (auth_set_secret: every worker of a process has the same), the
 * timeline (src/trace: api.c opens it for the process's worker only) and
 * unisum_free (local_free finds any worker's arena).
 */
#ifndef UNISUM_WORKER_WORKER_H
#define UNISUM_WORKER_WORKER_H

#include <stdbool.h>
#include <stddef.h>

#include "config/config.h"
#include "unisum.h"

struct worker;

/* unisum_init with the configuration cfg (copied): joins the job, blocks
 * until the whole job has registered.  0 and *out, or an error. */
int worker_join(const struct config *cfg, struct worker **out);

/* unisum_shutdown: waits for w's operations, leaves the job and closes w's
 * connections.  w stays allocated (its calls answer UNISUM_ENOTINIT) until
 * worker_free. */
int worker_leave(struct worker *w);
/* The configuration it joined with (sizes as the scheduler gave them). */
const struct config *worker_config(const struct worker *w);
/* Whether some operation of w has not completed (or the job failed):
 * leaving would wait for it. */
bool worker_busy(struct worker *w);
/* rc, a call's result: when it is UNISUM_ENOMEM and the job has not
 * failed (this worker's own allocation failed, not a peer's), the worker
 * names itself, the failed allocation (log_last_error) and the limits on
 * memory, once, through the scheduler to every process of the job. */
int worker_out_of_memory(struct worker *w, int rc);
/* Elastic jobs: 1 when this membership ended or workers wait to join (call
 * unisum_rejoin), 0 if not, or an error. */
int worker_membership_changed(struct worker *w);
/* Ends this worker's membership for unisum_rejoin: asks the scheduler to
 * re-form when it has not yet, and waits for it.  0, or an error (not
 * elastic, the job failed). */
int worker_end_membership(struct worker *w);
void worker_free(struct worker *w);

int worker_rank(const struct worker *w);
int worker_size(const struct worker *w);
int worker_local_rank(const struct worker *w);
int worker_local_size(const struct worker *w);

int worker_declare(struct worker *w, const char *name, unisum_dtype dtype, size_t count,
		   int priority);
struct rdv_shape;
int worker_declare_shaped(struct worker *w, const char *name, unisum_dtype dtype, size_t count,
			  const struct rdv_shape *shape, int priority);
int worker_declare_ex(struct worker *w, const char *name, unisum_dtype dtype, size_t count,
		      int priority, const char *compression);
int worker_declare_sync(struct worker *w, const char *name, unisum_dtype dtype, size_t count,
			int priority, const char *sync);
int worker_declare_in(struct worker *w, int set, const char *name, unisum_dtype dtype,
		      size_t count, const struct rdv_shape *shape, int priority);
int worker_undeclare(struct worker *w, int tensor);
/* Names every tensor of w on the timeline (it was started after them). */
void worker_trace_names(struct worker *w);
int worker_process_set_add(struct worker *w, const int *ranks, int n);
int worker_process_set_remove(struct worker *w, int set);
int worker_push_pull_async(struct worker *w, int tensor, const void *in, void *out, int flags,
			   unisum_handle *h);
int worker_broadcast_async(struct worker *w, int tensor, void *buf, int root_rank,
			   unisum_handle *h);
int worker_allgather_async(struct worker *w, int tensor, const void *in, void *out,
			   const uint64_t *counts, unisum_handle *h);
/* unisum_allgather_begin / unisum_allgather_supply. */
int worker_allgather_begin(struct worker *w, int tensor, void *out, const uint64_t *counts,
			   unisum_handle *h);
int worker_allgather_supply(struct worker *w, unisum_handle h, const void *in);
int worker_reduce_scatter_async(struct worker *w, int tensor, const void *in, void *out,
				const uint64_t *counts, int flags, unisum_handle *h);
int worker_alltoall_async(struct worker *w, int tensor, const void *in, void *out,
			  const uint64_t *counts, unisum_handle *h);
int worker_poll_timeout(struct worker *w, unisum_handle h, int timeout_ms);
/* unisum_join: the last rank to join, or an error (join.c). */
int worker_join_wait(struct worker *w);
int worker_wait(struct worker *w, unisum_handle h);
int worker_barrier(struct worker *w);
int worker_barrier_timeout(struct worker *w, int timeout_ms);
int worker_get_stats(struct worker *w, unisum_stats *out);

/* unisum_alloc's memory of w's arena (several workers on its machine), or
 * NULL: the caller falls back to ordinary memory.  It is registered with
 * w's transport (RDMA: transport.h's mem_register) until unisum_free
 * calls worker_alloc_forget(p), which any p may be given. */
void *worker_alloc(struct worker *w, size_t bytes);
void worker_alloc_forget(void *p);

#endif /* UNISUM_WORKER_WORKER_H */
