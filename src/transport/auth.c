/*
 * auth.c - the job secret and handshake tags (see auth.h), on libsodium.
 */
#include "transport/auth.h"

#include <sodium.h>
#include <stdatomic.h>
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
