/*
 * bench.c - `unisum bench`: push_pull throughput over tensor sizes.
 *
 * Run alone it launches itself as a local job (`-w 2 -s 1` by default) and
 * then runs as every worker of that job.  For each size every worker
 * declares a float32 tensor, warms up, and times push_pull rounds; rank 0
 * prints a progress line and then a table with
 *   - the time of one push_pull,
 *   - goodput per worker (tensor bytes / time),
 *   - the bytes on the wire of the whole job (every worker sends and
 *     receives the tensor once: 2 x workers x bytes / time).
 * With --model it runs a synthetic training step instead (tools/bench_model.c).
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "config/config.h"
#include "tools.h"
#include "unisum.h"

#define MIB (1024.0 * 1024.0)

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void bench_usage(FILE *out)
{
	fprintf(out, "usage: unisum bench [-w WORKERS] [-s SERVERS] [--sizes MiB,MiB,...] [--seconds S]\n"
		     "       unisum bench --model NAME [-w WORKERS] [-s SERVERS] [--iters N] [--warmup N]\n"
		     "                    [--compute-ms MS] [--modes fifo,priority] [--list]\n"
		     "  defaults: -w 2 -s 1 --sizes 1,4,16,64,256 --seconds 2\n"
		     "  --model: a training step replaying NAME's gradients, FIFO against priority\n"
		     "  scheduling (resnet50, vgg16, bert-base; `unisum bench --model help`)\n");
}

#define BENCH_WARMUP 5

/* One size of the table: warm up, let rank 0 pick how many rounds fit in
 * `seconds` (broadcast, so every worker runs the same), time them, print
 * the row (rank 0) and check the sum.  0, or 1 after printing why. */
static int bench_one_size(int rank, int size, int mib, double seconds)
{
	size_t bytes = (size_t)mib * 1024 * 1024;
	size_t count = bytes / sizeof(float);
	float *in = malloc(bytes), *out = malloc(bytes);
	if (in == NULL || out == NULL) {
		fprintf(stderr, "unisum bench: out of memory for %d MiB\n", mib);
		return 1;
	}
	for (size_t k = 0; k < count; k++)
		in[k] = (float)(k % 1024) * 0.5f + (float)rank;
	memset(out, 0, bytes);
	char name[64];
	snprintf(name, sizeof name, "bench.%dMiB", mib);
	int t = unisum_declare(name, UNISUM_FLOAT32, count, 0);
	/* Warm-up: the rounds in which fit mode (UNISUM_AUTOTUNE's default)
	 * measures the network and settles, so the table is the steady state. */
	for (int r = 0; r < BENCH_WARMUP; r++) {
		if (t < 0 || unisum_push_pull(t, in, out, 0) != 0) {
			fprintf(stderr, "unisum bench: %s\n", unisum_last_error());
			return 1;
		}
	}
	/* Rank 0 decides how many rounds fit in the time budget and
	 * broadcasts the count, so every worker runs the same rounds. */
	int32_t rounds = 0;
	int tr = unisum_declare("bench.rounds", UNISUM_INT32, 1, 0);
	if (rank == 0) {
		double t0 = now_s();
		unisum_push_pull(t, in, out, 0);
		double one = now_s() - t0;
		rounds = (int32_t)(seconds / (one > 1e-6 ? one : 1e-6));
		rounds = rounds < 3 ? 3 : rounds > 100000 ? 100000 : rounds;
	} else {
		unisum_push_pull(t, in, out, 0);
	}
	if (tr < 0 || unisum_broadcast(tr, &rounds, 0) != 0) {
		fprintf(stderr, "unisum bench: %s\n", unisum_last_error());
		return 1;
	}
	unisum_barrier();
	double t0 = now_s(), shown = t0;
	for (int r = 0; r < rounds; r++) {
		if (unisum_push_pull(t, in, out, 0) != 0) {
			fprintf(stderr, "unisum bench: %s\n", unisum_last_error());
			return 1;
		}
		/* A progress line a second: whole lines, so they pass through
		 * the launcher's line-by-line forwarding. */
		if (rank == 0 && now_s() - shown >= 1.0) {
			shown = now_s();
			fprintf(stderr, "  ... %d MiB: round %d of %d\n", mib, r + 1, rounds);
		}
	}
	double el = now_s() - t0;
	if (rank == 0) {
		double per = el / rounds;
		printf("%7d MiB %8d %9.3f ms %13.2f GB/s %15.2f GB/s\n", mib, rounds, per * 1e3,
		       (double)bytes / per / 1e9, 2.0 * size * (double)bytes / per / 1e9);
		fflush(stdout);
	}
	/* Check the sum once: sum over ranks of (k%1024)*0.5 + rank. */
	double want = (double)((count - 1) % 1024) * 0.5 * size + (double)size * (size - 1) / 2.0;
	if ((double)out[count - 1] != want) {
		fprintf(stderr, "unisum bench: wrong sum %g, expected %g\n", out[count - 1], want);
		return 1;
	}
	free(in);
	free(out);
	return 0;
}

static int bench_worker(const int *sizes_mib, int nsizes, double seconds)
{
	int rc = unisum_init();
	if (rc != 0) {
		fprintf(stderr, "unisum bench: %s\n", unisum_last_error());
		return 1;
	}
	int rank = unisum_rank(), size = unisum_size();
	if (rank == 0) {
		printf("unisum bench: %d workers, float32 push_pull, %.0f s per size\n", size, seconds);
		printf("%10s %8s %12s %18s %20s\n", "size", "rounds", "time/round", "goodput/worker",
		       "job bytes on wire");
		fflush(stdout);
	}
	for (int i = 0; i < nsizes; i++)
		if (bench_one_size(rank, size, sizes_mib[i], seconds) != 0)
			return 1;
	rc = unisum_shutdown();
	return rc == 0 ? 0 : 1;
}

int bench_inside_job(void)
{
	struct config cfg;
	char err[256];
	return config_load(&cfg, err, sizeof err) != 0 || cfg.launched ||
	       cfg.role != CONFIG_ROLE_NONE;
}

int bench_self_exe(char *buf, size_t len)
{
	ssize_t n = readlink("/proc/self/exe", buf, len - 1);
	if (n < 0) {
		perror("unisum bench: readlink /proc/self/exe");
		return 1;
	}
	buf[n] = '\0';
	return 0;
}

int bench_main(int argc, char **argv)
{
	int workers = 2, servers = 1;
	int sizes[32] = {1, 4, 16, 64, 256}, nsizes = 5;
	double seconds = 2.0;
	for (int i = 1; i < argc; i++)
		if (strcmp(argv[i], "--model") == 0 || strncmp(argv[i], "--model=", 8) == 0)
			return bench_model_main(argc, argv);
	for (int i = 1; i < argc; i++) {
		if ((strcmp(argv[i], "-w") == 0 || strcmp(argv[i], "--workers") == 0) && i + 1 < argc) {
			workers = atoi(argv[++i]);
		} else if ((strcmp(argv[i], "-s") == 0 || strcmp(argv[i], "--servers") == 0) && i + 1 < argc) {
			servers = atoi(argv[++i]);
		} else if (strcmp(argv[i], "--seconds") == 0 && i + 1 < argc) {
			seconds = atof(argv[++i]);
		} else if (strcmp(argv[i], "--sizes") == 0 && i + 1 < argc) {
			nsizes = 0;
			for (char *tok = strtok(argv[++i], ","); tok && nsizes < 32; tok = strtok(NULL, ","))
				sizes[nsizes++] = atoi(tok);
		} else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
			bench_usage(stdout);
			return 0;
		} else {
			bench_usage(stderr);
			return 2;
		}
	}
	for (int i = 0; i < nsizes; i++)
		if (sizes[i] < 1 || sizes[i] > 4096) {
			fprintf(stderr, "unisum bench: sizes are MiB in [1, 4096]\n");
			return 2;
		}
	if (workers < 1 || servers < 1 || seconds <= 0) {
		bench_usage(stderr);
		return 2;
	}
	if (bench_inside_job())
		return bench_worker(sizes, nsizes, seconds);

	/* Not inside a job: launch one that runs this same command. */
	char self[PATH_MAX];
	if (bench_self_exe(self, sizeof self) != 0)
		return 1;
	char secbuf[32], sizebuf[256] = "";
	snprintf(secbuf, sizeof secbuf, "%g", seconds);
	for (int i = 0; i < nsizes; i++) {
		size_t len = strlen(sizebuf);
		snprintf(sizebuf + len, sizeof sizebuf - len, "%s%d", i ? "," : "", sizes[i]);
	}
	/* Every worker its own machine: this measures the servers' path. */
	char *cmd[] = {self, "bench", "--sizes", sizebuf, "--seconds", secbuf, NULL};
	struct launch_opts job = {.num_workers = workers, .num_servers = servers, .local_size = 1,
				  .cmd = cmd};
	return launch_run(&job);
}
