/*
 * engine.c - the server's engines: every key is pinned to one engine
 * thread (key.c's table chooses it), which handles the key's events in
 * order (pushes folded in machine order, pulls answered, poison,
 * retirement) and looks for stalled rounds.  See server.c's DESIGN.
 */
#include <endian.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/prctl.h>

#include "log/log.h"
#include "reducer/reducer.h"
#include "rendezvous/rendezvous.h"
#include "server/srv_int.h"
#include "shm/shm.h"
#include "timing/timing.h"
#include "transport/transport.h"
#include "wire/wire.h"

/* ---- engines ------------------------------------------------------------ */

/* Out of memory `doing` what key k needs: the job fails, naming this
 * server and the limits (srv_out_of_memory). */
static void srv_engine_oom(struct server *srv, const struct srv_key *k, const char *doing)
{
	char what[300];
	snprintf(what, sizeof what, "%s key 0x%llx of tensor '%s' (%zu bytes)", doing,
		 (unsigned long long)k->key, k->name != NULL ? k->name : "?", k->bytes);
	atomic_store(&srv->job_error, UNISUM_ENOMEM);
	srv_out_of_memory(srv, what);
}

/* Frees slot s of key k for another round (its accumulator stays). */
static void srv_slot_reset(struct srv_key *k, struct srv_slot *s)
{
	s->active = false;
	s->ready = false;
	s->restored = false;
	s->replies = 0;
	s->next = 0;
	s->result = RESULT_NONE;
	s->dormant = false;
	memset(s->arrived, 0, (size_t)k->nc);
	memset(s->zero, 0, (size_t)k->nc);
	for (int w = 0; s->rpush != NULL && w < k->nc; w++) {
		free(s->rpush[w]);	/* a round no one needed after a failover */
		s->rpush[w] = NULL;
	}
}

/* UNISUM_TEST_CRASH_AFTER_REPLIES (failover tests only): once enough
 * replies went out, the first reply of a round (of a key of the chosen
 * name) reaches its worker and this server dies before the others. */
static void srv_test_crash(struct server *srv, const struct srv_key *k, const struct srv_slot *s)
{
	if ((srv->crash_rank >= 0 && srv->crash_rank != srv->rank) ||
	    (srv->crash_name != NULL && (k->name == NULL || strstr(k->name, srv->crash_name) == NULL)) ||
	    atomic_fetch_add(&srv->replies_sent, 1) + 1 < srv->crash_after || s->replies != 0 ||
	    k->nc < 2)
		return;
	LOG_WARN("UNISUM_TEST_CRASH_AFTER_REPLIES: killing this server after the first reply of key "
		 "0x%llx round %u", (unsigned long long)k->key, s->round);
	struct timespec pause = {.tv_sec = 0, .tv_nsec = 300 * 1000 * 1000};
	nanosleep(&pause, NULL);
	raise(SIGKILL);
}

/* Answers worker w's pull of the slot's round: the sum, or with skip
 * (a machine that wants none of this key's elements) only the header. */
static void srv_send_pull(struct server *srv, struct srv_key *k, struct srv_slot *s, int w,
			  bool skip)
{
	struct wire_hdr h = {.type = WIRE_PULL_REPLY, .sender = srv->id, .round = s->round,
			     .key = k->key, .count = k->count, .dtype = (uint8_t)k->dtype};
	const void *payload = NULL;
	if (skip) {
		h.flags = WIRE_FLAG_SKIP;
	} else if (s->result == RESULT_ZERO) {
		h.flags = WIRE_FLAG_ZERO;
	} else if (k->comp.kind != COMPRESS_NONE) {
		h.flags = WIRE_FLAG_COMPRESSED;
		h.payload_len = k->wire_bytes;
		payload = s->enc;
	} else {
		h.payload_len = k->bytes;
		payload = s->result == RESULT_OWNED ? s->acc : k->push_buf[s->borrowed];
	}
	atomic_fetch_add(&srv->bytes_out, h.payload_len);
	srv_queue_reply(srv, srv_key_peer(k, w), &h, k, payload);
	if (srv->crash_after > 0)	/* (a SKIP reply too: a homed cut's machine is done) */
		srv_test_crash(srv, k, s);
	if (++s->replies == k->nc)
		srv_slot_reset(k, s);	/* everyone has its reply: free for round + 2 */
}

/* srv_send_pull once the backup holds the error feedback of the round
 * before (a compressed key's, replica.c): at once without one. */
static void srv_reply_pull(struct server *srv, struct srv_key *k, struct srv_slot *s, int w,
			   bool skip)
{
	if (!srv_copy_gate(srv, k, w, s->round, skip))
		srv_send_pull(srv, k, s, w, skip);
}

/* The round of slot s is ready: answers the pulls that came before it. */
static void srv_answer_waiting(struct server *srv, struct srv_key *k, struct srv_slot *s)
{
	for (int w = 0; w < k->nc; w++) {
		if (s->pull_waiting[w]) {
			bool skip = s->pull_waiting[w] == 2;
			s->pull_waiting[w] = 0;
			srv_reply_pull(srv, k, s, w, skip);
		}
	}
}

static void srv_on_poison(struct server *srv, struct srv_key *k, const char *why)
{
	k->poison = why;
	for (int w = 0; k->copy_wait != NULL && w < k->nc; w++) {
		if (k->server_held && k->value_waiting[w]) {
			k->value_waiting[w] = 0;
			srv_reply_error(srv, NULL, srv_key_peer(k, w), k->key, k->wait_round[w],
					UNISUM_EMISMATCH, why);
		}
		if (k->copy_wait[w]) {	/* waiting for the backup (replica.c) */
			k->copy_wait[w] = 0;
			srv_reply_error(srv, NULL, srv_key_peer(k, w), k->key, k->copy_round[w],
					UNISUM_EMISMATCH, why);
		}
	}
	for (int i = 0; i < 2; i++) {
		struct srv_slot *s = &k->slot[i];
		for (int w = 0; w < k->nc; w++) {
			if (s->pull_waiting[w]) {
				s->pull_waiting[w] = 0;
				srv_reply_error(srv, NULL, srv_key_peer(k, w), k->key, s->round,
						UNISUM_EMISMATCH, why);
			}
		}
	}
}

static bool srv_slot_acc(struct srv_key *k, struct srv_slot *s)
{
	if (s->acc == NULL)
		s->acc = srv_key_buf(k, k->bytes);
	return s->acc != NULL;
}

/* Folds a compressed key's push of worker w: decoded into the slot's
 * sum (the first) or beside it and added, in float32.  0, UNISUM_ENOMEM,
 * or UNISUM_EPROTO when the bytes are not an encoding of the key. */
static int srv_fold_compressed(struct srv_key *k, struct srv_slot *s, int w)
{
	const struct compress_codec *codec = compress_codec_of(k->comp.kind);
	if (!srv_slot_acc(k, s))
		return UNISUM_ENOMEM;
	bool first = s->result != RESULT_OWNED;
	float *dst = first ? (float *)s->acc : k->scratch;
	uint8_t *src = s->rpush != NULL && s->rpush[w] != NULL ? s->rpush[w] : k->push_buf[w];
	int rc = codec->decode(&k->comp, src, k->wire_bytes, dst, (size_t)k->count,
			       compress_draw_seed(&k->comp, k->key, s->round, -1));
	if (src != k->push_buf[w]) {
		free(src);
		s->rpush[w] = NULL;
	}
	if (rc != 0)
		return UNISUM_EPROTO;
	if (!first)
		reducer_fold_into(REDUCER_SUM, s->acc, dst, k->count, UNISUM_FLOAT32);
	s->result = RESULT_OWNED;
	return 0;
}

/* Folds worker w's push from a RESTORE (a failover's, rpush[w]) into the
 * slot's own sum: never borrowed, since replies send a borrowed sum from
 * the push buffers. */
static int srv_fold_restored(struct srv_key *k, struct srv_slot *s, int w)
{
	uint8_t *src = s->rpush[w];
	reducer_op op = (reducer_op)wire_op_reduction(s->wire_op);
	if (!srv_slot_acc(k, s))
		return UNISUM_ENOMEM;
	if (s->result == RESULT_BORROWED)
		reducer_fold(op, s->acc, k->push_buf[s->borrowed], src, k->count, k->dtype);
	else if (s->result == RESULT_OWNED)
		reducer_fold_into(op, s->acc, src, k->count, k->dtype);
	else
		memcpy(s->acc, src, k->bytes);
	s->result = RESULT_OWNED;
	free(src);
	s->rpush[w] = NULL;
	return 0;
}

/* Folds worker w's contribution into the slot's sum. */
static int srv_fold(struct srv_key *k, struct srv_slot *s, int w)
{
	if (s->zero[w]) {
		if (s->result == RESULT_NONE)
			s->result = RESULT_ZERO;
		return 0;
	}
	if (k->comp.kind != COMPRESS_NONE)
		return srv_fold_compressed(k, s, w);
	if (s->rpush != NULL && s->rpush[w] != NULL)
		return srv_fold_restored(k, s, w);
	switch (s->result) {
	case RESULT_NONE:
	case RESULT_ZERO:
		s->result = RESULT_BORROWED;
		s->borrowed = w;
		return 0;
	case RESULT_BORROWED:
		if (!srv_slot_acc(k, s))
			return UNISUM_ENOMEM;
		reducer_fold((reducer_op)wire_op_reduction(s->wire_op), s->acc,
			     k->push_buf[s->borrowed], k->push_buf[w], k->count, k->dtype);
		s->result = RESULT_OWNED;
		return 0;
	default:
		reducer_fold_into((reducer_op)wire_op_reduction(s->wire_op), s->acc, k->push_buf[w],
				  k->count, k->dtype);
		return 0;
	}
}

/* Key k can never be summed (or added to) again: every pull, waiting or
 * to come, gets `why`, and everyone else holding the tensor learns it
 * through the scheduler (the workers of a machine waiting for their root,
 * the other partitions' servers). */
static void srv_refuse_key(struct server *srv, struct srv_key *k, const char *why)
{
	LOG_ERROR("%s", why);
	k->own_poison = strdup(why);
	srv_on_poison(srv, k, k->own_poison ? k->own_poison : "the key is refused");
	rdv_client_poison_tensor(srv->rdv, k->key & ~(uint64_t)0xffff, why);
}

/* Two pushes of one round ask for different collectives (a broadcast from
 * two roots, a sum against an average): nothing of the key is ever summed
 * again, and every pull, waiting or to come, gets this error. */
static void srv_op_mismatch(struct server *srv, struct srv_key *k, const struct srv_slot *s,
			    const struct srv_event *ev)
{
	char a[64], b[64], first[64], other[64], msg[768];
	snprintf(msg, sizeof msg,
		 "tensor '%s' (partition %u) round %u: %s called %s but %s %s; every worker must "
		 "call the same collective (a broadcast: with the same root)",
		 k->name ? k->name : "?", (unsigned)(k->key & 0xffff), s->round,
		 srv_worker_name(srv, srv_key_peer(k, s->op_worker), first, sizeof first),
		 wire_op_describe(s->wire_op, a, sizeof a),
		 srv_worker_name(srv, srv_key_peer(k, ev->worker), other, sizeof other),
		 wire_op_describe(ev->wire_op, b, sizeof b));
	srv_refuse_key(srv, k, msg);
}

/* ---- async keys -------------------------------------------------------- */

/*
 * An async key (WIRE_SYNC_ASYNC) has no rounds to fold: the server holds
 * its value.  Contributor 0's first push sets it (the others' first pushes
 * are their initial copies and are dropped: a broadcast from rank 0);
 * every later push is a delta, added at once by the key's engine thread,
 * which owns the value, so every delta is added exactly once and in one
 * piece.  A pull is answered with the value as it stands, copied into one
 * of two buffers of the puller's, used in turn: reply t's buffer is written
 * again only for reply t + 2, after the worker has received reply t + 1,
 * which the connection's sender sent after it was done with reply t (the
 * lock-step slots' argument; it also orders the two for ThreadSanitizer,
 * which a worker's next push into a buffer still being sent would not).
 * No pull sees half of a delta.  A pull before the value waits for it.
 */

/* SSP: whether contributor w, having pushed clock[w] deltas, must wait
 * before its next step: some contributor has pushed fewer than
 * clock[w] - staleness. */
static bool srv_ssp_holds(const struct srv_key *k, int w)
{
	if (!k->ssp)
		return false;
	for (int v = 0; v < k->nc; v++)
		if (!k->gone[v] && (uint64_t)k->clock[v] + k->staleness < k->clock[w])
			return true;
	return false;
}

/* Answers contributor w's pull of round `round` with the value (now:
 * the backup holds it, or there is none). */
static void srv_async_answer(struct server *srv, struct srv_key *k, int w, uint32_t round,
			     bool skip)
{
	struct wire_hdr h = {.type = WIRE_PULL_REPLY, .sender = srv->id, .round = round,
			     .key = k->key, .count = k->count, .dtype = (uint8_t)k->dtype};
	const void *payload = NULL;
	if (skip) {
		h.flags = WIRE_FLAG_SKIP;
	} else {
		uint8_t **buf = &k->snap[2 * w + (k->replies[w]++ & 1)];
		if (*buf == NULL && (*buf = srv_key_buf(k, k->bytes)) == NULL) {
			srv_reply_error(srv, NULL, srv_key_peer(k, w), k->key, round, UNISUM_ENOMEM,
					"out of memory for an async pull's reply");
			return;
		}
		memcpy(*buf, k->value, k->bytes);
		h.payload_len = k->bytes;
		payload = *buf;
		atomic_fetch_add(&srv->bytes_out, h.payload_len);
	}
	srv_queue_reply(srv, srv_key_peer(k, w), &h, k, payload);
}

/* Answers contributor w's pull once the backup holds its pushes
 * (replica.c): at once without one. */
static void srv_async_reply(struct server *srv, struct srv_key *k, int w, uint32_t round, bool skip)
{
	if (!srv_copy_gate(srv, k, w, round, skip))
		srv_async_answer(srv, k, w, round, skip);
}

static void srv_ssp_release(struct server *srv, struct srv_key *k);

/* Contributor ev->worker's push of round ev->round, whose bytes are
 * `data` (its push buffer, or a RESTORE's after a failover). */
static void srv_async_push(struct server *srv, struct srv_key *k, const struct srv_event *ev,
			   const uint8_t *data)
{
	int w = ev->worker;
	char msg[512], who[64], what[64];
	if (WIRE_OP_KIND(ev->wire_op) != WIRE_OP_SUM || ev->zero) {
		snprintf(msg, sizeof msg, "tensor '%s' (partition %u) is async, but %s pushed %s: an "
			 "async tensor takes deltas to add", k->name ? k->name : "?",
			 (unsigned)(k->key & 0xffff),
			 srv_worker_name(srv, srv_key_peer(k, w), who, sizeof who),
			 wire_op_describe(ev->wire_op, what, sizeof what));
		srv_refuse_key(srv, k, msg);
		return;
	}
	struct srv_slot *s = &k->slot[0];
	if (k->base != NULL && ev->round < k->base[w])
		return;	/* re-pushed after a failover, and in the copy taken over */
	srv_copy_pushed(k, w);
	if (!k->first_seen[w]) {
		k->first_seen[w] = 1;
		if (w != 0) {
			if (k->value == NULL && !s->active) {
				/* Waiting for contributor 0: stall reports name it. */
				s->active = true;
				s->round = ev->round;
				s->started_ms = timing_now_ms();
				s->stall_level = 0;
			}
			s->arrived[w] = 1;
			return;	/* its initial copy */
		}
		k->value = srv_key_buf(k, k->bytes);
		if (k->value == NULL) {
			srv_engine_oom(srv, k, "for the value of async");
			return;
		}
		memcpy(k->value, data, k->bytes);
		s->active = false;
		memset(s->arrived, 0, (size_t)k->nc);
		for (int v = 0; v < k->nc; v++) {
			if (k->value_waiting[v]) {
				bool skip = k->value_waiting[v] == 2;
				k->value_waiting[v] = 0;
				srv_async_reply(srv, k, v, k->wait_round[v], skip);
			}
		}
		return;
	}
	if (k->value == NULL) {
		/* A second push before the value: its first pull was never
		 * answered, so the worker broke the protocol. */
		snprintf(msg, sizeof msg, "tensor '%s' (partition %u) is async, and %s pushed a delta "
			 "before the value was set", k->name ? k->name : "?", (unsigned)(k->key & 0xffff),
			 srv_worker_name(srv, srv_key_peer(k, w), who, sizeof who));
		srv_refuse_key(srv, k, msg);
		return;
	}
	reducer_fold_into(REDUCER_SUM, k->value, data, k->count, k->dtype);
	k->clock[w]++;
	srv_ssp_release(srv, k);
}

/* SSP: answers the held pulls that nothing holds any more (a slow
 * contributor moved, or retired). */
static void srv_ssp_release(struct server *srv, struct srv_key *k)
{
	if (!k->ssp || k->value == NULL)
		return;
	bool held = false;
	for (int v = 0; v < k->nc; v++) {
		if (!k->value_waiting[v])
			continue;
		if (srv_ssp_holds(k, v)) {
			held = true;
			continue;
		}
		bool skip = k->value_waiting[v] == 2;
		k->value_waiting[v] = 0;
		srv_async_reply(srv, k, v, k->wait_round[v], skip);
	}
	if (!held) {
		k->held_since_ms = 0;
		k->held_level = 0;
	}
}

static void srv_async_pull(struct server *srv, struct srv_key *k, const struct srv_event *ev)
{
	if (k->poison != NULL) {
		srv_reply_error(srv, NULL, srv_key_peer(k, ev->worker), k->key, ev->round,
				UNISUM_EMISMATCH, k->poison);
	} else if (k->value != NULL && !srv_ssp_holds(k, ev->worker)) {
		srv_async_reply(srv, k, ev->worker, ev->round, ev->zero);
	} else {
		k->value_waiting[ev->worker] = ev->zero ? 2 : 1;
		k->wait_round[ev->worker] = ev->round;
		if (k->value != NULL && k->held_since_ms == 0) {
			/* Held by a slow contributor (SSP): stall reports name it. */
			k->held_since_ms = timing_now_ms();
			k->held_level = 0;
		}
	}
}

/* ---- lock-step keys ---------------------------------------------------- */

/* Folds slot s's pushes that arrived, in machine order; once every
 * machine's is in, a compressed key's sum is encoded once (with the
 * server's error feedback) and the pulls that came before are answered. */
static void srv_slot_advance(struct server *srv, struct srv_key *k, struct srv_slot *s)
{
	while (s->next < k->nc && s->arrived[s->next]) {
		int rc = srv_fold(k, s, s->next);
		if (rc == UNISUM_EPROTO) {
			char msg[512], who[64];
			snprintf(msg, sizeof msg, "tensor '%s' (partition %u) round %u: %s pushed bytes "
				 "that are not a %s encoding of %llu elements; the tensor is refused",
				 k->name ? k->name : "?", (unsigned)(k->key & 0xffff), s->round,
				 srv_worker_name(srv, srv_key_peer(k, s->next), who, sizeof who),
				 compress_codec_of(k->comp.kind)->name, (unsigned long long)k->count);
			srv_refuse_key(srv, k, msg);
			return;
		}
		if (rc != 0) {
			srv_engine_oom(srv, k, "summing");
			return;
		}
		s->next++;
	}
	if (s->next < k->nc)
		return;
	if (k->comp.kind != COMPRESS_NONE) {
		/* The sum is encoded once, for every worker's reply. */
		if (s->result == RESULT_OWNED) {
			if (s->enc == NULL && (s->enc = malloc(k->wire_bytes)) == NULL) {
				srv_engine_oom(srv, k, "compressing");
				return;
			}
			compress_state_encode(&k->cstate, (const float *)s->acc, s->enc,
					      compress_draw_seed(&k->comp, k->key, s->round, -1));
		}
	}
	/* Every worker folded.  A borrowed sum (one machine contributed: a
	 * lone worker, a broadcast, an allgather's or alltoall's partition)
	 * becomes the slot's own: its owner may push its next round before
	 * the others have received this one, which must not land in it.  The
	 * buffers trade places instead of being copied: the owner's next push
	 * goes into the slot's old accumulator (allocated then if there was
	 * none).  That one held round r - 2, and every reply of round r - 2
	 * has been sent: every machine pushed round r, so every worker
	 * finished round r - 1 of this tensor, so it received round r - 2. */
	if (s->result == RESULT_BORROWED) {
		uint8_t *old = s->acc;
		s->acc = k->push_buf[s->borrowed];
		k->push_buf[s->borrowed] = old;
		s->result = RESULT_OWNED;
	}
	s->ready = true;
	atomic_fetch_add(&srv->rounds, 1);
	uint32_t round = s->round;
	bool compressed = k->comp.kind != COMPRESS_NONE;
	if (compressed)	/* the feedback is round + 1's: a copy sent from now on says so */
		srv_copy_versioned(k, round, s->result == RESULT_ZERO);
	srv_answer_waiting(srv, k, s);	/* (each waits for the round before's copy) */
	if (compressed)	/* then this round's error feedback goes to the backup */
		srv_copy_encoded(srv, k);
	if (s->active && s->round == round && s->replies == k->nc)
		srv_slot_reset(k, s);	/* every machine had it (RESTOREs): none pulls */
}

/* Slot s takes round `round` (its first push, or RESTORE, came). */
static void srv_slot_begin(struct srv_slot *s, uint32_t round, uint32_t wire_op, int w)
{
	s->active = true;
	s->round = round;
	s->started_ms = timing_now_ms();
	s->stall_level = 0;
	s->wire_op = wire_op;
	s->op_worker = w;
}

/* A PUSH event of key k, on its engine's thread.  Serves: an async key's
 * delta goes to srv_async_push; a lock-step push is folded into the
 * round's slot in machine order (a restored round's laggard, a ZERO push,
 * the first push copies), and once every machine's push is in, the
 * held PULLs of the round are answered.  Owns the key's slots (only its
 * engine's thread touches them).  Never blocks: replies are queued on
 * their connections (written at once when the socket takes them, else
 * by the connection's loop). */
static void srv_on_push(struct server *srv, struct srv_key *k, const struct srv_event *ev)
{
	if (k->server_held) {
		if (k->poison == NULL)
			srv_async_push(srv, k, ev, k->push_buf[ev->worker]);
		return;
	}
	struct srv_slot *s = &k->slot[ev->round & 1];
	if (k->poison != NULL)
		return;	/* never summed: its pull gets the error */
	if (s->active && s->round < ev->round)
		srv_slot_reset(k, s);	/* round r - 2 (restored, or a failover's RESTOREs of a
					 * round no one needed): every machine has it */
	if (s->active && s->restored) {
		/* A laggard's push of a round restored (failover): in the sum. */
		LOG_DEBUG("key 0x%llx round %u: %d's push is in the restored sum",
			  (unsigned long long)k->key, ev->round, ev->worker);
		return;
	}
	s->dormant = false;	/* a machine needs the round */
	if (!s->active) {
		srv_slot_begin(s, ev->round, ev->wire_op, ev->worker);
	} else if (s->op_worker < 0) {	/* begun by a RESTORE, which names no collective */
		s->wire_op = ev->wire_op;
		s->op_worker = ev->worker;
	} else if (ev->wire_op != s->wire_op) {
		srv_op_mismatch(srv, k, s, ev);
		return;
	}
	s->arrived[ev->worker] = 1;
	s->zero[ev->worker] = ev->zero;
	srv_slot_advance(srv, k, s);
}

/* Failover, a compressed key or a PUSHED RESTORE (a homed cut's):
 * contributor w's last push answered by a lost server (round ev->round;
 * ev->why its bytes, malloc'd, taken here; ev->zero: a ZERO push).  It
 * pulls nothing of that round.  A
 * round older than the copy's (k->ver - 1) is in every machine's hands;
 * that round is the restored slot's (srv_copy_install): counted as
 * answered; a later one is summed again here, this push in its turn,
 * with the other machines' RESTOREs and re-pushes, into the same bytes
 * the lost server sent (the codecs and the sums are deterministic). */
static void srv_restore_push(struct server *srv, struct srv_key *k, const struct srv_event *ev)
{
	uint8_t *data = (uint8_t *)ev->why;
	struct srv_slot *s = &k->slot[ev->round & 1];
	int w = ev->worker;
	if (s->active && s->round < ev->round)
		srv_slot_reset(k, s);	/* r - 2: every machine has it (w completed r) */
	if (k->poison != NULL || ev->round + 1 < k->ver || (s->active && s->round > ev->round) ||
	    (s->active && s->arrived[w] && !s->restored)) {
		free(data);
		return;
	}
	if (s->active && s->restored) {	/* the copy's round: this machine had it */
		free(data);
		if (++s->replies == k->nc)
			srv_slot_reset(k, s);
		return;
	}
	if (s->rpush == NULL && (s->rpush = calloc((size_t)k->nc, sizeof *s->rpush)) == NULL) {
		free(data);
		srv_engine_oom(srv, k, "for a RESTORE of");
		return;
	}
	bool op_known = ev->type == EVENT_RESTORE_PUSH;	/* (a compressed one's is a sum) */
	if (!s->active) {
		srv_slot_begin(s, ev->round, ev->wire_op, op_known ? w : -1);
		s->dormant = true;	/* until a machine pushes it again: it needs it */
	} else if (op_known && s->op_worker >= 0 && ev->wire_op != s->wire_op) {
		free(data);
		srv_op_mismatch(srv, k, s, ev);
		return;
	} else if (op_known && s->op_worker < 0) {
		s->wire_op = ev->wire_op;
		s->op_worker = w;
	}
	s->arrived[w] = 1;
	s->zero[w] = ev->zero;
	s->rpush[w] = data;
	s->replies++;
	LOG_DEBUG("key 0x%llx round %u: %d's push restored, summed again", (unsigned long long)k->key,
		  ev->round, w);
	srv_slot_advance(srv, k, s);
}

/* Failover: contributor w received round ev->round of key k from a server
 * since lost, and sends that sum (ev->why, malloc'd, taken here); it will
 * not pull that round again.  Whoever did not receive it pulls it from
 * here: the slot holds the restored sum, and the re-pushes of that round
 * are not folded again. */
static void srv_on_restore(struct server *srv, struct srv_key *k, const struct srv_event *ev)
{
	uint8_t *data = (uint8_t *)ev->why;
	struct srv_slot *s = &k->slot[ev->round & 1];
	if (k->comp.kind != COMPRESS_NONE) {
		srv_restore_push(srv, k, ev);
		return;
	}
	if (k->server_held && k->poison == NULL) {
		/* An async key's: the worker's last push answered by a lost
		 * server, pushed again (dropped if the copy had it). */
		srv_async_push(srv, k, ev, data);
		free(data);
		return;
	}
	if (k->poison != NULL || k->server_held || (s->active && s->round > ev->round)) {
		free(data);
		return;
	}
	if (s->active && s->round != ev->round)
		srv_slot_reset(k, s);
	if (s->active && s->ready) {
		free(data);	/* summed or restored already: the same bytes */
	} else {
		if (!s->active)
			s->started_ms = timing_now_ms();
		s->active = true;
		s->round = ev->round;
		srv_key_buf_free(k, s->acc);
		s->acc = data;
		s->result = RESULT_OWNED;
		s->ready = true;
		s->restored = true;
		s->next = k->nc;
		memset(s->arrived, 1, (size_t)k->nc);
		LOG_DEBUG("key 0x%llx of '%s': round %u restored from %d's copy",
			  (unsigned long long)k->key, k->name ? k->name : "?", ev->round, ev->worker);
		srv_answer_waiting(srv, k, s);
	}
	if (++s->replies == k->nc)
		srv_slot_reset(k, s);
}

static void srv_on_pull(struct server *srv, struct srv_key *k, const struct srv_event *ev)
{
	if (k->server_held) {
		srv_async_pull(srv, k, ev);
		return;
	}
	struct srv_slot *s = &k->slot[ev->round & 1];
	if (k->poison != NULL)
		srv_reply_error(srv, NULL, srv_key_peer(k, ev->worker), k->key, ev->round,
				UNISUM_EMISMATCH, k->poison);
	else if (s->active && s->round == ev->round && s->ready)
		srv_reply_pull(srv, k, s, ev->worker, ev->zero);
	else
		s->pull_waiting[ev->worker] = ev->zero ? 2 : 1;
}


/* A worker is done with key k for good (an autotune cut it left, or it
 * undeclared the tensor).  Once every worker is, nothing will push, pull
 * or send from its buffers again: each RETIRE came after its worker
 * received every reply of the key, on the same connection, so its events
 * are all processed.  The key leaves the table at once (nobody can post
 * an event for it after that) and is freed by an event behind any that
 * were posted before. */
static void srv_on_retire(struct server *srv, struct srv_key *k, int w)
{
	if (k->server_held && w >= 0 && w < k->nc) {
		k->gone[w] = 1;	/* done with the key: it holds no one back (SSP) */
		srv_ssp_release(srv, k);
	}
	if (++k->nretired < k->nc)
		return;
	srv_copy_forget(srv, k);
	LOG_INFO("every worker retired '%s' (key 0x%llx): its %zu-byte buffers are freed",
		 k->name ? k->name : "?", (unsigned long long)k->key, k->bytes);
	srv_key_remove(srv, k);
	if (srv_post(srv, EVENT_FREE, k, 0, 0, false, 0, NULL) != 0) {
		/* Out of memory for the event: keep the key's memory rather
		 * than free it under a queued event. */
		LOG_WARN("out of memory freeing key 0x%llx: it stays allocated",
			 (unsigned long long)k->key);
	}
}

/* A reply that waited for the backup (srv_copy_held): the value of an
 * async key, a compressed key's round. */
static void srv_copy_answer(struct server *srv, struct srv_key *k, int w, uint32_t round,
			    bool skip)
{
	struct srv_slot *s = &k->slot[round & 1];
	if (k->server_held) {
		srv_async_answer(srv, k, w, round, skip);
	} else if (s->active && s->round == round) {
		srv_send_pull(srv, k, s, w, skip);
	} else {	/* (no path leads here: a round is kept until every reply went) */
		char why[256];
		snprintf(why, sizeof why, "server %d lost round %u of key 0x%llx while its reply "
			 "waited for the backup", srv->rank, round, (unsigned long long)k->key);
		LOG_ERROR("%s", why);
		srv_reply_error(srv, NULL, srv_key_peer(k, w), k->key, round, UNISUM_EPROTO, why);
	}
}

/* Runs one event on its key (the engine's thread, or a loop's). */
static void srv_engine_run(struct srv_engine *e, struct srv_event *ev)
{
	if (ev->key->copy != NULL && srv_copy_install(ev->key) != 0)
		srv_engine_oom(e->srv, ev->key, "for the value taken over from a copy of");
	if (ev->type == EVENT_COPY_HELD || ev->type == EVENT_COPY_AGAIN)
		srv_copy_held(e->srv, ev->key, (uint32_t)ev->worker,
			      ev->type == EVENT_COPY_HELD ? ev->round : 0, srv_copy_answer);
	else if (ev->type == EVENT_PUSH)
		srv_on_push(e->srv, ev->key, ev);
	else if (ev->type == EVENT_PULL)
		srv_on_pull(e->srv, ev->key, ev);
	else if (ev->type == EVENT_RETIRE)
		srv_on_retire(e->srv, ev->key, ev->worker);
	else if (ev->type == EVENT_FREE) {
		srv_copy_unlist(e, ev->key);
		srv_key_unpin(ev->key);
	}
	else if (ev->type == EVENT_RESTORE)
		srv_on_restore(e->srv, ev->key, ev);
	else if (ev->type == EVENT_RESTORE_PUSH)
		srv_restore_push(e->srv, ev->key, ev);
	else if (ev->type == EVENT_REFUSE) {
		if (ev->key->poison == NULL)
			srv_refuse_key(e->srv, ev->key, ev->why);
		free((char *)ev->why);
	}
	else
		srv_on_poison(e->srv, ev->key, ev->why);
	if (ev->type != EVENT_FREE)
		srv_copy_list(e, ev->key);	/* a version the backup lacks goes when due */
	free(ev);
}

/* Runs e's events in order until none is left (those posted meanwhile
 * too: a post to a busy engine signals nobody), or `max` of them (0: no
 * limit), after which the engine's thread is woken for the rest: a loop
 * that drains for other loops' posts serves its own connections again.
 * Called with e->lock held and e->busy set; returns with both let go. */
void srv_engine_drain(struct srv_engine *e, int max)
{
	struct srv_event *ev;
	for (int n = 0; (ev = e->head) != NULL && (max == 0 || n < max); n++) {
		e->head = ev->next;
		if (e->head == NULL)
			e->tail = NULL;
		pthread_mutex_unlock(&e->lock);
		srv_engine_run(e, ev);
		pthread_mutex_lock(&e->lock);
	}
	e->busy = false;
	if (e->head != NULL || e->dirty != NULL)	/* the thread sends copies when due */
		pthread_cond_signal(&e->cond);
	pthread_mutex_unlock(&e->lock);
}

/* The stall check, unless a loop is running e's events (then later). */
static bool srv_engine_check(struct srv_engine *e)
{
	pthread_mutex_lock(&e->lock);
	bool mine = !e->busy;
	if (mine)
		e->busy = true;
	pthread_mutex_unlock(&e->lock);
	if (!mine)
		return false;
	srv_check_stalls(e->srv, e);
	pthread_mutex_lock(&e->lock);
	srv_engine_drain(e, 0);
	return true;
}

/* An engine's thread, one per engine (keys are spread over the engines).
 * Serves: takes its queue's events in order (PUSH, PULL, RETIRE, FREE,
 * RESTORE, REFUSE, POISON) and runs each on its key, and every stall
 * period checks its keys for stalled rounds.  Owns its keys' sums, but
 * for the events a loop runs at the end of its round while the engine is
 * idle (srv_wake_engines): e->busy says who runs them.  Takes e->lock
 * only to take an event.  Blocks only in the queue's timed wait, until
 * the next stall check at most. */
void *srv_engine_main(void *arg)
{
	prctl(PR_SET_NAME, "unisum-engine"); /* for top -H, perf and gdb */
	struct srv_engine *e = arg;
	int64_t next_check = timing_now_ms() + srv_stall_period_ms(e->srv);
	for (;;) {
		if (timing_now_ms() >= next_check)	/* a loop running e's events: soon */
			next_check = timing_now_ms() + (srv_engine_check(e) ?
							srv_stall_period_ms(e->srv) : 10);
		pthread_mutex_lock(&e->lock);
		/* Asleep until an event, the stop, copies due or the next stall
		 * check: an idle engine wakes once a stall period, not more
		 * (issue 49).  (The dirty list is the busy one's: read only
		 * when none is.) */
		bool copies = false;
		while (!e->stop && (e->busy || e->head == NULL)) {
			int64_t now = timing_now_ms(), until_ms = next_check;
			if (!e->busy && e->dirty != NULL) {
				if ((copies = e->copy_due <= now))
					break;
				until_ms = e->copy_due < until_ms ? e->copy_due : until_ms;
			}
			if (until_ms <= now)
				break;
			struct timespec until = timing_deadline((int)(until_ms - now));
			pthread_cond_timedwait(&e->cond, &e->lock, &until);
		}
		if (e->head == NULL && e->stop && !e->busy) {
			pthread_mutex_unlock(&e->lock);
			return NULL;
		}
		if (e->busy || (e->head == NULL && !copies)) {
			pthread_mutex_unlock(&e->lock);
			continue;
		}
		e->busy = true;
		if (copies) {
			pthread_mutex_unlock(&e->lock);
			e->copy_due = srv_copies_due(e);
			pthread_mutex_lock(&e->lock);
		}
		srv_engine_drain(e, 0);
	}
}
