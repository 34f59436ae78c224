/*
 * sched_barrier.c - the scheduler's barriers: a node enters one of role
 * groups 1-3 (RDV_GROUP_WORKERS, RDV_GROUP_SERVERS, both); once every
 * registered node of the group has, each gets BARRIER_DONE.  A barrier
 * that a worker who left will never enter fails the job naming it, and
 * one that waits too long is reported, then fails the job
 * (UNISUM_STALL_WARN_MS, UNISUM_STALL_ABORT_MS).  Everything here runs
 * with s->lock held, on a node's thread or the monitor's.
 */
#include <pthread.h>
#include <stdio.h>

#include "log/log.h"
#include "rendezvous/rendezvous.h"
#include "rendezvous/sched_int.h"
#include "timing/timing.h"
#include "wire/wire.h"

/* Whether nodes of `role` belong to barrier group `group`. */
static bool group_has(int group, int role)
{
	return (role == CONFIG_ROLE_WORKER && (group & RDV_GROUP_WORKERS)) ||
	       (role == CONFIG_ROLE_SERVER && (group & RDV_GROUP_SERVERS));
}

/* A barrier of workers that a worker who said goodbye has not entered can
 * never complete: fails the job naming it (and blames it).  Called with
 * s->lock held. */
void sched_check_left_barriers(struct rdv_scheduler *s)
{
	for (int g = 1; g < 4 && s->error == 0; g++) {
		if (s->barrier_since[g] == 0 || !group_has(g, CONFIG_ROLE_WORKER))
			continue;
		for (int i = 0; i < s->nnodes; i++) {
			struct sched_node *m = s->nodes[i];
			if (!m->registered || m->role != CONFIG_ROLE_WORKER || !m->said_goodbye ||
			    m->in_barrier[g])
				continue;
			char label[160], msg[400];
			snprintf(msg, sizeof msg,
				 "%s left the job (it called shutdown, or its program ended) while the "
				 "other workers wait for it in a barrier: does every worker call "
				 "barrier() the same number of times?",
				 sched_node_label(m, label, sizeof label));
			sched_fail(s, UNISUM_ECONN, msg);
			s->culprit_role = m->role;
			s->culprit_rank = m->rank;
			return;
		}
	}
}

void sched_barrier_settle(struct rdv_scheduler *s, int group)
{
	if (s->resuming || s->barrier_since[group] == 0)
		return;		/* a restarted scheduler waits for every node's report */
	int need = 0, have = 0;
	for (int i = 0; i < s->nnodes; i++) {
		struct sched_node *m = s->nodes[i];
		if (!m->registered || !group_has(group, m->role) || m->lost)
			continue;
		need++;
		have += m->in_barrier[group];
	}
	if (have < need)
		sched_check_left_barriers(s);
	if (have == need) {
		s->barrier_since[group] = 0;
		struct wire_hdr h = {.type = WIRE_BARRIER_DONE, .aux = (uint32_t)group};
		for (int i = 0; i < s->nnodes; i++) {
			struct sched_node *m = s->nodes[i];
			if (!m->registered || !group_has(group, m->role))
				continue;
			m->in_barrier[group] = false;
			sched_send(m, &h, NULL);
		}
	}
}

/* Node n entered the barrier of `group`: once every registered node of
 * the group has, each gets BARRIER_DONE (see sched_int.h). */
void sched_on_barrier(struct rdv_scheduler *s, struct sched_node *n, int group)
{
	pthread_mutex_lock(&s->lock);
	if (!n->registered) {	/* retired (elastic re-form) since it sent it */
		pthread_mutex_unlock(&s->lock);
		return;
	}
	n->in_barrier[group] = true;
	if (s->barrier_since[group] == 0) {
		s->barrier_since[group] = timing_now_ms();
		s->barrier_stall[group] = 0;
	}
	sched_barrier_settle(s, group);
	pthread_mutex_unlock(&s->lock);
}

/* A barrier that some nodes entered and others not for UNISUM_STALL_WARN_MS
 * is logged with the missing ones; with UNISUM_STALL_ABORT_MS the job
 * fails with that message on every rank instead of waiting forever, as a
 * stalled round of a tensor does on the servers.  Called with s->lock
 * held. */
void sched_check_barriers(struct rdv_scheduler *s, int64_t now)
{
	for (int g = 1; g < 4 && s->error == 0; g++) {
		if (s->barrier_since[g] == 0)
			continue;
		int64_t waited = now - s->barrier_since[g];
		int level = s->stall_abort_ms > 0 && waited >= s->stall_abort_ms ? 2
			    : waited >= s->stall_warn_ms			      ? 1
										      : 0;
		if (level <= s->barrier_stall[g])
			continue;
		s->barrier_stall[g] = level;
		char missing[256] = "", msg[600];
		size_t len = 0;
		for (int i = 0; i < s->nnodes && len < sizeof missing - 40; i++) {
			struct sched_node *m = s->nodes[i];
			if (m->registered && group_has(g, m->role) && !m->in_barrier[g])
				len += (size_t)snprintf(missing + len, sizeof missing - len, "%s%s %d",
							len ? ", " : "", config_role_name(m->role), m->rank);
		}
		snprintf(msg, sizeof msg,
			 "stall: a barrier has waited %lld ms for %s, which have not entered it; the "
			 "others have. Does every worker call barrier() (and every collective before "
			 "it) the same number of times?",
			 (long long)waited, missing);
		if (level == 1) {
			log_count_stall();
			LOG_WARN("%s", msg);
		} else {
			LOG_ERROR("%s (UNISUM_STALL_ABORT_MS=%d: failing the job)", msg, s->stall_abort_ms);
			sched_fail(s, UNISUM_ETIMEDOUT, msg);
		}
	}
}
