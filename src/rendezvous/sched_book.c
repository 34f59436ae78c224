/*
 * sched_book.c - the address book: ranks and ids assigned, the book sent to
 * every registered node (at the start and at each elastic re-form), and
 * the workers told how many wait to join.  Called with s->lock held.
 */
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "log/log.h"
#include "rendezvous/rdv_proto.h"
#include "rendezvous/rendezvous.h"
#include "rendezvous/sched_int.h"
#include "timing/timing.h"
#include "wire/wire.h"

/* Gives every registered node of `role` its rank: the one it asked for
 * (UNISUM_SERVER_ID; for a worker machine x local_size + local rank, the
 * machine being UNISUM_WORKER_ID), else the lowest free one in arrival
 * order (only when local_size is 1: with more, every worker asked for a
 * machine).  Then a worker's machine and local rank follow from its rank.
 * Called with s->lock held. */
static int sched_assign_ranks(struct rdv_scheduler *s, int role, int count)
{
	bool *taken = calloc((size_t)count, sizeof *taken);
	if (taken == NULL)
		return UNISUM_ENOMEM;
	int L = role == CONFIG_ROLE_WORKER ? s->local_size : 1;
	int rc = 0;
	for (int i = 0; i < s->nnodes; i++) {
		struct sched_node *n = s->nodes[i];
		n->rank = n->role == role ? -1 : n->rank;
		if (!n->registered || n->role != role || n->req_rank < 0)
			continue;
		int want = n->req_rank * L + n->local_rank;
		if (taken[want]) {
			char why[256];
			if (L > 1)
				snprintf(why, sizeof why,
					 "two workers asked for machine %d, local rank %d (UNISUM_WORKER_ID / "
					 "DMLC_WORKER_ID and UNISUM_LOCAL_RANK / BYTEPS_LOCAL_RANK pairs must be "
					 "unique)", n->req_rank, n->local_rank);
			else
				snprintf(why, sizeof why, "two %ss asked for rank %d (%s must be unique)",
					 config_role_name(role), n->req_rank,
					 role == CONFIG_ROLE_WORKER ? "UNISUM_WORKER_ID / DMLC_WORKER_ID"
								    : "UNISUM_SERVER_ID");
			sched_fail(s, UNISUM_ECONFIG, why);
			rc = UNISUM_ECONFIG;
			goto out_free;
		}
		taken[want] = true;
		n->rank = want;
	}
	int next = 0;
	for (int i = 0; i < s->nnodes; i++) {
		struct sched_node *n = s->nodes[i];
		if (!n->registered || n->role != role)
			continue;
		if (n->rank < 0) {
			while (taken[next])
				next++;
			n->rank = next;
			taken[next] = true;
		}
		n->machine = role == CONFIG_ROLE_WORKER ? n->rank / L : -1;
		n->local_rank = role == CONFIG_ROLE_WORKER ? n->rank % L : 0;
	}
out_free:
	free(taken);
	return rc;
}

/* The address book entry of node n. */
struct rdv_node sched_entry_of(const struct sched_node *n)
{
	struct rdv_node e = {.id = n->id, .role = n->role, .rank = n->rank, .machine = n->machine,
			     .local_rank = n->local_rank, .port = n->port, .pid = n->pid,
			     .rack = n->rack};
	snprintf(e.host, sizeof e.host, "%s", n->host);
	snprintf(e.host_id, sizeof e.host_id, "%s", n->host_id);
	return e;
}

void sched_book_of_one(const struct rdv_scheduler *s, struct wire_buf *b, uint32_t your_id,
		       const struct sched_node *n)
{
	rdv_book_encode_head(b, your_id, (uint32_t)s->local_size, 1);
	struct rdv_node e = sched_entry_of(n);
	rdv_book_encode_node(b, &e);
}

/* Assigns ranks and ids and sends every node the address book.  Called
 * with s->lock held once all nodes have registered. */
int sched_send_addrbook(struct rdv_scheduler *s)
{
	/* Requested ranks first, then everybody else by arrival. */
	int rc = sched_assign_ranks(s, CONFIG_ROLE_SERVER, s->num_servers);
	if (rc == 0)
		rc = sched_assign_ranks(s, CONFIG_ROLE_WORKER, s->num_workers);
	if (rc != 0)
		return rc;
	for (int i = 0; i < s->nnodes; i++) {
		struct sched_node *n = s->nodes[i];
		if (n->registered)
			n->id = n->role == CONFIG_ROLE_SERVER ? 1 + (uint32_t)n->rank
							      : 1 + (uint32_t)s->num_servers + (uint32_t)n->rank;
	}

	for (int i = 0; i < s->nnodes; i++) {
		struct sched_node *me = s->nodes[i];
		if (!me->registered)
			continue;
		struct wire_buf b;
		wire_buf_init(&b);
		rdv_book_encode_head(&b, me->id, (uint32_t)s->local_size, (uint32_t)s->registered);
		for (int j = 0; j < s->nnodes; j++) {
			struct sched_node *n = s->nodes[j];
			if (!n->registered)
				continue;
			struct rdv_node entry = sched_entry_of(n);
			rdv_book_encode_node(&b, &entry);
		}
		struct wire_hdr h = {.type = WIRE_ADDRBOOK, .round = s->gen, .payload_len = b.len};
		if (b.failed)
			rc = UNISUM_ENOMEM;
		else
			sched_send(me, &h, b.data);
		wire_buf_fini(&b);
	}
	s->book_sent = true;
	/* Silence counts from now: a node that registered early sent nothing
	 * while it waited for the book (an elastic re-form may take
	 * UNISUM_TIMEOUT_MS). */
	int64_t now = timing_now_ms();
	for (int i = 0; i < s->nnodes; i++)
		if (s->nodes[i]->registered)
			atomic_store(&s->nodes[i]->last_seen_ms, now);
	/* Workers that wait to join (elastic) are announced once the others
	 * can read it. */
	if (s->elastic && s->nwaiting > 0)
		sched_announce_waiting(s);
	/* Wakes the accepting thread, unless replacement servers may come
	 * (failover) or workers join (elastic): it accepts them until the job
	 * ends. */
	if (!(s->server_failover && s->num_servers > 1) && !s->elastic)
		s->tp->listener_shutdown(s->listener);
	sched_place_roles(s);
	if (s->gen == 0)
		LOG_INFO("all %d servers and %d workers on %d machines registered", s->num_servers,
			 s->num_workers, s->num_machines);
	atomic_fetch_add(&s->books, 1);
	return rc;
}

/* Tells every worker of the job how many wait to join (RESIZE). */
void sched_announce_waiting(struct rdv_scheduler *s)
{
	struct wire_hdr h = {.type = WIRE_RESIZE, .aux = (uint32_t)s->nwaiting};
	for (int i = 0; i < s->nnodes; i++) {
		struct sched_node *o = s->nodes[i];
		if (o->registered && !o->gone && o->role == CONFIG_ROLE_WORKER)
			sched_send(o, &h, NULL);
	}
}
