/*
 * client_int.h - a node's client of the scheduler, shared by client.c (the
 * connection, registration, requests and the heartbeat) and client_book.c
 * (the address book as this node sees it).  Internal to src/rendezvous.
 */
#ifndef UNISUM_CLIENT_INT_H
#define UNISUM_CLIENT_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "loop/conn.h"
#include "loop/loop.h"
#include "rendezvous/metrics.h"
#include "rendezvous/rdv_proto.h"
#include "rendezvous/rendezvous.h"
#include "transport/transport.h"
#include "wire/wire.h"

struct rdv_client {
	const struct transport_ops *tp;
	struct tp_conn *conn;		/* to the scheduler */
	int role;			/* CONFIG_ROLE_* of this node */
	uint32_t id;			/* this node's id */
	int rank;			/* this node's rank within its role */
	struct rdv_node *nodes;		/* the address book */
	int nnodes;
	int local_size;			/* worker processes per machine (from the book) */
	int num_machines;		/* worker machines (workers in the book / local_size) */
	int num_servers;		/* servers in the book */
	_Atomic int waiting;		/* elastic: workers waiting to join (RESIZE) */
	rdv_notice_fn notice;		/* job-over callback */
	rdv_tensor_error_fn tensor_error; /* poisoned-tensor callback, or NULL */
	void *notice_arg;		/* both callbacks' argument */
	rdv_tune_fn tune;		/* autotune settings (workers), or NULL; under lock */
	void *tune_arg;
	struct rdv_tune *early;		/* TUNEs that came before the callback was set */
	int nearly;
	rdv_join_fn join;		/* join events (workers), or NULL; under lock */
	void *join_arg;
	struct rdv_join_event_rec {
		int event, rank;
		struct rdv_announce a;
	} *early_join;			/* join events that came before the callback */
	int nearly_join;
	rdv_failover_fn failover;	/* FAILOVER (workers), or NULL; under lock */
	void *failover_arg;
	struct rdv_failover *early_fo;	/* FAILOVERs that came before the callback */
	int nearly_fo;
	rdv_failover_fn migrate;	/* MIGRATE (servers), or NULL; under lock */
	void *migrate_arg;
	rdv_rejoin_fn rejoin;		/* REJOIN (workers), or NULL; under lock */
	void *rejoin_arg;
	rdv_metrics_fn metrics;		/* fills this node's counters, or NULL; under lock */
	void *metrics_arg;
	atomic_bool metrics_asked;	/* the scheduler's last heartbeat asked for them */
	struct loop_pool pool;		/* one loop: the connection and the heartbeat */
	struct loop_conn *lc;		/* conn, served by it after registration */
	struct loop_timer beat;		/* says we are alive; watches the scheduler */
	int heartbeat_ms, timeout_ms;
	int serving;			/* rdv_serve: 0 not yet, 1 done, else its error */
	_Atomic int64_t last_rx_ms;	/* when the scheduler last sent anything */
	pthread_mutex_t request_lock;	/* one request in flight */
	pthread_mutex_t lock;		/* the reply slot and `failed` */
	pthread_cond_t replied;
	bool have_reply;		/* reply_hdr / reply_payload are set */
	struct wire_hdr reply_hdr;
	void *reply_payload;		/* malloc'd; taken by the requester */
	uint32_t barrier_entered[4];	/* per group: barriers entered ... */
	uint32_t barrier_done[4];	/* ... and completed (BARRIER_DONE) */
	bool barrier_waiting[4];	/* a timed wait ran out: the next call waits
					 * for the same barrier, even when it ended
					 * in between */
	int failed;			/* 0, or why no reply will ever come */
	char failed_why[512];
	bool closing;			/* rdv_client_free() has started */
	/* A lost scheduler, waited for and resumed with (client_resume.c). */
	char sched_host[256];		/* where it listens */
	int sched_port;
	struct rdv_register reg;	/* this node's first REGISTER */
	uint32_t gen;			/* the book's generation (its header's round) */
	pthread_mutex_t send_lock;	/* lc, conn, resuming, dialed and the outbox,
					 * for senders; inside `lock` */
	bool resuming;			/* the scheduler was lost: waiting for it */
	bool dialed;			/* ... registered again, its answer awaited */
	int64_t lost_ms;		/* when it was lost (under lock) ... */
	char lost_why[300];		/* ... and how */
	struct loop_timer redial;	/* tries to reach it again */
	uint32_t reported_entered[4];	/* barriers entered as the resume reported them */
	struct rdv_held *held;		/* every tensor declared (under lock) */
	int nheld;
	bool held_lost;			/* one could not be kept: no resume */
	uint8_t *lost_servers;		/* [num_servers] lost and not replaced */
	uint32_t failovers;		/* the last FAILOVER's number */
	bool joined;			/* JOIN sent, no JOIN_DONE yet */
	struct rdv_tune *posted;	/* worker 0's TUNEs, the last RDV_MAX_POSTED */
	int nposted;
	int64_t tune_seen;		/* the last TUNE epoch handed on, -1: none */
	struct wire_hdr req_hdr;	/* the request in flight (under lock) ... */
	void *req_payload;
	bool req_active;		/* ... until answered (or failed) */
	struct rdv_outbox {
		struct wire_hdr h;
		void *payload;
	} *outbox;			/* sent while resuming, to send once back */
	int noutbox;
};

/* client.c's connection callbacks, for the connection client_resume.c
 * opens to a restarted scheduler. */
extern const struct loop_conn_ops rdv_conn_ops;

/* client_resume.c.  The scheduler's connection ended (rc, why), on the
 * loop: true when this node waits for a restarted scheduler (a plain
 * loss, while the job runs), false when the caller fails the client. */
bool rdv_resume_start(struct rdv_client *c, int rc, const char *why);
/* A try of the redial timer (every RDV_REDIAL_MS): reaches the restarted
 * scheduler and registers again.  0: go on; 1: over (back, or the client
 * failed or closes); or an error with why: the client fails with it (the
 * loss lasted UNISUM_TIMEOUT_MS, or its tensors cannot be told). */
#define RDV_REDIAL_MS 100
int rdv_resume_try(struct rdv_client *c, char *why, size_t len);
/* An ADDRBOOK while resuming: the scheduler took the node back; what
 * waited goes out.  0, or UNISUM_EPROTO (not the node's book, or not
 * awaited). */
int rdv_resume_done(struct rdv_client *c, const struct wire_hdr *h, const void *payload);
/* A message sent while resuming (send_lock held): kept to send once the
 * scheduler is back, or dropped when the resume carries it.  0 or an
 * error. */
int rdv_resume_hold(struct rdv_client *c, const struct wire_hdr *h, const void *payload);
/* Keeps request req (with its payload), about to be sent, to send again
 * to a restarted scheduler until answered (c->lock held).  0 or
 * UNISUM_ENOMEM. */
int rdv_request_keep(struct rdv_client *c, const struct wire_hdr *req, const void *payload);
/* The tensors this worker declared: kept from a DECLARE reply of the
 * request in flight, on the loop's thread (c->lock held), forgotten, moved
 * by a failover (and its lost server noted); freed with the rest of the
 * resume's state. */
void rdv_held_reply(struct rdv_client *c, const struct wire_hdr *reply, const void *payload);
void rdv_held_forget(struct rdv_client *c, uint64_t key);
void rdv_held_failover(struct rdv_client *c, const struct rdv_failover *f);
void rdv_held_free(struct rdv_client *c);
/* Worker 0 posted TUNE t (c->lock held). */
void rdv_posted_add(struct rdv_client *c, const struct rdv_tune *t);

#endif /* UNISUM_CLIENT_INT_H */
