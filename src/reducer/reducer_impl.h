/*
 * reducer_impl.h - what the reducer's files share and nobody else sees.
 *
 * Each instruction-set path (reducer.c for scalar, reducer_avx2.c,
 * reducer_avx512.c) exports one table of loops, struct reducer_ops, and
 * reducer.c picks the table at first use.  Every loop of every table has the
 * same contract as the public call it serves (reducer.h): buffers of any
 * alignment, any length, `dst` equal to `a` or `b` allowed, and results
 * bit-identical to the scalar table for every input.
 *
 * The scalar element helpers below are what the SIMD files use for their
 * tails, so a tail can never round differently from the scalar path.
 */
#ifndef UNISUM_REDUCER_IMPL_H
#define UNISUM_REDUCER_IMPL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "reducer/reducer.h"

/* The SIMD files only have code on x86; elsewhere only the scalar path
 * exists and reducer_isa_is_supported() says so. */
#if defined(__x86_64__) || defined(__i386__)
#define REDUCER_HAVE_X86 1
#else
#define REDUCER_HAVE_X86 0
#endif

/*
 * The canonical quiet NaNs.  A float16 or bfloat16 sum or quotient that is
 * NaN is stored as this exact pattern: when both operands are NaN, IEEE
 * leaves open which payload survives (and compilers swap the operands of
 * an add freely), so a fixed pattern is the only way every path agrees bit
 * for bit.
 */
#define REDUCER_F16_QNAN 0x7e00u
#define REDUCER_BF16_QNAN 0x7fc0u

/* dst[i] = a[i] + b[i] for i < n; dst may equal a or b. */
typedef void (*reducer_sum_fn)(void *dst, const void *a, const void *b, size_t n);

/* buf[i] /= divisor for i < n; divisor >= 2 (the caller skips 1). */
typedef void (*reducer_divide_fn)(void *buf, size_t n, int divisor);

/* One instruction-set path: a loop per dtype, indexed by unisum_dtype. */
struct reducer_ops {
	reducer_isa isa;			/* which path this table is */
	reducer_sum_fn sum[UNISUM_DTYPE_COUNT];	/* elementwise a + b */
	reducer_divide_fn divide[UNISUM_DTYPE_COUNT]; /* elementwise / divisor */
};

extern const struct reducer_ops reducer_scalar_ops;
#if REDUCER_HAVE_X86
extern const struct reducer_ops reducer_avx2_ops;
extern const struct reducer_ops reducer_avx512_ops;
#endif

/* Rounds a float32 result to float16 (bfloat16) to nearest-even; a NaN
 * becomes the canonical quiet NaN above.  This is how every path stores a
 * float16 or bfloat16 result. */
uint16_t reducer_f16_round(float f);
uint16_t reducer_bf16_round(float f);

/* The scalar loops, which the SIMD tables reuse for the dtypes they do not
 * vectorize (integer division). */
void reducer_scalar_divide_i32(void *buf, size_t n, int divisor);
void reducer_scalar_divide_i64(void *buf, size_t n, int divisor);

/*
 * Loads and stores of one element at any byte address.  memcpy of a fixed
 * small size compiles to one move, and unlike a cast pointer it is defined
 * behaviour (and quiet under -fsanitize=alignment) when the address is not
 * a multiple of the element size.
 */
static inline float reducer_load_f32(const unsigned char *p)
{
	float v;

	memcpy(&v, p, sizeof(v));
	return v;
}

static inline void reducer_store_f32(unsigned char *p, float v)
{
	memcpy(p, &v, sizeof(v));
}

static inline double reducer_load_f64(const unsigned char *p)
{
	double v;

	memcpy(&v, p, sizeof(v));
	return v;
}

static inline void reducer_store_f64(unsigned char *p, double v)
{
	memcpy(p, &v, sizeof(v));
}

static inline uint16_t reducer_load_u16(const unsigned char *p)
{
	uint16_t v;

	memcpy(&v, p, sizeof(v));
	return v;
}

static inline void reducer_store_u16(unsigned char *p, uint16_t v)
{
	memcpy(p, &v, sizeof(v));
}

static inline uint32_t reducer_load_u32(const unsigned char *p)
{
	uint32_t v;

	memcpy(&v, p, sizeof(v));
	return v;
}

static inline void reducer_store_u32(unsigned char *p, uint32_t v)
{
	memcpy(p, &v, sizeof(v));
}

static inline uint64_t reducer_load_u64(const unsigned char *p)
{
	uint64_t v;

	memcpy(&v, p, sizeof(v));
	return v;
}

static inline void reducer_store_u64(unsigned char *p, uint64_t v)
{
	memcpy(p, &v, sizeof(v));
}

#endif /* UNISUM_REDUCER_IMPL_H */
