/*
 * test_loop.c - the event loop (src/loop) over real sockets: many
 * connections served by one thread, a peer that sends one byte at a time,
 * a peer that never reads (the queue stops at its cap, nothing grows
 * without bound, and the others are still served), a peer that hangs up
 * mid-message, a malformed message that closes one connection only,
 * timers that fire while every connection is idle, and the job-secret
 * handshake run by the loop (a peer without the secret is refused).
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <unistd.h>

#include <cmocka.h>

#include "log/log.h"
#include "loop/conn.h"
#include "loop/loop.h"
#include "timing/timing.h"
#include "transport/auth.h"
#include "transport/transport.h"
#include "wire/wire.h"

#define MAX_CONNS 600

/* A server on a loop of its own thread: accepts, counts, echoes. */
struct srv {
	const struct transport_ops *tp;
	struct loop *loop;
	struct tp_listener *l;
	struct loop_io lio;
	pthread_t thread;
	int port;
	pthread_mutex_t mu;		/* below */
	struct loop_conn *conns[MAX_CONNS];
	int nconns, messages, closed, last_rc;
	char last_why[256];
	bool echo;
};

static void srv_closed(struct loop_conn *lc, int rc, const char *why)
{
	struct srv *s = loop_conn_arg(lc);
	pthread_mutex_lock(&s->mu);
	s->closed++;
	s->last_rc = rc;
	snprintf(s->last_why, sizeof s->last_why, "%s", why);
	pthread_mutex_unlock(&s->mu);
}

static int srv_message(struct loop_conn *lc, const struct wire_hdr *h, void *payload, char *why,
		       size_t len)
{
	(void)why, (void)len;
	struct srv *s = loop_conn_arg(lc);
	pthread_mutex_lock(&s->mu);
	s->messages++;
	bool echo = s->echo;
	pthread_mutex_unlock(&s->mu);
	if (echo)
		assert_int_equal(loop_conn_send(lc, h, payload), 0);
	return 0;
}

static const struct loop_conn_ops srv_ops = {
	.on_message = srv_message,
	.on_closed = srv_closed,
};

static void srv_accept(struct loop_io *io, uint32_t events)
{
	(void)events;
	struct srv *s = io->arg;
	struct tp_conn *c;
	while (s->tp->accept_nb(s->l, &c) == 0) {
		struct loop_conn *lc;
		assert_int_equal(loop_conn_new(s->loop, s->tp, c, true, &srv_ops, s, &lc), 0);
		pthread_mutex_lock(&s->mu);
		assert_true(s->nconns < MAX_CONNS);
		s->conns[s->nconns++] = lc;
		pthread_mutex_unlock(&s->mu);
	}
}

static void *srv_main(void *arg)
{
	struct srv *s = arg;
	loop_run(s->loop, NULL, NULL);
	return NULL;
}

static void srv_start_on(struct srv *s, const struct transport_ops *tp)
{
	memset(s, 0, sizeof *s);
	s->tp = tp;
	s->echo = true;
	pthread_mutex_init(&s->mu, NULL);
	assert_int_equal(loop_new(&s->loop), 0);
	if (tp == transport_ipc()) {
		/* Named after a TCP port: this process holds one meanwhile. */
		struct tp_listener *tcp;
		int port;
		assert_int_equal(transport_tcp()->listen("127.0.0.1", 0, &tcp, &port), 0);
		assert_int_equal(tp->listen("127.0.0.1", port, &s->l, &s->port), 0);
		transport_tcp()->listener_free(tcp);
		s->port = port;
	} else {
		assert_int_equal(s->tp->listen("127.0.0.1", 0, &s->l, &s->port), 0);
	}
	assert_int_equal(loop_io_add(s->loop, &s->lio, s->tp->listener_fd(s->l), EPOLLIN, srv_accept, s), 0);
	assert_int_equal(pthread_create(&s->thread, NULL, srv_main, s), 0);
}

static void srv_start(struct srv *s)
{
	srv_start_on(s, transport_tcp());
}

static void srv_stop(struct srv *s)
{
	loop_stop(s->loop);
	pthread_join(s->thread, NULL);
	for (int i = 0; i < s->nconns; i++)
		loop_conn_free(s->conns[i]);
	loop_io_del(&s->lio);
	s->tp->listener_free(s->l);
	loop_free(s->loop);
	pthread_mutex_destroy(&s->mu);
}

static int srv_get(struct srv *s, int *field)
{
	pthread_mutex_lock(&s->mu);
	int v = *field;
	pthread_mutex_unlock(&s->mu);
	return v;
}

/* Waits up to 5 s for *field to reach want. */
static void srv_wait(struct srv *s, int *field, int want)
{
	for (int i = 0; i < 500 && srv_get(s, field) < want; i++)
		usleep(10000);
	assert_int_equal(srv_get(s, field), want);
}

static long threads_now(void)
{
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];
	long n = -1;
	while (f != NULL && fgets(line, sizeof line, f) != NULL)
		if (strncmp(line, "Threads:", 8) == 0)
			n = strtol(line + 8, NULL, 10);
	if (f != NULL)
		fclose(f);
	return n;
}

/* A PUSH of n floats, value i + seed at element i. */
static struct wire_hdr push_hdr(uint64_t n, uint64_t key)
{
	return (struct wire_hdr){.type = WIRE_PUSH, .dtype = UNISUM_FLOAT32, .count = n,
				 .payload_len = 4 * n, .key = key};
}

static float *floats(uint64_t n, int seed)
{
	float *v = malloc(4 * (n ? n : 1));
	for (uint64_t i = 0; i < n; i++)
		v[i] = (float)(i + (uint64_t)seed);
	return v;
}

/* Reads one message on a blocking client connection and checks it is the
 * echo of a PUSH of n floats with key and seed. */
static void expect_echo(const struct transport_ops *tp, struct tp_conn *c, uint64_t n, uint64_t key,
			int seed)
{
	struct wire_hdr h;
	char why[256];
	assert_int_equal(tp->recv_header(c, &h, why, sizeof why), 0);
	assert_int_equal(h.type, WIRE_PUSH);
	assert_int_equal(h.key, key);
	assert_int_equal(h.count, n);
	float *got = malloc(4 * (n ? n : 1)), *want = floats(n, seed);
	assert_int_equal(tp->recv_payload(c, got, 4 * n), 0);
	assert_memory_equal(got, want, 4 * n);
	free(got);
	free(want);
}

static void test_many_connections(void **state)
{
	(void)state;
	struct srv s;
	srv_start(&s);
	long before = threads_now();	/* 2 (3 under ThreadSanitizer, which adds its own) */
	enum { N = 250 };
	static struct tp_conn *c[N];
	static const uint64_t sizes[3] = {0, 25, 30000};
	for (int i = 0; i < N; i++)
		assert_int_equal(transport_connect(s.tp, "127.0.0.1", s.port, 2000, &c[i]), 0);
	srv_wait(&s, &s.nconns, N);
	/* Every connection served by the loop's one thread. */
	assert_int_equal(threads_now(), before);
	for (int m = 0; m < 3; m++) {
		for (int i = 0; i < N; i++) {
			float *v = floats(sizes[m], i);
			struct wire_hdr h = push_hdr(sizes[m], (uint64_t)(i * 3 + m));
			assert_int_equal(s.tp->send(c[i], &h, sizes[m] ? v : NULL), 0);
			free(v);
		}
		for (int i = 0; i < N; i++)
			expect_echo(s.tp, c[i], sizes[m], (uint64_t)(i * 3 + m), i);
	}
	assert_int_equal(srv_get(&s, &s.messages), 3 * N);
	for (int i = 0; i < N; i++)
		s.tp->conn_free(c[i]);
	srv_wait(&s, &s.closed, N);
	assert_int_equal(s.last_rc, UNISUM_ECONN);
	srv_stop(&s);
}

/* A raw socket connected to the server (no handshake: no secret is set). */
static int raw_connect(int port)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
	assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
	return fd;
}

static void test_one_byte_at_a_time(void **state)
{
	(void)state;
	struct srv s;
	srv_start(&s);
	s.echo = false;
	int fd = raw_connect(s.port);
	uint8_t msg[WIRE_HDR_SIZE + 64];
	struct wire_hdr h = push_hdr(16, 7);
	wire_encode(&h, msg);
	float *v = floats(16, 3);
	memcpy(msg + WIRE_HDR_SIZE, v, 64);
	free(v);
	for (size_t i = 0; i < sizeof msg; i++) {
		assert_int_equal(send(fd, msg + i, 1, MSG_NOSIGNAL), 1);
		usleep(300);
		if (i + 1 < sizeof msg)	/* not before its last byte */
			assert_int_equal(srv_get(&s, &s.messages), 0);
	}
	srv_wait(&s, &s.messages, 1);
	close(fd);
	srv_wait(&s, &s.closed, 1);
	srv_stop(&s);
}

static void test_never_reads(void **state)
{
	(void)state;
	struct srv s;
	srv_start(&s);
	struct tp_conn *deaf, *other;
	assert_int_equal(transport_connect(s.tp, "127.0.0.1", s.port, 2000, &deaf), 0);
	srv_wait(&s, &s.nconns, 1);
	struct loop_conn *lc = s.conns[0];
	size_t cap = 4u << 20;
	loop_conn_set_cap(lc, cap);
	/* 1 MiB messages to a peer that never reads: the kernel's buffers
	 * fill, then the queue up to its cap, then sends are refused. */
	float *v = floats(1 << 18, 1);
	struct wire_hdr h = push_hdr(1 << 18, 1);
	int sent = 0, rc = 0;
	while (sent < 200 && (rc = loop_conn_send(lc, &h, v)) == 0)
		sent++;
	assert_int_equal(rc, TP_AGAIN);
	assert_true(sent < 100);
	assert_true(loop_conn_queued(lc) <= cap);
	assert_true(loop_conn_queued(lc) > 0);
	/* The loop serves another connection meanwhile. */
	assert_int_equal(transport_connect(s.tp, "127.0.0.1", s.port, 2000, &other), 0);
	struct wire_hdr small = push_hdr(4, 9);
	float *w = floats(4, 5);
	assert_int_equal(s.tp->send(other, &small, w), 0);
	expect_echo(s.tp, other, 4, 9, 5);
	free(w);
	free(v);
	s.tp->conn_free(deaf);
	s.tp->conn_free(other);
	srv_wait(&s, &s.closed, 2);
	srv_stop(&s);
}

/* A message sent without a copy (loop_conn_send_msg), counting its
 * release. */
struct owned_msg {
	struct loop_conn_msg m;	/* first */
	atomic_int *released;
};

static void owned_release(struct loop_conn_msg *m)
{
	atomic_fetch_add(((struct owned_msg *)m)->released, 1);
}

static void send_owned(struct loop_conn *lc, struct owned_msg *o, uint64_t key, const float *data,
		       uint64_t n, bool urgent, atomic_int *released)
{
	memset(o, 0, sizeof *o);
	o->m.tx.hdr = push_hdr(n, key);
	o->m.tx.payload = data;
	o->m.urgent = urgent;
	o->m.release = owned_release;
	o->released = released;
	assert_int_equal(loop_conn_send_msg(lc, &o->m), 0);
}

/* Urgent messages (the server's PUSH_ACKs) go ahead of every queued one
 * that is not, in their own order, but never ahead of a message partly
 * sent; each message is released once, after it went out. */
static void test_urgent_goes_ahead(void **state)
{
	(void)state;
	struct srv s;
	srv_start(&s);
	struct tp_conn *peer;
	assert_int_equal(transport_connect(s.tp, "127.0.0.1", s.port, 2000, &peer), 0);
	srv_wait(&s, &s.nconns, 1);
	struct loop_conn *lc = s.conns[0];
	/* 16 MiB to a peer not reading yet: partly sent, the rest queued. */
	uint64_t big = 4u << 20;
	float *v = floats(big, 3), *a = floats(4, 4);
	struct owned_msg o[5];
	atomic_int released = 0;
	send_owned(lc, &o[0], 1, v, big, false, &released);
	assert_true(loop_conn_queued(lc) > 0);
	send_owned(lc, &o[1], 2, a, 4, false, &released);
	send_owned(lc, &o[2], 3, a, 4, true, &released);
	send_owned(lc, &o[3], 4, a, 4, false, &released);
	send_owned(lc, &o[4], 5, a, 4, true, &released);
	assert_int_equal(atomic_load(&released), 0);
	uint64_t want[5] = {1, 3, 5, 2, 4};
	float *got = malloc(big * sizeof *got);
	for (int i = 0; i < 5; i++) {
		struct wire_hdr h;
		char why[256];
		assert_int_equal(s.tp->recv_header(peer, &h, why, sizeof why), 0);
		assert_int_equal(h.key, want[i]);
		assert_int_equal(s.tp->recv_payload(peer, got, h.payload_len), 0);
		assert_memory_equal(got, h.key == 1 ? v : a, h.payload_len);
	}
	for (int i = 0; i < 200 && atomic_load(&released) < 5; i++)
		usleep(10000);
	assert_int_equal(atomic_load(&released), 5);
	free(got);
	free(v);
	free(a);
	s.tp->conn_free(peer);
	srv_wait(&s, &s.closed, 1);
	srv_stop(&s);
}

/* Over IPC a message's data is read from the sender's memory, not from
 * the socket: a message whose header ends a round's burst is finished in
 * that round, or nothing would wake the loop for it (one message without
 * data, then eight with: the eighth's header is the burst's sixteenth
 * step). */
static void test_ipc_data_at_the_burst_end(void **state)
{
	(void)state;
	struct srv s;
	srv_start_on(&s, transport_ipc());
	s.echo = false;
	struct tp_conn *c;
	assert_int_equal(transport_connect(s.tp, "127.0.0.1", s.port, 2000, &c), 0);
	struct wire_hdr none = {.type = WIRE_HEARTBEAT};
	assert_int_equal(s.tp->send(c, &none, NULL), 0);
	float *v = floats(1000, 7);
	for (int i = 0; i < 8; i++) {
		struct wire_hdr h = push_hdr(1000, (uint64_t)(2 + i));
		assert_int_equal(s.tp->send(c, &h, v), 0);
	}
	srv_wait(&s, &s.messages, 9);
	assert_int_equal(srv_get(&s, &s.messages), 9);
	s.tp->conn_free(c);
	srv_wait(&s, &s.closed, 1);
	free(v);
	srv_stop(&s);
}

static void test_disconnect_mid_message(void **state)
{
	(void)state;
	struct srv s;
	srv_start(&s);
	int fd = raw_connect(s.port);
	uint8_t head[WIRE_HDR_SIZE];
	struct wire_hdr h = push_hdr(250, 1);
	wire_encode(&h, head);
	assert_int_equal(send(fd, head, sizeof head, MSG_NOSIGNAL), (ssize_t)sizeof head);
	assert_int_equal(send(fd, "0123456789", 10, MSG_NOSIGNAL), 10);
	usleep(20000);
	close(fd);
	srv_wait(&s, &s.closed, 1);
	assert_int_equal(s.last_rc, UNISUM_ECONN);
	assert_int_equal(srv_get(&s, &s.messages), 0);
	srv_stop(&s);
}

static void test_malformed_closes_one(void **state)
{
	(void)state;
	struct srv s;
	srv_start(&s);
	struct tp_conn *good;
	assert_int_equal(transport_connect(s.tp, "127.0.0.1", s.port, 2000, &good), 0);
	int fd = raw_connect(s.port);
	uint8_t junk[WIRE_HDR_SIZE];
	memset(junk, 0x5a, sizeof junk);
	assert_int_equal(send(fd, junk, sizeof junk, MSG_NOSIGNAL), (ssize_t)sizeof junk);
	srv_wait(&s, &s.closed, 1);
	assert_int_equal(s.last_rc, UNISUM_EPROTO);
	assert_non_null(strstr(s.last_why, "bad magic"));
	char b;
	assert_int_equal(recv(fd, &b, 1, 0), 0);	/* it hung up on the bad one */
	close(fd);
	struct wire_hdr h = push_hdr(8, 2);
	float *v = floats(8, 4);
	assert_int_equal(s.tp->send(good, &h, v), 0);
	expect_echo(s.tp, good, 8, 2, 4);
	free(v);
	s.tp->conn_free(good);
	srv_wait(&s, &s.closed, 2);
	srv_stop(&s);
}

/* ---- timers while every connection is idle ---- */

struct ticks {
	struct srv *s;
	struct loop_timer every, once;
	atomic_int n_every, n_once;
};

static void tick_every(struct loop_timer *t)
{
	struct ticks *k = t->arg;
	atomic_fetch_add(&k->n_every, 1);
}

static void tick_once(struct loop_timer *t)
{
	struct ticks *k = t->arg;
	atomic_fetch_add(&k->n_once, 1);
}

static void ticks_start(void *arg)
{
	struct ticks *k = arg;
	loop_timer_start(k->s->loop, &k->every, 50, 50, tick_every, k);
	loop_timer_start(k->s->loop, &k->once, 120, 0, tick_once, k);
}

static void ticks_stop(void *arg)
{
	struct ticks *k = arg;
	loop_timer_stop(k->s->loop, &k->every);
}

static void test_timer_while_idle(void **state)
{
	(void)state;
	struct srv s;
	srv_start(&s);
	struct tp_conn *c[3];
	for (int i = 0; i < 3; i++)
		assert_int_equal(transport_connect(s.tp, "127.0.0.1", s.port, 2000, &c[i]), 0);
	srv_wait(&s, &s.nconns, 3);
	static struct ticks k;
	memset(&k, 0, sizeof k);
	k.s = &s;
	k.every.slot = k.once.slot = -1;
	assert_int_equal(loop_post(s.loop, ticks_start, &k), 0);
	usleep(600000);
	assert_true(atomic_load(&k.n_every) >= 4);
	assert_int_equal(atomic_load(&k.n_once), 1);
	assert_int_equal(loop_post(s.loop, ticks_stop, &k), 0);
	usleep(100000);
	int n = atomic_load(&k.n_every);
	usleep(200000);
	assert_int_equal(atomic_load(&k.n_every), n);	/* stopped */
	assert_int_equal(srv_get(&s, &s.messages), 0);
	for (int i = 0; i < 3; i++)
		s.tp->conn_free(c[i]);
	srv_wait(&s, &s.closed, 3);
	srv_stop(&s);
}

static void test_handshake_on_the_loop(void **state)
{
	(void)state;
	assert_int_equal(auth_set_secret("loop-secret"), 0);
	struct srv s;
	srv_start(&s);
	struct tp_conn *c;
	assert_int_equal(transport_connect(s.tp, "127.0.0.1", s.port, 2000, &c), 0);
	struct wire_hdr h = push_hdr(5, 3);
	float *v = floats(5, 2);
	assert_int_equal(s.tp->send(c, &h, v), 0);
	expect_echo(s.tp, c, 5, 3, 2);
	free(v);
	/* No secret: a message where the answer should be is refused. */
	int fd = raw_connect(s.port);
	uint8_t junk[64] = {0};
	assert_int_equal(send(fd, junk, sizeof junk, MSG_NOSIGNAL), 64);
	srv_wait(&s, &s.closed, 1);
	assert_int_equal(s.last_rc, UNISUM_EAUTH);
	assert_int_equal(srv_get(&s, &s.messages), 1);
	close(fd);
	s.tp->conn_free(c);
	srv_wait(&s, &s.closed, 2);
	srv_stop(&s);
	auth_set_secret(NULL);
}

/* Drives the connector's handshake on c without blocking (poll), as a
 * worker does for all its servers at once: its result, the reason in why. */
static int connector_auth(const struct transport_ops *tp, struct tp_conn *c, char *why, size_t len)
{
	struct auth_state a = {.connector = true};
	struct pollfd p = {.fd = tp->nb_fd(c), .events = POLLIN};
	int rc;
	while ((rc = tp->auth_nb(c, &a, why, len)) == TP_AGAIN)
		assert_true(poll(&p, 1, 2000) == 1);
	return rc;
}

/* A fake acceptor on a raw socket: what it sends in place of the
 * challenge and the tag; the connector's side must name each failure. */
static int fake_acceptor(int lfd, const struct transport_ops *tp, int port, int how, char *why,
			 size_t len)
{
	struct tp_conn *c;
	assert_int_equal(tp->dial("127.0.0.1", port, 1000, &c), 0);
	int fd = accept(lfd, NULL, NULL);
	assert_true(fd >= 0);
	uint8_t challenge[36], tag[32];
	memcpy(challenge, how == 0 ? "JUNK" : AUTH_MAGIC, 4);
	auth_nonce(challenge + 4);
	assert_int_equal(send(fd, challenge, sizeof challenge, MSG_NOSIGNAL), 36);
	if (how == 1)
		close(fd);		/* hangs up after the challenge */
	if (how == 2) {			/* a tag made without the secret (sent
					 * ahead: this test has one thread) */
		memset(tag, 7, sizeof tag);
		assert_int_equal(send(fd, tag, sizeof tag, MSG_NOSIGNAL), 32);
	}
	int rc = connector_auth(tp, c, why, len);
	if (how != 1)
		close(fd);
	tp->conn_free(c);
	return rc;
}

static void test_connector_handshake_without_blocking(void **state)
{
	(void)state;
	assert_int_equal(auth_set_secret("loop-secret"), 0);
	struct srv s;
	srv_start(&s);
	struct tp_conn *c;
	char why[256] = "";
	assert_int_equal(s.tp->dial("127.0.0.1", s.port, 2000, &c), 0);
	assert_int_equal(connector_auth(s.tp, c, why, sizeof why), 0);
	struct wire_hdr h = push_hdr(5, 3);
	float *v = floats(5, 2);
	assert_int_equal(s.tp->send(c, &h, v), 0);
	free(v);
	srv_wait(&s, &s.messages, 1);
	s.tp->conn_free(c);
	srv_wait(&s, &s.closed, 1);
	srv_stop(&s);

	int lfd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in sa = {.sin_family = AF_INET};
	socklen_t sl = sizeof sa;
	inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
	assert_int_equal(bind(lfd, (struct sockaddr *)&sa, sizeof sa), 0);
	assert_int_equal(listen(lfd, 4), 0);
	assert_int_equal(getsockname(lfd, (struct sockaddr *)&sa, &sl), 0);
	int port = ntohs(sa.sin_port);
	assert_int_equal(fake_acceptor(lfd, s.tp, port, 0, why, sizeof why), UNISUM_EAUTH);
	assert_non_null(strstr(why, "sent no authentication challenge"));
	assert_int_equal(fake_acceptor(lfd, s.tp, port, 1, why, sizeof why), UNISUM_EAUTH);
	assert_non_null(strstr(why, "hung up during the handshake"));
	assert_int_equal(fake_acceptor(lfd, s.tp, port, 2, why, sizeof why), UNISUM_EAUTH);
	assert_non_null(strstr(why, "does not know the job secret"));
	close(lfd);
	auth_set_secret(NULL);
}

int main(void)
{
	struct rlimit r;
	getrlimit(RLIMIT_NOFILE, &r);
	if (r.rlim_cur < 2 * MAX_CONNS && r.rlim_max >= 2 * MAX_CONNS) {
		r.rlim_cur = 2 * MAX_CONNS;
		setrlimit(RLIMIT_NOFILE, &r);
	}
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_many_connections),
		cmocka_unit_test(test_one_byte_at_a_time),
		cmocka_unit_test(test_never_reads),
		cmocka_unit_test(test_urgent_goes_ahead),
		cmocka_unit_test(test_ipc_data_at_the_burst_end),
		cmocka_unit_test(test_disconnect_mid_message),
		cmocka_unit_test(test_malformed_closes_one),
		cmocka_unit_test(test_timer_while_idle),
		cmocka_unit_test(test_handshake_on_the_loop),
		cmocka_unit_test(test_connector_handshake_without_blocking),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
