/*
 * ucx_connect.c - how UCX connections are made (see ucx.c), both sides:
 * a listener is a TCP socket of ours, and over it the two sides exchange
 * their UCP workers' addresses; each then makes its endpoint from the
 * other's, and dial() ends with the listener's HELLO.
 *
 * DESIGN.  UCX's own listener (its sockaddr connection manager) reads a
 * connection request before any code of ours runs, and UCX 1.13 asserts
 * on a malformed one: a stranger's few bytes on a server's port aborted
 * the server.  So no UCX code reads from the listening port.  The dialler
 * sends a request: magic, length, a tag, its worker's address.  A request
 * that is not one closes that socket alone.  The tag is a keyed hash of
 * the address (auth_digest: the job secret's key, or zeros without a
 * secret), since UCX trusts an address too (noise as one aborts the
 * process in ucp_address_unpack): with a secret, only the job's nodes can
 * hand UCX an address; without one, nobody is authenticated anyway and
 * the tag is a checksum.  A wrong tag is answered with a refusal (an
 * answer naming no address), so that a dialler holding another secret,
 * or none, fails at once.  Then the listener makes the connection on the
 * process's accepting worker, towards the dialler's worker, and answers
 * with its own worker's address, tagged; the dialler makes its endpoint
 * from that.  The job secret's handshake follows over UCX, as before.
 * The sockets UCX itself listens on for its endpoints (its TCP
 * transport's) survive strangers' bytes: checked by hand, random bytes,
 * zeros and an HTTP request on every one of them.
 *
 * One worker a dial.  UCP pairs two endpoints made from addresses by a
 * count per pair of workers: the n-th endpoint that A made towards B
 * with the n-th that B made towards A.  Two processes that dial each
 * other (servers and their backups), or two dials between the same
 * processes under way at once, would be paired across connections, and
 * closing one would break the other.  So each dial has a worker of its
 * own, whose address only the listener it dialled learns: the listener
 * makes exactly one endpoint towards it, and the pairing is exact.  The
 * UCX thread progresses every worker.
 *
 * Accepting.  The UCX thread serves the listener (ucx_watch: an epoll
 * descriptor holding the listening socket and the requests being read),
 * as a kernel's backlog accepts, so that a dial ends whether or not
 * anyone calls accept() meanwhile (a server dialling its backup while
 * the backup dials it); made connections wait in a queue, and an eventfd
 * tells the loop.  A request has 5 s to arrive; at most 64 wait at once
 * (the oldest is dropped for a newer one).
 */
#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "log/log.h"
#include "timing/timing.h"
#include "transport/auth.h"
#include "transport/stream.h"
#include "transport/ucx/ucx_int.h"
#include "unisum.h"

#define BOOT_MAGIC "UNISUMX1"		/* a request's and an answer's first 8 bytes */
#define BOOT_HEAD (12 + AUTH_TAG_BYTES)	/* the magic, u32 the address's length
					 * (big-endian), the address's tag */
#define BOOT_ASK "ucx-request"		/* the tags' labels */
#define BOOT_ANSWER "ucx-answer"
#define BOOT_ADDR_MAX 65536		/* a worker's address is at most this */
#define BOOT_MS 5000			/* a request arrives within this */
#define BOOT_PENDING 64			/* requests read at once, at most */

static bool listener_room(struct tp_listener *l);
static void listener_push(struct tp_listener *l, struct tp_conn *c, int fd_errno);

/* Sends a request or an answer (label) naming addr (len 0: a refusal)
 * in one write: whether all of it went (a fresh socket takes it whole). */
static bool boot_send(int fd, const char *label, const void *addr, size_t len)
{
	uint8_t head[BOOT_HEAD];
	memcpy(head, BOOT_MAGIC, 8);
	uint32_t n = htobe32((uint32_t)len);
	memcpy(head + 8, &n, 4);
	auth_digest(label, addr, len, head + 12);
	struct iovec iov[2] = {{head, BOOT_HEAD}, {(void *)addr, len}};
	struct msghdr mh = {.msg_iov = iov, .msg_iovlen = 2};
	return sendmsg(fd, &mh, MSG_NOSIGNAL) == (ssize_t)(BOOT_HEAD + len);
}

/* A request being read. */
struct boot {
	int fd;
	char peer[64];
	int64_t since_ms;
	uint8_t head[BOOT_HEAD];
	size_t got;			/* of head, then of addr */
	uint8_t *addr;
	size_t addr_len;
};

struct tp_listener {
	struct ucx_ctx *u;
	struct stream_listener s;
	int epfd;			/* the UCX thread's: s.fd and the boots */
	bool watched;			/* ... which it watches */
	int64_t paused_ms;		/* s.fd left out since (accept() failed) */
	struct boot *boots[BOOT_PENDING];	/* (the UCX thread's) */
	size_t nboots;
	uint8_t addr[BOOT_ADDR_MAX];	/* the accepting worker's address */
	size_t addr_len;
	int evfd;			/* the loop's: readable while one waits */
	pthread_mutex_t lock;		/* below */
	struct tp_conn **conns;		/* made, waiting for accept() */
	size_t nconns, cap;
	int fd_errno;			/* a peer refused for want of descriptors */
	bool signaled;
};

/* Makes the listener's eventfd readable.  l->lock held. */
static void listener_signal(struct tp_listener *l)
{
	uint64_t one = 1;
	if (!l->signaled && write(l->evfd, &one, sizeof one) == sizeof one)
		l->signaled = true;
}

static void boot_free(struct tp_listener *l, size_t i)
{
	struct boot *b = l->boots[i];
	epoll_ctl(l->epfd, EPOLL_CTL_DEL, b->fd, NULL);
	close(b->fd);
	free(b->addr);
	free(b);
	l->boots[i] = l->boots[--l->nboots];
}

/* Drops request i, saying why (a stranger, or a peer gone).  What it
 * sent is read first (up to 64 KiB), so that it sees the connection end,
 * not reset. */
static void boot_drop(struct tp_listener *l, size_t i, const char *why)
{
	LOG_WARN("UCX: closing the connection of %s: %s", l->boots[i]->peer, why);
	char sink[4096];
	for (int k = 0; k < 16 && recv(l->boots[i]->fd, sink, sizeof sink, MSG_DONTWAIT) > 0; k++)
		;
	boot_free(l, i);
}

/* A peer connected: its request is read from now. */
static void boot_add(struct tp_listener *l, int fd, const struct sockaddr_in *sa)
{
	if (l->nboots == BOOT_PENDING) {
		size_t old = 0;
		for (size_t i = 1; i < l->nboots; i++)
			if (l->boots[i]->since_ms < l->boots[old]->since_ms)
				old = i;
		boot_drop(l, old, "its request is the oldest of too many waiting");
	}
	struct boot *b = calloc(1, sizeof *b);
	struct epoll_event ev = {.events = EPOLLIN, .data.ptr = b};
	if (b == NULL || epoll_ctl(l->epfd, EPOLL_CTL_ADD, fd, &ev) != 0) {
		LOG_WARN("UCX: cannot take a connection: %s", strerror(b == NULL ? ENOMEM : errno));
		free(b);
		close(fd);
		return;
	}
	char ip[INET_ADDRSTRLEN] = "?";
	inet_ntop(AF_INET, &sa->sin_addr, ip, sizeof ip);
	snprintf(b->peer, sizeof b->peer, "%s:%u", ip, ntohs(sa->sin_port));
	b->fd = fd;
	b->since_ms = timing_now_ms();
	l->boots[l->nboots++] = b;
}

/* Reads what request i has: 0 when whole, TP_AGAIN, or -1 (dropped).
 * Its magic and length are judged as soon as they are in. */
static int boot_read(struct tp_listener *l, size_t i)
{
	struct boot *b = l->boots[i];
	int rc = 0;
	if (b->addr == NULL) {
		rc = stream_read_nb(b->fd, b->head, BOOT_HEAD, &b->got);
		if (b->got >= 8 && memcmp(b->head, BOOT_MAGIC, 8) != 0) {
			boot_drop(l, i, "not a unisum UCX peer (its first bytes are not a request)");
			return -1;
		}
		uint32_t n;
		memcpy(&n, b->head + 8, 4);
		n = be32toh(n);
		if (b->got >= 12 && (n == 0 || n > BOOT_ADDR_MAX)) {
			boot_drop(l, i, "its request names an address of impossible length");
			return -1;
		}
		if (rc == 0 && (b->addr = malloc(n)) == NULL) {
			boot_drop(l, i, "out of memory for its request");
			return -1;
		}
		if (rc == 0) {
			b->addr_len = n;
			b->got = 0;
		}
	}
	if (rc == 0)
		rc = stream_read_nb(b->fd, b->addr, b->addr_len, &b->got);
	if (rc == UNISUM_ECONN) {
		boot_drop(l, i, "it hung up before its request was whole");
		return -1;
	}
	return rc;
}

/* A peer dialled: its connection is made on the
 * accepting worker, towards the peer's own worker, and greeted (HELLO
 * ends the peer's dial), then waits for accept(), as a socket waits in
 * the kernel's backlog.  NULL when that failed, logged, with *err the
 * errno of running out of descriptors or memory (0 otherwise). */
static struct tp_conn *conn_accept(const void *addr, const char *peer, int *err)
{
	errno = 0;
	struct tp_conn *c = ucx_conn_new();
	if (c == NULL) {
		*err = errno ? errno : ENOMEM;
		LOG_WARN("UCX: cannot make the connection of %s: %s", peer, strerror(*err));
		return NULL;
	}
	ucx_conn_set_worker(c, ucx_conn_ctx(c)->worker, false, true, peer);
	char why[256];
	if (ucx_conn_connect(c, addr, why, sizeof why) != 0) {
		LOG_WARN("UCX: cannot make the connection of %s: %s", peer, why);
		ucx_conn_drop(c);
		return NULL;
	}
	ucx_conn_send(c, UCX_HELLO, NULL, NULL, 0, false);	/* a failure breaks c */
	return c;
}

/* Request i is whole: the connection made and the answer sent (NULL when
 * either failed: dropped). */
static struct tp_conn *boot_finish(struct tp_listener *l, size_t i)
{
	struct boot *b = l->boots[i];
	if (!auth_digest_is_valid(BOOT_ASK, b->addr, b->addr_len, b->head + 12)) {
		/* Refused (an answer naming no address), so that a peer
		 * holding another secret, or none, fails at once. */
		if (!boot_send(b->fd, BOOT_ANSWER, NULL, 0))
			LOG_DEBUG("UCX: %s did not take its refusal", b->peer);
		boot_drop(l, i, auth_is_enabled() ? "wrong or missing job secret (its request's tag)"
						  : "its request carries a job secret's tag, and this "
						    "node sets no UNISUM_SECRET (or it is not a unisum peer)");
		return NULL;
	}
	/* Room first; then the answer (it names this process's worker
	 * alone), then the connection: one made is never freed here, on the
	 * UCX thread, whose commands its freeing waits for. */
	if (!listener_room(l)) {
		boot_drop(l, i, "too many connections wait for accept() already");
		return NULL;
	}
	if (!boot_send(b->fd, BOOT_ANSWER, l->addr, l->addr_len)) {
		boot_drop(l, i, "it did not take the answer");
		return NULL;
	}
	int e = 0;
	struct tp_conn *c = conn_accept(b->addr, b->peer, &e);
	if (c == NULL && (e == EMFILE || e == ENFILE))
		listener_push(l, NULL, e);	/* accept() says so (RLIMIT_NOFILE) */
	boot_free(l, i);
	return c;
}

/* Whether the queue has room for one more connection (grown if not, to
 * a backlog's 1,024 at most, as listen()'s). */
static bool listener_room(struct tp_listener *l)
{
	pthread_mutex_lock(&l->lock);
	if (l->nconns == l->cap && l->cap < 1024) {
		size_t cap = l->cap ? l->cap * 2 : 16;
		struct tp_conn **r = realloc(l->conns, cap * sizeof *r);
		if (r != NULL)
			l->conns = r, l->cap = cap;
	}
	bool room = l->nconns < l->cap;
	pthread_mutex_unlock(&l->lock);
	return room;
}

/* A connection made (room for it reserved: listener_room): it waits for
 * accept().  An accept() that failed for want of descriptors is told
 * too. */
static void listener_push(struct tp_listener *l, struct tp_conn *c, int fd_errno)
{
	pthread_mutex_lock(&l->lock);
	if (c != NULL)
		l->conns[l->nconns++] = c;
	if (fd_errno != 0)
		l->fd_errno = fd_errno;
	listener_signal(l);
	pthread_mutex_unlock(&l->lock);
}

/* Takes the peers waiting in the backlog (a turn's worth), on the UCX
 * thread. */
static void listener_accept(struct tp_listener *l)
{
	for (int k = 0; k < BOOT_PENDING; k++) {
		struct sockaddr_in sa;
		socklen_t sl = sizeof sa;
		int fd, rc = stream_accept_nb(&l->s, (struct sockaddr *)&sa, &sl, &fd);
		if (rc == 0) {
			boot_add(l, fd, &sa);
			continue;
		}
		if (rc == UNISUM_ESYS) {
			/* The peer stays in the backlog: not watched for a
			 * second, rather than spin on it (listener_serve). */
			listener_push(l, NULL, errno == EMFILE || errno == ENFILE ? errno : EIO);
			epoll_ctl(l->epfd, EPOLL_CTL_DEL, l->s.fd, NULL);
			l->paused_ms = timing_now_ms();
		}
		return;
	}
}

/* One event of the listener's, on the UCX thread. */
static void listener_event(struct tp_listener *l, struct epoll_event *ev)
{
	if (ev->data.ptr == &l->s) {
		listener_accept(l);
		return;
	}
	size_t i = 0;
	while (i < l->nboots && l->boots[i] != ev->data.ptr)
		i++;
	if (i == l->nboots || boot_read(l, i) != 0)
		return;	/* (dropped by an earlier event of this turn, or not whole) */
	struct tp_conn *c = boot_finish(l, i);
	if (c != NULL)
		listener_push(l, c, 0);
}

/* The UCX thread's turn at the listener (ucx_watch). */
static void listener_serve(void *arg)
{
	struct tp_listener *l = arg;
	int64_t now = timing_now_ms();
	bool closing = atomic_load(&l->s.closing);
	for (size_t i = l->nboots; i-- > 0;) {
		if (closing) {	/* (a peer's dial as a job ends: not worth a warning) */
			LOG_INFO("UCX: closing the connection of %s: the listener was shut",
				 l->boots[i]->peer);
			boot_free(l, i);
		} else if (now - l->boots[i]->since_ms > BOOT_MS) {
			boot_drop(l, i, "no request within 5 s");
		}
	}
	if (l->paused_ms != 0 && now - l->paused_ms >= 1000 && !closing) {
		struct epoll_event a = {.events = EPOLLIN, .data.ptr = &l->s};
		pthread_mutex_lock(&l->lock);	/* (a shutdown meanwhile leaves it out) */
		if (!atomic_load(&l->s.closing) && epoll_ctl(l->epfd, EPOLL_CTL_ADD, l->s.fd, &a) == 0)
			l->paused_ms = 0;
		pthread_mutex_unlock(&l->lock);
	}
	struct epoll_event ev[16];
	int n = closing ? 0 : epoll_wait(l->epfd, ev, 16, 0);
	for (int i = 0; i < n; i++)
		listener_event(l, &ev[i]);
}

int ucx_accept_nb(struct tp_listener *l, struct tp_conn **out)
{
	pthread_mutex_lock(&l->lock);
	struct tp_conn *c = NULL;
	if (l->nconns > 0) {
		c = l->conns[0];
		memmove(l->conns, l->conns + 1, --l->nconns * sizeof *l->conns);
	}
	bool closing = atomic_load(&l->s.closing);
	int rc = c != NULL ? 0 : closing ? UNISUM_ESHUTDOWN : l->fd_errno ? UNISUM_ESYS : TP_AGAIN;
	int fd_errno = l->fd_errno;
	if (rc == UNISUM_ESYS)
		l->fd_errno = 0;	/* told once */
	uint64_t n;
	if (l->nconns == 0 && !closing && l->signaled && read(l->evfd, &n, sizeof n) == sizeof n)
		l->signaled = false;
	pthread_mutex_unlock(&l->lock);
	if (c != NULL)
		*out = c;
	if (rc == UNISUM_ESYS && (fd_errno == EMFILE || fd_errno == ENFILE)) {
		char why[512];
		log_fd_limits(fd_errno, why, sizeof why);
		log_set_last_error("a peer could not be accepted over UCX: %s", why);
	} else if (rc == UNISUM_ESYS) {
		log_set_last_error("a peer could not be accepted over UCX: accept() failed");
	}
	return rc;
}

int ucx_accept(struct tp_listener *l, struct tp_conn **out)
{
	int rc;
	while ((rc = ucx_accept_nb(l, out)) == TP_AGAIN) {
		struct pollfd p = {.fd = l->evfd, .events = POLLIN};
		poll(&p, 1, 100);
	}
	return rc;
}

/* The listener's descriptors and its worker's address: 0, or -1 (errno). */
static int listener_open(struct tp_listener *l)
{
	pthread_mutex_init(&l->lock, NULL);
	l->epfd = epoll_create1(EPOLL_CLOEXEC);
	l->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	struct epoll_event a = {.events = EPOLLIN, .data.ptr = &l->s};
	if (l->epfd < 0 || l->evfd < 0 || stream_set_nonblocking(l->s.fd) != 0 ||
	    epoll_ctl(l->epfd, EPOLL_CTL_ADD, l->s.fd, &a) != 0)
		return -1;
	l->addr_len = ucx_worker_address(l->u, l->u->worker, l->addr, sizeof l->addr);
	if (l->addr_len == 0) {
		errno = EPROTO;
		return -1;
	}
	if (ucx_watch(l->u, l->epfd, listener_serve, l) != 0) {
		errno = ENOMEM;
		return -1;
	}
	l->watched = true;
	return 0;
}

static void listener_close(struct tp_listener *l)
{
	if (l->watched)
		ucx_watch(l->u, l->epfd, NULL, NULL);	/* the UCX thread is done with l */
	while (l->nboots > 0)
		boot_free(l, 0);
	for (size_t i = 0; i < l->nconns; i++)
		ucx_conn_free(l->conns[i]);
	free(l->conns);
	if (l->epfd >= 0)
		close(l->epfd);
	if (l->evfd >= 0)
		close(l->evfd);
	stream_listener_close(&l->s);
	pthread_mutex_destroy(&l->lock);
	struct ucx_ctx *u = l->u;
	free(l);
	ucx_ctx_put(u);
}

int ucx_listen(const char *host, int port, struct tp_listener **out, int *port_out)
{
	char why[256] = "";
	struct ucx_ctx *u = ucx_ctx_get(why, sizeof why);
	if (u == NULL)
		return log_fail(UNISUM_ECONFIG, "UNISUM_TRANSPORT=ucx: %s", why);
	struct tp_listener *l = calloc(1, sizeof *l);
	int fd, rc = l == NULL ? UNISUM_ENOMEM : stream_listen(host, port, &fd, port_out);
	if (rc != 0) {
		free(l);
		ucx_ctx_put(u);
		return rc;
	}
	l->u = u;
	l->s.fd = fd;
	atomic_init(&l->s.closing, false);
	if (listener_open(l) != 0) {
		int e = errno;
		listener_close(l);
		return log_fail(UNISUM_ESYS, "UCX listener on %s:%d: %s", host, port, strerror(e));
	}
	*out = l;
	return 0;
}

/* New dialers are refused from now, as TCP's listener refuses them, and
 * the requests being read are dropped (listener_serve). */
void ucx_listener_shutdown(struct tp_listener *l)
{
	pthread_mutex_lock(&l->lock);
	if (!atomic_load(&l->s.closing)) {
		epoll_ctl(l->epfd, EPOLL_CTL_DEL, l->s.fd, NULL);	/* (not readable for ever) */
		stream_listener_shutdown(&l->s);
	}
	listener_signal(l);
	pthread_mutex_unlock(&l->lock);
}

void ucx_listener_free(struct tp_listener *l)
{
	if (l == NULL)
		return;
	ucx_listener_shutdown(l);
	listener_close(l);
}

int ucx_listener_fd(struct tp_listener *l)
{
	return l->evfd;
}

/* ---- the dialler's side ---------------------------------------------------- */

/* Sends mine (a worker's address) over fd, which is blocking with
 * timeouts, and reads the listener's into *addr (malloc'd): 0, or
 * UNISUM_ECONN (UNISUM_EAUTH: refused for the job secret) with why. */
static int boot_exchange(int fd, const uint8_t *mine, size_t mine_len, uint8_t **addr,
			 char *why, size_t len)
{
	uint8_t head[BOOT_HEAD];
	if (!boot_send(fd, BOOT_ASK, mine, mine_len) || stream_read_full(fd, head, BOOT_HEAD) != 0) {
		snprintf(why, len, "the listener hung up or did not answer (%s)", strerror(errno));
		return UNISUM_ECONN;
	}
	uint32_t n;
	memcpy(&n, head + 8, 4);
	n = be32toh(n);
	if (memcmp(head, BOOT_MAGIC, 8) == 0 && n == 0) {
		snprintf(why, len, auth_is_enabled()
					   ? "the peer refused this node's UNISUM_SECRET: it holds another "
					     "one, or none"
					   : "the peer asks for the job secret (UNISUM_SECRET), which this "
					     "node does not set");
		return UNISUM_EAUTH;
	}
	if (memcmp(head, BOOT_MAGIC, 8) != 0 || n > BOOT_ADDR_MAX) {
		snprintf(why, len, "the peer is not a unisum UCX listener (is UNISUM_TRANSPORT "
			 "the same on every node?)");
		return UNISUM_ECONN;
	}
	if ((*addr = malloc(n)) == NULL || stream_read_full(fd, *addr, n) != 0) {
		snprintf(why, len, "the listener hung up during its answer");
		return UNISUM_ECONN;
	}
	if (!auth_digest_is_valid(BOOT_ANSWER, *addr, n, head + 12)) {
		snprintf(why, len, auth_is_enabled() ? "the listener's answer has a wrong tag: it "
			 "holds another UNISUM_SECRET, or none" : "the listener's answer has a wrong checksum");
		return UNISUM_ECONN;
	}
	return 0;
}

static int boot_dial(const struct sockaddr_in *sa, const char *peer, int wait_ms, struct tp_conn *c,
		     char *why, size_t len)
{
	int fd, rc = stream_connect(AF_INET, (const struct sockaddr *)sa, sizeof *sa, wait_ms, peer,
				    &fd);	/* (retrying a refusal meanwhile) */
	if (rc != 0) {
		snprintf(why, len, "%s", log_last_error());
		return rc;
	}
	struct timeval tv = {.tv_sec = wait_ms / 1000, .tv_usec = (wait_ms % 1000) * 1000};
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
	struct ucx_ctx *u = ucx_conn_ctx(c);
	ucp_worker_h w;
	uint8_t *mine = NULL, *theirs = NULL;
	size_t mine_len = 0;
	rc = UNISUM_ESYS;
	if (ucx_worker_new(u, &w, why, len) == 0) {
		ucx_conn_set_worker(c, w, true, false, NULL);	/* freed with c */
		if ((mine = malloc(BOOT_ADDR_MAX)) != NULL)
			mine_len = ucx_worker_address(u, w, mine, BOOT_ADDR_MAX);
		if (mine_len == 0)
			snprintf(why, len, "UCX gave no address for a new worker");
		else
			rc = boot_exchange(fd, mine, mine_len, &theirs, why, len);
	}
	close(fd);
	if (rc == 0)
		rc = ucx_conn_connect(c, theirs, why, len);
	free(mine);
	free(theirs);
	return rc;
}

#define UCX_HELLO_MS 10000	/* a dialled peer's HELLO comes within this */

/* One dial: a connection that heard the listener's HELLO, or why not. */
static int dial_once(const struct sockaddr_in *sa, const char *peer, int wait_ms,
		     struct tp_conn **out, char *why, size_t len)
{
	struct tp_conn *c = ucx_conn_new();
	if (c == NULL) {
		snprintf(why, len, "out of memory or descriptors for a UCX connection");
		return UNISUM_ESYS;
	}
	ucx_conn_set_worker(c, NULL, false, false, peer);	/* (its worker: boot_dial) */
	int rc = boot_dial(sa, peer, wait_ms, c, why, len);
	if (rc == 0)
		rc = ucx_conn_wait_hello(c, wait_ms, why, len);
	if (rc != 0) {
		ucx_conn_free(c);
		return rc;
	}
	*out = c;
	return 0;
}

int ucx_dial(const char *host, int port, int timeout_ms, struct tp_conn **out)
{
	struct sockaddr_in sa;
	int rc = stream_resolve(host, port, &sa);
	if (rc != 0)
		return rc;
	char why[256] = "", peer[300];
	snprintf(peer, sizeof peer, "%s:%d", host, port);
	struct ucx_ctx *u = ucx_ctx_get(why, sizeof why);
	if (u == NULL)
		return log_fail(UNISUM_ECONFIG, "UNISUM_TRANSPORT=ucx: %s", why);
	int64_t until = timing_now_ms() + timeout_ms;
	for (;;) {
		int64_t left = until - timing_now_ms();
		int wait = left > UCX_HELLO_MS ? UCX_HELLO_MS : left < 1000 ? 1000 : (int)left;
		rc = dial_once(&sa, peer, wait, out, why, sizeof why);
		if (rc != UNISUM_ECONN || timing_now_ms() + 100 >= until)
			break;
		usleep(100 * 1000);	/* not listening yet: as TCP retries a refusal */
	}
	ucx_ctx_put(u);	/* a connection holds its own */
	if (rc == 0)
		return 0;
	return log_fail(rc, "cannot reach %s over UCX: %s", peer, why);
}
