/*
 * server.c - the Summation Service: receives pushes, sums them, answers
 * pulls.  This file runs a server (start, accept, stop); the key table is
 * in key.c, the engines in engine.c, a worker's connection in conn.c, the
 * state they share in srv_int.h.
 *
 * DESIGN.  Threads:
 *   - the I/O loops (UNISUM_IO_THREADS, a fixed number whatever the
 *     number of workers; loop 0 on the main thread, until the job's end)
 *     serve every connection: loop 0 accepts them
 *     (TCP, and IPC for this host's workers) and hands each to a loop in
 *     turn; each loop runs its connections' handshakes, validates every
 *     message, receive PUSH payloads straight into the key's per-worker
 *     buffer, hand events to the key's engine, and write what the
 *     engines' replies left queued (PULL_REPLYs straight from the key's
 *     sum buffer);
 *   - engine threads sum.  Every key is pinned to one engine, chosen by
 *     byte balance when it is declared, so one key's events are handled in
 *     order by one thread and its sums need no lock.
 *
 * Machines.  A machine's workers reduce among themselves; only its local
 * root (local rank 0) connects here and pushes the machine's sum.  So
 * "worker w" below is machine w: the server sums one push per machine
 * (UNISUM_NUM_WORKER of them) per key and round, and with one worker per
 * machine a machine is simply a worker.
 *
 * Rounds.  Each worker pushes round 0, 1, 2, ... of a key, each push
 * followed by a pull of the same round.  A key keeps two round slots
 * (round & 1): a worker can only push round r+1 after it received the sum
 * of round r, so at most rounds r and r+1 are alive and they never mix.
 *
 * Summation order.  Contributions are folded in machine order
 * (((w0 + w1) + w2) + ...), whatever order they arrive in: results are
 * bitwise reproducible from run to run and equal a reference summed in the
 * same order.  The first contribution is not copied: the sum of w0 and w1
 * goes straight into the slot's accumulator (dst = a + b), later ones are
 * added in place.  A lone contribution (one worker, or a broadcast root) is
 * copied into the accumulator once every push is in.  A push
 * flagged ZERO (a broadcast from another root) is skipped.
 *
 * Buffer lifetimes.  A worker's push buffer of a key is rewritten only by
 * its next push of that key, which comes after that worker received the
 * previous sum, which is after every push of that round was folded.  A
 * slot's accumulator is rewritten two rounds later, after every worker
 * received it (same argument).  So replies are sent straight from these
 * buffers without copies.
 *
 * Stalls.  Each engine looks over its keys about once a second: a round
 * that some workers pushed and others not for UNISUM_STALL_WARN_MS is
 * logged with the tensor, the round and the missing ranks; with
 * UNISUM_STALL_ABORT_MS the server asks the scheduler to fail the job, so
 * every rank gets that message instead of waiting forever.
 *
 * Locks.  `srv->lock` guards the key table and the worker -> connection
 * table; a connection's send queue has its own lock (loop/conn.c); an
 * engine's `lock` its event queue.  Order: srv->lock, then the queue's.
 * No lock is held while summing; an engine holds a connection (refs),
 * not srv->lock, while its reply goes to the socket.
 */
#include "server/server.h"

#include <endian.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>
#include <time.h>

#include "log/log.h"
#include "reducer/reducer.h"
#include "rendezvous/rendezvous.h"
#include "server/srv_int.h"
#include "shm/shm.h"
#include "timing/timing.h"
#include "transport/transport.h"
#include "wire/wire.h"

/* ---- lifecycle ---------------------------------------------------------- */

static void srv_notice(void *arg, int err, const char *why)
{
	struct server *srv = arg;
	if (err == UNISUM_EMEMBERSHIP) {
		LOG_INFO("%s", why);
		atomic_store(&srv->job_error, err);
	} else if (err != UNISUM_ESHUTDOWN) {
		LOG_ERROR("stopping: %s", why);
		int none = 0;
		if (atomic_compare_exchange_strong(&srv->job_error, &none, err))
			atomic_store(&srv->told, true);
	} else {
		LOG_INFO("stopping: %s", why);
	}
	pthread_mutex_lock(&srv->lock);
	atomic_store(&srv->stopping, true);
	if (srv->main_loop != NULL)
		loop_stop(srv->main_loop);
	pthread_mutex_unlock(&srv->lock);
}

/* Frees c: when it is finished, or once the loops stopped. */
static void srv_conn_free(struct srv_conn *c)
{
	free(c->held);	/* a DECLARE_CHECK held when the job ended */
	if (c->lc != NULL)
		loop_conn_free(c->lc);	/* its transport connection too */
	else if (c->conn != NULL)
		c->tp->conn_free(c->conn);	/* its loop never took it */
	free(c);
}

/* Frees connections that have ended (strangers that were rejected,
 * workers gone), so a stream of bad connections cannot grow memory. */
static void srv_reap(struct server *srv)
{
	pthread_mutex_lock(&srv->lock);
	struct srv_conn **pp = &srv->conns;
	while (*pp) {
		struct srv_conn *c = *pp;
		if (atomic_load(&c->finished) && atomic_load(&c->refs) == 0) {
			*pp = c->next;
			pthread_mutex_unlock(&srv->lock);
			srv_conn_free(c);
			pthread_mutex_lock(&srv->lock);
			pp = &srv->conns;
			continue;
		}
		pp = &c->next;
	}
	pthread_mutex_unlock(&srv->lock);
}

/* A thread of the server could not start: the limit that was hit is
 * named here and, through the scheduler, to every process of the job
 * (its workers would otherwise see no handshake, and the others a worker
 * that left). */
static void srv_out_of_threads(struct server *srv, int rc, const char *what)
{
	char limits[384], why[640];
	log_thread_limits(rc, limits, sizeof limits);
	snprintf(why, sizeof why, "server %d (pid %d) cannot start %s: %s", srv->rank,
		 (int)getpid(), what, limits);
	LOG_ERROR("%s", why);
	if (srv->rdv != NULL)
		rdv_client_fail_job(srv->rdv, UNISUM_ESYS, why);
}

/* The server could not accept a worker's connection (descriptors ran
 * out): the limit is named here and, once, through the scheduler to every
 * process of the job (the worker would otherwise see no handshake). */
static void srv_out_of_fds(struct server *srv, const struct transport_ops *tp)
{
	char why[640];
	snprintf(why, sizeof why, "server %d (pid %d) cannot take a worker's %s connection: %s",
		 srv->rank, (int)getpid(), tp->name, log_last_error());
	if (!atomic_exchange(&srv->fds_failed, true)) {
		LOG_ERROR("%s", why);
		if (srv->rdv != NULL)
			rdv_client_fail_job(srv->rdv, UNISUM_ESYS, why);
	}
}

/* Takes accepted connection tc (of transport tp): served by one of the
 * loops, in turn.  On loop 0's thread. */
static void srv_take_conn(struct server *srv, const struct transport_ops *tp, struct tp_conn *tc)
{
	struct srv_conn *c = calloc(1, sizeof *c);
	if (c == NULL) {
		tp->conn_free(tc);
		return;
	}
	c->srv = srv;
	c->tp = tp;
	c->conn = tc;
	c->worker = -1;
	c->loop = srv->pool.loops[atomic_fetch_add(&srv->next_loop, 1) % (unsigned)srv->pool.n];
	atomic_init(&c->finished, false);
	pthread_mutex_lock(&srv->lock);
	c->next = srv->conns;
	srv->conns = c;
	pthread_mutex_unlock(&srv->lock);
	if (c->loop == srv->pool.loops[0]) {
		srv_conn_start(c);
	} else if (loop_post(c->loop, srv_conn_start, c) != 0) {
		LOG_ERROR("out of memory: refusing the connection from %s", tp->peer_name(tc));
		tp->conn_shutdown(tc);
		atomic_store(&c->finished, true);
	}
}

static void srv_accept_resume(struct loop_timer *t)
{
	struct srv_acceptor *a = t->arg;
	loop_io_set(&a->io, EPOLLIN);
}

/* A listener is readable: accepts what waits.  Out of descriptors, it is
 * named (srv_out_of_fds) and accepting pauses for 100 ms. */
static void srv_accept_ready(struct loop_io *io, uint32_t events)
{
	(void)events;
	struct srv_acceptor *a = io->arg;
	struct server *srv = a->srv;
	for (int n = 0; n < 64; n++) {
		struct tp_conn *tc;
		int rc = a->tp->accept_nb(a->l, &tc);
		if (rc == UNISUM_ESYS) {
			srv_out_of_fds(srv, a->tp);
			loop_io_set(&a->io, 0);
			loop_timer_start(io->loop, &a->resume, 100, 0, srv_accept_resume, a);
			return;
		}
		if (rc != 0)	/* TP_AGAIN: none waits */
			return;
		srv_reap(srv);
		srv_take_conn(srv, a->tp, tc);
	}
}

/* Watches the listeners on loop 0 (a loop_post call). */
static void srv_watch_listeners(void *arg)
{
	struct server *srv = arg;
	for (int i = 0; i < srv->nacceptors; i++) {
		struct srv_acceptor *a = &srv->acceptors[i];
		if (loop_io_add(srv->pool.loops[0], &a->io, a->tp->listener_fd(a->l), EPOLLIN,
				srv_accept_ready, a) != 0)
			LOG_ERROR("server %d cannot watch its %s listener: %s", srv->rank, a->tp->name,
				  log_last_error());
	}
}

/* Accepts workers on loop 0 until the job ends (srv_notice). */
static void srv_serve(struct server *srv)
{
	srv->acceptors[0] = (struct srv_acceptor){.srv = srv, .tp = srv->tp,
						   .l = srv->listener, .resume.slot = -1};
	srv->nacceptors = 1;
	if (srv->ipc_listener != NULL)
		srv->acceptors[srv->nacceptors++] = (struct srv_acceptor){
			.srv = srv, .tp = transport_ipc(), .l = srv->ipc_listener, .resume.slot = -1};
	if (loop_post(srv->pool.loops[0], srv_watch_listeners, srv) != 0)
		rdv_client_fail_job(srv->rdv, UNISUM_ENOMEM, "a server is out of memory");
	/* This thread runs loop 0 (one thread fewer than waiting here),
	 * until the job ends (srv_notice stops it). */
	pthread_mutex_lock(&srv->lock);
	bool run = !atomic_load(&srv->stopping);
	srv->main_loop = run ? srv->pool.loops[0] : NULL;
	pthread_mutex_unlock(&srv->lock);
	if (run)
		loop_run(srv->pool.loops[0], srv_wake_engines, srv);
	pthread_mutex_lock(&srv->lock);
	srv->main_loop = NULL;
	pthread_mutex_unlock(&srv->lock);
	srv_wake_engines(NULL);	/* no longer a loop: posts signal at once */
}

/* After the loops halted: the listeners are no longer watched. */
static void srv_unwatch_listeners(struct server *srv)
{
	for (int i = 0; i < srv->nacceptors; i++) {
		loop_io_del(&srv->acceptors[i].io);
		loop_timer_stop(srv->pool.loops[0], &srv->acceptors[i].resume);
	}
	srv->nacceptors = 0;
}

/* Starts the loops that serve the connections (UNISUM_IO_THREADS; by
 * default one per core: a server's loops copy every push in).  0 or an
 * error, named (loop_pool_free undoes it either way). */
static int srv_start_loops(struct server *srv)
{
	srv->pool = (struct loop_pool){.name = "unisum-sloop", .after = srv_wake_engines,
				       .arg = srv, .on_caller = true};
	int thread_rc, n = srv->cfg->io_threads > 0 ? srv->cfg->io_threads : config_per_cores(1);
	int rc = loop_pool_start(&srv->pool, n, &thread_rc);
	if (thread_rc != 0) {
		srv_out_of_threads(srv, thread_rc, "its I/O threads");
	} else if (rc == UNISUM_ESYS && srv->rdv != NULL) {	/* out of descriptors: named */
		char why[640];
		snprintf(why, sizeof why, "server %d (pid %d) cannot make its I/O loop: %s",
			 srv->rank, (int)getpid(), log_last_error());
		rdv_client_fail_job(srv->rdv, rc, why);
	}
	return rc;
}

/* A server for cfg, with its tables and no thread yet; NULL when out of
 * memory. */
static struct server *srv_new(const struct config *cfg)
{
	struct server *srv = calloc(1, sizeof *srv);
	if (srv == NULL)
		return NULL;
	srv->cfg = cfg;
	srv->nworkers = cfg->num_workers;
	/* "N", or "N:R" for server rank R only (the rank is known later). */
	const char *crash = getenv("UNISUM_TEST_CRASH_AFTER_REPLIES");
	char *end = NULL;
	srv->crash_after = crash != NULL ? strtol(crash, &end, 10) : 0;
	srv->crash_rank = end != NULL && *end == ':' ? (int)strtol(end + 1, NULL, 10) : -1;
	srv->crash_name = getenv("UNISUM_TEST_CRASH_KEY_NAME");
	srv->nengines = cfg->engine_threads;
	pthread_mutex_init(&srv->lock, NULL);
	srv->nbuckets = 1024;
	srv->buckets = calloc(srv->nbuckets, sizeof *srv->buckets);
	srv->by_worker = calloc((size_t)srv->nworkers, sizeof *srv->by_worker);
	srv->left = calloc((size_t)srv->nworkers, sizeof *srv->left);
	srv->drain = srv_engine_drain;
	srv->engines = calloc((size_t)srv->nengines, sizeof *srv->engines);
	if (srv->buckets == NULL || srv->by_worker == NULL || srv->left == NULL ||
	    srv->engines == NULL) {
		free(srv->buckets);
		free(srv->by_worker);
		free(srv->left);
		free(srv->engines);
		pthread_mutex_destroy(&srv->lock);
		free(srv);
		return NULL;
	}
	return srv;
}

/* Frees what srv_new made and every key left. */
static void srv_free(struct server *srv)
{
	if (srv == NULL)
		return;
	for (size_t i = 0; i < srv->nbuckets; i++)
		for (struct srv_key *k = srv->buckets[i]; k;) {
			struct srv_key *next = k->next;
			srv_key_free(k);
			k = next;
		}
	free(srv->buckets);
	while (srv->poisoned) {
		struct srv_poison *p = srv->poisoned;
		srv->poisoned = p->next;
		free(p->why);
		free(p);
	}
	free(srv->by_worker);
	free(srv->left);
	free(srv->engines);
	pthread_mutex_destroy(&srv->lock);
	free(srv);
}

/* Starts the engine threads; *started counts those running.  0 or
 * UNISUM_ESYS. */
static int srv_start_engines(struct server *srv, int *started)
{
	for (*started = 0; *started < srv->nengines; (*started)++) {
		struct srv_engine *e = &srv->engines[*started];
		e->srv = srv;
		pthread_mutex_init(&e->lock, NULL);
		timing_cond_init(&e->cond);
		if (pthread_create(&e->thread, NULL, srv_engine_main, e) != 0)
			return UNISUM_ESYS;
	}
	return 0;
}

/* Stops and joins the first `started` engines once their queues are
 * empty; later posts are dropped.  (A queued EVENT_FREE's key is out of
 * the table: freed here.) */
static void srv_stop_engines(struct server *srv, int started)
{
	for (int i = 0; i < started; i++) {
		struct srv_engine *e = &srv->engines[i];
		pthread_mutex_lock(&e->lock);
		e->stop = true;
		pthread_cond_signal(&e->cond);
		pthread_mutex_unlock(&e->lock);
		pthread_join(e->thread, NULL);
		pthread_mutex_lock(&e->lock);
		e->joined = true;
		pthread_mutex_unlock(&e->lock);
		free(e->keys);
		for (struct srv_event *ev = e->head; ev;) {
			struct srv_event *next = ev->next;
			if (ev->type == EVENT_FREE)
				srv_key_unpin(ev->key);
			free(ev);
			ev = next;
		}
	}
}

/* Registers with the scheduler as listening on bind_host:port and checks
 * that the job has the machines this server expects.  0 or an error
 * (logged; the client is freed). */
static int srv_join(struct server *srv, const char *bind_host, int port)
{
	int rc = rdv_client_new(srv->cfg, port, srv_notice, srv_tensor_error, srv, &srv->rdv);
	if (rc != 0)	/* named as a worker names it: the scheduler may be what died */
		return log_fail(rc, "server: cannot join the job through the scheduler at %s:%d: %s",
				srv->cfg->scheduler_host, srv->cfg->scheduler_port, log_last_error());
	rdv_client_on_migrate(srv->rdv, srv_on_migrate, srv);
	rdv_client_on_metrics(srv->rdv, srv_metrics, srv);
	srv->id = rdv_client_id(srv->rdv);
	srv->rank = rdv_client_rank(srv->rdv);
	srv->local_size = rdv_client_local_size(srv->rdv);
	if (srv->cfg->elastic)	/* the job's size is the generation's */
		srv->nworkers = rdv_client_num_machines(srv->rdv);
	log_set_identity("server", srv->rank);
	/* Every rank may connect: a local root for its machine, the others for
	 * their process sets' tensors. */
	srv->npeers = srv->nworkers + srv->nworkers * (srv->local_size > 0 ? srv->local_size : 1);
	struct srv_conn **by = calloc((size_t)srv->npeers, sizeof *by);
	int64_t *left = calloc((size_t)srv->npeers, sizeof *left);
	if (by == NULL || left == NULL) {
		free(by);
		free(left);
		rdv_client_free(srv->rdv);
		srv->rdv = NULL;
		return log_fail(UNISUM_ENOMEM, "server %d: out of memory", srv->rank);
	}
	free(srv->by_worker);
	free(srv->left);
	srv->by_worker = by;
	srv->left = left;
	if (rdv_client_num_machines(srv->rdv) != srv->nworkers) {
		char why[256];
		snprintf(why, sizeof why,
			 "server %d has UNISUM_NUM_WORKER=%d but the job has %d worker machines: give "
			 "every process the same UNISUM_NUM_WORKER (machines, not worker processes)",
			 srv->rank, srv->nworkers, rdv_client_num_machines(srv->rdv));
		rc = log_fail(UNISUM_ECONFIG, "%s", why);
		rdv_client_fail_job(srv->rdv, UNISUM_ECONFIG, why);
		rdv_client_free(srv->rdv);
		srv->rdv = NULL;
		return rc;
	}
	LOG_INFO("listening on %s:%d (%s) with %d engine threads, reducer %s", bind_host, port,
		 srv->tp->name, srv->nengines, reducer_isa_name(reducer_active_isa()));
	return 0;
}

/* Workers of this host (UNISUM_IPC) connect over the IPC transport,
 * named after our TCP address; without it they use TCP, so a failure here
 * only costs speed. */
static void srv_listen_ipc(struct server *srv, int port)
{
	int ignored;
	if (srv->cfg->ipc &&
	    transport_ipc()->listen(srv->cfg->node_host, port, &srv->ipc_listener, &ignored) != 0) {
		LOG_WARN("workers of this host will send over TCP: %s", log_last_error());
		srv->ipc_listener = NULL;
	}
}


/* The job ended: hangs up on every worker, stops the loops and frees the
 * connections. */
static void srv_hang_up(struct server *srv)
{
	atomic_store(&srv->stopping, true);
	loop_pool_halt(&srv->pool);
	srv_unwatch_listeners(srv);
	/* The engines still run: they find no connection from now on, and
	 * those sending on one finish before it is freed. */
	pthread_mutex_lock(&srv->lock);
	for (struct srv_conn *c = srv->conns; c; c = c->next)
		if (c->conn != NULL)
			c->tp->conn_shutdown(c->conn);
	for (int p = 0; p < srv->npeers; p++)
		srv->by_worker[p] = NULL;
	pthread_mutex_unlock(&srv->lock);
	for (struct srv_conn *c = srv->conns; c; c = c->next)
		while (atomic_load(&c->refs) > 0)
			nanosleep(&(struct timespec){0, 1000000}, NULL);
	while (srv->conns) {
		struct srv_conn *c = srv->conns;
		srv->conns = c->next;
		srv_conn_free(c);
	}
	srv_backup_stop(srv);
	loop_pool_free(&srv->pool);
}

/* One membership of the job: until it ends (UNISUM_EMEMBERSHIP: an
 * elastic job re-forms).  Then the server is kept in *ended, not freed: a
 * worker of that generation may still be reading a sum from its memory
 * (IPC passes them by address) before it hears of the re-form, and this
 * process lives on.  It is freed once the next generation has formed
 * (every worker of the last one rejoined, its connections closed, or was
 * lost). */
static int srv_run_once(const struct config *cfg, bool *elsewhere, struct server **ended)
{
	if (elsewhere != NULL)
		*elsewhere = false;
	struct server *srv = srv_new(cfg);
	if (srv == NULL)
		return UNISUM_ENOMEM;
	int started = 0, port = 0;
	const char *bind_host = cfg->bind[0] ? cfg->bind : cfg->node_host;
	char why[512];
	int rc = (srv->tp = transport_named(cfg->transport, why, sizeof why)) == NULL
			 ? log_fail(UNISUM_ECONFIG, "server: %s", why)
			 : srv->tp->listen(bind_host, cfg->port, &srv->listener, &port);
	if (rc != 0)
		goto out_free;
	srv_listen_ipc(srv, port);
	rc = srv_start_engines(srv, &started);
	if (rc == 0)
		rc = srv_join(srv, bind_host, port);
	if (rc == 0 && srv_backup_init(srv) != 0)
		rc = log_fail(UNISUM_ENOMEM, "server %d: out of memory", srv->rank);
	if (rc == 0 && (rc = srv_start_loops(srv)) == 0 && (rc = srv_backup_start(srv)) != 0) {
		srv_out_of_threads(srv, rc, "the thread that dials its backup server");
		rc = UNISUM_ESYS;
	}
	if (rc != 0 && srv->rdv != NULL) {
		rdv_client_free(srv->rdv);	/* the job was told (srv_out_of_threads) */
		srv->rdv = NULL;
	}
	if (rc != 0)
		goto out_stop_engines;
	srv_free(*ended);	/* the new generation formed */
	*ended = NULL;

	srv_serve(srv);

	/* Engines tell the scheduler of stalls and disagreements: they stop
	 * before its client goes. */
	srv_hang_up(srv);
	srv_stop_engines(srv, started);
	rdv_client_free(srv->rdv);
	rc = atomic_load(&srv->job_error);
	started = 0;
out_stop_engines:
	loop_pool_free(&srv->pool);
	srv_stop_engines(srv, started);
	srv_backup_free(srv);
	transport_ipc()->listener_free(srv->ipc_listener);
	srv->tp->listener_free(srv->listener);
out_free:
	if (elsewhere != NULL && rc != 0)
		*elsewhere = atomic_load(&srv->told);
	if (rc == UNISUM_EMEMBERSHIP && cfg->elastic && *ended == NULL)
		*ended = srv;
	else
		srv_free(srv);
	return rc;
}

int server_run(const struct config *cfg, bool *elsewhere)
{
	struct server *ended = NULL;
	int rc = srv_run_once(cfg, elsewhere, &ended);
	/* Elastic: register again for the new generation, which ranks the
	 * servers afresh. */
	struct config again = *cfg;
	again.server_id = -1;
	while (rc == UNISUM_EMEMBERSHIP && cfg->elastic) {
		LOG_INFO("the job re-forms: registering again");
		rc = srv_run_once(&again, elsewhere, &ended);
	}
	srv_free(ended);
	return rc;
}
