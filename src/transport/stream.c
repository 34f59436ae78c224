/*
 * stream.c - wire messages over blocking stream sockets, shared by the TCP
 * and the IPC transports (see stream.h).
 *
 * Sends go out with one sendmsg() of header + payload (no copy into a
 * staging buffer).  Receives read the header into a small buffer, then the
 * payload with MSG_WAITALL straight into the destination the caller chose.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "log/log.h"
#include "timing/timing.h"
#include "transport/auth.h"
#include "transport/stream.h"

/* How long a handshake may wait for the peer's next bytes. */
#define STREAM_AUTH_TIMEOUT_S 10

int stream_listen(const char *host, int port, int *fd_out, int *port_out)
{
	struct sockaddr_in sa;
	int rc = stream_resolve(host, port, &sa);
	if (rc != 0)
		return rc;
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return log_fail(UNISUM_ESYS, "socket(): %s", strerror(errno));
	int one = 1;
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
		rc = log_fail(UNISUM_ESYS,
			      "cannot listen on %s:%d: %s (is another job using the port? "
			      "pick another or use 0 for a free one)",
			      host, port, strerror(errno));
	} else if (listen(fd, 1024) != 0) {
		rc = log_fail(UNISUM_ESYS, "listen(): %s", strerror(errno));
	} else {
		socklen_t len = sizeof sa;
		getsockname(fd, (struct sockaddr *)&sa, &len);
		*fd_out = fd;
		*port_out = ntohs(sa.sin_port);
		return 0;
	}
	close(fd);
	return rc;
}

int stream_accept(struct stream_listener *l, struct sockaddr *sa, socklen_t *sa_len, int *fd_out)
{
	socklen_t cap = *sa_len;
	for (;;) {
		*sa_len = cap;
		int fd = accept4(l->fd, sa, sa_len, SOCK_CLOEXEC);
		if (atomic_load(&l->closing)) {
			if (fd >= 0)
				close(fd);
			return UNISUM_ESHUTDOWN;
		}
		if (fd >= 0) {
			*fd_out = fd;
			return 0;
		}
		if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO)
			continue;
		if (errno == EMFILE || errno == ENFILE) {
			/* Retrying would not help while the limit holds: the
			 * caller names it and fails the job. */
			char why[300];
			log_fd_limits(errno, why, sizeof why);
			log_set_last_error("accept(): %s", why);
			return UNISUM_ESYS;
		}
		if (errno == ENOBUFS || errno == ENOMEM) {
			LOG_ERROR("accept(): %s; retrying in 100 ms", strerror(errno));
			nanosleep(&(struct timespec){0, 100000000}, NULL);
			continue;
		}
		return log_fail(UNISUM_ESYS, "accept(): %s", strerror(errno));
	}
}

void stream_listener_shutdown(struct stream_listener *l)
{
	atomic_store(&l->closing, true);
	shutdown(l->fd, SHUT_RDWR);
}

void stream_listener_close(struct stream_listener *l)
{
	close(l->fd);
}

int stream_connect(int family, const struct sockaddr *sa, socklen_t sa_len, int timeout_ms,
		   const char *peer, int *fd_out)
{
	int64_t start = timing_now_ms();
	int delay_ms = 10;
	for (;;) {
		int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (fd < 0 && (errno == EMFILE || errno == ENFILE)) {
			char why[300];
			log_fd_limits(errno, why, sizeof why);
			return log_fail(UNISUM_ESYS, "cannot connect to %s: socket(): %s", peer, why);
		}
		if (fd < 0)
			return log_fail(UNISUM_ESYS, "socket(): %s", strerror(errno));
		if (connect(fd, sa, sa_len) == 0) {
			*fd_out = fd;
			return 0;
		}
		int e = errno;
		close(fd);
		long elapsed = (long)(timing_now_ms() - start);
		bool retry = e == ECONNREFUSED || e == EINTR || e == ETIMEDOUT || e == EAGAIN ||
			     e == ENETUNREACH || e == EHOSTUNREACH;
		if (!retry || elapsed >= timeout_ms) {
			log_set_last_error("cannot connect to %s after %ld ms: %s (is the peer "
					   "running and the address right? UNISUM_TIMEOUT_MS bounds "
					   "the wait)",
					   peer, elapsed, strerror(e));
			return UNISUM_ECONN;
		}
		nanosleep(&(struct timespec){0, (long)delay_ms * 1000000}, NULL);
		if (delay_ms < 200)
			delay_ms *= 2;
	}
}

int stream_send(int fd, const struct wire_hdr *hdr, const void *payload)
{
	uint8_t head[WIRE_HDR_SIZE];
	wire_encode(hdr, head);
	struct iovec iov[2] = {
		{.iov_base = head, .iov_len = WIRE_HDR_SIZE},
		{.iov_base = (void *)payload, .iov_len = payload ? hdr->payload_len : 0},
	};
	struct msghdr msg = {.msg_iov = iov, .msg_iovlen = payload ? 2 : 1};
	while (msg.msg_iovlen > 0) {
		ssize_t n = sendmsg(fd, &msg, MSG_NOSIGNAL);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return UNISUM_ECONN;
		}
		size_t left = (size_t)n;
		while (msg.msg_iovlen > 0 && left >= msg.msg_iov[0].iov_len) {
			left -= msg.msg_iov[0].iov_len;
			msg.msg_iov++;
			msg.msg_iovlen--;
		}
		if (msg.msg_iovlen > 0) {
			msg.msg_iov[0].iov_base = (uint8_t *)msg.msg_iov[0].iov_base + left;
			msg.msg_iov[0].iov_len -= left;
		}
	}
	return 0;
}

int stream_read_full(int fd, void *dst, size_t len)
{
	uint8_t *p = dst;
	while (len > 0) {
		ssize_t n = recv(fd, p, len, MSG_WAITALL);
		if (n == 0)
			return UNISUM_ECONN;
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return UNISUM_ECONN;
		}
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

int stream_recv_header(int fd, struct wire_hdr *hdr, char *why, size_t why_len)
{
	uint8_t head[WIRE_HDR_SIZE];
	int rc = stream_read_full(fd, head, sizeof head);
	if (rc != 0) {
		snprintf(why, why_len, "connection closed");
		return rc;
	}
	return wire_decode(head, hdr, why, why_len);
}

int stream_recv_payload(int fd, void *dst, size_t len)
{
	if (dst != NULL)
		return stream_read_full(fd, dst, len);
	uint8_t sink[4096];
	while (len > 0) {
		size_t n = len < sizeof sink ? len : sizeof sink;
		int rc = stream_read_full(fd, sink, n);
		if (rc != 0)
			return rc;
		len -= n;
	}
	return 0;
}

static void stream_recv_timeout(int fd, int seconds)
{
	struct timeval tv = {.tv_sec = seconds};
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
}

/* ---- the non-blocking form ------------------------------------------------ */

int stream_set_nonblocking(int fd)
{
	int flags = fcntl(fd, F_GETFL);
	if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0)
		return log_fail(UNISUM_ESYS, "fcntl(O_NONBLOCK): %s", strerror(errno));
	return 0;
}

int stream_accept_nb(struct stream_listener *l, struct sockaddr *sa, socklen_t *sa_len, int *fd_out)
{
	int fd = accept4(l->fd, sa, sa_len, SOCK_CLOEXEC | SOCK_NONBLOCK);
	if (atomic_load(&l->closing)) {
		if (fd >= 0)
			close(fd);
		return UNISUM_ESHUTDOWN;
	}
	if (fd >= 0) {
		*fd_out = fd;
		return 0;
	}
	int e = errno;
	if (e == EAGAIN || e == EWOULDBLOCK || e == EINTR || e == ECONNABORTED || e == EPROTO)
		return TP_AGAIN;
	char why[300];
	if (e == EMFILE || e == ENFILE)
		log_fd_limits(e, why, sizeof why);
	else if (e == ENOBUFS || e == ENOMEM)
		snprintf(why, sizeof why, "%s: the kernel is out of memory for sockets", strerror(e));
	else
		snprintf(why, sizeof why, "%s", strerror(e));
	log_set_last_error("cannot accept a connection: accept(): %s", why);
	errno = e;	/* (the UCX listener tells its loop which) */
	return UNISUM_ESYS;
}

int stream_read_nb(int fd, void *dst, size_t len, size_t *got)
{
	while (*got < len) {
		ssize_t n = recv(fd, (uint8_t *)dst + *got, len - *got, 0);
		if (n > 0) {
			*got += (size_t)n;
			continue;
		}
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return TP_AGAIN;
		return UNISUM_ECONN;
	}
	return 0;
}

int stream_recv_header_nb(int fd, struct tp_rx *rx, char *why, size_t why_len)
{
	int rc = stream_read_nb(fd, rx->buf, WIRE_HDR_SIZE, &rx->got);
	if (rc == UNISUM_ECONN)
		snprintf(why, why_len, "connection closed");
	if (rc != 0)
		return rc;
	rx->got = 0;
	return wire_decode(rx->buf, &rx->hdr, why, why_len);
}

int stream_recv_payload_nb(int fd, struct tp_rx *rx)
{
	size_t len = rx->hdr.payload_len;
	if (rx->dst != NULL)
		return stream_read_nb(fd, rx->dst, len, &rx->got);
	uint8_t sink[4096];
	while (rx->got < len) {
		size_t part = 0, want = len - rx->got < sizeof sink ? len - rx->got : sizeof sink;
		int rc = stream_read_nb(fd, sink, want, &part);
		rx->got += part;
		if (rc != 0)
			return rc;
	}
	return 0;
}

int stream_send_nb(int fd, struct tp_tx *tx, const void *payload, size_t len)
{
	if (!tx->begun) {
		wire_encode(&tx->hdr, tx->head);
		tx->begun = true;
		tx->off = 0;
	}
	size_t total = WIRE_HDR_SIZE + (payload != NULL ? len : 0);
	while (tx->off < total) {
		struct iovec iov[2];
		int n = 0;
		if (tx->off < WIRE_HDR_SIZE)
			iov[n++] = (struct iovec){tx->head + tx->off, WIRE_HDR_SIZE - tx->off};
		size_t poff = tx->off > WIRE_HDR_SIZE ? tx->off - WIRE_HDR_SIZE : 0;
		if (payload != NULL && len > poff)
			iov[n++] = (struct iovec){(uint8_t *)payload + poff, len - poff};
		struct msghdr msg = {.msg_iov = iov, .msg_iovlen = (size_t)n};
		ssize_t sent = sendmsg(fd, &msg, MSG_NOSIGNAL);
		if (sent < 0 && errno == EINTR)
			continue;
		if (sent < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return TP_AGAIN;
		if (sent <= 0)
			return UNISUM_ECONN;
		tx->off += (size_t)sent;
	}
	return 0;
}

/* Writes src from *off up to len: 0 once all is out, TP_AGAIN, or
 * UNISUM_ECONN when the peer hung up. */
static int stream_write_nb(int fd, const uint8_t *src, size_t len, size_t *off)
{
	while (*off < len) {
		ssize_t n = send(fd, src + *off, len - *off, MSG_NOSIGNAL);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return TP_AGAIN;
		if (n <= 0)
			return UNISUM_ECONN;
		*off += (size_t)n;
	}
	return 0;
}

/* ---- the handshake, blocking or not -------------------------------------- */

/* The handshake's bytes on a socket (struct auth_io), blocking or not:
 * the same calls.  On a blocking socket a read that timed out
 * (SO_RCVTIMEO) is the peer's failure (stream_auth_read_blocking). */
_Static_assert(AUTH_AGAIN == TP_AGAIN, "the handshake's AGAIN is the transports'");

static int stream_auth_read(void *ctx, void *dst, size_t len, size_t *off)
{
	return stream_read_nb(*(int *)ctx, dst, len, off);
}

static int stream_auth_read_blocking(void *ctx, void *dst, size_t len, size_t *off)
{
	int rc = stream_read_nb(*(int *)ctx, dst, len, off);
	return rc == TP_AGAIN ? UNISUM_ETIMEDOUT : rc;
}

static int stream_auth_write(void *ctx, const void *src, size_t len, size_t *off)
{
	return stream_write_nb(*(int *)ctx, src, len, off);
}

int stream_authenticate(int fd, bool acceptor, const char *peer, char *why, size_t len)
{
	if (!auth_is_enabled())
		return 0;
	stream_recv_timeout(fd, STREAM_AUTH_TIMEOUT_S);
	struct auth_io io = {&fd, stream_auth_read_blocking, stream_auth_write};
	struct auth_state a = {.connector = !acceptor};
	int rc = auth_step(&a, &io, peer, why, len);
	stream_recv_timeout(fd, 0);
	return rc;
}

int stream_auth_nb(int fd, const char *peer, struct auth_state *a, char *why, size_t len)
{
	if (!auth_is_enabled())
		return 0;
	struct auth_io io = {&fd, stream_auth_read, stream_auth_write};
	return auth_step(a, &io, peer, why, len);
}

/* ---- telling ThreadSanitizer about messages ------------------------------- */

#if defined(__SANITIZE_THREAD__)
#define STREAM_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define STREAM_TSAN 1
#endif
#endif

#ifdef STREAM_TSAN
void __tsan_acquire(void *addr);
void __tsan_release(void *addr);

/* Tokens share these words; a collision only adds an ordering. */
static char stream_sync_words[4096];

void stream_sync_release(uint64_t token)
{
	__tsan_release(&stream_sync_words[token % sizeof stream_sync_words]);
}

void stream_sync_acquire(uint64_t token)
{
	__tsan_acquire(&stream_sync_words[token % sizeof stream_sync_words]);
}

/* FNV-1a of bytes. */
static uint64_t stream_sync_token(const void *bytes, size_t len)
{
	uint64_t h = 0xcbf29ce484222325ull;
	for (size_t i = 0; i < len; i++)
		h = (h ^ ((const uint8_t *)bytes)[i]) * 0x100000001b3ull;
	return h;
}

void stream_tcp_tokens(int fd, uint64_t *tx, uint64_t *rx)
{
	struct sockaddr_storage pair[2];
	socklen_t len = sizeof pair[0];
	memset(pair, 0, sizeof pair);
	getsockname(fd, (struct sockaddr *)&pair[0], &len);
	len = sizeof pair[1];
	getpeername(fd, (struct sockaddr *)&pair[1], &len);
	*tx = stream_sync_token(pair, sizeof pair);	/* from here to the peer */
	struct sockaddr_storage swapped[2] = {pair[1], pair[0]};
	*rx = stream_sync_token(swapped, sizeof swapped);
}

void stream_ipc_tokens(int fd, bool acceptor, pid_t peer_pid, uint64_t *tx, uint64_t *rx)
{
	/* A Unix socket's connecting end has no name: the listener's name,
	 * the connecting pid and the direction are the same at both ends. */
	struct sockaddr_un sa;
	socklen_t len = sizeof sa;
	memset(&sa, 0, sizeof sa);
	if (acceptor)
		getsockname(fd, (struct sockaddr *)&sa, &len);
	else
		getpeername(fd, (struct sockaddr *)&sa, &len);
	struct {
		char name[sizeof sa.sun_path];
		int32_t connector, to_acceptor;
	} k;
	memset(&k, 0, sizeof k);
	memcpy(k.name, sa.sun_path, sizeof k.name);
	k.connector = acceptor ? (int32_t)peer_pid : (int32_t)getpid();
	k.to_acceptor = 1;
	uint64_t up = stream_sync_token(&k, sizeof k);
	k.to_acceptor = 0;
	uint64_t down = stream_sync_token(&k, sizeof k);
	*tx = acceptor ? down : up;
	*rx = acceptor ? up : down;
}
#else
/* Outside ThreadSanitizer: nothing to tell, no token to derive. */
void stream_sync_release(uint64_t token)
{
	(void)token;
}

void stream_sync_acquire(uint64_t token)
{
	(void)token;
}

void stream_tcp_tokens(int fd, uint64_t *tx, uint64_t *rx)
{
	(void)fd;
	*tx = *rx = 0;
}

void stream_ipc_tokens(int fd, bool acceptor, pid_t peer_pid, uint64_t *tx, uint64_t *rx)
{
	(void)fd, (void)acceptor, (void)peer_pid;
	*tx = *rx = 0;
}
#endif

int stream_resolve(const char *host, int port, struct sockaddr_in *sa)
{
	memset(sa, 0, sizeof *sa);
	sa->sin_family = AF_INET;
	sa->sin_port = htons((uint16_t)port);
	if (inet_pton(AF_INET, host, &sa->sin_addr) == 1)
		return 0;
	struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM};
	struct addrinfo *res = NULL;
	int rc = getaddrinfo(host, NULL, &hints, &res);
	if (rc != 0 || res == NULL)
		return log_fail(UNISUM_ECONN, "cannot resolve host '%s': %s", host, gai_strerror(rc));
	sa->sin_addr = ((struct sockaddr_in *)res->ai_addr)->sin_addr;
	freeaddrinfo(res);
	return 0;
}
