/*
 * trace.h - the timeline: stage spans per partition and per tensor, as
 * Chrome trace-event JSON that Perfetto and chrome://tracing open.
 *
 * UNISUM_TRACE_ON=1 (or BYTEPS_TRACE_ON) turns it on; the rounds
 * UNISUM_TRACE_START_STEP..UNISUM_TRACE_END_STEP (inclusive; a tensor's
 * round is its training step) are recorded into
 * UNISUM_TRACE_DIR/<rank>/comm.json, the layout BytePS uses.
 *
 * The hot path never waits for the file: trace_span() copies a small
 * record into a ring under a lock held for a few instructions, and a
 * writer thread formats and writes the records in the background.  When
 * the ring is full the record is dropped and counted (the count is logged
 * at the end), never waited for.
 *
 * Layout in the viewer: one process per worker ("worker R"), one row per
 * tensor (its whole push_pull, named after the tensor) and one row per
 * partition ("<tensor> [i]") with its QUEUE (waiting for priority and
 * credit), PUSH and PULL spans, plus an "in flight" counter of the bytes
 * under credit.
 */
#ifndef UNISUM_TRACE_H
#define UNISUM_TRACE_H

#include <stdbool.h>
#include <stdint.h>

struct config;

/* What a record is. */
enum trace_kind {
	TRACE_TENSOR,	/* a whole push_pull: start to completion */
	TRACE_QUEUE,	/* a partition waiting in the PUSH stage's queue */
	TRACE_PUSH,	/* its PUSH leaving: taken from the queue to written */
	TRACE_PULL,	/* its PULL: written to the reply received in full */
	TRACE_INFLIGHT,	/* counter: bytes in flight under the credit */
	TRACE_LOCAL_REDUCE,	/* its slice summed across the machine's workers */
	TRACE_LOCAL_BROADCAST,	/* the machine's result reaching this worker */
};

/* Starts tracing for worker `rank` when the configuration asks for it
 * (creates the directory and file, starts the writer).  Returns 0, or
 * UNISUM_ECONFIG / UNISUM_ESYS with the reason in the last error. */
int trace_open(const struct config *cfg, int rank);

/* Starts the timeline now, every round from here on, into the file
 * `path` (Horovod's start_timeline); trace_close stops it.  0, or
 * UNISUM_EBUSY while one is being written, UNISUM_EINVAL / UNISUM_ECONFIG
 * for a path that cannot be written. */
int trace_start(const char *path, int rank);

/* Whether a timeline is being written. */
bool trace_is_on(void);

/* Whether round `round` is recorded (false when tracing is off). */
bool trace_wants(uint32_t round);

/* Names tensor `tensor` (its index) and says how many partitions it has. */
void trace_name_tensor(int tensor, const char *name, uint32_t nparts);

/* Microseconds on the trace's clock. */
int64_t trace_now_us(void);

/* Records a span [start_us, end_us] of `kind` for partition `part` of
 * tensor `tensor` (part is ignored for TRACE_TENSOR), or for
 * TRACE_INFLIGHT the counter value `bytes` at start_us.  `order` is the
 * PUSH stage's dispatch number (TRACE_QUEUE/TRACE_PUSH), else 0. */
void trace_span(enum trace_kind kind, int tensor, uint32_t part, uint32_t round, uint64_t key,
		uint64_t bytes, uint64_t order, int64_t start_us, int64_t end_us);

/* Writes what is left, closes the JSON and the file, stops the writer. */
void trace_close(void);

#endif /* UNISUM_TRACE_H */
