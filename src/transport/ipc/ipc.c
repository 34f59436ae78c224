/*
 * ipc.c - the IPC transport: processes of one host, data by address.
 *
 * DESIGN.  A worker and a server on the same host need not push tensors
 * through the kernel's socket buffers twice: the receiver can copy them
 * once, straight out of the sender's memory (cross-memory attach,
 * process_vm_readv).  This transport carries the messages over a Unix
 * stream socket and, for the two messages that carry tensor data (PUSH and
 * PULL_REPLY), sends the data's address instead of the data (WIRE_FLAG_IPC,
 * an 8-byte payload).  recv_header() hides that: the caller sees the
 * message as TCP would deliver it (no IPC flag, payload_len the data's
 * size) and recv_payload() copies the data from the sender.  Everything
 * else (control messages, zero-filled pushes) goes over the socket as is.
 *
 * Naming and trust.  The socket lives in the abstract namespace, named
 * after the TCP address the listener's owner advertises ("unisum/HOST:PORT"):
 * a process reaches it only from the same network namespace, which is what
 * the address book's host identity already requires of "same host".  The
 * peer's pid (whose memory we read) comes from the kernel (SO_PEERCRED),
 * not from anything the peer says, and the job-secret handshake runs as on
 * TCP.
 *
 * By-address contract.  send() of a PUSH or PULL_REPLY returns before the
 * peer has read the data: the sender keeps the buffer unchanged until the
 * protocol says the peer is done with it.  unisum's protocol already does:
 * a worker's input stays until the reply of its push has arrived, and a
 * server's sum stays until that worker's next push of the key.
 *
 * Letting go early.  A sender that gives up on a connection (the job
 * failed: conn_shutdown, conn_free) fails its operations at once and
 * their buffers go back to their callers, who may free them, while the
 * peer may still be reading, or not yet have read, a PUSH already sent.
 * So every connection has a guard word, and a by-address payload carries
 * the guard's address and value as sent.  The sender changes the guard
 * before it lets go; the reader copies the data, then the guard (one
 * process_vm_readv, in that order), and uses the copy only if the guard
 * is unchanged: then the data was still lent when it was read.  A changed
 * guard reads as a closed connection.  Guards are never freed (a reader
 * may check one after its connection closed): a closed connection's guard
 * goes back to a pool, its value counting on.
 */
#include <endian.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "log/log.h"
#include "shm/shm.h"
#include "transport/stream.h"
#include "transport/transport.h"
#include "unisum.h"

struct tp_listener {
	struct stream_listener s;
};

/* A connection's guard (see "Letting go early"). */
struct ipc_guard {
	_Atomic uint64_t value;
	struct ipc_guard *next;	/* in the pool */
};

struct tp_conn {
	int fd;
	pid_t peer_pid;		/* whose memory the data is read from */
	char peer[80];		/* "pid N", for log lines */
	struct ipc_guard *guard;	/* this side's, for the data it lends */
	uint64_t ref;		/* the received message's data, in the peer ... */
	size_t ref_left;	/* ... and how much of it recv_payload() has not read */
	uint64_t ref_guard;	/* ... the peer's guard ... */
	uint64_t ref_value;	/* ... and its value when the peer sent it */
	bool by_ref;		/* the received message's data is by address */
	uint64_t tx, rx;	/* each direction's token (stream_sync_release) */
};

static void ipc_conn_free(struct tp_conn *c);

/* ---- guards ---------------------------------------------------------------- */

static pthread_mutex_t guard_lock = PTHREAD_MUTEX_INITIALIZER;
static struct ipc_guard *guard_pool;

static struct ipc_guard *guard_take(void)
{
	pthread_mutex_lock(&guard_lock);
	struct ipc_guard *g = guard_pool;
	if (g != NULL)
		guard_pool = g->next;
	pthread_mutex_unlock(&guard_lock);
	return g != NULL ? g : calloc(1, sizeof *g);
}

/* The data lent through the guard's connection is let go: a peer that
 * reads it from now on does not use it. */
static void guard_let_go(struct ipc_guard *g)
{
	atomic_fetch_add(&g->value, 1);
}

static void guard_give_back(struct ipc_guard *g)
{
	guard_let_go(g);
	pthread_mutex_lock(&guard_lock);
	g->next = guard_pool;
	guard_pool = g;
	pthread_mutex_unlock(&guard_lock);
}

/* The socket's address for the TCP address host:port. */
static int ipc_address(const char *host, int port, struct sockaddr_un *sa, socklen_t *len)
{
	memset(sa, 0, sizeof *sa);
	sa->sun_family = AF_UNIX;
	int n = snprintf(sa->sun_path + 1, sizeof sa->sun_path - 1, "unisum/%s:%d", host, port);
	if (n < 0 || (size_t)n >= sizeof sa->sun_path - 1)
		return log_fail(UNISUM_EINVAL, "IPC address for '%s:%d' is too long", host, port);
	*len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
	return 0;
}

/* A connection on fd, its peer's pid from the kernel. */
static struct tp_conn *ipc_conn_new(int fd, bool acceptor)
{
	struct ucred cred;
	socklen_t len = sizeof cred;
	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || cred.pid <= 0) {
		LOG_ERROR("IPC connection without the peer's credentials: %s", strerror(errno));
		return NULL;
	}
	struct tp_conn *c = calloc(1, sizeof *c);
	if (c == NULL || (c->guard = guard_take()) == NULL) {
		free(c);
		return NULL;
	}
	c->fd = fd;
	c->peer_pid = cred.pid;
	snprintf(c->peer, sizeof c->peer, "pid %d (IPC)", (int)cred.pid);
	stream_ipc_tokens(fd, acceptor, c->peer_pid, &c->tx, &c->rx);
	return c;
}

static int ipc_listen(const char *host, int port, struct tp_listener **out, int *port_out)
{
	if (port <= 0)
		return log_fail(UNISUM_EINVAL, "an IPC listener is named after a TCP port, got %d", port);
	struct sockaddr_un sa;
	socklen_t sa_len;
	int rc = ipc_address(host, port, &sa, &sa_len);
	if (rc != 0)
		return rc;
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return log_fail(UNISUM_ESYS, "socket(AF_UNIX): %s", strerror(errno));
	if (bind(fd, (struct sockaddr *)&sa, sa_len) != 0 || listen(fd, 1024) != 0) {
		rc = log_fail(UNISUM_ESYS, "cannot listen on the IPC socket @%s: %s", sa.sun_path + 1,
			      strerror(errno));
		close(fd);
		return rc;
	}
	struct tp_listener *l = calloc(1, sizeof *l);
	if (l == NULL) {
		close(fd);
		return UNISUM_ENOMEM;
	}
	l->s.fd = fd;
	atomic_init(&l->s.closing, false);
	*out = l;
	*port_out = port;
	return 0;
}

static int ipc_accept(struct tp_listener *l, struct tp_conn **out)
{
	for (;;) {
		struct sockaddr_un sa;
		socklen_t len = sizeof sa;
		int fd;
		int rc = stream_accept(&l->s, (struct sockaddr *)&sa, &len, &fd);
		if (rc != 0)
			return rc;
		struct tp_conn *c = ipc_conn_new(fd, true);
		if (c != NULL) {
			*out = c;
			return 0;
		}
		close(fd);
	}
}

static void ipc_listener_shutdown(struct tp_listener *l)
{
	stream_listener_shutdown(&l->s);
}

static void ipc_listener_free(struct tp_listener *l)
{
	if (l == NULL)
		return;
	stream_listener_close(&l->s);
	free(l);
}

static int ipc_dial(const char *host, int port, int timeout_ms, struct tp_conn **out)
{
	struct sockaddr_un sa;
	socklen_t sa_len;
	int rc = ipc_address(host, port, &sa, &sa_len);
	if (rc != 0)
		return rc;
	char peer[sizeof sa.sun_path + 1];
	snprintf(peer, sizeof peer, "@%s", sa.sun_path + 1);
	int fd;
	rc = stream_connect(AF_UNIX, (struct sockaddr *)&sa, sa_len, timeout_ms, peer, &fd);
	if (rc != 0)
		return rc;
	struct tp_conn *c = ipc_conn_new(fd, false);
	if (c == NULL) {
		close(fd);
		log_set_last_error("cannot set up the IPC connection to %s", peer);
		return UNISUM_ECONN;
	}
	*out = c;
	return 0;
}

static int ipc_authenticate(struct tp_conn *c, bool connector, char *why, size_t len)
{
	return stream_authenticate(c->fd, !connector, c->peer, why, len);
}

/* Whether a message's payload goes by address: tensor data, not zeros,
 * not a compressed encoding (whose length is the codec's: inline). */
static bool ipc_by_ref(const struct wire_hdr *h, const void *payload)
{
	return (h->type == WIRE_PUSH || h->type == WIRE_PULL_REPLY) && payload != NULL &&
	       h->payload_len > 0 && !(h->flags & (WIRE_FLAG_ZERO | WIRE_FLAG_COMPRESSED));
}

static int ipc_send(struct tp_conn *c, const struct wire_hdr *hdr, const void *payload)
{
	stream_sync_release(c->tx);
	if (!ipc_by_ref(hdr, payload))
		return stream_send(c->fd, hdr, payload);
	struct wire_hdr h = *hdr;
	h.flags |= WIRE_FLAG_IPC;
	h.payload_len = WIRE_IPC_PAYLOAD;
	uint64_t ref[3] = {htole64((uint64_t)(uintptr_t)payload),
			   htole64((uint64_t)(uintptr_t)&c->guard->value),
			   htole64(atomic_load(&c->guard->value))};
	return stream_send(c->fd, &h, ref);
}

static int ipc_recv_header(struct tp_conn *c, struct wire_hdr *hdr, char *why, size_t why_len)
{
	c->by_ref = false;
	c->ref_left = 0;
	int rc = stream_recv_header(c->fd, hdr, why, why_len);
	if (rc == 0)
		stream_sync_acquire(c->rx);
	if (rc != 0 || !(hdr->flags & WIRE_FLAG_IPC))
		return rc;
	/* wire_decode allowed the flag only on PUSH and PULL_REPLY, with a
	 * reference for payload. */
	uint64_t ref[3];
	if (stream_read_full(c->fd, ref, sizeof ref) != 0) {
		snprintf(why, why_len, "connection closed");
		return UNISUM_ECONN;
	}
	c->by_ref = true;
	c->ref = le64toh(ref[0]);
	c->ref_guard = le64toh(ref[1]);
	c->ref_value = le64toh(ref[2]);
	c->ref_left = (size_t)hdr->count * unisum_dtype_size((unisum_dtype)hdr->dtype);
	hdr->flags &= ~WIRE_FLAG_IPC;
	hdr->payload_len = c->ref_left;
	return 0;
}

static int ipc_recv_payload(struct tp_conn *c, void *dst, size_t len)
{
	if (!c->by_ref)
		return stream_recv_payload(c->fd, dst, len);
	if (len > c->ref_left)
		return UNISUM_ECONN;
	uint64_t value = c->ref_value;
	int rc = dst != NULL ? shm_vm_read_guarded(c->peer_pid, dst, c->ref, len, c->ref_guard, &value)
			     : 0;
	c->ref += len;
	c->ref_left -= len;
	if (rc == 0 && value != c->ref_value) {
		/* The sender gave up on the connection before or while this ran. */
		log_set_last_error("pid %d let go of the data it lent (it gave up on the "
				   "connection) before it was read", (int)c->peer_pid);
		return UNISUM_ECONN;
	}
	if (rc == 0)
		return 0;
	log_set_last_error("cannot read %zu bytes from the memory of pid %d (same host, "
			   "UNISUM_IPC=1) with process_vm_readv: %s; set UNISUM_IPC=0 to send the "
			   "data through the socket",
			   len, (int)c->peer_pid, strerror(-rc));
	return rc == -ESRCH ? UNISUM_ECONN : UNISUM_ESYS;
}

static void ipc_conn_shutdown(struct tp_conn *c)
{
	guard_let_go(c->guard);
	shutdown(c->fd, SHUT_RDWR);
}

static void ipc_conn_free(struct tp_conn *c)
{
	if (c == NULL)
		return;
	guard_give_back(c->guard);
	close(c->fd);
	free(c);
}

static const char *ipc_peer_name(const struct tp_conn *c)
{
	return c->peer;
}

/* ---- the non-blocking form ---- */

static int ipc_listener_fd(struct tp_listener *l)
{
	stream_set_nonblocking(l->s.fd);
	return l->s.fd;
}

static int ipc_accept_nb(struct tp_listener *l, struct tp_conn **out)
{
	struct sockaddr_un sa;
	socklen_t len = sizeof sa;
	int fd;
	int rc = stream_accept_nb(&l->s, (struct sockaddr *)&sa, &len, &fd);
	if (rc != 0)
		return rc;
	*out = ipc_conn_new(fd, true);
	if (*out != NULL)
		return 0;
	close(fd);
	return TP_AGAIN;	/* a peer gone before its credentials were read */
}

static int ipc_nb_fd(struct tp_conn *c)
{
	stream_set_nonblocking(c->fd);
	return c->fd;
}

static int ipc_auth_nb(struct tp_conn *c, struct auth_state *a, char *why, size_t len)
{
	return stream_auth_nb(c->fd, c->peer, a, why, len);
}

/* recv_nb's header stages: the header, and for data by address the
 * reference that follows it (then the header reads as TCP's would). */
static int ipc_recv_head_nb(struct tp_conn *c, struct tp_rx *rx, char *why, size_t why_len)
{
	if (rx->stage == 0) {
		c->by_ref = false;
		c->ref_left = 0;
		int rc = stream_recv_header_nb(c->fd, rx, why, why_len);
		if (rc != 0)
			return rc;
		stream_sync_acquire(c->rx);
		rx->stage = (rx->hdr.flags & WIRE_FLAG_IPC) ? 1 : 2;
	}
	if (rx->stage == 1) {
		uint64_t ref[3];
		int rc = stream_read_nb(c->fd, rx->buf, WIRE_IPC_PAYLOAD, &rx->got);
		if (rc == UNISUM_ECONN)
			snprintf(why, why_len, "connection closed");
		if (rc != 0)
			return rc;
		rx->got = 0;
		memcpy(ref, rx->buf, sizeof ref);
		c->by_ref = true;
		c->ref = le64toh(ref[0]);
		c->ref_guard = le64toh(ref[1]);
		c->ref_value = le64toh(ref[2]);
		c->ref_left = (size_t)rx->hdr.count * unisum_dtype_size((unisum_dtype)rx->hdr.dtype);
		rx->hdr.flags &= ~WIRE_FLAG_IPC;
		rx->hdr.payload_len = c->ref_left;
		rx->stage = 2;
	}
	return 0;
}

static int ipc_recv_nb(struct tp_conn *c, struct tp_rx *rx, char *why, size_t why_len)
{
	if (rx->stage < 2) {
		int rc = ipc_recv_head_nb(c, rx, why, why_len);
		if (rc != 0)
			return rc;
		if (rx->hdr.payload_len > 0)
			return TP_HEADER;
	}
	if (!c->by_ref)
		return stream_recv_payload_nb(c->fd, rx);
	/* The copy from the peer's memory does not wait for the socket. */
	int rc = ipc_recv_payload(c, rx->dst, rx->hdr.payload_len);
	if (rc != 0)
		snprintf(why, why_len, "%s", log_last_error());
	return rc;
}

static int ipc_send_nb(struct tp_conn *c, struct tp_tx *tx)
{
	if (!tx->begun) {
		stream_sync_release(c->tx);
		if (ipc_by_ref(&tx->hdr, tx->payload)) {
			tx->hdr.flags |= WIRE_FLAG_IPC;
			tx->hdr.payload_len = WIRE_IPC_PAYLOAD;
			tx->ref[0] = htole64((uint64_t)(uintptr_t)tx->payload);
			tx->ref[1] = htole64((uint64_t)(uintptr_t)&c->guard->value);
			tx->ref[2] = htole64(atomic_load(&c->guard->value));
			tx->payload = tx->ref;
		}
	}
	return stream_send_nb(c->fd, tx, tx->payload, tx->hdr.payload_len);
}

static const struct transport_ops ipc_ops = {
	.name = "ipc",
	.listen = ipc_listen,
	.accept = ipc_accept,
	.listener_shutdown = ipc_listener_shutdown,
	.listener_free = ipc_listener_free,
	.dial = ipc_dial,
	.send = ipc_send,
	.authenticate = ipc_authenticate,
	.recv_header = ipc_recv_header,
	.recv_payload = ipc_recv_payload,
	.conn_shutdown = ipc_conn_shutdown,
	.conn_free = ipc_conn_free,
	.peer_name = ipc_peer_name,
	.listener_fd = ipc_listener_fd,
	.accept_nb = ipc_accept_nb,
	.nb_fd = ipc_nb_fd,
	.auth_nb = ipc_auth_nb,
	.recv_nb = ipc_recv_nb,
	.send_nb = ipc_send_nb,
};

const struct transport_ops *transport_ipc(void)
{
	return &ipc_ops;
}
