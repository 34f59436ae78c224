/*
 * conn.h - a transport connection served by an event loop (loop.h): the
 * acceptor's handshake, then every message received and handed to its
 * owner, and a queue of messages to send, all moved by the transport's
 * non-blocking form (transport.h) as the descriptor becomes ready.
 *
 * Threading.  Receiving, the handshake and closing run on the loop's
 * thread.  loop_conn_send(), loop_conn_flush(), loop_conn_queued() and
 * loop_conn_shutdown() may be called from any thread.
 *
 * Back-pressure.  Sends are copied into the connection's queue, which
 * holds at most `cap` bytes (loop_conn_set_cap); a send beyond it is
 * refused (TP_AGAIN) and the owner decides: wait, drop, or close a peer
 * that does not read.  Nothing is buffered without bound.
 */
#ifndef UNISUM_LOOP_CONN_H
#define UNISUM_LOOP_CONN_H

#include <stdbool.h>
#include <stddef.h>

#include "loop/loop.h"
#include "transport/transport.h"

struct loop_conn;

struct loop_conn_ops {
	/* A header with a payload came (rx->hdr): set rx->dst, or leave it
	 * NULL to discard the payload.  0, or an error with why, which
	 * closes the connection.  When this is NULL the payload goes into a
	 * buffer of its own, which on_message gets and which is freed after
	 * it returns. */
	int (*on_header)(struct loop_conn *lc, struct tp_rx *rx, char *why, size_t len);
	/* A whole message: 0, or an error with why, which closes the
	 * connection. */
	int (*on_message)(struct loop_conn *lc, const struct wire_hdr *h, void *payload, char *why,
			  size_t len);
	/* The connection ended, once, on the loop's thread: UNISUM_ECONN (the
	 * peer closed or it broke), UNISUM_EPROTO or UNISUM_EAUTH with why,
	 * or what an on_ call returned.  It is no longer watched, but may
	 * still send a last word (loop_conn_send, loop_conn_flush) in this
	 * call; then it is shut.  The connection no longer calls its owner;
	 * the owner frees it (loop_conn_free) when it likes. */
	void (*on_closed)(struct loop_conn *lc, int rc, const char *why);
};

/* Serves connection c (of transport tp) on loop l: with `acceptor` it
 * first runs the acceptor's side of the job-secret handshake, which must
 * end within a few seconds.  On the loop's thread, or before it runs.  0
 * and *out, or an error (c is left to the caller). */
int loop_conn_new(struct loop *l, const struct transport_ops *tp, struct tp_conn *c,
		  bool acceptor, const struct loop_conn_ops *ops, void *arg, struct loop_conn **out);
/* Frees lc and its transport connection; after on_closed, or before or
 * after the loop runs. */
void loop_conn_free(struct loop_conn *lc);

void *loop_conn_arg(const struct loop_conn *lc);
struct tp_conn *loop_conn_tp(const struct loop_conn *lc);
const char *loop_conn_peer(const struct loop_conn *lc);

/* The most bytes (headers included) the send queue may hold; default
 * LOOP_CONN_CAP. */
#define LOOP_CONN_CAP (64u << 20)
void loop_conn_set_cap(struct loop_conn *lc, size_t cap);

/* Queues hdr and a copy of its payload (NULL when payload_len is 0), and
 * sends what the socket takes at once.  0, TP_AGAIN when the queue would
 * pass its cap (nothing queued), or UNISUM_ECONN / UNISUM_ENOMEM. */
int loop_conn_send(struct loop_conn *lc, const struct wire_hdr *hdr, const void *payload);
/* A message sent without a copy, embedded in its owner's structure: the
 * owner sets tx.hdr and tx.payload (zeroing the rest of tx), urgent and
 * release.  The payload stays as it is until release(m) is called, once,
 * on whatever thread sent the last of it or dropped it (the connection
 * closed), with no lock of the connection held. */
struct loop_conn_msg {
	struct tp_tx tx;
	bool urgent;		/* ahead of every queued message that is not urgent
				 * (behind the urgent ones, and behind one partly sent) */
	void (*release)(struct loop_conn_msg *m);
	size_t bytes;		/* the connection's */
	struct loop_conn_msg *next;
};

/* Queues m and sends what the socket takes at once.  The cap does not
 * apply: the owner bounds what it sends this way.  0, or UNISUM_ECONN
 * (closed: m was released). */
int loop_conn_send_msg(struct loop_conn *lc, struct loop_conn_msg *m);

/* Bytes queued and not yet with the kernel. */
size_t loop_conn_queued(struct loop_conn *lc);
/* Waits up to timeout_ms for the queue to go out (a last word before
 * hanging up).  0, UNISUM_ETIMEDOUT or UNISUM_ECONN. */
int loop_conn_flush(struct loop_conn *lc, int timeout_ms);
/* Hangs up: the loop then sees the end (on_closed); any thread. */
void loop_conn_shutdown(struct loop_conn *lc);
/* Closes lc now with rc and why (on_closed is called); the loop's
 * thread. */
void loop_conn_close(struct loop_conn *lc, int rc, const char *why);
/* Stops reading lc's messages until loop_conn_resume (from on_message:
 * the messages after this one wait, in order, while the owner waits for
 * something else); its end is still noticed.  The loop's thread. */
void loop_conn_pause(struct loop_conn *lc);
void loop_conn_resume(struct loop_conn *lc);

/* Whether it closed. */
bool loop_conn_closed(struct loop_conn *lc);

#endif /* UNISUM_LOOP_CONN_H */
