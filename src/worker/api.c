/*
 * api.c - the C API of unisum.h: the process's one worker (worker.h), read
 * from the environment, with the process's log identity and timeline.
 *
 * A process joins its job once: after unisum_shutdown its worker stays
 * (left, so every call answers UNISUM_ENOTINIT) and unisum_init fails with
 * UNISUM_ESHUTDOWN.  No call may run concurrently with unisum_init or
 * unisum_shutdown but unisum_alloc and unisum_free, which take the
 * process's lock.
 *
 * A call that declares or starts work and finds no memory for it
 * (UNISUM_ENOMEM) fails the job through the scheduler, naming this worker
 * and the limits (worker_out_of_memory), as a thread or a descriptor that
 * cannot be had does: the other processes would otherwise see a worker
 * that left.  unisum_alloc returns NULL instead, as malloc does.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "config/config.h"
#include "log/log.h"
#include "trace/trace.h"
#include "worker/local.h"
#include "rendezvous/rendezvous.h"
#include "worker/worker.h"
#include "unisum.h"

static pthread_mutex_t api_lock = PTHREAD_MUTEX_INITIALIZER;	/* api_worker's changes */
static struct worker *_Atomic api_worker;	/* this process's, once it joined */
static bool api_left;				/* unisum_shutdown ran */
static pid_t api_pid;				/* the process that joined (not a fork of it) */

static struct worker *api(void)
{
	return atomic_load(&api_worker);
}

/* rc, a call's result, after worker_out_of_memory (see the top). */
static int api_rc(int rc)
{
	return worker_out_of_memory(api(), rc);
}

/* Reads the worker's configuration from the environment.  0, or an error
 * with err naming the variable. */
static int api_configure(struct config *cfg, char *err, size_t len)
{
	int rc = config_load(cfg, err, len);
	if (rc == 0 && cfg->role == CONFIG_ROLE_NONE)
		cfg->role = CONFIG_ROLE_WORKER;
	if (rc == 0 && cfg->role != CONFIG_ROLE_WORKER) {
		snprintf(err, len, "UNISUM_ROLE=%s: unisum_init() is for workers; run `unisum %s` for "
			 "that role", config_role_name(cfg->role), config_role_name(cfg->role));
		rc = UNISUM_ECONFIG;
	}
	if (rc == 0)
		rc = config_require(cfg, CONFIG_ROLE_WORKER, err, len);
	return rc;
}

/* At exit (main returned, or exit()): a program that never called
 * unisum_shutdown leaves the job as if it had, as BytePS and Horovod
 * programs expect, so the job ends normally.  Only when every operation
 * is done: one still in flight waits on other workers, and leaving would
 * then hang the exit; without a goodbye the scheduler names this worker
 * instead.  A forked child shares the sockets and must not speak. */
static void api_at_exit(void)
{
	pthread_mutex_lock(&api_lock);
	struct worker *w = api_left || getpid() != api_pid ? NULL : api();
	pthread_mutex_unlock(&api_lock);
	if (w == NULL)
		return;
	if (worker_busy(w)) {
		LOG_WARN("exiting with operations in flight (or after the job failed) without "
			 "unisum_shutdown(): not leaving the job cleanly");
		return;
	}
	unisum_shutdown();
}

/* Joins with cfg and opens the timeline (api_lock held). */
static int api_join(const struct config *cfg)
{
	log_set_level(cfg->log_level);
	log_set_identity("worker", cfg->worker_id);
	struct worker *w;
	int rc = worker_join(cfg, &w);
	if (rc != 0)
		return rc;
	log_set_identity("worker", worker_rank(w));
	if ((rc = trace_open(cfg, worker_rank(w))) != 0) {
		worker_leave(w);
		worker_free(w);
		return rc;
	}
	atomic_store(&api_worker, w);
	static bool at_exit_set;
	api_pid = getpid();
	if (!at_exit_set && atexit(api_at_exit) == 0)
		at_exit_set = true;
	return 0;
}

int unisum_init(void)
{
	pthread_mutex_lock(&api_lock);
	int rc = 0;
	if (api() != NULL && !api_left)
		goto out;
	if (api_left) {
		rc = log_fail(UNISUM_ESHUTDOWN, "unisum_init: this process left the job with "
			      "unisum_shutdown() already, and a job cannot be joined twice (the "
			      "scheduler counted this worker done, and the servers stop once every "
			      "worker is); call unisum_init() once per process and unisum_shutdown() "
			      "at its end");
		goto out;
	}
	struct config cfg;
	char err[512];
	rc = api_configure(&cfg, err, sizeof err);
	if (rc != 0)
		rc = log_fail(rc, "unisum_init: %s", err);
	else
		rc = api_join(&cfg);
out:
	pthread_mutex_unlock(&api_lock);
	return rc;
}

int unisum_shutdown(void)
{
	pthread_mutex_lock(&api_lock);
	struct worker *w = api_left ? NULL : api();
	if (w != NULL)
		api_left = true;
	pthread_mutex_unlock(&api_lock);
	if (w == NULL)
		return log_fail(UNISUM_ENOTINIT, "call unisum_init() first");
	/* The worker stays allocated: later calls answer UNISUM_ENOTINIT. */
	int rc = worker_leave(w);
	trace_close();
	return rc;
}

int unisum_rejoin(void)
{
	pthread_mutex_lock(&api_lock);
	struct worker *w = api_left ? NULL : api();
	int rc = w == NULL ? log_fail(UNISUM_ENOTINIT, "call unisum_init() first")
			   : worker_end_membership(w);
	if (rc != 0) {
		pthread_mutex_unlock(&api_lock);
		return rc;
	}
	struct config cfg = *worker_config(w);
	atomic_store(&api_worker, NULL);
	worker_leave(w);	/* its operations failed: nothing waits */
	trace_close();
	worker_free(w);
	/* The scheduler ranks the new generation itself. */
	cfg.worker_id = -1;
	rc = api_join(&cfg);
	if (rc != 0)
		api_left = true;	/* calls answer UNISUM_ENOTINIT; init cannot retry */
	pthread_mutex_unlock(&api_lock);
	return rc;
}

int unisum_membership_changed(void)
{
	return worker_membership_changed(api());
}

int unisum_join(void)
{
	return worker_join_wait(api());
}

int unisum_timeline_start(const char *path)
{
	struct worker *w = api();
	int rank = worker_rank(w);
	if (rank < 0)
		return log_fail(UNISUM_ENOTINIT, "call unisum_init() first");
	int rc = trace_start(path, rank);
	if (rc == 0)
		worker_trace_names(w);
	return rc;
}

int unisum_timeline_stop(void)
{
	if (!trace_is_on())
		return log_fail(UNISUM_EINVAL, "unisum_timeline_stop: no timeline is being written");
	trace_close();
	return 0;
}

int unisum_rank(void)
{
	return worker_rank(api());
}

int unisum_size(void)
{
	return worker_size(api());
}

int unisum_local_rank(void)
{
	return worker_local_rank(api());
}

int unisum_local_size(void)
{
	return worker_local_size(api());
}

int unisum_declare(const char *name, unisum_dtype dtype, size_t count, int priority)
{
	return api_rc(worker_declare(api(), name, dtype, count, priority));
}

/* unisum_declare_shaped and unisum_declare_in, in process set `set`. */
static int api_declare_shaped(int set, const char *name, unisum_dtype dtype, int ndim,
			      const int64_t *dims, int priority)
{
	if (ndim < 0 || ndim > RDV_MAX_DIMS || (ndim > 0 && dims == NULL))
		return log_fail(UNISUM_EINVAL, "unisum_declare_shaped('%s'): ndim must be 0 to %d, "
				"with dims", name ? name : "", RDV_MAX_DIMS);
	struct rdv_shape shape = {.ndim = (uint32_t)ndim};
	uint64_t count = 1;
	for (int i = 0; i < ndim; i++) {
		if (dims[i] < 0 || __builtin_mul_overflow(count, (uint64_t)dims[i], &count))
			return log_fail(UNISUM_EINVAL, "unisum_declare_shaped('%s'): dimension %d is "
					"%lld", name ? name : "", i, (long long)dims[i]);
		shape.dims[i] = (uint64_t)dims[i];
	}
	return api_rc(worker_declare_in(api(), set, name, dtype, (size_t)count, &shape, priority));
}

int unisum_declare_shaped(const char *name, unisum_dtype dtype, int ndim, const int64_t *dims,
			  int priority)
{
	return api_declare_shaped(0, name, dtype, ndim, dims, priority);
}

int unisum_declare_sync(const char *name, unisum_dtype dtype, size_t count, int priority,
			const char *sync)
{
	return api_rc(worker_declare_sync(api(), name, dtype, count, priority, sync));
}

int unisum_declare_ex(const char *name, unisum_dtype dtype, size_t count, int priority,
		      const char *compression)
{
	return api_rc(worker_declare_ex(api(), name, dtype, count, priority, compression));
}

int unisum_declare_in(int set, const char *name, unisum_dtype dtype, int ndim,
		      const int64_t *dims, int priority)
{
	return api_declare_shaped(set, name, dtype, ndim, dims, priority);
}

int unisum_process_set_add(const int *ranks, int nranks)
{
	return api_rc(worker_process_set_add(api(), ranks, nranks));
}

int unisum_process_set_remove(int set)
{
	return worker_process_set_remove(api(), set);
}

int unisum_undeclare(int tensor)
{
	return worker_undeclare(api(), tensor);
}

int unisum_push_pull_async(int tensor, const void *in, void *out, int flags, unisum_handle *h)
{
	return api_rc(worker_push_pull_async(api(), tensor, in, out, flags, h));
}

int unisum_push_pull(int tensor, const void *in, void *out, int flags)
{
	unisum_handle h;
	int rc = unisum_push_pull_async(tensor, in, out, flags, &h);
	return rc != 0 ? rc : unisum_wait(h);
}

int unisum_broadcast_async(int tensor, void *buf, int root_rank, unisum_handle *h)
{
	return api_rc(worker_broadcast_async(api(), tensor, buf, root_rank, h));
}

int unisum_broadcast(int tensor, void *buf, int root_rank)
{
	unisum_handle h;
	int rc = unisum_broadcast_async(tensor, buf, root_rank, &h);
	return rc != 0 ? rc : unisum_wait(h);
}

int unisum_allgather_async(int tensor, const void *in, void *out, const uint64_t *counts,
			   unisum_handle *h)
{
	return api_rc(worker_allgather_async(api(), tensor, in, out, counts, h));
}

int unisum_allgather_begin(int tensor, void *out, const uint64_t *counts, unisum_handle *h)
{
	return api_rc(worker_allgather_begin(api(), tensor, out, counts, h));
}

int unisum_allgather_supply(unisum_handle h, const void *in)
{
	return api_rc(worker_allgather_supply(api(), h, in));
}

int unisum_allgather(int tensor, const void *in, void *out, const uint64_t *counts)
{
	unisum_handle h;
	int rc = unisum_allgather_async(tensor, in, out, counts, &h);
	return rc != 0 ? rc : unisum_wait(h);
}

int unisum_reduce_scatter_async(int tensor, const void *in, void *out, const uint64_t *counts,
				int flags, unisum_handle *h)
{
	return api_rc(worker_reduce_scatter_async(api(), tensor, in, out, counts, flags, h));
}

int unisum_reduce_scatter(int tensor, const void *in, void *out, const uint64_t *counts,
			  int flags)
{
	unisum_handle h;
	int rc = unisum_reduce_scatter_async(tensor, in, out, counts, flags, &h);
	return rc != 0 ? rc : unisum_wait(h);
}

int unisum_alltoall_async(int tensor, const void *in, void *out, const uint64_t *counts,
			  unisum_handle *h)
{
	return api_rc(worker_alltoall_async(api(), tensor, in, out, counts, h));
}

int unisum_alltoall(int tensor, const void *in, void *out, const uint64_t *counts)
{
	unisum_handle h;
	int rc = unisum_alltoall_async(tensor, in, out, counts, &h);
	return rc != 0 ? rc : unisum_wait(h);
}

int unisum_poll_timeout(unisum_handle h, int timeout_ms)
{
	return worker_poll_timeout(api(), h, timeout_ms);
}

int unisum_poll_timeout_into(unisum_handle h, int timeout_ms, int *answer)
{
	int rc = unisum_poll_timeout(h, timeout_ms);
	if (answer != NULL)
		*answer = rc;
	return rc;
}

int unisum_poll(unisum_handle h)
{
	return unisum_poll_timeout(h, 0);
}

int unisum_wait(unisum_handle h)
{
	return worker_wait(api(), h);
}

int unisum_barrier(void)
{
	return worker_barrier(api());
}

int unisum_barrier_timeout(int timeout_ms)
{
	return worker_barrier_timeout(api(), timeout_ms);
}

int unisum_barrier_timeout_into(int timeout_ms, int *answer)
{
	int rc = unisum_barrier_timeout(timeout_ms);
	if (answer != NULL)
		*answer = rc;
	return rc;
}

int unisum_get_stats(unisum_stats *out)
{
	return worker_get_stats(api(), out);
}

void *unisum_alloc(size_t bytes)
{
	pthread_mutex_lock(&api_lock);
	void *p = worker_alloc(api(), bytes);
	pthread_mutex_unlock(&api_lock);
	if (p == NULL) {
		size_t round = bytes == 0 ? 64 : (bytes + 63) & ~(size_t)63;
		p = round < bytes ? NULL : aligned_alloc(64, round);
	}
	return p;
}

void unisum_free(void *p)
{
	if (p == NULL)
		return;
	worker_alloc_forget(p);	/* before the memory is reused */
	if (!local_free(p))
		free(p);
}
