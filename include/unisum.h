/*
 * unisum.h - the public C API of unisum.
 *
 * unisum sums gradients across data-parallel workers through a Summation
 * Service (the BytePS architecture).  A training process calls
 * unisum_init() once, declares each gradient tensor by name, and then calls
 * unisum_push_pull() (or its asynchronous form) every iteration.
 *
 * Conventions (libuv's): every function that acts returns 0 (or a
 * non-negative value where stated) on success and a negative UNISUM_E* code
 * on failure; unisum_strerror() gives the code's text.  When a call fails,
 * the log line names the rank, the tensor and what to do about it, and
 * unisum_last_error() returns that same detailed message.
 *
 * Buffers passed to an asynchronous call belong to the caller and must stay
 * valid, untouched, until the handle completes: that is what lets unisum
 * send from and receive into them without copies.
 *
 * Every buffer is host memory: the C API never reads or writes device
 * (GPU) memory.  GPU tensors go through the PyTorch plugin (unisum.torch),
 * which copies them to page-locked host memory on streams of its own and
 * back (docs/ARCHITECTURE.md, "Python").
 */
#ifndef UNISUM_H
#define UNISUM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Element types of a tensor.  The values are part of the wire protocol. */
typedef enum unisum_dtype {
	UNISUM_FLOAT32 = 0,
	UNISUM_FLOAT64 = 1,
	UNISUM_FLOAT16 = 2,
	UNISUM_BFLOAT16 = 3,
	UNISUM_INT32 = 4,
	UNISUM_INT64 = 5,
	UNISUM_DTYPE_COUNT
} unisum_dtype;

/* Error codes: always negative. */
enum {
	UNISUM_OK = 0,
	UNISUM_EINVAL = -1,	/* an argument is invalid */
	UNISUM_ENOMEM = -2,	/* out of memory */
	UNISUM_ECONFIG = -3,	/* an environment variable is missing or malformed */
	UNISUM_ENOTINIT = -4,	/* unisum_init() has not been called */
	UNISUM_EMISMATCH = -5,	/* workers disagree on a tensor: dtype, size, or collective (root, op) */
	UNISUM_ECONN = -6,	/* a connection to a peer failed or was closed */
	UNISUM_EPROTO = -7,	/* a peer sent a message that breaks the protocol */
	UNISUM_ETIMEDOUT = -8,	/* a bounded wait ran out */
	UNISUM_EBUSY = -9,	/* a tensor's push_pull in flight, or a shared segment in use */
	UNISUM_EREMOTE = -10,	/* a peer reported an error (see the log / last error) */
	UNISUM_ESYS = -11,	/* a system call failed (see errno in the log) */
	UNISUM_ESHUTDOWN = -12,	/* the job is shutting down */
	UNISUM_EAUTH = -13,	/* a peer failed the handshake of the job secret */
	UNISUM_EMEMBERSHIP = -14, /* an elastic job's workers changed (one was lost, or
				   * some join): call unisum_rejoin() */
};

/* Flags of unisum_push_pull(): at most one of them; none is the sum. */
#define UNISUM_AVERAGE 0x1	/* divide the sum by unisum_size() */
#define UNISUM_MIN 0x2		/* elementwise minimum instead of the sum */
#define UNISUM_MAX 0x4		/* elementwise maximum */
#define UNISUM_PRODUCT 0x8	/* elementwise product */

/* An in-flight asynchronous operation; 0 is never a valid handle. */
typedef int64_t unisum_handle;

/* Reads the UNISUM_* / DMLC_* / BYTEPS_* environment, registers with the
 * scheduler and connects to every server.  Blocks until the whole job has
 * registered.  Returns 0 (also when already initialised) or a negative
 * error (UNISUM_ECONFIG names the variable in unisum_last_error()).  A
 * process joins its job once: after unisum_shutdown() it fails at once
 * with UNISUM_ESHUTDOWN. */
int unisum_init(void);

/* Waits for in-flight operations, tells the scheduler this worker is done
 * and closes every connection.  Servers stay up until every worker is done.
 * A process that exits without calling it (main returns, exit()) leaves
 * the same way at exit, provided every operation is complete; otherwise it
 * leaves without a goodbye and the job fails naming it.  A worker that
 * leaves while others still wait on it (a round it never pushed, a
 * barrier) fails the job with its name on every rank. */
int unisum_shutdown(void);

/* Elastic jobs (UNISUM_ELASTIC=1, `unisum launch --elastic`).  When a
 * worker is lost, or when workers wait to join and one worker calls
 * unisum_rejoin(), the job re-forms: every operation of every worker then
 * fails with UNISUM_EMEMBERSHIP.  unisum_rejoin() leaves the ended
 * membership and joins the new one (blocking until it has formed):
 * rank and size change, every tensor and handle of before is gone (declare
 * again), and the servers start afresh.  Called while the membership
 * still holds, it asks the scheduler to re-form the job now (taking the
 * waiting workers in).  0, UNISUM_EINVAL when the job is not elastic, or
 * the error that failed the job (fewer workers left than
 * UNISUM_ELASTIC_MIN_WORKERS).  A worker that starts while the job runs
 * waits in unisum_init() for the next re-form.  The buffers of operations
 * that failed with UNISUM_EMEMBERSHIP stay in use until unisum_rejoin()
 * returns: a server of the ended membership may still read an input (IPC
 * reads it in place) until the new one has formed. */
int unisum_rejoin(void);

/* 1 when this worker should call unisum_rejoin() (its membership ended, or
 * workers wait to join: poll it where the state is committed), 0 if not,
 * or a negative error. */
int unisum_membership_changed(void);

/* Rank of this worker in [0, size), number of workers, and the rank and
 * count of workers on this machine.  Negative (UNISUM_ENOTINIT) before init. */
int unisum_rank(void);
int unisum_size(void);
int unisum_local_rank(void);
int unisum_local_size(void);

/* Declares a tensor of `count` elements of `dtype` under `name`.  Every
 * worker must declare the same name with the same dtype and count, in any
 * order: the keys are derived from the name.  `priority` orders
 * transmission (larger goes first).  Declaring the same name again with the
 * same shape returns the same id.  Returns a tensor id >= 0 or a negative
 * error (UNISUM_EMISMATCH when another worker declared it differently). */
int unisum_declare(const char *name, unisum_dtype dtype, size_t count, int priority);

/* unisum_declare with the tensor's dimensions (ndim of them, 0 to 16; the
 * count is their product): a worker that declares the name with other
 * dimensions fails with UNISUM_EMISMATCH naming both shapes, even when the
 * element counts agree, and so do the others.  A declaration without
 * dimensions (unisum_declare) agrees with any of the same count. */
int unisum_declare_shaped(const char *name, unisum_dtype dtype, int ndim, const int64_t *dims,
			  int priority);

/* Horovod's join: this worker has no more data.  Until every worker has
 * joined, it contributes zeros to every push_pull the others run (the
 * others tell it which, through the scheduler; an average still divides
 * by unisum_size()), and the others' broadcasts and gathering collectives
 * fail with UNISUM_EINVAL.  Waits for this worker's own operations first.
 * Returns the rank that joined last (the same on every worker), or an
 * error. */
int unisum_join(void);

/* Starts the timeline now (Horovod's start_timeline): every operation
 * from here on, as UNISUM_TRACE_ON records it (README: "Priority, credit,
 * timeline and autotune"), into the Chrome trace-event JSON file `path`, until
 * unisum_timeline_stop() or unisum_shutdown().  UNISUM_EBUSY while a
 * timeline is being written (UNISUM_TRACE_ON's too). */
int unisum_timeline_start(const char *path);
int unisum_timeline_stop(void);

/* Process sets (Horovod's): a subgroup of the ranks, `ranks` in any
 * order, each once.  Returns the set's id (>= 1; 0 is the global set of
 * every rank) or a negative error (UNISUM_EINVAL for a bad or repeated
 * rank, or ranks that are a set already).  Local: every member adds the
 * same ranks, and non-members need not.  Ids count from 1 in the order a
 * worker adds sets; the set is its ranks, not its id. */
int unisum_process_set_add(const int *ranks, int nranks);

/* Removes process set `set` and undeclares its tensors (UNISUM_EBUSY
 * while an operation on one of them has not been waited for). */
int unisum_process_set_remove(int set);

/* unisum_declare_shaped for process set `set` (0: the global set, as
 * unisum_declare_shaped).  Only its members declare it, and push_pull and
 * broadcast on it run among them alone: its own keys and rounds, summed on
 * the job's servers (which it needs: UNISUM_ECONFIG without one) over
 * each member's push; UNISUM_AVERAGE divides by the set's size, and a
 * broadcast's root is a member's rank.  The same name in two sets is two
 * tensors.  UNISUM_EINVAL for a worker outside the set; the gathering
 * collectives take tensors of the global set only. */
int unisum_declare_in(int set, const char *name, unisum_dtype dtype, int ndim,
		      const int64_t *dims, int priority);

/* unisum_declare of a float32 tensor whose push_pulls are compressed
 * (BytePS's two-level scheme): `compression` is a spec such as
 * "onebit,scaling=1,ef=vanilla,momentum=nesterov,mu=0.9", "topk,k=0.01",
 * "randomk,k=0.01,seed=7", "dithering,s=7,normalize=max,partition=linear",
 * "fp16" or "bf16" (NULL, "" or "none": uncompressed; `unisum info`
 * lists the compressors and keys).  The machine's root compresses each
 * partition of the machine's sum (after Nesterov momentum and error
 * feedback, as the spec asks), the server decompresses every machine's
 * push, sums in float32 and compresses the sum once (with its own error
 * feedback), and every worker decompresses the same bytes; UNISUM_AVERAGE
 * divides after that.  A tensor smaller than UNISUM_MIN_COMPRESS_BYTES
 * (64 KiB) goes uncompressed.  Only push_pull runs on it, in lock-step,
 * and every worker must declare it with the same spec (UNISUM_EMISMATCH
 * naming both otherwise: the tensor can never be summed, the others go
 * on).  UNISUM_EINVAL for a bad spec (naming the key or value at fault)
 * or another dtype. */
int unisum_declare_ex(const char *name, unisum_dtype dtype, size_t count, int priority,
		      const char *compression);

/* unisum_declare in sync mode `sync` (NULL: UNISUM_SYNC's, "sync" by
 * default): "sync" is the lock-step of unisum_declare; "async" is
 * BytePS's asynchronous mode, where the servers hold the tensor's value
 * and no worker waits for another.  On an async tensor every rank runs
 * alone: its first unisum_push_pull is the initialisation (rank 0's input
 * becomes the value, the others' inputs are dropped, and every rank's
 * output is the value: a broadcast from rank 0); each later one adds its
 * input to the value as a delta, at once and exactly once, and returns
 * the value as it stands then (every partition whole, never half of a
 * delta).  "ssp:S" is async with bounded staleness: a rank that has
 * pushed t deltas gets its push_pull's answer only once every rank has
 * pushed at least t - S (S = 0 is lock-step; the servers log the rank
 * that holds the others back, and fail the job past
 * UNISUM_STALL_ABORT_MS).  Only push_pull with flags 0 runs on such a
 * tensor (UNISUM_EINVAL otherwise).  "dssync:G" is divide and shuffle:
 * push_pull number k on the tensor runs among the G ranks this rank is
 * grouped with at step k (a permutation of the ranks from the job id and
 * k, the same on every worker, another at every step; its own keys on
 * the same servers), and every UNISUM_DSSYNC_GLOBAL_EVERY-th among all
 * ranks; UNISUM_AVERAGE divides by the group's size.  A name declared in two modes fails
 * (UNISUM_EMISMATCH); UNISUM_EINVAL for another mode; UNISUM_ECONFIG
 * without servers. */
int unisum_declare_sync(const char *name, unisum_dtype dtype, size_t count, int priority,
			const char *sync);

/* This worker is done with the tensor for good: its id is free (a later
 * unisum_declare may return it for another name), and once every worker
 * has undeclared it, the scheduler, the servers and the machine's shared
 * memory forget it too.  For one-shot tensors (unisum.torch names each
 * unnamed operation and each broadcast by a counter and undeclares it
 * when done): a name must not be declared again unless every worker has
 * undeclared it first (a unisum_barrier after the undeclares is enough:
 * a server holds a worker's new declaration until the others' undeclares
 * reach it); the scheduler refuses it (UNISUM_EINVAL) while it can tell.  UNISUM_EBUSY while an operation on it has not been waited
 * for; UNISUM_EINVAL for an unknown id. */
int unisum_undeclare(int tensor);

/* Sums `in` over all workers into `out` (which may equal `in`); with
 * UNISUM_AVERAGE the sum is divided by unisum_size() (integers: floor).
 * UNISUM_MIN, UNISUM_MAX and UNISUM_PRODUCT reduce with that operation
 * instead, on the servers as the sum is: a float min or max is NaN where
 * any input is, and min(-0, +0) is -0, max(-0, +0) is +0; integer
 * products wrap.  Blocks until done. */
int unisum_push_pull(int tensor, const void *in, void *out, int flags);

/* The asynchronous form: starts the operation and stores its handle in *h.
 * `in` and `out` must stay valid until unisum_poll() returns non-zero or
 * unisum_wait() returns.  A tensor has at most one operation in flight
 * (UNISUM_EBUSY otherwise).  On error *h is not set and no completion is
 * ever reported. */
int unisum_push_pull_async(int tensor, const void *in, void *out, int flags,
			   unisum_handle *h);

/* 1 when the operation is done (its handle is then released: do not poll
 * or wait on it again), 0 while pending, negative on error (also releases). */
int unisum_poll(unisum_handle h);

/* Blocks until the operation completes; releases the handle.  0 or a
 * negative error. */
int unisum_wait(unisum_handle h);

/* unisum_poll that waits at most timeout_ms (>= 0) for the operation to
 * complete: 1 done (released), 0 still pending, negative on error
 * (released).  For callers that must come back often, such as an
 * interpreter that runs its signal handlers between calls. */
int unisum_poll_timeout(unisum_handle h, int timeout_ms);

/* unisum_poll_timeout that also stores its answer in *answer before it
 * returns, for an interpreter that may run a signal handler between this
 * call's return and the use of its value (CPython raises Ctrl-C's
 * KeyboardInterrupt right there): a completion, which released the
 * handle, is then still known to the caller.  *answer is written on every
 * return, unless `answer` is NULL. */
int unisum_poll_timeout_into(unisum_handle h, int timeout_ms, int *answer);

/* Copies `buf` of rank `root_rank` into `buf` of every worker.  Every
 * worker must name the same root: when they disagree (as when they
 * disagree on UNISUM_AVERAGE in a push_pull), every worker's call fails
 * with UNISUM_EMISMATCH naming both sides, before any buffer is written
 * (but for the machine's sum that a local root of several machines holds
 * by then), and the tensor can never be summed again. */
int unisum_broadcast(int tensor, void *buf, int root_rank);

/* The asynchronous form: starts the broadcast and stores its handle in *h
 * (unisum_poll / unisum_wait complete it); `buf` must stay valid until
 * then. */
int unisum_broadcast_async(int tensor, void *buf, int root_rank, unisum_handle *h);

/*
 * The gathering collectives.  Each runs on a tensor declared (by every
 * worker, the same) with the whole result's element count, on the same
 * servers and pipeline as a push_pull, and moves only what it must: a
 * machine pushes only partitions that hold its elements and pulls only
 * those it wants.  Every worker passes the same counts; workers that pass
 * different ones fail with UNISUM_EMISMATCH, as for different collectives.
 * The results are bit-exact for every dtype.  `in` and `out` stay the
 * caller's until the handle completes; the blocking forms wait.
 */

/* Concatenates every rank's `in` (counts[r] elements of rank r) into
 * `out` (the declared count, rank 0's elements first), as MPI_Allgatherv.
 * `in` may lie inside `out`. */
int unisum_allgather_async(int tensor, const void *in, void *out, const uint64_t *counts,
			   unisum_handle *h);
int unisum_allgather(int tensor, const void *in, void *out, const uint64_t *counts);

/* unisum_allgather_async in two steps, for a caller that knows the next
 * call's layout before it has its rows (a training loop gathering a
 * tensor of the same shape every step): begin sends this machine's pulls
 * of the other ranks' rows now, so those arrive as soon as their ranks
 * push them, even before this rank has its own; supply then copies this
 * rank's counts[rank] elements from `in` (NULL when there are none) into
 * their place in `out` and pushes them.  Until supplied the operation cannot complete (waiting on
 * it fails with UNISUM_EINVAL instead of blocking for ever); every rank
 * must supply (or call unisum_allgather_async) for any to complete.
 * unisum_join and unisum_shutdown supply nothing for the operations
 * begun and not supplied: their rows stay as they were in `out`, the
 * others receive zeros.  With one worker a machine only
 * (UNISUM_EINVAL otherwise); while a rank has joined, begin fails with
 * UNISUM_EINVAL without logging it (as a call would, which logs). */
int unisum_allgather_begin(int tensor, void *out, const uint64_t *counts, unisum_handle *h);
int unisum_allgather_supply(unisum_handle h, const void *in);

/* Sums `in` (the declared count) over all workers and leaves in `out` only
 * this rank's slice: counts[r] elements for rank r, the slices in rank
 * order.  Each machine pulls only its ranks' slices.  flags: 0 or
 * UNISUM_AVERAGE. */
int unisum_reduce_scatter_async(int tensor, const void *in, void *out, const uint64_t *counts,
				int flags, unisum_handle *h);
int unisum_reduce_scatter(int tensor, const void *in, void *out, const uint64_t *counts,
			  int flags);

/* Every rank sends counts[me * size + d] elements to each rank d, `in`
 * holding them by destination; `out` receives counts[s * size + me]
 * elements from each rank s, by source.  counts has size * size entries,
 * the same on every rank, adding up to the declared count. */
int unisum_alltoall_async(int tensor, const void *in, void *out, const uint64_t *counts,
			  unisum_handle *h);
int unisum_alltoall(int tensor, const void *in, void *out, const uint64_t *counts);

/* Returns when every worker has called unisum_barrier(). */
int unisum_barrier(void);

/* The same in slices: enters the barrier unless this worker is already
 * waiting in one, then waits at most timeout_ms (>= 0).  1 when every
 * worker has entered; 0 when the time ran out first (this worker stays in
 * the barrier, and the next call waits for the same one); negative when
 * the job failed. */
int unisum_barrier_timeout(int timeout_ms);

/* unisum_barrier_timeout that also stores its answer in *answer before it
 * returns (see unisum_poll_timeout_into): a barrier that ended is then
 * not entered again by mistake. */
int unisum_barrier_timeout_into(int timeout_ms, int *answer);

/* Memory for tensors to push_pull, like malloc (uninitialised, 64-byte
 * aligned; NULL when out of memory).  After unisum_init() on a machine of
 * several workers it comes from this worker's shared arena
 * (UNISUM_LOCAL_ARENA_BYTES), which the other workers of the machine have
 * mapped: a push_pull whose input and output lie there is summed with
 * plain loads and stores, without the cross-memory-attach copy.  Otherwise,
 * or when the arena is full, it is ordinary memory and everything works
 * the same, only slower.  Give it back with unisum_free(); it stays valid
 * after unisum_shutdown(). */
void *unisum_alloc(size_t bytes);
void unisum_free(void *p);

/* Servers whose bytes unisum_stats counts one by one. */
#define UNISUM_STATS_SERVERS 64

/* What the pipeline of this worker has done so far. */
typedef struct unisum_stats {
	uint64_t credit_bytes;		/* the PUSH stage's credit now */
	uint64_t partition_bytes;	/* the largest partition now (autotune may change both) */
	uint64_t max_inflight_bytes;	/* the most bytes ever in flight under the credit */
	uint64_t partitions_sent;	/* partitions the PUSH stage let out */
	uint64_t bytes_pushed;		/* data this worker sent to the servers */
	uint64_t bytes_pulled;		/* data it received from them */
	uint64_t operations;		/* collectives completed without an error */
	uint64_t local_bytes;		/* input bytes it summed from its machine's workers
					 * through shared memory (its slices of each tensor) */
	int nservers;			/* the job's servers; the first UNISUM_STATS_SERVERS
					 * of them are counted in server_bytes */
	uint64_t server_bytes[UNISUM_STATS_SERVERS];	/* data it sent to each server */
} unisum_stats;

/* Fills *out.  0, or UNISUM_ENOTINIT / UNISUM_EINVAL. */
int unisum_get_stats(unisum_stats *out);

/* Text of an error code; never NULL. */
const char *unisum_strerror(int err);

/* The detailed message of the last error on this thread (rank, tensor,
 * what to do), or "" when there is none. */
const char *unisum_last_error(void);

/* The library's release version ("0.1.0"); never NULL. */
const char *unisum_version(void);

/* Size in bytes of one element of `dtype`, or 0 for an unknown dtype. */
size_t unisum_dtype_size(unisum_dtype dtype);

/* Name of `dtype` ("float32", ...), or "unknown". */
const char *unisum_dtype_name(unisum_dtype dtype);

#ifdef __cplusplus
}
#endif
#endif /* UNISUM_H */
