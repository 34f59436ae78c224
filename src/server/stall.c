/*
 * stall.c - the engines' look for stalls (server.c's DESIGN): a round,
 * an SSP pull or a wait for the backup that lasts past
 * UNISUM_STALL_WARN_MS is reported, naming who it waits for, and past
 * UNISUM_STALL_ABORT_MS fails the job; a round that waits for a machine
 * whose connection ended fails it at once (after a grace for the
 * scheduler's word on the real cause).  Each engine keeps its longest
 * wait for the metrics.  Called from engine.c's threads only.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "log/log.h"
#include "rendezvous/rendezvous.h"
#include "server/srv_int.h"
#include "timing/timing.h"

/* How often an engine looks for stalls: a quarter of the shortest limit,
 * at most once a second. */
int srv_stall_period_ms(const struct server *srv)
{
	int limit = srv->cfg->stall_warn_ms;
	if (srv->cfg->stall_abort_ms > 0 && srv->cfg->stall_abort_ms < limit)
		limit = srv->cfg->stall_abort_ms;
	return limit / 4 < 1000 ? (limit / 4 > 5 ? limit / 4 : 5) : 1000;
}

/* The contributor with the fewest deltas (the one holding others back). */
static int srv_ssp_slowest(const struct srv_key *k)
{
	int slow = -1;
	for (int v = 0; v < k->nc; v++)
		if (!k->gone[v] && (slow < 0 || k->clock[v] < k->clock[slow]))
			slow = v;
	return slow < 0 ? 0 : slow;
}

/* How long a peer's connection must have been gone before a round waiting
 * for it fails the job with this server's own words.  A process that died
 * (killed by the OOM killer, a signal) is named with its cause by the
 * scheduler, which hears it from the launcher or the node's monitor a few
 * milliseconds later: that message wins when it comes first (issue 49's
 * "every survivor names the real cause").  A stall check runs every second
 * at most, so the job still fails within about two. */
#define SRV_LEFT_GRACE_MS 1000

/* Whether peer p's connection ended at least SRV_LEFT_GRACE_MS before
 * `now`.  Called with srv->lock held. */
static bool srv_peer_gone(const struct server *srv, int p, int64_t now)
{
	return srv->left[p] != 0 && now - srv->left[p] >= SRV_LEFT_GRACE_MS;
}

/* Whether slot s of key k waits for a machine whose connection ended (it
 * left the job, or died): then that round can never be summed, and msg
 * says so, naming it.  Called with srv->lock held. */
static bool srv_slot_waits_for_left(const struct server *srv, const struct srv_key *k,
				    const struct srv_slot *s, int64_t now, char *msg, size_t len)
{
	for (int w = 0; w < k->nc; w++) {
		if (s->arrived[w] || !srv_peer_gone(srv, srv_key_peer(k, w), now))
			continue;
		char name[64];
		snprintf(msg, len,
			 "%s closed its connection (it called shutdown, its program ended or it "
			 "died) while tensor '%s' (partition %u) round %u still waits for its push: "
			 "the other workers pushed it. Does every worker run the same number of "
			 "rounds?",
			 srv_worker_name(srv, srv_key_peer(k, w), name, sizeof name), k->name,
			 (unsigned)(k->key & 0xffff), s->round);
		return true;
	}
	return false;
}

/* 0, 1 (past UNISUM_STALL_WARN_MS) or 2 (past UNISUM_STALL_ABORT_MS) for a
 * wait of `waited` ms. */
static int srv_stall_level(const struct config *cfg, int64_t waited)
{
	return cfg->stall_abort_ms > 0 && waited >= cfg->stall_abort_ms ? 2
	       : waited >= cfg->stall_warn_ms				 ? 1
									 : 0;
}

/* SSP: a pull held for a slow contributor longer than the stall limits
 * is reported, naming the contributor that holds the others back (and
 * past UNISUM_STALL_ABORT_MS fails the job, into abort_msg); one that
 * left can never catch up, and goes into left_msg (the job fails at
 * once, as for a lock-step round waiting for a machine that left, unless
 * its last push is still queued: srv_check_stalls).  Called with
 * srv->lock held, on the key's engine thread. */
static void srv_ssp_stall(struct server *srv, struct srv_key *k, int64_t now, char *abort_msg,
			  char *left_msg, size_t len)
{
	const struct config *cfg = srv->cfg;
	int64_t waited = now - k->held_since_ms;
	int level = srv_stall_level(cfg, waited);
	int slow = srv_ssp_slowest(k);
	if (srv_peer_gone(srv, srv_key_peer(k, slow), now)) {
		char name[64];
		if (left_msg[0] == '\0')
			snprintf(left_msg, len, "%s closed its connection (it called shutdown, its "
				 "program ended or it died) while it held back the others on tensor "
				 "'%s' (partition %u, bounded staleness %u): they wait for its next step",
				 srv_worker_name(srv, srv_key_peer(k, slow), name, sizeof name),
				 k->name ? k->name : "?", (unsigned)(k->key & 0xffff), k->staleness);
		return;
	}
	if (level <= k->held_level)
		return;
	k->held_level = level;
	char waiting[256] = "", msg[768];
	size_t n = 0;
	for (int w = 0; w < k->nc && n < sizeof waiting - 16; w++)
		if (k->value_waiting[w])
			n += (size_t)snprintf(waiting + n, sizeof waiting - n, "%s%d", n ? ", " : "",
					      k->ranks != NULL ? k->ranks[w] : w);
	int top = 0;
	for (int w = 0; w < k->nc; w++)
		top = k->clock[w] > k->clock[top] ? w : top;
	snprintf(msg, sizeof msg,
		 "stall: worker %d holds the others back: tensor '%s' (partition %u) runs with "
		 "bounded staleness %u, worker %d has pushed %u steps and worker %d %u, so worker(s) "
		 "%s have waited %lld ms for it",
		 k->ranks != NULL ? k->ranks[slow] : slow, k->name ? k->name : "?",
		 (unsigned)(k->key & 0xffff), k->staleness, k->ranks != NULL ? k->ranks[slow] : slow,
		 k->clock[slow], k->ranks != NULL ? k->ranks[top] : top, k->clock[top], waiting,
		 (long long)waited);
	log_count_stall();
	if (level == 1) {
		LOG_WARN("%s", msg);
	} else {
		LOG_ERROR("%s (UNISUM_STALL_ABORT_MS=%d: failing the job)", msg, cfg->stall_abort_ms);
		if (abort_msg[0] == '\0')
			snprintf(abort_msg, len, "%s", msg);
	}
}

/* Reports rounds of this engine's keys that some workers pushed and others
 * have not, for longer than the stall limits (see DESIGN above), and fails
 * the job at once for a round that waits for a machine that left. */
/* The contributors slot s of key k waits for, in `missing`: "worker(s)
 * 1, 3", or with several workers per machine "machine(s) 1 (worker rank
 * 4), 3 (worker rank 12)".  Called with srv->lock held. */
static void srv_slot_missing(const struct server *srv, const struct srv_key *k,
			     const struct srv_slot *s, char *missing, size_t len)
{
	int L = srv->local_size;
	bool machines = L > 1 && k->ranks == NULL;
	size_t n = (size_t)snprintf(missing, len, "%s", machines ? "machine(s)" : "worker(s)");

	for (int w = 0, first = 1; w < k->nc && n < len - 40; w++) {
		if (s->arrived[w])
			continue;
		if (machines)
			n += (size_t)snprintf(missing + n, len - n, "%s%d (worker rank %d)",
					      first ? " " : ", ", w, w * L);
		else
			n += (size_t)snprintf(missing + n, len - n, "%s%d", first ? " " : ", ",
					      k->ranks != NULL ? k->ranks[w] : w);
		first = 0;
	}
}

/* Slot s of key k has waited `waited` ms: past a stall limit it crossed
 * since the last look it is logged, and past the abort limit its message
 * goes into abort_msg (the first one).  Called with srv->lock held. */
static void srv_slot_stall(struct server *srv, struct srv_key *k, struct srv_slot *s,
			   int64_t waited, char *abort_msg, size_t abort_len)
{
	const struct config *cfg = srv->cfg;
	int level = srv_stall_level(cfg, waited);
	if (level <= s->stall_level)
		return;
	s->stall_level = level;
	char missing[256], msg[768];
	srv_slot_missing(srv, k, s, missing, sizeof missing);
	snprintf(msg, sizeof msg,
		 "stall: tensor '%s' (partition %u) round %u has waited %lld ms for %s, "
		 "which have not pushed it; the others have. Does every worker push "
		 "every tensor every round?",
		 k->name, (unsigned)(k->key & 0xffff), s->round, (long long)waited, missing);
	log_count_stall();
	if (level == 1) {
		LOG_WARN("%s", msg);
	} else {
		LOG_ERROR("%s (UNISUM_STALL_ABORT_MS=%d: failing the job)", msg,
			  cfg->stall_abort_ms);
		if (abort_msg[0] == '\0')
			snprintf(abort_msg, abort_len, "%s", msg);
	}
}

/* Keeps engine e's longest wait past UNISUM_STALL_WARN_MS (k's slot s,
 * `waited` ms; k NULL: none) for the metrics, named.  Called with
 * srv->lock held. */
static void srv_note_stall(struct server *srv, struct srv_engine *e, const struct srv_key *k,
			   const struct srv_slot *s, int64_t waited)
{
	char missing[256] = "";
	if (k != NULL)
		srv_slot_missing(srv, k, s, missing, sizeof missing);
	pthread_mutex_lock(&e->lock);
	e->stall_ms = k != NULL ? waited : 0;
	if (k != NULL)
		snprintf(e->stall, sizeof e->stall,
			 "server %d: tensor '%s' (partition %u) round %u waits for %s", srv->rank,
			 k->name ? k->name : "?", (unsigned)(k->key & 0xffff), s->round, missing);
	pthread_mutex_unlock(&e->lock);
}

/* Engine e's look for stalls, every srv_stall_period_ms: a round of one
 * of its keys that has waited past UNISUM_STALL_WARN_MS is logged, past
 * UNISUM_STALL_ABORT_MS it fails the job (the first such message), and a
 * round waiting for a machine that left fails it once the machine has
 * been gone SRV_LEFT_GRACE_MS (once per engine), both naming who did not
 * push.  Runs on the engine's thread;
 * takes srv->lock to read the keys, then e->lock, and talks to the
 * scheduler with neither held. */
void srv_check_stalls(struct server *srv, struct srv_engine *e)
{
	int64_t now = timing_now_ms();
	const struct config *cfg = srv->cfg;
	char abort_msg[768] = "";	/* the first stall past the abort limit */
	char left_msg[768] = "";	/* the first round waiting for a machine that left */
	struct srv_key *worst_k = NULL;	/* the longest wait past the warning, for the metrics */
	struct srv_slot *worst_s = NULL;
	int64_t worst_ms = 0;
	pthread_mutex_lock(&srv->lock);
	for (size_t i = 0; i < e->nkeys; i++) {
		struct srv_key *k = e->keys[i];
		if (k->ssp && k->held_since_ms > 0 && k->poison == NULL)
			srv_ssp_stall(srv, k, now, abort_msg, left_msg, sizeof abort_msg);
		for (int j = 0; j < 2; j++) {
			struct srv_slot *s = &k->slot[j];
			if (!s->active || s->ready || s->dormant || k->poison != NULL)
				continue;
			if (left_msg[0] == '\0' &&
			    srv_slot_waits_for_left(srv, k, s, now, left_msg, sizeof left_msg))
				continue;
			int64_t waited = now - s->started_ms;
			if (waited >= cfg->stall_warn_ms && waited > worst_ms) {
				worst_ms = waited;
				worst_k = k;
				worst_s = s;
			}
			srv_slot_stall(srv, k, s, waited, abort_msg, sizeof abort_msg);
		}
	}
	srv_note_stall(srv, e, worst_k, worst_s, worst_ms);
	pthread_mutex_unlock(&srv->lock);
	/* A machine's last push may still wait in this engine's queue: it is
	 * acknowledged as it arrives, before it is summed, and the machine
	 * may leave at the acknowledgement (unisum_shutdown pushes ZERO for
	 * a begun allgather round and leaves once that is acknowledged).  It
	 * was queued before its connection closed (one thread does both), so
	 * with the queue empty, the round truly waits; else look again at
	 * the next check, once the queue has been worked off. */
	if (left_msg[0] != '\0') {
		pthread_mutex_lock(&e->lock);
		if (e->head != NULL)
			left_msg[0] = '\0';
		pthread_mutex_unlock(&e->lock);
	}
	/* Socket I/O after the lock is let go; once for a machine that left. */
	if (left_msg[0] != '\0') {
		if (!e->left_failed) {
			e->left_failed = true;
			LOG_ERROR("%s", left_msg);
			rdv_client_fail_job(srv->rdv, UNISUM_ECONN, left_msg);
		}
	} else if (abort_msg[0] != '\0') {
		rdv_client_fail_job(srv->rdv, UNISUM_ETIMEDOUT, abort_msg);
	}
}
