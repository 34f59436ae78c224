/*
 * sched_nodes.c - the scheduler's side of one node's connection: sending
 * to it (each node's send_lock serialises writes, taken after s->lock when
 * both are held), reading from it, naming it in messages, and taking what
 * its REGISTER says of it.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include "rendezvous/rdv_proto.h"
#include "rendezvous/rendezvous.h"
#include "rendezvous/sched_int.h"
#include "timing/timing.h"
#include "wire/wire.h"

int sched_send(struct sched_node *n, const struct wire_hdr *h, const void *payload)
{
	pthread_mutex_lock(&n->send_lock);
	int rc = n->s->tp->send(n->conn, h, payload);
	pthread_mutex_unlock(&n->send_lock);
	return rc;
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

/* Reads node n's next message: its header into *h and its payload into
 * *payload (malloc'd, NULL when empty; the caller frees it).  0 or an
 * error with why set. */
int sched_recv(struct sched_node *n, struct wire_hdr *h, void **payload, char *why,
		      size_t len)
{
	struct rdv_scheduler *s = n->s;
	*payload = NULL;
	int rc = s->tp->recv_header(n->conn, h, why, len);
	if (rc != 0)
		return rc;
	atomic_store(&n->last_seen_ms, timing_now_ms());
	if (h->payload_len == 0)
		return 0;
	*payload = malloc(h->payload_len);
	if (*payload == NULL) {
		snprintf(why, len, "out of memory");
		return UNISUM_ENOMEM;
	}
	rc = s->tp->recv_payload(n->conn, *payload, h->payload_len);
	if (rc != 0)
		snprintf(why, len, "connection closed");
	return rc;
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
