/*
 * launch_elastic.c - `unisum launch --elastic`: a job whose workers may be
 * lost and added (horovodrun's elastic mode, on this host).
 *
 * The scheduler re-forms the job (src/rendezvous/sched_elastic.c); the
 * launcher only keeps the processes: a worker that dies is reported and
 * the job goes on (the scheduler fails it when fewer than --min-workers
 * are left), and with --host-discovery-script the script runs every
 * second; the slots it offers on this host (lines "host" or "host:slots",
 * horovodrun's format; this host is localhost, 127.0.0.1 or its name),
 * at most --max-workers, are the number of workers to run: new ones are
 * started (they wait in unisum_init until the job takes them in) and
 * surplus ones, the newest first, are stopped (SIGTERM).  Other hosts are
 * named once and skipped: the workers of an elastic job run on this host.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "launch.h"
#include "rendezvous/rendezvous.h"
#include "timing/timing.h"

#define DISCOVERY_EVERY_MS 1000
/* A host whose workers failed this many times gets no more
 * (horovodrun blacklists such hosts too). */
#define LAUNCH_ELASTIC_FAILS 3

/* How many of host's workers failed (its entry, made when
 * `add`, else NULL when none). */
static struct launch_failing *failing_of(struct launcher *l, const char *host, bool add)
{
	for (int i = 0; i < l->nfailing; i++)
		if (strcmp(l->failing[i].host, host) == 0)
			return &l->failing[i];
	if (!add || l->nfailing == 64)
		return NULL;
	struct launch_failing *f = &l->failing[l->nfailing++];
	snprintf(f->host, sizeof f->host, "%s", host);
	f->fails = 0;
	return f;
}

static int parse_workers(const char *opt, const char *value, int *out)
{
	char *end;
	long v = strtol(value, &end, 10);
	if (*value == '\0' || *end != '\0' || v < 1 || v > 4096) {
		fprintf(stderr, "unisum launch: %s '%s': expected a number of workers, 1 to 4096\n",
			opt, value);
		return -1;
	}
	*out = (int)v;
	return 0;
}

int launch_elastic_option(struct launcher *l, int argc, char **argv, int *i)
{
	const char *arg = argv[*i];
	if (strcmp(arg, "--elastic") == 0) {
		l->elastic = true;
		return 0;
	}
	const char *names[] = {"--min-workers", "--max-workers", "--host-discovery-script"};
	for (int k = 0; k < 3; k++) {
		size_t n = strlen(names[k]);
		const char *value = NULL;
		if (strcmp(arg, names[k]) == 0) {
			if (*i + 1 >= argc) {
				fprintf(stderr, "unisum launch: %s needs a value\n", arg);
				return -1;
			}
			value = argv[++*i];
		} else if (strncmp(arg, names[k], n) == 0 && arg[n] == '=') {
			value = arg + n + 1;
		} else {
			continue;
		}
		if (k == 2) {
			l->discovery_script = value;
			return 0;
		}
		return parse_workers(names[k], value, k == 0 ? &l->min_workers : &l->max_workers);
	}
	return 1;
}

int launch_elastic_check(struct launcher *l)
{
	if (!l->elastic) {
		if (l->min_workers || l->max_workers || l->discovery_script) {
			fprintf(stderr, "unisum launch: --min-workers, --max-workers and "
				"--host-discovery-script go with --elastic\n");
			return -1;
		}
		return 0;
	}
	if (l->one_machine || l->nhosts > 0 || l->slurm || l->nnetns > 0 ||
	    l->worker_netns_opt != NULL || l->worker_racks_opt != NULL ||
	    l->server_racks_opt != NULL) {
		fprintf(stderr, "unisum launch: --elastic runs a whole job on this host (-w, -s): it "
			"does not go with -H, --slurm, --nproc-per-node, namespaces or racks yet\n");
		return -1;
	}
	if (l->local_size > 1 && l->local_size != l->num_workers) {
		fprintf(stderr, "unisum launch: --elastic runs one worker per machine: --local-size "
			"must be 1\n");
		return -1;
	}
	l->local_size = 1;
	l->machines = l->num_workers;
	if (l->min_workers == 0)
		l->min_workers = 1;
	if (l->max_workers == 0)
		l->max_workers = l->num_workers;
	if (l->min_workers > l->num_workers || l->num_workers > l->max_workers) {
		fprintf(stderr, "unisum launch: --elastic needs --min-workers %d <= -w %d <= "
			"--max-workers %d\n", l->min_workers, l->num_workers, l->max_workers);
		return -1;
	}
	l->cap_children = l->num_servers + l->max_workers;
	l->next_worker = l->num_workers;
	return 0;
}

/* Whether `host` (from the discovery script) is this host: localhost,
 * 127.0.0.1, its name, or the address the job listens on. */
static bool host_is_here(const struct launcher *l, const char *host)
{
	char name[256];
	if (strcmp(host, "localhost") == 0 || strcmp(host, "127.0.0.1") == 0 ||
	    strcmp(host, l->sched_addr) == 0)
		return true;
	return gethostname(name, sizeof name) == 0 && strcmp(host, name) == 0;
}

#define DISCOVERY_HOSTS_MAX 64

/* One host the script offers: "" for this one. */
struct offer {
	char host[256];
	int slots;
};

/* Runs the script: the hosts it offers (this host's slots summed into
 * offers[0]), or -1 when it failed. */
static int discover(struct launcher *l, struct offer *offers)
{
	FILE *p = popen(l->discovery_script, "r");
	if (p == NULL)
		return -1;
	char line[512];
	int n = 1;
	offers[0].host[0] = '\0';
	offers[0].slots = 0;
	while (fgets(line, sizeof line, p) != NULL) {
		char *s = line + strspn(line, " \t");
		s[strcspn(s, " \t\r\n")] = '\0';
		if (*s == '\0' || *s == '#')
			continue;
		char *colon = strrchr(s, ':');
		int slots = 1;
		if (colon != NULL) {
			*colon = '\0';
			slots = atoi(colon + 1);
		}
		if (slots < 0)
			slots = 0;
		if (host_is_here(l, s)) {
			offers[0].slots += slots;
		} else if (strcmp(l->sched_addr, "127.0.0.1") == 0) {
			/* Nothing here listens where another host reaches. */
			bool said = false;
			for (int i = 0; i < l->ndiscovery_warned && !said; i++)
				said = strcmp(l->discovery_warned[i], s) == 0;
			if (!said && l->ndiscovery_warned < 8) {
				snprintf(l->discovery_warned[l->ndiscovery_warned++], 64, "%s", s);
				fprintf(stderr, "unisum launch: the discovery script offers host %s, but "
					"this job listens on 127.0.0.1 only: set UNISUM_NODE_HOST to the "
					"address of this host that the others reach; %s is skipped\n", s,
					s);
			}
		} else if (n < DISCOVERY_HOSTS_MAX && strlen(s) < sizeof offers[0].host) {
			snprintf(offers[n].host, sizeof offers[n].host, "%s", s);
			offers[n++].slots = slots;
		}
	}
	return pclose(p) == 0 ? n : -1;
}

/* A slot for a new worker: a reaped worker's, or a fresh one; NULL when
 * there is no room. */
static struct child *free_slot(struct launcher *l)
{
	for (int i = 0; i < l->nchildren; i++) {
		struct child *c = &l->children[i];
		if ((c->role != CHILD_WORKER && !c->ehost[0]) || c->pid == 0 || c->running)
			continue;
		if (c->stdin_fd >= 0) {	/* an ssh child's, reaped */
			close(c->stdin_fd);
			c->stdin_fd = -1;
		}
		/* Its pipes must be drained and closed first (EOF read). */
		if (c->out.fd < 0 && c->err.fd < 0)
			return c;
	}
	return l->nchildren < l->cap_children ? &l->children[l->nchildren++] : NULL;
}

/* Whether child c is a live worker of the job on `host` ("" here). */
static bool worker_on(const struct child *c, const char *host)
{
	return (c->role == CHILD_WORKER || c->ehost[0]) && c->running && !c->removed &&
	       strcmp(c->ehost, host) == 0;
}

/* Starts one worker on `host` ("": here, else over ssh).  0 or -1. */
static int start_worker(struct launcher *l, const char *host, int want)
{
	struct child *c = free_slot(l);
	if (c == NULL)
		return -1;
	if (c->argv != NULL)
		launch_ssh_free(c);
	memset(c, 0, sizeof *c);
	c->role = host[0] ? CHILD_SSH : CHILD_WORKER;
	c->rank = l->next_worker++;
	c->netns = -1;
	c->stdin_fd = -1;
	c->out.fd = c->err.fd = -1;
	c->out.out_fd = STDOUT_FILENO;
	c->err.out_fd = STDERR_FILENO;
	snprintf(c->ehost, sizeof c->ehost, "%.255s", host);
	if (host[0])
		snprintf(c->name, sizeof c->name, "worker %d (%.64s)", c->rank, host);
	else
		snprintf(c->name, sizeof c->name, "worker %d", c->rank);
	snprintf(c->prefix, sizeof c->prefix, "[%.72s] ", c->name);
	int rc = launch_child_spawn(l, c);
	if (rc < 0) {
		fprintf(stderr, "unisum launch: cannot start another worker%s%s: %s\n",
			host[0] ? " on " : "", host, strerror(-rc));
		return -1;
	}
	fprintf(stderr, "unisum launch: the discovery script offers %d slot(s) on %s: started %s "
		"(pid %d); it joins at the job's next commit\n", want, host[0] ? host : "this host",
		c->name, (int)c->pid);
	return 0;
}

/* Stops worker c: a local one with SIGTERM, one over ssh by closing its
 * stdin (its host's launcher then stops it). */
static void stop_worker(struct launcher *l, struct child *c, int want)
{
	(void)l;
	fprintf(stderr, "unisum launch: the discovery script offers %d slot(s) on %s: stopping "
		"%s (pid %d)\n", want, c->ehost[0] ? c->ehost : "this host", c->name, (int)c->pid);
	c->removed = true;
	if (c->ehost[0] && c->stdin_fd >= 0) {
		close(c->stdin_fd);
		c->stdin_fd = -1;
	} else {
		kill(-c->pid, SIGTERM);
	}
}

void launch_elastic_tick(struct launcher *l, int64_t now)
{
	if (!l->elastic || l->discovery_script == NULL || l->stopping || l->workers_done_ms ||
	    l->elastic_ending || now < l->discovery_next_ms)
		return;
	l->discovery_next_ms = now + DISCOVERY_EVERY_MS;
	struct offer offers[DISCOVERY_HOSTS_MAX];
	int n = discover(l, offers);
	if (n < 0) {
		fprintf(stderr, "unisum launch: the discovery script %s failed; the workers stay as "
			"they are\n", l->discovery_script);
		return;
	}
	/* Each host's share of at most --max-workers, this host first. */
	int left = l->max_workers, live_total = 0;
	for (int h = 0; h < n; h++) {
		int want = offers[h].slots < left ? offers[h].slots : left;
		left -= want;
		offers[h].slots = want;
	}
	for (int i = 0; i < l->nchildren; i++)
		live_total += worker_on(&l->children[i], l->children[i].ehost);
	/* Surplus first (hosts gone from the list too), newest first, never
	 * below --min-workers. */
	for (int i = l->nchildren - 1; i >= 0 && live_total > l->min_workers; i--) {
		struct child *c = &l->children[i];
		if (!worker_on(c, c->ehost))
			continue;
		int h = 0;
		while (h < n && strcmp(offers[h].host, c->ehost) != 0)
			h++;
		int want = h < n ? offers[h].slots : 0, live = 0;
		for (int j = 0; j < l->nchildren; j++)
			live += worker_on(&l->children[j], c->ehost);
		if (live > want) {
			stop_worker(l, c, want);
			live_total--;
		}
	}
	for (int h = 0; h < n; h++) {
		const struct launch_failing *f = failing_of(l, offers[h].host, false);
		if (f != NULL && f->fails >= LAUNCH_ELASTIC_FAILS)
			continue;
		int live = 0;
		for (int i = 0; i < l->nchildren; i++)
			live += worker_on(&l->children[i], offers[h].host);
		while (live < offers[h].slots && start_worker(l, offers[h].host, offers[h].slots) == 0)
			live++;
	}
}

void launch_elastic_prefixes(struct launcher *l)
{
	if (!l->elastic || l->sched == NULL)
		return;
	unsigned books = rdv_scheduler_books(l->sched);
	if (books == l->prefix_books)
		return;
	l->prefix_books = books;
	for (int i = 0; i < l->nchildren; i++) {
		struct child *c = &l->children[i];
		int rank;
		if (c->role != CHILD_WORKER || !c->running)
			continue;
		if (rdv_scheduler_worker_rank(l->sched, (int)c->pid, &rank)) {
			snprintf(c->prefix, sizeof c->prefix, "[worker %d] ", rank);
			c->job_rank = rank + 1;
		} else {
			snprintf(c->prefix, sizeof c->prefix, "[%.72s] ", c->name);
			c->job_rank = 0;
		}
	}
}

bool launch_elastic_absorbs(struct launcher *l, const struct child *c, int status,
			    const char *what)
{
	(void)status;
	if (!l->elastic || (c->role != CHILD_WORKER && !c->ehost[0]))
		return false;
	if (c->removed) {
		fprintf(stderr, "unisum launch: %s (pid %d) %s, as asked\n", c->name, (int)c->pid,
			what);
		return true;
	}
	char rank[32] = "";
	if (c->job_rank > 0 && c->job_rank - 1 != c->rank)
		snprintf(rank, sizeof rank, "rank %d, ", c->job_rank - 1);
	fprintf(stderr, "unisum launch: %s (%spid %d) %s; the elastic job goes on without it "
		"(--min-workers %d)\n", c->name, rank, (int)c->pid, what, l->min_workers);
	struct launch_failing *f = failing_of(l, c->ehost, true);
	if (f != NULL && ++f->fails == LAUNCH_ELASTIC_FAILS && l->discovery_script != NULL)
		fprintf(stderr, "unisum launch: %d workers on %s have failed: no more are "
			"started there\n", f->fails, c->ehost[0] ? c->ehost : "this host");
	return true;
}
