/*
 * test_rendezvous.c - the scheduler and its clients in one process, over
 * loopback: machines with several workers (rank = machine x local_size +
 * local rank, node ids by rank, the address book's machine and local rank,
 * barriers and shutdown counting every worker process), one worker per
 * machine placed by arrival, and the registrations that must fail the job
 * naming why (local sizes that differ, a (machine, local rank) pair taken
 * twice, several workers per machine without UNISUM_WORKER_ID).  And a
 * server of such a job: it takes one connection per rank, and the global
 * set's tensors only from a machine's local root (another local rank that
 * declares one is turned away, naming why).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <fcntl.h>
#include <pthread.h>
#include <unistd.h>

#include <cmocka.h>

#include "config/config.h"
#include "log/log.h"
#include "placement/placement.h"
#include "rendezvous/rendezvous.h"
#include "server/server.h"
#include "transport/transport.h"
#include "wire/wire.h"

#define MAX_RUNS 16

/* One node of a test job, registering on its own thread. */
struct node_run {
	struct config cfg;
	pthread_t thread;
	int rc;				/* rdv_client_new's result */
	char err[512];			/* its last error when rc != 0 */
	struct rdv_client *client;
	atomic_int notice;		/* the notice's error, 0 before */
};

static void on_notice(void *arg, int err, const char *why)
{
	(void)why;
	struct node_run *run = arg;
	atomic_store(&run->notice, err);
}

static void *node_main(void *arg)
{
	struct node_run *run = arg;
	int port = run->cfg.role == CONFIG_ROLE_SERVER ? 40000 + run->cfg.server_id + 1 : 0;
	run->rc = rdv_client_new(&run->cfg, port, on_notice, NULL, run, &run->client);
	if (run->rc != 0)
		snprintf(run->err, sizeof run->err, "%s", log_last_error());
	return NULL;
}

/* The configuration every node of a test job shares. */
static struct config job_config(int machines, int servers)
{
	struct config cfg;
	memset(&cfg, 0, sizeof cfg);
	cfg.num_workers = machines;
	cfg.num_servers = servers;
	snprintf(cfg.scheduler_host, sizeof cfg.scheduler_host, "127.0.0.1");
	snprintf(cfg.node_host, sizeof cfg.node_host, "127.0.0.1");
	cfg.worker_id = -1;
	cfg.server_id = -1;
	cfg.local_size = 1;
	cfg.timeout_ms = 10000;
	cfg.heartbeat_ms = 100;
	return cfg;
}

struct job {
	struct config cfg;
	struct rdv_scheduler *sched;
	struct node_run runs[MAX_RUNS];
	int nruns;
};

/* Starts j's scheduler with cfg (job_config's, changed by the test). */
static void job_start_with(struct job *j, const struct config *cfg)
{
	memset(j, 0, sizeof *j);
	j->cfg = *cfg;
	int port = 0;
	assert_int_equal(rdv_scheduler_start("127.0.0.1", 0, &j->cfg, transport_tcp(), &j->sched, &port), 0);
	j->cfg.scheduler_port = port;
}

static void job_start(struct job *j, int machines, int servers)
{
	struct config cfg = job_config(machines, servers);
	job_start_with(j, &cfg);
}

static struct node_run *job_add(struct job *j, int role, int id, int local_rank, int local_size)
{
	assert_true(j->nruns < MAX_RUNS);
	struct node_run *run = &j->runs[j->nruns++];
	run->cfg = j->cfg;
	run->cfg.role = role;
	if (role == CONFIG_ROLE_SERVER) {
		run->cfg.server_id = id;
	} else {
		run->cfg.worker_id = id;
		run->cfg.local_rank = local_rank;
		run->cfg.local_size = local_size;
	}
	assert_int_equal(pthread_create(&run->thread, NULL, node_main, run), 0);
	return run;
}

static void job_join(struct job *j)
{
	for (int i = 0; i < j->nruns; i++)
		pthread_join(j->runs[i].thread, NULL);
}

static void *barrier_main(void *arg)
{
	struct node_run *run = arg;
	run->rc = rdv_client_barrier(run->client, RDV_GROUP_WORKERS);
	return NULL;
}

static void sleep_ms(int ms)
{
	struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
	nanosleep(&ts, NULL);
}

/* Waits up to 5 s for run's notice; returns it (0: none came). */
static int wait_notice(struct node_run *run)
{
	for (int i = 0; i < 500 && atomic_load(&run->notice) == 0; i++)
		sleep_ms(10);
	return atomic_load(&run->notice);
}

static void test_machines_of_two_workers(void **state)
{
	(void)state;
	struct job j;
	job_start(&j, 2, 1);
	/* (machine, local rank), arriving out of order. */
	static const int placement[4][2] = {{1, 0}, {1, 1}, {0, 1}, {0, 0}};
	struct node_run *server = job_add(&j, CONFIG_ROLE_SERVER, -1, 0, 1);
	struct node_run *workers[4];
	for (int i = 0; i < 4; i++)
		workers[i] = job_add(&j, CONFIG_ROLE_WORKER, placement[i][0], placement[i][1], 2);
	job_join(&j);

	assert_int_equal(server->rc, 0);
	assert_int_equal(rdv_client_local_size(server->client), 2);
	assert_int_equal(rdv_client_num_machines(server->client), 2);
	assert_int_equal(rdv_client_id(server->client), 1);
	for (int i = 0; i < 4; i++) {
		struct rdv_client *c = workers[i]->client;
		assert_int_equal(workers[i]->rc, 0);
		int rank = placement[i][0] * 2 + placement[i][1];
		assert_int_equal(rdv_client_rank(c), rank);
		assert_int_equal(rdv_client_id(c), 2 + (uint32_t)rank);	/* after the one server */
		assert_int_equal(rdv_client_local_size(c), 2);
		assert_int_equal(rdv_client_num_machines(c), 2);
	}
	int count;
	const struct rdv_node *book = rdv_client_nodes(workers[0]->client, &count);
	assert_int_equal(count, 5);
	for (int i = 0; i < count; i++) {
		const struct rdv_node *n = &book[i];
		if (n->role == CONFIG_ROLE_SERVER) {
			assert_int_equal(n->machine, -1);
			assert_int_equal(n->local_rank, 0);
			assert_int_equal(n->port, 40000);
		} else {
			assert_int_equal(n->machine, n->rank / 2);
			assert_int_equal(n->local_rank, n->rank % 2);
			assert_int_equal(n->id, 2 + (uint32_t)n->rank);
		}
	}

	/* A workers' barrier holds every worker process, not one per machine. */
	pthread_t barrier[4];
	for (int i = 0; i < 3; i++)
		assert_int_equal(pthread_create(&barrier[i], NULL, barrier_main, workers[i]), 0);
	sleep_ms(200);
	for (int i = 0; i < 3; i++)
		assert_int_not_equal(pthread_tryjoin_np(barrier[i], NULL), 0);
	assert_int_equal(pthread_create(&barrier[3], NULL, barrier_main, workers[3]), 0);
	for (int i = 0; i < 4; i++) {
		pthread_join(barrier[i], NULL);
		assert_int_equal(workers[i]->rc, 0);
	}

	/* Servers stop when every worker process said goodbye, not when one
	 * per machine did. */
	rdv_client_free(workers[0]->client);
	rdv_client_free(workers[1]->client);
	sleep_ms(200);
	assert_int_equal(atomic_load(&server->notice), 0);
	rdv_client_free(workers[2]->client);
	rdv_client_free(workers[3]->client);
	assert_int_equal(wait_notice(server), UNISUM_ESHUTDOWN);
	rdv_client_free(server->client);
	assert_int_equal(rdv_scheduler_wait(j.sched), 0);
	rdv_scheduler_free(j.sched);
}

static void test_one_worker_per_machine_by_arrival(void **state)
{
	(void)state;
	struct job j;
	job_start(&j, 3, 2);
	struct node_run *servers[2], *workers[3];
	for (int i = 0; i < 2; i++)
		servers[i] = job_add(&j, CONFIG_ROLE_SERVER, -1, 0, 1);
	for (int i = 0; i < 3; i++)
		workers[i] = job_add(&j, CONFIG_ROLE_WORKER, i == 0 ? 2 : -1, 0, 1);
	job_join(&j);
	bool seen[3] = {false};
	for (int i = 0; i < 3; i++) {
		assert_int_equal(workers[i]->rc, 0);
		int rank = rdv_client_rank(workers[i]->client);
		assert_in_range(rank, 0, 2);
		assert_false(seen[rank]);
		seen[rank] = true;
		assert_int_equal(rdv_client_local_size(workers[i]->client), 1);
		assert_int_equal(rdv_client_num_machines(workers[i]->client), 3);
		const struct rdv_node *me = rdv_client_node_by_id(workers[i]->client,
								  rdv_client_id(workers[i]->client));
		assert_non_null(me);
		assert_int_equal(me->machine, rank);
		assert_int_equal(me->local_rank, 0);
	}
	assert_int_equal(rdv_client_rank(workers[0]->client), 2);	/* the one it asked for */
	for (int i = 0; i < 3; i++)
		rdv_client_free(workers[i]->client);
	for (int i = 0; i < 2; i++) {
		assert_int_equal(servers[i]->rc, 0);
		assert_int_equal(wait_notice(servers[i]), UNISUM_ESHUTDOWN);
		rdv_client_free(servers[i]->client);
	}
	assert_int_equal(rdv_scheduler_wait(j.sched), 0);
	rdv_scheduler_free(j.sched);
}

/* Every node of j failed to register, each error holding `needle`, and
 * the scheduler failed with `err`. */
static void expect_job_failed(struct job *j, const char *needle, int err)
{
	job_join(j);
	for (int i = 0; i < j->nruns; i++) {
		if (j->runs[i].rc == 0)
			fail_msg("node %d registered in a job that must fail", i);
		if (strstr(j->runs[i].err, needle) == NULL)
			fail_msg("node %d's error does not say '%s': %s", i, needle, j->runs[i].err);
	}
	assert_int_equal(rdv_scheduler_wait(j->sched), err);
	rdv_scheduler_free(j->sched);
}

static void test_local_sizes_must_agree(void **state)
{
	(void)state;
	struct job j;
	job_start(&j, 2, 1);
	job_add(&j, CONFIG_ROLE_WORKER, 0, 0, 2);
	sleep_ms(100);	/* registers first, usually; the test holds either way */
	job_add(&j, CONFIG_ROLE_WORKER, 1, 0, 3);
	job_join(&j);
	for (int i = 0; i < 2; i++) {
		assert_int_not_equal(j.runs[i].rc, 0);
		const char *e = j.runs[i].err;
		bool named = (strstr(e, "UNISUM_LOCAL_SIZE=3") && strstr(e, "first worker reported 2")) ||
			     (strstr(e, "UNISUM_LOCAL_SIZE=2") && strstr(e, "first worker reported 3"));
		if (!named)
			fail_msg("the error does not name both local sizes: %s", j.runs[i].err);
	}
	assert_int_equal(rdv_scheduler_wait(j.sched), UNISUM_ECONFIG);
	rdv_scheduler_free(j.sched);
}

/* A node that never comes (died before it reached the scheduler, never
 * started) fails the job UNISUM_START_TIMEOUT_MS after the scheduler
 * started, naming it to every node that did come; with anonymous nodes
 * (no UNISUM_WORKER_ID) only how many are missing is known. */
static void test_start_timeout_names_the_missing(void **state)
{
	(void)state;
	struct config cfg = job_config(2, 1);
	cfg.start_timeout_ms = 400;
	struct job j;
	job_start_with(&j, &cfg);
	job_add(&j, CONFIG_ROLE_SERVER, 0, 0, 1);
	job_add(&j, CONFIG_ROLE_WORKER, 1, 0, 1);
	expect_job_failed(&j, "worker 0 never registered", UNISUM_ETIMEDOUT);

	job_start_with(&j, &cfg);
	int role, rank;
	job_add(&j, CONFIG_ROLE_WORKER, 1, 0, 1);
	job_join(&j);
	assert_int_not_equal(j.runs[0].rc, 0);
	if (strstr(j.runs[0].err, "UNISUM_START_TIMEOUT_MS") == NULL ||
	    strstr(j.runs[0].err, "server 0, worker 0 never registered") == NULL)
		fail_msg("the error does not name both missing nodes: %s", j.runs[0].err);
	assert_int_equal(rdv_scheduler_wait(j.sched), UNISUM_ETIMEDOUT);
	assert_false(rdv_scheduler_culprit(j.sched, &role, &rank));	/* two of them */
	rdv_scheduler_free(j.sched);

	job_start_with(&j, &cfg);
	job_add(&j, CONFIG_ROLE_SERVER, 0, 0, 1);
	job_add(&j, CONFIG_ROLE_WORKER, -1, 0, 1);
	expect_job_failed(&j, "1 of 2 workers never registered", UNISUM_ETIMEDOUT);
}

/* A job that fails while nodes are still starting keeps answering for
 * cfg.linger_ms (the standalone scheduler's UNISUM_TIMEOUT_MS): a node that
 * comes late learns why, instead of finding the port closed. */
static void test_late_node_learns_why_the_job_failed(void **state)
{
	(void)state;
	struct config cfg = job_config(2, 1);
	cfg.linger_ms = 3000;
	struct job j;
	job_start_with(&j, &cfg);
	job_add(&j, CONFIG_ROLE_WORKER, 0, 0, 1);
	job_add(&j, CONFIG_ROLE_WORKER, 1, 0, 2);	/* the local sizes differ */
	job_join(&j);
	assert_int_not_equal(j.runs[0].rc, 0);
	assert_int_not_equal(j.runs[1].rc, 0);
	struct node_run *late = job_add(&j, CONFIG_ROLE_SERVER, 0, 0, 1);	/* after the failure */
	pthread_join(late->thread, NULL);	/* the others were joined above */
	assert_int_not_equal(j.runs[2].rc, 0);
	if (strstr(j.runs[2].err, "UNISUM_LOCAL_SIZE") == NULL)
		fail_msg("the late server was not told why the job failed: %s", j.runs[2].err);
	assert_int_equal(rdv_scheduler_wait(j.sched), UNISUM_ECONFIG);
	rdv_scheduler_free(j.sched);
}

/* UNISUM_RACK is set on every worker or on none (a group of DS-Sync is cut
 * within racks, so a worker without one could not be placed). */
static void test_racks_on_every_worker_or_none(void **state)
{
	(void)state;
	struct job j;
	job_start(&j, 2, 1);
	j.cfg.rack = 3;
	job_add(&j, CONFIG_ROLE_WORKER, 0, 0, 1);
	j.cfg.rack = -1;
	job_add(&j, CONFIG_ROLE_WORKER, 1, 0, 1);
	job_join(&j);
	for (int i = 0; i < 2; i++) {
		assert_int_not_equal(j.runs[i].rc, 0);
		if (strstr(j.runs[i].err, "UNISUM_RACK") == NULL ||
		    strstr(j.runs[i].err, "every worker or on none") == NULL)
			fail_msg("the error does not name UNISUM_RACK: %s", j.runs[i].err);
	}
	assert_int_equal(rdv_scheduler_wait(j.sched), UNISUM_ECONFIG);
	rdv_scheduler_free(j.sched);
}

/* Every node's rack reaches every node with the address book. */
static void test_racks_in_the_address_book(void **state)
{
	(void)state;
	struct job j;
	job_start(&j, 2, 2);
	struct node_run *runs[4];
	for (int i = 0; i < 2; i++) {
		j.cfg.rack = 10 + i;
		runs[i] = job_add(&j, CONFIG_ROLE_SERVER, i, 0, 1);
		j.cfg.rack = 20 + i;
		runs[2 + i] = job_add(&j, CONFIG_ROLE_WORKER, i, 0, 1);
	}
	job_join(&j);
	for (int i = 0; i < 4; i++)
		assert_int_equal(runs[i]->rc, 0);
	for (int i = 0; i < 4; i++) {
		for (int r = 0; r < 2; r++) {
			assert_int_equal(rdv_client_server(runs[i]->client, r)->rack, 10 + r);
			assert_int_equal(rdv_client_worker(runs[i]->client, r)->rack, 20 + r);
		}
	}
	for (int i = 2; i < 4; i++)
		rdv_client_free(runs[i]->client);
	for (int i = 0; i < 2; i++) {
		assert_int_equal(wait_notice(runs[i]), UNISUM_ESHUTDOWN);
		rdv_client_free(runs[i]->client);
	}
	assert_int_equal(rdv_scheduler_wait(j.sched), 0);
	rdv_scheduler_free(j.sched);
}

static void test_machine_and_local_rank_unique(void **state)
{
	(void)state;
	struct job j;
	job_start(&j, 2, 1);
	job_add(&j, CONFIG_ROLE_SERVER, -1, 0, 1);
	job_add(&j, CONFIG_ROLE_WORKER, 0, 0, 2);
	job_add(&j, CONFIG_ROLE_WORKER, 0, 1, 2);
	job_add(&j, CONFIG_ROLE_WORKER, 0, 1, 2);
	job_add(&j, CONFIG_ROLE_WORKER, 1, 0, 2);
	expect_job_failed(&j, "machine 0, local rank 1", UNISUM_ECONFIG);
}

static void test_several_workers_need_a_machine(void **state)
{
	(void)state;
	struct job j;
	job_start(&j, 1, 1);
	/* config_require() stops this in unisum_init; the scheduler checks too. */
	job_add(&j, CONFIG_ROLE_WORKER, -1, 0, 2);
	expect_job_failed(&j, "UNISUM_WORKER_ID", UNISUM_ECONFIG);
}

struct server_run_arg {
	struct config cfg;
	int rc;
};

static void *server_main(void *arg)
{
	struct server_run_arg *a = arg;
	a->rc = server_run(&a->cfg, NULL);
	return NULL;
}

/* Runs job j's one server (one engine, no stall warnings) on a thread. */
static pthread_t server_start(const struct job *j, struct server_run_arg *srv)
{
	*srv = (struct server_run_arg){.cfg = j->cfg};
	srv->cfg.role = CONFIG_ROLE_SERVER;
	srv->cfg.engine_threads = 1;
	srv->cfg.stall_warn_ms = 60000;
	pthread_t server;
	assert_int_equal(pthread_create(&server, NULL, server_main, srv), 0);
	return server;
}

/* Connects to the server at `at` and says hello as node `id`.  Returns
 * the connection, or NULL when the server hung up on the hello. */
static struct tp_conn *hello(const struct rdv_node *at, uint32_t id, bool expect_hangup)
{
	const struct transport_ops *tp = transport_tcp();
	struct tp_conn *conn;
	assert_int_equal(transport_connect(tp, at->host, at->port, 5000, &conn), 0);
	struct wire_hdr h = {.type = WIRE_REGISTER, .sender = id};
	assert_int_equal(tp->send(conn, &h, NULL), 0);
	if (!expect_hangup)
		return conn;
	/* The server says why (one ERROR), then hangs up. */
	char why[256];
	int errors = 0;
	while (tp->recv_header(conn, &h, why, sizeof why) == 0) {
		assert_int_equal(h.type, WIRE_ERROR);
		if (h.payload_len > 0)
			assert_int_equal(tp->recv_payload(conn, NULL, h.payload_len), 0);
		errors++;
	}
	assert_int_equal(errors, 1);
	tp->conn_free(conn);
	return NULL;
}

/* A process set's tensor ("set:<size>:<hash>/NAME") is forgotten once its
 * members undeclared it, not every worker: the same name may then be
 * declared afresh (here with another count), which the scheduler refuses
 * while it still holds the old entry. */
static void test_set_tensor_forgotten_by_its_members(void **state)
{
	(void)state;
	struct job j;
	job_start(&j, 3, 1);
	struct node_run *server = job_add(&j, CONFIG_ROLE_SERVER, -1, 0, 1);
	struct node_run *wk[3];
	for (int i = 0; i < 3; i++)
		wk[i] = job_add(&j, CONFIG_ROLE_WORKER, i, 0, 1);
	job_join(&j);
	assert_int_equal(server->rc, 0);
	for (int i = 0; i < 3; i++)
		assert_int_equal(wk[i]->rc, 0);
	struct node_run *m[2] = {NULL, NULL};
	for (int i = 0, k = 0; i < 3; i++)
		if (rdv_client_rank(wk[i]->client) != 1)
			m[k++] = wk[i];	/* ranks 0 and 2 are the set */
	const char *name = "set:2:00000000000000ab/x";
	uint64_t key[2];
	for (int k = 0; k < 2; k++) {
		uint32_t nparts;
		struct placement_part *parts = NULL;
		uint32_t *servers = NULL;
		char why[256];
		assert_int_equal(rdv_client_declare(m[k]->client, name, UNISUM_FLOAT32, 1000, 4096,
						    &key[k], &nparts, &parts, &servers, why, sizeof why), 0);
		free(parts);
		free(servers);
	}
	assert_true(key[0] == key[1]);
	rdv_client_forget(m[1]->client, key[1]);
	rdv_client_forget(m[0]->client, key[0]);
	/* The forgets are messages without replies: try for up to 5 s. */
	int rc = -1;
	char why[256] = "";
	for (int i = 0; i < 500 && rc != 0; i++) {
		uint64_t k2;
		uint32_t nparts;
		struct placement_part *parts = NULL;
		uint32_t *servers = NULL;
		rc = rdv_client_declare(m[0]->client, name, UNISUM_FLOAT32, 2000, 4096, &k2, &nparts,
					&parts, &servers, why, sizeof why);
		free(parts);
		free(servers);
		if (rc != 0)
			sleep_ms(10);
	}
	if (rc != 0)
		fail_msg("declaring the set's tensor again: %s", why);
	for (int i = 0; i < 3; i++)
		rdv_client_free(wk[i]->client);
	/* A server that leaves before the scheduler told it the job ended is
	 * a lost server: wait for the shutdown notice, as the other tests do. */
	assert_int_equal(wait_notice(server), UNISUM_ESHUTDOWN);
	rdv_client_free(server->client);
	assert_int_equal(rdv_scheduler_wait(j.sched), 0);
	rdv_scheduler_free(j.sched);
}

static void test_server_takes_global_tensors_from_roots(void **state)
{
	(void)state;
	struct job j;
	job_start(&j, 2, 1);
	struct server_run_arg srv;
	pthread_t server = server_start(&j, &srv);
	struct node_run *workers[4];
	for (int rank = 0; rank < 4; rank++)
		workers[rank] = job_add(&j, CONFIG_ROLE_WORKER, rank / 2, rank % 2, 2);
	job_join(&j);
	for (int rank = 0; rank < 4; rank++)
		assert_int_equal(rdv_client_rank(workers[rank]->client), rank);
	const struct rdv_node *at = rdv_client_server(workers[0]->client, 0);
	assert_non_null(at);
	uint32_t first_worker_id = 2;	/* after the one server */

	/* The server's complaints go to stderr: catch them in a file. */
	char path[] = "/tmp/test_rendezvous.XXXXXX";
	int log_fd = mkstemp(path);
	assert_true(log_fd >= 0);
	unlink(path);
	int saved = dup(STDERR_FILENO);
	dup2(log_fd, STDERR_FILENO);

	/* Machine 0's local rank 1 may say hello (for its process sets'
	 * tensors), but not declare a tensor of the global set. */
	const struct transport_ops *tp = transport_tcp();
	struct tp_conn *other = hello(at, first_worker_id + 1, false);
	struct wire_buf b;
	wire_buf_init(&b);
	wire_declare_check_encode(&b, "t", NULL, 0, NULL);
	struct wire_hdr h = {.type = WIRE_DECLARE_CHECK, .sender = first_worker_id + 1, .key = 0x10000,
			     .dtype = UNISUM_FLOAT32, .count = 1, .payload_len = b.len};
	assert_int_equal(tp->send(other, &h, b.data), 0);
	char why[256];
	/* The server says why (an ERROR), then hangs up. */
	while (tp->recv_header(other, &h, why, sizeof why) == 0)
		if (h.payload_len > 0)
			assert_int_equal(tp->recv_payload(other, NULL, h.payload_len), 0);
	tp->conn_free(other);
	struct tp_conn *root = hello(at, first_worker_id + 2, false);	/* machine 1's root */
	/* The root's hello is in once a push of it is acknowledged. */
	h = (struct wire_hdr){.type = WIRE_DECLARE_CHECK, .sender = first_worker_id + 2, .key = 0x10000,
			      .dtype = UNISUM_FLOAT32, .count = 1, .payload_len = b.len};
	assert_int_equal(tp->send(root, &h, b.data), 0);
	wire_buf_fini(&b);
	float one = 1.0f;
	h = (struct wire_hdr){.type = WIRE_PUSH, .sender = first_worker_id + 2, .key = 0x10000,
			      .dtype = UNISUM_FLOAT32, .count = 1, .payload_len = sizeof one};
	assert_int_equal(tp->send(root, &h, &one), 0);
	assert_int_equal(tp->recv_header(root, &h, why, sizeof why), 0);
	assert_int_equal(h.type, WIRE_PUSH_ACK);
	hello(at, first_worker_id + 2, true);			/* ... claimed twice */

	dup2(saved, STDERR_FILENO);
	close(saved);
	char text[4096] = "";
	assert_true(pread(log_fd, text, sizeof text - 1, 0) >= 0);
	close(log_fd);
	if (strstr(text, "worker rank 1 declared key 0x10000 of 't', which it does not push (only a "
			 "machine's local root pushes the global set's tensors)") == NULL)
		fail_msg("the server did not say why it turned local rank 1 away: %s", text);
	if (strstr(text, "a second connection claims to be machine 1 (worker rank 2)") == NULL)
		fail_msg("the server did not name the machine claimed twice: %s", text);

	tp->conn_free(root);
	for (int rank = 0; rank < 4; rank++)
		rdv_client_free(workers[rank]->client);
	pthread_join(server, NULL);
	assert_int_equal(srv.rc, 0);
	assert_int_equal(rdv_scheduler_wait(j.sched), 0);
	rdv_scheduler_free(j.sched);
}

/* Reads the next message on conn (not a PUSH_ACK), its payload into buf. */
static struct wire_hdr next_reply(struct tp_conn *conn, void *buf, size_t cap)
{
	const struct transport_ops *tp = transport_tcp();
	struct wire_hdr h;
	char why[256];
	do {
		assert_int_equal(tp->recv_header(conn, &h, why, sizeof why), 0);
		assert_true(h.payload_len < cap);
		if (h.payload_len > 0)
			assert_int_equal(tp->recv_payload(conn, buf, h.payload_len), 0);
		((char *)buf)[h.payload_len] = '\0';
	} while (h.type == WIRE_PUSH_ACK);
	return h;
}

/* A compressed key's push must be its codec's encoding: a wrong length
 * (read and dropped) or bytes that do not decode (found as the engine
 * sums) refuse that key, whose pull gets the reason, while the
 * connection and the other keys go on; a good push is summed and sent
 * back encoded. */
static void test_server_refuses_malformed_compressed_push(void **state)
{
	(void)state;
	struct job j;
	job_start(&j, 1, 1);
	struct server_run_arg srv;
	pthread_t server = server_start(&j, &srv);
	struct node_run *worker = job_add(&j, CONFIG_ROLE_WORKER, 0, 0, 1);
	job_join(&j);
	const struct rdv_node *at = rdv_client_server(worker->client, 0);
	assert_non_null(at);
	const uint32_t id = 2;	/* the worker, after the server */
	int saved = dup(STDERR_FILENO);	/* the server's complaints: not in the test's output */
	int devnull = open("/dev/null", O_WRONLY);
	dup2(devnull, STDERR_FILENO);

	const struct transport_ops *tp = transport_tcp();
	struct tp_conn *c = hello(at, id, false);
	const uint64_t n = 40;	/* onebit: 4 + 2 x 4 bytes */
	uint64_t keys[2];
	for (int i = 0; i < 2; i++) {
		/* The scheduler knows them: a refused key is poisoned there. */
		uint32_t nparts, *servers;
		struct placement_part *parts;
		char err[256];
		assert_int_equal(rdv_client_declare_homed(worker->client, i ? "b" : "a", UNISUM_FLOAT32,
							  n, 4096, 0, NULL, NULL, NULL, 0, "onebit",
							  -1, &keys[i], &nparts, &parts, &servers,
							  err, sizeof err),
				 0);
		assert_int_equal(nparts, 1);
		free(parts);
		free(servers);
	}
	const uint64_t A = keys[0], B = keys[1];
	for (int i = 0; i < 2; i++) {
		struct wire_buf b;
		wire_buf_init(&b);
		wire_declare_check_encode(&b, i ? "b" : "a", NULL, 0, "onebit");
		struct wire_hdr h = {.type = WIRE_DECLARE_CHECK, .sender = id, .key = i ? B : A,
				     .dtype = UNISUM_FLOAT32, .count = n, .payload_len = b.len};
		assert_int_equal(tp->send(c, &h, b.data), 0);
		wire_buf_fini(&b);
	}
	uint8_t enc[13] = {0}, got[1024];
	float scale = 2.0f;
	memcpy(enc, &scale, 4);
	enc[4] = 0x5a;	/* some signs */
	/* Key A: 13 bytes where 12 belong. */
	struct wire_hdr h = {.type = WIRE_PUSH, .flags = WIRE_FLAG_COMPRESSED, .sender = id, .key = A,
			     .dtype = UNISUM_FLOAT32, .count = n, .payload_len = 13};
	assert_int_equal(tp->send(c, &h, enc), 0);
	h = (struct wire_hdr){.type = WIRE_PULL, .sender = id, .key = A, .dtype = UNISUM_FLOAT32};
	assert_int_equal(tp->send(c, &h, NULL), 0);
	h = next_reply(c, got, sizeof got);
	assert_int_equal(h.type, WIRE_ERROR);
	assert_true(h.key == A);
	char why[512];
	assert_int_equal(wire_error_decode(got, h.payload_len, why, sizeof why), 0);
	if (strstr(why, "pushed 13 bytes, but 40 elements compressed 'onebit' take 12") == NULL)
		fail_msg("the refusal does not say what was wrong: %s", why);
	/* Key B, on the same connection: a good push comes back as it went
	 * (one machine: the sum is its push; mean |x| of +-2 is 2). */
	h = (struct wire_hdr){.type = WIRE_PUSH, .flags = WIRE_FLAG_COMPRESSED, .sender = id, .key = B,
			      .dtype = UNISUM_FLOAT32, .count = n, .payload_len = 12};
	assert_int_equal(tp->send(c, &h, enc), 0);
	h = (struct wire_hdr){.type = WIRE_PULL, .sender = id, .key = B, .dtype = UNISUM_FLOAT32};
	assert_int_equal(tp->send(c, &h, NULL), 0);
	h = next_reply(c, got, sizeof got);
	assert_int_equal(h.type, WIRE_PULL_REPLY);
	assert_int_equal(h.flags, WIRE_FLAG_COMPRESSED);
	assert_int_equal(h.payload_len, 12);
	assert_memory_equal(got, enc, 12);
	/* Round 1 of key B: sign bits past the 40 elements are not an
	 * encoding of 40 elements. */
	enc[4 + 4 + 3] = 0x80;
	h = (struct wire_hdr){.type = WIRE_PUSH, .flags = WIRE_FLAG_COMPRESSED, .sender = id, .key = B,
			      .round = 1, .dtype = UNISUM_FLOAT32, .count = n, .payload_len = 12};
	assert_int_equal(tp->send(c, &h, enc), 0);
	h = (struct wire_hdr){.type = WIRE_PULL, .sender = id, .key = B, .round = 1,
			      .dtype = UNISUM_FLOAT32};
	assert_int_equal(tp->send(c, &h, NULL), 0);
	h = next_reply(c, got, sizeof got);
	assert_int_equal(h.type, WIRE_ERROR);
	assert_int_equal(wire_error_decode(got, h.payload_len, why, sizeof why), 0);
	if (strstr(why, "are not a onebit encoding of 40 elements") == NULL)
		fail_msg("the refusal does not say what was wrong: %s", why);

	dup2(saved, STDERR_FILENO);
	close(saved);
	close(devnull);
	tp->conn_free(c);
	rdv_client_free(worker->client);
	pthread_join(server, NULL);
	assert_int_equal(srv.rc, 0);
	assert_int_equal(rdv_scheduler_wait(j.sched), 0);
	rdv_scheduler_free(j.sched);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_machines_of_two_workers),
		cmocka_unit_test(test_one_worker_per_machine_by_arrival),
		cmocka_unit_test(test_local_sizes_must_agree),
		cmocka_unit_test(test_start_timeout_names_the_missing),
		cmocka_unit_test(test_late_node_learns_why_the_job_failed),
		cmocka_unit_test(test_racks_on_every_worker_or_none),
		cmocka_unit_test(test_racks_in_the_address_book),
		cmocka_unit_test(test_machine_and_local_rank_unique),
		cmocka_unit_test(test_several_workers_need_a_machine),
		cmocka_unit_test(test_server_takes_global_tensors_from_roots),
		cmocka_unit_test(test_set_tensor_forgotten_by_its_members),
		cmocka_unit_test(test_server_refuses_malformed_compressed_push),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
