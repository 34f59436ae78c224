/*
 * launch_node.c - one node of a multi-node job, the way torchrun and
 * Kubernetes' PyTorchJob start one: `unisum launch --nproc-per-node L` on
 * every node, told the job's shape by options or by the variables those
 * engines set.
 *
 *   --nnodes N       NNODES, PET_NNODES, else WORLD_SIZE (PyTorchJob: pods)
 *   --node-rank R    NODE_RANK, PET_NODE_RANK, else RANK (the pod's index)
 *   --master-addr A  MASTER_ADDR, PET_MASTER_ADDR (127.0.0.1 for one node)
 *   --master-port P  MASTER_PORT, PET_MASTER_PORT (29500, torchrun's)
 *
 * Each node runs L workers (ranks R x L .. R x L + L - 1) and one
 * colocated server (rank R), BytePS's best practice and what Theorem 1
 * gives when every worker host has spare CPU; node 0 also runs the
 * scheduler, inside the launcher, at A:P.  The nodes share the job's
 * secret through UNISUM_SECRET or UNISUM_SECRET_FILE (a Kubernetes Secret,
 * say); `--no-secret` runs without one.  Nothing else is set by hand.
 *
 * The variables are read when the options are checked, before the
 * launcher clears what it sets per child (RANK and WORLD_SIZE among them).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "launch.h"

/* torchrun's default port. */
#define LAUNCH_MASTER_PORT 29500

/* The most nodes of a job (RDV_MAX_NODES bounds servers plus workers). */
#define LAUNCH_NODES_MAX 2048

/* The value of the first of `names` that is set and not empty, its name
 * in *which; NULL when none is. */
static const char *env_first(const char *const *names, const char **which)
{
	for (; *names; names++) {
		const char *v = getenv(*names);

		if (v && *v) {
			*which = *names;
			return v;
		}
	}
	return NULL;
}

int launch_parse_int(const char *name, const char *value, long lo, long hi, const char *what,
		     int *out)
{
	char *end;
	long v;

	errno = 0;
	v = strtol(value, &end, 10);
	if (errno || end == value || *end != '\0' || v < lo || v > hi) {
		fprintf(stderr, "unisum launch: %s='%s' is not %s (%ld to %ld)%s\n", name, value,
			what, lo, hi, strchr(value, ':') ? "; elastic ranges (MIN:MAX) are not "
			"supported: give the number of nodes" : "");
		return -1;
	}
	*out = (int)v;
	return 0;
}

/* One setting: the option's value if given, else the first variable of
 * `vars` that is set.  *value NULL when neither; *name says which it was. */
static void setting(const char *opt_value, const char *opt_name, const char *const *vars,
		    const char **value, const char **name)
{
	*name = opt_name;
	*value = opt_value ? opt_value : env_first(vars, name);
}

int launch_node_resolve(struct launcher *l)
{
	static const char *const nnodes_vars[] = { "NNODES", "PET_NNODES", "WORLD_SIZE", NULL };
	static const char *const rank_vars[] = { "NODE_RANK", "PET_NODE_RANK", "RANK", NULL };
	static const char *const addr_vars[] = { "MASTER_ADDR", "PET_MASTER_ADDR", NULL };
	static const char *const port_vars[] = { "MASTER_PORT", "PET_MASTER_PORT", NULL };
	static const char *const sched_vars[] = { "UNISUM_SCHEDULER_HOST", "DMLC_PS_ROOT_URI", NULL };
	const char *value, *name, *ignored;
	bool by_option = l->nnodes_opt || l->node_rank_opt || l->master_addr_opt ||
			 l->master_port_opt || l->cpu_servers_opt;

	/* A machine of a job described by UNISUM_* (started by hand) is not
	 * a node of one described by the engine's variables. */
	if (!by_option && (env_first(sched_vars, &ignored) || !env_first(addr_vars, &ignored)))
		return 0;
	l->node_mode = true;

	setting(l->nnodes_opt, "--nnodes", nnodes_vars, &value, &name);
	if (!value) {
		fprintf(stderr, "unisum launch: a node of a multi-node job needs the number of "
			"nodes: --nnodes, or NNODES / PET_NNODES / WORLD_SIZE\n");
		return -1;
	}
	if (launch_parse_int(name, value, 1, LAUNCH_NODES_MAX, "a number of nodes", &l->nnodes) < 0)
		return -1;

	setting(l->node_rank_opt, "--node-rank", rank_vars, &value, &name);
	if (l->server_only)
		value = NULL;	/* no node of its own: a server rank by arrival */
	else if (!value && l->nnodes > 1) {
		fprintf(stderr, "unisum launch: a node of a %d-node job needs its index: "
			"--node-rank, or NODE_RANK / PET_NODE_RANK / RANK\n", l->nnodes);
		return -1;
	}
	l->node_rank = 0;
	if (value && launch_parse_int(name, value, 0, l->nnodes - 1, "this node's index among the nodes",
			       &l->node_rank) < 0)
		return -1;

	setting(l->master_addr_opt, "--master-addr", addr_vars, &value, &name);
	if (!value && l->nnodes > 1) {
		fprintf(stderr, "unisum launch: the nodes of a %d-node job meet at node 0: give its "
			"address with --master-addr or MASTER_ADDR\n", l->nnodes);
		return -1;
	}
	snprintf(l->master_addr, sizeof(l->master_addr), "%s", value ? value : "127.0.0.1");

	setting(l->master_port_opt, "--master-port", port_vars, &value, &name);
	l->master_port = LAUNCH_MASTER_PORT;
	if (value && launch_parse_int(name, value, 1, 65535, "a TCP port", &l->master_port) < 0)
		return -1;

	/* CPU-only servers (`unisum server` on hosts without workers, taking
	 * the ranks after the nodes' by arrival): --cpu-servers K, or a total
	 * in UNISUM_NUM_SERVER. */
	static const char *const servers_vars[] = { "UNISUM_NUM_SERVER", "DMLC_NUM_SERVER", NULL };
	int cpu = 0, colocated = l->no_colocated ? 0 : l->nnodes;
	l->node_servers = colocated;
	if (l->cpu_servers_opt) {
		if (launch_parse_int("--cpu-servers", l->cpu_servers_opt, l->no_colocated ? 1 : 0,
			      LAUNCH_NODES_MAX, "a number of servers", &cpu) < 0)
			return -1;
		l->node_servers = colocated + cpu;
	} else if ((value = env_first(servers_vars, &name)) != NULL) {
		if (launch_parse_int(name, value, colocated ? colocated : 1, colocated + LAUNCH_NODES_MAX,
			      "the job's servers: one per node and any CPU-only ones", &l->node_servers) < 0)
			return -1;
	}
	return 0;
}

/* The IPv4 address of `host` into out (INET_ADDRSTRLEN). */
static int resolve_ipv4(const char *host, char *out)
{
	struct addrinfo hints = { .ai_family = AF_INET, .ai_socktype = SOCK_STREAM };
	struct addrinfo *res;
	int rc = getaddrinfo(host, NULL, &hints, &res);

	if (rc != 0) {
		fprintf(stderr, "unisum launch: cannot resolve '%s': %s\n", host, gai_strerror(rc));
		return -1;
	}
	inet_ntop(AF_INET, &((struct sockaddr_in *)res->ai_addr)->sin_addr, out, INET_ADDRSTRLEN);
	freeaddrinfo(res);
	return 0;
}

/* This host's address on the route to ip:port (a UDP socket's local end:
 * nothing is sent) into out (INET_ADDRSTRLEN): the address the other
 * nodes reach this node's server at. */
static int local_addr_toward(const char *ip, int port, char *out)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	socklen_t len = sizeof(sa);
	int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	int rc = -1;

	inet_pton(AF_INET, ip, &sa.sin_addr);
	if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 &&
	    getsockname(fd, (struct sockaddr *)&sa, &len) == 0) {
		inet_ntop(AF_INET, &sa.sin_addr, out, INET_ADDRSTRLEN);
		rc = 0;
	} else {
		fprintf(stderr, "unisum launch: no route from this host to %s: %s\n", ip,
			strerror(errno));
	}
	if (fd >= 0)
		close(fd);
	return rc;
}

int launch_route_addr(const char *host, int port, char *ip, char *local)
{
	return resolve_ipv4(host, ip) < 0 || local_addr_toward(ip, port, local) < 0 ? -1 : 0;
}

int launch_node_environ(struct launcher *l)
{
	static const char *const secret_vars[] = { "UNISUM_SECRET", "UNISUM_SECRET_FILE", NULL };
	char ip[INET_ADDRSTRLEN], here[INET_ADDRSTRLEN], num[16];
	const char *bind = getenv("UNISUM_BIND"), *ignored;

	if (launch_route_addr(l->master_addr, l->master_port, ip, here) < 0)
		return -1;
	if (l->no_secret) {
		unsetenv("UNISUM_SECRET");
		unsetenv("UNISUM_SECRET_FILE");
	} else if (!env_first(secret_vars, &ignored)) {
		fprintf(stderr, "unisum launch: the nodes of a job prove a shared secret to each "
			"other: set UNISUM_SECRET (or UNISUM_SECRET_FILE) to the same value on every "
			"node (on Kubernetes, from a Secret), or pass --no-secret on every node\n");
		return -1;
	}
	setenv("UNISUM_SCHEDULER_HOST", l->master_addr, 1);
	snprintf(num, sizeof(num), "%d", l->master_port);
	setenv("UNISUM_SCHEDULER_PORT", num, 1);
	snprintf(num, sizeof(num), "%d", l->nnodes);
	setenv("UNISUM_NUM_WORKER", num, 1);
	snprintf(num, sizeof(num), "%d", l->node_servers);
	setenv("UNISUM_NUM_SERVER", num, 1);	/* one colocated server per node, then CPU-only */
	unsetenv("DMLC_NUM_SERVER");
	/* An elastic job's scheduler ranks its workers itself. */
	const char *elastic = getenv("UNISUM_ELASTIC");
	snprintf(num, sizeof(num), "%d", elastic && strcmp(elastic, "1") == 0 ? -1 : l->node_rank);
	if (!l->server_only)
		setenv("UNISUM_WORKER_ID", num, 1);
	unsetenv("DMLC_WORKER_ID");
	/* The server listens where the other nodes can reach it. */
	if (!getenv("UNISUM_NODE_HOST") && !getenv("DMLC_NODE_HOST"))
		setenv("UNISUM_NODE_HOST", here, 1);
	/* Node 0's scheduler listens on the master's address (UNISUM_BIND,
	 * say 0.0.0.0, when that address is a service's, not this host's). */
	if (bind && *bind && strlen(bind) >= sizeof(l->sched_addr)) {
		fprintf(stderr, "unisum launch: UNISUM_BIND='%s' is not an IPv4 address\n", bind);
		return -1;
	}
	snprintf(l->sched_addr, sizeof(l->sched_addr), "%s", bind && *bind ? bind : ip);
	l->sched_listen_port = l->master_port;
	return 0;
}
