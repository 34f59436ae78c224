/*
 * reducer_ref.c - test_reducer's reference: see reducer_ref.h.
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "reducer_ref.h"

/* ---- Random numbers (xorshift64*) ---- */

uint64_t rng_state;

uint64_t rnd(void)
{
	rng_state ^= rng_state >> 12;
	rng_state ^= rng_state << 25;
	rng_state ^= rng_state >> 27;
	return rng_state * 0x2545f4914f6cdd1dull;
}

size_t rnd_below(size_t n)
{
	return (size_t)(rnd() % n);
}

/* A double in [0, 1). */
double rnd_unit(void)
{
	return (double)(rnd() >> 11) * 0x1p-53;
}

/* ---- Element helpers ---- */

size_t dtype_size(unisum_dtype dtype)
{
	static const size_t sizes[UNISUM_DTYPE_COUNT] = { 4, 8, 2, 2, 4, 8 };

	return sizes[dtype];
}

const char *dtype_name(unisum_dtype dtype)
{
	static const char *const names[UNISUM_DTYPE_COUNT] = {
		"float32", "float64", "float16", "bfloat16", "int32", "int64"
	};

	return names[dtype];
}

uint64_t get_elem(const unsigned char *p, size_t i, size_t size)
{
	uint64_t v = 0;

	/* Little-endian x86: the low bytes of v are the element. */
	memcpy(&v, p + i * size, size);
	return v;
}

void put_elem(unsigned char *p, size_t i, size_t size, uint64_t v)
{
	memcpy(p + i * size, &v, size);
}

float f32_of(uint32_t u)
{
	float f;

	memcpy(&f, &u, sizeof(f));
	return f;
}

uint32_t bits_of_f32(float f)
{
	uint32_t u;

	memcpy(&u, &f, sizeof(u));
	return u;
}

double f64_of(uint64_t u)
{
	double d;

	memcpy(&d, &u, sizeof(d));
	return d;
}

uint64_t bits_of_f64(double d)
{
	uint64_t u;

	memcpy(&u, &d, sizeof(u));
	return u;
}

/* ---- The reference: 16-bit floats by arithmetic, not bit tricks ---- */

/* A 16-bit float format: float16 (5, 10) or bfloat16 (8, 7). */

const struct small_format f16_format = { 5, 10, F16_QNAN };
const struct small_format bf16_format = { 8, 7, BF16_QNAN };

int format_bias(const struct small_format *fmt)
{
	return (1 << (fmt->exponent_bits - 1)) - 1;
}

float ref_decode(uint16_t h, const struct small_format *fmt)
{
	int mbits = fmt->mantissa_bits, bias = format_bias(fmt);
	int exponent = (h >> mbits) & ((1 << fmt->exponent_bits) - 1);
	int mantissa = h & ((1 << mbits) - 1);
	double v;

	if (exponent == (1 << fmt->exponent_bits) - 1)
		v = mantissa ? NAN : INFINITY;
	else if (exponent == 0)
		v = ldexp(mantissa, 1 - bias - mbits);
	else
		v = ldexp(mantissa + (1 << mbits), exponent - bias - mbits);
	return (float)((h & 0x8000) ? -v : v);
}

/* Rounds a float32 to the format, nearest-even; NaN gives `nan`. */
uint16_t ref_encode(float f, const struct small_format *fmt, uint16_t nan)
{
	int mbits = fmt->mantissa_bits, bias = format_bias(fmt);
	int min_exponent = 1 - bias, exponent;
	uint16_t sign = signbit(f) ? 0x8000 : 0;
	uint16_t inf = (uint16_t)(((1 << fmt->exponent_bits) - 1) << mbits);
	double a = fabs((double)f), quantum, q, value;

	if (isnan(f))
		return nan;
	if (isinf(f))
		return sign | inf;
	if (a == 0)
		return sign;
	frexp(a, &exponent);
	exponent--;	/* a is in [2^exponent, 2^(exponent + 1)) */
	if (exponent < min_exponent)
		exponent = min_exponent;
	quantum = ldexp(1.0, exponent - mbits);
	q = nearbyint(a / quantum);	/* default mode: ties to even */
	value = q * quantum;
	if (value >= ldexp(1.0, bias + 1))
		return sign | inf;
	if (value < ldexp(1.0, min_exponent))
		return (uint16_t)(sign | (uint16_t)q);	/* subnormal or zero */
	frexp(value, &exponent);
	exponent--;
	return (uint16_t)(sign | ((exponent + bias) << mbits) |
			  (uint16_t)(ldexp(value, mbits - exponent) - (1 << mbits)));
}

const struct small_format *small_format_of(unisum_dtype dtype)
{
	return dtype == UNISUM_FLOAT16 ? &f16_format : &bf16_format;
}

/* a + b as the reducer must compute it, as raw bits. */
uint64_t ref_add(unisum_dtype dtype, uint64_t a, uint64_t b)
{
	switch (dtype) {
	case UNISUM_FLOAT32:
		return bits_of_f32(f32_of((uint32_t)a) + f32_of((uint32_t)b));
	case UNISUM_FLOAT64:
		return bits_of_f64(f64_of(a) + f64_of(b));
	case UNISUM_FLOAT16:
	case UNISUM_BFLOAT16: {
		const struct small_format *fmt = small_format_of(dtype);
		float s = ref_decode((uint16_t)a, fmt) + ref_decode((uint16_t)b, fmt);

		return ref_encode(s, fmt, fmt->qnan);
	}
	case UNISUM_INT32:
		return (uint32_t)(a + b);
	default:
		return a + b;
	}
}

/* Python's floor division. */
int64_t ref_floor_div(int64_t x, int divisor)
{
	__int128 r = ((__int128)x % divisor + divisor) % divisor;

	return (int64_t)(((__int128)x - r) / divisor);
}

uint64_t ref_divide(unisum_dtype dtype, uint64_t x, int divisor)
{
	switch (dtype) {
	case UNISUM_FLOAT32:
		return bits_of_f32(f32_of((uint32_t)x) / (float)divisor);
	case UNISUM_FLOAT64:
		return bits_of_f64(f64_of(x) / (double)divisor);
	case UNISUM_FLOAT16:
	case UNISUM_BFLOAT16: {
		const struct small_format *fmt = small_format_of(dtype);

		return ref_encode(ref_decode((uint16_t)x, fmt) / (float)divisor, fmt,
				  fmt->qnan);
	}
	case UNISUM_INT32:
		return (uint32_t)(int32_t)ref_floor_div((int32_t)(uint32_t)x, divisor);
	default:
		return (uint64_t)ref_floor_div((int64_t)x, divisor);
	}
}

/* Whether the element is a NaN of a float dtype. */
bool elem_is_nan(unisum_dtype dtype, uint64_t v)
{
	switch (dtype) {
	case UNISUM_FLOAT32:
		return isnan(f32_of((uint32_t)v));
	case UNISUM_FLOAT64:
		return isnan(f64_of(v));
	case UNISUM_FLOAT16:
		return (v & 0x7c00) == 0x7c00 && (v & 0x3ff);
	case UNISUM_BFLOAT16:
		return (v & 0x7f80) == 0x7f80 && (v & 0x7f);
	default:
		return false;
	}
}

/* ---- Random elements ---- */

/* A float32 that is usually ordinary (so sums round) and sometimes
 * special. */
float rnd_f32(void)
{
	static const uint32_t special[] = {
		0x00000000, 0x80000000, 0x7f800000, 0xff800000, 0x7fc00000,
		0xffc00001, 0x7f800001, 0x7f7fffff, 0xff7fffff, 0x00800000,
		0x00000001, 0x807fffff, 0x00400000,
	};

	switch (rnd_below(8)) {
	case 0:
		return f32_of(special[rnd_below(sizeof(special) / sizeof(special[0]))]);
	case 1:
		return f32_of((uint32_t)rnd());
	default:
		return (float)ldexp(rnd_unit() * 2 - 1, (int)rnd_below(40) - 20);
	}
}

double rnd_f64(void)
{
	static const uint64_t special[] = {
		0, 0x8000000000000000ull, 0x7ff0000000000000ull,
		0xfff0000000000000ull, 0x7ff8000000000000ull, 0x7ff0000000000001ull,
		0x7fefffffffffffffull, 0x0000000000000001ull, 0x000fffffffffffffull,
	};

	switch (rnd_below(8)) {
	case 0:
		return f64_of(special[rnd_below(sizeof(special) / sizeof(special[0]))]);
	case 1:
		return f64_of(rnd());
	default:
		return ldexp(rnd_unit() * 2 - 1, (int)rnd_below(80) - 40);
	}
}

/* A 16-bit float: half the time any bit pattern (NaN, infinities and
 * subnormals included), half the time exponents close together, so that
 * sums round and tie often. */
uint16_t rnd_small(unisum_dtype dtype)
{
	uint16_t bits = (uint16_t)rnd();

	if (rnd_below(2))
		return bits;
	if (dtype == UNISUM_FLOAT16)
		return (uint16_t)((bits & 0x83ff) | ((13 + rnd_below(4)) << 10));
	return (uint16_t)((bits & 0x807f) | ((125 + rnd_below(4)) << 7));
}

uint64_t rnd_elem(unisum_dtype dtype)
{
	switch (dtype) {
	case UNISUM_FLOAT32:
		return bits_of_f32(rnd_f32());
	case UNISUM_FLOAT64:
		return bits_of_f64(rnd_f64());
	case UNISUM_FLOAT16:
	case UNISUM_BFLOAT16:
		return rnd_small(dtype);
	case UNISUM_INT32:
		return (uint32_t)rnd();
	default:
		return rnd();
	}
}

