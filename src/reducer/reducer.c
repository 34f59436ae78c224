/*
 * reducer.c - the reducer's dispatch, its scalar path and the reference
 * float16/bfloat16 conversions.
 *
 * Dispatch: the first call (of any reducer_* function) detects the CPU once
 * under pthread_once and installs the best table in an atomic pointer,
 * unless reducer_force_isa() installed one first.  Every later call is one
 * atomic load and an indirect call, so the hot path takes no lock.
 *
 * The scalar path is the reference: the SIMD files must produce the same
 * bits for every input, and use the element helpers here for their tails.
 * float16 and bfloat16 arithmetic widens to float32 (exact), adds or
 * divides in float32 and rounds back to nearest-even; a NaN result is the
 * canonical quiet NaN (see reducer_impl.h).  Integer sums wrap, computed in
 * unsigned arithmetic so that overflow is defined.  Integer division is
 * floor division, as Python and torch do it (-7 // 2 == -4).
 *
 * Nothing here relies on the floating-point environment beyond the default
 * one: round to nearest-even, no flush-to-zero, no denormals-are-zero.
 */
#include <pthread.h>
#include <stdatomic.h>

#include "reducer/reducer_impl.h"

#if REDUCER_HAVE_X86
#include <cpuid.h>
#endif

/* ---- Reference conversions ---- */

static uint32_t float_bits(float f)
{
	uint32_t u;

	memcpy(&u, &f, sizeof(u));
	return u;
}

static float bits_float(uint32_t u)
{
	float f;

	memcpy(&f, &u, sizeof(f));
	return f;
}

/*
 * float16 to float32 is exact.  A NaN keeps its sign and payload and comes
 * back quiet, as the F16C instruction vcvtph2ps does.
 */
float reducer_f16_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
	uint32_t exponent = (h >> 10) & 0x1fu;
	uint32_t mantissa = h & 0x3ffu;
	uint32_t e32;

	if (exponent == 0x1f) {
		if (mantissa == 0)
			return bits_float(sign | 0x7f800000u);
		return bits_float(sign | 0x7fc00000u | (mantissa << 13));
	}
	if (exponent != 0)
		return bits_float(sign | ((exponent + 112) << 23) | (mantissa << 13));
	if (mantissa == 0)
		return bits_float(sign);
	/* A subnormal: shift the leading one up to the implicit bit. */
	e32 = 113;
	while (!(mantissa & 0x400u)) {
		mantissa <<= 1;
		e32--;
	}
	return bits_float(sign | (e32 << 23) | ((mantissa & 0x3ffu) << 13));
}

/*
 * float32 to float16, rounded to nearest-even, overflowing to infinity.
 * A NaN keeps its sign and the top of its payload and comes back quiet, as
 * vcvtps2ph does.
 */
uint16_t reducer_f32_to_f16(float f)
{
	uint32_t x = float_bits(f);
	uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
	uint32_t mantissa, shift, q, rest, half;

	x &= 0x7fffffffu;
	if (x > 0x7f800000u)
		return (uint16_t)(sign | 0x7e00u | ((x >> 13) & 0x3ffu));
	/* 65520 is halfway between 65504 (odd mantissa) and 65536: ties go
	 * up, to infinity. */
	if (x >= 0x477ff000u)
		return sign | 0x7c00u;
	if (x >= 0x38800000u) {
		/* A normal result: rebias the exponent (127 - 15 = 112) and
		 * round the 13 dropped bits; a carry into the exponent is
		 * what rounding up to the next binade means. */
		x += 0xfffu + ((x >> 13) & 1u);
		return (uint16_t)(sign | ((x - 0x38000000u) >> 13));
	}
	/* 2^-25 is halfway between 0 and the smallest subnormal 2^-24: ties
	 * go to the even one, zero. */
	if (x <= 0x33000000u)
		return sign;
	/* A subnormal result: the value in units of 2^-24, rounded.  A
	 * result of 0x400 is the smallest normal, which is also right. */
	mantissa = (x & 0x7fffffu) | 0x800000u;
	shift = 126 - (x >> 23);
	q = mantissa >> shift;
	rest = mantissa & ((1u << shift) - 1);
	half = 1u << (shift - 1);
	if (rest > half || (rest == half && (q & 1u)))
		q++;
	return (uint16_t)(sign | q);
}

/* bfloat16 is the top half of a float32: widening is a shift, exact, and
 * a NaN keeps its bits. */
float reducer_bf16_to_f32(uint16_t h)
{
	return bits_float((uint32_t)h << 16);
}

/* float32 to bfloat16, rounded to nearest-even; a NaN keeps its sign and
 * the top of its payload and comes back quiet. */
uint16_t reducer_f32_to_bf16(float f)
{
	uint32_t x = float_bits(f);

	if ((x & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((x >> 16) | 0x40u);
	/* Adding 0x7fff plus the lowest kept bit carries into the kept bits
	 * exactly when the dropped half is above a half, or a half with an
	 * odd kept part; the largest finite values carry into infinity. */
	x += 0x7fffu + ((x >> 16) & 1u);
	return (uint16_t)(x >> 16);
}

uint16_t reducer_f16_round(float f)
{
	if (f != f)
		return REDUCER_F16_QNAN;
	return reducer_f32_to_f16(f);
}

uint16_t reducer_bf16_round(float f)
{
	if (f != f)
		return REDUCER_BF16_QNAN;
	return reducer_f32_to_bf16(f);
}

/* ---- The scalar path ---- */

static void scalar_sum_f32(void *dst, const void *a, const void *b, size_t n)
{
	unsigned char *d = dst;
	const unsigned char *x = a, *y = b;

	for (size_t i = 0; i < n; i++)
		reducer_store_f32(d + 4 * i, reducer_load_f32(x + 4 * i) +
				  reducer_load_f32(y + 4 * i));
}

static void scalar_sum_f64(void *dst, const void *a, const void *b, size_t n)
{
	unsigned char *d = dst;
	const unsigned char *x = a, *y = b;

	for (size_t i = 0; i < n; i++)
		reducer_store_f64(d + 8 * i, reducer_load_f64(x + 8 * i) +
				  reducer_load_f64(y + 8 * i));
}

static void scalar_sum_f16(void *dst, const void *a, const void *b, size_t n)
{
	unsigned char *d = dst;
	const unsigned char *x = a, *y = b;

	for (size_t i = 0; i < n; i++) {
		float s = reducer_f16_to_f32(reducer_load_u16(x + 2 * i)) +
			  reducer_f16_to_f32(reducer_load_u16(y + 2 * i));

		reducer_store_u16(d + 2 * i, reducer_f16_round(s));
	}
}

static void scalar_sum_bf16(void *dst, const void *a, const void *b, size_t n)
{
	unsigned char *d = dst;
	const unsigned char *x = a, *y = b;

	for (size_t i = 0; i < n; i++) {
		float s = reducer_bf16_to_f32(reducer_load_u16(x + 2 * i)) +
			  reducer_bf16_to_f32(reducer_load_u16(y + 2 * i));

		reducer_store_u16(d + 2 * i, reducer_bf16_round(s));
	}
}

/* Signed integers add as unsigned ones: same bits, and wrapping is
 * defined. */
static void scalar_sum_i32(void *dst, const void *a, const void *b, size_t n)
{
	unsigned char *d = dst;
	const unsigned char *x = a, *y = b;

	for (size_t i = 0; i < n; i++)
		reducer_store_u32(d + 4 * i, reducer_load_u32(x + 4 * i) +
				  reducer_load_u32(y + 4 * i));
}

static void scalar_sum_i64(void *dst, const void *a, const void *b, size_t n)
{
	unsigned char *d = dst;
	const unsigned char *x = a, *y = b;

	for (size_t i = 0; i < n; i++)
		reducer_store_u64(d + 8 * i, reducer_load_u64(x + 8 * i) +
				  reducer_load_u64(y + 8 * i));
}

static void scalar_divide_f32(void *buf, size_t n, int divisor)
{
	unsigned char *p = buf;
	float d = (float)divisor;

	for (size_t i = 0; i < n; i++)
		reducer_store_f32(p + 4 * i, reducer_load_f32(p + 4 * i) / d);
}

static void scalar_divide_f64(void *buf, size_t n, int divisor)
{
	unsigned char *p = buf;
	double d = (double)divisor;

	for (size_t i = 0; i < n; i++)
		reducer_store_f64(p + 8 * i, reducer_load_f64(p + 8 * i) / d);
}

static void scalar_divide_f16(void *buf, size_t n, int divisor)
{
	unsigned char *p = buf;
	float d = (float)divisor;

	for (size_t i = 0; i < n; i++) {
		float q = reducer_f16_to_f32(reducer_load_u16(p + 2 * i)) / d;

		reducer_store_u16(p + 2 * i, reducer_f16_round(q));
	}
}

static void scalar_divide_bf16(void *buf, size_t n, int divisor)
{
	unsigned char *p = buf;
	float d = (float)divisor;

	for (size_t i = 0; i < n; i++) {
		float q = reducer_bf16_to_f32(reducer_load_u16(p + 2 * i)) / d;

		reducer_store_u16(p + 2 * i, reducer_bf16_round(q));
	}
}

/* The power of two that `divisor` is, as a shift, or -1. */
static int power_of_two_shift(int divisor)
{
	int shift = 0;

	if (divisor <= 0 || (divisor & (divisor - 1)) != 0)
		return -1;
	while ((1 << shift) != divisor)
		shift++;
	return shift;
}

/*
 * Floor division.  C's / truncates toward zero, so a negative dividend
 * with a remainder is one too high.  A power-of-two divisor takes a shift
 * instead of a hardware divide: for x < 0, floor(x / 2^k) == ~(~x >> k),
 * and ~x is then non-negative, so no shift of a negative number is needed.
 */
void reducer_scalar_divide_i32(void *buf, size_t n, int divisor)
{
	unsigned char *p = buf;
	int shift = power_of_two_shift(divisor);

	for (size_t i = 0; i < n; i++) {
		int32_t x = (int32_t)reducer_load_u32(p + 4 * i);
		int32_t q;

		if (shift >= 0) {
			q = x < 0 ? ~(~x >> shift) : x >> shift;
		} else {
			q = x / divisor;
			if (x % divisor != 0 && x < 0)
				q--;
		}
		reducer_store_u32(p + 4 * i, (uint32_t)q);
	}
}

void reducer_scalar_divide_i64(void *buf, size_t n, int divisor)
{
	unsigned char *p = buf;
	int shift = power_of_two_shift(divisor);

	for (size_t i = 0; i < n; i++) {
		int64_t x = (int64_t)reducer_load_u64(p + 8 * i);
		int64_t q;

		if (shift >= 0) {
			q = x < 0 ? ~(~x >> shift) : x >> shift;
		} else {
			q = x / divisor;
			if (x % divisor != 0 && x < 0)
				q--;
		}
		reducer_store_u64(p + 8 * i, (uint64_t)q);
	}
}

const struct reducer_ops reducer_scalar_ops = {
	.isa = REDUCER_ISA_SCALAR,
	.sum = {
		[UNISUM_FLOAT32] = scalar_sum_f32,
		[UNISUM_FLOAT64] = scalar_sum_f64,
		[UNISUM_FLOAT16] = scalar_sum_f16,
		[UNISUM_BFLOAT16] = scalar_sum_bf16,
		[UNISUM_INT32] = scalar_sum_i32,
		[UNISUM_INT64] = scalar_sum_i64,
	},
	.divide = {
		[UNISUM_FLOAT32] = scalar_divide_f32,
		[UNISUM_FLOAT64] = scalar_divide_f64,
		[UNISUM_FLOAT16] = scalar_divide_f16,
		[UNISUM_BFLOAT16] = scalar_divide_bf16,
		[UNISUM_INT32] = reducer_scalar_divide_i32,
		[UNISUM_INT64] = reducer_scalar_divide_i64,
	},
};

/* ---- Dispatch ---- */

#define ISA_COUNT 3

/* What the CPU can run, filled once by detect_cpu(). */
static bool isa_supported[ISA_COUNT];
static pthread_once_t detect_once = PTHREAD_ONCE_INIT;

/* The table in use: NULL until the first call or reducer_force_isa(). */
static _Atomic(const struct reducer_ops *) active_ops;

static const struct reducer_ops *isa_ops(reducer_isa isa)
{
	switch (isa) {
#if REDUCER_HAVE_X86
	case REDUCER_ISA_AVX512:
		return &reducer_avx512_ops;
	case REDUCER_ISA_AVX2:
		return &reducer_avx2_ops;
#endif
	default:
		return &reducer_scalar_ops;
	}
}

#if REDUCER_HAVE_X86
/* F16C straight from CPUID leaf 1 (ECX bit 29): clang's
 * __builtin_cpu_supports does not know the name.  It needs no OS support
 * beyond AVX's, which the AVX2 check covers. */
static bool cpu_has_f16c(void)
{
	unsigned int eax, ebx, ecx, edx;

	if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx))
		return false;
	return (ecx & bit_F16C) != 0;
}
#endif

/*
 * Runs once.  __builtin_cpu_supports also checks that the OS saves the
 * wide registers (XGETBV), so a flag here means the path really runs.  The
 * best table goes in only if reducer_force_isa() has not put one there.
 */
static void detect_cpu(void)
{
	const struct reducer_ops *expected = NULL;
	reducer_isa best = REDUCER_ISA_SCALAR;

	isa_supported[REDUCER_ISA_SCALAR] = true;
#if REDUCER_HAVE_X86
	__builtin_cpu_init();
	isa_supported[REDUCER_ISA_AVX2] = __builtin_cpu_supports("avx2") &&
					  cpu_has_f16c() &&
					  __builtin_cpu_supports("fma");
	isa_supported[REDUCER_ISA_AVX512] = __builtin_cpu_supports("avx512f") &&
					    __builtin_cpu_supports("avx512bw") &&
					    __builtin_cpu_supports("avx512vl") &&
					    __builtin_cpu_supports("avx512dq");
#endif
	for (int isa = 0; isa < ISA_COUNT; isa++)
		if (isa_supported[isa])
			best = (reducer_isa)isa;
	atomic_compare_exchange_strong(&active_ops, &expected, isa_ops(best));
}

static const struct reducer_ops *ops(void)
{
	const struct reducer_ops *o = atomic_load_explicit(&active_ops,
							   memory_order_acquire);

	if (o != NULL)
		return o;
	pthread_once(&detect_once, detect_cpu);
	return atomic_load_explicit(&active_ops, memory_order_acquire);
}

/* An unknown dtype is a caller bug (callers validate); it does nothing
 * rather than index past a table. */
static bool dtype_is_known(unisum_dtype dtype)
{
	return (unsigned)dtype < UNISUM_DTYPE_COUNT;
}

void reducer_sum_into(void *dst, const void *src, size_t n, unisum_dtype dtype)
{
	if (dtype_is_known(dtype))
		ops()->sum[dtype](dst, dst, src, n);
}

void reducer_sum(void *dst, const void *a, const void *b, size_t n, unisum_dtype dtype)
{
	if (dtype_is_known(dtype))
		ops()->sum[dtype](dst, a, b, n);
}

/* Dividing by 1 changes nothing (the quotient of every value by 1 is the
 * value), so it returns at once; a divisor below 1 breaks the contract
 * and leaves `buf` untouched. */
void reducer_divide(void *buf, size_t n, unisum_dtype dtype, int divisor)
{
	if (dtype_is_known(dtype) && divisor > 1)
		ops()->divide[dtype](buf, n, divisor);
}

reducer_isa reducer_active_isa(void)
{
	return ops()->isa;
}

const char *reducer_isa_name(reducer_isa isa)
{
	switch (isa) {
	case REDUCER_ISA_SCALAR:
		return "scalar";
	case REDUCER_ISA_AVX2:
		return "avx2";
	case REDUCER_ISA_AVX512:
		return "avx512";
	}
	return "unknown";
}

bool reducer_isa_is_supported(reducer_isa isa)
{
	pthread_once(&detect_once, detect_cpu);
	return (unsigned)isa < ISA_COUNT && isa_supported[isa];
}

int reducer_force_isa(reducer_isa isa)
{
	if (!reducer_isa_is_supported(isa))
		return UNISUM_EINVAL;
	atomic_store_explicit(&active_ops, isa_ops(isa), memory_order_release);
	return 0;
}
