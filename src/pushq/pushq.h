/*
 * pushq.h - the push queue (a stage queue): partitions ordered by priority, gated by credit.
 *
 * Every stage of the worker pipeline (docs/ARCHITECTURE.md section 2) takes its
 * partitions from one of these.  Entries come out highest priority first,
 * then lowest key (the same order on every worker, whatever order they
 * were queued in, so the servers complete the same partitions first).
 *
 * A queue with a credit lets an entry out only while the bytes in flight
 * (taken and not yet released) plus the entry's bytes fit the credit; an
 * entry bigger than the whole credit goes out alone.  The head is never
 * skipped for a smaller entry behind it, so a high-priority partition
 * queued behind a long low-priority backlog is the next one out once any
 * credit comes back (ByteScheduler, SOSP'19).
 *
 * The queue records the most bytes it ever had in flight and numbers the
 * entries it lets out, so tests can assert the credit and the order
 * without timing anything.
 */
#ifndef UNISUM_PUSHQ_H
#define UNISUM_PUSHQ_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Embedded in whatever the stage moves. */
struct pushq_entry {
	int priority;		/* higher goes first */
	uint64_t key;		/* then lower key */
	size_t bytes;		/* counted against the credit */
	uint64_t order;		/* set when taken: 0, 1, 2, ... per queue */
	size_t inflight;	/* set when taken: bytes in flight with it */
};

struct pushq {
	pthread_mutex_t lock;
	pthread_cond_t cond;		/* an entry came, credit came back, or closed */
	struct pushq_entry **heap;
	size_t n, cap;
	size_t credit;			/* 0: no credit gate */
	size_t inflight;		/* bytes taken and not released */
	size_t max_inflight;		/* the most ever in flight */
	uint64_t taken;			/* entries taken so far */
	bool closed;
};

/* credit 0 means "no gate". */
int pushq_init(struct pushq *q, size_t credit);
void pushq_fini(struct pushq *q);

/* Queues an entry.  Returns 0 or UNISUM_ENOMEM. */
int pushq_push(struct pushq *q, struct pushq_entry *e);

/* Takes the head once it fits the credit, waiting as long as needed; its
 * bytes count as in flight until pushq_release().  Returns NULL once the
 * queue is closed (entries left in it stay there: see pushq_drain). */
struct pushq_entry *pushq_pop(struct pushq *q);

/* The same without waiting: NULL when the queue is empty, closed, or its
 * head does not fit the credit now. */
struct pushq_entry *pushq_try_pop(struct pushq *q);

/* Gives back the credit of `bytes` taken earlier; returns the bytes still
 * in flight. */
size_t pushq_release(struct pushq *q, size_t bytes);

/* The same, waking no pushq_pop(): for a caller that then takes what fits
 * itself (pushq_try_pop until NULL), so that nothing that fits is left
 * waiting. */
size_t pushq_release_quiet(struct pushq *q, size_t bytes);

/* Changes the credit (0: no gate); waiters re-check at once. */
void pushq_set_credit(struct pushq *q, size_t credit);

/* Wakes every pushq_pop() with NULL, now and later. */
void pushq_close(struct pushq *q);

/* Removes and returns the entry at the head, whatever the credit, or NULL
 * when empty: for failing what is left after a close. */
struct pushq_entry *pushq_drain(struct pushq *q);

/* Snapshot of the counters. */
struct pushq_stats {
	size_t credit, inflight, max_inflight, queued;
	uint64_t taken;
};
void pushq_stats(struct pushq *q, struct pushq_stats *out);

#endif /* UNISUM_PUSHQ_H */
