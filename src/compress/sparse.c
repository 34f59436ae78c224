/*
 * sparse.c - top-k and random-k (compress.h): k of a partition's elements
 * travel, the rest decode as 0.
 *
 * Top-k finds the k-th largest |x| on the bits of |x| (for floats that are
 * not NaN, the order of the bits is the order of the magnitudes; NaN
 * counts as the largest): a histogram of their top 11 bits (the exponent
 * and 3 bits of mantissa) finds the bucket that holds it, the elements of
 * that bucket are gathered, and a radix select among them finds it
 * exactly.  One more pass takes, in index order, every element above that
 * threshold and the first of those equal to it: two reads of the
 * partition, and one of a bucket.  Should the bucket's copy not fit in
 * memory, the radix select runs on the partition itself (four more
 * reads).
 *
 * Random-k's indices come from the seed (compress_randomk_indices), drawn
 * again on every side, so only the values travel.
 */
#include <math.h>
#include <stdlib.h>

#include "compress/codecs.h"

static inline uint32_t abs_bits(float x)
{
	uint32_t b;

	memcpy(&b, &x, 4);
	return b & 0x7fffffffu;
}

#if defined(__x86_64__)
#include <immintrin.h>
#define SPARSE_X86 1

/* skip_below()'s whole blocks of 8 (lo >= 1). */
__attribute__((target("avx2")))
static size_t skip_below_avx2(const float *in, size_t i, size_t n, uint32_t lo)
{
	const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
	const __m256i below = _mm256_set1_epi32((int)(lo - 1));

	for (; i + 8 <= n; i += 8) {
		__m256i a = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(in + i)), abs_mask);
		int hit = _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(a, below)));

		if (hit)
			return i + (size_t)__builtin_ctz((unsigned)hit);
	}
	return i;
}
#endif

static size_t topk_bytes(const struct compress_spec *s, size_t n)
{
	return 4 + 8 * compress_k(s, n);
}

/* The top bits of |x| the first histogram counts. */
#define TOPK_COARSE_SHIFT 20
#define TOPK_BUCKETS (1u << (31 - TOPK_COARSE_SHIFT))

/* A bucket copied on the stack up to this many elements. */
#define TOPK_STACK 4096

/* The k-th largest of n values (1 <= k <= n) into *t, and how many are
 * larger into *above, by a radix select, byte by byte from the top; the
 * values are vals[i], or abs_bits(floats[i]) when vals is NULL. */
static void radix_select(const uint32_t *vals, const float *floats, size_t n, size_t k,
			 uint32_t *t, size_t *above)
{
	uint32_t prefix = 0, mask = 0;
	size_t want = k, larger = 0;	/* still to find at or below; found above */

	for (int shift = 24; shift >= 0; shift -= 8) {
		size_t hist[256] = { 0 };

		for (size_t i = 0; i < n; i++) {
			uint32_t b = vals ? vals[i] : abs_bits(floats[i]);

			if ((b & mask) == prefix)
				hist[(b >> shift) & 0xff]++;
		}
		/* From the top bucket down, to the one holding the want-th. */
		int byte = 255;
		for (; byte > 0 && hist[byte] < want; byte--) {
			want -= hist[byte];
			larger += hist[byte];
		}
		prefix |= (uint32_t)byte << shift;
		mask |= 0xffu << shift;
	}
	*t = prefix;
	*above = larger;
}

/* The first index from i on whose abs_bits are lo or more; n if none.  The
 * passes after the histogram look for few elements (the threshold's
 * bucket and above it): AVX2 skips 8 at a time. */
static size_t skip_below(const float *in, size_t i, size_t n, uint32_t lo)
{
#ifdef SPARSE_X86
	if (compress_use_avx2())
		i = skip_below_avx2(in, i, n, lo);
#endif
	while (i < n && abs_bits(in[i]) < lo)
		i++;
	return i;
}

/* The k-th largest abs_bits of in[0 .. n) (1 <= k <= n) into *t, and how
 * many are larger into *above. */
static void select_kth(const float *in, size_t n, size_t k, uint32_t *t, size_t *above)
{
	uint32_t hist[4][TOPK_BUCKETS];	/* four, so that runs of one bucket do not wait */
	uint32_t stack[TOPK_STACK] = { 0 }, *cand = stack;	/* (zeroed: for the compiler) */
	size_t i = 0, larger = 0, want = k, m;

	memset(hist, 0, sizeof(hist));
	for (; i + 4 <= n; i += 4)
		for (int j = 0; j < 4; j++)
			hist[j][abs_bits(in[i + j]) >> TOPK_COARSE_SHIFT]++;
	for (; i < n; i++)
		hist[0][abs_bits(in[i]) >> TOPK_COARSE_SHIFT]++;
	/* From the top bucket down, to the one holding the want-th. */
	uint32_t bucket = TOPK_BUCKETS - 1;
	for (;; bucket--) {
		m = (size_t)hist[0][bucket] + hist[1][bucket] + hist[2][bucket] + hist[3][bucket];
		if (m >= want || bucket == 0)
			break;
		want -= m;
		larger += m;
	}
	if (m > TOPK_STACK && !(cand = calloc(m, sizeof(*cand)))) {
		radix_select(NULL, in, n, k, t, above);
		return;
	}
	size_t c = 0;
	uint32_t lo = bucket << TOPK_COARSE_SHIFT;
	for (i = lo ? skip_below(in, 0, n, lo) : 0; i < n; i = lo ? skip_below(in, i + 1, n, lo) : i + 1) {
		uint32_t b = abs_bits(in[i]);

		if (b >> TOPK_COARSE_SHIFT == bucket)
			cand[c++] = b;
	}
	radix_select(cand, NULL, c, want, t, above);
	*above += larger;
	if (cand != stack)
		free(cand);
}

static void topk_encode(const struct compress_spec *s, const float *in, size_t n, void *out,
			uint64_t seed)
{
	uint8_t *o = out;
	size_t k = compress_k(s, n), above, ties, j = 0;
	uint32_t t;

	(void)seed;
	codec_store_u32(o, (uint32_t)k);
	if (k == 0)
		return;
	select_kth(in, n, k, &t, &above);
	ties = k - above;	/* elements equal to t to take, the first ones */
	for (size_t i = t ? skip_below(in, 0, n, t) : 0; i < n && j < k;
	     i = t ? skip_below(in, i + 1, n, t) : i + 1) {
		uint32_t b = abs_bits(in[i]);

		if (b > t || (b == t && ties > 0 && ties--)) {
			codec_store_u32(o + 4 + 8 * j, (uint32_t)i);
			codec_store_f32(o + 8 + 8 * j, in[i]);
			j++;
		}
	}
}

static int topk_decode(const struct compress_spec *s, const void *in, size_t len, float *out,
		       size_t n, uint64_t seed)
{
	const uint8_t *p = in;
	size_t k = compress_k(s, n);

	(void)seed;
	if (len != topk_bytes(s, n) || codec_load_u32(p) != k)
		return -1;
	memset(out, 0, n * sizeof(*out));
	for (size_t j = 0; j < k; j++) {
		uint32_t i = codec_load_u32(p + 4 + 8 * j);

		/* Increasing indices, each in range. */
		if (i >= n || (j > 0 && i <= codec_load_u32(p + 4 + 8 * (j - 1))))
			return -1;
		out[i] = codec_load_f32(p + 8 + 8 * j);
	}
	return 0;
}

static size_t randomk_bytes(const struct compress_spec *s, size_t n)
{
	return 4 * compress_k(s, n);
}

/* The j-th of random-k's indices, advancing *state (the same walk as
 * compress_randomk_indices). */
static inline size_t randomk_next(uint64_t *state, size_t j, size_t n, size_t k)
{
	size_t lo = j * n / k, hi = (j + 1) * n / k;

	*state = compress_mix64(*state);
	return lo + (size_t)(((*state >> 32) * (uint64_t)(hi - lo)) >> 32);
}

static void randomk_encode(const struct compress_spec *s, const float *in, size_t n, void *out,
			   uint64_t seed)
{
	uint8_t *o = out;
	size_t k = compress_k(s, n);
	uint64_t state = seed;

	for (size_t j = 0; j < k; j++)
		codec_store_f32(o + 4 * j, in[randomk_next(&state, j, n, k)]);
}

static int randomk_decode(const struct compress_spec *s, const void *in, size_t len, float *out,
			  size_t n, uint64_t seed)
{
	const uint8_t *p = in;
	size_t k = compress_k(s, n);
	uint64_t state = seed;

	if (len != randomk_bytes(s, n))
		return -1;
	memset(out, 0, n * sizeof(*out));
	for (size_t j = 0; j < k; j++)
		out[randomk_next(&state, j, n, k)] = codec_load_f32(p + 4 * j);
	return 0;
}

void compress_randomk_clear(size_t n, size_t k, uint64_t seed, float *e)
{
	uint64_t state = seed;

	for (size_t j = 0; j < k; j++)
		e[randomk_next(&state, j, n, k)] = 0.0f;
}

void compress_randomk_indices(size_t n, size_t k, uint64_t seed, uint32_t *idx)
{
	uint64_t state = seed;

	for (size_t j = 0; j < k; j++)
		idx[j] = (uint32_t)randomk_next(&state, j, n, k);
}

const struct compress_codec compress_topk = { "topk", topk_bytes, topk_encode, topk_decode };
const struct compress_codec compress_randomk = { "randomk", randomk_bytes, randomk_encode,
						 randomk_decode };
