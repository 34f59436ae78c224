/*
 * auth.c - the job secret and handshake tags (see auth.h), on libsodium.
 */
#include "transport/auth.h"

#include <sodium.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "unisum.h"

static uint8_t auth_key[crypto_auth_KEYBYTES];
static atomic_bool auth_enabled;

int auth_set_secret(const char *secret)
{
	if (secret == NULL || secret[0] == '\0') {
		atomic_store(&auth_enabled, false);
		return 0;
	}
	if (sodium_init() < 0)
		return UNISUM_ESYS;
	crypto_generichash(auth_key, sizeof auth_key, (const unsigned char *)secret, strlen(secret),
			   NULL, 0);
	atomic_store(&auth_enabled, true);
	return 0;
}

bool auth_is_enabled(void)
{
	return atomic_load(&auth_enabled);
}

static void auth_message(const char *label, const uint8_t *first, const uint8_t *second,
			 uint8_t *msg, size_t *len)
{
	size_t n = strlen(label);
	memcpy(msg, label, n);
	memcpy(msg + n, first, AUTH_NONCE_BYTES);
	memcpy(msg + n + AUTH_NONCE_BYTES, second, AUTH_NONCE_BYTES);
	*len = n + 2 * AUTH_NONCE_BYTES;
}

void auth_tag(const char *label, const uint8_t *first, const uint8_t *second,
	      uint8_t out[AUTH_TAG_BYTES])
{
	uint8_t msg[64 + 2 * AUTH_NONCE_BYTES];
	size_t len;
	auth_message(label, first, second, msg, &len);
	crypto_auth(out, msg, len, auth_key);
}

bool auth_tag_is_valid(const char *label, const uint8_t *first, const uint8_t *second,
		       const uint8_t tag[AUTH_TAG_BYTES])
{
	uint8_t msg[64 + 2 * AUTH_NONCE_BYTES];
	size_t len;
	auth_message(label, first, second, msg, &len);
	return crypto_auth_verify(tag, msg, len, auth_key) == 0;
}

void auth_nonce(uint8_t nonce[AUTH_NONCE_BYTES])
{
	randombytes_buf(nonce, AUTH_NONCE_BYTES);
}

/* The acceptor's side of auth_step. */
static int auth_acceptor_step(struct auth_state *a, const struct auth_io *io, char *why, size_t len)
{
	int rc = 0;
	if (a->stage == 0 && a->off == 0) {
		memcpy(a->challenge, AUTH_MAGIC, 4);
		auth_nonce(a->challenge + 4);
	}
	if (a->stage == 0 && (rc = io->write(io->ctx, a->challenge, sizeof a->challenge, &a->off)) == 0)
		a->stage = 1, a->off = 0;
	if (a->stage == 1 && (rc = io->read(io->ctx, a->answer, sizeof a->answer, &a->off)) == 0) {
		if (!auth_tag_is_valid("connector", a->challenge + 4, a->answer,
				       a->answer + AUTH_NONCE_BYTES)) {
			snprintf(why, len, "wrong or missing job secret (or a replayed handshake)");
			return UNISUM_EAUTH;
		}
		auth_tag("acceptor", a->answer, a->challenge + 4, a->tag);
		a->stage = 2, a->off = 0;
	}
	if (a->stage == 2 && (rc = io->write(io->ctx, a->tag, sizeof a->tag, &a->off)) == 0)
		a->stage = 3;
	if (rc == AUTH_AGAIN)
		return AUTH_AGAIN;
	if (rc != 0) {
		snprintf(why, len, a->stage <= 1 ? "no answer to the authentication challenge"
						 : "hung up during the handshake");
		return UNISUM_EAUTH;
	}
	return 0;
}

/* The connector's side of auth_step. */
static int auth_connector_step(struct auth_state *a, const struct auth_io *io, const char *peer,
			       char *why, size_t len)
{
	int rc = 0;
	if (a->stage == 0 && (rc = io->read(io->ctx, a->challenge, sizeof a->challenge, &a->off)) == 0) {
		if (memcmp(a->challenge, AUTH_MAGIC, 4) != 0) {
			rc = UNISUM_EAUTH;	/* no challenge: named below */
		} else {
			auth_nonce(a->answer);
			auth_tag("connector", a->challenge + 4, a->answer, a->answer + AUTH_NONCE_BYTES);
			a->stage = 1, a->off = 0;
		}
	}
	if (a->stage == 1 && (rc = io->write(io->ctx, a->answer, sizeof a->answer, &a->off)) == 0)
		a->stage = 2, a->off = 0;
	if (a->stage == 2 && (rc = io->read(io->ctx, a->tag, sizeof a->tag, &a->off)) == 0) {
		if (!auth_tag_is_valid("acceptor", a->answer, a->challenge + 4, a->tag)) {
			snprintf(why, len, "%s does not know the job secret (UNISUM_SECRET differs)", peer);
			return UNISUM_EAUTH;
		}
		a->stage = 3;
	}
	if (rc == AUTH_AGAIN)
		return AUTH_AGAIN;
	if (rc != 0 && a->stage == 0)
		snprintf(why, len, "%s sent no authentication challenge: is UNISUM_SECRET set on every "
			 "node of the job (and only there)?", peer);
	else if (rc != 0)
		snprintf(why, len, "%s hung up during the handshake: it holds another UNISUM_SECRET",
			 peer);
	return rc != 0 ? UNISUM_EAUTH : 0;
}

int auth_step(struct auth_state *a, const struct auth_io *io, const char *peer, char *why,
	      size_t len)
{
	return a->connector ? auth_connector_step(a, io, peer, why, len)
			    : auth_acceptor_step(a, io, why, len);
}

void auth_digest(const char *label, const void *msg, size_t len, uint8_t out[AUTH_TAG_BYTES])
{
	static const uint8_t none[crypto_generichash_KEYBYTES];
	if (sodium_init() < 0) {
		memset(out, 0, AUTH_TAG_BYTES);	/* (then nothing is valid but zeros) */
		return;
	}
	crypto_generichash_state st;
	crypto_generichash_init(&st, auth_is_enabled() ? auth_key : none, sizeof none,
				AUTH_TAG_BYTES);
	crypto_generichash_update(&st, (const unsigned char *)label, strlen(label) + 1);
	crypto_generichash_update(&st, msg, len);
	crypto_generichash_final(&st, out, AUTH_TAG_BYTES);
}

bool auth_digest_is_valid(const char *label, const void *msg, size_t len,
			  const uint8_t tag[AUTH_TAG_BYTES])
{
	uint8_t want[AUTH_TAG_BYTES];
	auth_digest(label, msg, len, want);
	return sodium_memcmp(want, tag, AUTH_TAG_BYTES) == 0;
}
