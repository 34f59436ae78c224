/*
 * launch_netns.c - `unisum launch -w N -s K --worker-netns NS,...
 * --server-netns NS,... [--scheduler-netns NS] -- CMD`: a job across
 * network namespaces.
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
 * This file opens each named namespace once, learns its address, and runs
 * a function inside a namespace (launch_job.c starts the scheduler's
 * listener through it); launch_children.c sets the children's variables and
 * moves each child.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "launch.h"

/* The scheduler's address when no namespace is given. */
#define LAUNCH_HOST "127.0.0.1"

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

int launch_netns_run(const struct netns *ns, int (*fn)(void *), void *arg)
{
	if (!ns)
		return fn(arg);
	int home = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
	if (home < 0 || setns(ns->fd, CLONE_NEWNET) < 0) {
		fprintf(stderr, "unisum launch: cannot enter network namespace %s: %s\n", ns->name,
			strerror(errno));
		if (home >= 0)
			close(home);
		return LAUNCH_NETNS_NOT_ENTERED;
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
	int rc = launch_netns_run(ns, netns_addr_fn, ns->addr);
	if (rc < 0) {
		if (rc != LAUNCH_NETNS_NOT_ENTERED)
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

int launch_netns_setup(struct launcher *l)
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

void launch_netns_free(struct launcher *l)
{
	for (int i = 0; i < l->nnetns; i++)
		close(l->netns[i].fd);
	free(l->netns);
	free(l->machine_netns);
	free(l->server_netns);
}
