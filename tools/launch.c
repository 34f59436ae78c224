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
 * counts machines as DMLC_NUM_WORKER does in BytePS.
 *
 * The second form is one machine of a job whose scheduler and servers run
 * elsewhere: no scheduler, no servers, L worker processes with
 * UNISUM_ROLE=worker, UNISUM_LOCAL_RANK=0..L-1 and UNISUM_LOCAL_SIZE=L; the
 * rest (the scheduler's address, the job size, the machine index in
 * UNISUM_WORKER_ID, the secret) is inherited from the launcher's
 * environment, which must hold it.  Worker i's rank is machine x L + i.
 *
 * Network namespaces (the third form: an emulated cluster, see
 * bench/cluster/netns.sh).  Each worker machine runs in its own named
 * network namespace (/run/netns/NS, one per machine, in order), each server
 * in the namespace given for it (a worker machine's, to be colocated with
 * it, or one of its own, a CPU-only server), and the scheduler in
 * --scheduler-netns (default: the first machine's).  The launcher learns
 * each namespace's IPv4 address from its interfaces, starts the scheduler's
 * listener inside its namespace, gives every child UNISUM_NODE_HOST (its
 * namespace's address) and UNISUM_SCHEDULER_HOST, and moves each child into
 * its namespace between fork() and exec().  Everything else is the same;
 * the host identity of every process includes its network namespace, so
 * the machines count as different hosts.
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
 *     line is forwarded as "[worker 0] line" to our own stdout (or stderr
 *     for the child's stderr); the lines of one read() go out in one
 *     write(), so a chatty child costs few system calls.  A line longer
 *     than the buffer is cut into buffer-sized pieces, each prefixed and
 *     ended with a newline, so that another process's output never lands
 *     in the middle of it.  The pipes are drained whenever they are readable, so a child
 *     that writes a lot never blocks on a full pipe for long.
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
 * Stopping the scheduler.  After every child is gone the scheduler
 * normally finishes by itself (a clean goodbye, or connections that dropped
 * without one); only if it has not within 2 s is it aborted.
 * rdv_scheduler_abort() is safe until rdv_scheduler_free(), which runs last.
 *
 * Children.  Each child gets its own process group (so that SIGTERM reaches
 * whatever it spawned, and Ctrl-C on the terminal reaches only the launcher,
 * which then stops the job in order), PR_SET_PDEATHSIG(SIGKILL) so that it
 * does not outlive a launcher killed with SIGKILL, stdin from /dev/null
 * (a background process group reading the terminal would be stopped), the
 * signal mask and SIGPIPE disposition the launcher started with, and no file
 * descriptor opened since launch_main() began (the scheduler's sockets).
 * The child environment is built before fork(): the scheduler's threads are
 * running, so the child calls only async-signal-safe functions until exec.
 *
 * launch_main() owns the process: it leaves the signals blocked and SIGPIPE
 * ignored when it returns, since its return value becomes the exit status.
 */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sched.h>
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
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/signalfd.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "unisum.h"
#include "config/config.h"
#include "log/log.h"
#include "rendezvous/rendezvous.h"
#include "shm/shm.h"
#include "timing/timing.h"
#include "tools.h"
#include "transport/auth.h"
#include "transport/transport.h"

extern char **environ;

#define LAUNCH_HOST "127.0.0.1"

/* Bytes buffered per child stream; a longer line is forwarded in pieces. */
#define LAUNCH_LINE_MAX (64 * 1024)

/* From SIGTERM to SIGKILL when stopping the job. */
#define LAUNCH_TERM_GRACE_MS 3000

/* After SIGKILL, how long to wait for the children to be reaped before the
 * launcher gives up on them (a process stuck in the kernel). */
#define LAUNCH_KILL_GRACE_MS 5000

/* How long the servers may run after every worker exited 0. */
#define LAUNCH_SERVER_GRACE_MS 30000

/* How long a scheduler failure, or a child that failed on the news of
 * another's failure, waits for a child failure to blame instead. */
#define LAUNCH_BLAME_GRACE_MS 1000

/* How many such children the summary lists. */
#define LAUNCH_MAX_ECHOES 8

/* After every child is gone, how long the scheduler may take to finish on
 * its own before it is aborted, and then how long the abort may take. */
#define LAUNCH_SCHED_GRACE_MS 2000
#define LAUNCH_SCHED_ABORT_MS 5000

/* After every child is gone, how long to keep reading pipes that something
 * else (a grandchild) still holds open. */
#define LAUNCH_DRAIN_MS 1000

/* Exit status of a usage error. */
#define LAUNCH_EXIT_USAGE 2

/* Exit status when the job ran past --timeout (timeout(1)'s). */
#define LAUNCH_EXIT_TIMEOUT 124

/* Most workers on one machine (the range of UNISUM_LOCAL_SIZE). */
#define LAUNCH_LOCAL_MAX 1024

enum child_role {
	CHILD_SERVER,
	CHILD_WORKER,
};

/* One of a child's output pipes, and the partial line read from it. */
struct stream {
	int fd;				/* read end, non-blocking; -1 once at EOF */
	int out_fd;			/* where its lines go: 1 or 2 */
	size_t len;			/* bytes in buf not yet forwarded */
	char buf[LAUNCH_LINE_MAX];	/* the start of the current line */
};

/* A server or worker process. */
struct child {
	int role;			/* enum child_role */
	int rank;			/* server or worker index */
	pid_t pid;			/* process id, also its process group; 0 until spawned */
	bool running;			/* spawned and not yet reaped */
	bool signalled;			/* the launcher sent it SIGTERM or SIGKILL */
	char prefix[32];		/* "[worker 0] ", put before each line */
	int netns;			/* index in launcher.netns, -1 = the launcher's */
	struct stream out;		/* its stdout */
	struct stream err;		/* its stderr */
};

/* The child environment: environ minus the names we set, plus ours. */
#define LAUNCH_ENV_OWN 12
struct child_env {
	char **envp;				/* NULL-terminated, for execve */
	char vars[LAUNCH_ENV_OWN][96];		/* storage of our NAME=value strings */
};

/* A named network namespace a process runs in (an emulated host). */
struct netns {
	char name[64];			/* under /run/netns */
	int fd;				/* open on it, O_CLOEXEC */
	char addr[INET_ADDRSTRLEN];	/* its first non-loopback IPv4 address */
};

/* Everything the launcher knows. */
struct launcher {
	/* Options. */
	int num_workers;		/* -w: worker processes of the whole job */
	int num_servers;		/* -s */
	int local_size;			/* --local-size, or --nproc-per-node's L; 0 = not given */
	bool one_machine;		/* --nproc-per-node: one machine of a job, no
					 * scheduler and no servers here */
	double timeout_s;		/* --timeout, 0 = none */
	bool no_secret;			/* --no-secret: run without a job secret */
	char **cmd;			/* CMD ARGS..., NULL-terminated (argv's) */
	const char *worker_netns_opt;	/* --worker-netns list, or NULL */
	const char *server_netns_opt;	/* --server-netns list, or NULL */
	const char *sched_netns_opt;	/* --scheduler-netns, or NULL */

	/* The shape of the job. */
	int machines;			/* UNISUM_NUM_WORKER: num_workers / local_size, or the
					 * environment's with --nproc-per-node */
	int machine;			/* --nproc-per-node: this machine's index */
	char job_id[SHM_JOB_MAX + 1];	/* UNISUM_JOB_ID of every child */
	bool job_started;		/* children may have made segments: remove them at exit */
	char sched_host[256];		/* the scheduler's address, for the start line */
	int sched_port;			/* ... and its port */

	/* Network namespaces (--worker-netns ...): every distinct one named,
	 * which of them each machine and server runs in, and the scheduler's. */
	struct netns *netns;
	int nnetns;
	int *machine_netns;		/* [machines] */
	int *server_netns;		/* [num_servers] */
	int sched_netns;		/* -1 = the launcher's own */
	char sched_addr[INET_ADDRSTRLEN];	/* where children find the scheduler */

	/* The scheduler and the thread that waits for it. */
	struct rdv_scheduler *sched;	/* freed last, once sched_done */
	int port;			/* its port */
	pthread_t waiter;		/* runs sched_waiter() */
	bool waiter_started;		/* the thread exists */
	int waiter_pipe[2];		/* the thread writes one byte when done */
	bool sched_done;		/* rdv_scheduler_wait() returned, sched_rc is valid */
	int sched_rc;			/* its result */
	int64_t sched_failed_ms;	/* when it failed while the job ran, 0 = it did not */
	int64_t echo_ms;		/* when a child failed on the news of another's failure,
					 * 0 = none (see child_is_echo) */
	int echo_status;		/* ... the first one's exit status */
	char echoes[LAUNCH_MAX_ECHOES][160]; /* ... what each was, for the summary */
	int nechoes;
	bool sched_abandoned;		/* the waiter never returned: it still uses this struct */

	/* Children: servers first, then workers (only workers with
	 * --nproc-per-node). */
	struct child *children;
	int nchildren;
	int devnull;			/* /dev/null, the children's stdin */
	pid_t self;			/* our pid, for the PDEATHSIG check */

	/* Descriptors open when launch_main() began; all others are kept from
	 * the children. */
	int *entry_fds;
	int nentry_fds;

	/* Signals. */
	int sigfd;			/* signalfd of SIGCHLD, SIGINT, SIGTERM, SIGHUP */
	sigset_t entry_mask;		/* the mask to give back to children */

	/* The job's fate. */
	int64_t start_ms;		/* when the children were started */
	int64_t workers_done_ms;	/* when the last worker exited 0, 0 = not yet */
	bool stopping;			/* a failure was declared; exit_status is set */
	int exit_status;		/* the root cause's status */
	int64_t kill_at_ms;		/* when stopping: when SIGKILL follows SIGTERM */
	bool killed;			/* SIGKILL was sent */
};

/* ---- small helpers ------------------------------------------------------- */

static const char *role_name(int role)
{
	return role == CHILD_SERVER ? "server" : "worker";
}

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
 * 9 (SIGKILL)".  Returns the matching exit status for the launcher. */
static int describe_status(int status, char *buf, size_t len)
{
	char name[32];

	if (WIFEXITED(status)) {
		int code = WEXITSTATUS(status);

		snprintf(buf, len, "exited with status %d%s", code,
			 code == 127 ? " (the command could not be run)" : "");
		return code;
	}
	if (WIFSIGNALED(status)) {
		int sig = WTERMSIG(status);

		signal_name(sig, name, sizeof(name));
		snprintf(buf, len, "killed by signal %d (%s)%s", sig, name,
			 WCOREDUMP(status) ? ", core dumped" : "");
		return 128 + sig;
	}
	snprintf(buf, len, "ended with wait status 0x%x", (unsigned)status);
	return 1;
}

/* Writes all of buf to fd, retrying short writes.  Output that cannot be
 * written (our stdout was closed) is dropped: the job goes on. */
static void write_all(int fd, const char *buf, size_t len)
{
	while (len > 0) {
		ssize_t n = write(fd, buf, len);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN) {
				struct pollfd p = { .fd = fd, .events = POLLOUT };

				poll(&p, 1, 1000);
				continue;
			}
			return;
		}
		buf += n;
		len -= (size_t)n;
	}
}

/* ---- output forwarding --------------------------------------------------- */

/* Prefixed lines waiting to be written, so that a burst of short lines
 * costs one write() rather than one per line.  Only the main thread
 * forwards output, and the batch is flushed before any other write, so
 * lines are never cut or reordered. */
static struct {
	int fd;					/* where the batch goes */
	size_t len;				/* bytes in data */
	char data[2 * LAUNCH_LINE_MAX];		/* whole prefixed lines */
} batch;

static void batch_flush(void)
{
	write_all(batch.fd, batch.data, batch.len);
	batch.len = 0;
}

/* Queues one line (or a piece of a long one) of child `c`, adding the
 * newline when `data` ends with neither a newline nor a carriage return
 * (a progress bar redrawing its line ends each frame with '\r'). */
static void stream_emit(const struct child *c, const struct stream *s, const char *data,
			size_t len)
{
	size_t prefix = strlen(c->prefix);
	bool newline = len == 0 || (data[len - 1] != '\n' && data[len - 1] != '\r');

	if (len == 1 && data[0] == '\r')
		prefix = 0;	/* a bare carriage return starting a frame: no prefix */
	if (batch.len > 0 && (batch.fd != s->out_fd ||
			      batch.len + prefix + len + 1 > sizeof(batch.data)))
		batch_flush();
	batch.fd = s->out_fd;
	memcpy(batch.data + batch.len, c->prefix, prefix);
	memcpy(batch.data + batch.len + prefix, data, len);
	batch.len += prefix + len;
	if (newline)
		batch.data[batch.len++] = '\n';
}

/* Closes a stream, forwarding its unfinished last line. */
static void stream_close(const struct child *c, struct stream *s)
{
	if (s->fd < 0)
		return;
	if (s->len > 0)
		stream_emit(c, s, s->buf, s->len);
	batch_flush();
	s->len = 0;
	close(s->fd);
	s->fd = -1;
}

/* Reads what the pipe has once and forwards every complete line.  Returns
 * true when more may be waiting (the read filled the buffer's free space). */
static bool stream_read(const struct child *c, struct stream *s)
{
	size_t room = sizeof(s->buf) - s->len;
	size_t start = 0;
	ssize_t n;
	char *nl;

	if (s->fd < 0)
		return false;
	do
		n = read(s->fd, s->buf + s->len, room);
	while (n < 0 && errno == EINTR);
	if (n < 0 && errno == EAGAIN)
		return false;
	if (n <= 0) {
		stream_close(c, s);
		return false;
	}
	s->len += (size_t)n;

	/* A line ends at '\n', or at a '\r' not followed by '\n': each frame
	 * of a progress bar goes out prefixed, as it is drawn. */
	while ((nl = memchr(s->buf + start, '\n', s->len - start)) != NULL ||
	       (nl = memchr(s->buf + start, '\r', s->len - start)) != NULL) {
		char *cr = memchr(s->buf + start, '\r', (size_t)(nl - s->buf) - start);
		if (cr != NULL && cr + 1 < s->buf + s->len && cr[1] != '\n')
			nl = cr;
		else if (*nl == '\r' && nl + 1 == s->buf + s->len)
			break;	/* maybe the first half of "\r\n": wait for more */
		size_t end = (size_t)(nl - s->buf) + 1;

		stream_emit(c, s, s->buf + start, end - start);
		start = end;
	}
	if (start == 0 && s->len == sizeof(s->buf)) {
		/* A line longer than the buffer: forward this piece. */
		stream_emit(c, s, s->buf, s->len);
		start = s->len;
	}
	batch_flush();
	memmove(s->buf, s->buf + start, s->len - start);
	s->len -= start;
	return (size_t)n == room;
}

/* Reads a stream until it is empty, within a bound in case something keeps
 * writing into it as fast as we read. */
static void stream_drain(const struct child *c, struct stream *s)
{
	for (int i = 0; i < 256 && stream_read(c, s); i++)
		;
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

/* Takes the waiter's report once its byte arrived. */
static void sched_collect(struct launcher *l)
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
			sched_collect(l);
	}
	return l->sched_done;
}

/* ---- stopping the job ---------------------------------------------------- */

/* Sends `sig` to the process group of every running child. */
static void children_signal(struct launcher *l, int sig)
{
	for (int i = 0; i < l->nchildren; i++) {
		struct child *c = &l->children[i];

		if (!c->running)
			continue;
		c->signalled = true;
		if (kill(-c->pid, sig) < 0)
			kill(c->pid, sig);
	}
}

/* Declares the job failed with `status`: prints the root cause's line (the
 * format's text after "unisum launch: "), then sends SIGTERM to every
 * child.  Only the first call acts. */
__attribute__((format(printf, 3, 4)))
static void job_fail(struct launcher *l, int status, const char *fmt, ...)
{
	va_list ap;

	if (l->stopping)
		return;
	l->stopping = true;
	l->exit_status = status;
	fputs("unisum launch: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	for (int i = l->echo_ms != 0 ? 0 : 1; i < l->nechoes; i++)
		fprintf(stderr, "unisum launch: then %s\n", l->echoes[i]);
	children_signal(l, SIGTERM);
	l->kill_at_ms = timing_now_ms() + LAUNCH_TERM_GRACE_MS;
}

/* Sends SIGKILL to every child still running, naming each. */
static void job_kill(struct launcher *l)
{
	for (int i = 0; i < l->nchildren; i++) {
		struct child *c = &l->children[i];

		if (c->running)
			fprintf(stderr, "unisum launch: %s %d (pid %d) is still running; "
				"sending SIGKILL\n", role_name(c->role), c->rank, (int)c->pid);
	}
	children_signal(l, SIGKILL);
	l->killed = true;
	l->kill_at_ms = timing_now_ms();
}

/* ---- children ------------------------------------------------------------ */

/* Remembers which descriptors are open now. */
static int fds_snapshot(struct launcher *l)
{
	DIR *dir = opendir("/proc/self/fd");
	struct dirent *e;
	int cap = 0;

	if (!dir)
		return 0;	/* without /proc, rely on O_CLOEXEC alone */
	while ((e = readdir(dir)) != NULL) {
		int fd = atoi(e->d_name);

		if (e->d_name[0] == '.' || fd == dirfd(dir))
			continue;
		if (l->nentry_fds == cap) {
			int *grown = realloc(l->entry_fds, sizeof(int) * (size_t)(cap ? 2 * cap : 16));

			if (!grown) {
				closedir(dir);
				return -1;
			}
			l->entry_fds = grown;
			cap = cap ? 2 * cap : 16;
		}
		l->entry_fds[l->nentry_fds++] = fd;
	}
	closedir(dir);
	return 0;
}

/* Marks close-on-exec every descriptor opened since launch_main() began, so
 * that no child inherits a scheduler socket (which would keep a connection
 * alive after the scheduler closed it). */
static void fds_protect(struct launcher *l)
{
	DIR *dir = opendir("/proc/self/fd");
	struct dirent *e;

	if (!dir)
		return;
	while ((e = readdir(dir)) != NULL) {
		int fd = atoi(e->d_name);
		bool old = false;
		int flags;

		if (e->d_name[0] == '.' || fd == dirfd(dir))
			continue;
		for (int i = 0; i < l->nentry_fds && !old; i++)
			old = l->entry_fds[i] == fd;
		if (old)
			continue;
		flags = fcntl(fd, F_GETFD);
		if (flags >= 0 && !(flags & FD_CLOEXEC))
			fcntl(fd, F_SETFD, flags | FD_CLOEXEC);
	}
	closedir(dir);
}

/* Adds "NAME=value" to a child environment. */
__attribute__((format(printf, 3, 4)))
static void env_add(struct child_env *env, int *n, const char *fmt, ...)
{
	char *var = env->vars[*n];
	va_list ap;
	int used;

	for (used = 0; env->envp[used] != NULL; used++)
		;
	va_start(ap, fmt);
	vsnprintf(var, sizeof(env->vars[0]), fmt, ap);
	va_end(ap);
	env->envp[used] = var;
	env->envp[used + 1] = NULL;
	(*n)++;
}

/* The variables the launcher sets (or clears) for its children: all of
 * these for a whole job; only the first LAUNCH_MACHINE_OWN for one machine
 * (--nproc-per-node), which inherits the job's shape and address. */
static const char *const env_own_names[] = {
	"UNISUM_ROLE", "DMLC_ROLE", "UNISUM_LOCAL_RANK", "BYTEPS_LOCAL_RANK",
	"UNISUM_LOCAL_SIZE", "BYTEPS_LOCAL_SIZE", "UNISUM_LAUNCHED",
	"UNISUM_NUM_WORKER", "UNISUM_NUM_SERVER", "UNISUM_SCHEDULER_HOST",
	"UNISUM_SCHEDULER_PORT", "UNISUM_WORKER_ID", "DMLC_WORKER_ID",
	"UNISUM_SERVER_ID", "UNISUM_NODE_HOST", "DMLC_NODE_HOST",
};
#define LAUNCH_MACHINE_OWN 7
#define LAUNCH_JOB_OWN (sizeof(env_own_names) / sizeof(env_own_names[0]))
/* The job form sets these two only when it places processes in namespaces. */
#define LAUNCH_NETNS_OWN 2

/* Whether environ entry `var` is one the launcher sets (or clears). */
static bool env_is_ours(const struct launcher *l, const char *var)
{
	size_t count = l->one_machine ? LAUNCH_MACHINE_OWN : LAUNCH_JOB_OWN;

	if (!l->one_machine && l->nnetns == 0)
		count -= LAUNCH_NETNS_OWN;
	for (size_t i = 0; i < count; i++) {
		size_t len = strlen(env_own_names[i]);

		if (strncmp(var, env_own_names[i], len) == 0 && var[len] == '=')
			return true;
	}
	return false;
}

/* Gives the job a fresh secret (UNISUM_SECRET, inherited by every child)
 * unless the user chose one: then nobody who merely reaches a port can join
 * the job or inject gradients.  False when no random bytes could be had. */
static bool secret_ensure(void)
{
	if (getenv("UNISUM_SECRET") != NULL || getenv("UNISUM_SECRET_FILE") != NULL)
		return true;
	uint8_t raw[32];
	char hex[2 * sizeof raw + 1];
	if (getrandom(raw, sizeof raw, 0) != (ssize_t)sizeof raw)
		return false;
	for (size_t i = 0; i < sizeof raw; i++)
		snprintf(hex + 2 * i, 3, "%02x", raw[i]);
	return setenv("UNISUM_SECRET", hex, 1) == 0;
}

/* Builds the environment of child `c`.  Returns NULL when out of memory;
 * free with free(env->envp) then free(env). */
static struct child_env *env_build(const struct launcher *l, const struct child *c)
{
	struct child_env *env;
	size_t count = 0, used = 0;
	int own = 0;

	for (char **e = environ; *e; e++)
		count++;
	env = calloc(1, sizeof(*env));
	if (!env)
		return NULL;
	env->envp = calloc(count + LAUNCH_ENV_OWN + 1, sizeof(char *));
	if (!env->envp) {
		free(env);
		return NULL;
	}
	for (char **e = environ; *e; e++)
		if (!env_is_ours(l, *e))
			env->envp[used++] = *e;
	env->envp[used] = NULL;

	/* UNISUM_JOB_ID is in environ already (see job_id_choose()). */
	env_add(env, &own, "UNISUM_ROLE=%s", role_name(c->role));
	env_add(env, &own, "UNISUM_LAUNCHED=1");
	if (c->role == CHILD_WORKER) {
		env_add(env, &own, "UNISUM_LOCAL_RANK=%d", c->rank % l->local_size);
		env_add(env, &own, "UNISUM_LOCAL_SIZE=%d", l->local_size);
	}
	if (l->one_machine)
		return env;	/* the rest is the job's, inherited */

	env_add(env, &own, "UNISUM_NUM_WORKER=%d", l->machines);
	env_add(env, &own, "UNISUM_NUM_SERVER=%d", l->num_servers);
	env_add(env, &own, "UNISUM_SCHEDULER_HOST=%s", l->sched_addr);
	if (c->netns >= 0)
		env_add(env, &own, "UNISUM_NODE_HOST=%s", l->netns[c->netns].addr);
	env_add(env, &own, "UNISUM_SCHEDULER_PORT=%d", l->port);
	if (c->role == CHILD_WORKER)
		env_add(env, &own, "UNISUM_WORKER_ID=%d", c->rank / l->local_size);
	else
		env_add(env, &own, "UNISUM_SERVER_ID=%d", c->rank);
	return env;
}

static void env_free(struct child_env *env)
{
	if (!env)
		return;
	free(env->envp);
	free(env);
}

/* Writes a string to fd 2 with async-signal-safe calls only. */
static void child_say(const char *s)
{
	ssize_t n = write(STDERR_FILENO, s, strlen(s));

	(void)n;
}

/* The child's side of fork(): async-signal-safe calls only, because the
 * scheduler's threads were running at fork() time.  Never returns. */
__attribute__((noreturn))
static void child_exec(const struct launcher *l, const struct child *c, int out_w, int err_w,
		       char *const argv[], char *const envp[])
{
	struct sigaction dfl = { .sa_handler = SIG_DFL };
	const char *why;
	int err;

	setpgid(0, 0);
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	if (getppid() != l->self)
		_exit(1);	/* the launcher died before PDEATHSIG was armed */

	if (dup2(l->devnull, STDIN_FILENO) < 0 || dup2(out_w, STDOUT_FILENO) < 0 ||
	    dup2(err_w, STDERR_FILENO) < 0)
		_exit(127);
	sigaction(SIGPIPE, &dfl, NULL);
	sigprocmask(SIG_SETMASK, &l->entry_mask, NULL);
	if (c->netns >= 0 && setns(l->netns[c->netns].fd, CLONE_NEWNET) < 0) {
		child_say("unisum launch: cannot enter network namespace ");
		child_say(l->netns[c->netns].name);
		child_say(": ");
		child_say(strerrordesc_np(errno) ? strerrordesc_np(errno) : "unknown error");
		child_say("\n");
		_exit(127);
	}

	if (c->role == CHILD_SERVER)
		execve("/proc/self/exe", argv, envp);
	else
		execvpe(argv[0], argv, envp);

	err = errno;
	why = strerrordesc_np(err);
	child_say("unisum launch: cannot run '");
	child_say(c->role == CHILD_SERVER ? "/proc/self/exe" : argv[0]);
	child_say("': ");
	child_say(why ? why : "unknown error");
	child_say("\n");
	_exit(127);
}

/* Starts child `c` with its output on two new pipes.  Returns 0, or -errno
 * with nothing left behind. */
static int child_spawn(struct launcher *l, struct child *c)
{
	static char *server_argv[] = { "unisum", "server", NULL };
	char *const *argv = c->role == CHILD_SERVER ? server_argv : l->cmd;
	struct child_env *env;
	int out_pipe[2], err_pipe[2];
	int rc = 0;
	pid_t pid;

	env = env_build(l, c);
	if (!env)
		return -ENOMEM;
	if (pipe2(out_pipe, O_CLOEXEC) < 0) {
		rc = -errno;
		goto out_free_env;
	}
	if (pipe2(err_pipe, O_CLOEXEC) < 0) {
		rc = -errno;
		goto out_close_out_pipe;
	}
	fds_protect(l);

	pid = fork();
	if (pid < 0) {
		rc = -errno;
		close(err_pipe[0]);
		close(err_pipe[1]);
		goto out_close_out_pipe;
	}
	if (pid == 0)
		child_exec(l, c, out_pipe[1], err_pipe[1], argv, env->envp);

	/* Also set the group here, so that a signal sent before the child ran
	 * setpgid() still finds it. */
	setpgid(pid, pid);
	c->pid = pid;
	c->running = true;
	close(out_pipe[1]);
	close(err_pipe[1]);
	fcntl(out_pipe[0], F_SETFL, O_NONBLOCK);
	fcntl(err_pipe[0], F_SETFL, O_NONBLOCK);
	c->out.fd = out_pipe[0];
	c->err.fd = err_pipe[0];
	goto out_free_env;

out_close_out_pipe:
	close(out_pipe[0]);
	close(out_pipe[1]);
out_free_env:
	env_free(env);
	return rc;
}

/* Judges a child that just exited, with its last output already forwarded. */
/* Whether child c, which ended with `status` while the job ran, failed on
 * the news of another process's failure rather than on its own: a server
 * says so with UNISUM_EXIT_ELSEWHERE, and for any child the scheduler may
 * already name another child as the node whose loss failed the job (the
 * scheduler sees a process's connection drop before anyone hears of it,
 * while the kernel may report the exits in either order). */
/* Whether the scheduler names child c as the node whose loss failed the
 * job. */
static bool child_is_culprit(const struct launcher *l, const struct child *c)
{
	int role, rank;
	if (l->sched == NULL || !rdv_scheduler_culprit(l->sched, &role, &rank))
		return false;
	return c->rank == rank && c->role == (role == CONFIG_ROLE_SERVER ? CHILD_SERVER : CHILD_WORKER) &&
	       (role == CONFIG_ROLE_SERVER || role == CONFIG_ROLE_WORKER);
}

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

static void child_ended(struct launcher *l, struct child *c, int status)
{
	char what[96];
	int code = describe_status(status, what, sizeof(what));

	if (l->stopping) {
		/* The cascade: quiet when it is our own SIGTERM/SIGKILL at work. */
		bool ours = c->signalled && WIFSIGNALED(status) &&
			    (WTERMSIG(status) == SIGTERM || WTERMSIG(status) == SIGKILL);

		if (code != 0 && !ours)
			fprintf(stderr, "unisum launch: then %s %d (pid %d) %s\n",
				role_name(c->role), c->rank, (int)c->pid, what);
		return;
	}
	if (code != 0 && child_is_echo(l, c, status)) {
		/* It failed on the news of another process's failure: that one
		 * is blamed when it ends, within a second; this one only if
		 * none does. */
		if (l->nechoes == 0) {
			l->echo_ms = timing_now_ms();
			l->echo_status = code;
		}
		if (l->nechoes < LAUNCH_MAX_ECHOES)
			snprintf(l->echoes[l->nechoes++], sizeof l->echoes[0], "%s %d (pid %d) %s, on the "
				 "news of the failure", role_name(c->role), c->rank, (int)c->pid, what);
		return;
	}
	if (code != 0) {
		job_fail(l, code, "%s %d (pid %d) %s; stopping the job",
			 role_name(c->role), c->rank, (int)c->pid, what);
		return;
	}
	if (l->echo_ms != 0 && child_is_culprit(l, c)) {
		job_fail(l, 1, "%s %d (pid %d) exited with status 0 but left the job without "
			 "unisum_shutdown(); stopping the job", role_name(c->role), c->rank, (int)c->pid);
		return;
	}
	if (c->role == CHILD_WORKER && l->workers_done_ms == 0) {
		bool all = true;

		for (int i = 0; i < l->nchildren && all; i++)
			all = l->children[i].role != CHILD_WORKER || l->children[i].pid == 0 ||
			      !l->children[i].running;
		if (all)
			l->workers_done_ms = timing_now_ms();
	}
}

/* Whether child c has been killed by a signal (not reaped yet). */
static bool child_was_killed(const struct child *c)
{
	siginfo_t info = {0};
	int w;
	do
		w = waitid(P_PID, (id_t)c->pid, &info, WEXITED | WNOHANG | WNOWAIT);
	while (w < 0 && errno == EINTR);
	return w == 0 && info.si_pid != 0 && (info.si_code == CLD_KILLED || info.si_code == CLD_DUMPED);
}

/* Child c ended: true when it may be blamed (no failure, or nobody else was killed
 * meanwhile).  A process killed with SIGKILL closes its sockets before it
 * becomes a zombie, so a survivor that exits on the news can end first: a
 * failure is judged only after the others had 300 ms to show a kill.
 * Returns false when another child turned out killed. */
static bool child_may_be_blamed(const struct launcher *l, const struct child *c)
{
	siginfo_t info = {0};
	int w;
	do
		w = waitid(P_PID, (id_t)c->pid, &info, WEXITED | WNOHANG | WNOWAIT);
	while (w < 0 && errno == EINTR);
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
			if (pass == 0) {
				siginfo_t info = {0};
				int w;
				do
					w = waitid(P_PID, (id_t)c->pid, &info, WEXITED | WNOHANG | WNOWAIT);
				while (w < 0 && errno == EINTR);
				if (w == 0 && info.si_pid == 0)
					continue;	/* still running */
				if (w == 0 && info.si_code != CLD_KILLED && info.si_code != CLD_DUMPED)
					continue;	/* exited: the second pass */
			}
			do
				r = waitpid(c->pid, &status, WNOHANG);
			while (r < 0 && errno == EINTR);
			if (r == 0)
				continue;
			c->running = false;
			if (r < 0) {
				/* Not our child any more (cannot happen unless someone
				 * reaped it behind our back): count it as failed. */
				status = 1 << 8;
			}
			stream_drain(c, &c->out);
			stream_drain(c, &c->err);
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
			if (!l->sched_done)
				rdv_scheduler_abort(l->sched);
			job_fail(l, 128 + sig, "received %s; stopping the job", name);
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
		/* The launcher itself is the root cause: keep the scheduler from
		 * blaming the processes it is about to stop. */
		if (!l->sched_done)
			rdv_scheduler_abort(l->sched);
		job_fail(l, LAUNCH_EXIT_TIMEOUT,
			 "the job ran longer than --timeout %g s; stopping it", l->timeout_s);
		return;
	}
	if (l->echo_ms && now - l->echo_ms >= LAUNCH_BLAME_GRACE_MS) {
		l->echo_ms = 0;	/* the summary names the first: no "then" line for it */
		job_fail(l, l->echo_status, "%s; stopping the job", l->echoes[0]);
		return;
	}
	if (l->sched_failed_ms && now - l->sched_failed_ms >= LAUNCH_BLAME_GRACE_MS) {
		job_fail(l, 1, "the scheduler failed: %s; stopping the job",
			 unisum_strerror(l->sched_rc));
		return;
	}
	if (l->workers_done_ms && now - l->workers_done_ms >= LAUNCH_SERVER_GRACE_MS) {
		for (int i = 0; i < l->nchildren; i++) {
			struct child *c = &l->children[i];

			if (c->running) {
				job_fail(l, 1, "%s %d (pid %d) still runs %d s after every "
					 "worker finished%s; stopping it", role_name(c->role),
					 c->rank, (int)c->pid, LAUNCH_SERVER_GRACE_MS / 1000,
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
		next = l->kill_at_ms + (l->killed ? LAUNCH_KILL_GRACE_MS : 0);
	} else {
		if (l->timeout_s > 0)
			next = l->start_ms + (int64_t)(l->timeout_s * 1000);
		if (l->sched_failed_ms && l->sched_failed_ms + LAUNCH_BLAME_GRACE_MS < next)
			next = l->sched_failed_ms + LAUNCH_BLAME_GRACE_MS;
		if (l->echo_ms && l->echo_ms + LAUNCH_BLAME_GRACE_MS < next)
			next = l->echo_ms + LAUNCH_BLAME_GRACE_MS;
		if (l->workers_done_ms && l->workers_done_ms + LAUNCH_SERVER_GRACE_MS < next)
			next = l->workers_done_ms + LAUNCH_SERVER_GRACE_MS;
	}
	if (next == INT64_MAX)
		return -1;
	if (next <= now)
		return 0;
	return next - now > INT_MAX ? INT_MAX : (int)(next - now);
}

/* Fills `fds` with every open child stream (and `streams`/`owners` with
 * what each entry is), after `first` fixed entries.  Returns the count. */
static int loop_fds(struct launcher *l, struct pollfd *fds, int first, struct stream **streams,
		    struct child **owners)
{
	int n = first;

	for (int i = 0; i < l->nchildren; i++) {
		struct child *c = &l->children[i];
		struct stream *both[2] = { &c->out, &c->err };

		for (int k = 0; k < 2; k++) {
			if (both[k]->fd < 0)
				continue;
			fds[n].fd = both[k]->fd;
			fds[n].events = POLLIN;
			fds[n].revents = 0;
			streams[n] = both[k];
			owners[n] = c;
			n++;
		}
	}
	return n;
}

/* Runs until every child is gone (or, after SIGKILL, given up on). */
static int loop_run(struct launcher *l)
{
	size_t slots = 2 + 2 * (size_t)l->nchildren;
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
		n = loop_fds(l, fds, 2, streams, owners);
		if (poll(fds, (nfds_t)n, loop_timeout(l, now)) < 0 && errno != EINTR) {
			rc = -errno;
			goto out_free;
		}

		for (int i = 2; i < n; i++)
			if (fds[i].revents)
				stream_read(owners[i], streams[i]);
		if (fds[1].revents) {
			sched_collect(l);
			if (l->sched_done && l->sched_rc != 0 && !l->stopping)
				l->sched_failed_ms = timing_now_ms();
		}
		if (fds[0].revents)
			signals_handle(l);
		children_reap(l);
		deadlines_check(l, timing_now_ms());
	}
out_free:
	free(fds);
	free(streams);
	free(owners);
	return rc;
}

/* Forwards what is left in the pipes once every child is gone; a pipe that
 * a grandchild still holds open is read for LAUNCH_DRAIN_MS at most. */
static void output_finish(struct launcher *l)
{
	int64_t deadline = timing_now_ms() + LAUNCH_DRAIN_MS;
	size_t slots = 2 * (size_t)l->nchildren + 2;
	struct pollfd *fds = calloc(slots, sizeof(*fds));
	struct stream **streams = calloc(slots, sizeof(*streams));
	struct child **owners = calloc(slots, sizeof(*owners));

	while (fds && streams && owners) {
		int64_t left = deadline - timing_now_ms();
		int n = loop_fds(l, fds, 0, streams, owners);

		if (n == 0 || left <= 0)
			break;
		if (poll(fds, (nfds_t)n, (int)left) <= 0)
			continue;
		for (int i = 0; i < n; i++)
			if (fds[i].revents)
				stream_read(owners[i], streams[i]);
	}
	for (int i = 0; i < l->nchildren; i++) {
		stream_close(&l->children[i], &l->children[i].out);
		stream_close(&l->children[i], &l->children[i].err);
	}
	free(fds);
	free(streams);
	free(owners);
}

/* Lets the scheduler finish once every child is gone, aborting it if it
 * does not (see DESIGN above), and folds its result into the exit status. */
static void sched_finish(struct launcher *l)
{
	if (!l->waiter_started)
		return;
	if (!sched_await(l, LAUNCH_SCHED_GRACE_MS)) {
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

/* ---- options ------------------------------------------------------------- */

#define LAUNCH_USAGE_LINES \
	"usage: unisum launch [-w N] [-s K] [--local-size L] [--timeout SEC] [--no-secret]\n" \
	"                     [--] CMD [ARGS...]\n" \
	"       unisum launch --nproc-per-node L [--timeout SEC] [--] CMD [ARGS...]\n"

static void usage(FILE *out)
{
	fputs(LAUNCH_USAGE_LINES
	      "\n"
	      "Runs a whole job on this machine: the scheduler (inside this process),\n"
	      "K server processes and N worker processes running CMD, with the\n"
	      "environment wired (UNISUM_ROLE, UNISUM_WORKER_ID, UNISUM_LOCAL_RANK,\n"
	      "UNISUM_SCHEDULER_HOST, UNISUM_SCHEDULER_PORT, ...).  The workers form\n"
	      "N/L machines of L workers: the workers of a machine sum through shared\n"
	      "memory and only the machine's sum goes through the servers.  Every line a\n"
	      "process prints is forwarded with a \"[worker 0] \" or \"[server 0] \" prefix.\n"
	      "When any process fails, everything is stopped and launch exits with that\n"
	      "process's status.\n"
	      "\n"
	      "  -w, --workers N     worker processes (default 2)\n"
	      "  -s, --servers K     server processes (default 1)\n"
	      "      --local-size L  workers per machine, a divisor of N (default N: all\n"
	      "                      workers are one machine; 1: every worker's tensors\n"
	      "                      go through the servers)\n"
	      "      --nproc-per-node L\n"
	      "                      start one machine of a job whose scheduler and\n"
	      "                      servers run elsewhere: L workers of CMD, with\n"
	      "                      UNISUM_LOCAL_RANK 0..L-1 and UNISUM_LOCAL_SIZE=L; the\n"
	      "                      environment must hold the rest: UNISUM_SCHEDULER_HOST,\n"
	      "                      UNISUM_SCHEDULER_PORT, UNISUM_NUM_WORKER (machines),\n"
	      "                      UNISUM_NUM_SERVER, UNISUM_WORKER_ID (this machine,\n"
	      "                      from 0), the job's secret (or their DMLC_* names);\n"
	      "                      worker ranks are UNISUM_WORKER_ID x L + local rank\n"
	      "      --worker-netns NS,NS,...\n"
	      "                      run machine i's workers in network namespace NS_i\n"
	      "                      (/run/netns/NS_i; one per machine): an emulated\n"
	      "                      cluster, see bench/cluster/netns.sh\n"
	      "      --server-netns NS,NS,...\n"
	      "                      run server j in NS_j: a worker machine's namespace\n"
	      "                      makes it colocated, any other a CPU-only server\n"
	      "      --scheduler-netns NS\n"
	      "                      the scheduler's namespace (default: machine 0's)\n"
	      "      --timeout SEC   stop everything and exit 124 after SEC seconds\n"
	      "                      (default 0: no limit)\n"
	      "      --no-secret     no job secret: connections are not authenticated\n"
	      "                      (by default a fresh UNISUM_SECRET is made for the job\n"
	      "                      unless UNISUM_SECRET or UNISUM_SECRET_FILE is set)\n"
	      "  -h, --help          print this help\n"
	      "\n"
	      "Every process gets UNISUM_JOB_ID (a fresh one unless it is set), which\n"
	      "names the job's shared-memory segments in /dev/shm; segments left by dead\n"
	      "jobs are removed at start, and the job's own when it ends.\n"
	      "\n"
	      "Exit status: 0 when every process exited 0; else the first failing\n"
	      "process's status (128 + N when killed by signal N), 1 when the\n"
	      "scheduler failed, 124 on --timeout, 130/143 on SIGINT/SIGTERM, 2 on a\n"
	      "usage error or a missing or malformed variable.\n", out);
}

/* Matches option `arg` against -x / --long, in the forms "-x V", "-xV",
 * "--long V" and "--long=V".  Returns 1 with *value set, 0 when it is
 * another option, -1 when the value is missing. */
static int option_match(int argc, char **argv, int *i, const char *shortname,
			const char *longname, const char **value)
{
	const char *arg = argv[*i];
	size_t longlen = strlen(longname);

	if ((shortname && strcmp(arg, shortname) == 0) || strcmp(arg, longname) == 0) {
		if (*i + 1 >= argc)
			return -1;
		*value = argv[++*i];
		return 1;
	}
	if (strncmp(arg, longname, longlen) == 0 && arg[longlen] == '=') {
		*value = arg + longlen + 1;
		return 1;
	}
	if (shortname && strncmp(arg, shortname, 2) == 0 && arg[2] != '\0') {
		*value = arg + 2;
		return 1;
	}
	return 0;
}

/* Parses a count of processes (1..max). */
static int parse_count(const char *name, const char *value, int max, int *out)
{
	char *end;
	long v;

	errno = 0;
	v = strtol(value, &end, 10);
	if (errno || end == value || *end != '\0' || v < 1 || v > max) {
		fprintf(stderr, "unisum launch: %s needs a number of processes from 1 to %d, "
			"got '%s'\n", name, max, value);
		return -1;
	}
	*out = (int)v;
	return 0;
}

/* Fills the options of `l` from argv.  Returns 0, 1 when help was printed,
 * or -1 after printing a usage error. */
static int options_parse(struct launcher *l, int argc, char **argv)
{
	const char *job_option = NULL;	/* an option of the whole-job form, seen */
	int nproc = 0;			/* --nproc-per-node */

	l->num_workers = 2;
	l->num_servers = 1;
	l->timeout_s = 0;
	l->cmd = NULL;

	for (int i = 1; i < argc; i++) {
		const char *arg = argv[i];
		const char *value = NULL;
		int m;

		if (strcmp(arg, "--") == 0) {
			l->cmd = &argv[i + 1];
			break;
		}
		if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0) {
			usage(stdout);
			return 1;
		}
		if (arg[0] != '-' || arg[1] == '\0') {
			l->cmd = &argv[i];
			break;
		}
		if ((m = option_match(argc, argv, &i, "-w", "--workers", &value)) != 0) {
			if (m < 0 || parse_count("--workers", value, 4096, &l->num_workers) < 0)
				goto out_missing;
			job_option = arg;
		} else if ((m = option_match(argc, argv, &i, "-s", "--servers", &value)) != 0) {
			if (m < 0 || parse_count("--servers", value, 4096, &l->num_servers) < 0)
				goto out_missing;
			job_option = arg;
		} else if ((m = option_match(argc, argv, &i, NULL, "--local-size", &value)) != 0) {
			if (m < 0 || parse_count("--local-size", value, LAUNCH_LOCAL_MAX,
						 &l->local_size) < 0)
				goto out_missing;
			job_option = arg;
		} else if ((m = option_match(argc, argv, &i, NULL, "--nproc-per-node", &value)) != 0) {
			if (m < 0 || parse_count("--nproc-per-node", value, LAUNCH_LOCAL_MAX,
						 &nproc) < 0)
				goto out_missing;
		} else if ((m = option_match(argc, argv, &i, NULL, "--timeout", &value)) != 0) {
			char *end;

			if (m < 0)
				goto out_missing;
			errno = 0;
			l->timeout_s = strtod(value, &end);
			if (errno || end == value || *end != '\0' || !(l->timeout_s >= 0) ||
			    l->timeout_s > 1e9) {
				fprintf(stderr, "unisum launch: --timeout needs a number of seconds "
					"(0 for none), got '%s'\n", value);
				return -1;
			}
		} else if ((m = option_match(argc, argv, &i, NULL, "--worker-netns", &value)) != 0) {
			if (m < 0)
				goto out_missing;
			l->worker_netns_opt = value;
			job_option = arg;
		} else if ((m = option_match(argc, argv, &i, NULL, "--server-netns", &value)) != 0) {
			if (m < 0)
				goto out_missing;
			l->server_netns_opt = value;
			job_option = arg;
		} else if ((m = option_match(argc, argv, &i, NULL, "--scheduler-netns", &value)) != 0) {
			if (m < 0)
				goto out_missing;
			l->sched_netns_opt = value;
			job_option = arg;
		} else if (strcmp(arg, "--no-secret") == 0) {
			l->no_secret = true;
			job_option = arg;
		} else {
			fprintf(stderr, "unisum launch: unknown option '%s'\n", arg);
			goto out_usage;
		}
		continue;
out_missing:
		if (m < 0)
			fprintf(stderr, "unisum launch: %s needs a value\n", arg);
		return -1;
	}
	if (!l->cmd || !l->cmd[0]) {
		fprintf(stderr, "unisum launch: no command to run\n");
		goto out_usage;
	}
	if (nproc > 0) {
		if (job_option) {
			fprintf(stderr, "unisum launch: %s does not go with --nproc-per-node, which "
				"starts one machine of a job described by the environment\n",
				job_option);
			goto out_usage;
		}
		l->one_machine = true;
		l->local_size = nproc;
		l->num_servers = 0;
		return 0;
	}
	if (l->local_size == 0) {
		/* One host, one machine: the shared-memory path by default. */
		if (l->num_workers > LAUNCH_LOCAL_MAX) {
			fprintf(stderr, "unisum launch: %d workers are too many for one machine "
				"(at most %d); pass --local-size to split them\n", l->num_workers,
				LAUNCH_LOCAL_MAX);
			goto out_usage;
		}
		l->local_size = l->num_workers;
	}
	if (l->num_workers % l->local_size != 0) {
		fprintf(stderr, "unisum launch: --local-size %d does not divide --workers %d: "
			"every machine holds the same number of workers\n", l->local_size,
			l->num_workers);
		goto out_usage;
	}
	l->machines = l->num_workers / l->local_size;
	if ((l->worker_netns_opt != NULL) != (l->server_netns_opt != NULL) ||
	    (l->sched_netns_opt != NULL && l->worker_netns_opt == NULL)) {
		fprintf(stderr, "unisum launch: --worker-netns and --server-netns go together (and "
			"--scheduler-netns needs them): every process of an emulated cluster runs in "
			"a namespace\n");
		goto out_usage;
	}
	return 0;

out_usage:
	fputs(LAUNCH_USAGE_LINES "       (unisum launch --help for more)\n", stderr);
	return -1;
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

/* Sets l->job_id: the UNISUM_JOB_ID of the environment when there is one
 * (the user's choice is kept), else a fresh one unique on this host, put
 * in environ so that every child inherits it.  Returns 0, or -1 after
 * printing why. */
static int job_id_choose(struct launcher *l)
{
	const char *given = getenv("UNISUM_JOB_ID");
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
	for (size_t i = 0; i < LAUNCH_MACHINE_OWN; i++)
		unsetenv(env_own_names[i]);
	if (config_load(&cfg, err, sizeof(err)) != 0 ||
	    config_require(&cfg, CONFIG_ROLE_WORKER, err, sizeof(err)) != 0) {
		fprintf(stderr, "unisum launch --nproc-per-node: %s\n", err);
		return -1;
	}
	if (cfg.worker_id < 0 || cfg.worker_id >= cfg.num_workers) {
		fprintf(stderr, "unisum launch --nproc-per-node: UNISUM_WORKER_ID (or "
			"DMLC_WORKER_ID) must be this machine's index, from 0 to %d "
			"(UNISUM_NUM_WORKER counts machines)%s\n", cfg.num_workers - 1,
			cfg.worker_id < 0 ? ", and it is not set" : "");
		return -1;
	}
	l->machines = cfg.num_workers;
	l->machine = cfg.worker_id;
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
static int job_config(struct launcher *l, struct config *cfg)
{
	char err[512];
	char num[16];

	for (size_t i = 0; i < LAUNCH_JOB_OWN; i++)
		unsetenv(env_own_names[i]);
	snprintf(num, sizeof(num), "%d", l->machines);
	setenv("UNISUM_NUM_WORKER", num, 1);
	snprintf(num, sizeof(num), "%d", l->num_servers);
	setenv("UNISUM_NUM_SERVER", num, 1);
	if (l->no_secret) {
		unsetenv("UNISUM_SECRET");
		unsetenv("UNISUM_SECRET_FILE");
	} else if (!secret_ensure()) {
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

/* Removes the segments that dead jobs left in /dev/shm. */
static void shm_sweep_stale(void)
{
	int removed = 0;

	log_set_identity("launch", -1);
	if (shm_clean_stale(NULL, &removed) == 0 && removed > 0)
		fprintf(stderr, "unisum launch: removed %d stale shared-memory segment(s) of dead "
			"jobs from %s\n", removed, SHM_DIR);
	/* A failure was logged; only jobs with several workers per machine
	 * need /dev/shm, and they will say so. */
}

/* Removes every segment of the job, once its children are gone: what a
 * worker that crashed or was killed left behind. */
static void shm_finish(struct launcher *l)
{
	int removed = 0;

	if (!l->job_started)
		return;
	log_set_identity("launch", -1);
	if (shm_unlink_job(l->job_id, &removed) == 0 && removed > 0)
		LOG_INFO("removed %d shared-memory segment(s) left by the workers of job %s",
			 removed, l->job_id);
}

/* Prints the start line: the scheduler's address, the job, the command. */
static void announce(const struct launcher *l)
{
	if (l->one_machine)
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
	if (!l->one_machine && l->machines == 1 && l->local_size > 1)
		fprintf(stderr, "unisum launch: all %d workers share one machine: the "
			"shared-memory local reduce is the whole job and the %d server(s) stay "
			"idle (--local-size 1 sends everything through the servers)\n",
			l->num_workers, l->num_servers);
}

/* The first non-loopback IPv4 address of the calling thread's network
 * namespace, into out[INET_ADDRSTRLEN]; false when there is none. */
static bool netns_first_addr(char *out)
{
	struct ifaddrs *ifs;
	bool found = false;

	if (getifaddrs(&ifs) < 0)
		return false;
	for (struct ifaddrs *i = ifs; i && !found; i = i->ifa_next) {
		if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET ||
		    (i->ifa_flags & IFF_LOOPBACK) || !(i->ifa_flags & IFF_UP))
			continue;
		const struct sockaddr_in *sin = (const struct sockaddr_in *)i->ifa_addr;
		found = inet_ntop(AF_INET, &sin->sin_addr, out, INET_ADDRSTRLEN) != NULL;
	}
	freeifaddrs(ifs);
	return found;
}

/* What netns_run() returns when it could not enter the namespace. */
#define NETNS_NOT_ENTERED INT_MIN

/* Runs fn(arg) with the calling thread inside namespace ns (NULL: where it
 * is), then moves it back.  Returns fn's result, or NETNS_NOT_ENTERED
 * after printing why.  Failing to come back aborts: the launcher must not
 * go on in a namespace it did not mean to. */
static int netns_run(const struct netns *ns, int (*fn)(void *), void *arg)
{
	if (!ns)
		return fn(arg);
	int home = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
	if (home < 0 || setns(ns->fd, CLONE_NEWNET) < 0) {
		fprintf(stderr, "unisum launch: cannot enter network namespace %s: %s\n", ns->name,
			strerror(errno));
		if (home >= 0)
			close(home);
		return NETNS_NOT_ENTERED;
	}
	int rc = fn(arg);
	if (setns(home, CLONE_NEWNET) < 0) {
		fprintf(stderr, "unisum launch: cannot leave network namespace %s: %s\n", ns->name,
			strerror(errno));
		abort();
	}
	close(home);
	return rc;
}

static int netns_addr_fn(void *arg)
{
	return netns_first_addr(arg) ? 0 : -EADDRNOTAVAIL;
}

/* The index of namespace `name` in l->netns, opening it and reading its
 * address the first time.  -1 after printing why. */
static int netns_find(struct launcher *l, const char *option, const char *name, size_t len)
{
	for (int i = 0; i < l->nnetns; i++)
		if (strlen(l->netns[i].name) == len && strncmp(l->netns[i].name, name, len) == 0)
			return i;
	if (len == 0 || len >= sizeof(l->netns[0].name) || memchr(name, '/', len)) {
		fprintf(stderr, "unisum launch: %s: '%.*s' is not a network namespace name\n", option,
			(int)len, name);
		return -1;
	}
	struct netns *grown = realloc(l->netns, sizeof(*grown) * (size_t)(l->nnetns + 1));
	if (!grown) {
		fprintf(stderr, "unisum launch: out of memory\n");
		return -1;
	}
	l->netns = grown;
	struct netns *ns = &l->netns[l->nnetns];
	char path[128];

	snprintf(ns->name, sizeof(ns->name), "%.*s", (int)len, name);
	snprintf(path, sizeof(path), "/run/netns/%s", ns->name);
	ns->fd = open(path, O_RDONLY | O_CLOEXEC);
	if (ns->fd < 0) {
		fprintf(stderr, "unisum launch: %s: no network namespace '%s' (%s: %s; make them "
			"with bench/cluster/netns.sh or `ip netns add`)\n", option, ns->name, path,
			strerror(errno));
		return -1;
	}
	int rc = netns_run(ns, netns_addr_fn, ns->addr);
	if (rc < 0) {
		if (rc != NETNS_NOT_ENTERED)
			fprintf(stderr, "unisum launch: %s: network namespace '%s' has no IPv4 "
				"address on an interface that is up\n", option, ns->name);
		close(ns->fd);
		return -1;
	}
	return l->nnetns++;
}

/* Parses a comma-separated list of exactly `want` namespaces into out[]. */
static int netns_list(struct launcher *l, const char *option, const char *list, int want, int *out)
{
	int n = 0;

	for (const char *p = list;; p++) {
		const char *end = strchr(p, ',');
		size_t len = end ? (size_t)(end - p) : strlen(p);

		if (n == want) {
			n++;
			break;
		}
		int idx = netns_find(l, option, p, len);
		if (idx < 0)
			return -1;
		out[n++] = idx;
		if (!end)
			break;
		p = end;
	}
	if (n != want) {
		fprintf(stderr, "unisum launch: %s names %s namespaces than the job's %d %s\n", option,
			n > want ? "more" : "fewer", want,
			option[2] == 'w' ? "machines (workers / --local-size)" : "servers");
		return -1;
	}
	return 0;
}

/* Resolves --worker-netns, --server-netns and --scheduler-netns, and where
 * the children will find the scheduler.  0, or -1 after printing why. */
static int netns_setup(struct launcher *l)
{
	l->sched_netns = -1;
	snprintf(l->sched_addr, sizeof(l->sched_addr), "%s", LAUNCH_HOST);
	if (!l->worker_netns_opt)
		return 0;
	l->machine_netns = calloc((size_t)l->machines, sizeof(int));
	l->server_netns = calloc((size_t)l->num_servers, sizeof(int));
	if (!l->machine_netns || !l->server_netns) {
		fprintf(stderr, "unisum launch: out of memory\n");
		return -1;
	}
	if (netns_list(l, "--worker-netns", l->worker_netns_opt, l->machines, l->machine_netns) < 0 ||
	    netns_list(l, "--server-netns", l->server_netns_opt, l->num_servers, l->server_netns) < 0)
		return -1;
	if (l->sched_netns_opt)
		l->sched_netns = netns_find(l, "--scheduler-netns", l->sched_netns_opt,
					    strlen(l->sched_netns_opt));
	else
		l->sched_netns = l->machine_netns[0];
	if (l->sched_netns < 0)
		return -1;
	snprintf(l->sched_addr, sizeof(l->sched_addr), "%s", l->netns[l->sched_netns].addr);
	return 0;
}

static void netns_free(struct launcher *l)
{
	for (int i = 0; i < l->nnetns; i++)
		close(l->netns[i].fd);
	free(l->netns);
	free(l->machine_netns);
	free(l->server_netns);
}

struct sched_start_args {
	struct launcher *l;
	const struct config *cfg;
};

static int sched_start_fn(void *arg)
{
	struct sched_start_args *a = arg;

	return rdv_scheduler_start(a->l->sched_addr, 0, a->cfg, transport_tcp(), &a->l->sched,
				   &a->l->port);
}

/* Starts the in-process scheduler and the thread that waits for it.
 * Returns 0, or -1 after printing why (with nothing left running). */
static int sched_start(struct launcher *l, const struct config *cfg)
{
	int rc;

	struct sched_start_args args = { l, cfg };

	log_set_identity("scheduler", -1);
	rc = netns_run(l->sched_netns >= 0 ? &l->netns[l->sched_netns] : NULL, sched_start_fn, &args);
	if (rc == NETNS_NOT_ENTERED)
		return -1;
	if (rc < 0) {
		fprintf(stderr, "unisum launch: cannot start the scheduler on %s: %s\n",
			l->sched_addr, unisum_strerror(rc));
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

int launch_main(int argc, char **argv)
{
	struct sigaction ignore = { .sa_handler = SIG_IGN };
	struct launcher *l;
	struct config cfg;
	sigset_t handled;
	int status = 1;
	int rc;

	/* On the heap, because a waiter thread that never returns keeps using
	 * it after launch_main() did (see sched_finish()). */
	l = calloc(1, sizeof(*l));
	if (!l) {
		fprintf(stderr, "unisum launch: out of memory\n");
		return 1;
	}
	l->sigfd = -1;
	l->devnull = -1;
	l->sched_netns = -1;
	l->waiter_pipe[0] = l->waiter_pipe[1] = -1;
	l->self = getpid();

	rc = options_parse(l, argc, argv);
	if (rc != 0) {
		status = rc > 0 ? 0 : LAUNCH_EXIT_USAGE;
		goto out_free_fds;
	}

	/* The job's identity and shape, from the options and the
	 * environment, before any thread exists (they edit environ). */
	if (job_id_choose(l) < 0) {
		status = LAUNCH_EXIT_USAGE;
		goto out_free_fds;
	}
	if (l->one_machine) {
		if (machine_config(l) < 0) {
			status = LAUNCH_EXIT_USAGE;
			goto out_free_fds;
		}
		/* No scheduler here: nothing to wait for. */
		l->sched_done = true;
	} else {
		rc = job_config(l, &cfg);
		if (rc != 0) {
			status = rc;
			goto out_free_fds;
		}
		if (netns_setup(l) < 0) {
			status = LAUNCH_EXIT_USAGE;
			goto out_free_fds;
		}
	}

	stdio_ensure();
	fflush(stdout);
	if (fds_snapshot(l) < 0) {
		fprintf(stderr, "unisum launch: out of memory\n");
		goto out_free_fds;
	}

	/* Block the signals we watch before any thread exists, so that every
	 * thread inherits the mask and they only arrive on the signalfd. */
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
		goto out_free_fds;
	}
	l->devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
	if (l->devnull < 0) {
		fprintf(stderr, "unisum launch: cannot open /dev/null: %s\n", strerror(errno));
		goto out_close_sigfd;
	}
	if (pipe2(l->waiter_pipe, O_CLOEXEC | O_NONBLOCK) < 0) {
		fprintf(stderr, "unisum launch: pipe: %s\n", strerror(errno));
		goto out_close_devnull;
	}
	l->nchildren = l->one_machine ? l->local_size : l->num_servers + l->num_workers;
	l->children = calloc((size_t)l->nchildren, sizeof(*l->children));
	if (!l->children) {
		fprintf(stderr, "unisum launch: out of memory for %d processes\n", l->nchildren);
		goto out_close_waiter_pipe;
	}
	for (int i = 0; i < l->nchildren; i++) {
		struct child *c = &l->children[i];

		c->netns = -1;
		if (l->one_machine) {
			c->role = CHILD_WORKER;
			c->rank = l->machine * l->local_size + i;
		} else {
			c->role = i < l->num_servers ? CHILD_SERVER : CHILD_WORKER;
			c->rank = i < l->num_servers ? i : i - l->num_servers;
			if (l->nnetns > 0)
				c->netns = c->role == CHILD_SERVER ? l->server_netns[c->rank]
					   : l->machine_netns[c->rank / l->local_size];
		}
		snprintf(c->prefix, sizeof(c->prefix), "[%s %d] ", role_name(c->role), c->rank);
		c->out.fd = c->err.fd = -1;
		c->out.out_fd = STDOUT_FILENO;
		c->err.out_fd = STDERR_FILENO;
	}

	shm_sweep_stale();
	if (!l->one_machine && sched_start(l, &cfg) < 0)
		goto out_free_children;
	announce(l);

	l->start_ms = timing_now_ms();
	l->job_started = true;
	for (int i = 0; i < l->nchildren; i++) {
		struct child *c = &l->children[i];

		rc = child_spawn(l, c);
		if (rc < 0) {
			job_fail(l, 1, "cannot start %s %d: %s; stopping the job",
				 role_name(c->role), c->rank, strerror(-rc));
			break;
		}
	}

	rc = loop_run(l);
	if (rc < 0) {
		/* poll() itself failed: nothing can be watched any more. */
		job_fail(l, 1, "poll: %s; stopping the job", strerror(-rc));
		children_signal(l, SIGKILL);
		for (int i = 0; i < l->nchildren; i++)
			if (l->children[i].running)
				waitpid(l->children[i].pid, NULL, 0);
	}
	output_finish(l);
	sched_finish(l);
	shm_finish(l);
	status = l->stopping ? l->exit_status : 0;
	if (l->sched && l->sched_done)
		rdv_scheduler_free(l->sched);

	if (l->sched_abandoned) {
		/* The waiter thread still holds `l` and its pipe: leave both
		 * to the process exit that follows. */
		free(l->children);
		return status;
	}

out_free_children:
	free(l->children);
out_close_waiter_pipe:
	close(l->waiter_pipe[0]);
	close(l->waiter_pipe[1]);
out_close_devnull:
	close(l->devnull);
out_close_sigfd:
	close(l->sigfd);
out_free_fds:
	netns_free(l);
	free(l->entry_fds);
	free(l);
	return status;
}
