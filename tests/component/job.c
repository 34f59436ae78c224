/*
 * job.c - whole jobs in one process for the component tests (job.h).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <unistd.h>

#include <cmocka.h>

#include "job.h"
#include "log/log.h"
#include "reducer/reducer.h"
#include "server/server.h"
#include "transport/transport.h"

/* Every job's UNISUM_TRANSPORT (job_test_setup). */
static char job_transport[8] = "tcp";

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

void *work_main(void *arg)
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
void each_rank(struct job *j, void *(*start)(void *), work_fn fn)
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
void job_start_with(struct job *j, int machines, int local, int servers, uint64_t credit,
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
	snprintf(j->cfg.transport, sizeof j->cfg.transport, "%s", job_transport);
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

void job_start(struct job *j, int machines, int local, int servers, uint64_t credit,
		      int ipc)
{
	job_start_with(j, machines, local, servers, credit, ipc, NULL);
}

void job_stop(struct job *j)
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
int value(int r, int t, size_t i)
{
	return (int)((r * 7 + i * 3 + (size_t)t * 5) % 13) - 6;
}

void put(void *buf, unisum_dtype d, size_t i, int v)
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
long long get(const void *buf, unisum_dtype d, size_t i)
{
	return d == UNISUM_INT64 ? (long long)((const int64_t *)buf)[i]
				 : (long long)((const float *)buf)[i];
}

void fill(void *buf, unisum_dtype d, size_t n, int r, int t)
{
	for (size_t i = 0; i < n; i++)
		put(buf, d, i, value(r, t, i));
}

/* The job's sum of tensor t (divided by the size for an average). */
void *reference(const struct job *j, unisum_dtype d, size_t n, int t, bool average)
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
int check(const struct job *j, const void *out, unisum_dtype d, size_t n, int t,
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

/* A buffer of w's: from its machine's arena when the job says so and the
 * arena has room (freed with unisum_free, which tells them apart). */
void *buffer(struct job *j, struct worker *w, size_t bytes)
{
	void *p = j->alloc ? worker_alloc(w, bytes + 1) : NULL;
	return p != NULL ? p : malloc(bytes + 1);
}

/* A push_pull of w, waited for. */
int push_pull(struct worker *w, int tensor, const void *in, void *out, int flags)
{
	unisum_handle h;
	int rc = worker_push_pull_async(w, tensor, in, out, flags, &h);
	return rc != 0 ? rc : worker_wait(w, h);
}

void job_test_setup(void)
{
	/* TEST_JOB_TRANSPORT=ucx runs every job's links over UCX. */
	const char *tp = getenv("TEST_JOB_TRANSPORT");
	if (tp != NULL)
		snprintf(job_transport, sizeof job_transport, "%s", tp);
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
}
