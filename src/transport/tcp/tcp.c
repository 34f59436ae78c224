/*
 * tcp.c - the TCP transport: a socket, blocking for the scheduler
 * connection's registration and the tests, non-blocking and served by an
 * event loop otherwise (src/loop; ARCHITECTURE.md section 3).
 *
 * The socket I/O (one sendmsg() of header + payload; payloads received
 * straight into the caller's destination) is stream.c's, shared with the
 * IPC transport.  On a loop, SO_RCVLOWAT while a payload is still to come
 * (tcp_lowat) wakes the loop once per 256 KiB, not once per segment.
 * MSG_ZEROCOPY does not pay on loopback or veth, where the kernel copies
 * anyway (bench/zerocopy.c: 1.35 times the CPU of a plain send, every
 * completion flagged as copied), and is not used.
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
#include "transport/stream.h"
#include "transport/transport.h"

static void tcp_conn_free(struct tp_conn *c);

struct tp_listener {
	struct stream_listener s;
};

struct tp_conn {
	int fd;			/* connected socket */
	char peer[80];		/* "host:port" of the peer */
	uint64_t tx, rx;	/* each direction's token (stream_sync_release) */
	int lowat;		/* SO_RCVLOWAT as set (0: the kernel's 1) */
};

/* A large payload wakes its loop once per TCP_LOWAT bytes queued, not once
 * per segment that arrives: each wake-up then costs one epoll_wait and
 * a few large recv calls instead of dozens of small ones (a blocking
 * reader got the same from MSG_WAITALL).  The mark never exceeds what is
 * still to come, so it is always reached; the kernel grows the receive
 * buffer to hold it, and wakes the reader anyway under memory pressure,
 * at the end of the stream or on an error. */
#define TCP_LOWAT (256u << 10)

/* Sets the connection's SO_RCVLOWAT for `remaining` bytes still to come
 * (1 when none or few). */
static void tcp_lowat(struct tp_conn *c, size_t remaining)
{
	int v = remaining >= TCP_LOWAT ? (int)TCP_LOWAT : remaining > 16384 ? (int)remaining : 1;
	if (v == (c->lowat > 0 ? c->lowat : 1))
		return;
	if (setsockopt(c->fd, SOL_SOCKET, SO_RCVLOWAT, &v, sizeof v) == 0)
		c->lowat = v;
}

static void tcp_tune(int fd)
{
	int one = 1;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
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
	stream_tcp_tokens(fd, &c->tx, &c->rx);
	tcp_tune(fd);
	return c;
}

/* A connection of fd, or UNISUM_ENOMEM with fd closed. */
static int tcp_adopt(int fd, const struct sockaddr_in *sa, struct tp_conn **out)
{
	*out = tcp_conn_new(fd, sa);
	if (*out != NULL)
		return 0;
	close(fd);
	return UNISUM_ENOMEM;
}

static int tcp_listen(const char *host, int port, struct tp_listener **out, int *port_out)
{
	int fd;
	int rc = stream_listen(host, port, &fd, port_out);
	if (rc != 0)
		return rc;
	struct tp_listener *l = calloc(1, sizeof *l);
	if (l == NULL) {
		close(fd);
		return UNISUM_ENOMEM;
	}
	l->s.fd = fd;
	atomic_init(&l->s.closing, false);
	*out = l;
	return 0;
}

static int tcp_accept(struct tp_listener *l, struct tp_conn **out)
{
	struct sockaddr_in sa;
	socklen_t len = sizeof sa;
	int fd;
	int rc = stream_accept(&l->s, (struct sockaddr *)&sa, &len, &fd);
	return rc != 0 ? rc : tcp_adopt(fd, &sa, out);
}

static void tcp_listener_shutdown(struct tp_listener *l)
{
	stream_listener_shutdown(&l->s);
}

static void tcp_listener_free(struct tp_listener *l)
{
	if (l == NULL)
		return;
	stream_listener_close(&l->s);
	free(l);
}

static int tcp_dial(const char *host, int port, int timeout_ms, struct tp_conn **out)
{
	struct sockaddr_in sa;
	int rc = stream_resolve(host, port, &sa);
	if (rc != 0)
		return rc;
	char peer[300];
	snprintf(peer, sizeof peer, "%s:%d", host, port);
	int fd;
	rc = stream_connect(AF_INET, (struct sockaddr *)&sa, sizeof sa, timeout_ms, peer, &fd);
	if (rc == UNISUM_ECONN) {
		char why[512];
		snprintf(why, sizeof why, "%s", log_last_error());
		return log_fail(rc, "%s", why);
	}
	if (rc != 0)
		return rc;
	return tcp_adopt(fd, &sa, out);
}

static int tcp_authenticate(struct tp_conn *c, bool connector, char *why, size_t len)
{
	return stream_authenticate(c->fd, !connector, c->peer, why, len);
}

static int tcp_send(struct tp_conn *c, const struct wire_hdr *hdr, const void *payload)
{
	stream_sync_release(c->tx);
	return stream_send(c->fd, hdr, payload);
}

static int tcp_recv_header(struct tp_conn *c, struct wire_hdr *hdr, char *why, size_t why_len)
{
	int rc = stream_recv_header(c->fd, hdr, why, why_len);
	if (rc == 0)
		stream_sync_acquire(c->rx);
	if (rc == 0 && (hdr->flags & WIRE_FLAG_IPC)) {
		/* By address is the IPC transport's alone (ipc/ipc.c). */
		snprintf(why, why_len, "%s: data by address (the IPC flag) on a TCP connection",
			 wire_type_name(hdr->type));
		return UNISUM_EPROTO;
	}
	return rc;
}

static int tcp_recv_payload(struct tp_conn *c, void *dst, size_t len)
{
	return stream_recv_payload(c->fd, dst, len);
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

/* ---- the non-blocking form ---- */

static int tcp_listener_fd(struct tp_listener *l)
{
	stream_set_nonblocking(l->s.fd);
	return l->s.fd;
}

static int tcp_accept_nb(struct tp_listener *l, struct tp_conn **out)
{
	struct sockaddr_in sa;
	socklen_t len = sizeof sa;
	int fd;
	int rc = stream_accept_nb(&l->s, (struct sockaddr *)&sa, &len, &fd);
	return rc != 0 ? rc : tcp_adopt(fd, &sa, out);
}

static int tcp_nb_fd(struct tp_conn *c)
{
	stream_set_nonblocking(c->fd);
	return c->fd;
}

static int tcp_auth_nb(struct tp_conn *c, struct auth_state *a, char *why, size_t len)
{
	return stream_auth_nb(c->fd, c->peer, a, why, len);
}

static int tcp_recv_nb(struct tp_conn *c, struct tp_rx *rx, char *why, size_t why_len)
{
	if (rx->stage == 0) {
		int rc = stream_recv_header_nb(c->fd, rx, why, why_len);
		if (rc != 0)
			return rc;
		stream_sync_acquire(c->rx);
		if (rx->hdr.flags & WIRE_FLAG_IPC) {
			snprintf(why, why_len, "%s: data by address (the IPC flag) on a TCP connection",
				 wire_type_name(rx->hdr.type));
			return UNISUM_EPROTO;
		}
		rx->stage = 2;
		if (rx->hdr.payload_len > 0)
			return TP_HEADER;
	}
	int rc = stream_recv_payload_nb(c->fd, rx);
	tcp_lowat(c, rc == TP_AGAIN ? rx->hdr.payload_len - rx->got : 0);
	return rc;
}

static int tcp_send_nb(struct tp_conn *c, struct tp_tx *tx)
{
	if (!tx->begun)
		stream_sync_release(c->tx);
	return stream_send_nb(c->fd, tx, tx->payload, tx->hdr.payload_len);
}

static const struct transport_ops tcp_ops = {
	.name = "tcp",
	.listen = tcp_listen,
	.accept = tcp_accept,
	.listener_shutdown = tcp_listener_shutdown,
	.listener_free = tcp_listener_free,
	.dial = tcp_dial,
	.send = tcp_send,
	.authenticate = tcp_authenticate,
	.recv_header = tcp_recv_header,
	.recv_payload = tcp_recv_payload,
	.conn_shutdown = tcp_conn_shutdown,
	.conn_free = tcp_conn_free,
	.peer_name = tcp_peer_name,
	.listener_fd = tcp_listener_fd,
	.accept_nb = tcp_accept_nb,
	.nb_fd = tcp_nb_fd,
	.auth_nb = tcp_auth_nb,
	.recv_nb = tcp_recv_nb,
	.send_nb = tcp_send_nb,
};

const struct transport_ops *transport_tcp(void)
{
	return &tcp_ops;
}
