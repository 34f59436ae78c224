/*
 * reducer_fold.c - the reductions other than the sum: elementwise min,
 * max and product of every dtype, and the bitwise OR that assembles an
 * allgather or alltoall from disjoint contributions (reducer.h).
 *
 * One scalar reference and two SIMD paths (AVX2, AVX-512), written once
 * with GCC's vector extensions and compiled per path with its target
 * attribute; float16 widens with F16C (vcvtph2ps) and narrows with
 * vcvtps2ph, bfloat16 widens by a shift.  Each path's loop finishes its
 * tail with the scalar loop, and the path follows reducer_active_isa(), so
 * reducer_force_isa() pins these loops as it pins the sums.
 *
 * Semantics, identical bit for bit on every path:
 * - min and max pick one of the operands when they are ordered and differ.
 *   When they compare equal (only +0 and -0 differ then) min gives -0 and
 *   max +0 (the OR and the AND of their bits), as torch.minimum/maximum
 *   do.  When either is NaN the result is NaN (the OR of the bits, which
 *   keeps a NaN a NaN); float16 and bfloat16 NaN results are the canonical
 *   quiet NaN, as in the sums.
 * - the product of float32 or float64 is IEEE's; of float16 and bfloat16
 *   it is exact in float32 (11 + 11 and 8 + 8 significant bits fit) and
 *   rounded once to nearest-even; integer products wrap.
 * - the OR works on bytes, whatever the dtype: x | 0 == x for every bit
 *   pattern (-0.0 and NaN payloads included), so contributions that are
 *   zero outside their own elements combine exactly.
 */
#include <stdbool.h>

#include "reducer/reducer_impl.h"

#if REDUCER_HAVE_X86
#include <immintrin.h>
#endif

/* The bits of min/max from comparison masks (all ones or zero) and the
 * operands' bits; the same expressions serve scalars and vectors. */
#define FOLD_MIN_BITS(lt, gt, X, Y) (((lt) & (X)) | ((gt) & (Y)) | (~((lt) | (gt)) & ((X) | (Y))))
#define FOLD_MAX_BITS(lt, gt, eq, X, Y)                                                   \
	(((gt) & (X)) | ((lt) & (Y)) |                                                    \
	 (~((lt) | (gt)) & (((eq) & (X) & (Y)) | (~(eq) & ((X) | (Y))))))

typedef void (*fold_fn)(void *dst, const void *a, const void *b, size_t n);

struct fold_table {
	fold_fn min[UNISUM_DTYPE_COUNT], max[UNISUM_DTYPE_COUNT], prod[UNISUM_DTYPE_COUNT];
	fold_fn bor;	/* n bytes */
};

/* ---- The scalar path (the reference) ---- */

static uint32_t f32_bits(float f)
{
	uint32_t u;
	memcpy(&u, &f, sizeof u);
	return u;
}

static float bits_f32(uint32_t u)
{
	float f;
	memcpy(&f, &u, sizeof f);
	return f;
}

static uint32_t min_f32_bits(float a, float b)
{
	uint32_t lt = 0u - (uint32_t)(a < b), gt = 0u - (uint32_t)(a > b);
	uint32_t X = f32_bits(a), Y = f32_bits(b);
	return FOLD_MIN_BITS(lt, gt, X, Y);
}

static uint32_t max_f32_bits(float a, float b)
{
	uint32_t lt = 0u - (uint32_t)(a < b), gt = 0u - (uint32_t)(a > b);
	uint32_t eq = 0u - (uint32_t)(a == b);
	uint32_t X = f32_bits(a), Y = f32_bits(b);
	return FOLD_MAX_BITS(lt, gt, eq, X, Y);
}

static void scalar_min_f32(void *dst, const void *a, const void *b, size_t n)
{
	unsigned char *d = dst;
	const unsigned char *x = a, *y = b;
	for (size_t i = 0; i < n; i++)
		reducer_store_u32(d + 4 * i, min_f32_bits(reducer_load_f32(x + 4 * i),
							  reducer_load_f32(y + 4 * i)));
}

static void scalar_max_f32(void *dst, const void *a, const void *b, size_t n)
{
	unsigned char *d = dst;
	const unsigned char *x = a, *y = b;
	for (size_t i = 0; i < n; i++)
		reducer_store_u32(d + 4 * i, max_f32_bits(reducer_load_f32(x + 4 * i),
							  reducer_load_f32(y + 4 * i)));
}

static void scalar_prod_f32(void *dst, const void *a, const void *b, size_t n)
{
	unsigned char *d = dst;
	const unsigned char *x = a, *y = b;
	for (size_t i = 0; i < n; i++)
		reducer_store_f32(d + 4 * i, reducer_load_f32(x + 4 * i) * reducer_load_f32(y + 4 * i));
}

static void scalar_min_f64(void *dst, const void *a, const void *b, size_t n)
{
	unsigned char *d = dst;
	const unsigned char *x = a, *y = b;
	for (size_t i = 0; i < n; i++) {
		double p = reducer_load_f64(x + 8 * i), q = reducer_load_f64(y + 8 * i);
		uint64_t lt = 0u - (uint64_t)(p < q), gt = 0u - (uint64_t)(p > q);
		uint64_t X = reducer_load_u64(x + 8 * i), Y = reducer_load_u64(y + 8 * i);
		reducer_store_u64(d + 8 * i, FOLD_MIN_BITS(lt, gt, X, Y));
	}
}

static void scalar_max_f64(void *dst, const void *a, const void *b, size_t n)
{
	unsigned char *d = dst;
	const unsigned char *x = a, *y = b;
	for (size_t i = 0; i < n; i++) {
		double p = reducer_load_f64(x + 8 * i), q = reducer_load_f64(y + 8 * i);
		uint64_t lt = 0u - (uint64_t)(p < q), gt = 0u - (uint64_t)(p > q);
		uint64_t eq = 0u - (uint64_t)(p == q);
		uint64_t X = reducer_load_u64(x + 8 * i), Y = reducer_load_u64(y + 8 * i);
		reducer_store_u64(d + 8 * i, FOLD_MAX_BITS(lt, gt, eq, X, Y));
	}
}

static void scalar_prod_f64(void *dst, const void *a, const void *b, size_t n)
{
	unsigned char *d = dst;
	const unsigned char *x = a, *y = b;
	for (size_t i = 0; i < n; i++)
		reducer_store_f64(d + 8 * i, reducer_load_f64(x + 8 * i) * reducer_load_f64(y + 8 * i));
}

/* float16 and bfloat16 min/max: on the widened values (exact), then back;
 * the result is one of them (or -0/+0), so narrowing is exact, and a NaN
 * becomes the canonical one. */
static uint16_t narrow_exact_f16(uint32_t bits)
{
	float f = bits_f32(bits);
	return f != f ? REDUCER_F16_QNAN : reducer_f32_to_f16(f);
}

static uint16_t narrow_exact_bf16(uint32_t bits)
{
	return (bits & 0x7fffffffu) > 0x7f800000u ? REDUCER_BF16_QNAN : (uint16_t)(bits >> 16);
}

#define SCALAR_HALF(name, widen, body)                                                    \
	static void name(void *dst, const void *a, const void *b, size_t n)               \
	{                                                                                 \
		unsigned char *d = dst;                                                   \
		const unsigned char *x = a, *y = b;                                       \
		for (size_t i = 0; i < n; i++) {                                          \
			float p = widen(reducer_load_u16(x + 2 * i));                     \
			float q = widen(reducer_load_u16(y + 2 * i));                     \
			reducer_store_u16(d + 2 * i, body);                               \
		}                                                                         \
	}

SCALAR_HALF(scalar_min_f16, reducer_f16_to_f32, narrow_exact_f16(min_f32_bits(p, q)))
SCALAR_HALF(scalar_max_f16, reducer_f16_to_f32, narrow_exact_f16(max_f32_bits(p, q)))
SCALAR_HALF(scalar_prod_f16, reducer_f16_to_f32, reducer_f16_round(p * q))
SCALAR_HALF(scalar_min_bf16, reducer_bf16_to_f32, narrow_exact_bf16(min_f32_bits(p, q)))
SCALAR_HALF(scalar_max_bf16, reducer_bf16_to_f32, narrow_exact_bf16(max_f32_bits(p, q)))
SCALAR_HALF(scalar_prod_bf16, reducer_bf16_to_f32, reducer_bf16_round(p * q))

#define SCALAR_INT(bits, stype)                                                           \
	static void scalar_min_i##bits(void *dst, const void *a, const void *b, size_t n) \
	{                                                                                 \
		unsigned char *d = dst;                                                   \
		const unsigned char *x = a, *y = b;                                       \
		for (size_t i = 0; i < n; i++) {                                          \
			uint##bits##_t X = reducer_load_u##bits(x + bits / 8 * i);        \
			uint##bits##_t Y = reducer_load_u##bits(y + bits / 8 * i);        \
			reducer_store_u##bits(d + bits / 8 * i,                           \
					      (stype)X < (stype)Y ? X : Y);               \
		}                                                                         \
	}                                                                                 \
	static void scalar_max_i##bits(void *dst, const void *a, const void *b, size_t n) \
	{                                                                                 \
		unsigned char *d = dst;                                                   \
		const unsigned char *x = a, *y = b;                                       \
		for (size_t i = 0; i < n; i++) {                                          \
			uint##bits##_t X = reducer_load_u##bits(x + bits / 8 * i);        \
			uint##bits##_t Y = reducer_load_u##bits(y + bits / 8 * i);        \
			reducer_store_u##bits(d + bits / 8 * i,                           \
					      (stype)X > (stype)Y ? X : Y);               \
		}                                                                         \
	}                                                                                 \
	static void scalar_prod_i##bits(void *dst, const void *a, const void *b, size_t n) \
	{                                                                                 \
		unsigned char *d = dst;                                                   \
		const unsigned char *x = a, *y = b;                                       \
		for (size_t i = 0; i < n; i++)                                            \
			reducer_store_u##bits(d + bits / 8 * i,                           \
					      (uint##bits##_t)(reducer_load_u##bits(x + bits / 8 * i) * \
							       reducer_load_u##bits(y + bits / 8 * i))); \
	}

SCALAR_INT(32, int32_t)
SCALAR_INT(64, int64_t)

static void scalar_bor(void *dst, const void *a, const void *b, size_t n)
{
	unsigned char *d = dst;
	const unsigned char *x = a, *y = b;
	size_t i = 0;
	for (; i + 8 <= n; i += 8)
		reducer_store_u64(d + i, reducer_load_u64(x + i) | reducer_load_u64(y + i));
	for (; i < n; i++)
		d[i] = x[i] | y[i];
}

static const struct fold_table fold_scalar = {
	.min = {scalar_min_f32, scalar_min_f64, scalar_min_f16, scalar_min_bf16, scalar_min_i32,
		scalar_min_i64},
	.max = {scalar_max_f32, scalar_max_f64, scalar_max_f16, scalar_max_bf16, scalar_max_i32,
		scalar_max_i64},
	.prod = {scalar_prod_f32, scalar_prod_f64, scalar_prod_f16, scalar_prod_bf16,
		 scalar_prod_i32, scalar_prod_i64},
	.bor = scalar_bor,
};

#if REDUCER_HAVE_X86

/*
 * The SIMD paths.  FOLD_PATH(P, VB, TGT, F16 conversions) defines the
 * loops of one path: VB bytes per vector, TGT its target attribute.  Loads
 * and stores go through memcpy, which compiles to unaligned vector moves.
 * Comparisons of vectors give all-ones or zero lanes, which the bit
 * expressions above combine; nothing here branches per element.
 */
#define FOLD_LOOP(P, name, esize, VB, TGT, STEP, tail)                                    \
	TGT static void P##_##name(void *dst, const void *a, const void *b, size_t n)     \
	{                                                                                 \
		unsigned char *d = dst;                                                   \
		const unsigned char *x = a, *y = b;                                       \
		const size_t lanes = (VB) / (esize);                                      \
		size_t i = 0;                                                             \
		for (; i + lanes <= n; i += lanes)                                        \
			STEP(d + (esize) * i, x + (esize) * i, y + (esize) * i);          \
		tail(d + (esize) * i, x + (esize) * i, y + (esize) * i, n - i);           \
	}

#define FOLD_PATH(P, VB, TGT, F16_WIDEN, F16_NARROW, H16)                                 \
	typedef float P##_f32 __attribute__((vector_size(VB)));                           \
	typedef double P##_f64 __attribute__((vector_size(VB)));                          \
	typedef int32_t P##_i32 __attribute__((vector_size(VB)));                         \
	typedef int64_t P##_i64 __attribute__((vector_size(VB)));                         \
	typedef uint32_t P##_u32 __attribute__((vector_size(VB)));                        \
	typedef uint64_t P##_u64 __attribute__((vector_size(VB)));                        \
	typedef uint16_t P##_h16 __attribute__((vector_size((VB) / 2)));                  \
                                                                                          \
	FOLD_FLOAT(P, VB, TGT, f32, P##_f32, P##_i32, 4)                                  \
	FOLD_FLOAT(P, VB, TGT, f64, P##_f64, P##_i64, 8)                                  \
	FOLD_INT(P, VB, TGT, i32, P##_i32, P##_u32, 4)                                    \
	FOLD_INT(P, VB, TGT, i64, P##_i64, P##_u64, 8)                                    \
	FOLD_HALF(P, VB, TGT, f16, F16_WIDEN, F16_NARROW, H16, 0x7c00, REDUCER_F16_QNAN)  \
	FOLD_HALF(P, VB, TGT, bf16, BF16_WIDEN, BF16_NARROW_EXACT, H16, 0x7f80,           \
		  REDUCER_BF16_QNAN)                                                      \
	TGT static void P##_bor(void *dst, const void *a, const void *b, size_t n)        \
	{                                                                                 \
		unsigned char *d = dst;                                                   \
		const unsigned char *x = a, *y = b;                                       \
		size_t i = 0;                                                             \
		for (; i + (VB) <= n; i += (VB)) {                                        \
			P##_u64 p, q;                                                     \
			memcpy(&p, x + i, VB);                                            \
			memcpy(&q, y + i, VB);                                            \
			p |= q;                                                           \
			memcpy(d + i, &p, VB);                                            \
		}                                                                         \
		scalar_bor(d + i, x + i, y + i, n - i);                                   \
	}                                                                                 \
	static const struct fold_table fold_##P = {                                      \
		.min = {P##_min_f32, P##_min_f64, P##_min_f16, P##_min_bf16, P##_min_i32, \
			P##_min_i64},                                                     \
		.max = {P##_max_f32, P##_max_f64, P##_max_f16, P##_max_bf16, P##_max_i32, \
			P##_max_i64},                                                     \
		.prod = {P##_prod_f32, P##_prod_f64, P##_prod_f16, P##_prod_bf16,         \
			 P##_prod_i32, P##_prod_i64},                                     \
		.bor = P##_bor,                                                           \
	};

/* Floats: compare as floats, combine as bits. */
#define FOLD_FLOAT(P, VB, TGT, t, FV, IV, esize)                                          \
	FOLD_LOOP(P, min_##t, esize, VB, TGT, P##_STEP_MIN_##t, scalar_min_##t)           \
	FOLD_LOOP(P, max_##t, esize, VB, TGT, P##_STEP_MAX_##t, scalar_max_##t)           \
	FOLD_LOOP(P, prod_##t, esize, VB, TGT, P##_STEP_PROD_##t, scalar_prod_##t)

/* The per-vector steps are macros of the path: P##_STEP_<OP>_<dtype>. */
#define FOLD_INT(P, VB, TGT, t, IV, UV, esize)                                            \
	FOLD_LOOP(P, min_##t, esize, VB, TGT, P##_STEP_MIN_##t, scalar_min_##t)           \
	FOLD_LOOP(P, max_##t, esize, VB, TGT, P##_STEP_MAX_##t, scalar_max_##t)           \
	FOLD_LOOP(P, prod_##t, esize, VB, TGT, P##_STEP_PROD_##t, scalar_prod_##t)

#define FOLD_HALF(P, VB, TGT, t, WIDEN, NARROW, H16, INF, QNAN)                           \
	FOLD_LOOP(P, min_##t, 2, (VB) / 2, TGT, P##_STEP_MIN_##t, scalar_min_##t)         \
	FOLD_LOOP(P, max_##t, 2, (VB) / 2, TGT, P##_STEP_MAX_##t, scalar_max_##t)         \
	FOLD_LOOP(P, prod_##t, 2, (VB) / 2, TGT, P##_STEP_PROD_##t, scalar_prod_##t)

/*
 * The steps, written once as generic macros of the vector types: FV/IV the
 * float and same-width integer vectors, VB the bytes of one vector.
 */
#define STEP_FMIN(FV, IV, VB, d, x, y)                                                    \
	do {                                                                              \
		FV p_, q_;                                                                \
		memcpy(&p_, x, VB);                                                       \
		memcpy(&q_, y, VB);                                                       \
		IV X_ = (IV)p_, Y_ = (IV)q_, lt_ = (IV)(p_ < q_), gt_ = (IV)(p_ > q_);    \
		IV r_ = FOLD_MIN_BITS(lt_, gt_, X_, Y_);                                  \
		memcpy(d, &r_, VB);                                                       \
	} while (0)
#define STEP_FMAX(FV, IV, VB, d, x, y)                                                    \
	do {                                                                              \
		FV p_, q_;                                                                \
		memcpy(&p_, x, VB);                                                       \
		memcpy(&q_, y, VB);                                                       \
		IV X_ = (IV)p_, Y_ = (IV)q_, lt_ = (IV)(p_ < q_), gt_ = (IV)(p_ > q_);    \
		IV eq_ = (IV)(p_ == q_);                                                  \
		IV r_ = FOLD_MAX_BITS(lt_, gt_, eq_, X_, Y_);                             \
		memcpy(d, &r_, VB);                                                       \
	} while (0)
#define STEP_FPROD(FV, VB, d, x, y)                                                       \
	do {                                                                              \
		FV p_, q_;                                                                \
		memcpy(&p_, x, VB);                                                       \
		memcpy(&q_, y, VB);                                                       \
		p_ *= q_;                                                                 \
		memcpy(d, &p_, VB);                                                       \
	} while (0)
#define STEP_IMIN(IV, VB, d, x, y)                                                        \
	do {                                                                              \
		IV p_, q_;                                                                \
		memcpy(&p_, x, VB);                                                       \
		memcpy(&q_, y, VB);                                                       \
		IV lt_ = (IV)(p_ < q_);                                                   \
		IV r_ = (lt_ & p_) | (~lt_ & q_);                                         \
		memcpy(d, &r_, VB);                                                       \
	} while (0)
#define STEP_IMAX(IV, VB, d, x, y)                                                        \
	do {                                                                              \
		IV p_, q_;                                                                \
		memcpy(&p_, x, VB);                                                       \
		memcpy(&q_, y, VB);                                                       \
		IV gt_ = (IV)(p_ > q_);                                                   \
		IV r_ = (gt_ & p_) | (~gt_ & q_);                                         \
		memcpy(d, &r_, VB);                                                       \
	} while (0)
#define STEP_IPROD(UV, VB, d, x, y)                                                       \
	do {                                                                              \
		UV p_, q_;                                                                \
		memcpy(&p_, x, VB);                                                       \
		memcpy(&q_, y, VB);                                                       \
		p_ *= q_;                                                                 \
		memcpy(d, &p_, VB);                                                       \
	} while (0)

/* Half types: VB/2 bytes of 16-bit values become one float vector. */
#define BF16_WIDEN(P, F, h)                                                               \
	do {                                                                              \
		P##_u32 w_ = __builtin_convertvector(h, P##_u32) << 16;                   \
		memcpy(&(F), &w_, sizeof w_);                                             \
	} while (0)
/* An exact bfloat16 from float bits (min/max): the top half; NaN lanes
 * are fixed after. */
#define BF16_NARROW_EXACT(P, h, R) (h) = __builtin_convertvector((R) >> 16, P##_h16)
/* Rounded bfloat16 (product), reducer_f32_to_bf16's integer trick. */
#define BF16_NARROW_ROUND(P, h, R)                                                        \
	(h) = __builtin_convertvector(((R) + 0x7fffu + (((R) >> 16) & 1u)) >> 16, P##_h16)
/* NaN lanes of a half vector become the canonical quiet NaN. */
#define HALF_FIX_NAN(h, INF, QNAN)                                                        \
	do {                                                                              \
		__typeof__(h) m_ = (__typeof__(h))(((h) & 0x7fff) > (INF));               \
		(h) = (m_ & (QNAN)) | (~m_ & (h));                                        \
	} while (0)

#define STEP_HALF(P, VB, WIDEN, NARROW, INF, QNAN, OP, d, x, y)                           \
	do {                                                                              \
		P##_h16 a_, b_, h_;                                                       \
		P##_f32 p_, q_;                                                           \
		memcpy(&a_, x, (VB) / 2);                                                 \
		memcpy(&b_, y, (VB) / 2);                                                 \
		WIDEN(P, p_, a_);                                                         \
		WIDEN(P, q_, b_);                                                         \
		P##_u32 r_;                                                               \
		OP(P, p_, q_, r_);                                                        \
		NARROW(P, h_, r_);                                                        \
		HALF_FIX_NAN(h_, INF, QNAN);                                              \
		memcpy(d, &h_, (VB) / 2);                                                 \
	} while (0)
#define HOP_MIN(P, p, q, r)                                                               \
	do {                                                                              \
		P##_u32 X_, Y_;                                                           \
		memcpy(&X_, &(p), sizeof X_);                                             \
		memcpy(&Y_, &(q), sizeof Y_);                                             \
		P##_u32 lt_ = (P##_u32)((p) < (q)), gt_ = (P##_u32)((p) > (q));           \
		(r) = FOLD_MIN_BITS(lt_, gt_, X_, Y_);                                    \
	} while (0)
#define HOP_MAX(P, p, q, r)                                                               \
	do {                                                                              \
		P##_u32 X_, Y_;                                                           \
		memcpy(&X_, &(p), sizeof X_);                                             \
		memcpy(&Y_, &(q), sizeof Y_);                                             \
		P##_u32 lt_ = (P##_u32)((p) < (q)), gt_ = (P##_u32)((p) > (q));           \
		P##_u32 eq_ = (P##_u32)((p) == (q));                                      \
		(r) = FOLD_MAX_BITS(lt_, gt_, eq_, X_, Y_);                               \
	} while (0)
#define HOP_PROD(P, p, q, r)                                                              \
	do {                                                                              \
		P##_f32 m_ = (p) * (q);                                                   \
		memcpy(&(r), &m_, sizeof m_);                                             \
	} while (0)

/* ---- AVX2: 32-byte vectors, float16 through F16C ---- */

#define AVX2_TGT __attribute__((target("avx2,f16c,fma")))
#define avx2_F16_WIDEN(P, F, h)                                                           \
	do {                                                                              \
		__m128i i_;                                                               \
		memcpy(&i_, &(h), 16);                                                    \
		__m256 f_ = _mm256_cvtph_ps(i_);                                          \
		memcpy(&(F), &f_, 32);                                                    \
	} while (0)
#define avx2_F16_NARROW(P, h, R)                                                          \
	do {                                                                              \
		__m256 f_;                                                                \
		memcpy(&f_, &(R), 32);                                                    \
		__m128i i_ = _mm256_cvtps_ph(f_, _MM_FROUND_TO_NEAREST_INT);               \
		memcpy(&(h), &i_, 16);                                                    \
	} while (0)

#define avx2_STEP_MIN_f32(d, x, y) STEP_FMIN(avx2_f32, avx2_i32, 32, d, x, y)
#define avx2_STEP_MAX_f32(d, x, y) STEP_FMAX(avx2_f32, avx2_i32, 32, d, x, y)
#define avx2_STEP_PROD_f32(d, x, y) STEP_FPROD(avx2_f32, 32, d, x, y)
#define avx2_STEP_MIN_f64(d, x, y) STEP_FMIN(avx2_f64, avx2_i64, 32, d, x, y)
#define avx2_STEP_MAX_f64(d, x, y) STEP_FMAX(avx2_f64, avx2_i64, 32, d, x, y)
#define avx2_STEP_PROD_f64(d, x, y) STEP_FPROD(avx2_f64, 32, d, x, y)
#define avx2_STEP_MIN_i32(d, x, y) STEP_IMIN(avx2_i32, 32, d, x, y)
#define avx2_STEP_MAX_i32(d, x, y) STEP_IMAX(avx2_i32, 32, d, x, y)
#define avx2_STEP_PROD_i32(d, x, y) STEP_IPROD(avx2_u32, 32, d, x, y)
#define avx2_STEP_MIN_i64(d, x, y) STEP_IMIN(avx2_i64, 32, d, x, y)
#define avx2_STEP_MAX_i64(d, x, y) STEP_IMAX(avx2_i64, 32, d, x, y)
#define avx2_STEP_PROD_i64(d, x, y) STEP_IPROD(avx2_u64, 32, d, x, y)
#define avx2_STEP_MIN_f16(d, x, y)                                                        \
	STEP_HALF(avx2, 32, avx2_F16_WIDEN, avx2_F16_NARROW, 0x7c00, REDUCER_F16_QNAN, HOP_MIN, d, x, y)
#define avx2_STEP_MAX_f16(d, x, y)                                                        \
	STEP_HALF(avx2, 32, avx2_F16_WIDEN, avx2_F16_NARROW, 0x7c00, REDUCER_F16_QNAN, HOP_MAX, d, x, y)
#define avx2_STEP_PROD_f16(d, x, y)                                                       \
	STEP_HALF(avx2, 32, avx2_F16_WIDEN, avx2_F16_NARROW, 0x7c00, REDUCER_F16_QNAN, HOP_PROD, d, x, y)
#define avx2_STEP_MIN_bf16(d, x, y)                                                       \
	STEP_HALF(avx2, 32, BF16_WIDEN, BF16_NARROW_EXACT, 0x7f80, REDUCER_BF16_QNAN, HOP_MIN, d, x, y)
#define avx2_STEP_MAX_bf16(d, x, y)                                                       \
	STEP_HALF(avx2, 32, BF16_WIDEN, BF16_NARROW_EXACT, 0x7f80, REDUCER_BF16_QNAN, HOP_MAX, d, x, y)
#define avx2_STEP_PROD_bf16(d, x, y)                                                      \
	STEP_HALF(avx2, 32, BF16_WIDEN, BF16_NARROW_ROUND, 0x7f80, REDUCER_BF16_QNAN, HOP_PROD, d, x, y)

FOLD_PATH(avx2, 32, AVX2_TGT, avx2_F16_WIDEN, avx2_F16_NARROW, avx2_h16)

/* ---- AVX-512: 64-byte vectors ---- */

#define AVX512_TGT __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))
#define avx512_F16_WIDEN(P, F, h)                                                         \
	do {                                                                              \
		__m256i i_;                                                               \
		memcpy(&i_, &(h), 32);                                                    \
		__m512 f_ = _mm512_cvtph_ps(i_);                                          \
		memcpy(&(F), &f_, 64);                                                    \
	} while (0)
#define avx512_F16_NARROW(P, h, R)                                                        \
	do {                                                                              \
		__m512 f_;                                                                \
		memcpy(&f_, &(R), 64);                                                    \
		__m256i i_ = _mm512_cvtps_ph(f_, _MM_FROUND_TO_NEAREST_INT);               \
		memcpy(&(h), &i_, 32);                                                    \
	} while (0)

#define avx512_STEP_MIN_f32(d, x, y) STEP_FMIN(avx512_f32, avx512_i32, 64, d, x, y)
#define avx512_STEP_MAX_f32(d, x, y) STEP_FMAX(avx512_f32, avx512_i32, 64, d, x, y)
#define avx512_STEP_PROD_f32(d, x, y) STEP_FPROD(avx512_f32, 64, d, x, y)
#define avx512_STEP_MIN_f64(d, x, y) STEP_FMIN(avx512_f64, avx512_i64, 64, d, x, y)
#define avx512_STEP_MAX_f64(d, x, y) STEP_FMAX(avx512_f64, avx512_i64, 64, d, x, y)
#define avx512_STEP_PROD_f64(d, x, y) STEP_FPROD(avx512_f64, 64, d, x, y)
#define avx512_STEP_MIN_i32(d, x, y) STEP_IMIN(avx512_i32, 64, d, x, y)
#define avx512_STEP_MAX_i32(d, x, y) STEP_IMAX(avx512_i32, 64, d, x, y)
#define avx512_STEP_PROD_i32(d, x, y) STEP_IPROD(avx512_u32, 64, d, x, y)
#define avx512_STEP_MIN_i64(d, x, y) STEP_IMIN(avx512_i64, 64, d, x, y)
#define avx512_STEP_MAX_i64(d, x, y) STEP_IMAX(avx512_i64, 64, d, x, y)
#define avx512_STEP_PROD_i64(d, x, y) STEP_IPROD(avx512_u64, 64, d, x, y)
#define avx512_STEP_MIN_f16(d, x, y)                                                      \
	STEP_HALF(avx512, 64, avx512_F16_WIDEN, avx512_F16_NARROW, 0x7c00, REDUCER_F16_QNAN, HOP_MIN, d, x, y)
#define avx512_STEP_MAX_f16(d, x, y)                                                      \
	STEP_HALF(avx512, 64, avx512_F16_WIDEN, avx512_F16_NARROW, 0x7c00, REDUCER_F16_QNAN, HOP_MAX, d, x, y)
#define avx512_STEP_PROD_f16(d, x, y)                                                     \
	STEP_HALF(avx512, 64, avx512_F16_WIDEN, avx512_F16_NARROW, 0x7c00, REDUCER_F16_QNAN, HOP_PROD, d, x, y)
#define avx512_STEP_MIN_bf16(d, x, y)                                                     \
	STEP_HALF(avx512, 64, BF16_WIDEN, BF16_NARROW_EXACT, 0x7f80, REDUCER_BF16_QNAN, HOP_MIN, d, x, y)
#define avx512_STEP_MAX_bf16(d, x, y)                                                     \
	STEP_HALF(avx512, 64, BF16_WIDEN, BF16_NARROW_EXACT, 0x7f80, REDUCER_BF16_QNAN, HOP_MAX, d, x, y)
#define avx512_STEP_PROD_bf16(d, x, y)                                                    \
	STEP_HALF(avx512, 64, BF16_WIDEN, BF16_NARROW_ROUND, 0x7f80, REDUCER_BF16_QNAN, HOP_PROD, d, x, y)

FOLD_PATH(avx512, 64, AVX512_TGT, avx512_F16_WIDEN, avx512_F16_NARROW, avx512_h16)

#endif /* REDUCER_HAVE_X86 */

static const struct fold_table *fold_table(void)
{
	switch (reducer_active_isa()) {
#if REDUCER_HAVE_X86
	case REDUCER_ISA_AVX512:
		return &fold_avx512;
	case REDUCER_ISA_AVX2:
		return &fold_avx2;
#endif
	default:
		return &fold_scalar;
	}
}

void reducer_fold(reducer_op op, void *dst, const void *a, const void *b, size_t n,
		  unisum_dtype dtype)
{
	const struct fold_table *t = fold_table();
	switch (op) {
	case REDUCER_SUM:
		reducer_sum(dst, a, b, n, dtype);
		break;
	case REDUCER_MIN:
		t->min[dtype](dst, a, b, n);
		break;
	case REDUCER_MAX:
		t->max[dtype](dst, a, b, n);
		break;
	case REDUCER_PRODUCT:
		t->prod[dtype](dst, a, b, n);
		break;
	case REDUCER_BOR:
		t->bor(dst, a, b, n * unisum_dtype_size(dtype));
		break;
	default:
		break;
	}
}

void reducer_fold_into(reducer_op op, void *dst, const void *src, size_t n, unisum_dtype dtype)
{
	reducer_fold(op, dst, dst, src, n, dtype);
}
