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

int auth_connector_answer(const uint8_t *challenge, uint8_t *answer, const char *peer, char *why,
			  size_t len)
{
	if (memcmp(challenge, AUTH_MAGIC, 4) != 0) {
		snprintf(why, len, "%s sent no authentication challenge: is UNISUM_SECRET set on every "
			 "node of the job (and only there)?", peer);
		return UNISUM_EAUTH;
	}
	auth_nonce(answer);
	auth_tag("connector", challenge + 4, answer, answer + AUTH_NONCE_BYTES);
	return 0;
}

int auth_connector_check(const uint8_t *challenge, const uint8_t *answer, const uint8_t *tag,
			 const char *peer, char *why, size_t len)
{
	if (!auth_tag_is_valid("acceptor", answer, challenge + 4, tag)) {
		snprintf(why, len, "%s does not know the job secret (UNISUM_SECRET differs)", peer);
		return UNISUM_EAUTH;
	}
	return 0;
}

void auth_connector_hung_up(const char *peer, char *why, size_t len)
{
	snprintf(why, len, "%s hung up during the handshake: it holds another UNISUM_SECRET", peer);
}

int auth_handshake_connector(const struct auth_io *io, const char *peer, char *why, size_t len)
{
	uint8_t challenge[4 + AUTH_NONCE_BYTES], answer[AUTH_NONCE_BYTES + AUTH_TAG_BYTES],
		tag[AUTH_TAG_BYTES];
	if (io->read_full(io->ctx, challenge, sizeof challenge) != 0)
		memset(challenge, 0, sizeof challenge);	/* no challenge: named below */
	int rc = auth_connector_answer(challenge, answer, peer, why, len);
	if (rc != 0)
		return rc;
	if (io->write_full(io->ctx, answer, sizeof answer) != 0 ||
	    io->read_full(io->ctx, tag, sizeof tag) != 0) {
		auth_connector_hung_up(peer, why, len);
		return UNISUM_EAUTH;
	}
	return auth_connector_check(challenge, answer, tag, peer, why, len);
}

int auth_handshake_acceptor(const struct auth_io *io, char *why, size_t len)
{
	uint8_t challenge[4 + AUTH_NONCE_BYTES], answer[AUTH_NONCE_BYTES + AUTH_TAG_BYTES],
		tag[AUTH_TAG_BYTES];
	memcpy(challenge, AUTH_MAGIC, 4);
	uint8_t *nonce_a = challenge + 4;
	auth_nonce(nonce_a);
	if (io->write_full(io->ctx, challenge, sizeof challenge) != 0 ||
	    io->read_full(io->ctx, answer, sizeof answer) != 0) {
		snprintf(why, len, "no answer to the authentication challenge");
		return UNISUM_EAUTH;
	}
	const uint8_t *nonce_c = answer;
	if (!auth_tag_is_valid("connector", nonce_a, nonce_c, answer + AUTH_NONCE_BYTES)) {
		snprintf(why, len, "wrong or missing job secret (or a replayed handshake)");
		return UNISUM_EAUTH;
	}
	auth_tag("acceptor", nonce_c, nonce_a, tag);
	if (io->write_full(io->ctx, tag, sizeof tag) != 0) {
		snprintf(why, len, "hung up during the handshake");
		return UNISUM_EAUTH;
	}
	return 0;
}
