/*
 * metrics.c - a node's own process counters and the codec of the
 * counters a HEARTBEAT carries (metrics.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "log/log.h"
#include "rendezvous/metrics.h"
#include "unisum.h"

const uint64_t rdv_lat_bounds_us[RDV_LAT_BUCKETS - 1] = {
	500, 1000, 2500, 5000, 10000, 25000, 50000, 100000, 250000, 500000,
	1000000, 2500000, 5000000, 10000000,
};

int rdv_lat_bucket(uint64_t us)
{
	int i = 0;
	while (i < RDV_LAT_BUCKETS - 1 && us > rdv_lat_bounds_us[i])
		i++;
	return i;
}

/* The bytes this host's interfaces received and sent, loopback aside
 * (/proc/net/dev: the process's network namespace, so an emulated host's
 * own links).  Zeros when it cannot be read. */
static void rdv_net_bytes(uint64_t *rx, uint64_t *tx)
{
	*rx = *tx = 0;
	FILE *f = fopen("/proc/net/dev", "r");
	if (f == NULL)
		return;
	char line[512];
	while (fgets(line, sizeof line, f) != NULL) {
		char *colon = strchr(line, ':');
		if (colon == NULL)
			continue;	/* the two heading lines */
		*colon = '\0';
		const char *name = line + strspn(line, " ");
		unsigned long long v[9];
		if (strcmp(name, "lo") == 0 ||
		    sscanf(colon + 1, "%llu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1],
			   &v[2], &v[3], &v[4], &v[5], &v[6], &v[7], &v[8]) != 9)
			continue;
		*rx += v[0];	/* receive bytes, then 7 more receive fields */
		*tx += v[8];	/* transmit bytes */
	}
	fclose(f);
}

void rdv_metrics_process(struct rdv_metrics *m)
{
	struct rusage ru;
	if (getrusage(RUSAGE_SELF, &ru) == 0) {
		m->v[RDV_M_CPU_USER_US] = (uint64_t)ru.ru_utime.tv_sec * 1000000 + (uint64_t)ru.ru_utime.tv_usec;
		m->v[RDV_M_CPU_SYS_US] = (uint64_t)ru.ru_stime.tv_sec * 1000000 + (uint64_t)ru.ru_stime.tv_usec;
	}
	long kib = log_read_number("/proc/self/status", "VmRSS:");
	m->v[RDV_M_RSS_BYTES] = kib > 0 ? (uint64_t)kib << 10 : 0;
	rdv_net_bytes(&m->v[RDV_M_NET_RX], &m->v[RDV_M_NET_TX]);
}

void rdv_metrics_encode(const struct rdv_metrics *m, struct wire_buf *b)
{
	wire_buf_u32(b, RDV_M_COUNT);
	for (int i = 0; i < RDV_M_COUNT; i++)
		wire_buf_u64(b, m->v[i]);
	wire_buf_u32(b, RDV_LAT_BUCKETS);
	for (int i = 0; i < RDV_LAT_BUCKETS; i++)
		wire_buf_u64(b, m->lat[i]);
	wire_buf_u32(b, m->nservers);
	for (uint32_t i = 0; i < m->nservers; i++) {
		wire_buf_u64(b, m->server_bytes[i]);
		wire_buf_u64(b, m->server_pulled[i]);
	}
	wire_buf_str(b, m->stall);
}

int rdv_metrics_decode(const void *payload, size_t len, struct rdv_metrics *m)
{
	memset(m, 0, sizeof *m);
	struct wire_reader r;
	wire_reader_init(&r, payload, len);
	if (wire_read_u32(&r) != RDV_M_COUNT)
		return UNISUM_EPROTO;
	for (int i = 0; i < RDV_M_COUNT; i++)
		m->v[i] = wire_read_u64(&r);
	if (wire_read_u32(&r) != RDV_LAT_BUCKETS)
		return UNISUM_EPROTO;
	for (int i = 0; i < RDV_LAT_BUCKETS; i++)
		m->lat[i] = wire_read_u64(&r);
	uint32_t n = wire_read_u32(&r);
	if (r.failed || n > RDV_METRICS_MAX_SERVERS || (size_t)n * 16 > r.left)
		return UNISUM_EPROTO;
	m->nservers = n;
	if (n > 0 && ((m->server_bytes = malloc((size_t)n * 8)) == NULL ||
		      (m->server_pulled = malloc((size_t)n * 8)) == NULL)) {
		rdv_metrics_free(m);
		return UNISUM_ENOMEM;
	}
	for (uint32_t i = 0; i < n; i++) {
		m->server_bytes[i] = wire_read_u64(&r);
		m->server_pulled[i] = wire_read_u64(&r);
	}
	wire_read_str(&r, m->stall, sizeof m->stall);
	if (r.failed || r.left != 0) {
		rdv_metrics_free(m);
		return UNISUM_EPROTO;
	}
	return 0;
}

void rdv_metrics_free(struct rdv_metrics *m)
{
	free(m->server_bytes);
	free(m->server_pulled);
	m->server_bytes = m->server_pulled = NULL;
	m->nservers = 0;
}
