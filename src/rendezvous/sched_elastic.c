/*
 * sched_elastic.c - the scheduler's side of an elastic job
 * (UNISUM_ELASTIC=1, `unisum launch --elastic`): workers are lost and
 * join, and the job re-forms at its new size.
 *
 * DESIGN.  A re-form is the rendezvous again, with every process staying
 * up.  Each membership is a generation.  When a worker of a running job
 * is lost (its connection gone without goodbye, or silent past
 * UNISUM_TIMEOUT_MS), or a worker asks (RESIZE: workers wait to join),
 * the scheduler starts generation g + 1 (sched_reform): every node of g is
 * retired (out of the job: its messages are dropped) and gets REFORM; it
 * answers that it comes back, hangs up, and registers again, as a fresh
 * node would.  Workers fail every operation with UNISUM_EMEMBERSHIP until
 * they call unisum_rejoin(); servers start over.  A worker that registers
 * while the job runs waits (it is not in the job yet) and every worker
 * hears how many wait (RESIZE); the job takes them in at its next
 * re-form.  The address book of g + 1 goes out once every node of g is
 * back (known by its host and pid) or lost (gone without answering), or
 * UNISUM_TIMEOUT_MS after the REFORM; ranks keep the old order, newcomers
 * after them.  Everything the scheduler knew of tensors goes: each
 * generation declares afresh.  The job fails when fewer than
 * UNISUM_ELASTIC_MIN_WORKERS workers, or no server, would be left.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "log/log.h"
#include "rendezvous/rdv_proto.h"
#include "rendezvous/sched_int.h"
#include "timing/timing.h"
#include "wire/wire.h"

/* Counts the registered nodes of `role` (-1: any). */
static int el_count(const struct rdv_scheduler *s, int role)
{
	int n = 0;
	for (int i = 0; i < s->nnodes; i++)
		n += s->nodes[i]->registered && (role < 0 || s->nodes[i]->role == role);
	return n;
}

/* Starts generation s->gen + 1 for `why` (see the header comment). */
static void el_reform(struct rdv_scheduler *s, const char *why)
{
	s->gen++;
	s->reforming = true;
	s->reform_since = timing_now_ms();
	struct wire_buf b;
	wire_buf_init(&b);
	wire_buf_str(&b, why);
	struct wire_hdr h = {.type = WIRE_REFORM, .aux = s->gen, .payload_len = b.len};
	int promoted = 0;
	for (int i = 0; i < s->nnodes; i++) {
		struct sched_node *n = s->nodes[i];
		if (n->registered) {
			n->registered = false;
			n->retired = true;
			n->coming_back = false;
			if (!n->gone && !b.failed)
				sched_send(n, &h, b.data);
		} else if (n->waiting && !n->gone) {
			n->waiting = false;
			n->registered = true;
			n->gen = s->gen;
			n->old_rank = -1;
			promoted++;
		}
	}
	wire_buf_fini(&b);
	s->registered = promoted;
	s->nwaiting = 0;
	s->book_sent = false;
	s->workers_done = 0;
	memset(s->barrier_since, 0, sizeof s->barrier_since);
	memset(s->barrier_stall, 0, sizeof s->barrier_stall);
	free(s->joined);
	s->joined = NULL;
	s->njoined = 0;
	LOG_WARN("the job re-forms (generation %u): %s", s->gen, why);
	pthread_cond_broadcast(&s->changed);
}

bool sched_elastic_lost(struct rdv_scheduler *s, struct sched_node *n, const char *cause,
			char *why, size_t len)
{
	if (!s->elastic || !s->book_sent || n->role != CONFIG_ROLE_WORKER)
		return false;
	int left = el_count(s, CONFIG_ROLE_WORKER) - 1;
	if (left < s->min_workers) {
		snprintf(why, len, "only %d workers would be left, fewer than the elastic job's "
			 "minimum (UNISUM_ELASTIC_MIN_WORKERS=%d)", left, s->min_workers);
		return false;
	}
	char label[160], text[400];
	snprintf(text, sizeof text, "%s was lost (%s); %d workers go on",
		 sched_node_label(n, label, sizeof label), cause, left);
	n->registered = false;	/* not one of those el_reform retires */
	n->retired = true;
	el_reform(s, text);
	sched_hangup(n);	/* a hung one is cut off */
	return true;
}

/* Whether nodes a and b are the same process in the same role. */
static bool el_same_process(const struct sched_node *a, const struct sched_node *b)
{
	return a->role == b->role && a->pid == b->pid && strcmp(a->host_id, b->host_id) == 0;
}

/* The node of the last generation that r (registering now) was: the same
 * host and process.  NULL for a newcomer. */
static struct sched_node *el_former(struct rdv_scheduler *s, const struct sched_node *r)
{
	for (int i = 0; i < s->nnodes; i++) {
		struct sched_node *o = s->nodes[i];
		if (o != r && o->retired && o->gen + 1 == s->gen && el_same_process(o, r))
			return o;
	}
	return NULL;
}

/* Node n is the one REGISTER m describes (one worker per machine). */
static void el_take(struct sched_node *n, const struct rdv_register *m)
{
	sched_take_register(n, m);
	n->req_rank = -1;
	n->old_rank = -1;
}

int sched_elastic_register(struct rdv_scheduler *s, struct sched_node *n,
			   const struct rdv_register *m, int *rc, char *why, size_t len)
{
	bool worker = m->role == CONFIG_ROLE_WORKER;
	if (!s->elastic || n->registered || n->waiting)
		return 0;
	/* Before the first address book, workers beyond the job's number
	 * (a discovery script offering more slots at once) wait too. */
	bool surplus = !s->book_sent && !s->reforming && worker && s->num_workers > 0 &&
		       el_count(s, CONFIG_ROLE_WORKER) >= s->num_workers;
	if (!s->book_sent && !s->reforming && !surplus)
		return 0;
	*rc = 0;
	if (s->book_sent && !worker)
		return 0;	/* a replacement server (failover) */
	if (s->book_sent || surplus) {
		/* The job runs: this worker waits for its next re-form. */
		el_take(n, m);
		n->waiting = true;
		s->nwaiting++;
		LOG_WARN("a worker at %s (pid %d) waits to join: the job takes it in at its next "
			 "re-form (%d waiting)", m->host, m->pid, s->nwaiting);
		if (s->book_sent)
			sched_announce_waiting(s);
		return 1;
	}
	if (!worker && el_count(s, CONFIG_ROLE_SERVER) >= s->max_servers) {
		snprintf(why, len, "a server at %s registered, but the job has its %d servers",
			 m->host, s->max_servers);
		*rc = UNISUM_EPROTO;
		return 1;
	}
	el_take(n, m);
	struct sched_node *o = el_former(s, n);
	n->old_rank = o != NULL ? o->rank : -1;
	n->gen = s->gen;
	n->registered = true;
	s->registered++;
	sched_elastic_check(s, timing_now_ms());
	return 1;
}

void sched_elastic_retired_msg(struct rdv_scheduler *s, struct sched_node *n,
			       const struct wire_hdr *h)
{
	if (h->type == WIRE_REFORM && h->aux == n->gen + 1) {
		n->coming_back = true;
		sched_elastic_check(s, timing_now_ms());
	}
}

void sched_elastic_resize(struct rdv_scheduler *s, struct sched_node *n)
{
	if (!s->elastic || !s->book_sent || !n->registered || n->role != CONFIG_ROLE_WORKER)
		return;
	char label[160], text[300];
	snprintf(text, sizeof text, "%s asked to take in the %d waiting to join",
		 sched_node_label(n, label, sizeof label), s->nwaiting);
	el_reform(s, text);
}

void sched_elastic_gone(struct rdv_scheduler *s, struct sched_node *n)
{
	if (n->waiting) {
		n->waiting = false;
		s->nwaiting--;
		if (s->book_sent)
			sched_announce_waiting(s);	/* one fewer waits */
	}
	if (s->reforming && n->registered) {
		/* Back, then died: not to be waited for any more. */
		struct sched_node *o = el_former(s, n);
		if (o != NULL)
			o->coming_back = false;
		n->registered = false;
		s->registered--;
	}
	if (s->reforming)
		sched_elastic_check(s, timing_now_ms());
}

/* Ranks of the new generation's nodes of `role`: former ones in their old
 * order, then newcomers by arrival (sched_assign_ranks takes req_rank). */
static void el_order(struct rdv_scheduler *s, int role)
{
	int next = 0;
	for (;;) {
		struct sched_node *best = NULL;
		for (int i = 0; i < s->nnodes; i++) {
			struct sched_node *n = s->nodes[i];
			if (!n->registered || n->role != role || n->req_rank >= 0)
				continue;
			if (best == NULL || (n->old_rank >= 0 &&
					     (best->old_rank < 0 || n->old_rank < best->old_rank)))
				best = n;
		}
		if (best == NULL)
			return;
		best->req_rank = next++;
	}
}

void sched_elastic_check(struct rdv_scheduler *s, int64_t now)
{
	if (!s->reforming || s->error != 0 || s->aborted)
		return;
	bool late = now - s->reform_since >= s->timeout_ms;
	/* Every node of the last generation is back, or lost. */
	for (int i = 0; i < s->nnodes && !late; i++) {
		struct sched_node *o = s->nodes[i];
		if (!o->retired || o->gen + 1 != s->gen || (o->gone && !o->coming_back))
			continue;
		bool back = false;
		for (int j = 0; j < s->nnodes && !back; j++) {
			const struct sched_node *r = s->nodes[j];
			back = r->registered && el_same_process(r, o);
		}
		if (!back)
			return;
	}
	int workers = el_count(s, CONFIG_ROLE_WORKER), servers = el_count(s, CONFIG_ROLE_SERVER);
	char why[400];
	if (workers < s->min_workers || servers == 0) {
		snprintf(why, sizeof why,
			 "the job could not re-form (generation %u)%s: %d workers and %d servers came "
			 "back, and it needs at least %d workers (UNISUM_ELASTIC_MIN_WORKERS) and one "
			 "server", s->gen, late ? " within UNISUM_TIMEOUT_MS" : "", workers, servers,
			 s->min_workers);
		sched_fail(s, UNISUM_ECONN, why);
		return;
	}
	for (int i = 0; i < s->nnodes; i++) {
		struct sched_node *n = s->nodes[i];
		if (n->retired && n->gen + 1 == s->gen && !n->gone)
			sched_hangup(n);	/* late: cut off */
		if (n->registered)
			n->req_rank = -1;
	}
	el_order(s, CONFIG_ROLE_SERVER);
	el_order(s, CONFIG_ROLE_WORKER);
	if (sched_tensors_reset(s, servers, workers) != 0 || sched_send_addrbook(s) != 0) {
		sched_fail(s, UNISUM_ENOMEM, "out of memory re-forming the job");
		return;
	}
	s->reforming = false;
	char ranks[256] = "";
	size_t used = 0;
	for (int i = 0; i < s->nnodes && used < sizeof ranks - 24; i++) {
		const struct sched_node *n = s->nodes[i];
		if (n->registered && n->role == CONFIG_ROLE_WORKER)
			used += (size_t)snprintf(ranks + used, sizeof ranks - used, "%s%d%s",
						 used ? ", " : "", n->rank,
						 n->old_rank < 0 ? " (new)" : "");
	}
	LOG_WARN("the job re-formed (generation %u) with %d workers (ranks %s) and %d servers",
		 s->gen, workers, ranks, servers);
	pthread_cond_broadcast(&s->changed);
}

void sched_elastic_reap(struct rdv_scheduler *s)
{
	int kept = 0;
	for (int i = 0; i < s->nnodes; i++) {
		struct sched_node *n = s->nodes[i];
		/* The last generation's nodes tell who is back until the
		 * new one has formed. */
		bool needed = n->retired && s->reforming && n->gen + 1 == s->gen;
		if (s->elastic && n->gone && !n->registered && !n->waiting && !needed) {
			loop_conn_free(n->lc);	/* closed: gone is set as it closes */
			rdv_metrics_free(&n->report);
			free(n);
			continue;
		}
		s->nodes[kept++] = n;
	}
	s->nnodes = kept;
}
