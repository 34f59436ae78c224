/*
 * test_compress.c - the compressors (src/compress/), each against a plain
 * reference written here:
 *
 *   - specs: BytePS's keys parsed, the canonical text parsing back to the
 *     same spec, and every bad spec refused naming its key;
 *   - fp16 and bf16: decode(encode(x)) == x on representable values, and
 *     the reducer's rounding on the rest;
 *   - onebit: every sign kept (-0.0 too), the scale the mean |x| (1.0
 *     without scaling), at sizes around the 32-bit words and the 8-wide
 *     SIMD blocks;
 *   - top-k: exactly the k largest |x|, ties to the lower index, in index
 *     order, k as a count and as a fraction;
 *   - random-k: the same indices from the same (job seed, key, round) for
 *     any rank, distinct, increasing, one per stratum, and other indices
 *     in another round;
 *   - dithering: every decoded element one of the two levels around it,
 *     exact on a level, and unbiased: the mean over 4000 seeds within 5
 *     standard deviations of the bound on the rounding's variance (a gap
 *     between adjacent levels g gives a variance of at most g^2/4);
 *   - the scalar paths and the SIMD ones give the same bytes (so a Python
 *     reference of the same order can check a job bitwise);
 *   - error feedback (vanilla, and sparse for random-k): over 50 rounds,
 *     what was sent plus the final residual is the inputs' sum within the
 *     float32 rounding of the feedback's own adds; Nesterov momentum on a
 *     worker, none on a server;
 *   - malformed encodings (wrong lengths, indices out of range or out of
 *     order, levels above s, stray bits) refused.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "compress/compress.h"
#include "reducer/reducer.h"

static struct compress_spec spec_of(const char *text)
{
	struct compress_spec s;
	char err[256];

	if (compress_spec_parse(text, &s, err, sizeof(err)) != 0)
		fail_msg("'%s' refused: %s", text, err);
	return s;
}

/* Encodes in[0 .. n) and decodes it again into out; returns the bytes. */
static size_t round_trip(const struct compress_spec *s, const float *in, size_t n, float *out,
			 uint64_t seed)
{
	const struct compress_codec *c = compress_codec_of(s->kind);
	size_t bytes = c->bytes(s, n);
	uint8_t *buf = malloc(bytes + 1);

	assert_non_null(buf);
	c->encode(s, in, n, buf, seed);
	assert_int_equal(c->decode(s, buf, bytes, out, n, seed), 0);
	/* One byte more or less is not an encoding of n elements. */
	assert_int_equal(c->decode(s, buf, bytes + 1, out, n, seed), -1);
	if (bytes > 0)
		assert_int_equal(c->decode(s, buf, bytes - 1, out, n, seed), -1);
	assert_int_equal(c->decode(s, buf, bytes, out, n, seed), 0);
	free(buf);
	return bytes;
}

/* Gradient-like values: mostly small, some large, both signs, some ties. */
static void fill(float *x, size_t n, unsigned seed)
{
	srand(seed);
	for (size_t i = 0; i < n; i++) {
		int r = rand();
		x[i] = (float)((r % 2001) - 1000) / 1000.0f * (r % 17 == 0 ? 8.0f : 0.5f);
	}
}

/* ---- specs --------------------------------------------------------------- */

static void test_spec_parse(void **state)
{
	(void)state;
	struct compress_spec s = spec_of("onebit,scaling=1,ef=vanilla,momentum=nesterov,mu=0.9");
	assert_int_equal(s.kind, COMPRESS_ONEBIT);
	assert_true(s.scaling);
	assert_int_equal(s.ef, COMPRESS_EF_VANILLA);
	assert_true(s.nesterov);
	assert_true(s.mu == 0.9);

	s = spec_of("compressor=topk,k=0.01");
	assert_int_equal(s.kind, COMPRESS_TOPK);
	assert_int_equal(compress_k(&s, 1000), 10);
	assert_int_equal(compress_k(&s, 10), 1);		/* at least one */
	s = spec_of("randomk,k=1000,seed=7,ef=sparse");
	assert_int_equal(compress_k(&s, 10), 10);		/* at most n */
	assert_int_equal(compress_k(&s, 5000), 1000);
	assert_true(s.seed == 7);
	s = spec_of("dithering,s=4,normalize=l2,partition=natural,momentum_mu=0.5,momentum=nesterov");
	assert_int_equal(s.s, 4);
	assert_true(s.l2 && s.natural && s.mu == 0.5);

	/* The canonical text parses back to the same spec. */
	const char *const texts[] = { "fp16", "bf16", "onebit", "onebit,scaling=0,ef=vanilla",
		"topk,k=0.05", "topk,k=17,momentum=nesterov,mu=0.8", "randomk,k=3,seed=99,ef=sparse",
		"dithering", "dithering,s=2,normalize=l2,partition=natural,seed=5", NULL };
	for (const char *const *t = texts; *t; t++) {
		struct compress_spec a = spec_of(*t), b;
		char text[COMPRESS_SPEC_MAX], err[256];

		assert_true(compress_spec_format(&a, text, sizeof(text)) < sizeof(text));
		assert_int_equal(compress_spec_parse(text, &b, err, sizeof(err)), 0);
		assert_memory_equal(&a, &b, sizeof(a));
		assert_string_equal(text, *t);	/* these are written canonically */
	}
}

static void test_spec_refused(void **state)
{
	(void)state;
	static const struct {
		const char *text, *says;
	} bad[] = {
		{ "", "no compressor" },
		{ "zip", "got 'zip'" },
		{ "k=3", "got 'k'" },
		{ "onebit,scaling=maybe", "scaling=maybe" },
		{ "onebit,k=3", "'k' does not apply to onebit" },
		{ "topk,k=0", "k=0" },
		{ "topk,k=2.5", "k=2.5" },
		{ "topk,s=3", "'s' does not apply to topk" },
		{ "dithering,s=0", "s=0" },
		{ "dithering,s=200", "s=200" },
		{ "dithering,normalize=l1", "normalize=l1" },
		{ "dithering,partition=log", "partition=log" },
		{ "randomk,seed=-1", "seed=-1" },
		{ "onebit,ef=sparse", "ef=sparse" },
		{ "onebit,momentum=adam", "momentum=adam" },
		{ "onebit,momentum=nesterov,mu=1", "mu=1" },
		{ "onebit,mu=0.5", "mu goes with momentum=nesterov" },
		{ "onebit,ef", "'ef' needs a value" },
		{ "onebit,colour=blue", "unknown key 'colour'" },
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct compress_spec s;
		char err[256];

		assert_int_equal(compress_spec_parse(bad[i].text, &s, err, sizeof(err)), -1);
		if (!strstr(err, bad[i].says) || !strstr(err, "compression spec"))
			fail_msg("'%s': '%s' does not say '%s'", bad[i].text, err, bad[i].says);
	}
}

/* ---- casts --------------------------------------------------------------- */

static void test_casts(void **state)
{
	(void)state;
	enum { N = 1000 };
	float in[N], out[N];

	/* Representable in both (8 significant bits): halves up to 127.5. */
	for (int i = 0; i < N; i++)
		in[i] = (float)(i % 256 - 128) * 0.5f;
	struct compress_spec s = spec_of("fp16");
	assert_int_equal(round_trip(&s, in, N, out, 0), 2 * N);
	assert_memory_equal(in, out, sizeof(in));
	s = spec_of("bf16");
	round_trip(&s, in, N, out, 0);
	assert_memory_equal(in, out, sizeof(in));
	/* Elsewhere: the reducer's rounding. */
	fill(in, N, 3);
	for (int i = 0; i < N; i++)
		in[i] *= 1.0001f;
	round_trip(&s, in, N, out, 0);
	for (int i = 0; i < N; i++)
		assert_true(out[i] == reducer_bf16_to_f32(reducer_f32_to_bf16(in[i])));
	s = spec_of("fp16");
	round_trip(&s, in, N, out, 0);
	for (int i = 0; i < N; i++)
		assert_true(out[i] == reducer_f16_to_f32(reducer_f32_to_f16(in[i])));
}

/* ---- onebit -------------------------------------------------------------- */

static void test_onebit(void **state)
{
	(void)state;
	static const size_t sizes[] = { 0, 1, 7, 8, 9, 31, 32, 33, 63, 64, 65, 1000, 100003 };
	struct compress_spec scaled = spec_of("onebit"), plain = spec_of("onebit,scaling=0");

	for (size_t t = 0; t < sizeof(sizes) / sizeof(sizes[0]); t++) {
		size_t n = sizes[t];
		float *in = malloc((n + 1) * sizeof(float)), *out = malloc((n + 1) * sizeof(float));
		double sum = 0;

		fill(in, n, (unsigned)n);
		if (n > 2)
			in[1] = -0.0f, in[2] = 0.0f;
		for (size_t i = 0; i < n; i++)
			sum += fabs(in[i]);
		size_t bytes = round_trip(&scaled, in, n, out, 0);
		assert_int_equal(bytes, 4 + 4 * ((n + 31) / 32));
		float scale = n ? (float)(sum / (double)n) : 0.0f;
		for (size_t i = 0; i < n; i++) {
			/* Every sign, and the mean |x| as the magnitude. */
			assert_int_equal(signbit(out[i]) != 0, signbit(in[i]) != 0);
			if (fabsf(fabsf(out[i]) - scale) > 1e-5f * scale)
				fail_msg("n=%zu: |out[%zu]| = %g, mean |x| = %g", n, i, fabsf(out[i]),
					 scale);
		}
		round_trip(&plain, in, n, out, 0);
		for (size_t i = 0; i < n; i++)
			assert_true(out[i] == (signbit(in[i]) ? -1.0f : 1.0f));
		free(in);
		free(out);
	}
	/* Onebit sends 1/32 of the bytes, and a little. */
	assert_true(compress_codec_of(COMPRESS_ONEBIT)->bytes(&scaled, 1 << 20) * 30 < 4u << 20);

	/* A stray bit past n is not an encoding of n. */
	float in[40] = { 0 }, out[40];
	uint8_t buf[12];
	compress_codec_of(COMPRESS_ONEBIT)->encode(&scaled, in, 40, buf, 0);
	buf[4 + 4 + 3] |= 0x80;	/* bit 31 of word 1: element 63 */
	assert_int_equal(compress_codec_of(COMPRESS_ONEBIT)->decode(&scaled, buf, 12, out, 40, 0), -1);
}

/* ---- top-k --------------------------------------------------------------- */

static const float *sort_key;

static int by_magnitude(const void *a, const void *b)
{
	size_t i = *(const size_t *)a, j = *(const size_t *)b;
	float x = fabsf(sort_key[i]), y = fabsf(sort_key[j]);

	return x > y ? -1 : x < y ? 1 : (i > j) - (i < j);
}

static void test_topk(void **state)
{
	(void)state;
	static const struct { size_t n; const char *spec; } cases[] = {
		{ 1, "topk,k=1" }, { 10, "topk,k=10" }, { 100, "topk,k=7" }, { 1000, "topk,k=0.01" },
		{ 4097, "topk,k=0.1" }, { 100000, "topk,k=0.01" }, { 100000, "topk,k=999" },
	};
	for (size_t t = 0; t < sizeof(cases) / sizeof(cases[0]); t++) {
		size_t n = cases[t].n;
		struct compress_spec s = spec_of(cases[t].spec);
		size_t k = compress_k(&s, n);
		float *in = malloc(n * sizeof(float)), *out = malloc(n * sizeof(float));
		size_t *order = malloc(n * sizeof(size_t));
		char *taken = calloc(n, 1);

		fill(in, n, (unsigned)(n + t));	/* many ties: values are multiples of 1/2000 */
		for (size_t i = 0; i < n; i++)
			order[i] = i;
		sort_key = in;
		qsort(order, n, sizeof(size_t), by_magnitude);
		for (size_t j = 0; j < k; j++)
			taken[order[j]] = 1;
		assert_int_equal(round_trip(&s, in, n, out, 0), 4 + 8 * k);
		for (size_t i = 0; i < n; i++) {
			if (out[i] != (taken[i] ? in[i] : 0.0f))
				fail_msg("%s on %zu: element %zu is %g, want %g", cases[t].spec, n, i,
					 out[i], taken[i] ? in[i] : 0.0f);
		}
		free(in), free(out), free(order), free(taken);
	}

	/* Malformed: an index out of range, out of order, a wrong k. */
	struct compress_spec s = spec_of("topk,k=2");
	const struct compress_codec *c = compress_codec_of(COMPRESS_TOPK);
	float in[8] = { 1, -5, 2, 0, 7, 0, 0, 3 }, out[8];
	uint8_t buf[20], bad[20];
	c->encode(&s, in, 8, buf, 0);
	uint32_t i0, i1;
	memcpy(&i0, buf + 4, 4), memcpy(&i1, buf + 12, 4);
	assert_int_equal(i0, 1);
	assert_int_equal(i1, 4);
	memcpy(bad, buf, 20), memcpy(bad + 12, &(uint32_t){ 8 }, 4);
	assert_int_equal(c->decode(&s, bad, 20, out, 8, 0), -1);
	memcpy(bad, buf, 20), memcpy(bad + 12, &(uint32_t){ 1 }, 4);
	assert_int_equal(c->decode(&s, bad, 20, out, 8, 0), -1);
	memcpy(bad, buf, 20), memcpy(bad, &(uint32_t){ 3 }, 4);
	assert_int_equal(c->decode(&s, bad, 20, out, 8, 0), -1);
}

/* ---- random-k ------------------------------------------------------------ */

static void test_randomk(void **state)
{
	(void)state;
	enum { N = 10007 };
	struct compress_spec s = spec_of("randomk,k=0.01,seed=42");
	size_t k = compress_k(&s, N);
	uint32_t a[N], b[N];
	float in[N], out[N];

	/* Every rank and server derives the key's round seed alike. */
	uint64_t seed = compress_seed(s.seed, 1234, 7, -1);
	assert_true(seed == compress_seed(s.seed, 1234, 7, -1));
	compress_randomk_indices(N, k, seed, a);
	compress_randomk_indices(N, k, compress_seed(s.seed, 1234, 7, -1), b);
	assert_memory_equal(a, b, k * sizeof(uint32_t));
	for (size_t j = 0; j < k; j++) {
		assert_true(a[j] >= j * N / k && a[j] < (j + 1) * N / k);	/* its stratum */
		if (j > 0)
			assert_true(a[j] > a[j - 1]);
	}
	/* Another round, another key: other indices. */
	compress_randomk_indices(N, k, compress_seed(s.seed, 1234, 8, -1), b);
	assert_memory_not_equal(a, b, k * sizeof(uint32_t));
	compress_randomk_indices(N, k, compress_seed(s.seed, 1235, 7, -1), b);
	assert_memory_not_equal(a, b, k * sizeof(uint32_t));
	/* A rank's own seed differs (for dithering's independent draws). */
	assert_true(compress_seed(s.seed, 1234, 7, 0) != compress_seed(s.seed, 1234, 7, 1));

	/* Only the values travel; they land at the indices. */
	fill(in, N, 5);
	assert_int_equal(round_trip(&s, in, N, out, seed), 4 * k);
	size_t j = 0;
	for (size_t i = 0; i < N; i++) {
		if (j < k && a[j] == i)
			assert_true(out[i] == in[a[j++]]);
		else
			assert_true(out[i] == 0.0f);
	}
	assert_int_equal(j, k);
}

/* ---- dithering ----------------------------------------------------------- */

/* The level values of spec s (norm 1), ascending, into lv; returns count. */
static int levels_of(const struct compress_spec *s, double *lv)
{
	lv[0] = 0;
	for (int l = 1; l <= s->s; l++)
		lv[l] = s->natural ? ldexp(1.0, l - s->s) : (double)l / s->s;
	return s->s + 1;
}

static void test_dithering(void **state)
{
	(void)state;
	enum { N = 257, SEEDS = 4000 };
	static const char *const specs[] = { "dithering", "dithering,s=1",
		"dithering,s=3,normalize=l2", "dithering,s=6,partition=natural", NULL };

	for (const char *const *t = specs; *t; t++) {
		struct compress_spec s = spec_of(*t);
		float in[N], out[N];
		double mean[N] = { 0 }, lv[130];
		int nl = levels_of(&s, lv);

		fill(in, N, 9);
		double norm = 0;
		for (int i = 0; i < N; i++)
			norm = s.l2 ? norm + (double)in[i] * in[i] : fmax(norm, fabs(in[i]));
		norm = s.l2 ? sqrt(norm) : norm;
		for (int r = 0; r < SEEDS; r++) {
			round_trip(&s, in, N, out, compress_seed(1, 2, (uint64_t)r, 3));
			for (int i = 0; i < N; i++) {
				/* A level around |x| / norm (within float rounding of
				 * |x| / norm: on a level, a neighbour may come up once
				 * in 10^7), with x's sign. */
				double v = fabs(in[i]) / norm, got = fabs(out[i]) / norm;
				double below = 0, above = 1;
				for (int l = 0; l < nl; l++) {
					if (lv[l] <= v - 1e-6)
						below = lv[l];
					if (lv[nl - 1 - l] >= v + 1e-6)
						above = lv[nl - 1 - l];
				}
				int on_level = 0;
				for (int l = 0; l < nl; l++)
					on_level |= lv[l] >= below - 1e-6 && lv[l] <= above + 1e-6 &&
						    fabs(got - lv[l]) <= 1e-6;
				if (!on_level)
					fail_msg("%s: element %d (%g) decoded %g, not a level around it", *t,
						 i, in[i], out[i]);
				if (out[i] != 0 && signbit(out[i]) != signbit(in[i]))
					fail_msg("%s: element %d lost its sign", *t, i);
				mean[i] += out[i];
			}
		}
		for (int i = 0; i < N; i++) {
			/* The gap between the levels around |x|/norm bounds the
			 * variance of one draw by gap^2 / 4. */
			double v = fabs(in[i]) / norm, gap = 0;
			for (int l = 1; l < nl; l++)
				if (lv[l - 1] <= v && v <= lv[l])
					gap = fmax(gap, lv[l] - lv[l - 1]);
			double sd = gap * norm / 2 / sqrt(SEEDS);
			double err = fabs(mean[i] / SEEDS - in[i]);
			if (err > 5 * sd + 1e-6 * norm)
				fail_msg("%s: element %d (%g): mean of %d draws %g, off by %g > 5 sd (%g)",
					 *t, i, in[i], SEEDS, mean[i] / SEEDS, err, sd);
		}
	}

	/* On a level, exact whatever the draw: 0, +-norm, +-norm/2 with s=2. */
	struct compress_spec s = spec_of("dithering,s=2");
	float in[6] = { 0, 4, -4, 2, -2, 0 }, out[6];
	for (int r = 0; r < 50; r++) {
		round_trip(&s, in, 6, out, (uint64_t)r);
		assert_memory_equal(in, out, sizeof(in));
	}
	/* A level above s is malformed: s=2 packs levels in 3 bits of 4 (3 is
	 * not one), in the tail and in a whole block of 8 alike. */
	const struct compress_codec *c = compress_codec_of(COMPRESS_DITHERING);
	uint8_t buf[8];
	c->encode(&s, in, 6, buf, 0);
	buf[4] |= 0x3;	/* element 0's level bits */
	assert_int_equal(c->decode(&s, buf, 4 + 3, out, 6, 0), -1);
	float big[40], big_out[40];
	uint8_t wire[4 + 20];
	fill(big, 40, 2);
	c->encode(&s, big, 40, wire, 0);
	assert_int_equal(c->decode(&s, wire, sizeof(wire), big_out, 40, 0), 0);
	wire[4 + 5] = (uint8_t)((wire[4 + 5] & 0xf0) | 0x3);	/* element 10 */
	assert_int_equal(c->decode(&s, wire, sizeof(wire), big_out, 40, 0), -1);
}

/* ---- every path, the same bytes ------------------------------------------ */

static void test_paths_agree(void **state)
{
	(void)state;
	static const char *const specs[] = { "onebit", "onebit,scaling=0", "topk,k=0.01",
		"randomk,k=0.01", "dithering", "dithering,s=1", "dithering,s=100",
		"dithering,normalize=l2", "dithering,s=3,partition=natural", "fp16", "bf16", NULL };
	static const size_t sizes[] = { 1, 7, 8, 9, 31, 33, 1000, 40000, 100003 };

	for (const char *const *t = specs; *t; t++) {
		struct compress_spec s = spec_of(*t);
		const struct compress_codec *c = compress_codec_of(s.kind);

		for (size_t z = 0; z < sizeof(sizes) / sizeof(sizes[0]); z++) {
			size_t n = sizes[z], bytes = c->bytes(&s, n);
			float *in = malloc(n * sizeof(float));
			uint8_t *a = malloc(bytes), *b = malloc(bytes);

			float *x = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float));

			fill(in, n, (unsigned)(n * 7));
			compress_force_scalar(true);
			c->encode(&s, in, n, a, 77);
			assert_int_equal(c->decode(&s, a, bytes, x, n, 77), 0);
			compress_force_scalar(false);
			c->encode(&s, in, n, b, 77);
			assert_int_equal(c->decode(&s, b, bytes, y, n, 77), 0);
			if (memcmp(a, b, bytes) != 0)
				fail_msg("%s on %zu elements: the scalar and the best path encode "
					 "differently", *t, n);
			if (memcmp(x, y, n * sizeof(float)) != 0)
				fail_msg("%s on %zu elements: the scalar and the best path decode "
					 "differently", *t, n);
			free(in), free(a), free(b), free(x), free(y);
		}
	}
	/* A non-finite element makes the norm NaN and every element NaN. */
	struct compress_spec s = spec_of("dithering");
	float in[20], out[20];
	fill(in, 20, 1);
	in[13] = INFINITY;
	round_trip(&s, in, 20, out, 1);
	for (int i = 0; i < 20; i++)
		assert_true(isnan(out[i]));
}

/* ---- error feedback and momentum ------------------------------------------ */

/* Over 50 rounds of inputs: what was sent plus the final residual is the
 * sum of the inputs, up to the float32 rounding of the feedback's own
 * adds and subtracts (half an ulp of each result, summed in the bound). */
static void test_error_feedback(void **state)
{
	(void)state;
	enum { N = 1000, ROUNDS = 50 };
	static const char *const specs[] = { "onebit,ef=vanilla", "topk,k=0.01,ef=vanilla",
		"dithering,s=1,ef=vanilla", "randomk,k=0.05,ef=vanilla", "randomk,k=0.05,ef=sparse",
		"fp16,ef=vanilla", NULL };

	for (const char *const *t = specs; *t; t++) {
		struct compress_spec spec = spec_of(*t);
		const struct compress_codec *c = compress_codec_of(spec.kind);
		struct compress_state st;
		size_t bytes = c->bytes(&spec, N);
		uint8_t *wire = malloc(bytes);
		float g[N], sent[N];
		double want[N] = { 0 }, got[N] = { 0 }, bound[N] = { 0 };

		assert_int_equal(compress_state_init(&st, &spec, N, true), 0);
		for (int r = 0; r < ROUNDS; r++) {
			uint64_t seed = compress_seed(3, 4, (uint64_t)r, -1);

			fill(g, N, (unsigned)(100 + r));
			for (int i = 0; i < N; i++) {
				want[i] += g[i];
				/* |g + e| and the new |e| bound each op's rounding. */
				bound[i] += (fabs(g[i]) + 2 * fabs(st.residual[i])) * 0x1p-24;
			}
			assert_int_equal(compress_state_encode(&st, g, wire, seed), bytes);
			assert_int_equal(c->decode(&spec, wire, bytes, sent, N, seed), 0);
			for (int i = 0; i < N; i++) {
				got[i] += sent[i];
				bound[i] += 2 * fabs(st.residual[i]) * 0x1p-24;
			}
		}
		for (int i = 0; i < N; i++) {
			double err = fabs(got[i] + st.residual[i] - want[i]);
			if (err > bound[i] + 1e-12)
				fail_msg("%s: element %d: sent + residual is off the inputs' sum by %g, "
					 "more than the rounding bound %g", *t, i, err, bound[i]);
		}
		compress_state_free(&st);
		free(wire);
	}
}

/* Nesterov momentum: what is encoded is g + mu (mu m + g), m kept. */
static void test_momentum(void **state)
{
	(void)state;
	enum { N = 300 };
	struct compress_spec spec = spec_of("fp16,momentum=nesterov,mu=0.5");
	struct compress_state st;
	float g[N], m[N] = { 0 }, out[N];
	uint8_t wire[2 * N];

	assert_int_equal(compress_state_init(&st, &spec, N, true), 0);
	for (int r = 0; r < 5; r++) {
		fill(g, N, (unsigned)r);
		compress_state_encode(&st, g, wire, 0);
		assert_int_equal(compress_codec_of(COMPRESS_FP16)->decode(&spec, wire, sizeof(wire), out,
									   N, 0), 0);
		for (int i = 0; i < N; i++) {
			m[i] = 0.5f * m[i] + g[i];
			float y = g[i] + 0.5f * m[i];
			assert_true(out[i] == reducer_f16_to_f32(reducer_f32_to_f16(y)));
		}
	}
	compress_state_free(&st);
	/* A server keeps no momentum: it encodes the sum as it is. */
	assert_int_equal(compress_state_init(&st, &spec, N, false), 0);
	assert_false(st.momentum_on);
	fill(g, N, 9);
	compress_state_encode(&st, g, wire, 0);
	compress_codec_of(COMPRESS_FP16)->decode(&spec, wire, sizeof(wire), out, N, 0);
	for (int i = 0; i < N; i++)
		assert_true(out[i] == reducer_f16_to_f32(reducer_f32_to_f16(g[i])));
	compress_state_free(&st);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_spec_parse),
		cmocka_unit_test(test_spec_refused),
		cmocka_unit_test(test_casts),
		cmocka_unit_test(test_onebit),
		cmocka_unit_test(test_topk),
		cmocka_unit_test(test_randomk),
		cmocka_unit_test(test_dithering),
		cmocka_unit_test(test_paths_agree),
		cmocka_unit_test(test_error_feedback),
		cmocka_unit_test(test_momentum),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
