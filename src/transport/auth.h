/*
 * auth.h - the job secret and the HMAC tags of the connection handshake.
 *
 * With a secret set (UNISUM_SECRET or UNISUM_SECRET_FILE), every
 * connection starts with a mutual challenge-response before any wire
 * message: the acceptor sends "USAU" and a fresh 32-byte nonce; the
 * connector answers with its own nonce and HMAC(key, "connector" | nonce_a
 * | nonce_c); the acceptor checks it and answers HMAC(key, "acceptor" |
 * nonce_c | nonce_a), which the connector checks.  Both nonces are fresh
 * random bytes, so a captured handshake replayed on another connection
 * fails.  A peer without the secret is dropped before any of its bytes are
 * read as a message.  The crypto is libsodium's (HMAC-SHA-512-256); the key
 * is the BLAKE2b hash of the secret.
 */
#ifndef UNISUM_AUTH_H
#define UNISUM_AUTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define AUTH_MAGIC "USAU"
#define AUTH_NONCE_BYTES 32
#define AUTH_TAG_BYTES 32

/* Sets the job secret (NULL or "" turns authentication off).  Returns 0,
 * or UNISUM_ESYS when libsodium cannot start. */
int auth_set_secret(const char *secret);

/* Whether a secret is set. */
bool auth_is_enabled(void);

/* out = HMAC(key, label | first | second), both AUTH_NONCE_BYTES long. */
void auth_tag(const char *label, const uint8_t *first, const uint8_t *second,
	      uint8_t out[AUTH_TAG_BYTES]);

/* Whether `tag` is HMAC(key, label | first | second), in constant time. */
bool auth_tag_is_valid(const char *label, const uint8_t *first, const uint8_t *second,
		       const uint8_t tag[AUTH_TAG_BYTES]);

/* Fills `nonce` with fresh random bytes. */
void auth_nonce(uint8_t nonce[AUTH_NONCE_BYTES]);

/* The bytes a handshake moves, whatever carries them: read_full() fills
 * exactly `len` bytes and write_full() sends exactly `len`; each returns 0,
 * or non-zero when the peer hung up, timed out or failed.  The handshake
 * reads at most AUTH_MAX_READ bytes from the peer, whatever it sends. */
struct auth_io {
	void *ctx;
	int (*read_full)(void *ctx, void *dst, size_t len);
	int (*write_full)(void *ctx, const void *src, size_t len);
};

#define AUTH_MAX_READ (4 + AUTH_NONCE_BYTES + AUTH_TAG_BYTES)

/* Runs one side of the handshake over `io`.  `peer` names the other end in
 * messages.  Returns 0 when both sides proved they hold the secret, or
 * UNISUM_EAUTH with the reason in `why` (never empty, always terminated). */
int auth_handshake_connector(const struct auth_io *io, const char *peer, char *why, size_t len);
int auth_handshake_acceptor(const struct auth_io *io, char *why, size_t len);

/* The connector's two steps, for a handshake driven without blocking:
 * the answer (AUTH_NONCE_BYTES + AUTH_TAG_BYTES) to a challenge (4 +
 * AUTH_NONCE_BYTES), and the check of the acceptor's tag.  0, or
 * UNISUM_EAUTH with the reason, naming `peer`, in `why`. */
int auth_connector_answer(const uint8_t *challenge, uint8_t *answer, const char *peer, char *why,
			  size_t len);
int auth_connector_check(const uint8_t *challenge, const uint8_t *answer, const uint8_t *tag,
			 const char *peer, char *why, size_t len);
/* Why a connector's peer hung up in the middle. */
void auth_connector_hung_up(const char *peer, char *why, size_t len);

#endif /* UNISUM_AUTH_H */
