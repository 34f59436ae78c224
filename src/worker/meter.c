/*
 * meter.c - the meter of fit mode (UNISUM_AUTOTUNE=2): worker 0 measures
 * what its pushes see of the network (bytes, busy time, the shortest
 * acknowledgement), from which autotune fits the partition size and the
 * credit (cuts.c, tune.c).  Its state is w->meter, under its own lock;
 * the connection threads report to it.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <unistd.h>

#include "rendezvous/rendezvous.h"
#include "timing/timing.h"
#include "worker/worker_int.h"

/* Fit mode: worker 0 measures what its pushes see of the network. */
bool wk_metering(const struct worker *w)
{
	return w->cfg.autotune == 2 && w->rank == 0;
}

/* Job j's data push is about to go out over TCP on connection c. */
void wk_meter_sent(struct wk_conn *c, struct wk_job *j)
{
	struct wk_meter *m = &c->w->meter;
	int64_t now = timing_now_us();
	j->t_sent_us = now;	/* under c->lock (the caller's): the ack reads it */
	pthread_mutex_lock(&m->lock);
	if (m->inflight++ == 0)
		m->busy_since = now;
	pthread_mutex_unlock(&m->lock);
}

/* A metered push of `bytes`, sent at `sent`, was acknowledged. */
void wk_meter_acked(struct worker *w, size_t bytes, int64_t sent)
{
	struct wk_meter *m = &w->meter;
	int64_t now = timing_now_us();
	pthread_mutex_lock(&m->lock);
	m->bytes += bytes;
	m->pushes++;
	if (m->inflight > 0 && --m->inflight == 0)
		m->busy_us += now - m->busy_since;
	if (m->min_ack_us == 0 || now - sent < m->min_ack_us)
		m->min_ack_us = now - sent > 0 ? now - sent : 1;
	pthread_mutex_unlock(&m->lock);
}

/* A push of `bytes` to this host's server (IPC) was acknowledged. */
void wk_meter_local(struct worker *w, size_t bytes)
{
	pthread_mutex_lock(&w->meter.lock);
	w->meter.ipc_bytes += bytes;
	w->meter.pushes++;
	pthread_mutex_unlock(&w->meter.lock);
}

/* CPU-seconds this host's cores have been busy (/proc/stat: all but
 * idle and iowait), what every process here and the kernel's network work
 * spent; -1 when it cannot be read.  Not the worker's own threads: most
 * of what a message costs lands elsewhere (its server's threads, softirq
 * work charged to whoever was running), and more so the smaller it is. */
static double wk_host_busy_s(void)
{
	FILE *f = fopen("/proc/stat", "re");
	if (f == NULL)
		return -1;
	unsigned long long v[10] = {0};
	int n = fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1],
		       &v[2], &v[3], &v[4], &v[5], &v[6], &v[7], &v[8], &v[9]);
	fclose(f);
	long hz = sysconf(_SC_CLK_TCK);
	if (n < 4 || hz <= 0)
		return -1;
	unsigned long long busy = 0;
	for (int i = 0; i < 8; i++)
		busy += i == 3 || i == 4 ? 0 : v[i];	/* guest time is in user already */
	return (double)busy / (double)hz;
}

/* The link's bandwidth from this worker's pushes over it.  A server on
 * this host (share s of the bytes, which this worker sends it over IPC)
 * sends its sums to the other machines over the same uplink as our
 * pushes, at the same time: our pushes, 1 - s of the bytes, get
 * (1 - s) / ((1 - s) + (n - 1) s) of the link.  On the emulated cluster
 * (4 machines at 1 Gbit/s, k = 2) pushes alone measured 75 MB/s.  With
 * out NULL, counting starts anew. */
void wk_meter_read(struct worker *w, struct tune_meas *out)
{
	struct wk_meter *m = &w->meter;
	int n = rdv_client_num_machines(w->rdv);
	double cpu = wk_host_busy_s();
	pthread_mutex_lock(&m->lock);
	if (out == NULL) {
		m->bytes = m->ipc_bytes = m->pushes = 0;
		m->busy_us = m->min_ack_us = 0;
		m->busy_since = timing_now_us();
		m->cpu0_s = cpu;
		pthread_mutex_unlock(&m->lock);
		return;
	}
	int64_t busy = m->busy_us + (m->inflight > 0 ? timing_now_us() - m->busy_since : 0);
	double s = m->bytes + m->ipc_bytes > 0
			   ? (double)m->ipc_bytes / (double)(m->bytes + m->ipc_bytes) : 0;
	double ours = (1 - s) / ((1 - s) + (n - 1) * s);
	*out = (struct tune_meas){
		.bw = busy > 0 && ours > 0 ? (double)m->bytes / ((double)busy / 1e6) / ours : 0,
		.rtt = (double)m->min_ack_us / 1e6, .bytes = m->bytes,
		.all_bytes = m->bytes + m->ipc_bytes, .pushes = m->pushes,
		.cpu_s = cpu >= 0 && m->cpu0_s >= 0 ? cpu - m->cpu0_s : 0};
	pthread_mutex_unlock(&m->lock);
}
