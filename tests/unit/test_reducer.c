/*
 * test_reducer.c - the reducer against a reference written beside it
 * (reducer_ref.c).
 *
 * The reference does not call the module: float16 and bfloat16 values are
 * decoded with ldexp() and rounded with nearbyint() in double precision
 * (exact for every float32), integer floor division goes through wider
 * types.  Every instruction-set path this CPU runs is forced in turn and
 * must match the reference bit for bit, for every dtype, on random lengths
 * (the boundary ones always) and random byte offsets, so that no buffer is
 * aligned to anything.  Each output buffer sits between guard bytes, and
 * some between inaccessible pages, to catch a loop that reads or writes
 * past its elements.
 *
 * Rounding ties are built on purpose (a float32 sum exactly half-way
 * between two float16 or bfloat16 values, both ways to even), as are NaN,
 * infinities, overflow to infinity and subnormals.
 *
 * The random seed is printed; UNISUM_TEST_SEED=<number> replays a run.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "reducer/reducer.h"
#include "reducer_ref.h"

#define ISA_COUNT 3
#define GUARD_BYTES 64
#define GUARD_FILL 0xa5

static int setup_seed(void **state)
{
	const char *env = getenv("UNISUM_TEST_SEED");
	uint64_t seed = env ? strtoull(env, NULL, 0) : (uint64_t)time(NULL);

	(void)state;
	printf("test_reducer: seed %" PRIu64 " (UNISUM_TEST_SEED=%" PRIu64
	       " replays it)\n", seed, seed);
	rng_state = seed * 2 + 1;
	return 0;
}

/* ---- Buffers between guard bytes ---- */

/* `bytes` bytes at `p`, `offset` bytes past an aligned start, with
 * GUARD_BYTES of GUARD_FILL on either side. */
struct guarded {
	unsigned char *base;	/* the allocation */
	unsigned char *p;	/* the elements */
	size_t bytes;		/* size of the elements */
};

static void guarded_init(struct guarded *g, size_t bytes, size_t offset)
{
	g->base = malloc(bytes + 2 * GUARD_BYTES + 64);
	assert_non_null(g->base);
	memset(g->base, GUARD_FILL, bytes + 2 * GUARD_BYTES + 64);
	g->p = g->base + GUARD_BYTES + offset;
	g->bytes = bytes;
}

static void guarded_check(const struct guarded *g, const char *what)
{
	size_t before = (size_t)(g->p - g->base);
	size_t after = before + g->bytes;

	for (size_t i = 0; i < before; i++)
		if (g->base[i] != GUARD_FILL)
			fail_msg("%s: byte %zd before the buffer was written",
				 what, (ptrdiff_t)i - (ptrdiff_t)before);
	for (size_t i = after; i < after + GUARD_BYTES; i++)
		if (g->base[i] != GUARD_FILL)
			fail_msg("%s: byte %zu past the end of %zu was written", what,
				 i - after, g->bytes);
}

/* ---- Checking ---- */

/* Compares n results with the expected ones; for float32 and float64 a
 * sum of two NaNs only has to be a NaN (which payload survives is left
 * open by IEEE), `a`/`b` being the operands or NULL for a division. */
static void check_results(const char *what, reducer_isa isa, unisum_dtype dtype,
			  const unsigned char *got, const unsigned char *want,
			  const unsigned char *a, const unsigned char *b, size_t n)
{
	size_t size = dtype_size(dtype);

	for (size_t i = 0; i < n; i++) {
		uint64_t g = get_elem(got, i, size), w = get_elem(want, i, size);

		if (g == w)
			continue;
		if (a != NULL && (dtype == UNISUM_FLOAT32 || dtype == UNISUM_FLOAT64) &&
		    elem_is_nan(dtype, get_elem(a, i, size)) &&
		    elem_is_nan(dtype, get_elem(b, i, size)) && elem_is_nan(dtype, g))
			continue;
		fail_msg("%s isa %s %s n %zu: element %zu is 0x%" PRIx64 ", want 0x%" PRIx64
			 " (operands 0x%" PRIx64 " 0x%" PRIx64 ")", what,
			 reducer_isa_name(isa), dtype_name(dtype), n, i, g, w,
			 a ? get_elem(a, i, size) : 0, b ? get_elem(b, i, size) : 0);
	}
}

/* ---- Lengths ---- */

static const size_t fixed_lengths[] = {
	0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65,
	127, 128, 129, 1000, 4099,
};
#define FIXED_LENGTHS (sizeof(fixed_lengths) / sizeof(fixed_lengths[0]))
#define RANDOM_LENGTHS 3

static size_t length_at(size_t k)
{
	return k < FIXED_LENGTHS ? fixed_lengths[k] : 1 + rnd_below(100000);
}

/* Every path this CPU runs, in turn: `body` runs with the path forced. */
#define FOR_EACH_ISA(isa)                                                       \
	for (reducer_isa isa = REDUCER_ISA_SCALAR; isa < ISA_COUNT;             \
	     isa = (reducer_isa)(isa + 1))                                      \
		if (reducer_force_isa(isa) == 0)

/* ---- Sums on random data ---- */

enum sum_mode { SUM_INTO, SUM_APART, SUM_DST_IS_A, SUM_DST_IS_B, SUM_MODES };

static const char *const sum_mode_names[SUM_MODES] = {
	"sum_into", "sum", "sum dst==a", "sum dst==b"
};

static void run_sum_case(reducer_isa isa, unisum_dtype dtype, size_t n, enum sum_mode mode)
{
	size_t size = dtype_size(dtype), bytes = n * size;
	struct guarded dst, a, b;
	unsigned char *a_copy = malloc(bytes + 1), *b_copy = malloc(bytes + 1);
	unsigned char *want = malloc(bytes + 1);

	assert_non_null(a_copy);
	assert_non_null(b_copy);
	assert_non_null(want);
	guarded_init(&dst, bytes, rnd_below(64));
	guarded_init(&a, bytes, rnd_below(64));
	guarded_init(&b, bytes, rnd_below(64));
	for (size_t i = 0; i < n; i++) {
		put_elem(a.p, i, size, rnd_elem(dtype));
		put_elem(b.p, i, size, rnd_elem(dtype));
		put_elem(dst.p, i, size, rnd_elem(dtype));
	}
	if (bytes > 0) {
		memcpy(a_copy, a.p, bytes);
		memcpy(b_copy, b.p, bytes);
	}
	for (size_t i = 0; i < n; i++)
		put_elem(want, i, size, ref_add(dtype, get_elem(a_copy, i, size),
						get_elem(b_copy, i, size)));

	switch (mode) {
	case SUM_INTO:
		reducer_sum_into(a.p, b.p, n, dtype);
		check_results(sum_mode_names[mode], isa, dtype, a.p, want, a_copy, b_copy, n);
		break;
	case SUM_APART:
		reducer_sum(dst.p, a.p, b.p, n, dtype);
		check_results(sum_mode_names[mode], isa, dtype, dst.p, want, a_copy, b_copy, n);
		assert_true(bytes == 0 || memcmp(a.p, a_copy, bytes) == 0);
		break;
	case SUM_DST_IS_A:
		reducer_sum(a.p, a.p, b.p, n, dtype);
		check_results(sum_mode_names[mode], isa, dtype, a.p, want, a_copy, b_copy, n);
		break;
	default:
		reducer_sum(b.p, a.p, b.p, n, dtype);
		check_results(sum_mode_names[mode], isa, dtype, b.p, want, a_copy, b_copy, n);
		assert_true(bytes == 0 || memcmp(a.p, a_copy, bytes) == 0);
		break;
	}
	if (mode != SUM_DST_IS_B)
		assert_true(bytes == 0 || memcmp(b.p, b_copy, bytes) == 0);
	guarded_check(&dst, "dst");
	guarded_check(&a, "a");
	guarded_check(&b, "b");
	free(dst.base);
	free(a.base);
	free(b.base);
	free(a_copy);
	free(b_copy);
	free(want);
}

static void test_sum_random(void **state)
{
	(void)state;
	FOR_EACH_ISA(isa) {
		for (int dtype = 0; dtype < UNISUM_DTYPE_COUNT; dtype++) {
			for (size_t k = 0; k < FIXED_LENGTHS + RANDOM_LENGTHS; k++) {
				size_t n = length_at(k);

				for (int mode = 0; mode < SUM_MODES; mode++)
					run_sum_case(isa, (unisum_dtype)dtype, n,
						     (enum sum_mode)mode);
			}
		}
	}
}

/* ---- min, max, product and OR (reducer_fold) ---- */

static const char *const fold_names[REDUCER_OP_COUNT] = { "sum", "min", "max", "product", "or" };

/* A float of the dtype as a double (16-bit floats through the reference). */
static double ref_value(unisum_dtype dtype, uint64_t v)
{
	switch (dtype) {
	case UNISUM_FLOAT32:
		return f32_of((uint32_t)v);
	case UNISUM_FLOAT64:
		return f64_of(v);
	default:
		return ref_decode((uint16_t)v, small_format_of(dtype));
	}
}

/* a op b as the reducer must compute it; *any_nan says that for float32
 * and float64 any NaN will do (IEEE leaves the payload open). */
static uint64_t ref_fold(reducer_op op, unisum_dtype dtype, uint64_t a, uint64_t b, bool *any_nan)
{
	size_t size = dtype_size(dtype);
	uint64_t mask = size == 8 ? ~0ull : (1ull << (8 * size)) - 1;
	bool is_float = dtype != UNISUM_INT32 && dtype != UNISUM_INT64;

	*any_nan = false;
	if (op == REDUCER_BOR)
		return a | b;
	if (!is_float) {
		int64_t x = dtype == UNISUM_INT32 ? (int32_t)(uint32_t)a : (int64_t)a;
		int64_t y = dtype == UNISUM_INT32 ? (int32_t)(uint32_t)b : (int64_t)b;

		if (op == REDUCER_MIN)
			return x < y ? a : b;
		if (op == REDUCER_MAX)
			return x > y ? a : b;
		return (a * b) & mask;
	}
	double x = ref_value(dtype, a), y = ref_value(dtype, b);
	bool small = dtype == UNISUM_FLOAT16 || dtype == UNISUM_BFLOAT16;
	uint64_t sign = 1ull << (8 * size - 1);

	if (op == REDUCER_PRODUCT) {
		if (small)
			return ref_encode((float)(x * y), small_format_of(dtype),
					  small_format_of(dtype)->qnan);
		*any_nan = isnan(x) || isnan(y);
		return dtype == UNISUM_FLOAT32 ? bits_of_f32(f32_of((uint32_t)a) * f32_of((uint32_t)b))
					       : bits_of_f64(x * y);
	}
	if (isnan(x) || isnan(y)) {
		*any_nan = !small;
		return small ? small_format_of(dtype)->qnan : (dtype == UNISUM_FLOAT32 ? 0x7fc00000u
								  : 0x7ff8000000000000ull);
	}
	if (x < y)
		return op == REDUCER_MIN ? a : b;
	if (x > y)
		return op == REDUCER_MIN ? b : a;
	if (x != 0)
		return a;
	/* +0 and -0: min is -0 when either is, max +0 when either is. */
	if (op == REDUCER_MIN)
		return (a & sign) || (b & sign) ? sign : 0;
	return (a & sign) && (b & sign) ? sign : 0;
}

static void run_fold_case(reducer_isa isa, reducer_op op, unisum_dtype dtype, size_t n, bool into)
{
	size_t size = dtype_size(dtype), bytes = n * size;
	struct guarded dst, a, b;

	guarded_init(&dst, bytes, rnd_below(64));
	guarded_init(&a, bytes, rnd_below(64));
	guarded_init(&b, bytes, rnd_below(64));
	for (size_t i = 0; i < n; i++) {
		put_elem(a.p, i, size, rnd_elem(dtype));
		/* Equal operands now and then: the -0/+0 and tie cases. */
		uint64_t v = rnd_below(8) == 0 ? get_elem(a.p, i, size) ^ (rnd_below(2) ? 1ull << (8 * size - 1) : 0)
					       : rnd_elem(dtype);
		put_elem(b.p, i, size, v);
	}
	unsigned char *a_copy = malloc(bytes + 1);

	assert_non_null(a_copy);
	memcpy(a_copy, a.p, bytes);
	if (into)
		reducer_fold_into(op, a.p, b.p, n, dtype);
	else
		reducer_fold(op, dst.p, a.p, b.p, n, dtype);
	const unsigned char *got = into ? a.p : dst.p;

	for (size_t i = 0; i < n; i++) {
		uint64_t x = get_elem(a_copy, i, size), y = get_elem(b.p, i, size);
		bool any_nan;
		uint64_t want = ref_fold(op, dtype, x, y, &any_nan), g = get_elem(got, i, size);

		if (g != want && !(any_nan && elem_is_nan(dtype, g)))
			fail_msg("%s isa %s %s n %zu: element %zu is 0x%" PRIx64 ", want 0x%" PRIx64
				 " (operands 0x%" PRIx64 " 0x%" PRIx64 ")", fold_names[op],
				 reducer_isa_name(isa), dtype_name(dtype), n, i, g, want, x, y);
	}
	guarded_check(&dst, "dst");
	guarded_check(&a, "a");
	guarded_check(&b, "b");
	free(dst.base);
	free(a.base);
	free(b.base);
	free(a_copy);
}

static void test_fold_random(void **state)
{
	(void)state;
	FOR_EACH_ISA(isa) {
		for (int op = REDUCER_MIN; op < REDUCER_OP_COUNT; op++)
			for (int dtype = 0; dtype < UNISUM_DTYPE_COUNT; dtype++)
				for (size_t k = 0; k < FIXED_LENGTHS + RANDOM_LENGTHS; k++)
					run_fold_case(isa, (reducer_op)op, (unisum_dtype)dtype,
						      length_at(k), k % 2 == 0);
	}
}

/* The cases a random draw may miss, at every lane position. */
static void test_fold_specials(void **state)
{
	(void)state;
	static const uint32_t f32[] = { 0x00000000, 0x80000000, 0x7fc00000, 0xffc00001,
					0x7f800000, 0xff800000, 0x3f800000, 0xbf800000 };
	FOR_EACH_ISA(isa) {
		for (size_t p = 0; p < 8; p++) {
			for (size_t q = 0; q < 8; q++) {
				float a[37], b[37], d[37];

				for (size_t i = 0; i < 37; i++) {
					a[i] = f32_of(f32[p]);
					b[i] = f32_of(f32[q]);
				}
				for (int op = REDUCER_MIN; op <= REDUCER_MAX; op++) {
					reducer_fold((reducer_op)op, d, a, b, 37, UNISUM_FLOAT32);
					bool any_nan;
					uint64_t want = ref_fold((reducer_op)op, UNISUM_FLOAT32, f32[p],
								 f32[q], &any_nan);

					for (size_t i = 0; i < 37; i++) {
						uint32_t g = bits_of_f32(d[i]);

						if (g != want && !(any_nan && isnan(d[i])))
							fail_msg("%s isa %s 0x%08x 0x%08x at %zu: 0x%08x, want 0x%08x",
								 fold_names[op], reducer_isa_name(isa), f32[p],
								 f32[q], i, g, (unsigned)want);
					}
				}
			}
		}
	}
	/* min(-0, +0) and max(-0, +0) in either order. */
	float z[2] = { -0.0f, 0.0f }, w[2] = { 0.0f, -0.0f }, r[2];

	reducer_fold(REDUCER_MIN, r, z, w, 2, UNISUM_FLOAT32);
	assert_true(signbit(r[0]) && signbit(r[1]));
	reducer_fold(REDUCER_MAX, r, z, w, 2, UNISUM_FLOAT32);
	assert_true(!signbit(r[0]) && !signbit(r[1]));
}

/* ---- Sums of chosen values ---- */

/*
 * Sums the pair (a, b) placed at every index of arrays of several lengths
 * (so that it lands in every SIMD lane, in the unrolled loop, the
 * single-vector loop and the tail) on every path, and checks the result is
 * `want`.
 */
static void check_pair(unisum_dtype dtype, uint64_t a, uint64_t b, uint64_t want)
{
	static const size_t lengths[] = { 1, 7, 37, 300 };
	size_t size = dtype_size(dtype);

	assert_true(ref_add(dtype, a, b) == want ||
		    (elem_is_nan(dtype, want) && elem_is_nan(dtype, ref_add(dtype, a, b))));
	FOR_EACH_ISA(isa) {
		for (size_t k = 0; k < sizeof(lengths) / sizeof(lengths[0]); k++) {
			size_t n = lengths[k];
			unsigned char *x = malloc(n * size + 3), *y = malloc(n * size + 5);
			unsigned char *xp = x + 3, *yp = y + 5;

			assert_non_null(x);
			assert_non_null(y);
			for (size_t i = 0; i < n; i++) {
				put_elem(xp, i, size, a);
				put_elem(yp, i, size, b);
			}
			reducer_sum_into(xp, yp, n, dtype);
			for (size_t i = 0; i < n; i++) {
				uint64_t got = get_elem(xp, i, size);

				if (got != want)
					fail_msg("isa %s %s 0x%" PRIx64 " + 0x%" PRIx64
						 " at %zu of %zu is 0x%" PRIx64 ", want 0x%" PRIx64,
						 reducer_isa_name(isa), dtype_name(dtype), a, b,
						 i, n, got, want);
			}
			free(x);
			free(y);
		}
	}
}

static void test_sum_f16_ties(void **state)
{
	(void)state;
	/* 1 + 2^-11 is half-way between 1 (even) and 1 + 2^-10 (odd). */
	check_pair(UNISUM_FLOAT16, 0x3c00, 0x1000, 0x3c00);
	check_pair(UNISUM_FLOAT16, 0xbc00, 0x9000, 0xbc00);
	/* 1 + 3 * 2^-11 is half-way between 1 + 2^-10 (odd) and 1 + 2^-9. */
	check_pair(UNISUM_FLOAT16, 0x3c01, 0x1000, 0x3c02);
	check_pair(UNISUM_FLOAT16, 0xbc01, 0x9000, 0xbc02);
	/* Just above and below a tie. */
	check_pair(UNISUM_FLOAT16, 0x3c00, 0x1001, 0x3c01);
	check_pair(UNISUM_FLOAT16, 0x3c01, 0x0fff, 0x3c01);
	/* 2048 + 1 is half-way between 2048 (even) and 2050; 2050 + 1
	 * between 2050 (odd) and 2052. */
	check_pair(UNISUM_FLOAT16, 0x6800, 0x3c00, 0x6800);
	check_pair(UNISUM_FLOAT16, 0x6801, 0x3c00, 0x6802);
}

static void test_sum_bf16_ties(void **state)
{
	(void)state;
	/* 1 + 2^-8 is half-way between 1 (even) and 1 + 2^-7 (odd). */
	check_pair(UNISUM_BFLOAT16, 0x3f80, 0x3b80, 0x3f80);
	check_pair(UNISUM_BFLOAT16, 0xbf80, 0xbb80, 0xbf80);
	/* 1 + 3 * 2^-8 is half-way between 1 + 2^-7 (odd) and 1 + 2^-6. */
	check_pair(UNISUM_BFLOAT16, 0x3f81, 0x3b80, 0x3f82);
	check_pair(UNISUM_BFLOAT16, 0xbf81, 0xbb80, 0xbf82);
	/* Just above and below a tie. */
	check_pair(UNISUM_BFLOAT16, 0x3f80, 0x3b81, 0x3f81);
	check_pair(UNISUM_BFLOAT16, 0x3f81, 0x3b7f, 0x3f81);
	/* 256 + 1 is half-way between 256 (even) and 258. */
	check_pair(UNISUM_BFLOAT16, 0x4380, 0x3f80, 0x4380);
	check_pair(UNISUM_BFLOAT16, 0x4381, 0x3f80, 0x4382);
}

static void test_sum_specials(void **state)
{
	(void)state;
	/* float16: NaN in, NaN out (canonical, quiet, positive). */
	check_pair(UNISUM_FLOAT16, 0x7e00, 0x3c00, F16_QNAN);
	check_pair(UNISUM_FLOAT16, 0x7c01, 0x3c00, F16_QNAN);	/* signalling */
	check_pair(UNISUM_FLOAT16, 0xfe17, 0x7d00, F16_QNAN);	/* two NaNs */
	check_pair(UNISUM_FLOAT16, 0x7c00, 0xfc00, F16_QNAN);	/* inf - inf */
	check_pair(UNISUM_FLOAT16, 0x7c00, 0x3c00, 0x7c00);
	check_pair(UNISUM_FLOAT16, 0xfc00, 0xbc00, 0xfc00);
	/* Overflow: 65504 + 65504, and 65504 + 16 (= 65520, the tie into
	 * infinity), but 65504 + 8 stays finite. */
	check_pair(UNISUM_FLOAT16, 0x7bff, 0x7bff, 0x7c00);
	check_pair(UNISUM_FLOAT16, 0x7bff, 0x4c00, 0x7c00);
	check_pair(UNISUM_FLOAT16, 0xfbff, 0xcc00, 0xfc00);
	check_pair(UNISUM_FLOAT16, 0x7bff, 0x4800, 0x7bff);
	/* Subnormals stay exact (no flush to zero), and carry into normal. */
	check_pair(UNISUM_FLOAT16, 0x0001, 0x0001, 0x0002);
	check_pair(UNISUM_FLOAT16, 0x03ff, 0x0001, 0x0400);
	check_pair(UNISUM_FLOAT16, 0x8001, 0x0001, 0x0000);
	check_pair(UNISUM_FLOAT16, 0x8001, 0x8000, 0x8001);
	check_pair(UNISUM_FLOAT16, 0x8000, 0x8000, 0x8000);

	/* bfloat16: the same stories. */
	check_pair(UNISUM_BFLOAT16, 0x7fc0, 0x3f80, BF16_QNAN);
	check_pair(UNISUM_BFLOAT16, 0x7f81, 0x3f80, BF16_QNAN);
	check_pair(UNISUM_BFLOAT16, 0xffff, 0x7f85, BF16_QNAN);
	check_pair(UNISUM_BFLOAT16, 0x7f80, 0xff80, BF16_QNAN);
	check_pair(UNISUM_BFLOAT16, 0x7f80, 0x3f80, 0x7f80);
	/* The largest finite plus itself, plus half its ulp (2^119, the tie
	 * into infinity), and plus a quarter ulp (stays finite). */
	check_pair(UNISUM_BFLOAT16, 0x7f7f, 0x7f7f, 0x7f80);
	check_pair(UNISUM_BFLOAT16, 0x7f7f, 0x7b00, 0x7f80);
	check_pair(UNISUM_BFLOAT16, 0xff7f, 0xfb00, 0xff80);
	check_pair(UNISUM_BFLOAT16, 0x7f7f, 0x7a80, 0x7f7f);
	check_pair(UNISUM_BFLOAT16, 0x0001, 0x0001, 0x0002);
	check_pair(UNISUM_BFLOAT16, 0x007f, 0x0001, 0x0080);
	check_pair(UNISUM_BFLOAT16, 0x8001, 0x0001, 0x0000);

	/* float32 and float64: infinities, overflow, subnormals. */
	check_pair(UNISUM_FLOAT32, 0x7f7fffff, 0x7f7fffff, 0x7f800000);
	check_pair(UNISUM_FLOAT32, 0x00000001, 0x00000001, 0x00000002);
	check_pair(UNISUM_FLOAT32, 0x7f800000, 0xff800000, 0xffc00000);
	check_pair(UNISUM_FLOAT32, 0x7fa00000, 0x3f800000, 0x7fe00000);
	check_pair(UNISUM_FLOAT64, 0x0000000000000001ull, 0x0000000000000001ull,
		   0x0000000000000002ull);
	check_pair(UNISUM_FLOAT64, 0x7fefffffffffffffull, 0x7fefffffffffffffull,
		   0x7ff0000000000000ull);

	/* Integers wrap. */
	check_pair(UNISUM_INT32, 0x7fffffff, 1, 0x80000000);
	check_pair(UNISUM_INT32, 0xffffffff, 0xffffffff, 0xfffffffe);
	check_pair(UNISUM_INT64, 0x7fffffffffffffffull, 1, 0x8000000000000000ull);
}

/* ---- Out-of-bounds accesses, caught by inaccessible pages ---- */

/*
 * Runs every sum and division with each buffer either ending exactly where
 * an inaccessible page starts or starting exactly where one ends: a read or
 * write of even one element too many crashes the test.
 */
static void test_page_guards(void **state)
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE);
	size_t span = 4 * page;
	unsigned char *region;

	(void)state;
	/* Three buffers, each with a guard page either side. */
	region = mmap(NULL, 3 * (span + 2 * page), PROT_READ | PROT_WRITE,
		      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	assert_true(region != MAP_FAILED);
	for (int k = 0; k < 3; k++) {
		unsigned char *lo = region + (size_t)k * (span + 2 * page);

		assert_int_equal(mprotect(lo, page, PROT_NONE), 0);
		assert_int_equal(mprotect(lo + page + span, page, PROT_NONE), 0);
	}
	FOR_EACH_ISA(isa) {
		for (int dtype = 0; dtype < UNISUM_DTYPE_COUNT; dtype++) {
			size_t size = dtype_size(dtype);

			for (size_t k = 0; k < FIXED_LENGTHS; k++) {
				size_t n = fixed_lengths[k], bytes = n * size;
				unsigned char *buf[3];

				if (bytes > span)
					continue;
				for (int j = 0; j < 3; j++) {
					unsigned char *start = region + (size_t)j * (span + 2 * page) + page;

					/* Alternate: flush against the end, or the start. */
					buf[j] = (k + (size_t)j) % 2 ? start + span - bytes : start;
					memset(buf[j], 0, bytes);
				}
				reducer_sum(buf[0], buf[1], buf[2], n, (unisum_dtype)dtype);
				reducer_sum_into(buf[1], buf[2], n, (unisum_dtype)dtype);
				reducer_divide(buf[2], n, (unisum_dtype)dtype, 3);
			}
		}
	}
	munmap(region, 3 * (span + 2 * page));
}

/* ---- Division ---- */

static void test_divide_random(void **state)
{
	static const int divisors[] = { 2, 3, 4, 7, 8, 10, 64, 1000, 65536, 1 << 30 };

	(void)state;
	FOR_EACH_ISA(isa) {
		for (int dtype = 0; dtype < UNISUM_DTYPE_COUNT; dtype++) {
			size_t size = dtype_size(dtype);

			for (size_t k = 0; k < FIXED_LENGTHS + RANDOM_LENGTHS; k++) {
				size_t n = length_at(k), bytes = n * size;
				int divisor = divisors[rnd_below(sizeof(divisors) / sizeof(divisors[0]))];
				struct guarded buf;
				unsigned char *want = malloc(bytes + 1);

				assert_non_null(want);
				guarded_init(&buf, bytes, rnd_below(64));
				for (size_t i = 0; i < n; i++) {
					uint64_t x = rnd_elem((unisum_dtype)dtype);

					put_elem(buf.p, i, size, x);
					put_elem(want, i, size, ref_divide((unisum_dtype)dtype, x, divisor));
				}
				reducer_divide(buf.p, n, (unisum_dtype)dtype, divisor);
				check_results("divide", isa, (unisum_dtype)dtype, buf.p, want,
					      NULL, NULL, n);
				guarded_check(&buf, "divide");
				free(buf.base);
				free(want);
			}
		}
	}
}

/* One value divided on every path, at every index of a short array. */
static void check_quotient(unisum_dtype dtype, uint64_t x, int divisor, uint64_t want)
{
	size_t size = dtype_size(dtype), n = 37;
	unsigned char *buf = malloc(n * size + 1), *p = buf + 1;

	assert_non_null(buf);
	assert_true(ref_divide(dtype, x, divisor) == want);
	FOR_EACH_ISA(isa) {
		for (size_t i = 0; i < n; i++)
			put_elem(p, i, size, x);
		reducer_divide(p, n, dtype, divisor);
		for (size_t i = 0; i < n; i++)
			if (get_elem(p, i, size) != want)
				fail_msg("isa %s %s 0x%" PRIx64 " / %d at %zu is 0x%" PRIx64
					 ", want 0x%" PRIx64, reducer_isa_name(isa),
					 dtype_name(dtype), x, divisor, i,
					 get_elem(p, i, size), want);
	}
	free(buf);
}

static void test_divide_known(void **state)
{
	(void)state;
	/* Floor division, as Python: -7 // 2 == -4, 7 // 2 == 3. */
	check_quotient(UNISUM_INT32, (uint32_t)-7, 2, (uint32_t)-4);
	check_quotient(UNISUM_INT32, 7, 2, 3);
	check_quotient(UNISUM_INT32, (uint32_t)-6, 3, (uint32_t)-2);
	check_quotient(UNISUM_INT32, (uint32_t)-1, 3, (uint32_t)-1);
	check_quotient(UNISUM_INT32, (uint32_t)-1, 4, (uint32_t)-1);
	check_quotient(UNISUM_INT32, (uint32_t)INT32_MIN, 2, (uint32_t)(INT32_MIN / 2));
	check_quotient(UNISUM_INT32, (uint32_t)INT32_MIN, 3, (uint32_t)-715827883);
	check_quotient(UNISUM_INT32, (uint32_t)INT32_MAX, 7, 306783378);
	check_quotient(UNISUM_INT64, (uint64_t)-7, 2, (uint64_t)-4);
	check_quotient(UNISUM_INT64, (uint64_t)INT64_MIN, 3, (uint64_t)-3074457345618258603ll);
	check_quotient(UNISUM_INT64, (uint64_t)INT64_MIN, 8, (uint64_t)(INT64_MIN / 8));
	check_quotient(UNISUM_INT64, (uint64_t)-9, 8, (uint64_t)-2);
	/* Floats: 3 / 2, float16 1 / 3 rounded, float16 NaN stays NaN. */
	check_quotient(UNISUM_FLOAT32, bits_of_f32(3.0f), 2, bits_of_f32(1.5f));
	check_quotient(UNISUM_FLOAT64, bits_of_f64(-3.0), 4, bits_of_f64(-0.75));
	check_quotient(UNISUM_FLOAT16, 0x3c00, 3, 0x3555);
	check_quotient(UNISUM_FLOAT16, 0x7bff, 2, 0x77ff);
	check_quotient(UNISUM_FLOAT16, 0x0001, 2, 0x0000);	/* tie to even zero */
	check_quotient(UNISUM_FLOAT16, 0x0003, 2, 0x0002);	/* tie to even 2 */
	check_quotient(UNISUM_FLOAT16, 0x7d00, 3, F16_QNAN);
	check_quotient(UNISUM_BFLOAT16, 0x3f80, 3, 0x3eab);
	check_quotient(UNISUM_BFLOAT16, 0x0003, 2, 0x0002);
	check_quotient(UNISUM_BFLOAT16, 0xff81, 3, BF16_QNAN);
}

static void test_divide_by_one(void **state)
{
	uint16_t h[3] = { 0x3c00, 0x7c01, 0x0001 };
	int32_t v[2] = { -7, 7 };

	(void)state;
	reducer_divide(h, 3, UNISUM_FLOAT16, 1);
	assert_int_equal(h[0], 0x3c00);
	assert_int_equal(h[1], 0x7c01);
	assert_int_equal(h[2], 0x0001);
	reducer_divide(v, 2, UNISUM_INT32, 1);
	assert_int_equal(v[0], -7);
	assert_int_equal(v[1], 7);
}

/* ---- Conversions ---- */

static void test_conversions_known(void **state)
{
	(void)state;
	assert_true(reducer_f16_to_f32(0x3c00) == 1.0f);
	assert_true(reducer_f16_to_f32(0x7bff) == 65504.0f);
	assert_true(reducer_f16_to_f32(0xc000) == -2.0f);
	assert_true(reducer_f16_to_f32(0x3555) == 0x1.554p-2f);
	assert_true(reducer_f16_to_f32(0x0400) == 0x1p-14f);
	assert_true(reducer_f16_to_f32(0x0001) == 0x1p-24f);
	assert_true(reducer_f16_to_f32(0x03ff) == 0x3ffp-24f);
	assert_true(reducer_f16_to_f32(0x7c00) == INFINITY);
	assert_true(reducer_f16_to_f32(0xfc00) == -INFINITY);
	assert_true(isnan(reducer_f16_to_f32(0x7e00)));
	assert_true(isnan(reducer_f16_to_f32(0x7c01)));
	assert_int_equal(bits_of_f32(reducer_f16_to_f32(0x8000)), 0x80000000);

	assert_int_equal(reducer_f32_to_f16(1.0f), 0x3c00);
	assert_int_equal(reducer_f32_to_f16(65504.0f), 0x7bff);
	assert_int_equal(reducer_f32_to_f16(65519.996f), 0x7bff);
	assert_int_equal(reducer_f32_to_f16(65520.0f), 0x7c00);	/* tie up */
	assert_int_equal(reducer_f32_to_f16(1e10f), 0x7c00);
	assert_int_equal(reducer_f32_to_f16(-1e10f), 0xfc00);
	assert_int_equal(reducer_f32_to_f16(1.0f + 0x1p-11f), 0x3c00);	/* tie down */
	assert_int_equal(reducer_f32_to_f16(1.0f + 0x3p-11f), 0x3c02);	/* tie up */
	assert_int_equal(reducer_f32_to_f16(0x1p-24f), 0x0001);
	assert_int_equal(reducer_f32_to_f16(0x1p-25f), 0x0000);	/* tie to 0 */
	assert_int_equal(reducer_f32_to_f16(0x1.000002p-25f), 0x0001);
	assert_int_equal(reducer_f32_to_f16(0x3p-25f), 0x0002);	/* tie to even */
	assert_int_equal(reducer_f32_to_f16(0x5p-25f), 0x0002);	/* tie to even */
	assert_int_equal(reducer_f32_to_f16(0x1p-30f), 0x0000);
	assert_int_equal(reducer_f32_to_f16(-0x1p-30f), 0x8000);
	assert_int_equal(reducer_f32_to_f16(0x1.ffcp-15f), 0x0400);	/* rounds to normal */
	assert_int_equal(reducer_f32_to_f16(INFINITY), 0x7c00);
	assert_true((reducer_f32_to_f16(NAN) & 0x7e00) == 0x7e00);	/* quiet NaN */
	assert_true((reducer_f32_to_f16(f32_of(0x7f800001)) & 0x7e00) == 0x7e00);

	assert_true(reducer_bf16_to_f32(0x3f80) == 1.0f);
	assert_true(reducer_bf16_to_f32(0xc040) == -3.0f);
	assert_true(reducer_bf16_to_f32(0x7f7f) == 0x1.fep127f);
	assert_true(reducer_bf16_to_f32(0x0001) == 0x1p-133f);
	assert_true(reducer_bf16_to_f32(0x7f80) == INFINITY);
	assert_true(isnan(reducer_bf16_to_f32(0x7fc0)));

	assert_int_equal(reducer_f32_to_bf16(1.0f), 0x3f80);
	assert_int_equal(reducer_f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);	/* tie down */
	assert_int_equal(reducer_f32_to_bf16(1.0f + 0x3p-8f), 0x3f82);	/* tie up */
	assert_int_equal(reducer_f32_to_bf16(1.0f + 0x1.02p-8f), 0x3f81);
	assert_int_equal(reducer_f32_to_bf16(FLT_MAX), 0x7f80);	/* overflows */
	assert_int_equal(reducer_f32_to_bf16(-FLT_MAX), 0xff80);
	assert_int_equal(reducer_f32_to_bf16(0x1p-133f), 0x0001);
	assert_int_equal(reducer_f32_to_bf16(0x1p-134f), 0x0000);	/* tie to 0 */
	assert_int_equal(reducer_f32_to_bf16(0x3p-134f), 0x0002);	/* tie to even */
	assert_int_equal(reducer_f32_to_bf16(0x1p-149f), 0x0000);
	assert_int_equal(reducer_f32_to_bf16(INFINITY), 0x7f80);
	assert_true((reducer_f32_to_bf16(NAN) & 0x7fc0) == 0x7fc0);
	assert_true((reducer_f32_to_bf16(f32_of(0x7f800001)) & 0x7fc0) == 0x7fc0);	/* quieted */
	assert_true((reducer_f32_to_bf16(f32_of(0xffffffff)) & 0xffc0) == 0xffc0);
}

/* Every float16 and bfloat16 widens as the reference says, and rounding
 * a random float32 agrees with the reference. */
static void test_conversions_sweep(void **state)
{
	(void)state;
	for (uint32_t h = 0; h < 65536; h++) {
		float f = reducer_f16_to_f32((uint16_t)h), r = ref_decode((uint16_t)h, &f16_format);
		float g = reducer_bf16_to_f32((uint16_t)h), s = ref_decode((uint16_t)h, &bf16_format);

		/* A value that is not NaN survives the round trip. */
		if (isnan(r)) {
			assert_true(isnan(f));
		} else {
			assert_int_equal(bits_of_f32(f), bits_of_f32(r));
			assert_int_equal(reducer_f32_to_f16(f), h);
		}
		if (isnan(s)) {
			assert_true(isnan(g));
		} else {
			assert_int_equal(bits_of_f32(g), bits_of_f32(s));
			assert_int_equal(reducer_f32_to_bf16(g), h);
		}
	}
	for (int i = 0; i < 1000000; i++) {
		/* Random bits, and random values in float16's range. */
		float f = i % 2 ? f32_of((uint32_t)rnd())
				: (float)ldexp(rnd_unit() * 2 - 1, (int)rnd_below(48) - 30);

		if (isnan(f))
			continue;
		if (reducer_f32_to_f16(f) != ref_encode(f, &f16_format, 0))
			fail_msg("float16 of 0x%08x is 0x%04x, want 0x%04x", bits_of_f32(f),
				 reducer_f32_to_f16(f), ref_encode(f, &f16_format, 0));
		if (reducer_f32_to_bf16(f) != ref_encode(f, &bf16_format, 0))
			fail_msg("bfloat16 of 0x%08x is 0x%04x, want 0x%04x", bits_of_f32(f),
				 reducer_f32_to_bf16(f), ref_encode(f, &bf16_format, 0));
	}
}

/* ---- Path control ---- */

static void test_isa_control(void **state)
{
	reducer_isa best = reducer_active_isa();

	(void)state;
	assert_string_equal(reducer_isa_name(REDUCER_ISA_SCALAR), "scalar");
	assert_string_equal(reducer_isa_name(REDUCER_ISA_AVX2), "avx2");
	assert_string_equal(reducer_isa_name(REDUCER_ISA_AVX512), "avx512");
	assert_true(reducer_isa_is_supported(REDUCER_ISA_SCALAR));
	assert_true(reducer_isa_is_supported(best));
	for (int isa = 0; isa < ISA_COUNT; isa++) {
		if (reducer_isa_is_supported((reducer_isa)isa)) {
			assert_int_equal(reducer_force_isa((reducer_isa)isa), 0);
			assert_int_equal(reducer_active_isa(), isa);
			printf("test_reducer: isa %s supported\n",
			       reducer_isa_name((reducer_isa)isa));
		} else {
			assert_int_equal(reducer_force_isa((reducer_isa)isa), UNISUM_EINVAL);
			printf("test_reducer: isa %s NOT supported, not tested\n",
			       reducer_isa_name((reducer_isa)isa));
		}
	}
	assert_int_equal(reducer_force_isa((reducer_isa)ISA_COUNT), UNISUM_EINVAL);
	assert_false(reducer_isa_is_supported((reducer_isa)ISA_COUNT));
	assert_int_equal(reducer_force_isa(best), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_isa_control),
		cmocka_unit_test(test_conversions_known),
		cmocka_unit_test(test_conversions_sweep),
		cmocka_unit_test(test_sum_random),
		cmocka_unit_test(test_sum_f16_ties),
		cmocka_unit_test(test_sum_bf16_ties),
		cmocka_unit_test(test_sum_specials),
		cmocka_unit_test(test_page_guards),
		cmocka_unit_test(test_fold_random),
		cmocka_unit_test(test_fold_specials),
		cmocka_unit_test(test_divide_random),
		cmocka_unit_test(test_divide_known),
		cmocka_unit_test(test_divide_by_one),
	};

	return cmocka_run_group_tests(tests, setup_seed, NULL);
}
