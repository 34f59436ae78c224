/*
 * bench/reducer.c - how close the reducer's sums come to memory bandwidth.
 *
 * The Summation Service's CPU cost is `dst += src` over gradient buffers far
 * larger than any cache, so the only honest yardstick is the machine's own
 * copy bandwidth.  This program measures, on 256 MiB arrays whose pages are
 * touched first:
 *
 *   1. memcpy, single thread: the reference bandwidth;
 *   2. reducer_sum_into() for float32, float16, bfloat16, float64 and int32
 *      on every instruction-set path this CPU runs, single thread, with the
 *      ratio to memcpy and the target for the dtype (float32 0.90,
 *      float16 and bfloat16 0.70) marked PASS or BELOW;
 *   3. memcpy and the float32 sum split over 1 and nproc threads;
 *   4. reducer_fold_into() min, max and product of the same dtypes and the
 *      bitwise OR, on the scalar path and the default one, single thread,
 *      each against a memcpy run beside it.
 *
 * Bandwidth counts the bytes an operation must move: 2 x size for memcpy
 * (read, write) and 3 x size for dst += src (read both, write one).  Each
 * figure is the best of REPEATS runs, each run right after a memcpy run;
 * ratios are over the best memcpy seen.  Usage: bench_reducer (no
 * arguments).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "reducer/reducer.h"

#define ARRAY_BYTES ((size_t)256 << 20)
#define REPEATS 7
#define MAX_THREADS 64

/* One dtype under test: its size (unisum_dtype_size is not ours to use
 * here) and the ratio to memcpy it should reach, 0 for none. */
struct bench_dtype {
	unisum_dtype dtype;
	const char *name;
	size_t size;
	double target;
};

static const struct bench_dtype dtypes[] = {
	{ UNISUM_FLOAT32, "float32", 4, 0.90 },
	{ UNISUM_FLOAT16, "float16", 2, 0.70 },
	{ UNISUM_BFLOAT16, "bfloat16", 2, 0.70 },
	{ UNISUM_FLOAT64, "float64", 8, 0.0 },
	{ UNISUM_INT32, "int32", 4, 0.0 },
};

/* What one thread does: memcpy (is_copy) or sum_into over its slice. */
struct bench_slice {
	pthread_t thread;	/* the worker running this slice */
	unsigned char *dst;	/* start of the slice in the destination */
	const unsigned char *src; /* start of the slice in the source */
	size_t bytes;		/* slice length in bytes */
	size_t elem_size;	/* element size of dtype */
	unisum_dtype dtype;	/* dtype summed when !is_copy */
	bool is_copy;		/* memcpy instead of reducer_sum_into */
	reducer_op op;		/* REDUCER_SUM: reducer_sum_into; else reducer_fold_into */
};

static double now_seconds(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void run_slice(struct bench_slice *s)
{
	if (s->is_copy)
		memcpy(s->dst, s->src, s->bytes);
	else if (s->op == REDUCER_SUM)
		reducer_sum_into(s->dst, s->src, s->bytes / s->elem_size, s->dtype);
	else
		reducer_fold_into(s->op, s->dst, s->src, s->bytes / s->elem_size, s->dtype);
}

static void *slice_thread(void *arg)
{
	run_slice(arg);
	return NULL;
}

/* Splits the arrays into `threads` contiguous slices of whole cache
 * lines, one per thread. */
static void plan_slices(struct bench_slice *slices, unsigned char *dst,
			const unsigned char *src, const struct bench_dtype *dt,
			bool is_copy, reducer_op op, int threads)
{
	size_t per = (ARRAY_BYTES / (size_t)threads) & ~(size_t)63;

	for (int t = 0; t < threads; t++) {
		slices[t].dst = dst + (size_t)t * per;
		slices[t].src = src + (size_t)t * per;
		slices[t].bytes = t == threads - 1 ? ARRAY_BYTES - (size_t)t * per : per;
		slices[t].elem_size = dt->size;
		slices[t].dtype = dt->dtype;
		slices[t].is_copy = is_copy;
		slices[t].op = op;
	}
}

/* Seconds for one run over the whole arrays.  One thread runs on the
 * calling thread, with no thread creation in the timing. */
static double time_once(struct bench_slice *slices, int threads)
{
	double start = now_seconds();

	if (threads == 1) {
		run_slice(&slices[0]);
	} else {
		for (int t = 0; t < threads; t++)
			if (pthread_create(&slices[t].thread, NULL, slice_thread,
					   &slices[t]) != 0) {
				perror("pthread_create");
				exit(1);
			}
		for (int t = 0; t < threads; t++)
			pthread_join(slices[t].thread, NULL);
	}
	return now_seconds() - start;
}

/*
 * The best of REPEATS runs of an operation, each run right after a memcpy
 * whose time lowers *copy_best.  Interleaving gives both the same chances
 * at a quiet machine (this one is a shared virtual machine, where a run can
 * take twice as long as the next), and the ratio to memcpy is then taken
 * against the best memcpy seen: noise can only make it look worse.
 */
static double best_seconds(unsigned char *dst, const unsigned char *src,
			   const struct bench_dtype *dt, reducer_op fold, int threads,
			   double *copy_best)
{
	struct bench_slice op[MAX_THREADS], copy[MAX_THREADS];
	double best = 1e30;

	/* Fresh values: repeated products would drift into subnormals. */
	memset(dst, 0x3c, ARRAY_BYTES);
	plan_slices(op, dst, src, dt, false, fold, threads);
	plan_slices(copy, dst, src, dt, true, fold, threads);
	for (int r = 0; r < REPEATS; r++) {
		double c = time_once(copy, threads), s = time_once(op, threads);

		if (c < *copy_best)
			*copy_best = c;
		if (s < best)
			best = s;
	}
	return best;
}

static double gbps(double bytes, double seconds)
{
	return bytes / seconds / 1e9;
}

static unsigned char *alloc_touched(void)
{
	unsigned char *p = aligned_alloc(4096, ARRAY_BYTES);

	if (p == NULL) {
		fprintf(stderr, "bench_reducer: cannot allocate %zu MiB\n",
			ARRAY_BYTES >> 20);
		exit(1);
	}
	/* 0x3c in every byte is a small finite number in every dtype (about
	 * 0.0115 in float32 and bfloat16, 1.06 in float16), so repeated sums
	 * stay far from denormals. */
	memset(p, 0x3c, ARRAY_BYTES);
	return p;
}

/* One line of the single-thread table. */
struct bench_row {
	const struct bench_dtype *dt;	/* what was summed */
	reducer_isa isa;		/* on which path */
	double seconds;			/* best time of one sum_into */
};

int main(int argc, char **argv)
{
	enum { MAX_ROWS = 5 * 3 };
	struct bench_row rows[MAX_ROWS];
	int row_count = 0;
	char date[64];
	time_t t = time(NULL);
	unsigned char *dst, *src;
	double copy_best = 1e30, copy_gbps;
	long nproc = sysconf(_SC_NPROCESSORS_ONLN);
	int thread_counts[2] = { 1, nproc < 1 ? 1 : nproc > MAX_THREADS ? MAX_THREADS : (int)nproc };
	reducer_isa best_isa = reducer_active_isa();

	strftime(date, sizeof(date), "%Y-%m-%d %H:%M:%S %Z", localtime(&t));
	printf("date:    %s\ncommand:", date);
	for (int i = 0; i < argc; i++)
		printf(" %s", argv[i]);
	printf("\narrays:  %zu MiB each, page-aligned, pages touched first; best of %d runs,\n"
	       "         each run after a memcpy run; GB/s counts 2 x size for memcpy,\n"
	       "         3 x size for dst += src; ratio is over the best memcpy seen\n"
	       "isa:     %s by default; %ld CPUs online\n\n",
	       ARRAY_BYTES >> 20, REPEATS, reducer_isa_name(best_isa), nproc);
	fflush(stdout);

	dst = alloc_touched();
	src = alloc_touched();

	for (size_t d = 0; d < sizeof(dtypes) / sizeof(dtypes[0]); d++) {
		for (int isa = REDUCER_ISA_SCALAR; isa <= REDUCER_ISA_AVX512; isa++) {
			if (reducer_force_isa((reducer_isa)isa) != 0)
				continue;
			rows[row_count].dt = &dtypes[d];
			rows[row_count].isa = (reducer_isa)isa;
			rows[row_count].seconds = best_seconds(dst, src, &dtypes[d], REDUCER_SUM, 1,
							       &copy_best);
			row_count++;
		}
	}
	reducer_force_isa(best_isa);

	copy_gbps = gbps(2.0 * ARRAY_BYTES, copy_best);
	printf("single thread\n");
	printf("%-10s %-7s %9s %8s %7s  %s\n", "op", "isa", "GB/s", "ms", "ratio", "target");
	printf("%-10s %-7s %9.2f %8.2f %7.3f  %s\n", "memcpy", "libc", copy_gbps,
	       copy_best * 1e3, 1.0, "-");
	for (int r = 0; r < row_count; r++) {
		double rate = gbps(3.0 * ARRAY_BYTES, rows[r].seconds);
		double ratio = rate / copy_gbps, target = rows[r].dt->target;
		char verdict[32] = "-";

		if (target > 0)
			snprintf(verdict, sizeof(verdict), "%.2f %s", target,
				 ratio >= target ? "PASS" : "BELOW");
		printf("%-10s %-7s %9.2f %8.2f %7.3f  %s\n", rows[r].dt->name,
		       reducer_isa_name(rows[r].isa), rate, rows[r].seconds * 1e3, ratio,
		       verdict);
	}

	printf("\nmulti-threaded (isa %s)\n", reducer_isa_name(best_isa));
	printf("%-10s %7s %9s %8s %7s\n", "op", "threads", "GB/s", "ms", "ratio");
	for (int i = 0; i < 2; i++) {
		int threads = thread_counts[i];
		double copy_mt = 1e30, s, rate, copy_rate;

		if (i == 1 && threads == thread_counts[0])
			break;
		s = best_seconds(dst, src, &dtypes[0], REDUCER_SUM, threads, &copy_mt);
		rate = gbps(3.0 * ARRAY_BYTES, s);
		copy_rate = gbps(2.0 * ARRAY_BYTES, copy_mt);
		printf("%-10s %7d %9.2f %8.2f %7.3f\n", "memcpy", threads, copy_rate,
		       copy_mt * 1e3, 1.0);
		printf("%-10s %7d %9.2f %8.2f %7.3f\n", "float32", threads, rate, s * 1e3,
		       rate / copy_rate);
	}
	/* min, max, product and OR (reducer_fold.c), scalar and the default
	 * path, single thread. */
	static const char *const fold_names[REDUCER_OP_COUNT] = {"sum", "min", "max", "product",
								 "or"};
	printf("\nmin, max, product, or: dst = dst op src, single thread\n");
	printf("%-8s %-10s %-7s %9s %8s %7s\n", "op", "dtype", "isa", "GB/s", "ms", "ratio");
	for (int f = REDUCER_MIN; f < REDUCER_OP_COUNT; f++) {
		for (size_t d = 0; d < sizeof(dtypes) / sizeof(dtypes[0]); d++) {
			if (f == REDUCER_BOR && d > 0)
				break;	/* bytes: one dtype says it all */
			reducer_isa isas[2] = {REDUCER_ISA_SCALAR, best_isa};
			for (int k = 0; k < (best_isa == REDUCER_ISA_SCALAR ? 1 : 2); k++) {
				double copy_f = 1e30;
				reducer_force_isa(isas[k]);
				double sec = best_seconds(dst, src, &dtypes[d], (reducer_op)f, 1, &copy_f);
				double rate = gbps(3.0 * ARRAY_BYTES, sec);
				printf("%-8s %-10s %-7s %9.2f %8.2f %7.3f\n", fold_names[f],
				       f == REDUCER_BOR ? "any" : dtypes[d].name,
				       reducer_isa_name(isas[k]), rate, sec * 1e3,
				       rate / gbps(2.0 * ARRAY_BYTES, copy_f));
				fflush(stdout);
			}
		}
	}
	reducer_force_isa(best_isa);

	printf("\nratio: GB/s over memcpy's best GB/s at the same thread count; "
	       "the targets apply\nto the default isa (the scalar path is the "
	       "fallback for CPUs without AVX2).\n");
	free(src);
	free(dst);
	return 0;
}
