/*
 * compress.h - gradient compressors, BytePS's two-level scheme (issue 19):
 * a worker encodes a partition of float32 gradients, the server decodes
 * every worker's push, sums in float32 and encodes the sum once, and every
 * worker decodes the same bytes.
 *
 * A compression spec is text, as a user writes it and as DECLARE carries
 * it:
 *
 *   "onebit,scaling=1,ef=vanilla,momentum=nesterov,mu=0.9"
 *   "topk,k=0.01"       k: a count (>= 1) or a fraction of the elements
 *   "randomk,k=1000,seed=7"
 *   "dithering,s=8,normalize=max,partition=linear"
 *   "fp16", "bf16"
 *
 * The first word names the compressor (or `compressor=NAME`, BytePS's
 * key); the keys are BytePS's (`partition` picks linear or natural
 * levels; `momentum_mu` is an alias of `mu`).  compress_spec_parse()
 * names the key at fault.
 *
 * Every codec works on one partition of n float32 elements, in place of
 * the partition's bytes, and keeps no state: error feedback and momentum
 * live around it (the worker's and the server's buffers).  `seed` is what
 * a stochastic codec draws from: the caller derives it from the key and
 * round (and, where the draw may differ per worker, the rank), so that
 * random-k's indices agree everywhere without a message.
 *
 * Bit layouts, little-endian, sizes in bytes:
 *
 *   fp16, bf16   n x 2: each element rounded to nearest-even (NaN stays
 *                NaN), as the reducer rounds.
 *   onebit       4: the scale (float32: mean |x| with scaling, else 1.0);
 *                then ceil(n / 32) x 4: uint32 words, bit j of word w the
 *                sign bit of element 32w + j (1: negative, -0.0 included).
 *                Decoded: -scale or +scale.  Unused high bits are 0.  The
 *                mean is summed in one order on every path: per whole
 *                word w, float lane j (< 8) adds (|x[32w+j]| + |x[32w+8+j]|)
 *                + (|x[32w+16+j]| + |x[32w+24+j]|); every 1024 words the
 *                lanes are added to a double in lane order and cleared;
 *                the tail word's elements are added in order (float) and
 *                then to the double; scale = (float)(double / n).
 *   topk         4: k (uint32); then k x 8: (uint32 index, float32 value)
 *                in increasing index order, the k largest |x| (ties to the
 *                lower index).  Decoded: the values at their indices, 0
 *                elsewhere.
 *   randomk      k x 4: float32 values of the k indices drawn from the
 *                seed (compress_randomk_indices: one index uniformly in
 *                each of k equal strata of [0, n), so distinct and
 *                increasing, each element drawn with probability ~k/n).
 *                Decoded as top-k.
 *   dithering    4: the norm (float32: max |x|, or the l2 norm; NaN when
 *                an element is not finite: every element then decodes as
 *                NaN); then the elements packed LSB-first in b-bit fields,
 *                b = 2 (s = 1), 4 (s <= 7) or 8 (s <= 127): the level in the
 *                low b - 1 bits, the sign in the top one (0 at level 0).
 *                Linear levels are l/s of the norm, natural ones 2^(l - s)
 *                (and 0 for l = 0); each |x|/norm is rounded stochastically
 *                to one of the two levels around it, so the mean is exact.
 *                The draws, the same on every path: 32 streams x of a
 *                32-bit LCG (x = 1664525 x + 1013904223), stream j seeded
 *                (uint32)compress_mix64(seed + j) | 1; element i takes the
 *                next draw r of stream i % 32, and
 *                u = (r >> 8) 2^-24.  Linear: level = min(s, (int)(|x| *
 *                (s / norm) + u)) in float32.  The l2 norm sums squares in
 *                8 float lanes (element i in lane i % 8), added to a double
 *                in lane order every 8192 elements and at the end.
 */
#ifndef UNISUM_COMPRESS_H
#define UNISUM_COMPRESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef enum compress_kind {
	COMPRESS_NONE = 0,
	COMPRESS_FP16,
	COMPRESS_BF16,
	COMPRESS_ONEBIT,
	COMPRESS_TOPK,
	COMPRESS_RANDOMK,
	COMPRESS_DITHERING,
	COMPRESS_KIND_COUNT
} compress_kind;

typedef enum compress_ef {
	COMPRESS_EF_NONE = 0,
	COMPRESS_EF_VANILLA,	/* residual = input - decode(encode(input)) */
	COMPRESS_EF_SPARSE,	/* random-k: only the sent indices' residual clears */
} compress_ef;

/* Most characters of a spec's canonical text (compress_spec_format). */
#define COMPRESS_SPEC_MAX 160

struct compress_spec {
	compress_kind kind;
	bool scaling;		/* onebit: scale by mean |x| (default on) */
	double k;		/* topk, randomk: count if >= 1, else fraction (0, 1) */
	int s;			/* dithering: levels (1 .. 127, default 7: 4 bits) */
	bool l2;		/* dithering: l2 norm (default: max) */
	bool natural;		/* dithering: natural levels (default: linear) */
	uint64_t seed;		/* randomk, dithering: the job's seed (default 0) */
	compress_ef ef;
	bool nesterov;		/* momentum=nesterov on the worker */
	double mu;		/* its coefficient (default 0.9) */
};

/* Parses `text` into *out.  0, or -1 with the reason in err (naming the key
 * or value at fault). */
int compress_spec_parse(const char *text, struct compress_spec *out, char *err, size_t errlen);

/* The canonical text of *s (every key that differs from its default), for
 * DECLARE and logs; parses back to the same spec.  Returns its length. */
size_t compress_spec_format(const struct compress_spec *s, char *buf, size_t len);

/* Lists the compressors, their keys and defaults, and the SIMD path the
 * codecs take here (`unisum info`). */
void compress_print(FILE *out);

/* The name of a compressor ("onebit", ...; "none"). */
const char *compress_kind_name(compress_kind kind);

/* k of a top-k or random-k spec for a partition of n elements: at least 1,
 * at most n. */
size_t compress_k(const struct compress_spec *s, size_t n);

/* One codec. */
struct compress_codec {
	const char *name;
	/* The bytes encode() writes for n elements (every codec here writes
	 * exactly this many: a length that differs is malformed). */
	size_t (*bytes)(const struct compress_spec *s, size_t n);
	/* Encodes in[0 .. n) into out (bytes(s, n) bytes). */
	void (*encode)(const struct compress_spec *s, const float *in, size_t n, void *out,
		       uint64_t seed);
	/* Decodes `len` bytes into out[0 .. n), every element written.  0, or
	 * -1 when they are not an encoding of n elements (a wrong length, an
	 * index out of range or out of order, a level above s, bits set past
	 * the end); a scale or norm that is NaN gives NaN, as the same input
	 * would uncompressed. */
	int (*decode)(const struct compress_spec *s, const void *in, size_t len, float *out,
		      size_t n, uint64_t seed);
};

/* The codec of `kind`, NULL for COMPRESS_NONE. */
const struct compress_codec *compress_codec_of(compress_kind kind);

/* Random-k's indices for a partition of n elements and `seed`: k distinct
 * indices in increasing order into idx, one drawn uniformly in each of k
 * strata (stratum j: [j n / k, (j + 1) n / k)). */
void compress_randomk_indices(size_t n, size_t k, uint64_t seed, uint32_t *idx);

/* Runs the scalar paths only (true) or the best the CPU has (false), for
 * tests and benchmarks: every path encodes to the same bytes. */
void compress_force_scalar(bool scalar);

/* The seed of a key's partition in a round (and a rank, or -1 when every
 * rank must draw the same). */
uint64_t compress_seed(uint64_t job_seed, uint64_t key, uint64_t round, int rank);

/* The seed a codec of spec s draws from for partition `key` in wire round
 * `round`, encoding on rank `rank` (-1: a server, and every decode):
 * random-k's is the same everywhere (its indices must agree); the others
 * are the rank's own. */
uint64_t compress_draw_seed(const struct compress_spec *s, uint64_t key, uint32_t round, int rank);

/* The state around a codec for one partition on one side (state.c):
 * momentum on a worker, error feedback on workers and servers. */
struct compress_state {
	struct compress_spec spec;
	size_t n;		/* the partition's elements */
	bool momentum_on;	/* a worker's Nesterov momentum */
	float *residual;	/* error feedback's e, or NULL */
	float *momentum;	/* momentum's m, or NULL */
	float *scratch;		/* n floats of working space, or NULL */
};

/* Sets up *st for a partition of n elements on a worker (momentum applies)
 * or a server.  0, or UNISUM_ENOMEM with nothing held. */
int compress_state_init(struct compress_state *st, const struct compress_spec *spec, size_t n,
			bool worker);

/* Frees what *st holds. */
void compress_state_free(struct compress_state *st);

/* Encodes the partition's input g (st->n floats, not changed) into out
 * after momentum and error feedback, updating them; returns the bytes
 * written (the codec's bytes(n)). */
size_t compress_state_encode(struct compress_state *st, const float *g, void *out, uint64_t seed);

/* Zeroes e at random-k's indices for n, k and seed (sparse EF). */
void compress_randomk_clear(size_t n, size_t k, uint64_t seed, float *e);

/* ---- shared by the codecs (compress_int.h material) ---- */

/* splitmix64: a good 64-bit mix, the seed expander. */
static inline uint64_t compress_mix64(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

#endif /* UNISUM_COMPRESS_H */
