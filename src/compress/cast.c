/*
 * cast.c - fp16 and bf16: each float32 rounded to nearest-even in two
 * bytes (compress.h), with the reducer's conversions, so a cast here and a
 * float16 sum there round alike.
 */
#include "compress/codecs.h"
#include "reducer/reducer.h"

static size_t half_bytes(const struct compress_spec *s, size_t n)
{
	(void)s;
	return 2 * n;
}

static void half_encode(const float *in, size_t n, uint8_t *out, uint16_t (*to)(float))
{
	for (size_t i = 0; i < n; i++) {
		uint16_t h = to(in[i]);

		memcpy(out + 2 * i, &h, 2);
	}
}

static int half_decode(const uint8_t *in, size_t len, float *out, size_t n,
		       float (*from)(uint16_t))
{
	if (len != 2 * n)
		return -1;
	for (size_t i = 0; i < n; i++) {
		uint16_t h;

		memcpy(&h, in + 2 * i, 2);
		out[i] = from(h);
	}
	return 0;
}

static void fp16_encode(const struct compress_spec *s, const float *in, size_t n, void *out,
			uint64_t seed)
{
	(void)s, (void)seed;
	half_encode(in, n, out, reducer_f32_to_f16);
}

static int fp16_decode(const struct compress_spec *s, const void *in, size_t len, float *out,
		       size_t n, uint64_t seed)
{
	(void)s, (void)seed;
	return half_decode(in, len, out, n, reducer_f16_to_f32);
}

static void bf16_encode(const struct compress_spec *s, const float *in, size_t n, void *out,
			uint64_t seed)
{
	(void)s, (void)seed;
	half_encode(in, n, out, reducer_f32_to_bf16);
}

static int bf16_decode(const struct compress_spec *s, const void *in, size_t len, float *out,
		       size_t n, uint64_t seed)
{
	(void)s, (void)seed;
	return half_decode(in, len, out, n, reducer_bf16_to_f32);
}

const struct compress_codec compress_fp16 = { "fp16", half_bytes, fp16_encode, fp16_decode };
const struct compress_codec compress_bf16 = { "bf16", half_bytes, bf16_encode, bf16_decode };
