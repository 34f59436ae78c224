/*
 * ucx.c - the UCX transport: wire messages as UCP active messages, so
 * that one code path runs over InfiniBand, RoCE, TCP and shared memory,
 * whichever UCX picks (UCX_TLS, UCX_NET_DEVICES, UCX_RNDV_THRESH pass
 * through as UCX reads them).
 *
 * DESIGN.  A message is one active message: its AM header carries a kind
 * (HELLO, AUTH, WIRE), for WIRE a sequence number and the wire header,
 * and its data is the payload.  Large payloads go by UCX's rendezvous:
 * the receiver learns the header first (the AM callback keeps the
 * descriptor), the caller says where the payload belongs (TP_HEADER, as
 * on TCP), and ucp_am_recv_data_nbx() brings the data straight there.
 * Smaller ones arrive whole and are copied once.  Connections are made
 * from the workers' addresses, exchanged over a TCP socket of ours
 * (ucx_connect.c), with peer error handling on, so a peer that dies
 * breaks the connection as a reset socket would; one that closes says
 * BYE first, as UCX does not tell it.
 *
 * Readiness.  The loops watch descriptors; UCX has one for each of its
 * workers, which its progress thread (ucx_api.c) watches.  So each
 * connection has an eventfd: the progress thread's callbacks queue what
 * arrives and signal it; recv_nb() takes from the queue and, when nothing
 * is ready, clears it.  Sends never wait for the descriptor: UCX takes
 * every send at once (send_nb returns 0 or an error), queueing what the
 * wire does not take yet.
 *
 * Lending.  As over IPC, the tensor data of PUSH and PULL_REPLY is lent,
 * not copied: send() returns before UCX has read it, and the protocol
 * keeps it unchanged until the peer answered (transport.h).  Every other
 * payload is copied for its send.  A connection shut forces its endpoint
 * closed, which cancels what it had not sent; conn_free() waits for that.
 *
 * Locks.  No UCX call is made with a connection's lock held: the progress
 * thread holds UCX's worker lock while it runs the callbacks that take it.
 */
#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "log/log.h"
#include "timing/timing.h"
#include "transport/stream.h"
#include "transport/ucx/ucx_int.h"
#include "unisum.h"

#define UCX_INLINE_MAX 8192	/* a payload up to this is copied in the callback */
#define UCX_PRE_AUTH_MSGS 4096	/* WIRE queued before the handshake ended, at most */
#define UCX_PRE_AUTH_BYTES (256u << 20)
#define UCX_LAST_WORD_MS 200	/* a closing connection's copied sends may take this long */
#define UCX_QUIESCE_MS 10000	/* a receive begun ends within this when its link is shut */


struct tp_conn {
	struct ucx_ctx *u;
	ucp_worker_h worker;		/* the accepting one, or (own) the dial's */
	bool own_worker;
	ucp_ep_h ep;
	int evfd;			/* readable while something is ready */
	char peer[96];
	pthread_mutex_t lock;		/* below */
	pthread_cond_t cond;		/* hello, inflight, close_done */
	struct ucx_msg *rxq;		/* WIRE received, by sequence */
	struct ucx_msg *cur;		/* the one recv_nb is on */
	uint64_t rx_next;
	uint64_t tx_handed;		/* WIRE messages handed to UCX (its thread's) */
	uint64_t rx_arrived;		/* WIRE messages queued so far */
	uint64_t bye_after;		/* the peer closed after this many (bye) */
	bool bye;
	int inflight;			/* sends UCX has not finished, */
	int copies_inflight;		/* ... of them with a copied payload (a last word) */
	bool hello, broken, shut, close_done, signaled, auth_new;
	bool authed;			/* the handshake is done: WIRE counts from now */
	bool broken_by_peer;		/* UCX reported the peer lost */
	bool acceptor;			/* made by a listener */
	const struct auth_state *auth;	/* the handshake auth_nb moves, meanwhile */
	size_t pre_msgs, pre_bytes;	/* WIRE queued before it (bounded) */
	char why[512];			/* broken's reason */
	uint8_t auth_in[AUTH_MAX_READ];	/* the handshake's bytes from the peer */
	size_t auth_len, auth_off;
	struct ucx_cmd close_cmd;
	struct tp_rx brx;		/* the blocking receive's message, */
	uint8_t *bstage;		/* ... its payload when read in parts */
	size_t bgot;			/* ... and how much of it was read */
};

/* A send UCX holds: the AM header, and a copy of the payload unless it
 * is lent. */
struct ucx_sreq {
	struct ucx_cmd cmd;
	struct tp_conn *c;
	uint8_t head[UCX_WIRE_HEAD];
	size_t hlen;
	const void *payload;
	size_t len;
	bool lent;			/* payload is the caller's (transport.h) */
	unsigned lent_half;		/* ... counted there (ucx_lent_begin) */
	uint8_t data[];
};

/* ---- readiness ------------------------------------------------------------- */

static bool conn_ready(const struct tp_conn *c)
{
	if (c->broken)
		return true;
	if (!c->authed)
		return c->auth_new;
	if (c->cur != NULL)
		return c->cur->how != UCX_DATA_RNDV || !c->cur->posted || c->cur->done;
	return c->rxq != NULL && c->rxq->seq == c->rx_next;
}

/* Makes the eventfd readable.  Lock held. */
static void conn_signal(struct tp_conn *c)
{
	if (c->signaled)
		return;
	uint64_t one = 1;
	if (write(c->evfd, &one, sizeof one) == sizeof one)
		c->signaled = true;
}

/* Clears the eventfd when nothing is ready.  Lock held. */
static void conn_rearm(struct tp_conn *c)
{
	uint64_t n;
	if (c->signaled && !conn_ready(c) && read(c->evfd, &n, sizeof n) == sizeof n)
		c->signaled = false;
}

/* Breaks the connection with why (the first reason stays).  Lock held. */
static void conn_break(struct tp_conn *c, const char *why)
{
	if (!c->broken)
		snprintf(c->why, sizeof c->why, "%s", why);
	c->broken = true;
	pthread_cond_broadcast(&c->cond);
	conn_signal(c);
}

static void ucx_on_error(void *arg, ucp_ep_h ep, ucs_status_t status)
{
	(void)ep;
	struct tp_conn *c = arg;
	char why[512];
	snprintf(why, sizeof why, "UCX lost the connection to %s: %s", c->peer,
		 ucx_fn.ucs_status_string(status));
	pthread_mutex_lock(&c->lock);
	c->broken_by_peer = true;
	conn_break(c, why);
	pthread_mutex_unlock(&c->lock);
}

/* ---- receiving ----------------------------------------------------------- */

/* Puts m into c: a HELLO or the handshake's bytes at once, a WIRE
 * message in its place by sequence.  From the AM callback or when c
 * adopts its orphans; false when c no longer takes messages (the caller
 * drops m). */
static bool conn_take(struct tp_conn *c, struct ucx_msg *m)
{
	pthread_mutex_lock(&c->lock);
	bool took = !c->shut;
	if (!took) {
	} else if (m->kind == UCX_BYE) {
		/* The break waits for the WIRE messages sent before it (m->seq
		 * of them), which are read before it, as a socket's data
		 * before its end. */
		c->bye = true;
		c->bye_after = m->seq;
		took = false;
	} else if (m->kind == UCX_HELLO) {
		c->hello = true;
		pthread_cond_broadcast(&c->cond);
		took = false;
	} else if (m->kind == UCX_AUTH && c->authed) {
		conn_break(c, auth_is_enabled()
				      ? "the peer sent a second handshake"
				      : "the peer asks for the job secret (UNISUM_SECRET), which this node "
					"does not set");
		took = false;
	} else if (m->kind == UCX_AUTH) {
		if (c->auth_len + m->len > sizeof c->auth_in)
			conn_break(c, "the peer's handshake is longer than any handshake");
		else
			memcpy(c->auth_in + c->auth_len, m->data, m->len);
		c->auth_len += m->len;
		c->auth_new = true;
		took = false;
	} else if (!c->authed && c->acceptor && auth_is_enabled()) {
		/* Nothing may come before the connector's answer. */
		conn_break(c, "the peer sent a message before the handshake: is UNISUM_SECRET set "
			      "on every node of the job (and only there)?");
		took = false;
	} else if (!c->authed && (++c->pre_msgs > UCX_PRE_AUTH_MSGS ||
				   (c->pre_bytes += m->len) > UCX_PRE_AUTH_BYTES)) {
		conn_break(c, "the peer sent too much before the handshake ended");
		took = false;
	} else {
		struct ucx_msg **p = &c->rxq;
		while (*p != NULL && (*p)->seq < m->seq)
			p = &(*p)->next;
		m->next = *p;
		*p = m;
		c->rx_arrived++;
	}
	if (c->bye && c->rx_arrived >= c->bye_after) {
		c->broken_by_peer = true;
		conn_break(c, "the peer closed the connection");
	}
	if (!c->shut)
		conn_signal(c);
	pthread_mutex_unlock(&c->lock);
	return took;
}

static void conn_adopt(struct tp_conn *c, struct ucx_msg *m)
{
	if (!conn_take(c, m))
		ucx_msg_free(m);
}

/* Builds the message of an AM: NULL when its header is malformed or
 * memory ran out. */
static struct ucx_msg *msg_new(const void *header, size_t hlen, void *data, size_t len,
			       const ucp_am_recv_param_t *param)
{
	const uint8_t *h = header;
	uint32_t kind;
	uint64_t seq;
	if (hlen < UCX_HEAD)
		return NULL;
	memcpy(&kind, h, 4);
	memcpy(&seq, h + 8, 8);
	kind = le32toh(kind);
	if (kind < UCX_HELLO || kind > UCX_BYE || hlen != (kind == UCX_WIRE ? UCX_WIRE_HEAD : UCX_HEAD))
		return NULL;
	bool rndv = param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV;
	bool keep = !rndv && len > UCX_INLINE_MAX && (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_DATA);
	bool copy = !rndv && !keep && len > 0;
	if (kind != UCX_WIRE && (rndv || keep))
		return NULL;	/* a handshake is small */
	struct ucx_msg *m = calloc(1, sizeof *m + (copy ? len : 0));
	if (m == NULL)
		return NULL;
	m->kind = kind;
	m->seq = le64toh(seq);
	if (kind == UCX_WIRE)
		memcpy(m->head, h + UCX_HEAD, WIRE_HDR_SIZE);
	m->len = len;
	m->how = rndv ? UCX_DATA_RNDV : keep ? UCX_DATA_KEPT : copy ? UCX_DATA_INLINE : UCX_DATA_NONE;
	m->data = copy ? m->inline_data : (rndv || keep) ? data : NULL;
	if (copy)
		memcpy(m->inline_data, data, len);
	return m;
}

ucs_status_t ucx_on_am(void *arg, const void *header, size_t header_length, void *data,
		       size_t length, const ucp_am_recv_param_t *param)
{
	if (!(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) || param->reply_ep == NULL)
		return UCS_OK;	/* every sender asks for the reply endpoint */
	struct ucx_msg *m = msg_new(header, header_length, data, length, param);
	if (m != NULL)
		m->worker = arg;	/* (ucx_worker_make) */
	bool kept = m != NULL && (m->how == UCX_DATA_RNDV || m->how == UCX_DATA_KEPT);
	struct tp_conn *c = ucx_map_find_or_park(param->reply_ep, m);
	if (c == NULL)
		return m != NULL && kept ? UCS_INPROGRESS : UCS_OK;	/* parked, or dropped */
	if (m == NULL) {
		pthread_mutex_lock(&c->lock);
		conn_break(c, "a malformed message (its UCX header)");
		pthread_mutex_unlock(&c->lock);
		return UCS_OK;
	}
	if (conn_take(c, m))
		return kept ? UCS_INPROGRESS : UCS_OK;
	free(m);	/* not kept by us: UCX drops what it lent */
	return UCS_OK;
}

static void ucx_recv_done(void *request, ucs_status_t status, size_t length, void *user_data)
{
	(void)length;
	struct ucx_msg *m = user_data;
	struct tp_conn *c = m->owner;
	pthread_mutex_lock(&c->lock);
	m->done = true;
	m->status = status;
	m->req = NULL;
	pthread_cond_broadcast(&c->cond);
	conn_signal(c);
	pthread_mutex_unlock(&c->lock);
	ucx_fn.ucp_request_free(request);
}

static void ucx_do_recv(struct ucx_cmd *cmd)
{
	struct ucx_msg *m = (struct ucx_msg *)((char *)cmd - offsetof(struct ucx_msg, cmd));
	struct tp_conn *c = m->owner;
	ucp_request_param_t p = {
		.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
		.cb.recv_am = ucx_recv_done, .user_data = m};
	if ((p.memh = ucx_mem_find(m->dst, m->len)) != NULL)
		p.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
	ucs_status_ptr_t r = ucx_fn.ucp_am_recv_data_nbx(c->worker, m->data, m->dst, m->len, &p);
	pthread_mutex_lock(&c->lock);
	if (r != NULL && !UCS_PTR_IS_ERR(r)) {
		if (!m->done)
			m->req = r;	/* ucx_recv_done ends it; a quiesce may cancel it */
		pthread_mutex_unlock(&c->lock);
		return;
	}
	m->done = true;
	m->status = UCS_PTR_STATUS(r);
	pthread_cond_broadcast(&c->cond);
	conn_signal(c);
	pthread_mutex_unlock(&c->lock);
}

/* Brings a rendezvous payload to dst (UCX puts it there).  Lock held;
 * the receiving thread owns m. */
static void conn_post_rndv(struct tp_conn *c, struct ucx_msg *m, void *dst)
{
	m->owner = c;
	m->dst = dst;
	m->posted = true;
	m->cmd.fn = ucx_do_recv;
	ucx_post(c->u, &m->cmd);
}

/* recv_nb's first stage: the next message's header.  Lock held. */
static int conn_recv_head(struct tp_conn *c, struct tp_rx *rx, char *why, size_t why_len)
{
	if (c->cur == NULL && c->rxq != NULL && c->rxq->seq == c->rx_next) {
		c->cur = c->rxq;
		c->rxq = c->cur->next;
		c->rx_next++;
	}
	if (c->cur == NULL) {
		if (c->broken)
			return UNISUM_ECONN;
		conn_rearm(c);
		return TP_AGAIN;
	}
	int rc = wire_decode(c->cur->head, &rx->hdr, why, why_len);
	if (rc == 0 && rx->hdr.payload_len != c->cur->len) {
		snprintf(why, why_len, "a message of %llu payload bytes carried %zu",
			 (unsigned long long)rx->hdr.payload_len, c->cur->len);
		rc = UNISUM_EPROTO;
	}
	if (rc != 0)
		return rc;
	rx->stage = 2;
	return c->cur->len > 0 ? TP_HEADER : 0;
}

static int ucx_recv_nb(struct tp_conn *c, struct tp_rx *rx, char *why, size_t why_len)
{
	struct ucx_msg *m = NULL;
	pthread_mutex_lock(&c->lock);
	int rc = rx->stage == 0 ? conn_recv_head(c, rx, why, why_len) : 0;
	if (rc == 0 && c->cur->how == UCX_DATA_RNDV && !c->cur->posted && rx->dst != NULL)
		conn_post_rndv(c, c->cur, rx->dst);
	if (rc == 0) {
		m = c->cur;
		if (m->how == UCX_DATA_RNDV && m->posted && !m->done) {
			/* (A broken link's receive may never end: its buffer is
			 * the caller's until conn_quiesce.) */
			rc = c->broken ? UNISUM_ECONN : TP_AGAIN;
			if (!c->broken)
				conn_rearm(c);
			m = NULL;
		} else if (m->how == UCX_DATA_RNDV && m->posted && m->status != UCS_OK) {
			char lost[512];
			snprintf(lost, sizeof lost, "UCX lost a message's data from %s: %s", c->peer,
				 ucx_fn.ucs_status_string(m->status));
			conn_break(c, lost);
			rc = UNISUM_ECONN;
		}
		if (m != NULL)
			c->cur = NULL;
	}
	pthread_mutex_unlock(&c->lock);
	if (m != NULL && rc == 0 && m->how != UCX_DATA_RNDV && rx->dst != NULL && m->len > 0)
		memcpy(rx->dst, m->data, m->len);
	ucx_msg_free(m);	/* UCX's part goes back to it (no lock held) */
	return rc;
}

/* ---- sending --------------------------------------------------------------- */

static void ucx_send_done(void *request, ucs_status_t status, void *user_data)
{
	struct ucx_sreq *s = user_data;
	struct tp_conn *c = s->c;
	pthread_mutex_lock(&c->lock);
	if (status != UCS_OK && status != UCS_ERR_CANCELED) {
		char why[512];
		snprintf(why, sizeof why, "UCX could not send to %s: %s", c->peer,
			 ucx_fn.ucs_status_string(status));
		conn_break(c, why);
	}
	c->inflight--;
	c->copies_inflight -= !s->lent;
	if (s->lent)
		ucx_lent_end(s->lent_half);
	pthread_cond_broadcast(&c->cond);
	pthread_mutex_unlock(&c->lock);
	free(s);
	if (request != NULL)
		ucx_fn.ucp_request_free(request);
}

static void ucx_do_send(struct ucx_cmd *cmd)
{
	struct ucx_sreq *s = (struct ucx_sreq *)((char *)cmd - offsetof(struct ucx_sreq, cmd));
	ucp_request_param_t p = {
		.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
				UCP_OP_ATTR_FIELD_FLAGS,
		.flags = UCP_AM_SEND_FLAG_REPLY, .cb.send = ucx_send_done, .user_data = s};
	/* A lent buffer is not handed to UCX once its connection is shut:
	 * its owner lets it go then (a job that failed).  Chaos over UCX saw
	 * a survivor get a sum with a failed worker's freed input, the send
	 * having waited in this thread's queue past the shutdown.  (Not
	 * under the lock across the UCX call: a send towards a dead peer can
	 * take seconds in UCX, and a failover's shutdown, on the thread that
	 * sends the heartbeats, then waited that long.)  What UCX holds
	 * already, the close cancels.  A copy (a last word) still goes. */
	struct tp_conn *c = s->c;
	pthread_mutex_lock(&c->lock);
	bool drop = c->shut && s->lent;
	pthread_mutex_unlock(&c->lock);
	/* A WIRE message's number, and BYE's count of them, are the
	 * messages handed to UCX (this thread's, in posting order): one
	 * dropped leaves no gap that would hold back a last word behind it. */
	uint32_t kind;
	memcpy(&kind, s->head, 4);
	kind = le32toh(kind);
	uint64_t n = htole64(c->tx_handed);
	if (kind == UCX_BYE || (kind == UCX_WIRE && !drop))
		memcpy(s->head + 8, &n, 8);
	ucs_status_ptr_t r = UCS_STATUS_PTR(UCS_ERR_CANCELED);
	if (!drop) {
		if (s->lent && (p.memh = ucx_mem_find(s->payload, s->len)) != NULL)
			p.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;	/* registered once (ucx_mem.c) */
		r = ucx_fn.ucp_am_send_nbx(c->ep, UCX_AM_ID, s->head, s->hlen, s->payload, s->len, &p);
	}
	if (kind == UCX_WIRE && !drop && !UCS_PTR_IS_ERR(r))
		c->tx_handed++;
	if (r == NULL || UCS_PTR_IS_ERR(r))
		ucx_send_done(NULL, UCS_PTR_STATUS(r), s);
}

/* Whether a message's payload is lent (tensor data, as IPC lends it). */
static bool ucx_lends(const struct wire_hdr *h, const void *payload)
{
	return (h->type == WIRE_PUSH || h->type == WIRE_PULL_REPLY) && payload != NULL &&
	       h->payload_len > 0 && !(h->flags & (WIRE_FLAG_ZERO | WIRE_FLAG_COMPRESSED));
}

/* Sends one AM of kind (hdr: WIRE's header, else NULL) with len bytes of
 * payload, lent or copied: 0 or UNISUM_ECONN.  The send is made on the
 * UCX thread, in the order of the calls; a failure there breaks c. */
int ucx_conn_send(struct tp_conn *c, uint32_t kind, const struct wire_hdr *hdr,
		     const void *payload, size_t len, bool lend)
{
	struct ucx_sreq *s = malloc(sizeof *s + (lend ? 0 : len));
	if (s == NULL)
		return UNISUM_ECONN;
	s->c = c;
	memset(s->head, 0, UCX_HEAD);
	uint32_t k = htole32(kind);
	memcpy(s->head, &k, 4);
	s->hlen = kind == UCX_WIRE ? UCX_WIRE_HEAD : UCX_HEAD;
	s->payload = lend || len == 0 ? payload : s->data;
	s->len = len;
	s->lent = lend && len > 0;
	if (!lend && len > 0)
		memcpy(s->data, payload, len);
	s->cmd.fn = ucx_do_send;
	s->cmd.sync = false;
	pthread_mutex_lock(&c->lock);
	if (c->broken || c->shut) {
		pthread_mutex_unlock(&c->lock);
		free(s);
		return UNISUM_ECONN;
	}
	if (kind == UCX_WIRE)
		wire_encode(hdr, s->head + UCX_HEAD);	/* (its number: ucx_do_send) */
	c->inflight++;
	c->copies_inflight += !s->lent;
	if (s->lent)
		s->lent_half = ucx_lent_begin();
	ucx_post(c->u, &s->cmd);	/* under c->lock: ahead of the close */
	pthread_mutex_unlock(&c->lock);
	return 0;
}

static int ucx_send_nb(struct tp_conn *c, struct tp_tx *tx)
{
	size_t len = tx->payload != NULL ? tx->hdr.payload_len : 0;
	return ucx_conn_send(c, UCX_WIRE, &tx->hdr, tx->payload, len, ucx_lends(&tx->hdr, tx->payload));
}

static int ucx_send(struct tp_conn *c, const struct wire_hdr *hdr, const void *payload)
{
	struct tp_tx tx = {.hdr = *hdr, .payload = payload};
	return ucx_send_nb(c, &tx);
}

/* ---- connections ------------------------------------------------------------ */


/* A connection, holding its own reference to the context (which the
 * caller holds already): NULL when memory or descriptors ran out. */
struct tp_conn *ucx_conn_new(void)
{
	struct tp_conn *c = calloc(1, sizeof *c);
	if (c == NULL)
		return NULL;
	c->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (c->evfd < 0) {
		free(c);
		return NULL;
	}
	char ignored[8];
	c->u = ucx_ctx_get(ignored, sizeof ignored);
	pthread_mutex_init(&c->lock, NULL);
	timing_cond_init(&c->cond);	/* timed waits on the monotonic clock */
	return c;
}

struct ucx_ep_cmd {
	struct ucx_cmd cmd;
	struct tp_conn *c;
	ucp_ep_params_t *params;
	ucs_status_t status;
};

static void ucx_do_ep_create(struct ucx_cmd *cmd)
{
	struct ucx_ep_cmd *e = (struct ucx_ep_cmd *)cmd;
	e->status = ucx_fn.ucp_ep_create(e->c->worker, e->params, &e->c->ep);
}

struct ucx_ctx *ucx_conn_ctx(struct tp_conn *c)
{
	return c->u;
}

void ucx_conn_set_worker(struct tp_conn *c, ucp_worker_h w, bool own, bool acceptor,
			 const char *peer)
{
	c->worker = w;
	c->own_worker = own;
	c->acceptor = acceptor;
	if (peer != NULL)
		snprintf(c->peer, sizeof c->peer, "%.90s", peer);
}

/* Makes c's endpoint, towards the worker whose address is addr, and
 * enters it in the table: 0, or UNISUM_ECONN with why. */
int ucx_conn_connect(struct tp_conn *c, const void *addr, char *why, size_t len)
{
	ucp_ep_params_t ep = {
		.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
			      UCP_EP_PARAM_FIELD_ERR_HANDLER,
		.address = addr, .err_mode = UCP_ERR_HANDLING_MODE_PEER,
		.err_handler = {.cb = ucx_on_error, .arg = c}};
	struct ucx_ep_cmd e = {.cmd.fn = ucx_do_ep_create, .c = c, .params = &ep};
	ucx_run(c->u, &e.cmd);
	if (e.status != UCS_OK) {
		c->ep = NULL;
		snprintf(why, len, "UCX cannot connect to %s: %s", c->peer,
			 ucx_fn.ucs_status_string(e.status));
		return UNISUM_ECONN;
	}
	ucx_map_add(c->ep, c);
	ucx_map_adopt(c->ep, c, conn_adopt);
	return 0;
}

/* Frees c, which has no endpoint (its making failed). */
void ucx_conn_drop(struct tp_conn *c)
{
	close(c->evfd);
	pthread_cond_destroy(&c->cond);
	pthread_mutex_destroy(&c->lock);
	struct ucx_ctx *u = c->u;
	if (c->own_worker)
		ucx_worker_free(u, c->worker);	/* after the releases posted before */
	free(c);
	ucx_ctx_put(u);
}

struct ucx_cancel_cmd {
	struct ucx_cmd cmd;
	struct ucx_msg *m;
};

static void ucx_do_cancel(struct ucx_cmd *cmd)
{
	struct ucx_msg *m = ((struct ucx_cancel_cmd *)cmd)->m;
	struct tp_conn *c = m->owner;
	pthread_mutex_lock(&c->lock);
	void *req = m->done ? NULL : m->req;
	pthread_mutex_unlock(&c->lock);
	if (req != NULL)
		ucx_fn.ucp_request_cancel(c->worker, req);
}

/* A receive begun writes into its caller's buffer on the UCX thread:
 * before a closing connection's owner lets its buffers go, the receive
 * is cancelled and waited for (UCX ends it with its endpoint's failure
 * otherwise).  Bounded: past UCX_QUIESCE_MS it is logged and left, and
 * conn_free then keeps the connection rather than free what the receive
 * still names. */
static void ucx_conn_quiesce(struct tp_conn *c)
{
	pthread_mutex_lock(&c->lock);
	struct ucx_msg *m = c->cur;
	bool begun = m != NULL && m->how == UCX_DATA_RNDV && m->posted && !m->done;
	pthread_mutex_unlock(&c->lock);
	if (!begun)
		return;
	struct ucx_cancel_cmd cancel = {.cmd.fn = ucx_do_cancel, .m = m};
	ucx_run(c->u, &cancel.cmd);	/* behind the receive's own command */
	struct timespec until = timing_deadline(UCX_QUIESCE_MS);
	pthread_mutex_lock(&c->lock);
	while (!m->done && pthread_cond_timedwait(&c->cond, &c->lock, &until) == 0)
		;
	bool done = m->done;
	pthread_mutex_unlock(&c->lock);
	if (!done)
		LOG_ERROR("UCX: a receive from %s did not end within %d s of its connection's end",
			  c->peer, UCX_QUIESCE_MS / 1000);
}

static void ucx_close_done(void *request, ucs_status_t status, void *user_data)
{
	(void)status;
	struct tp_conn *c = user_data;
	pthread_mutex_lock(&c->lock);
	c->close_done = true;
	pthread_cond_broadcast(&c->cond);
	pthread_mutex_unlock(&c->lock);
	if (request != NULL)
		ucx_fn.ucp_request_free(request);
}

/* Waits, progressing, until c's copied sends went or ms passed: false
 * when the peer is lost. */
static bool conn_last_words(struct tp_conn *c, int ms)
{
	int64_t until = timing_now_ms() + ms;
	for (;;) {
		pthread_mutex_lock(&c->lock);
		bool lost = c->broken_by_peer, sending = c->copies_inflight > 0 && !lost;
		pthread_mutex_unlock(&c->lock);
		if (!sending || timing_now_ms() >= until)
			return !lost;
		ucx_fn.ucp_worker_progress(c->worker);
	}
}

/* Sends BYE at once (on the UCX thread, as c closes). */
static void conn_bye(struct tp_conn *c)
{
	struct ucx_sreq *s = calloc(1, sizeof *s);
	if (s == NULL)
		return;	/* (the peer learns of it by its heartbeats) */
	s->c = c;
	uint32_t k = htole32(UCX_BYE);
	memcpy(s->head, &k, 4);
	s->hlen = UCX_HEAD;
	pthread_mutex_lock(&c->lock);
	c->inflight++;
	c->copies_inflight++;
	pthread_mutex_unlock(&c->lock);
	ucx_do_send(&s->cmd);
}

static void ucx_do_close(struct ucx_cmd *cmd)
{
	struct tp_conn *c = (struct tp_conn *)((char *)cmd - offsetof(struct tp_conn, close_cmd));
	/* What was sent last (an ERROR naming why: a copy) goes out before
	 * the endpoint is forced closed, which cancels what it holds; then
	 * BYE, so that the peer reads it whole (a rendezvous's data too)
	 * before its end.  Bounded, as a peer may be gone, and short, as the
	 * UCX thread serves every other connection meanwhile. */
	if (conn_last_words(c, UCX_LAST_WORD_MS)) {
		conn_bye(c);
		conn_last_words(c, UCX_LAST_WORD_MS);
	}
	ucx_map_del(c->ep);
	ucp_request_param_t p = {
		.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
				UCP_OP_ATTR_FIELD_FLAGS,
		.flags = UCP_EP_CLOSE_FLAG_FORCE, .cb.send = ucx_close_done, .user_data = c};
	ucs_status_ptr_t r = ucx_fn.ucp_ep_close_nbx(c->ep, &p);
	if (r == NULL || UCS_PTR_IS_ERR(r))
		ucx_close_done(NULL, UCS_PTR_STATUS(r), c);
}

/* Shuts c: from now no send is made, and no lent payload is handed to
 * UCX (ucx_do_send checks under the lock), so its owner may let its
 * buffers go; the endpoint's close (forced: it cancels what UCX holds)
 * follows every send made.  Never blocks.  (Waiting here for the close
 * was tried: a worker's thread that shuts a lost server's link while it
 * holds that link's lock then stalled long enough, in chaos runs, for
 * the scheduler to take the worker for hung.) */
static void ucx_conn_shutdown(struct tp_conn *c)
{
	pthread_mutex_lock(&c->lock);
	bool first = !c->shut;
	c->shut = true;
	conn_break(c, "the connection was shut");
	if (first && c->ep != NULL) {
		c->close_cmd.fn = ucx_do_close;
		ucx_post(c->u, &c->close_cmd);	/* behind every send made */
	}
	pthread_mutex_unlock(&c->lock);
}

void ucx_conn_free(struct tp_conn *c)
{
	if (c == NULL)
		return;
	ucx_conn_shutdown(c);
	pthread_mutex_lock(&c->lock);
	while ((c->ep != NULL && !c->close_done) || c->inflight > 0)
		pthread_cond_wait(&c->cond, &c->lock);
	bool begun = c->cur != NULL && c->cur->how == UCX_DATA_RNDV && c->cur->posted &&
		     !c->cur->done;
	pthread_mutex_unlock(&c->lock);
	if (begun)
		ucx_conn_quiesce(c);
	pthread_mutex_lock(&c->lock);
	if (c->cur != NULL && c->cur->posted && !c->cur->done) {
		/* UCX still names it (and c): kept, not freed. */
		pthread_mutex_unlock(&c->lock);
		LOG_ERROR("UCX: keeping a connection to %s whose receive never ended", c->peer);
		return;
	}
	struct ucx_msg *left = c->rxq, *cur = c->cur;
	c->rxq = c->cur = NULL;
	pthread_mutex_unlock(&c->lock);
	ucx_msg_free(cur);
	while (left != NULL) {
		struct ucx_msg *next = left->next;
		ucx_msg_free(left);
		left = next;
	}
	free(c->bstage);
	ucx_conn_drop(c);
}

static const char *ucx_peer_name(const struct tp_conn *c)
{
	return c->peer;
}

static int ucx_nb_fd(struct tp_conn *c)
{
	return c->evfd;
}

/* Waits for the HELLO that ends c's dial, at most wait_ms: 0, or
 * UNISUM_ECONN with why. */
int ucx_conn_wait_hello(struct tp_conn *c, int wait_ms, char *why, size_t len)
{
	struct timespec until = timing_deadline(wait_ms);	/* HELLO and a break signal c->cond */
	int rc = 0;
	pthread_mutex_lock(&c->lock);
	while (!c->hello && !c->broken && pthread_cond_timedwait(&c->cond, &c->lock, &until) == 0)
		;
	if (!c->hello) {
		snprintf(why, len, "%.200s", c->broken ? c->why : "no answer");
		rc = UNISUM_ECONN;
	}
	pthread_mutex_unlock(&c->lock);
	return rc;
}

/* Waits until c's descriptor is readable, at most ms. */
static void conn_wait(struct tp_conn *c, int ms)
{
	struct pollfd p = {.fd = c->evfd, .events = POLLIN};
	poll(&p, 1, ms);
}

/* ---- the handshake ------------------------------------------------------------ */

static int auth_read(void *ctx, void *dst, size_t len, size_t *off)
{
	struct tp_conn *c = ctx;
	pthread_mutex_lock(&c->lock);
	size_t n = c->auth_len - c->auth_off;
	if (n > len - *off)
		n = len - *off;
	memcpy((uint8_t *)dst + *off, c->auth_in + c->auth_off, n);
	c->auth_off += n;
	*off += n;
	c->auth_new = false;
	int rc = *off == len ? 0 : c->broken ? UNISUM_ECONN : AUTH_AGAIN;
	if (rc == AUTH_AGAIN)
		conn_rearm(c);
	pthread_mutex_unlock(&c->lock);
	return rc;
}

static int auth_write(void *ctx, const void *src, size_t len, size_t *off)
{
	struct tp_conn *c = ctx;
	if (!c->auth->connector && c->auth->stage == 2) {
		/* The acceptor's last word: the connector's messages may
		 * follow it at once, and count. */
		pthread_mutex_lock(&c->lock);
		c->authed = true;
		pthread_mutex_unlock(&c->lock);
	}
	int rc = ucx_conn_send(c, UCX_AUTH, NULL, (const uint8_t *)src + *off, len - *off, false);
	if (rc == 0)
		*off = len;
	return rc;
}

static int ucx_auth_nb(struct tp_conn *c, struct auth_state *a, char *why, size_t len)
{
	int rc = 0;
	if (auth_is_enabled()) {
		struct auth_io io = {.ctx = c, .read = auth_read, .write = auth_write};
		c->auth = a;
		rc = auth_step(a, &io, c->peer, why, len);
		c->auth = NULL;
	}
	if (rc == AUTH_AGAIN)
		return TP_AGAIN;
	if (rc == 0) {
		/* The messages that came meanwhile count from now. */
		pthread_mutex_lock(&c->lock);
		c->authed = true;
		if (conn_ready(c))
			conn_signal(c);
		pthread_mutex_unlock(&c->lock);
	}
	return rc;
}

static int ucx_authenticate(struct tp_conn *c, bool connector, char *why, size_t len)
{
	struct auth_state a = {.connector = connector};
	int64_t until = timing_now_ms() + 10000;
	int rc;
	while ((rc = ucx_auth_nb(c, &a, why, len)) == TP_AGAIN) {
		if (timing_now_ms() >= until) {
			snprintf(why, len, "%s did not finish the handshake within 10 s", c->peer);
			return UNISUM_EAUTH;
		}
		conn_wait(c, 100);
	}
	return rc;
}

/* ---- blocking receives ------------------------------------------------------- */

static int ucx_recv_header(struct tp_conn *c, struct wire_hdr *hdr, char *why, size_t why_len)
{
	memset(&c->brx, 0, sizeof c->brx);
	int rc;
	while ((rc = ucx_recv_nb(c, &c->brx, why, why_len)) == TP_AGAIN)
		conn_wait(c, 1000);
	if (rc != 0 && rc != TP_HEADER)
		return rc;
	*hdr = c->brx.hdr;
	return 0;
}

/* Brings the blocking receive's payload to dst: 0 or an error. */
static int conn_recv_whole(struct tp_conn *c, void *dst)
{
	c->brx.dst = dst;
	char why[160];
	int rc;
	while ((rc = ucx_recv_nb(c, &c->brx, why, sizeof why)) == TP_AGAIN)
		conn_wait(c, 1000);
	return rc;
}

/* The payload at once into dst, or (read in parts, as a stream socket
 * allows) through a buffer of its own. */
static int ucx_recv_payload(struct tp_conn *c, void *dst, size_t len)
{
	size_t total = (size_t)c->brx.hdr.payload_len;
	if (len == 0)
		return 0;
	if (c->bgot == 0 && len == total)
		return conn_recv_whole(c, dst);
	if (c->bgot + len > total)
		return UNISUM_ECONN;
	if (c->bstage == NULL) {
		if ((c->bstage = malloc(total)) == NULL)
			return UNISUM_ECONN;
		int rc = conn_recv_whole(c, c->bstage);
		if (rc != 0) {
			free(c->bstage);
			c->bstage = NULL;
			return rc;
		}
	}
	if (dst != NULL)
		memcpy(dst, c->bstage + c->bgot, len);
	c->bgot += len;
	if (c->bgot == total) {
		free(c->bstage);
		c->bstage = NULL;
		c->bgot = 0;
	}
	return 0;
}

static const struct transport_ops ucx_ops = {
	.name = "ucx",
	.listen = ucx_listen,
	.accept = ucx_accept,
	.listener_shutdown = ucx_listener_shutdown,
	.listener_free = ucx_listener_free,
	.dial = ucx_dial,
	.send = ucx_send,
	.authenticate = ucx_authenticate,
	.recv_header = ucx_recv_header,
	.recv_payload = ucx_recv_payload,
	.conn_shutdown = ucx_conn_shutdown,
	.conn_quiesce = ucx_conn_quiesce,
	.conn_free = ucx_conn_free,
	.peer_name = ucx_peer_name,
	.listener_fd = ucx_listener_fd,
	.accept_nb = ucx_accept_nb,
	.nb_fd = ucx_nb_fd,
	.auth_nb = ucx_auth_nb,
	.recv_nb = ucx_recv_nb,
	.send_nb = ucx_send_nb,
	.mem_register = ucx_mem_register,
	.mem_unregister = ucx_mem_unregister,
	.lent_settle = ucx_lent_settle,
};

const struct transport_ops *transport_ucx(char *why, size_t len)
{
	return ucx_loadable(why, len) == 0 ? &ucx_ops : NULL;
}
