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

bool launch_slurm_env_sizes_tasks(const char *var)
{
	static const char *const per_task[] = {
		"SLURM_NTASKS=", "SLURM_NPROCS=", "SLURM_NTASKS_PER_NODE=", "SLURM_CPUS_PER_TASK=",
		"SRUN_CPUS_PER_TASK=", "SLURM_GPUS_PER_TASK=", "SLURM_TRES_PER_TASK=",
		"SLURM_MEM_PER_CPU=", "SLURM_MEM_PER_GPU=", "SLURM_CPUS_PER_GPU=", "SLURM_CPU_BIND=",
		"SLURM_DISTRIBUTION=", NULL,
	};

	for (const char *const *v = per_task; *v; v++)
		if (strncmp(var, *v, strlen(*v)) == 0)
			return true;
	return false;
}

void launch_slurm_env_untask(void)
{
	static const char *const task[] = {
		"SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_NTASKS", "SLURM_NPROCS",
		"SLURM_GTIDS", "SLURM_STEP_NUM_TASKS", "SLURM_STEP_TASKS_PER_NODE",
		"SLURM_TASKS_PER_NODE", "SLURM_STEP_NUM_NODES", "SLURM_STEP_NODELIST", NULL,
	};

	if (!getenv("SLURM_STEP_ID"))
		return;
	for (const char *const *v = task; *v; v++)
		unsetenv(*v);
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
	/* At least one node runs workers. */
	if (l->cpu_server_nodes_opt &&
	    launch_parse_int("--cpu-server-nodes", l->cpu_server_nodes_opt, 0, l->nhosts - 1,
			     "a number of nodes for CPU-only servers (one node at least runs workers)", &k) < 0)
		return -1;
	if (l->no_colocated && k == 0) {
		fprintf(stderr, "unisum launch: --no-colocated-servers needs --cpu-server-nodes of 1 "
			"or more: the job needs a server\n");
		return -1;
	}
	/* Workers per node: --nproc-per-node, else what the allocation asked
	 * for per node, else one. */
	int slots = nproc > 0 ? nproc : 1;
	if (nproc == 0 && per_node && *per_node &&
	    launch_parse_int("SLURM_NTASKS_PER_NODE", per_node, 1, 1024,
			     "a number of workers per node", &slots) < 0)
		return -1;
	for (int i = 0; i < l->nhosts; i++)
		l->hosts[i].slots = slots;
	l->slurm = true;
	launch_hosts_shape(l, l->nhosts - k);
	return 0;
}

/* NodeAddr=... of `scontrol show node -o NAME` into out, "" when there
 * is none (no scontrol, say). */
static void node_addr_of_slurm(const char *name, char *out, size_t len)
{
	char cmd[HOSTLIST_NAME_MAX + 64], *line = NULL;
	size_t cap = 0;
	FILE *p;

	out[0] = '\0';
	if (name[0] == '-')
		return;
	for (const char *c = name; *c; c++) {
		if (!isalnum((unsigned char)*c) && !strchr("._-", *c))
			return;	/* nothing a shell would read */
	}
	snprintf(cmd, sizeof(cmd), "scontrol show node -o %s 2>/dev/null", name);
	p = popen(cmd, "r");
	if (!p)
		return;
	if (getline(&line, &cap, p) > 0) {
		const char *a = strstr(line, " NodeAddr=");

		if (a) {
			a += strlen(" NodeAddr=");
			snprintf(out, len, "%.*s", (int)strcspn(a, " \n"), a);
		}
	}
	free(line);
	pclose(p);
}

int launch_slurm_node_addr(const char *name, char *out, size_t len)
{
	struct addrinfo hints = { .ai_family = AF_INET, .ai_socktype = SOCK_STREAM }, *res;
	struct in_addr ip;
	char text[INET_ADDRSTRLEN];

	node_addr_of_slurm(name, out, len);
	if (!out[0])
		snprintf(out, len, "%s", name);
	int rc = getaddrinfo(out, NULL, &hints, &res);
	if (rc != 0) {
		fprintf(stderr, "unisum launch: node %s (address %s) does not resolve: %s; set "
			"UNISUM_BIND to this host's address the nodes reach\n", name, out,
			gai_strerror(rc));
		return -1;
	}
	ip = ((struct sockaddr_in *)res->ai_addr)->sin_addr;
	freeaddrinfo(res);
	if ((ntohl(ip.s_addr) >> 24) == 127) {
		inet_ntop(AF_INET, &ip, text, sizeof(text));
		fprintf(stderr, "unisum launch: node %s resolves to %s, a loopback address the other "
			"nodes cannot reach (an /etc/hosts line?); give it a NodeAddr in slurm.conf, "
			"or set UNISUM_BIND to this host's address the nodes reach\n", name, text);
		return -1;
	}
	return 0;
}

int launch_srun_argv(struct launcher *l, struct child *c)
{
	char *remote = launch_remote_command(l, c->rank);
	char *nodelist = malloc(sizeof(l->hosts[0].name) + 16);

	if (nodelist)
		snprintf(nodelist, sizeof(l->hosts[0].name) + 16, "--nodelist=%s",
			 l->hosts[c->rank].name);
	const char *const pre[] = { "srun", NULL };
	/* One task on this node, with all the node's CPUs and memory of the
	 * job (the node runs many processes), unbound, without MPI's setup;
	 * other steps (the user's, a debugger) may share it. */
	const char *const post[] = { "--nodes=1", "--ntasks=1", nodelist, "--mem=0",
				     "--cpu-bind=none", "--mpi=none", "--overlap", "/bin/sh", "-c",
				     remote, NULL };

	return launch_transport_argv(c, pre, l->srun_args_opt, post, nodelist, remote);
}
