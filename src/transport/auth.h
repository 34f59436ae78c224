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

/* out = keyed BLAKE2b of label and msg: keyed with the secret's key when
 * one is set (a tag only its holders can make), else with zeros (a
 * checksum).  For what is not a handshake: a UCX worker's address, which
 * UCX 1.13 trusts (a malformed one aborts the process). */
void auth_digest(const char *label, const void *msg, size_t len, uint8_t out[AUTH_TAG_BYTES]);
bool auth_digest_is_valid(const char *label, const void *msg, size_t len,
			  const uint8_t tag[AUTH_TAG_BYTES]);

/* Fills `nonce` with fresh random bytes. */
void auth_nonce(uint8_t nonce[AUTH_NONCE_BYTES]);

/* The bytes a handshake moves, whatever carries them (a blocking or a
 * non-blocking socket, the fuzzer's peer): each call moves what it can
 * of bytes [*off, len), advancing *off, and returns 0 once all of them
 * moved, AUTH_AGAIN when it would block (the caller calls auth_step
 * again once it can go on), or another non-zero value when the peer hung
 * up, timed out or failed.  A handshake reads at most AUTH_MAX_READ bytes
 * from the peer, whatever it sends. */
struct auth_io {
	void *ctx;
	int (*read)(void *ctx, void *dst, size_t len, size_t *off);
	int (*write)(void *ctx, const void *src, size_t len, size_t *off);
};

#define AUTH_AGAIN 1
#define AUTH_MAX_READ (4 + AUTH_NONCE_BYTES + AUTH_TAG_BYTES)

/* One side of a handshake in progress, the only implementation of either
 * side: zeroed by the caller, who sets `connector` on the connecting
 * side. */
struct auth_state {
	bool connector;
	int stage;	/* acceptor: 0 challenge out, 1 answer in, 2 tag out, 3 done;
			 * connector: 0 challenge in, 1 answer out, 2 tag in, 3 done */
	size_t off;	/* of the current stage's bytes */
	uint8_t challenge[4 + AUTH_NONCE_BYTES];		/* "USAU", nonce_a */
	uint8_t answer[AUTH_NONCE_BYTES + AUTH_TAG_BYTES];	/* nonce_c, its tag */
	uint8_t tag[AUTH_TAG_BYTES];				/* the acceptor's */
};

/* Moves a's handshake on as far as io allows (the caller has checked that
 * a secret is set).  Returns 0 once both sides proved they hold the
 * secret, AUTH_AGAIN, or UNISUM_EAUTH with the reason in `why` (never
 * empty, always terminated; naming `peer` on the connector's side). */
int auth_step(struct auth_state *a, const struct auth_io *io, const char *peer, char *why,
	      size_t len);

#endif /* UNISUM_AUTH_H */
