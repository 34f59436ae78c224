/*
 * reducer.h - elementwise sums of every dtype, SIMD with runtime dispatch.
 *
 * The Summation Service spends its CPU time here, so these loops are
 * memory-bound by design: one pass, no temporaries.  The implementation
 * picks AVX-512, AVX2(+F16C) or a scalar path once, at first use, from
 * what the CPU reports; reducer_force_isa() lets tests and benchmarks pin
 * one path.  float16 and bfloat16 are summed by widening to float32,
 * adding, and rounding back to nearest-even (NaN stays NaN), so every path
 * gives bit-identical results for every dtype.  A float16 or bfloat16
 * result that is NaN is always the canonical quiet NaN (0x7e00, 0x7fc0):
 * which payload survives a sum of two NaNs is otherwise left open by IEEE.
 * For float32 and float64 that one case (both operands NaN) gives a NaN
 * whose payload may differ between paths; every other input is exact.
 *
 * Nothing here allocates or fails: callers validate dtype and lengths.
 * Buffers may be unaligned; `dst` may equal `src` or `a`/`b`.
 */
#ifndef UNISUM_REDUCER_H
#define UNISUM_REDUCER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "unisum.h"

/* The instruction-set paths, best last. */
typedef enum reducer_isa {
	REDUCER_ISA_SCALAR = 0,
	REDUCER_ISA_AVX2 = 1,	/* AVX2 + FMA-free adds + F16C conversions */
	REDUCER_ISA_AVX512 = 2,	/* AVX-512F/BW/VL/DQ; no FP16 or BF16 needed */
} reducer_isa;

/* dst[i] += src[i] for i < n. */
void reducer_sum_into(void *dst, const void *src, size_t n, unisum_dtype dtype);

/* dst[i] = a[i] + b[i] for i < n. */
void reducer_sum(void *dst, const void *a, const void *b, size_t n, unisum_dtype dtype);

/* buf[i] /= divisor for i < n (divisor >= 1).  Floats divide (float16 and
 * bfloat16 through float32, rounded to nearest-even); integers floor-divide
 * as Python and torch do.  A divisor of 1 leaves buf untouched. */
void reducer_divide(void *buf, size_t n, unisum_dtype dtype, int divisor);

/* The reductions a collective may ask for (reducer_fold.c).  REDUCER_BOR
 * is the bitwise OR of the bytes: it assembles contributions that are
 * zero outside their own elements (allgather, alltoall) exactly, whatever
 * the dtype. */
typedef enum reducer_op {
	REDUCER_SUM = 0,
	REDUCER_MIN = 1,
	REDUCER_MAX = 2,
	REDUCER_PRODUCT = 3,
	REDUCER_BOR = 4,
	REDUCER_OP_COUNT
} reducer_op;

/* dst[i] = a[i] op b[i] for i < n; dst may equal a or b.  min and max of
 * floats: NaN if either is (float16/bfloat16: the canonical quiet NaN),
 * min(-0, +0) = -0, max(-0, +0) = +0, whatever the order.  Products of
 * float16/bfloat16 are rounded once to nearest-even; integer products
 * wrap. */
void reducer_fold(reducer_op op, void *dst, const void *a, const void *b, size_t n,
		  unisum_dtype dtype);

/* dst[i] = dst[i] op src[i]. */
void reducer_fold_into(reducer_op op, void *dst, const void *src, size_t n, unisum_dtype dtype);

/* The path in use, and its name ("avx512", "avx2", "scalar"). */
reducer_isa reducer_active_isa(void);
const char *reducer_isa_name(reducer_isa isa);

/* Whether this CPU can run `isa`. */
bool reducer_isa_is_supported(reducer_isa isa);

/* Pins the path (tests, benchmarks).  Returns 0, or UNISUM_EINVAL when the
 * CPU cannot run it. */
int reducer_force_isa(reducer_isa isa);

/* Scalar conversions, exact reference semantics (round to nearest-even). */
float reducer_f16_to_f32(uint16_t h);
uint16_t reducer_f32_to_f16(float f);
float reducer_bf16_to_f32(uint16_t h);
uint16_t reducer_f32_to_bf16(float f);

#endif /* UNISUM_REDUCER_H */
