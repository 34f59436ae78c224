/*
 * reducer_ref.h - test_reducer's reference (reducer_ref.c): random numbers
 * (xorshift64*), element access by dtype, and the arithmetic the reducer
 * must match bit for bit, written without calling the module: float16 and
 * bfloat16 decoded with ldexp() and rounded with nearbyint() in double
 * precision, integer floor division through wider types.
 */
#ifndef TEST_REDUCER_REF_H
#define TEST_REDUCER_REF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "unisum.h"

#define F16_QNAN 0x7e00u
#define BF16_QNAN 0x7fc0u

extern uint64_t rng_state;	/* the generator's state: seed * 2 + 1 */

struct small_format {
	int exponent_bits;
	int mantissa_bits;
	uint16_t qnan;	/* the canonical quiet NaN of the reducer's results */
};
extern const struct small_format f16_format, bf16_format;

uint64_t rnd(void);
size_t rnd_below(size_t n);
double rnd_unit(void);
size_t dtype_size(unisum_dtype dtype);
const char *dtype_name(unisum_dtype dtype);
uint64_t get_elem(const unsigned char *p, size_t i, size_t size);
void put_elem(unsigned char *p, size_t i, size_t size, uint64_t v);
float f32_of(uint32_t u);
uint32_t bits_of_f32(float f);
double f64_of(uint64_t u);
uint64_t bits_of_f64(double d);
int format_bias(const struct small_format *fmt);
float ref_decode(uint16_t h, const struct small_format *fmt);
uint16_t ref_encode(float f, const struct small_format *fmt, uint16_t nan);
const struct small_format *small_format_of(unisum_dtype dtype);
uint64_t ref_add(unisum_dtype dtype, uint64_t a, uint64_t b);
int64_t ref_floor_div(int64_t x, int divisor);
uint64_t ref_divide(unisum_dtype dtype, uint64_t x, int divisor);
bool elem_is_nan(unisum_dtype dtype, uint64_t v);
float rnd_f32(void);
double rnd_f64(void);
uint16_t rnd_small(unisum_dtype dtype);
uint64_t rnd_elem(unisum_dtype dtype);

#endif
