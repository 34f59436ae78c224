/*
 * transport.h - the interface every transport implements.
 *
 * A transport moves wire messages (a fixed header and an optional payload)
 * between two nodes.  It is a table of function pointers, chosen per
 * connection: TCP (tcp/) between any two nodes, IPC (ipc/) between a
 * worker and a server of one host; UCX (ucx/) where UNISUM_TRANSPORT
 * asks for it.  What the transports share (stream-socket
 * I/O, the handshake) is in stream.c.
 *
 * Threading contract: a connection has two independent directions.  At most
 * one thread sends on a connection at a time and at most one thread
 * receives at a time; the two may run concurrently.  All calls block; the
 * only way to unblock a receiver is conn_shutdown() from another thread.
 *
 * The non-blocking form (readiness).  A connection given to an event loop
 * (src/loop/conn.h) is made non-blocking with nb_fd(), and from then on
 * moved only with auth_nb(), recv_nb() and send_nb(): each goes as far as
 * the descriptor allows and returns TP_AGAIN where it would block, keeping
 * its place in a state the caller owns (struct tp_rx, tp_tx, auth_state), so
 * the next call, once epoll says the descriptor is ready, goes on from
 * there.  The zero-copy contracts below hold for it as well.
 *
 * Zero-copy contract: send() transmits straight from the caller's payload
 * buffer, which the caller may reuse as soon as send() returns.  A receiver
 * first reads the header with recv_header(), decides where the payload
 * belongs, then calls recv_payload() with that destination (for a PUSH the
 * key's buffer on the server, for a PULL_REPLY the user's output tensor on
 * the worker): the payload never lands in an intermediate buffer.
 */
#ifndef UNISUM_TRANSPORT_H
#define UNISUM_TRANSPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "transport/auth.h"
#include "wire/wire.h"

struct tp_listener;
struct tp_conn;

/* The non-blocking calls' answers beside 0 (done) and the errors. */
#define TP_AGAIN 1	/* no further until the descriptor is ready */
#define TP_HEADER 2	/* recv_nb: a header with a payload came: set rx->dst, call again */

/* A message being received (recv_nb).  The caller zeroes it for each new
 * message, reads hdr after TP_HEADER (or 0) and sets dst. */
struct tp_rx {
	struct wire_hdr hdr;	/* the message's header, payload_len its data's size */
	void *dst;		/* where its payload goes; NULL discards it */
	int stage;		/* the transport's: 0 header, 1 the IPC reference, 2 payload */
	size_t got;		/* ... bytes of this stage so far */
	uint8_t buf[WIRE_HDR_SIZE];
};

/* A message being sent (send_nb): the caller fills hdr and payload (which
 * stays unchanged until the send is done) and zeroes the rest. */
struct tp_tx {
	struct wire_hdr hdr;
	const void *payload;	/* hdr.payload_len bytes, or NULL */
	bool begun;		/* the transport's: head encoded, sent so far */
	size_t off;
	uint8_t head[WIRE_HDR_SIZE];
	uint64_t ref[3];	/* IPC: the data's address and guard, as sent */
};

struct transport_ops {
	const char *name;

	/* Listens on host:port (port 0 = a free port; the bound port goes to
	 * *port_out).  Returns 0 or a negative error. */
	int (*listen)(const char *host, int port, struct tp_listener **out, int *port_out);

	/* Blocks until a peer connects; 0 and a new connection,
	 * UNISUM_ESHUTDOWN once listener_close() was called, or UNISUM_ESYS
	 * (out of descriptors: the reason, naming RLIMIT_NOFILE, in
	 * log_last_error(), not logged). */
	int (*accept)(struct tp_listener *l, struct tp_conn **out);

	/* listener_shutdown() makes a blocked or later accept() return
	 * UNISUM_ESHUTDOWN; never blocks.  listener_free() closes and frees
	 * the listener once no accept() is running. */
	void (*listener_shutdown)(struct tp_listener *l);
	void (*listener_free)(struct tp_listener *l);

	/* Connects to host:port, retrying refused attempts until timeout_ms
	 * has passed, without the handshake: transport_connect() runs it
	 * blocking (authenticate), or the caller without blocking (auth_nb
	 * with a->connector set), so that one thread can shake hands with
	 * many peers at once.  0 and a connection, or a negative error. */
	int (*dial)(const char *host, int port, int timeout_ms, struct tp_conn **out);

	/* Sends `hdr` followed by hdr->payload_len bytes of `payload` (NULL
	 * when the length is 0).  Returns when everything was handed to the
	 * kernel: 0, or UNISUM_ECONN. */
	int (*send)(struct tp_conn *c, const struct wire_hdr *hdr, const void *payload);

	/* Runs one side of the handshake of the job secret (auth.h) on a
	 * fresh, blocking connection; a no-op when no secret is set.  0, or
	 * UNISUM_EAUTH with the reason in `why` (the caller closes the
	 * connection). */
	int (*authenticate)(struct tp_conn *c, bool connector, char *why, size_t why_len);

	/* Receives and validates (wire_decode) the next header.  0, or
	 * UNISUM_ECONN when the peer closed or the connection broke, or
	 * UNISUM_EPROTO with the reason in `why`. */
	int (*recv_header)(struct tp_conn *c, struct wire_hdr *hdr, char *why, size_t why_len);

	/* Receives exactly `len` payload bytes into `dst` (dst == NULL
	 * discards them).  0 or UNISUM_ECONN; the IPC transport also
	 * UNISUM_ESYS when it may not read the peer's memory (the reason in
	 * log_last_error()). */
	int (*recv_payload)(struct tp_conn *c, void *dst, size_t len);

	/* Wakes every thread blocked on the connection with UNISUM_ECONN and
	 * makes later calls fail.  Never blocks; safe from any thread. */
	void (*conn_shutdown)(struct tp_conn *c);

	/* Where the transport writes a receive's payload outside recv_nb
	 * (UCX's rendezvous, on its own thread): ends any such receive
	 * begun, waiting until nothing more is written into the caller's
	 * buffer, so that a closing connection's owner may let its buffers
	 * go.  Bounded; NULL for the transports that never do (TCP, IPC). */
	void (*conn_quiesce)(struct tp_conn *c);

	/* Frees the connection; no thread may be using it. */
	void (*conn_free)(struct tp_conn *c);

	/* "host:port" of the peer, for log lines; valid until conn_free. */
	const char *(*peer_name)(const struct tp_conn *c);

	/* ---- the non-blocking form (see the top of this file) ---- */

	/* The listener's descriptor, made non-blocking: readable when a peer
	 * waits to be accepted. */
	int (*listener_fd)(struct tp_listener *l);

	/* Accepts a waiting peer without blocking: 0 and a connection
	 * (already non-blocking), TP_AGAIN when none waits, or UNISUM_ESYS
	 * with the reason, naming the limit (RLIMIT_NOFILE) when descriptors
	 * ran out, in log_last_error() (not logged). */
	int (*accept_nb)(struct tp_listener *l, struct tp_conn **out);

	/* Makes the connection non-blocking; returns the descriptor whose
	 * readiness moves it. */
	int (*nb_fd)(struct tp_conn *c);

	/* Either side's handshake of the job secret (a->connector): 0 once
	 * done (at once with no secret), TP_AGAIN, or UNISUM_EAUTH with why. */
	int (*auth_nb)(struct tp_conn *c, struct auth_state *a, char *why, size_t len);

	/* Receives the next message into rx: TP_HEADER once its header is in
	 * (rx->hdr; the caller sets rx->dst and calls again), 0 once the whole
	 * message is (at once for one without payload), TP_AGAIN, or an error
	 * as recv_header() and recv_payload() give. */
	int (*recv_nb)(struct tp_conn *c, struct tp_rx *rx, char *why, size_t why_len);

	/* Sends tx: 0 once all of it is with the kernel, TP_AGAIN, or
	 * UNISUM_ECONN. */
	int (*send_nb)(struct tp_conn *c, struct tp_tx *tx);

	/* ---- registered memory (RDMA) ---- */

	/* Registers [p, p + len), memory its caller owns for long (a shared
	 * arena, a server's buffers of a key), once: payloads sent from it
	 * or received into it then use that registration instead of one made
	 * per message.  A failure is logged and leaves the memory as it was
	 * (still usable).  mem_unregister(p) before the memory is freed; an
	 * address never registered is ignored.  NULL for the transports that
	 * register nothing (TCP, IPC): see transport_mem_register(). */
	void (*mem_register)(void *p, size_t len);
	void (*mem_unregister)(void *p);

	/* Waits, at most timeout_ms, until the transport reads no payload
	 * lent to any of its connections any more (each sent, or cancelled by
	 * its connection's shutdown): a caller told that an operation failed
	 * calls it before letting that operation's buffers go, since a lent
	 * buffer freed and reused would reach the peer as the data.  How many
	 * are still read (0: none).  NULL where a payload
	 * is the transport's no longer once send returns (TCP) or the peer
	 * checks the sender's guard (IPC). */
	int (*lent_settle)(int timeout_ms);
};

/* tp's mem_register and mem_unregister, where it has them (tp may be
 * NULL). */
void transport_mem_register(const struct transport_ops *tp, void *p, size_t len);
void transport_mem_unregister(const struct transport_ops *tp, void *p);
/* tp's lent_settle where it has one (0 otherwise). */
int transport_lent_settle(const struct transport_ops *tp, int timeout_ms);

/* Dials host:port over tp and runs the connector's side of the handshake,
 * blocking: a connection ready for messages.  0, or a negative error
 * with the reason in log_last_error() (the connection is freed). */
int transport_connect(const struct transport_ops *tp, const char *host, int port, int timeout_ms,
		      struct tp_conn **out);

/* The TCP transport (a socket, blocking for the scheduler connection's
 * registration and the tests, served by a loop otherwise; see
 * transport/tcp/tcp.c). */
const struct transport_ops *transport_tcp(void);

/* The IPC transport, between processes of one host (one network
 * namespace): a Unix socket named after the listener's TCP address, with
 * the data of PUSH and PULL_REPLY passed by address and copied by the
 * receiver from the sender's memory (transport/ipc/ipc.c).  listen() and
 * dial() take the TCP host and port the listener's owner advertises.
 * Its send() of tensor data returns before the peer read it: the buffer
 * must stay unchanged until the protocol says the peer is done with it.
 * Its dial() fails without logging (the caller falls back to TCP). */
const struct transport_ops *transport_ipc(void);

/* The UCX transport (transport/ucx/): wire messages as UCP active
 * messages over whatever UCX picks (verbs, RoCE, TCP, shared memory),
 * libucp loaded at run time.  NULL, with the reason in why, when this
 * build or this machine has no UCX or it would not start.  Its send() of
 * tensor data lends the buffer as IPC's does. */
const struct transport_ops *transport_ucx(char *why, size_t len);

/* The transport UNISUM_TRANSPORT names ("tcp" or "ucx"): NULL, with the
 * reason (naming the variable) in why, when it is not there. */
const struct transport_ops *transport_named(const char *name, char *why, size_t len);

#endif /* UNISUM_TRANSPORT_H */
