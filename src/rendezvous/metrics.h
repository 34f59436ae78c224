/*
 * metrics.h - what a node tells the scheduler about itself while the job
 * runs (UNISUM_METRICS_PORT): its counters ride on the heartbeats it
 * sends once the scheduler's heartbeats ask for them (aux 1), and the
 * scheduler serves them in Prometheus's text format (sched_metrics.c).
 *
 * A node's own process counters (CPU, resident memory, its host's network
 * interfaces) are gathered here (metrics.c); a worker or server fills in
 * what only it knows through the callback it gives its client
 * (rdv_client_on_metrics), on the client's loop thread.
 */
#ifndef UNISUM_METRICS_H
#define UNISUM_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "wire/wire.h"

/* The counters and gauges, by index.  Workers and servers read some the
 * same way: PUSHED and PULLED are a worker's bytes sent to and received
 * from the servers, a server's bytes received (pushes) and sent (sums). */
enum rdv_metric {
	RDV_M_CPU_USER_US,	/* getrusage: the whole process */
	RDV_M_CPU_SYS_US,
	RDV_M_RSS_BYTES,
	RDV_M_NET_RX,		/* this host's (network namespace's) interfaces, lo aside */
	RDV_M_NET_TX,
	RDV_M_PUSHED,
	RDV_M_PULLED,
	RDV_M_OPS,		/* worker: operations done; server: partition rounds summed */
	RDV_M_OP_SUM_US,	/* worker: the operations' latencies, summed */
	RDV_M_STEP_US,		/* worker: the last step's time (see worker/stats.c) */
	RDV_M_STEPS,
	RDV_M_LOCAL_BYTES,	/* worker: bytes summed from its machine's workers */
	RDV_M_COMP_IN,		/* worker: bytes it compressed, and what they became */
	RDV_M_COMP_OUT,
	RDV_M_PARTITION_BYTES,	/* worker: the setting in force (autotune's) */
	RDV_M_CREDIT_BYTES,
	RDV_M_KEYS,		/* server: keys (partitions) it holds */
	RDV_M_STALLS,		/* stall warnings this process logged */
	RDV_M_STALL_MS,		/* how long `stall` has waited (0: no stall now) */
	RDV_M_COUNT
};

/* The latency histogram's buckets: bucket i counts operations of at most
 * rdv_lat_bounds_us[i]; the last counts the rest (+Inf). */
#define RDV_LAT_BUCKETS 15
extern const uint64_t rdv_lat_bounds_us[RDV_LAT_BUCKETS - 1];
/* The bucket of a latency of `us` microseconds. */
int rdv_lat_bucket(uint64_t us);

#define RDV_METRICS_MAX_SERVERS 4096
#define RDV_STALL_TEXT 240

struct rdv_metrics {
	uint64_t v[RDV_M_COUNT];
	uint64_t lat[RDV_LAT_BUCKETS];	/* workers: operations by latency */
	uint32_t nservers;		/* workers: bytes pushed to each server ... */
	uint64_t *server_bytes;		/* ... [nservers] (decode: malloc'd, as the next) */
	uint64_t *server_pulled;	/* ... and pulled from it, [nservers] */
	char stall[RDV_STALL_TEXT];	/* the longest wait past UNISUM_STALL_WARN_MS, named */
};

/* Fills m's process counters: CPU, resident memory, the host's network. */
void rdv_metrics_process(struct rdv_metrics *m);

/* The payload of a node's HEARTBEAT: u32 RDV_M_COUNT, that many u64, u32
 * RDV_LAT_BUCKETS, that many u64, u32 nservers, that many {u64 pushed, u64
 * pulled}, str stall.
 * decode: 0, UNISUM_EPROTO (not that shape, or counts this build does not
 * know) or UNISUM_ENOMEM; free the result's array with rdv_metrics_free. */
void rdv_metrics_encode(const struct rdv_metrics *m, struct wire_buf *b);
int rdv_metrics_decode(const void *payload, size_t len, struct rdv_metrics *m);
void rdv_metrics_free(struct rdv_metrics *m);

/* Called on the client's loop thread, about once a heartbeat while the
 * scheduler asks: adds what the node knows to m (zeroed but for the
 * process counters; server_bytes and server_pulled have room for nservers
 * entries). */
typedef void (*rdv_metrics_fn)(void *arg, struct rdv_metrics *m);

#endif /* UNISUM_METRICS_H */
