/*
 * sched_metrics.c - the scheduler's metrics (UNISUM_METRICS_PORT): every
 * node's last counters (rendezvous/metrics.h), kept as its heartbeats
 * bring them, served on the scheduler's loop in Prometheus's text format
 * at /metrics, with the live page (metrics_page.html) at /.
 *
 * Labels: role, rank and host (the address the node registered).  A
 * host's network counters come from each of its nodes; the largest is
 * served once per host.  Stalls are gauges with a `what` label, one
 * series per stall now: a node's longest wait past UNISUM_STALL_WARN_MS,
 * and the scheduler's barriers.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "http/http.h"
#include "log/log.h"
#include "rendezvous/sched_int.h"
#include "timing/timing.h"
#include "unisum.h"

extern const char sched_metrics_page[];
extern const unsigned long sched_metrics_page_len;

/* The counters served as they come, one series per node of the role
 * (-1: workers and servers). */
static const struct sched_family {
	const char *name, *type, *help;
	int role;
	int idx;		/* enum rdv_metric */
	double scale;		/* 0: the integer as it is */
} sched_families[] = {
	{"unisum_process_resident_memory_bytes", "gauge", "Resident memory of the process.", -1,
	 RDV_M_RSS_BYTES, 0},
	{"unisum_stalls_total", "counter", "Stall reports the process logged.", -1, RDV_M_STALLS, 0},
	{"unisum_worker_pushed_bytes_total", "counter", "Bytes a worker pushed to the servers.",
	 CONFIG_ROLE_WORKER, RDV_M_PUSHED, 0},
	{"unisum_worker_pulled_bytes_total", "counter", "Bytes a worker received from the servers.",
	 CONFIG_ROLE_WORKER, RDV_M_PULLED, 0},
	{"unisum_worker_operations_total", "counter", "Collectives a worker completed.",
	 CONFIG_ROLE_WORKER, RDV_M_OPS, 0},
	{"unisum_worker_step_seconds", "gauge", "A worker's last step: between two rounds' starts.",
	 CONFIG_ROLE_WORKER, RDV_M_STEP_US, 1e-6},
	{"unisum_worker_steps_total", "counter", "Steps a worker completed.", CONFIG_ROLE_WORKER,
	 RDV_M_STEPS, 0},
	{"unisum_worker_local_reduce_bytes_total", "counter",
	 "Bytes a worker summed from its machine's workers in shared memory.", CONFIG_ROLE_WORKER,
	 RDV_M_LOCAL_BYTES, 0},
	{"unisum_worker_compression_input_bytes_total", "counter", "Bytes a worker compressed.",
	 CONFIG_ROLE_WORKER, RDV_M_COMP_IN, 0},
	{"unisum_worker_compression_output_bytes_total", "counter",
	 "What the bytes a worker compressed became.", CONFIG_ROLE_WORKER, RDV_M_COMP_OUT, 0},
	{"unisum_worker_partition_bytes", "gauge", "The partition size in force (autotune's).",
	 CONFIG_ROLE_WORKER, RDV_M_PARTITION_BYTES, 0},
	{"unisum_worker_credit_bytes", "gauge", "The push credit in force (autotune's).",
	 CONFIG_ROLE_WORKER, RDV_M_CREDIT_BYTES, 0},
	{"unisum_server_received_bytes_total", "counter", "Bytes of pushes a server received.",
	 CONFIG_ROLE_SERVER, RDV_M_PUSHED, 0},
	{"unisum_server_sent_bytes_total", "counter", "Bytes of sums a server sent.",
	 CONFIG_ROLE_SERVER, RDV_M_PULLED, 0},
	{"unisum_server_rounds_total", "counter", "Partition rounds a server summed.",
	 CONFIG_ROLE_SERVER, RDV_M_OPS, 0},
	{"unisum_server_keys", "gauge", "Partitions a server holds.", CONFIG_ROLE_SERVER,
	 RDV_M_KEYS, 0},
};

/* Whether n is a member of the job now, with a rank to label it by. */
static bool sched_member(const struct sched_node *n)
{
	return n->registered && !n->retired && n->rank >= 0 &&
	       (n->role == CONFIG_ROLE_WORKER || n->role == CONFIG_ROLE_SERVER);
}

/* Whether n is a member that reported counters, of `role` (-1: any). */
static bool sched_reported(const struct sched_node *n, int role)
{
	return sched_member(n) && n->report_ms != 0 && (role == -1 || n->role == role);
}

/* A label value, escaped as the text format wants. */
static void sched_label_value(FILE *f, const char *v)
{
	for (; *v != '\0'; v++) {
		if (*v == '\\' || *v == '"')
			fputc('\\', f);
		if (*v == '\n')
			fputs("\\n", f);
		else
			fputc(*v, f);
	}
}

/* `role="worker",rank="3",host="10.0.0.2"` */
static void sched_labels(FILE *f, const char *role, int rank, const char *host)
{
	fprintf(f, "role=\"%s\",rank=\"%d\",host=\"", role, rank);
	sched_label_value(f, host);
	fputc('"', f);
}

static void sched_node_labels(FILE *f, const struct sched_node *n)
{
	sched_labels(f, config_role_name(n->role), n->rank, n->host);
}

static void sched_head(FILE *f, const char *name, const char *type, const char *help)
{
	fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void sched_value(FILE *f, uint64_t v, double scale)
{
	if (scale == 0)
		fprintf(f, " %" PRIu64 "\n", v);
	else
		fprintf(f, " %.6f\n", (double)v * scale);
}

/* The scheduler's own process counters, as a node's. */
static void sched_render_self(FILE *f, const struct rdv_scheduler *s, const struct rdv_metrics *me)
{
	sched_head(f, "unisum_process_cpu_seconds_total", "counter",
		   "CPU time of the process, user and system apart.");
	for (int k = 0; k < 2; k++) {
		int idx = k ? RDV_M_CPU_SYS_US : RDV_M_CPU_USER_US;
		fputs("unisum_process_cpu_seconds_total{", f);
		sched_labels(f, "scheduler", 0, s->host);
		fprintf(f, ",mode=\"%s\"} %.6f\n", k ? "system" : "user", (double)me->v[idx] * 1e-6);
		for (int i = 0; i < s->nnodes; i++) {
			const struct sched_node *n = s->nodes[i];
			if (!sched_reported(n, -1))
				continue;
			fputs("unisum_process_cpu_seconds_total{", f);
			sched_node_labels(f, n);
			fprintf(f, ",mode=\"%s\"} %.6f\n", k ? "system" : "user",
				(double)n->report.v[idx] * 1e-6);
		}
	}
}

/* Liveness: up, and how old each node's counters are. */
static void sched_render_up(FILE *f, const struct rdv_scheduler *s, int64_t now)
{
	sched_head(f, "unisum_node_up", "gauge", "1 while the node is connected to the scheduler.");
	fputs("unisum_node_up{", f);
	sched_labels(f, "scheduler", 0, s->host);
	fputs("} 1\n", f);
	for (int i = 0; i < s->nnodes; i++)
		if (sched_member(s->nodes[i])) {
			fputs("unisum_node_up{", f);
			sched_node_labels(f, s->nodes[i]);
			fprintf(f, "} %d\n", s->nodes[i]->gone ? 0 : 1);
		}
	sched_head(f, "unisum_node_report_age_seconds", "gauge",
		   "Seconds since the node's counters last came.");
	for (int i = 0; i < s->nnodes; i++)
		if (sched_reported(s->nodes[i], -1)) {
			fputs("unisum_node_report_age_seconds{", f);
			sched_node_labels(f, s->nodes[i]);
			fprintf(f, "} %.3f\n", (double)(now - s->nodes[i]->report_ms) / 1000);
		}
}

static void sched_render_family(FILE *f, const struct rdv_scheduler *s,
				const struct sched_family *fam, const struct rdv_metrics *me)
{
	sched_head(f, fam->name, fam->type, fam->help);
	if (fam->role == -1) {	/* the scheduler's process too */
		fprintf(f, "%s{", fam->name);
		sched_labels(f, "scheduler", 0, s->host);
		fputc('}', f);
		sched_value(f, fam->idx == RDV_M_STALLS ? log_stalls() : me->v[fam->idx], fam->scale);
	}
	for (int i = 0; i < s->nnodes; i++) {
		const struct sched_node *n = s->nodes[i];
		if (!sched_reported(n, fam->role))
			continue;
		fprintf(f, "%s{", fam->name);
		sched_node_labels(f, n);
		fputc('}', f);
		sched_value(f, n->report.v[fam->idx], fam->scale);
	}
}

/* What the workers pushed to and pulled from each server, summed over
 * them (labelled by the server alone: a series per worker and server
 * would be W x S of them). */
static void sched_render_per_server(FILE *f, const struct rdv_scheduler *s)
{
	uint32_t S = (uint32_t)s->num_servers;
	uint64_t *sum = calloc(2 * (size_t)S + 1, sizeof *sum);
	if (sum == NULL)
		return;
	for (int i = 0; i < s->nnodes; i++) {
		const struct sched_node *n = s->nodes[i];
		if (!sched_reported(n, CONFIG_ROLE_WORKER))
			continue;
		for (uint32_t j = 0; j < n->report.nservers && j < S; j++) {
			sum[j] += n->report.server_bytes[j];
			sum[S + j] += n->report.server_pulled[j];
		}
	}
	for (int k = 0; k < 2; k++) {
		const char *name = k ? "unisum_pulled_from_server_bytes_total"
				     : "unisum_pushed_to_server_bytes_total";
		sched_head(f, name, "counter", k ? "Bytes the workers received from each server."
						 : "Bytes the workers pushed to each server.");
		for (uint32_t j = 0; j < S; j++)
			fprintf(f, "%s{server=\"%u\"} %" PRIu64 "\n", name, j, sum[k * S + j]);
	}
	free(sum);
}

/* The workers' operations' latency histogram. */
static void sched_render_workers(FILE *f, const struct rdv_scheduler *s)
{
	const char *name = "unisum_worker_operation_seconds";
	sched_head(f, name, "histogram", "Time from a collective's start to its completion.");
	for (int i = 0; i < s->nnodes; i++) {
		const struct sched_node *n = s->nodes[i];
		if (!sched_reported(n, CONFIG_ROLE_WORKER))
			continue;
		uint64_t cum = 0;
		for (int b = 0; b < RDV_LAT_BUCKETS; b++) {
			cum += n->report.lat[b];
			fprintf(f, "%s_bucket{", name);
			sched_node_labels(f, n);
			if (b < RDV_LAT_BUCKETS - 1)
				fprintf(f, ",le=\"%g\"} %" PRIu64 "\n", (double)rdv_lat_bounds_us[b] * 1e-6, cum);
			else
				fprintf(f, ",le=\"+Inf\"} %" PRIu64 "\n", cum);
		}
		fprintf(f, "%s_sum{", name);
		sched_node_labels(f, n);
		fprintf(f, "} %.6f\n%s_count{", (double)n->report.v[RDV_M_OP_SUM_US] * 1e-6, name);
		sched_node_labels(f, n);
		fprintf(f, "} %" PRIu64 "\n", cum);
	}
}

/* Each server's share of the bytes under Theorem 1 (the placement's
 * weights), and the job's own gauges. */
static void sched_render_job(FILE *f, const struct rdv_scheduler *s)
{
	sched_head(f, "unisum_server_share", "gauge",
		   "The server's share of the bytes placed (Theorem 1; the placement's weights).");
	for (int i = 0; i < s->nnodes; i++) {
		const struct sched_node *n = s->nodes[i];
		if (!sched_member(n) || n->role != CONFIG_ROLE_SERVER || n->rank >= s->num_servers)
			continue;
		double w = s->placement.weights != NULL ? s->placement.weights[n->rank]
							: 1.0 / s->num_servers;
		fputs("unisum_server_share{", f);
		sched_node_labels(f, n);
		fprintf(f, "} %.6f\n", w);
	}
	sched_head(f, "unisum_job_workers", "gauge", "Worker processes in the job.");
	fprintf(f, "unisum_job_workers %d\n", s->num_workers);
	sched_head(f, "unisum_job_servers", "gauge", "Servers in the job.");
	fprintf(f, "unisum_job_servers %d\n", s->num_servers);
	sched_head(f, "unisum_job_tensors", "gauge", "Tensors declared now.");
	fprintf(f, "unisum_job_tensors %d\n", s->ntensors);
	sched_head(f, "unisum_job_failed", "gauge", "1 once the job failed.");
	fprintf(f, "unisum_job_failed %d\n", s->error != 0);
	sched_head(f, "unisum_job_failovers_total", "counter", "Servers failed over so far.");
	fprintf(f, "unisum_job_failovers_total %d\n", s->failovers);
	sched_head(f, "unisum_job_reforms_total", "counter", "Times an elastic job re-formed.");
	fprintf(f, "unisum_job_reforms_total %u\n", (unsigned)s->gen);
}

/* Every host's network counters, once: the largest any of its nodes
 * reported. */
static void sched_render_hosts(FILE *f, const struct rdv_scheduler *s)
{
	sched_head(f, "unisum_host_network_bytes_total", "counter",
		   "Bytes through the host's network interfaces (loopback aside).");
	for (int i = 0; i < s->nnodes; i++) {
		const struct sched_node *n = s->nodes[i];
		if (!sched_reported(n, -1))
			continue;
		bool seen = false;
		uint64_t rx = n->report.v[RDV_M_NET_RX], tx = n->report.v[RDV_M_NET_TX];
		for (int j = 0; j < s->nnodes && !seen; j++) {
			const struct sched_node *m = s->nodes[j];
			if (j == i || !sched_reported(m, -1) || strcmp(m->host, n->host) != 0)
				continue;
			seen = j < i;
			rx = m->report.v[RDV_M_NET_RX] > rx ? m->report.v[RDV_M_NET_RX] : rx;
			tx = m->report.v[RDV_M_NET_TX] > tx ? m->report.v[RDV_M_NET_TX] : tx;
		}
		for (int k = 0; k < 2 && !seen; k++) {
			fputs("unisum_host_network_bytes_total{host=\"", f);
			sched_label_value(f, n->host);
			fprintf(f, "\",direction=\"%s\"} %" PRIu64 "\n", k ? "tx" : "rx", k ? tx : rx);
		}
	}
}

/* The stalls now: each node's longest wait, and the scheduler's barriers. */
static void sched_render_stalls(FILE *f, const struct rdv_scheduler *s, int64_t now)
{
	static const char *const groups[4] = {"", "the workers'", "the servers'", "every node's"};
	sched_head(f, "unisum_stall_seconds", "gauge",
		   "How long each stall now has waited, named by `what`.");
	for (int i = 0; i < s->nnodes; i++) {
		const struct sched_node *n = s->nodes[i];
		if (!sched_reported(n, -1) || n->report.v[RDV_M_STALL_MS] == 0 ||
		    now - n->report_ms > 3 * (int64_t)s->heartbeat_ms)
			continue;
		fputs("unisum_stall_seconds{", f);
		sched_node_labels(f, n);
		fputs(",what=\"", f);
		sched_label_value(f, n->report.stall);
		fprintf(f, "\"} %.3f\n", (double)n->report.v[RDV_M_STALL_MS] / 1000);
	}
	for (int g = 1; g < 4; g++) {
		int64_t waited = s->barrier_since[g] != 0 ? now - s->barrier_since[g] : 0;
		if (waited < s->stall_warn_ms)
			continue;
		int missing = 0;
		for (int i = 0; i < s->nnodes; i++)
			missing += sched_member(s->nodes[i]) && !s->nodes[i]->in_barrier[g] &&
				   ((g & 1 && s->nodes[i]->role == CONFIG_ROLE_WORKER) ||
				    (g & 2 && s->nodes[i]->role == CONFIG_ROLE_SERVER));
		fputs("unisum_stall_seconds{", f);
		sched_labels(f, "scheduler", 0, s->host);
		fprintf(f, ",what=\"%s barrier waits for %d node(s)\"} %.3f\n", groups[g], missing,
			(double)waited / 1000);
	}
}

/* /metrics: everything, under s->lock.  A malloc'd text, or NULL. */
static char *sched_render(struct rdv_scheduler *s, size_t *len)
{
	char *text = NULL;
	FILE *f = open_memstream(&text, len);
	if (f == NULL)
		return NULL;
	struct rdv_metrics me = {0};
	rdv_metrics_process(&me);
	int64_t now = timing_now_ms();
	pthread_mutex_lock(&s->lock);
	sched_render_up(f, s, now);
	sched_render_self(f, s, &me);
	for (size_t i = 0; i < sizeof sched_families / sizeof sched_families[0]; i++)
		sched_render_family(f, s, &sched_families[i], &me);
	sched_render_workers(f, s);
	sched_render_per_server(f, s);
	sched_render_job(f, s);
	sched_render_hosts(f, s);
	sched_render_stalls(f, s, now);
	pthread_mutex_unlock(&s->lock);
	if (fclose(f) != 0) {
		free(text);
		return NULL;
	}
	return text;
}

static void sched_http_get(void *arg, const char *path, struct http_reply *r)
{
	struct rdv_scheduler *s = arg;
	if (strcmp(path, "/metrics") == 0) {
		r->body = sched_render(s, &r->len);
		r->status = r->body != NULL ? 200 : 500;
		r->type = "text/plain; version=0.0.4; charset=utf-8";
	} else if (strcmp(path, "/") == 0 || strcmp(path, "/index.html") == 0) {
		r->body = malloc(sched_metrics_page_len);
		r->status = r->body != NULL ? 200 : 500;
		if (r->body != NULL) {
			memcpy(r->body, sched_metrics_page, sched_metrics_page_len);
			r->len = sched_metrics_page_len;
		}
		r->type = "text/html; charset=utf-8";
	}
}

/* Leaves the port where `unisum top JOB` finds it: /tmp/unisum-UID/JOB.metrics. */
static void sched_job_file(struct rdv_scheduler *s, const struct config *cfg, const char *addr,
			   int port)
{
	char dir[64], job[80];
	snprintf(dir, sizeof dir, "/tmp/unisum-%u", (unsigned)getuid());
	if (mkdir(dir, 0700) != 0 && errno != EEXIST)
		return;
	config_job_id(cfg, job, sizeof job);
	snprintf(s->job_file, sizeof s->job_file, "%s/%s.metrics", dir, job);
	FILE *f = fopen(s->job_file, "w");
	if (f == NULL) {
		s->job_file[0] = '\0';
		return;
	}
	fprintf(f, "%s:%d\n", strcmp(addr, "0.0.0.0") == 0 ? "127.0.0.1" : addr, port);
	fclose(f);
}

int sched_metrics_start(struct rdv_scheduler *s, const struct config *cfg)
{
	if (cfg->metrics_port == 0)
		return 0;
	const char *addr = cfg->metrics_addr[0] != '\0' ? cfg->metrics_addr : s->host;
	char why[300];
	int port = 0;
	int rc = http_server_start(s->loop, addr, cfg->metrics_port, sched_http_get, s, &s->http,
				   &port, why, sizeof why);
	if (rc != 0)
		return log_fail(UNISUM_ECONFIG, "UNISUM_METRICS_PORT=%d: %s (is another job or program "
				"using the port? pick another)", cfg->metrics_port, why);
	sched_job_file(s, cfg, addr, port);
	LOG_INFO("metrics at http://%s:%d/metrics, the live page at http://%s:%d/", addr, port, addr,
		 port);
	return 0;
}

void sched_metrics_stop(struct rdv_scheduler *s)
{
	http_server_free(s->http);
	s->http = NULL;
	if (s->job_file[0] != '\0')
		unlink(s->job_file);
	s->job_file[0] = '\0';
}

int sched_on_report(struct sched_node *n, const void *payload, size_t len)
{
	struct rdv_metrics m;
	int rc = rdv_metrics_decode(payload, len, &m);
	if (rc != 0 || !n->registered) {
		rdv_metrics_free(&m);
		return rc;
	}
	rdv_metrics_free(&n->report);
	n->report = m;
	n->report_ms = timing_now_ms();
	return 0;
}
