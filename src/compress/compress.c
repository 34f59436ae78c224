/*
 * compress.c - compression specs, the codec table, and what the codecs
 * share: k, seeds, random-k's indices (compress.h).
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compress/compress.h"
#include "compress/codecs.h"

static const char *const kind_names[COMPRESS_KIND_COUNT] = {
	[COMPRESS_NONE] = "none",	[COMPRESS_FP16] = "fp16",	[COMPRESS_BF16] = "bf16",
	[COMPRESS_ONEBIT] = "onebit",	[COMPRESS_TOPK] = "topk",	[COMPRESS_RANDOMK] = "randomk",
	[COMPRESS_DITHERING] = "dithering",
};

const char *compress_kind_name(compress_kind kind)
{
	return kind >= 0 && kind < COMPRESS_KIND_COUNT ? kind_names[kind] : "?";
}

const struct compress_codec *compress_codec_of(compress_kind kind)
{
	switch (kind) {
	case COMPRESS_FP16: return &compress_fp16;
	case COMPRESS_BF16: return &compress_bf16;
	case COMPRESS_ONEBIT: return &compress_onebit;
	case COMPRESS_TOPK: return &compress_topk;
	case COMPRESS_RANDOMK: return &compress_randomk;
	case COMPRESS_DITHERING: return &compress_dithering;
	default: return NULL;
	}
}

/* Atomic: encoders on several threads (servers' engines) ask at once. */
static atomic_bool force_scalar;

void compress_force_scalar(bool scalar)
{
	atomic_store(&force_scalar, scalar);
}

bool compress_use_avx2(void)
{
#if defined(__x86_64__)
	static atomic_int known = -1;

	if (atomic_load(&known) < 0) {
		__builtin_cpu_init();
		atomic_store(&known, __builtin_cpu_supports("avx2") != 0);
	}
	return atomic_load(&known) && !atomic_load(&force_scalar);
#else
	return false;
#endif
}

static void spec_default(struct compress_spec *s)
{
	memset(s, 0, sizeof(*s));
	s->scaling = true;
	s->k = 0.01;
	s->s = 7;
	s->mu = 0.9;
}

static int fail(char *err, size_t errlen, const char *text, const char *fmt, ...)
{
	va_list ap;
	int n = snprintf(err, errlen, "compression spec '%s': ", text);

	if (n >= 0 && (size_t)n < errlen) {
		va_start(ap, fmt);
		vsnprintf(err + n, errlen - (size_t)n, fmt, ap);
		va_end(ap);
	}
	return -1;
}

/* Parses a number of `value` in [lo, hi] into *out. */
static bool number(const char *value, double lo, double hi, double *out)
{
	char *end;

	errno = 0;
	*out = strtod(value, &end);
	return !errno && end != value && *end == '\0' && *out >= lo && *out <= hi;
}

static bool boolean(const char *value, bool *out)
{
	static const char *const yes[] = { "1", "true", "yes", "on", NULL };
	static const char *const no[] = { "0", "false", "no", "off", NULL };

	for (const char *const *y = yes; *y; y++)
		if (strcmp(value, *y) == 0)
			return (*out = true);
	for (const char *const *n = no; *n; n++)
		if (strcmp(value, *n) == 0)
			return !(*out = false);
	return false;
}

/* Which keys each compressor takes (beyond ef, momentum, mu). */
static bool key_applies(compress_kind kind, const char *key)
{
	if (strcmp(key, "scaling") == 0)
		return kind == COMPRESS_ONEBIT;
	if (strcmp(key, "k") == 0)
		return kind == COMPRESS_TOPK || kind == COMPRESS_RANDOMK;
	if (strcmp(key, "seed") == 0)
		return kind == COMPRESS_RANDOMK || kind == COMPRESS_DITHERING;
	if (strcmp(key, "s") == 0 || strcmp(key, "normalize") == 0 || strcmp(key, "partition") == 0)
		return kind == COMPRESS_DITHERING;
	return true;
}

static int kind_of(const char *name, compress_kind *kind)
{
	for (int k = COMPRESS_FP16; k < COMPRESS_KIND_COUNT; k++) {
		if (strcmp(name, kind_names[k]) == 0) {
			*kind = (compress_kind)k;
			return 0;
		}
	}
	return -1;
}

/* Takes key=value (a key that applies to s->kind, with a value) into *s;
 * *have_mu: mu (momentum_mu) was given.  0, or the error of fail() for
 * spec `text`. */
static int spec_take(struct compress_spec *s, const char *text, const char *key,
		     const char *value, bool *have_mu, char *err, size_t errlen)
{
	double v;

	if (strcmp(key, "scaling") == 0) {
		if (!boolean(value, &s->scaling))
			return fail(err, errlen, text, "scaling=%s: give 1 or 0", value);
	} else if (strcmp(key, "k") == 0) {
		if (!number(value, 1e-9, 4294967295.0, &v) || (v >= 1 && v != floor(v)))
			return fail(err, errlen, text, "k=%s: give a count of elements (1 or "
				    "more) or a fraction in (0, 1)", value);
		s->k = v;
	} else if (strcmp(key, "s") == 0) {
		if (!number(value, 1, 127, &v) || v != floor(v))
			return fail(err, errlen, text, "s=%s: give a number of levels from 1 to "
				    "127", value);
		s->s = (int)v;
	} else if (strcmp(key, "normalize") == 0) {
		if (strcmp(value, "max") != 0 && strcmp(value, "l2") != 0)
			return fail(err, errlen, text, "normalize=%s: give max or l2", value);
		s->l2 = strcmp(value, "l2") == 0;
	} else if (strcmp(key, "partition") == 0) {
		if (strcmp(value, "linear") != 0 && strcmp(value, "natural") != 0)
			return fail(err, errlen, text, "partition=%s: give linear or natural",
				    value);
		s->natural = strcmp(value, "natural") == 0;
	} else if (strcmp(key, "seed") == 0) {
		char *end;

		errno = 0;
		s->seed = strtoull(value, &end, 0);
		if (errno || *end || value[0] == '-')
			return fail(err, errlen, text, "seed=%s: give a number from 0 to 2^64-1",
				    value);
	} else if (strcmp(key, "ef") == 0) {
		if (strcmp(value, "none") == 0)
			s->ef = COMPRESS_EF_NONE;
		else if (strcmp(value, "vanilla") == 0)
			s->ef = COMPRESS_EF_VANILLA;
		else if (strcmp(value, "sparse") == 0 && s->kind == COMPRESS_RANDOMK)
			s->ef = COMPRESS_EF_SPARSE;
		else
			return fail(err, errlen, text, "ef=%s: give none or vanilla (or sparse, "
				    "for randomk)", value);
	} else if (strcmp(key, "momentum") == 0) {
		if (strcmp(value, "none") != 0 && strcmp(value, "nesterov") != 0)
			return fail(err, errlen, text, "momentum=%s: give none or nesterov",
				    value);
		s->nesterov = strcmp(value, "nesterov") == 0;
	} else if (strcmp(key, "mu") == 0 || strcmp(key, "momentum_mu") == 0) {
		if (!number(value, 0, 1, &v) || v >= 1)
			return fail(err, errlen, text, "%s=%s: give a number in [0, 1)", key,
				    value);
		s->mu = v;
		*have_mu = true;
	} else {
		return fail(err, errlen, text, "unknown key '%s' (keys: compressor, scaling, "
			    "k, s, normalize, partition, seed, ef, momentum, mu)", key);
	}
	return 0;
}

int compress_spec_parse(const char *text, struct compress_spec *out, char *err, size_t errlen)
{
	char buf[512];
	struct compress_spec s;
	bool have_kind = false, have_mu = false;

	spec_default(&s);
	if (strlen(text) >= sizeof(buf))
		return fail(err, errlen, "...", "longer than %zu characters", sizeof(buf) - 1);
	snprintf(buf, sizeof(buf), "%s", text);
	for (char *save, *item = strtok_r(buf, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
		char *eq = strchr(item, '=');
		const char *key = item, *value = eq ? eq + 1 : NULL;

		if (eq)
			*eq = '\0';
		if (!have_kind) {
			/* The compressor: "onebit" or "compressor=onebit". */
			const char *name = value && strcmp(key, "compressor") == 0 ? value : key;

			if ((value && strcmp(key, "compressor") != 0) || kind_of(name, &s.kind) < 0)
				return fail(err, errlen, text, "it starts with the compressor, one of fp16, "
					    "bf16, onebit, topk, randomk, dithering; got '%s'", name);
			have_kind = true;
			continue;
		}
		if (!value || !*value)
			return fail(err, errlen, text, "key '%s' needs a value (%s=...)", key, key);
		if (!key_applies(s.kind, key))
			return fail(err, errlen, text, "key '%s' does not apply to %s", key,
				    kind_names[s.kind]);
		int rc = spec_take(&s, text, key, value, &have_mu, err, errlen);
		if (rc != 0)
			return rc;
	}
	if (!have_kind)
		return fail(err, errlen, text, "no compressor named");
	if (have_mu && !s.nesterov)
		return fail(err, errlen, text, "mu goes with momentum=nesterov");
	*out = s;
	if (errlen)
		err[0] = '\0';
	return 0;
}

/* The shortest text of v that reads back as v ("0.05", not
 * "0.050000000000000003"). */
static const char *shortest(double v, char *buf, size_t len)
{
	for (int digits = 1; digits <= 17; digits++) {
		snprintf(buf, len, "%.*g", digits, v);
		if (strtod(buf, NULL) == v)
			break;
	}
	return buf;
}

size_t compress_spec_format(const struct compress_spec *s, char *buf, size_t len)
{
	struct compress_spec d;
	size_t n = 0;
	char num[32];

#define ADD(...) do { \
		int w_ = snprintf(buf + n, n < len ? len - n : 0, __VA_ARGS__); \
		n += w_ > 0 ? (size_t)w_ : 0; \
	} while (0)
	spec_default(&d);
	ADD("%s", compress_kind_name(s->kind));
	if (s->kind == COMPRESS_ONEBIT && s->scaling != d.scaling)
		ADD(",scaling=%d", s->scaling);
	if ((s->kind == COMPRESS_TOPK || s->kind == COMPRESS_RANDOMK) && s->k != d.k)
		ADD(",k=%s", shortest(s->k, num, sizeof(num)));
	if (s->kind == COMPRESS_DITHERING) {
		if (s->s != d.s)
			ADD(",s=%d", s->s);
		if (s->l2)
			ADD(",normalize=l2");
		if (s->natural)
			ADD(",partition=natural");
	}
	if ((s->kind == COMPRESS_RANDOMK || s->kind == COMPRESS_DITHERING) && s->seed != 0)
		ADD(",seed=%llu", (unsigned long long)s->seed);
	if (s->ef == COMPRESS_EF_VANILLA)
		ADD(",ef=vanilla");
	else if (s->ef == COMPRESS_EF_SPARSE)
		ADD(",ef=sparse");
	if (s->nesterov) {
		ADD(",momentum=nesterov");
		if (s->mu != d.mu)
			ADD(",mu=%s", shortest(s->mu, num, sizeof(num)));
	}
#undef ADD
	return n;
}

size_t compress_k(const struct compress_spec *s, size_t n)
{
	double k = s->k >= 1 ? s->k : ceil(s->k * (double)n);

	if (n == 0)
		return 0;
	return k < 1 ? 1 : k > (double)n ? n : (size_t)k;
}

void compress_print(FILE *out)
{
	static const char *const lines[] = {
		"onebit      sign bits and one scale per partition (1/32 of the bytes);",
		"            scaling=1 (scale = mean |x|; 0: 1.0)",
		"topk        the k largest |x| as (index, value); k=COUNT or a fraction < 1",
		"randomk     k values at indices drawn from a seed every rank shares;",
		"            k as for topk, seed=N (default 0)",
		"dithering   stochastic rounding to s levels, unbiased; s=1..127 (default 7),",
		"            normalize=max|l2, partition=linear|natural",
		"fp16, bf16  a cast of each element, rounded to nearest even",
		"every one   ef=vanilla|sparse (error feedback; sparse for randomk),",
		"            momentum=nesterov with mu=0.9 (momentum_mu), on the worker",
	};
	fprintf(out, "Compressors (unisum_declare_ex, DistributedOptimizer's compression_params; "
		"tensors below UNISUM_MIN_COMPRESS_BYTES go uncompressed), codecs on the %s path:\n",
		compress_use_avx2() ? "AVX2" : "scalar");
	for (size_t i = 0; i < sizeof lines / sizeof *lines; i++)
		fprintf(out, "  %s\n", lines[i]);
}

uint64_t compress_draw_seed(const struct compress_spec *s, uint64_t key, uint32_t round, int rank)
{
	return compress_seed(s->seed, key, round, s->kind == COMPRESS_RANDOMK ? -1 : rank);
}

uint64_t compress_seed(uint64_t job_seed, uint64_t key, uint64_t round, int rank)
{
	uint64_t x = compress_mix64(job_seed ^ compress_mix64(key));

	x = compress_mix64(x ^ compress_mix64(round + 0x51ed27u));
	return rank < 0 ? x : compress_mix64(x ^ (uint64_t)(rank + 1) * 0xd1b54a32d192ed03ull);
}
