/*
 * top.c - `unisum top [--once] [--interval S] [JOB | HOST:PORT]`: the
 * scheduler's metrics (UNISUM_METRICS_PORT, `unisum launch --metrics`) as
 * a table that refreshes, one row per process: CPU, memory, step time,
 * operations and bytes per second, each server's bytes against its
 * Theorem 1 share, the hosts' network, and the stalls now, named.
 *
 * It reads GET /metrics (Prometheus's text format) every interval and
 * computes the rates from two samples.  A job on this host is found by
 * its id (/tmp/unisum-UID/JOB.metrics, which the scheduler writes), or
 * alone when it is the only one.
 */
#include <dirent.h>
#include <errno.h>
#include <netdb.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "tools.h"

#define TOP_ROWS 4200
#define TOP_STALLS 32

struct top_row {
	char role[12];
	int rank;
	char host[64];
	int up;
	double cpu, rss, step, ops, in, out, share;
};

struct top_sample {
	double t;			/* when taken (s, monotonic) */
	struct top_row *rows;		/* [nrows] */
	int nrows;
	struct { char host[64]; double rx, tx; } hosts[256];
	int nhosts;
	struct { char who[96]; char what[256]; double secs; } stalls[TOP_STALLS];
	int nstalls;
	int workers, servers, failed, failovers;
};

static volatile sig_atomic_t top_stop;

static void top_on_signal(int sig)
{
	(void)sig;
	top_stop = 1;
}

static double top_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* GET /metrics from host:port into a malloc'd text (the body), or NULL
 * with why. */
static char *top_fetch(const char *host, const char *port, char *why, size_t len)
{
	struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *res;
	int rc = getaddrinfo(host, port, &hints, &res);
	if (rc != 0) {
		snprintf(why, len, "cannot resolve %s: %s", host, gai_strerror(rc));
		return NULL;
	}
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct timeval tv = {.tv_sec = 3};
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);	/* connect() too */
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	char req[256];
	int n = snprintf(req, sizeof req, "GET /metrics HTTP/1.1\r\nHost: %s:%s\r\n"
			 "Connection: close\r\n\r\n", host, port);
	if (fd < 0 || connect(fd, res->ai_addr, res->ai_addrlen) != 0 ||
	    send(fd, req, (size_t)n, MSG_NOSIGNAL) != n) {
		snprintf(why, len, "cannot reach %.100s:%.20s: %s", host, port, strerror(errno));
		freeaddrinfo(res);
		if (fd >= 0)
			close(fd);
		return NULL;
	}
	freeaddrinfo(res);
	size_t cap = 1 << 16, got = 0;
	char *buf = malloc(cap + 1);
	ssize_t r;
	while (buf != NULL && (r = recv(fd, buf + got, cap - got, 0)) > 0)
		if ((got += (size_t)r) == cap) {
			char *grown = realloc(buf, 2 * cap + 1);
			cap *= 2;
			if (grown == NULL)
				free(buf);
			buf = grown;
		}
	close(fd);
	char *body = buf != NULL ? (buf[got] = '\0', strstr(buf, "\r\n\r\n")) : NULL;
	if (body == NULL || strncmp(buf, "HTTP/1.1 200", 12) != 0) {
		snprintf(why, len, "%.100s:%.20s did not answer with metrics", host, port);
		free(buf);
		return NULL;
	}
	memmove(buf, body + 4, strlen(body + 4) + 1);
	return buf;
}

/* The value of label `key` in a line's labels ("{a=\"x\",b=\"y\"}"), into
 * out (escapes undone); "" when absent. */
static void top_label(const char *labels, const char *key, char *out, size_t len)
{
	char pat[32];
	snprintf(pat, sizeof pat, "%s=\"", key);
	const char *p = labels;
	size_t n = 0;
	out[0] = '\0';
	while ((p = strstr(p, pat)) != NULL && p != labels + 1 && p[-1] != ',')
		p++;
	if (p == NULL)
		return;
	for (p += strlen(pat); *p != '\0' && *p != '"' && n + 1 < len; p++) {
		if (*p == '\\' && p[1] != '\0')
			p++, out[n++] = *p == 'n' ? ' ' : *p;
		else
			out[n++] = *p;
	}
	out[n] = '\0';
}

static struct top_row *top_row_of(struct top_sample *s, const char *labels)
{
	char role[12], rank[16], host[64];
	top_label(labels, "role", role, sizeof role);
	top_label(labels, "rank", rank, sizeof rank);
	top_label(labels, "host", host, sizeof host);
	for (int i = 0; i < s->nrows; i++)
		if (strcmp(s->rows[i].role, role) == 0 && s->rows[i].rank == atoi(rank))
			return &s->rows[i];
	if (s->nrows == TOP_ROWS || role[0] == '\0')
		return NULL;
	struct top_row *r = &s->rows[s->nrows++];
	*r = (struct top_row){.rank = atoi(rank), .step = -1, .share = -1};
	snprintf(r->role, sizeof r->role, "%s", role);
	snprintf(r->host, sizeof r->host, "%s", host);
	return r;
}

/* One series (name, labels, value) into the sample. */
static void top_take(struct top_sample *s, const char *name, const char *labels, double v)
{
	static const struct { const char *name; size_t at; } per_row[] = {
		{"unisum_node_up", offsetof(struct top_row, up)},
		{"unisum_process_resident_memory_bytes", offsetof(struct top_row, rss)},
		{"unisum_worker_step_seconds", offsetof(struct top_row, step)},
		{"unisum_worker_operations_total", offsetof(struct top_row, ops)},
		{"unisum_server_rounds_total", offsetof(struct top_row, ops)},
		{"unisum_worker_pulled_bytes_total", offsetof(struct top_row, in)},
		{"unisum_server_received_bytes_total", offsetof(struct top_row, in)},
		{"unisum_server_sent_bytes_total", offsetof(struct top_row, out)},
		{"unisum_server_share", offsetof(struct top_row, share)},
	};
	struct top_row *r;
	for (size_t i = 0; i < sizeof per_row / sizeof per_row[0]; i++)
		if (strcmp(name, per_row[i].name) == 0 && (r = top_row_of(s, labels)) != NULL) {
			if (per_row[i].at == offsetof(struct top_row, up))
				r->up = (int)v;
			else
				*(double *)((char *)r + per_row[i].at) = v;
			return;
		}
	if (strcmp(name, "unisum_process_cpu_seconds_total") == 0 && (r = top_row_of(s, labels)))
		r->cpu += v;
	else if (strcmp(name, "unisum_worker_pushed_bytes_total") == 0 && (r = top_row_of(s, labels)))
		r->out = v;
	else if (strcmp(name, "unisum_host_network_bytes_total") == 0 && s->nhosts < 256) {
		char host[64], dir[8];
		top_label(labels, "host", host, sizeof host);
		top_label(labels, "direction", dir, sizeof dir);
		int h = 0;
		while (h < s->nhosts && strcmp(s->hosts[h].host, host) != 0)
			h++;
		if (h == s->nhosts)
			snprintf(s->hosts[s->nhosts++].host, sizeof s->hosts[0].host, "%s", host);
		*(strcmp(dir, "tx") == 0 ? &s->hosts[h].tx : &s->hosts[h].rx) = v;
	} else if (strcmp(name, "unisum_stall_seconds") == 0 && s->nstalls < TOP_STALLS) {
		char role[12], rank[16];
		top_label(labels, "role", role, sizeof role);
		top_label(labels, "rank", rank, sizeof rank);
		snprintf(s->stalls[s->nstalls].who, sizeof s->stalls[0].who, "%s %s", role, rank);
		top_label(labels, "what", s->stalls[s->nstalls].what, sizeof s->stalls[0].what);
		s->stalls[s->nstalls++].secs = v;
	} else if (strcmp(name, "unisum_job_workers") == 0) {
		s->workers = (int)v;
	} else if (strcmp(name, "unisum_job_servers") == 0) {
		s->servers = (int)v;
	} else if (strcmp(name, "unisum_job_failed") == 0) {
		s->failed = (int)v;
	} else if (strcmp(name, "unisum_job_failovers_total") == 0) {
		s->failovers = (int)v;
	}
}

/* Parses the text format into s. */
static void top_parse(struct top_sample *s, char *text)
{
	for (char *line = strtok(text, "\n"); line != NULL; line = strtok(NULL, "\n")) {
		if (line[0] == '#')
			continue;
		char *labels = strchr(line, '{'), *end, *value;
		if (labels != NULL) {
			end = strrchr(labels, '}');	/* a label's text may hold braces */
			if (end == NULL || end[1] != ' ')
				continue;
			end[1] = '\0';
			value = end + 2;
			char name[128];
			snprintf(name, sizeof name, "%.*s", (int)(labels - line), line);
			top_take(s, name, labels, strtod(value, NULL));
		} else if ((value = strchr(line, ' ')) != NULL) {
			*value++ = '\0';
			top_take(s, line, "{}", strtod(value, NULL));
		}
	}
}

static const struct top_row *top_find(const struct top_sample *s, const struct top_row *r)
{
	for (int i = 0; s != NULL && i < s->nrows; i++)
		if (s->rows[i].rank == r->rank && strcmp(s->rows[i].role, r->role) == 0)
			return &s->rows[i];
	return NULL;
}

/* One screen: the job, a row per process, the hosts, the stalls. */
static void top_print(const char *target, const struct top_sample *s, const struct top_sample *p,
		      bool clear)
{
	double dt = p != NULL ? s->t - p->t : 0, total_in = 0;
	for (int i = 0; i < s->nrows; i++)
		if (strcmp(s->rows[i].role, "server") == 0) {
			const struct top_row *q = top_find(p, &s->rows[i]);
			total_in += s->rows[i].in - (q != NULL && dt > 0 ? q->in : 0);
		}
	if (clear)
		fputs("\033[H\033[2J", stdout);
	printf("unisum top: %s  %d workers, %d servers, %s, %d failover(s)%s\n", target, s->workers,
	       s->servers, s->failed ? "FAILED" : "running", s->failovers,
	       dt > 0 ? "" : "  (totals: rates need two samples)");
	printf("%-9s %5s %-15s %2s %6s %8s %9s %8s %10s %10s %12s\n", "ROLE", "RANK", "HOST", "UP",
	       "CPU%", "RSS MiB", "STEP ms", "OPS/s", "IN MB/s", "OUT MB/s", "BYTES/SHARE");
	for (int i = 0; i < s->nrows; i++) {
		const struct top_row *r = &s->rows[i], *q = dt > 0 ? top_find(p, r) : NULL;
		double k = q != NULL ? 1 / dt : 0;
		char step[16] = "-", share[24] = "";
		if (r->step >= 0)
			snprintf(step, sizeof step, "%.1f", r->step * 1e3);
		if (r->share >= 0 && total_in > 0)
			snprintf(share, sizeof share, "%.0f%%/%.0f%%",
				 100 * (r->in - (q != NULL ? q->in : 0)) / total_in, 100 * r->share);
		printf("%-9s %5d %-15.15s %2d %6.1f %8.1f %9s %8.1f %10.1f %10.1f %12s\n", r->role,
		       r->rank, r->host, r->up, q != NULL ? 100 * (r->cpu - q->cpu) * k : 0, r->rss / 1048576,
		       step, q != NULL ? (r->ops - q->ops) * k : r->ops,
		       q != NULL ? (r->in - q->in) * k / 1e6 : r->in / 1e6,
		       q != NULL ? (r->out - q->out) * k / 1e6 : r->out / 1e6, share);
	}
	for (int h = 0; h < s->nhosts; h++) {
		double rx = 0, tx = 0;
		for (int j = 0; p != NULL && dt > 0 && j < p->nhosts; j++)
			if (strcmp(p->hosts[j].host, s->hosts[h].host) == 0) {
				rx = (s->hosts[h].rx - p->hosts[j].rx) * 8 / dt / 1e6;
				tx = (s->hosts[h].tx - p->hosts[j].tx) * 8 / dt / 1e6;
			}
		printf("%s host %-15s rx %8.1f Mbit/s  tx %8.1f Mbit/s\n", h ? "    " : "net:",
		       s->hosts[h].host, rx, tx);
	}
	printf("stalls: %s\n", s->nstalls ? "" : "none");
	for (int i = 0; i < s->nstalls; i++)
		printf("  %-12s %6.1f s  %s\n", s->stalls[i].who, s->stalls[i].secs, s->stalls[i].what);
	fflush(stdout);
}

/* Where the job's metrics are: HOST:PORT as given, or from a job id
 * (its file), or the one job of this user on this host. */
static int top_target(const char *arg, char *host, size_t hlen, char *port, size_t plen)
{
	char dir[64], path[400], line[400] = "";
	snprintf(dir, sizeof dir, "/tmp/unisum-%u", (unsigned)getuid());
	if (arg != NULL && strchr(arg, ':') != NULL) {
		snprintf(line, sizeof line, "%s", arg);
	} else {
		char job[300] = "";
		int jobs = 0;
		DIR *d = arg == NULL ? opendir(dir) : NULL;
		for (struct dirent *e; d != NULL && (e = readdir(d)) != NULL;) {
			size_t n = strlen(e->d_name);
			if (n > 8 && strcmp(e->d_name + n - 8, ".metrics") == 0 && jobs++ == 0)
				snprintf(job, sizeof job, "%.*s", (int)(n - 8), e->d_name);
		}
		if (d != NULL)
			closedir(d);
		if (arg == NULL && jobs != 1) {
			fprintf(stderr, "unisum top: %s; name a job id or HOST:PORT\n",
				jobs ? "several jobs serve metrics here" : "no job serves metrics here "
				"(start one with unisum launch --metrics)");
			return -1;
		}
		snprintf(path, sizeof path, "%s/%s.metrics", dir, arg != NULL ? arg : job);
		FILE *f = fopen(path, "r");
		if (f == NULL || fgets(line, sizeof line, f) == NULL) {
			fprintf(stderr, "unisum top: no job '%s' serves metrics on this host (%s: %s)\n",
				arg != NULL ? arg : job, path, strerror(errno));
			if (f != NULL)
				fclose(f);
			return -1;
		}
		fclose(f);
		line[strcspn(line, "\n")] = '\0';
	}
	char *colon = strrchr(line, ':');
	if (colon == NULL || colon == line) {
		fprintf(stderr, "unisum top: '%s' is not HOST:PORT\n", line);
		return -1;
	}
	snprintf(host, hlen, "%.*s", (int)(colon - line), line);
	snprintf(port, plen, "%s", colon + 1);
	return 0;
}

static int top_sample(const char *host, const char *port, struct top_sample *s, bool first)
{
	char why[700];
	char *text = top_fetch(host, port, why, sizeof why);
	if (text == NULL) {
		if (first)
			fprintf(stderr, "unisum top: %s\n", why);
		else
			printf("unisum top: the job is gone (%s)\n", why);
		return first ? 1 : 0;
	}
	struct top_row *rows = s->rows;
	memset(s, 0, sizeof *s);
	s->rows = rows;
	s->t = top_now();
	top_parse(s, text);
	free(text);
	return -1;	/* go on */
}

int top_main(int argc, char **argv)
{
	double interval = 1;
	bool once = false;
	const char *arg = NULL;
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--once") == 0)
			once = true;
		else if (strcmp(argv[i], "--interval") == 0 && i + 1 < argc)
			interval = atof(argv[++i]);
		else if (argv[i][0] != '-' && arg == NULL)
			arg = argv[i];
		else {
			fprintf(stderr, "usage: unisum top [--once] [--interval SECONDS] [JOB | HOST:PORT]\n");
			return 2;
		}
	}
	char host[256], port[32], target[300];
	if (interval < 0.1 || top_target(arg, host, sizeof host, port, sizeof port) < 0)
		return interval < 0.1 ? 2 : 1;
	snprintf(target, sizeof target, "%s:%s", host, port);
	signal(SIGINT, top_on_signal);
	signal(SIGTERM, top_on_signal);
	struct top_sample *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b);
	int rc = 1;
	if (a == NULL || b == NULL || (a->rows = calloc(TOP_ROWS, sizeof *a->rows)) == NULL ||
	    (b->rows = calloc(TOP_ROWS, sizeof *b->rows)) == NULL)
		goto out;
	bool first = true;
	while (!top_stop && (rc = top_sample(host, port, b, first)) < 0) {
		if (!once || !first)
			top_print(target, b, first ? NULL : a, !once);
		if (once && !first)
			break;
		struct top_sample *t = a;
		a = b;
		b = t;
		first = false;
		usleep((useconds_t)(interval * 1e6));
	}
	rc = rc < 0 ? 0 : rc;
out:
	if (a != NULL)
		free(a->rows);
	if (b != NULL)
		free(b->rows);
	free(a);
	free(b);
	return rc;
}
