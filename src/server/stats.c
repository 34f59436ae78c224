/*
 * stats.c - what a server tells the scheduler's metrics about itself
 * (rendezvous/metrics.h): the bytes it received and sent, the rounds it
 * summed, the keys it holds, and its longest wait now, which each
 * engine's stall check keeps (engine.c).
 */
#include <stdio.h>
#include <string.h>

#include "log/log.h"
#include "server/srv_int.h"

void srv_metrics(void *arg, struct rdv_metrics *m)
{
	struct server *srv = arg;
	m->v[RDV_M_PUSHED] = atomic_load(&srv->bytes_in);
	m->v[RDV_M_PULLED] = atomic_load(&srv->bytes_out);
	m->v[RDV_M_OPS] = atomic_load(&srv->rounds);
	m->v[RDV_M_STALLS] = log_stalls();
	pthread_mutex_lock(&srv->lock);
	m->v[RDV_M_KEYS] = srv->nkeys;
	pthread_mutex_unlock(&srv->lock);
	for (int i = 0; i < srv->nengines; i++) {
		struct srv_engine *e = &srv->engines[i];
		pthread_mutex_lock(&e->lock);
		if (e->stall_ms > 0 && (uint64_t)e->stall_ms > m->v[RDV_M_STALL_MS]) {
			m->v[RDV_M_STALL_MS] = (uint64_t)e->stall_ms;
			snprintf(m->stall, sizeof m->stall, "%s", e->stall);
		}
		pthread_mutex_unlock(&e->lock);
	}
}
