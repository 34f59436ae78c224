/*
 * sched_tensors.c - the scheduler's tensors: declarations (the cut and
 * placement of each name, the same answer for every worker), poisoning,
 * forgetting undeclared tensors, and the servers' roles and shares
 * (Theorem 1).  See sched_int.h.
 */
#include <stdlib.h>
#include <string.h>

#include "compress/compress.h"
#include "log/log.h"
#include "rendezvous/rdv_proto.h"
#include "rendezvous/sched_int.h"
#include "timing/timing.h"
#include "unisum.h"

void sched_free_racks(struct rdv_scheduler *s)
{
	for (int i = 0; i < s->nracks; i++) {
		free(s->racks[i].server);
		placement_fini(&s->racks[i].pl);
	}
	free(s->racks);
	s->racks = NULL;
	s->nracks = 0;
}

/* One placement per rack that has servers (UNISUM_RACK on the servers),
 * weighed by Theorem 1 among that rack's servers and worker hosts.  Out
 * of memory: no racks (every tensor is placed on every server). */
static void sched_place_racks(struct rdv_scheduler *s, const char **server_hosts,
			      const char **server_addr)
{
	int ns = s->num_servers;
	int *rack_of = malloc((size_t)ns * sizeof *rack_of);
	const char **hosts = calloc((size_t)(ns + s->nnodes), sizeof *hosts);
	double *weights = calloc((size_t)ns, sizeof *weights);
	int *colocated = calloc((size_t)ns, sizeof *colocated);
	s->racks = calloc((size_t)ns, sizeof *s->racks);
	if (rack_of == NULL || hosts == NULL || weights == NULL || colocated == NULL ||
	    s->racks == NULL)
		goto fail;
	for (int r = 0; r < ns; r++)
		rack_of[r] = -1;
	for (int i = 0; i < s->nnodes; i++) {
		const struct sched_node *n = s->nodes[i];
		if (n->registered && n->role == CONFIG_ROLE_SERVER && n->rank >= 0 && n->rank < ns)
			rack_of[n->rank] = n->rack;
	}
	for (int r = 0; r < ns; r++) {
		if (rack_of[r] < 0)
			continue;
		struct sched_rack *k = NULL;
		for (int i = 0; i < s->nracks && k == NULL; i++)
			k = s->racks[i].rack == rack_of[r] ? &s->racks[i] : NULL;
		if (k != NULL)
			continue;	/* done with its first server */
		k = &s->racks[s->nracks++];
		k->rack = rack_of[r];
		k->server = malloc((size_t)ns * sizeof *k->server);
		if (k->server == NULL)
			goto fail;
		int nh = 0;
		for (int q = r; q < ns; q++)
			if (rack_of[q] == k->rack) {
				k->server[k->nservers] = q;
				hosts[k->nservers++] = server_hosts[q];
			}
		for (int i = 0; i < s->nnodes; i++) {
			const struct sched_node *n = s->nodes[i];
			if (n->registered && n->role == CONFIG_ROLE_WORKER && n->rack == k->rack)
				hosts[k->nservers + nh++] = n->host_id;
		}
		int hn, hc, hk;
		placement_weights(k->nservers, hosts, nh, hosts + k->nservers, weights, colocated,
				  &hn, &hc, &hk);
		if (placement_init(&k->pl, s->placement.policy, k->nservers, weights) != 0)
			goto fail;
		LOG_INFO("placement rack %d: %d worker hosts, %d of them with servers, %d CPU-only "
			 "server hosts; tensors of its workers alone go on its %d servers (first %s)",
			 k->rack, hn, hc, hk, k->nservers, server_addr[r]);
	}
	goto out;
fail:
	LOG_WARN("out of memory placing by rack: every tensor goes on every server");
	if (s->racks != NULL)
		sched_free_racks(s);
out:
	free(rack_of);
	free(hosts);
	free(weights);
	free(colocated);
}

/* Gives every server its byte share from where the nodes run (see
 * placement_weights()) and logs it.  Called with s->lock held, once every
 * node has registered and has its rank. */
void sched_place_roles(struct rdv_scheduler *s)
{
	int ns = s->num_servers, nw = s->num_workers;
	const char **server_hosts = calloc((size_t)ns, sizeof *server_hosts);
	const char **worker_hosts = calloc((size_t)nw, sizeof *worker_hosts);
	const char **server_addr = calloc((size_t)ns, sizeof *server_addr);
	double *weights = calloc((size_t)ns, sizeof *weights);
	int *colocated = calloc((size_t)ns, sizeof *colocated);
	if (server_hosts == NULL || worker_hosts == NULL || server_addr == NULL || weights == NULL ||
	    colocated == NULL) {
		LOG_WARN("out of memory weighing the servers: every server gets an equal share");
		goto out;
	}
	int w = 0;
	for (int i = 0; i < s->nnodes; i++) {
		const struct sched_node *n = s->nodes[i];
		if (!n->registered)
			continue;
		if (n->role == CONFIG_ROLE_SERVER && n->rank >= 0 && n->rank < ns) {
			server_hosts[n->rank] = n->host_id;
			server_addr[n->rank] = n->host;
		} else if (n->role == CONFIG_ROLE_WORKER && w < nw) {
			worker_hosts[w++] = n->host_id;
		}
	}
	for (int i = 0; i < ns; i++)
		if (server_hosts[i] == NULL)
			goto out;
	/* Each machine's home: the first server on its host (homed cuts). */
	for (int i = 0; s->home_server != NULL && i < s->nnodes; i++) {
		const struct sched_node *n = s->nodes[i];
		if (!n->registered || n->role != CONFIG_ROLE_WORKER || n->machine < 0 ||
		    n->machine >= s->num_machines)
			continue;
		s->home_server[n->machine] = -1;
		for (int r = 0; r < ns; r++) {
			if (strcmp(server_hosts[r], n->host_id) == 0) {
				s->home_server[n->machine] = r;
				break;
			}
		}
	}
	int hn, hc, hk;
	sched_place_racks(s, server_hosts, server_addr);
	placement_weights(ns, server_hosts, w, worker_hosts, weights, colocated, &hn, &hc, &hk);
	if (s->placement.policy == PLACEMENT_OPTIMAL)
		memcpy(s->placement.weights, weights, (size_t)ns * sizeof *weights);
	LOG_INFO("placement %s: %d worker hosts, %d of them with servers (colocated), %d CPU-only "
		 "server hosts; Theorem 1 time %.4f M/B", placement_policy_name(s->placement.policy),
		 hn, hc, hk, placement_theorem_time(hn, hc, hk));
	for (int i = 0; i < ns; i++)
		LOG_INFO("placement: server %d at %s, %s, share %.4f%s", i, server_addr[i],
			 colocated[i] ? "colocated" : "CPU-only", weights[i],
			 s->placement.policy == PLACEMENT_OPTIMAL ? "" : " (not used by this policy)");
out:
	free(server_hosts);
	free(worker_hosts);
	free(server_addr);
	free(weights);
	free(colocated);
}

/* Logs the bytes placed on every server against its share, once a second
 * has passed since the last new tensor (now = INT64_MAX: at once, if not
 * logged since).  Called with s->lock held. */
void sched_log_loads(struct rdv_scheduler *s, int64_t now)
{
	if (s->placed_ms == 0 || now - s->placed_ms < 1000)
		return;
	s->placed_ms = 0;
	const struct placement *p = &s->placement;
	LOG_INFO("placement %s: %d tensors, %llu bytes", placement_policy_name(p->policy), s->ntensors,
		 (unsigned long long)p->total);
	for (int i = 0; i < p->nservers; i++)
		LOG_INFO("placement: server %d holds %llu bytes, %.4f of all (share %.4f)", i,
			 (unsigned long long)p->loads[i],
			 p->total ? (double)p->loads[i] / (double)p->total : 0.0, p->weights[i]);
}

struct sched_tensor *sched_find_tensor(struct rdv_scheduler *s, const char *name, uint64_t key)
{
	for (int i = 0; i < s->ntensors; i++)
		if (s->tensors[i].key == key || strcmp(s->tensors[i].name, name) == 0)
			return &s->tensors[i];
	return NULL;
}

/* Tells every server and worker that tensor `key` can never be summed (its
 * workers disagree on its shape): servers answer its pushes with the
 * error, and workers summing it in shared memory stop waiting for the
 * rank that could not declare it.  Called with s->lock held. */
void sched_poison(struct rdv_scheduler *s, uint64_t key, const char *why)
{
	struct wire_buf b;
	wire_buf_init(&b);
	struct wire_hdr h = {.key = key};
	bool built = wire_error_build(&h, &b, UNISUM_EMISMATCH, why) == 0;
	for (int i = 0; i < s->nnodes; i++) {
		struct sched_node *n = s->nodes[i];
		if (built && n->registered && !n->gone)
			sched_send(n, &h, b.data);
	}
	wire_buf_fini(&b);
}

/* Whether `name` is a cut of tensor `base`: "BASE#K" (a gathering
 * collective's layout) or "BASE@BYTES" (autotune's), digits after. */
static bool sched_is_cut_of(const char *name, const char *base)
{
	size_t n = strlen(base);
	if (strncmp(name, base, n) != 0 || (name[n] != '#' && name[n] != '@') || name[n + 1] == '\0')
		return false;
	for (const char *p = name + n + 1; *p; p++)
		if (*p < '0' || *p > '9')
			return false;
	return true;
}

/* Poisons tensor t and every cut of it declared so far (a worker may be
 * waiting in one of those for a worker that never gets there); cuts
 * declared later are refused (sched_poisoned_base).  s->lock held. */
static void sched_poison_all(struct rdv_scheduler *s, struct sched_tensor *t, const char *text)
{
	if (t->poison == NULL) {
		t->poison = strdup(text);
		sched_poison(s, t->key, text);
	}
	for (int i = 0; i < s->ntensors; i++) {
		struct sched_tensor *c = &s->tensors[i];
		if (c->poison == NULL && sched_is_cut_of(c->name, t->name)) {
			c->poison = strdup(text);
			sched_poison(s, c->key, text);
		}
	}
}

/* The poisoned tensor that `name` is a cut of, or NULL.  s->lock held. */
static struct sched_tensor *sched_poisoned_base(struct rdv_scheduler *s, const char *name)
{
	for (int i = 0; i < s->ntensors; i++)
		if (s->tensors[i].poison != NULL && sched_is_cut_of(name, s->tensors[i].name))
			return &s->tensors[i];
	return NULL;
}

int sched_poison_reported(struct rdv_scheduler *s, uint64_t key, const char *text, char *why,
			  size_t len)
{
	struct sched_tensor *t = NULL;
	for (int i = 0; i < s->ntensors && t == NULL; i++)
		if (s->tensors[i].key == key)
			t = &s->tensors[i];
	if (t == NULL && (key & 0xffff) != 0) {
		snprintf(why, len, "ERROR about key 0x%llx, which is not a tensor's",
			 (unsigned long long)key);
		return UNISUM_EPROTO;
	}
	if (t == NULL) {
		/* Forgotten: every worker undeclared it while the report was on
		 * its way (a one-shot tensor of a rank that joined).  Nobody
		 * holds it any more: nothing to poison. */
		LOG_INFO("a report about tensor key 0x%llx, which every worker has undeclared: %s",
			 (unsigned long long)key, text);
		return 0;
	}
	if (t->poison == NULL)
		LOG_ERROR("%s", text);
	sched_poison_all(s, t, text);
	return 0;
}

/* How many workers undeclare tensor `name`: a process set's members (its
 * wire name is "set:<size>:<hash>/NAME", worker.c), else every worker. */
static int sched_retirers(const char *name, int num_workers)
{
	if (strncmp(name, "set:", 4) != 0)
		return num_workers;
	char *end = NULL;
	long k = strtol(name + 4, &end, 10);
	return end != name + 4 && *end == ':' && k >= 1 && k <= num_workers ? (int)k : num_workers;
}

/* Worker n undeclared the tensor of `key` (a RETIRE): once every worker
 * has, its entry goes, so one-shot tensors (unisum.torch's unnamed
 * operations and broadcasts) do not pile up.  Their bytes stay counted
 * in the placement's loads, which only steer where the next pieces go.
 * Returns 0 or UNISUM_EPROTO with why set.  Called with s->lock held. */
int sched_on_forget(struct rdv_scheduler *s, struct sched_node *n, uint64_t key, char *why,
			   size_t len)
{
	int i = 0;
	while (i < s->ntensors && s->tensors[i].key != key)
		i++;
	struct sched_tensor *t = i < s->ntensors ? &s->tensors[i] : NULL;
	if (t == NULL && s->resumed)
		return 0;	/* every worker that reported it to the restarted
				 * scheduler had undeclared it already */
	if (t != NULL && t->forgot == NULL)
		t->forgot = calloc((size_t)s->num_workers, 1);
	if (n->role != CONFIG_ROLE_WORKER || t == NULL || n->rank < 0 || n->rank >= s->num_workers ||
	    (t->forgot != NULL && t->forgot[n->rank])) {
		snprintf(why, len, "RETIRE of tensor key 0x%llx, which is %s", (unsigned long long)key,
			 t == NULL ? "not declared" : "undeclared by this worker already");
		return UNISUM_EPROTO;
	}
	if (t->forgot == NULL)
		return 0;	/* out of memory: the entry stays, nothing breaks */
	t->forgot[n->rank] = 1;
	if (++t->nforgot < sched_retirers(t->name, s->num_workers))
		return 0;
	LOG_DEBUG("every worker undeclared '%s': its entry goes", t->name);
	free(t->parts);
	free(t->servers);
	free(t->poison);
	free(t->forgot);
	s->tensors[i] = s->tensors[--s->ntensors];
	return 0;
}

/* FNV-1a of a homed cut's segments (0 for none). */
static uint64_t sched_segs_hash(const struct rdv_segs *segs)
{
	uint64_t x = 0;
	if (segs->n == 0)
		return 0;
	x = 0xcbf29ce484222325ull;
	for (uint32_t i = 0; i < segs->n; i++) {
		uint64_t v[2] = {segs->counts[i], segs->owners[i]};
		for (int k = 0; k < 2; k++)
			for (int b = 0; b < 8; b++) {
				x ^= (v[k] >> (8 * b)) & 0xff;
				x *= 0x100000001b3ull;
			}
	}
	return x;
}

/* Answers a DECLARE: the tensor's key and servers, or why not. */
/* Why worker n's declaration of `name` (dtype, count, pbytes) cannot be
 * answered with tensor t's cut: written into msg with its code, or msg
 * left empty when it can. */
/* "float32[17, 23, 57]" into buf. */
static const char *sched_shape_text(int dtype, const struct rdv_shape *shape, char *buf, size_t len)
{
	size_t at = (size_t)snprintf(buf, len, "%s[", unisum_dtype_name(dtype));
	for (uint32_t i = 0; i < shape->ndim && at < len; i++)
		at += (size_t)snprintf(buf + at, len - at, "%s%llu", i ? ", " : "",
				       (unsigned long long)shape->dims[i]);
	if (at < len)
		snprintf(buf + at, len - at, "]");
	return buf;
}

static bool sched_same_shape(const struct rdv_shape *a, const struct rdv_shape *b)
{
	if (a->ndim == 0 || b->ndim == 0)
		return true;	/* one gave none: the counts say enough */
	if (a->ndim != b->ndim)
		return false;
	for (uint32_t i = 0; i < a->ndim; i++)
		if (a->dims[i] != b->dims[i])
			return false;
	return true;
}

int sched_refusal(const struct sched_tensor *t, const struct sched_node *n, const char *name,
		  const struct wire_hdr *req, uint64_t pbytes, const struct rdv_segs *segs,
		  const struct rdv_shape *shape, const char *comp, char *msg, size_t len)
{
	char a[200], b[200];
	if (strcmp(t->name, name) != 0) {
		snprintf(msg, len, "tensor names '%s' and '%s' hash to the same key 0x%llx: rename one "
			 "of them", t->name, name, (unsigned long long)t->key);
	} else if (t->forgot != NULL && t->forgot[n->rank]) {
		snprintf(msg, len, "worker %d declared '%s' again after undeclaring it, before every "
			 "worker had undeclared it: give each one-shot tensor a new name", n->rank, name);
		return UNISUM_EINVAL;
	} else if (t->poison != NULL) {
		snprintf(msg, len, "%s", t->poison);
	} else if (t->sync != req->aux) {
		snprintf(msg, len, "tensor '%s' declared %s by worker %d but %s by worker %d: a tensor "
			 "runs in one sync mode", name, wire_sync_text(t->sync, a, sizeof a),
			 t->first_rank, wire_sync_text(req->aux, b, sizeof b), n->rank);
	} else if (strcmp(t->comp, comp) != 0) {
		snprintf(msg, len, "tensor '%s' declared with compression '%.96s' by worker %d but "
			 "'%.96s' by worker %d: every worker must compress it alike (the same "
			 "spec and UNISUM_MIN_COMPRESS_BYTES)", name,
			 t->comp[0] ? t->comp : "none", t->first_rank, comp[0] ? comp : "none",
			 n->rank);
	} else if (!sched_same_shape(&t->shape, shape) && t->dtype == req->dtype &&
		   t->count == req->count) {
		snprintf(msg, len,
			 "tensor '%s' declared as %s by worker %d but as %s by worker %d: every worker "
			 "must pass a tensor of the same shape", name,
			 sched_shape_text(t->dtype, &t->shape, a, sizeof a), t->shape_rank,
			 sched_shape_text(req->dtype, shape, b, sizeof b), n->rank);
	} else if (t->nsegs != segs->n || t->segs_hash != sched_segs_hash(segs)) {
		snprintf(msg, len,
			 "tensor '%s' was declared by worker %d with %u segments (hash 0x%llx) but by "
			 "worker %d with %u (hash 0x%llx): every worker must pass the same layout",
			 name, t->first_rank, t->nsegs, (unsigned long long)t->segs_hash, n->rank,
			 segs->n, (unsigned long long)sched_segs_hash(segs));
	} else if (t->dtype != req->dtype || t->count != req->count || t->partition_bytes != pbytes) {
		snprintf(msg, len,
			 "tensor '%s' declared as %s[%llu] (partition %llu bytes) by worker %d but as "
			 "%s[%llu] (partition %llu bytes) by worker %d: every worker must declare a name "
			 "with the same dtype, element count and UNISUM_PARTITION_BYTES%s",
			 name, unisum_dtype_name(t->dtype), (unsigned long long)t->count,
			 (unsigned long long)t->partition_bytes, t->first_rank,
			 unisum_dtype_name(req->dtype), (unsigned long long)req->count,
			 (unsigned long long)pbytes, n->rank,
			 /* A homed cut: an allgather's follows its ring phases. */
			 t->nsegs > 0 ? " (and for an allgather the same UNISUM_ALLGATHER_PHASES)" : "");
	}
	return UNISUM_EMISMATCH;
}

/* Whether server rank r was lost and failed over (its node is gone). */
static bool sched_server_lost(const struct rdv_scheduler *s, int r)
{
	return s->lost != NULL && r >= 0 && r < s->num_servers && s->lost[r];
}

/* The live server furthest below its share (Theorem 1's weight) of the
 * bytes placed so far, or -1 when none is left.  Called with s->lock
 * held. */
static int sched_least_loaded(const struct rdv_scheduler *s)
{
	int best = -1;
	double best_fill = 0;
	for (int r = 0; r < s->num_servers; r++) {
		if (sched_server_lost(s, r))
			continue;
		double wgt = s->placement.weights != NULL ? s->placement.weights[r] : 1.0;
		double fill = (double)s->placement.loads[r] / (wgt > 1e-9 ? wgt : 1e-9);
		if (best < 0 || fill < best_fill) {
			best = r;
			best_fill = fill;
		}
	}
	return best;
}

/* Moves `bytes` of placement load from server `from` to server `to`. */
static void sched_move_load(struct rdv_scheduler *s, uint32_t from, uint32_t to, uint64_t bytes)
{
	uint64_t *loads = s->placement.loads;
	loads[from] -= bytes <= loads[from] ? bytes : loads[from];
	loads[to] += bytes;
}

/* Whether tensor t is compressed with error feedback, which its servers
 * keep from round to round (a spec without it keeps nothing). */
static bool sched_feedback(const struct sched_tensor *t)
{
	struct compress_spec spec;
	char err[128];
	return t->comp[0] != '\0' && (compress_spec_parse(t->comp, &spec, err, sizeof err) != 0 ||
				       spec.ef != COMPRESS_EF_NONE);
}

/* Why tensor t's pieces cannot change servers (its state would be lost),
 * or NULL: a server of an async or SSP tensor holds its value, and of a
 * compressed tensor with error feedback that feedback (unless its backup
 * holds a copy: UNISUM_REPLICAS).  A gathering collective's homed cut
 * moves when each machine keeps its last push (UNISUM_GATHER_FAILOVER),
 * from which the new server sums the round again. */
static const char *sched_unmovable(const struct rdv_scheduler *s, const struct sched_tensor *t)
{
	return t->sync != 0 && !s->replicas
		       ? "an async or SSP tensor, whose value the server held (UNISUM_REPLICAS=0)"
	       : sched_feedback(t) && !s->replicas
		       ? "a compressed tensor, whose error feedback the server held "
			 "(UNISUM_REPLICAS=0)"
	       : t->nsegs > 0 && !s->gather_failover
		       ? "a gathering collective's tensor (allgather, alltoall, reduce-scatter), "
			 "whose rows only the server had (UNISUM_GATHER_FAILOVER=0)"
		       : NULL;
}

/* Whether tensor t's state lives on its servers beyond a round and goes
 * to their backups (UNISUM_REPLICAS): async, SSP, compressed with error
 * feedback. */
static bool sched_replicated(const struct sched_tensor *t)
{
	return t->sync != 0 || sched_feedback(t);
}

void sched_avoid_lost(struct rdv_scheduler *s, const struct placement_part *parts,
		      uint32_t *servers, uint32_t nparts, size_t esize)
{
	for (uint32_t i = 0; s->lost != NULL && i < nparts; i++) {
		if (!sched_server_lost(s, (int)servers[i]))
			continue;
		int to = sched_least_loaded(s);
		if (to < 0)
			return;
		sched_move_load(s, servers[i], (uint32_t)to, parts[i].count * esize);
		servers[i] = (uint32_t)to;
	}
}

/* The backup of server `dead` (replica.c's rule): the next server by
 * rank that is neither lost nor a replacement, or -1. */
static int sched_backup_of(const struct rdv_scheduler *s, int dead)
{
	for (int i = 1; i < s->num_servers; i++) {
		int r = (dead + i) % s->num_servers;
		if (!sched_server_lost(s, r) && (s->replaced == NULL || !s->replaced[r]))
			return r;
	}
	return -1;
}

/* Whether the job can go on without server `dead`: 0, or UNISUM_ECONN
 * with why set when it was the last server or held partitions of a
 * tensor whose state failover does not move. */
static int sched_failover_refused(struct rdv_scheduler *s, int dead, char *why, size_t len)
{
	int live = 0;
	for (int r = 0; r < s->num_servers; r++)
		live += r != dead && !sched_server_lost(s, r);
	if (live == 0) {
		snprintf(why, len, "it was the last server of the job: nothing is left to sum on");
		return UNISUM_ECONN;
	}
	for (int i = 0; i < s->ntensors; i++) {
		const struct sched_tensor *t = &s->tensors[i];
		const char *what = sched_unmovable(s, t);
		if (what == NULL && sched_replicated(t) && sched_backup_of(s, dead) < 0)
			what = "a tensor whose state the servers copy (async, SSP, compressed with "
			       "error feedback), and no live server but replacements (which hold no "
			       "copies) is left";
		for (uint32_t p = 0; what != NULL && p < t->nparts; p++) {
			if ((int)t->servers[p] == dead) {
				snprintf(why, len, "it held partitions of '%s', %s, which failover "
					 "does not move", t->name, what);
				return UNISUM_ECONN;
			}
		}
	}
	return 0;
}

/* Moves every partition on server `dead` to a live server, into f (keys
 * and servers, room for all); remembers the keys moved off it, to move
 * back to its replacement.  The number of tensors that moved. */
static int sched_failover_move(struct rdv_scheduler *s, int dead, struct rdv_failover *f)
{
	int tensors = 0;
	for (int i = 0; i < s->ntensors; i++) {
		struct sched_tensor *t = &s->tensors[i];
		size_t esize = unisum_dtype_size(t->dtype);
		bool moved = false;
		for (uint32_t p = 0; p < t->nparts; p++) {
			if ((int)t->servers[p] != dead)
				continue;
			int to = sched_replicated(t) ? sched_backup_of(s, dead) : -1;
			if (to >= 0) {	/* where its copy is */
				sched_move_load(s, (uint32_t)dead, (uint32_t)to,
						t->parts[p].count * esize);
				t->servers[p] = (uint32_t)to;
			} else if (t->nsegs > 0) {
				/* A homed cut's bytes are no server's load: every
				 * piece of the lost one goes to one server (its
				 * ring phases keep one flow a link). */
				if ((to = sched_least_loaded(s)) >= 0)
					t->servers[p] = (uint32_t)to;
			} else {
				sched_avoid_lost(s, &t->parts[p], &t->servers[p], 1, esize);
			}
			f->keys[f->n] = t->key + p;
			f->servers[f->n++] = t->servers[p];
			moved = true;
		}
		tensors += moved;
	}
	s->placement.loads[dead] = 0;
	if (s->moved_off == NULL)
		s->moved_off = calloc((size_t)s->num_servers, sizeof *s->moved_off);
	if (s->moved_off != NULL) {
		uint64_t *keys = malloc((f->n ? f->n : 1) * sizeof *keys);
		if (keys != NULL) {
			memcpy(keys, f->keys, f->n * sizeof *keys);
			free(s->moved_off[dead].keys);
			s->moved_off[dead] = (struct sched_moved_off){.n = f->n, .keys = keys};
		}
	}
	return tensors;
}

/* Logs failover f (tensors of them moved) and sends it to every worker.
 * 0 or UNISUM_ENOMEM. */
static int sched_failover_tell(struct rdv_scheduler *s, const struct rdv_failover *f,
			       int tensors)
{
	struct wire_buf b;
	wire_buf_init(&b);
	struct wire_hdr h = {0};
	rdv_failover_encode(f, &h, &b);
	if (b.failed) {
		wire_buf_fini(&b);
		return UNISUM_ENOMEM;
	}
	char to[256] = "";
	size_t used = 0;
	for (int r = 0; r < s->num_servers && used < sizeof to - 16; r++)
		if (!sched_server_lost(s, r))
			used += (size_t)snprintf(to + used, sizeof to - used, "%s%d", used ? ", " : "", r);
	LOG_WARN("failover %d: server %d is lost; its %u partitions of %d tensors move to servers "
		 "%s (UNISUM_SERVER_FAILOVER=1)", s->failovers, f->dead, f->n, tensors, to);
	/* With replicas the servers hear it too: one whose backup was lost
	 * (silent, its link still open) dials the next. */
	for (int i = 0; i < s->nnodes; i++) {
		struct sched_node *m = s->nodes[i];
		if (m->registered && !m->gone && !m->lost &&
		    (m->role == CONFIG_ROLE_WORKER || (s->replicas && m->role == CONFIG_ROLE_SERVER)))
			sched_send(m, &h, b.data);
	}
	wire_buf_fini(&b);
	return 0;
}

int sched_failover(struct rdv_scheduler *s, int dead, char *why, size_t len)
{
	int rc = sched_failover_refused(s, dead, why, len);
	if (rc != 0)
		return rc;
	if (s->lost == NULL && (s->lost = calloc((size_t)s->num_servers, 1)) == NULL) {
		snprintf(why, len, "out of memory");
		return UNISUM_ENOMEM;
	}
	uint32_t n = 0;
	for (int i = 0; i < s->ntensors; i++)
		for (uint32_t p = 0; p < s->tensors[i].nparts; p++)
			n += (int)s->tensors[i].servers[p] == dead;
	struct rdv_failover f = {.number = (uint32_t)s->failovers + 1, .dead = dead,
				 .keys = malloc((n ? n : 1) * sizeof *f.keys),
				 .servers = malloc((n ? n : 1) * sizeof *f.servers)};
	if (f.keys == NULL || f.servers == NULL) {
		free(f.keys);
		free(f.servers);
		snprintf(why, len, "out of memory");
		return UNISUM_ENOMEM;
	}
	s->lost[dead] = 1;
	s->failovers++;
	rc = sched_failover_tell(s, &f, sched_failover_move(s, dead, &f));
	if (rc != 0)
		snprintf(why, len, "out of memory");
	free(f.keys);
	free(f.servers);
	return rc;
}

void sched_migrate_back(struct rdv_scheduler *s, int r)
{
	if (s->moved_off == NULL || s->moved_off[r].n == 0)
		return;
	struct sched_moved_off mo = s->moved_off[r];
	s->moved_off[r] = (struct sched_moved_off){0};
	struct rdv_failover *per = calloc((size_t)s->num_servers, sizeof *per);
	for (int q = 0; per != NULL && q < s->num_servers; q++) {
		per[q].keys = malloc(mo.n * sizeof *per[q].keys);
		per[q].servers = malloc(mo.n * sizeof *per[q].servers);
		per[q].dead = r;
		per[q].number = (uint32_t)s->failovers;
	}
	uint32_t moved = 0;
	for (uint32_t k = 0; per != NULL && k < mo.n; k++) {
		uint64_t key = mo.keys[k];
		for (int i = 0; i < s->ntensors; i++) {
			struct sched_tensor *t = &s->tensors[i];
			if (key < t->key || key - t->key >= t->nparts)
				continue;
			uint32_t p = (uint32_t)(key - t->key);
			int from = (int)t->servers[p];
			/* An async or compressed-with-feedback key stays (its copies are
			 * on from's backup), and a homed cut (its phases, its names). */
			if (sched_unmovable(s, t) != NULL || sched_replicated(t) || t->nsegs > 0 ||
			    from == r ||
			    sched_server_lost(s, from) || per[from].keys == NULL ||
			    per[from].servers == NULL)
				break;
			sched_move_load(s, (uint32_t)from, (uint32_t)r,
					t->parts[p].count * unisum_dtype_size(t->dtype));
			t->servers[p] = (uint32_t)r;
			per[from].keys[per[from].n] = key;
			per[from].servers[per[from].n++] = (uint32_t)r;
			moved++;
			break;
		}
	}
	for (int q = 0; per != NULL && q < s->num_servers; q++) {
		for (int i = 0; per[q].n > 0 && i < s->nnodes; i++) {
			struct sched_node *m = s->nodes[i];
			if (!m->registered || m->gone || m->lost || m->role != CONFIG_ROLE_SERVER ||
			    m->rank != q)
				continue;
			struct wire_buf b;
			wire_buf_init(&b);
			struct wire_hdr h = {0};
			rdv_failover_encode(&per[q], &h, &b);
			h.type = WIRE_MIGRATE;
			if (!b.failed)
				sched_send(m, &h, b.data);
			wire_buf_fini(&b);
		}
		free(per[q].keys);
		free(per[q].servers);
	}
	free(per);
	free(mo.keys);
	LOG_WARN("%u partitions the failover of server %d had moved go back to its replacement "
		 "from the next round", moved, r);
}

struct sched_tensor *sched_new_tensor(struct rdv_scheduler *s)
{
	if (s->ntensors == s->cap_tensors) {
		int cap = s->cap_tensors ? s->cap_tensors * 2 : 64;
		struct sched_tensor *nt = realloc(s->tensors, (size_t)cap * sizeof *nt);
		if (nt == NULL)
			return NULL;
		s->tensors = nt;
		s->cap_tensors = cap;
	}
	struct sched_tensor *t = &s->tensors[s->ntensors];
	memset(t, 0, sizeof *t);
	return t;
}

/* A new tensor: its cut and placement, filed in the table (*out); on the
 * servers of `rack` when it has any (a tensor of that rack's workers
 * alone).  0, UNISUM_ENOMEM, or UNISUM_EPROTO when it cannot be placed. */
static int sched_place_tensor(struct rdv_scheduler *s, const struct sched_node *n, const char *name,
			      uint64_t key, const struct wire_hdr *req, uint64_t pbytes,
			      const struct rdv_segs *segs, const struct rdv_shape *shape, int rack,
			      const char *comp, struct sched_tensor **out)
{
	struct sched_tensor *t = sched_new_tensor(s);
	if (t == NULL)
		return UNISUM_ENOMEM;
	uint32_t nparts;
	int rc;
	if (segs->n > 0) {
		int32_t *homes = calloc(segs->n, sizeof *homes);
		if (homes == NULL)
			return UNISUM_ENOMEM;
		for (uint32_t i = 0; i < segs->n; i++)
			homes[i] = s->home_server != NULL && segs->owners[i] < (uint32_t)s->num_machines
					   ? s->home_server[segs->owners[i]]
					   : -1;
		rc = placement_place_homed(&s->placement, unisum_dtype_size(req->dtype), pbytes,
					   segs->n, segs->counts, homes, &nparts, &t->parts,
					   &t->servers);
		free(homes);
	} else {
		struct sched_rack *k = NULL;
		for (int i = 0; rack >= 0 && i < s->nracks && k == NULL; i++)
			k = s->racks[i].rack == rack ? &s->racks[i] : NULL;
		rc = placement_place(k != NULL ? &k->pl : &s->placement, key, req->count,
				     unisum_dtype_size(req->dtype), pbytes, &nparts, &t->parts,
				     &t->servers);
		for (uint32_t i = 0; rc == 0 && k != NULL && i < nparts; i++) {
			t->servers[i] = (uint32_t)k->server[t->servers[i]];
			s->placement.loads[t->servers[i]] += t->parts[i].count *
							      unisum_dtype_size(req->dtype);
		}
		if (rc == 0 && k != NULL)
			s->placement.total += req->count * unisum_dtype_size(req->dtype);
	}
	if (rc != 0)
		return rc == UNISUM_ENOMEM ? rc : UNISUM_EPROTO;
	sched_avoid_lost(s, t->parts, t->servers, nparts, unisum_dtype_size(req->dtype));
	s->placed_ms = timing_now_ms();
	if (LOG_LEVEL_DEBUG >= log_threshold) {
		for (uint32_t i = 0; i < nparts; i++)
			LOG_DEBUG("placed '%s' part %u (%llu elements at %llu) on server %u", name, i,
				  (unsigned long long)t->parts[i].count,
				  (unsigned long long)t->parts[i].offset, t->servers[i]);
	}
	sched_file_tensor(s, t, n, name, key, req, pbytes, segs, shape, comp, nparts);
	*out = t;
	return 0;
}

void sched_file_tensor(struct rdv_scheduler *s, struct sched_tensor *t, const struct sched_node *n,
		       const char *name, uint64_t key, const struct wire_hdr *req, uint64_t pbytes,
		       const struct rdv_segs *segs, const struct rdv_shape *shape, const char *comp,
		       uint32_t nparts)
{
	t->nsegs = segs->n;
	t->segs_hash = sched_segs_hash(segs);
	t->shape = *shape;
	t->shape_rank = n->rank;
	snprintf(t->name, sizeof t->name, "%s", name);
	t->dtype = req->dtype;
	t->count = req->count;
	t->partition_bytes = pbytes;
	t->key = key;
	t->first_rank = n->rank;
	t->sync = req->aux;
	snprintf(t->comp, sizeof t->comp, "%s", comp);
	t->nparts = nparts;
	s->ntensors++;
}

/* Whether DECLARE req (partitions of pbytes, segments segs, shape) is
 * well formed: segments that add up to the count, a shape whose product
 * is the count, a known sync mode, and not too many partitions. */
bool sched_declare_valid(const struct wire_hdr *req, uint64_t pbytes,
			 const struct rdv_segs *segs, const struct rdv_shape *shape)
{
	size_t esize = unisum_dtype_size(req->dtype);
	uint64_t seg_total = 0;
	bool seg_ok = true;
	for (uint32_t i = 0; i < segs->n && seg_ok; i++) {
		seg_ok = segs->counts[i] <= req->count - seg_total &&
			 placement_nparts(segs->counts[i], esize, pbytes) <= PLACEMENT_MAX_PARTS;
		seg_total += seg_ok ? segs->counts[i] : 0;
	}
	uint64_t elements = shape->ndim > 0 ? 1 : req->count;
	for (uint32_t i = 0; i < shape->ndim && seg_ok; i++)
		seg_ok = !__builtin_mul_overflow(elements, shape->dims[i], &elements);
	return pbytes >= esize && seg_ok && elements == req->count && wire_sync_valid(req->aux) &&
	       !(segs->n > 0 && seg_total != req->count) &&
	       !(segs->n == 0 && placement_nparts(req->count, esize, pbytes) > PLACEMENT_MAX_PARTS);
}

/* DECLARE from node n, on the scheduler's loop.  Serves: decodes the
 * request, refuses a bad one (the node's connection closes on an error
 * returned), and files the tensor or checks it against the one already
 * filed under its name; the first declaration cuts it and places the
 * pieces (Theorem 1), and every declarer gets the same answer.  Takes
 * s->lock itself; owns the tensor table's entries it makes.  Blocks only
 * on the reply's send to n. */
int sched_on_declare(struct rdv_scheduler *s, struct sched_node *n, const struct wire_hdr *req,
		     const void *payload, size_t len)
{
	char name[256];
	uint64_t pbytes;
	struct rdv_segs segs;
	struct rdv_shape shape;
	int rack;
	char comp[WIRE_SPEC_MAX];
	int drc = rdv_declare_decode(payload, len, name, sizeof name, &pbytes, &segs, &shape, &rack,
				     comp, sizeof comp);
	if (drc != 0)
		return drc;
	if (n->role != CONFIG_ROLE_WORKER || !sched_declare_valid(req, pbytes, &segs, &shape)) {
		rdv_segs_free(&segs);
		return UNISUM_EPROTO;
	}

	uint64_t key = placement_tensor_key(name);
	struct wire_buf b;
	wire_buf_init(&b);
	pthread_mutex_lock(&s->lock);
	if (!n->registered) {
		/* Retired by an elastic re-form while this was on its way: the
		 * worker declares again in its new generation. */
		pthread_mutex_unlock(&s->lock);
		wire_buf_fini(&b);
		rdv_segs_free(&segs);
		return 0;
	}
	struct sched_tensor *t = sched_find_tensor(s, name, key);
	char msg[768] = "";
	int rc = 0, code = t != NULL ? sched_refusal(t, n, name, req, pbytes, &segs, &shape, comp,
						     msg, sizeof msg)
				     : 0;
	if (t != NULL && msg[0] == '\0' && t->shape.ndim == 0 && shape.ndim > 0) {
		t->shape = shape;	/* the first to give one */
		t->shape_rank = n->rank;
	}
	if (t == NULL &&
	    (rc = sched_place_tensor(s, n, name, key, req, pbytes, &segs, &shape, rack, comp,
					      &t)) != 0) {
		pthread_mutex_unlock(&s->lock);
		wire_buf_fini(&b);
		rdv_segs_free(&segs);
		return rc;
	}
	rdv_segs_free(&segs);
	if (msg[0] != '\0' && code == UNISUM_EMISMATCH && t->poison == NULL &&
	    strcmp(t->name, name) == 0) {
		/* Workers that declared the first shape may already be pushing:
		 * the servers answer every pull of this tensor with the error. */
		sched_poison_all(s, t, msg);
	}
	struct sched_tensor *base = msg[0] == '\0' ? sched_poisoned_base(s, name) : NULL;
	if (base != NULL) {
		/* A cut of a tensor that can never be summed: the worker that
		 * declared the tensor differently never gets here. */
		snprintf(msg, sizeof msg, "%s", base->poison);
		code = UNISUM_EMISMATCH;
		sched_poison_all(s, t, msg);
	}
	if (msg[0] != '\0') {
		LOG_ERROR("%s", msg);
		rdv_refused_encode(&b, code, msg);
	} else {
		rdv_placed_encode(&b, t->nparts, t->parts, t->servers);
	}
	pthread_mutex_unlock(&s->lock);
	if (b.failed) {
		wire_buf_fini(&b);
		return UNISUM_ENOMEM;
	}
	struct wire_hdr h = {.type = WIRE_DECLARE, .key = key, .dtype = req->dtype, .count = req->count,
			     .payload_len = b.len};
	sched_send(n, &h, b.data);
	wire_buf_fini(&b);
	return 0;
}


int sched_tensors_reset(struct rdv_scheduler *s, int num_servers, int num_machines)
{
	for (int i = 0; i < s->ntensors; i++) {
		free(s->tensors[i].parts);
		free(s->tensors[i].servers);
		free(s->tensors[i].poison);
		free(s->tensors[i].forgot);
	}
	s->ntensors = 0;
	free(s->lost);
	s->lost = NULL;
	free(s->replaced);
	s->replaced = NULL;
	for (int i = 0; s->moved_off != NULL && i < s->num_servers; i++)
		free(s->moved_off[i].keys);
	free(s->moved_off);
	s->moved_off = NULL;
	s->failovers = 0;
	s->placed_ms = 0;
	sched_free_racks(s);
	int policy = s->placement.policy;
	placement_fini(&s->placement);
	int *home = realloc(s->home_server, (size_t)(num_machines > 0 ? num_machines : 1) *
						sizeof *home);
	if (home != NULL)
		s->home_server = home;
	for (int m = 0; home != NULL && m < num_machines; m++)
		home[m] = -1;
	s->num_servers = num_servers;
	s->num_machines = num_machines;
	s->num_workers = num_machines * s->local_size;
	return home == NULL || placement_init(&s->placement, policy, num_servers, NULL) != 0
		       ? UNISUM_ENOMEM
		       : 0;
}
