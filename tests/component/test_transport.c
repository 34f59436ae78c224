/*
 * test_transport.c - the two transports against one contract, over real
 * sockets in one process: TCP and IPC deliver the same messages (control
 * payloads, tensor data, zero-filled pushes) and the receiver sees no
 * difference; IPC passes tensor data by address (changing the sender's
 * buffer before the receiver reads it shows in what it reads), names its
 * peer by the pid the kernel gives, refuses nothing TCP accepts, and fails
 * a read whose sender exited with UNISUM_ECONN; TCP refuses the IPC flag;
 * connecting where nobody listens fails at once for IPC.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <arpa/inet.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "log/log.h"
#include "timing/timing.h"
#include "transport/auth.h"
#include "transport/transport.h"
#include "wire/wire.h"
#ifdef UNISUM_HAVE_UCX
#include "transport/ucx/ucx_int.h"
#endif

/* A connected pair of transport tp: *a connected, *b accepted. */
struct pair {
	const struct transport_ops *tp;
	struct tp_listener *tcp_l, *l;
	struct tp_conn *a, *b;
};

static void pair_open(struct pair *p, const struct transport_ops *tp)
{
	memset(p, 0, sizeof *p);
	p->tp = tp;
	int port = 0, got = 0;
	/* The IPC listener is named after a TCP address: take a real one. */
	if (tp != transport_tcp() && tp != transport_ipc())	/* UCX listens itself */
		assert_int_equal(tp->listen("127.0.0.1", 0, &p->l, &port), 0);
	else
		assert_int_equal(transport_tcp()->listen("127.0.0.1", 0, &p->tcp_l, &port), 0);
	if (p->l != NULL)
		got = port;
	else if (tp == transport_ipc())
		assert_int_equal(tp->listen("127.0.0.1", port, &p->l, &got), 0);
	else
		p->l = p->tcp_l, p->tcp_l = NULL, got = port;
	assert_int_equal(got, port);
	assert_int_equal(transport_connect(tp, "127.0.0.1", port, 1000, &p->a), 0);
	assert_int_equal(tp->accept(p->l, &p->b), 0);
	char why[256];
	assert_int_equal(tp->authenticate(p->b, false, why, sizeof why), 0);
}

static void pair_close(struct pair *p)
{
	p->tp->conn_free(p->a);
	p->tp->conn_free(p->b);
	p->tp->listener_free(p->l);
	if (p->tcp_l != NULL)
		transport_tcp()->listener_free(p->tcp_l);
}

static struct wire_hdr data_hdr(uint8_t type, uint64_t count)
{
	struct wire_hdr h = {.type = type, .sender = 3, .round = 7, .key = 0x1234, .count = count,
			     .dtype = UNISUM_FLOAT32, .payload_len = count * 4};
	return h;
}

/* Every kind of message, through tp, arrives as sent. */
static void check_messages(const struct transport_ops *tp)
{
	struct pair p;
	pair_open(&p, tp);
	char why[256];
	struct wire_hdr h;

	/* A control payload. */
	const char name[] = "layer1.weight";
	struct wire_hdr ctl = {.type = WIRE_DECLARE_CHECK, .sender = 3, .key = 9, .count = 5,
			       .dtype = UNISUM_INT32, .payload_len = sizeof name};
	assert_int_equal(tp->send(p.a, &ctl, name), 0);
	assert_int_equal(tp->recv_header(p.b, &h, why, sizeof why), 0);
	assert_int_equal(h.type, WIRE_DECLARE_CHECK);
	assert_int_equal(h.payload_len, sizeof name);
	char got_name[sizeof name];
	assert_int_equal(tp->recv_payload(p.b, got_name, sizeof got_name), 0);
	assert_string_equal(got_name, name);

	/* Tensor data both ways, in two reads on one side (small enough that
	 * the sockets hold it before anyone reads: one thread here). */
	enum { N = 4096 };
	float *in = malloc(N * sizeof *in), *out = calloc(N, sizeof *out);
	assert_non_null(in);
	assert_non_null(out);
	for (int i = 0; i < N; i++)
		in[i] = (float)i * 0.5f;
	struct wire_hdr push = data_hdr(WIRE_PUSH, N);
	assert_int_equal(tp->send(p.a, &push, in), 0);
	assert_int_equal(tp->recv_header(p.b, &h, why, sizeof why), 0);
	assert_int_equal(h.type, WIRE_PUSH);
	assert_int_equal(h.flags, 0);
	assert_int_equal(h.payload_len, (uint64_t)N * 4);
	assert_int_equal(tp->recv_payload(p.b, out, 4000), 0);
	assert_int_equal(tp->recv_payload(p.b, out + 1000, (N - 1000) * 4), 0);
	assert_memory_equal(in, out, N * sizeof *in);
	memset(out, 0, N * sizeof *out);
	struct wire_hdr reply = data_hdr(WIRE_PULL_REPLY, N);
	assert_int_equal(tp->send(p.b, &reply, in), 0);
	assert_int_equal(tp->recv_header(p.a, &h, why, sizeof why), 0);
	assert_int_equal(h.type, WIRE_PULL_REPLY);
	assert_int_equal(h.payload_len, (uint64_t)N * 4);
	assert_int_equal(tp->recv_payload(p.a, out, (size_t)h.payload_len), 0);
	assert_memory_equal(in, out, N * sizeof *in);

	/* Data the receiver throws away, then a zero-filled push: nothing
	 * follows its header. */
	assert_int_equal(tp->send(p.a, &push, in), 0);
	assert_int_equal(tp->recv_header(p.b, &h, why, sizeof why), 0);
	assert_int_equal(tp->recv_payload(p.b, NULL, (size_t)h.payload_len), 0);
	struct wire_hdr zero = data_hdr(WIRE_PUSH, N);
	zero.flags = WIRE_FLAG_ZERO;
	zero.aux = WIRE_OP(WIRE_OP_BROADCAST, 1);	/* a broadcast's non-root */
	zero.payload_len = 0;
	assert_int_equal(tp->send(p.a, &zero, NULL), 0);
	struct wire_hdr beat = {.type = WIRE_HEARTBEAT, .sender = 3};
	assert_int_equal(tp->send(p.a, &beat, NULL), 0);
	assert_int_equal(tp->recv_header(p.b, &h, why, sizeof why), 0);
	assert_int_equal(h.flags, WIRE_FLAG_ZERO);
	assert_int_equal(h.payload_len, 0);
	assert_int_equal(tp->recv_header(p.b, &h, why, sizeof why), 0);
	assert_int_equal(h.type, WIRE_HEARTBEAT);

	/* A shut-down connection fails the peer's receive. */
	tp->conn_shutdown(p.a);
	assert_int_equal(tp->recv_header(p.b, &h, why, sizeof why), UNISUM_ECONN);
	free(in);
	free(out);
	pair_close(&p);
}

static void test_tcp_messages(void **state)
{
	(void)state;
	check_messages(transport_tcp());
}

static void test_ipc_messages(void **state)
{
	(void)state;
	check_messages(transport_ipc());
}

/* IPC sends the address: the receiver reads the sender's buffer as it is
 * when it reads, and knows the sender's pid from the kernel. */
static void test_ipc_is_by_address(void **state)
{
	(void)state;
	struct pair p;
	pair_open(&p, transport_ipc());
	char expect[64];
	snprintf(expect, sizeof expect, "pid %d", (int)getpid());
	assert_non_null(strstr(transport_ipc()->peer_name(p.a), expect));
	assert_non_null(strstr(transport_ipc()->peer_name(p.b), expect));
	int32_t buf[4] = {1, 2, 3, 4}, out[4];
	struct wire_hdr push = data_hdr(WIRE_PUSH, 4);
	push.dtype = UNISUM_INT32;
	assert_int_equal(transport_ipc()->send(p.a, &push, buf), 0);
	buf[2] = 33;
	struct wire_hdr h;
	char why[256];
	assert_int_equal(transport_ipc()->recv_header(p.b, &h, why, sizeof why), 0);
	assert_int_equal(transport_ipc()->recv_payload(p.b, out, sizeof out), 0);
	assert_int_equal(out[2], 33);
	pair_close(&p);
}

/* A sender that gives up on the connection (its operation failed, its
 * caller may free the buffer) before the data was read: the receiver does
 * not use what it reads, it sees a lost connection.  A later connection
 * (which may reuse the guard) lends as before. */
static void test_ipc_sender_let_go(void **state)
{
	(void)state;
	for (int i = 0; i < 2; i++) {
		struct pair p;
		pair_open(&p, transport_ipc());
		int32_t buf[4] = {1, 2, 3, 4}, out[4] = {0};
		struct wire_hdr push = data_hdr(WIRE_PUSH, 4), h;
		push.dtype = UNISUM_INT32;
		char why[256];
		assert_int_equal(transport_ipc()->send(p.a, &push, buf), 0);
		assert_int_equal(transport_ipc()->recv_header(p.b, &h, why, sizeof why), 0);
		assert_int_equal(transport_ipc()->recv_payload(p.b, out, sizeof out), 0);
		assert_int_equal(out[3], 4);
		assert_int_equal(transport_ipc()->send(p.a, &push, buf), 0);
		transport_ipc()->conn_shutdown(p.a);
		buf[0] = -1;	/* what a freed buffer may hold */
		assert_int_equal(transport_ipc()->recv_header(p.b, &h, why, sizeof why), 0);
		assert_int_equal(transport_ipc()->recv_payload(p.b, out, sizeof out), UNISUM_ECONN);
		assert_non_null(strstr(log_last_error(), "let go"));
		pair_close(&p);
	}
}

/* A sender that exits before its data was read: the read fails as a lost
 * connection, not with garbage. */
static void test_ipc_sender_gone(void **state)
{
	(void)state;
	int port = 0, got = 0;
	struct tp_listener *tcp_l, *l;
	assert_int_equal(transport_tcp()->listen("127.0.0.1", 0, &tcp_l, &port), 0);
	assert_int_equal(transport_ipc()->listen("127.0.0.1", port, &l, &got), 0);
	pid_t child = fork();
	assert_true(child >= 0);
	if (child == 0) {
		struct tp_conn *c;
		static float data[1024];
		struct wire_hdr push = data_hdr(WIRE_PUSH, 1024);
		if (transport_connect(transport_ipc(), "127.0.0.1", port, 1000, &c) != 0 ||
		    transport_ipc()->send(c, &push, data) != 0)
			_exit(1);
		_exit(0);
	}
	struct tp_conn *b;
	assert_int_equal(transport_ipc()->accept(l, &b), 0);
	struct wire_hdr h;
	char why[256];
	assert_int_equal(transport_ipc()->recv_header(b, &h, why, sizeof why), 0);
	int status;
	assert_int_equal(waitpid(child, &status, 0), child);
	assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	static float out[1024];
	assert_int_equal(transport_ipc()->recv_payload(b, out, sizeof out), UNISUM_ECONN);
	transport_ipc()->conn_free(b);
	transport_ipc()->listener_free(l);
	transport_tcp()->listener_free(tcp_l);
}

/* By address is IPC's alone: a TCP receiver refuses the flag. */
static void test_tcp_refuses_ipc_flag(void **state)
{
	(void)state;
	struct pair p;
	pair_open(&p, transport_tcp());
	struct wire_hdr push = data_hdr(WIRE_PUSH, 4);
	push.flags = WIRE_FLAG_IPC;
	push.payload_len = WIRE_IPC_PAYLOAD;
	uint64_t ref[3] = {0x1000, 0x2000, 7};	/* data, guard, its value */
	_Static_assert(sizeof ref == WIRE_IPC_PAYLOAD, "an IPC reference is three u64s");
	assert_int_equal(transport_tcp()->send(p.a, &push, ref), 0);
	struct wire_hdr h;
	char why[256];
	assert_int_equal(transport_tcp()->recv_header(p.b, &h, why, sizeof why), UNISUM_EPROTO);
	assert_non_null(strstr(why, "TCP"));
	pair_close(&p);
}

/* Nobody listening for IPC: connect fails at once (the worker falls back
 * to TCP), even with a long timeout for a refused TCP connection. */
static void test_ipc_nobody_listening(void **state)
{
	(void)state;
	int port = 0;
	struct tp_listener *tcp_l;
	assert_int_equal(transport_tcp()->listen("127.0.0.1", 0, &tcp_l, &port), 0);
	struct tp_conn *c = NULL;
	assert_int_equal(transport_connect(transport_ipc(), "127.0.0.1", port, 0, &c), UNISUM_ECONN);
	assert_null(c);
	struct tp_listener *l;
	int got;
	assert_int_not_equal(transport_ipc()->listen("127.0.0.1", 0, &l, &got), 0);
	transport_tcp()->listener_free(tcp_l);
}


/* ---- UCX: the same contract, and what is its own ---- */

/* The UCX transport, or NULL after reporting SKIPPED with the reason
 * (which fails the test as root: CI installs UCX). */
static const struct transport_ops *ucx_or_skip(void)
{
	char why[400];
	const struct transport_ops *tp = transport_ucx(why, sizeof why);
	if (tp == NULL && geteuid() == 0)
		fail_msg("the UCX transport is not here, and as root nothing is skipped: %s", why);
	if (tp == NULL) {
		printf("SKIPPED: %s\n", why);
		skip();
	}
	return tp;
}

static void test_ucx_messages(void **state)
{
	(void)state;
	const struct transport_ops *tp = ucx_or_skip();
	if (tp != NULL)
		check_messages(tp);
}

/* Large tensor data (UCX's rendezvous: the receiver names the buffer
 * after the header) both ways, many messages in flight, in order. */
static void test_ucx_large_in_order(void **state)
{
	(void)state;
	const struct transport_ops *tp = ucx_or_skip();
	enum { N = 1 << 20, MSGS = 6 };
	struct pair p;
	pair_open(&p, tp);
	float *in[MSGS], *out = malloc(N * sizeof *out);
	assert_non_null(out);
	for (int m = 0; m < MSGS; m++) {
		assert_non_null(in[m] = malloc(N * sizeof(float)));
		for (int i = 0; i < N; i++)
			in[m][i] = (float)(i % 1000) + (float)m;
		struct wire_hdr push = data_hdr(WIRE_PUSH, N - (uint64_t)m);
		push.round = (uint32_t)m;
		assert_int_equal(tp->send(p.a, &push, in[m]), 0);
	}
	for (int m = 0; m < MSGS; m++) {
		struct wire_hdr h;
		char why[256];
		assert_int_equal(tp->recv_header(p.b, &h, why, sizeof why), 0);
		assert_int_equal(h.round, m);
		assert_int_equal(h.payload_len, (uint64_t)(N - m) * 4);
		assert_int_equal(tp->recv_payload(p.b, out, (size_t)h.payload_len), 0);
		assert_memory_equal(out, in[m], (size_t)h.payload_len);
	}
	for (int m = 0; m < MSGS; m++)
		free(in[m]);
	free(out);
	pair_close(&p);
}

/* Memory registered once (mem_register: ucp_mem_map) carries its
 * registration into the sends from it and the rendezvous receives into
 * it, and the bytes arrive unchanged; unregistered, it is forgotten;
 * what is too small to need one, or was never registered, is ignored. */
static void test_ucx_registered_memory(void **state)
{
	(void)state;
	const struct transport_ops *tp = ucx_or_skip();
	if (tp == NULL)
		return;
#ifdef UNISUM_HAVE_UCX
	enum { N = 1 << 20, MSGS = 3 };
	struct pair p;
	pair_open(&p, tp);
	float *in = malloc(N * sizeof *in), *out = malloc(N * sizeof *out);
	assert_non_null(in);
	assert_non_null(out);
	size_t regions0, regions;
	unsigned long long uses0, uses;
	ucx_mem_stats(&regions0, &uses0);
	tp->mem_register(in, N * sizeof *in);
	tp->mem_register(out, N * sizeof *out);
	char small[64];
	tp->mem_register(small, sizeof small);	/* below UCX_REG_MIN: not registered */
	ucx_mem_stats(&regions, &uses);
	assert_int_equal(regions, regions0 + 2);
	for (int m = 0; m < MSGS; m++) {
		for (int i = 0; i < N; i++)
			in[i] = (float)(i % 977) * 0.5f + (float)m;
		struct wire_hdr push = data_hdr(WIRE_PUSH, N - (uint64_t)m);	/* inside the region */
		assert_int_equal(tp->send(p.a, &push, in + m), 0);
		struct wire_hdr h;
		char why[256];
		assert_int_equal(tp->recv_header(p.b, &h, why, sizeof why), 0);
		assert_int_equal(tp->recv_payload(p.b, out, (size_t)h.payload_len), 0);
		assert_memory_equal(out, in + m, (size_t)h.payload_len);
	}
	ucx_mem_stats(&regions, &uses);
	assert_true(uses - uses0 >= 2 * MSGS);	/* every send, every rendezvous receive */
	assert_int_equal(tp->lent_settle(5000), 0);	/* the sends ended: unregistering is safe */
	tp->mem_unregister(in);
	tp->mem_unregister(out);
	tp->mem_unregister(small);
	tp->mem_unregister(in);	/* twice: ignored */
	ucx_mem_stats(&regions, &uses);
	assert_int_equal(regions, regions0);
	free(in);
	free(out);
	pair_close(&p);
#endif
}

/* Lent payloads that UCX still reads are counted: lent_settle waits for
 * them, bounded, and a shutdown's close ends them (cancelled), so that a
 * worker told its operation failed lets go of no buffer a send still
 * reads.  Rendezvous sends that the receiver never takes stay under
 * way until then. */
static void test_ucx_lent_settle(void **state)
{
	(void)state;
	const struct transport_ops *tp = ucx_or_skip();
	if (tp == NULL)
		return;
	enum { N = 1 << 20, MSGS = 3 };
	struct pair p;
	pair_open(&p, tp);
	float *in = calloc(N, sizeof *in);
	assert_non_null(in);
	assert_int_equal(tp->lent_settle(1000), 0);	/* nothing lent yet */
	for (int m = 0; m < MSGS; m++) {
		struct wire_hdr push = data_hdr(WIRE_PUSH, N);
		push.round = (uint32_t)m;
		assert_int_equal(tp->send(p.a, &push, in), 0);
	}
	int64_t t0 = timing_now_ms();
	int left = tp->lent_settle(300);
	assert_true(left > 0);	/* nobody received them: under way */
	assert_true(timing_now_ms() - t0 >= 250);
	tp->conn_shutdown(p.a);	/* its close cancels them */
	t0 = timing_now_ms();
	assert_int_equal(tp->lent_settle(5000), 0);
	assert_true(timing_now_ms() - t0 < 3000);
	free(in);
	pair_close(&p);
}

enum { BIG = 3 << 18 };	/* floats: 3 MiB, a rendezvous over TCP */

/* What a child of ucx_child() runs (this program again, by exec: UCX
 * does not live through fork): connect to port over UCX with secret
 * ("-": none), send a heartbeat, then by mode: exit (1 if any of it
 * failed); linger, waiting to be killed; or big: send BIG floats 0, 1,
 * 2, ... copied (compressed, not lent), a heartbeat from sender 7, and
 * close the connection. */
static int ucx_child_main(int port, const char *secret, const char *mode)
{
	bool linger = strcmp(mode, "linger") == 0;
	char why[256];
	auth_set_secret(strcmp(secret, "-") == 0 ? NULL : secret);
	const struct transport_ops *tp = transport_ucx(why, sizeof why);
	struct tp_conn *c;
	struct wire_hdr beat = {.type = WIRE_HEARTBEAT, .sender = 1};
	if (tp == NULL || transport_connect(tp, "127.0.0.1", port, 5000, &c) != 0 ||
	    tp->send(c, &beat, NULL) != 0)
		return 1;
	while (linger)
		pause();
	if (strcmp(mode, "big") != 0)
		return 0;
	float *in = malloc(BIG * sizeof *in);
	for (int i = 0; in != NULL && i < BIG; i++)
		in[i] = (float)i;
	struct wire_hdr big = data_hdr(WIRE_PUSH, BIG);
	big.flags = WIRE_FLAG_COMPRESSED;	/* a copy, not lent (ucx_lends) */
	beat.sender = 7;
	if (in == NULL || tp->send(c, &big, in) != 0 || tp->send(c, &beat, NULL) != 0)
		return 1;
	tp->conn_free(c);	/* the last words go first, then BYE */
	free(in);
	return 0;
}

static pid_t ucx_child(int port, const char *secret, const char *mode)
{
	pid_t child = fork();
	assert_true(child >= 0);
	if (child != 0)
		return child;
	if (strcmp(mode, "exit") == 0)	/* a refused one: its error is the test's (ucx_refused) */
		dup2(STDOUT_FILENO, STDERR_FILENO);
	char port_s[16];
	snprintf(port_s, sizeof port_s, "%d", port);
	execl("/proc/self/exe", "test_transport", "--ucx-child", port_s, secret != NULL ? secret : "-",
	      mode, (char *)NULL);
	_exit(127);
}

/* A listener here, a child of ucx_child() in `mode` connected to it, its
 * connection accepted and the child's first heartbeat read. */
static pid_t ucx_child_heard(const struct transport_ops *tp, const char *mode,
			     struct tp_listener **l, struct tp_conn **b)
{
	int port;
	assert_int_equal(tp->listen("127.0.0.1", 0, l, &port), 0);
	pid_t child = ucx_child(port, NULL, mode);
	assert_int_equal(tp->accept(*l, b), 0);
	char why[256];
	assert_int_equal(tp->authenticate(*b, false, why, sizeof why), 0);
	struct wire_hdr h;
	assert_int_equal(tp->recv_header(*b, &h, why, sizeof why), 0);
	assert_int_equal(h.type, WIRE_HEARTBEAT);
	return child;
}

/* A peer killed: its connection breaks (UNISUM_ECONN) within seconds,
 * as a reset socket would, and no receive hangs. */
static void test_ucx_dead_peer(void **state)
{
	(void)state;
	const struct transport_ops *tp = ucx_or_skip();
	struct tp_listener *l;
	struct tp_conn *b;
	pid_t child = ucx_child_heard(tp, "linger", &l, &b);
	char why[256];
	struct wire_hdr h;
	kill(child, SIGKILL);
	waitpid(child, NULL, 0);
	int64_t t0 = timing_now_ms();
	assert_int_equal(tp->recv_header(b, &h, why, sizeof why), UNISUM_ECONN);
	assert_true(timing_now_ms() - t0 < 30000);
	tp->conn_free(b);
	tp->listener_free(l);
}

/* A peer in another process sends 3 MiB copied (a rendezvous over TCP)
 * and a heartbeat, and closes: both arrive whole, then the end, within
 * seconds (BYE goes once its copies went). */
static void test_ucx_last_words(void **state)
{
	(void)state;
	const struct transport_ops *tp = ucx_or_skip();
	struct tp_listener *l;
	struct tp_conn *b;
	pid_t child = ucx_child_heard(tp, "big", &l, &b);
	char why[256];
	struct wire_hdr h;
	float *out = malloc(BIG * sizeof *out);
	assert_non_null(out);
	assert_int_equal(tp->recv_header(b, &h, why, sizeof why), 0);
	assert_int_equal(h.payload_len, (uint64_t)BIG * 4);
	assert_int_equal(tp->recv_payload(b, out, (size_t)h.payload_len), 0);
	for (int i = 0; i < BIG; i++)
		if (out[i] != (float)i)
			fail_msg("element %d is %g", i, (double)out[i]);
	free(out);
	assert_int_equal(tp->recv_header(b, &h, why, sizeof why), 0);
	assert_int_equal(h.sender, 7);
	int64_t t0 = timing_now_ms();
	assert_int_equal(tp->recv_header(b, &h, why, sizeof why), UNISUM_ECONN);
	assert_true(timing_now_ms() - t0 < 5000);
	int status;
	assert_int_equal(waitpid(child, &status, 0), child);
	assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	tp->conn_free(b);
	tp->listener_free(l);
}

/* A child connecting with `secret` (NULL: none) to a listener here with
 * the job's own secret (mine true) or none: it is refused before any UCX
 * code reads its worker's address (the request's tag), and fails at once
 * with why, which *out holds; the listener makes no connection. */
static void ucx_refused(const char *secret, bool mine, char *out, size_t len)
{
	const struct transport_ops *tp = ucx_or_skip();
	assert_int_equal(auth_set_secret(mine ? "the job's secret" : NULL), 0);
	struct tp_listener *l;
	int port, fds[2];
	assert_int_equal(tp->listen("127.0.0.1", 0, &l, &port), 0);
	assert_int_equal(pipe(fds), 0);
	fflush(stdout);
	int saved = dup(STDOUT_FILENO);
	dup2(fds[1], STDOUT_FILENO);	/* the child's errors (ucx_child) */
	int64_t t0 = timing_now_ms();
	pid_t child = ucx_child(port, secret != NULL ? secret : "-", "exit");
	dup2(saved, STDOUT_FILENO);
	close(saved);
	close(fds[1]);
	int status;
	assert_int_equal(waitpid(child, &status, 0), child);
	assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 1);
	assert_true(timing_now_ms() - t0 < 5000);	/* at once, not at its timeout */
	ssize_t n = read(fds[0], out, len - 1);
	out[n > 0 ? n : 0] = '\0';
	close(fds[0]);
	struct tp_conn *b;
	assert_int_equal(tp->accept_nb(l, &b), TP_AGAIN);
	tp->listener_free(l);
	auth_set_secret(NULL);
}

/* A peer with another secret is refused over UCX as over TCP. */
static void test_ucx_wrong_secret(void **state)
{
	(void)state;
	char why[2048];
	ucx_refused("another secret", true, why, sizeof why);
	assert_non_null(strstr(why, "refused this node's UNISUM_SECRET"));
}

/* A secret on one side only: refused both ways, the side without one
 * told to set the variable. */
static void test_ucx_secret_on_one_side(void **state)
{
	(void)state;
	char why[2048];
	ucx_refused("-", true, why, sizeof why);
	assert_non_null(strstr(why, "asks for the job secret (UNISUM_SECRET)"));
	ucx_refused("the job's secret", false, why, sizeof why);
	assert_non_null(strstr(why, "refused this node's UNISUM_SECRET"));
}

/* A stranger connects to port and sends len bytes of what (none: it
 * stays, its socket returned); otherwise it waits for the listener to
 * close the connection, which must come within 6 s. */
static int stranger(int port, const void *what, size_t len)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	assert_true(fd >= 0);
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
				 .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
	if (len == 0)
		return fd;
	assert_int_equal(send(fd, what, len, MSG_NOSIGNAL), (ssize_t)len);
	struct timeval tv = {.tv_sec = 6};
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	char buf[256];
	ssize_t n;
	while ((n = recv(fd, buf, sizeof buf, 0)) > 0)
		;	/* (a refusal's answer) */
	if (!(n == 0 || errno == ECONNRESET))
		fail_msg("stranger %zu bytes: recv %zd, %s", len, n, strerror(errno));	/* closed (reset: bytes left unread) */
	close(fd);
	return -1;
}

/* Sends port a well-formed request (a real worker's address, its tag)
 * and resets the connection at once. */
static void reset_after_request(int port)
{
	char why[256];
	struct ucx_ctx *u = ucx_ctx_get(why, sizeof why);
	assert_non_null(u);
	ucp_worker_h w;
	assert_int_equal(ucx_worker_new(u, &w, why, sizeof why), 0);
	static uint8_t req[44 + 65536];	/* a worker's address is at most 64 KiB */
	size_t n = ucx_worker_address(u, w, req + 44, sizeof req - 44);
	assert_true(n > 0);
	memcpy(req, "UNISUMX1", 8);
	uint32_t be = htonl((uint32_t)n);
	memcpy(req + 8, &be, 4);
	auth_digest("ucx-request", req + 44, n, req + 12);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
				 .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
	assert_int_equal(send(fd, req, 44 + n, MSG_NOSIGNAL), (ssize_t)(44 + n));
	struct linger reset = {.l_onoff = 1, .l_linger = 0};
	setsockopt(fd, SOL_SOCKET, SO_LINGER, &reset, sizeof reset);
	close(fd);
	ucx_worker_free(u, w);
	ucx_ctx_put(u);
}

/* Strangers on a UCX listener's port are closed, each alone, and no UCX
 * code reads their bytes (UCX 1.13's own listener aborted the process on
 * the zeros and the HTTP request): zeros, an HTTP request, a request
 * naming an impossible length, and one naming noise as its worker's
 * address (its tag wrong: UCX never sees it).  A real peer connects
 * after them, while a silent stranger still holds its connection, and
 * its messages go both ways; then one resets right after its request. */
static void test_ucx_strangers(void **state)
{
	(void)state;
	const struct transport_ops *tp = ucx_or_skip();
	struct tp_listener *l;
	int port;
	assert_int_equal(tp->listen("127.0.0.1", 0, &l, &port), 0);
	int silent = stranger(port, NULL, 0);
	uint8_t zeros[40] = {0}, noise[44 + 64] = {0};	/* magic, length, tag, address */
	stranger(port, zeros, sizeof zeros);
	const char http[] = "GET / HTTP/1.0\r\n\r\n";
	stranger(port, http, strlen(http));
	stranger(port, "UNISUMX1\xff\xff\xff\xff", 12);
	memcpy(noise, "UNISUMX1\0\0\0\x40", 12);
	for (size_t i = 44; i < sizeof noise; i++)
		noise[i] = (uint8_t)(i * 37 + 11);
	stranger(port, noise, sizeof noise);	/* UCX 1.13 aborts on such an address */
	struct tp_conn *a, *b;
	assert_int_equal(transport_connect(tp, "127.0.0.1", port, 5000, &a), 0);
	assert_int_equal(tp->accept(l, &b), 0);
	char why[256];
	assert_int_equal(tp->authenticate(b, false, why, sizeof why), 0);
	struct wire_hdr beat = {.type = WIRE_HEARTBEAT, .sender = 3}, h;
	assert_int_equal(tp->send(a, &beat, NULL), 0);
	assert_int_equal(tp->recv_header(b, &h, why, sizeof why), 0);
	assert_int_equal(h.type, WIRE_HEARTBEAT);
	beat.sender = 4;
	assert_int_equal(tp->send(b, &beat, NULL), 0);
	assert_int_equal(tp->recv_header(a, &h, why, sizeof why), 0);
	assert_int_equal(h.sender, 4);
	close(silent);
	tp->conn_free(a);
	tp->conn_free(b);
	/* A request whose sender resets its socket at once (its answer
	 * cannot go): the listener goes on, and a dial after it ends (the
	 * UCX thread once waited there for ever on a connection it freed). */
	reset_after_request(port);
	assert_int_equal(transport_connect(tp, "127.0.0.1", port, 5000, &a), 0);
	tp->conn_free(a);
	tp->listener_free(l);
}

/* What closing one end of a connection shows at the other: what it
 * sent last, then its end, within seconds. */
static void check_closed_by(const struct transport_ops *tp, struct tp_conn *closing,
			    struct tp_conn *other)
{
	char why[256];
	struct wire_hdr beat = {.type = WIRE_HEARTBEAT, .sender = 5}, h;
	assert_int_equal(tp->send(closing, &beat, NULL), 0);
	tp->conn_free(closing);
	int64_t t0 = timing_now_ms();
	assert_int_equal(tp->recv_header(other, &h, why, sizeof why), 0);	/* its last word */
	assert_int_equal(h.sender, 5);
	assert_int_equal(tp->recv_header(other, &h, why, sizeof why), UNISUM_ECONN);
	assert_true(timing_now_ms() - t0 < 5000);
	tp->conn_free(other);
}

/* Three connections between the same two processes (here one): the
 * dialler of one closes it, the acceptor of another (UCX does not tell
 * the peer of an endpoint closed: BYE does), and the third stays whole,
 * both ways (UCX pairs endpoints made from addresses by a count, which
 * one worker a dial keeps exact). */
static void test_ucx_close_one_of_three(void **state)
{
	(void)state;
	const struct transport_ops *tp = ucx_or_skip();
	struct pair p, q, r;
	pair_open(&p, tp);
	pair_open(&q, tp);
	pair_open(&r, tp);
	check_closed_by(tp, p.a, p.b);
	check_closed_by(tp, q.b, q.a);
	tp->listener_free(p.l);
	tp->listener_free(q.l);
	char why[256];
	struct wire_hdr beat = {.type = WIRE_HEARTBEAT, .sender = 5}, h;
	assert_int_equal(tp->send(r.a, &beat, NULL), 0);
	assert_int_equal(tp->recv_header(r.b, &h, why, sizeof why), 0);
	assert_int_equal(h.sender, 5);
	beat.sender = 6;
	assert_int_equal(tp->send(r.b, &beat, NULL), 0);
	assert_int_equal(tp->recv_header(r.a, &h, why, sizeof why), 0);
	assert_int_equal(h.sender, 6);
	pair_close(&r);
}

/* Nobody listening: dialling fails after its timeout, naming the place. */
static void test_ucx_nobody_listening(void **state)
{
	(void)state;
	const struct transport_ops *tp = ucx_or_skip();
	int port = 0;
	struct tp_listener *tcp_l;
	assert_int_equal(transport_tcp()->listen("127.0.0.1", 0, &tcp_l, &port), 0);
	transport_tcp()->listener_free(tcp_l);	/* a port nobody has */
	struct tp_conn *c = NULL;
	assert_int_equal(tp->dial("127.0.0.1", port, 300, &c), UNISUM_ECONN);
	assert_null(c);
	char expect[64];
	snprintf(expect, sizeof expect, "127.0.0.1:%d", port);
	assert_non_null(strstr(log_last_error(), expect));
}

int main(int argc, char **argv)
{
	if (argc == 5 && strcmp(argv[1], "--ucx-child") == 0)
		return ucx_child_main(atoi(argv[2]), argv[3], argv[4]);
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_tcp_messages),
		cmocka_unit_test(test_ipc_messages),
		cmocka_unit_test(test_ipc_is_by_address),
		cmocka_unit_test(test_ipc_sender_let_go),
		cmocka_unit_test(test_ipc_sender_gone),
		cmocka_unit_test(test_tcp_refuses_ipc_flag),
		cmocka_unit_test(test_ipc_nobody_listening),
		cmocka_unit_test(test_ucx_messages),
		cmocka_unit_test(test_ucx_large_in_order),
		cmocka_unit_test(test_ucx_registered_memory),
		cmocka_unit_test(test_ucx_lent_settle),
		cmocka_unit_test(test_ucx_dead_peer),
		cmocka_unit_test(test_ucx_last_words),
		cmocka_unit_test(test_ucx_wrong_secret),
		cmocka_unit_test(test_ucx_secret_on_one_side),
		cmocka_unit_test(test_ucx_nobody_listening),
		cmocka_unit_test(test_ucx_strangers),
		cmocka_unit_test(test_ucx_close_one_of_three),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
