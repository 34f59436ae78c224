/*
 * test_job.c - whole jobs in one process, as Gloo tests its collectives:
 * a scheduler, servers on threads (server_run) and every worker a handle
 * (worker.h) on its own thread, over real loopback sockets, the IPC
 * transport and the machines' shared memory.  Cheap enough to run the
 * corners the integration tests reach only slowly, and under the
 * sanitizers:
 *
 *   - every dtype, at sizes on each side of the partition boundaries
 *     (0, 1, P - 1, P, P + 1 and 3P + 5 elements of P per partition),
 *     summed and averaged, out of place and in place, on one machine
 *     (the local reduce only), on machines of several workers (the local
 *     reduce, then the servers over IPC) and one worker per machine over
 *     TCP and over IPC;
 *     the same staged through the ranks' arenas, and with buffers from
 *     the machine's arenas (worker_alloc);
 *   - 48 tensors in flight at once under a credit of one partition, so
 *     every push waits for credit to come back;
 *   - a broadcast from every root;
 *   - min, max and product of every dtype, and uneven allgather,
 *     reduce-scatter (sum and average) and alltoall of every dtype, some
 *     ranks with nothing, slices ending inside partitions, and the bytes
 *     they move (a machine pulls only its slice of a reduce-scatter,
 *     pushes only its rows of an allgather); an allgather
 *     whose ranks pass different counts fails on all of them;
 *   - one-shot tensors (a new name each), declared, summed and
 *     undeclared, ids reused;
 *   - ranks that disagree on a collective mid-job (within a machine, on a
 *     job of two machines): every rank fails with UNISUM_EMISMATCH, its
 *     output untouched (as unisum.h says: but for a local root's machine
 *     sum), and the next tensor sums;
 *   - leaving with operations in flight: worker_leave waits for them, and
 *     their sums are right;
 *   - fit mode (UNISUM_AUTOTUNE=2) over TCP: the setting changes after
 *     the first rounds, every sum stays exact.
 *
 * Values are small integers, exact in every dtype and any order of
 * summation, so the reference is the plain sum; averages go through the
 * same reducer_divide the worker uses.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "config/config.h"
#include "log/log.h"
#include "reducer/reducer.h"
#include "rendezvous/rendezvous.h"
#include "server/server.h"
#include "transport/transport.h"
#include "worker/worker.h"
#include "worker/worker_int.h"	/* a tensor's cut (the async test) */

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

static void *server_main(void *arg)
{
	struct config *cfg = arg;
	int rc = server_run(cfg, NULL);
	return (void *)(intptr_t)rc;
}

static void *join_main(void *arg)
{
	struct rank_run *r = arg;
	r->rc = worker_join(&r->job->wcfg[r->rank], &r->job->w[r->rank]);
	if (r->rc != 0)
		snprintf(r->msg, sizeof r->msg, "worker_join: %s", unisum_last_error());
	return NULL;
}

static void *work_main(void *arg)
{
	struct rank_run *r = arg;
	r->rc = r->fn(r->job, r->rank, r->msg, sizeof r->msg);
	return NULL;
}

static void *leave_main(void *arg)
{
	struct rank_run *r = arg;
	r->rc = worker_leave(r->job->w[r->rank]);
	if (r->rc != 0)
		snprintf(r->msg, sizeof r->msg, "worker_leave: %s", unisum_last_error());
	return NULL;
}

/* Runs fn (or start) on one thread per rank and fails the test, with
 * every rank's message, unless each returned 0. */
static void each_rank(struct job *j, void *(*start)(void *), work_fn fn)
{
	struct rank_run runs[MAX_WORKERS];
	pthread_t threads[MAX_WORKERS];
	for (int r = 0; r < j->nworkers; r++) {
		runs[r] = (struct rank_run){.job = j, .rank = r, .fn = fn};
		assert_int_equal(pthread_create(&threads[r], NULL, start, &runs[r]), 0);
	}
	bool ok = true;
	for (int r = 0; r < j->nworkers; r++) {
		pthread_join(threads[r], NULL);
		if (runs[r].rc != 0) {
			print_error("rank %d: %s (%s)\n", r, runs[r].msg, unisum_strerror(runs[r].rc));
			ok = false;
		}
	}
	assert_true(ok);
}

/* Starts a job of machines x local workers and `servers` servers; cfg_fn
 * (may be NULL) changes the configuration every node starts from. */
static void job_start_with(struct job *j, int machines, int local, int servers, uint64_t credit,
			   int ipc, void (*cfg_fn)(struct config *cfg))
{
	static int serial;
	memset(j, 0, sizeof *j);
	j->machines = machines;
	j->local = local;
	j->servers = servers;
	j->nworkers = machines * local;
	char err[256];
	assert_int_equal(config_load(&j->cfg, err, sizeof err), 0);
	j->cfg.role = CONFIG_ROLE_SCHEDULER;
	j->cfg.num_workers = machines;
	j->cfg.num_servers = servers;
	j->cfg.local_size = local;
	snprintf(j->cfg.scheduler_host, sizeof j->cfg.scheduler_host, "127.0.0.1");
	snprintf(j->cfg.node_host, sizeof j->cfg.node_host, "127.0.0.1");
	snprintf(j->cfg.job_id, sizeof j->cfg.job_id, "tj%d-%d", (int)getpid(), serial++);
	j->cfg.timeout_ms = 20000;
	j->cfg.heartbeat_ms = 200;
	j->cfg.stall_abort_ms = 15000;	/* a broken case fails, never hangs */
	j->cfg.partition_bytes = PART_BYTES;
	j->cfg.credit_bytes = credit;
	j->cfg.ipc = ipc;
	j->cfg.engine_threads = 2;
	/* One host: the ring phases of allgathers run only when asked (a
	 * job of 3 machines or more then takes them, with 16 and more
	 * partitions of rows). */
	j->cfg.allgather_phases = 1;
	if (getenv("TEST_JOB_DEBUG") != NULL) {
		j->cfg.log_level = LOG_LEVEL_DEBUG;
		log_set_level(LOG_LEVEL_DEBUG);	/* the level is the process's */
	}
	if (cfg_fn != NULL)
		cfg_fn(&j->cfg);
	int port = 0;
	assert_int_equal(rdv_scheduler_start("127.0.0.1", 0, &j->cfg, transport_tcp(), &j->sched,
					     &port), 0);
	j->cfg.scheduler_port = port;
	for (int s = 0; s < servers; s++) {
		j->scfg[s] = j->cfg;
		j->scfg[s].role = CONFIG_ROLE_SERVER;
		j->scfg[s].server_id = s;
		j->scfg[s].port = 0;
		j->scfg[s].rack = s % 2;	/* racks: see work_dssync */
		assert_int_equal(pthread_create(&j->srv_thread[s], NULL, server_main, &j->scfg[s]), 0);
	}
	for (int r = 0; r < j->nworkers; r++) {
		j->wcfg[r] = j->cfg;
		j->wcfg[r].role = CONFIG_ROLE_WORKER;
		j->wcfg[r].worker_id = r / local;
		j->wcfg[r].local_rank = r % local;
		j->wcfg[r].rack = (r / local) % 2;
	}
	each_rank(j, join_main, NULL);
	for (int r = 0; r < j->nworkers; r++)
		assert_int_equal(worker_rank(j->w[r]), r);
}

static void job_start(struct job *j, int machines, int local, int servers, uint64_t credit,
		      int ipc)
{
	job_start_with(j, machines, local, servers, credit, ipc, NULL);
}

static void job_stop(struct job *j)
{
	each_rank(j, leave_main, NULL);
	for (int r = 0; r < j->nworkers; r++)
		worker_free(j->w[r]);
	for (int s = 0; s < j->servers; s++) {
		void *rc;
		pthread_join(j->srv_thread[s], &rc);
		assert_int_equal((int)(intptr_t)rc, 0);
	}
	assert_int_equal(rdv_scheduler_wait(j->sched), 0);
	rdv_scheduler_free(j->sched);
}

/* ---- values and references ------------------------------------------------ */

/* Rank r's element i of tensor t: a small integer, exact everywhere. */
static int value(int r, int t, size_t i)
{
	return (int)((r * 7 + i * 3 + (size_t)t * 5) % 13) - 6;
}

static void put(void *buf, unisum_dtype d, size_t i, int v)
{
	switch (d) {
	case UNISUM_FLOAT32: ((float *)buf)[i] = (float)v; break;
	case UNISUM_FLOAT64: ((double *)buf)[i] = v; break;
	case UNISUM_FLOAT16: ((uint16_t *)buf)[i] = reducer_f32_to_f16((float)v); break;
	case UNISUM_BFLOAT16: ((uint16_t *)buf)[i] = reducer_f32_to_bf16((float)v); break;
	case UNISUM_INT32: ((int32_t *)buf)[i] = v; break;
	case UNISUM_INT64: ((int64_t *)buf)[i] = v; break;
	default: break;
	}
}

/* Element i of an int64 or float32 buffer (the async test's dtypes). */
static long long get(const void *buf, unisum_dtype d, size_t i)
{
	return d == UNISUM_INT64 ? (long long)((const int64_t *)buf)[i]
				 : (long long)((const float *)buf)[i];
}

static void fill(void *buf, unisum_dtype d, size_t n, int r, int t)
{
	for (size_t i = 0; i < n; i++)
		put(buf, d, i, value(r, t, i));
}

/* The job's sum of tensor t (divided by the size for an average). */
static void *reference(const struct job *j, unisum_dtype d, size_t n, int t, bool average)
{
	void *ref = malloc(n * unisum_dtype_size(d) + 1);
	for (size_t i = 0; i < n; i++) {
		int sum = 0;
		for (int r = 0; r < j->nworkers; r++)
			sum += value(r, t, i);
		put(ref, d, i, sum);
	}
	if (average)
		reducer_divide(ref, n, d, j->nworkers);
	return ref;
}

/* 0 when out holds the reference, else an error naming the first
 * difference. */
static int check(const struct job *j, const void *out, unisum_dtype d, size_t n, int t,
		 bool average, const char *what, char *msg, size_t len)
{
	void *ref = reference(j, d, n, t, average);
	size_t es = unisum_dtype_size(d);
	int rc = 0;
	for (size_t i = 0; i < n; i++)
		if (memcmp((const char *)out + i * es, (char *)ref + i * es, es) != 0) {
			snprintf(msg, len, "%s: %s x %zu, element %zu differs from the reference", what,
				 unisum_dtype_name(d), n, i);
			rc = UNISUM_EINVAL;
			break;
		}
	free(ref);
	return rc;
}

/* ---- what the ranks do ------------------------------------------------------ */

/* A buffer of w's: from its machine's arena when the job says so and the
 * arena has room (freed with unisum_free, which tells them apart). */
static void *buffer(struct job *j, struct worker *w, size_t bytes)
{
	void *p = j->alloc ? worker_alloc(w, bytes + 1) : NULL;
	return p != NULL ? p : malloc(bytes + 1);
}

/* A push_pull of w, waited for. */
static int push_pull(struct worker *w, int tensor, const void *in, void *out, int flags)
{
	unisum_handle h;
	int rc = worker_push_pull_async(w, tensor, in, out, flags, &h);
	return rc != 0 ? rc : worker_wait(w, h);
}

#define FAIL(rc_, ...) do { snprintf(msg, len, __VA_ARGS__); return (rc_) ? (rc_) : UNISUM_EINVAL; } while (0)

/* Every dtype x sizes around the partition boundaries, summed out of
 * place, then averaged in place. */
static int work_sums(struct job *j, int rank, char *msg, size_t len)
{
	struct worker *w = j->w[rank];
	int t = 0;
	for (int d = 0; d < UNISUM_DTYPE_COUNT; d++) {
		size_t p = PART_BYTES / unisum_dtype_size((unisum_dtype)d);
		size_t counts[] = {0, 1, p - 1, p, p + 1, 3 * p + 5};
		for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++, t++) {
			size_t n = counts[c], bytes = n * unisum_dtype_size((unisum_dtype)d);
			char name[64];
			snprintf(name, sizeof name, "sums.%d.%zu", d, n);
			int id = worker_declare(w, name, (unisum_dtype)d, n, 0);
			if (id < 0)
				FAIL(id, "declare %s: %s", name, unisum_last_error());
			void *in = buffer(j, w, bytes), *out = buffer(j, w, bytes);
			fill(in, (unisum_dtype)d, n, rank, t);
			int rc = push_pull(w, id, in, out, 0);
			if (rc == 0)
				rc = check(j, out, (unisum_dtype)d, n, t, false, "sum", msg, len);
			else
				snprintf(msg, len, "push_pull %s: %s", name, unisum_last_error());
			if (rc == 0) {
				fill(in, (unisum_dtype)d, n, rank, t);
				rc = push_pull(w, id, in, in, UNISUM_AVERAGE);
				if (rc == 0)
					rc = check(j, in, (unisum_dtype)d, n, t, true, "average", msg, len);
				else
					snprintf(msg, len, "average %s: %s", name, unisum_last_error());
			}
			unisum_free(in);
			unisum_free(out);
			if (rc != 0)
				return rc;
		}
	}
	return 0;
}

/* 48 tensors in flight at once, each several partitions, in a different
 * order of priority on every rank's queue. */
static int work_many(struct job *j, int rank, char *msg, size_t len)
{
	enum { TENSORS = 48, N = 3000 };
	struct worker *w = j->w[rank];
	int ids[TENSORS];
	float *in[TENSORS], *out[TENSORS];
	unisum_handle h[TENSORS];
	for (int t = 0; t < TENSORS; t++) {
		char name[32];
		snprintf(name, sizeof name, "many.%d", t);
		ids[t] = worker_declare(w, name, UNISUM_FLOAT32, N, t % 5);
		if (ids[t] < 0)
			FAIL(ids[t], "declare %s: %s", name, unisum_last_error());
		in[t] = malloc(N * sizeof(float));
		out[t] = calloc(N, sizeof(float));
		fill(in[t], UNISUM_FLOAT32, N, rank, 100 + t);
	}
	int rc = 0;
	for (int t = 0; t < TENSORS && rc == 0; t++)
		if ((rc = worker_push_pull_async(w, ids[t], in[t], out[t], 0, &h[t])) != 0)
			snprintf(msg, len, "push_pull many.%d: %s", t, unisum_last_error());
	for (int t = 0; t < TENSORS && rc == 0; t++) {
		rc = worker_wait(w, h[t]);
		if (rc != 0)
			snprintf(msg, len, "wait many.%d: %s", t, unisum_last_error());
		else
			rc = check(j, out[t], UNISUM_FLOAT32, N, 100 + t, false, "many", msg, len);
	}
	for (int t = 0; t < TENSORS; t++) {
		free(in[t]);
		free(out[t]);
	}
	return rc;
}

/* A broadcast from every root: every rank ends with the root's values. */
static int work_broadcast(struct job *j, int rank, char *msg, size_t len)
{
	enum { N = 5000 };
	struct worker *w = j->w[rank];
	int id = worker_declare(w, "bcast", UNISUM_INT32, N, 0);
	if (id < 0)
		FAIL(id, "declare bcast: %s", unisum_last_error());
	int32_t buf[N], want[N];
	for (int root = 0; root < j->nworkers; root++) {
		fill(buf, UNISUM_INT32, N, rank, 200 + root);
		fill(want, UNISUM_INT32, N, root, 200 + root);
		unisum_handle h;
		int rc = worker_broadcast_async(w, id, buf, root, &h);
		if (rc == 0)
			rc = worker_wait(w, h);
		if (rc != 0)
			FAIL(rc, "broadcast from %d: %s", root, unisum_last_error());
		if (memcmp(buf, want, sizeof buf) != 0)
			FAIL(0, "broadcast from %d: not the root's values", root);
	}
	return 0;
}

/* One-shot tensors: declared, summed, undeclared, 60 names. */
static int work_once(struct job *j, int rank, char *msg, size_t len)
{
	enum { N = 1500 };
	struct worker *w = j->w[rank];
	int64_t in[N], out[N];
	for (int t = 0; t < 60; t++) {
		char name[32];
		snprintf(name, sizeof name, "once.%d", t);
		int id = worker_declare(w, name, UNISUM_INT64, N, 0);
		if (id < 0)
			FAIL(id, "declare once (%d): %s", t, unisum_last_error());
		fill(in, UNISUM_INT64, N, rank, 300 + t);
		int rc = push_pull(w, id, in, out, 0);
		if (rc != 0)
			FAIL(rc, "push_pull once (%d): %s", t, unisum_last_error());
		rc = check(j, out, UNISUM_INT64, N, 300 + t, false, "once", msg, len);
		if (rc != 0)
			return rc;
		if ((rc = worker_undeclare(w, id)) != 0)
			FAIL(rc, "undeclare once (%d): %s", t, unisum_last_error());
	}
	return 0;
}

/* Rank 0 averages what the others sum: every rank fails naming the
 * disagreement, its output untouched; then a healthy tensor sums. */
static int work_disagree(struct job *j, int rank, char *msg, size_t len)
{
	enum { N = 2000 };
	struct worker *w = j->w[rank];
	float in[N], out[N];
	fill(in, UNISUM_FLOAT32, N, rank, 400);
	for (int i = 0; i < N; i++)
		out[i] = -1.0f;
	/* A rank that comes late finds the tensor poisoned already: its
	 * declaration fails the same way. */
	int id = worker_declare(w, "disagree", UNISUM_FLOAT32, N, 0);
	int rc = id < 0 ? id : push_pull(w, id, in, out, rank == 0 ? UNISUM_AVERAGE : 0);
	if (rc != UNISUM_EMISMATCH)
		FAIL(0, "a disagreeing declare or push_pull returned %s, not UNISUM_EMISMATCH: %s",
		     unisum_strerror(rc), unisum_last_error());
	/* unisum.h: untouched, but for the machine's sum that the local root
	 * of a machine that agreed within holds by then. */
	bool root_of_several = j->machines > 1 && j->local > 1 && rank % j->local == 0;
	for (int i = 0; i < N && !root_of_several; i++)
		if (out[i] != -1.0f)
			FAIL(0, "a failed push_pull wrote element %d of its output", i);
	int ok = worker_declare(w, "healthy", UNISUM_FLOAT32, N, 0);
	if (ok < 0)
		FAIL(ok, "declare healthy: %s", unisum_last_error());
	fill(in, UNISUM_FLOAT32, N, rank, 401);
	if ((rc = push_pull(w, ok, in, out, 0)) != 0)
		FAIL(rc, "healthy push_pull after a disagreement: %s", unisum_last_error());
	return check(j, out, UNISUM_FLOAT32, N, 401, false, "healthy", msg, len);
}

/* 8 rounds of a 2 MiB tensor, its inputs new every round. */
static int work_rounds(struct job *j, int rank, char *msg, size_t len)
{
	enum { N = 1 << 19 };
	struct worker *w = j->w[rank];
	int id = worker_declare(w, "rounds", UNISUM_FLOAT32, N, 0);
	if (id < 0)
		FAIL(id, "declare rounds: %s", unisum_last_error());
	float *in = malloc(N * sizeof(float)), *out = malloc(N * sizeof(float));
	int rc = 0;
	for (int r = 0; r < 8 && rc == 0; r++) {
		fill(in, UNISUM_FLOAT32, N, rank, 600 + r);
		if ((rc = push_pull(w, id, in, out, 0)) != 0)
			snprintf(msg, len, "round %d: %s", r, unisum_last_error());
		else
			rc = check(j, out, UNISUM_FLOAT32, N, 600 + r, false, "rounds", msg, len);
	}
	free(in);
	free(out);
	return rc;
}

/* ---- min, max, product; allgather, reduce-scatter, alltoall ------------- */

/* Compares n elements of out with want; 0 or an error in msg. */
static int same(const void *out, const void *want, unisum_dtype d, size_t n, const char *what,
		char *msg, size_t len)
{
	size_t es = unisum_dtype_size(d);
	for (size_t i = 0; i < n; i++)
		if (memcmp((const char *)out + i * es, (const char *)want + i * es, es) != 0) {
			snprintf(msg, len, "%s: %s x %zu, element %zu differs from the reference", what,
				 unisum_dtype_name(d), n, i);
			return UNISUM_EINVAL;
		}
	return 0;
}

/* Rank r's count of an uneven layout of case t: some ranks have none, and
 * the others' slices end inside partitions. */
static uint64_t layout_count(int r, int t, size_t p)
{
	return (r + t) % 4 == 1 ? 0 : (uint64_t)((size_t)(r * 7 + t) % 3 * p + (size_t)(r * 131 + t * 17) % p);
}

/* Min, max and product of every dtype, then an uneven allgather,
 * reduce-scatter (sum and average) and alltoall of every dtype, checked
 * exactly against references computed here. */
static int work_collectives(struct job *j, int rank, char *msg, size_t len)
{
	struct worker *w = j->w[rank];
	const int n = j->nworkers;
	int rc = 0;
	for (int d = 0; d < UNISUM_DTYPE_COUNT && rc == 0; d++) {
		unisum_dtype dt = (unisum_dtype)d;
		size_t es = unisum_dtype_size(dt), p = PART_BYTES / es, N = 3 * p + 5;
		char name[64];
		/* min, max, product: values in [-2, 2] keep every product exact */
		static const int ops[3] = {UNISUM_MIN, UNISUM_MAX, UNISUM_PRODUCT};
		snprintf(name, sizeof name, "ops.%d", d);
		int id = worker_declare(w, name, dt, N, 0);
		if (id < 0)
			FAIL(id, "declare %s: %s", name, unisum_last_error());
		uint8_t *in = malloc(N * es + 1), *out = malloc(N * es + 1), *want = malloc(N * es + 1);
		for (int o = 0; o < 3 && rc == 0; o++) {
			for (size_t i = 0; i < N; i++) {
				int acc = 0;
				for (int r = 0; r < n; r++) {
					int v = value(r, o, i) % 3;
					if (o == 2 && v == 0)
						v = 1;	/* products of floats: -0 and +0 differ */
					if (r == rank)
						put(in, dt, i, v);
					acc = r == 0 ? v : o == 0 ? (v < acc ? v : acc)
							 : o == 1 ? (v > acc ? v : acc) : acc * v;
				}
				put(want, dt, i, acc);
			}
			if ((rc = push_pull(w, id, in, out, ops[o])) != 0)
				snprintf(msg, len, "push_pull %s op %d: %s", name, o, unisum_last_error());
			else
				rc = same(out, want, dt, N, o == 0 ? "min" : o == 1 ? "max" : "product", msg, len);
		}
		free(in);
		free(out);
		free(want);
		if (rc != 0)
			return rc;

		/* allgather and reduce-scatter of one uneven layout */
		uint64_t counts[MAX_WORKERS], total = 0, off[MAX_WORKERS + 1] = {0};
		for (int r = 0; r < n; r++) {
			counts[r] = layout_count(r, d, p);
			off[r + 1] = off[r] + counts[r];
		}
		total = off[n];
		snprintf(name, sizeof name, "gather.%d", d);
		id = worker_declare(w, name, dt, total, 0);
		if (id < 0)
			FAIL(id, "declare %s: %s", name, unisum_last_error());
		in = malloc(total * es + 1);
		out = malloc(total * es + 1);
		want = malloc(total * es + 1);
		for (size_t i = 0; i < counts[rank]; i++)
			put(in, dt, i, value(rank, 50 + d, i));
		for (int r = 0; r < n; r++)
			for (size_t i = 0; i < counts[r]; i++)
				put(want, dt, off[r] + i, value(r, 50 + d, i));
		memset(out, 0x5a, total * es);
		unisum_handle h;
		if ((rc = worker_allgather_async(w, id, in, out, counts, &h)) == 0)
			rc = worker_wait(w, h);
		if (rc != 0)
			FAIL(rc, "allgather %s: %s", name, unisum_last_error());
		if ((rc = same(out, want, dt, total, "allgather", msg, len)) != 0)
			return rc;
		/* reduce-scatter: the sum's slice of this rank, then the average's */
		for (int avg = 0; avg < 2 && rc == 0; avg++) {
			fill(in, dt, total, rank, 60 + d);
			void *ref = reference(j, dt, total, 60 + d, avg);
			memset(out, 0x5a, total * es);
			if ((rc = worker_reduce_scatter_async(w, id, in, out, counts,
							      avg ? UNISUM_AVERAGE : 0, &h)) == 0)
				rc = worker_wait(w, h);
			if (rc != 0)
				snprintf(msg, len, "reduce_scatter %s: %s", name, unisum_last_error());
			else
				rc = same(out, (uint8_t *)ref + off[rank] * es, dt, counts[rank],
					  avg ? "reduce_scatter average" : "reduce_scatter", msg, len);
			free(ref);
		}
		free(in);
		free(out);
		free(want);
		if (rc != 0)
			return rc;

		/* alltoall: rank s sends counts[s][d] elements to rank d */
		uint64_t a2a[MAX_WORKERS * MAX_WORKERS], a2a_total = 0, sent = 0, got = 0;
		for (int s2 = 0; s2 < n; s2++)
			for (int d2 = 0; d2 < n; d2++) {
				a2a[s2 * n + d2] = (uint64_t)((s2 * 5 + d2 * 3 + d) % 4 == 0 ? 0 :
							      (size_t)(s2 * 97 + d2 * 41 + d) % (p + p / 2));
				a2a_total += a2a[s2 * n + d2];
			}
		for (int d2 = 0; d2 < n; d2++)
			sent += a2a[rank * n + d2];
		for (int s2 = 0; s2 < n; s2++)
			got += a2a[s2 * n + rank];
		snprintf(name, sizeof name, "alltoall.%d", d);
		id = worker_declare(w, name, dt, a2a_total, 0);
		if (id < 0)
			FAIL(id, "declare %s: %s", name, unisum_last_error());
		in = malloc(sent * es + 1);
		out = malloc(got * es + 1);
		want = malloc(got * es + 1);
		size_t at = 0;
		for (int d2 = 0; d2 < n; d2++)
			for (size_t i = 0; i < a2a[rank * n + d2]; i++)
				put(in, dt, at++, value(rank * 3 + d2, 70 + d, i));
		at = 0;
		for (int s2 = 0; s2 < n; s2++)
			for (size_t i = 0; i < a2a[s2 * n + rank]; i++)
				put(want, dt, at++, value(s2 * 3 + rank, 70 + d, i));
		if ((rc = worker_alltoall_async(w, id, in, out, a2a, &h)) == 0)
			rc = worker_wait(w, h);
		if (rc != 0)
			snprintf(msg, len, "alltoall %s: %s", name, unisum_last_error());
		else
			rc = same(out, want, dt, got, "alltoall", msg, len);
		free(in);
		free(out);
		free(want);
	}
	return rc;
}

/* What the gathering collectives move: with several machines, a local
 * root pulls only its machine's slice of a reduce-scatter and pushes only
 * its machine's rows of an allgather (give or take the two partitions
 * that straddle its edges), and pulls the allgather's other rows (a
 * worker alone on its machine copies its own; a root pulls them all, for
 * its local ranks); the other local ranks talk to no server. */
static int work_traffic(struct job *j, int rank, char *msg, size_t len)
{
	enum { N = 40000 };
	struct worker *w = j->w[rank];
	const int n = j->nworkers, L = j->local;
	uint64_t counts[MAX_WORKERS];
	for (int r = 0; r < n; r++)
		counts[r] = N / (uint64_t)n + (r == 0 ? N % (uint64_t)n : 0);
	int id = worker_declare(w, "traffic", UNISUM_FLOAT32, N, 0);
	if (id < 0)
		FAIL(id, "declare traffic: %s", unisum_last_error());
	float *in = calloc(N, sizeof(float)), *out = calloc(N, sizeof(float));
	uint64_t machine = 0;
	for (int r = rank / L * L; r < rank / L * L + L; r++)
		machine += counts[r] * sizeof(float);
	uint64_t slack = 2 * PART_BYTES, whole = N * sizeof(float);
	unisum_stats a, b, c;
	unisum_handle h;
	int rc = worker_get_stats(w, &a);
	if (rc == 0 && (rc = worker_reduce_scatter_async(w, id, in, out, counts, 0, &h)) == 0)
		rc = worker_wait(w, h);
	if (rc == 0)
		rc = worker_get_stats(w, &b);
	if (rc == 0 && (rc = worker_allgather_async(w, id, in, out, counts, &h)) == 0)
		rc = worker_wait(w, h);
	if (rc == 0)
		rc = worker_get_stats(w, &c);
	free(in);
	free(out);
	if (rc != 0)
		FAIL(rc, "traffic: %s", unisum_last_error());
	bool talks = j->machines > 1 && rank % L == 0;
	uint64_t rs_push = b.bytes_pushed - a.bytes_pushed, rs_pull = b.bytes_pulled - a.bytes_pulled;
	uint64_t ag_push = c.bytes_pushed - b.bytes_pushed, ag_pull = c.bytes_pulled - b.bytes_pulled;
	if (!talks && (rs_push | rs_pull | ag_push | ag_pull) != 0)
		FAIL(0, "rank %d is no machine's root or has no servers, yet moved %llu/%llu/%llu/%llu bytes",
		     rank, (unsigned long long)rs_push, (unsigned long long)rs_pull,
		     (unsigned long long)ag_push, (unsigned long long)ag_pull);
	if (talks && (rs_push != whole || rs_pull > machine + slack || rs_pull < machine ||
		      ag_push > machine + slack || ag_push < machine ||
		      ag_pull != (L == 1 ? whole - machine : whole)))
		FAIL(0, "rank %d: reduce-scatter pushed %llu and pulled %llu bytes, allgather pushed %llu "
		     "and pulled %llu; the machine's share is %llu of %llu", rank,
		     (unsigned long long)rs_push, (unsigned long long)rs_pull,
		     (unsigned long long)ag_push, (unsigned long long)ag_pull,
		     (unsigned long long)machine, (unsigned long long)whole);
	/* The counters of unisum_get_stats agree: two more operations, every
	 * pushed byte counted at the server it went to, and a machine of
	 * several ranks sums its slices in shared memory. */
	uint64_t to_servers = 0;
	for (int s = 0; s < c.nservers; s++)
		to_servers += c.server_bytes[s] - a.server_bytes[s];
	if (c.operations != a.operations + 2 || c.nservers != j->servers ||
	    to_servers != c.bytes_pushed - a.bytes_pushed ||
	    (L > 1 && c.local_bytes <= a.local_bytes) || (L == 1 && c.local_bytes != 0))
		FAIL(0, "rank %d: stats say %llu operations (from %llu), %d servers (of %d), %llu bytes "
		     "to servers of %llu pushed, %llu summed locally (from %llu)", rank,
		     (unsigned long long)c.operations, (unsigned long long)a.operations, c.nservers,
		     j->servers, (unsigned long long)to_servers,
		     (unsigned long long)(c.bytes_pushed - a.bytes_pushed),
		     (unsigned long long)c.local_bytes, (unsigned long long)a.local_bytes);
	return 0;
}

/* An allgather whose pulls go in ring phases (3 machines or more, one
 * worker each; test_job asks for the phases): rows of several partitions
 * and a rank with none (an empty phase), six rounds on one tensor, the
 * odd ones begun before their rows come (worker_allgather_begin, then
 * the rows late and in turns; the last in place, from its own rows in
 * `out`, the others from rows apart, which go out from `in` itself):
 * every element exact. */
static int work_phases(struct job *j, int rank, char *msg, size_t len)
{
	struct worker *w = j->w[rank];
	const int n = j->nworkers;
	const uint64_t p = PART_BYTES / sizeof(int32_t);
	uint64_t counts[MAX_WORKERS], off[MAX_WORKERS + 1] = {0};
	for (int r = 0; r < n; r++) {
		counts[r] = r % 3 == 1 ? 0 : r % 3 == 0 ? 13 * p + 3 : 5 * p + 1;
		off[r + 1] = off[r] + counts[r];
	}
	int id = worker_declare(w, "phases", UNISUM_INT32, off[n], 0);
	if (id < 0)
		FAIL(id, "declare phases: %s", unisum_last_error());
	int32_t *in = malloc(counts[rank] * sizeof *in + 1), *out = malloc(off[n] * sizeof *out);
	int rc = in == NULL || out == NULL ? UNISUM_ENOMEM : 0;
	for (int round = 0; round < 6 && rc == 0; round++) {
		memset(out, 0x5a, off[n] * sizeof *out);
		int32_t *rows = round == 5 ? out + off[rank] : in;
		for (uint64_t i = 0; i < counts[rank]; i++)
			rows[i] = value(rank, 70 + round, i);
		unisum_handle h;
		if (round % 2 == 1) {
			rc = worker_allgather_begin(w, id, out, counts, &h);
			if (rc == 0) {
				usleep(1000 * (useconds_t)((rank + round) % n));
				rc = worker_allgather_supply(w, h, counts[rank] > 0 ? rows : NULL);
			}
		} else {
			rc = worker_allgather_async(w, id, in, out, counts, &h);
		}
		if (rc == 0)
			rc = worker_wait(w, h);
		if (rc != 0)
			snprintf(msg, len, "phases round %d: %s", round, unisum_last_error());
		for (int r = 0; r < n && rc == 0; r++)
			for (uint64_t i = 0; i < counts[r] && rc == 0; i++)
				if (out[off[r] + i] != value(r, 70 + round, i)) {
					snprintf(msg, len, "phases round %d: rank %d's element %llu is %d, "
						 "not %d", round, r, (unsigned long long)i,
						 out[off[r] + i], value(r, 70 + round, i));
					rc = UNISUM_EINVAL;
				}
	}
	free(in);
	free(out);
	return rc;
}

/* Shapes: the same dimensions agree, and so does a declaration without
 * any; another shape of as many elements fails on every rank, naming
 * both. */
static int work_shapes(struct job *j, int rank, char *msg, size_t len)
{
	struct worker *w = j->w[rank];
	struct rdv_shape same = {.ndim = 2, .dims = {6, 7}};
	int id = worker_declare_shaped(w, "shape.same", UNISUM_FLOAT32, 42, &same, 0);
	if (id < 0)
		FAIL(id, "declare shape.same: %s", unisum_last_error());
	id = rank == 0 ? worker_declare(w, "shape.flat", UNISUM_FLOAT32, 42, 0)
		       : worker_declare_shaped(w, "shape.flat", UNISUM_FLOAT32, 42, &same, 0);
	if (id < 0)
		FAIL(id, "declare shape.flat: %s", unisum_last_error());
	struct rdv_shape other = {.ndim = 3, .dims = {6, 7, 1}};
	int rc = worker_declare_shaped(w, "shape.differs", UNISUM_FLOAT32, 42,
				       rank == j->nworkers - 1 ? &other : &same, 0);
	float in[42] = {0}, out[42];
	if (rc >= 0)
		rc = push_pull(w, rc, in, out, 0);
	if (rc != UNISUM_EMISMATCH)
		FAIL(0, "ranks declaring [6, 7] and [6, 7, 1] got %s, not UNISUM_EMISMATCH: %s",
		     unisum_strerror(rc), unisum_last_error());
	if (strstr(unisum_last_error(), "[6, 7") == NULL)
		FAIL(0, "the error does not name the shapes: %s", unisum_last_error());
	return 0;
}

/* unisum_barrier_timeout in slices: a wait that ran out stays in its
 * barrier, and the next call waits for that one, also when it ended in
 * between (it used to enter a new barrier then, one ahead of the other
 * workers for ever: a bench run hung so). */
static int work_barrier_slices(struct job *j, int rank, char *msg, size_t len)
{
	struct worker *w = j->w[rank];
	struct timespec pause = {.tv_sec = 0, .tv_nsec = 300 * 1000 * 1000};
	int rc;
	if (rank == 0) {
		if ((rc = worker_barrier_timeout(w, 0)) != 0)
			FAIL(rc, "a barrier the others had not entered returned %d, not 0", rc);
		nanosleep(&pause, NULL);
		nanosleep(&pause, NULL);	/* the others enter meanwhile: it ends */
		if ((rc = worker_barrier_timeout(w, 0)) != 1)
			FAIL(rc < 0 ? rc : 0, "a barrier that ended between two slices returned %d, "
			     "not 1", rc);
	} else {
		nanosleep(&pause, NULL);
		if ((rc = worker_barrier(w)) != 0)
			FAIL(rc, "barrier: %s", unisum_last_error());
	}
	if ((rc = worker_barrier(w)) != 0)	/* and the next is one barrier on every rank */
		FAIL(rc, "the barrier after: %s", unisum_last_error());
	return 0;
}

/* Ranks that pass different counts to an allgather fail on every rank
 * with UNISUM_EMISMATCH, like ranks that call different collectives. */
static int work_layout_disagree(struct job *j, int rank, char *msg, size_t len)
{
	enum { N = 3000 };
	struct worker *w = j->w[rank];
	const int n = j->nworkers;
	uint64_t counts[MAX_WORKERS] = {0};
	counts[0] = N - (uint64_t)(n - 1) * 10;
	for (int r = 1; r < n; r++)
		counts[r] = 10;
	if (rank == n - 1) {
		counts[0] -= 5;
		counts[n - 1] += 5;
	}
	int id = worker_declare(w, "layout", UNISUM_FLOAT32, N, 0);
	if (id < 0)
		FAIL(id, "declare layout: %s", unisum_last_error());
	float *in = calloc(N, sizeof(float)), *out = malloc(N * sizeof(float));
	unisum_handle h;
	int rc = worker_allgather_async(w, id, in, out, counts, &h);
	if (rc == 0)
		rc = worker_wait(w, h);
	free(in);
	free(out);
	if (rc != UNISUM_EMISMATCH)
		FAIL(0, "an allgather of different counts returned %s, not UNISUM_EMISMATCH: %s",
		     unisum_strerror(rc), unisum_last_error());
	if (strstr(unisum_last_error(), "layout") == NULL)
		FAIL(0, "the error does not name the layout: %s", unisum_last_error());
	/* Then an agreed layout runs on every rank, whichever rank's
	 * declaration of the refused one went through (its next cut has the
	 * same name on all). */
	in = malloc(N * sizeof(float));
	out = malloc(N * sizeof(float));
	for (int r = 0; r < n; r++)
		counts[r] = N / n + (r == 0 ? N % n : 0);
	for (uint64_t i = 0; i < counts[rank]; i++)
		in[i] = (float)value(rank, 90, (size_t)i);
	if ((rc = worker_allgather_async(w, id, in, out, counts, &h)) == 0)
		rc = worker_wait(w, h);
	for (int r = 0, base = 0; r < n && rc == 0; base += (int)counts[r], r++)
		for (uint64_t i = 0; i < counts[r] && rc == 0; i++)
			if (out[(uint64_t)base + i] != (float)value(r, 90, (size_t)i))
				rc = UNISUM_EINVAL;
	free(in);
	free(out);
	if (rc != 0)
		FAIL(rc, "an agreed allgather after a refused layout: %s", rc == UNISUM_EINVAL ?
		     "wrong rows" : unisum_last_error());
	return 0;
}

/* The sum (or average, or max) of tensor t over the ranks ranks[0..n). */
static void *subset_reference(const int *ranks, int n, unisum_dtype d, size_t count, int t,
			      int flags)
{
	void *ref = malloc(count * unisum_dtype_size(d) + 1);
	for (size_t i = 0; i < count; i++) {
		int acc = flags & UNISUM_MAX ? value(ranks[0], t, i) : 0;
		for (int k = 0; k < n; k++) {
			int v = value(ranks[k], t, i);
			acc = flags & UNISUM_MAX ? (v > acc ? v : acc) : acc + v;
		}
		put(ref, d, i, acc);
	}
	if (flags & UNISUM_AVERAGE)
		reducer_divide(ref, count, d, n);
	return ref;
}

/* Runs sum, average, max and a broadcast from its last member on process
 * set `set` (its ranks ranks[0..n), this rank among them) under tensor
 * names "ps.*", every dtype, sizes across partitions; checks each exactly.
 * Ranks of another set run the same names at the same time. */
static int ps_rounds(struct worker *w, int set, const int *ranks, int n, int rank, char *msg,
		     size_t len)
{
	static const int flags[3] = {0, UNISUM_AVERAGE, UNISUM_MAX};
	for (int d = 0; d < UNISUM_DTYPE_COUNT; d++) {
		unisum_dtype dt = (unisum_dtype)d;
		size_t es = unisum_dtype_size(dt), N = 3 * (PART_BYTES / es) + 5;
		char name[32];
		snprintf(name, sizeof name, "ps.%d", d);
		int id = worker_declare_in(w, set, name, dt, N, &(struct rdv_shape){.ndim = 2, .dims = {N, 1}},
					   0);
		if (id < 0)
			FAIL(id, "declare %s in set %d: %s", name, set, unisum_last_error());
		uint8_t *in = malloc(N * es + 1), *out = malloc(N * es + 1);
		for (int f = 0; f < 3; f++) {
			int t = 300 + 10 * d + f;
			fill(in, dt, N, rank, t);
			int rc = push_pull(w, id, in, out, flags[f]);
			void *want = subset_reference(ranks, n, dt, N, t, flags[f]);
			bool ok = rc == 0 && memcmp(out, want, N * es) == 0;
			free(want);
			if (!ok) {
				free(in);
				free(out);
				FAIL(rc, "set %d, %s flags 0x%x: %s", set, name, flags[f],
				     rc ? unisum_last_error() : "not the members' reduction");
			}
		}
		int root = ranks[n - 1];
		fill(in, dt, N, rank, 399);
		fill(out, dt, N, root, 399);
		unisum_handle h;
		int rc = worker_broadcast_async(w, id, in, root, &h);
		if (rc == 0)
			rc = worker_wait(w, h);
		bool ok = rc == 0 && memcmp(in, out, N * es) == 0;
		free(in);
		free(out);
		if (!ok)
			FAIL(rc, "set %d, %s broadcast from %d: %s", set, name, root,
			     rc ? unisum_last_error() : "not the root's values");
	}
	return 0;
}

/* Process sets: {0, last} and the ranks between run at the same time,
 * each its own sums under the same names; a non-member cannot declare in
 * a set, nor broadcast from outside it; the gathering collectives refuse
 * a set's tensor; then every rank sums on the global set, and the sets
 * are removed. */
static int work_process_sets(struct job *j, int rank, char *msg, size_t len)
{
	struct worker *w = j->w[rank];
	const int n = j->nworkers;
	int a[2] = {n - 1, 0}, b[MAX_WORKERS], nb = 0;	/* a: in any order */
	for (int r = 1; r < n - 1; r++)
		b[nb++] = r;
	int sa = worker_process_set_add(w, a, 2);
	int sb = nb > 0 ? worker_process_set_add(w, b, nb) : 0;
	if (sa != 1 || (nb > 0 && sb != 2))
		FAIL(sa < 0 ? sa : sb, "process_set_add gave ids %d and %d: %s", sa, sb,
		     unisum_last_error());
	if (worker_process_set_add(w, (int[]){0, n - 1}, 2) != UNISUM_EINVAL ||
	    worker_process_set_add(w, (int[]){0, n}, 2) != UNISUM_EINVAL ||
	    worker_process_set_add(w, (int[]){1, 1}, 2) != UNISUM_EINVAL)
		FAIL(0, "process_set_add took a set again, a rank out of the job, or a rank twice");
	bool in_a = rank == 0 || rank == n - 1;
	int rc;
	if (in_a) {
		int sorted[2] = {0, n - 1};
		rc = ps_rounds(w, sa, sorted, 2, rank, msg, len);
		if (rc != 0)
			return rc;
		int id = worker_declare_in(w, sa, "ps.0", UNISUM_FLOAT32, 3 * (PART_BYTES / 4) + 5,
					   &(struct rdv_shape){.ndim = 2, .dims = {3 * (PART_BYTES / 4) + 5, 1}}, 0);
		float x[4] = {0};
		unisum_handle h;
		if (n > 2 && worker_broadcast_async(w, id, x, 1, &h) != UNISUM_EINVAL)
			FAIL(0, "a broadcast from rank 1, outside the set, was taken");
		uint64_t counts[MAX_WORKERS] = {0};
		if (worker_allgather_async(w, id, x, x, counts, &h) != UNISUM_EINVAL ||
		    strstr(unisum_last_error(), "process set") == NULL)
			FAIL(0, "allgather on a set's tensor was taken, or not explained: %s",
			     unisum_last_error());
	} else {
		rc = ps_rounds(w, sb, b, nb, rank, msg, len);
		if (rc != 0)
			return rc;
		if (worker_declare_in(w, sa, "ps.x", UNISUM_FLOAT32, 4,
				      &(struct rdv_shape){.ndim = 1, .dims = {4}}, 0) != UNISUM_EINVAL ||
		    strstr(unisum_last_error(), "not in process set") == NULL)
			FAIL(0, "rank %d declared in a set it is not in: %s", rank, unisum_last_error());
	}
	/* The global set still sums over everyone. */
	enum { N = 5000 };
	int id = worker_declare(w, "ps.after", UNISUM_INT32, N, 0);
	if (id < 0)
		FAIL(id, "declare ps.after: %s", unisum_last_error());
	int32_t in[N], out[N];
	fill(in, UNISUM_INT32, N, rank, 398);
	rc = push_pull(w, id, in, out, 0);
	if (rc == 0)
		rc = check(j, out, UNISUM_INT32, N, 398, false, "global sum after sets", msg, len);
	else
		snprintf(msg, len, "ps.after: %s", unisum_last_error());
	if (rc != 0)
		return rc;
	if (worker_process_set_remove(w, sa) != 0 || (nb > 0 && worker_process_set_remove(w, sb) != 0))
		FAIL(0, "process_set_remove: %s", unisum_last_error());
	if (worker_process_set_remove(w, sa) != UNISUM_EINVAL)
		FAIL(0, "a removed set was removed again");
	return 0;
}

/* Join with uneven data: in pass p, rank r has 2 + (p ? n-1-r : r) steps
 * of a sum and an average; a rank out of steps joins, and its zeros stand
 * in for its data: every step's result is the sum over the ranks that
 * still had data (the average divides by the whole size, as Horovod's),
 * and a max of negative values and a product are those of the ranks with
 * data (a joined rank contributes the reduction's identity, not zeros).
 * The rank with the most steps then finds a broadcast refused (its last
 * step needed the others' zeros, so it has heard that they joined), and
 * every rank gets the last to join.  Twice, so the state resets. */
static int work_join(struct job *j, int rank, char *msg, size_t len)
{
	enum { N = 3000 };
	struct worker *w = j->w[rank];
	const int n = j->nworkers;
	int ids[4];
	ids[0] = worker_declare(w, "join.sum", UNISUM_INT32, N, 0);
	ids[1] = worker_declare(w, "join.avg", UNISUM_FLOAT64, N, 0);
	ids[2] = worker_declare(w, "join.max", UNISUM_FLOAT32, N, 0);
	ids[3] = worker_declare(w, "join.prod", UNISUM_INT64, N, 0);
	for (int k = 0; k < 4; k++)
		if (ids[k] < 0)
			FAIL(ids[k], "declare: %s", unisum_last_error());
	int32_t in[N], out[N], want[N];
	double din[N], dout[N];
	float fin[N], fout[N];
	int64_t lin[N], lout[N];
	for (int pass = 0; pass < 2; pass++) {
		int steps[MAX_WORKERS], most = 0;
		for (int q = 0; q < n; q++) {
			steps[q] = 2 + (pass ? n - 1 - q : q);
			most = steps[q] > steps[most] ? q : most;
		}
		for (int s = 0; s < steps[rank]; s++) {
			int t = 500 + 10 * pass + s;
			fill(in, UNISUM_INT32, N, rank, t);
			fill(din, UNISUM_FLOAT64, N, rank, t);
			for (size_t i = 0; i < N; i++) {
				fin[i] = -7.0f - (float)value(rank, t, i);	/* all below 0 */
				lin[i] = 1 + (value(rank, t, i) & 1);
			}
			int rc = push_pull(w, ids[0], in, out, 0);
			if (rc == 0)
				rc = push_pull(w, ids[1], din, dout, UNISUM_AVERAGE);
			if (rc == 0)
				rc = push_pull(w, ids[2], fin, fout, UNISUM_MAX);
			if (rc == 0)
				rc = push_pull(w, ids[3], lin, lout, UNISUM_PRODUCT);
			if (rc != 0)
				FAIL(rc, "pass %d step %d: %s", pass, s, unisum_last_error());
			for (size_t i = 0; i < N; i++) {
				int sum = 0;
				float max = -INFINITY;
				int64_t prod = 1;
				for (int q = 0; q < n; q++) {
					if (steps[q] <= s)
						continue;
					sum += value(q, t, i);
					float v = -7.0f - (float)value(q, t, i);
					max = v > max ? v : max;
					prod *= 1 + (value(q, t, i) & 1);
				}
				want[i] = sum;
				if (out[i] != want[i] || dout[i] != (double)sum / n)
					FAIL(0, "pass %d step %d element %zu: %d and %g, want %d and %g", pass,
					     s, i, out[i], dout[i], sum, (double)sum / n);
				if (fout[i] != max || lout[i] != prod)
					FAIL(0, "pass %d step %d element %zu: max %g and product %lld, want "
					     "%g and %lld", pass, s, i, fout[i], (long long)lout[i], max,
					     (long long)prod);
			}
		}
		if (rank == most) {
			unisum_handle h;
			int rc = worker_broadcast_async(w, ids[0], in, 0, &h);
			if (rc != UNISUM_EINVAL || strstr(unisum_last_error(), "joined") == NULL)
				FAIL(rc, "a broadcast while ranks had joined: %d (%s)",
				     rc, unisum_last_error());
		}
		int last = worker_join_wait(w);
		if (last < 0)
			FAIL(last, "pass %d: join: %s", pass, unisum_last_error());
		if (last != most)
			FAIL(0, "pass %d: join returned %d, want %d", pass, last, most);
	}
	/* Everyone is back: a plain sum over all. */
	fill(in, UNISUM_INT32, N, rank, 599);
	int rc = push_pull(w, ids[0], in, out, 0);
	if (rc == 0)
		rc = check(j, out, UNISUM_INT32, N, 599, false, "sum after join", msg, len);
	return rc;
}

/* A gathering collective in flight when a rank joins can never complete:
 * rank 0 starts an allgather, and only then (gather_started) do the
 * others join instead of gathering.  Rank 0's wait fails, naming the
 * join, within the test's time (it hung before), and rank 0 then joins
 * too. */
static atomic_int gather_started;

static int work_join_gather(struct job *j, int rank, char *msg, size_t len)
{
	enum { N = 4000 };
	struct worker *w = j->w[rank];
	const int n = j->nworkers;
	int id = worker_declare(w, "join.gather", UNISUM_INT32, (size_t)N * n, 0);
	if (id < 0)
		FAIL(id, "declare: %s", unisum_last_error());
	/* Every rank has declared it before it dies (a later declaration is
	 * refused, and that rank would never join). */
	int rc = worker_barrier(w);
	if (rc != 0)
		FAIL(rc, "barrier: %s", unisum_last_error());
	if (rank == 0) {
		int32_t in[N] = {0};
		int32_t *out = malloc((size_t)N * n * sizeof *out);
		uint64_t counts[MAX_WORKERS];
		for (int q = 0; q < n; q++)
			counts[q] = N;
		unisum_handle h;
		rc = worker_allgather_async(w, id, in, out, counts, &h);
		atomic_store(&gather_started, 1);
		if (rc == 0)
			rc = worker_wait(w, h);
		free(out);
		if (rc == 0 || strstr(unisum_last_error(), "joined") == NULL)
			FAIL(0, "an allgather in flight while the others joined: %d (%s)", rc,
			     unisum_last_error());
	} else {
		while (atomic_load(&gather_started) == 0)
			sched_yield();
	}
	int last = worker_join_wait(w);
	if (last < 0)
		FAIL(last, "join: %s", unisum_last_error());
	if (last >= n)
		FAIL(0, "join returned %d, not a rank of %d", last, n);
	/* The tensor died with that allgather: a later one, of a layout every
	 * rank agrees on, fails on every rank (rank 0 would declare the
	 * tensor's second layout, the others its first: it used to wait for
	 * them for ever). */
	int32_t *in = calloc(2 * N, sizeof *in), *out = malloc((size_t)N * n * sizeof *out);
	uint64_t counts[MAX_WORKERS];
	for (int q = 0; q < n; q++)
		counts[q] = q == 0 ? 2 * N : q == 1 ? 0 : N;
	unisum_handle h;
	rc = worker_allgather_async(w, id, in, out, counts, &h);
	if (rc == 0) {
		rc = worker_poll_timeout(w, h, 10000);
		if (rc == 0)
			FAIL(0, "an allgather of the tensor that died with a join is still waiting "
			     "after 10 s");
		rc = rc == 1 ? 0 : rc;
	}
	free(in);
	free(out);
	if (rc == 0 || strstr(unisum_last_error(), "joined") == NULL)
		FAIL(0, "an allgather of the tensor that died with a join: %d (%s)", rc,
		     unisum_last_error());
	return 0;
}

/* A name undeclared by every worker and declared again is a new tensor,
 * whose rounds start at 0: a rank that joins runs them for the others
 * even though it ran rounds 0-2 of the old one (its ring of retired names
 * tells them apart by their declaration's key; it used to skip them, and
 * the others waited for ever). */
static int work_join_relife(struct job *j, int rank, char *msg, size_t len)
{
	enum { N = 1000 };
	struct worker *w = j->w[rank];
	const int n = j->nworkers;
	int32_t in[N], out[N];
	int id = worker_declare(w, "relife", UNISUM_INT32, N, 0);
	if (id < 0)
		FAIL(id, "declare: %s", unisum_last_error());
	for (int s = 0; s < 3; s++) {
		fill(in, UNISUM_INT32, N, rank, 700 + s);
		int rc = push_pull(w, id, in, out, 0);
		if (rc != 0)
			FAIL(rc, "first life, step %d: %s", s, unisum_last_error());
	}
	int rc = worker_undeclare(w, id);
	if (rc == 0)
		rc = worker_barrier(w);	/* every RETIRE is in before any new DECLARE */
	if (rc != 0)
		FAIL(rc, "undeclare: %s", unisum_last_error());
	if (rank != n - 1) {
		id = worker_declare(w, "relife", UNISUM_INT32, N, 0);
		if (id < 0)
			FAIL(id, "declare again: %s", unisum_last_error());
		fill(in, UNISUM_INT32, N, rank, 710);
		rc = push_pull(w, id, in, out, 0);
		if (rc != 0)
			FAIL(rc, "second life: %s", unisum_last_error());
		for (size_t i = 0; i < N; i++) {
			int sum = 0;
			for (int q = 0; q < n - 1; q++)
				sum += value(q, 710, i);
			if (out[i] != sum)
				FAIL(0, "second life, element %zu: %d, want %d", i, out[i], sum);
		}
	}
	int last = worker_join_wait(w);
	if (last < 0)
		FAIL(last, "join: %s", unisum_last_error());
	return 0;
}

/* Async: rank 0's first push sets the value (the others' are dropped, and
 * every rank gets rank 0's); then every rank adds its deltas for ROUNDS
 * rounds, all at once, no rank waiting for another.  Every pulled value is
 * whole per partition (each delta adds the same to every element, so a
 * partition's elements are equal unless a pull saw half of a delta), and
 * once everyone is done the value is the initial one plus every delta,
 * exactly, in int64 and in float32.  Other collectives are refused on an
 * async tensor, and so is a name declared in two modes. */
static int work_async(struct job *j, int rank, char *msg, size_t len)
{
	enum { ROUNDS = 30 };
	struct worker *w = j->w[rank];
	const int n = j->nworkers;
	const unisum_dtype dts[2] = {UNISUM_INT64, UNISUM_FLOAT32};
	for (int d = 0; d < 2; d++) {
		unisum_dtype dt = dts[d];
		size_t es = unisum_dtype_size(dt), N = 3 * (PART_BYTES / es) + 5;
		char name[32];
		snprintf(name, sizeof name, "async.%d", d);
		int id = worker_declare_sync(w, name, dt, N, 0, "async");
		if (id < 0)
			FAIL(id, "declare %s async: %s", name, unisum_last_error());
		uint8_t *in = malloc(N * es), *out = malloc(N * es);
		for (size_t i = 0; i < N; i++)
			put(in, dt, i, rank == 0 ? 1000 : -77);
		int rc = push_pull(w, id, in, out, 0);
		/* Rank 0's value, plus whatever deltas others added already. */
		for (size_t i = 0; rc == 0 && i < N; i++)
			if (get(out, dt, i) < 1000)
				FAIL(0, "%s: the first pull gave %lld at %zu, not rank 0's 1000 (plus "
				     "deltas)", name, (long long)get(out, dt, i), i);
		pthread_mutex_lock(&w->lock);
		const struct wk_layout *L = &w->tensors[id]->cuts[0];
		pthread_mutex_unlock(&w->lock);
		for (int s = 0; rc == 0 && s <= ROUNDS; s++) {
			if (s > 0) {	/* round 0 checks the first pull */
				for (size_t i = 0; i < N; i++)
					put(in, dt, i, (rank + 1) * s);
				rc = push_pull(w, id, in, out, 0);
			}
			for (uint32_t p = 0; rc == 0 && p < L->nparts; p++) {
				uint64_t lo = L->parts[p].offset, hi = lo + L->parts[p].count;
				for (uint64_t i = lo + 1; i < hi; i++)
					if (get(out, dt, i) != get(out, dt, lo))
						FAIL(0, "%s round %d: partition %u is torn: %lld at %llu, %lld at "
						     "%llu", name, s, p, (long long)get(out, dt, lo),
						     (unsigned long long)lo, (long long)get(out, dt, i),
						     (unsigned long long)i);
			}
		}
		if (rc == 0)
			rc = worker_barrier(w);	/* every delta is in */
		for (size_t i = 0; i < N; i++)
			put(in, dt, i, 0);
		if (rc == 0)
			rc = push_pull(w, id, in, out, 0);
		long long want = 1000 + (long long)n * (n + 1) / 2 * (ROUNDS * (ROUNDS + 1) / 2);
		for (size_t i = 0; rc == 0 && i < N; i++)
			if (get(out, dt, i) != want)
				FAIL(0, "%s: the final value is %lld at %zu, want %lld", name,
				     (long long)get(out, dt, i), i, want);
		unisum_handle h;
		if (rc == 0 && (push_pull(w, id, in, out, UNISUM_AVERAGE) != UNISUM_EINVAL ||
				worker_broadcast_async(w, id, in, 0, &h) != UNISUM_EINVAL ||
				strstr(unisum_last_error(), "async") == NULL))
			FAIL(0, "%s: an average or a broadcast on an async tensor was taken", name);
		if (rc == 0 && worker_declare(w, name, dt, N, 0) != UNISUM_EMISMATCH)
			FAIL(0, "%s: declared lock-step after async on one worker", name);
		free(in);
		free(out);
		if (rc != 0)
			FAIL(rc, "%s: %s", name, unisum_last_error());
	}
	/* Two workers, two modes: the scheduler refuses the later. */
	int rc = 0;
	if (rank == 0 && worker_declare(w, "async.two", UNISUM_INT32, 10, 0) < 0)
		FAIL(0, "declare async.two lock-step: %s", unisum_last_error());
	rc = worker_barrier(w);
	if (rc == 0 && rank == 1) {
		rc = worker_declare_sync(w, "async.two", UNISUM_INT32, 10, 0, "async");
		if (rc != UNISUM_EMISMATCH || strstr(unisum_last_error(), "sync mode") == NULL)
			FAIL(0, "async.two declared async after lock-step: %d (%s)", rc,
			     unisum_last_error());
		rc = 0;
	}
	if (worker_declare_sync(w, "async.bad", UNISUM_INT32, 10, 0, "ssp:x") != UNISUM_EINVAL)
		FAIL(0, "an unknown sync mode was taken");
	return rc;
}

/* SSP with staleness S: the last rank holds back its first delta until
 * the others have each finished S steps without it (had they been held
 * sooner, it would wait for ever: the test fails after 20 s); their step
 * S + 1 must not return before it pushes (ssp_released); at the end the
 * value is exact. */
static atomic_int ssp_done, ssp_released;

static int work_ssp(struct job *j, int rank, char *msg, size_t len)
{
	enum { S = 2, N = 1000 };
	struct worker *w = j->w[rank];
	const int n = j->nworkers, slow = n - 1;
	int id = worker_declare_sync(w, "ssp.x", UNISUM_INT64, N, 0, "ssp:2");
	if (id < 0)
		FAIL(id, "declare ssp.x: %s", unisum_last_error());
	int64_t in[N], out[N];
	for (size_t i = 0; i < N; i++)
		in[i] = rank == 0 ? 1000 : 5;
	int rc = push_pull(w, id, in, out, 0);
	if (rc == 0)
		rc = worker_barrier(w);	/* every rank has its first value */
	if (rc != 0)
		FAIL(rc, "ssp first value: %s", unisum_last_error());
	for (size_t i = 0; i < N; i++)
		in[i] = rank + 1;
	if (rank == slow) {
		for (int i = 0; atomic_load(&ssp_done) < n - 1; i++) {
			if (i > 20000)
				FAIL(0, "the others did not finish %d steps while rank %d had none", S, slow);
			usleep(1000);
		}
		usleep(100000);	/* they are held in step S + 1 now */
		atomic_store(&ssp_released, 1);
		for (int s = 0; rc == 0 && s <= S; s++)
			rc = push_pull(w, id, in, out, 0);
	} else {
		for (int s = 0; rc == 0 && s < S; s++)
			rc = push_pull(w, id, in, out, 0);
		atomic_fetch_add(&ssp_done, 1);
		if (rc == 0)
			rc = push_pull(w, id, in, out, 0);
		if (rc == 0 && !atomic_load(&ssp_released))
			FAIL(0, "step %d returned before rank %d pushed its first delta (staleness %d)",
			     S + 1, slow, S);
	}
	if (rc == 0)
		rc = worker_barrier(w);
	for (size_t i = 0; i < N; i++)
		in[i] = 0;
	if (rc == 0)
		rc = push_pull(w, id, in, out, 0);
	if (rc != 0)
		FAIL(rc, "ssp: %s", unisum_last_error());
	int64_t want = 1000 + (int64_t)(S + 1) * n * (n + 1) / 2;
	for (size_t i = 0; i < N; i++)
		if (out[i] != want)
			FAIL(0, "ssp: the final value is %lld at %zu, want %lld", (long long)out[i], i,
			     (long long)want);
	return 0;
}

/* Divide-and-shuffle (dssync:2, every 3rd step global, two racks by the
 * machine's parity (job_start_with: servers by theirs), crossing them
 * every 2nd step): at each step a rank's push_pull averages over its
 * group of that step alone (computed here with the same function, seed,
 * step and racks), and every third over all; the averages are exact in
 * float64.  A group within a rack is placed on that rack's servers. */
/* The server of a partition of the set tensor of dssync tensor `name` for
 * group[0..m) that is not in `rack` (-1: none; -2: no such tensor). */
static int dssync_foreign_server(struct worker *w, const char *name, const int *group, int m,
				 int rack)
{
	int bad = -2;
	char part[64];
	snprintf(part, sizeof part, "/%s@", name);
	pthread_mutex_lock(&w->lock);
	for (int t = 0; t < w->ntensors; t++) {
		const struct wk_tensor *tt = w->tensors[t];
		if (tt == NULL || tt->nranks != m || strstr(tt->name, part) == NULL ||
		    memcmp(tt->ranks, group, (size_t)m * sizeof *group) != 0)
			continue;
		bad = -1;
		for (uint32_t p = 0; p < tt->cuts[0].nparts; p++)
			if ((int)tt->cuts[0].servers[p] % 2 != rack)
				bad = (int)tt->cuts[0].servers[p];
	}
	pthread_mutex_unlock(&w->lock);
	return bad;
}

/* UNISUM_DSSYNC_KEEP for work_dssync: 1 (a group's tensor stays when the
 * group comes back next step), then 0 (it goes after every step: the same
 * group then declares a new tensor at once, while the scheduler may still
 * count the old one's undeclares). */
static int dssync_keep_now;

static int work_dssync(struct job *j, int rank, char *msg, size_t len)
{
	enum { N = 700, STEPS = 12, G = 2, EVERY = 3 };
	struct worker *w = j->w[rank];
	const int n = j->nworkers;
	w->cfg.dssync_every = EVERY;
	w->cfg.dssync_cross_every = 2;
	w->cfg.dssync_keep = dssync_keep_now;
	const char *name = dssync_keep_now ? "dssync.k1" : "dssync.k0";
	int racks[MAX_WORKERS];
	for (int q = 0; q < n; q++)
		racks[q] = (q / j->local) % 2;
	struct wk_dssync_topo topo = {.rack = racks, .cross_every = 2};
	int id = worker_declare_sync(w, name, UNISUM_FLOAT64, N, 0, "dssync:2");
	if (id < 0)
		FAIL(id, "declare %s: %s", name, unisum_last_error());
	if (worker_declare_sync(w, name, UNISUM_FLOAT64, N, 0, "dssync:3") != UNISUM_EMISMATCH)
		FAIL(0, "%s declared again with another group size", name);
	char job[128];
	config_job_id(&w->cfg, job, sizeof job);
	uint64_t seed = wk_name_hash(job);
	double in[N], out[N];
	int group[MAX_WORKERS];
	for (int s = 0; s < STEPS; s++) {
		for (size_t i = 0; i < N; i++)
			in[i] = rank * 10 + s + (double)i;
		int rc = push_pull(w, id, in, out, UNISUM_AVERAGE);
		if (rc != 0)
			FAIL(rc, "dssync step %d: %s", s, unisum_last_error());
		bool global = (s + 1) % EVERY == 0;
		int m = global ? n : wk_dssync_group(seed, (uint64_t)s, n, G, rank, &topo, group);
		for (int k = 0; !global && !wk_dssync_crosses(&topo, (uint64_t)s) && k < m; k++)
			if (racks[group[k]] != racks[rank])
				FAIL(0, "dssync step %d: rank %d's group holds rank %d of another rack", s,
				     rank, group[k]);
		bool keep = false;	/* UNISUM_DSSYNC_KEEP = 1: comes back next step */
		int next[MAX_WORKERS];
		if (dssync_keep_now && !global && (s + 2) % EVERY != 0)
			keep = wk_dssync_group(seed, (uint64_t)s + 1, n, G, rank, &topo, next) == m &&
			       memcmp(next, group, (size_t)m * sizeof *group) == 0;
		int bad = global ? -1 : dssync_foreign_server(w, name, group, m, racks[rank]);
		if (!global && (bad == -2) == keep)
			FAIL(0, "dssync step %d: rank %d's group's tensor is %s, but its group %s next "
			     "step", s, rank, bad == -2 ? "gone" : "still declared",
			     keep ? "comes back" : "does not come back");
		/* Within a rack that has a server, it lies on that rack's alone. */
		if (bad >= 0 && !wk_dssync_crosses(&topo, (uint64_t)s) && racks[rank] < j->servers)
			FAIL(0, "dssync step %d: rank %d's group (rack %d) has a partition on server "
			     "%d, of rack %d", s, rank, racks[rank], bad, bad % 2);
		double sum = 0;
		for (int k = 0; k < m; k++)
			sum += (global ? k : group[k]) * 10 + s;
		for (size_t i = 0; i < N; i++)
			if (out[i] != sum / m + (double)i)
				FAIL(0, "dssync step %d (%s): %g at %zu, want the mean of %d ranks %g", s,
				     global ? "global" : "group", out[i], i, m, sum / m + (double)i);
	}
	return 0;
}

/* ---- the tests ----------------------------------------------------------- */

/* Sums, many, broadcast and one-shot tensors on one job. */
static void run_all(int machines, int local, int servers, uint64_t credit, int ipc)
{
	struct job j;
	job_start(&j, machines, local, servers, credit, ipc);
	each_rank(&j, work_main, work_sums);
	each_rank(&j, work_main, work_many);
	each_rank(&j, work_main, work_broadcast);
	each_rank(&j, work_main, work_once);
	each_rank(&j, work_main, work_collectives);
	each_rank(&j, work_main, work_traffic);
	if (local == 1)		/* begin: one worker a machine */
		each_rank(&j, work_main, work_phases);
	each_rank(&j, work_main, work_process_sets);
	each_rank(&j, work_main, work_join);
	atomic_store(&gather_started, 0);
	each_rank(&j, work_main, work_join_gather);
	each_rank(&j, work_main, work_join_relife);
	each_rank(&j, work_main, work_async);
	atomic_store(&ssp_done, 0);
	atomic_store(&ssp_released, 0);
	each_rank(&j, work_main, work_ssp);
	dssync_keep_now = 1;
	each_rank(&j, work_main, work_dssync);
	dssync_keep_now = 0;
	each_rank(&j, work_main, work_dssync);
	job_stop(&j);
}

/* The groups of divide-and-shuffle: at every step a partition of the
 * ranks into runs of at most G (each rank in exactly one, the same seen
 * from every member), and not the same partition at every step; with
 * racks (rank % 3), within racks except every 3rd step, which mixes them
 * at least once. */
static void test_dssync_groups(void **state)
{
	(void)state;
	static const int ns[] = {1, 3, 4, 5, 8, 16}, gs[] = {1, 2, 3, 4};
	int rack[16];
	for (int r = 0; r < 16; r++)
		rack[r] = r % 3;
	const struct wk_dssync_topo racked = {.rack = rack, .cross_every = 3};
	for (size_t a = 0; a < sizeof ns / sizeof ns[0] * 2; a++) {
		int n = ns[a % (sizeof ns / sizeof ns[0])];
		const struct wk_dssync_topo *topo = a < sizeof ns / sizeof ns[0] ? NULL : &racked;
		for (size_t b = 0; b < sizeof gs / sizeof gs[0]; b++) {
			int mixed = 0;
			int g = gs[b], changed = 0, first[16];
			for (uint64_t step = 0; step < 40; step++) {
				int seen[16] = {0};
				for (int r = 0; r < n; r++) {
					int mine[16], m = wk_dssync_group(42, step, n, g, r, topo, mine);
					assert_true(m >= 1 && m <= g);
					bool self = false;
					for (int k = 0; k < m; k++) {
						self = self || mine[k] == r;
						if (topo != NULL && !wk_dssync_crosses(topo, step))
							assert_int_equal(rack[mine[k]], rack[r]);
						mixed |= rack[mine[k]] != rack[r];
						int theirs[16];
						int mt = wk_dssync_group(42, step, n, g, mine[k], topo, theirs);
						assert_int_equal(mt, m);
						assert_memory_equal(theirs, mine, (size_t)m * sizeof *mine);
						if (k > 0)
							assert_true(mine[k] > mine[k - 1]);
					}
					assert_true(self);
					seen[r] = 1;
					if (step == 0 && r == 0)
						memcpy(first, mine, (size_t)m * sizeof *mine), first[15] = m;
					if (r == 0 && step > 0 &&
					    (m != first[15] || memcmp(first, mine, (size_t)m * sizeof *mine)))
						changed = 1;
				}
				for (int r = 0; r < n; r++)
					assert_true(seen[r]);
			}
			if (n > g && g > 1 && (topo == NULL || n > 3))
				assert_true(changed);	/* rank 0's group moved at least once */
			if (topo != NULL && n >= 3 && g > 1)
				assert_true(mixed);	/* some group crossed racks */
		}
	}
}

/* With 2 racks of 4 and groups of 4 (bench/cluster/sync's cluster), a step
 * that crosses racks moves one member of each rack's group to the other:
 * every group has 3 of one rack and 1 of the other, a different one from
 * step to step; and with 2 racks of 8 and groups of 4, each of the 4
 * groups has 3 of one rack and 1 of the other, and the 2 groups of a rack
 * send their travellers to different groups; with racks of 5, the groups
 * of one stay alone and the others still swap. */
static void test_dssync_travellers(void **state)
{
	(void)state;
	for (int per = 4; per <= 8; per += 4) {
		int n = 2 * per, rack[16];
		for (int r = 0; r < n; r++)
			rack[r] = r / per;
		const struct wk_dssync_topo topo = {.rack = rack, .cross_every = 2};
		int travellers_seen[16] = {0};
		for (uint64_t step = 1; step < 40; step += 2) {
			assert_true(wk_dssync_crosses(&topo, step));
			for (int r = 0; r < n; r++) {
				int mine[16], m = wk_dssync_group(7, step, n, 4, r, &topo, mine);
				assert_int_equal(m, 4);
				int own = 0;
				for (int k = 0; k < m; k++)
					own += rack[mine[k]] == rack[r];
				/* r is one of the 3 of the group's rack, or its traveller */
				assert_true(own == 3 || own == 1);
				if (own == 1)
					travellers_seen[r] = 1;
				int majority = own == 3 ? rack[r] : 1 - rack[r];
				int count = 0;
				for (int k = 0; k < m; k++)
					count += rack[mine[k]] == majority;
				assert_int_equal(count, 3);
			}
		}
		int distinct = 0;
		for (int r = 0; r < n; r++)
			distinct += travellers_seen[r];
		assert_true(distinct > 2);	/* not always the same members travel */
	}
	/* Racks of 5, groups of 4: each rack's group of 4 swaps a member with
	 * the other's, its group of one stays alone (it used to force the
	 * full shuffle). */
	int rack[10];
	for (int r = 0; r < 10; r++)
		rack[r] = r / 5;
	const struct wk_dssync_topo topo = {.rack = rack, .cross_every = 1};
	for (uint64_t step = 0; step < 20; step++) {
		int fours = 0;
		for (int r = 0; r < 10; r++) {
			int mine[16], m = wk_dssync_group(9, step, 10, 4, r, &topo, mine);
			assert_true(m == 4 || m == 1);
			if (m == 1)
				continue;
			fours++;
			int own = 0;
			for (int k = 0; k < m; k++)
				own += rack[mine[k]] == rack[r];
			assert_true(own == 3 || own == 1);
		}
		assert_int_equal(fours, 8);
	}
}

static void test_one_machine(void **state)
{
	(void)state;
	run_all(1, 3, 1, 4 * PART_BYTES, 1);
}

static void test_machines_of_two_ipc(void **state)
{
	(void)state;
	run_all(2, 2, 2, 4 * PART_BYTES, 1);
}

static void test_one_per_machine_tcp(void **state)
{
	(void)state;
	run_all(3, 1, 3, 4 * PART_BYTES, 0);
}

static void test_one_per_machine_ipc(void **state)
{
	(void)state;
	run_all(2, 1, 1, 4 * PART_BYTES, 1);
}

/* One machine, every tensor staged through the ranks' arenas instead of
 * read by cross-memory attach. */
static void stage_everything(struct config *cfg)
{
	cfg->local_stage_bytes = 1;
}

static void test_one_machine_staged(void **state)
{
	(void)state;
	struct job j;
	job_start_with(&j, 1, 4, 1, 4 * PART_BYTES, 1, stage_everything);
	each_rank(&j, work_main, work_sums);
	each_rank(&j, work_main, work_many);
	each_rank(&j, work_main, work_broadcast);
	job_stop(&j);
}

/* Buffers from worker_alloc (unisum_alloc): the machine's ranks sum each
 * other's arenas with plain loads and stores. */
static void test_arena_buffers(void **state)
{
	(void)state;
	struct job j;
	job_start(&j, 1, 3, 1, 4 * PART_BYTES, 1);
	void *p = worker_alloc(j.w[0], 64);
	assert_non_null(p);	/* the arena is there: the path below is taken */
	unisum_free(p);
	j.alloc = true;
	each_rank(&j, work_main, work_sums);
	job_stop(&j);
	job_start(&j, 2, 2, 2, 4 * PART_BYTES, 1);
	j.alloc = true;
	each_rank(&j, work_main, work_sums);
	job_stop(&j);
}

/* Fit mode over TCP: worker 0 meters its pushes, the partition size and
 * credit change from the third round on, every sum stays exact. */
static void fit_mode(struct config *cfg)
{
	cfg->autotune = 2;
	cfg->partition_bytes = 4096000;
	cfg->credit_bytes = 4 * 4096000;
}

static void test_fit_mode(void **state)
{
	(void)state;
	struct job j;
	job_start_with(&j, 2, 1, 2, 0, 0, fit_mode);
	each_rank(&j, work_main, work_rounds);
	/* What fit mode chose: not the configured setting (its credit is 8
	 * partitions or twice the bandwidth-delay product, never the
	 * configured 4), and the same on every worker. */
	unisum_stats st[2];
	for (int r = 0; r < 2; r++)
		assert_int_equal(worker_get_stats(j.w[r], &st[r]), 0);
	print_message("fit mode chose partitions of %llu bytes and a credit of %llu\n",
		      (unsigned long long)st[0].partition_bytes,
		      (unsigned long long)st[0].credit_bytes);
	assert_true(st[0].partition_bytes <= 4096000 && st[0].partition_bytes >= 128 * 1024);
	assert_true(st[0].credit_bytes != 4 * 4096000);
	assert_true(st[0].credit_bytes >= 8 * st[0].partition_bytes);
	assert_int_equal(st[1].partition_bytes, st[0].partition_bytes);
	assert_int_equal(st[1].credit_bytes, st[0].credit_bytes);
	job_stop(&j);
}

/* A credit of one partition: one push in flight per worker at a time. */
/* An allgather whose `in` lies at the start of `out` on every rank (as
 * unisum.h allows), where the other ranks' rows land: each rank's rows
 * must go out as they were, though its pushes wait for credit while the
 * pulls arrive.  Then a second allgather on the tensor while the first is
 * in flight (rank 0, before the others start): refused with UNISUM_EBUSY,
 * and the first's output untouched by it. */
static atomic_int gather_busy_tried;

static int work_gather_aliased(struct job *j, int rank, char *msg, size_t len)
{
	enum { N = 16 * PART_BYTES / 4 };	/* int32 rows per rank: 16 partitions */
	struct worker *w = j->w[rank];
	const int n = j->nworkers;
	int id = worker_declare(w, "gather.aliased", UNISUM_INT32, (size_t)N * n, 0);
	if (id < 0)
		FAIL(id, "declare: %s", unisum_last_error());
	uint64_t counts[MAX_WORKERS];
	for (int r = 0; r < n; r++)
		counts[r] = N;
	int32_t *out = malloc((size_t)N * n * 4), other[N];
	int rc = 0;
	for (int round = 0; round < 3 && rc == 0; round++) {
		for (int i = 0; i < N; i++)
			out[i] = value(rank, 70 + round, (size_t)i);
		unisum_handle h;
		if ((rc = worker_allgather_async(w, id, out, out, counts, &h)) == 0)
			rc = worker_wait(w, h);
		if (rc != 0)
			FAIL(rc, "aliased allgather: %s", unisum_last_error());
		for (int r = 0; r < n && rc == 0; r++)
			for (int i = 0; i < N && rc == 0; i++)
				if (out[(size_t)r * N + i] != value(r, 70 + round, (size_t)i))
					FAIL(0, "aliased allgather round %d: rank %d's row %d is %d, not %d",
					     round, r, i, out[(size_t)r * N + i], value(r, 70 + round, (size_t)i));
	}
	if (rank != 0) {
		while (atomic_load(&gather_busy_tried) == 0)
			sched_yield();
	}
	int32_t *in = malloc((size_t)N * 4);
	for (int i = 0; i < N; i++) {
		in[i] = value(rank, 80, (size_t)i);
		other[i] = -1;
	}
	unisum_handle h, h2;
	if ((rc = worker_allgather_async(w, id, in, out, counts, &h)) != 0)
		FAIL(rc, "allgather: %s", unisum_last_error());
	if (rank == 0) {
		int rc2 = worker_allgather_async(w, id, other, out, counts, &h2);
		atomic_store(&gather_busy_tried, 1);
		if (rc2 != UNISUM_EBUSY) {
			worker_wait(w, h);
			FAIL(0, "a second allgather on a busy tensor returned %s, not UNISUM_EBUSY",
			     unisum_strerror(rc2));
		}
	}
	if ((rc = worker_wait(w, h)) != 0)
		FAIL(rc, "allgather: %s", unisum_last_error());
	for (int r = 0; r < n; r++)
		for (int i = 0; i < N; i++)
			if (out[(size_t)r * N + i] != value(r, 80, (size_t)i))
				FAIL(0, "after a refused allgather: rank %d's row %d is %d, not %d", r, i,
				     out[(size_t)r * N + i], value(r, 80, (size_t)i));
	free(in);
	free(out);
	return 0;
}

static void test_credit_of_one_partition(void **state)
{
	(void)state;
	struct job j;
	job_start(&j, 2, 1, 2, PART_BYTES, 0);
	each_rank(&j, work_main, work_many);
	atomic_store(&gather_busy_tried, 0);
	each_rank(&j, work_main, work_gather_aliased);
	job_stop(&j);
	/* Over IPC a push is read from the worker's memory later still. */
	job_start(&j, 2, 1, 2, PART_BYTES, 1);
	atomic_store(&gather_busy_tried, 0);
	each_rank(&j, work_main, work_gather_aliased);
	job_stop(&j);
}

/* Ranks that declare one name with two dtypes, then reduce-scatter it:
 * the ranks whose declaration went through run on the tensor's homed cut
 * (NAME#0), which the others never declare; that cut is poisoned with the
 * tensor, so every rank fails with UNISUM_EMISMATCH at once instead of
 * waiting out the stall limit. */
static int work_cut_of_poisoned(struct job *j, int rank, char *msg, size_t len)
{
	enum { N = 3000 };
	struct worker *w = j->w[rank];
	int32_t in[N], out[N];
	unisum_dtype d = rank == j->nworkers - 1 ? UNISUM_FLOAT32 : UNISUM_INT32;
	fill(in, d, N, rank, 410);
	uint64_t counts[MAX_WORKERS];
	for (int q = 0; q < j->nworkers; q++)
		counts[q] = N / j->nworkers + (q == 0 ? N % j->nworkers : 0);
	int id = worker_declare(w, "rs.bad", d, N, 0);
	int rc = id;
	if (id >= 0) {
		unisum_handle h;
		rc = worker_reduce_scatter_async(w, id, in, out, counts, 0, &h);
		if (rc == 0)
			rc = worker_wait(w, h);
	}
	if (rc != UNISUM_EMISMATCH)
		FAIL(0, "a reduce-scatter of a tensor declared with two dtypes returned %s, not "
		     "UNISUM_EMISMATCH: %s", unisum_strerror(rc), unisum_last_error());
	return 0;
}

static void test_disagreement(void **state)
{
	(void)state;
	struct job j;
	job_start(&j, 2, 2, 1, 4 * PART_BYTES, 1);
	each_rank(&j, work_main, work_disagree);
	each_rank(&j, work_main, work_layout_disagree);
	each_rank(&j, work_main, work_barrier_slices);
	each_rank(&j, work_main, work_shapes);
	each_rank(&j, work_main, work_cut_of_poisoned);
	job_stop(&j);
}

/* Leaving with pushes in flight: leave waits for them. */
struct in_flight {
	float *in, *out;
};

static struct in_flight flights[MAX_WORKERS];

static int work_start_only(struct job *j, int rank, char *msg, size_t len)
{
	enum { N = 1 << 18 };
	struct worker *w = j->w[rank];
	int id = worker_declare(w, "flight", UNISUM_FLOAT32, N, 0);
	if (id < 0)
		FAIL(id, "declare flight: %s", unisum_last_error());
	flights[rank].in = malloc(N * sizeof(float));
	flights[rank].out = calloc(N, sizeof(float));
	fill(flights[rank].in, UNISUM_FLOAT32, N, rank, 500);
	unisum_handle h;
	int rc = worker_push_pull_async(w, id, flights[rank].in, flights[rank].out, 0, &h);
	if (rc != 0)
		FAIL(rc, "push_pull flight: %s", unisum_last_error());
	return 0;
}

static void test_leave_in_flight(void **state)
{
	(void)state;
	struct job j;
	job_start(&j, 2, 2, 2, 4 * PART_BYTES, 1);
	each_rank(&j, work_main, work_start_only);
	job_stop(&j);
	char msg[256] = "";
	for (int r = 0; r < j.nworkers; r++) {
		int rc = check(&j, flights[r].out, UNISUM_FLOAT32, 1 << 18, 500, false, "flight", msg,
			       sizeof msg);
		if (rc != 0)
			print_error("rank %d: %s\n", r, msg);
		assert_int_equal(rc, 0);
		free(flights[r].in);
		free(flights[r].out);
	}
}

int main(void)
{
	/* The configuration comes from the tests, not from the environment. */
	extern char **environ;
	for (char **e = environ; *e;)
		if (strncmp(*e, "UNISUM_", 7) == 0 || strncmp(*e, "DMLC_", 5) == 0 ||
		    strncmp(*e, "BYTEPS_", 7) == 0) {
			char name[256];
			snprintf(name, sizeof name, "%.*s", (int)(strcspn(*e, "=")), *e);
			unsetenv(name);
		} else {
			e++;
		}
	/* TEST_JOB_FILTER=PATTERN runs the matching tests only. */
	if (getenv("TEST_JOB_FILTER") != NULL)
		cmocka_set_test_filter(getenv("TEST_JOB_FILTER"));
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_dssync_groups),
		cmocka_unit_test(test_dssync_travellers),
		cmocka_unit_test(test_one_machine),
		cmocka_unit_test(test_machines_of_two_ipc),
		cmocka_unit_test(test_one_per_machine_tcp),
		cmocka_unit_test(test_one_per_machine_ipc),
		cmocka_unit_test(test_one_machine_staged),
		cmocka_unit_test(test_arena_buffers),
		cmocka_unit_test(test_credit_of_one_partition),
		cmocka_unit_test(test_fit_mode),
		cmocka_unit_test(test_disagreement),
		cmocka_unit_test(test_leave_in_flight),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
