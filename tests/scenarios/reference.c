/*
 * reference.c - the scenarios' one data generator and their exact
 * reference (scenarios.h: scn_gen_bits, scn_fill, scn_verify).
 *
 * Every rank can compute every other rank's input, so the reference is
 * exact: it sums as the servers do, each machine's local ranks in rank
 * order, then the machines in order, float16 and bfloat16 rounded after
 * every addition, integers wrapping; an average is divided as the server
 * divides.  Checking every element costs (ranks x elements) per rank: this
 * is most of what check_sums computes, so the elements are built bit by bit
 * rather than converted, and the loops are folded per dtype.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reducer/reducer.h"
#include "scenarios.h"

/* ---- the generator and the reference ------------------------------------ */

/* The reference arithmetic below works on values in registers and on the
 * stack only.  It is most of a check_sums worker's time, so the sanitizer
 * runs leave it uninstrumented; every read and write of a buffer the
 * library shares (fill, verify) stays checked. */
#if defined(__clang__)
#define REFERENCE __attribute__((no_sanitize("address", "thread", "undefined")))
#else
#define REFERENCE
#endif
/* For a dtype known where it is called: each caller's switch gets its own
 * copy with the dtype's branches folded away. */
#define FOLDED static inline __attribute__((always_inline))

/* splitmix64's finalizer. */
FOLDED REFERENCE uint64_t mix(uint64_t x)
{
	x ^= x >> 30;
	x *= 0xbf58476d1ce4e5b9ull;
	x ^= x >> 27;
	x *= 0x94d049bb133111ebull;
	x ^= x >> 31;
	return x;
}

/* Rank r's stream for tensor `salt`: element i is made from mix(seed + i). */
static REFERENCE uint64_t seed_of(uint64_t salt, int r)
{
	return mix(salt * 0x9e3779b97f4a7c15ull + (uint64_t)r * 0x632be59bd9b4e019ull);
}

/* An element's bits from 64 random ones.  The floats are built bit by bit:
 * a random sign and significand in a few binades around 1 (float16
 * [1/4, 4), bfloat16 [1/4, 4), float32 and float64 [1/8, 32)), so
 * sums round and cancel but every partial sum is zero or a normal number
 * (the least significant bit of any element is at least 2^-12 for float16)
 * far from overflow, where the reference's conversions below are exact. */
FOLDED REFERENCE uint64_t elem_bits(unisum_dtype dt, uint64_t h)
{
	uint64_t sign = h >> 63, e = h >> 59;	/* the top bits; the rest the significand */
	switch (dt) {
	case UNISUM_FLOAT16:
		return sign << 15 | (13 + (e & 3)) << 10 | (h & 0x3ff);
	case UNISUM_BFLOAT16:
		return sign << 15 | (125 + (e & 3)) << 7 | (h & 0x7f);
	case UNISUM_FLOAT32:
		return sign << 31 | (124 + (e & 7)) << 23 | (h & 0x7fffff);
	case UNISUM_FLOAT64:
		return sign << 63 | (1020 + (e & 7)) << 52 | (h & 0xfffffffffffffull);
	case UNISUM_INT32:
		return (uint32_t)h;
	default:	/* UNISUM_INT64 */
		return h;
	}
}

FOLDED REFERENCE float f32_of(uint32_t bits)
{
	float f;
	memcpy(&f, &bits, sizeof f);
	return f;
}

FOLDED REFERENCE uint32_t bits_of(float f)
{
	uint32_t bits;
	memcpy(&bits, &f, sizeof bits);
	return bits;
}

/* float16 (zero or normal) to float32, exactly. */
FOLDED REFERENCE float f16_value(uint64_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000) << 16, mag = (uint32_t)h & 0x7fff;
	return f32_of(sign | (mag ? (mag << 13) + 0x38000000u : 0));
}

/* float32 (zero, or in float16's normal range) to float16, rounded to
 * nearest-even: the rounding the server applies after every addition. */
FOLDED REFERENCE uint64_t f16_round(float f)
{
	uint32_t x = bits_of(f), sign = x >> 16 & 0x8000, mag = x & 0x7fffffff;
	return sign | (mag ? (mag + 0xfff + (mag >> 13 & 1) - 0x38000000u) >> 13 : 0);
}

/* float32 to bfloat16, rounded to nearest-even. */
FOLDED REFERENCE uint64_t bf16_round(float f)
{
	uint32_t x = bits_of(f);
	return (x + 0x7fff + (x >> 16 & 1)) >> 16;
}

/* acc + x in the server's arithmetic, as bits. */
FOLDED REFERENCE uint64_t add_bits(unisum_dtype dt, uint64_t acc, uint64_t x)
{
	switch (dt) {
	case UNISUM_FLOAT16:
		return f16_round(f16_value(acc) + f16_value(x));
	case UNISUM_BFLOAT16:
		return bf16_round(f32_of((uint32_t)acc << 16) + f32_of((uint32_t)x << 16));
	case UNISUM_FLOAT32:
		return bits_of(f32_of((uint32_t)acc) + f32_of((uint32_t)x));
	case UNISUM_FLOAT64: {
		double a, b;
		memcpy(&a, &acc, sizeof a);
		memcpy(&b, &x, sizeof b);
		a += b;
		memcpy(&acc, &a, sizeof acc);
		return acc;
	}
	case UNISUM_INT32:
		return (uint32_t)(acc + x);
	default:
		return acc + x;
	}
}

/* The job's sum of element i (its bits), from every rank's seed: each
 * machine of L local ranks sums them in rank order, then the server sums
 * the machines in order. */
FOLDED REFERENCE uint64_t expect_bits(unisum_dtype dt, const uint64_t *seed, int size, int L,
				      size_t i)
{
	uint64_t acc = 0;
	for (int m = 0; m < size / L; m++) {
		uint64_t part = elem_bits(dt, mix(seed[m * L] + i));
		for (int l = 1; l < L; l++)
			part = add_bits(dt, part, elem_bits(dt, mix(seed[m * L + l] + i)));
		acc = m == 0 ? part : add_bits(dt, acc, part);
	}
	return acc;
}

/* Stores an element's bits as a dtype's element at dst. */
FOLDED void put_bits(size_t es, uint64_t bits, void *dst)
{
	uint16_t b16 = (uint16_t)bits;
	uint32_t b32 = (uint32_t)bits;
	if (es == 2)
		memcpy(dst, &b16, sizeof b16);
	else if (es == 4)
		memcpy(dst, &b32, sizeof b32);
	else
		memcpy(dst, &bits, sizeof bits);
}

/* The element of es bytes at src, as bits. */
FOLDED uint64_t get_bits(size_t es, const void *src)
{
	uint16_t b16;
	uint32_t b32;
	uint64_t b64;
	if (es == 2) {
		memcpy(&b16, src, sizeof b16);
		return b16;
	}
	if (es == 4) {
		memcpy(&b32, src, sizeof b32);
		return b32;
	}
	memcpy(&b64, src, sizeof b64);
	return b64;
}

/* Elements i0 .. i0 + n - 1 of rank `seed`'s input (gen_as) or of the job's
 * sum (expect_as), as bits into out; folded per dtype by the two below. */
FOLDED REFERENCE void gen_as(unisum_dtype dt, uint64_t seed, size_t i0, size_t n, uint64_t *out)
{
	for (size_t j = 0; j < n; j++)
		out[j] = elem_bits(dt, mix(seed + i0 + j));
}

FOLDED REFERENCE void expect_as(unisum_dtype dt, const uint64_t *seed, int size, int L, size_t i0,
				size_t n, uint64_t *out)
{
	for (size_t j = 0; j < n; j++)
		out[j] = expect_bits(dt, seed, size, L, i0 + j);
}

/* One case per dtype, so that each calls its own folded copy. */
#define FOR_DTYPE(dt, CALL)                                                                        \
	switch (dt) {                                                                              \
	case UNISUM_FLOAT16:                                                                       \
		CALL(UNISUM_FLOAT16);                                                              \
		break;                                                                             \
	case UNISUM_BFLOAT16:                                                                      \
		CALL(UNISUM_BFLOAT16);                                                             \
		break;                                                                             \
	case UNISUM_FLOAT32:                                                                       \
		CALL(UNISUM_FLOAT32);                                                              \
		break;                                                                             \
	case UNISUM_FLOAT64:                                                                       \
		CALL(UNISUM_FLOAT64);                                                              \
		break;                                                                             \
	case UNISUM_INT32:                                                                         \
		CALL(UNISUM_INT32);                                                                \
		break;                                                                             \
	default:                                                                                   \
		CALL(UNISUM_INT64);                                                                \
		break;                                                                             \
	}

static REFERENCE void gen_block(unisum_dtype dt, uint64_t seed, size_t i0, size_t n, uint64_t *out)
{
#define GEN(D) gen_as(D, seed, i0, n, out)
	FOR_DTYPE(dt, GEN)
#undef GEN
}

static REFERENCE void expect_block(unisum_dtype dt, const uint64_t *seed, int size, int L,
				   size_t i0, size_t n, uint64_t *out)
{
#define EXPECT(D) expect_as(D, seed, size, L, i0, n, out)
	FOR_DTYPE(dt, EXPECT)
#undef EXPECT
}

enum { BLOCK = 512 };	/* elements generated at a time, on the stack */

/* An average's expected bits from the sums': divided as the server does. */
static void divide_bits(unisum_dtype dt, int size, uint64_t *bits, size_t n)
{
	uint8_t el[BLOCK * 8];
	size_t es = unisum_dtype_size(dt);
	for (size_t j = 0; j < n; j++)
		put_bits(es, bits[j], el + j * es);
	reducer_divide(el, n, dt, size);
	for (size_t j = 0; j < n; j++)
		bits[j] = get_bits(es, el + j * es);
}

uint64_t scn_gen_bits(unisum_dtype dt, uint64_t salt, int r, size_t i)
{
	uint64_t bits;
	gen_block(dt, seed_of(salt, r), i, 1, &bits);
	return bits;
}

void scn_fill(const struct scn_ops *o, unisum_dtype dt, uint64_t salt, void *buf, size_t count)
{
	uint64_t seed = seed_of(salt, o->rank), bits[BLOCK];
	size_t es = unisum_dtype_size(dt);
	for (size_t i0 = 0; i0 < count; i0 += BLOCK) {
		size_t n = count - i0 < BLOCK ? count - i0 : BLOCK;
		gen_block(dt, seed, i0, n, bits);
		for (size_t j = 0; j < n; j++)
			put_bits(es, bits[j], (uint8_t *)buf + (i0 + j) * es);
	}
}

int scn_verify(const struct scn_ops *o, const char *what, unisum_dtype dt, uint64_t salt,
	       const void *buf, size_t count, bool average, char *msg, size_t len)
{
	uint64_t *seed = malloc(sizeof *seed * (size_t)o->size), want[BLOCK];
	if (seed == NULL) {
		snprintf(msg, len, "%s: out of memory", what);
		return UNISUM_ENOMEM;
	}
	for (int r = 0; r < o->size; r++)
		seed[r] = seed_of(salt, r);
	size_t es = unisum_dtype_size(dt), i = count;
	uint64_t got = 0;
	for (size_t i0 = 0; i0 < count && i == count; i0 += BLOCK) {
		size_t n = count - i0 < BLOCK ? count - i0 : BLOCK;
		expect_block(dt, seed, o->size, o->local_size, i0, n, want);
		if (average)
			divide_bits(dt, o->size, want, n);
		for (size_t j = 0; j < n && i == count; j++)
			if ((got = get_bits(es, (const uint8_t *)buf + (i0 + j) * es)) != want[j])
				i = i0 + j;
	}
	free(seed);
	if (i == count)
		return 0;
	snprintf(msg, len, "%s: %s element %zu of %zu: got 0x%" PRIx64 ", expected 0x%" PRIx64, what,
		 unisum_dtype_name(dt), i, count, got, want[i % BLOCK]);
	return UNISUM_EINVAL;
}
