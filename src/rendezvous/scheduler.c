/*
 * scheduler.c - the scheduler: registration, address book, barriers,
 * liveness and shutdown (see rendezvous.h); its tensors are in
 * sched_tensors.c, the state both share in sched_int.h.
 *
 * DESIGN.  One thread runs one event loop (src/loop) that serves every
 * node: it accepts connections until every node has registered (longer
 * with failover or an elastic job), runs each one's handshake, reads its
 * requests and answers them, and runs the monitor (sched_monitor.c) as a
 * timer: heartbeats to every node, the job failed naming a node silent
 * too long, barriers some nodes entered and others not.  So the scheduler
 * has one thread whatever the number of nodes.  Sends are queued on the
 * node's connection and never block, so a node that does not read holds
 * up no one.  All shared state sits under one mutex (`lock`), which the
 * launcher's calls (rdv_scheduler_stop, _abort, ...) take from their own
 * thread; they wake the loop, whose `after` step (sched_after) looks at
 * the job as a whole after every round: whether accepting is over, and
 * whether the job is.  Traffic here is tiny (a few messages per tensor
 * and per barrier), so simplicity wins over throughput.
 */
#include <pthread.h>
#include <sys/epoll.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/prctl.h>

#include "log/log.h"
#include "placement/placement.h"
#include "rendezvous/rdv_proto.h"
#include "rendezvous/rendezvous.h"
#include "rendezvous/sched_int.h"
#include "timing/timing.h"
#include "wire/wire.h"

/* Checks a worker's local size against the job's (learning it from the
 * first worker) and fails the job when they differ or the job grows past
 * RDV_MAX_NODES.  0, or UNISUM_ECONFIG with the reason in `why` (the job
 * has failed; the node is told too).  Called with s->lock held. */
static int sched_check_local_size(struct rdv_scheduler *s, struct sched_node *n, int local_size,
				  const char *host, char *why, size_t why_len)
{
	if (s->local_size == local_size)
		return 0;
	if (s->local_size != 0) {
		snprintf(why, why_len,
			 "a worker at %s (%s) reports UNISUM_LOCAL_SIZE=%d but the first worker reported %d: "
			 "every machine of a job must run the same number of workers",
			 host, s->tp->peer_name(n->conn), local_size, s->local_size);
	} else if ((long)s->num_machines * local_size + s->num_servers > RDV_MAX_NODES) {
		snprintf(why, why_len,
			 "%d machines x UNISUM_LOCAL_SIZE=%d workers + %d servers is more than the %d "
			 "nodes a job can have",
			 s->num_machines, local_size, s->num_servers, RDV_MAX_NODES);
	} else {
		s->local_size = local_size;
		s->num_workers = s->num_machines * local_size;
		return 0;
	}
	sched_send_error(n, UNISUM_ECONFIG, why);
	sched_fail(s, UNISUM_ECONFIG, why);
	return UNISUM_ECONFIG;
}

/* A server registering after the address book went out: it takes the rank
 * of a lost server (the one it asks for, or the lowest), gets the book of
 * the live nodes, and every worker hears where it is (REJOIN): tensors
 * placed from now on may go to it.  Called with s->lock held; 0, or an
 * error (the connection closes) when no server was lost. */
static int sched_on_replacement(struct rdv_scheduler *s, struct sched_node *n,
				const struct rdv_register *m, char *why, size_t len)
{
	int r = -1;
	for (int q = 0; q < s->num_servers && s->lost != NULL; q++)
		if (s->lost[q] && (m->req_rank < 0 || m->req_rank == q) && r < 0)
			r = q;
	if (r < 0) {
		snprintf(why, len, "a server at %s registered while the job runs, but %s",
			 m->host, m->req_rank >= 0 ? "its UNISUM_SERVER_ID is not a lost server's"
						   : "no server was lost");
		return UNISUM_EPROTO;
	}
	sched_take_register(n, m);
	n->req_rank = m->req_rank;
	n->rank = r;
	n->machine = -1;
	n->id = 1 + (uint32_t)r;
	n->registered = true;
	struct wire_buf b;
	wire_buf_init(&b);
	int live = 0;
	for (int i = 0; i < s->nnodes; i++)
		live += s->nodes[i]->registered && !s->nodes[i]->lost;
	rdv_book_encode_head(&b, n->id, (uint32_t)s->local_size, (uint32_t)live);
	for (int i = 0; i < s->nnodes; i++) {
		struct sched_node *o = s->nodes[i];
		if (o->registered && !o->lost) {
			struct rdv_node e = sched_entry_of(o);
			rdv_book_encode_node(&b, &e);
		}
	}
	struct wire_hdr h = {.type = WIRE_ADDRBOOK, .round = s->gen, .payload_len = b.len};
	if (!b.failed)
		sched_send(n, &h, b.data);
	wire_buf_fini(&b);
	/* Every worker connects to it; new placements may use it. */
	wire_buf_init(&b);
	sched_book_of_one(s, &b, 0, n);
	h = (struct wire_hdr){.type = WIRE_REJOIN, .aux = (uint32_t)r, .payload_len = b.len};
	for (int i = 0; i < s->nnodes && !b.failed; i++) {
		struct sched_node *o = s->nodes[i];
		if (o->registered && !o->gone && o->role == CONFIG_ROLE_WORKER)
			sched_send(o, &h, b.data);
	}
	int rc = b.failed ? UNISUM_ENOMEM : 0;
	wire_buf_fini(&b);
	if (rc == 0 && s->replaced == NULL)
		s->replaced = calloc((size_t)s->num_servers, 1);
	if (rc == 0) {
		s->lost[r] = 0;
		if (s->replaced != NULL)
			s->replaced[r] = 1;
		LOG_WARN("server %d is back (%s:%d): tensors placed from now on may go to it", r,
			 n->host, n->port);
		sched_migrate_back(s, r);
	}
	return rc;
}

/* Whether REGISTER m is well formed for this job. */
static bool sched_register_valid(const struct rdv_scheduler *s, const struct rdv_register *m)
{
	bool server = m->role == CONFIG_ROLE_SERVER, worker = m->role == CONFIG_ROLE_WORKER;
	uint32_t local_rank = (uint32_t)m->local_rank, local_size = (uint32_t)m->local_size;
	return (server || worker) && m->port >= 0 && m->port <= 65535 && m->req_rank >= -1 &&
	       m->rack >= -1 && !(worker && m->req_rank >= s->num_machines) &&
	       !(server && m->req_rank >= s->num_servers) &&
	       !(server && (local_rank != 0 || local_size != 1)) && local_size >= 1 &&
	       local_size <= RDV_MAX_LOCAL_SIZE && local_rank < local_size;
}

/* A worker's REGISTER m that the job cannot take (no machine named with
 * several workers a machine, or a local size unlike the others'): the job
 * fails (the node hears why) and UNISUM_EPROTO closes the connection,
 * logging why.  0 when it can.  Called with s->lock held. */
static int sched_worker_refused(struct rdv_scheduler *s, struct sched_node *n,
				const struct rdv_register *m, char *why, size_t why_len)
{
	if (m->local_size > 1 && m->req_rank < 0) {
		/* Its machine's other workers could never find it. */
		snprintf(why, why_len,
			 "a worker at %s (local rank %u of UNISUM_LOCAL_SIZE=%u) did not say which machine "
			 "it is on: with several workers per machine each must set UNISUM_WORKER_ID "
			 "(or DMLC_WORKER_ID)", m->host, (unsigned)m->local_rank,
			 (unsigned)m->local_size);
		sched_send_error(n, UNISUM_ECONFIG, why);
		sched_fail(s, UNISUM_ECONFIG, why);
		return UNISUM_EPROTO;
	}
	if (sched_check_local_size(s, n, m->local_size, m->host, why, why_len) != 0)
		return UNISUM_EPROTO;
	return 0;
}

/* Whether worker REGISTER m's UNISUM_RACK disagrees with the first
 * worker's (set on every worker or on none): then the job fails (the node
 * hears why) and UNISUM_EPROTO closes the connection.  Else the first
 * worker's is noted.  Called with s->lock held. */
static int sched_worker_rack(struct rdv_scheduler *s, struct sched_node *n,
			     const struct rdv_register *m, char *why, size_t why_len)
{
	if (s->worker_rack != -2 && (s->worker_rack < 0) != (m->rack < 0)) {
		snprintf(why, why_len,
			 "a worker at %s (%s) %s UNISUM_RACK but the first worker %s: set it on every "
			 "worker or on none", m->host, s->tp->peer_name(n->conn),
			 m->rack < 0 ? "does not set" : "sets", s->worker_rack < 0 ? "did not" : "did");
		sched_send_error(n, UNISUM_ECONFIG, why);
		sched_fail(s, UNISUM_ECONFIG, why);
		return UNISUM_EPROTO;
	}
	if (s->worker_rack == -2)
		s->worker_rack = m->rack < 0 ? -1 : m->rack;
	return 0;
}

/* Whether REGISTER m's UNISUM_TRANSPORT differs from the first node's
 * that the job took: then the job fails naming both (the node hears why)
 * and UNISUM_EPROTO closes the connection: TCP and UCX cannot reach each
 * other.  Else the first node's is noted.  (A replacement server or a
 * node resuming the job is not checked: its links fail, named, if it
 * differs.)  Called with s->lock held. */
static int sched_check_transport(struct rdv_scheduler *s, struct sched_node *n,
				 const struct rdv_register *m, char *why, size_t why_len)
{
	char who[160];
	snprintf(who, sizeof who, "%s %d at %s", config_role_name(m->role),
		 m->req_rank, m->host);
	if (s->transport[0] == '\0') {
		snprintf(s->transport, sizeof s->transport, "%s", m->transport);
		snprintf(s->transport_who, sizeof s->transport_who, "%s", who);
		return 0;
	}
	if (strcmp(s->transport, m->transport) == 0)
		return 0;
	snprintf(why, why_len, "%s (%s) has UNISUM_TRANSPORT=%s but %s has UNISUM_TRANSPORT=%s: "
		 "every node of a job must use the same transport", who, s->tp->peer_name(n->conn),
		 m->transport, s->transport_who, s->transport);
	sched_send_error(n, UNISUM_ECONFIG, why);
	sched_fail(s, UNISUM_ECONFIG, why);
	return UNISUM_EPROTO;
}

/* A node's REGISTER: checked, then the node counts, or (elastic) waits
 * for the next generation, or (failover) replaces a lost server; the
 * address book goes out once every node has registered.  0, or an error
 * with why set that closes the connection.  On the node's thread. */
static int sched_on_register(struct rdv_scheduler *s, struct sched_node *n, const void *payload,
			     size_t len, char *why, size_t why_len)
{
	struct rdv_register m;
	if (rdv_register_decode(payload, len, &m) != 0 || !sched_register_valid(s, &m)) {
		snprintf(why, why_len, "malformed REGISTER");
		return UNISUM_EPROTO;
	}
	bool server = m.role == CONFIG_ROLE_SERVER, worker = m.role == CONFIG_ROLE_WORKER;
	pthread_mutex_lock(&s->lock);
	if (s->error != 0) {
		/* The job failed while this node was starting (sched_fail):
		 * it is told why, under the lock it would register under. */
		sched_send_error(n, s->error, s->error_why);
		pthread_mutex_unlock(&s->lock);
		snprintf(why, why_len, "the job had failed");
		return UNISUM_ESHUTDOWN;
	}
	if (m.resume.on) {
		int rrc = sched_on_resume(s, n, &m, why, why_len);
		pthread_cond_broadcast(&s->changed);
		pthread_mutex_unlock(&s->lock);
		return rrc;
	}
	if (s->resumed && !n->registered) {
		pthread_mutex_unlock(&s->lock);
		snprintf(why, why_len, "a %s at %s registered afresh with a scheduler that resumes a "
			 "running job: only that job's nodes may come back to it",
			 config_role_name(m.role), m.host);
		return UNISUM_EPROTO;
	}
	int rc = worker ? sched_worker_refused(s, n, &m, why, why_len) : 0;
	if (rc != 0) {
		pthread_mutex_unlock(&s->lock);
		return rc;
	}
	if (sched_elastic_register(s, n, &m, &rc, why, why_len)) {
		pthread_cond_broadcast(&s->changed);
		pthread_mutex_unlock(&s->lock);
		return rc;
	}
	if (server && !n->registered && s->book_sent) {
		rc = sched_on_replacement(s, n, &m, why, why_len);
		pthread_mutex_unlock(&s->lock);
		return rc;
	}
	int have = 0;
	for (int i = 0; i < s->nnodes; i++)
		if (s->nodes[i]->registered && s->nodes[i]->role == m.role)
			have++;
	int limit = server ? s->num_servers : s->num_workers;
	if (n->registered || s->book_sent || have >= limit) {
		pthread_mutex_unlock(&s->lock);
		snprintf(why, why_len, "unexpected REGISTER of a %s: the job already has %d",
			 config_role_name(m.role), limit);
		return UNISUM_EPROTO;
	}
	if ((worker && (rc = sched_worker_rack(s, n, &m, why, why_len)) != 0) ||
	    (rc = sched_check_transport(s, n, &m, why, why_len)) != 0) {
		pthread_mutex_unlock(&s->lock);
		return rc;
	}
	sched_take_register(n, &m);
	n->req_rank = m.req_rank;
	n->local_rank = m.local_rank;
	n->local_size = m.local_size;
	n->registered = true;
	s->registered++;
	LOG_DEBUG("registered %s from %s (%d of %d so far)", config_role_name(m.role), m.host,
		  s->registered, s->num_servers + s->num_workers);
	/* num_workers is 0 until the first worker told its local size. */
	if (s->num_workers > 0 && s->registered == s->num_servers + s->num_workers)
		rc = sched_send_addrbook(s);
	pthread_cond_broadcast(&s->changed);
	pthread_mutex_unlock(&s->lock);
	return rc;
}

/* Worker 0's autotune setting for an epoch: checked, then passed to every
 * worker in the order posted (worker.c waits for it before the epoch). */
static int sched_on_tune(struct rdv_scheduler *s, struct sched_node *n, const struct wire_hdr *h,
			 const void *payload, char *why, size_t len)
{
	struct rdv_tune t;
	if (n->role != CONFIG_ROLE_WORKER || n->rank != 0) {
		snprintf(why, len, "TUNE from a node other than worker 0");
		return UNISUM_EPROTO;
	}
	if (rdv_tune_decode(payload, h->payload_len, h->round, &t) != 0) {
		snprintf(why, len, "malformed TUNE");
		return UNISUM_EPROTO;
	}
	if (sched_resume_defer(s, NULL, h, payload))
		return 0;	/* for every worker, once all are back */
	pthread_mutex_lock(&s->lock);
	sched_send_tune(s, h, payload);
	pthread_mutex_unlock(&s->lock);
	return 0;
}


/* Worker n joined (unisum_join): every worker hears of it (the others
 * announce their push_pulls in flight to the joined, sched_on_announce);
 * once all have, every worker hears that, and who was last. */
static int sched_on_join(struct rdv_scheduler *s, struct sched_node *n, char *why, size_t len)
{
	pthread_mutex_lock(&s->lock);
	int rc = 0;
	if (!n->registered) {	/* retired (elastic re-form) since it sent it */
		pthread_mutex_unlock(&s->lock);
		return 0;
	}
	if (s->joined == NULL && s->num_workers > 0)
		s->joined = calloc((size_t)s->num_workers, 1);
	if (n->role != CONFIG_ROLE_WORKER || n->rank < 0 || n->rank >= s->num_workers) {
		snprintf(why, len, "JOIN from a node that is not a worker");
		rc = UNISUM_EPROTO;
	} else if (s->joined == NULL) {
		snprintf(why, len, "out of memory for JOIN");
		rc = UNISUM_ENOMEM;
	} else if (s->joined[n->rank]) {
		snprintf(why, len, "JOIN from worker %d, which joined already", n->rank);
		rc = UNISUM_EPROTO;
	}
	if (rc != 0) {
		pthread_mutex_unlock(&s->lock);
		return rc;
	}
	s->joined[n->rank] = 1;
	s->njoined++;
	s->join_last = n->rank;
	LOG_DEBUG("worker %d joined (%d of %d)", n->rank, s->njoined, s->num_workers);
	struct wire_hdr h = {.type = WIRE_JOIN, .aux = (uint32_t)n->rank};
	sched_send_workers(s, &h, NULL, false);
	if (s->njoined == s->num_workers) {
		h = (struct wire_hdr){.type = WIRE_JOIN_DONE, .aux = (uint32_t)s->join_last};
		sched_send_workers(s, &h, NULL, false);
		memset(s->joined, 0, (size_t)s->num_workers);
		s->njoined = 0;
	}
	pthread_mutex_unlock(&s->lock);
	return 0;
}

/* A worker runs a push_pull that joined workers must contribute zeros to:
 * passed on to them. */
static int sched_on_announce(struct rdv_scheduler *s, struct sched_node *n,
			     const struct wire_hdr *h, const void *payload, char *why, size_t len)
{
	struct rdv_announce a;
	if (n->role != CONFIG_ROLE_WORKER ||
	    rdv_announce_decode(h, payload, h->payload_len, &a) != 0) {
		snprintf(why, len, "malformed ANNOUNCE");
		return UNISUM_EPROTO;
	}
	struct wire_hdr out = *h;
	out.sender = 0;
	pthread_mutex_lock(&s->lock);
	sched_send_workers(s, &out, payload, true);
	pthread_mutex_unlock(&s->lock);
	return 0;
}

/* A worker said goodbye; when all have, stop the servers. */
static void sched_on_goodbye(struct rdv_scheduler *s, struct sched_node *n)
{
	pthread_mutex_lock(&s->lock);
	if (!n->registered) {	/* retired (elastic re-form) since it sent it */
		pthread_mutex_unlock(&s->lock);
		return;
	}
	if (!n->said_goodbye) {
		n->said_goodbye = true;
		s->workers_done++;
		sched_check_left_barriers(s);
	}
	if (s->workers_done == s->num_workers)
		sched_log_loads(s, INT64_MAX);	/* if not logged yet */
	sched_stop_servers_if_done(s);
	pthread_cond_broadcast(&s->changed);
	pthread_mutex_unlock(&s->lock);
}


/* An ERROR from node n: fail the job for its reason (a stalled round or
 * barrier), or with a key, poison that tensor (its workers disagree on the
 * collective).  0 or UNISUM_EPROTO with why set. */
static int sched_on_error(struct rdv_scheduler *s, struct sched_node *n, const struct wire_hdr *h,
			  const void *payload, char *why, size_t len)
{
	char text[512], label[160], msg[900], lost[96] = "";
	wire_error_decode(payload, h->payload_len, text, sizeof text);
	pthread_mutex_lock(&s->lock);
	int rc = 0;
	if (h->key != 0) {
		rc = sched_poison_reported(s, h->key, text, why, len);
	} else {
		/* After failovers, which servers are gone (a server's error
		 * may come from a state it took over). */
		for (int r = 0, k = 0; s->lost != NULL && r < s->num_servers; r++)
			if (s->lost[r] && (size_t)k < sizeof lost - 12)
				k += snprintf(lost + k, sizeof lost - (size_t)k, "%s%d",
					      k ? ", " : " (servers lost so far: ", r);
		if (lost[0] != '\0')
			strcat(lost, ")");
		snprintf(msg, sizeof msg, "%s: %s%s", sched_node_label(n, label, sizeof label), text,
			 lost);
		sched_fail(s, log_known_error(-(int)h->aux, UNISUM_EREMOTE), msg);
	}
	pthread_mutex_unlock(&s->lock);
	return rc;
}

/* Handles one message of node n.  0, or an error with why set: the
 * connection closes. */
static int sched_dispatch(struct rdv_scheduler *s, struct sched_node *n, const struct wire_hdr *h,
			  const void *payload, char *why, size_t len)
{
	int rc = 0;
	/* An elastic re-form retires nodes from another node's thread;
	 * otherwise only this thread registers n (s->elastic never changes). */
	bool retired = false, registered;
	if (s->elastic) {
		pthread_mutex_lock(&s->lock);
		retired = n->retired;
		registered = n->registered;
		if (retired)
			sched_elastic_retired_msg(s, n, h);
		pthread_mutex_unlock(&s->lock);
	} else {
		registered = n->registered;
	}
	if (retired)
		return 0;
	if (!registered && h->type != WIRE_REGISTER) {
		snprintf(why, len, "%s before REGISTER", wire_type_name(h->type));
		return UNISUM_EPROTO;
	}
	switch (h->type) {
	case WIRE_REGISTER:
		return sched_on_register(s, n, payload, h->payload_len, why, len);
	case WIRE_BARRIER:
		if (h->aux != RDV_GROUP_WORKERS && h->aux != RDV_GROUP_SERVERS && h->aux != RDV_GROUP_ALL) {
			snprintf(why, len, "barrier of unknown group %u", h->aux);
			return UNISUM_EPROTO;
		}
		sched_on_barrier(s, n, (int)h->aux);
		return 0;
	case WIRE_HELD:
		return sched_on_held(s, n, h, payload, why, len);
	case WIRE_DECLARE:
		if (sched_resume_defer(s, n, h, payload))
			return 0;	/* answered once every node is back */
		rc = sched_on_declare(s, n, h, payload, h->payload_len);
		if (rc == UNISUM_EPROTO)
			snprintf(why, len, "malformed DECLARE");
		return rc;
	case WIRE_SHUTDOWN:
		if (n->role == CONFIG_ROLE_WORKER)
			sched_on_goodbye(s, n);
		return 0;
	case WIRE_TUNE:
		return sched_on_tune(s, n, h, payload, why, len);
	case WIRE_HEARTBEAT:
		if (h->payload_len == 0)
			return 0;
		pthread_mutex_lock(&s->lock);
		rc = sched_on_report(n, payload, h->payload_len);
		pthread_mutex_unlock(&s->lock);
		if (rc == UNISUM_EPROTO)
			snprintf(why, len, "malformed HEARTBEAT counters");
		return rc;
	case WIRE_JOIN:
		return sched_on_join(s, n, why, len);
	case WIRE_ANNOUNCE:
		return sched_on_announce(s, n, h, payload, why, len);
	case WIRE_RETIRE:
		pthread_mutex_lock(&s->lock);
		rc = n->registered ? sched_on_forget(s, n, h->key, why, len) : 0;
		pthread_mutex_unlock(&s->lock);
		return rc;
	case WIRE_ERROR:
		return sched_on_error(s, n, h, payload, why, len);
	case WIRE_RESIZE:
		pthread_mutex_lock(&s->lock);
		sched_elastic_resize(s, n);
		pthread_mutex_unlock(&s->lock);
		return 0;
	default:
		snprintf(why, len, "unexpected %s", wire_type_name(h->type));
		return UNISUM_EPROTO;
	}
}

/* Node n's connection ended with rc (why): unless it said goodbye, the
 * job fails naming it, and it is the culprit the launcher blames. */
static void sched_node_gone(struct rdv_scheduler *s, struct sched_node *n, int rc, const char *why)
{
	/* How it ended, where this process launched it: looked at before the
	 * lock (this loop's thread is the one that changes n). */
	char end[400] = "";
	if (n->registered && !n->said_goodbye && rc != UNISUM_EPROTO)
		sched_node_end(s, n, end, sizeof end);
	pthread_mutex_lock(&s->lock);
	n->gone = true;
	if (s->resuming && n->registered) {
		/* Back, then gone before the job went on: as if it never came
		 * back (a worker that finished meanwhile, a server that died). */
		sched_resume_drop(s, n);
		pthread_cond_broadcast(&s->changed);
		pthread_mutex_unlock(&s->lock);
		return;
	}
	char label[160];
	sched_node_label(n, label, sizeof label);
	if (rc == UNISUM_EPROTO || rc == UNISUM_EAUTH)
		LOG_ERROR("closing the connection of %s: %s", label, why);
	char fo_why[300] = "";
	if (s->elastic && (n->waiting || n->retired || s->reforming)) {
		sched_elastic_gone(s, n);
		pthread_cond_broadcast(&s->changed);
		pthread_mutex_unlock(&s->lock);
		return;
	}
	char el_why[300] = "";
	if (n->registered && !n->said_goodbye && s->error == 0 && !s->aborted &&
	    sched_elastic_lost(s, n, rc == UNISUM_EPROTO ? why : "its connection closed without a goodbye",
			       el_why, sizeof el_why)) {
		pthread_cond_broadcast(&s->changed);
		pthread_mutex_unlock(&s->lock);
		return;
	}
	if (n->registered && !n->said_goodbye && !n->lost && s->error == 0 && !s->aborted &&
	    n->role == CONFIG_ROLE_SERVER && rc != UNISUM_EPROTO && s->server_failover &&
	    s->book_sent) {
		if (sched_failover(s, n->rank, fo_why, sizeof fo_why) == 0)
			n->lost = true;
	}
	if (n->registered && !n->said_goodbye && !n->lost && s->error == 0 && !s->aborted) {
		char msg[640];
		if (fo_why[0] != '\0')
			snprintf(msg, sizeof msg,
				 "%s lost its connection to the scheduler without saying goodbye: it "
				 "exited or crashed, and failover cannot replace it: %s", label, fo_why);
		else if (el_why[0] != '\0')
			snprintf(msg, sizeof msg,
				 "%s lost its connection to the scheduler without saying goodbye (it "
				 "exited or crashed), and the elastic job cannot go on without it: %s",
				 label, el_why);
		else if (rc == UNISUM_EPROTO)
			snprintf(msg, sizeof msg, "%s broke the protocol: %s", label, why);
		else if (end[0] != '\0')
			snprintf(msg, sizeof msg, "%s lost its connection to the scheduler without "
				 "saying goodbye: it %s", label, end);
		else
			snprintf(msg, sizeof msg,
				 "%s lost its connection to the scheduler without saying goodbye: it "
				 "exited or crashed; see its own log for the first error",
				 label);
		sched_fail(s, rc == UNISUM_EPROTO ? UNISUM_EPROTO : UNISUM_ECONN, msg);
		s->culprit_role = n->role;
		s->culprit_rank = n->rank;
	}
	pthread_cond_broadcast(&s->changed);
	pthread_mutex_unlock(&s->lock);
}

/* A node's message (its loop connection's on_message): handled, or the
 * connection closes with why.  A peer that proved the secret but whose
 * first message broke the protocol (another wire version, say) is told
 * why first, in this version's header: its own decoder then names both
 * versions. */
static int sched_node_message(struct loop_conn *lc, const struct wire_hdr *h, void *payload,
			      char *why, size_t len)
{
	struct sched_node *n = loop_conn_arg(lc);
	atomic_store(&n->last_seen_ms, timing_now_ms());
	return sched_dispatch(n->s, n, h, payload, why, len);
}

/* Node n's connection ended (on_closed): it is gone (sched_node_gone). */
static void sched_node_closed(struct loop_conn *lc, int rc, const char *why)
{
	struct sched_node *n = loop_conn_arg(lc);
	if (rc == UNISUM_EPROTO && !n->registered) {
		sched_send_error(n, rc, why);
		loop_conn_flush(lc, 200);
	}
	sched_node_gone(n->s, n, rc, why);
}

static const struct loop_conn_ops sched_node_ops = {
	.on_message = sched_node_message,
	.on_closed = sched_node_closed,
};

/* How many connections registration may take: every node plus strangers
 * that connect and fail, at most RDV_MAX_NODES.  Before the first worker
 * told its local size the number of worker processes is unknown, so only
 * RDV_MAX_NODES bounds it.  Called with s->lock held. */
static int sched_max_connections(const struct rdv_scheduler *s)
{
	if (s->local_size == 0)
		return RDV_MAX_NODES;
	int room = 2 * (s->num_workers + s->num_servers) + 64;
	return room < RDV_MAX_NODES ? room : RDV_MAX_NODES;
}

/* Takes accepted connection c as a new node: 0, or the reason it was
 * refused (c freed).  Called with s->lock held, on the loop. */
static int sched_take_conn(struct rdv_scheduler *s, struct tp_conn *c)
{
	sched_elastic_reap(s);
	if (s->nnodes >= sched_max_connections(s)) {
		s->tp->conn_free(c);
		LOG_ERROR("too many connections before registration completed (%d); refusing one",
			  s->nnodes);
		return UNISUM_EPROTO;
	}
	if (s->nnodes == s->cap_nodes) {
		int cap = s->cap_nodes * 2;
		struct sched_node **grown = realloc(s->nodes, (size_t)cap * sizeof *grown);
		if (grown != NULL) {
			s->nodes = grown;
			s->cap_nodes = cap;
		}
	}
	struct sched_node *n = s->nnodes < s->cap_nodes ? calloc(1, sizeof *n) : NULL;
	if (n == NULL || loop_conn_new(s->loop, s->tp, c, true, &sched_node_ops, n, &n->lc) != 0) {
		free(n);
		s->tp->conn_free(c);
		LOG_ERROR("out of memory accepting a connection; refusing it");
		return UNISUM_ENOMEM;
	}
	n->s = s;
	n->conn = c;
	s->nodes[s->nnodes++] = n;
	return 0;
}

/* The listener is watched again (after running out of descriptors). */
static void sched_accept_resume(struct loop_timer *t)
{
	struct rdv_scheduler *s = t->arg;
	if (s->accepting && s->lio.loop == NULL &&
	    loop_io_add(s->loop, &s->lio, s->lio.fd, EPOLLIN, s->lio.fn, s) != 0)
		LOG_ERROR("cannot watch the listener again: no more nodes can connect");
}

/* The listener is readable: accepts every waiting peer.  Running out of
 * descriptors fails the job, naming the limit (a scheduler that cannot
 * hold a connection per node cannot run the job); accepting pauses a
 * moment so that the lingering door stays open to tell nodes why. */
static void sched_accept(struct loop_io *io, uint32_t events)
{
	(void)events;
	struct rdv_scheduler *s = io->arg;
	for (;;) {
		struct tp_conn *c;
		int rc = s->tp->accept_nb(s->listener, &c);
		if (rc == TP_AGAIN)
			return;
		if (rc == UNISUM_ESHUTDOWN) {
			loop_io_del(&s->lio);
			return;
		}
		pthread_mutex_lock(&s->lock);
		if (rc != 0) {
			char why[600];
			snprintf(why, sizeof why, "the scheduler %s: every node needs a connection to "
				 "it, so the job needs about %d descriptors there",
				 log_last_error(), s->num_machines * (s->local_size ? s->local_size : 1) +
				 s->num_servers + 16);
			sched_fail(s, UNISUM_ESYS, why);
			loop_io_del(&s->lio);
			loop_timer_start(s->loop, &s->accept_pause, 100, 0, sched_accept_resume, s);
		} else {
			sched_take_conn(s, c);
		}
		pthread_mutex_unlock(&s->lock);
		if (rc != 0)
			return;
	}
}

/* Whether accepting is over: every node registered (with failover or an
 * elastic job, replacement servers and newcomers may still come until it
 * ends), or the job failed and no longer lingers.  s->lock held. */
static bool sched_accept_done(const struct rdv_scheduler *s)
{
	bool late = ((s->server_failover && s->num_servers > 1) || s->elastic) &&
		    !sched_is_finished(s);
	return (s->book_sent && !late && !s->resuming) || s->aborted ||
	       (s->error != 0 && !sched_lingers(s));
}

/* Lingering ended: sched_after, which runs next, sees it. */
static void sched_linger_over(struct loop_timer *t)
{
	(void)t;
}

/* After every round of the loop: stops accepting once that is over, and
 * the loop once the job is finished (and no longer lingers to tell late
 * nodes why it failed), recording its result and hanging up on every
 * node. */
static void sched_after(void *arg)
{
	struct rdv_scheduler *s = arg;
	sched_resume_after(s);
	pthread_mutex_lock(&s->lock);
	if (s->accepting && sched_accept_done(s)) {
		s->accepting = false;
		loop_io_del(&s->lio);
		loop_timer_stop(s->loop, &s->accept_pause);
		s->tp->listener_shutdown(s->listener);
	}
	if (sched_lingers(s) && s->linger.slot < 0)
		loop_timer_start(s->loop, &s->linger, (int)(s->linger_until - timing_now_ms()), 0,
				 sched_linger_over, s);
	bool stop = !s->done && sched_is_finished(s) && !sched_lingers(s);
	if (stop) {
		s->done = true;
		s->result = s->error != 0 ? s->error : s->aborted ? UNISUM_ESHUTDOWN : 0;
		for (int i = 0; i < s->nnodes; i++)
			sched_hangup(s->nodes[i]);
	}
	pthread_mutex_unlock(&s->lock);
	if (stop)
		loop_stop(s->loop);
}

/* The scheduler's one thread.  Serves every node and the monitor on the
 * loop until the job is finished (sched_after). */
static void *sched_main(void *arg)
{
	prctl(PR_SET_NAME, "unisum-sched"); /* for top -H, perf and gdb */
	struct rdv_scheduler *s = arg;
	loop_run(s->loop, sched_after, s);
	loop_timer_stop(s->loop, &s->monitor);
	loop_timer_stop(s->loop, &s->accept_pause);
	loop_timer_stop(s->loop, &s->linger);
	return NULL;
}

/* The settings the scheduler keeps of cfg. */
static void sched_take_config(struct rdv_scheduler *s, const struct config *cfg)
{
	s->heartbeat_ms = cfg->heartbeat_ms;
	s->timeout_ms = cfg->timeout_ms;
	s->stall_warn_ms = cfg->stall_warn_ms;
	s->stall_abort_ms = cfg->stall_abort_ms;
	s->server_failover = cfg->server_failover;
	s->replicas = cfg->replicas && !cfg->elastic;	/* as the servers decide (replica.c) */
	s->gather_failover = cfg->gather_failover;	/* as the workers decide (wk_kept_init) */
	s->elastic = cfg->elastic;
	s->min_workers = cfg->elastic_min_workers;
	s->max_servers = cfg->num_servers;
	s->start_timeout_ms = cfg->start_timeout_ms;
	s->started_ms = timing_now_ms();
}

int rdv_scheduler_start(const char *host, int port, const struct config *cfg,
			const struct transport_ops *tp, struct rdv_scheduler **out, int *port_out)
{
	int num_machines = cfg->num_workers, num_servers = cfg->num_servers;
	if (num_machines < 1 || num_servers < 1 || num_machines + num_servers > RDV_MAX_NODES)
		return log_fail(UNISUM_EINVAL, "a job needs 1 to %d nodes with at least one worker and one "
				"server (got %d worker machines, %d servers)", RDV_MAX_NODES, num_machines,
				num_servers);
	struct rdv_scheduler *s = calloc(1, sizeof *s);
	if (s == NULL)
		return UNISUM_ENOMEM;
	s->tp = tp;
	s->num_machines = num_machines;
	s->num_servers = num_servers;
	sched_take_config(s, cfg);
	s->oom_kills = log_oom_kills();
	/* Grows as connections come (see sched_max_connections). */
	s->cap_nodes = 2 * (num_machines + num_servers) + 64;
	s->nodes = calloc((size_t)s->cap_nodes, sizeof *s->nodes);
	s->home_server = malloc((size_t)(num_machines > 0 ? num_machines : 1) * sizeof *s->home_server);
	int rc = UNISUM_ENOMEM;
	if (s->nodes == NULL || s->home_server == NULL ||
	    placement_init(&s->placement, cfg->placement, num_servers, NULL) != 0)
		goto out_free;
	for (int m = 0; m < num_machines; m++)
		s->home_server[m] = -1;
	s->worker_rack = -2;
	pthread_mutex_init(&s->lock, NULL);
	timing_cond_init(&s->changed);
	s->linger_ms = cfg->linger_ms;
	s->monitor.slot = s->accept_pause.slot = s->linger.slot = -1;
	rc = loop_new(&s->loop);
	if (rc != 0)
		goto out_free;
	rc = tp->listen(host, port, &s->listener, port_out);
	if (rc != 0)
		goto out_loop;
	rc = loop_io_add(s->loop, &s->lio, tp->listener_fd(s->listener), EPOLLIN, sched_accept, s);
	if (rc != 0)
		goto out_listener;
	snprintf(s->host, sizeof s->host, "%s", host);
	rc = sched_metrics_start(s, cfg);
	if (rc != 0)
		goto out_lio;
	s->accepting = true;
	loop_timer_start(s->loop, &s->monitor, s->heartbeat_ms, s->heartbeat_ms, sched_monitor_tick, s);
	int e = pthread_create(&s->thread, NULL, sched_main, s);
	if (e != 0) {
		char why[400];
		log_thread_limits(e, why, sizeof why);
		rc = log_fail(UNISUM_ESYS, "cannot start the scheduler's thread: %s", why);
		goto out_io;
	}
	LOG_INFO("scheduler listening on %s:%d for %d servers and %d worker machines", host, *port_out,
		 num_servers, num_machines);
	*out = s;
	return 0;

out_io:
	loop_timer_stop(s->loop, &s->monitor);
	sched_metrics_stop(s);
out_lio:
	loop_io_del(&s->lio);
out_listener:
	tp->listener_free(s->listener);
out_loop:
	loop_free(s->loop);
out_free:
	free(s->nodes);
	free(s->home_server);
	placement_fini(&s->placement);
	free(s);
	return rc;
}

bool rdv_scheduler_culprit(struct rdv_scheduler *s, int *role, int *rank)
{
	pthread_mutex_lock(&s->lock);
	bool known = s->error != 0 && s->culprit_role != CONFIG_ROLE_NONE;
	*role = s->culprit_role;
	*rank = s->culprit_rank;
	pthread_mutex_unlock(&s->lock);
	return known;
}

unsigned rdv_scheduler_books(struct rdv_scheduler *s)
{
	return atomic_load(&s->books);
}

bool rdv_scheduler_worker_rank(struct rdv_scheduler *s, int pid, int *rank)
{
	bool found = false;

	pthread_mutex_lock(&s->lock);
	for (int i = 0; i < s->nnodes && !found; i++) {
		const struct sched_node *n = s->nodes[i];

		found = n->registered && !n->retired && n->role == CONFIG_ROLE_WORKER &&
			n->pid == pid && n->rank >= 0;
		if (found)
			*rank = n->rank;
	}
	pthread_mutex_unlock(&s->lock);
	return found;
}

void rdv_scheduler_stop(struct rdv_scheduler *s, const char *why)
{
	char msg[sizeof s->error_why];

	snprintf(msg, sizeof msg, "the launcher stopped the job: %s", why);
	pthread_mutex_lock(&s->lock);
	if (!s->aborted)
		sched_fail_logged(s, UNISUM_EREMOTE, msg, false);
	pthread_mutex_unlock(&s->lock);
	loop_wake(s->loop);
}

void rdv_scheduler_abort(struct rdv_scheduler *s)
{
	pthread_mutex_lock(&s->lock);
	s->aborted = true;
	pthread_cond_broadcast(&s->changed);
	pthread_mutex_unlock(&s->lock);
	s->tp->listener_shutdown(s->listener);
	loop_wake(s->loop);
}

int rdv_scheduler_wait(struct rdv_scheduler *s)
{
	pthread_join(s->thread, NULL);
	return s->result;
}

void rdv_scheduler_free(struct rdv_scheduler *s)
{
	if (s == NULL)
		return;
	sched_metrics_stop(s);
	for (int i = 0; i < s->nnodes; i++) {
		loop_conn_free(s->nodes[i]->lc);
		rdv_metrics_free(&s->nodes[i]->report);
		free(s->nodes[i]);
	}
	loop_io_del(&s->lio);
	s->tp->listener_free(s->listener);
	loop_free(s->loop);
	for (int i = 0; i < s->ntensors; i++) {
		free(s->tensors[i].parts);
		free(s->tensors[i].servers);
		free(s->tensors[i].poison);
		free(s->tensors[i].forgot);
	}
	free(s->tensors);
	free(s->nodes);
	free(s->home_server);
	free(s->joined);
	free(s->lost);
	free(s->replaced);
	for (int i = 0; s->moved_off != NULL && i < s->num_servers; i++)
		free(s->moved_off[i].keys);
	free(s->moved_off);
	sched_free_racks(s);
	sched_resume_free(s);
	placement_fini(&s->placement);
	pthread_mutex_destroy(&s->lock);
	pthread_cond_destroy(&s->changed);
	free(s);
}
