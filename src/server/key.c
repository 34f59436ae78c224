/*
 * key.c - the server's key table: a hash of every declared key (struct
 * srv_key, srv_int.h), declaration (checked against what is known, or
 * made and pinned to the engine with the fewest bytes), and the pins that
 * free a key once nothing holds it.  The table is under srv->lock; a key's
 * state is its engine's (engine.c).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "log/log.h"
#include "server/srv_int.h"
#include "timing/timing.h"
#include "wire/wire.h"

static size_t srv_hash(uint64_t key, size_t n)
{
	key ^= key >> 33;
	key *= 0xff51afd7ed558ccdull;
	key ^= key >> 33;
	return (size_t)(key & (n - 1));
}

/* Looks a key up; call with srv->lock held. */
struct srv_key *srv_key_find(struct server *srv, uint64_t key)
{
	for (struct srv_key *k = srv->buckets[srv_hash(key, srv->nbuckets)]; k; k = k->next)
		if (k->key == key)
			return k;
	return NULL;
}

void srv_out_of_memory(struct server *srv, const char *what)
{
	if (atomic_exchange(&srv->oom_told, true))
		return;
	char limits[400], why[1000];
	log_memory_limits(limits, sizeof limits);
	snprintf(why, sizeof why, "server %d (pid %d) is out of memory: %s (%s)", srv->rank,
		 (int)getpid(), what, limits);
	LOG_ERROR("%s", why);
	if (srv->rdv != NULL)
		rdv_client_fail_job(srv->rdv, UNISUM_ENOMEM, why);
}

/* ---- copies of other servers' keys (replica.c) ---------------------------- */

static struct srv_copy **srv_copy_slot(struct server *srv, uint64_t key)
{
	struct srv_copy **at = &srv->copies[srv_hash(key, SRV_COPY_BUCKETS)];
	while (*at != NULL && (*at)->key != key)
		at = &(*at)->next;
	return at;
}

static void srv_copy_free(struct srv_copy *c)
{
	if (c != NULL)
		free(c->data);
	free(c);
}

int srv_copy_put(struct server *srv, struct srv_copy *c)
{
	pthread_mutex_lock(&srv->lock);
	if (srv->copies == NULL &&
	    (srv->copies = calloc(SRV_COPY_BUCKETS, sizeof *srv->copies)) == NULL) {
		pthread_mutex_unlock(&srv->lock);
		return UNISUM_ENOMEM;
	}
	struct srv_copy **at = srv_copy_slot(srv, c->key), *old = *at;
	c->next = old != NULL ? old->next : NULL;
	*at = c;
	pthread_mutex_unlock(&srv->lock);
	srv_copy_free(old);
	return 0;
}

/* Takes key's copy out of the table (srv->lock held), or NULL. */
static struct srv_copy *srv_copy_take(struct server *srv, uint64_t key)
{
	if (srv->copies == NULL)
		return NULL;
	struct srv_copy **at = srv_copy_slot(srv, key), *c = *at;
	if (c != NULL)
		*at = c->next;
	return c;
}

void srv_copy_drop(struct server *srv, uint64_t key)
{
	pthread_mutex_lock(&srv->lock);
	struct srv_copy *c = srv_copy_take(srv, key);
	pthread_mutex_unlock(&srv->lock);
	srv_copy_free(c);
}

int srv_copies_drop_from(struct server *srv, uint32_t from)
{
	int n = 0;
	pthread_mutex_lock(&srv->lock);
	for (size_t i = 0; srv->copies != NULL && i < SRV_COPY_BUCKETS; i++) {
		for (struct srv_copy **at = &srv->copies[i]; *at != NULL;) {
			struct srv_copy *c = *at;
			if (c->from != from) {
				at = &c->next;
				continue;
			}
			*at = c->next;
			srv_copy_free(c);
			n++;
		}
	}
	pthread_mutex_unlock(&srv->lock);
	return n;
}

void srv_copies_free(struct server *srv)
{
	for (size_t i = 0; srv->copies != NULL && i < SRV_COPY_BUCKETS; i++)
		while (srv->copies[i] != NULL) {
			struct srv_copy *c = srv->copies[i];
			srv->copies[i] = c->next;
			srv_copy_free(c);
		}
	free(srv->copies);
	srv->copies = NULL;
}

/* Whether copy c is of key k as declared: its size and contributors; of
 * a compressed key, its error feedback and the round's encoding. */
static bool srv_copy_fits(const struct srv_copy *c, const struct srv_key *k)
{
	bool compressed = !k->server_held;
	size_t want = compressed ? k->bytes + k->wire_bytes : k->bytes + 4 * (size_t)k->nc;
	return c->count == k->count && c->dtype == k->dtype &&
	       (c->len == want || (compressed && c->len == k->bytes)) &&
	       c->nc == (compressed ? 0u : (uint32_t)k->nc) &&
	       ((c->flags & WIRE_FLAG_COMPRESSED) != 0) == compressed;
}

/* A failover moved key k (async, SSP, or compressed with error
 * feedback) here: it takes this server's copy of it, if any (of its
 * size), with each contributor's pushes it holds (k->base; a compressed
 * key's: its version, k->copy_have).  0 or UNISUM_ENOMEM; srv->lock
 * held. */
static int srv_key_take_copy(struct server *srv, struct srv_key *k)
{
	struct srv_copy *c = srv_copy_take(srv, k->key);
	if (c == NULL)
		return 0;
	if (!srv_copy_fits(c, k)) {
		LOG_WARN("key 0x%llx: the copy from server %u is %s[%llu] of %u contributors, not "
			 "the key declared: dropped", (unsigned long long)k->key, c->from,
			 unisum_dtype_name(c->dtype), (unsigned long long)c->count, c->nc);
		srv_copy_free(c);
		return 0;
	}
	if (!k->server_held) {
		k->copy_have = c->ver;
		k->copy = c;
		return 0;
	}
	k->base = calloc((size_t)k->nc, sizeof *k->base);
	if (k->base == NULL) {
		srv_copy_free(c);
		return UNISUM_ENOMEM;
	}
	bool gone;
	for (int w = 0; w < k->nc; w++)
		k->base[w] = srv_copy_pushes(c, k->bytes, w, &gone);
	k->copy = c;
	return 0;
}

/* A declaration of replicated key k by contributor w, pushing `round`
 * next (after a failover, the pushes it had answered): the key's copy
 * here must hold all but the last, which the worker sends again
 * (RESTORE); of a compressed key, the error feedback of the round before
 * the worker's last, which is summed again here from every worker's
 * push.  Else an acknowledged update is lost and the job fails
 * (UNISUM_EREMOTE with why).  srv->lock held. */
static int srv_key_copy_check(struct server *srv, const struct srv_key *k, int w, uint32_t round,
			      const char *name, char *why, size_t len)
{
	bool held = k->server_held;
	uint32_t have = !held ? k->copy_have : k->base != NULL ? k->base[w] : 0;
	if (!srv_key_replicated(srv, k) || round <= have + 1)
		return 0;
	char who[64];
	snprintf(why, len, "server %d took over key 0x%llx of '%s' (%s) from a lost server, but "
		 "%s: %s had %u %s answered, of which the copy must hold %u and holds %u; no "
		 "whole copy of the key was left (its backup was lost too, or was still catching "
		 "up)", srv->rank, (unsigned long long)k->key, name,
		 held ? "async/SSP" : "compressed, with error feedback",
		 (held ? k->base != NULL : k->copy_have > 0) ? "its copy here is behind"
							     : "it holds no copy of it",
		 srv_worker_name(srv, srv_key_peer(k, w), who, sizeof who), round,
		 held ? "updates" : "rounds", round - 1, have);
	return UNISUM_EREMOTE;
}

static int srv_key_grow(struct server *srv)
{
	size_t n = srv->nbuckets * 2;
	struct srv_key **b = calloc(n, sizeof *b);
	if (b == NULL)
		return UNISUM_ENOMEM;
	for (size_t i = 0; i < srv->nbuckets; i++) {
		struct srv_key *k = srv->buckets[i];
		while (k) {
			struct srv_key *next = k->next;
			size_t h = srv_hash(k->key, n);
			k->next = b[h];
			b[h] = k;
			k = next;
		}
	}
	free(srv->buckets);
	srv->buckets = b;
	srv->nbuckets = n;
	return 0;
}

/* Drops a pin of k (see srv_key.pins); the last frees it.  Only the
 * protocol, through the workers, orders a reply's sending before the last
 * RETIRE of its key; the pin keeps the key's memory regardless (and shows
 * ThreadSanitizer the order in the in-process tests). */
void srv_key_unpin(struct srv_key *k)
{
	if (atomic_fetch_sub_explicit(&k->pins, 1, memory_order_acq_rel) == 1)
		srv_key_free(k);
}

uint8_t *srv_key_buf(struct srv_key *k, size_t bytes)
{
	uint8_t *p = malloc(bytes ? bytes : 1);
	transport_mem_register(k->tp, p, bytes);
	return p;
}

void srv_key_buf_free(struct srv_key *k, void *p)
{
	transport_mem_unregister(k->tp, p);
	free(p);
}

void srv_key_free(struct srv_key *k)
{
	if (k == NULL)
		return;
	if (k->push_buf)
		for (int w = 0; w < k->nc; w++)
			srv_key_buf_free(k, k->push_buf[w]);
	for (int i = 0; i < 2; i++) {
		free(k->slot[i].arrived);
		free(k->slot[i].zero);
		free(k->slot[i].pull_waiting);
		srv_key_buf_free(k, k->slot[i].acc);
		free(k->slot[i].enc);
		for (int w = 0; k->slot[i].rpush != NULL && w < k->nc; w++)
			free(k->slot[i].rpush[w]);
		free(k->slot[i].rpush);
	}
	compress_state_free(&k->cstate);
	free(k->scratch);
	free(k->comp_text);
	free(k->push_buf);
	srv_key_buf_free(k, k->value);
	free(k->first_seen);
	free(k->value_waiting);
	free(k->wait_round);
	free(k->clock);
	for (int i = 0; k->snap != NULL && i < 2 * k->nc; i++)
		srv_key_buf_free(k, k->snap[i]);
	free(k->snap);
	free(k->replies);
	free(k->gone);
	free(k->peer);
	free(k->ranks);
	free(k->next_round);
	free(k->retired);
	free(k->name);
	free(k->own_poison);
	free(k->need);
	free(k->last);
	free(k->copy_wait);
	free(k->copy_round);
	free(k->base);
	srv_copy_free(k->copy);
	free(k);
}

static int srv_engine_grow(struct srv_engine *e)
{
	size_t cap = e->capkeys ? 2 * e->capkeys : 64;
	struct srv_key **keys = realloc(e->keys, cap * sizeof *keys);
	if (keys == NULL)
		return UNISUM_ENOMEM;
	e->keys = keys;
	e->capkeys = cap;
	return 0;
}

/* Whether key k's contributors are the process set `ranks` (nranks 0:
 * the global set). */
static bool srv_key_same_set(const struct srv_key *k, const int *ranks, int nranks)
{
	if (nranks == 0 || k->ranks == NULL)
		return nranks == 0 && k->ranks == NULL;
	return k->nc == nranks && memcmp(k->ranks, ranks, (size_t)nranks * sizeof *ranks) == 0;
}

/* Whether declaring key h->key with compression `spec` can be taken at
 * all: 0 with *comp parsed, or UNISUM_EPROTO with why set. */
static int srv_declare_spec(const struct wire_hdr *h, const char *name, const char *spec,
			    struct compress_spec *comp, char *why, size_t len)
{
	char err[256];

	comp->kind = COMPRESS_NONE;
	if (spec[0] != '\0' && compress_spec_parse(spec, comp, err, sizeof err) != 0) {
		snprintf(why, len, "DECLARE_CHECK of key 0x%llx of '%s' with compression '%s': %s",
			 (unsigned long long)h->key, name, spec, err);
		return UNISUM_EPROTO;
	}
	if (comp->kind != COMPRESS_NONE &&
	    (h->dtype != UNISUM_FLOAT32 || h->aux != WIRE_SYNC_LOCKSTEP)) {
		snprintf(why, len, "DECLARE_CHECK of key 0x%llx of '%s': compression '%s' takes "
			 "lock-step float32 tensors", (unsigned long long)h->key, name, spec);
		return UNISUM_EPROTO;
	}
	if (h->count > WIRE_MAX_DATA_PAYLOAD / unisum_dtype_size(h->dtype)) {
		snprintf(why, len, "key 0x%llx declared with %llu elements, more than one 1 GiB partition",
			 (unsigned long long)h->key, (unsigned long long)h->count);
		return UNISUM_EPROTO;
	}
	if (!wire_sync_valid(h->aux)) {
		snprintf(why, len, "DECLARE_CHECK of key 0x%llx with unknown sync mode %u",
			 (unsigned long long)h->key, h->aux);
		return UNISUM_EPROTO;
	}
	return 0;
}

/* Key k, known here, declared again by connection c's worker: 0 when the
 * declaration matches (its next round is then h->round: 0, or after a
 * failover the round it is at), else UNISUM_EMISMATCH / UNISUM_EPROTO with
 * why set.  Called with srv->lock held. */
static int srv_key_redeclare(struct server *srv, struct srv_key *k, const struct srv_conn *c,
			     const struct wire_hdr *h, const char *name, const int *ranks,
			     int nranks, const char *spec, char *why, size_t len)
{
	int w = srv_key_contrib(k, c->worker);
	unsigned long long key = (unsigned long long)h->key;

	if (k->sync != h->aux) {
		char a[32], b[32];
		snprintf(why, len, "key 0x%llx of '%s' is %s here but the worker declared it %s", key,
			 name, wire_sync_text(k->sync, a, sizeof a), wire_sync_text(h->aux, b, sizeof b));
		return UNISUM_EMISMATCH;
	}
	if (!srv_key_same_set(k, ranks, nranks)) {
		snprintf(why, len, "key 0x%llx of '%s' is summed over %s here but the worker "
			 "declared it for %s%d ranks", key, name,
			 k->ranks ? "a process set" : "the global set",
			 nranks ? "a process set of " : "the global set, not ", nranks);
		return UNISUM_EMISMATCH;
	}
	if (w < 0) {
		char who[64];
		snprintf(why, len, "%s declared key 0x%llx of '%s', which it does not push",
			 srv_worker_name(srv, c->worker, who, sizeof who), key, name);
		return UNISUM_EPROTO;
	}
	if (k->retired[w]) {
		snprintf(why, len, "key 0x%llx of '%s' declared again by a worker that undeclared it, "
			 "before every worker had", key, name);
		return UNISUM_EPROTO;
	}
	if (strcmp(k->comp_text ? k->comp_text : "", spec) != 0) {
		snprintf(why, len, "key 0x%llx of '%s' is compressed '%s' here but the worker "
			 "declared '%s'", key, name, k->comp_text ? k->comp_text : "none",
			 spec[0] ? spec : "none");
		return UNISUM_EMISMATCH;
	}
	if (k->dtype != h->dtype || k->count != h->count) {
		snprintf(why, len, "key 0x%llx is %s[%llu] here but the worker declared %s[%llu]", key,
			 unisum_dtype_name(k->dtype), (unsigned long long)k->count,
			 unisum_dtype_name(h->dtype), (unsigned long long)h->count);
		return UNISUM_EMISMATCH;
	}
	int rc = srv_key_copy_check(srv, k, w, h->round, name, why, len);
	if (rc == 0)
		k->next_round[w] = h->round;
	return rc;
}

/* Whether connection c's worker pushes a key of the process set `ranks`
 * (nranks 0: the global set, which a machine's local root pushes); else
 * UNISUM_EPROTO with why set. */
static int srv_declare_pusher(struct server *srv, const struct srv_conn *c,
			      const struct wire_hdr *h, const char *name, const int *ranks,
			      int nranks, char *why, size_t len)
{
	bool pushes = nranks == 0 && c->worker < srv->nworkers;
	char who[64];

	for (int i = 0; i < nranks && !pushes; i++)
		pushes = srv_rank_peer(srv, ranks[i]) == c->worker;
	if (pushes)
		return 0;
	snprintf(why, len, "%s declared key 0x%llx of '%s', which it does not push (%s)",
		 srv_worker_name(srv, c->worker, who, sizeof who), (unsigned long long)h->key, name,
		 nranks ? "it is not in the key's process set"
			: "only a machine's local root pushes the global set's tensors");
	return UNISUM_EPROTO;
}

/* A new key of W contributors (the process set `ranks`, nranks 0: the
 * global set) in sync mode `sync`, with its per-contributor tables; NULL
 * when out of memory. */
static struct srv_key *srv_key_new(struct server *srv, size_t W, const int *ranks, int nranks,
				   uint32_t sync)
{
	struct srv_key *k = calloc(1, sizeof *k);
	if (k == NULL)
		return NULL;
	atomic_init(&k->pins, 1);
	k->tp = srv->tp;
	k->moved_to = -1;
	k->nc = (int)W;
	if (nranks > 0) {
		k->peer = malloc(W * sizeof *k->peer);
		k->ranks = malloc(W * sizeof *k->ranks);
		if (k->peer != NULL && k->ranks != NULL) {
			memcpy(k->ranks, ranks, W * sizeof *ranks);
			for (int w = 0; w < nranks; w++)
				k->peer[w] = srv_rank_peer(srv, ranks[w]);
		}
	}
	k->next_round = calloc(W, sizeof *k->next_round);
	k->push_buf = calloc(W, sizeof *k->push_buf);
	k->retired = calloc(W, 1);
	bool ok = k->next_round && k->push_buf && k->retired && (nranks == 0 || (k->peer && k->ranks));
	k->sync = sync;
	k->server_held = wire_sync_held(sync);
	k->ssp = WIRE_SYNC_KIND(sync) == WIRE_SYNC_SSP;
	k->staleness = WIRE_SYNC_STALENESS(sync);
	if (k->server_held) {
		k->first_seen = calloc(W, 1);
		k->value_waiting = calloc(W, 1);
		k->wait_round = calloc(W, sizeof *k->wait_round);
		k->clock = calloc(W, sizeof *k->clock);
		k->snap = calloc(2 * W, sizeof *k->snap);
		k->replies = calloc(W, sizeof *k->replies);
		k->gone = calloc(W, 1);
		k->need = calloc(W, sizeof *k->need);
		k->last = calloc(W, sizeof *k->last);
		k->copy_wait = calloc(W, 1);
		k->copy_round = calloc(W, sizeof *k->copy_round);
		ok = ok && k->first_seen && k->value_waiting && k->wait_round && k->clock && k->snap &&
		     k->replies && k->gone && k->need && k->last && k->copy_wait && k->copy_round;
	}
	for (int i = 0; i < 2; i++) {
		k->slot[i].arrived = calloc(W, 1);
		k->slot[i].zero = calloc(W, 1);
		k->slot[i].pull_waiting = calloc(W, 1);
		ok = ok && k->slot[i].arrived && k->slot[i].zero && k->slot[i].pull_waiting;
	}
	if (!ok) {
		srv_key_free(k);
		return NULL;
	}
	return k;
}

/* Sets new key k's compression `comp` (spec text `spec`): its wire size,
 * scratch and error-feedback state.  0, UNISUM_ENOMEM, or UNISUM_EPROTO
 * with why set when a compressed partition would not fit a message. */
static int srv_key_compress(struct srv_key *k, const struct compress_spec *comp,
			    const char *name, const char *spec, char *why, size_t len)
{
	k->comp = *comp;
	if (comp->kind == COMPRESS_NONE)
		return 0;
	k->wire_bytes = compress_codec_of(comp->kind)->bytes(comp, (size_t)k->count);
	if (k->wire_bytes > WIRE_MAX_DATA_PAYLOAD) {
		snprintf(why, len, "key 0x%llx of '%s': %llu elements compressed '%s' take more "
			 "than the 1 GiB a message carries", (unsigned long long)k->key, name,
			 (unsigned long long)k->count, spec);
		return UNISUM_EPROTO;
	}
	k->comp_text = strdup(spec);
	k->scratch = malloc(k->bytes ? k->bytes : 1);
	if (k->comp_text == NULL || k->scratch == NULL ||
	    compress_state_init(&k->cstate, comp, (size_t)k->count, false) != 0)
		return UNISUM_ENOMEM;
	return 0;
}

/* A compressed key with error feedback (replicated): its replies' waits
 * for the backup.  0 or UNISUM_ENOMEM. */
static int srv_key_copy_arrays(struct srv_key *k)
{
	k->copy_wait = calloc((size_t)k->nc, 1);
	k->copy_round = calloc((size_t)k->nc, sizeof *k->copy_round);
	return k->copy_wait != NULL && k->copy_round != NULL ? 0 : UNISUM_ENOMEM;
}

/* Files new key k (named `name`) in the table and pins it to the engine
 * with the fewest bytes.  0 or UNISUM_ENOMEM.  Called with srv->lock held. */
static int srv_key_insert(struct server *srv, struct srv_key *k, const char *name)
{
	int best = 0;
	for (int e = 1; e < srv->nengines; e++)
		if (srv->engines[e].bytes < srv->engines[best].bytes)
			best = e;
	struct srv_engine *e = &srv->engines[best];
	k->name = strdup(name);
	if (k->name == NULL || (e->nkeys == e->capkeys && srv_engine_grow(e) != 0))
		return UNISUM_ENOMEM;
	e->keys[e->nkeys++] = k;
	k->engine = best;
	e->bytes += k->bytes;
	size_t b = srv_hash(k->key, srv->nbuckets);
	k->next = srv->buckets[b];
	srv->buckets[b] = k;
	srv->nkeys++;
	return 0;
}

bool srv_key_awaits_retires(struct server *srv, const struct srv_conn *c, uint64_t key)
{
	pthread_mutex_lock(&srv->lock);
	struct srv_key *k = srv_key_find(srv, key);
	int w0 = k != NULL ? srv_key_contrib(k, c->worker) : -1;
	bool awaits = w0 >= 0 && k->retired[w0];
	pthread_mutex_unlock(&srv->lock);
	return awaits;
}

/* Declares key h->key of tensor `name`, summed over the process set
 * `ranks` (nranks 0: the global set) in the sync mode h->aux (idempotent
 * when the shape, the set and the mode match).  Returns 0, or
 * UNISUM_EMISMATCH / UNISUM_ENOMEM / UNISUM_EPROTO with `why` set. */
int srv_key_declare(struct server *srv, struct srv_conn *c, const struct wire_hdr *h,
		    const char *name, const int *ranks, int nranks, const char *spec, char *why,
		    size_t len)
{
	struct compress_spec comp;
	int rc = srv_declare_spec(h, name, spec, &comp, why, len);
	if (rc != 0)
		return rc;
	size_t W = nranks > 0 ? (size_t)nranks : (size_t)srv->nworkers;
	pthread_mutex_lock(&srv->lock);
	struct srv_key *k = srv_key_find(srv, h->key);	/* held until retired: conn.c */
	if (k != NULL) {
		rc = srv_key_redeclare(srv, k, c, h, name, ranks, nranks, spec, why, len);
		goto out_unlock;
	}
	rc = srv_declare_pusher(srv, c, h, name, ranks, nranks, why, len);
	if (rc != 0)
		goto out_unlock;
	if (srv->nkeys + 1 > srv->nbuckets && srv_key_grow(srv) != 0) {
		rc = UNISUM_ENOMEM;
		goto out_unlock;
	}
	k = srv_key_new(srv, W, ranks, nranks, h->aux);
	if (k == NULL) {
		rc = UNISUM_ENOMEM;
		goto out_unlock;
	}
	k->key = h->key;
	k->dtype = h->dtype;
	k->count = h->count;
	k->bytes = h->count * unisum_dtype_size(h->dtype);
	int w = srv_key_contrib(k, c->worker);
	k->next_round[w] = h->round;
	rc = srv_key_compress(k, &comp, name, spec, why, len);
	if (rc == 0 && !k->server_held && srv_key_replicated(srv, k))
		rc = srv_key_copy_arrays(k);
	if (rc == 0 && srv_key_replicated(srv, k) && (rc = srv_key_take_copy(srv, k)) == 0)
		rc = srv_key_copy_check(srv, k, w, h->round, name, why, len);
	if (rc == 0)
		rc = srv_key_insert(srv, k, name);
	if (rc != 0)
		srv_key_free(k);
out_unlock:
	if (rc == UNISUM_ENOMEM)
		snprintf(why, len, "out of memory declaring key 0x%llx", (unsigned long long)h->key);
	pthread_mutex_unlock(&srv->lock);
	return rc;
}

/* Takes key k out of the table and its engine's list (nobody can post an
 * event for it after that), and wakes a declaration waiting for it to go. */
void srv_key_remove(struct server *srv, struct srv_key *k)
{
	pthread_mutex_lock(&srv->lock);
	struct srv_key **at = &srv->buckets[srv_hash(k->key, srv->nbuckets)];
	while (*at != NULL && *at != k)
		at = &(*at)->next;
	if (*at != NULL)
		*at = k->next;
	srv->nkeys--;
	struct srv_engine *e = &srv->engines[k->engine];
	for (size_t i = 0; i < e->nkeys; i++) {
		if (e->keys[i] == k) {
			e->keys[i] = e->keys[--e->nkeys];
			break;
		}
	}
	e->bytes -= k->bytes;
	pthread_mutex_unlock(&srv->lock);
}

/* The engines a loop thread owes a run (srv_wake_engines), at most
 * SRV_DUE_MAX; a post that finds no room signals at once.  A piece under
 * SRV_INLINE_BYTES waits for the end of the loop's round, and then the
 * loop runs the engine's events itself when no one else is (issue 50:
 * with 128-512 KiB partitions, waking an engine thread for every push
 * cost two context switches and two futex calls a push, a fifth of the
 * servers' CPU on the 2-core emulated cluster); a larger piece wakes the
 * engine's thread at once, so that summing it overlaps the loop's next
 * copy. */
#define SRV_DUE_MAX 64
#define SRV_INLINE_BYTES (1u << 20)
#define SRV_INLINE_MAX 64	/* events a loop runs for an engine at a time */
static _Thread_local struct {
	struct server *srv;	/* set on a loop thread by its first round */
	int n;
	struct srv_engine *e[SRV_DUE_MAX];
} srv_due;

void srv_wake_engines(void *arg)
{
	srv_due.srv = arg;	/* NULL: this thread's loop ended */
	for (int i = 0; i < srv_due.n; i++) {
		struct srv_engine *e = srv_due.e[i];
		pthread_mutex_lock(&e->lock);
		e->wake_due = false;
		if (arg != NULL && !e->busy && e->head != NULL && !e->stop) {
			e->busy = true;
			((struct server *)arg)->drain(e, SRV_INLINE_MAX);	/* lets the lock go */
			continue;
		}
		if (!e->busy)
			pthread_cond_signal(&e->cond);
		pthread_mutex_unlock(&e->lock);
	}
	srv_due.n = 0;
}

/* Whether a post of k's event from this thread may leave its engine to
 * the end of the loop's round; the caller holds e->lock. */
static bool srv_defer_wake(struct server *srv, struct srv_engine *e, const struct srv_key *k)
{
	if (srv_due.srv != srv || k->bytes >= SRV_INLINE_BYTES)
		return false;
	if (e->wake_due)
		return true;
	if (srv_due.n == SRV_DUE_MAX)
		return false;
	srv_due.e[srv_due.n++] = e;
	e->wake_due = true;
	return true;
}

int srv_post(struct server *srv, int type, struct srv_key *k, int w, uint32_t round, bool zero,
		    uint32_t wire_op, const char *why)
{
	struct srv_event *ev = malloc(sizeof *ev);
	if (ev == NULL)
		return UNISUM_ENOMEM;
	*ev = (struct srv_event){.type = type, .key = k, .worker = w, .round = round, .zero = zero,
				 .wire_op = wire_op, .why = why};
	struct srv_engine *e = &srv->engines[k->engine];
	pthread_mutex_lock(&e->lock);
	if (e->joined) {
		/* Shutting down (a late poison from the scheduler): nobody
		 * would take it. */
		pthread_mutex_unlock(&e->lock);
		if (type == EVENT_REFUSE || type == EVENT_RESTORE)
			free((char *)why);
		free(ev);
		return 0;
	}
	if (e->tail)
		e->tail->next = ev;
	else
		e->head = ev;
	e->tail = ev;
	/* A busy engine (its thread, or a loop at its round's end) runs
	 * this event before it lets go: no signal. */
	if (!e->busy && !srv_defer_wake(srv, e, k))
		pthread_cond_signal(&e->cond);
	pthread_mutex_unlock(&e->lock);
	return 0;
}
