/*
 * sched_resume.c - a restarted scheduler takes a running job back from
 * its nodes (issue 52; the node's side is client_resume.c).
 *
 * DESIGN.  A scheduler holds no state that its nodes do not also hold:
 * the address book (each node has it), the tensors and their placement
 * (each worker that declared one has its cut and servers), the barriers
 * (each node counts those it entered and completed), the lost servers
 * (each worker heard the FAILOVER).  So a scheduler started at the same
 * address after its predecessor died rebuilds the job from their reports:
 * REGISTER with a resume part, then a HELD per tensor.  The first such
 * REGISTER makes it a resumed scheduler (refused once a node registered
 * afresh); its sizes and generation are the job's from then on.  Each
 * node is answered at once (an ADDRBOOK of its own entry); declarations
 * wait until every node is back (a tensor's first report places it, the
 * others must match), and so do barriers.  A node of an older generation
 * is refused as stale.  Every node back, or UNISUM_TIMEOUT_MS after the
 * first came: a worker still missing counts as one that left (it may have
 * finished and said goodbye to the dead scheduler; if it died instead,
 * its servers name it when a round waits for it), a server still missing
 * is failed over.  What cannot be resumed fails the job, saying why: a
 * join (unisum_join) under way, or a failover that some workers heard of
 * and others not.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log/log.h"
#include "placement/placement.h"
#include "rendezvous/rdv_proto.h"
#include "rendezvous/sched_int.h"
#include "timing/timing.h"
#include "wire/wire.h"

/* The first node back: the job's sizes and generation are its book's. */
static int sched_resume_begin(struct rdv_scheduler *s, const struct sched_node *n,
			      const struct rdv_resume *z, char *why, size_t len)
{
	if (s->book_sent) {
		/* Its connection broke while this scheduler lived on: it was
		 * counted as lost then, and is not taken back. */
		snprintf(why, len, "a node at %s lost its connection to this scheduler, which did "
			 "not restart: it runs the job still, and counted that node as lost",
			 s->tp->peer_name(n->conn));
		return UNISUM_ECONN;
	}
	if (s->registered > 0) {
		snprintf(why, len, "a node at %s asks to resume a running job, but this scheduler "
			 "started a job afresh (%d nodes registered): is another job using this "
			 "address?", s->tp->peer_name(n->conn), s->registered);
		return UNISUM_ECONFIG;
	}
	/* The nodes' book is the job, whatever this scheduler was told. */
	s->local_size = (int)z->local_size;
	if (sched_tensors_reset(s, (int)z->servers, (int)(z->workers / z->local_size)) != 0) {
		snprintf(why, len, "out of memory");
		return UNISUM_ENOMEM;
	}
	s->resumed = s->resuming = true;
	s->resume_since = timing_now_ms();
	s->gen = z->gen;
	s->book_sent = true;
	atomic_fetch_add(&s->books, 1);
	LOG_WARN("resuming a running job (generation %u: %d servers, %d workers on %d machines) "
		 "from its nodes' reports: this scheduler was restarted", z->gen, s->num_servers,
		 s->num_workers, s->num_machines);
	return 0;
}

/* Nodes of an older generation than z's were stale: refused, and the
 * tensors they reported forgotten. */
static int sched_resume_newer(struct rdv_scheduler *s, const struct rdv_resume *z)
{
	char msg[300];
	snprintf(msg, sizeof msg, "this node is of generation %u, but the job went on at "
		 "generation %u without it: it is stale", s->gen, z->gen);
	for (int i = 0; i < s->nnodes; i++) {
		struct sched_node *o = s->nodes[i];
		if (o->registered && o->gen < z->gen) {
			sched_send_error(o, UNISUM_EMEMBERSHIP, msg);
			sched_hangup(o);
			sched_resume_drop(s, o);
		}
	}
	LOG_WARN("a node of generation %u resumed: those of generation %u were stale", z->gen,
		 s->gen);
	s->gen = z->gen;
	s->lost_reported = false;
	return sched_tensors_reset(s, (int)z->servers, (int)(z->workers / z->local_size));
}

/* Whether z fits the job as resumed so far; why set when not. */
static int sched_resume_fits(struct rdv_scheduler *s, const struct rdv_register *m, char *why,
			     size_t len)
{
	const struct rdv_resume *z = &m->resume;
	bool worker = m->role == CONFIG_ROLE_WORKER;
	int count = worker ? s->num_workers : s->num_servers;
	uint32_t id = worker ? 1 + (uint32_t)s->num_servers + z->rank : 1 + z->rank;
	if (!s->resuming) {
		snprintf(why, len, "a %s at %s (rank %u) came back after the restarted scheduler's "
			 "wait (UNISUM_TIMEOUT_MS) had ended without it: it was counted as gone",
			 config_role_name(m->role), m->host, z->rank);
		return UNISUM_ECONN;
	}
	if (z->gen < s->gen) {
		snprintf(why, len, "a %s at %s (rank %u) of generation %u asks to resume the job, "
			 "which went on at generation %u without it: it is stale and refused",
			 config_role_name(m->role), m->host, z->rank, z->gen, s->gen);
		return UNISUM_EMEMBERSHIP;
	}
	if ((int)z->workers != s->num_workers || (int)z->servers != s->num_servers ||
	    (int)z->local_size != s->local_size) {
		snprintf(why, len, "a %s at %s resumes a job of %u workers (%u a machine) and %u "
			 "servers, but the others reported %d workers (%d a machine) and %d servers",
			 config_role_name(m->role), m->host, z->workers, z->local_size, z->servers,
			 s->num_workers, s->local_size, s->num_servers);
		return UNISUM_ECONFIG;
	}
	if ((int)z->rank >= count || z->id != id) {
		snprintf(why, len, "malformed REGISTER: rank %u, id %u of a job of %d %ss", z->rank,
			 z->id, count, config_role_name(m->role));
		return UNISUM_EPROTO;
	}
	if (!worker && s->lost != NULL && s->lost[z->rank]) {
		snprintf(why, len, "server %u at %s asks to resume the job, but it was failed over: "
			 "it is lost", z->rank, m->host);
		return UNISUM_EMEMBERSHIP;
	}
	for (int i = 0; i < s->nnodes; i++) {
		struct sched_node *o = s->nodes[i];
		if (!o->registered || o->role != m->role || o->rank != (int)z->rank)
			continue;
		if (!o->gone) {
			snprintf(why, len, "two nodes resume the job as %s %u (%s and %s)",
				 config_role_name(m->role), z->rank, o->host, m->host);
			return UNISUM_EPROTO;
		}
		sched_resume_drop(s, o);	/* its earlier try, whose connection broke */
	}
	return 0;
}

/* A worker's lost servers: the first report sets them, the others must
 * agree (a failover some heard of and others not cannot be resumed). */
static void sched_resume_lost(struct rdv_scheduler *s, const struct sched_node *n,
			      const struct rdv_resume *z)
{
	uint8_t *mine = calloc((size_t)s->num_servers, 1);
	if (s->lost == NULL)
		s->lost = calloc((size_t)s->num_servers, 1);
	if (mine == NULL || s->lost == NULL) {
		free(mine);
		sched_fail(s, UNISUM_ENOMEM, "the restarted scheduler ran out of memory");
		return;
	}
	for (uint32_t i = 0; i < z->nlost; i++)
		if (z->lost[i] < (uint32_t)s->num_servers)
			mine[z->lost[i]] = 1;
	if (!s->lost_reported) {
		memcpy(s->lost, mine, (size_t)s->num_servers);
		s->lost_reported = true;
		s->lost_rank = n->rank;
	} else if (memcmp(s->lost, mine, (size_t)s->num_servers) != 0) {
		char msg[400];
		snprintf(msg, sizeof msg,
			 "the scheduler was lost while it failed a server over: worker %d and worker %d "
			 "disagree on which servers are lost, and the failover cannot be resumed",
			 s->lost_rank, n->rank);
		sched_fail(s, UNISUM_ECONN, msg);
	}
	free(mine);
	if (z->failovers > (uint32_t)s->failovers)
		s->failovers = (int)z->failovers;
}

/* Node n's barriers as it reported them: a barrier some node completed
 * was completed (a node that missed its BARRIER_DONE gets it now); one it
 * entered and did not complete, it is in. */
static void sched_resume_barriers(struct rdv_scheduler *s, struct sched_node *n,
				  const struct rdv_resume *z)
{
	struct wire_hdr done = {.type = WIRE_BARRIER_DONE};
	for (int g = 1; g < 4; g++) {
		done.aux = (uint32_t)g;
		n->barrier_done[g] = z->done[g];
		n->in_barrier[g] = z->entered[g] > z->done[g];
		for (int i = 0; i < s->nnodes; i++) {
			struct sched_node *o = s->nodes[i];
			if (!o->registered)
				continue;
			/* Whoever is behind another's count missed a BARRIER_DONE. */
			struct sched_node *late = o->barrier_done[g] < n->barrier_done[g] ? o
						: n->barrier_done[g] < o->barrier_done[g] ? n : NULL;
			if (late != NULL && late->in_barrier[g]) {
				late->in_barrier[g] = false;
				late->barrier_done[g]++;
				sched_send(late, &done, NULL);
			}
		}
		/* Waiting only while someone is in it (a release above may have
		 * emptied it). */
		bool waits = false;
		for (int i = 0; i < s->nnodes; i++)
			waits |= s->nodes[i]->registered && s->nodes[i]->in_barrier[g];
		if (!waits) {
			s->barrier_since[g] = 0;
		} else if (s->barrier_since[g] == 0) {
			s->barrier_since[g] = timing_now_ms();
			s->barrier_stall[g] = 0;
		}
	}
}

void sched_resume_drop(struct rdv_scheduler *s, struct sched_node *n)
{
	if (n->registered)
		s->registered--;
	n->registered = false;
	int kept = 0;
	for (int i = 0; i < s->ndeferred; i++) {
		if (s->deferred[i].n == n)
			free(s->deferred[i].payload);
		else
			s->deferred[kept++] = s->deferred[i];
	}
	s->ndeferred = kept;
}

/* Answers node n: an ADDRBOOK of its own entry. */
static void sched_resume_answer(struct rdv_scheduler *s, struct sched_node *n)
{
	struct wire_buf b;
	wire_buf_init(&b);
	sched_book_of_one(s, &b, n->id, n);
	struct wire_hdr h = {.type = WIRE_ADDRBOOK, .round = s->gen, .payload_len = b.len};
	if (!b.failed)
		sched_send(n, &h, b.data);
	wire_buf_fini(&b);
}

int sched_on_resume(struct rdv_scheduler *s, struct sched_node *n, const struct rdv_register *m,
		    char *why, size_t len)
{
	const struct rdv_resume *z = &m->resume;
	bool worker = m->role == CONFIG_ROLE_WORKER;
	int rc = 0;
	if (z->local_size < 1 || z->local_size > RDV_MAX_LOCAL_SIZE || z->servers < 1 ||
	    z->workers < 1 || z->workers % z->local_size != 0 ||
	    z->workers + z->servers > RDV_MAX_NODES) {
		snprintf(why, len, "malformed REGISTER: a resume of %u workers, %u a machine, and %u "
			 "servers", z->workers, z->local_size, z->servers);
		return UNISUM_EPROTO;
	}
	if (!s->resumed)
		rc = sched_resume_begin(s, n, z, why, len);
	if (rc == 0 && z->gen > s->gen)
		rc = sched_resume_newer(s, z);
	if (rc == 0)
		rc = sched_resume_fits(s, m, why, len);
	if (rc != 0) {
		LOG_ERROR("refusing a node: %s", why);
		sched_send_error(n, rc, why);
		return UNISUM_EPROTO;
	}
	sched_take_register(n, m);
	int L = s->local_size;
	n->rank = (int)z->rank;
	n->req_rank = worker ? n->rank / L : n->rank;
	n->id = z->id;
	n->machine = worker ? n->rank / L : -1;
	n->local_rank = worker ? n->rank % L : 0;
	n->local_size = worker ? L : 1;
	n->gen = z->gen;
	n->held_expected = worker ? z->held : 0;
	n->held_got = 0;
	n->registered = true;
	s->registered++;
	if (worker)
		sched_resume_lost(s, n, z);
	if (worker && z->joined && s->error == 0) {
		char msg[300];
		snprintf(msg, sizeof msg, "the scheduler was lost while worker %d had joined "
			 "(unisum_join): a join under way cannot be resumed", n->rank);
		sched_fail(s, UNISUM_ECONN, msg);
	}
	sched_resume_barriers(s, n, z);
	sched_resume_answer(s, n);
	LOG_INFO("%s %d is back (%d of %d nodes)", config_role_name(n->role), n->rank, s->registered,
		 s->num_workers + s->num_servers);
	sched_resume_check(s, timing_now_ms());
	return 0;
}

/* Whether HELD's cut (n parts of parts, on servers) covers the tensor of
 * h with partitions of at most pbytes on the job's servers. */
static bool sched_held_valid(const struct rdv_scheduler *s, const struct wire_hdr *h,
			     uint64_t pbytes, uint32_t n, const struct placement_part *parts,
			     const uint32_t *servers)
{
	size_t esize = unisum_dtype_size(h->dtype);
	uint64_t most = esize ? pbytes / esize : 0, off = 0;
	bool ok = (n == 0) == (h->count == 0);
	for (uint32_t i = 0; ok && i < n; i++) {
		ok = parts[i].count > 0 && parts[i].count <= most && parts[i].count <= h->count - off &&
		     servers[i] < (uint32_t)s->num_servers;
		off += ok ? parts[i].count : 0;
	}
	return ok && off == h->count;
}

/* Files a reported tensor as it was placed (its bytes count on its
 * servers, but a homed cut's), or checks it against the report that
 * filed it.  s->lock held. */
static void sched_held_file(struct rdv_scheduler *s, struct sched_node *n, const char *name,
			    const struct wire_hdr *h, uint64_t pbytes, const struct rdv_segs *segs,
			    const struct rdv_shape *shape, const char *comp, uint32_t np,
			    struct placement_part **parts, uint32_t **servers)
{
	struct sched_tensor *t = sched_find_tensor(s, name, h->key);
	char msg[768] = "";
	if (t == NULL) {
		if ((t = sched_new_tensor(s)) == NULL) {
			sched_fail(s, UNISUM_ENOMEM, "the restarted scheduler ran out of memory");
			return;
		}
		t->parts = *parts;
		t->servers = *servers;
		*parts = NULL;
		*servers = NULL;
		sched_file_tensor(s, t, n, name, h->key, h, pbytes, segs, shape, comp, np);
		size_t esize = unisum_dtype_size(h->dtype);
		for (uint32_t i = 0; segs->n == 0 && i < np; i++) {
			s->placement.loads[t->servers[i]] += t->parts[i].count * esize;
			s->placement.total += t->parts[i].count * esize;
		}
		return;
	}
	sched_refusal(t, n, name, h, pbytes, segs, shape, comp, msg, sizeof msg);
	bool same = msg[0] == '\0' && t->nparts == np;
	for (uint32_t i = 0; same && i < np; i++)
		same = t->parts[i].count == (*parts)[i].count && t->servers[i] == (*servers)[i];
	if (!same) {
		char text[1000];
		snprintf(text, sizeof text, "worker %d and worker %d hold different placements of '%s' "
			 "after the scheduler was lost, and the job cannot go on: %s", t->first_rank,
			 n->rank, name, msg[0] ? msg : "their pieces are on different servers");
		sched_fail(s, UNISUM_EPROTO, text);
	}
}

int sched_on_held(struct rdv_scheduler *s, struct sched_node *n, const struct wire_hdr *h,
		  const void *payload, char *why, size_t len)
{
	const void *req, *reply;
	size_t req_len, reply_len;
	char name[256], comp[WIRE_SPEC_MAX], text[8];
	uint64_t pbytes;
	struct rdv_segs segs = {0};
	struct rdv_shape shape;
	int rack, status = -1;
	uint32_t np = 0;
	struct placement_part *parts = NULL;
	uint32_t *servers = NULL;
	int rc = rdv_held_split(payload, h->payload_len, &req, &req_len, &reply, &reply_len);
	if (rc == 0)
		rc = rdv_declare_decode(req, req_len, name, sizeof name, &pbytes, &segs, &shape, &rack,
					comp, sizeof comp);
	if (rc == 0)
		rc = rdv_declare_reply_decode(reply, reply_len, &status, text, sizeof text, &np,
					      &parts, &servers);
	pthread_mutex_lock(&s->lock);
	bool ok = rc == 0 && status == 0 && s->resumed && n->role == CONFIG_ROLE_WORKER &&
		  h->key == placement_tensor_key(name) && sched_declare_valid(h, pbytes, &segs, &shape) &&
		  sched_held_valid(s, h, pbytes, np, parts, servers);
	if (ok && s->error == 0)
		sched_held_file(s, n, name, h, pbytes, &segs, &shape, comp, np, &parts, &servers);
	if (ok) {
		n->held_got++;
		sched_resume_check(s, timing_now_ms());
	}
	pthread_mutex_unlock(&s->lock);
	rdv_segs_free(&segs);
	free(parts);
	free(servers);
	if (rc == UNISUM_ENOMEM)
		return rc;
	if (!ok)
		snprintf(why, len, "malformed or unexpected HELD");
	return ok ? 0 : UNISUM_EPROTO;
}

bool sched_resume_defer(struct rdv_scheduler *s, struct sched_node *n, const struct wire_hdr *h,
			const void *payload)
{
	pthread_mutex_lock(&s->lock);
	bool defer = s->resuming;
	if (defer) {
		struct sched_deferred *grown = realloc(s->deferred, (size_t)(s->ndeferred + 1) *
								    sizeof *grown);
		void *copy = h->payload_len ? malloc(h->payload_len) : NULL;
		if (grown != NULL)
			s->deferred = grown;
		if (grown == NULL || (h->payload_len && copy == NULL)) {
			free(copy);
			sched_fail(s, UNISUM_ENOMEM, "the restarted scheduler ran out of memory");
		} else {
			if (copy != NULL)
				memcpy(copy, payload, h->payload_len);
			s->deferred[s->ndeferred++] = (struct sched_deferred){n, *h, copy};
		}
	}
	pthread_mutex_unlock(&s->lock);
	return defer;
}

/* The nodes still missing once the wait is over: workers count as gone
 * with a goodbye, servers are failed over.  s->lock held. */
static void sched_resume_missing(struct rdv_scheduler *s)
{
	uint8_t *back = calloc((size_t)(s->num_workers + s->num_servers), 1);
	if (back == NULL) {
		sched_fail(s, UNISUM_ENOMEM, "the restarted scheduler ran out of memory");
		return;
	}
	for (int i = 0; i < s->nnodes; i++) {
		const struct sched_node *o = s->nodes[i];
		if (o->registered)
			back[o->role == CONFIG_ROLE_SERVER ? o->rank : s->num_servers + o->rank] = 1;
	}
	for (int w = 0; w < s->num_workers; w++) {
		if (back[s->num_servers + w])
			continue;
		LOG_WARN("worker %d did not come back within %d ms (UNISUM_TIMEOUT_MS): it counts as "
			 "having left the job", w, s->timeout_ms);
		s->workers_done++;
	}
	for (int r = 0; r < s->num_servers && s->error == 0; r++) {
		if (back[r] || (s->lost != NULL && s->lost[r]))
			continue;
		char fo[300] = "", msg[600];
		int rc = s->server_failover ? sched_failover(s, r, fo, sizeof fo) : UNISUM_ECONN;
		if (rc == 0)
			continue;
		snprintf(msg, sizeof msg, "server %d did not come back to the restarted scheduler "
			 "within %d ms (UNISUM_TIMEOUT_MS), and failover cannot replace it%s%s", r,
			 s->timeout_ms, fo[0] ? ": " : "", fo[0] ? fo : " (UNISUM_SERVER_FAILOVER=0)");
		sched_fail(s, UNISUM_ECONN, msg);
		s->culprit_role = CONFIG_ROLE_SERVER;
		s->culprit_rank = r;
	}
	free(back);
}

void sched_resume_check(struct rdv_scheduler *s, int64_t now)
{
	if (!s->resuming || s->error != 0)
		return;
	int workers = 0, servers = 0, lost = 0;
	bool reported = true;	/* every worker back told every tensor it holds */
	for (int i = 0; i < s->nnodes; i++) {
		const struct sched_node *o = s->nodes[i];
		workers += o->registered && o->role == CONFIG_ROLE_WORKER;
		servers += o->registered && o->role == CONFIG_ROLE_SERVER;
		reported &= !o->registered || o->held_got >= o->held_expected;
	}
	for (int r = 0; s->lost != NULL && r < s->num_servers; r++)
		lost += s->lost[r];
	bool all = workers == s->num_workers && servers + lost == s->num_servers &&
		   s->lost_reported && reported;
	if (!all && now - s->resume_since < s->timeout_ms)
		return;
	s->resuming = false;
	if (!all)
		sched_resume_missing(s);
	sched_place_roles(s);
	for (int g = 1; g < 4; g++)
		sched_barrier_settle(s, g);
	if (s->workers_done >= s->num_workers)
		sched_log_loads(s, INT64_MAX);	/* if not logged yet */
	sched_stop_servers_if_done(s);
	LOG_WARN("resumed the job %lld ms after the first node came back: %d tensors, %d lost "
		 "servers", (long long)(now - s->resume_since), s->ntensors, lost);
	pthread_cond_broadcast(&s->changed);
}

void sched_resume_after(struct rdv_scheduler *s)
{
	pthread_mutex_lock(&s->lock);
	struct sched_deferred *d = NULL;
	int nd = 0;
	if (!s->resuming && s->ndeferred > 0) {
		d = s->deferred;
		nd = s->ndeferred;
		s->deferred = NULL;
		s->ndeferred = 0;
	}
	pthread_mutex_unlock(&s->lock);
	for (int i = 0; i < nd; i++) {
		if (d[i].n == NULL) {	/* worker 0's TUNE */
			pthread_mutex_lock(&s->lock);
			sched_send_tune(s, &d[i].h, d[i].payload);
			pthread_mutex_unlock(&s->lock);
			free(d[i].payload);
			continue;
		}
		int rc = sched_on_declare(s, d[i].n, &d[i].h, d[i].payload, d[i].h.payload_len);
		if (rc != 0 && !loop_conn_closed(d[i].n->lc))
			loop_conn_close(d[i].n->lc, rc, "malformed DECLARE");
		free(d[i].payload);
	}
	free(d);
}

void sched_resume_free(struct rdv_scheduler *s)
{
	for (int i = 0; i < s->ndeferred; i++)
		free(s->deferred[i].payload);
	free(s->deferred);
}
