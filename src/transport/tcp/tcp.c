/*
 * tcp.c - the TCP transport: blocking sockets, one thread per direction.
 *
 * DESIGN.  Loopback and LAN TCP on small machines is bound by the kernel's
 * copies, so the socket work has to spread over every core.  A prototype
 * measured a single event-loop thread at 0.84x of iperf3 and one thread
 * per connection at 0.91-0.97x, so this transport is deliberately simple:
 * every connection is a blocking socket, its owner runs one receiving and
 * one sending thread on it, and the scheduler of the operating system
 * spreads them over the cores.  MSG_ZEROCOPY made loopback slower and is
 * not used.
 *
 * Sends go out with one sendmsg() of header + payload (no copy into a
 * staging buffer).  Receives read the header into a small buffer, then the
 * payload with MSG_WAITALL straight into the destination the caller chose.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "log/log.h"
#include "transport/auth.h"
#include "transport/transport.h"

static void tcp_conn_free(struct tp_conn *c);
static int tcp_authenticate_side(struct tp_conn *c, bool acceptor, char *why, size_t len);

/* How long a handshake may wait for the peer's next bytes. */
#define TCP_AUTH_TIMEOUT_S 10

struct tp_listener {
	int fd;			/* listening socket */
	atomic_bool closing;	/* listener_shutdown() was called */
};

struct tp_conn {
	int fd;			/* connected socket */
	char peer[80];		/* "host:port" of the peer */
};

static void tcp_tune(int fd)
{
	int one = 1;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

static int tcp_resolve(const char *host, int port, struct sockaddr_in *sa)
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

static struct tp_conn *tcp_conn_new(int fd, const struct sockaddr_in *sa)
{
	struct tp_conn *c = calloc(1, sizeof *c);
	if (c == NULL)
		return NULL;
	c->fd = fd;
	char ip[INET_ADDRSTRLEN] = "?";
	inet_ntop(AF_INET, &sa->sin_addr, ip, sizeof ip);
	snprintf(c->peer, sizeof c->peer, "%s:%u", ip, ntohs(sa->sin_port));
	tcp_tune(fd);
	return c;
}

static int tcp_listen(const char *host, int port, struct tp_listener **out, int *port_out)
{
	struct sockaddr_in sa;
	int rc = tcp_resolve(host, port, &sa);
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
		goto out_close_fd;
	}
	if (listen(fd, 1024) != 0) {
		rc = log_fail(UNISUM_ESYS, "listen(): %s", strerror(errno));
		goto out_close_fd;
	}
	socklen_t len = sizeof sa;
	getsockname(fd, (struct sockaddr *)&sa, &len);
	struct tp_listener *l = calloc(1, sizeof *l);
	if (l == NULL) {
		rc = UNISUM_ENOMEM;
		goto out_close_fd;
	}
	l->fd = fd;
	atomic_init(&l->closing, false);
	*out = l;
	*port_out = ntohs(sa.sin_port);
	return 0;

out_close_fd:
	close(fd);
	return rc;
}

static int tcp_accept(struct tp_listener *l, struct tp_conn **out)
{
	for (;;) {
		struct sockaddr_in sa;
		socklen_t len = sizeof sa;
		int fd = accept4(l->fd, (struct sockaddr *)&sa, &len, SOCK_CLOEXEC);
		if (atomic_load(&l->closing)) {
			if (fd >= 0)
				close(fd);
			return UNISUM_ESHUTDOWN;
		}
		if (fd < 0) {
			if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO)
				continue;
			if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
				LOG_ERROR("accept(): %s; retrying in 100 ms", strerror(errno));
				nanosleep(&(struct timespec){0, 100000000}, NULL);
				continue;
			}
			return log_fail(UNISUM_ESYS, "accept(): %s", strerror(errno));
		}
		struct tp_conn *c = tcp_conn_new(fd, &sa);
		if (c == NULL) {
			close(fd);
			return UNISUM_ENOMEM;
		}
		*out = c;
		return 0;
	}
}

static void tcp_listener_shutdown(struct tp_listener *l)
{
	atomic_store(&l->closing, true);
	shutdown(l->fd, SHUT_RDWR);
}

static void tcp_listener_free(struct tp_listener *l)
{
	if (l == NULL)
		return;
	close(l->fd);
	free(l);
}

static int tcp_connect(const char *host, int port, int timeout_ms, struct tp_conn **out)
{
	struct sockaddr_in sa;
	int rc = tcp_resolve(host, port, &sa);
	if (rc != 0)
		return rc;
	struct timespec start, now;
	clock_gettime(CLOCK_MONOTONIC, &start);
	int delay_ms = 10;
	for (;;) {
		int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (fd < 0)
			return log_fail(UNISUM_ESYS, "socket(): %s", strerror(errno));
		if (connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0) {
			struct tp_conn *c = tcp_conn_new(fd, &sa);
			if (c == NULL) {
				close(fd);
				return UNISUM_ENOMEM;
			}
			char why[256];
			rc = tcp_authenticate_side(c, false, why, sizeof why);
			if (rc != 0) {
				tcp_conn_free(c);
				return log_fail(rc, "%s", why);
			}
			*out = c;
			return 0;
		}
		int e = errno;
		close(fd);
		clock_gettime(CLOCK_MONOTONIC, &now);
		long elapsed = (now.tv_sec - start.tv_sec) * 1000 + (now.tv_nsec - start.tv_nsec) / 1000000;
		bool retry = e == ECONNREFUSED || e == EINTR || e == ETIMEDOUT || e == EAGAIN ||
			     e == ENETUNREACH || e == EHOSTUNREACH;
		if (!retry || elapsed >= timeout_ms)
			return log_fail(UNISUM_ECONN,
					"cannot connect to %s:%d after %ld ms: %s (is the peer running "
					"and the address right? UNISUM_TIMEOUT_MS bounds the wait)",
					host, port, elapsed, strerror(e));
		nanosleep(&(struct timespec){0, (long)delay_ms * 1000000}, NULL);
		if (delay_ms < 200)
			delay_ms *= 2;
	}
}

static int tcp_read_full(int fd, void *dst, size_t len);

static int tcp_write_full(int fd, const void *src, size_t len)
{
	const uint8_t *p = src;
	while (len > 0) {
		ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return UNISUM_ECONN;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

static void tcp_recv_timeout(int fd, int seconds)
{
	struct timeval tv = {.tv_sec = seconds};
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
}

static int tcp_io_read(void *ctx, void *dst, size_t len)
{
	return tcp_read_full(((struct tp_conn *)ctx)->fd, dst, len);
}

static int tcp_io_write(void *ctx, const void *src, size_t len)
{
	return tcp_write_full(((struct tp_conn *)ctx)->fd, src, len);
}

static int tcp_authenticate_side(struct tp_conn *c, bool acceptor, char *why, size_t len)
{
	if (!auth_is_enabled())
		return 0;
	tcp_recv_timeout(c->fd, TCP_AUTH_TIMEOUT_S);
	struct auth_io io = {c, tcp_io_read, tcp_io_write};
	int rc = acceptor ? auth_handshake_acceptor(&io, why, len)
			  : auth_handshake_connector(&io, c->peer, why, len);
	tcp_recv_timeout(c->fd, 0);
	return rc;
}

static int tcp_authenticate(struct tp_conn *c, char *why, size_t len)
{
	return tcp_authenticate_side(c, true, why, len);
}

static int tcp_send(struct tp_conn *c, const struct wire_hdr *hdr, const void *payload)
{
	uint8_t head[WIRE_HDR_SIZE];
	wire_encode(hdr, head);
	struct iovec iov[2] = {
		{.iov_base = head, .iov_len = WIRE_HDR_SIZE},
		{.iov_base = (void *)payload, .iov_len = payload ? hdr->payload_len : 0},
	};
	struct msghdr msg = {.msg_iov = iov, .msg_iovlen = payload ? 2 : 1};
	while (msg.msg_iovlen > 0) {
		ssize_t n = sendmsg(c->fd, &msg, MSG_NOSIGNAL);
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

/* Reads exactly len bytes; 0, or UNISUM_ECONN on EOF or error. */
static int tcp_read_full(int fd, void *dst, size_t len)
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

static int tcp_recv_header(struct tp_conn *c, struct wire_hdr *hdr, char *why, size_t why_len)
{
	uint8_t head[WIRE_HDR_SIZE];
	int rc = tcp_read_full(c->fd, head, sizeof head);
	if (rc != 0) {
		snprintf(why, why_len, "connection closed");
		return rc;
	}
	return wire_decode(head, hdr, why, why_len);
}

static int tcp_recv_payload(struct tp_conn *c, void *dst, size_t len)
{
	if (dst != NULL)
		return tcp_read_full(c->fd, dst, len);
	uint8_t sink[4096];
	while (len > 0) {
		size_t n = len < sizeof sink ? len : sizeof sink;
		int rc = tcp_read_full(c->fd, sink, n);
		if (rc != 0)
			return rc;
		len -= n;
	}
	return 0;
}

static void tcp_conn_shutdown(struct tp_conn *c)
{
	shutdown(c->fd, SHUT_RDWR);
}

static void tcp_conn_free(struct tp_conn *c)
{
	if (c == NULL)
		return;
	close(c->fd);
	free(c);
}

static const char *tcp_peer_name(const struct tp_conn *c)
{
	return c->peer;
}

static const struct transport_ops tcp_ops = {
	.name = "tcp",
	.listen = tcp_listen,
	.accept = tcp_accept,
	.listener_shutdown = tcp_listener_shutdown,
	.listener_free = tcp_listener_free,
	.connect = tcp_connect,
	.send = tcp_send,
	.authenticate = tcp_authenticate,
	.recv_header = tcp_recv_header,
	.recv_payload = tcp_recv_payload,
	.conn_shutdown = tcp_conn_shutdown,
	.conn_free = tcp_conn_free,
	.peer_name = tcp_peer_name,
};

const struct transport_ops *transport_tcp(void)
{
	return &tcp_ops;
}
