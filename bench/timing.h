/* timing.h - the clock and the median helper the benchmark programs share. */
#ifndef UNISUM_BENCH_TIMING_H
#define UNISUM_BENCH_TIMING_H

#include <time.h>

/* Seconds on the monotonic clock. */
static inline double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* qsort comparison of doubles, ascending. */
static inline int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

#endif /* UNISUM_BENCH_TIMING_H */
