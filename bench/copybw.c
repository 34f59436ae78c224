/*
 * copybw.c - the memory-traffic bound of bench/local.sh.
 *
 *   bench_copybw PROCS BYTES [REPS]            (REPS default 7)
 *
 * Forks PROCS processes, one thread each.  Each owns two BYTES buffers,
 * both pre-faulted, and copies one into the other in two ways: libc's
 * memcpy, and a loop of SSE2 loads and non-temporal stores.  The second
 * matters because glibc switches to non-temporal stores only above
 * x86_non_temporal_threshold (114 MiB on this VM): below it every store
 * first reads its line (3 x traffic), so memcpy alone would make the bound
 * of a 64 MiB allreduce look looser than it is.  A rep is two rounds, one
 * per way, in which every process copies its buffer COPIES times at the
 * same time: the processes meet at a barrier (a process-shared pthread
 * barrier in a shared mapping), each times its own copies, and a round's
 * wall time is the slowest process's.  A round's traffic bandwidth is
 * bytes read plus bytes written, summed over processes, over that time:
 *
 *   traffic = 2 x PROCS x BYTES x COPIES / max time
 *
 * The median over REPS (after one warm-up rep) of each way, and the larger
 * of the two as the bound's bandwidth, are printed as
 *
 *   copy procs=P bytes=BYTES traffic_GBps=.. memcpy_GBps=.. nt_GBps=..
 *
 * (GB = 1e9 bytes).  An allreduce that reads every input once and writes
 * every output once moves 2 x P x BYTES, so its bound is that over this
 * bandwidth.  With more processes than cores the processes time-share,
 * which is what the allreduce peers measured beside it face too.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#include "timing.h"

#define COPIES 4
#define MAX_REPS 64

struct shared {
	pthread_barrier_t barrier;
	double t[2][MAX_REPS + 1][256];	/* [way][rep][proc] seconds */
};

/* dst = src with non-temporal stores; both 64-byte aligned. */
static void copy_nt(void *dst, const void *src, size_t bytes)
{
#ifdef __SSE2__
	__m128i *d = dst;
	const __m128i *s = src;
	size_t n = bytes / 64;
	for (size_t i = 0; i < n; i++, d += 4, s += 4) {
		__m128i a = _mm_load_si128(s), b = _mm_load_si128(s + 1);
		__m128i c = _mm_load_si128(s + 2), e = _mm_load_si128(s + 3);
		_mm_stream_si128(d, a);
		_mm_stream_si128(d + 1, b);
		_mm_stream_si128(d + 2, c);
		_mm_stream_si128(d + 3, e);
	}
	_mm_sfence();
	memcpy((char *)dst + n * 64, (const char *)src + n * 64, bytes - n * 64);
#else
	memcpy(dst, src, bytes);
#endif
}

static int child(struct shared *sh, int p, size_t bytes, int reps)
{
	size_t alloc = (bytes + 63) / 64 * 64;
	char *src = aligned_alloc(64, alloc), *dst = aligned_alloc(64, alloc);
	if (!src || !dst) {
		fprintf(stderr, "bench_copybw: out of memory\n");
		return 1;
	}
	for (size_t i = 0; i < bytes; i++)
		src[i] = (char)(i * 7 + (size_t)p);
	memset(dst, 0, bytes);
	for (int r = 0; r <= reps; r++)
		for (int way = 0; way < 2; way++) {
			pthread_barrier_wait(&sh->barrier);
			double t0 = now();
			for (int c = 0; c < COPIES; c++) {
				if (way == 0)
					memcpy(dst, src, bytes);
				else
					copy_nt(dst, src, bytes);
				__asm__ volatile("" : : "r"(dst) : "memory");
			}
			sh->t[way][r][p] = now() - t0;
		}
	int ok = memcmp(dst, src, bytes) == 0;
	free(src);
	free(dst);
	return ok ? 0 : 1;
}

int main(int argc, char **argv)
{
	if (argc < 3 || argc > 4) {
		fprintf(stderr, "usage: bench_copybw PROCS BYTES [REPS]\n");
		return 2;
	}
	int procs = atoi(argv[1]);
	size_t bytes = strtoull(argv[2], NULL, 10);
	int reps = argc > 3 ? atoi(argv[3]) : 7;
	if (procs < 1 || procs > 256 || bytes == 0 || reps < 1 || reps > MAX_REPS) {
		fprintf(stderr, "bench_copybw: bad arguments\n");
		return 2;
	}
	struct shared *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE,
				 MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (sh == MAP_FAILED) {
		perror("bench_copybw: mmap");
		return 1;
	}
	pthread_barrierattr_t attr;
	pthread_barrierattr_init(&attr);
	pthread_barrierattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
	pthread_barrier_init(&sh->barrier, &attr, (unsigned)procs);

	for (int p = 0; p < procs; p++) {
		pid_t pid = fork();
		if (pid < 0) {
			perror("bench_copybw: fork");
			return 1;
		}
		if (pid == 0)
			_exit(child(sh, p, bytes, reps));
	}
	int failed = 0, status;
	while (wait(&status) > 0)
		if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
			failed = 1;
	if (failed) {
		fprintf(stderr, "bench_copybw: a copying process failed\n");
		return 1;
	}
	double med[2];
	for (int way = 0; way < 2; way++) {
		double gbps[MAX_REPS];
		for (int r = 1; r <= reps; r++) {	/* rep 0 is the warm-up */
			double tmax = 0;
			for (int p = 0; p < procs; p++)
				if (sh->t[way][r][p] > tmax)
					tmax = sh->t[way][r][p];
			gbps[r - 1] = 2.0 * procs * (double)bytes * COPIES / tmax / 1e9;
		}
		qsort(gbps, (size_t)reps, sizeof gbps[0], cmp_double);
		med[way] = gbps[reps / 2];
	}
	printf("copy procs=%d bytes=%zu traffic_GBps=%.2f memcpy_GBps=%.2f nt_GBps=%.2f\n", procs,
	       bytes, med[0] > med[1] ? med[0] : med[1], med[0], med[1]);
	return 0;
}
