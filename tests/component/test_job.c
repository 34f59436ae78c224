/*
 * test_job.c - whole jobs in one process (job.h), as Gloo tests its
 * collectives: a scheduler, servers on threads and every worker a handle
 * (worker.h) on its own thread, over real loopback sockets, the IPC
 * transport and the machines' shared memory.  Cheap enough to run the
 * corners the integration tests reach only slowly, and under the
 * sanitizers.  The training features (process sets, join, asynchronous
 * handles, stale-synchronous and divide-and-shuffle training) are
 * test_job_training.c's.
 *
 * tests/scenarios (shared with check_sums, on worker handles here):
 *   - every dtype, at sizes on each side of the partition boundaries,
 *     summed and averaged, in place and out of place, on one machine (the
 *     local reduce only), on machines of several workers (the local
 *     reduce, then the servers over IPC) and one worker per machine over
 *     TCP and over IPC; the same staged through the ranks' arenas, and
 *     with buffers from the machine's arenas (worker_alloc);
 *   - 48 tensors in flight at once, also under a credit of one
 *     partition, so every push waits for credit to come back;
 *   - a broadcast from every root;
 *   - one-shot tensors (a new name each), declared, summed and
 *     undeclared, ids reused;
 *   - ranks that disagree on a collective mid-job (within a machine, on a
 *     job of two machines): every rank fails with UNISUM_EMISMATCH, soon
 *     (within half the job's stall limit: no refusal waits it out), naming
 *     both sides, its output untouched (as unisum.h says: but for a local
 *     root's machine sum), and the next tensor sums;
 *   - fit mode (UNISUM_AUTOTUNE=2) over TCP: the setting changes after
 *     the first rounds, every sum stays exact.
 * Their inputs and reference are the scenarios' (exact bits, summed in
 * the servers' order).
 *
 * Here, on small integers exact in every dtype and any order (job.h):
 *   - min, max and product of every dtype, and uneven allgather,
 *     reduce-scatter (sum and average) and alltoall of every dtype, some
 *     ranks with nothing, slices ending inside partitions, and the bytes
 *     they move (a machine pulls only its slice of a reduce-scatter,
 *     pushes only its rows of an allgather); an allgather
 *     whose ranks pass different counts fails on all of them;
 *   - an allgather whose input aliases its output under a credit of one
 *     partition; ranks that disagree on a layout or a dtype;
 *   - leaving with operations in flight: worker_leave waits for them, and
 *     their sums are right.
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

#include "job.h"
#include "scenarios.h"
#include "reducer/reducer.h"
#include "worker/worker_int.h"	/* a tensor's cut, divide-and-shuffle's groups */

/* ---- the shared scenarios (tests/scenarios) on worker handles ------------- */

/* One rank of a job, as the scenarios see it. */
struct job_rank {
	struct job *j;
	struct worker *w;
};

static int jr_declare(void *ctx, const char *name, unisum_dtype dt, size_t count, int priority)
{
	return worker_declare(((struct job_rank *)ctx)->w, name, dt, count, priority);
}

static int jr_push_pull_async(void *ctx, int t, const void *in, void *out, int flags,
			      unisum_handle *h)
{
	return worker_push_pull_async(((struct job_rank *)ctx)->w, t, in, out, flags, h);
}

static int jr_poll(void *ctx, unisum_handle h)
{
	return worker_poll_timeout(((struct job_rank *)ctx)->w, h, 0);
}

static int jr_wait(void *ctx, unisum_handle h)
{
	return worker_wait(((struct job_rank *)ctx)->w, h);
}

static int jr_broadcast_async(void *ctx, int t, void *buf, int root, unisum_handle *h)
{
	return worker_broadcast_async(((struct job_rank *)ctx)->w, t, buf, root, h);
}

static int jr_undeclare(void *ctx, int t)
{
	return worker_undeclare(((struct job_rank *)ctx)->w, t);
}

/* From the machine's arena when the job says so (j->alloc), else malloc. */
static void *jr_alloc(void *ctx, size_t bytes, bool input)
{
	struct job_rank *c = ctx;
	(void)input;
	return buffer(c->j, c->w, bytes);
}

static void jr_free(void *ctx, void *p)
{
	(void)ctx;
	unisum_free(p);
}

static struct scn_ops job_ops(struct job_rank *c, struct job *j, int rank)
{
	*c = (struct job_rank){.j = j, .w = j->w[rank]};
	return (struct scn_ops){
		.ctx = c, .rank = rank, .size = j->nworkers, .local_size = j->local,
		.machines = j->machines, .partition_bytes = PART_BYTES,
		.refuse_ms = scn_refuse_ms(j->cfg.timeout_ms, j->cfg.stall_abort_ms),
		.declare = jr_declare, .push_pull_async = jr_push_pull_async, .poll = jr_poll,
		.wait = jr_wait, .broadcast_async = jr_broadcast_async, .undeclare = jr_undeclare,
		.alloc = jr_alloc, .free = jr_free, .digest = SCN_DIGEST_START,
	};
}

/* A work_fn running scenario CALL (on `o`, the rank's table). */
#define SCENARIO(fn, CALL)                                                                         \
	static int fn(struct job *j, int rank, char *msg, size_t len)                              \
	{                                                                                          \
		struct job_rank c;                                                                 \
		struct scn_ops o = job_ops(&c, j, rank);                                           \
		return CALL;                                                                       \
	}

SCENARIO(work_sums, scn_sums(&o, false, msg, len))
SCENARIO(work_many, scn_many(&o, 48, msg, len))
SCENARIO(work_broadcast, scn_broadcast(&o, msg, len))
SCENARIO(work_once, scn_once(&o, 60, msg, len))
SCENARIO(work_disagree, scn_disagree(&o, msg, len))
/* 8 rounds of a 2 MiB tensor */
SCENARIO(work_rounds, scn_rounds(&o, UNISUM_FLOAT32, 1 << 19, 8, msg, len))

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

/* Min, max and product of dtype d on tensor ops.d, checked exactly. */
static int collective_ops(struct job *j, int rank, int d, char *msg, size_t len)
{
	struct worker *w = j->w[rank];
	const int n = j->nworkers;
	unisum_dtype dt = (unisum_dtype)d;
	size_t es = unisum_dtype_size(dt), N = 3 * (PART_BYTES / es) + 5;
	char name[64];
	int rc = 0;
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
	return rc;
}

/* An allgather of dtype d in one uneven layout on tensor gather.d, then a
 * reduce-scatter (sum and average) of the same layout, checked exactly. */
static int collective_gather(struct job *j, int rank, int d, char *msg, size_t len)
{
	struct worker *w = j->w[rank];
	const int n = j->nworkers;
	unisum_dtype dt = (unisum_dtype)d;
	size_t es = unisum_dtype_size(dt), p = PART_BYTES / es;
	char name[64];
	int rc = 0;
	uint64_t counts[MAX_WORKERS], total = 0, off[MAX_WORKERS + 1] = {0};
	for (int r = 0; r < n; r++) {
		counts[r] = layout_count(r, d, p);
		off[r + 1] = off[r] + counts[r];
	}
	total = off[n];
	snprintf(name, sizeof name, "gather.%d", d);
	int id = worker_declare(w, name, dt, total, 0);
	if (id < 0)
		FAIL(id, "declare %s: %s", name, unisum_last_error());
	uint8_t *in = malloc(total * es + 1), *out = malloc(total * es + 1);
	uint8_t *want = malloc(total * es + 1);
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
		snprintf(msg, len, "allgather %s: %s", name, unisum_last_error());
	else
		rc = same(out, want, dt, total, "allgather", msg, len);
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
	return rc;
}

/* An alltoall of dtype d on tensor alltoall.d: rank s sends a2a[s][d2]
 * elements to rank d2, some none; checked exactly. */
static int collective_alltoall(struct job *j, int rank, int d, char *msg, size_t len)
{
	struct worker *w = j->w[rank];
	const int n = j->nworkers;
	unisum_dtype dt = (unisum_dtype)d;
	size_t es = unisum_dtype_size(dt), p = PART_BYTES / es;
	char name[64];
	int rc = 0;
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
	int id = worker_declare(w, name, dt, a2a_total, 0);
	if (id < 0)
		FAIL(id, "declare %s: %s", name, unisum_last_error());
	uint8_t *in = malloc(sent * es + 1), *out = malloc(got * es + 1), *want = malloc(got * es + 1);
	size_t at = 0;
	for (int d2 = 0; d2 < n; d2++)
		for (size_t i = 0; i < a2a[rank * n + d2]; i++)
			put(in, dt, at++, value(rank * 3 + d2, 70 + d, i));
	at = 0;
	for (int s2 = 0; s2 < n; s2++)
		for (size_t i = 0; i < a2a[s2 * n + rank]; i++)
			put(want, dt, at++, value(s2 * 3 + rank, 70 + d, i));
	unisum_handle h;
	if ((rc = worker_alltoall_async(w, id, in, out, a2a, &h)) == 0)
		rc = worker_wait(w, h);
	if (rc != 0)
		snprintf(msg, len, "alltoall %s: %s", name, unisum_last_error());
	else
		rc = same(out, want, dt, got, "alltoall", msg, len);
	free(in);
	free(out);
	free(want);
	return rc;
}

/* Min, max and product of every dtype, then an uneven allgather,
 * reduce-scatter (sum and average) and alltoall of every dtype, checked
 * exactly against references computed here; dtype by dtype. */
static int work_collectives(struct job *j, int rank, char *msg, size_t len)
{
	int rc = 0;
	for (int d = 0; d < UNISUM_DTYPE_COUNT && rc == 0; d++) {
		rc = collective_ops(j, rank, d, msg, len);
		if (rc == 0)
			rc = collective_gather(j, rank, d, msg, len);
		if (rc == 0)
			rc = collective_alltoall(j, rank, d, msg, len);
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


/* ---- the tests ----------------------------------------------------------- */

/* The scenarios, then the collectives, on one job. */
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
	job_stop(&j);
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
 * credit change from the fourth round on, every sum stays exact. */
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
	job_test_setup();
	const struct CMUnitTest tests[] = {
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
