/*
 * srv_int.h - the server's state and the functions its files share
 * (internal to src/server): server.c runs a server (start, accept, stop);
 * key.c keeps the key table; engine.c the engines that sum; conn.c a
 * worker's connection (receiving and validating every message, sending
 * replies).  See server.c's DESIGN.
 */
#ifndef UNISUM_SRV_INT_H
#define UNISUM_SRV_INT_H

#include <endian.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "compress/compress.h"
#include "config/config.h"
#include "loop/conn.h"
#include "loop/loop.h"
#include "rendezvous/rendezvous.h"
#include "transport/transport.h"
#include "wire/wire.h"

enum srv_result {
	RESULT_NONE,		/* nothing folded yet */
	RESULT_ZERO,		/* only ZERO contributions so far */
	RESULT_BORROWED,	/* the sum is worker `borrowed`'s push buffer */
	RESULT_OWNED,		/* the sum is in `acc` */
};

/* One round of a key, owned by the key's engine thread. */
struct srv_slot {
	bool active;		/* holds a round in progress */
	uint32_t round;		/* which one */
	int next;		/* next worker rank to fold */
	int result;		/* enum srv_result */
	int borrowed;		/* worker whose buffer is the sum (RESULT_BORROWED) */
	bool ready;		/* every worker folded */
	bool restored;		/* the sum came in a RESTORE (failover): pushes of the
				 * round are not folded, and it may linger */
	int replies;		/* pull replies queued */
	uint8_t *arrived;	/* [W] pushed this round */
	uint8_t *zero;		/* [W] pushed a ZERO contribution */
	uint8_t *pull_waiting;	/* [W] pulled before the round was ready: 1, or 2 with SKIP */
	uint8_t *acc;		/* accumulator, key bytes, allocated on first use */
	uint8_t *enc;		/* a compressed key: the sum's encoding (wire_bytes), the
				 * replies' payload */
	uint8_t **rpush;	/* [W] a key taken over: contributor w's push of the round
				 * from its RESTORE (its last push answered, a compressed
				 * or a homed key's: it pulls nothing), folded in turn;
				 * malloc'd, or NULL */
	bool dormant;		/* begun by such RESTOREs alone: a round that no machine
				 * may need (each that does pushes it again), so no stall */
	int64_t started_ms;	/* when the round's first push arrived */
	uint32_t wire_op;	/* the collective of that push (WIRE_OP()) ... */
	int op_worker;		/* ... and who sent it: every other push must agree */
	int stall_level;	/* 0, 1 = warned, 2 = aborted */
};

/* A key's contributors w = 0 .. nc - 1: the machines' local roots for the
 * global set (peer w), or the ranks of a process set, each its own
 * contributor (peer[w]).  Every [W] array below has nc entries. */
struct srv_key {
	uint64_t key;
	int dtype;
	uint64_t count;
	size_t bytes;		/* count x element size */
	int nc;			/* contributors: one push each per round */
	int *peer;		/* [nc] each one's peer (srv_rank_peer); NULL: the global set */
	int *ranks;		/* [nc] a process set's ranks, or NULL */
	int engine;		/* engine thread that owns the key */
	_Atomic uint32_t *next_round;	/* [W] next round worker w may push; written by its
					 * conn thread (and a DECLARE_CHECK under srv->lock),
					 * read by MIGRATE on the rendezvous thread */
	const struct transport_ops *tp;	/* the server's, which registers the buffers below
					 * (srv_key_buf: UCX's, RDMA) */
	uint8_t **push_buf;	/* [W] worker w's push buffer (wire_bytes for a compressed
				 * key); written by its conn thread */
	/* A compressed key (its DECLARE_CHECK's spec): every push and reply
	 * is the codec's encoding of count float32 elements.  The engine
	 * decodes each push, sums in float32 into the slot's acc and encodes
	 * the sum once, with the server's own error feedback. */
	struct compress_spec comp;	/* kind COMPRESS_NONE: raw */
	char *comp_text;	/* its canonical text, or NULL */
	size_t wire_bytes;	/* one encoding's bytes */
	struct compress_state cstate;	/* engine-owned: the server's error feedback */
	float *scratch;		/* engine-owned: a push decoded [count] */
	struct srv_slot slot[2];	/* engine-owned */
	const char *poison;	/* engine-owned: why every pull fails, or NULL */
	char *own_poison;	/* engine-owned: the text of a disagreement found here */
	uint8_t *retired;	/* [W] worker w sent RETIRE; its conn thread's */
	int nretired;		/* engine-owned: RETIREs seen; at W the buffers go */
	char *name;		/* the tensor's name, for stall reports */
	/* Async and SSP (wire_sync_held): the server holds the value.
	 * Engine-owned. */
	uint32_t sync;		/* the mode, WIRE_SYNC() */
	bool server_held;	/* the server holds the value: async, and SSP (ssp below) */
	bool ssp;		/* ... and a pull waits for the slowest beyond `staleness` */
	uint32_t staleness;
	uint32_t *clock;	/* [W] deltas contributor w has pushed */
	uint8_t **snap;		/* [2W] contributor w's pull replies alternate between
				 * snap[2w] and snap[2w + 1] (allocated at first use) ... */
	uint32_t *replies;	/* [W] ... by the count of its replies */
	uint8_t *gone;		/* [W] contributor w retired the key: it holds no one back */
	int64_t held_since_ms;	/* SSP: when a pull began waiting for a slow contributor, or 0 */
	int held_level;		/* its stall reports: 0, 1 = warned, 2 = aborted */
	uint8_t *value;		/* [bytes] the value, once contributor 0's first push set it */
	uint8_t *first_seen;	/* [W] contributor w's first push (its initial copy) came */
	uint8_t *value_waiting;	/* [W] pulled before the value was set: 1, or 2 with SKIP ... */
	uint32_t *wait_round;	/* [W] ... that pull's round.  Until the value is set, slot[0]
				 * stands for the wait (its stall reports name contributor 0) */
	/* Moved back to a replacement server (MIGRATE), under srv->lock: a
	 * push of round moved_at or later is refused (MOVED, to moved_to) and
	 * its PULL dropped; rounds before it complete here.  claimed: one more
	 * than the latest round a push was accepted of. */
	int moved_to;		/* -1: stays */
	uint32_t moved_at;
	uint32_t claimed;
	/* Replication (replica.c; async and SSP keys, UNISUM_REPLICAS):
	 * engine-owned.  Every push accepted makes a new version of the
	 * value; the backup is sent the newest (one COPY in flight at a
	 * time), and a pull is answered only once the backup holds the
	 * version of the contributor's push before its last (the worker
	 * keeps its last push until the next reply). */
	uint32_t ver;		/* the value's version (each accepted push) */
	uint32_t ver_sent;	/* the newest sent to the backup of link ver_gen ... */
	uint32_t ver_held;	/* ... and the newest it holds */
	uint32_t ver_gen;	/* that link (srv->backup.gen when sent) */
	uint32_t *last;		/* [W] the version of contributor w's last push ... */
	uint32_t *need;		/* [W] ... and of the one before: its reply waits for it */
	uint8_t *copy_wait;	/* [W] a pull waits for the backup: 1, or 2 with SKIP ... */
	uint32_t *copy_round;	/* [W] ... and its round */
	struct srv_copy *copy;	/* a lost server's copy of the key, taken at its declaration
				 * here (srv->lock), installed by the engine's next event */
	uint32_t *base;		/* [W] with a copy: contributor w's pushes it held (pushes
				 * of a lower round are in the value already), or NULL */
	/* A compressed key with error feedback replicates it too: version
	 * r + 1 is the feedback after round r's sum was encoded, sent with
	 * that encoding (or as ZERO: the round summed to nothing), and a
	 * reply of round r waits until the backup holds version r. */
	bool ver_zero;		/* round ver - 1 summed to ZERO (no encoding) */
	uint32_t copy_have;	/* the version of the copy taken over (under srv->lock) */
	bool copy_dirty;	/* on its engine's dirty list: a newer version to send */
	struct srv_key *dirty_next;
	int64_t push_ms;	/* the first push the backup lacks: the copy is due ... */
	int64_t step_ms;	/* ... half of this later (contributor 0's pushes' interval,
				 * averaged) ... */
	int64_t push0_ms;	/* ... from its last push's time */
	atomic_int pins;	/* the key table's 1, and 1 per queued reply pointing into
				 * the key's memory: the last unpin frees it */
	struct srv_key *next;	/* hash chain */
};

/* EVENT_REFUSE: the key can never be summed (a malformed compressed push
 * found by a connection thread): why is malloc'd, the engine frees it. */
/* EVENT_RESTORE: a failover's RESTORE; why is the sum's bytes (malloc'd,
 * the engine takes them).  EVENT_RESTORE_PUSH: one flagged PUSHED, the
 * worker's push answered (why: its bytes, or NULL with zero; wire_op its
 * collective). */
/* EVENT_COPY_HELD: the backup of link `worker` holds version `round`.
 * EVENT_COPY_AGAIN: the backup changed (link `worker`): send it all. */
enum srv_event_type {
	EVENT_PUSH, EVENT_PULL, EVENT_POISON, EVENT_RETIRE, EVENT_FREE, EVENT_REFUSE, EVENT_RESTORE,
	EVENT_COPY_HELD, EVENT_COPY_AGAIN, EVENT_RESTORE_PUSH
};

struct srv_event {
	int type;		/* enum srv_event_type */
	struct srv_key *key;
	int worker;
	uint32_t round;
	bool zero;		/* PUSH flagged ZERO; PULL flagged SKIP */
	uint32_t wire_op;	/* PUSH: its collective (the header's aux) */
	const char *why;	/* POISON: the reason (owned by the server) */
	struct srv_event *next;
};

struct srv_engine {
	struct server *srv;
	pthread_t thread;
	pthread_mutex_t lock;	/* the queue */
	pthread_cond_t cond;
	struct srv_event *head, *tail;
	bool stop;		/* finish the queue, then exit */
	bool wake_due;		/* a loop owes it a signal at the end of its round */
	bool busy;		/* its events are being run, by its thread or, at the end
				 * of a round, by a loop's (srv_wake_engines): one at a
				 * time, so a key's state still needs no lock */
	bool joined;		/* exited: posts are dropped */
	bool left_failed;	/* failed the job for a machine that left (its thread only) */
	struct srv_key *dirty;	/* keys with a version the backup lacks, sent by the engine's
				 * thread once due (srv_copy_due_ms; whoever is busy owns the
				 * list) ... */
	int64_t copy_due;	/* ... and when the first may be due (0: none) */
	uint64_t bytes;		/* bytes of keys pinned here (under srv->lock) */
	struct srv_key **keys;	/* keys pinned here (under srv->lock) */
	size_t nkeys, capkeys;
	char stall[RDV_STALL_TEXT];	/* its longest wait past UNISUM_STALL_WARN_MS, named ... */
	int64_t stall_ms;	/* ... and how long (0: none); both under lock (metrics) */
};

/* A reply on its way: sent from its payload without a copy (msg.tx). */
struct srv_reply {
	struct loop_conn_msg msg;	/* a PUSH_ACK is urgent: ahead of queued sums */
	void *owned;		/* freed after sending (error texts), or NULL */
	struct srv_key *pin;	/* the key the payload points into, pinned until sent, or NULL */
};

/* What the payload of the message being received is for (its header came
 * and was checked; srv_on_header). */
enum srv_pend_kind {
	PEND_NONE,	/* nothing: dropped */
	PEND_PUSH,	/* into the key's buffer of contributor w, then summed */
	PEND_MOVED,	/* the key moved (failover): dropped, answered MOVED */
	PEND_POISON,	/* the tensor is poisoned: dropped, acknowledged */
	PEND_REFUSE,	/* not the key's encoding: dropped, the key refused */
	PEND_BUF,	/* into buf (a DECLARE_CHECK's, a RESTORE's sum) */
};

struct srv_pend {
	int kind;		/* enum srv_pend_kind */
	struct srv_key *k;
	int w;
	uint8_t *buf;		/* PEND_BUF: malloc'd, taken by the handler */
};

/* A copy of a key of another server, which this one backs up: the value
 * and each contributor's pushes it holds (wire COPY), as of `ver`. */
struct srv_copy {
	uint64_t key;
	uint32_t from;		/* the server's rank */
	uint32_t ver;
	int dtype;
	uint64_t count;
	uint32_t nc;
	uint8_t flags;		/* COMPRESSED: a compressed key's error feedback (count
				 * float32s), then its round's encoding (none: ZERO) */
	size_t len;		/* data's bytes */
	uint8_t *data;		/* count x dtype bytes, then nc u32s (COPY's payload) */
	struct srv_copy *next;	/* hash chain */
};

/* This server's backup: the next server by rank that it has not lost
 * (replica.c).  A thread of its own dials it, so that no loop blocks. */
enum srv_backup_state { BACKUP_DIALING, BACKUP_UP, BACKUP_NONE };
struct srv_backup {
	pthread_mutex_t lock;	/* all below */
	pthread_cond_t cond;
	pthread_t thread;
	bool inited, started, stop, want;	/* want: dial (again) */
	_Atomic int state;	/* enum srv_backup_state (written under lock; the
				 * engines read it without) */
	int rank;		/* the backup's rank while UP */
	_Atomic uint32_t gen;	/* bumps with each link up (and with none left) */
	struct loop_conn *lc;	/* the link while UP */
	struct srv_link *links;	/* every link made, freed at the end */
	uint8_t *dead;		/* [servers] ranks this server lost (never a backup again) */
	int nservers;
	/* As a backup: a primary's link closed at gone_ms[r] (0: none
	 * pending); unless the scheduler fails r over (failed[r]) within
	 * UNISUM_TIMEOUT_MS and a margin, r lives and copies to another
	 * server now, and its copies here, stale from then on, are dropped
	 * (a later declaration of one of its keys here must not take it). */
	int64_t *gone_ms;
	uint8_t *failed;
	int64_t cut_ms;		/* UNISUM_TEST_CUT_BACKUP_MS (tests only): the first link
				 * is cut this long after it came up, as a network would
				 * (cut_at: then; 0: not pending) */
	int64_t cut_at;
};

/* A link to a backup (the loop connection's arg). */
struct srv_link {
	struct server *srv;
	uint32_t gen;
	int rank;
	struct loop_conn *lc;
	struct srv_link *next;
};

#define SRV_COPY_BUCKETS 4096u

/* Contributor w's pushes in copy c (its COPY's u32 after the value), and
 * in *gone whether it retired. */
static inline uint32_t srv_copy_pushes(const struct srv_copy *c, size_t bytes, int w, bool *gone)
{
	uint32_t have;
	memcpy(&have, c->data + bytes + 4 * (size_t)w, 4);
	have = le32toh(have);
	*gone = (have & 0x80000000u) != 0;
	return have & 0x7fffffffu;
}
/* A key's newest version goes to the backup when a reply waits for it,
 * or half a step after the first push it lacks (a step: contributor 0's
 * time between pushes, k->step_ms), within these bounds: the copy is
 * there before the next step's replies need it, and covers every push
 * of the half step (each worker's, in async, at its own time). */
#define SRV_COPY_MIN_MS 2
#define SRV_COPY_MAX_MS 1000

/* A worker's connection, served by one of the server's event loops. */
struct srv_conn {
	struct server *srv;
	struct loop *loop;	/* the loop that serves it */
	struct loop_conn *lc;	/* NULL until the loop took it */
	struct tp_conn *conn;	/* lc's transport connection */
	int worker;		/* its machine after hello, -1 before (a server: npeers) */
	bool from_server;	/* a server whose backup this one is (its COPYs) ... */
	int from_rank;		/* ... of this rank */
	const struct transport_ops *tp;	/* the listener's that accepted it: TCP or IPC */
	struct srv_pend pend;	/* the loop's thread's */
	/* A DECLARE_CHECK of a key this worker undeclared, before the others
	 * all had: it waits (reading paused, so what follows waits too),
	 * looked at again every 10 ms, until the key is gone or
	 * UNISUM_TIMEOUT_MS. */
	struct wire_hdr held_h;
	uint8_t *held;		/* its payload, or NULL: none waits */
	int64_t held_until_ms;
	struct loop_timer held_timer;
	atomic_bool finished;	/* closed, and the loop is done with it */
	atomic_int refs;	/* engines sending to it now (srv_conn_get): not freed */
	struct srv_conn *next;	/* all connections, for the final join */
};

struct server {
	atomic_bool fds_failed;		/* accept() ran out of descriptors (told once) */
	atomic_bool oom_told;		/* out of memory (told once: srv_out_of_memory) */
	const struct config *cfg;
	struct rdv_client *rdv;
	/* engine.c's srv_engine_drain, for key.c's loops below it: runs up
	 * to max of e's queued events; called with e->lock held and e->busy
	 * set, returns with e->busy clear and the lock let go (the engine's
	 * thread woken for what is left). */
	void (*drain)(struct srv_engine *e, int max);
	const struct transport_ops *tp;	/* UNISUM_TRANSPORT's: TCP or UCX */
	struct tp_listener *listener;	/* tp's, watched by loop 0 */
	struct tp_listener *ipc_listener;	/* IPC for workers of this host, or NULL */
	struct loop_pool pool;		/* serving the connections (UNISUM_IO_THREADS); loop 0
					 * runs on server_run's thread (srv_serve) */
	struct loop *main_loop;		/* loop 0 while server_run's thread runs it (srv->lock) */
	atomic_uint next_loop;		/* round robin over the loops */
	/* The listeners (TCP, and IPC when there is one), watched by loop 0. */
	struct srv_acceptor {
		struct server *srv;
		const struct transport_ops *tp;
		struct tp_listener *l;
		struct loop_io io;
		struct loop_timer resume;	/* accepting again after descriptors ran out */
	} acceptors[2];
	int nacceptors;
	int nworkers;		/* worker machines: one push each per key and round */
	int local_size;		/* workers per machine (names in messages) */
	uint32_t id;		/* this server's node id */
	int rank;
	pthread_mutex_t lock;	/* keys, by_worker, conns, stop state */
	struct srv_key **buckets;	/* key hash table */
	size_t nbuckets, nkeys;
	/* Peers: p < nworkers is machine p's local root, which pushes for the
	 * machine; nworkers + r is worker rank r, not a local root, which
	 * pushes only the tensors of its process sets (srv_rank_peer). */
	int npeers;
	struct srv_conn **by_worker;	/* [npeers] each peer's live connection */
	int64_t *left;		/* [npeers] when that connection ended (ms; 0: it has not):
				 * the peer pushes no more */
	struct srv_conn *conns;	/* every connection ever accepted */
	struct srv_engine *engines;
	int nengines;
	struct srv_poison *poisoned;	/* tensors that can never be summed */
	bool replicate;			/* UNISUM_REPLICAS with failover and several servers */
	struct srv_backup backup;	/* replica.c: this server's backup */
	struct srv_copy **copies;	/* [SRV_COPY_BUCKETS] the keys this one backs up
					 * (under srv->lock), or NULL */
	atomic_bool stopping;
	atomic_int job_error;	/* the notice's error, 0 while running */
	atomic_bool told;	/* job_error came from the scheduler's notice */
	/* UNISUM_TEST_CRASH_AFTER_REPLIES=N[:R] (failover tests only): the
	 * server kills itself with SIGKILL right after the first reply of a
	 * round, once N replies were sent, so that one machine has the round
	 * and the others do not.  0: off. */
	long crash_after;
	int crash_rank;		/* ... on this server rank only (-1: any) ... */
	const char *crash_name;	/* ... for keys of tensors whose name has this
				 * (UNISUM_TEST_CRASH_KEY_NAME), or NULL: any */
	atomic_long replies_sent;
	/* stats.c: what the metrics report. */
	_Atomic uint64_t bytes_in;	/* pushes' data (compressed: their encodings) */
	_Atomic uint64_t bytes_out;	/* pull replies' data */
	_Atomic uint64_t rounds;	/* partition rounds summed */
};

/* stats.c: the metrics' callback (rdv_client_on_metrics). */
void srv_metrics(void *arg, struct rdv_metrics *m);

/* A tensor whose workers disagree on its shape (the scheduler says so):
 * every pull of its keys is answered with an error instead of a sum. */
struct srv_poison {
	uint64_t tensor;	/* key >> 16 */
	char *why;		/* both shapes, for the workers' errors */
	struct srv_poison *next;
};

/* conn.c: MIGRATE from the scheduler (the rdv client's callback). */
void srv_on_migrate(void *arg, const struct rdv_failover *f);

/* Peer p's name in messages, into buf (len bytes): a machine's root, a
 * worker rank of a process set, or a worker before its HELLO. */
static inline const char *srv_worker_name(const struct server *srv, int m, char *buf, size_t len)
{
	if (m < 0)
		snprintf(buf, len, "a worker before its hello");
	else if (m >= srv->nworkers)
		snprintf(buf, len, "worker rank %d", m - srv->nworkers);
	else if (srv->local_size > 1)
		snprintf(buf, len, "machine %d (worker rank %d)", m, m * srv->local_size);
	else
		snprintf(buf, len, "worker %d", m);
	return buf;
}

/* The peer through which worker rank r talks to this server. */
static inline int srv_rank_peer(const struct server *srv, int r)
{
	return r % srv->local_size == 0 ? r / srv->local_size : srv->nworkers + r;
}

/* Contributor w of key k's peer. */
static inline int srv_key_peer(const struct srv_key *k, int w)
{
	return k->peer != NULL ? k->peer[w] : w;
}

/* Peer p's contributor index for key k, or -1 when it is not one. */
static inline int srv_key_contrib(const struct srv_key *k, int p)
{
	if (k->peer == NULL)
		return p >= 0 && p < k->nc ? p : -1;
	for (int w = 0; w < k->nc; w++)
		if (k->peer[w] == p)
			return w;
	return -1;
}

/* Whether key k's state goes to a backup (replica.c): an async or SSP
 * key's value, a compressed key's error feedback. */
static inline bool srv_key_replicated(const struct server *srv, const struct srv_key *k)
{
	return srv->replicate && (k->server_held || k->cstate.residual != NULL);
}

/* The server's files are layered, lowest first: key.c, replica.c,
 * conn.c, stall.c, engine.c, server.c; each calls only files earlier in the list
 * (tests/docs/check_layers.py holds them to it).
 *
 * key.c: the key table (call srv_key_find with srv->lock held; the others
 * take it), and posting an event to a key's engine (srv_post: the queue
 * the connections fill and the engine's thread drains). */
int srv_key_declare(struct server *srv, struct srv_conn *c, const struct wire_hdr *h,
		    const char *name, const int *ranks, int nranks, const char *spec, char *why,
		    size_t len);
struct srv_key *srv_key_find(struct server *srv, uint64_t key);
/* Whether connection c's worker undeclared key `key`, which is still in
 * the table: the others have not all undeclared it yet, and a new
 * declaration of it by this worker must wait. */
bool srv_key_awaits_retires(struct server *srv, const struct srv_conn *c, uint64_t key);
void srv_key_remove(struct server *srv, struct srv_key *k);
/* The copies this server keeps of other servers' keys (replica.c's):
 * srv_copy_put replaces the key's copy (0 or UNISUM_ENOMEM), _drop
 * forgets it; each takes srv->lock. */
int srv_copy_put(struct server *srv, struct srv_copy *c);
/* The server could not allocate `what`: named here with the limits on
 * memory and, once, through the scheduler to every process of the job. */
void srv_out_of_memory(struct server *srv, const char *what);
void srv_copy_drop(struct server *srv, uint64_t key);
/* Drops every copy server `from` sent; how many. */
int srv_copies_drop_from(struct server *srv, uint32_t from);
void srv_copies_free(struct server *srv);
void srv_key_free(struct srv_key *k);
/* A buffer of k's data (a push's, a sum, a value, a reply), registered
 * with the server's transport (RDMA: transport.h's mem_register), or
 * NULL; freed, unregistered, with srv_key_buf_free (NULL is ignored). */
uint8_t *srv_key_buf(struct srv_key *k, size_t bytes);
void srv_key_buf_free(struct srv_key *k, void *p);
void srv_key_unpin(struct srv_key *k);
/* Signals the engines that this loop thread's posts of its round left
 * waiting (srv_post defers the wake-up of an engine for a small key's
 * event to the end of the loop's round: one wake-up for all the round's
 * pushes, not one each).  The `after` of every server loop. */
void srv_wake_engines(void *srv);
int srv_post(struct server *srv, int type, struct srv_key *k, int w, uint32_t round, bool zero,
	     uint32_t wire_op, const char *why);

/* replica.c: copies of async and SSP keys' values, and of compressed
 * keys' error feedback, on a backup server.
 * The primary's side: a link to the backup (srv_backup_start and _stop,
 * around the loops), each key's copies sent after aggregation by its
 * engine, and a pull's reply held until the backup has the pushes
 * before it.  The backup's side: COPYs from a server kept until a
 * failover moves the key here, when its declaration takes it. */
int srv_backup_init(struct server *srv);	/* after joining, before the loops start */
int srv_backup_start(struct server *srv);	/* its thread, once they run: 0 or errno */
void srv_backup_stop(struct server *srv);	/* loops halted, before they are freed */
void srv_backup_free(struct server *srv);	/* after the engines stopped */
/* Engine: whether contributor w's reply (round, skip) must wait for the
 * backup (it is kept, and the copy sent); false: answer now. */
bool srv_copy_gate(struct server *srv, struct srv_key *k, int w, uint32_t round, bool skip);
/* Engine: the backup holds version ver of link gen (COPY_ACK), or the
 * link changed (gen, ver 0): the replies that may go now are handed to
 * answer(srv, k, w, round, skip); a newer version is sent. */
void srv_copy_held(struct server *srv, struct srv_key *k, uint32_t gen, uint32_t ver,
		   void (*answer)(struct server *, struct srv_key *, int, uint32_t, bool));
/* Engine: contributor w's push was accepted (a new version). */
void srv_copy_pushed(struct srv_key *k, int w);
/* Engine: a compressed key's round was encoded (or summed to ZERO): its
 * feedback is version round + 1 (before any reply of the round: a copy
 * the gate sends carries it); then, its waiting replies sent, _encoded
 * sends it unless one is on its way (the encoding stays in the round's
 * slot until round + 2 is encoded, which waits for every reply of this
 * one). */
void srv_copy_versioned(struct srv_key *k, uint32_t round, bool zero);
void srv_copy_encoded(struct server *srv, struct srv_key *k);
/* Engine, after an event of key k: on e's dirty list if the backup lacks
 * its newest version, which goes when due (srv_copy_due_ms). */
void srv_copy_list(struct srv_engine *e, struct srv_key *k);
/* The engine's thread, busy: sends the due versions (each covers every
 * push since the last copy; one on its way: its acknowledgement lists
 * the key again); when the next is due, or 0. */
int64_t srv_copies_due(struct srv_engine *e);
/* Engine: key k is freed: off the dirty list. */
void srv_copy_unlist(struct srv_engine *e, struct srv_key *k);
/* Engine: key k goes (every contributor retired): its copy too. */
void srv_copy_forget(struct server *srv, struct srv_key *k);
/* Engine, a key's first event after its declaration took a copy: the
 * value and the clocks as the copy has them; a compressed key's error
 * feedback, and its last round encoded as a restored round. */
int srv_copy_install(struct srv_key *k);
/* Connection from a server (c->from_server): a COPY's header and the
 * whole message. */
int srv_copy_head(struct server *srv, struct srv_conn *c, const struct wire_hdr *h, char *why,
		  size_t len);
int srv_copy_message(struct server *srv, struct srv_conn *c, const struct wire_hdr *h, char *why,
		     size_t len);
/* Connection from server r (its primary) closed: its copies go stale
 * unless a FAILOVER of r follows (srv_backup_main drops them). */
void srv_copies_link_closed(struct server *srv, int r);

/* stall.c: an engine's look for stalls (its thread's), and how often */
void srv_check_stalls(struct server *srv, struct srv_engine *e);
int srv_stall_period_ms(const struct server *srv);

/* engine.c: the engines' threads */
void *srv_engine_main(void *arg);
void srv_engine_drain(struct srv_engine *e, int max);

/* conn.c: a worker's connection on its loop, and its replies */
void srv_conn_enqueue(struct srv_conn *c, const struct wire_hdr *h, const void *payload,
		      void *owned, struct srv_key *pin);
void srv_queue_reply(struct server *srv, int p, const struct wire_hdr *h, struct srv_key *k,
		     const void *payload);
/* Serves c on c->loop (a loop_post call: arg is c). */
void srv_conn_start(void *arg);
void srv_tensor_error(void *arg, uint64_t key, const char *why);
void srv_reply_error(struct server *srv, struct srv_conn *c, int p, uint64_t key, uint32_t round,
		     int err, const char *why);

#endif /* UNISUM_SRV_INT_H */
