/*
 * sched_monitor.c - the scheduler's monitor: heartbeats, silence, stalled
 * barriers and a start that never completes (see scheduler.c for the rest
 * of the scheduler, and sched_int.h for the state they share).
 *
 * It is a timer of the scheduler's loop, every heartbeat_ms.  It owns
 * nothing: everything it reads and changes is under s->lock, which it
 * takes once a round; it writes to nodes with sched_send, which queues
 * and never blocks.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "log/log.h"
#include "rendezvous/rendezvous.h"
#include "rendezvous/sched_int.h"
#include "timing/timing.h"
#include "wire/wire.h"

/* Whether node n still has to prove it is alive. */
static bool sched_node_is_watched(const struct sched_node *n)
{
	return n->registered && !n->gone && !n->said_goodbye && !n->lost;
}

/* Every heartbeat_ms: a heartbeat to every live node, and the job fails,
 * naming the node, when one has been silent for timeout_ms (hung, stopped
 * or cut off: a crash closes the connection and is caught sooner). */
/* Appends `text` to buf (of len, holding *used bytes), quietly cut. */
static void sched_append(char *buf, size_t len, size_t *used, const char *text)
{
	if (*used < len)
		*used += (size_t)snprintf(buf + *used, len - *used, "%s", text);
}

/* Names the nodes that have not registered yet into buf, as their labels
 * will read once they do; returns how many there are.  When exactly one
 * is missing and its rank is known, *role and *rank name it, else *role
 * is CONFIG_ROLE_NONE.  Called with s->lock held. */
static int sched_missing(const struct rdv_scheduler *s, char *buf, size_t len, int *role, int *rank)
{
	size_t used = 0;
	int missing = 0;
	bool known = true;
	buf[0] = '\0';
	*role = CONFIG_ROLE_NONE;
	*rank = -1;
	for (int r = 0; r < 2; r++) {
		int want = r == 0 ? CONFIG_ROLE_SERVER : CONFIG_ROLE_WORKER;
		int L = r == 0 ? 1 : s->local_size;
		int total = (r == 0 ? s->num_servers : s->num_machines) * L;
		int have = 0, anonymous = 0;
		for (int i = 0; i < s->nnodes; i++) {
			const struct sched_node *n = s->nodes[i];
			have += n->registered && n->role == want;
			anonymous += n->registered && n->role == want && n->req_rank < 0;
		}
		char one[128];
		if (L == 0) {	/* the local size comes with the first worker */
			snprintf(one, sizeof one, "%severy worker (%d machines)", used ? ", " : "",
				 s->num_machines);
			sched_append(buf, len, &used, one);
			missing += s->num_machines;
			known = false;
			continue;
		}
		if (anonymous > 0) {
			/* Nodes without UNISUM_SERVER_ID / UNISUM_WORKER_ID take
			 * free ranks: which ones are missing is not known yet. */
			if (total > have) {
				snprintf(one, sizeof one, "%s%d of %d %ss", used ? ", " : "", total - have,
					 total, config_role_name(want));
				sched_append(buf, len, &used, one);
			}
			missing += total - have;
			known = false;
			continue;
		}
		for (int slot = 0; slot < total; slot++) {
			bool here = false;
			for (int i = 0; i < s->nnodes && !here; i++) {
				const struct sched_node *n = s->nodes[i];
				here = n->registered && n->role == want &&
				       n->req_rank * L + n->local_rank == slot;
			}
			if (here)
				continue;
			missing++;
			*role = want;
			*rank = slot;
			if (L > 1)
				snprintf(one, sizeof one, "%sthe worker of machine %d, local rank %d",
					 used ? ", " : "", slot / L, slot % L);
			else
				snprintf(one, sizeof one, "%s%s %d", used ? ", " : "", config_role_name(want),
					 slot);
			sched_append(buf, len, &used, one);
		}
	}
	if (missing != 1 || !known)
		*role = CONFIG_ROLE_NONE;
	return missing;
}

/* Registration that has not completed start_timeout_ms after the start
 * fails the job, naming who is missing; at stall_warn_ms it is logged
 * once.  Called with s->lock held, before the address book went out. */
static void sched_check_start(struct rdv_scheduler *s, int64_t now)
{
	int64_t waited = now - s->started_ms;
	bool fail = s->start_timeout_ms > 0 && waited >= s->start_timeout_ms;
	if (!fail && (s->start_warned || s->stall_warn_ms <= 0 || waited < s->stall_warn_ms))
		return;
	char missing[768];
	int role, rank;
	sched_missing(s, missing, sizeof missing, &role, &rank);
	if (!fail) {
		s->start_warned = true;
		LOG_WARN("still waiting after %lld ms for %s to register: not started yet, or unable "
			 "to reach this scheduler?", (long long)waited, missing);
		return;
	}
	char msg[1024];
	snprintf(msg, sizeof msg,
		 "the job did not start within %d ms (UNISUM_START_TIMEOUT_MS): %s never registered: "
		 "not started, died before it reached the scheduler, or cannot reach it",
		 s->start_timeout_ms, missing);
	sched_fail(s, UNISUM_ETIMEDOUT, msg);
	s->culprit_role = role;
	s->culprit_rank = rank;
}

/* Node n has been silent for `silent` ms: it is failed over (a server),
 * the elastic job goes on without it, or the job fails naming it.  Returns
 * whether the round of checks ends here.  Called with s->lock held. */
static bool sched_silent(struct rdv_scheduler *s, struct sched_node *n, int64_t silent)
{
	char label[160], msg[700], fo_why[300] = "";
	if (n->role == CONFIG_ROLE_SERVER && s->server_failover &&
	    sched_failover(s, n->rank, fo_why, sizeof fo_why) == 0) {
		/* Its partitions live elsewhere now: cut it off. */
		n->lost = true;
		sched_hangup(n);
		return false;
	}
	char cause[160];
	snprintf(cause, sizeof cause, "silent for %lld ms: hung, stopped or cut off",
		 (long long)silent);
	if (sched_elastic_lost(s, n, cause, fo_why, sizeof fo_why))
		return true;	/* the generation ended: nobody is watched */
	if (fo_why[0] != '\0' && n->role == CONFIG_ROLE_WORKER)
		snprintf(msg, sizeof msg, "%s has sent nothing for %lld ms (hung, stopped or cut "
			 "off), and the elastic job cannot go on without it: %s",
			 sched_node_label(n, label, sizeof label), (long long)silent, fo_why);
	else
		snprintf(msg, sizeof msg,
			 "%s has sent nothing for %lld ms: it is hung, stopped or cut off "
			 "(UNISUM_TIMEOUT_MS=%d)%s%s",
			 sched_node_label(n, label, sizeof label), (long long)silent, s->timeout_ms,
			 fo_why[0] ? "; failover cannot replace it: " : "", fo_why);
	sched_fail(s, UNISUM_ETIMEDOUT, msg);
	s->culprit_role = n->role;
	s->culprit_rank = n->rank;
	return true;
}

/* The monitor, a timer of the scheduler's loop, every heartbeat_ms.
 * Serves: the start (every node registered within start_timeout_ms), an
 * elastic re-form, stalled barriers and the load report, then a heartbeat
 * to each watched node; fails the job, or fails a server over, when a
 * node has been silent for timeout_ms.  Owns nothing; works under
 * s->lock.  Never blocks: sends are queued. */
void sched_monitor_tick(struct loop_timer *t)
{
	struct rdv_scheduler *s = t->arg;
	pthread_mutex_lock(&s->lock);
	int64_t now = timing_now_ms();
	if (sched_is_finished(s)) {
		/* Nothing to watch; the loop ends once lingering is over. */
	} else if (s->reforming) {
		sched_elastic_check(s, now);
	} else if (!s->book_sent) {
		sched_check_start(s, now);
	} else {
		sched_resume_check(s, now);
		sched_log_loads(s, now);
		sched_check_barriers(s, now);
		/* aux 1: send your counters (metrics.h) */
		struct wire_hdr hb = {.type = WIRE_HEARTBEAT, .aux = s->http != NULL};
		for (int i = 0; i < s->nnodes && s->error == 0; i++) {
			struct sched_node *n = s->nodes[i];
			if (!sched_node_is_watched(n))
				continue;
			int64_t silent = now - atomic_load(&n->last_seen_ms);
			if (silent >= s->timeout_ms) {
				if (sched_silent(s, n, silent))
					break;
				continue;
			}
			sched_send(n, &hb, NULL);
		}
	}
	pthread_mutex_unlock(&s->lock);
}
