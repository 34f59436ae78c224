/*
 * pushpull.c - one job's push_pull time for a gradient set of a given size,
 * the unisum side of bench/cluster/compare.
 *
 *   bench_pushpull [--mib M] [--tensors T] [--iters I] [--warmup K]
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
 *   pushpull workers=W bytes=B tensors=T iters=I median_s=.. min_s=.. max_s=.. first_s=..
 *
 * first_s is rank 0's time from calling unisum_init to the end of the first
 * push_pull (joining the job, declaring, the first barrier and round): what
 * the first step of a training job pays, probing included.
 * and every rank checks its results exactly; any wrong element exits 1.
 * With PUSHPULL_VERBOSE set, rank 0 first prints every iteration's time.
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

int main(int argc, char **argv)
{
	double mib = 64;
	int tensors = 1, iters = 5, warmup = 2;
	for (int i = 1; i + 1 < argc; i += 2) {
		if (strcmp(argv[i], "--mib") == 0)
			mib = atof(argv[i + 1]);
		else if (strcmp(argv[i], "--tensors") == 0)
			tensors = atoi(argv[i + 1]);
		else if (strcmp(argv[i], "--iters") == 0)
			iters = atoi(argv[i + 1]);
		else if (strcmp(argv[i], "--warmup") == 0)
			warmup = atoi(argv[i + 1]);
		else {
			fprintf(stderr, "bench_pushpull: unknown option %s\n", argv[i]);
			return 2;
		}
	}
	if (mib <= 0 || tensors < 1 || iters < 1 || warmup < 0) {
		fprintf(stderr, "usage: bench_pushpull [--mib M] [--tensors T] [--iters I] [--warmup K]\n");
		return 2;
	}
	double init_t0 = now(), first_s = 0;
	if (unisum_init() != 0)
		return fail("init");
	int rank = unisum_rank(), size = unisum_size();
	size_t total = (size_t)(mib * 1024 * 1024 / sizeof(float));
	size_t per = total / (size_t)tensors;
	float **in = calloc((size_t)tensors, sizeof *in), **out = calloc((size_t)tensors, sizeof *out);
	int *ids = calloc((size_t)tensors, sizeof *ids);
	unisum_handle *h = calloc((size_t)tensors, sizeof *h);
	double *times = calloc((size_t)size, sizeof *times), *all = calloc((size_t)size, sizeof *all);
	double *iter_s = calloc((size_t)iters, sizeof *iter_s);
	if (!in || !out || !ids || !h || !times || !all || !iter_s)
		return fail("out of memory");
	for (int t = 0; t < tensors; t++) {
		size_t n = t == tensors - 1 ? total - per * (size_t)(tensors - 1) : per;
		char name[64];
		snprintf(name, sizeof name, "pushpull.%d", t);
		/* later tensors first, as backward produces them */
		ids[t] = unisum_declare(name, UNISUM_FLOAT32, n, t);
		in[t] = malloc(n * sizeof(float));
		out[t] = malloc(n * sizeof(float));
		if (ids[t] < 0 || !in[t] || !out[t])
			return fail("declare");
		for (size_t j = 0; j < n; j++)
			in[t][j] = (float)((j + (size_t)t) % 251 + (size_t)rank);
		memset(out[t], 0, n * sizeof(float));
	}
	int times_id = unisum_declare("pushpull.times", UNISUM_FLOAT64, (size_t)size, -1);
	if (times_id < 0)
		return fail("declare times");

	for (int it = 0; it < warmup + iters; it++) {
		if (unisum_barrier() != 0)
			return fail("barrier");
		double t0 = now();
		for (int t = 0; t < tensors; t++)
			if (unisum_push_pull_async(ids[t], in[t], out[t], 0, &h[t]) != 0)
				return fail("push_pull");
		for (int t = 0; t < tensors; t++)
			if (unisum_wait(h[t]) != 0)
				return fail("push_pull");
		double dt = now() - t0;
		if (it == 0)
			first_s = now() - init_t0;
		memset(times, 0, (size_t)size * sizeof *times);
		times[rank] = dt;
		if (unisum_push_pull(times_id, times, all, 0) != 0)
			return fail("push_pull times");
		double slowest = 0;
		for (int r = 0; r < size; r++)
			slowest = all[r] > slowest ? all[r] : slowest;
		if (it >= warmup)
			iter_s[it - warmup] = slowest;
	}

	/* sum over r of ((j + t) mod 251 + r) */
	double rsum = (double)size * (size - 1) / 2;
	size_t wrong = 0;
	for (int t = 0; t < tensors; t++) {
		size_t n = t == tensors - 1 ? total - per * (size_t)(tensors - 1) : per;
		for (size_t j = 0; j < n; j++) {
			double want = (double)size * (double)((j + (size_t)t) % 251) + rsum;
			if ((double)out[t][j] != want && wrong++ < 3)
				fprintf(stderr, "bench_pushpull: rank %d tensor %d element %zu is %g, not %g\n",
					rank, t, j, (double)out[t][j], want);
		}
	}
	if (rank == 0 && getenv("PUSHPULL_VERBOSE") != NULL) {
		printf("pushpull iterations:");
		for (int i = 0; i < iters; i++)
			printf(" %.4f", iter_s[i]);
		printf("\n");
	}
	if (rank == 0) {
		qsort(iter_s, (size_t)iters, sizeof *iter_s, cmp_double);
		printf("pushpull workers=%d bytes=%zu tensors=%d iters=%d median_s=%.4f min_s=%.4f "
		       "max_s=%.4f first_s=%.4f\n", size, total * sizeof(float), tensors, iters,
		       iter_s[iters / 2], iter_s[0], iter_s[iters - 1], first_s);
		fflush(stdout);
	}
	unisum_shutdown();
	return wrong ? 1 : 0;
}
