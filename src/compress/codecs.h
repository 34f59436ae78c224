/*
 * codecs.h - the codecs behind compress_codec_of(), one file each, and
 * the little they share.  Private to src/compress/.
 */
#ifndef UNISUM_COMPRESS_CODECS_H
#define UNISUM_COMPRESS_CODECS_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "compress/compress.h"

extern const struct compress_codec compress_fp16;	/* cast.c */
extern const struct compress_codec compress_bf16;	/* cast.c */
extern const struct compress_codec compress_onebit;	/* onebit.c */
extern const struct compress_codec compress_topk;	/* sparse.c */
extern const struct compress_codec compress_randomk;	/* sparse.c */
extern const struct compress_codec compress_dithering;	/* dithering.c */

/* Whether the AVX2 paths run: the CPU has AVX2 and compress_force_scalar()
 * did not turn them off. */
bool compress_use_avx2(void);

/* Unaligned little-endian loads and stores (x86 and every target here is
 * little-endian; memcpy compiles to one move). */
static inline uint32_t codec_load_u32(const void *p)
{
	uint32_t v;

	memcpy(&v, p, 4);
	return v;
}

static inline void codec_store_u32(void *p, uint32_t v)
{
	memcpy(p, &v, 4);
}

static inline float codec_load_f32(const void *p)
{
	float v;

	memcpy(&v, p, 4);
	return v;
}

static inline void codec_store_f32(void *p, float v)
{
	memcpy(p, &v, 4);
}

#endif /* UNISUM_COMPRESS_CODECS_H */
