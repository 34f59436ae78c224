/*
 * onebit.c - one sign bit per element and one scale per partition
 * (compress.h), signSGD's compressor with BytePS's scaling: the scale is
 * the mean |x|, so that the decoded partition keeps the input's l1 norm.
 *
 * Both directions are one pass over memory; with AVX2 the encoder takes
 * 8 sign bits at a time (movemask) and the decoder turns 8 bits into 8
 * floats with one compare, as the reducer dispatches (at first use).
 */
#include <math.h>
#include <stdbool.h>

#include "compress/codecs.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define ONEBIT_X86 1
#endif

static size_t onebit_bytes(const struct compress_spec *s, size_t n)
{
	(void)s;
	return 4 + 4 * ((n + 31) / 32);
}

/* Words folded into the double sum at a time (compress.h's order). */
#define ONEBIT_FOLD_WORDS 1024

/* The tail word (fewer than 32 elements) at in: its bits; adds |x| to *sum
 * in order. */
static uint32_t pack_tail(const float *in, size_t n, double *sum)
{
	uint32_t bits = 0;
	float part = 0;

	for (size_t j = 0; j < n; j++) {
		bits |= (uint32_t)(signbit(in[j]) != 0) << j;
		part += fabsf(in[j]);
	}
	*sum += part;
	return bits;
}

/* Sign bits of in[0 .. n) into words; returns the sum of |x|, in the
 * order compress.h gives (the AVX2 path's lanes). */
static double pack_scalar(const float *in, size_t n, uint8_t *words)
{
	float lane[8] = { 0 };
	double sum = 0;
	size_t w = 0;

	for (; (w + 1) * 32 <= n; w++) {
		const float *p = in + w * 32;
		uint32_t bits = 0;

		for (int j = 0; j < 32; j++)
			bits |= (uint32_t)(signbit(p[j]) != 0) << j;
		for (int j = 0; j < 8; j++)
			lane[j] += (fabsf(p[j]) + fabsf(p[8 + j])) + (fabsf(p[16 + j]) + fabsf(p[24 + j]));
		codec_store_u32(words + 4 * w, bits);
		if (w % ONEBIT_FOLD_WORDS == ONEBIT_FOLD_WORDS - 1) {
			for (int j = 0; j < 8; j++)
				sum += lane[j], lane[j] = 0;
		}
	}
	for (int j = 0; j < 8; j++)
		sum += lane[j];
	if (w * 32 < n)
		codec_store_u32(words + 4 * w, pack_tail(in + w * 32, n - w * 32, &sum));
	return sum;
}

#ifdef ONEBIT_X86
__attribute__((target("avx2")))
static double pack_avx2(const float *in, size_t n, uint8_t *words)
{
	const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
	__m256 acc = _mm256_setzero_ps();
	double sum = 0;
	size_t w = 0;

	for (; (w + 1) * 32 <= n; w++) {
		const float *p = in + w * 32;
		__m256 a = _mm256_loadu_ps(p), b = _mm256_loadu_ps(p + 8);
		__m256 c = _mm256_loadu_ps(p + 16), d = _mm256_loadu_ps(p + 24);
		uint32_t bits = (uint32_t)_mm256_movemask_ps(a) |
				(uint32_t)_mm256_movemask_ps(b) << 8 |
				(uint32_t)_mm256_movemask_ps(c) << 16 |
				(uint32_t)_mm256_movemask_ps(d) << 24;

		acc = _mm256_add_ps(acc, _mm256_add_ps(
			_mm256_add_ps(_mm256_and_ps(a, abs_mask), _mm256_and_ps(b, abs_mask)),
			_mm256_add_ps(_mm256_and_ps(c, abs_mask), _mm256_and_ps(d, abs_mask))));
		codec_store_u32(words + 4 * w, bits);
		/* float32 lanes lose precision over millions of elements: fold
		 * them into the double. */
		if (w % ONEBIT_FOLD_WORDS == ONEBIT_FOLD_WORDS - 1) {
			float lanes[8];

			_mm256_storeu_ps(lanes, acc);
			for (int i = 0; i < 8; i++)
				sum += lanes[i];
			acc = _mm256_setzero_ps();
		}
	}
	float lanes[8];

	_mm256_storeu_ps(lanes, acc);
	for (int i = 0; i < 8; i++)
		sum += lanes[i];
	if (w * 32 < n)
		codec_store_u32(words + 4 * w, pack_tail(in + w * 32, n - w * 32, &sum));
	return sum;
}

__attribute__((target("avx2")))
static void unpack_avx2(const uint8_t *words, size_t n, float scale, float *out)
{
	const __m256i lane_bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
	const __m256 pos = _mm256_set1_ps(scale);
	const __m256 sign = _mm256_set1_ps(-0.0f);
	size_t i = 0;

	for (; i + 8 <= n; i += 8) {
		uint32_t byte = words[i / 8];
		__m256i set = _mm256_and_si256(_mm256_set1_epi32((int)byte), lane_bit);
		__m256 neg = _mm256_castsi256_ps(_mm256_cmpeq_epi32(set, lane_bit));

		_mm256_storeu_ps(out + i, _mm256_xor_ps(pos, _mm256_and_ps(neg, sign)));
	}
	for (; i < n; i++)
		out[i] = (words[i / 8] >> (i % 8)) & 1 ? -scale : scale;
}
#endif

static void onebit_encode(const struct compress_spec *s, const float *in, size_t n, void *out,
			  uint64_t seed)
{
	uint8_t *o = out;
	double sum;

	(void)seed;
#ifdef ONEBIT_X86
	if (compress_use_avx2())
		sum = pack_avx2(in, n, o + 4);
	else
#endif
		sum = pack_scalar(in, n, o + 4);
	codec_store_f32(o, s->scaling ? (n ? (float)(sum / (double)n) : 0.0f) : 1.0f);
}

static int onebit_decode(const struct compress_spec *s, const void *in, size_t len, float *out,
			 size_t n, uint64_t seed)
{
	const uint8_t *p = in;

	(void)seed;
	if (len != onebit_bytes(s, n))
		return -1;
	float scale = codec_load_f32(p);	/* NaN in, NaN out, as uncompressed */
	/* Bits past n in the last word must be clear: a canonical encoding. */
	if (n % 32 && codec_load_u32(p + 4 + 4 * (n / 32)) >> (n % 32))
		return -1;
#ifdef ONEBIT_X86
	if (compress_use_avx2()) {
		unpack_avx2(p + 4, n, scale, out);
		return 0;
	}
#endif
	for (size_t i = 0; i < n; i++)
		out[i] = (p[4 + i / 8] >> (i % 8)) & 1 ? -scale : scale;
	return 0;
}

const struct compress_codec compress_onebit = { "onebit", onebit_bytes, onebit_encode,
						onebit_decode };
