/*
 * local_allreduce.c - unisum's column of bench/local.sh.
 *
 *   unisum launch -w P -s 1 -- bench_local_allreduce BYTES ITERS WARMUP
 *
 * Runs as every worker of a local job.  Declares one float32 tensor of
 * BYTES; worker r fills element j of its input with (j mod 251) + r, small
 * integers, so every sum is exact in float32.  Each of WARMUP + ITERS
 * iterations is unisum_barrier(), then one timed out-of-place
 * unisum_push_pull(t, in, out, 0).  The time of an iteration is the
 * slowest worker's, as for the MPI and gloo peers: after the timed call
 * (outside the timing) every worker push_pulls a float64 vector of P
 * elements holding its own time at its rank and zero elsewhere, so the sum
 * holds every worker's time.  Worker 0 prints
 *
 *   unisum procs=P bytes=BYTES median_ms=.. min_ms=..
 *
 * After the timed loop, one more push_pull into an output filled with -1
 * is checked on every element (want P (j mod 251) + P (P - 1) / 2); any
 * difference fails the run (exit 1).  With BENCH_ALLOC=1 the input and
 * output come from unisum_alloc (the workers' shared arenas) instead of
 * malloc, and the line starts "unisum-alloc".
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "timing.h"
#include "unisum.h"

static int die(const char *what, int rc)
{
	fprintf(stderr, "bench_local_allreduce: %s failed: %s (%s)\n", what,
		unisum_strerror(rc), unisum_last_error());
	return 1;
}

int main(int argc, char **argv)
{
	if (argc != 4) {
		fprintf(stderr, "usage: bench_local_allreduce BYTES ITERS WARMUP (as a worker of unisum launch)\n");
		return 2;
	}
	size_t bytes = strtoull(argv[1], NULL, 10);
	int iters = atoi(argv[2]), warmup = atoi(argv[3]);
	size_t n = bytes / sizeof(float);
	if (n == 0 || iters < 1 || warmup < 0) {
		fprintf(stderr, "bench_local_allreduce: bad arguments\n");
		return 2;
	}
	int rc = unisum_init();
	if (rc != 0)
		return die("unisum_init", rc);
	int rank = unisum_rank(), size = unisum_size();

	/* BENCH_ALLOC=1: the buffers come from unisum_alloc (the allocator path). */
	const char *alloc = getenv("BENCH_ALLOC");
	bool shared = alloc != NULL && strcmp(alloc, "1") == 0;
	float *in = shared ? unisum_alloc(n * sizeof *in) : malloc(n * sizeof *in);
	float *out = shared ? unisum_alloc(n * sizeof *out) : malloc(n * sizeof *out);
	double *times = malloc((size_t)iters * sizeof *times);
	double *vec = malloc((size_t)size * sizeof *vec);
	if (!in || !out || !times || !vec) {
		fprintf(stderr, "bench_local_allreduce: out of memory\n");
		return 1;
	}
	for (size_t j = 0; j < n; j++)
		in[j] = (float)(j % 251 + (size_t)rank);
	memset(out, 0, n * sizeof *out);	/* pre-fault */

	char name[64];
	snprintf(name, sizeof name, "bench.local.%zu", bytes);
	int t = unisum_declare(name, UNISUM_FLOAT32, n, 0);
	if (t < 0)
		return die("unisum_declare", t);
	int tt = unisum_declare("bench.local.times", UNISUM_FLOAT64, (size_t)size, 0);
	if (tt < 0)
		return die("unisum_declare", tt);

	for (int i = 0; i < warmup + iters; i++) {
		if ((rc = unisum_barrier()) != 0)
			return die("unisum_barrier", rc);
		double t0 = now();
		if ((rc = unisum_push_pull(t, in, out, 0)) != 0)
			return die("unisum_push_pull", rc);
		double dt = now() - t0;
		for (int r = 0; r < size; r++)
			vec[r] = r == rank ? dt : 0.0;
		if ((rc = unisum_push_pull(tt, vec, vec, 0)) != 0)
			return die("unisum_push_pull (times)", rc);
		double m = 0;
		for (int r = 0; r < size; r++)
			if (vec[r] > m)
				m = vec[r];
		if (i >= warmup)
			times[i - warmup] = m;
	}

	for (size_t j = 0; j < n; j++)
		out[j] = -1.0f;
	if ((rc = unisum_push_pull(t, in, out, 0)) != 0)
		return die("unisum_push_pull (check)", rc);
	size_t bad = 0, first = 0;
	for (size_t j = 0; j < n; j++) {
		float want = (float)(size * (int)(j % 251) + size * (size - 1) / 2);
		if (out[j] != want && bad++ == 0)
			first = j;
	}
	if (bad)
		fprintf(stderr, "bench_local_allreduce: rank %d: %zu wrong elements, first %zu is %g, want %g\n",
			rank, bad, first, out[first],
			(double)(size * (int)(first % 251) + size * (size - 1) / 2));

	if (rank == 0 && !bad) {
		qsort(times, (size_t)iters, sizeof *times, cmp_double);
		double med = iters % 2 ? times[iters / 2] : (times[iters / 2 - 1] + times[iters / 2]) / 2;
		printf("%s procs=%d bytes=%zu median_ms=%.3f min_ms=%.3f local_size=%d\n",
		       shared ? "unisum-alloc" : "unisum", size, bytes, med * 1e3, times[0] * 1e3, unisum_local_size());
		fflush(stdout);
	}
	if ((rc = unisum_shutdown()) != 0)
		return die("unisum_shutdown", rc);
	unisum_free(in);	/* takes malloc's memory too */
	unisum_free(out);
	free(times);
	free(vec);
	return bad ? 1 : 0;
}
