/*
 * launch_slurm.c - a job inside a Slurm allocation (issue 21), run once in
 * an sbatch script or under salloc:
 *
 *   unisum launch --slurm [--nproc-per-node L] [--cpu-server-nodes K]
 *                 [--srun-args ARGS] -- CMD
 *
 * It is the ssh form (launch_ssh.c) with srun as the transport: the
 * allocation's nodes (SLURM_JOB_NODELIST, expanded by hostlist.c) are the
 * hosts, in Slurm's order, so a node's index is what SLURM_NODEID would
 * say; each runs L workers (--nproc-per-node, else SLURM_NTASKS_PER_NODE,
 * else 1) and a colocated server, and the last K nodes run one CPU-only
 * server each.  The scheduler runs inside this launcher.  Every node is
 * started by its own job step,
 *
 *   srun --nodes=1 --ntasks=1 --nodelist=NODE --overlap [ARGS] \
 *        /bin/sh -c 'cd CWD && exec env VARS... UNISUM launch --remote ...'
 *
 * so that each has its own stdin (the secret, then EOF to stop it), its
 * own output prefix and its own exit status, as a host over ssh has.  srun
 * exports this environment to the step (less the job's own identity and
 * its secret), as Slurm users expect: modules, PATH, CUDA settings.
 * `scancel` signals every step and this launcher (the batch script's, or
 * salloc's child): everything stops.
 */
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hostlist.h"
#include "launch.h"

static int node_add(void *arg, const char *name)
{
	return launch_host_add(arg, name, strlen(name), NULL, "SLURM_JOB_NODELIST");
}

int launch_slurm_setup(struct launcher *l, int nproc)
{
	const char *job = getenv("SLURM_JOB_ID");
	const char *list = getenv("SLURM_JOB_NODELIST");
	const char *per_node = getenv("SLURM_NTASKS_PER_NODE");
	char err[512];
	int k = 0;

	if (!job || !*job) {
		fprintf(stderr, "unisum launch: --slurm runs inside a Slurm allocation, and "
			"SLURM_JOB_ID is not set: run it in an sbatch script or under salloc\n");
		return -1;
	}
	if (!list || !*list)
		list = getenv("SLURM_NODELIST");
	if (!list || !*list) {
		fprintf(stderr, "unisum launch: --slurm: SLURM_JOB_NODELIST is not set in "
			"job %s\n", job);
		return -1;
	}
	if (hostlist_expand(list, node_add, l, err, sizeof(err)) != 0) {
		if (err[0])
			fprintf(stderr, "unisum launch: SLURM_JOB_NODELIST: %s\n", err);
		return -1;
	}
	if (l->cpu_server_nodes_opt) {
		char *end;

		errno = 0;
		long v = strtol(l->cpu_server_nodes_opt, &end, 10);
		if (errno || end == l->cpu_server_nodes_opt || *end || v < 0 || v >= l->nhosts) {
			fprintf(stderr, "unisum launch: --cpu-server-nodes needs a number of nodes from "
				"0 to %d (the allocation has %d; at least one runs workers), got '%s'\n",
				l->nhosts - 1, l->nhosts, l->cpu_server_nodes_opt);
			return -1;
		}
		k = (int)v;
	}
	/* Workers per node: --nproc-per-node, else what the allocation asked
	 * for per node, else one. */
	int slots = nproc;
	if (slots == 0 && per_node && *per_node) {
		char *end;

		errno = 0;
		long v = strtol(per_node, &end, 10);
		if (errno || end == per_node || *end || v < 1 || v > 1024) {
			fprintf(stderr, "unisum launch: SLURM_NTASKS_PER_NODE='%s' is not a number of "
				"workers per node (1 to 1024): pass --nproc-per-node\n", per_node);
			return -1;
		}
		slots = (int)v;
	}
	for (int i = 0; i < l->nhosts; i++)
		l->hosts[i].slots = slots > 0 ? slots : 1;
	l->slurm = true;
	launch_hosts_shape(l, l->nhosts - k);
	return 0;
}

/* Node 0's address as this host reaches it: its name resolved, else the
 * NodeAddr Slurm knows it by (slurm.conf may give names no resolver
 * knows). */
static int node_addr(const char *name, char *out, size_t len)
{
	struct addrinfo hints = { .ai_family = AF_INET, .ai_socktype = SOCK_STREAM }, *res;
	char cmd[HOSTLIST_NAME_MAX + 64], line[1024];
	FILE *p;

	if (getaddrinfo(name, NULL, &hints, &res) == 0) {
		freeaddrinfo(res);
		snprintf(out, len, "%s", name);
		return 0;
	}
	for (const char *c = name; *c; c++) {
		if (!isalnum((unsigned char)*c) && !strchr("._-", *c))
			return -1;
	}
	snprintf(cmd, sizeof(cmd), "scontrol show node -o %s 2>/dev/null", name);
	p = popen(cmd, "r");
	if (!p)
		return -1;
	int rc = -1;
	if (fgets(line, sizeof(line), p)) {
		const char *a = strstr(line, " NodeAddr=");

		if (a) {
			a += strlen(" NodeAddr=");
			snprintf(out, len, "%.*s", (int)strcspn(a, " \n"), a);
			rc = out[0] ? 0 : -1;
		}
	}
	pclose(p);
	return rc;
}

int launch_slurm_sched_addr(struct launcher *l)
{
	char addr[256], ip[INET_ADDRSTRLEN];
	const char *bind = getenv("UNISUM_BIND");

	if (bind && *bind) {
		struct in_addr a;

		if (inet_pton(AF_INET, bind, &a) != 1) {
			fprintf(stderr, "unisum launch: UNISUM_BIND='%s' is not an IPv4 address\n",
				bind);
			return -1;
		}
		snprintf(l->sched_addr, sizeof(l->sched_addr), "%s", bind);
		return 0;
	}
	if (node_addr(l->hosts[0].name, addr, sizeof(addr)) < 0) {
		fprintf(stderr, "unisum launch: node %s of the allocation has no address (its name "
			"does not resolve, and `scontrol show node` gives no NodeAddr): set "
			"UNISUM_BIND to this host's address the nodes reach\n", l->hosts[0].name);
		return -1;
	}
	return launch_route_addr(addr, 6817, ip, l->sched_addr);
}

int launch_srun_argv(struct launcher *l, struct child *c)
{
	char *remote = launch_remote_command(l, c->rank);
	char *nodelist = malloc(sizeof(l->hosts[0].name) + 16);

	if (nodelist)
		snprintf(nodelist, sizeof(l->hosts[0].name) + 16, "--nodelist=%s",
			 l->hosts[c->rank].name);
	const char *const pre[] = { "srun", NULL };
	/* One task on this node; other steps (the user's, a debugger) may
	 * share it. */
	const char *const post[] = { "--nodes=1", "--ntasks=1", nodelist, "--overlap", "/bin/sh",
				     "-c", remote, NULL };

	return launch_transport_argv(c, pre, l->srun_args_opt, post, nodelist, remote);
}
