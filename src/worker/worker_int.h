/*
 * worker_int.h - the worker's state and the functions its files share
 * (internal to src/worker).  The files are layered; the list of them,
 * lowest first, and what each holds is above their declarations, below
 * the structs.  Each section says which file defines what it declares.
 * See worker.c's DESIGN for the data flow and the locks, and
 * docs/START_HERE.md for one push_pull followed through the files.
 */
#ifndef UNISUM_WORKER_INT_H
#define UNISUM_WORKER_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "compress/compress.h"
#include "config/config.h"
#include "log/log.h"
#include "loop/conn.h"
#include "loop/loop.h"
#include "placement/placement.h"
#include "rendezvous/rendezvous.h"
#include "pushq/pushq.h"
#include "transport/transport.h"
#include "unisum.h"
#include "worker/local.h"
#include "worker/tune.h"
#include "worker/worker.h"

/* One cut of a tensor into partitions, with its keys and servers. */
struct wk_layout {
	uint64_t pbytes;		/* the partition size it was cut for */
	uint64_t key;			/* partition i has key + i */
	uint32_t nparts;
	struct placement_part *parts;
	uint32_t *servers;		/* server rank of each partition */
	uint32_t rounds;		/* rounds done with this cut: the wire's round */
	bool retired;			/* autotune settled elsewhere: servers freed it */
	uint64_t homed;			/* a homed cut (a gathering collective's layout):
					 * the hash of its segments; 0: an ordinary cut */
	uint32_t homed_no;		/* a homed cut's K, of its name NAME#K */
	/* A compressed tensor, on the worker that pushes it (a machine's
	 * root): each partition's momentum and error feedback (compress.h),
	 * set up at its first push; used by one round at a time. */
	struct compress_state *cs;	/* [nparts], or NULL */
	/* Server failover (UNISUM_SERVER_FAILOVER, several servers), on the
	 * worker that pushes it: each partition's last reply, which a new
	 * server gets (RESTORE) for the machines that did not receive it
	 * from a lost one, and how many rounds of it this worker completed
	 * (of a homed cut, its last push answered instead). */
	struct wk_kept *kept;		/* [nparts], or NULL */
};

/* Failover: a partition's last reply as the server sent it (before any
 * division), and its rounds completed (the round it pushes next). */
struct wk_kept {
	uint8_t *data;			/* count x esize, or NULL before the first reply; of a
					 * compressed partition, its last push answered, as
					 * encoded (len bytes), which a new server sums again */
	size_t len;
	uint32_t pulled;
	bool keeps_push;		/* async or SSP: data is the last push answered,
					 * which the backup may not hold yet (UNISUM_REPLICAS;
					 * the next reply says it does); a homed cut's: which
					 * a new server sums again (no one reply is the round:
					 * machines pull with SKIP what they do not need) ... */
	uint8_t *stage;			/* ... and this the push whose reply is arriving,
					 * swapped in once it has (pulled moves with it) */
	bool homed;			/* a homed cut's: data and stage are allocated at
					 * their first data push ... */
	bool zero, stage_zero;		/* ... and these pushes were ZERO ... */
	bool stage_bad;			/* ... (or not kept: out of memory) ... */
	uint32_t op, stage_op;		/* ... of these collectives (WIRE_OP()) */
};

/* A gathering collective's segments: counts[i] elements owned by machine
 * owners[i] (rdv_client_declare_homed); hash names the homed cut. */
struct wk_segs {
	uint32_t n;
	uint64_t *counts;
	uint32_t *owners;
	uint64_t pbytes;	/* the cut's partition size; 0: the tensor's */
	uint64_t hash;		/* of all the above */
};

#define WK_NAME_MAX 256

struct wk_tensor {
	struct worker *w;		/* its worker */
	int index;			/* tensor id */
	char name[WK_NAME_MAX];
	uint64_t life;			/* which declaration of the name (join.c) */
	uint32_t sync;			/* WIRE_SYNC_*: async runs on every rank alone */
	/* Divide-and-shuffle ("dssync:G"): push_pull k runs in the group of G
	 * ranks this rank falls in at step k (wk_dssync_group), on that
	 * group's own set tensor; every `dssync_every`-th on this, global. */
	int dssync_g;			/* 0: not dssync */
	uint32_t dssync_every;
	uint64_t dssync_step;		/* push_pulls started on it (w->lock) */
	bool dssync_group;		/* a dssync group's set tensor ... */
	bool dssync_retire;		/* ... whose group does not come back within
					 * UNISUM_DSSYNC_KEEP steps: undeclared once its
					 * operation is released */
	struct wk_dssync_life {		/* a dssync tensor's group tensors that may live */
		int id;
		uint64_t name_hash;	/* of its name: the id may serve another later */
	} *dssync_live;
	int dssync_nlive, dssync_cap;
	unisum_dtype dtype;
	uint64_t count;
	size_t esize;
	int priority;
	/* Its compressor (unisum_declare_ex; kind COMPRESS_NONE: none), and
	 * the spec's canonical text ("" for none), which the scheduler and
	 * the servers get with every cut. */
	struct compress_spec comp;
	char comp_text[WIRE_SPEC_MAX];
	struct wk_layout *cuts;		/* [0]: UNISUM_PARTITION_BYTES; more for autotune */
	int ncuts;
	uint32_t nhomed;		/* homed cuts declared so far (names NAME#0, #1, ...) */
	struct rdv_shape shape;		/* as declared (ndim 0: none), sent with the first cut */
	int *ranks;			/* its process set's ranks, sorted (owned), or NULL ... */
	int nranks;			/* ... and how many: 0 for the global set */
	uint32_t round;			/* next round (training step) */
	bool busy;			/* an operation is in flight */
};

/* Elements [lo, hi) of a tensor. */
struct wk_span {
	uint64_t lo, hi;
};

/* A gathering collective on one worker per machine: elements [lo, hi) of
 * the tensor (one segment of its homed cut) are pushed from src (NULL:
 * ZERO, not this rank's) and pulled into dst (NULL: SKIP, not for this
 * rank), straight from and into the caller's buffers. */
struct wk_direct {
	uint64_t lo, hi;
	const uint8_t *src;
	uint8_t *dst;
};

struct wk_op {
	struct worker *w;		/* its worker */
	unisum_handle handle;
	struct wk_tensor *t;
	int flags;
	const void *in;			/* the caller's buffers (in NULL: contribute zeros) */
	void *out;
	uint32_t wire_op;		/* its collective (WIRE_OP()), on every push */
	/* Allgather, alltoall, reduce-scatter: the elements this machine
	 * contributes (others' partitions are pushed ZERO) and those it
	 * wants back (others' are pulled with SKIP), each a sorted list of
	 * [lo, hi) spans; NULL: every element. */
	struct wk_span *push_spans, *pull_spans;
	int npush_spans, npull_spans;
	/* Allgather, alltoall: this rank's own elements of `in`; the rest of
	 * every partition this machine pushes is zeroed at launch, once the
	 * cut is known (wk_zero_pushed). */
	struct wk_span *own_spans;
	int nown_spans;
	void *scratch;			/* owned full-size buffer, freed at release */
	struct wk_segs segs;		/* owned; n > 0: run on the homed cut of these */
	struct wk_direct *direct;	/* owned, sorted; non-NULL: each partition's buffers */
	int ndirect;
	uint64_t rot_offset;		/* homed cut: the PUSH stage starts at the partition
					 * holding this element and wraps around (wk_push_order) */
	const void *own_from;		/* once accepted, before it starts: own_bytes */
	void *own_to;			/* from own_from to own_to (an allgather's own rows
					 * into the output; memmove: they may overlap) */
	size_t own_bytes;
	const void *copy_from;		/* when complete: copy_bytes from here ... */
	void *copy_to;			/* ... to the caller's output */
	size_t copy_bytes;
	uint32_t remaining;		/* partitions not yet completed */
	int error;			/* first error of any partition */
	char why[512];			/* its message */
	bool done;
	uint32_t round;
	bool traced;			/* its round is on the timeline */
	int64_t t_start;		/* when it started (trace clock) */
	struct wk_op *tune_next;	/* in the autotune thread's queue */
	/* The local path (several workers on this machine): */
	struct local_op *local;		/* its LOCAL_REDUCE/BROADCAST state, or NULL */
	const struct wk_layout *L;	/* its cut (stable while it is in flight) */
	uint32_t wire_round;
	bool join_refused;		/* a broadcast in flight when a rank joined: it
					 * completes, and its wait fails (join.c) */
	/* A gathering collective in flight when a rank joined: its tensor is
	 * poisoned (every rank's wait fails) once its cut is known (join.c). */
	bool join_poison;
	bool launched;			/* wk_launch has run */
	/* An allgather begun without this rank's rows (unisum_allgather_begin):
	 * its own partitions' jobs wait in `held` (chained by `next`, counted
	 * in `remaining`) until supplied (worker_allgather_supply). */
	bool deferred;
	bool supplied;
	bool nothing;			/* ... by wk_supply_nothing: none of its rows, */
	int nothing_unacked;		/* ... and of those ZERO pushes, how many have no
					 * PUSH_ACK yet (nor failed) */
	struct wk_job *held;
	int join_rank;			/* the rank that joined, for the message */
	/* An allgather on one worker per machine pulls the others' rows in
	 * ring phases (wk_phases_plan): phase p the rows of rank + p.  Phase
	 * p + 1's PULLs wait (JOB_PULL) until phase p has at most one
	 * partition left, so each link carries one flow at a time. */
	int nphases;			/* 0: no phases */
	int *phase_left;		/* [nphases]: partitions not yet completed */
	_Atomic int phase_sent;		/* the last phase whose PULLs may go (w->lock) */
	/* A begun round's (deferred) first phase waits too: its PULLs go
	 * once it is supplied, or once nothing else of this worker is in
	 * flight (wk_begun_release), never while another round receives:
	 * rows of a rank already in its next call would then share this
	 * machine's link with the current call's and break its phases
	 * (back to back, 4 MiB allgathers ran 43 ms a call against 30). */
	bool pulls_held;
	struct wk_job **pulls;		/* a JOB_PULL for each PULL of phases 2 and on
					 * (1 and on, begun), made ahead (owned until
					 * sent; NULL once sent) */
	int npulls;
};

enum wk_job_type { JOB_DECLARE, JOB_PUSH_PULL, JOB_RETIRE, JOB_RESTORE, JOB_PULL };

struct wk_job {
	struct pushq_entry entry;	/* PUSH_PULL: priority, key, bytes, order */
	int type;			/* enum wk_job_type */
	int server;			/* the connection it goes to */
	uint32_t part;			/* partition index within its tensor */
	uint64_t key;
	uint32_t round;
	unisum_dtype dtype;
	uint64_t count;
	const void *in;			/* push from here (NULL: a ZERO push) */
	void *out;			/* reply goes here */
	int divisor;			/* UNISUM_AVERAGE: divide by this, else 1 */
	bool skip_pull;			/* this machine wants none of it: PULL with SKIP */
	uint32_t wire_op;		/* the collective, WIRE_OP(): the PUSH's aux */
	struct compress_state *cs;	/* a compressed partition's state (the push is
					 * encoded with it, the reply decoded), or NULL */
	struct wk_kept *kept;		/* its partition's (failover), or NULL */
	void *enc;			/* with kept, compressed: its push encoded once (a
					 * re-push after a failover sends these bytes: encoding
					 * again would apply error feedback twice), or NULL */
	void *owned;			/* RESTORE jobs: what `in` points to, freed once sent */
	size_t restore_len;		/* RESTORE jobs: a compressed key's encoding's bytes
					 * (flag COMPRESSED), or 0: count x dtype ... */
	uint16_t restore_flags;		/* ... its flags otherwise (PUSHED: a homed cut's
					 * push, its collective in wire_op; ZERO) */
	bool repushed;			/* routed again after a failover: its credit may
					 * have come back from the lost server already */
	struct wk_op *op;		/* NULL for DECLARE and RESTORE jobs */
	char *name;			/* DECLARE jobs: the tensor's name (owned) ... */
	int *ranks;			/* ... its process set's ranks (owned), or NULL ... */
	int nranks;			/* ... and how many (0: the global set) ... */
	uint32_t sync;			/* ... and its sync mode (WIRE_SYNC_*) ... */
	char *spec;			/* ... and its compression spec (owned), or NULL */
	struct wk_job *pending_next;	/* chain in the pending table */
	struct wk_job *next;		/* chain in its connection's send queue */
	int64_t t_queued, t_taken;	/* trace clock: entered, left the PUSH queue */
	int64_t t_pushed;		/* PUSH written (set under the conn's lock) */
	int64_t t_sent_us;		/* metered conn: its PUSH went out (timing clock;
					 * under the conn's lock), 0: not metered */
	bool credit_back;		/* PUSH_ACK came: its bytes left the credit */
	bool nothing;			/* a ZERO push of wk_supply_nothing's (counted in
					 * its operation's nothing_unacked until acked) */
	int phase;			/* its ring phase (wk_op's nphases), 0: none */
	bool pull_waiting;		/* its PUSH went out before its phase: its PULL waits
					 * for the phase's JOB_PULL (under its conn's lock) */
};

/* Fit mode (UNISUM_AUTOTUNE=2), worker 0: its data pushes over TCP, for
 * tune_fit (meter.c).  Times on the timing clock, in microseconds. */
struct wk_meter {
	pthread_mutex_t lock;
	int inflight;			/* pushes sent, not acknowledged */
	int64_t busy_since;		/* when inflight last went from 0 to 1 */
	int64_t busy_us;		/* time with inflight > 0, before busy_since */
	uint64_t bytes;			/* acknowledged push bytes over TCP */
	uint64_t ipc_bytes;		/* ... and to this host's server, over IPC */
	int64_t min_ack_us;		/* shortest push-to-acknowledgement, 0: none */
	uint64_t pushes;		/* acknowledged pushes, over TCP and IPC */
	double cpu0_s;			/* the host's busy CPU-seconds when counting began */
};

struct wk_conn {
	struct worker *w;		/* its worker */
	int server;			/* server rank */
	_Atomic uint64_t bytes_pushed;	/* data payloads sent to this server ... */
	_Atomic uint64_t bytes_pulled;	/* ... and received from it (the metrics) */
	char label[128];		/* "server 0 (127.0.0.1:4000)" */
	struct tp_conn *conn;		/* lc's transport connection */
	const struct transport_ops *tp;	/* IPC (a server of this host) or TCP */
	struct loop *loop;		/* the I/O loop that serves it (links.c) */
	struct loop_conn *lc;		/* NULL while not served */
	pthread_mutex_t lock;		/* pending, dead; held while sending */
	struct wk_job **pending;	/* key -> job, chained hash */
	size_t npending_buckets;
	bool dead;			/* the connection failed or closed */
	bool handed_over;		/* ... and a failover moved its keys: jobs for it
					 * go where their keys went (wk_route) */
	bool parking;			/* ... which is under way: jobs for it wait in
					 * `parked` until their keys are declared there */
	struct wk_job *parked;		/* chained by pending_next */
	bool closing;			/* unisum_shutdown() closed it */
	bool reaped;			/* it ended and wk_conn_fail is done with it */
	char dead_why[700];		/* why, for the errors of later calls */
	/* The reply being received (its loop's thread's): its job, where
	 * its data goes, a buffer of its own (a compressed sum, an error's
	 * text). */
	struct wk_job *rx_job;
	uint8_t *rx_into;
	void *rx_buf;
	char end_why[640];		/* why it ended, for wk_conn_fail (the reaper's) */
};

/* Work a connection's loop leaves to the reaper, which may wait: the end
 * of connection c (j NULL), or job j, whose key moved to server `to`
 * (MOVED), to be declared there and sent on. */
struct wk_task {
	struct wk_conn *c;
	struct wk_job *j;
	int to;
	struct wk_task *next;
};

/* A process set (unisum_process_set_add): a subgroup of the ranks whose
 * tensors are their own keys, summed on the same servers over its
 * members' pushes. */
struct wk_pset {
	int id;				/* >= 1; 0 is the global set */
	int n;
	int *ranks;			/* sorted, owned */
};

/* What the connection layer (conns.c) tells the layers above it.  It
 * calls them only through this table, which the worker fills as it is
 * made (worker.c, wk_new), so conns.c needs nothing above it to build
 * and the layers form no circle: failover.c, phase.c, cuts.c, members.c
 * and worker.c call down into conns.c, and conns.c calls up through here
 * (a local operation's partitions end through local_pulled instead: the
 * machine's local path completes them, worker.c's wk_local_done). */
struct wk_conn_upcalls {
	/* A partition of op ended (err 0 or negative): op.c's
	 * wk_op_part_done, in part.c. */
	void (*part_done)(struct wk_op *op, int err, const char *why);
	/* A partition of ring phase `done` ended: phase.c's wk_phase_step. */
	void (*phase_step)(struct worker *w, struct wk_op *op, int done);
	/* A ZERO push for op was acknowledged, or failed first (w->lock
	 * held): part.c's wk_nothing_pushed. */
	void (*nothing_pushed)(struct worker *w, struct wk_op *op);
	/* Failover (failover.c): a lost server's partitions declared where
	 * they moved (wk_hand_over); a MOVED job's key declared on `to`
	 * (wk_move_key); where a key lives now (wk_server_of, w->lock held). */
	int (*hand_over)(struct worker *w, int dead);
	int (*move_key)(struct worker *w, struct wk_conn *c, struct wk_job *j, int to);
	uint32_t (*server_of)(const struct worker *w, uint64_t key, uint32_t placed);
};

/* One worker: a rank of the job.  The C API of unisum.h drives the
 * process's one; tests may run several in a process (worker.h). */
struct worker {
	pthread_mutex_t lock;		/* everything below but conns' own state */
	pthread_cond_t done_cond;	/* an operation completed */
	pthread_cond_t failed_cond;	/* `failed` was set */
	bool initialized;		/* in its job: between worker_join and worker_leave */
	struct config cfg;
	const struct transport_ops *tp;	/* UNISUM_TRANSPORT's, to servers not reached by IPC */
	const struct wk_conn_upcalls *up;	/* conns.c's calls up (wk_new sets it) */
	struct rdv_client *rdv;
	int rank, size, nservers;
	bool local;			/* several workers on this machine: src/worker/local.c */
	struct local *lc;		/* ... its local path (NULL once it left) */
	bool to_servers;		/* this worker talks to the servers (a machine's root) */
	int server_hosts;		/* how many hosts the servers are on (host_id) */
	struct wk_conn *conns;		/* [nservers]; a worker that is not its machine's
					 * root connects at its first process set tensor */
	pthread_mutex_t connect_lock;	/* that connecting */
	struct wk_pset *psets;		/* the process sets added and not removed */
	int npsets, next_pset;
	bool conns_live;		/* every conn is set up and not yet torn down */
	struct wk_tensor **tensors;
	int ntensors, captensors;
	struct wk_op **ops;		/* operations not yet released */
	int nops, capops;
	unisum_handle next_handle;
	struct pushq push_q;	/* the PUSH stage: priority and credit */
	struct tuner *tuner;		/* the settings of each epoch (src/worker/tune.c) */
	struct wk_meter meter;		/* fit mode: what crossed the network (meter.c) */
	_Atomic uint64_t operations;	/* collectives completed without an error */
	_Atomic uint64_t bytes_pulled;	/* data payloads received from the servers (conns.c;
					 * what was pushed: each wk_conn's bytes_pushed) */
	/* stats.c: what the metrics report beyond unisum_stats. */
	_Atomic uint64_t lat[RDV_LAT_BUCKETS];	/* completed operations by latency */
	_Atomic uint64_t lat_sum_us;
	_Atomic uint64_t comp_in, comp_out;	/* bytes compressed, and their encodings */
	bool step_seen;			/* a step began (w->lock, as the three below) */
	uint32_t step_round;		/* the highest round started: its step ... */
	int64_t step_start_us;		/* ... began then (trace clock) */
	uint64_t step_us, steps;	/* the last whole step's time, and how many */
	pthread_t tune_thread;		/* autotune: operations waiting for their cut */
	bool tune_started, tune_stop;
	pthread_cond_t tune_cond;	/* its queue is not empty, or it is to stop */
	struct wk_op *tune_head, *tune_tail;
	pthread_t push_thread;
	/* links.c: the I/O loops that serve the server connections
	 * (UNISUM_IO_THREADS), and the reaper, which runs wk_conn_fail for
	 * the connections that ended (it may wait for the scheduler's word,
	 * which no loop may). */
	struct loop_pool pool;
	pthread_t reaper;
	bool reaper_started, reaper_stop;
	pthread_cond_t reap_cond;	/* under w->lock: a task queued, or a conn reaped */
	struct wk_task *tasks, *tasks_tail;	/* the reaper's, in order; under w->lock */
	bool push_started;
	/* Server failover: every worker keeps its partitions' last replies
	 * (wk_kept) when there are several servers and failover is on. */
	bool keep_replies;
	struct wk_moved {
		uint64_t key;		/* 0: empty */
		uint32_t server;	/* where it lives now ... */
		uint32_t from;		/* ... the lost server it moved from ... */
		bool ready;		/* ... and whether that one's hand-over is done:
					 * until then its jobs wait on `from` */
	} *moved;			/* where each moved key lives (open addressing) */
	uint32_t failovers;		/* FAILOVERs followed so far */
	/* The kept replies of tensors this worker undeclared, newest last (a
	 * bounded FIFO): another worker may still wait for the last round of
	 * one from a server lost since, which then needs this RESTORE. */
	struct wk_gone_kept {
		uint64_t key;
		uint64_t count;
		unisum_dtype dtype;
		uint32_t pulled;
		uint32_t sync;
		uint8_t *data;		/* owned */
	} *gone_kept;
	int ngone_kept;
	size_t gone_kept_bytes;
	size_t nmoved, capmoved;
	atomic_bool any_moved;		/* a key ever moved: the PUSH stage looks them up */
	bool *lost;			/* [nservers] its FAILOVER came (w->moved holds
					 * where its keys went), or NULL before the first */
	int failed;			/* the job failed: every call returns it */
	bool oom_told;			/* worker_out_of_memory told the job */
	char failed_why[512];
	struct wk_poison {
		uint64_t key;
		char why[512];
	} *poison;			/* tensors that can never be summed (scheduler) */
	int npoison;
	/* Join (join.c): */
	bool join_seen;			/* a rank joined since the last JOIN_DONE: announce */
	bool joined;			/* this worker is in unisum_join */
	/* Divide and shuffle: every rank's rack (the address book's), read at
	 * the first group. */
	bool racks_known;
	int *racks;			/* [size], or NULL: no UNISUM_RACK anywhere */
	bool join_done;			/* ... and every worker has joined */
	int join_last;			/* the last to join */
	struct rdv_announce *announced;	/* push_pulls to contribute zeros to, in order */
	struct wk_retired {
		uint64_t name_hash;	/* wk_name_hash of an undeclared tensor's name */
		uint64_t life;		/* which declaration of the name (rdv_announce.life) */
		uint32_t rounds;	/* the rounds it had run */
	} *retired;			/* [WK_RETIRED] the latest undeclared, a ring */
	uint32_t retired_at;
	int nannounced, capannounced;
	pthread_cond_t join_cond;	/* announced, join_done or failed changed */
};

/*
 * The files below declare what they share in the order they are layered,
 * lowest first: each calls only files earlier in this list (and the
 * modules outside src/worker), never a later one; tests/docs/
 * check_layers.py holds them to it.  The connection layer calls up only
 * through w->up (struct wk_conn_upcalls).
 *
 *   stats.c, meter.c, keep.c, conns.c, links.c, failover.c, phase.c, part.c,
 *   members.c, announce.c, cuts.c, tensor.c, dssync.c, op.c, gather.c, join.c, pset.c,
 *   worker.c
 *
 * api.c (unisum.h's functions) comes after them all; the local path
 * (local_arena.c, local_wait.c, local_reduce.c, local.c: the machine's
 * shared memory) and tune.c (autotune's search) before them all.
 */

/* UNISUM_ENOTINIT (logged) unless w has joined its job. */
static inline int wk_require_init(const struct worker *w)
{
	return w != NULL && w->initialized ? 0 : log_fail(UNISUM_ENOTINIT, "call unisum_init() first");
}

/* stats.c: operation op started (w->lock held), or completed without an
 * error; and the metrics' callback (rdv_client_on_metrics). */
void wk_stats_started(struct worker *w, const struct wk_op *op);
void wk_stats_done(struct worker *w, const struct wk_op *op);
void wk_metrics(void *arg, struct rdv_metrics *m);

/* meter.c: fit mode's meter (worker 0 with UNISUM_AUTOTUNE=2): whether
 * this worker meters; a data push about to go out on c (c->lock held); a metered push
 * acknowledged; a push to this host's server acknowledged; the link's
 * bandwidth and round trip so far (bw NULL: count anew from now). */
bool wk_metering(const struct worker *w);
void wk_meter_sent(struct wk_conn *c, struct wk_job *j);
void wk_meter_acked(struct worker *w, size_t bytes, int64_t sent);
void wk_meter_local(struct worker *w, size_t bytes);
void wk_meter_read(struct worker *w, struct tune_meas *out);

/* keep.c: what a worker keeps of its pushes for failover.  The bytes a
 * push of count elements of t puts on the wire (cs NULL: raw); a
 * compressed push encoded into *encoded (len bytes, malloc'd; under
 * failover once, kept in j->enc: 0 or UNISUM_ENOMEM, c->lock held); a
 * kept push staged as its reply's header comes (wk_keep_push), and kept
 * once the reply is whole (wk_kept_answered, which also counts the
 * round done). */
size_t wk_push_bytes(const struct wk_tensor *t, uint64_t count, const struct compress_state *cs);
int wk_encode_push(struct wk_conn *c, struct wk_job *j, size_t len, void **encoded);
void wk_keep_push(struct wk_job *j);
void wk_kept_answered(struct wk_job *j);

/* conns.c: the connections to the servers: sending a job (from the
 * thread that routes or queues it), the replies (loop callbacks,
 * wk_conn_ops), the end of a connection (wk_conn_fail), and the PUSH
 * stage's thread (wk_push_main). */
/* Hands a PUSH_PULL job to the connection of its key's server, following
 * failovers; fails it when that server is gone for good. */
void wk_route(struct worker *w, struct wk_job *j);
int wk_enqueue(struct wk_conn *c, struct wk_job *j);
/* Waits, w->lock held, up to wait_ms for the scheduler's word on server
 * s: the job failed, or s was lost (its FAILOVER).  Whether s was lost
 * and the job goes on. */
bool wk_await_lost(struct worker *w, int s, int wait_ms);
void *wk_push_main(void *arg);
/* How a server connection is served on its loop. */
extern const struct loop_conn_ops wk_conn_ops;
/* Runs and frees task t (the end of a connection: it is marked dead,
 * every pending job fails or goes where its keys went, and it is marked
 * reaped; or a moved job).  May wait for the scheduler's word: the
 * reaper's thread. */
void wk_task_run(struct wk_task *t);

/* links.c: opening the server connections, serving them on the I/O
 * loops, the reaper, closing them; reconnecting to a lost server's
 * replacement. */
int wk_connect_servers(struct worker *w);
void wk_close_conns(struct worker *w);
int wk_reconnect(struct worker *w, struct wk_conn *c, const struct rdv_node *n);

/* failover.c: the server to send `key`'s jobs to (`placed` unless it
 * moved; while the hand-over of the server it moved from runs, that one,
 * whose connection parks them; w->lock held), and the FAILOVER callback. */
uint32_t wk_server_of(const struct worker *w, uint64_t key, uint32_t placed);
void wk_on_failover(void *arg, const struct rdv_failover *f);
/* A new placement of keys [key, key + n) holds from now on: forgets where
 * earlier ones of those keys moved (w->lock held). */
void wk_moved_forget(struct worker *w, uint64_t key, uint32_t n);
/* A replacement of lost server node->rank: reconnects to it (the
 * REJOIN callback; conns.c does the connecting). */
void wk_on_rejoin(void *arg, const struct rdv_node *node);
/* MOVED on connection c: job j's key lives on server `to` from j's round
 * on: declared there (after waiting for its REJOIN, if need be) and
 * retired on c's server.  0 or an error. */
int wk_move_key(struct worker *w, struct wk_conn *c, struct wk_job *j, int to);
/* A cut's kept replies, set up on the worker that pushes it: 0 or
 * UNISUM_ENOMEM.  wk_kept_free frees them. */
int wk_kept_init(const struct wk_tensor *t, struct wk_layout *L);
void wk_kept_free(struct wk_layout *L);
/* On a lost server's connection thread, once its FAILOVER came: declares
 * each of its partitions this worker pushes on the new server, with a
 * RESTORE.  0 or an error. */
int wk_hand_over(struct worker *w, int dead);
/* Cut c of t was just filed (w->lock held): its pieces placed on a lost
 * server whose hand-over ran before it was filed (and so missed it) are
 * declared where they moved. */
void wk_redeclare_late(struct worker *w, struct wk_tensor *t, int c);
/* Tensor t is undeclared here: its kept replies move to w->gone_kept
 * (w->lock held).  wk_gone_kept_free frees them all. */
void wk_keep_gone(struct worker *w, struct wk_tensor *t);
void wk_gone_kept_free(struct worker *w);

/* phase.c: ring phases.  A partition of phase `done` (0: none) ended;
 * sends the PULLs of the phases whose turn came. */
void wk_phase_step(struct worker *w, struct wk_op *op, int done);
/* Sends the held first phase of the oldest begun round (pulls_held), if
 * no other operation is in flight (w->lock held). */
void wk_begun_release(struct worker *w);
/* Sends begun round op's held first phase now (w->lock held). */
void wk_begun_go(struct worker *w, struct wk_op *op);

/* part.c: an operation's partitions.  Completing one (err 0 or negative);
 * whether this machine pushes data for the partition [offset, offset +
 * count) and pulls its result; zeroing what is not this rank's in the
 * partitions it pushes (allgather, alltoall); a partition's place in the
 * PUSH stage's order; freeing an operation (or what a template owns). */
void wk_op_part_done(struct wk_op *op, int err, const char *why);
void wk_job_sets(const struct wk_op *op, uint64_t offset, uint64_t count, bool *push,
		 bool *pull);
void wk_zero_pushed(const struct wk_op *op, const struct wk_layout *L);
uint64_t wk_push_order(const struct wk_op *op, const struct wk_layout *L, uint32_t part);
/* A ZERO push of wk_supply_nothing's for operation op was acknowledged,
 * or its job failed first (w->lock held). */
void wk_nothing_pushed(struct worker *w, struct wk_op *op);
void wk_op_free_owned(const struct wk_op *op);
void wk_op_free(struct wk_op *op);

/* members.c: connections to every server for a rank that is no local root
 * (a process set's member pushes itself), opened once. */
int wk_ensure_conns(struct worker *w);
/* A process set's wire name for the user's `name`: a prefix hashing its
 * ranks.  0, or an error (logged) naming `what` when it does not fit. */
int wk_set_wire_name(const int *ranks, int n, const char *name, char *wire, size_t len,
		     const char *what);
/* Worker rank r's UNISUM_RACK as it registered (-1: none or unknown), and
 * the rack of all of ranks[0..n) or of all but one, when that is more
 * than half (-1: none is): a process set's tensors go on that rack's
 * servers. */
int wk_rank_rack(struct worker *w, int r);
int wk_set_rack(struct worker *w, const int *ranks, int n);
/* The ranks of process set `set` (a copy, *n of them) for tensor `name`
 * of it, with its wire name in wire (len bytes), its connections open;
 * NULL with *rc set (logged). */
int *wk_pset_for(struct worker *w, int set, const char *name, char *wire, size_t len,
		 int *n, int *rc);

/* announce.c: the scheduler's join events; which collectives a joined
 * worker contributes to (the reductions), and their announcement; a
 * stranded gathering collective's poison; the lives of names. */
#define WK_RETIRED 4096
uint64_t wk_name_hash(const char *name);
void wk_note_retired(struct worker *w, const char *name, uint64_t life, uint32_t rounds);
uint64_t wk_next_life(struct worker *w, const char *name);
bool wk_reduces(uint32_t wire_op);
bool wk_join_runs(uint32_t wire_op);
void wk_announce_fill(const struct wk_op *op, struct rdv_announce *a);
void wk_on_join(void *arg, int event, int rank, const struct rdv_announce *a);
void wk_join_poison(struct worker *w, uint64_t key, const char *tensor, int rank);

/* cuts.c: declaring a cut, retiring cuts, the autotune thread and its
 * hooks, handing an operation to its first stage or failing it before. */
int wk_cut(const struct wk_tensor *t, const char *wire_name, uint64_t pbytes,
	   const struct wk_segs *segs, struct wk_layout *L);
const struct wk_layout *wk_homed_cut(struct wk_tensor *t, const struct wk_segs *segs, int *rc);
void wk_launch(struct wk_op *op, const struct wk_layout *L);
void wk_on_tune(void *arg, const struct rdv_tune *t);
void wk_op_fail(struct wk_op *op, int err, const char *what);
void wk_retire_cuts(struct wk_tensor *t, const struct wk_layout *L);
void *wk_tune_main(void *arg);
const struct wk_layout *wk_tuned_cut(struct wk_op *op, bool wait, int *rc);
int wk_tuner_new(struct worker *w);
/* A compressed tensor's state of partition `part` of cut L, set up at its
 * first push (the layout's cs); NULL for an uncompressed tensor, or with
 * *rc = UNISUM_ENOMEM.  wk_layout_free_cs frees a cut's. */
struct compress_state *wk_comp_state(const struct wk_tensor *t, const struct wk_layout *L,
				     uint32_t part, int *rc);
void wk_layout_free_cs(struct wk_layout *L);

/* The flags that choose a reduction other than the sum. */
#define WK_OP_FLAGS (UNISUM_MIN | UNISUM_MAX | UNISUM_PRODUCT)

/* tensor.c: the tensor table.  Files t under an id (see tensor.c). */
int wk_tensor_insert(struct wk_tensor *t, bool *filed);
/* The id of tensor `name` if w has it (UNISUM_EMISMATCH when with another
 * shape or sync mode), or -1. */
int wk_tensor_known(struct worker *w, const char *name, unisum_dtype dtype, size_t count,
		    uint32_t sync, const char *comp);
/* Declares a tensor in the process set `ranks` (nranks 0: the global set):
 * its id, or an error (logged). */
int wk_declare(struct worker *w, const char *name, unisum_dtype dtype, size_t count,
	       const struct rdv_shape *shape, int priority, int *ranks, int nranks,
	       uint32_t sync, const struct compress_spec *comp);
/* Forgets tensor `tensor` here and, with `retire`, at the scheduler and
 * servers once every worker has. */
int wk_undeclare(struct worker *w, int tensor, bool retire);
void wk_tensor_free(struct wk_tensor *t);

/* dssync.c: divide and shuffle.  The tensor this step's push_pull of
 * `tensor` goes to (its group's), and the step it took. */
int wk_dssync_target(struct worker *w, int tensor, int *target, uint64_t *taken);
/* Undeclares dssync group set tensor `id` (-1: nothing) after its step. */
void wk_dssync_retire(struct worker *w, int id);
/* Divide-and-shuffle's topology: every rank's rack (UNISUM_RACK), or
 * NULL for none, and how often the groups cross racks. */
struct wk_dssync_topo {
	const int *rack;		/* [n] */
	uint32_t cross_every;		/* every this many steps (0: never) */
};
/* Whether step `step` groups across racks: always without racks, else
 * every topo->cross_every-th step. */
bool wk_dssync_crosses(const struct wk_dssync_topo *topo, uint64_t step);
/* The members of rank's group at `step` (0-based), sorted, into ranks[];
 * returns how many, or UNISUM_ENOMEM.  The ranks are shuffled (Fisher-Yates, splitmix64 from
 * `seed` and the step: the same on every worker, another at every step)
 * and cut into runs of g, the last maybe shorter; on a step that does not
 * cross racks, each rack (by id) on its own; on one that does, with racks,
 * the same, then one member of each group of two or more moves to the
 * next such group of an order that alternates racks while it can (the
 * full shuffle when fewer than two such groups, or all in one rack). */
int wk_dssync_group(uint64_t seed, uint64_t step, int n, int g, int rank,
		    const struct wk_dssync_topo *topo, int *ranks);

/* op.c: operations.  The index in w->ops of handle h, or -1. */
int wk_find_op(const struct worker *w, unisum_handle h);
/* Files and starts an operation of `tensor` shaped like *tmpl: its handle
 * in *h, or an error (logged). */
int wk_start(struct worker *w, int tensor, const struct wk_op *tmpl, unisum_handle *h);

/* gather.c: the gathering collectives.  Queues the held jobs of the
 * operations begun and not supplied (unisum_allgather_begin) as ZERO
 * pushes: unisum_join and unisum_shutdown wait for every operation, which
 * those could never complete otherwise. */
void wk_supply_nothing(struct worker *w);

/* join.c: unisum_join.  Whether an operation of w->ops is in flight but
 * those supplied nothing (w->lock held): unisum_join waits for the others
 * only; with `pushed`, for those too until their ZERO pushes are
 * acknowledged (unisum_shutdown: their rounds need no more of this
 * worker, and it must not wait for the others' rows, which may never
 * come). */
bool wk_busy_but_nothing(const struct worker *w, bool pushed);

#endif /* UNISUM_WORKER_INT_H */
