/*
 * test_tune.c - fit mode's mapping (tune_fit, UNISUM_AUTOTUNE=2) from a
 * measured bandwidth and round trip to the partition size and credit, at
 * its edges: nothing measured, slow links (the 128 KiB floor), the emulated
 * cluster's 500 Mbit/s and 1 Gbit/s (the setting found best on both), 10 Gbit/s, links faster than the configured partition
 * (kept), long round trips (the credit covers twice the bandwidth-delay
 * product), and a configured partition below the floor; then the CPU a
 * message costs, from two settings (tune_msg_cpu), and the partition it
 * asks for (tune_fit_cpu).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "worker/tune.h"

static const struct tune_setting first = {4096000, 4 * 4096000};

static void expect_fit(double bw, double rtt, uint64_t pbytes, uint64_t credit)
{
	struct tune_setting s = tune_fit(bw, rtt, first);
	print_message("bw %.3g B/s rtt %.3g s: partition %llu credit %llu\n", bw, rtt,
		      (unsigned long long)s.pbytes, (unsigned long long)s.credit);
	assert_int_equal(s.pbytes, pbytes);
	assert_int_equal(s.credit, credit);
}

static void test_nothing_measured_keeps_the_configured(void **state)
{
	(void)state;
	expect_fit(0, 0, first.pbytes, first.credit);
	expect_fit(-1, 0.001, first.pbytes, first.credit);
	expect_fit(NAN, 0, first.pbytes, first.credit);
	expect_fit(INFINITY, 0, first.pbytes, first.credit);
}

static void test_slow_links_floor_at_128k(void **state)
{
	(void)state;
	expect_fit(1e6, 0.0002, 131072, 8 * 131072);	/* 8 Mbit/s */
	expect_fit(11e6, 0.0002, 131072, 8 * 131072);	/* 100 Mbit/s */
}

static void test_emulated_cluster_rates(void **state)
{
	(void)state;
	/* TCP goodput at 500 Mbit/s and 1 Gbit/s (x 1448/1514). */
	expect_fit(59.8e6, 0.0003, 131072, 1048576);	/* the floor: bench/README */
	expect_fit(119.6e6, 0.0003, 131072, 1048576);	/* bench/cluster/compare's tuned setting */
	expect_fit(1.196e9, 0.0001, 1048576, 8388608);	/* 10 Gbit/s */
}

static void test_fast_links_keep_the_configured_partition(void **state)
{
	(void)state;
	expect_fit(3e9, 0.00005, 2097152, 8 * 2097152);	/* loopback TCP: 3 MB < 4096000 */
	expect_fit(5e9, 0.00005, first.pbytes, 8 * first.pbytes);
	expect_fit(50e9, 0, first.pbytes, 8 * first.pbytes);
}

static void test_long_round_trips_widen_the_credit(void **state)
{
	(void)state;
	/* 1 Gbit/s with 2 ms on each of the four links a round trip crosses:
	 * 2 x 119.6e6 x 0.008 = 1.91 MB, rounded up to whole partitions. */
	expect_fit(119.6e6, 0.008, 131072, 15 * 131072);
	/* A round trip short enough that 8 partitions cover it. */
	expect_fit(119.6e6, 0.004, 131072, 1048576);
}

static void test_configured_partition_below_the_floor(void **state)
{
	(void)state;
	struct tune_setting small = {32768, 4 * 32768};
	struct tune_setting s = tune_fit(119.6e6, 0.0003, small);
	assert_int_equal(s.pbytes, 32768);
	assert_int_equal(s.credit, 8 * 32768);
}

/* What a message costs, from two settings' CPU per byte (tune_msg_cpu):
 * 64 MiB a round in 16 messages took 0.5 CPU-s, in 512 messages 0.7, so
 * 496 messages more cost 0.2 s: about 403 us each. */
static void test_message_cpu_from_two_settings(void **state)
{
	(void)state;
	struct tune_meas a = {.all_bytes = 64u << 20, .pushes = 16, .cpu_s = 0.5};
	struct tune_meas b = {.all_bytes = 64u << 20, .pushes = 512, .cpu_s = 0.7};
	double want = 0.2 / (64u << 20) / (1.0 / (128u << 10) - 1.0 / (4u << 20));
	assert_true(fabs(tune_msg_cpu(&a, &b) - want) < 1e-9);
	assert_true(fabs(want - 403e-6) < 1e-6);
	assert_true(fabs(tune_msg_cpu(&b, &a) - want) < 1e-9);	/* either order */
	/* Less CPU with the smaller messages: noise, nothing said. */
	b.cpu_s = 0.4;
	assert_true(tune_msg_cpu(&a, &b) == 0);
	/* Messages of about the same size (small tensors): nothing said. */
	b = (struct tune_meas){.all_bytes = 64u << 20, .pushes = 20, .cpu_s = 0.9};
	assert_true(tune_msg_cpu(&a, &b) == 0);
	/* Nothing pushed. */
	b.pushes = 0;
	assert_true(tune_msg_cpu(&a, &b) == 0);
}

/* The fit grows its partition until a message's CPU is at most a quarter
 * of the link's time for it, in powers of two up to the configured. */
static void test_message_cpu_grows_the_partition(void **state)
{
	(void)state;
	struct tune_setting fit = tune_fit(119.6e6, 0.0003, first);
	assert_int_equal(fit.pbytes, 131072);
	/* Nothing measured: the fit stands. */
	struct tune_setting s = tune_fit_cpu(fit, 119.6e6, 0, first);
	assert_int_equal(s.pbytes, fit.pbytes);
	assert_int_equal(s.credit, fit.credit);
	/* 400 us x 119.6 MB/s / 0.25 = 191 KB: 256 KiB, credit 8 of them. */
	s = tune_fit_cpu(fit, 119.6e6, 400e-6, first);
	assert_int_equal(s.pbytes, 262144);
	assert_int_equal(s.credit, 8 * 262144);
	/* 20 us: 9.6 KB, under the fit: it stands. */
	s = tune_fit_cpu(fit, 119.6e6, 20e-6, first);
	assert_int_equal(s.pbytes, 131072);
	/* 20 ms: beyond every power of two under the configured 4096000. */
	s = tune_fit_cpu(fit, 119.6e6, 0.02, first);
	assert_int_equal(s.pbytes, first.pbytes);
	assert_int_equal(s.credit, 8 * first.pbytes);
	/* A credit the round trip widened keeps covering it, in whole partitions. */
	fit = tune_fit(119.6e6, 0.008, first);
	s = tune_fit_cpu(fit, 119.6e6, 400e-6, first);
	assert_int_equal(s.pbytes, 262144);
	assert_int_equal(s.credit, 8 * 262144);
	fit.credit = 30 * 131072;
	s = tune_fit_cpu(fit, 119.6e6, 400e-6, first);
	assert_int_equal(s.credit, 15 * 262144);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_nothing_measured_keeps_the_configured),
		cmocka_unit_test(test_slow_links_floor_at_128k),
		cmocka_unit_test(test_emulated_cluster_rates),
		cmocka_unit_test(test_fast_links_keep_the_configured_partition),
		cmocka_unit_test(test_long_round_trips_widen_the_credit),
		cmocka_unit_test(test_configured_partition_below_the_floor),
		cmocka_unit_test(test_message_cpu_from_two_settings),
		cmocka_unit_test(test_message_cpu_grows_the_partition),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
