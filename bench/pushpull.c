/*
 * pushpull.c - one job's push_pull time for a gradient set of a given size,
 * the unisum side of bench/cluster/compare and bench/scale.sh.
 *
 *   bench_pushpull [--mib M] [--tensors T] [--iters I] [--warmup K] [--small N]
 *
 * Run as every worker of a job (under `unisum launch`).  Each worker
 * declares T float32 tensors that together hold M MiB (default 64 MiB in
 * one tensor), fills element j of tensor t on rank r with
 * (j + t) mod 251 + r, so every sum is exact in float32, and times I
 * iterations after K warm-ups.  An iteration is a barrier, then every
 * tensor's push_pull started at once and waited for; its time is the
 * slowest rank's (each rank's time goes through one more push_pull).  Rank
 * 0 prints
 *
 *   pushpull workers=W bytes=B tensors=T iters=I median_s=.. min_s=.. max_s=.. first_s=.. p99_s=..
 *
 * first_s is rank 0's time from calling unisum_init to the end of the first
 * push_pull (joining the job, declaring, the first barrier and round): what
 * the first step of a training job pays, probing included.  p99_s is the
 * ceil(0.99 I)-th time (the slowest when I < 100).
 *
 * With PUSHPULL_T0 set (a CLOCK_REALTIME time in seconds, taken just
 * before the launch), every rank measures from it to the end of its own
 * first push_pull, and rank 0 also prints
 *
 *   pushpull_launch workers=W first_max_s=.. first_median_s=..
 *
 * With --small N, N more iterations follow on a 4-byte tensor (one
 * float32, rank r gives r + 1), timed the same way:
 *
 *   pushpull_small workers=W bytes=4 iters=N median_s=.. p99_s=..
 *
 * Every rank checks its results exactly; any wrong element exits 1.  With
 * PUSHPULL_VERBOSE set, rank 0 first prints every iteration's time.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "timing.h"
#include "unisum.h"

static int fail(const char *what)
{
	fprintf(stderr, "bench_pushpull: %s: %s\n", what, unisum_last_error());
	return 1;
}

/* This job's ranks, and the tensor that carries one double per rank. */
struct bench {
	int rank, size, times_id;
	double *times, *all;	/* size doubles each: this rank's slot, everyone's */
	double last_end;	/* now() when the last timed push_pull ended */
};

/* Everyone's `value` into b->all (a push_pull of the per-rank slots).
 * The largest, or -1 on an error. */
static double gather(struct bench *b, double value)
{
	memset(b->times, 0, (size_t)b->size * sizeof *b->times);
	b->times[b->rank] = value;
	if (unisum_push_pull(b->times_id, b->times, b->all, 0) != 0)
		return -1;
	double most = 0;
	for (int r = 0; r < b->size; r++)
		most = b->all[r] > most ? b->all[r] : most;
	return most;
}

/* One timed iteration of tensors ids[0..n): a barrier, every push_pull
 * started, every one waited for.  The slowest rank's seconds, or -1 on an
 * error. */
static double timed_round(struct bench *b, int n, const int *ids, float **in, float **out,
			  unisum_handle *h)
{
	if (unisum_barrier() != 0)
		return -1;
	double t0 = now();
	for (int t = 0; t < n; t++)
		if (unisum_push_pull_async(ids[t], in[t], out[t], 0, &h[t]) != 0)
			return -1;
	for (int t = 0; t < n; t++)
		if (unisum_wait(h[t]) != 0)
			return -1;
	b->last_end = now();
	return gather(b, b->last_end - t0);
}

/* The ceil(0.99 n)-th of sorted v[0..n). */
static double p99(const double *v, int n)
{
	return v[(n * 99 + 99) / 100 - 1];
}

/* Seconds since the epoch (PUSHPULL_T0's clock). */
static double wall_clock(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* With PUSHPULL_T0: every rank's time from it to the end of its first
 * push_pull (`done`, on the wall clock); rank 0 prints their largest and
 * median.  0 or 1 on an error. */
static int report_launch(struct bench *b, double done)
{
	const char *t0 = getenv("PUSHPULL_T0");
	if (t0 == NULL || t0[0] == '\0')
		return 0;
	double most = gather(b, done - atof(t0));
	if (most < 0)
		return fail("push_pull times");
	if (b->rank == 0) {
		qsort(b->all, (size_t)b->size, sizeof *b->all, cmp_double);
		printf("pushpull_launch workers=%d first_max_s=%.3f first_median_s=%.3f\n", b->size,
		       most, b->all[b->size / 2]);
	}
	return 0;
}

/* --small N: N timed iterations of a 4-byte tensor, checked exactly;
 * rank 0 prints their median and p99.  0 or 1. */
static int run_small(struct bench *b, int iters)
{
	if (iters <= 0)
		return 0;
	float in = (float)(b->rank + 1), out = 0, *pin = &in, *pout = &out;
	int id = unisum_declare("pushpull.small", UNISUM_FLOAT32, 1, -1);
	double *s = calloc((size_t)iters, sizeof *s);
	unisum_handle h;
	if (id < 0 || s == NULL)
		return fail("declare small");
	for (int it = 0; it < iters + 1; it++) {	/* one warm-up */
		double t = timed_round(b, 1, &id, &pin, &pout, &h);
		if (t < 0)
			return fail("push_pull small");
		if (it > 0)
			s[it - 1] = t;
	}
	if ((double)out != (double)b->size * (b->size + 1) / 2) {
		fprintf(stderr, "bench_pushpull: rank %d: the 4-byte sum is %g\n", b->rank,
			(double)out);
		return 1;
	}
	qsort(s, (size_t)iters, sizeof *s, cmp_double);
	if (b->rank == 0)
		printf("pushpull_small workers=%d bytes=4 iters=%d median_s=%.6f p99_s=%.6f\n", b->size,
		       iters, s[iters / 2], p99(s, iters));
	free(s);
	return 0;
}

/* Element j of tensor t, as rank r gives it. */
static float input_of(size_t j, int t, int r)
{
	return (float)((j + (size_t)t) % 251 + (size_t)r);
}

/* Checks every element of out[0..tensors) exactly: the number wrong. */
static size_t check(const struct bench *b, float **out, size_t total, size_t per, int tensors)
{
	/* sum over r of ((j + t) mod 251 + r) */
	double rsum = (double)b->size * (b->size - 1) / 2;
	size_t wrong = 0;
	for (int t = 0; t < tensors; t++) {
		size_t n = t == tensors - 1 ? total - per * (size_t)(tensors - 1) : per;
		for (size_t j = 0; j < n; j++) {
			double want = (double)input_of(j, t, 0) * b->size + rsum;
			if ((double)out[t][j] != want && wrong++ < 3)
				fprintf(stderr, "bench_pushpull: rank %d tensor %d element %zu is %g, not %g\n",
					b->rank, t, j, (double)out[t][j], want);
		}
	}
	return wrong;
}

struct opts {
	double mib;
	int tensors, iters, warmup, small;
};

static int parse(int argc, char **argv, struct opts *o)
{
	*o = (struct opts){.mib = 64, .tensors = 1, .iters = 5, .warmup = 2};
	for (int i = 1; i + 1 < argc; i += 2) {
		int *field = strcmp(argv[i], "--tensors") == 0 ? &o->tensors
			     : strcmp(argv[i], "--iters") == 0 ? &o->iters
			     : strcmp(argv[i], "--warmup") == 0 ? &o->warmup
			     : strcmp(argv[i], "--small") == 0 ? &o->small : NULL;
		if (strcmp(argv[i], "--mib") == 0) {
			o->mib = atof(argv[i + 1]);
		} else if (field != NULL) {
			*field = atoi(argv[i + 1]);
		} else {
			fprintf(stderr, "bench_pushpull: unknown option %s\n", argv[i]);
			return 2;
		}
	}
	if (o->mib <= 0 || o->tensors < 1 || o->iters < 1 || o->warmup < 0 || o->small < 0) {
		fprintf(stderr, "usage: bench_pushpull [--mib M] [--tensors T] [--iters I] "
				"[--warmup K] [--small N]\n");
		return 2;
	}
	return 0;
}

int main(int argc, char **argv)
{
	struct opts o;
	if (parse(argc, argv, &o) != 0)
		return 2;
	double init_t0 = now(), first_s = 0;
	if (unisum_init() != 0)
		return fail("init");
	struct bench b = {.rank = unisum_rank(), .size = unisum_size()};
	int tensors = o.tensors, iters = o.iters;
	size_t total = (size_t)(o.mib * 1024 * 1024 / sizeof(float)), per = total / (size_t)tensors;
	float **in = calloc((size_t)tensors, sizeof *in), **out = calloc((size_t)tensors, sizeof *out);
	int *ids = calloc((size_t)tensors, sizeof *ids);
	unisum_handle *h = calloc((size_t)tensors, sizeof *h);
	b.times = calloc((size_t)b.size, sizeof *b.times);
	b.all = calloc((size_t)b.size, sizeof *b.all);
	double *iter_s = calloc((size_t)iters, sizeof *iter_s), done = 0;
	if (!in || !out || !ids || !h || !b.times || !b.all || !iter_s)
		return fail("out of memory");
	for (int t = 0; t < tensors; t++) {
		size_t n = t == tensors - 1 ? total - per * (size_t)(tensors - 1) : per;
		char name[64];
		snprintf(name, sizeof name, "pushpull.%d", t);
		/* later tensors first, as backward produces them */
		ids[t] = unisum_declare(name, UNISUM_FLOAT32, n, t);
		in[t] = malloc(n * sizeof(float));
		out[t] = calloc(n, sizeof(float));
		if (ids[t] < 0 || !in[t] || !out[t])
			return fail("declare");
		for (size_t j = 0; j < n; j++)
			in[t][j] = input_of(j, t, b.rank);
	}
	if ((b.times_id = unisum_declare("pushpull.times", UNISUM_FLOAT64, (size_t)b.size, -1)) < 0)
		return fail("declare times");
	for (int it = 0; it < o.warmup + iters; it++) {
		double slowest = timed_round(&b, tensors, ids, in, out, h);
		if (slowest < 0)
			return fail("push_pull");
		if (it == 0) {	/* the first push_pull's end, not the gather's */
			first_s = b.last_end - init_t0;
			done = wall_clock() - (now() - b.last_end);
		}
		if (it >= o.warmup)
			iter_s[it - o.warmup] = slowest;
	}
	if (report_launch(&b, done) != 0 || run_small(&b, o.small) != 0)
		return 1;
	size_t wrong = check(&b, out, total, per, tensors);
	if (b.rank == 0 && getenv("PUSHPULL_VERBOSE") != NULL) {
		printf("pushpull iterations:");
		for (int i = 0; i < iters; i++)
			printf(" %.4f", iter_s[i]);
		printf("\n");
	}
	if (b.rank == 0) {
		qsort(iter_s, (size_t)iters, sizeof *iter_s, cmp_double);
		printf("pushpull workers=%d bytes=%zu tensors=%d iters=%d median_s=%.4f min_s=%.4f "
		       "max_s=%.4f first_s=%.4f p99_s=%.4f\n", b.size, total * sizeof(float), tensors,
		       iters, iter_s[iters / 2], iter_s[0], iter_s[iters - 1], first_s,
		       p99(iter_s, iters));
		fflush(stdout);
	}
	unisum_shutdown();
	return wrong ? 1 : 0;
}
