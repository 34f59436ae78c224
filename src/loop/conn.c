/*
 * conn.c - a transport connection served by an event loop (see conn.h).
 *
 * DESIGN.  The descriptor is watched for reading always and for writing
 * only while the send queue holds something.  A readable descriptor
 * gives up to LOOP_CONN_BURST messages a round (level-triggered: the
 * rest come next round, after the other connections had theirs).  A send
 * appends to the queue under `txlock` and, when the queue was empty,
 * writes at once from the sending thread, so a small message costs no
 * wake-up of the loop; only what the socket does not take waits for
 * EPOLLOUT.  Nothing goes out before the handshake is done.
 */
#include "loop/conn.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>

#include "log/log.h"
#include "timing/timing.h"
#include "unisum.h"

#define LOOP_CONN_BURST 16
#define LOOP_CONN_AUTH_MS 10000

/* A message loop_conn_send() copied. */
struct loop_conn_item {
	struct loop_conn_msg m;
	uint8_t data[];			/* the payload's copy */
};

struct loop_conn {
	struct loop *loop;
	const struct transport_ops *tp;
	struct tp_conn *c;
	const struct loop_conn_ops *ops;
	void *arg;
	struct loop_io io;
	struct loop_timer auth_timer;
	struct auth_state auth;
	bool authed;			/* the handshake is done (or was not needed) */
	struct tp_rx rx;		/* the message being received */
	void *own;			/* rx.dst when the connection owns it */
	pthread_mutex_t txlock;		/* everything below */
	struct loop_conn_msg *head, **tail;
	struct loop_conn_msg *last_urgent;	/* the last urgent one queued, or NULL */
	size_t queued, cap;
	bool want_out;			/* EPOLLOUT is watched */
	bool paused;			/* nothing is read (loop_conn_pause) */
	bool closed;			/* no more sends */
	bool closing;			/* loop_conn_close ran (the loop's thread) */
};

void *loop_conn_arg(const struct loop_conn *lc)
{
	return lc->arg;
}

struct tp_conn *loop_conn_tp(const struct loop_conn *lc)
{
	return lc->c;
}

const char *loop_conn_peer(const struct loop_conn *lc)
{
	return lc->tp->peer_name(lc->c);
}

void loop_conn_set_cap(struct loop_conn *lc, size_t cap)
{
	pthread_mutex_lock(&lc->txlock);
	lc->cap = cap;
	pthread_mutex_unlock(&lc->txlock);
}

static void conn_watch_out(struct loop_conn *lc);

/* Takes the first queued message off the queue.  txlock held. */
static struct loop_conn_msg *conn_pop(struct loop_conn *lc)
{
	struct loop_conn_msg *m = lc->head;
	lc->head = m->next;
	if (lc->head == NULL)
		lc->tail = &lc->head;
	if (lc->last_urgent == m)
		lc->last_urgent = NULL;
	lc->queued -= m->bytes;
	m->next = NULL;
	return m;
}

/* Releases the messages of a list (sent or dropped); no lock held. */
static void conn_release(struct loop_conn_msg *m)
{
	while (m != NULL) {
		struct loop_conn_msg *next = m->next;
		m->release(m);
		m = next;
	}
}

/* Sends queued messages until the socket is full: 0 (queue empty),
 * TP_AGAIN, or UNISUM_ECONN.  Those sent go onto *done, to be released
 * once txlock is let go.  txlock held. */
static int conn_push_out(struct loop_conn *lc, struct loop_conn_msg **done)
{
	while (lc->head != NULL && lc->authed) {
		int rc = lc->tp->send_nb(lc->c, &lc->head->tx);
		if (rc != 0)
			return rc;
		struct loop_conn_msg *m = conn_pop(lc);
		m->next = *done;
		*done = m;
	}
	return lc->head != NULL ? TP_AGAIN : 0;
}

/* Sends what is queued and watches EPOLLOUT for the rest; a broken
 * connection is shut (the loop then sees its end).  txlock held. */
static void conn_kick(struct loop_conn *lc, struct loop_conn_msg **done)
{
	if (conn_push_out(lc, done) == UNISUM_ECONN)
		lc->tp->conn_shutdown(lc->c);
	conn_watch_out(lc);
}

/* Watches EPOLLOUT while something waits to go.  txlock held. */
static void conn_watch_out(struct loop_conn *lc)
{
	bool want = lc->head != NULL && lc->authed && !lc->closed;
	if (want == lc->want_out || lc->closed || lc->io.loop == NULL)
		return;
	lc->want_out = want;
	loop_io_set(&lc->io, (lc->paused ? 0 : EPOLLIN) | (want ? EPOLLOUT : 0));
}

/* Stops or resumes reading: txlock for the watch. */
static void conn_set_paused(struct loop_conn *lc, bool paused)
{
	pthread_mutex_lock(&lc->txlock);
	lc->paused = paused;
	if (!lc->closed && lc->io.loop != NULL)
		loop_io_set(&lc->io, (paused ? 0 : EPOLLIN) | (lc->want_out ? EPOLLOUT : 0));
	pthread_mutex_unlock(&lc->txlock);
}

void loop_conn_pause(struct loop_conn *lc)
{
	conn_set_paused(lc, true);
}

void loop_conn_resume(struct loop_conn *lc)
{
	conn_set_paused(lc, false);
}

/* Queues m: an urgent one behind the urgent ones queued (ahead of the
 * rest, but never ahead of a message partly sent), any other at the end.
 * txlock held. */
static void conn_enqueue(struct loop_conn *lc, struct loop_conn_msg *m)
{
	m->bytes = WIRE_HDR_SIZE + (m->tx.payload != NULL ? m->tx.hdr.payload_len : 0);
	lc->queued += m->bytes;
	struct loop_conn_msg **at = lc->tail;
	if (m->urgent) {
		if (lc->last_urgent != NULL)
			at = &lc->last_urgent->next;
		else if (lc->head != NULL && lc->head->tx.begun)
			at = &lc->head->next;
		else
			at = &lc->head;
		lc->last_urgent = m;
	}
	m->next = *at;
	*at = m;
	if (m->next == NULL)
		lc->tail = &m->next;
}

static void conn_item_free(struct loop_conn_msg *m)
{
	free(m);	/* the item: m is its first member */
}

int loop_conn_send(struct loop_conn *lc, const struct wire_hdr *hdr, const void *payload)
{
	size_t plen = payload != NULL ? hdr->payload_len : 0;
	size_t bytes = WIRE_HDR_SIZE + plen;
	pthread_mutex_lock(&lc->txlock);
	bool full = lc->queued + bytes > lc->cap && lc->queued > 0;
	pthread_mutex_unlock(&lc->txlock);
	if (full)
		return TP_AGAIN;
	struct loop_conn_item *it = malloc(sizeof *it + plen);
	if (it == NULL)
		return UNISUM_ENOMEM;
	memset(&it->m, 0, sizeof it->m);
	it->m.tx.hdr = *hdr;
	if (plen > 0)
		memcpy(it->data, payload, plen);
	it->m.tx.payload = plen > 0 ? it->data : NULL;
	it->m.release = conn_item_free;
	return loop_conn_send_msg(lc, &it->m);
}

int loop_conn_send_msg(struct loop_conn *lc, struct loop_conn_msg *m)
{
	struct loop_conn_msg *done = NULL;
	int rc = 0;
	m->next = NULL;
	pthread_mutex_lock(&lc->txlock);
	if (lc->closed) {
		rc = UNISUM_ECONN;
		done = m;
	} else {
		conn_enqueue(lc, m);
		conn_kick(lc, &done);
	}
	pthread_mutex_unlock(&lc->txlock);
	conn_release(done);
	return rc;
}

size_t loop_conn_queued(struct loop_conn *lc)
{
	pthread_mutex_lock(&lc->txlock);
	size_t n = lc->queued;
	pthread_mutex_unlock(&lc->txlock);
	return n;
}

int loop_conn_flush(struct loop_conn *lc, int timeout_ms)
{
	int64_t until = timing_now_ms() + timeout_ms;
	struct loop_conn_msg *done = NULL;
	pthread_mutex_lock(&lc->txlock);
	int rc;
	while ((rc = lc->closed ? UNISUM_ECONN : conn_push_out(lc, &done)) == TP_AGAIN) {
		int64_t left = until - timing_now_ms();
		if (left <= 0 || !lc->authed) {
			rc = UNISUM_ETIMEDOUT;
			break;
		}
		struct pollfd p = {.fd = lc->io.fd, .events = POLLOUT};
		poll(&p, 1, (int)left);
	}
	pthread_mutex_unlock(&lc->txlock);
	conn_release(done);
	return rc;
}

void loop_conn_shutdown(struct loop_conn *lc)
{
	lc->tp->conn_shutdown(lc->c);
}

bool loop_conn_closed(struct loop_conn *lc)
{
	pthread_mutex_lock(&lc->txlock);
	bool closed = lc->closed;
	pthread_mutex_unlock(&lc->txlock);
	return closed;
}

void loop_conn_close(struct loop_conn *lc, int rc, const char *why)
{
	if (lc->closing)
		return;
	lc->closing = true;
	/* A receive the transport writes on its own (UCX) ends before the
	 * buffer it names (lc->own, or the owner's, let go in on_closed). */
	if (lc->tp->conn_quiesce != NULL)
		lc->tp->conn_quiesce(lc->c);
	pthread_mutex_lock(&lc->txlock);	/* a sender's conn_watch_out */
	loop_io_del(&lc->io);
	pthread_mutex_unlock(&lc->txlock);
	loop_timer_stop(lc->loop, &lc->auth_timer);
	free(lc->own);
	lc->own = NULL;
	/* Its owner may still say a last word (loop_conn_send, then
	 * loop_conn_flush) before the connection is shut. */
	if (lc->ops->on_closed != NULL)
		lc->ops->on_closed(lc, rc, why);
	pthread_mutex_lock(&lc->txlock);
	lc->closed = true;
	struct loop_conn_msg *left = lc->head;	/* never to go out */
	lc->head = lc->last_urgent = NULL;
	lc->tail = &lc->head;
	lc->queued = 0;
	pthread_mutex_unlock(&lc->txlock);
	conn_release(left);
	lc->tp->conn_shutdown(lc->c);
}

/* A message's header came: where its payload goes.  0 or an error. */
static int conn_place(struct loop_conn *lc, char *why, size_t len)
{
	if (lc->ops->on_header != NULL)
		return lc->ops->on_header(lc, &lc->rx, why, len);
	lc->own = malloc(lc->rx.hdr.payload_len);
	if (lc->own == NULL) {
		snprintf(why, len, "out of memory for a %llu-byte payload",
			 (unsigned long long)lc->rx.hdr.payload_len);
		return UNISUM_ENOMEM;
	}
	lc->rx.dst = lc->own;
	return 0;
}

/* Receives up to LOOP_CONN_BURST whole messages (a message begun is
 * finished: over IPC its data is read from the peer's memory, and the
 * socket may not become readable again): 0 (come back when readable), or
 * the error that ends the connection, with why. */
static int conn_receive(struct loop_conn *lc, char *why, size_t len)
{
	for (int n = 0; n < LOOP_CONN_BURST;) {
		int rc = lc->tp->recv_nb(lc->c, &lc->rx, why, len);
		/* Its payload next, in this round: over IPC it is not on the
		 * socket, which may not be readable again. */
		if (rc == TP_HEADER && (rc = conn_place(lc, why, len)) == 0)
			continue;
		if (rc == TP_AGAIN)
			return 0;
		if (rc != 0)
			return rc;
		struct wire_hdr h = lc->rx.hdr;
		void *payload = lc->rx.dst, *own = lc->own;
		memset(&lc->rx, 0, sizeof lc->rx);
		lc->own = NULL;
		rc = lc->ops->on_message(lc, &h, payload, why, len);
		free(own);
		n++;
		if (rc != 0)
			return rc;
		if (lc->closing || lc->paused)	/* the owner closed it, or waits */
			return 0;
	}
	return 0;
}

/* The acceptor's handshake: 0 when done, TP_AGAIN, or UNISUM_EAUTH. */
static int conn_authenticate(struct loop_conn *lc, char *why, size_t len)
{
	int rc = lc->tp->auth_nb(lc->c, &lc->auth, why, len);
	if (rc != 0)
		return rc;
	loop_timer_stop(lc->loop, &lc->auth_timer);
	struct loop_conn_msg *done = NULL;
	pthread_mutex_lock(&lc->txlock);
	lc->authed = true;
	conn_kick(lc, &done);
	pthread_mutex_unlock(&lc->txlock);
	conn_release(done);
	return 0;
}

static void conn_ready(struct loop_io *io, uint32_t events)
{
	struct loop_conn *lc = io->arg;
	char why[512] = "";
	int rc = 0;
	if (!lc->authed)
		rc = conn_authenticate(lc, why, sizeof why);
	if (rc == 0 && lc->authed && (events & EPOLLOUT)) {
		struct loop_conn_msg *done = NULL;
		pthread_mutex_lock(&lc->txlock);
		conn_kick(lc, &done);
		pthread_mutex_unlock(&lc->txlock);
		conn_release(done);
	}
	/* A paused connection still hears of its end (HUP is always
	 * reported): reading then finds it. */
	if (rc == 0 && lc->authed && (events & (EPOLLHUP | EPOLLERR | (lc->paused ? 0 : EPOLLIN))))
		rc = conn_receive(lc, why, sizeof why);
	if (rc == TP_AGAIN)
		rc = 0;
	if (rc != 0)
		loop_conn_close(lc, rc, why);
}

static void conn_auth_late(struct loop_timer *t)
{
	struct loop_conn *lc = t->arg;
	char why[128];
	snprintf(why, sizeof why, "no answer to the authentication challenge within %d s",
		 LOOP_CONN_AUTH_MS / 1000);
	loop_conn_close(lc, UNISUM_EAUTH, why);
}

int loop_conn_new(struct loop *l, const struct transport_ops *tp, struct tp_conn *c,
		  bool acceptor, const struct loop_conn_ops *ops, void *arg, struct loop_conn **out)
{
	struct loop_conn *lc = calloc(1, sizeof *lc);
	if (lc == NULL)
		return UNISUM_ENOMEM;
	lc->loop = l;
	lc->tp = tp;
	lc->c = c;
	lc->ops = ops;
	lc->arg = arg;
	lc->cap = LOOP_CONN_CAP;
	lc->tail = &lc->head;
	lc->auth_timer.slot = -1;
	lc->authed = !acceptor;
	pthread_mutex_init(&lc->txlock, NULL);
	int rc = loop_io_add(l, &lc->io, tp->nb_fd(c), EPOLLIN, conn_ready, lc);
	if (rc != 0) {
		pthread_mutex_destroy(&lc->txlock);
		free(lc);
		return rc;
	}
	if (acceptor) {
		loop_timer_start(l, &lc->auth_timer, LOOP_CONN_AUTH_MS, 0, conn_auth_late, lc);
		/* The challenge goes out now: the peer speaks only after it. */
		char why[256] = "";
		if (conn_authenticate(lc, why, sizeof why) == UNISUM_EAUTH)
			tp->conn_shutdown(c);
	}
	*out = lc;
	return 0;
}

void loop_conn_free(struct loop_conn *lc)
{
	if (lc == NULL)
		return;
	if (lc->io.loop != NULL)
		loop_io_del(&lc->io);
	loop_timer_stop(lc->loop, &lc->auth_timer);
	struct loop_conn_msg *left = lc->head;
	lc->head = NULL;
	conn_release(left);
	free(lc->own);
	lc->tp->conn_free(lc->c);
	pthread_mutex_destroy(&lc->txlock);
	free(lc);
}
