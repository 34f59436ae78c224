/*
 * rendezvous.h - the scheduler and the client every node uses to reach it.
 *
 * One scheduler per job.  Servers and every worker process connect to it
 * and REGISTER (role, host, port, requested rank or machine, local rank
 * and local size).  A job has num_servers servers and num_workers worker
 * *machines* of local_size worker processes each; the scheduler learns
 * local_size from the first worker and holds every other worker to it.
 * Once all num_servers + num_workers x local_size nodes have registered it
 * assigns ids and sends every node the address book.  A worker's rank is
 * machine x local_size + local_rank; with local_size 1 a worker may leave
 * its machine to the scheduler (assigned by arrival).  After that the scheduler serves barriers over
 * role groups, tensor declarations (it is the single authority that maps a
 * tensor name to its keys and servers, so every worker agrees whatever its
 * declaration order), and shutdown: servers are told to stop only when
 * every worker has said it is done.  If a node's connection drops before
 * it said goodbye, the scheduler tells every other node which one died and
 * fails the job.
 */
#ifndef UNISUM_RENDEZVOUS_H
#define UNISUM_RENDEZVOUS_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

#include "config/config.h"
#include "rendezvous/metrics.h"
#include "transport/transport.h"

/* Node ids: the scheduler is 0, servers 1..S, workers S+1..S+W by rank
 * (W = worker processes = machines x local_size). */
#define RDV_SCHEDULER_ID 0u

/* Role groups for barriers. */
enum {
	RDV_GROUP_WORKERS = 1,
	RDV_GROUP_SERVERS = 2,
	RDV_GROUP_ALL = 3,
};

/* One entry of the address book. */
struct rdv_node {
	uint32_t id;		/* node id (see above) */
	int role;		/* CONFIG_ROLE_SERVER or CONFIG_ROLE_WORKER */
	int rank;		/* rank within its role */
	int machine;		/* workers: rank / local_size; servers: -1 */
	int local_rank;		/* workers: rank % local_size; servers: 0 */
	char host[64];		/* address peers connect to */
	int port;		/* listening port (servers), 0 for workers */
	int pid;		/* its process id ... */
	char host_id[64];	/* ... and host: boot id, network and pid namespaces (an
				 * emulated cluster's namespaces are hosts of their own);
				 * see rdv_client_same_host() */
	int rack;		/* UNISUM_RACK as it registered (-1: none) */
};


/* ---- scheduler ---------------------------------------------------------- */

struct rdv_scheduler;

/* Starts a scheduler thread listening on host:port (port 0 picks a free
 * one, stored in *port_out).  Once every node registered, the scheduler
 * sends each a heartbeat every cfg->heartbeat_ms and declares dead (failing
 * the job, naming it) any node silent for cfg->timeout_ms.  Returns 0 or a
 * negative error. */
int rdv_scheduler_start(const char *host, int port, const struct config *cfg,
			const struct transport_ops *tp, struct rdv_scheduler **out,
			int *port_out);

/* Waits for the scheduler to finish: 0 when every worker said goodbye and
 * every server was told to stop; a negative error when a node died or broke
 * the protocol (the log names it).  Call once. */
int rdv_scheduler_wait(struct rdv_scheduler *s);

/* How many address books the scheduler has sent: one per membership (an
 * elastic job's re-forms give its workers new ranks).  Safe from any
 * thread before rdv_scheduler_free(). */
unsigned rdv_scheduler_books(struct rdv_scheduler *s);

/* The rank of the worker process `pid` in the current membership: true
 * with *rank, false when no registered worker has that pid (still
 * starting, waiting to be taken in, or gone).  Safe from any thread
 * before rdv_scheduler_free(). */
bool rdv_scheduler_worker_rank(struct rdv_scheduler *s, int pid, int *rank);

/* The launcher that runs this scheduler is stopping the job, for `why` (a
 * process it started failed, a signal, --timeout): unless the job failed
 * already, that is its failure, which every node hears (as
 * UNISUM_EREMOTE, its text naming `why`) instead of learning of the stop
 * from the connections that the stop then closes.  Not logged here: the
 * launcher said it.  Safe from any thread before rdv_scheduler_free(). */
void rdv_scheduler_stop(struct rdv_scheduler *s, const char *why);

/* The launcher reaps its children, the scheduler's nodes among them, and
 * notes how each ended here first (`info` from waitid(WNOWAIT)): a node
 * reaped before the scheduler could look is still named with its real
 * cause (killed by the OOM killer, say), not "exited or crashed".  Safe
 * from any thread. */
void rdv_note_child_end(const siginfo_t *info);

/* Makes a running scheduler give up (the launcher calls it when a process
 * dies); rdv_scheduler_wait() then returns UNISUM_ESHUTDOWN.  Safe from any
 * thread at any time before rdv_scheduler_free(), also after wait returned. */
void rdv_scheduler_abort(struct rdv_scheduler *s);

/* Whether the job failed because of one node (it lost its connection
 * without a goodbye, broke the protocol or went silent): true with its
 * role (CONFIG_ROLE_*) and rank.  The scheduler sees that before anyone
 * hears of the failure, so a launcher can tell the process that failed
 * from those that exited on the news.  Safe until rdv_scheduler_free(). */
bool rdv_scheduler_culprit(struct rdv_scheduler *s, int *role, int *rank);

/* Frees the scheduler once rdv_scheduler_wait() has returned. */
void rdv_scheduler_free(struct rdv_scheduler *s);

/* ---- client (servers and workers) --------------------------------------- */

struct rdv_client;

/* Called once, on the client's loop thread, when the scheduler announces
 * that the job is over: `err` is UNISUM_ESHUTDOWN for a clean stop (servers
 * get it when every worker is done), another negative code when a node
 * failed or the scheduler was lost, with `why` naming the culprit. */
typedef void (*rdv_notice_fn)(void *arg, int err, const char *why);

/* Called on the client's loop thread (servers and workers) when the scheduler finds that
 * the workers disagree on the shape of the tensor with key `key`, or a
 * worker found them disagreeing on its collective: it can never be summed,
 * and `why` names both sides. */
typedef void (*rdv_tensor_error_fn)(void *arg, uint64_t key, const char *why);

/* Connects to the scheduler of `cfg` (retrying until cfg->timeout_ms),
 * registers as cfg->role with the given listening port, and waits for the
 * address book.  Both callbacks get `arg`; tensor_error may be NULL.
 * Returns 0 and a client, or a negative error. */
int rdv_client_new(const struct config *cfg, int listen_port, rdv_notice_fn notice,
		   rdv_tensor_error_fn tensor_error, void *arg, struct rdv_client **out);

/* This node's id and rank, and the address book (valid until _free). */
uint32_t rdv_client_id(const struct rdv_client *c);
int rdv_client_rank(const struct rdv_client *c);

/* Worker processes per machine as the scheduler saw them (the first
 * worker's UNISUM_LOCAL_SIZE, which every worker matched), and the number
 * of worker machines in the job. */
int rdv_client_local_size(const struct rdv_client *c);
int rdv_client_num_machines(const struct rdv_client *c);
int rdv_client_num_servers(const struct rdv_client *c);
/* Elastic jobs: how many workers wait to join (the scheduler's last
 * RESIZE), and asking the scheduler to re-form the job now to take them
 * in (0, or the error that already ended this membership). */
int rdv_client_waiting(struct rdv_client *c);
int rdv_client_resize(struct rdv_client *c);
/* Waits up to timeout_ms for this client's membership to end (REFORM, or
 * a failure); returns its error, 0 when it did not. */
int rdv_client_wait_failed(struct rdv_client *c, int timeout_ms);
const struct rdv_node *rdv_client_nodes(const struct rdv_client *c, int *count);
const struct rdv_node *rdv_client_server(const struct rdv_client *c, int server_rank);
const struct rdv_node *rdv_client_worker(const struct rdv_client *c, int rank);
const struct rdv_node *rdv_client_node_by_id(const struct rdv_client *c, uint32_t id);

/* Whether node n shares this node's host (the identities both registered
 * with the scheduler are equal) and gave its pid: its memory can be read
 * by address (IPC mode). */
bool rdv_client_same_host(const struct rdv_client *c, const struct rdv_node *n);

/* Autotune (worker.c): the setting every worker uses from round
 * epoch x UNISUM_AUTOTUNE_STEPS of each tensor on; `final` means it never
 * changes again. */
struct rdv_tune {
	uint32_t epoch;
	uint64_t partition_bytes, credit_bytes;
	bool final;
	uint32_t mode;		/* worker 0's UNISUM_AUTOTUNE: 1 search, 2 fit */
	uint32_t steps;		/* ... and its rounds per epoch (fit mode: 1) */
};

/* Called on the client's loop thread (workers) for every setting worker 0
 * posts, in the order posted. */
typedef void (*rdv_tune_fn)(void *arg, const struct rdv_tune *t);

/* Server failover (UNISUM_SERVER_FAILOVER): server `dead` was lost and
 * each piece key keys[i] now lives on server servers[i].  `number`
 * counts the failovers of the job (1, 2 ...). */
struct rdv_failover {
	uint32_t number;
	int dead;
	uint32_t n;
	uint64_t *keys;			/* [n], malloc'd by the decoder */
	uint32_t *servers;		/* [n] */
};
/* Called on the client's loop thread (workers) for every FAILOVER, in order;
 * the callee owns nothing of f. */
typedef void (*rdv_failover_fn)(void *arg, const struct rdv_failover *f);
void rdv_client_on_failover(struct rdv_client *c, rdv_failover_fn fn, void *arg);
/* A replacement server took lost server `node->rank`'s place (REJOIN):
 * the client's address book has its entry already.  On the client's loop thread
 * (workers). */
typedef void (*rdv_rejoin_fn)(void *arg, const struct rdv_node *node);
/* Servers: MIGRATE (FAILOVER's payload, f->dead = the replacement the keys
 * go to), on the client's loop thread. */
void rdv_client_on_migrate(struct rdv_client *c, rdv_failover_fn fn, void *arg);
void rdv_client_on_rejoin(struct rdv_client *c, rdv_rejoin_fn fn, void *arg);
/* FAILOVER's codec: header round = number, aux = dead; payload u32 n,
 * n x {u64 key, u32 server}.  decode: 0, UNISUM_EPROTO or UNISUM_ENOMEM. */
void rdv_failover_encode(const struct rdv_failover *f, struct wire_hdr *h, struct wire_buf *b);
int rdv_failover_decode(const struct wire_hdr *h, const void *payload, size_t len,
			struct rdv_failover *f);

/* Sets the callback of TUNE messages (before anyone posts one). */
void rdv_client_on_tune(struct rdv_client *c, rdv_tune_fn fn, void *arg);

/* Worker 0 only: posts a setting; the scheduler passes it to every worker
 * (this one included).  0 or a negative error. */
int rdv_client_post_tune(struct rdv_client *c, const struct rdv_tune *t);

/* Encodes / decodes a TUNE payload.  decode: 0 or UNISUM_EPROTO. */
void rdv_tune_encode(const struct rdv_tune *t, struct wire_buf *b);
int rdv_tune_decode(const void *payload, size_t len, uint32_t epoch, struct rdv_tune *t);

/* Waits until every node of `group` has entered the barrier. */
int rdv_client_barrier(struct rdv_client *c, int group);

/* The same in slices: enters the barrier of `group` unless this node is
 * already waiting in one, then waits at most timeout_ms (< 0: no limit).
 * 1 when every node has entered, 0 when the time ran out first (still in
 * the barrier: the next call waits for the same one), or a negative error
 * when the job failed. */
int rdv_client_barrier_wait(struct rdv_client *c, int group, int timeout_ms);

/* Asks the scheduler for the cut and placement of tensor `name`.  On
 * success *key_base is the tensor's key (partition i has key key_base + i),
 * and *parts and *servers are malloc'd arrays of *nparts entries: where
 * each partition lies in the tensor and its server rank (the scheduler's
 * placement policy decides both, see placement.h).  On a mismatch with
 * another worker's declaration returns UNISUM_EMISMATCH with both shapes
 * in `why`. */
struct placement_part;
int rdv_client_declare(struct rdv_client *c, const char *name, unisum_dtype dtype,
		       uint64_t count, uint64_t partition_bytes, uint64_t *key_base,
		       uint32_t *nparts, struct placement_part **parts, uint32_t **servers,
		       char *why, size_t why_len);

/* A tensor's dimensions, when its declaration gives them: every worker
 * that gives them must give the same (UNISUM_EMISMATCH naming both).  ndim
 * 0: none given. */
#define RDV_MAX_DIMS 16
struct rdv_shape {
	uint32_t ndim;
	uint64_t dims[RDV_MAX_DIMS];
};

/* The same for a homed cut (placement_place_homed), with the shape (NULL:
 * none) and the sync mode (WIRE_SYNC_*, which every declaration of the
 * name must share) and the compression spec (compress_spec_format's text,
 * NULL or "": none; every declaration must share it too): the tensor is nseg
 * segments of seg_counts[i] elements, each owned by machine
 * seg_owners[i]; every partition of a segment lies on its owner's host's
 * server when it has one, and no partition spans two segments.  Every
 * worker must declare the name with the same segments (UNISUM_EMISMATCH
 * otherwise).  rack >= 0: every worker of the tensor's process set is in
 * that rack (UNISUM_RACK), so the tensor goes on that rack's servers when
 * it has any (-1: anywhere). */
int rdv_client_declare_homed(struct rdv_client *c, const char *name, unisum_dtype dtype,
			     uint64_t count, uint64_t partition_bytes, uint32_t nseg,
			     const uint64_t *seg_counts, const uint32_t *seg_owners,
			     const struct rdv_shape *shape, uint32_t sync, const char *compression,
			     int rack, uint64_t *key_base,
			     uint32_t *nparts, struct placement_part **parts, uint32_t **servers,
			     char *why, size_t why_len);

/* Asks the scheduler to fail the whole job with `why` (a server that
 * found a round stalled past UNISUM_STALL_ABORT_MS): every node is told,
 * every rank's pending and later calls fail with the message. */
void rdv_client_fail_job(struct rdv_client *c, int err, const char *why);

/* Asks the scheduler to tell every node that tensor `key` can never be
 * summed, for `why` (the workers of a machine, or a server, found that
 * they disagree on its collective): the others stop waiting for it. */
void rdv_client_poison_tensor(struct rdv_client *c, uint64_t key, const char *why);

/* Join (unisum_join): a worker that joined contributes zeros to the
 * push_pulls of the others until every worker has joined.  The scheduler
 * tells every worker who joined (RDV_JOINED); a worker that has not
 * joined announces each push_pull it runs from then on, and those in
 * flight (rdv_client_announce); the scheduler passes the announcements to
 * the joined workers (RDV_ANNOUNCED), and tells everyone once all have
 * joined (RDV_JOIN_DONE, with the last to join). */
struct rdv_announce {
	char name[256];
	unisum_dtype dtype;
	uint64_t count;
	uint32_t round;			/* the tensor's round (its operation count) */
	uint32_t wire_op;		/* the collective (WIRE_OP) */
	uint64_t life;			/* which declaration of the name (1, then 2 when
					 * declared again after an undeclare ...), in
					 * the header's key field */
	uint64_t key;			/* the tensor's key (its first cut's), 0 when
					 * not known yet: what a joined rank poisons
					 * when it never ran an announced gathering
					 * collective's round */
	struct rdv_shape shape;
};
enum rdv_join_event { RDV_JOINED, RDV_ANNOUNCED, RDV_JOIN_DONE };
/* `rank`: who joined (RDV_JOINED), the last (RDV_JOIN_DONE); `a`: the
 * announcement (RDV_ANNOUNCED), else NULL.  On the client's loop thread. */
typedef void (*rdv_join_fn)(void *arg, int event, int rank, const struct rdv_announce *a);
/* Sets the callback; events that came before it are handed to it now. */
void rdv_client_on_join(struct rdv_client *c, rdv_join_fn fn, void *arg);
int rdv_client_join(struct rdv_client *c);
int rdv_client_announce(struct rdv_client *c, const struct rdv_announce *a);
/* ANNOUNCE's codec: the header's dtype, count, round and aux, and the
 * payload str name, u32 ndim, ndim x u64, u64 key. */
void rdv_announce_encode(const struct rdv_announce *a, struct wire_hdr *h, struct wire_buf *b);
int rdv_announce_decode(const struct wire_hdr *h, const void *payload, size_t len,
			struct rdv_announce *a);

/* Tells the scheduler that this worker undeclared the tensor of `key`
 * (unisum_undeclare); once every worker has, it forgets the tensor. */
void rdv_client_forget(struct rdv_client *c, uint64_t key);

/* Sets the callback that adds this node's own counters to those its
 * heartbeats carry while the scheduler serves metrics (metrics.h); NULL
 * clears it.  The callback runs on the client's loop thread without the
 * client's lock, until rdv_client_free(). */
void rdv_client_on_metrics(struct rdv_client *c, rdv_metrics_fn fn, void *arg);

/* Says goodbye (workers: "done"; the scheduler stops servers when all
 * workers are done) and frees the client. */
void rdv_client_free(struct rdv_client *c);

#endif /* UNISUM_RENDEZVOUS_H */
