/*
 * sched_job.c - the job's fate as the scheduler keeps it: its first
 * failure, told to every node (and, while registration lingers, to nodes
 * that come late), and whether the job is over.  Every function is called
 * with s->lock held.  It calls only sched_nodes.c, so every other file of
 * the scheduler may fail the job.
 */
#include <pthread.h>
#include <stdio.h>

#include "log/log.h"
#include "rendezvous/rendezvous.h"
#include "rendezvous/sched_int.h"
#include "timing/timing.h"

/* sched_fail; `logged`: the failure is logged as this scheduler's ERROR
 * (not when the launcher that runs it has said it already). */
void sched_fail_logged(struct rdv_scheduler *s, int err, const char *why, bool logged)
{
	if (s->error != 0)
		return;
	s->error = err;
	snprintf(s->error_why, sizeof s->error_why, "%s", why);
	if (logged)
		LOG_ERROR("job failed: %s", why);
	/* Nodes still starting would only find the port closed, and could
	 * not say why: until linger_ms from now, a connection that has not
	 * registered yet, and any new one, is answered with this failure
	 * when its REGISTER comes (sched_on_register). */
	bool linger = !s->book_sent && s->linger_ms > 0 && !s->aborted;
	if (linger)
		s->linger_until = timing_now_ms() + s->linger_ms;
	for (int i = 0; i < s->nnodes; i++) {
		struct sched_node *n = s->nodes[i];
		if (!n->gone && (n->registered || n->waiting))
			sched_send_error(n, err, why);
		if (n->registered || n->waiting || !linger)
			sched_hangup(n);
	}
	if (!linger)
		s->tp->listener_shutdown(s->listener);
	pthread_cond_broadcast(&s->changed);
}

/* Records the first failure and tells every other live node.  Called with
 * s->lock held. */
void sched_fail(struct rdv_scheduler *s, int err, const char *why)
{
	sched_fail_logged(s, err, why, true);
}

bool sched_lingers(const struct rdv_scheduler *s)
{
	return s->error != 0 && !s->aborted && s->linger_until > timing_now_ms();
}

bool sched_is_finished(const struct rdv_scheduler *s)
{
	if (s->error != 0 || s->aborted)
		return true;
	if (!s->servers_stopped)
		return false;
	for (int i = 0; i < s->nnodes; i++)
		if (s->nodes[i]->registered && !s->nodes[i]->gone)
			return false;
	return true;
}

void sched_stop_servers_if_done(struct rdv_scheduler *s)
{
	if (s->workers_done >= s->num_workers && !s->servers_stopped && !s->resuming) {
		s->servers_stopped = true;
		struct wire_hdr h = {.type = WIRE_SHUTDOWN};
		for (int i = 0; i < s->nnodes; i++) {
			struct sched_node *m = s->nodes[i];
			if (m->registered && m->role == CONFIG_ROLE_SERVER && !m->lost) {
				m->said_goodbye = true;
				sched_send(m, &h, NULL);
			}
		}
		LOG_INFO("every worker is done; servers told to stop");
		for (int i = 0; i < s->nnodes; i++)
			if (s->nodes[i]->waiting)
				sched_send_error(s->nodes[i], UNISUM_ESHUTDOWN,
						 "the elastic job ended before this worker could join it");
	}
}
