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
};

#endif /* UNISUM_CLIENT_INT_H */
