/*
 * links.c - the worker's server connections as links: opening them (to
 * every server at once: dial, the handshake without blocking, then each
 * is handed to one of the worker's I/O loops and says hello), the loops
 * themselves (UNISUM_IO_THREADS, a fixed number whatever the number of
 * servers), the reaper (one thread that
 * runs wk_conn_fail for every connection that ended: it may wait for the
 * scheduler's word on a failover, which no loop may), closing them, and
 * reconnecting to a lost server's replacement.  conns.c sends and
 * receives on them.  See worker.c's DESIGN.
 */
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/prctl.h>

#include "log/log.h"
#include "timing/timing.h"
#include "wire/wire.h"
#include "worker/worker_int.h"

/* ---- the loops and the reaper --------------------------------------------- */

/* The reaper: the tasks the loops leave it (a connection that ended, a
 * moved job), in order, until the worker closes its connections. */
static void *wk_reaper_main(void *arg)
{
	prctl(PR_SET_NAME, "unisum-reaper"); /* for top -H, perf and gdb */
	struct worker *w = arg;
	pthread_mutex_lock(&w->lock);
	for (;;) {
		while (w->tasks == NULL && !w->reaper_stop)
			pthread_cond_wait(&w->reap_cond, &w->lock);
		struct wk_task *t = w->tasks;
		if (t == NULL)
			break;
		w->tasks = t->next;
		if (w->tasks == NULL)
			w->tasks_tail = NULL;
		pthread_mutex_unlock(&w->lock);
		wk_task_run(t);
		pthread_mutex_lock(&w->lock);
	}
	pthread_mutex_unlock(&w->lock);
	return NULL;
}

/* A thread of the worker's links could not start (pthread_create's rc):
 * names the limits here and, through the scheduler, to every process of
 * the job, which would otherwise see this worker leave. */
static int wk_no_thread(struct worker *w, int rc, const char *what)
{
	char limits[384], why[640];
	log_thread_limits(rc, limits, sizeof limits);
	snprintf(why, sizeof why, "worker %d (pid %d) cannot start %s: %s", w->rank, (int)getpid(),
		 what, limits);
	rdv_client_fail_job(w->rdv, UNISUM_ESYS, why);
	return log_fail(UNISUM_ESYS, "%s", why);
}

/* Starts the loops and the reaper.  0 or an error, named (wk_stop_links
 * undoes what was started). */
static int wk_start_links(struct worker *w)
{
	/* A worker's loops receive its own replies: one per 8 cores. */
	w->pool = (struct loop_pool){.name = "unisum-wloop"};
	int thread_rc, n = w->cfg.io_threads > 0 ? w->cfg.io_threads : config_per_cores(8);
	int rc = loop_pool_start(&w->pool, n, &thread_rc);
	if (thread_rc != 0)
		return wk_no_thread(w, thread_rc, "its I/O threads");
	if (rc == UNISUM_ESYS) {	/* out of descriptors: the limit is named */
		char why[640];
		snprintf(why, sizeof why, "worker %d (pid %d) cannot make its I/O loop: %s", w->rank,
			 (int)getpid(), log_last_error());
		rdv_client_fail_job(w->rdv, rc, why);
		return log_fail(rc, "%s", why);
	}
	if (rc != 0)
		return rc;
	w->reaper_stop = false;
	rc = pthread_create(&w->reaper, NULL, wk_reaper_main, w);
	if (rc != 0)
		return wk_no_thread(w, rc, "its thread for connections that end");
	w->reaper_started = true;
	return 0;
}

/* Stops the reaper and the loops; their connections are freed already. */
static void wk_stop_links(struct worker *w)
{
	if (w->reaper_started) {
		pthread_mutex_lock(&w->lock);
		w->reaper_stop = true;
		pthread_cond_broadcast(&w->reap_cond);
		pthread_mutex_unlock(&w->lock);
		pthread_join(w->reaper, NULL);
		w->reaper_started = false;
	}
	loop_pool_free(&w->pool);
}

/* ---- one link ------------------------------------------------------------- */

/* Dials server n for c, without the handshake (wk_handshake does it):
 * over IPC when n shares this host (same boot, network and pid
 * namespaces) and UNISUM_IPC allows, else (or when n does not listen for
 * IPC) over UNISUM_TRANSPORT's (TCP or UCX). */
static int wk_dial_one(struct worker *w, struct wk_conn *c, const struct rdv_node *n)
{
	int rc = UNISUM_ECONN;
	if (w->cfg.ipc && rdv_client_same_host(w->rdv, n)) {
		c->tp = transport_ipc();
		rc = c->tp->dial(n->host, n->port, 0, &c->conn);
		if (rc == 0)
			LOG_INFO("worker %d passes data to %s by address (IPC: same host)", w->rank,
				 c->label);
		else
			LOG_INFO("worker %d reaches %s over %s: %s", w->rank, c->label, w->tp->name,
				 log_last_error());
	}
	if (rc != 0) {
		c->tp = w->tp;
		rc = c->tp->dial(n->host, n->port, w->cfg.timeout_ms, &c->conn);
	}
	if (rc == UNISUM_ESYS) {
		/* Out of descriptors (named in the last error): every process
		 * of the job hears it, not of a worker that left. */
		char why[640];
		snprintf(why, sizeof why, "worker %d (pid %d) cannot open its connection to %s: %s",
			 w->rank, (int)getpid(), c->label, log_last_error());
		rdv_client_fail_job(w->rdv, UNISUM_ESYS, why);
		return log_fail(rc, "%s", why);
	}
	if (rc != 0)
		return log_fail(rc, "worker %d cannot reach %s: %s", w->rank, c->label, log_last_error());
	return 0;
}

/* Shakes hands (the job secret, as the connector) with every dialled link
 * of cs[0..n) at once, from this thread: the non-blocking form, driven by
 * poll, so that n servers cost one wait, not 2n.  rcs[i] is 0, or
 * UNISUM_EAUTH with the reason in cs[i]->dead_why. */
static void wk_handshake(struct worker *w, struct wk_conn **cs, int *rcs, int n)
{
	struct auth_state *a = calloc((size_t)n, sizeof *a);
	struct pollfd *p = calloc((size_t)n, sizeof *p);
	int left = 0;
	for (int i = 0; i < n; i++) {
		rcs[i] = a == NULL || p == NULL ? UNISUM_ENOMEM : TP_AGAIN;
		if (rcs[i] == TP_AGAIN) {
			a[i].connector = true;
			p[i] = (struct pollfd){.fd = cs[i]->tp->nb_fd(cs[i]->conn), .events = POLLIN};
			left++;
		} else {
			snprintf(cs[i]->dead_why, sizeof cs[i]->dead_why, "out of memory");
		}
	}
	int64_t until = timing_now_ms() + w->cfg.timeout_ms;
	while (left > 0) {
		for (int i = 0; i < n; i++) {
			if (rcs[i] != TP_AGAIN)
				continue;
			rcs[i] = cs[i]->tp->auth_nb(cs[i]->conn, &a[i], cs[i]->dead_why,
						    sizeof cs[i]->dead_why);
			/* Its answer is the one thing it writes: wait to read. */
			p[i].fd = rcs[i] == TP_AGAIN ? p[i].fd : -1;
			left -= rcs[i] != TP_AGAIN;
		}
		int64_t wait = until - timing_now_ms();
		if (left > 0 && (wait <= 0 || poll(p, (nfds_t)n, (int)wait) == 0))
			break;
	}
	for (int i = 0; i < n; i++)
		if (rcs[i] == TP_AGAIN) {
			rcs[i] = UNISUM_EAUTH;
			snprintf(cs[i]->dead_why, sizeof cs[i]->dead_why,
				 "%s did not finish the handshake within UNISUM_TIMEOUT_MS=%d",
				 cs[i]->label, w->cfg.timeout_ms);
		}
	free(a);
	free(p);
}

/* Handing connections to their loops (loop_conn_new runs there), waited
 * for by the thread that connected them. */
struct wk_serve {
	int left, rc;
	pthread_mutex_t lock;
	pthread_cond_t cond;
};

struct wk_serve_one {
	struct wk_serve *sv;
	struct wk_conn *c;
};

static void wk_serve_on_loop(void *arg)
{
	struct wk_serve_one *one = arg;
	struct wk_conn *c = one->c;
	int rc = loop_conn_new(c->loop, c->tp, c->conn, false, &wk_conn_ops, c, &c->lc);
	struct wk_serve *sv = one->sv;
	pthread_mutex_lock(&sv->lock);
	if (rc != 0 && sv->rc == 0)
		sv->rc = rc;
	if (--sv->left == 0)
		pthread_cond_signal(&sv->cond);
	pthread_mutex_unlock(&sv->lock);
}

/* The hello to c failed (rc): a server that hangs up then is usually
 * failing itself (out of descriptors, say), which the scheduler is about
 * to announce; its notice gets a moment, so that the error names the
 * root cause rather than the echo.  Returns the error. */
static int wk_hello_failed(struct worker *w, const struct wk_conn *c, int rc)
{
	char root[600] = "";
	pthread_mutex_lock(&w->lock);
	struct timespec until = timing_deadline(2000);
	while (w->failed == 0 && pthread_cond_timedwait(&w->failed_cond, &w->lock, &until) == 0)
		;
	if (w->failed != 0) {
		rc = w->failed;
		snprintf(root, sizeof root, ": the job failed: %s", w->failed_why);
	}
	pthread_mutex_unlock(&w->lock);
	return log_fail(rc, "worker %d lost %s while saying hello%s", w->rank, c->label, root);
}

/* Serves cs[0..n) (connected and authenticated), each on its loop, and
 * says hello on each.  0 or an error. */
static int wk_serve(struct worker *w, struct wk_conn **cs, int n)
{
	struct wk_serve sv = {0};
	struct wk_serve_one *ones = calloc((size_t)n + 1, sizeof *ones);
	if (ones == NULL)
		return log_fail(UNISUM_ENOMEM, "worker %d: out of memory", w->rank);
	pthread_mutex_init(&sv.lock, NULL);
	pthread_cond_init(&sv.cond, NULL);
	for (int i = 0; i < n; i++) {
		struct wk_conn *c = cs[i];
		c->loop = w->pool.loops[c->server % w->pool.n];
		c->reaped = false;
		ones[i] = (struct wk_serve_one){.sv = &sv, .c = c};
		pthread_mutex_lock(&sv.lock);
		int rc = loop_post(c->loop, wk_serve_on_loop, &ones[i]);
		if (rc == 0)
			sv.left++;
		else if (sv.rc == 0)
			sv.rc = rc;
		pthread_mutex_unlock(&sv.lock);
	}
	pthread_mutex_lock(&sv.lock);
	while (sv.left > 0)
		pthread_cond_wait(&sv.cond, &sv.lock);
	int rc = sv.rc;
	pthread_mutex_unlock(&sv.lock);
	pthread_cond_destroy(&sv.cond);
	pthread_mutex_destroy(&sv.lock);
	free(ones);
	if (rc != 0)
		return log_fail(rc, "worker %d cannot serve its connections to the servers: %s",
				w->rank, unisum_strerror(rc));
	struct wire_hdr hello = {.type = WIRE_REGISTER, .sender = rdv_client_id(w->rdv)};
	for (int i = 0; i < n; i++)
		if ((rc = loop_conn_send(cs[i]->lc, &hello, NULL)) != 0)
			return wk_hello_failed(w, cs[i], rc);
	return 0;
}

/* Frees c's link: its loop connection (and transport connection), or the
 * transport connection its loop never took. */
static void wk_link_free(struct wk_conn *c)
{
	if (c->lc != NULL)
		loop_conn_free(c->lc);
	else if (c->conn != NULL)
		c->tp->conn_free(c->conn);
	c->lc = NULL;
	c->conn = NULL;
}

/* Waits until the reaper is done with ended connection c. */
static void wk_await_reaped(struct worker *w, struct wk_conn *c)
{
	pthread_mutex_lock(&w->lock);
	while (!c->reaped)
		pthread_cond_wait(&w->reap_cond, &w->lock);
	pthread_mutex_unlock(&w->lock);
}

int wk_reconnect(struct worker *w, struct wk_conn *c, const struct rdv_node *n)
{
	pthread_mutex_lock(&c->lock);
	bool gone = c->dead && c->handed_over && !c->parking;
	pthread_mutex_unlock(&c->lock);
	if (!gone)
		return log_fail(UNISUM_EPROTO, "server %d is not a lost one here", n->rank);
	/* Its work was handed over; the reaper is done with it, or about to be. */
	if (c->lc != NULL)
		wk_await_reaped(w, c);
	wk_link_free(c);
	snprintf(c->label, sizeof c->label, "server %d (%s:%d)", c->server, n->host, n->port);
	int rc = wk_dial_one(w, c, n);
	if (rc == 0) {
		wk_handshake(w, &c, &rc, 1);
		if (rc != 0)
			rc = log_fail(rc, "worker %d cannot reach %s: %s", w->rank, c->label,
				      c->dead_why);
	}
	if (rc == 0)
		rc = wk_serve(w, &c, 1);
	if (rc != 0)
		return rc;
	/* Counted anew: the bytes this server got since it came back. */
	atomic_store(&c->bytes_pushed, 0);
	atomic_store(&c->bytes_pulled, 0);
	pthread_mutex_lock(&c->lock);
	c->dead = false;
	c->handed_over = false;
	c->dead_why[0] = '\0';
	pthread_mutex_unlock(&c->lock);
	return 0;
}

/* How many hosts the servers are on, from the address book every worker
 * has. */
static int wk_count_server_hosts(struct worker *w)
{
	int hosts = 0;
	for (int s = 0; s < w->nservers; s++) {
		const struct rdv_node *n = rdv_client_server(w->rdv, s), *m;
		bool seen = false;
		for (int t = 0; n != NULL && t < s && !seen; t++)
			seen = (m = rdv_client_server(w->rdv, t)) != NULL &&
			       strcmp(m->host_id, n->host_id) == 0;
		hosts += n != NULL && !seen;
	}
	return hosts;
}

/* Server c refused this worker's first connection: with failover on it
 * may have died after it joined, and the scheduler then says so (its
 * FAILOVER, within UNISUM_TIMEOUT_MS).  Whether it did: c is then dead
 * and handed over (it held nothing of this worker's), and the job goes
 * on without it, as for a server lost later. */
static bool wk_lost_at_start(struct worker *w, struct wk_conn *c)
{
	if (!w->keep_replies)
		return false;
	pthread_mutex_lock(&w->lock);
	bool lost = wk_await_lost(w, c->server, w->cfg.timeout_ms + 2000);
	c->reaped = lost;
	pthread_mutex_unlock(&w->lock);
	if (!lost)
		return false;
	pthread_mutex_lock(&c->lock);
	c->dead = true;
	c->handed_over = true;
	snprintf(c->dead_why, sizeof c->dead_why, "%s was lost before worker %d reached it", c->label,
		 w->rank);
	pthread_mutex_unlock(&c->lock);
	LOG_WARN("%s", c->dead_why);
	return true;
}

/* Sets c up as the link to server s (not yet connected).  0 or an error. */
static int wk_link_init(struct worker *w, struct wk_conn *c, int s)
{
	const struct rdv_node *n = rdv_client_server(w->rdv, s);
	c->w = w;
	c->server = s;
	c->npending_buckets = 1024;
	c->pending = calloc(c->npending_buckets, sizeof *c->pending);
	if (n == NULL || c->pending == NULL)
		return UNISUM_ENOMEM;
	snprintf(c->label, sizeof c->label, "server %d (%s:%d)", s, n->host, n->port);
	pthread_mutex_init(&c->lock, NULL);
	return 0;
}

/* A link that could not open (rc, not out of descriptors): fine when its
 * server was lost at the start (wk_lost_at_start), else the error. */
static int wk_link_failed(struct worker *w, struct wk_conn *c, int rc)
{
	if (rc == UNISUM_ESYS || !wk_lost_at_start(w, c))
		return rc;
	return 0;
}

/* Opens the links to every server in three steps, each over all servers
 * at once: dial, shake hands (one thread, poll), hand to the loops. */
int wk_connect_servers(struct worker *w)
{
	w->conns = calloc((size_t)w->nservers, sizeof *w->conns);
	struct wk_conn **cs = calloc((size_t)w->nservers + 1, sizeof *cs);
	int *rcs = calloc((size_t)w->nservers + 1, sizeof *rcs);
	int rc = w->conns == NULL || cs == NULL || rcs == NULL ? UNISUM_ENOMEM : 0, n = 0;
	w->server_hosts = rc == 0 ? wk_count_server_hosts(w) : 0;
	if (rc == 0)
		rc = wk_start_links(w);
	for (int s = 0; rc == 0 && s < w->nservers; s++) {
		struct wk_conn *c = &w->conns[s];
		if ((rc = wk_link_init(w, c, s)) != 0)
			break;
		rc = wk_dial_one(w, c, rdv_client_server(w->rdv, s));
		if (rc == 0)
			cs[n++] = c;
		else
			rc = wk_link_failed(w, c, rc);
	}
	if (rc == 0)
		wk_handshake(w, cs, rcs, n);
	int m = 0;
	for (int i = 0; rc == 0 && i < n; i++) {
		if (rcs[i] == 0) {
			cs[m++] = cs[i];
			continue;
		}
		log_fail(rcs[i], "worker %d cannot reach %s: %s", w->rank, cs[i]->label,
			 cs[i]->dead_why);
		cs[i]->dead_why[0] = '\0';
		rc = wk_link_failed(w, cs[i], rcs[i]);
	}
	if (rc == 0)
		rc = wk_serve(w, cs, m);
	free(cs);
	free(rcs);
	if (rc != 0)
		return rc;
	pthread_mutex_lock(&w->lock);
	w->conns_live = true;
	pthread_mutex_unlock(&w->lock);
	return 0;
}

/* Stops and frees every server connection: each is shut, the reaper
 * fails what was pending on it, then the links go. */
void wk_close_conns(struct worker *w)
{
	pthread_mutex_lock(&w->lock);
	w->conns_live = false;	/* the scheduler's notice keeps off from now on */
	pthread_mutex_unlock(&w->lock);
	if (w->conns == NULL) {
		wk_stop_links(w);
		return;
	}
	for (int s = 0; s < w->nservers; s++) {
		struct wk_conn *c = &w->conns[s];
		if (c->lc == NULL)
			continue;
		pthread_mutex_lock(&c->lock);
		c->closing = true;
		pthread_mutex_unlock(&c->lock);
		loop_conn_shutdown(c->lc);
	}
	for (int s = 0; s < w->nservers; s++)
		if (w->conns[s].lc != NULL)
			wk_await_reaped(w, &w->conns[s]);
	wk_stop_links(w);
	for (int s = 0; s < w->nservers; s++) {
		struct wk_conn *c = &w->conns[s];
		if (c->lc != NULL || c->conn != NULL)
			pthread_mutex_destroy(&c->lock);
		wk_link_free(c);
		free(c->pending);
	}
	/* Under the lock: unisum_get_stats reads the counters under it. */
	pthread_mutex_lock(&w->lock);
	struct wk_conn *conns = w->conns;
	w->conns = NULL;
	pthread_mutex_unlock(&w->lock);
	free(conns);
}
