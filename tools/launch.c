/*
 * launch.c - `unisum launch`: a whole job on this machine, or one machine of
 * a job.
 *
 *   unisum launch -w N -s K [--local-size L] [--timeout SEC] -- CMD ARGS...
 *   unisum launch --nproc-per-node L [--timeout SEC] -- CMD ARGS...
 *   unisum launch -w N -s K --worker-netns NS,... --server-netns NS,...
 *                 [--scheduler-netns NS] -- CMD ARGS...
 *
 * The first form runs the scheduler in-process, starts K server processes
 * (this same executable, `unisum server`) and N worker processes running
 * CMD, wires their environment (UNISUM_ROLE, UNISUM_WORKER_ID, the
 * scheduler's address, ...), forwards their output with a rank prefix, and
 * turns the fate of the job into one exit status.  The N workers form N/L
 * machines of L workers each (L defaults to N: one machine); the workers of
 * a machine sum among themselves through shared memory and only the
 * machine's sum goes through the servers.  Worker i gets
 * UNISUM_WORKER_ID=i/L (its machine), UNISUM_LOCAL_RANK=i%L and
 * UNISUM_LOCAL_SIZE=L; every process gets UNISUM_NUM_WORKER=N/L, which
 * counts machines as DMLC_NUM_WORKER does in BytePS.  Every worker also gets
 * Horovod's HOROVOD_RANK/SIZE/LOCAL_RANK/LOCAL_SIZE/CROSS_RANK/CROSS_SIZE
 * and torchrun's RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE (in both
 * forms), equal to what unisum_rank() and friends report.
 *
 * The second form is one machine of a job whose scheduler and servers run
 * elsewhere: no scheduler, no servers, L worker processes with
 * UNISUM_ROLE=worker, UNISUM_LOCAL_RANK=0..L-1 and UNISUM_LOCAL_SIZE=L; the
 * rest (the scheduler's address, the job size, the machine index in
 * UNISUM_WORKER_ID, the secret) is inherited from the launcher's
 * environment, which must hold it.  Worker i's rank is machine x L + i.
 *
 * The third form is the first across network namespaces, an emulated
 * cluster: see launch_netns.c.
 *
 * This file holds launch_main(), the event loop and the failure policy.
 * The other parts are listed in launch.h: the options, the children and
 * their environment (with how each child is started), the forwarding of
 * their output, the namespaces, and the job's identity, shared memory and
 * in-process scheduler (with how the scheduler is stopped).
 *
 * DESIGN
 *
 * Everything happens on the calling thread in one poll() loop, plus one
 * helper thread whose only job is to block in rdv_scheduler_wait() and
 * report the result through a pipe, so that a failing scheduler wakes the
 * loop like any other event.  The loop watches:
 *
 *   - a signalfd for SIGCHLD, SIGINT, SIGTERM and SIGHUP.  Those signals are
 *     blocked before the scheduler starts, so every thread inherits the
 *     mask and the signals are only ever seen through the signalfd;
 *   - the scheduler-waiter pipe;
 *   - the read ends of every child's stdout and stderr pipes.  Each complete
 *     line is forwarded with the child's prefix (launch_output.c).  The
 *     pipes are drained whenever they are readable, so a child that writes
 *     a lot never blocks on a full pipe for long.
 *
 * Failure policy.  The first process that exits non-zero or dies by a
 * signal is the root cause: one summary line names it, every other child's
 * process group gets SIGTERM, then SIGKILL 3 s later, and the launcher
 * exits with that process's status (128 + signal for a signal).  Later
 * deaths are the cascade and get one short line each, except those caused
 * by our own SIGTERM/SIGKILL, which are expected.  A scheduler failure is
 * usually the echo of a process dying, and so is a server that exits with
 * UNISUM_EXIT_ELSEWHERE (it stopped because the scheduler announced a
 * failure): either is only blamed when no child fails within a second of
 * it, so that a worker whose Python raised is named, not the server that
 * exited on the news first.  --timeout (exit 124) and SIGINT,
 * SIGTERM, SIGHUP to the launcher (exit 128 + signal) stop the job the same
 * way; a second signal sends SIGKILL at once.
 *
 * Success.  When every worker has exited 0, the scheduler tells the servers
 * to stop; they get 30 s to exit on their own before that counts as a
 * failure.  Then rdv_scheduler_wait()'s result decides: 0 exits 0.
 *
 * Once the children are gone, on every way out (success, failure,
 * --timeout, signals), the launcher forwards the rest of their output, lets
 * the scheduler finish and removes the job's shared-memory segments
 * (launch_job.c).
 *
 * launch_main() owns the process: it leaves the signals blocked and SIGPIPE
 * ignored when it returns, since its return value becomes the exit status.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "unisum.h"
#include "config/config.h"
#include "launch.h"
#include "log/log.h"
#include "rendezvous/rendezvous.h"
#include "timing/timing.h"
#include "tools.h"

/* From SIGTERM to SIGKILL when stopping the job. */
#define LAUNCH_TERM_GRACE_MS 3000

/* A node of torchrun's kind (--nnodes, --node-rank) whose child died, on
 * a host without the scheduler, stops its other children this much later:
 * the scheduler must see the dead one's connection drop first, or it may
 * blame a sibling that this node's SIGTERM took down (both drops can come
 * in one of its polls).  Not a node that a launcher started (-H, --slurm:
 * --remote): that launcher blames by the nodes' exits, the first of which
 * must be this one's. */
#define LAUNCH_NODE_TERM_DELAY_MS 1000

/* After SIGKILL, how long to wait for the children to be reaped before the
 * launcher gives up on them (a process stuck in the kernel). */
#define LAUNCH_KILL_GRACE_MS 5000

/* How long the servers may run after every worker exited 0. */
#define LAUNCH_SERVER_GRACE_MS 30000

/* How long a scheduler failure, or a child that failed on the news of
 * another's failure, waits for a child failure to blame instead. */
#define LAUNCH_BLAME_GRACE_MS 1000

/* Exit status when the job ran past --timeout (timeout(1)'s). */
#define LAUNCH_EXIT_TIMEOUT 124

/* ---- small helpers ------------------------------------------------------- */

/* Writes "SIGKILL" (or "signal 77") for `sig` into buf. */
static void signal_name(int sig, char *buf, size_t len)
{
	const char *abbrev = sigabbrev_np(sig);

	if (abbrev)
		snprintf(buf, len, "SIG%s", abbrev);
	else
		snprintf(buf, len, "signal %d", sig);
}

/* Describes a waitpid() status: "exited with status 3", "killed by signal
 * 9 (SIGKILL)", and for a SIGKILL while the kernel's out-of-memory killer
 * struck, that it probably was.  Returns the matching exit status for the
 * launcher. */
static int describe_status(const struct launcher *l, int status, char *buf, size_t len)
{
	if (WIFEXITED(status)) {
		int code = WEXITSTATUS(status);

		snprintf(buf, len, "exited with status %d%s", code,
			 code == 127 ? " (the command could not be run)" : "");
		return code;
	}
	if (WIFSIGNALED(status)) {
		log_killed(WTERMSIG(status), WCOREDUMP(status), l->oom_kills, buf, len);
		return 128 + WTERMSIG(status);
	}
	snprintf(buf, len, "ended with wait status 0x%x", (unsigned)status);
	return 1;
}

/* ---- stopping the job ---------------------------------------------------- */

/* Declares the job failed with `status`: prints the root cause's line
 * ("unisum launch: <cause>; stopping the job", the cause being the
 * format's text), tells the scheduler the cause, then sends SIGTERM to
 * every child, after `delay_ms` (loop_run).  Only the first call acts. */
__attribute__((format(printf, 4, 5)))
static void job_fail_after(struct launcher *l, int64_t delay_ms, int status, const char *fmt, ...)
{
	char why[512];
	va_list ap;

	if (l->stopping)
		return;
	l->stopping = true;
	l->exit_status = status;
	va_start(ap, fmt);
	vsnprintf(why, sizeof why, fmt, ap);
	va_end(ap);
	fprintf(stderr, "unisum launch: %s; stopping the job\n", why);
	for (int i = l->echo_ms != 0 ? 0 : 1; i < l->nechoes; i++)
		fprintf(stderr, "unisum launch: then %s\n", l->echoes[i]);
	/* The scheduler (when it runs here) tells every node this cause, so
	 * that the connections the stop closes are not reported as failures
	 * of their own. */
	if (l->sched != NULL && !l->sched_done)
		rdv_scheduler_stop(l->sched, why);
	l->term_at_ms = timing_now_ms() + delay_ms;
	l->termed = delay_ms <= 0;
	if (l->termed)
		launch_children_signal(l, SIGTERM);
	/* A host's launcher gives its own children the same grace before it
	 * kills them: wait for that too. */
	l->kill_at_ms = l->term_at_ms + LAUNCH_TERM_GRACE_MS * (l->nhosts > 0 ? 2 : 1);
}

/* job_fail_after with no delay: every other way a job fails. */
#define job_fail(l, ...) job_fail_after((l), 0, __VA_ARGS__)

/* Sends SIGKILL to every child still running, naming each. */
static void job_kill(struct launcher *l)
{
	for (int i = 0; i < l->nchildren; i++) {
		struct child *c = &l->children[i];

		if (c->running)
			fprintf(stderr, "unisum launch: %s (pid %d) is still running; "
				"sending SIGKILL\n", c->name, (int)c->pid);
	}
	launch_children_signal(l, SIGKILL);
	l->killed = true;
	l->kill_at_ms = timing_now_ms();
}

/* ---- judging the children ----------------------------------------------- */

/* Whether the scheduler names child c as the node whose loss failed the
 * job. */
static bool child_is_culprit(const struct launcher *l, const struct child *c)
{
	int role, rank;
	if (l->sched == NULL || !rdv_scheduler_culprit(l->sched, &role, &rank))
		return false;
	/* The host of that worker, or of that colocated server: CPU-only
	 * servers take their ranks by arrival, on no host known here. */
	if (c->role == CHILD_SSH)
		return (role == CONFIG_ROLE_SERVER && !l->no_colocated && rank < l->machines &&
			rank == c->rank) ||
		       (role == CONFIG_ROLE_WORKER && rank / l->local_size == c->rank);
	return c->rank == rank && c->role == (role == CONFIG_ROLE_SERVER ? CHILD_SERVER : CHILD_WORKER) &&
	       (role == CONFIG_ROLE_SERVER || role == CONFIG_ROLE_WORKER);
}

/* Whether child c, which ended with `status` while the job ran, failed on
 * the news of another process's failure rather than on its own: a server
 * says so with UNISUM_EXIT_ELSEWHERE, and for any child the scheduler may
 * already name another child as the node whose loss failed the job (the
 * scheduler sees a process's connection drop before anyone hears of it,
 * while the kernel may report the exits in either order). */
static bool child_is_echo(const struct launcher *l, const struct child *c, int status)
{
	if (c->role == CHILD_SERVER && WIFEXITED(status) && WEXITSTATUS(status) == UNISUM_EXIT_ELSEWHERE)
		return true;
	for (int i = 0; i < l->nchildren; i++) {
		const struct child *o = &l->children[i];
		if (o != c && o->running && child_is_culprit(l, o))
			return true;
	}
	return false;
}

/* Judges a child that just exited, with its last output already forwarded. */
static void child_ended(struct launcher *l, struct child *c, int status)
{
	char what[320];
	int code = describe_status(l, status, what, sizeof(what));

	if (l->stopping) {
		/* The cascade: quiet when it is our own SIGTERM/SIGKILL at work. */
		/* A host's node stopped on the end of its stdin, which we closed. */
		bool ours = c->signalled && ((WIFSIGNALED(status) &&
			    (WTERMSIG(status) == SIGTERM || WTERMSIG(status) == SIGKILL)) ||
			    c->role == CHILD_SSH);

		if (code != 0 && !ours)
			fprintf(stderr, "unisum launch: then %s (pid %d) %s\n",
				c->name, (int)c->pid, what);
		return;
	}
	if (code != 0 && c->role == CHILD_SERVER && l->server_failover && !WIFEXITED(status)) {
		/* Killed or crashed: the scheduler moves its partitions to the
		 * other servers (UNISUM_SERVER_FAILOVER), or fails the job and
		 * says why. */
		fprintf(stderr, "unisum launch: %s (pid %d) %s; the job goes on without it "
			"(UNISUM_SERVER_FAILOVER=1)\n", c->name, (int)c->pid, what);
		return;
	}
	if (code != 0 && launch_elastic_absorbs(l, c, status, what))
		return;
	if (code != 0 && child_is_echo(l, c, status)) {
		/* It failed on the news of another process's failure: that one
		 * is blamed when it ends, within a second; this one only if
		 * none does. */
		if (l->nechoes == 0) {
			l->echo_ms = timing_now_ms();
			l->echo_status = code;
		}
		if (l->nechoes < LAUNCH_MAX_ECHOES)
			snprintf(l->echoes[l->nechoes++], sizeof l->echoes[0], "%.64s (pid %d) %.140s, on the "
				 "news of the failure", c->name, (int)c->pid, what);
		return;
	}
	if (code != 0) {
		int64_t delay = l->node_mode && !l->remote && l->sched == NULL ?
				LAUNCH_NODE_TERM_DELAY_MS : 0;
		job_fail_after(l, delay, code, "%s (pid %d) %s", c->name,
			       (int)c->pid, what);
		return;
	}
	if (l->echo_ms != 0 && child_is_culprit(l, c)) {
		job_fail(l, 1, "%s (pid %d) exited with status 0 but left the job without "
			 "unisum_shutdown()", c->name, (int)c->pid);
		return;
	}
	/* A node's server serves the other nodes' workers too: it stops when
	 * the scheduler says the whole job is done. */
	/* A worker that finished: the training ends, so an elastic job
	 * starts no worker in its place. */
	if ((c->role == CHILD_WORKER || c->ehost[0]) && !c->removed)
		l->elastic_ending = true;
	if ((c->role == CHILD_WORKER || c->ehost[0]) && l->workers_done_ms == 0 && !l->node_mode) {
		bool all = true;

		for (int i = 0; i < l->nchildren && all; i++)
			all = (l->children[i].role != CHILD_WORKER && !l->children[i].ehost[0]) ||
			      l->children[i].pid == 0 || !l->children[i].running;
		if (all)
			l->workers_done_ms = timing_now_ms();
	}
}

/* How child c ended, without reaping it: waitid's result (0 with
 * info->si_pid 0 while it runs). */
static int child_peek(const struct child *c, siginfo_t *info)
{
	int w;
	*info = (siginfo_t){0};
	do
		w = waitid(P_PID, (id_t)c->pid, info, WEXITED | WNOHANG | WNOWAIT);
	while (w < 0 && errno == EINTR);
	return w;
}

/* Whether child c has been killed by a signal (not reaped yet). */
static bool child_was_killed(const struct child *c)
{
	siginfo_t info;
	int w = child_peek(c, &info);
	return w == 0 && info.si_pid != 0 && (info.si_code == CLD_KILLED || info.si_code == CLD_DUMPED);
}

/* Child c ended: true when it may be blamed (no failure, or nobody else was killed
 * meanwhile).  A process killed with SIGKILL closes its sockets before it
 * becomes a zombie, so a survivor that exits on the news can end first: a
 * failure is judged only after the others had 300 ms to show a kill.
 * Returns false when another child turned out killed. */
static bool child_may_be_blamed(const struct launcher *l, const struct child *c)
{
	siginfo_t info;
	int w = child_peek(c, &info);
	if (w != 0 || info.si_pid == 0 || info.si_code != CLD_EXITED || info.si_status == 0)
		return true;
	for (int tries = 0; tries < 30; tries++) {
		for (int i = 0; i < l->nchildren; i++) {
			const struct child *o = &l->children[i];
			if (o != c && o->running && child_was_killed(o))
				return false;
		}
		usleep(10000);
	}
	return true;
}

/* Reaps every child that has ended, forwarding its remaining output first. */
static void children_reap(struct launcher *l)
{
	/* Children that ended since the last look are judged together, those
	 * killed by a signal first: when a worker is killed and a server exits
	 * on the news before we look, the killed worker is the root cause. */
	for (int pass = 0; pass < 2; pass++) {
		for (int i = 0; i < l->nchildren; i++) {
			struct child *c = &l->children[i];
			int status;
			pid_t r;

			if (!c->running)
				continue;
			if (pass == 1 && !l->stopping && !child_may_be_blamed(l, c)) {
				/* Another child was killed: it goes first (pass 0 again). */
				pass = -1;
				break;
			}
			siginfo_t info;
			int w = child_peek(c, &info);
			if (w == 0 && info.si_pid == 0)
				continue;	/* still running */
			if (pass == 0 && w == 0 && info.si_code != CLD_KILLED &&
			    info.si_code != CLD_DUMPED)
				continue;	/* exited: the second pass */
			/* The scheduler (a thread here) may still look for it. */
			if (w == 0)
				rdv_note_child_end(&info);
			do
				r = wait4(c->pid, &status, WNOHANG, &c->ru);
			while (r < 0 && errno == EINTR);
			if (r == 0)
				continue;
			c->running = false;
			if (r < 0) {
				/* Not our child any more (cannot happen unless someone
				 * reaped it behind our back): count it as failed. */
				status = 1 << 8;
			}
			launch_stream_drain(c, &c->out);
			launch_stream_drain(c, &c->err);
			child_ended(l, c, status);
		}
	}
}

static int children_running(const struct launcher *l)
{
	int n = 0;

	for (int i = 0; i < l->nchildren; i++)
		n += l->children[i].running;
	return n;
}

/* ---- the event loop ------------------------------------------------------ */

/* Handles the signals that arrived on the signalfd. */
static void signals_handle(struct launcher *l)
{
	struct signalfd_siginfo si;
	char name[32];

	while (read(l->sigfd, &si, sizeof(si)) == (ssize_t)sizeof(si)) {
		int sig = (int)si.ssi_signo;

		if (sig == SIGCHLD)
			continue;	/* children_reap() runs every round */
		signal_name(sig, name, sizeof(name));
		if (!l->stopping) {
			/* job_fail tells the scheduler: it blames nobody else. */
			job_fail(l, 128 + sig, "received %s", name);
		} else if (!l->killed) {
			fprintf(stderr, "unisum launch: received %s while stopping; killing everything\n",
				name);
			job_kill(l);
		}
	}
}

/* Checks the deadlines that hold while the job runs. */
static void deadlines_check(struct launcher *l, int64_t now)
{
	if (l->stopping)
		return;
	if (l->timeout_s > 0 && now - l->start_ms >= (int64_t)(l->timeout_s * 1000)) {
		/* The launcher itself is the root cause: job_fail tells the
		 * scheduler, which then blames none of the processes it stops. */
		job_fail(l, LAUNCH_EXIT_TIMEOUT,
			 "the job ran longer than --timeout %g s", l->timeout_s);
		return;
	}
	if (l->echo_ms && now - l->echo_ms >= LAUNCH_BLAME_GRACE_MS) {
		l->echo_ms = 0;	/* the summary names the first: no "then" line for it */
		job_fail(l, l->echo_status, "%s", l->echoes[0]);
		return;
	}
	if (l->sched_failed_ms && now - l->sched_failed_ms >= LAUNCH_BLAME_GRACE_MS) {
		job_fail(l, 1, "the scheduler failed: %s",
			 unisum_strerror(l->sched_rc));
		return;
	}
	if (l->workers_done_ms && now - l->workers_done_ms >= LAUNCH_SERVER_GRACE_MS) {
		for (int i = 0; i < l->nchildren; i++) {
			struct child *c = &l->children[i];

			if (c->running) {
				job_fail(l, 1, "%s (pid %d) still runs %d s after every "
					 "worker finished%s", c->name, (int)c->pid, LAUNCH_SERVER_GRACE_MS / 1000,
					 l->sched_done ? "" : " (the scheduler is still waiting "
					 "for workers: did every worker call unisum_shutdown()?)");
				return;
			}
		}
	}
}

/* The poll() timeout until the nearest deadline, -1 for none. */
static int loop_timeout(const struct launcher *l, int64_t now)
{
	int64_t next = INT64_MAX;

	if (l->stopping) {
		next = l->termed ? l->kill_at_ms + (l->killed ? LAUNCH_KILL_GRACE_MS : 0)
				 : l->term_at_ms;
	} else {
		if (l->timeout_s > 0)
			next = l->start_ms + (int64_t)(l->timeout_s * 1000);
		if (l->sched_failed_ms && l->sched_failed_ms + LAUNCH_BLAME_GRACE_MS < next)
			next = l->sched_failed_ms + LAUNCH_BLAME_GRACE_MS;
		if (l->echo_ms && l->echo_ms + LAUNCH_BLAME_GRACE_MS < next)
			next = l->echo_ms + LAUNCH_BLAME_GRACE_MS;
		if (l->workers_done_ms && l->workers_done_ms + LAUNCH_SERVER_GRACE_MS < next)
			next = l->workers_done_ms + LAUNCH_SERVER_GRACE_MS;
		if (l->elastic && l->discovery_script && l->discovery_next_ms < next)
			next = l->discovery_next_ms;
	}
	if (next == INT64_MAX)
		return -1;
	if (next <= now)
		return 0;
	return next - now > INT_MAX ? INT_MAX : (int)(next - now);
}

/* --remote: reads what came on stdin; at its end (the launcher that
 * started this node over ssh or srun is gone, or stopped the job) stops
 * the node. */
static void remote_stdin_check(struct launcher *l)
{
	char buf[256];
	ssize_t n = read(STDIN_FILENO, buf, sizeof(buf));

	if (n > 0 || (n < 0 && (errno == EINTR || errno == EAGAIN)))
		return;
	l->remote_stdin_open = false;
	job_fail(l, 1, "the connection to the launcher (ssh or srun) ended");
}

/* Runs until every child is gone (or, after SIGKILL, given up on). */
static int loop_run(struct launcher *l)
{
	size_t slots = 3 + 2 * (size_t)(l->cap_children > l->nchildren ? l->cap_children
									  : l->nchildren);
	struct pollfd *fds = calloc(slots, sizeof(*fds));
	struct stream **streams = calloc(slots, sizeof(*streams));
	struct child **owners = calloc(slots, sizeof(*owners));
	int rc = 0;

	if (!fds || !streams || !owners) {
		rc = -ENOMEM;
		goto out_free;
	}
	while (children_running(l) > 0) {
		int64_t now = timing_now_ms();
		int n;

		if (l->stopping && !l->termed && now >= l->term_at_ms) {
			launch_children_signal(l, SIGTERM);
			l->termed = true;
		}
		if (l->stopping && now >= l->kill_at_ms) {
			if (!l->killed) {
				job_kill(l);
			} else if (now >= l->kill_at_ms + LAUNCH_KILL_GRACE_MS) {
				fprintf(stderr, "unisum launch: %d process(es) did not die after "
					"SIGKILL; giving up on them\n", children_running(l));
				break;
			}
		}

		fds[0] = (struct pollfd){ .fd = l->sigfd, .events = POLLIN };
		fds[1] = (struct pollfd){ .fd = l->sched_done ? -1 : l->waiter_pipe[0],
					  .events = POLLIN };
		/* A node started over ssh: its stdin ends when the connection does. */
		fds[2] = (struct pollfd){ .fd = l->remote_stdin_open ? STDIN_FILENO : -1,
					  .events = POLLIN };
		n = launch_output_fds(l, fds, 3, streams, owners);
		if (poll(fds, (nfds_t)n, loop_timeout(l, now)) < 0 && errno != EINTR) {
			rc = -errno;
			goto out_free;
		}

		/* Output a worker wrote after a re-form gave it its new rank
		 * has the new rank in its prefix (the scheduler has a new
		 * address book before any worker hears of it). */
		launch_elastic_prefixes(l);
		for (int i = 3; i < n; i++)
			if (fds[i].revents)
				launch_stream_read(owners[i], streams[i]);
		if (fds[2].revents)
			remote_stdin_check(l);
		if (fds[1].revents) {
			launch_sched_collect(l);
			if (l->sched_done && l->sched_rc != 0 && !l->stopping)
				l->sched_failed_ms = timing_now_ms();
		}
		if (fds[0].revents)
			signals_handle(l);
		children_reap(l);
		deadlines_check(l, timing_now_ms());
		launch_elastic_tick(l, timing_now_ms());
	}
out_free:
	free(fds);
	free(streams);
	free(owners);
	return rc;
}

/* ---- the entry point ----------------------------------------------------- */

/* Makes sure descriptors 0-2 are open, so that no pipe lands on them. */
static void stdio_ensure(void)
{
	for (int fd = 0; fd <= 2; fd++) {
		if (fcntl(fd, F_GETFD) >= 0)
			continue;
		if (open("/dev/null", O_RDWR) != fd)
			return;
	}
}

/* Blocks the signals we watch before any thread exists, so that every
 * thread inherits the mask and they only arrive on the signalfd; ignores
 * SIGPIPE.  Returns 0, or -1 after printing why. */
static int signals_block(struct launcher *l)
{
	struct sigaction ignore = { .sa_handler = SIG_IGN };
	sigset_t handled;

	sigemptyset(&handled);
	sigaddset(&handled, SIGCHLD);
	sigaddset(&handled, SIGINT);
	sigaddset(&handled, SIGTERM);
	sigaddset(&handled, SIGHUP);
	pthread_sigmask(SIG_BLOCK, &handled, &l->entry_mask);
	sigaction(SIGPIPE, &ignore, NULL);
	l->sigfd = signalfd(-1, &handled, SFD_NONBLOCK | SFD_CLOEXEC);
	if (l->sigfd < 0) {
		fprintf(stderr, "unisum launch: signalfd: %s\n", strerror(errno));
		return -1;
	}
	return 0;
}

/* Starts every child in order; the first that cannot be started fails the
 * job, and the rest are not started. */
static void children_start(struct launcher *l)
{
	for (int i = 0; i < l->nchildren; i++) {
		struct child *c = &l->children[i];
		int rc = launch_child_spawn(l, c);

		if (rc < 0) {
			job_fail(l, 1, "cannot start %s: %s", c->name,
				 strerror(-rc));
			break;
		}
	}
}

/* Runs the job once everything it needs is open: starts the scheduler
 * (when it runs here) and the children, watches them until they are
 * gone, and cleans up after them.  Returns the exit status. */
static int job_run(struct launcher *l, const struct config *cfg)
{
	int status;
	int rc;

	launch_shm_sweep_stale();
	/* launch_job_configure() decided: sched_done when it runs elsewhere. */
	if (!l->sched_done && launch_sched_start(l, cfg) < 0)
		return 1;
	launch_announce(l);

	l->start_ms = timing_now_ms();
	l->job_started = true;
	l->remote_stdin_open = l->remote;
	children_start(l);

	rc = loop_run(l);
	if (rc < 0) {
		/* poll() itself failed: nothing can be watched any more. */
		job_fail(l, 1, "poll: %s", strerror(-rc));
		launch_children_signal(l, SIGKILL);
		for (int i = 0; i < l->nchildren; i++)
			if (l->children[i].running)
				waitpid(l->children[i].pid, NULL, 0);
	}
	launch_output_finish(l);
	if (l->cpu_report)
		launch_cpu_report(l);
	launch_sched_finish(l);
	launch_shm_finish(l);
	status = l->stopping ? l->exit_status : 0;
	if (l->sched && l->sched_done)
		rdv_scheduler_free(l->sched);
	return status;
}

/* A launcher with nothing open yet; NULL when out of memory.  On the heap,
 * because a waiter thread that never returns keeps using it after the
 * launcher returned (see launch_sched_finish()). */
static struct launcher *launcher_new(void)
{
	struct launcher *l = calloc(1, sizeof(*l));
	if (!l) {
		fprintf(stderr, "unisum launch: out of memory\n");
		return NULL;
	}
	l->sigfd = -1;
	l->devnull = -1;
	l->sched_netns = -1;
	l->start_timeout_s = -1;	/* --start-timeout not given */
	l->waiter_pipe[0] = l->waiter_pipe[1] = -1;
	l->self = getpid();
	l->oom_kills = log_oom_kills();
	return l;
}

/* Raises the soft limit on descriptors to the hard limit, for the
 * launcher and every child it starts (as a cluster's own launchers do): a
 * job of hundreds of hosts needs more than the usual 1024 (each child's
 * pipes here, the in-process scheduler's connection to every server and
 * worker, a server's connection to every worker).  Says what the job
 * needs when even the hard limit is short. */
static void fds_limit_raise(const struct launcher *l)
{
	struct rlimit r;
	rlim_t nodes = (rlim_t)(l->num_servers + l->num_workers);
	rlim_t need = 64 + 3 * (rlim_t)l->nchildren + (l->sched_done ? 0 : 2 * nodes);
	if (need < 64 + 2 * nodes)	/* a server: a connection per worker, IPC and TCP */
		need = 64 + 2 * nodes;
	if (getrlimit(RLIMIT_NOFILE, &r) != 0)
		return;
	if (r.rlim_max != RLIM_INFINITY && r.rlim_max < need)
		fprintf(stderr, "unisum launch: warning: this job needs about %llu descriptors in a "
			"process here, and the hard limit is %llu (ulimit -Hn; raise it in "
			"/etc/security/limits.conf or the service's LimitNOFILE)\n",
			(unsigned long long)need, (unsigned long long)r.rlim_max);
	if (r.rlim_max != RLIM_INFINITY && r.rlim_cur < r.rlim_max) {
		r.rlim_cur = r.rlim_max;
		setrlimit(RLIMIT_NOFILE, &r);
	} else if (r.rlim_cur < need) {
		r.rlim_cur = need;
		setrlimit(RLIMIT_NOFILE, &r);
	}
}

/* Runs the job of launcher l, whose options are set and checked, and
 * frees l (but for a waiter thread's share of it).  The exit status. */
static int launcher_run(struct launcher *l)
{
	struct config cfg;
	int status = 1;

	/* The job's identity and shape, from the options and the
	 * environment, before any thread exists (they edit environ). */
	int rc = launch_job_configure(l, &cfg);
	if (rc != 0) {
		status = rc;
		goto out_free_launcher;
	}

	stdio_ensure();
	fflush(stdout);
	if (launch_fds_snapshot(l) < 0) {
		fprintf(stderr, "unisum launch: out of memory\n");
		goto out_free_launcher;
	}
	if (signals_block(l) < 0)
		goto out_free_launcher;
	l->devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
	if (l->devnull < 0) {
		fprintf(stderr, "unisum launch: cannot open /dev/null: %s\n", strerror(errno));
		goto out_close_sigfd;
	}
	if (pipe2(l->waiter_pipe, O_CLOEXEC | O_NONBLOCK) < 0) {
		fprintf(stderr, "unisum launch: pipe: %s\n", strerror(errno));
		goto out_close_devnull;
	}
	if (launch_children_init(l) < 0)
		goto out_close_waiter_pipe;
	fds_limit_raise(l);

	status = job_run(l, &cfg);
	for (int i = 0; i < l->nchildren; i++) {
		if (l->children[i].stdin_fd >= 0)
			close(l->children[i].stdin_fd);
		launch_ssh_free(&l->children[i]);
	}
	if (l->sched_abandoned) {
		/* The waiter thread still holds `l` and its pipe: leave both
		 * to the process exit that follows. */
		free(l->children);
		return status;
	}

	free(l->children);
out_close_waiter_pipe:
	close(l->waiter_pipe[0]);
	close(l->waiter_pipe[1]);
out_close_devnull:
	close(l->devnull);
out_close_sigfd:
	close(l->sigfd);
out_free_launcher:
	launch_netns_free(l);
	free(l->machine_rack);
	free(l->server_rack);
	free(l->hosts);
	free(l->entry_fds);
	free(l);
	return status;
}

int launch_main(int argc, char **argv)
{
	if (argc == 2 && strcmp(argv[1], "--scheduler") == 0)
		return launch_scheduler_role();
	struct launcher *l = launcher_new();
	if (!l)
		return 1;
	int rc = launch_options_parse(l, argc, argv);
	if (rc != 0) {
		free(l->hosts);
		free(l);
		return rc > 0 ? 0 : LAUNCH_EXIT_USAGE;
	}
	return launcher_run(l);
}

int launch_run(const struct launch_opts *o)
{
	struct launcher *l = launcher_new();
	if (!l)
		return 1;
	l->num_workers = o->num_workers;
	l->num_servers = o->num_servers;
	l->local_size = o->local_size;
	l->timeout_s = o->timeout_s;
	l->no_secret = o->no_secret;
	l->cmd = o->cmd;
	if (launch_options_check(l, NULL, 0) < 0) {
		free(l);
		return LAUNCH_EXIT_USAGE;
	}
	return launcher_run(l);
}
