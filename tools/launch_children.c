/*
 * launch_children.c - the server and worker processes of `unisum launch`:
 * who they are, the environment each gets, how each is started, and how
 * they are signalled.
 *
 * Each child gets its own process group (so that SIGTERM reaches whatever
 * it spawned, and Ctrl-C on the terminal reaches only the launcher, which
 * then stops the job in order), PR_SET_PDEATHSIG(SIGKILL) so that it does
 * not outlive a launcher killed with SIGKILL, stdin from /dev/null (a
 * background process group reading the terminal would be stopped), the
 * signal mask and SIGPIPE disposition the launcher started with, and no
 * file descriptor opened since launch_main() began (the scheduler's
 * sockets).  The child environment is built before fork(): the scheduler's
 * threads are running, so the child calls only async-signal-safe functions
 * until exec.
 */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include "launch.h"

extern char **environ;

/* The child environment: environ minus the names we set, plus ours. */
#define LAUNCH_ENV_OWN 28
struct child_env {
	char **envp;				/* NULL-terminated, for execve */
	char vars[LAUNCH_ENV_OWN][96];		/* storage of our NAME=value strings */
};

/* Which form of the launcher sets (or clears) a variable for its children. */
enum env_scope {
	ENV_MACHINE,	/* both forms: the job form and one machine (--nproc-per-node),
			 * which inherits the job's shape and address */
	ENV_JOB,	/* the job form only */
	ENV_NETNS,	/* the job form when it places processes in namespaces */
	ENV_RACKS,	/* the job form with --worker-racks or --server-racks */
	ENV_SERVER,	/* the forms that start servers: the job form, a node */
	ENV_TORCH,	/* where launch_torch_master() chose torchrun's master */
};

/* The variables the launcher sets (or clears) for its children. */
static const struct {
	const char *name;
	enum env_scope scope;
} env_own[] = {
	{ "UNISUM_ROLE", ENV_MACHINE },
	{ "DMLC_ROLE", ENV_MACHINE },
	{ "UNISUM_LOCAL_RANK", ENV_MACHINE },
	{ "BYTEPS_LOCAL_RANK", ENV_MACHINE },
	{ "UNISUM_LOCAL_SIZE", ENV_MACHINE },
	{ "BYTEPS_LOCAL_SIZE", ENV_MACHINE },
	{ "UNISUM_LAUNCHED", ENV_MACHINE },
	{ "UNISUM_NUM_WORKER", ENV_JOB },
	{ "UNISUM_NUM_SERVER", ENV_JOB },
	{ "UNISUM_SCHEDULER_HOST", ENV_JOB },
	{ "UNISUM_SCHEDULER_PORT", ENV_JOB },
	{ "UNISUM_WORKER_ID", ENV_JOB },
	{ "DMLC_WORKER_ID", ENV_JOB },
	{ "UNISUM_SERVER_ID", ENV_SERVER },
	{ "UNISUM_RACK", ENV_RACKS },
	{ "UNISUM_NODE_HOST", ENV_NETNS },
	{ "DMLC_NODE_HOST", ENV_NETNS },
	/* What Horovod's and torchrun's programs read (workers). */
	{ "HOROVOD_RANK", ENV_MACHINE },
	{ "HOROVOD_SIZE", ENV_MACHINE },
	{ "HOROVOD_LOCAL_RANK", ENV_MACHINE },
	{ "HOROVOD_LOCAL_SIZE", ENV_MACHINE },
	{ "HOROVOD_CROSS_RANK", ENV_MACHINE },
	{ "HOROVOD_CROSS_SIZE", ENV_MACHINE },
	{ "RANK", ENV_MACHINE },
	{ "WORLD_SIZE", ENV_MACHINE },
	{ "LOCAL_RANK", ENV_MACHINE },
	{ "LOCAL_WORLD_SIZE", ENV_MACHINE },
	{ "MASTER_ADDR", ENV_TORCH },
	{ "MASTER_PORT", ENV_TORCH },
};
#define LAUNCH_ENV_OWN_COUNT (sizeof(env_own) / sizeof(env_own[0]))

const char *launch_role_name(int role)
{
	return role == CHILD_SERVER ? "server" : role == CHILD_SSH ? "host" : "worker";
}

int launch_children_init(struct launcher *l)
{
	/* A node of a multi-node job adds its colocated server, first. */
	int node_server = l->node_mode && !l->no_colocated ? 1 : 0;
	l->nchildren = l->nhosts > 0 ? l->nhosts : l->server_only ? 1
		       : l->one_machine ? node_server + l->local_size
		       : l->num_servers + l->num_workers;
	l->children = calloc((size_t)(l->cap_children > l->nchildren ? l->cap_children
								       : l->nchildren),
			     sizeof(*l->children));
	if (!l->children) {
		fprintf(stderr, "unisum launch: out of memory for %d processes\n", l->nchildren);
		return -1;
	}
	for (int i = 0; i < l->nchildren; i++) {
		struct child *c = &l->children[i];

		c->netns = -1;
		c->stdin_fd = -1;
		c->out.fd = c->err.fd = -1;
		c->out.out_fd = STDOUT_FILENO;
		c->err.out_fd = STDERR_FILENO;
		if (l->nhosts > 0) {
			c->role = CHILD_SSH;
			c->rank = i;
			snprintf(c->prefix, sizeof(c->prefix), "[%.64s] ", l->hosts[i].name);
			snprintf(c->name, sizeof(c->name), "host %d (%.64s)", i, l->hosts[i].name);
			continue;
		}
		if (l->server_only) {
			/* Its rank comes by arrival: the prefix has none. */
			c->role = CHILD_SERVER;
			c->rank = -1;
			snprintf(c->prefix, sizeof(c->prefix), "[cpu server] ");
			snprintf(c->name, sizeof(c->name), "cpu server");
			continue;
		}
		if (l->one_machine && i < node_server) {
			c->role = CHILD_SERVER;
			c->rank = l->machine;
		} else if (l->one_machine) {
			c->role = CHILD_WORKER;
			c->rank = l->machine * l->local_size + i - node_server;
		} else {
			c->role = i < l->num_servers ? CHILD_SERVER : CHILD_WORKER;
			c->rank = i < l->num_servers ? i : i - l->num_servers;
			if (l->nnetns > 0)
				c->netns = c->role == CHILD_SERVER ? l->server_netns[c->rank]
					   : l->machine_netns[c->rank / l->local_size];
		}
		snprintf(c->name, sizeof(c->name), "%s %d", launch_role_name(c->role), c->rank);
		snprintf(c->prefix, sizeof(c->prefix), "[%.64s] ", c->name);
	}
	return 0;
}

/* ---- descriptors --------------------------------------------------------- */

int launch_fds_snapshot(struct launcher *l)
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

/* ---- environments -------------------------------------------------------- */

/* Whether this launcher sets (or clears) the variables of `scope` for its
 * children. */
static bool env_scope_is_ours(const struct launcher *l, enum env_scope scope)
{
	switch (scope) {
	case ENV_MACHINE:
		return true;
	case ENV_JOB:
		return !l->one_machine;
	case ENV_NETNS:
		return !l->one_machine && l->nnetns > 0;
	case ENV_RACKS:
		return !l->one_machine && (l->machine_rack != NULL || l->server_rack != NULL);
	case ENV_SERVER:
		return !l->one_machine || l->node_mode;
	case ENV_TORCH:
		return l->torch_port > 0;
	}
	return false;
}

/* Whether environ entry `var` is one the launcher sets (or clears). */
static bool env_is_ours(const struct launcher *l, const char *var)
{
	for (size_t i = 0; i < LAUNCH_ENV_OWN_COUNT; i++) {
		size_t len = strlen(env_own[i].name);

		if (env_scope_is_ours(l, env_own[i].scope) &&
		    strncmp(var, env_own[i].name, len) == 0 && var[len] == '=')
			return true;
	}
	return false;
}

bool launch_env_set_per_child(const char *var)
{
	for (size_t i = 0; i < LAUNCH_ENV_OWN_COUNT; i++) {
		size_t len = strlen(env_own[i].name);

		if (strncmp(var, env_own[i].name, len) == 0 && var[len] == '=')
			return true;
	}
	return false;
}

void launch_env_clear(const struct launcher *l)
{
	for (size_t i = 0; i < LAUNCH_ENV_OWN_COUNT; i++)
		if ((!l->one_machine || env_own[i].scope == ENV_MACHINE ||
		     (l->node_mode && env_own[i].scope == ENV_SERVER)) &&
		    /* An elastic job listens where the user says (other hosts'
		     * workers reach it there). */
		    !(l->elastic && env_own[i].scope == ENV_NETNS))
			unsetenv(env_own[i].name);
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

/* Worker c's place in Horovod's and torchrun's names: its global rank
 * (machine x local_size + local rank, unisum_rank()'s), the job's size,
 * its local rank and size, and its machine (cross rank) among the
 * machines (cross size). */
static void env_add_ranks(const struct launcher *l, const struct child *c, struct child_env *env,
			  int *own)
{
	int L = l->local_size, local = c->rank % L;
	int machine = l->one_machine ? l->machine : c->rank / L;
	int rank = machine * L + local, size = l->machines * L;
	env_add(env, own, "HOROVOD_RANK=%d", rank);
	env_add(env, own, "HOROVOD_SIZE=%d", size);
	env_add(env, own, "HOROVOD_LOCAL_RANK=%d", local);
	env_add(env, own, "HOROVOD_LOCAL_SIZE=%d", L);
	env_add(env, own, "HOROVOD_CROSS_RANK=%d", machine);
	env_add(env, own, "HOROVOD_CROSS_SIZE=%d", l->machines);
	env_add(env, own, "RANK=%d", rank);
	env_add(env, own, "WORLD_SIZE=%d", size);
	env_add(env, own, "LOCAL_RANK=%d", local);
	env_add(env, own, "LOCAL_WORLD_SIZE=%d", L);
	if (l->torch_port > 0) {
		env_add(env, own, "MASTER_ADDR=%s", l->torch_addr);
		env_add(env, own, "MASTER_PORT=%d", l->torch_port);
	}
}

int launch_free_tcp_port(void)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_ANY) };
	socklen_t len = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), port = 0;

	if (fd < 0)
		return 0;
	if (bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
	    getsockname(fd, (struct sockaddr *)&a, &len) == 0)
		port = ntohs(a.sin_port);
	close(fd);
	return port;
}

void launch_torch_master(struct launcher *l)
{
	l->torch_port = 0;
	if (l->node_mode) {
		snprintf(l->torch_addr, sizeof(l->torch_addr), "%s", l->master_addr);
		l->torch_port = l->master_port < 65535 ? l->master_port + 1 : 0;
		return;
	}
	if (l->one_machine) {
		/* One machine of a job whose scheduler the environment names:
		 * what the user set stays; else the scheduler's address and
		 * port + 1, as a node's (rank 0's store beside the scheduler). */
		if (getenv("MASTER_ADDR") != NULL && getenv("MASTER_PORT") != NULL)
			return;
		snprintf(l->torch_addr, sizeof(l->torch_addr), "%s", l->sched_host);
		l->torch_port = l->sched_port > 0 && l->sched_port < 65535 ? l->sched_port + 1 : 0;
		return;
	}
	if (l->nhosts > 0 || l->elastic || l->slurm)
		return;
	const char *addr = l->nnetns > 0 && l->machine_netns != NULL
				   ? l->netns[l->machine_netns[0]].addr : "127.0.0.1";
	snprintf(l->torch_addr, sizeof(l->torch_addr), "%s", addr);
	l->torch_port = launch_free_tcp_port();
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
	/* ssh and srun never need the secret (stdin has it) nor the job's
	 * identity here; srun exports the rest to its step. */
	for (char **e = environ; *e; e++)
		if (!env_is_ours(l, *e) && !(c->role == CHILD_SSH && (launch_env_stays_here(*e) ||
		    (l->slurm && launch_slurm_env_sizes_tasks(*e)))))
			env->envp[used++] = *e;
	env->envp[used] = NULL;
	if (c->role == CHILD_SSH)
		return env;	/* the command carries what the node needs */

	/* UNISUM_JOB_ID is in environ already (see job_id_choose() in
	 * launch_job.c). */
	env_add(env, &own, "UNISUM_ROLE=%s", launch_role_name(c->role));
	env_add(env, &own, "UNISUM_LAUNCHED=1");
	if (c->role == CHILD_WORKER) {
		env_add(env, &own, "UNISUM_LOCAL_RANK=%d", c->rank % l->local_size);
		env_add(env, &own, "UNISUM_LOCAL_SIZE=%d", l->local_size);
		env_add_ranks(l, c, env, &own);
	}
	if (l->one_machine && c->role == CHILD_SERVER && !l->server_only)	/* a node's own */
		env_add(env, &own, "UNISUM_SERVER_ID=%d", c->rank);
	if (l->one_machine)
		return env;	/* the rest is the job's, inherited */

	env_add(env, &own, "UNISUM_NUM_WORKER=%d", l->machines);
	env_add(env, &own, "UNISUM_NUM_SERVER=%d", l->num_servers);
	env_add(env, &own, "UNISUM_SCHEDULER_HOST=%s", l->sched_addr);
	if (c->netns >= 0)
		env_add(env, &own, "UNISUM_NODE_HOST=%s", l->netns[c->netns].addr);
	env_add(env, &own, "UNISUM_SCHEDULER_PORT=%d", l->port);
	if (c->role == CHILD_WORKER && l->elastic)	/* ranked by arrival, then by the job */
		env_add(env, &own, "UNISUM_WORKER_ID=-1");
	else if (c->role == CHILD_WORKER)
		env_add(env, &own, "UNISUM_WORKER_ID=%d", c->rank / l->local_size);
	else
		env_add(env, &own, "UNISUM_SERVER_ID=%d", c->rank);
	if (c->role == CHILD_WORKER && l->machine_rack != NULL)
		env_add(env, &own, "UNISUM_RACK=%d", l->machine_rack[c->rank / l->local_size]);
	else if (c->role == CHILD_SERVER && l->server_rack != NULL)
		env_add(env, &own, "UNISUM_RACK=%d", l->server_rack[c->rank]);
	return env;
}

static void env_free(struct child_env *env)
{
	if (!env)
		return;
	free(env->envp);
	free(env);
}

/* ---- starting and signalling --------------------------------------------- */

/* Writes a string to fd 2 with async-signal-safe calls only. */
static void child_say(const char *s)
{
	ssize_t n = write(STDERR_FILENO, s, strlen(s));

	(void)n;
}

/* The child's side of fork(): async-signal-safe calls only, because the
 * scheduler's threads were running at fork() time.  Never returns. */
__attribute__((noreturn))
static void child_exec(const struct launcher *l, const struct child *c, int in_r, int out_w,
		       int err_w, char *const argv[], char *const envp[])
{
	struct sigaction dfl = { .sa_handler = SIG_DFL };
	const char *why;
	int err;

	setpgid(0, 0);
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	if (getppid() != l->self)
		_exit(1);	/* the launcher died before PDEATHSIG was armed */

	if (dup2(in_r, STDIN_FILENO) < 0 || dup2(out_w, STDOUT_FILENO) < 0 ||
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

/* Gives ssh (or srun) child c its stdin, the write end `fd` of its pipe,
 * and writes the job's secret on it as one line (the line fits the pipe:
 * this does not block). */
static void secret_send(struct launcher *l, struct child *c, int fd)
{
	size_t len = strlen(l->secret);
	char line[sizeof(l->secret) + 1];

	memcpy(line, l->secret, len);
	line[len] = '\n';
	c->stdin_fd = fd;
	if (write(c->stdin_fd, line, len + 1) != (ssize_t)(len + 1))
		fprintf(stderr, "unisum launch: cannot send host %d its secret: %s\n", c->rank,
			strerror(errno));
	explicit_bzero(line, sizeof(line));
}

int launch_child_spawn(struct launcher *l, struct child *c)
{
	static char *server_argv[] = { "unisum", "server", NULL };
	struct child_env *env;
	int out_pipe[2], err_pipe[2], in_pipe[2] = { -1, -1 };
	int rc = 0;
	pid_t pid;

	if (c->role == CHILD_SSH && !c->argv &&
	    (rc = (l->slurm ? launch_srun_argv : launch_ssh_argv)(l, c)) < 0)
		return rc;
	char *const *argv = c->role == CHILD_SERVER ? server_argv : c->role == CHILD_SSH ? c->argv
			    : l->cmd;
	env = env_build(l, c);
	if (!env)
		return -ENOMEM;
	/* An ssh child reads the secret, then waits for EOF (launch_ssh.c). */
	if (c->role == CHILD_SSH && pipe2(in_pipe, O_CLOEXEC) < 0) {
		rc = -errno;
		goto out_free_env;
	}
	if (pipe2(out_pipe, O_CLOEXEC) < 0) {
		rc = -errno;
		goto out_close_in_pipe;
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
		child_exec(l, c, in_pipe[0] >= 0 ? in_pipe[0] : l->devnull, out_pipe[1], err_pipe[1],
			   argv, env->envp);

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
	if (in_pipe[0] >= 0) {
		close(in_pipe[0]);
		secret_send(l, c, in_pipe[1]);
	}
	goto out_free_env;

out_close_out_pipe:
	close(out_pipe[0]);
	close(out_pipe[1]);
out_close_in_pipe:
	if (in_pipe[0] >= 0) {
		close(in_pipe[0]);
		close(in_pipe[1]);
	}
out_free_env:
	env_free(env);
	return rc;
}

void launch_children_signal(struct launcher *l, int sig)
{
	for (int i = 0; i < l->nchildren; i++) {
		struct child *c = &l->children[i];

		if (!c->running)
			continue;
		c->signalled = true;
		if (c->role == CHILD_SSH && sig == SIGTERM) {
			/* Its node stops at the end of its stdin (launch_ssh.c), and
			 * ssh exits once everything on the host is gone. */
			if (c->stdin_fd >= 0)
				close(c->stdin_fd);
			c->stdin_fd = -1;
			continue;
		}
		if (c->role == CHILD_SSH && sig == SIGKILL && l->slurm) {
			/* srun passes SIGTERM to every process of its step and
			 * ends it; a killed srun would leave the step running
			 * until the allocation ends. */
			kill(c->pid, SIGTERM);
			continue;
		}
		if (kill(-c->pid, sig) < 0)
			kill(c->pid, sig);
	}
}
