/*
 * sched_nodes.c - the scheduler's side of one node's connection: sending
 * to it (queued on its loop connection, which any thread may do, and
 * never blocking), hanging up, naming it in messages, how its process
 * ended when it was this one's child, and taking what its REGISTER says
 * of it.
 */
#include <pthread.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include "log/log.h"
#include "rendezvous/rdv_proto.h"
#include "rendezvous/rendezvous.h"
#include "rendezvous/sched_int.h"
#include "timing/timing.h"
#include "wire/wire.h"

int sched_send(struct sched_node *n, const struct wire_hdr *h, const void *payload)
{
	int rc = loop_conn_send(n->lc, h, payload);
	if (rc == TP_AGAIN) {
		/* LOOP_CONN_CAP of control messages unread: it is hung. */
		char label[160];
		LOG_ERROR("%s reads nothing the scheduler sends (%zu bytes wait for it): cutting it off",
			  sched_node_label(n, label, sizeof label), loop_conn_queued(n->lc));
		loop_conn_shutdown(n->lc);
		rc = UNISUM_ECONN;
	}
	return rc;
}

/* How long a last word may wait for a node's socket to take it. */
#define SCHED_HANGUP_FLUSH_MS 200

void sched_hangup(struct sched_node *n)
{
	loop_conn_flush(n->lc, SCHED_HANGUP_FLUSH_MS);
	loop_conn_shutdown(n->lc);
}

const char *sched_node_label(const struct sched_node *n, char *buf, size_t len)
{
	const char *peer = n->s->tp->peer_name(n->conn);
	if (!n->registered)
		snprintf(buf, len, "unregistered peer %s", peer);
	else if (n->role == CONFIG_ROLE_WORKER && n->local_size > 1 && !n->s->book_sent)
		snprintf(buf, len, "the worker of machine %d, local rank %d (%s)", n->req_rank,
			 n->local_rank, peer);
	else if (!n->s->book_sent && n->req_rank >= 0)	/* its rank will be the one it asked */
		snprintf(buf, len, "%s %d (%s)", config_role_name(n->role), n->req_rank, peer);
	else if (!n->s->book_sent)
		snprintf(buf, len, "a %s not given a rank yet (%s)", config_role_name(n->role), peer);
	else if (n->role == CONFIG_ROLE_WORKER && n->local_size > 1)
		snprintf(buf, len, "worker %d (machine %d, local rank %d; %s)", n->rank, n->machine,
			 n->local_rank, peer);
	else
		snprintf(buf, len, "%s %d (%s)", config_role_name(n->role), n->rank, peer);
	return buf;
}

/* Sends node n the job-level ERROR `err` with text `why`. */
void sched_send_error(struct sched_node *n, int err, const char *why)
{
	struct wire_buf b;
	wire_buf_init(&b);
	struct wire_hdr h = {0};
	if (wire_error_build(&h, &b, err, why) == 0)
		sched_send(n, &h, b.data);
	wire_buf_fini(&b);
}

/* Sends h (and payload) to every worker still connected, or with
 * `joined_only` to those that joined.  Called with s->lock held. */
void sched_send_workers(struct rdv_scheduler *s, const struct wire_hdr *h,
			       const void *payload, bool joined_only)
{
	for (int i = 0; i < s->nnodes; i++) {
		struct sched_node *m = s->nodes[i];
		if (!m->registered || m->gone || m->role != CONFIG_ROLE_WORKER)
			continue;
		if (joined_only && (s->joined == NULL || m->rank < 0 || m->rank >= s->num_workers ||
				    !s->joined[m->rank]))
			continue;
		sched_send(m, h, payload);
	}
}

void sched_take_register(struct sched_node *n, const struct rdv_register *m)
{
	n->role = m->role;
	n->port = m->port;
	n->local_rank = 0;
	n->local_size = 1;
	snprintf(n->host, sizeof n->host, "%s", m->host);
	n->pid = m->pid;
	snprintf(n->host_id, sizeof n->host_id, "%s", m->host_id);
	n->rack = m->rack;
	atomic_store(&n->last_seen_ms, timing_now_ms());
}

/* The ends of this process's children that the launcher reaped (the
 * scheduler runs in the launcher's process: a child reaped there can no
 * longer be waited for here), newest last, in a ring. */
enum { RDV_CHILD_ENDS = 256, RDV_CHILD_END_MS = 30000 };
static struct {
	pthread_mutex_t lock;
	struct {
		siginfo_t info;
		int64_t at_ms;		/* when noted: a pid comes back, in time */
	} ends[RDV_CHILD_ENDS];
	unsigned next;
} rdv_child_ends = {.lock = PTHREAD_MUTEX_INITIALIZER};

void rdv_note_child_end(const siginfo_t *info)
{
	pthread_mutex_lock(&rdv_child_ends.lock);
	unsigned i = rdv_child_ends.next++ % RDV_CHILD_ENDS;
	rdv_child_ends.ends[i].info = *info;
	rdv_child_ends.ends[i].at_ms = timing_now_ms();
	pthread_mutex_unlock(&rdv_child_ends.lock);
}

/* How child `pid` ended, if the launcher noted it lately; the note is
 * taken (a later process of the same pid is another). */
static bool rdv_child_end(pid_t pid, siginfo_t *info)
{
	bool found = false;
	int64_t now = timing_now_ms();
	pthread_mutex_lock(&rdv_child_ends.lock);
	for (unsigned i = 0; i < RDV_CHILD_ENDS && !found; i++) {
		unsigned k = (rdv_child_ends.next - 1 - i) % RDV_CHILD_ENDS;
		siginfo_t *e = &rdv_child_ends.ends[k].info;
		if (e->si_pid == pid && now - rdv_child_ends.ends[k].at_ms <= RDV_CHILD_END_MS) {
			*info = *e;
			e->si_pid = 0;
			found = true;
		}
	}
	pthread_mutex_unlock(&rdv_child_ends.lock);
	return found;
}

bool sched_node_end(const struct rdv_scheduler *s, const struct sched_node *n, char *buf,
		    size_t len)
{
	char me[64];
	rdv_host_identity(me, sizeof me);
	if (n->pid <= 0 || strcmp(me, n->host_id) != 0)
		return false;
	siginfo_t info = {0};
	/* Its socket closes a moment before it can be waited for. */
	for (int i = 0; i < 100 && info.si_pid == 0; i++) {
		if (waitid(P_PID, (id_t)n->pid, &info, WEXITED | WNOHANG | WNOWAIT) != 0) {
			/* Not a child of this process, or one the launcher
			 * reaped first (it notes how it ended before). */
			if (!rdv_child_end((pid_t)n->pid, &info))
				return false;
			break;
		}
		if (info.si_pid == 0)
			usleep(2000);
	}
	if (info.si_pid == 0)
		return false;
	if (info.si_code == CLD_EXITED) {
		snprintf(buf, len, "exited with status %d", info.si_status);
		return true;
	}
	char killed[400];
	log_killed(info.si_status, info.si_code == CLD_DUMPED, s->oom_kills, killed, sizeof killed);
	snprintf(buf, len, "was %s", killed);
	return true;
}

void sched_send_tune(struct rdv_scheduler *s, const struct wire_hdr *h, const void *payload)
{
	struct wire_hdr out = {.type = WIRE_TUNE, .round = h->round, .payload_len = h->payload_len};
	sched_send_workers(s, &out, payload, false);
}
