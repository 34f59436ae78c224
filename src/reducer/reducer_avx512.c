/*
 * reducer_avx512.c - the AVX-512 path: 512-bit loops with masked tails.
 *
 * Every function carries its own target attribute (AVX-512 F, BW, VL, DQ),
 * so this file builds with plain -O2 and its code only runs once reducer.c
 * has seen the CPU report all four.  Nothing here needs AVX512_FP16 or
 * AVX512_BF16.  In particular vcvtneps2bf16 is not used on purpose: it
 * treats denormal inputs as zero (measured: 0x00010000 gives 0x0000, not
 * 0x0001), so it would not match the scalar path bit for bit.
 *
 * The loops are memory-bound: four vectors per iteration so that enough
 * loads are in flight, with a software prefetch 4 KiB ahead, then single
 * vectors, then one masked vector for the last few elements (a masked load
 * or store touches no byte outside its mask, so nothing outside
 * [dst, dst + n) is read or written).  Loads and stores are unaligned.
 * Within a vector the loads come before the store, which is what makes
 * `dst` equal to an operand safe.
 *
 * float16 widens with vcvtph2ps (exact) and narrows with vcvtps2ph in
 * round-to-nearest-even; bfloat16 widens by shifting and rounds with the
 * integer trick of reducer_f32_to_bf16(), both halves of each 32-bit lane
 * handled separately so that no lane crosses.  NaN results become the
 * canonical quiet NaN, as in the scalar path.
 */
#include "reducer/reducer_impl.h"

#if REDUCER_HAVE_X86

#include <immintrin.h>

#define AVX512_FN __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))

/* The mask of the first `count` lanes (count < 64). */
#define LOW_LANES(count) ((1ull << (count)) - 1)

/*
 * How far ahead of its loads a loop prefetches, in bytes.  The hardware
 * prefetchers stop at each 4 KiB page, and a loop whose vectors take many
 * instructions (the float16 and bfloat16 conversions) fills the reorder
 * buffer before enough cache misses are in flight: prefetching 4 KiB ahead
 * took float16 and bfloat16 sums from about 0.76 to 0.9-1.0 of memcpy's
 * bandwidth, and left float32 (already at memcpy's) unchanged.
 */
#define PREFETCH_BYTES 4096

/*
 * Prefetches the `len` bytes at p + o, a line at a time.  A macro, not a
 * function: GCC 12 splits a small function with an early return, then
 * judges the split part free of side effects (a prefetch does not count)
 * and deletes every call to it.
 */
#define PREFETCH_LINES(p, o, len)                                                 \
	for (size_t l_ = 0; l_ < (len); l_ += 64)                                  \
		_mm_prefetch((const char *)(p) + (o) + l_, _MM_HINT_T0)

/* What the sums and the divisions prefetch: the operands `x` and `y`
 * (`dst` is one of them in the common dst += src), or the buffer `p`. */
#define SUM_PREFETCH(o, len)                                                      \
	do {                                                                       \
		PREFETCH_LINES(x, (o), (len));                                     \
		PREFETCH_LINES(y, (o), (len));                                     \
	} while (0)
#define DIVIDE_PREFETCH(o, len) PREFETCH_LINES(p, (o), (len))

/*
 * The loop every AVX-512 sum and division shares.  `size` is the element
 * size and `lanes` the elements of one vector; STEP(o) handles the vector
 * at byte offset o and MSTEP(o, m) the lanes of mask m there;
 * PREFETCH(o, len) prefetches the `len` bytes at offset o.  The unrolled
 * loop prefetches PREFETCH_BYTES ahead of what it loads, but never past
 * the end: a prefetch cannot fault, but nothing there is worth a memory
 * access.
 */
#define AVX512_LOOP(size, lanes, STEP, MSTEP, PREFETCH)                          \
	do {                                                                       \
		const size_t vb_ = (size) * (lanes); /* bytes per vector */        \
		const size_t total_ = n * (size);                                  \
		size_t i_ = 0;                                                     \
                                                                                   \
		for (; i_ + 4 * (lanes) <= n; i_ += 4 * (lanes)) {                 \
			size_t o_ = i_ * (size);                                   \
                                                                                   \
			if (o_ + PREFETCH_BYTES < total_)                          \
				PREFETCH(o_ + PREFETCH_BYTES, 4 * vb_);            \
			STEP(o_);                                                  \
			STEP(o_ + vb_);                                            \
			STEP(o_ + 2 * vb_);                                        \
			STEP(o_ + 3 * vb_);                                        \
		}                                                                  \
		for (; i_ + (lanes) <= n; i_ += (lanes))                           \
			STEP(i_ * (size));                                         \
		if (i_ < n)                                                        \
			MSTEP(i_ * (size), LOW_LANES(n - i_));                     \
	} while (0)

/* ---- Narrowing ---- */

/* Rounds 16 float32 to float16; NaN becomes the canonical quiet NaN (a
 * float32 quiet NaN with no payload narrows to exactly 0x7e00). */
AVX512_FN static inline __m256i f16_round(__m512 v)
{
	__mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);

	v = _mm512_mask_mov_ps(v, nan, _mm512_castsi512_ps(_mm512_set1_epi32(0x7fc00000)));
	return _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

/* The low bfloat16 of each 32-bit lane as float32 (the even elements). */
AVX512_FN static inline __m512 bf16_even(__m512i v)
{
	return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
}

/* The high bfloat16 of each 32-bit lane as float32 (the odd elements). */
AVX512_FN static inline __m512 bf16_odd(__m512i v)
{
	return _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32((int)0xffff0000u)));
}

/* Rounds float32 to bfloat16 in the top half of each lane (the bottom
 * half is garbage), NaN to the canonical quiet NaN. */
AVX512_FN static inline __m512i bf16_round_high(__m512 v)
{
	__m512i bits = _mm512_castps_si512(v);
	__m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
	__m512i r = _mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
	__mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);

	return _mm512_mask_mov_epi32(r, nan, _mm512_set1_epi32(0x7fc00000));
}

/* Packs two rounded vectors back into 32 bfloat16: (even >> 16) | (odd &
 * 0xffff0000), one ternary-logic instruction after the shift. */
AVX512_FN static inline __m512i bf16_pack(__m512i even, __m512i odd)
{
	return _mm512_ternarylogic_epi32(_mm512_srli_epi32(even, 16), odd,
					 _mm512_set1_epi32((int)0xffff0000u), 0xf8);
}

/* The 32 bfloat16 sums of two vectors of 32 bfloat16. */
AVX512_FN static inline __m512i bf16_add(__m512i u, __m512i v)
{
	__m512 even = _mm512_add_ps(bf16_even(u), bf16_even(v));
	__m512 odd = _mm512_add_ps(bf16_odd(u), bf16_odd(v));

	return bf16_pack(bf16_round_high(even), bf16_round_high(odd));
}

/* The 32 bfloat16 quotients of a vector of 32 bfloat16 by q. */
AVX512_FN static inline __m512i bf16_div(__m512i u, __m512 q)
{
	__m512 even = _mm512_div_ps(bf16_even(u), q);
	__m512 odd = _mm512_div_ps(bf16_odd(u), q);

	return bf16_pack(bf16_round_high(even), bf16_round_high(odd));
}

/* ---- Sums ---- */

AVX512_FN static void avx512_sum_f32(void *dst, const void *a, const void *b, size_t n)
{
	unsigned char *d = dst;
	const unsigned char *x = a, *y = b;

#define STEP(o) _mm512_storeu_ps(d + (o), _mm512_add_ps(_mm512_loadu_ps(x + (o)), \
							  _mm512_loadu_ps(y + (o))))
#define MSTEP(o, m) _mm512_mask_storeu_ps(d + (o), (m), \
		_mm512_add_ps(_mm512_maskz_loadu_ps((m), x + (o)), \
			      _mm512_maskz_loadu_ps((m), y + (o))))
	AVX512_LOOP(4, 16, STEP, MSTEP, SUM_PREFETCH);
#undef STEP
#undef MSTEP
}

AVX512_FN static void avx512_sum_f64(void *dst, const void *a, const void *b, size_t n)
{
	unsigned char *d = dst;
	const unsigned char *x = a, *y = b;

#define STEP(o) _mm512_storeu_pd(d + (o), _mm512_add_pd(_mm512_loadu_pd(x + (o)), \
							  _mm512_loadu_pd(y + (o))))
#define MSTEP(o, m) _mm512_mask_storeu_pd(d + (o), (m), \
		_mm512_add_pd(_mm512_maskz_loadu_pd((m), x + (o)), \
			      _mm512_maskz_loadu_pd((m), y + (o))))
	AVX512_LOOP(8, 8, STEP, MSTEP, SUM_PREFETCH);
#undef STEP
#undef MSTEP
}

AVX512_FN static void avx512_sum_f16(void *dst, const void *a, const void *b, size_t n)
{
	unsigned char *d = dst;
	const unsigned char *x = a, *y = b;

#define STEP(o) _mm256_storeu_si256((__m256i *)(d + (o)), f16_round(_mm512_add_ps( \
		_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(x + (o)))), \
		_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(y + (o)))))))
#define MSTEP(o, m) _mm256_mask_storeu_epi16(d + (o), (m), f16_round(_mm512_add_ps( \
		_mm512_cvtph_ps(_mm256_maskz_loadu_epi16((m), x + (o))), \
		_mm512_cvtph_ps(_mm256_maskz_loadu_epi16((m), y + (o))))))
	AVX512_LOOP(2, 16, STEP, MSTEP, SUM_PREFETCH);
#undef STEP
#undef MSTEP
}

AVX512_FN static void avx512_sum_bf16(void *dst, const void *a, const void *b, size_t n)
{
	unsigned char *d = dst;
	const unsigned char *x = a, *y = b;

#define STEP(o) _mm512_storeu_si512(d + (o), bf16_add(_mm512_loadu_si512(x + (o)), \
							    _mm512_loadu_si512(y + (o))))
#define MSTEP(o, m) _mm512_mask_storeu_epi16(d + (o), (m), \
		bf16_add(_mm512_maskz_loadu_epi16((m), x + (o)), \
			 _mm512_maskz_loadu_epi16((m), y + (o))))
	AVX512_LOOP(2, 32, STEP, MSTEP, SUM_PREFETCH);
#undef STEP
#undef MSTEP
}

AVX512_FN static void avx512_sum_i32(void *dst, const void *a, const void *b, size_t n)
{
	unsigned char *d = dst;
	const unsigned char *x = a, *y = b;

#define STEP(o) _mm512_storeu_si512(d + (o), _mm512_add_epi32(_mm512_loadu_si512(x + (o)), \
							       _mm512_loadu_si512(y + (o))))
#define MSTEP(o, m) _mm512_mask_storeu_epi32(d + (o), (m), \
		_mm512_add_epi32(_mm512_maskz_loadu_epi32((m), x + (o)), \
				 _mm512_maskz_loadu_epi32((m), y + (o))))
	AVX512_LOOP(4, 16, STEP, MSTEP, SUM_PREFETCH);
#undef STEP
#undef MSTEP
}

AVX512_FN static void avx512_sum_i64(void *dst, const void *a, const void *b, size_t n)
{
	unsigned char *d = dst;
	const unsigned char *x = a, *y = b;

#define STEP(o) _mm512_storeu_si512(d + (o), _mm512_add_epi64(_mm512_loadu_si512(x + (o)), \
							       _mm512_loadu_si512(y + (o))))
#define MSTEP(o, m) _mm512_mask_storeu_epi64(d + (o), (m), \
		_mm512_add_epi64(_mm512_maskz_loadu_epi64((m), x + (o)), \
				 _mm512_maskz_loadu_epi64((m), y + (o))))
	AVX512_LOOP(8, 8, STEP, MSTEP, SUM_PREFETCH);
#undef STEP
#undef MSTEP
}

/* ---- Division (floats; integers use the scalar loop) ---- */

AVX512_FN static void avx512_divide_f32(void *buf, size_t n, int divisor)
{
	unsigned char *p = buf;
	const __m512 q = _mm512_set1_ps((float)divisor);

#define STEP(o) _mm512_storeu_ps(p + (o), _mm512_div_ps(_mm512_loadu_ps(p + (o)), q))
#define MSTEP(o, m) _mm512_mask_storeu_ps(p + (o), (m), \
		_mm512_div_ps(_mm512_maskz_loadu_ps((m), p + (o)), q))
	AVX512_LOOP(4, 16, STEP, MSTEP, DIVIDE_PREFETCH);
#undef STEP
#undef MSTEP
}

AVX512_FN static void avx512_divide_f64(void *buf, size_t n, int divisor)
{
	unsigned char *p = buf;
	const __m512d q = _mm512_set1_pd((double)divisor);

#define STEP(o) _mm512_storeu_pd(p + (o), _mm512_div_pd(_mm512_loadu_pd(p + (o)), q))
#define MSTEP(o, m) _mm512_mask_storeu_pd(p + (o), (m), \
		_mm512_div_pd(_mm512_maskz_loadu_pd((m), p + (o)), q))
	AVX512_LOOP(8, 8, STEP, MSTEP, DIVIDE_PREFETCH);
#undef STEP
#undef MSTEP
}

AVX512_FN static void avx512_divide_f16(void *buf, size_t n, int divisor)
{
	unsigned char *p = buf;
	const __m512 q = _mm512_set1_ps((float)divisor);

#define STEP(o) _mm256_storeu_si256((__m256i *)(p + (o)), f16_round(_mm512_div_ps( \
		_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + (o)))), q)))
#define MSTEP(o, m) _mm256_mask_storeu_epi16(p + (o), (m), f16_round(_mm512_div_ps( \
		_mm512_cvtph_ps(_mm256_maskz_loadu_epi16((m), p + (o))), q)))
	AVX512_LOOP(2, 16, STEP, MSTEP, DIVIDE_PREFETCH);
#undef STEP
#undef MSTEP
}

AVX512_FN static void avx512_divide_bf16(void *buf, size_t n, int divisor)
{
	unsigned char *p = buf;
	const __m512 q = _mm512_set1_ps((float)divisor);

#define STEP(o) _mm512_storeu_si512(p + (o), bf16_div(_mm512_loadu_si512(p + (o)), q))
#define MSTEP(o, m) _mm512_mask_storeu_epi16(p + (o), (m), \
		bf16_div(_mm512_maskz_loadu_epi16((m), p + (o)), q))
	AVX512_LOOP(2, 32, STEP, MSTEP, DIVIDE_PREFETCH);
#undef STEP
#undef MSTEP
}

const struct reducer_ops reducer_avx512_ops = {
	.isa = REDUCER_ISA_AVX512,
	.sum = {
		[UNISUM_FLOAT32] = avx512_sum_f32,
		[UNISUM_FLOAT64] = avx512_sum_f64,
		[UNISUM_FLOAT16] = avx512_sum_f16,
		[UNISUM_BFLOAT16] = avx512_sum_bf16,
		[UNISUM_INT32] = avx512_sum_i32,
		[UNISUM_INT64] = avx512_sum_i64,
	},
	.divide = {
		[UNISUM_FLOAT32] = avx512_divide_f32,
		[UNISUM_FLOAT64] = avx512_divide_f64,
		[UNISUM_FLOAT16] = avx512_divide_f16,
		[UNISUM_BFLOAT16] = avx512_divide_bf16,
		[UNISUM_INT32] = reducer_scalar_divide_i32,
		[UNISUM_INT64] = reducer_scalar_divide_i64,
	},
};

#endif /* REDUCER_HAVE_X86 */
