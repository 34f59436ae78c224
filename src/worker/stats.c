/*
 * stats.c - what a worker counts of itself: unisum_get_stats(), and the
 * counters its heartbeats carry to the scheduler's metrics
 * (rendezvous/metrics.h): operations by latency, the step time, bytes per
 * server, compression, the setting in force, and the longest wait now.
 *
 * A step is the time between the starts of two successive rounds: the
 * first operation of round r + 1 of any tensor ends step r (in a training
 * loop every gradient's tensor runs one round a step).
 */
#include <stdio.h>

#include "pushq/pushq.h"
#include "timing/timing.h"
#include "trace/trace.h"
#include "worker/worker_int.h"

void wk_stats_started(struct worker *w, const struct wk_op *op)
{
	if (!w->step_seen) {
		w->step_seen = true;
	} else if (op->round > w->step_round) {
		w->step_us = (uint64_t)(op->t_start - w->step_start_us);
		w->steps++;
	} else {
		return;
	}
	w->step_round = op->round;
	w->step_start_us = op->t_start;
}

void wk_stats_done(struct worker *w, const struct wk_op *op)
{
	int64_t us = trace_now_us() - op->t_start;
	uint64_t took = us > 0 ? (uint64_t)us : 0;
	atomic_fetch_add(&w->lat[rdv_lat_bucket(took)], 1);
	atomic_fetch_add(&w->lat_sum_us, took);
}

/* *out, whether or not w has joined its job yet. */
static void wk_fill_stats(struct worker *w, unisum_stats *out)
{
	struct pushq_stats st;
	pushq_stats(&w->push_q, &st);
	uint64_t pbytes = tune_partition_bytes(w->tuner);
	*out = (unisum_stats){.credit_bytes = st.credit, .partition_bytes = pbytes,
			      .max_inflight_bytes = st.max_inflight, .partitions_sent = st.taken,
			      .bytes_pulled = atomic_load(&w->bytes_pulled),
			      .operations = atomic_load(&w->operations),
			      .nservers = w->nservers};
	/* Under the lock: worker_leave takes lc and the connections away
	 * under it. */
	pthread_mutex_lock(&w->lock);
	out->local_bytes = w->lc != NULL ? local_summed_bytes(w->lc) : 0;
	for (int s = 0; s < w->nservers && w->conns != NULL; s++) {
		uint64_t bytes = atomic_load(&w->conns[s].bytes_pushed);

		out->bytes_pushed += bytes;
		if (s < UNISUM_STATS_SERVERS)
			out->server_bytes[s] = bytes;
	}
	pthread_mutex_unlock(&w->lock);
}

int worker_get_stats(struct worker *w, unisum_stats *out)
{
	if (wk_require_init(w) != 0)
		return UNISUM_ENOTINIT;
	if (out == NULL)
		return log_fail(UNISUM_EINVAL, "unisum_get_stats: out must not be NULL");
	wk_fill_stats(w, out);
	return 0;
}

/* The operation that has waited longest, into m, when past
 * UNISUM_STALL_WARN_MS.  Called with w->lock held. */
static void wk_metrics_stall(const struct worker *w, struct rdv_metrics *m)
{
	const struct wk_op *oldest = NULL;
	for (int i = 0; i < w->nops; i++) {
		const struct wk_op *op = w->ops[i];
		if (!op->done && (oldest == NULL || op->t_start < oldest->t_start))
			oldest = op;
	}
	if (oldest == NULL)
		return;
	int64_t waited_ms = (trace_now_us() - oldest->t_start) / 1000;
	if (waited_ms < w->cfg.stall_warn_ms)
		return;
	m->v[RDV_M_STALL_MS] = (uint64_t)waited_ms;
	snprintf(m->stall, sizeof m->stall, "worker %d waits for tensor '%.160s' round %u", w->rank,
		 oldest->t->name, oldest->round);
}

void wk_metrics(void *arg, struct rdv_metrics *m)
{
	struct worker *w = arg;
	unisum_stats st;
	wk_fill_stats(w, &st);
	m->v[RDV_M_PUSHED] = st.bytes_pushed;
	m->v[RDV_M_PULLED] = st.bytes_pulled;
	m->v[RDV_M_OPS] = st.operations;
	m->v[RDV_M_LOCAL_BYTES] = st.local_bytes;
	m->v[RDV_M_PARTITION_BYTES] = st.partition_bytes;
	m->v[RDV_M_CREDIT_BYTES] = st.credit_bytes;
	m->v[RDV_M_COMP_IN] = atomic_load(&w->comp_in);
	m->v[RDV_M_COMP_OUT] = atomic_load(&w->comp_out);
	m->v[RDV_M_OP_SUM_US] = atomic_load(&w->lat_sum_us);
	m->v[RDV_M_STALLS] = log_stalls();
	for (int i = 0; i < RDV_LAT_BUCKETS; i++)
		m->lat[i] = atomic_load(&w->lat[i]);
	pthread_mutex_lock(&w->lock);
	m->v[RDV_M_STEP_US] = w->step_us;
	m->v[RDV_M_STEPS] = w->steps;
	for (uint32_t s = 0; s < m->nservers && (int)s < w->nservers && w->conns != NULL; s++) {
		m->server_bytes[s] = atomic_load(&w->conns[s].bytes_pushed);
		m->server_pulled[s] = atomic_load(&w->conns[s].bytes_pulled);
	}
	wk_metrics_stall(w, m);
	pthread_mutex_unlock(&w->lock);
}
