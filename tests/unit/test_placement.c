/*
 * test_placement.c - partitioning boundaries, the byte balance of the
 * assignment of partitions to servers, and the optimal policy's byte
 * shares against the BytePS paper's Theorem 1.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>
#include <math.h>

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

/* The paper's shares for n worker hosts each with a server and k CPU-only
 * hosts, written out independently of placement.c. */
static void paper_shares(int n, int k, double *colocated, double *cpu)
{
	double d = (double)n * n + (double)k * n - 2.0 * k;
	*colocated = (double)(n - k) / d;
	*cpu = 2.0 * (n - 1) / d;
}

static void test_theorem_shares(void **state)
{
	(void)state;
	double x, y;
	for (int n = 2; n <= 8; n++) {
		for (int k = 1; k < n; k++) {
			double px, py;
			paper_shares(n, k, &px, &py);
			placement_theorem_shares(n, n, k, &x, &y);
			if (fabs(x - px) > 1e-12 || fabs(y - py) > 1e-12)
				fail_msg("n=%d k=%d: shares %.6f/%.6f, the paper says %.6f/%.6f", n, k, x,
					 y, px, py);
			double t = 2.0 * n * (n - 1) / ((double)n * n + (double)k * n - 2.0 * k);
			assert_true(fabs(placement_theorem_time(n, n, k) - t) < 1e-12);
			/* strictly between the parameter server and all-reduce */
			if (k < n)
				assert_true(t < 2.0 * (n - 1) / n + 1e-12);
			assert_true(t >= 1.0 - 1e-12);
		}
		/* k = 0: all-reduce, even over the colocated servers */
		placement_theorem_shares(n, n, 0, &x, &y);
		assert_true(fabs(x - 1.0 / n) < 1e-12 && y == 0);
		assert_true(fabs(placement_theorem_time(n, n, 0) - 2.0 * (n - 1) / n) < 1e-12);
		/* k = n and beyond: the parameter server, colocated servers idle */
		for (int k = n; k <= n + 3; k++) {
			placement_theorem_shares(n, n, k, &x, &y);
			assert_true(x == 0 && fabs(y - 1.0 / k) < 1e-12);
			assert_true(fabs(placement_theorem_time(n, n, k) - 1.0) < 1e-12);
		}
	}
	/* one worker host: its own server costs no network */
	placement_theorem_shares(1, 1, 3, &x, &y);
	assert_true(x == 1.0 && y == 0);
	/* no colocated server: CPU-only servers share evenly */
	placement_theorem_shares(4, 0, 2, &x, &y);
	assert_true(x == 0 && y == 0.5);
	/* fewer servers than worker hosts: shares still sum to 1 and the
	 * time stays between the two special cases */
	placement_theorem_shares(6, 3, 2, &x, &y);
	assert_true(fabs(3 * x + 2 * y - 1.0) < 1e-12 && x > 0 && y > 0);
}

static void test_weights_from_hosts(void **state)
{
	(void)state;
	/* 3 worker hosts (the first with 2 worker processes), a server beside
	 * each, 2 CPU-only hosts of which one runs 2 servers. */
	const char *workers[] = {"w0", "w0", "w1", "w2"};
	const char *servers[] = {"w0", "c0", "w1", "c1", "w2", "c1"};
	double w[6];
	int col[6], n, c, k;
	placement_weights(6, servers, 4, workers, w, col, &n, &c, &k);
	assert_int_equal(n, 3);
	assert_int_equal(c, 3);
	assert_int_equal(k, 2);
	double px, py;
	paper_shares(3, 2, &px, &py);
	int want_col[6] = {1, 0, 1, 0, 1, 0};
	double want[6] = {px, py, px, py / 2, px, py / 2};
	double sum = 0;
	for (int s = 0; s < 6; s++) {
		assert_int_equal(col[s], want_col[s]);
		assert_true(fabs(w[s] - want[s]) < 1e-12);
		sum += w[s];
	}
	assert_true(fabs(sum - 1.0) < 1e-12);
	/* every process on one host: nothing crosses a network, even spread */
	const char *one[] = {"h", "h", "h"};
	placement_weights(3, one, 2, one, w, col, &n, &c, &k);
	assert_true(n == 1 && c == 1 && k == 0);
	for (int s = 0; s < 3; s++)
		assert_true(col[s] == 1 && fabs(w[s] - 1.0 / 3) < 1e-12);
}

/* Places ResNet-50 (last layer first, as backward declares it) with the
 * optimal policy on n worker hosts with a server each plus k CPU-only
 * servers; checks every cut and returns the worst relative deviation of a
 * server's byte share from its weight.  servers_out (may be NULL) gets
 * the server of every partition in order. */
static double place_optimal(int n, int k, const uint64_t *sizes, size_t nt, uint32_t *servers_out,
			    size_t *nparts_out)
{
	const char *hosts[16];
	char names[16][8];
	for (int i = 0; i < n + k; i++) {
		snprintf(names[i], sizeof names[i], "%c%d", i < n ? 'w' : 'c', i);
		hosts[i] = names[i];
	}
	double w[16];
	placement_weights(n + k, hosts, n, hosts, w, NULL, NULL, NULL, NULL);
	struct placement p;
	assert_int_equal(placement_init(&p, PLACEMENT_OPTIMAL, n + k, w), 0);
	size_t total_parts = 0;
	for (size_t t = nt; t-- > 0;) {
		uint32_t np, *servers;
		struct placement_part *parts;
		uint64_t count = sizes[t] / 4;
		assert_int_equal(placement_place(&p, (uint64_t)(t + 1) << 16, count, 4, PB, &np, &parts,
						 &servers), 0);
		uint64_t next = 0;
		for (uint32_t i = 0; i < np; i++) {
			assert_true(parts[i].offset == next);
			assert_true(parts[i].count >= 1 && parts[i].count * 4 <= PB);
			assert_true(servers[i] < (uint32_t)(n + k) && w[servers[i]] > 0);
			next += parts[i].count;
			if (servers_out != NULL)
				servers_out[total_parts + i] = servers[i];
		}
		assert_true(next == count);
		total_parts += np;
		free(parts);
		free(servers);
	}
	double worst = 0;
	for (int s = 0; s < n + k; s++) {
		double share = (double)p.loads[s] / (double)p.total;
		if (w[s] == 0) {
			assert_true(p.loads[s] == 0);
			continue;
		}
		double dev = fabs(share - w[s]) / w[s];
		worst = dev > worst ? dev : worst;
	}
	placement_fini(&p);
	if (nparts_out != NULL)
		*nparts_out = total_parts;
	return worst;
}

static void test_optimal_shares_resnet50(void **state)
{
	(void)state;
	uint64_t sizes[256];
	size_t nt = resnet50_sizes(sizes);
	static uint32_t a[4096], b[4096];
	for (int n = 1; n <= 8; n++) {
		for (int k = 0; k <= 8; k++) {
			size_t na, nb;
			double dev = place_optimal(n, k, sizes, nt, a, &na);
			if (dev > 0.02)
				fail_msg("n=%d k=%d: a server's byte share is %.2f%% off Theorem 1", n, k,
					 100 * dev);
			assert_true(na < 4096);
			/* deterministic: the same every time (every worker gets the
			 * scheduler's one answer; the scheduler gets this one) */
			place_optimal(n, k, sizes, nt, b, &nb);
			assert_true(na == nb);
			assert_memory_equal(a, b, na * sizeof *a);
		}
	}
}

static void test_hash_and_even_policies(void **state)
{
	(void)state;
	struct placement p;
	assert_int_equal(placement_init(&p, PLACEMENT_HASH, 3, NULL), 0);
	uint32_t np, *servers;
	struct placement_part *parts;
	/* equal partitions; server = djb2 of the decimal key mod 3 */
	assert_int_equal(placement_place(&p, 65536, 3 * (PB / 4), 4, PB, &np, &parts, &servers), 0);
	assert_int_equal(np, 3);
	for (uint32_t i = 0; i < np; i++) {
		char dec[32];
		snprintf(dec, sizeof dec, "%llu", 65536ull + i);
		uint64_t h = 5381;
		for (const char *c = dec; *c; c++)
			h = h * 33 + (unsigned char)*c;
		assert_int_equal(servers[i], h % 3);
		assert_true(parts[i].count == PB / 4);
	}
	free(parts);
	free(servers);
	placement_fini(&p);
	/* even ignores weights: least loaded first */
	double w[2] = {0.9, 0.1};
	assert_int_equal(placement_init(&p, PLACEMENT_EVEN, 2, w), 0);
	assert_int_equal(placement_place(&p, 65536, 4 * (PB / 4), 4, PB, &np, &parts, &servers), 0);
	assert_int_equal(np, 4);
	assert_true(p.loads[0] == p.loads[1]);
	free(parts);
	free(servers);
	/* empty tensor, element larger than a partition */
	assert_int_equal(placement_place(&p, 1 << 16, 0, 4, PB, &np, &parts, &servers), 0);
	assert_true(np == 0 && parts == NULL && servers == NULL);
	assert_int_equal(placement_place(&p, 1 << 16, 5, 8, 4, &np, &parts, &servers), -1);
	placement_fini(&p);
	assert_int_equal(placement_policy_parse("optimal"), PLACEMENT_OPTIMAL);
	assert_int_equal(placement_policy_parse("hash"), PLACEMENT_HASH);
	assert_int_equal(placement_policy_parse("even"), PLACEMENT_EVEN);
	assert_int_equal(placement_policy_parse("Optimal"), -1);
}

/* A tensor smaller than a piece, partition sizes not a multiple of the
 * element size, tiny partitions: the optimal cut still covers exactly. */
static void test_optimal_cut_edges(void **state)
{
	(void)state;
	double w[3] = {0.5, 0.3, 0.2};
	struct placement p;
	assert_int_equal(placement_init(&p, PLACEMENT_OPTIMAL, 3, w), 0);
	uint64_t counts[] = {1, 7, 1000, 1024, 123457, 3000000};
	uint64_t pbs[] = {8, 4003, 4096, PB};
	for (size_t ci = 0; ci < sizeof counts / sizeof *counts; ci++) {
		for (size_t pi = 0; pi < sizeof pbs / sizeof *pbs; pi++) {
			uint32_t np, *servers;
			struct placement_part *parts;
			if (counts[ci] * 8 / pbs[pi] > 60000)
				continue;
			assert_int_equal(placement_place(&p, 1 << 16, counts[ci], 8, pbs[pi], &np, &parts,
							 &servers), 0);
			uint64_t next = 0;
			for (uint32_t i = 0; i < np; i++) {
				assert_true(parts[i].offset == next && parts[i].count >= 1);
				assert_true(parts[i].count * 8 <= pbs[pi] && servers[i] < 3);
				next += parts[i].count;
			}
			assert_true(next == counts[ci]);
			free(parts);
			free(servers);
		}
	}
	/* After all that, the shares hold to within a piece. */
	for (int s = 0; s < 3; s++)
		assert_true(fabs((double)p.loads[s] / (double)p.total - w[s]) < 0.01);
	placement_fini(&p);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_partition_boundaries),
		cmocka_unit_test(test_resnet50_balance),
		cmocka_unit_test(test_assignment_is_deterministic),
		cmocka_unit_test(test_tensor_keys),
		cmocka_unit_test(test_theorem_shares),
		cmocka_unit_test(test_weights_from_hosts),
		cmocka_unit_test(test_optimal_shares_resnet50),
		cmocka_unit_test(test_hash_and_even_policies),
		cmocka_unit_test(test_optimal_cut_edges),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
