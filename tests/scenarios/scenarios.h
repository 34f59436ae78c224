/*
 * scenarios.h - the scenarios that tests/component/test_job.c (every
 * worker a struct worker handle, in one process) and
 * tests/integration/check_sums.c (a worker program under `unisum launch`,
 * on unisum.h) both run, written once against a table of the calls they
 * need, with one data generator and one reference:
 *
 *   scn_sums       every dtype at sizes around the partition boundaries,
 *                  summed and (below 100000 elements) averaged, each in
 *                  place at some sizes and out of place at the others
 *   scn_many       many tensors in flight at once
 *   scn_broadcast  a broadcast from every root
 *   scn_once       one-shot tensors: declared, summed, undeclared, ids reused
 *   scn_disagree   the ranks disagree on a collective: every rank fails with
 *                  UNISUM_EMISMATCH within refuse_ms, its buffers
 *                  untouched; then a healthy tensor sums
 *   scn_rounds     rounds of a tensor whose inputs change every round
 *
 * Every rank can compute every other rank's input (scn_gen_bits: a
 * function of dtype, salt, rank and index), so the reference is exact: it
 * sums as the servers do, each machine's local ranks in rank order, then
 * the machines in order (float16 / bfloat16 rounded after every addition,
 * integers wrapping), and divides an average with reducer_divide.
 *
 * Each scenario returns 0, or an error (a negative unisum code) with a
 * message in msg.
 */
#ifndef UNISUM_TESTS_SCENARIOS_H
#define UNISUM_TESTS_SCENARIOS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "unisum.h"

/* What a scenario calls: one rank's view of the job. */
struct scn_ops {
	void *ctx;			/* passed to every call */
	int rank, size;			/* in the job */
	int local_size;			/* ranks per machine */
	int machines;
	size_t partition_bytes;
	int refuse_ms;			/* scn_disagree: a refusal fails within this (scn_refuse_ms) */
	int (*declare)(void *ctx, const char *name, unisum_dtype dt, size_t count, int priority);
	int (*push_pull_async)(void *ctx, int tensor, const void *in, void *out, int flags,
			       unisum_handle *h);
	int (*poll)(void *ctx, unisum_handle h);	/* unisum_poll's answer */
	int (*wait)(void *ctx, unisum_handle h);
	int (*broadcast_async)(void *ctx, int tensor, void *buf, int root, unisum_handle *h);
	int (*undeclare)(void *ctx, int tensor);
	void *(*alloc)(void *ctx, size_t bytes, bool input);	/* a tensor's buffer, or NULL */
	void (*free)(void *ctx, void *p);
	void (*say)(void *ctx, const char *line);	/* may be NULL: a line of progress */
	uint64_t digest;		/* scn_sums: FNV-1a of every result, updated */
};

/* How soon scn_disagree's refusals must fail, for a job whose silent peer
 * is dead after timeout_ms and whose stalled operation fails after
 * stall_abort_ms (0: never): half the shorter.  A refusal takes a few
 * messages (a server or worker tells the scheduler, which poisons the
 * tensor on every node): milliseconds, and never seconds even under a
 * sanitizer on a loaded machine; one that came only by a peer's death or
 * the stall limit came too late, and fails the scenario. */
int scn_refuse_ms(int timeout_ms, int stall_abort_ms);

/* The digest's start (FNV-1a's offset basis). */
#define SCN_DIGEST_START 0xcbf29ce484222325ull

/* Input element i of rank r for tensor `salt`: its bits, zero-extended. */
uint64_t scn_gen_bits(unisum_dtype dt, uint64_t salt, int r, size_t i);
/* Fills count elements of rank o->rank's input for `salt`. */
void scn_fill(const struct scn_ops *o, unisum_dtype dt, uint64_t salt, void *buf, size_t count);
/* 0 when buf holds the job's sum (or average) of `salt`, else an error
 * naming `what` and the first wrong element in msg. */
int scn_verify(const struct scn_ops *o, const char *what, unisum_dtype dt, uint64_t salt,
	       const void *buf, size_t count, bool average, char *msg, size_t len);

/* `big`: also a 64 MiB tensor of every dtype. */
int scn_sums(struct scn_ops *o, bool big, char *msg, size_t len);
int scn_many(struct scn_ops *o, int n, char *msg, size_t len);
int scn_broadcast(struct scn_ops *o, char *msg, size_t len);
/* n one-shot tensors; afterwards their freed id must be refused. */
int scn_once(struct scn_ops *o, int n, char *msg, size_t len);
int scn_disagree(struct scn_ops *o, char *msg, size_t len);
/* n rounds of `count` elements of dt, in place on even rounds. */
int scn_rounds(struct scn_ops *o, unisum_dtype dt, size_t count, int n, char *msg, size_t len);

#endif
