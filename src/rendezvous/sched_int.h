/*
 * sched_int.h - the scheduler's state and the functions its files share
 * (internal to src/rendezvous: scheduler.c registers nodes, sends the
 * address book and runs the loop that serves them all; sched_nodes.c sends to and reads
 * from one node; sched_job.c keeps the job's fate (sched_fail); sched_barrier.c the barriers; sched_monitor.c the
 * heartbeats and the checks of silence and stalls; sched_tensors.c
 * answers declarations and keeps the tensor table and the placement;
 * sched_elastic.c an elastic job's generations).
 */
#ifndef UNISUM_SCHED_INT_H
#define UNISUM_SCHED_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "loop/conn.h"
#include "loop/loop.h"
#include "placement/placement.h"
#include "rendezvous/metrics.h"
#include "rendezvous/rendezvous.h"
#include "transport/transport.h"
#include "wire/wire.h"

struct rdv_register;
struct rdv_segs;

struct sched_node {
	struct rdv_scheduler *s;	/* back pointer for the loop's calls */
	struct loop_conn *lc;		/* its connection on the scheduler's loop ... */
	struct tp_conn *conn;		/* ... and that connection's transport end */
	bool registered;		/* REGISTER received */
	bool gone;			/* connection closed (normally or not) */
	bool said_goodbye;		/* worker sent SHUTDOWN / server was stopped */
	bool lost;			/* a server failed over (sched_failover) */
	/* Elastic jobs (sched_elastic.c): a node is of one generation. */
	uint32_t gen;			/* the generation it registered for */
	bool retired;			/* its generation ended (REFORM sent): out of the job */
	bool coming_back;		/* ... and it answered that it registers again */
	bool waiting;			/* a worker that registered while the job ran: it
					 * joins the next generation */
	int old_rank;			/* a returning node's rank in the last generation,
					 * -1 for a newcomer */
	int role, req_rank, rank, port;
	int local_rank, local_size;	/* as registered (servers: 0 and 1) */
	int machine;			/* workers: rank / local_size; servers: -1 */
	uint32_t id;
	char host[64];
	int pid;			/* as registered */
	char host_id[64];
	int rack;			/* UNISUM_RACK as registered, -1: none */
	bool in_barrier[4];		/* entered the barrier of group g */
	uint32_t barrier_done[4];	/* ... and the barriers of g it completed, as a
					 * resume's report said (sched_resume.c) */
	uint32_t held_expected, held_got; /* a resumed worker's HELDs: said, and come */
	_Atomic int64_t last_seen_ms;	/* when it last sent anything */
	struct rdv_metrics report;	/* its last counters (sched_metrics.c) ... */
	int64_t report_ms;		/* ... and when they came (0: none yet) */
};

/* The servers of one rack and their own placement (Theorem 1 among the
 * rack's servers and worker hosts), for tensors whose workers are all in
 * that rack (a dssync group, a process set): their traffic stays under
 * the rack's switch. */
struct sched_rack {
	int rack;			/* UNISUM_RACK */
	int nservers;
	int *server;			/* [nservers] global server ranks */
	struct placement pl;		/* indices into server[] */
};

/* A declared tensor: the first declaration fixes its shape and placement. */
struct sched_tensor {
	char name[256];
	int dtype;
	uint64_t count, partition_bytes, key;
	int first_rank;			/* who declared it first, for messages */
	uint32_t nparts;
	struct placement_part *parts;	/* [nparts]: the cut, not always equal */
	uint32_t *servers;		/* [nparts] */
	char *poison;			/* why it can never be summed (a mismatch), or NULL */
	struct rdv_shape shape;		/* the first declaration's that gave one (ndim 0: none) ... */
	int shape_rank;			/* ... and whose */
	uint32_t nsegs;			/* a homed cut's segments (0: none) ... */
	uint64_t segs_hash;		/* ... and their hash, which every declaration must match */
	uint32_t sync;			/* WIRE_SYNC_*: the first declaration's, which all share */
	char comp[WIRE_SPEC_MAX];	/* its compression spec ("": none), the same */
	uint8_t *forgot;		/* [num_workers] undeclared it (RETIRE), or NULL */
	int nforgot;			/* ... how many: at num_workers the entry goes */
};

struct rdv_scheduler {
	const struct transport_ops *tp;
	struct tp_listener *listener;
	int num_machines;		/* worker machines (UNISUM_NUM_WORKER) */
	int num_servers;
	int heartbeat_ms, timeout_ms;	/* liveness (UNISUM_HEARTBEAT_MS, UNISUM_TIMEOUT_MS) */
	int stall_warn_ms, stall_abort_ms; /* barriers (UNISUM_STALL_WARN_MS, _ABORT_MS) */
	int start_timeout_ms;		/* UNISUM_START_TIMEOUT_MS */
	int64_t started_ms;		/* when it started listening */
	long oom_kills;			/* log_oom_kills() then */
	bool start_warned;		/* a slow registration was logged */
	pthread_t thread;		/* runs the loop: every connection, the monitor */
	struct loop *loop;
	struct loop_io lio;		/* the listener on the loop, while accepting */
	bool accepting;
	struct loop_timer monitor;	/* heartbeats and silence detection */
	struct loop_timer accept_pause;	/* accepting again after running out of descriptors */
	struct loop_timer linger;	/* wakes the loop when lingering ends */
	bool done;			/* the loop is told to stop */
	pthread_mutex_t lock;		/* everything below */
	pthread_cond_t changed;		/* registration, goodbyes, failure */
	struct sched_node **nodes;	/* accepted connections (each its own allocation:
					 * their threads keep pointers while this grows) */
	int nnodes, cap_nodes;
	int local_size;			/* workers per machine, from the first worker's
					 * REGISTER; 0 before it */
	int num_workers;		/* worker processes: num_machines x local_size
					 * (0 before the first worker registered) */
	int registered;			/* nodes that sent REGISTER */
	bool book_sent;			/* address book distributed */
	_Atomic unsigned books;		/* address books sent so far (each membership's) */
	int workers_done;		/* worker processes that said goodbye */
	bool servers_stopped;		/* SHUTDOWN sent to servers */
	int error;			/* first failure, 0 if none */
	char error_why[512];		/* ... its message */
	int linger_ms;			/* cfg->linger_ms */
	int64_t linger_until;		/* a failure during registration keeps the listener
					 * open until then, to tell nodes that come late */
	int culprit_role, culprit_rank;	/* the node that caused it (role NONE: no one node) */
	bool aborted;
	struct sched_tensor *tensors;
	int ntensors, cap_tensors;
	int64_t barrier_since[4];	/* per group: when its first node entered, 0 = none in it */
	int barrier_stall[4];		/* ... 1 warned, 2 failed the job */
	struct placement placement;	/* policy, weights (set once all registered), loads */
	int *home_server;		/* [num_machines] the server on that machine's host, or -1
					 * (set with the weights) */
	char transport[8];		/* the first node's UNISUM_TRANSPORT, "" before it */
	char transport_who[160];	/* ... and that node, for the error */
	int worker_rack;		/* the first worker's UNISUM_RACK (every worker sets
					 * one or none: -1), or -2 before the first */
	struct sched_rack *racks;	/* [nracks] the racks that have servers (set with the
					 * weights) */
	int nracks;
	int64_t placed_ms;		/* when a tensor was last placed; 0 once logged */
	int result;			/* what rdv_scheduler_wait returns */
	int server_failover;		/* UNISUM_SERVER_FAILOVER */
	uint8_t *lost;			/* [num_servers] lost and failed over, or NULL */
	uint8_t *replaced;		/* [num_servers] a replacement took the rank: it holds
					 * no copies of other servers' keys, or NULL */
	int replicas;			/* UNISUM_REPLICAS: async and SSP keys have copies */
	int gather_failover;		/* UNISUM_GATHER_FAILOVER: homed cuts move */
	int failovers;			/* how many so far */
	struct sched_moved_off {
		uint32_t n;
		uint64_t *keys;		/* the keys a failover moved off it, to move back
					 * to its replacement (sched_migrate_back) */
	} *moved_off;			/* [num_servers], or NULL */
	uint8_t *joined;		/* [num_workers] joined (unisum_join) since the last
					 * JOIN_DONE, or NULL before the first JOIN */
	int njoined, join_last;
	/* Elastic jobs (UNISUM_ELASTIC, sched_elastic.c). */
	int elastic;			/* workers may be lost and join */
	int min_workers;		/* UNISUM_ELASTIC_MIN_WORKERS */
	int max_servers;		/* UNISUM_NUM_SERVER: a generation's servers at most */
	uint32_t gen;			/* this generation (0: the first) */
	bool reforming;			/* REFORM sent: waiting for the nodes of gen */
	int64_t reform_since;		/* ... since then */
	int nwaiting;			/* workers waiting to join the next generation */
	/* Metrics (UNISUM_METRICS_PORT, sched_metrics.c). */
	struct http_server *http;	/* serving them, or NULL: off */
	char host[64];			/* the address the scheduler listens on */
	char job_file[300];		/* where `unisum top` finds the port, "" none */
	/* A restarted scheduler (sched_resume.c). */
	bool resumed;			/* its nodes came back from a running job */
	bool resuming;			/* ... and not all of them yet */
	int64_t resume_since;		/* the first one's REGISTER */
	bool lost_reported;		/* a worker reported the lost servers (s->lost) */
	int lost_rank;			/* ... that worker's rank */
	struct sched_deferred {
		struct sched_node *n;
		struct wire_hdr h;
		void *payload;
	} *deferred;			/* DECLAREs that came while resuming, and TUNEs
					 * (node NULL: for every worker once all are back) */
	int ndeferred;
};

/* sched_nodes.c: a node's connection.  Queues h (and a copy of payload)
 * for n; never blocks.  0 or an error (a node whose queue is full is not
 * reading: it is cut off). */
int sched_send(struct sched_node *n, const struct wire_hdr *h, const void *payload);
/* Hangs up on n once what is queued for it went out (a short wait at
 * most): its connection's end comes through the loop. */
void sched_hangup(struct sched_node *n);
/* Node n as messages name it ("worker 2 (127.0.0.1:5000)", ...), in buf. */
const char *sched_node_label(const struct sched_node *n, char *buf, size_t len);
/* Sends node n the job-level ERROR `err` with text `why`. */
void sched_send_error(struct sched_node *n, int err, const char *why);
/* How node n's process ended, into buf ("was killed by signal 9
 * (SIGKILL)...", "exited with status 3"), when it was a child of this
 * process (the scheduler of `unisum launch`) on this host and has ended
 * or ends within 200 ms; else false at once. */
bool sched_node_end(const struct rdv_scheduler *s, const struct sched_node *n, char *buf,
		    size_t len);
/* Sends h (and payload) to every worker still connected, or with
 * `joined_only` to those that joined.  Called with s->lock held. */
void sched_send_workers(struct rdv_scheduler *s, const struct wire_hdr *h, const void *payload,
			bool joined_only);

/* sched_job.c: the job's fate (s->lock held).  Records the first failure
 * and tells every other live node; sched_fail_logged with `logged` false
 * does not log it as this scheduler's ERROR (the launcher said it). */
void sched_fail(struct rdv_scheduler *s, int err, const char *why);
void sched_fail_logged(struct rdv_scheduler *s, int err, const char *why, bool logged);
/* Whether the job is over: every node gone after goodbye, or a failure. */
bool sched_is_finished(const struct rdv_scheduler *s);
/* Whether a failed job still answers nodes that come late (see
 * sched_fail). */
bool sched_lingers(const struct rdv_scheduler *s);

/* sched_elastic.c.  Called with s->lock held. */
/* Worker n of a running elastic job was lost (cause): the job re-forms
 * without it.  false when it cannot (not elastic; too few workers left:
 * why then says so), and the caller fails the job. */
bool sched_elastic_lost(struct rdv_scheduler *s, struct sched_node *n, const char *cause,
			char *why, size_t len);
/* A REGISTER (m) that an elastic job takes outside its first
 * registration: a worker waiting to join, or a node of the generation
 * being formed.  1 when handled (rc into *rc), 0 when the usual
 * registration applies. */
int sched_elastic_register(struct rdv_scheduler *s, struct sched_node *n,
			   const struct rdv_register *m, int *rc, char *why, size_t len);
/* A message of a node whose generation ended: its REFORM answer counts,
 * the rest is dropped. */
void sched_elastic_retired_msg(struct rdv_scheduler *s, struct sched_node *n,
			       const struct wire_hdr *h);
/* A worker asks to re-form now (RESIZE): workers wait to join. */
void sched_elastic_resize(struct rdv_scheduler *s, struct sched_node *n);
/* A node of the generation being formed hung up before the address book. */
void sched_elastic_gone(struct rdv_scheduler *s, struct sched_node *n);
/* Sends the address book of the new generation once every node of the
 * last one is back or lost (or UNISUM_TIMEOUT_MS passed); fails the job
 * when it has too few workers or no server. */
void sched_elastic_check(struct rdv_scheduler *s, int64_t now);
/* Frees the nodes of ended generations (and strangers) whose
 * connections have closed. */
void sched_elastic_reap(struct rdv_scheduler *s);

/* sched_nodes.c: node n takes what REGISTER m says of it (role, address,
 * process, rack; a local rank 0 of 1, a server's or an elastic worker's);
 * the caller sets its rank */
void sched_take_register(struct sched_node *n, const struct rdv_register *m);
/* sched_book.c: the address book (ranks assigned) to every registered
 * node */
int sched_send_addrbook(struct rdv_scheduler *s);
/* The address book entry of node n. */
struct rdv_node sched_entry_of(const struct sched_node *n);
/* An address book of node n's entry alone, for your_id, into b (a
 * replacement's REJOIN, a resumed node's answer). */
void sched_book_of_one(const struct rdv_scheduler *s, struct wire_buf *b, uint32_t your_id,
		       const struct sched_node *n);
/* Tells every worker of the job how many wait to join (RESIZE). */
void sched_announce_waiting(struct rdv_scheduler *s);

/* sched_resume.c: a scheduler that restarted takes a running job back
 * from its nodes' reports.  A REGISTER with a resume part (s->lock held):
 * 0, or an error with why (the node is told, its connection closes). */
int sched_on_resume(struct rdv_scheduler *s, struct sched_node *n, const struct rdv_register *m,
		    char *why, size_t len);
/* A worker's HELD: the tensor filed as it was placed, or checked against
 * another's report (takes s->lock).  0, or UNISUM_EPROTO with why. */
int sched_on_held(struct rdv_scheduler *s, struct sched_node *n, const struct wire_hdr *h,
		  const void *payload, char *why, size_t len);
/* A DECLARE or TUNE while nodes are still to come back: kept (true),
 * answered or passed on by sched_resume_after once all are (takes
 * s->lock). */
bool sched_resume_defer(struct rdv_scheduler *s, struct sched_node *n, const struct wire_hdr *h,
			const void *payload);
/* Ends the resume once every node is back, or UNISUM_TIMEOUT_MS after
 * the first: a worker missing then counts as one that left, a server
 * missing is failed over (or fails the job).  s->lock held. */
void sched_resume_check(struct rdv_scheduler *s, int64_t now);
/* On the loop, without the lock: answers the deferred DECLAREs and passes
 * the TUNEs on once the resume is over. */
void sched_resume_after(struct rdv_scheduler *s);
void sched_resume_free(struct rdv_scheduler *s);
/* Node n is out of the resume (gone, stale, a duplicate): unregistered,
 * what it deferred dropped.  s->lock held. */
void sched_resume_drop(struct rdv_scheduler *s, struct sched_node *n);
/* sched_nodes.c: worker 0's TUNE (h, payload) to every worker back.
 * s->lock held. */
void sched_send_tune(struct rdv_scheduler *s, const struct wire_hdr *h, const void *payload);

/* sched_job.c: once every worker said goodbye (or counts as gone), the
 * servers are told to stop.  s->lock held. */
void sched_stop_servers_if_done(struct rdv_scheduler *s);
/* sched_barrier.c: completes the barrier of `group` when every node of
 * it has entered (not while resuming).  s->lock held. */
void sched_barrier_settle(struct rdv_scheduler *s, int group);

/* sched_tensors.c.  Every function is called with s->lock held but
 * sched_on_declare, which takes it. */
/* A new, zeroed entry at the end of the tensor table (not yet counted:
 * the caller fills it and increments s->ntensors), or NULL. */
struct sched_tensor *sched_new_tensor(struct rdv_scheduler *s);
/* Fills entry t (parts and servers set, from sched_new_tensor) for node
 * n's declaration of name and counts it in the table. */
void sched_file_tensor(struct rdv_scheduler *s, struct sched_tensor *t, const struct sched_node *n,
		       const char *name, uint64_t key, const struct wire_hdr *req, uint64_t pbytes,
		       const struct rdv_segs *segs, const struct rdv_shape *shape, const char *comp,
		       uint32_t nparts);
struct sched_tensor *sched_find_tensor(struct rdv_scheduler *s, const char *name, uint64_t key);
/* Whether a DECLARE (or HELD) header and payload are well formed. */
bool sched_declare_valid(const struct wire_hdr *req, uint64_t pbytes,
			 const struct rdv_segs *segs, const struct rdv_shape *shape);
/* Why node n's declaration (req, ...) of name cannot use tensor t, into
 * msg ("" when it can), and the error code. */
int sched_refusal(const struct sched_tensor *t, const struct sched_node *n, const char *name,
		  const struct wire_hdr *req, uint64_t pbytes, const struct rdv_segs *segs,
		  const struct rdv_shape *shape, const char *comp, char *msg, size_t len);
void sched_place_roles(struct rdv_scheduler *s);
void sched_free_racks(struct rdv_scheduler *s);
void sched_log_loads(struct rdv_scheduler *s, int64_t now);
void sched_poison(struct rdv_scheduler *s, uint64_t key, const char *why);
/* A worker or a server reported that the workers of tensor `key` disagree
 * on its collective (text): poison it, once.  0 (also for a tensor key no
 * longer declared: every worker undeclared it while the report was on its
 * way), or UNISUM_EPROTO with why set for a key that is not a tensor's. */
int sched_poison_reported(struct rdv_scheduler *s, uint64_t key, const char *text, char *why,
			  size_t len);
int sched_on_forget(struct rdv_scheduler *s, struct sched_node *n, uint64_t key, char *why,
		    size_t len);
int sched_on_declare(struct rdv_scheduler *s, struct sched_node *n, const struct wire_hdr *req,
		     const void *payload, size_t len);
/* Server `dead` is lost: its partitions go to the live servers (each to
 * the one furthest below its Theorem 1 share), and every worker gets
 * FAILOVER.  0, or an error with why set when the job cannot go on
 * without it (the last server; a tensor whose state it took). */
int sched_failover(struct rdv_scheduler *s, int dead, char *why, size_t len);
/* Replacement server r registered: the keys the failover of r moved off
 * it go back (MIGRATE to the servers that hold them now).  Called with
 * s->lock held. */
void sched_migrate_back(struct rdv_scheduler *s, int r);
/* A re-formed elastic job starts afresh: no tensor, no failover, and
 * placement for its new numbers of servers and machines (their shares
 * are set once it has ranks, sched_place_roles).  0 or UNISUM_ENOMEM. */
int sched_tensors_reset(struct rdv_scheduler *s, int num_servers, int num_machines);
/* Moves every partition of a fresh placement that landed on a lost
 * server to a live one. */
void sched_avoid_lost(struct rdv_scheduler *s, const struct placement_part *parts,
		      uint32_t *servers, uint32_t nparts, size_t esize);

/* Barriers (sched_barrier.c).  Node n entered the barrier of `group`
 * (takes s->lock). */
void sched_on_barrier(struct rdv_scheduler *s, struct sched_node *n, int group);
/* A worker barrier that a worker who said goodbye has not entered fails
 * the job, naming it.  Called with s->lock held. */
void sched_check_left_barriers(struct rdv_scheduler *s);
/* A barrier some nodes entered long ago: reported at stall_warn_ms, the
 * job failed at stall_abort_ms.  Called with s->lock held. */
void sched_check_barriers(struct rdv_scheduler *s, int64_t now);

/* The monitor (sched_monitor.c), a timer of the scheduler's loop: every
 * heartbeat_ms a heartbeat to every live node; fails the job naming a
 * node silent for timeout_ms, a barrier stalled past stall_abort_ms, or a
 * start that never completes.  Takes s->lock. */
void sched_monitor_tick(struct loop_timer *t);

/* sched_metrics.c.  Serves the metrics on cfg's UNISUM_METRICS_PORT (its
 * loop not yet running): 0, or an error naming the variable. */
int sched_metrics_start(struct rdv_scheduler *s, const struct config *cfg);
/* Stops serving them, once the loop is done. */
void sched_metrics_stop(struct rdv_scheduler *s);
/* Node n's HEARTBEAT carried its counters (the scheduler's lock held): 0, or
 * UNISUM_EPROTO / UNISUM_ENOMEM when they do not decode. */
int sched_on_report(struct sched_node *n, const void *payload, size_t len);

#endif /* UNISUM_SCHED_INT_H */
