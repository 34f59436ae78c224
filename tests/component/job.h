/*
 * job.h - whole jobs in one process, for the component tests
 * (test_job.c, test_job_training.c): a scheduler, servers on threads
 * (server_run) and every worker a handle (worker.h) on its own thread,
 * over real loopback sockets, the IPC transport and the machines' shared
 * memory; and the small-integer values and references of the tests that
 * tests/scenarios does not run.
 */
#ifndef UNISUM_TESTS_COMPONENT_JOB_H
#define UNISUM_TESTS_COMPONENT_JOB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <pthread.h>

#include "config/config.h"
#include "rendezvous/rendezvous.h"
#include "worker/worker.h"

#define MAX_WORKERS 8
#define MAX_SERVERS 3
#define PART_BYTES 4096		/* small partitions: many per tensor, cheaply */

struct job {
	int machines, local, servers, nworkers;
	struct config cfg;			/* the scheduler's; the others start from it */
	struct config scfg[MAX_SERVERS], wcfg[MAX_WORKERS];
	struct rdv_scheduler *sched;
	pthread_t srv_thread[MAX_SERVERS];
	int srv_rc[MAX_SERVERS];
	struct worker *w[MAX_WORKERS];
	bool alloc;			/* work_sums takes its buffers from worker_alloc */
};

/* What a rank's thread runs; 0, or an error with msg set. */
typedef int (*work_fn)(struct job *j, int rank, char *msg, size_t len);

struct rank_run {
	struct job *job;
	int rank;
	work_fn fn;
	int rc;
	char msg[512];
};

/* Runs fn (or start) on one thread per rank and fails the test, with
 * every rank's message, unless each returned 0. */
void each_rank(struct job *j, void *(*start)(void *), work_fn fn);
/* each_rank's start that runs the rank's work_fn. */
void *work_main(void *arg);
/* Starts a job of machines x local workers and `servers` servers; cfg_fn
 * (may be NULL) changes the configuration every node starts from. */
void job_start_with(struct job *j, int machines, int local, int servers, uint64_t credit, int ipc,
		    void (*cfg_fn)(struct config *cfg));
void job_start(struct job *j, int machines, int local, int servers, uint64_t credit, int ipc);
void job_stop(struct job *j);
/* The environment's UNISUM_, DMLC_ and BYTEPS_ variables unset (the
 * configuration comes from the tests); TEST_JOB_FILTER applied. */
void job_test_setup(void);

/* Rank r's element i of tensor t: a small integer, exact everywhere. */
int value(int r, int t, size_t i);
void put(void *buf, unisum_dtype d, size_t i, int v);
/* Element i of an int64 or float32 buffer. */
long long get(const void *buf, unisum_dtype d, size_t i);
void fill(void *buf, unisum_dtype d, size_t n, int r, int t);
/* The job's sum of tensor t (divided by the size for an average). */
void *reference(const struct job *j, unisum_dtype d, size_t n, int t, bool average);
/* 0 when out holds the reference, else an error naming the first
 * difference. */
int check(const struct job *j, const void *out, unisum_dtype d, size_t n, int t, bool average,
	  const char *what, char *msg, size_t len);
/* A buffer of w's: from its machine's arena when the job says so and the
 * arena has room (freed with unisum_free, which tells them apart). */
void *buffer(struct job *j, struct worker *w, size_t bytes);
/* A push_pull of w, waited for. */
int push_pull(struct worker *w, int tensor, const void *in, void *out, int flags);

/* In a work_fn: sets msg and returns rc_, or UNISUM_EINVAL for 0. */
#define FAIL(rc_, ...) do { snprintf(msg, len, __VA_ARGS__); return (rc_) ? (rc_) : UNISUM_EINVAL; } while (0)

#endif
