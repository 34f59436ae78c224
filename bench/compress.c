/*
 * bench/compress.c - how fast the compressors encode and decode, against
 * memcpy in the same run (issue 19's codec goals: onebit and dithering at
 * 50% of memcpy or more, top-k at 10%).
 *
 * One core; 64 MiB of float32 gradient-like values (pages touched first),
 * cut into partitions of 1 Mi elements (4 MiB, the pipeline's default
 * size) as the pipeline does.  GB/s is float32 input bytes per second:
 * read by encode, written by decode.  memcpy's GB/s is the bytes copied
 * per second of a 64 MiB memcpy.  Each figure is the best of REPEATS
 * runs, each run right after a memcpy run; ratios are over the best
 * memcpy seen.  The wire column is the encoded bytes over the input's.
 * Usage: bench_compress [SPEC...] (default: every compressor, in a few
 * settings).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "compress/compress.h"

#define ARRAY_BYTES ((size_t)64 << 20)
#define PART (1u << 20)	/* elements per partition */
#define REPEATS 5

static double now_seconds(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void cpu_model(char *buf, size_t len)
{
	FILE *f = fopen("/proc/cpuinfo", "r");
	char line[512];

	snprintf(buf, len, "unknown CPU");
	while (f && fgets(line, sizeof(line), f)) {
		char *colon = strchr(line, ':');

		if (strncmp(line, "model name", 10) == 0 && colon) {
			snprintf(buf, len, "%s", colon + 2);
			buf[strcspn(buf, "\n")] = '\0';
			break;
		}
	}
	if (f)
		fclose(f);
}

static double copy_best = 1e9;

static void time_copy(void *dst, const void *src)
{
	double t = now_seconds();

	memcpy(dst, src, ARRAY_BYTES);
	t = now_seconds() - t;
	copy_best = t < copy_best ? t : copy_best;
}

int main(int argc, char **argv)
{
	static const char *const all[] = { "onebit", "onebit,scaling=0", "topk,k=0.01",
		"topk,k=0.001", "randomk,k=0.01", "dithering", "dithering,s=2,partition=natural",
		"dithering,normalize=l2", "fp16", "bf16", NULL };
	const char *const *specs = argc > 1 ? (const char *const *)argv + 1 : all;
	size_t n = ARRAY_BYTES / sizeof(float), parts = n / PART;
	float *in = malloc(ARRAY_BYTES), *out = malloc(ARRAY_BYTES);
	uint8_t *wire = malloc(ARRAY_BYTES + 64 * parts), *copy = malloc(ARRAY_BYTES);
	char model[256];

	if (!in || !out || !wire || !copy) {
		fprintf(stderr, "bench_compress: out of memory\n");
		return 1;
	}
	srand(1);
	for (size_t i = 0; i < n; i++)	/* gradient-like: small, signed, a few large */
		in[i] = (float)((rand() % 2001) - 1000) * (rand() % 17 ? 1e-5f : 1e-3f);
	memset(out, 0, ARRAY_BYTES);
	memset(wire, 0, ARRAY_BYTES + 64 * parts);
	memset(copy, 0, ARRAY_BYTES);
	for (int r = 0; r < 3; r++)
		time_copy(copy, in);

	cpu_model(model, sizeof(model));
	printf("# bench_compress: %s, one core, %zu MiB float32 in partitions of %u elements, "
	       "best of %d\n", model, ARRAY_BYTES >> 20, PART, REPEATS);
	printf("# %-34s %8s %10s %8s %10s %8s  %s\n", "spec", "wire", "enc_GB/s", "enc/cpy",
	       "dec_GB/s", "dec/cpy", "goal");
	for (const char *const *t = specs; *t; t++) {
		struct compress_spec s;
		char err[256];

		if (compress_spec_parse(*t, &s, err, sizeof(err)) != 0) {
			fprintf(stderr, "bench_compress: %s\n", err);
			return 1;
		}
		const struct compress_codec *c = compress_codec_of(s.kind);
		size_t bytes = c->bytes(&s, PART);
		double enc = 1e9, dec = 1e9;

		for (int r = 0; r < REPEATS; r++) {
			time_copy(copy, in);
			double t0 = now_seconds();
			for (size_t p = 0; p < parts; p++)
				c->encode(&s, in + p * PART, PART, wire + p * bytes,
					  compress_seed(s.seed, 1, (uint64_t)r, 0));
			double t1 = now_seconds();
			time_copy(copy, in);
			double t2 = now_seconds();
			for (size_t p = 0; p < parts; p++)
				if (c->decode(&s, wire + p * bytes, bytes, out + p * PART, PART,
					      compress_seed(s.seed, 1, (uint64_t)r, 0)) != 0) {
					fprintf(stderr, "bench_compress: %s: decode refused its own "
						"encoding\n", *t);
					return 1;
				}
			double t3 = now_seconds();
			enc = t1 - t0 < enc ? t1 - t0 : enc;
			dec = t3 - t2 < dec ? t3 - t2 : dec;
		}
		double gb = (double)ARRAY_BYTES / 1e9;
		double goal = s.kind == COMPRESS_ONEBIT || s.kind == COMPRESS_DITHERING ? 0.5
			      : s.kind == COMPRESS_TOPK ? 0.1 : 0;
		double worst = (copy_best / enc < copy_best / dec ? copy_best / enc : copy_best / dec);
		printf("%-36s %8.4f %10.2f %8.2f %10.2f %8.2f  %s\n", *t, (double)bytes / (4.0 * PART),
		       gb / enc, copy_best / enc, gb / dec, copy_best / dec,
		       goal == 0 ? "-" : worst >= goal ? "PASS" : "BELOW");
	}
	printf("# memcpy %.2f GB/s (64 MiB, best)\n", (double)ARRAY_BYTES / 1e9 / copy_best);
	free(in), free(out), free(wire), free(copy);
	return 0;
}
