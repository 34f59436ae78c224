/*
 * strangers.c - check_sums's strangers: connections that are no worker of
 * the job (no secret, a wrong or replayed handshake, malformed streams),
 * which a server must hang up on, and a free port for tests that start
 * nodes by hand.  See check_sums.c's modes `auth` and `garbage`.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "check_sums/strangers.h"
#include "scenarios.h"
#include "transport/auth.h"
#include "unisum.h"
#include "wire/wire.h"

static int st_rank;	/* the caller's, for messages */

#define FAIL(...)                                                                                  \
	do {                                                                                       \
		fprintf(stderr, "check_sums[rank %d] FAILED: ", st_rank);                          \
		fprintf(stderr, __VA_ARGS__);                                                      \
		fprintf(stderr, "\n");                                                             \
		exit(1);                                                                           \
	} while (0)

/* Sends `len` bytes on a fresh connection (then half-closes it when
 * `half_close`) and checks that the server hangs up (possibly after an
 * ERROR) within 5 s instead of waiting for more. */
static void expect_hangup(int port, const void *data, size_t len, bool half_close, const char *what)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
	if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0)
		FAIL("garbage: cannot connect to the server on port %d", port);
	struct timeval tv = {.tv_sec = 5};
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	if (send(fd, data, len, MSG_NOSIGNAL) != (ssize_t)len)
		FAIL("garbage: send failed");
	if (half_close)
		shutdown(fd, SHUT_WR);
	char sink[4096];
	ssize_t n;
	while ((n = recv(fd, sink, sizeof sink, 0)) > 0)
		;
	if (n < 0)
		FAIL("garbage: the server kept the connection open after %s", what);
	close(fd);
	printf("rank %d: server hung up after %s\n", st_rank, what);
}

static int connect_local(int port)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
	if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0)
		FAIL("auth: cannot connect to port %d", port);
	struct timeval tv = {.tv_sec = 5};
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	return fd;
}

/* Reads exactly n bytes or fails the test. */
static void read_exact(int fd, void *buf, size_t n, const char *what)
{
	for (size_t got = 0; got < n;) {
		ssize_t r = recv(fd, (char *)buf + got, n - got, 0);
		if (r <= 0)
			FAIL("auth: %s: the server hung up early", what);
		got += (size_t)r;
	}
}

/* After `what` was sent on fd, the server must close without a word. */
static void expect_closed(int fd, const char *what)
{
	char c;
	ssize_t r = recv(fd, &c, 1, 0);
	if (r != 0)
		FAIL("auth: the server %s after %s", r > 0 ? "answered" : "kept the connection open", what);
	close(fd);
	printf("rank %d: server hung up after %s\n", st_rank, what);
}

void strangers_auth(int port, int rank)
{
	st_rank = rank;
	uint8_t challenge[4 + AUTH_NONCE_BYTES], answer[AUTH_NONCE_BYTES + AUTH_TAG_BYTES];
	uint8_t tag[AUTH_TAG_BYTES];

	/* 1. No secret: a plain unisum hello instead of an answer. */
	int fd = connect_local(port);
	read_exact(fd, challenge, sizeof challenge, "no secret");
	if (memcmp(challenge, AUTH_MAGIC, 4) != 0)
		FAIL("auth: the server sent no challenge");
	uint8_t hdr[WIRE_HDR_SIZE + 16] = {0};
	struct wire_hdr h = {.type = WIRE_REGISTER, .sender = 1};
	wire_encode(&h, hdr);
	send(fd, hdr, sizeof hdr, MSG_NOSIGNAL);
	expect_closed(fd, "a client without the secret");

	/* 2. A wrong tag: the right shape, made with another key. */
	fd = connect_local(port);
	read_exact(fd, challenge, sizeof challenge, "wrong secret");
	auth_nonce(answer);
	for (size_t i = 0; i < AUTH_TAG_BYTES; i++)
		answer[AUTH_NONCE_BYTES + i] = (uint8_t)scn_gen_bits(UNISUM_INT64, 0, 0, i);
	send(fd, answer, sizeof answer, MSG_NOSIGNAL);
	expect_closed(fd, "a client with a wrong secret");

	/* 3. A replay: a valid answer captured on one connection, sent
	 * again on the next (whose challenge differs). */
	fd = connect_local(port);
	read_exact(fd, challenge, sizeof challenge, "capture");
	auth_nonce(answer);
	auth_tag("connector", challenge + 4, answer, answer + AUTH_NONCE_BYTES);
	send(fd, answer, sizeof answer, MSG_NOSIGNAL);
	read_exact(fd, tag, sizeof tag, "the genuine handshake");
	if (!auth_tag_is_valid("acceptor", answer, challenge + 4, tag))
		FAIL("auth: the server's answer does not prove it knows the secret");
	close(fd);
	fd = connect_local(port);
	read_exact(fd, challenge, sizeof challenge, "replay");
	send(fd, answer, sizeof answer, MSG_NOSIGNAL);
	expect_closed(fd, "a replayed handshake");
}

void strangers_garbage(int port, int rank)
{
	st_rank = rank;
	uint8_t junk[4096];
	for (size_t i = 0; i < sizeof junk; i++)
		junk[i] = (uint8_t)scn_gen_bits(UNISUM_INT64, 0, 0, i);
	expect_hangup(port, junk, sizeof junk, false, "random bytes");

	uint8_t hdr[WIRE_HDR_SIZE];
	struct wire_hdr h = {.type = WIRE_PUSH, .key = 1, .count = 1, .payload_len = 4};
	wire_encode(&h, hdr);
	expect_hangup(port, hdr, sizeof hdr, false, "a PUSH without a hello");

	h = (struct wire_hdr){.type = WIRE_REGISTER, .sender = 999};
	wire_encode(&h, hdr);
	expect_hangup(port, hdr, sizeof hdr, false, "a hello from an unknown node");

	h = (struct wire_hdr){.type = WIRE_ERROR, .payload_len = 1ull << 40};
	wire_encode(&h, hdr);
	expect_hangup(port, hdr, sizeof hdr, false, "a 1 TiB payload length");

	h = (struct wire_hdr){.type = 77};
	wire_encode(&h, hdr);
	expect_hangup(port, hdr, sizeof hdr, false, "an unknown message type");

	h = (struct wire_hdr){.type = WIRE_PUSH};
	wire_encode(&h, hdr);
	expect_hangup(port, hdr, 20, true, "a truncated header and end of stream");
}

/* Whether port `port` (0: any) of 127.0.0.1 can be bound now; the port
 * bound in *got. */
static bool bind_probe(int port, int *got)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
	socklen_t len = sizeof sa;
	bool ok = fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0 &&
		  getsockname(fd, (struct sockaddr *)&sa, &len) == 0;
	*got = ntohs(sa.sin_port);
	if (fd >= 0)
		close(fd);
	return ok;
}

/* Prints a port that is free right now (for tests that start nodes by
 * hand).  Below the kernel's ephemeral range (ip_local_port_range) where
 * it can: a port the kernel picked may go to another test's connection or
 * listener before the node binds it (seen once with make test's two
 * sanitizer trees side by side), while one below the range goes only to
 * whoever names it. */
int strangers_free_port(void)
{
	int low = 32768, got = 0;
	FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
	if (f != NULL) {
		if (fscanf(f, "%d", &low) != 1)
			low = 32768;
		fclose(f);
	}
	struct timespec now;
	clock_gettime(CLOCK_REALTIME, &now);
	unsigned seed = (unsigned)getpid() * 2654435761u ^ (unsigned)now.tv_nsec;
	for (int i = 0; low > 12000 && i < 100; i++) {
		int port = 10000 + (int)(rand_r(&seed) % (unsigned)(low - 10000));
		if (bind_probe(port, &got)) {
			printf("%d\n", got);
			return 0;
		}
	}
	if (!bind_probe(0, &got))
		return 1;
	printf("%d\n", got);
	return 0;
}

