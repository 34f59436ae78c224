/*
 * state.c - what lives around a codec (compress.h): Nesterov momentum on
 * the worker, and error feedback on the worker and on the server, per
 * partition.
 *
 *   momentum (worker):   m = mu m + g;  g = g + mu m
 *   vanilla EF:          x = g + e;  send encode(x);  e = x - decode(sent)
 *   sparse EF (random-k): e += g;  send encode(e);  e[i] = 0 at the sent
 *                        indices (what random-k sends is e there exactly,
 *                        so this is vanilla EF without the decode pass)
 *
 * The residual e holds what the partition's compressed messages still
 * owe: the sum of everything sent plus e is the sum of every input.
 */
#include <stdlib.h>

#include "compress/codecs.h"
#include "unisum.h"

int compress_state_init(struct compress_state *st, const struct compress_spec *spec, size_t n,
			bool worker)
{
	memset(st, 0, sizeof(*st));
	st->spec = *spec;
	st->n = n;
	st->momentum_on = worker && spec->nesterov;
	if (spec->ef != COMPRESS_EF_NONE)
		st->residual = calloc(n ? n : 1, sizeof(float));
	if (st->momentum_on)
		st->momentum = calloc(n ? n : 1, sizeof(float));
	if (spec->ef == COMPRESS_EF_VANILLA || st->momentum_on)
		st->scratch = calloc(n ? n : 1, sizeof(float));
	if ((spec->ef != COMPRESS_EF_NONE && !st->residual) || (st->momentum_on && !st->momentum) ||
	    ((spec->ef == COMPRESS_EF_VANILLA || st->momentum_on) && !st->scratch)) {
		compress_state_free(st);
		return UNISUM_ENOMEM;
	}
	return 0;
}

void compress_state_free(struct compress_state *st)
{
	free(st->residual);
	free(st->momentum);
	free(st->scratch);
	st->residual = st->momentum = st->scratch = NULL;
}

size_t compress_state_encode(struct compress_state *st, const float *g, void *out, uint64_t seed)
{
	const struct compress_codec *c = compress_codec_of(st->spec.kind);
	const float *x = g;
	size_t n = st->n, bytes = c->bytes(&st->spec, n);
	float mu = (float)st->spec.mu;

	if (st->momentum_on) {
		float *m = st->momentum, *y = st->scratch;

		for (size_t i = 0; i < n; i++) {
			m[i] = mu * m[i] + g[i];
			y[i] = g[i] + mu * m[i];
		}
		x = y;
	}
	switch (st->spec.ef) {
	case COMPRESS_EF_NONE:
		c->encode(&st->spec, x, n, out, seed);
		break;
	case COMPRESS_EF_VANILLA: {
		float *e = st->residual, *y = st->scratch;

		for (size_t i = 0; i < n; i++)
			y[i] = x[i] + e[i];
		c->encode(&st->spec, y, n, out, seed);
		/* e = y - decode(out): decode into e, then subtract. */
		c->decode(&st->spec, out, bytes, e, n, seed);
		for (size_t i = 0; i < n; i++)
			e[i] = y[i] - e[i];
		break;
	}
	case COMPRESS_EF_SPARSE: {
		float *e = st->residual;
		size_t k = compress_k(&st->spec, n);

		for (size_t i = 0; i < n; i++)
			e[i] += x[i];
		c->encode(&st->spec, e, n, out, seed);
		compress_randomk_clear(n, k, seed, e);
		break;
	}
	}
	return bytes;
}
