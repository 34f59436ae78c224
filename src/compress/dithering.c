/*
 * dithering.c - stochastic rounding to s levels (compress.h), QSGD's
 * quantizer: |x| / norm lies between two levels, and is rounded up with
 * the probability that makes the expected level exact.  Linear levels are
 * l/s; natural levels 2^(l - s) (l = 1 .. s) and 0, finer near 0, where
 * most gradients are.
 *
 * Fields of 2, 4 or 8 bits keep packing and unpacking to shifts within a
 * byte; the draws come from 32 LCG streams, one per SIMD lane of
 * four vectors (four chains of draws in flight, not one), so the AVX2 path
 * (linear levels: 32 elements at a time, norm included) and the scalar one
 * give the same bytes for the same seed.  The seed differs
 * per worker: two workers' roundings are independent.
 */
#include <math.h>

#include "compress/codecs.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define DITHER_X86 1
#endif

/* Elements whose squares are summed in float lanes before the double. */
#define DITHER_FOLD 8192

static int field_bits(int s)
{
	return s == 1 ? 2 : s <= 7 ? 4 : 8;
}

static size_t dithering_bytes(const struct compress_spec *s, size_t n)
{
	return 4 + ((size_t)field_bits(s->s) * n + 7) / 8;
}

/* Streams of draws: element i takes stream i % DITHER_STREAMS. */
#define DITHER_STREAMS 32

/* The streams' states for `seed`. */
static void streams_seed(uint64_t seed, uint32_t st[DITHER_STREAMS])
{
	for (int j = 0; j < DITHER_STREAMS; j++)
		st[j] = (uint32_t)compress_mix64(seed + (uint64_t)j) | 1u;
}

/* The next draw of a stream: a 32-bit LCG (Numerical Recipes' constants),
 * two instructions a lane; only its top 24 bits are used, the good ones. */
static inline uint32_t lcg32(uint32_t *x)
{
	*x = *x * 1664525u + 1013904223u;
	return *x;
}

/* The norm, in compress.h's order; NaN when an element is not finite. */
static float norm_scalar(const struct compress_spec *s, const float *in, size_t n)
{
	bool finite = true;

	if (!s->l2) {
		float m = 0;

		for (size_t i = 0; i < n; i++) {
			float a = fabsf(in[i]);

			finite &= a <= 3.40282347e38f;
			m = a > m ? a : m;
		}
		return finite ? m : NAN;
	}
	float lane[8] = { 0 };
	double sum = 0;

	for (size_t i = 0; i < n; i++) {
		finite &= fabsf(in[i]) <= 3.40282347e38f;
		lane[i % 8] += in[i] * in[i];
		if (i % DITHER_FOLD == DITHER_FOLD - 1)
			for (int j = 0; j < 8; j++)
				sum += lane[j], lane[j] = 0;
	}
	for (int j = 0; j < 8; j++)
		sum += lane[j];
	return finite ? (float)sqrt(sum) : NAN;
}

/* The level of v = |x| / norm in [0, 1] with natural levels, rounded with
 * draw u. */
static uint32_t natural_level(int s, float v, float u)
{
	if (!(v > 0))
		return 0;
	int e;
	float m = frexpf(v, &e);	/* v = m 2^e, m in [0.5, 1) */
	int l = e - 1 + s;		/* the level just below: 2^(e-1) */

	if (l >= s)
		return (uint32_t)s;	/* v == 1 */
	if (l < 1)	/* below the smallest level 2^(1-s): between 0 and it */
		return u < v / ldexpf(1.0f, 1 - s) ? 1 : 0;
	/* Between 2^(e-1) and 2^e: up with probability (v - lo) / lo = 2m - 1. */
	return (uint32_t)l + (u < 2 * m - 1);
}

/* Puts field `code` of element i (b bits) into out (zeroed). */
static inline void field_put(uint8_t *out, size_t i, int b, uint32_t code)
{
	size_t bit = i * (size_t)b;

	out[bit / 8] |= (uint8_t)(code << (bit % 8));
}

static void encode_scalar(const struct compress_spec *s, const float *in, size_t from, size_t n,
			  float scale, uint32_t st[DITHER_STREAMS], uint8_t *out)
{
	int b = field_bits(s->s);
	uint32_t sign_bit = 1u << (b - 1);

	for (size_t i = from; i < n; i++) {
		float u = (float)(lcg32(&st[i % DITHER_STREAMS]) >> 8) * (1.0f / 16777216.0f);
		float v = fabsf(in[i]) * scale;	/* |x| s / norm, or |x| / norm */
		uint32_t l;

		if (s->natural) {
			l = natural_level(s->s, v > 1 ? 1 : v, u);
		} else {
			float q = v + u;

			l = q >= (float)s->s ? (uint32_t)s->s : (uint32_t)q;
		}
		field_put(out, i, b, l | (l != 0 && signbit(in[i]) ? sign_bit : 0));
	}
}

#ifdef DITHER_X86
__attribute__((target("avx2")))
static float norm_avx2(const struct compress_spec *s, const float *in, size_t n, size_t *done)
{
	const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
	const __m256 big = _mm256_set1_ps(3.40282347e38f);
	__m256 acc = _mm256_setzero_ps(), bad = _mm256_setzero_ps();
	double sum = 0;
	float lanes[8];
	size_t i = 0;

	for (; i + 8 <= n; i += 8) {
		__m256 x = _mm256_loadu_ps(in + i), a = _mm256_and_ps(x, abs_mask);

		bad = _mm256_or_ps(bad, _mm256_cmp_ps(a, big, _CMP_NLE_UQ));	/* > max, or NaN */
		if (!s->l2) {
			acc = _mm256_max_ps(a, acc);	/* a > acc ? a : acc */
		} else {
			acc = _mm256_add_ps(acc, _mm256_mul_ps(x, x));
			if ((i + 8) % DITHER_FOLD == 0) {
				_mm256_storeu_ps(lanes, acc);
				for (int j = 0; j < 8; j++)
					sum += lanes[j];
				acc = _mm256_setzero_ps();
			}
		}
	}
	*done = i;
	_mm256_storeu_ps(lanes, acc);
	bool finite = _mm256_movemask_ps(bad) == 0;
	if (!s->l2) {
		float m = 0;

		for (int j = 0; j < 8; j++)
			m = lanes[j] > m ? lanes[j] : m;
		for (; i < n; i++) {
			float a = fabsf(in[i]);

			finite &= a <= 3.40282347e38f;
			m = a > m ? a : m;
		}
		return finite ? m : NAN;
	}
	/* The tail goes to its lanes (i % 8), then every lane to the sum. */
	for (; i < n; i++) {
		finite &= fabsf(in[i]) <= 3.40282347e38f;
		lanes[i % 8] += in[i] * in[i];
	}
	for (int j = 0; j < 8; j++)
		sum += lanes[j];
	return finite ? (float)sqrt(sum) : NAN;
}

/* 8 codes (level, and the sign where the element is negative and its level
 * not 0) of in[0 .. 8), the streams x advanced once each. */
__attribute__((target("avx2")))
static inline __m256i codes8(const float *in, __m256i *x, __m256 scale, __m256 top, int b)
{
	const __m256 unit = _mm256_set1_ps(1.0f / 16777216.0f);
	const __m256i high = _mm256_set1_epi32((int)0x80000000u);

	*x = _mm256_add_epi32(_mm256_mullo_epi32(*x, _mm256_set1_epi32(1664525)),
			      _mm256_set1_epi32(1013904223));
	__m256 u = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(*x, 8)), unit);
	__m256i raw = _mm256_loadu_si256((const __m256i *)in);
	__m256 a = _mm256_castsi256_ps(_mm256_andnot_si256(high, raw));
	__m256 q = _mm256_add_ps(_mm256_mul_ps(a, scale), u);
	__m256i l = _mm256_cvttps_epi32(_mm256_min_ps(q, top));	/* q >= 0 */
	/* The sign (raw's top bit) where the level is not 0. */
	__m256i has = _mm256_and_si256(_mm256_min_epu32(l, _mm256_set1_epi32(1)),
				       _mm256_srli_epi32(raw, 31));
	return _mm256_or_si256(l, _mm256_sll_epi32(has, _mm_cvtsi32_si128(b - 1)));
}

/* Linear levels, 32 elements at a time: their codes packed to bytes, in
 * order, then into b-bit fields. */
__attribute__((target("avx2")))
static size_t encode_avx2(const struct compress_spec *s, const float *in, size_t n, float scale,
			  uint32_t st[DITHER_STREAMS], uint8_t *out)
{
	const __m256 vscale = _mm256_set1_ps(scale), top = _mm256_set1_ps((float)s->s);
	const int b = field_bits(s->s);
	const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
	__m256i x0 = _mm256_loadu_si256((const __m256i *)st);
	__m256i x1 = _mm256_loadu_si256((const __m256i *)(st + 8));
	__m256i x2 = _mm256_loadu_si256((const __m256i *)(st + 16));
	__m256i x3 = _mm256_loadu_si256((const __m256i *)(st + 24));
	size_t i = 0;

	for (; i + 32 <= n; i += 32) {
		__m256i c0 = codes8(in + i, &x0, vscale, top, b);
		__m256i c1 = codes8(in + i + 8, &x1, vscale, top, b);
		__m256i c2 = codes8(in + i + 16, &x2, vscale, top, b);
		__m256i c3 = codes8(in + i + 24, &x3, vscale, top, b);
		/* 32 bytes; the packs interleave the 128-bit halves: reorder. */
		__m256i bytes = _mm256_permutevar8x32_epi32(
			_mm256_packus_epi16(_mm256_packus_epi32(c0, c1), _mm256_packus_epi32(c2, c3)),
			order);

		if (b == 8) {
			_mm256_storeu_si256((__m256i *)(out + i), bytes);
			continue;
		}
		if (b == 4) {
			/* Pairs: a + 16 b, 16 bytes in 16-bit slots; to bytes (each
			 * half packs its own), the halves' first 8 joined. */
			__m256i v = _mm256_maddubs_epi16(bytes, _mm256_set1_epi16(0x1001));
			v = _mm256_permute4x64_epi64(_mm256_packus_epi16(v, v), 0x08);
			_mm_storeu_si128((__m128i *)(out + i / 2), _mm256_castsi256_si128(v));
		} else {
			/* Quads: (a + 4 b) + 16 (c + 4 d), 8 bytes in 32-bit slots. */
			__m256i v = _mm256_maddubs_epi16(bytes, _mm256_set1_epi16(0x0401));
			v = _mm256_madd_epi16(v, _mm256_set1_epi32(0x00100001));
			v = _mm256_packus_epi16(_mm256_packus_epi32(v, v), v);
			v = _mm256_permutevar8x32_epi32(v, _mm256_setr_epi32(0, 4, 0, 0, 0, 0, 0, 0));
			_mm_storel_epi64((__m128i *)(out + i / 4), _mm256_castsi256_si128(v));
		}
	}
	_mm256_storeu_si256((__m256i *)st, x0);
	_mm256_storeu_si256((__m256i *)(st + 8), x1);
	_mm256_storeu_si256((__m256i *)(st + 16), x2);
	_mm256_storeu_si256((__m256i *)(st + 24), x3);
	return i;
}

/* Decodes whole groups of 8 fields with the value table (every code's
 * value, NaN past s); returns the elements done, or (size_t)-1 when a
 * level is above s. */
__attribute__((target("avx2")))
static size_t decode_avx2(const struct compress_spec *s, const uint8_t *p, size_t n,
			  const float value[256], float *out)
{
	const int b = field_bits(s->s);
	const __m256i field = _mm256_set1_epi32((1 << b) - 1);
	const __m256i level_max = _mm256_set1_epi32(s->s);
	const __m256i level_mask = _mm256_set1_epi32((1 << (b - 1)) - 1);
	const __m256i shifts = _mm256_setr_epi32(0, b, 2 * b, 3 * b, 4 * b, 5 * b, 6 * b, 7 * b);
	__m256i bad = _mm256_setzero_si256();
	size_t i = 0;

	for (; i + 8 <= n; i += 8) {
		__m256i c;

		if (b == 8) {
			c = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p + i)));
		} else {
			/* 8 fields: b bytes. */
			uint32_t w = b == 4 ? codec_load_u32(p + i / 2)
					    : (uint32_t)p[i / 4] | (uint32_t)p[i / 4 + 1] << 8;
			c = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)w), shifts), field);
		}
		bad = _mm256_or_si256(bad, _mm256_cmpgt_epi32(_mm256_and_si256(c, level_mask), level_max));
		_mm256_storeu_ps(out + i, _mm256_i32gather_ps(value, c, 4));
	}
	return _mm256_movemask_epi8(bad) ? (size_t)-1 : i;
}
#endif

static void dithering_encode(const struct compress_spec *s, const float *in, size_t n, void *out,
			     uint64_t seed)
{
	uint8_t *o = out;
	uint32_t st[DITHER_STREAMS];
	size_t done = 0, bytes = dithering_bytes(s, n);
	float norm;

	streams_seed(seed, st);
#ifdef DITHER_X86
	if (compress_use_avx2())
		norm = norm_avx2(s, in, n, &done);
	else
#endif
		norm = norm_scalar(s, in, n);
	codec_store_f32(o, norm);
	if (isnan(norm)) {
		memset(o + 4, 0, bytes - 4);	/* every element decodes as NaN */
		return;
	}
	/* |x| / norm (natural), or |x| s / norm (linear); 0 for a norm of 0. */
	float scale = norm > 0 ? (s->natural ? 1.0f : (float)s->s) / norm : 0.0f;
	done = 0;
#ifdef DITHER_X86
	if (compress_use_avx2() && !s->natural)
		done = encode_avx2(s, in, n, scale, st, o + 4);
#endif
	/* The scalar fields are or'ed into zeroed bytes (done is a multiple
	 * of 32: whole bytes). */
	size_t from = 4 + done * (size_t)field_bits(s->s) / 8;
	memset(o + from, 0, bytes - from);
	encode_scalar(s, in, done, n, scale, st, o + 4);
}

static inline float level_value(const struct compress_spec *s, uint32_t l)
{
	if (!s->natural)
		return (float)l / (float)s->s;
	return l == 0 ? 0.0f : ldexpf(1.0f, (int)l - s->s);
}

static int dithering_decode(const struct compress_spec *s, const void *in, size_t len,
			    float *out, size_t n, uint64_t seed)
{
	const uint8_t *p = in;
	int b = field_bits(s->s);
	uint32_t field = (1u << b) - 1, sign_bit = 1u << (b - 1);
	float value[256];

	(void)seed;
	if (len != dithering_bytes(s, n))
		return -1;
	float norm = codec_load_f32(p);	/* NaN in, NaN out */
	/* Every field's value: level times norm, signed. */
	for (uint32_t c = 0; c <= field; c++) {
		uint32_t l = c & (sign_bit - 1);
		float v = l <= (uint32_t)s->s ? level_value(s, l) * norm : NAN;

		value[c] = c & sign_bit ? -v : v;
	}
	size_t i = 0;
#ifdef DITHER_X86
	if (compress_use_avx2() && (i = decode_avx2(s, p + 4, n, value, out)) == (size_t)-1)
		return -1;
#endif
	for (; i < n; i++) {
		size_t bit = i * (size_t)b;
		uint32_t c = (p[4 + bit / 8] >> (bit % 8)) & field;

		if ((c & (sign_bit - 1)) > (uint32_t)s->s)
			return -1;
		out[i] = value[c];
	}
	/* The bits after the last field are 0. */
	size_t used = (size_t)b * n;
	if (used % 8 && p[4 + used / 8] >> (used % 8))
		return -1;
	return 0;
}

const struct compress_codec compress_dithering = { "dithering", dithering_bytes,
						   dithering_encode, dithering_decode };
