/*
 * launch_sched.c - `unisum launch --scheduler`: the scheduler role alone,
 * as its own process, restarted on this host when it dies (issue 52).
 *
 * A job's other launchers keep the scheduler inside themselves, where it
 * dies only with the launcher (and the launcher's children with it).  A
 * scheduler that should outlive a crash runs as `unisum scheduler`, a
 * child of this launcher: when it dies of a signal (SIGKILL, a crash, the
 * OOM killer) the launcher starts another at once on the same address,
 * and the job's nodes, which wait UNISUM_TIMEOUT_MS for it, resume with
 * it (rendezvous/sched_resume.c).  An exit is the job's end: 0 when the
 * job finished, else the failure the scheduler told every node, and the
 * launcher exits with that status.  More than LAUNCH_SCHED_RESTARTS deaths
 * within a minute stop it (a scheduler that cannot live).  SIGINT and
 * SIGTERM pass to the scheduler, which then ends the job.  The role's
 * variables are the scheduler's (UNISUM_SCHEDULER_PORT, UNISUM_BIND,
 * UNISUM_NUM_WORKER, ...): it is what a Kubernetes pod or a systemd unit
 * runs (deploy/kubernetes/scheduler.yaml).
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "launch.h"

#define LAUNCH_SCHED_RESTARTS 10	/* deaths a minute before giving up */

static volatile sig_atomic_t sched_child, sched_stopping;

static void sched_forward(int sig)
{
	sched_stopping = sig;
	if (sched_child > 0)
		kill((pid_t)sched_child, sig);
}

/* Starts `self scheduler` as a child (it dies with this launcher). */
static pid_t sched_spawn(const char *self)
{
	pid_t parent = getpid();
	pid_t pid = fork();
	if (pid == 0) {
		sigset_t none;	/* the parent blocks its stops around the fork */
		sigemptyset(&none);
		sigprocmask(SIG_SETMASK, &none, NULL);
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(1);
		setenv("UNISUM_ROLE", "scheduler", 1);
		execl(self, "unisum", "scheduler", (char *)NULL);
		fprintf(stderr, "unisum launch: cannot run %s scheduler: %s\n", self, strerror(errno));
		_exit(127);
	}
	return pid;
}

int launch_scheduler_role(void)
{
	char self[4096];
	ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
	if (n <= 0) {
		perror("unisum launch: readlink /proc/self/exe");
		return 1;
	}
	self[n] = '\0';
	struct sigaction sa = {.sa_handler = sched_forward};
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	signal(SIGCHLD, SIG_DFL);	/* waitpid needs its children's status */
	sigset_t stops, old;
	sigemptyset(&stops);
	sigaddset(&stops, SIGINT);
	sigaddset(&stops, SIGTERM);
	time_t deaths[LAUNCH_SCHED_RESTARTS];
	int ndeaths = 0;
	for (;;) {
		/* A stop asked for while no child runs is not lost: the child
		 * is known before the handler can run again. */
		sigprocmask(SIG_BLOCK, &stops, &old);
		pid_t pid = sched_stopping ? 0 : sched_spawn(self);
		sched_child = pid;
		sigprocmask(SIG_SETMASK, &old, NULL);
		if (pid == 0)
			return 128 + sched_stopping;
		if (pid < 0) {
			perror("unisum launch: fork");
			return 1;
		}
		int status = 0, w;
		while ((w = waitpid(pid, &status, 0)) < 0 && errno == EINTR)
			;
		sched_child = 0;
		if (w < 0) {
			perror("unisum launch: waitpid");
			return 1;
		}
		if (WIFEXITED(status))
			return WEXITSTATUS(status);
		if (sched_stopping)
			return 128 + WTERMSIG(status);	/* it was told to stop */
		time_t now = time(NULL);
		if (ndeaths == LAUNCH_SCHED_RESTARTS && now - deaths[0] < 60) {
			fprintf(stderr, "unisum launch: the scheduler (pid %d) was killed by signal %d "
				"(%s), its %dth death within a minute: not restarting it\n", (int)pid,
				WTERMSIG(status), strsignal(WTERMSIG(status)), LAUNCH_SCHED_RESTARTS + 1);
			return 128 + WTERMSIG(status);
		}
		if (ndeaths == LAUNCH_SCHED_RESTARTS)
			memmove(deaths, deaths + 1, (LAUNCH_SCHED_RESTARTS - 1) * sizeof *deaths);
		else
			ndeaths++;
		deaths[ndeaths - 1] = now;
		fprintf(stderr, "unisum launch: the scheduler (pid %d) was killed by signal %d (%s): "
			"starting another on the same address; the nodes wait UNISUM_TIMEOUT_MS for it\n",
			(int)pid, WTERMSIG(status), strsignal(WTERMSIG(status)));
	}
}
