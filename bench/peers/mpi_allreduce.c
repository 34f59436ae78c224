/*
 * mpi_allreduce.c - the OpenMPI peer of bench/local.sh.
 *
 *   mpirun -np P mpi_allreduce BYTES ITERS WARMUP
 *
 * float32 MPI_Allreduce(MPI_SUM), out of place, on BYTES per rank.  Rank r
 * fills element j with (j mod 251) + r: small integers, so every sum is
 * exact in float32 and the result can be compared exactly.  Each call is
 * preceded by an MPI_Barrier and timed on every rank; the time of a call
 * is the maximum over ranks (an MPI_Reduce of the elapsed times after the
 * timed call, outside the measurement).  Rank 0 prints one line:
 *
 *   mpi procs=P bytes=BYTES median_ms=.. min_ms=.. p99_ms=..
 *
 * and every rank checks a few elements of the last result (exit 1 when
 * wrong).  Built by bench/local.sh with mpicc, not by CMake.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
	int rank, size;

	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	if (argc != 4) {
		if (rank == 0)
			fprintf(stderr, "usage: mpi_allreduce BYTES ITERS WARMUP\n");
		MPI_Abort(MPI_COMM_WORLD, 2);
	}
	size_t bytes = strtoull(argv[1], NULL, 10);
	int iters = atoi(argv[2]), warmup = atoi(argv[3]);
	size_t n = bytes / sizeof(float);
	if (n == 0 || n > (size_t)0x7fffffff || iters < 1 || warmup < 0) {
		if (rank == 0)
			fprintf(stderr, "mpi_allreduce: bad arguments\n");
		MPI_Abort(MPI_COMM_WORLD, 2);
	}
	float *in = malloc(n * sizeof *in), *out = malloc(n * sizeof *out);
	double *times = malloc((size_t)iters * sizeof *times);
	if (!in || !out || !times) {
		fprintf(stderr, "mpi_allreduce: out of memory\n");
		MPI_Abort(MPI_COMM_WORLD, 1);
	}
	for (size_t j = 0; j < n; j++)
		in[j] = (float)(j % 251 + rank);
	memset(out, 0, n * sizeof *out);	/* pre-fault */

	for (int i = 0; i < warmup + iters; i++) {
		MPI_Barrier(MPI_COMM_WORLD);
		double t0 = MPI_Wtime();
		MPI_Allreduce(in, out, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
		double dt = MPI_Wtime() - t0, dtmax = 0;
		MPI_Reduce(&dt, &dtmax, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
		if (i >= warmup)
			times[i - warmup] = dtmax;
	}

	/* sum over ranks of (j mod 251) + r = P (j mod 251) + P (P - 1) / 2 */
	int bad = 0;
	size_t probe[] = {0, 1, 250, 251, n / 2, n - 1};
	for (size_t k = 0; k < sizeof probe / sizeof probe[0]; k++) {
		size_t j = probe[k] < n ? probe[k] : n - 1;
		float want = (float)((double)size * (double)(j % 251) + size * (size - 1) / 2.0);
		if (out[j] != want) {
			fprintf(stderr, "mpi_allreduce: rank %d element %zu is %g, want %g\n",
				rank, j, out[j], want);
			bad = 1;
		}
	}
	int anybad = 0;
	MPI_Allreduce(&bad, &anybad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
	if (rank == 0 && !anybad) {
		qsort(times, (size_t)iters, sizeof *times, cmp_double);
		double med = iters % 2 ? times[iters / 2] : (times[iters / 2 - 1] + times[iters / 2]) / 2;
		int p99 = (iters * 99 + 99) / 100 - 1;	/* the ceil(0.99 n)-th */
		printf("mpi procs=%d bytes=%zu median_ms=%.3f min_ms=%.3f p99_ms=%.3f\n",
		       size, bytes, med * 1e3, times[0] * 1e3, times[p99] * 1e3);
	}
	free(in);
	free(out);
	free(times);
	MPI_Finalize();
	return anybad ? 1 : 0;
}
