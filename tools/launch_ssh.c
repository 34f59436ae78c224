/*
 * launch_ssh.c - a job over ssh, as `horovodrun -H` and BytePS's
 * dist_launcher run one (issue 21):
 *
 *   unisum launch -H h1:4,h2:4 [--ssh-args ARGS] [--start-timeout SEC] -- CMD
 *   unisum launch --hostfile FILE ...     (OpenMPI's "host slots=N" lines)
 *
 * The scheduler runs inside this launcher; every host is a node of the job
 * (launch_node.c): `slots` workers and a colocated server, started by
 *
 *   ssh -o BatchMode=yes -o ConnectTimeout=SEC [ARGS] host \
 *       cd CWD && exec env VARS... UNISUM launch --remote --nproc-per-node S \
 *       --nnodes N --node-rank I --master-addr A --master-port P -- CMD
 *
 * with the system's OpenSSH client.  The job's secret travels on ssh's
 * stdin, one line, never on a command line that `ps` shows; the remote
 * launcher keeps reading its stdin and stops its node when it ends, which
 * is what happens when this launcher stops the ssh client or the
 * connection is lost: nothing keeps running on a host whose ssh is gone.
 * VARS are this environment's UNISUM_*, BYTEPS_*, DMLC_* knobs (not those
 * a node sets itself), PATH, PYTHONPATH and LD_LIBRARY_PATH; UNISUM is this
 * program's own path, which the hosts share (one build on a shared file
 * system, or the same install everywhere).
 */
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "launch.h"
#include "shellwords.h"

extern char **environ;

/* Most hosts of a job. */
#define LAUNCH_HOSTS_MAX 2048

int launch_host_add(void *arg, const char *name, size_t len, const char *slots, const char *from)
{
	struct launcher *l = arg;
	char *end;
	long n = 1;

	if (len == 0 || len >= sizeof(l->hosts[0].name) || name[0] == '-') {
		fprintf(stderr, "unisum launch: %s: '%.*s' is not a host name\n", from, (int)len, name);
		return -1;
	}
	if (slots) {
		errno = 0;
		n = strtol(slots, &end, 10);
		if (errno || end == slots || (*end && *end != ',' && !isspace((unsigned char)*end)) ||
		    n < 1 || n > 1024) {
			fprintf(stderr, "unisum launch: %s: host %.*s needs a number of slots from 1 "
				"to 1024\n", from, (int)len, name);
			return -1;
		}
	}
	if (l->nhosts == LAUNCH_HOSTS_MAX) {
		fprintf(stderr, "unisum launch: %s: more than %d hosts\n", from, LAUNCH_HOSTS_MAX);
		return -1;
	}
	struct launch_host *grown = realloc(l->hosts, (size_t)(l->nhosts + 1) * sizeof(*grown));
	if (!grown) {
		fprintf(stderr, "unisum launch: out of memory\n");
		return -1;
	}
	l->hosts = grown;
	memcpy(l->hosts[l->nhosts].name, name, len);
	l->hosts[l->nhosts].name[len] = '\0';
	l->hosts[l->nhosts].slots = (int)n;
	l->nhosts++;
	return 0;
}

/* -H host[:slots],... (or --server-hosts host,..., `option`) */
static int hosts_parse_list(struct launcher *l, const char *list, const char *option)
{
	const char *p = list;

	while (*p) {
		const char *comma = strchr(p, ',');
		size_t len = comma ? (size_t)(comma - p) : strlen(p);
		const char *colon = memchr(p, ':', len);

		if (launch_host_add(l, p, colon ? (size_t)(colon - p) : len, colon ? colon + 1 : NULL, option) < 0)
			return -1;
		if (!comma)
			break;
		p = comma + 1;
		if (!*p) {
			fprintf(stderr, "unisum launch: %s ends with a comma: '%s'\n", option, list);
			return -1;
		}
	}
	return 0;
}

/* --hostfile: "host [slots=N]" per line (OpenMPI's and Horovod's format),
 * "host:N" too; '#' starts a comment. */
static int hosts_parse_file(struct launcher *l, const char *path)
{
	FILE *f = fopen(path, "r");
	char line[1024], from[PATH_MAX + 32];
	int lineno = 0, rc = 0;

	if (!f) {
		fprintf(stderr, "unisum launch: --hostfile %s: %s\n", path, strerror(errno));
		return -1;
	}
	while (rc == 0 && fgets(line, sizeof(line), f)) {
		char *p = line, *hash = strchr(line, '#'), *slots;
		size_t len;

		lineno++;
		if (hash)
			*hash = '\0';
		while (isspace((unsigned char)*p))
			p++;
		if (!*p)
			continue;
		len = strcspn(p, " \t\r\n:");
		slots = strstr(p + len, " slots=");	/* not max_slots= */
		if (!slots)
			slots = strstr(p + len, "\tslots=");
		snprintf(from, sizeof(from), "%s:%d", path, lineno);
		if (p[len] == ':')
			slots = p + len + 1;
		else if (slots)
			slots += strlen(" slots=");
		rc = launch_host_add(l, p, len, slots, from);
	}
	fclose(f);
	if (rc == 0 && l->nhosts == 0) {
		fprintf(stderr, "unisum launch: --hostfile %s names no host\n", path);
		return -1;
	}
	return rc;
}

int launch_hosts_setup(struct launcher *l)
{
	if (l->hosts_opt && l->hostfile_opt) {
		fprintf(stderr, "unisum launch: give -H or --hostfile, not both\n");
		return -1;
	}
	if ((l->hosts_opt ? hosts_parse_list(l, l->hosts_opt, "-H")
			  : hosts_parse_file(l, l->hostfile_opt)) < 0)
		return -1;
	int n = l->nhosts;
	if (n == 0) {
		fprintf(stderr, "unisum launch: -H names no host\n");
		return -1;
	}
	if (l->server_hosts_opt) {
		/* CPU-only servers: hosts after the nodes, with no slots. */
		if (strchr(l->server_hosts_opt, ':')) {
			fprintf(stderr, "unisum launch: --server-hosts takes hosts without slots: each "
				"runs one server\n");
			return -1;
		}
		if (hosts_parse_list(l, l->server_hosts_opt, "--server-hosts") < 0)
			return -1;
	}
	for (int i = 1; i < n; i++) {
		if (l->hosts[i].slots != l->hosts[0].slots) {
			fprintf(stderr, "unisum launch: host %s has %d slots and %s %d: every host "
				"runs the same number of workers\n", l->hosts[i].name, l->hosts[i].slots,
				l->hosts[0].name, l->hosts[0].slots);
			return -1;
		}
	}
	launch_hosts_shape(l, n);
	if (l->start_timeout_s < 0)
		l->start_timeout_s = 30;
	return 0;
}

void launch_hosts_shape(struct launcher *l, int worker_hosts)
{
	l->nserver_hosts = l->nhosts - worker_hosts;
	l->local_size = l->hosts[0].slots;
	l->machines = worker_hosts;
	l->num_workers = worker_hosts * l->local_size;
	/* One per worker host, and the CPU-only ones. */
	l->num_servers = l->nhosts - (l->no_colocated ? worker_hosts : 0);
}

/* The host part of "[user@]host". */
static const char *host_of(const char *name)
{
	const char *at = strrchr(name, '@');

	return at ? at + 1 : name;
}

/* The first host's IPv4 address into ip and this host's on the route to
 * it into local (INET_ADDRSTRLEN each): over Slurm from its NodeAddr,
 * else from its name.  0, or -1 after printing why. */
static int host0_route(const struct launcher *l, char *ip, char *local)
{
	char addr[256];

	if (!l->slurm)
		snprintf(addr, sizeof(addr), "%s", host_of(l->hosts[0].name));
	else if (launch_slurm_node_addr(l->hosts[0].name, addr, sizeof(addr)) < 0)
		return -1;
	return launch_route_addr(addr, 22, ip, local);
}

int launch_hosts_sched_remote(struct launcher *l)
{
	char local[INET_ADDRSTRLEN];

	if (host0_route(l, l->sched_addr, local) < 0)
		return -1;
	l->port = 20000 + (int)((unsigned)(getpid() ^ time(NULL)) % 40000);
	l->sched_done = true;
	return 0;
}

int launch_hosts_sched_addr(struct launcher *l)
{
	char ip[INET_ADDRSTRLEN];
	const char *bind = getenv("UNISUM_BIND");
	struct in_addr a;

	if (!bind || !*bind)
		return host0_route(l, ip, l->sched_addr);
	/* The hosts are told this address, so it must be one they reach. */
	if (inet_pton(AF_INET, bind, &a) != 1 || a.s_addr == htonl(INADDR_ANY)) {
		fprintf(stderr, "unisum launch: UNISUM_BIND='%s' is not an IPv4 address the hosts "
			"can reach this one at (the scheduler listens there and every host is told "
			"it)\n", bind);
		return -1;
	}
	snprintf(l->sched_addr, sizeof(l->sched_addr), "%s", bind);
	return 0;
}

/* ---- the remote command ---------------------------------------------------- */

/* A string that grows; `failed` once out of memory. */
struct text {
	char *s;
	size_t len, cap;
	bool failed;
};

static void text_add(struct text *t, const char *s, size_t n)
{
	if (t->failed)
		return;
	if (t->len + n + 1 > t->cap) {
		size_t cap = (t->len + n + 1) * 2;
		char *grown = realloc(t->s, cap);

		if (!grown) {
			t->failed = true;
			return;
		}
		t->s = grown;
		t->cap = cap;
	}
	memcpy(t->s + t->len, s, n);
	t->len += n;
	t->s[t->len] = '\0';
}

static void text_str(struct text *t, const char *s)
{
	text_add(t, s, strlen(s));
}

/* Adds s in single quotes, for the remote shell (' as '\''), then a space. */
static void text_quoted(struct text *t, const char *s)
{
	text_str(t, "'");
	for (const char *q; (q = strchr(s, '\'')); s = q + 1) {
		text_add(t, s, (size_t)(q - s));
		text_str(t, "'\\''");
	}
	text_str(t, s);
	text_str(t, "' ");
}

/* Whether environ entry `var` travels to the hosts: a knob of the job,
 * not one that a launcher sets per child (launch_children.c's table) nor
 * one that stays here (launch_env_stays_here). */
static bool env_travels(const char *var)
{
	static const char *const knobs[] = { "UNISUM_", "BYTEPS_", "DMLC_", "PATH=", "PYTHONPATH=",
					     "LD_LIBRARY_PATH=", NULL };
	bool knob = false;

	for (const char *const *k = knobs; *k && !knob; k++)
		knob = strncmp(var, *k, strlen(*k)) == 0;
	return knob && !launch_env_stays_here(var) && !launch_env_set_per_child(var);
}

bool launch_env_stays_here(const char *var)
{
	static const char *const own[] = {
		"UNISUM_SECRET=", "UNISUM_SECRET_FILE=", "UNISUM_JOB_ID=", "UNISUM_BIND=",
		"UNISUM_PORT=", "DMLC_PS_ROOT_URI=", "DMLC_PS_ROOT_PORT=", "DMLC_NUM_WORKER=",
		"DMLC_NUM_SERVER=", "DMLC_PORT=", NULL,
	};

	for (const char *const *o = own; *o; o++)
		if (strncmp(var, *o, strlen(*o)) == 0)
			return true;
	return false;
}

/* "cd CWD && exec env VARS... UNISUM " into t. */
static void remote_prefix(struct text *t)
{
	char self[PATH_MAX], cwd[PATH_MAX];

	if (!realpath("/proc/self/exe", self))
		snprintf(self, sizeof(self), "unisum");
	text_str(t, "cd ");
	text_quoted(t, getcwd(cwd, sizeof(cwd)) ? cwd : "/");
	text_str(t, "&& exec env ");
	for (char **e = environ; *e; e++)
		if (env_travels(*e))
			text_quoted(t, *e);
	text_quoted(t, self);
}

/* "-- CMD ARGS..." into t; t's text (the caller frees it), or NULL when
 * out of memory. */
static char *remote_command_end(struct text *t, const struct launcher *l)
{
	text_str(t, "-- ");
	for (char **a = l->cmd; *a; a++)
		text_quoted(t, *a);
	if (t->failed) {
		free(t->s);
		return NULL;
	}
	return t->s;
}

/* Elastic (launch_elastic.c): one worker of CMD on a host, as a node of
 * one worker and no server (`launch --remote --nproc-per-node 1
 * --no-colocated-servers`); node_rank only names it (the worker's rank is
 * the scheduler's, UNISUM_ELASTIC travels). */
static char *remote_worker_command(const struct launcher *l, int node_rank)
{
	struct text t = { 0 };
	char num[160];

	remote_prefix(&t);
	snprintf(num, sizeof(num), "launch --remote --nproc-per-node 1 --node-rank %d --nnodes %d "
		 "--no-colocated-servers --cpu-servers %d --master-addr ", node_rank, node_rank + 1,
		 l->num_servers);
	text_str(&t, num);
	text_quoted(&t, l->sched_addr);
	snprintf(num, sizeof(num), "--master-port %d ", l->port);
	text_str(&t, num);
	if (l->no_secret)
		text_str(&t, "--no-secret ");
	return remote_command_end(&t, l);
}

char *launch_remote_command(const struct launcher *l, int rank)
{
	struct text t = { 0 };
	char num[64];

	remote_prefix(&t);
	int nodes = l->nhosts - l->nserver_hosts;
	if (rank < nodes) {
		snprintf(num, sizeof(num), "launch --remote --nproc-per-node %d ", l->local_size);
		text_str(&t, num);
		snprintf(num, sizeof(num), "--node-rank %d ", rank);
	} else {
		text_str(&t, "launch --remote --server-only ");
		num[0] = '\0';
	}
	text_str(&t, num);
	snprintf(num, sizeof(num), "--cpu-servers %d ", l->nserver_hosts);
	text_str(&t, num);
	snprintf(num, sizeof(num), "--nnodes %d ", nodes);
	text_str(&t, num);
	text_str(&t, "--master-addr ");
	text_quoted(&t, l->sched_addr);
	snprintf(num, sizeof(num), "--master-port %d ", l->port);
	text_str(&t, num);
	if (l->no_secret)
		text_str(&t, "--no-secret ");
	if (l->no_colocated)
		text_str(&t, "--no-colocated-servers ");
	if (l->sched_on_host && rank == 0)
		text_str(&t, "--run-scheduler ");
	if (rank < nodes)	/* a CPU-only server runs no command */
		return remote_command_end(&t, l);
	if (t.failed) {
		free(t.s);
		return NULL;
	}
	return t.s;
}

int launch_transport_argv(struct child *c, const char *const *pre, const char *extra,
			  const char *const *post, char *mem, char *remote)
{
	char *args = extra ? strdup(extra) : NULL;
	size_t n = 0, cap = 1;
	char **argv = NULL;

	if (!mem || !remote || (extra && !args))
		goto out_nomem;
	for (const char *const *p = pre; *p; p++)
		cap++;
	for (const char *const *p = post; *p; p++)
		cap++;
	int words = args ? shellwords_split(args, NULL) : 0;
	if (words < 0)	/* launch_options_check refused it already */
		goto out_nomem;
	argv = calloc(cap + (size_t)words, sizeof(*argv));
	if (!argv)
		goto out_nomem;
	for (const char *const *p = pre; *p; p++)
		argv[n++] = (char *)*p;
	if (args)
		n += (size_t)shellwords_split(args, argv + n);
	for (const char *const *p = post; *p; p++)
		argv[n++] = (char *)*p;
	argv[n] = NULL;
	c->argv = argv;
	c->argv_mem[0] = mem;
	c->argv_mem[1] = args;
	c->argv_mem[2] = remote;
	return 0;

out_nomem:
	free(args);
	free(mem);
	free(remote);
	return -ENOMEM;
}

int launch_ssh_argv(struct launcher *l, struct child *c)
{
	char timeout[64];
	char *remote = c->ehost[0] ? remote_worker_command(l, c->rank)
				   : launch_remote_command(l, c->rank);

	/* 0: no limit, as ssh's own ConnectTimeout 0. */
	snprintf(timeout, sizeof(timeout), "ConnectTimeout=%d",
		 l->start_timeout_s > 1e6 ? 1000000 : (int)l->start_timeout_s);
	char *connect = strdup(timeout);
	/* No shared master connection that would outlive the job. */
	const char *const pre[] = { "ssh", "-o", "BatchMode=yes", "-o", connect, "-o",
				    "ControlPath=none", NULL };
	/* No pty, whatever the user's config says: it would echo the secret
	 * and keep stdin's end from reaching the remote launcher. */
	const char *const post[] = { "-T", c->ehost[0] ? c->ehost : l->hosts[c->rank].name, remote,
				     NULL };

	return launch_transport_argv(c, pre, l->ssh_args_opt, post, connect, remote);
}

void launch_ssh_free(struct child *c)
{
	free(c->argv);
	for (int i = 0; i < 3; i++) {
		free(c->argv_mem[i]);
		c->argv_mem[i] = NULL;
	}
	c->argv = NULL;
}

int launch_remote_secret(void)
{
	char line[512];
	size_t n = 0;

	for (;;) {
		char ch;
		ssize_t r = read(STDIN_FILENO, &ch, 1);

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			fprintf(stderr, "unisum launch --remote: the job's secret did not come on "
				"stdin (the launcher that started this node over ssh sends it)\n");
			return -1;
		}
		if (ch == '\n')
			break;
		if (n + 1 >= sizeof(line)) {
			fprintf(stderr, "unisum launch --remote: the secret on stdin is too long\n");
			return -1;
		}
		line[n++] = ch;
	}
	line[n] = '\0';
	unsetenv("UNISUM_SECRET_FILE");
	if (n == 0)
		unsetenv("UNISUM_SECRET");
	else if (setenv("UNISUM_SECRET", line, 1) != 0)
		return -1;
	explicit_bzero(line, sizeof(line));
	return 0;
}
