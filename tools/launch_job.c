/*
 * launch_job.c - the job that `unisum launch` runs: its identity (job id,
 * secret), its configuration from the environment, its shared memory, and
 * the in-process scheduler.
 *
 * Shared memory.  Every child gets UNISUM_JOB_ID, which names the job's
 * segments in /dev/shm: the user's when set, else a fresh one unique on
 * this host ("l<pid>-<random hex>").  Before starting anything the launcher
 * removes the segments of dead jobs (shm_clean_stale()); once its children
 * are gone, on every way out (success, failure, --timeout, signals), it
 * removes every segment of its own job (shm_unlink_job()), so that a worker
 * killed with SIGKILL leaves nothing behind.  Only a launcher killed with
 * SIGKILL leaves them, to the next launcher's stale sweep.
 *
 * The scheduler runs inside the launcher; a helper thread blocks in
 * rdv_scheduler_wait() and reports through a pipe to the event loop (see
 * DESIGN in launch.c).
 *
 * Stopping the scheduler.  After every child is gone the scheduler
 * normally finishes by itself (a clean goodbye, or connections that dropped
 * without one); only if it has not within 2 s is it aborted.
 * rdv_scheduler_abort() is safe until rdv_scheduler_free(), which runs last.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "unisum.h"
#include "config/config.h"
#include "launch.h"
#include "log/log.h"
#include "rendezvous/rendezvous.h"
#include "shm/shm.h"
#include "timing/timing.h"
#include "transport/auth.h"
#include "transport/transport.h"

/* After every child is gone, how long the scheduler may take to finish on
 * its own before it is aborted, and then how long the abort may take. */
#define LAUNCH_SCHED_GRACE_MS 2000
#define LAUNCH_SCHED_ABORT_MS 5000

/* ---- identity and configuration ------------------------------------------ */

/* Gives the job a fresh secret (UNISUM_SECRET, inherited by every child)
 * unless the user chose one (in `given`, the environment as the launcher
 * found it): then nobody who merely reaches a port can join the job or
 * inject gradients.  False when no random bytes could be had. */
static bool secret_ensure(const struct config *given)
{
	if (given->secret[0] != '\0' || given->secret_file[0] != '\0')
		return true;
	uint8_t raw[32];
	char hex[2 * sizeof raw + 1];
	if (getrandom(raw, sizeof raw, 0) != (ssize_t)sizeof raw)
		return false;
	for (size_t i = 0; i < sizeof raw; i++)
		snprintf(hex + 2 * i, 3, "%02x", raw[i]);
	return setenv("UNISUM_SECRET", hex, 1) == 0;
}

/* Sets l->job_id: the UNISUM_JOB_ID of the environment (env) when there is
 * one (the user's choice is kept), else a fresh one unique on this host,
 * put in environ so that every child inherits it.  Returns 0, or -1 after
 * printing why. */
static int job_id_choose(struct launcher *l, const struct config *env)
{
	const char *given = env->job_id[0] != '\0' ? env->job_id : NULL;
	uint8_t raw[4];

	if (given) {
		if (!shm_job_is_valid(given)) {
			fprintf(stderr, "unisum launch: UNISUM_JOB_ID='%s' is not a job id: 1 to %d "
				"letters, digits, '-' or '_'\n", given, SHM_JOB_MAX);
			return -1;
		}
		snprintf(l->job_id, sizeof(l->job_id), "%s", given);
		return 0;
	}
	if (getrandom(raw, sizeof(raw), GRND_NONBLOCK) != (ssize_t)sizeof(raw)) {
		/* The pid alone is unique among live launchers; the noise only
		 * keeps a later launcher with a recycled pid from the same name. */
		struct timespec ts;

		clock_gettime(CLOCK_REALTIME, &ts);
		memcpy(raw, &ts.tv_nsec, sizeof(raw));
	}
	snprintf(l->job_id, sizeof(l->job_id), "l%d-%02x%02x%02x%02x", (int)getpid(), raw[0],
		 raw[1], raw[2], raw[3]);
	if (setenv("UNISUM_JOB_ID", l->job_id, 1) != 0) {
		fprintf(stderr, "unisum launch: cannot set UNISUM_JOB_ID: %s\n", strerror(errno));
		return -1;
	}
	return 0;
}

/* Reads the job a machine belongs to (--nproc-per-node) from the
 * environment: the scheduler's address, the number of machines and
 * servers, this machine's index.  The variables the launcher sets per
 * child are removed first.  Returns 0, or -1 after printing which
 * variable is missing or malformed. */
static int machine_config(struct launcher *l)
{
	struct config cfg;
	char err[512];

	/* What the launcher sets per child cannot clash with the rest. */
	launch_env_clear(l);
	if (config_load(&cfg, err, sizeof(err)) != 0 ||
	    config_require(&cfg, CONFIG_ROLE_WORKER, err, sizeof(err)) != 0) {
		fprintf(stderr, "unisum launch --nproc-per-node: %s\n", err);
		return -1;
	}
	/* An elastic job's worker (launch_elastic.c starts one per node)
	 * is ranked by the scheduler. */
	bool elastic = cfg.elastic && cfg.worker_id < 0 && cfg.local_size == 1;
	if (!elastic && (cfg.worker_id < 0 || cfg.worker_id >= cfg.num_workers)) {
		fprintf(stderr, "unisum launch --nproc-per-node: UNISUM_WORKER_ID (or "
			"DMLC_WORKER_ID) must be this machine's index, from 0 to %d "
			"(UNISUM_NUM_WORKER counts machines)%s\n", cfg.num_workers - 1,
			cfg.worker_id < 0 ? ", and it is not set" : "");
		return -1;
	}
	l->machines = cfg.num_workers;
	l->machine = elastic ? 0 : cfg.worker_id;
	l->num_servers = cfg.num_servers;
	snprintf(l->sched_host, sizeof(l->sched_host), "%s", cfg.scheduler_host);
	l->sched_port = cfg.scheduler_port;
	log_set_level(cfg.log_level);
	return 0;
}

/* Reads the knobs of the in-process scheduler (heartbeat, timeout, log
 * level, secret) from the same environment the children get, after putting
 * the job's shape there: UNISUM_NUM_WORKER (machines) and
 * UNISUM_NUM_SERVER.  The variables the launcher sets per child are
 * removed first, so that leftovers in the user's shell cannot clash.
 * Fills *cfg; returns 0, or the exit status after printing why. */
static int job_config(struct launcher *l, const struct config *env, struct config *cfg)
{
	char err[512];
	char num[16];

	launch_env_clear(l);
	snprintf(num, sizeof(num), "%d", l->machines);
	setenv("UNISUM_NUM_WORKER", num, 1);
	snprintf(num, sizeof(num), "%d", l->num_servers);
	setenv("UNISUM_NUM_SERVER", num, 1);
	if (l->elastic) {
		setenv("UNISUM_ELASTIC", "1", 1);
		snprintf(num, sizeof(num), "%d", l->min_workers);
		setenv("UNISUM_ELASTIC_MIN_WORKERS", num, 1);
	}
	if (l->no_secret) {
		unsetenv("UNISUM_SECRET");
		unsetenv("UNISUM_SECRET_FILE");
	} else if (!secret_ensure(env)) {
		fprintf(stderr, "unisum launch: cannot make a job secret: %s\n", strerror(errno));
		return 1;
	}
	if (config_load(cfg, err, sizeof(err)) != 0 || auth_set_secret(cfg->secret) != 0) {
		fprintf(stderr, "unisum launch: %s\n", err);
		return LAUNCH_EXIT_USAGE;
	}
	log_set_level(cfg->log_level);
	return 0;
}

/* Node 0 of a multi-node job: the in-process scheduler's configuration,
 * from the job's environment (launch_node_environ put its shape there).
 * The other nodes are not the launcher's children: a node that starts
 * after the job failed is told why for UNISUM_TIMEOUT_MS, as by
 * `unisum scheduler`. */
/* Whether this node runs the job's scheduler: node 0, unless a launcher
 * of -H or --slurm started it (that one runs it, but for --scheduler-host:
 * --run-scheduler), or --no-scheduler says one runs at the master's
 * address already. */
static bool node_runs_scheduler(const struct launcher *l)
{
	return l->node_rank == 0 && (!l->remote || l->run_scheduler) && !l->no_scheduler;
}

static int node_sched_config(struct launcher *l, struct config *cfg)
{
	char err[512];

	if (config_load(cfg, err, sizeof(err)) != 0 || auth_set_secret(cfg->secret) != 0) {
		fprintf(stderr, "unisum launch: %s\n", err);
		return LAUNCH_EXIT_USAGE;
	}
	cfg->linger_ms = cfg->timeout_ms;
	/* Its children gone, node 0 still serves the others: their servers
	 * leave after SHUTDOWN, and after a failure late nodes are told. */
	l->sched_grace_ms = cfg->timeout_ms + 1000;
	return 0;
}

/* launch_job_configure for one machine of a job (--nproc-per-node, a
 * node over ssh or srun, a CPU-only server): its environment, and the
 * scheduler when this node runs it.  0, or LAUNCH_EXIT_USAGE after
 * printing why. */
static int machine_job_configure(struct launcher *l, struct config *cfg)
{
	if (l->remote && launch_remote_secret() < 0)
		return LAUNCH_EXIT_USAGE;
	if (l->remote)
		launch_slurm_env_untask();
	if (l->node_mode && launch_node_environ(l) < 0)
		return LAUNCH_EXIT_USAGE;
	if (l->no_secret && !l->node_mode) {
		unsetenv("UNISUM_SECRET");
		unsetenv("UNISUM_SECRET_FILE");
	}
	if (l->server_only) {
		l->machines = l->nnodes;
		l->num_servers = l->node_servers;
		l->sched_done = true;	/* node 0 has the scheduler */
		return 0;
	}
	if (machine_config(l) < 0)
		return LAUNCH_EXIT_USAGE;
	launch_torch_master(l);
	if (l->node_mode) {
		l->num_servers = l->node_servers;
		if (node_runs_scheduler(l))
			return node_sched_config(l, cfg);
	}
	/* No scheduler here: nothing to wait for. */
	l->sched_done = true;
	return 0;
}

int launch_job_configure(struct launcher *l, struct config *cfg)
{
	int rc;
	struct config env;	/* what the user set, before the launcher adds anything */
	char err[512];

	launch_env_clear(l);	/* leftovers of what the launcher sets per child */
	if (config_load(&env, err, sizeof(err)) != 0) {
		fprintf(stderr, "unisum launch: %s\n", err);
		return LAUNCH_EXIT_USAGE;
	}
	if (job_id_choose(l, &env) < 0)
		return LAUNCH_EXIT_USAGE;
	/* A server that dies is the scheduler's to replace, not a failure
	 * of the job (unless its failover cannot: then it fails the job). */
	l->server_failover = env.server_failover != 0 && l->num_servers > 1;
	if (l->one_machine)
		return machine_job_configure(l, cfg);
	rc = job_config(l, &env, cfg);
	if (rc != 0)
		return rc;
	if (l->metrics_port != 0)
		cfg->metrics_port = l->metrics_port > 0 ? l->metrics_port : launch_free_tcp_port();
	l->metrics_port = cfg->metrics_port;
	if (launch_netns_setup(l) < 0 || launch_racks_setup(l) < 0)
		return LAUNCH_EXIT_USAGE;
	launch_torch_master(l);
	if (l->elastic) {
		/* Workers the discovery script places on other hosts reach the
		 * scheduler (and the servers) at UNISUM_NODE_HOST, and get the
		 * secret on ssh's stdin as -H's hosts do. */
		struct in_addr a;
		if (inet_pton(AF_INET, cfg->node_host, &a) != 1) {
			fprintf(stderr, "unisum launch: --elastic: UNISUM_NODE_HOST='%s' is not an IPv4 "
				"address (the scheduler and the servers listen there)\n",
				cfg->node_host);
			return LAUNCH_EXIT_USAGE;
		}
		inet_ntop(AF_INET, &a, l->sched_addr, sizeof(l->sched_addr));
		snprintf(l->secret, sizeof(l->secret), "%s", cfg->secret);
		if (l->start_timeout_s < 0)
			l->start_timeout_s = 30;
	}
	if (l->nhosts > 0) {
		/* Over ssh: the hosts reach the scheduler here.  A host ssh
		 * cannot reach is named by ssh within --start-timeout; the
		 * registration deadline stays UNISUM_START_TIMEOUT_MS (a
		 * script may import for a while before unisum_init). */
		if ((l->sched_on_host ? launch_hosts_sched_remote(l) : launch_hosts_sched_addr(l)) < 0)
			return LAUNCH_EXIT_USAGE;
		if (strchr(cfg->secret, '\n')) {
			fprintf(stderr, "unisum launch: the job's secret holds a newline: it travels "
				"to the hosts as one line\n");
			return LAUNCH_EXIT_USAGE;
		}
		snprintf(l->secret, sizeof(l->secret), "%s", cfg->secret);
	}
	return 0;
}

void launch_announce(const struct launcher *l)
{
	if (l->server_only) {
		fprintf(stderr, "unisum launch: a CPU-only server of a job of %d nodes and %d "
			"servers, scheduler at %s:%d, job %s\n", l->nnodes, l->node_servers,
			l->master_addr, l->master_port, l->job_id);
		return;
	}
	char server[32] = "";

	if (!l->no_colocated)
		snprintf(server, sizeof(server), "server %d and ", l->node_rank);
	if (l->nhosts > 0)
		fprintf(stderr, "unisum launch: scheduler on %s:%d, %d host(s) over %s: %d with %s%d "
			"worker(s) each, %d with a CPU-only server, job %s:", l->sched_addr, l->port,
			l->nhosts, l->slurm ? "srun" : "ssh", l->machines,
			l->no_colocated ? "" : "a server and ", l->local_size, l->nserver_hosts,
			l->job_id);
	else if (l->node_mode)
		fprintf(stderr, "unisum launch: node %d of %d: %s%d worker(s) (ranks %d "
			"to %d)%s, scheduler at %s:%d, job %s:", l->node_rank, l->nnodes, server,
			l->local_size, l->machine * l->local_size, (l->machine + 1) * l->local_size - 1,
			node_runs_scheduler(l) ? " and the scheduler" : "",
			l->master_addr,
			l->master_port, l->job_id);
	else if (l->one_machine)
		fprintf(stderr, "unisum launch: machine %d of %d, %d worker(s) (ranks %d to %d), "
			"scheduler at %s:%d, job %s:", l->machine, l->machines, l->local_size,
			l->machine * l->local_size, (l->machine + 1) * l->local_size - 1,
			l->sched_host, l->sched_port, l->job_id);
	else if (l->local_size > 1)
		fprintf(stderr, "unisum launch: scheduler on %s:%d, %d server(s), %d worker(s) "
			"on %d machine(s) of %d, job %s:", l->sched_addr, l->port, l->num_servers,
			l->num_workers, l->machines, l->local_size, l->job_id);
	else
		fprintf(stderr, "unisum launch: scheduler on %s:%d, %d server(s), %d worker(s):",
			l->sched_addr, l->port, l->num_servers, l->num_workers);
	for (char **a = l->cmd; *a; a++)
		fprintf(stderr, " %s", *a);
	fputc('\n', stderr);
	if (l->metrics_port > 0 && !l->sched_done)
		fprintf(stderr, "unisum launch: metrics at http://%s:%d/metrics, the live page at "
			"http://%s:%d/, in a terminal: unisum top %s\n", l->sched_addr,
			l->metrics_port, l->sched_addr, l->metrics_port, l->job_id);
	if (!l->one_machine && l->machines == 1 && l->local_size > 1)
		fprintf(stderr, "unisum launch: all %d workers share one machine: the "
			"shared-memory local reduce is the whole job and the %d server(s) stay "
			"idle (--local-size 1 sends everything through the servers)\n",
			l->num_workers, l->num_servers);
}

/* ---- shared memory ------------------------------------------------------- */

void launch_shm_sweep_stale(void)
{
	int removed = 0;

	log_set_identity("launch", -1);
	if (shm_clean_stale(NULL, &removed) == 0 && removed > 0)
		fprintf(stderr, "unisum launch: removed %d stale shared-memory segment(s) of dead "
			"jobs from %s\n", removed, SHM_DIR);
	/* A failure was logged; only jobs with several workers per machine
	 * need /dev/shm, and they will say so. */
}

void launch_shm_finish(struct launcher *l)
{
	int removed = 0;

	if (!l->job_started)
		return;
	log_set_identity("launch", -1);
	if (shm_unlink_job(l->job_id, &removed) == 0 && removed > 0)
		LOG_INFO("removed %d shared-memory segment(s) left by the workers of job %s",
			 removed, l->job_id);
}

/* ---- the scheduler ------------------------------------------------------- */

/* The waiter thread: blocks in rdv_scheduler_wait() and reports. */
static void *sched_waiter(void *arg)
{
	struct launcher *l = arg;
	char byte = 1;
	ssize_t n;

	l->sched_rc = rdv_scheduler_wait(l->sched);
	do
		n = write(l->waiter_pipe[1], &byte, 1);
	while (n < 0 && errno == EINTR);
	return NULL;
}

void launch_sched_collect(struct launcher *l)
{
	char byte;

	if (l->sched_done || read(l->waiter_pipe[0], &byte, 1) != 1)
		return;
	pthread_join(l->waiter, NULL);
	l->sched_done = true;
}

/* Waits up to timeout_ms for the waiter's report; true once it is in. */
static bool sched_await(struct launcher *l, int timeout_ms)
{
	struct pollfd p = { .fd = l->waiter_pipe[0], .events = POLLIN };
	int64_t deadline = timing_now_ms() + timeout_ms;

	while (!l->sched_done) {
		int64_t left = deadline - timing_now_ms();

		if (left <= 0)
			break;
		if (poll(&p, 1, (int)left) > 0)
			launch_sched_collect(l);
	}
	return l->sched_done;
}

struct sched_start_args {
	struct launcher *l;
	const struct config *cfg;
};

static int sched_start_fn(void *arg)
{
	struct sched_start_args *a = arg;

	return rdv_scheduler_start(a->l->sched_addr, a->l->sched_listen_port, a->cfg, transport_tcp(),
				   &a->l->sched, &a->l->port);
}

int launch_sched_start(struct launcher *l, const struct config *cfg)
{
	int rc;

	struct sched_start_args args = { l, cfg };

	log_set_identity("scheduler", -1);
	rc = launch_netns_run(l->sched_netns >= 0 ? &l->netns[l->sched_netns] : NULL,
			      sched_start_fn, &args);
	if (rc == LAUNCH_NETNS_NOT_ENTERED)
		return -1;
	if (rc < 0) {
		fprintf(stderr, "unisum launch: cannot start the scheduler on %s: %s%s\n",
			l->sched_addr, unisum_strerror(rc), l->node_mode ? " (the master's address "
			"must be this node's own, or set UNISUM_BIND=0.0.0.0 on node 0)" : "");
		return -1;
	}
	rc = pthread_create(&l->waiter, NULL, sched_waiter, l);
	if (rc != 0) {
		fprintf(stderr, "unisum launch: cannot start the scheduler's waiter thread: %s\n",
			strerror(rc));
		rdv_scheduler_abort(l->sched);
		rdv_scheduler_wait(l->sched);
		rdv_scheduler_free(l->sched);
		l->sched = NULL;
		return -1;
	}
	l->waiter_started = true;
	return 0;
}

void launch_sched_finish(struct launcher *l)
{
	if (!l->waiter_started)
		return;
	if (!sched_await(l, l->sched_grace_ms > 0 ? l->sched_grace_ms : LAUNCH_SCHED_GRACE_MS)) {
		if (!l->stopping) {
			l->stopping = true;
			l->exit_status = 1;
			fprintf(stderr, "unisum launch: every process exited but the scheduler "
				"did not finish; did every worker call unisum_init() and "
				"unisum_shutdown()?\n");
		}
		rdv_scheduler_abort(l->sched);
		if (!sched_await(l, LAUNCH_SCHED_ABORT_MS)) {
			fprintf(stderr, "unisum launch: the scheduler did not stop within %d s "
				"of being aborted; exiting anyway\n", LAUNCH_SCHED_ABORT_MS / 1000);
			l->sched_abandoned = true;
		}
		return;
	}
	if (l->sched_rc == 0 || l->sched_rc == UNISUM_ESHUTDOWN)
		return;
	if (!l->stopping) {
		l->stopping = true;
		l->exit_status = 1;
		fprintf(stderr, "unisum launch: the scheduler failed: %s\n",
			unisum_strerror(l->sched_rc));
	}
}
