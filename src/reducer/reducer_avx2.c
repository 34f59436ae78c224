/*
 * reducer_avx2.c - the AVX2 path: 256-bit loops, float16 through F16C.
 *
 * Every function carries its own target attribute, so this file builds
 * with plain -O2 and its code only runs once reducer.c has seen the CPU
 * report AVX2, F16C and FMA (FMA is not used, but every AVX2 CPU has it
 * and requiring it keeps the set equal to x86-64-v3).
 *
 * The loops are memory-bound: each handles four vectors per iteration so
 * that enough loads are in flight, with a software prefetch 4 KiB ahead,
 * then single vectors, then hands the last few elements to the scalar
 * loop, which is the reference and so cannot round differently.  Loads
 * and stores are unaligned (any address works).
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

#define AVX2_FN __attribute__((target("avx2,f16c,fma")))

/*
 * How far ahead of its loads a loop prefetches, in bytes.  The hardware
 * prefetchers stop at each 4 KiB page, and a loop whose vectors take many
 * instructions (the float16 and bfloat16 conversions) fills the reorder
 * buffer before enough cache misses are in flight: those prefetch a page
 * ahead (PREFETCH_BYTES; see reducer_avx512.c for the measurements).  A
 * loop of plain adds runs ahead by itself, and a far prefetch only takes
 * load slots and evicts lines it still needs: on an AMD EPYC (AVX2, no
 * AVX-512), float32 `dst += src` on 256 MiB ran at 0.80-0.85 of memcpy
 * with 4096 bytes, 0.83-0.93 without prefetching and 0.90-0.95 with 512
 * (PREFETCH_NEAR), the variants side by side in each of six runs;
 * unrolling 8 vectors instead of 4 gained nothing.  The plain-add loops
 * (float32, float64, int32, int64) use PREFETCH_NEAR.
 */
#define PREFETCH_BYTES 4096
#define PREFETCH_NEAR 512

/*
 * Prefetches the `len` bytes at p + o, a line at a time.  A macro, not a
 * function: GCC 12 splits a small function with an early return, then
 * judges the split part free of side effects (a prefetch does not count)
 * and deletes every call to it.
 */
#define PREFETCH_LINES(p, o, len)                                                 \
	for (size_t l_ = 0; l_ < (len); l_ += 64)                                  \
		_mm_prefetch((const char *)(p) + (o) + l_, _MM_HINT_T0)

/*
 * The loop every AVX2 sum shares.  `size` is the element size, `lanes` the
 * elements one STEP handles; STEP(d, x, y) sums one vector at those byte
 * addresses; `dtype` names the scalar loop that finishes the tail; `ahead`
 * is the prefetch distance in bytes.
 */
#define AVX2_SUM_LOOP(size, lanes, STEP, dtype, ahead)                            \
	do {                                                                       \
		unsigned char *d_ = dst;                                           \
		const unsigned char *x_ = a, *y_ = b;                              \
		const size_t vb_ = (size) * (lanes); /* bytes per vector */        \
		const size_t total_ = n * (size);                                  \
		size_t i_ = 0;                                                     \
                                                                                   \
		for (; i_ + 4 * (lanes) <= n; i_ += 4 * (lanes)) {                 \
			size_t o_ = i_ * (size);                                   \
                                                                                   \
			if (o_ + (ahead) < total_) {                               \
				PREFETCH_LINES(x_, o_ + (ahead), 4 * vb_);         \
				PREFETCH_LINES(y_, o_ + (ahead), 4 * vb_);         \
			}                                                          \
			STEP(d_ + o_, x_ + o_, y_ + o_);                           \
			STEP(d_ + o_ + vb_, x_ + o_ + vb_, y_ + o_ + vb_);         \
			STEP(d_ + o_ + 2 * vb_, x_ + o_ + 2 * vb_,                 \
			     y_ + o_ + 2 * vb_);                                   \
			STEP(d_ + o_ + 3 * vb_, x_ + o_ + 3 * vb_,                 \
			     y_ + o_ + 3 * vb_);                                   \
		}                                                                  \
		for (; i_ + (lanes) <= n; i_ += (lanes))                           \
			STEP(d_ + i_ * (size), x_ + i_ * (size), y_ + i_ * (size)); \
		if (i_ < n)                                                        \
			reducer_scalar_ops.sum[dtype](d_ + i_ * (size),            \
						      x_ + i_ * (size),            \
						      y_ + i_ * (size), n - i_);   \
	} while (0)

/* The same for a division in place: STEP(p) divides one vector at p, and
 * every fourth vector prefetches the next four, PREFETCH_BYTES ahead. */
#define AVX2_DIVIDE_LOOP(size, lanes, STEP, dtype)                                \
	do {                                                                       \
		unsigned char *p_ = buf;                                           \
		size_t i_ = 0;                                                     \
                                                                                   \
		for (; i_ + (lanes) <= n; i_ += (lanes)) {                         \
			if (i_ % (4 * (lanes)) == 0 &&                             \
			    (i_ * (size)) + PREFETCH_BYTES < n * (size))           \
				PREFETCH_LINES(p_, i_ * (size) + PREFETCH_BYTES,   \
					       4 * (size) * (lanes));              \
			STEP(p_ + i_ * (size));                                    \
		}                                                                  \
		if (i_ < n)                                                        \
			reducer_scalar_ops.divide[dtype](p_ + i_ * (size),         \
							 n - i_, divisor);         \
	} while (0)

/* ---- Widening and narrowing ---- */

AVX2_FN static inline __m256 load_f16x8(const unsigned char *p)
{
	return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

/* Rounds 8 float32 to float16 at p; NaN becomes the canonical quiet NaN
 * (a float32 quiet NaN with no payload narrows to exactly 0x7e00). */
AVX2_FN static inline void store_f16x8(unsigned char *p, __m256 v)
{
	__m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);

	v = _mm256_blendv_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fc00000)), nan);
	_mm_storeu_si128((__m128i *)p, _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
}

/* The low bfloat16 of each 32-bit lane as float32 (the even elements). */
AVX2_FN static inline __m256 bf16_even(__m256i v)
{
	return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

/* The high bfloat16 of each 32-bit lane as float32 (the odd elements). */
AVX2_FN static inline __m256 bf16_odd(__m256i v)
{
	return _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32((int)0xffff0000u)));
}

/* Rounds float32 to bfloat16 in the top half of each lane (the bottom
 * half is garbage), NaN to the canonical quiet NaN. */
AVX2_FN static inline __m256i bf16_round_high(__m256 v)
{
	__m256i bits = _mm256_castps_si256(v);
	__m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
	__m256i r = _mm256_add_epi32(bits, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
	__m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);

	return _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(r),
			_mm256_castsi256_ps(_mm256_set1_epi32(0x7fc00000)), nan));
}

/* Packs two rounded vectors back into 16 bfloat16. */
AVX2_FN static inline __m256i bf16_pack(__m256i even, __m256i odd)
{
	return _mm256_or_si256(_mm256_srli_epi32(even, 16),
			       _mm256_and_si256(odd, _mm256_set1_epi32((int)0xffff0000u)));
}

/* ---- Sums ---- */

AVX2_FN static inline void step_f32(unsigned char *d, const unsigned char *x,
				    const unsigned char *y)
{
	_mm256_storeu_ps((float *)d, _mm256_add_ps(_mm256_loadu_ps((const float *)x),
						   _mm256_loadu_ps((const float *)y)));
}

AVX2_FN static inline void step_f64(unsigned char *d, const unsigned char *x,
				    const unsigned char *y)
{
	_mm256_storeu_pd((double *)d, _mm256_add_pd(_mm256_loadu_pd((const double *)x),
						    _mm256_loadu_pd((const double *)y)));
}

AVX2_FN static inline void step_f16(unsigned char *d, const unsigned char *x,
				    const unsigned char *y)
{
	store_f16x8(d, _mm256_add_ps(load_f16x8(x), load_f16x8(y)));
}

AVX2_FN static inline void step_bf16(unsigned char *d, const unsigned char *x,
				     const unsigned char *y)
{
	__m256i u = _mm256_loadu_si256((const __m256i *)x);
	__m256i v = _mm256_loadu_si256((const __m256i *)y);
	__m256 even = _mm256_add_ps(bf16_even(u), bf16_even(v));
	__m256 odd = _mm256_add_ps(bf16_odd(u), bf16_odd(v));

	_mm256_storeu_si256((__m256i *)d, bf16_pack(bf16_round_high(even),
						    bf16_round_high(odd)));
}

AVX2_FN static inline void step_i32(unsigned char *d, const unsigned char *x,
				    const unsigned char *y)
{
	_mm256_storeu_si256((__m256i *)d,
			    _mm256_add_epi32(_mm256_loadu_si256((const __m256i *)x),
					     _mm256_loadu_si256((const __m256i *)y)));
}

AVX2_FN static inline void step_i64(unsigned char *d, const unsigned char *x,
				    const unsigned char *y)
{
	_mm256_storeu_si256((__m256i *)d,
			    _mm256_add_epi64(_mm256_loadu_si256((const __m256i *)x),
					     _mm256_loadu_si256((const __m256i *)y)));
}

AVX2_FN static void avx2_sum_f32(void *dst, const void *a, const void *b, size_t n)
{
	AVX2_SUM_LOOP(4, 8, step_f32, UNISUM_FLOAT32, PREFETCH_NEAR);
}

AVX2_FN static void avx2_sum_f64(void *dst, const void *a, const void *b, size_t n)
{
	AVX2_SUM_LOOP(8, 4, step_f64, UNISUM_FLOAT64, PREFETCH_NEAR);
}

AVX2_FN static void avx2_sum_f16(void *dst, const void *a, const void *b, size_t n)
{
	AVX2_SUM_LOOP(2, 8, step_f16, UNISUM_FLOAT16, PREFETCH_BYTES);
}

AVX2_FN static void avx2_sum_bf16(void *dst, const void *a, const void *b, size_t n)
{
	AVX2_SUM_LOOP(2, 16, step_bf16, UNISUM_BFLOAT16, PREFETCH_BYTES);
}

AVX2_FN static void avx2_sum_i32(void *dst, const void *a, const void *b, size_t n)
{
	AVX2_SUM_LOOP(4, 8, step_i32, UNISUM_INT32, PREFETCH_NEAR);
}

AVX2_FN static void avx2_sum_i64(void *dst, const void *a, const void *b, size_t n)
{
	AVX2_SUM_LOOP(8, 4, step_i64, UNISUM_INT64, PREFETCH_NEAR);
}

/* ---- Division (floats; integers use the scalar loop) ---- */

AVX2_FN static void avx2_divide_f32(void *buf, size_t n, int divisor)
{
	const __m256 q = _mm256_set1_ps((float)divisor);

#define STEP(p) _mm256_storeu_ps((float *)(p), \
				 _mm256_div_ps(_mm256_loadu_ps((const float *)(p)), q))
	AVX2_DIVIDE_LOOP(4, 8, STEP, UNISUM_FLOAT32);
#undef STEP
}

AVX2_FN static void avx2_divide_f64(void *buf, size_t n, int divisor)
{
	const __m256d q = _mm256_set1_pd((double)divisor);

#define STEP(p) _mm256_storeu_pd((double *)(p), \
				 _mm256_div_pd(_mm256_loadu_pd((const double *)(p)), q))
	AVX2_DIVIDE_LOOP(8, 4, STEP, UNISUM_FLOAT64);
#undef STEP
}

AVX2_FN static void avx2_divide_f16(void *buf, size_t n, int divisor)
{
	const __m256 q = _mm256_set1_ps((float)divisor);

#define STEP(p) store_f16x8((p), _mm256_div_ps(load_f16x8(p), q))
	AVX2_DIVIDE_LOOP(2, 8, STEP, UNISUM_FLOAT16);
#undef STEP
}

AVX2_FN static inline void divide_bf16x16(unsigned char *p, __m256 q)
{
	__m256i v = _mm256_loadu_si256((const __m256i *)p);
	__m256 even = _mm256_div_ps(bf16_even(v), q);
	__m256 odd = _mm256_div_ps(bf16_odd(v), q);

	_mm256_storeu_si256((__m256i *)p, bf16_pack(bf16_round_high(even),
						    bf16_round_high(odd)));
}

AVX2_FN static void avx2_divide_bf16(void *buf, size_t n, int divisor)
{
	const __m256 q = _mm256_set1_ps((float)divisor);

#define STEP(p) divide_bf16x16((p), q)
	AVX2_DIVIDE_LOOP(2, 16, STEP, UNISUM_BFLOAT16);
#undef STEP
}

const struct reducer_ops reducer_avx2_ops = {
	.isa = REDUCER_ISA_AVX2,
	.sum = {
		[UNISUM_FLOAT32] = avx2_sum_f32,
		[UNISUM_FLOAT64] = avx2_sum_f64,
		[UNISUM_FLOAT16] = avx2_sum_f16,
		[UNISUM_BFLOAT16] = avx2_sum_bf16,
		[UNISUM_INT32] = avx2_sum_i32,
		[UNISUM_INT64] = avx2_sum_i64,
	},
	.divide = {
		[UNISUM_FLOAT32] = avx2_divide_f32,
		[UNISUM_FLOAT64] = avx2_divide_f64,
		[UNISUM_FLOAT16] = avx2_divide_f16,
		[UNISUM_BFLOAT16] = avx2_divide_bf16,
		[UNISUM_INT32] = reducer_scalar_divide_i32,
		[UNISUM_INT64] = reducer_scalar_divide_i64,
	},
};

#endif /* REDUCER_HAVE_X86 */
