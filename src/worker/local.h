/*
 * local.h - the LOCAL_REDUCE and LOCAL_BROADCAST stages: the workers of one
 * machine sum in shared memory before (and instead of) the network
 * (docs/ARCHITECTURE.md section 6).
 *
 * The workers of a machine share one control segment, created by local
 * rank 0 (the local root) and named after the job and the machine.  Each
 * rank publishes there, per operation, where its input and output buffers
 * are; the data never goes through the segment.  Every rank reads its own
 * slice of each partition straight from its peers' private input buffers
 * with cross-memory attach (process_vm_readv: one copy, no staging), sums
 * it in cache, and writes the sum where it belongs with process_vm_writev:
 *
 *   - one machine in the job: into every local rank's output (the local
 *     reduce is the whole job; nothing goes to a server);
 *   - several machines: into the local root's output, from which the root
 *     pushes each partition once for the machine as soon as all its slices
 *     are summed; after the pull every other rank copies the result from
 *     the root's output into its own.
 *
 * Ranks wait for each other on one futex word in the segment, always with
 * bounded sleeps that also watch the job's failure and each peer's life.
 * The segment's name is removed as soon as every local rank has mapped it,
 * so a crash can never leave it behind in /dev/shm.
 *
 * An operation is named on the machine by its cut's key and its round, which
 * every rank agrees on whatever order it declared and started them in; each
 * rank may work through its operations in its own order (by priority), as
 * the reads need nothing from a peer but its published buffers.
 */
#ifndef UNISUM_WORKER_LOCAL_H
#define UNISUM_WORKER_LOCAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "placement/placement.h"
#include "unisum.h"

struct local_cfg {
	const char *job;		/* job id (segment names) */
	int machine;			/* this machine's index */
	int machines;			/* machines in the job */
	int local_rank, local_size;
	int rank;			/* this worker's rank, for messages */
	int timeout_ms;			/* bounds attaching to the segment */
	int stall_warn_ms;		/* a wait this long is logged ... */
	int stall_abort_ms;		/* ... and this long fails the job (0: never) */
	uint64_t stage_bytes;		/* one machine: stage tensors this large (0: never) */
	uint64_t arena_bytes;		/* ... in a staging area this large per rank */
};

/* What the worker lends the stages.  `arg` is passed to those that take
 * no operation. */
struct local_hooks {
	void *arg;
	/* Several machines, local root only: partition `part` of the operation
	 * `ctx` is summed in its output buffer; push it (and pull into the same
	 * place).  Called on the LOCAL_REDUCE thread. */
	void (*push)(void *ctx, uint32_t part);
	/* The operation `ctx` is complete on this rank (err 0 or negative, with
	 * why).  Called once per operation, on the LOCAL_BROADCAST thread. */
	void (*done)(void *ctx, int err, const char *why);
	/* Whether the job failed: its error with the reason in why, or 0. */
	int (*failed)(void *arg, char *why, size_t len);
	/* Whether the tensor of cut `key` can never be summed (the workers
	 * declared it with different shapes): its error with why, or 0. */
	int (*poisoned)(void *arg, uint64_t key, char *why, size_t len);
	/* Several machines, local root only: this machine's workers disagree
	 * on the collective of cut `key`, so it never pushes it; tell every
	 * other machine, whose workers would wait for that push. */
	void (*poison)(void *arg, uint64_t key, const char *why);
	/* A wait stalled past cfg.stall_abort_ms: ask for the whole job to
	 * fail with `why`, so that every rank gets it instead of waiting. */
	void (*fail_job)(void *arg, int err, const char *why);
};

/* One push_pull on the local path. */
struct local_req {
	uint64_t key;			/* its cut's key: the operation's name ... */
	uint32_t round;			/* ... with its round */
	unisum_dtype dtype;
	const void *in;			/* NULL: contribute nothing (broadcast) */
	void *out;
	uint32_t nparts;
	const struct placement_part *parts;	/* valid until done */
	int divisor;			/* one machine: divide the sum by it (average) */
	int priority;			/* larger first */
	void *ctx;			/* passed back to the hooks */
	bool traced;			/* put its stages on the timeline ... */
	int tensor;			/* ... as this tensor's */
	uint32_t step;			/* ... round (the user's, not the cut's) */
	uint32_t wire_op;		/* the collective (WIRE_OP()): every rank must agree */
	const char *name;		/* the tensor's, for messages; valid until done */
};

/* One local rank's path (a handle: tests run several in one process). */
struct local;
struct local_op;

/* Maps (local root: creates) the machine's segment, waits until every local
 * rank has it (bounded by cfg->timeout_ms), removes its name and starts the
 * stage threads.  0 and *out, or a negative error, logged. */
int local_start(const struct local_cfg *cfg, const struct local_hooks *hooks, struct local **out);

/* Stops the threads (every operation must be done), unmaps and frees lc
 * (NULL: nothing).  Its arena stays mapped while local_alloc memory of it
 * is out. */
void local_stop(struct local *lc);

/* Starts an operation: publishes its buffers to the peers and queues it.
 * *out (for local_pulled) stays valid until the done hook has run.
 * 0, or UNISUM_ENOMEM / the table is full (logged). */
int local_submit(struct local *lc, const struct local_req *req, struct local_op **out);

/* This rank undeclared the tensor of cut `key` (no operation of it in
 * flight): its entry is reused once every local rank has done the same. */
void local_forget(struct local *lc, uint64_t key);

/* Several machines, local root only: the reply of partition `part` is in
 * the output buffer (err 0), or that partition failed. */
void local_pulled(struct local_op *op, uint32_t part, int err, const char *why);

/* unisum_alloc on the local path: `bytes` of this rank's arena, which every
 * local peer has mapped, so a push_pull whose buffers lie there is summed
 * with plain loads and stores instead of cross-memory attach; NULL when
 * the arena is full or the path is not running (the caller falls back to
 * ordinary memory).  The memory stays valid until local_free, even past
 * local_stop. */
void *local_alloc(struct local *lc, size_t bytes);

/* Gives back memory of local_alloc of any rank of this process: true, or
 * false when p is not from it. */
bool local_free(void *p);

/* Input bytes this rank has summed from its machine's ranks so far. */
uint64_t local_summed_bytes(struct local *lc);

#endif /* UNISUM_WORKER_LOCAL_H */
