/*
 * test_job_training.c - whole jobs in one process (job.h) for the
 * training features, on one machine (the local reduce only), on machines
 * of several workers and one worker per machine over TCP and over IPC:
 *
 *   - process sets: sums, averages and maxima over subsets of the ranks,
 *     and broadcasts within them, beside the global set;
 *   - join: ranks that run out of data join while the others go on
 *     (their contributions zero, or nothing for min and max), then the
 *     job sums again; an allgather begun before a join; a rank that
 *     joins, then lives again;
 *   - asynchronous handles polled and waited in any order;
 *   - stale-synchronous training and divide-and-shuffle training, whose
 *     groups are also checked alone (wk_dssync_group).
 *
 * Values are small integers, exact in every dtype and any order of
 * summation, so the reference is the plain sum.
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
#include "reducer/reducer.h"
#include "worker/worker_int.h"	/* a tensor's cut, divide-and-shuffle's groups */

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

/* What a step of work_join pulled: its sum, average, max and product. */
struct join_out {
	const int32_t *sum;
	const double *avg;
	const float *max;
	const int64_t *prod;
};

/* 0 when step s of pass `pass` (tensor 500 + 10 * pass + s) pulled the
 * sums, averages, maxima and products of the ranks that still had data
 * (steps[q] > s), else an error in msg. */
static int join_check(const struct join_out *got, size_t N, int n, const int *steps, int pass,
		      int s, char *msg, size_t len)
{
	int t = 500 + 10 * pass + s;
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
		if (got->sum[i] != sum || got->avg[i] != (double)sum / n)
			FAIL(0, "pass %d step %d element %zu: %d and %g, want %d and %g", pass, s, i,
			     got->sum[i], got->avg[i], sum, (double)sum / n);
		if (got->max[i] != max || got->prod[i] != prod)
			FAIL(0, "pass %d step %d element %zu: max %g and product %lld, want %g and "
			     "%lld", pass, s, i, got->max[i], (long long)got->prod[i], max,
			     (long long)prod);
	}
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
	int32_t in[N], out[N];
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
			struct join_out got = {out, dout, fout, lout};
			if ((rc = join_check(&got, N, n, steps, pass, s, msg, len)) != 0)
				return rc;
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

/* What a joined rank does with an announced gathering collective's round:
 * rank 0 still pulling it as a faster rank joined (a race in make test's
 * load: test_torch's join.py).  Every rank gathers round 0; the others
 * join, and rank 0 announces round 0 to them, as it would had its pull
 * been late: they ran it, so the tensor lives, and round 1 completes
 * everywhere.  Then rank 0 announces round 2, which nobody ran: the
 * joined ranks poison the tensor, and round 2 fails on every rank, naming
 * the join. */
static void announce_gather_round(struct worker *w, int id, uint32_t round)
{
	pthread_mutex_lock(&w->lock);
	while (!w->join_seen) {	/* the scheduler has a joined rank to pass it to */
		pthread_mutex_unlock(&w->lock);
		usleep(1000);
		pthread_mutex_lock(&w->lock);
	}
	const struct wk_tensor *t = w->tensors[id];
	struct rdv_announce a = {.dtype = t->dtype, .count = t->count, .round = round,
				 .wire_op = WIRE_OP(WIRE_OP_ALLGATHER, 0), .life = t->life,
				 .key = t->cuts[0].key, .shape = t->shape};
	snprintf(a.name, sizeof a.name, "%s", t->name);
	pthread_mutex_unlock(&w->lock);
	assert_int_equal(rdv_client_announce(w->rdv, &a), 0);
}

/* One allgather round of tensor `id` (each rank's 1000 elements): 0, or
 * the error (a result gathered wrongly is UNISUM_EPROTO). */
static int gather_round(struct worker *w, int id, int rank, int n)
{
	enum { N = 1000 };
	int32_t in[N], *out = malloc((size_t)N * n * sizeof *out);
	uint64_t counts[MAX_WORKERS];
	for (int q = 0; q < n; q++)
		counts[q] = N;
	for (int i = 0; i < N; i++)
		in[i] = rank * N + i;
	unisum_handle h;
	int rc = out == NULL ? UNISUM_ENOMEM : worker_allgather_async(w, id, in, out, counts, &h);
	if (rc == 0)
		rc = worker_wait(w, h);
	for (int i = 0; rc == 0 && i < N * n; i++)
		if (out[i] != i)
			rc = UNISUM_EPROTO;
	free(out);
	return rc;
}

static int work_join_gather_ran(struct job *j, int rank, char *msg, size_t len)
{
	struct worker *w = j->w[rank];
	const int n = j->nworkers;
	int id = worker_declare(w, "join.gather.ran", UNISUM_INT32, (size_t)1000 * n, 0);
	if (id < 0)
		FAIL(id, "declare: %s", unisum_last_error());
	for (int phase = 0; phase < 2; phase++) {
		int rc = gather_round(w, id, rank, n);
		if (rc != 0)
			FAIL(rc, "allgather before join %d: %s", phase, unisum_last_error());
		/* Round 0 ran everywhere; round 3 (after rounds 1 and 2) nowhere. */
		if (rank == 0)
			announce_gather_round(w, id, phase == 0 ? 0 : 3);
		int last = worker_join_wait(w);
		if (last < 0)
			FAIL(last, "join: %s", unisum_last_error());
		if (phase == 0) {
			if ((rc = gather_round(w, id, rank, n)) != 0)
				FAIL(rc, "an allgather after a join whose announced round every rank "
				     "ran: %s", unisum_last_error());
			continue;
		}
		/* The poison travels joined rank -> scheduler -> servers, behind
		 * the join's end: the barrier lets it reach them, and a round that
		 * beat it there anyway is a round every rank ran. */
		if ((rc = worker_barrier(w)) != 0)
			FAIL(rc, "barrier: %s", unisum_last_error());
		for (int k = 0; k < 50 && rc == 0; k++)
			rc = gather_round(w, id, rank, n);
		if (rc == 0 || strstr(unisum_last_error(), "joined") == NULL)
			FAIL(0, "allgathers after a join whose announced round no joined rank ran: "
			     "%d (%s)", rc, unisum_last_error());
	}
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

/* work_async's tensor async.d of dtype dt (see there). */
static int async_tensor(struct job *j, int rank, int d, unisum_dtype dt, char *msg, size_t len)
{
	enum { ROUNDS = 30 };
	struct worker *w = j->w[rank];
	const int n = j->nworkers;
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
	struct worker *w = j->w[rank];
	const unisum_dtype dts[2] = {UNISUM_INT64, UNISUM_FLOAT32};
	for (int d = 0; d < 2; d++) {
		int rc = async_tensor(j, rank, d, dts[d], msg, len);
		if (rc != 0)
			return rc;
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

/* Every training feature here on one job. */
static void run_all(int machines, int local, int servers, uint64_t credit, int ipc)
{
	struct job j;
	job_start(&j, machines, local, servers, credit, ipc);
	each_rank(&j, work_main, work_process_sets);
	each_rank(&j, work_main, work_join);
	atomic_store(&gather_started, 0);
	each_rank(&j, work_main, work_join_gather);
	each_rank(&j, work_main, work_join_gather_ran);
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


int main(void)
{
	job_test_setup();
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_dssync_groups),
		cmocka_unit_test(test_dssync_travellers),
		cmocka_unit_test(test_one_machine),
		cmocka_unit_test(test_machines_of_two_ipc),
		cmocka_unit_test(test_one_per_machine_tcp),
		cmocka_unit_test(test_one_per_machine_ipc),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
