/*
 * fuzz_auth.c - libFuzzer target for the connection handshake
 * (src/transport/auth.c, protocol in auth.h).
 *
 * The side under test (auth_step, the one implementation that both the
 * blocking and the non-blocking transports drive) talks to a peer played
 * by this harness through the auth_io callbacks, so no socket is needed
 * and every byte the peer sends comes from the fuzzer.  Input layout:
 *
 *   byte 0      mode: bit 0 the side under test (0 acceptor, 1 connector);
 *               bit 1 the peer is honest (computes its messages with its
 *               own secret, then the fuzzer's mask is XORed over them)
 *               rather than raw (the fuzzer's bytes are sent as they are);
 *               bit 2 (honest acceptor test) replay: after a first honest
 *               handshake, the captured answer is sent again to a second
 *               acceptor; bit 3 the peer holds another secret; bit 4
 *               trickle: the side under test gets and gives at most 7
 *               bytes a call, then AUTH_AGAIN, and is called again (the
 *               non-blocking path the event loop takes).
 *   byte 1      the size of the caller's reason buffer, 1..256
 *   byte 2      n, the length of the secret (1..32); then n secret bytes
 *   byte 3+n    t, how many bytes the peer sends before hanging up
 *               (255: all it wants to)
 *   the rest    raw mode: the peer's bytes; honest mode: the peer's nonce
 *               (32 bytes, zero-padded) then the XOR mask over everything
 *               the peer sends (zero-padded: no corruption)
 *
 * What must hold, and abort()s here when it does not:
 *
 * - The side under test writes exactly the messages of auth.h, in order:
 *   an acceptor "USAU" + nonce (36 bytes), then its 32-byte tag; a
 *   connector its nonce + tag (64 bytes).  The tags it sends are HMACs
 *   that this harness recomputes independently (libsodium called here,
 *   the key the BLAKE2b hash of the secret) over the nonces it saw.
 * - It never reads more than AUTH_MAX_READ bytes in all.
 * - It succeeds exactly when the peer is honest, holds the same secret,
 *   flipped no bit of what was read and did not hang up early.  A raw
 *   peer never succeeds: it cannot know the fresh nonce it would have to
 *   sign.  A replayed answer never succeeds.
 * - A failure returns UNISUM_EAUTH with a non-empty, terminated reason
 *   that fits the caller's buffer, however small (heap-allocated at its
 *   exact size, so AddressSanitizer sees one byte written past it).
 *
 * Build and run with tests/fuzz/run.sh.
 */
#include <sodium.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "transport/auth.h"
#include "unisum.h"

#include "fuzz_check.h"

/* The peer: what it will send, what it has seen. */
struct peer {
	bool honest;
	bool acceptor_under_test;
	uint8_t key[crypto_auth_KEYBYTES]; /* the peer's key */
	uint8_t our_key[crypto_auth_KEYBYTES]; /* the key of the side under test */
	uint8_t nonce[AUTH_NONCE_BYTES];   /* the peer's own nonce (honest mode) */
	const uint8_t *raw;		   /* raw bytes, or the XOR mask */
	size_t raw_len;
	size_t limit;			   /* bytes it sends before hanging up */
	size_t sent;			   /* bytes sent so far */
	bool flipped;			   /* a mask bit landed on a byte that was read */
	bool truncated;			   /* a read came up short */
	/* What the side under test wrote. */
	uint8_t written[128];
	size_t written_len;
	int writes;
	/* A replayed answer, when set, is sent as it is. */
	const uint8_t *replay;
	bool trickle;			   /* at most TRICKLE bytes a call */
	uint8_t msg[128];		   /* the message being read, whole */
};

static void tag_of(const uint8_t key[crypto_auth_KEYBYTES], const char *label,
		   const uint8_t *first, const uint8_t *second, uint8_t out[AUTH_TAG_BYTES])
{
	uint8_t msg[16 + 2 * AUTH_NONCE_BYTES];
	size_t n = strlen(label);
	memcpy(msg, label, n);
	memcpy(msg + n, first, AUTH_NONCE_BYTES);
	memcpy(msg + n + AUTH_NONCE_BYTES, second, AUTH_NONCE_BYTES);
	crypto_auth(out, msg, n + 2 * AUTH_NONCE_BYTES, key);
}

/* The next `len` bytes an honest peer sends, before the mask. */
static void honest_bytes(struct peer *p, uint8_t *out, size_t len)
{
	uint8_t msg[128];
	size_t msg_len = 0;
	if (p->acceptor_under_test) {
		/* Answer the challenge: nonce_c, HMAC("connector" | nonce_a | nonce_c). */
		CHECK(p->written_len >= 4 + AUTH_NONCE_BYTES);
		const uint8_t *nonce_a = p->written + 4;
		memcpy(msg, p->nonce, AUTH_NONCE_BYTES);
		tag_of(p->key, "connector", nonce_a, p->nonce, msg + AUTH_NONCE_BYTES);
		msg_len = AUTH_NONCE_BYTES + AUTH_TAG_BYTES;
	} else if (p->written_len == 0) {
		/* The challenge. */
		memcpy(msg, AUTH_MAGIC, 4);
		memcpy(msg + 4, p->nonce, AUTH_NONCE_BYTES);
		msg_len = 4 + AUTH_NONCE_BYTES;
	} else {
		/* The acceptor's tag: HMAC("acceptor" | nonce_c | nonce_a). */
		tag_of(p->key, "acceptor", p->written, p->nonce, msg);
		msg_len = AUTH_TAG_BYTES;
	}
	CHECK(len == msg_len);
	memcpy(out, msg, len);
}

#define TRICKLE 7

static int peer_read_all(void *ctx, void *dst, size_t len)
{
	struct peer *p = ctx;
	uint8_t *out = dst;
	CHECK(p->sent + len <= AUTH_MAX_READ);
	if (p->replay != NULL) {
		memcpy(out, p->replay, len);
	} else if (p->honest) {
		honest_bytes(p, out, len);
		for (size_t i = 0; i < len; i++) {
			size_t at = p->sent + i;
			uint8_t m = at < p->raw_len ? p->raw[at] : 0;
			if (m != 0 && at < p->limit)
				p->flipped = true;
			out[i] ^= m;
		}
	} else {
		for (size_t i = 0; i < len; i++) {
			size_t at = p->sent + i;
			out[i] = at < p->raw_len ? p->raw[at] : 0;
		}
		if (p->sent + len > p->raw_len)
			p->truncated = true;
	}
	if (p->sent + len > p->limit) {
		p->truncated = true;
		p->sent = p->limit;
		return -1;
	}
	p->sent += len;
	return 0;
}

static int peer_write_all(void *ctx, const void *src, size_t len)
{
	struct peer *p = ctx;
	const uint8_t *in = src;
	p->writes++;
	if (p->acceptor_under_test) {
		if (p->writes == 1) {
			CHECK(len == 4 + AUTH_NONCE_BYTES);
			CHECK(memcmp(in, AUTH_MAGIC, 4) == 0);
		} else {
			/* Only after an answer that checks out. */
			CHECK(p->writes == 2);
			CHECK(len == AUTH_TAG_BYTES);
			uint8_t want[AUTH_TAG_BYTES];
			const uint8_t *nonce_a = p->written + 4;
			/* The nonce_c the acceptor read is the one the peer sent. */
			uint8_t nonce_c[AUTH_NONCE_BYTES];
			for (size_t i = 0; i < AUTH_NONCE_BYTES; i++) {
				uint8_t m = i < p->raw_len ? p->raw[i] : 0;
				nonce_c[i] = p->replay != NULL ? p->replay[i]
					     : p->honest	  ? p->nonce[i] ^ m
								  : m;
			}
			tag_of(p->our_key, "acceptor", nonce_c, nonce_a, want);
			CHECK(memcmp(in, want, AUTH_TAG_BYTES) == 0);
		}
	} else {
		CHECK(p->writes == 1);
		CHECK(len == AUTH_NONCE_BYTES + AUTH_TAG_BYTES);
		/* The connector signed the challenge it read. */
		uint8_t nonce_a[AUTH_NONCE_BYTES], want[AUTH_TAG_BYTES];
		for (size_t i = 0; i < AUTH_NONCE_BYTES; i++) {
			size_t at = 4 + i;
			uint8_t m = at < p->raw_len ? p->raw[at] : 0;
			nonce_a[i] = p->honest ? p->nonce[i] ^ m : m;
		}
		tag_of(p->our_key, "connector", nonce_a, in, want);
		CHECK(memcmp(in + AUTH_NONCE_BYTES, want, AUTH_TAG_BYTES) == 0);
	}
	CHECK(p->written_len + len <= sizeof p->written);
	memcpy(p->written + p->written_len, in, len);
	p->written_len += len;
	return 0;
}

static void key_of(const uint8_t *secret, size_t n, uint8_t key[crypto_auth_KEYBYTES])
{
	crypto_generichash(key, crypto_auth_KEYBYTES, secret, n, NULL, 0);
}

/* auth_io's read: the whole message is made when its first byte is
 * asked for (peer_read_all), then handed over all at once or, trickling,
 * TRICKLE bytes a call. */
static int peer_read(void *ctx, void *dst, size_t len, size_t *off)
{
	struct peer *p = ctx;
	CHECK(len <= sizeof p->msg && *off < len);
	if (*off == 0 && peer_read_all(p, p->msg, len) != 0)
		return -1;
	size_t n = p->trickle && len - *off > TRICKLE ? TRICKLE : len - *off;
	memcpy((uint8_t *)dst + *off, p->msg + *off, n);
	*off += n;
	return *off == len ? 0 : AUTH_AGAIN;
}

/* auth_io's write: taken all at once or, trickling, TRICKLE bytes a call;
 * checked whole once all of it came (peer_write_all). */
static int peer_write(void *ctx, const void *src, size_t len, size_t *off)
{
	struct peer *p = ctx;
	CHECK(*off < len);
	*off += p->trickle && len - *off > TRICKLE ? TRICKLE : len - *off;
	if (*off < len)
		return AUTH_AGAIN;
	return peer_write_all(p, src, len);
}

/* Runs the side under test against `p`; checks the reason; returns rc. */
static int run_side(struct peer *p, size_t why_size)
{
	char *why = malloc(why_size);
	CHECK(why != NULL);
	memset(why, 'x', why_size);
	struct auth_io io = {p, peer_read, peer_write};
	struct auth_state a = {.connector = !p->acceptor_under_test};
	int rc, calls = 0;
	while ((rc = auth_step(&a, &io, "10.0.0.1:9000", why, why_size)) == AUTH_AGAIN)
		CHECK(p->trickle && ++calls < 64);	/* every call moved a byte */
	CHECK(rc == 0 || rc == UNISUM_EAUTH);
	if (rc != 0) {
		CHECK(memchr(why, '\0', why_size) != NULL);
		CHECK(why_size == 1 || why[0] != '\0');
	}
	free(why);
	return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 4)
		return 0;
	uint8_t mode = data[0];
	size_t why_size = (size_t)data[1] + 1;
	size_t n = (size_t)(data[2] % 32) + 1;
	if (size < 4 + n)
		return 0;
	const uint8_t *secret = data + 3;
	uint8_t t = data[3 + n];
	const uint8_t *rest = data + 4 + n;
	size_t rest_len = size - 4 - n;

	/* The side under test holds `secret` (NUL-free, as an environment
	 * variable would be); the peer holds it too, or it with one more byte. */
	char our_secret[34];
	for (size_t i = 0; i < n; i++)
		our_secret[i] = (char)(secret[i] | 1);
	our_secret[n] = '\0';
	CHECK(auth_set_secret(our_secret) == 0);
	CHECK(auth_is_enabled());

	struct peer p = {0};
	p.acceptor_under_test = (mode & 1) == 0;
	p.honest = (mode & 2) != 0;
	p.trickle = (mode & 16) != 0;
	p.limit = t == 255 ? SIZE_MAX : t;
	key_of((const uint8_t *)our_secret, n, p.our_key);
	if (mode & 8) {
		char other[35];
		memcpy(other, our_secret, n + 1);
		other[n] = '!';
		other[n + 1] = '\0';
		key_of((const uint8_t *)other, n + 1, p.key);
	} else {
		memcpy(p.key, p.our_key, sizeof p.key);
	}
	if (p.honest) {
		size_t take = rest_len < AUTH_NONCE_BYTES ? rest_len : AUTH_NONCE_BYTES;
		memcpy(p.nonce, rest, take);
		p.raw = rest + take;
		p.raw_len = rest_len - take;
	} else {
		p.raw = rest;
		p.raw_len = rest_len;
	}

	int rc = run_side(&p, why_size);
	bool same_secret = (mode & 8) == 0;
	if (!p.honest)
		CHECK(rc != 0);
	else
		CHECK((rc == 0) == (same_secret && !p.flipped && !p.truncated));

	/* Replay: a second acceptor is sent the answer the first one accepted. */
	if (rc == 0 && p.acceptor_under_test && (mode & 4)) {
		uint8_t captured[AUTH_NONCE_BYTES + AUTH_TAG_BYTES];
		memcpy(captured, p.nonce, AUTH_NONCE_BYTES);
		tag_of(p.key, "connector", p.written + 4, p.nonce, captured + AUTH_NONCE_BYTES);
		struct peer q = {0};
		q.acceptor_under_test = true;
		q.limit = SIZE_MAX;
		memcpy(q.our_key, p.our_key, sizeof q.our_key);
		q.replay = captured;
		CHECK(run_side(&q, why_size) == UNISUM_EAUTH);
	}
	return 0;
}
