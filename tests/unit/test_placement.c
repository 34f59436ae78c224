/*
 * test_placement.c - partitioning boundaries and the byte balance of the
 * assignment of partitions to servers.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "placement/placement.h"

#define PB 4096000ull

static void check_partition(uint64_t count, size_t esize, uint64_t pbytes, uint64_t want_parts)
{
	uint64_t n = placement_nparts(count, esize, pbytes);
	assert_true(n == want_parts);
	if (n == 0)
		return;
	struct placement_part *p = calloc(n, sizeof *p);
	placement_partition(count, n, p);
	uint64_t next = 0, lo = UINT64_MAX, hi = 0;
	for (uint64_t i = 0; i < n; i++) {
		assert_true(p[i].offset == next);	/* contiguous, in order */
		assert_true(p[i].count >= 1);
		assert_true(p[i].count * esize <= pbytes);	/* never above the limit */
		next += p[i].count;
		lo = p[i].count < lo ? p[i].count : lo;
		hi = p[i].count > hi ? p[i].count : hi;
	}
	assert_true(next == count);	/* covers the tensor exactly */
	assert_true(hi - lo <= 1);	/* nearly equal parts */
	free(p);
}

static void test_partition_boundaries(void **state)
{
	(void)state;
	uint64_t per4 = PB / 4, per2 = PB / 2;
	check_partition(0, 4, PB, 0);			/* empty tensor: no partitions */
	check_partition(1, 4, PB, 1);			/* one element */
	check_partition(per4 - 1, 4, PB, 1);
	check_partition(per4, 4, PB, 1);		/* exactly one partition */
	check_partition(per4 + 1, 4, PB, 2);		/* one partition plus one element */
	check_partition(2 * per4, 4, PB, 2);
	check_partition(2 * per4 + 1, 4, PB, 3);
	check_partition(per2 + 1, 2, PB, 2);
	check_partition(PB / 8 + 1, 8, PB, 2);
	check_partition(1000, 4, 8, 500);		/* tiny partitions */
	check_partition(7, 8, 8, 7);			/* one element per partition */
	assert_true(placement_nparts(5, 8, 4) == 0);	/* element larger than a partition */
	/* partition bytes not a multiple of the element size */
	check_partition(1001, 4, 4003, 2);
}

/* ResNet-50's gradient tensors (conv weights, batch-norm scale and shift,
 * the classifier), in bytes of float32, in declaration order. */
static size_t resnet50_sizes(uint64_t *out)
{
	size_t n = 0;
	out[n++] = 64 * 3 * 7 * 7 * 4;
	out[n++] = 64 * 4;
	out[n++] = 64 * 4;
	int blocks[4] = {3, 4, 6, 3}, width[4] = {64, 128, 256, 512};
	int in = 64;
	for (int stage = 0; stage < 4; stage++) {
		for (int b = 0; b < blocks[stage]; b++) {
			int w = width[stage], outc = 4 * w;
			uint64_t convs[3] = {(uint64_t)in * w, (uint64_t)w * w * 9, (uint64_t)w * outc};
			int chans[3] = {w, w, outc};
			for (int c = 0; c < 3; c++) {
				out[n++] = convs[c] * 4;
				out[n++] = (uint64_t)chans[c] * 4;
				out[n++] = (uint64_t)chans[c] * 4;
			}
			if (b == 0) {
				out[n++] = (uint64_t)in * outc * 4;	/* downsample */
				out[n++] = (uint64_t)outc * 4;
				out[n++] = (uint64_t)outc * 4;
			}
			in = outc;
		}
	}
	out[n++] = 2048ull * 1000 * 4;
	out[n++] = 1000 * 4;
	return n;
}

/* Places every tensor (partitioned) and returns max load / mean load. */
static double place_all(const uint64_t *sizes, size_t n, int nservers, uint32_t *first_server)
{
	uint64_t loads[16] = {0}, total = 0;
	for (size_t t = 0; t < n; t++) {
		uint64_t count = sizes[t] / 4, np = placement_nparts(count, 4, PB);
		struct placement_part parts[64];
		uint64_t bytes[64];
		uint32_t servers[64];
		assert_true(np <= 64);
		placement_partition(count, np, parts);
		for (uint64_t i = 0; i < np; i++)
			bytes[i] = parts[i].count * 4;
		placement_assign(loads, nservers, bytes, np, servers);
		for (uint64_t i = 0; i < np; i++)
			assert_true(servers[i] < (uint32_t)nservers);
		if (first_server)
			first_server[t] = servers[0];
		total += sizes[t];
	}
	uint64_t max = 0;
	for (int s = 0; s < nservers; s++)
		max = loads[s] > max ? loads[s] : max;
	return (double)max / ((double)total / nservers);
}

static void test_resnet50_balance(void **state)
{
	(void)state;
	uint64_t sizes[256], shuffled[256];
	size_t n = resnet50_sizes(sizes);
	assert_int_equal(n, 161);
	uint64_t total = 0;
	for (size_t i = 0; i < n; i++)
		total += sizes[i];
	assert_true(total > 90ull << 20 && total < 110ull << 20);	/* ~25.5 M parameters */

	/* Placement is online (the scheduler places a name when it is first
	 * declared), so the fullest server can exceed the mean by at most one
	 * partition: 4 MB against ~25 MB per server at 4 servers.  The jobs
	 * of this issue use up to 4 servers; more servers need the weighted
	 * placement of the unified-architecture issue. */
	for (int servers = 1; servers <= 4; servers++) {
		double r = place_all(sizes, n, servers, NULL);
		if (r > 1.10)
			fail_msg("%d servers: the fullest server holds %.3f x the mean", servers, r);
		/* In any declaration order too (the scheduler places in the order
		 * the job first declares names). */
		srand(42 + (unsigned)servers);
		for (int trial = 0; trial < 20; trial++) {
			memcpy(shuffled, sizes, n * sizeof *sizes);
			for (size_t i = n - 1; i > 0; i--) {
				size_t j = (size_t)rand() % (i + 1);
				uint64_t t = shuffled[i];
				shuffled[i] = shuffled[j];
				shuffled[j] = t;
			}
			r = place_all(shuffled, n, servers, NULL);
			if (r > 1.10)
				fail_msg("%d servers, shuffled order %d: fullest server holds %.3f x the mean",
					 servers, trial, r);
		}
	}
}

static void test_assignment_is_deterministic(void **state)
{
	(void)state;
	uint64_t sizes[256];
	size_t n = resnet50_sizes(sizes);
	uint32_t a[256], b[256];
	place_all(sizes, n, 3, a);
	place_all(sizes, n, 3, b);
	assert_memory_equal(a, b, n * sizeof *a);
	/* ties go to the lowest rank */
	uint64_t loads[3] = {0, 0, 0}, bytes[3] = {10, 10, 10};
	uint32_t servers[3];
	placement_assign(loads, 3, bytes, 3, servers);
	assert_int_equal(servers[0], 0);
	assert_int_equal(servers[1], 1);
	assert_int_equal(servers[2], 2);
}

static void test_tensor_keys(void **state)
{
	(void)state;
	uint64_t k = placement_tensor_key("layer1.0.conv1.weight");
	assert_true(k == placement_tensor_key("layer1.0.conv1.weight"));	/* stable */
	assert_true((k & 0xffff) == 0);		/* room for 65536 partition indices */
	assert_true(k != placement_tensor_key("layer1.0.conv2.weight"));
	assert_true(placement_tensor_key("a") != placement_tensor_key("b"));
	/* no collisions among many similar names */
	enum { N = 20000 };
	uint64_t *keys = malloc(N * sizeof *keys);
	for (int i = 0; i < N; i++) {
		char name[32];
		snprintf(name, sizeof name, "grad.%d", i);
		keys[i] = placement_tensor_key(name);
		for (int j = i - 50 < 0 ? 0 : i - 50; j < i; j++)
			assert_true(keys[j] != keys[i]);
	}
	free(keys);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_partition_boundaries),
		cmocka_unit_test(test_resnet50_balance),
		cmocka_unit_test(test_assignment_is_deterministic),
		cmocka_unit_test(test_tensor_keys),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
