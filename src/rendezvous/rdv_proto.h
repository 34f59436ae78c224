/*
 * rdv_proto.h - payload layouts shared by the scheduler and its client.
 * (Internal to src/rendezvous.)
 *
 *   REGISTER   u32 role, u32 requested rank (int32, -1 = any; a worker's machine
 *              index), u32 port, u32 local rank, u32 local size (servers 0, 1), str host,
 *              u32 pid, str host identity, u32 rack (int32, UNISUM_RACK, -1 = none),
 *              str transport (UNISUM_TRANSPORT), u32 resume (0: a fresh node; 1: a node of a running job whose
 *              scheduler was lost, then struct rdv_resume's fields in order,
 *              the lost servers as u32 n and n x u32)
 *   HELD       worker -> a restarted scheduler: header key, dtype, count, aux = sync;
 *              payload u32 length and the tensor's DECLARE request, then the
 *              DECLARE reply it got (the cut and where each piece lives now)
 *   ADDRBOOK   u32 your id, u32 local size, u32 n, n x {u32 id, u32 role, u32 rank,
 *              u32 machine (int32, -1 for servers), u32 local rank, u32 port, str host,
 *              u32 pid, str host identity, u32 rack (int32, -1 = none)}
 *   BARRIER    header aux = group; BARRIER_DONE the same
 *   DECLARE    request: header dtype, count; payload str name, u64 partition_bytes,
 *              segments, shape, u32 rack, str compression spec
 *              (rdv_declare_encode)
 *              reply:   header key; payload u32 status (0 or -error), then
 *                       u32 n, n x {u64 count, u32 server rank} (the cut, in order),
 *                       or str message
 *   SHUTDOWN   worker -> scheduler: goodbye; scheduler -> server: stop now
 *   ERROR      scheduler -> node: the job failed; header key 0, aux = -error, payload str why
 *              node -> scheduler: fail the job for this reason (a stalled round or
 *              barrier); with a key (a worker): that tensor's workers disagree on
 *              its collective, poison it
 *              scheduler -> server and worker: header key = a tensor key: that
 *              tensor's workers disagree on its shape or collective and it can
 *              never be summed; payload str why
 *   RETIRE     worker -> scheduler: header key = a tensor key it undeclared; once
 *              every worker has, the scheduler forgets the tensor
 *   TUNE       worker 0 -> scheduler -> every worker: header round = epoch; payload
 *              u64 partition_bytes (8 .. 1 GiB), u64 credit_bytes (> 0), u32 final (0/1)
 *   JOIN       worker -> scheduler: it joined; scheduler -> every worker: aux = who
 *   ANNOUNCE   worker -> scheduler -> joined workers: header dtype, count, round, aux =
 *              collective; payload str name, u32 ndim, ndim x u64, u64 key (rdv_announce_*)
 *   JOIN_DONE  scheduler -> every worker: everyone joined, aux = the last
 */
#ifndef UNISUM_RDV_PROTO_H
#define UNISUM_RDV_PROTO_H

#include <stddef.h>
#include <stdint.h>

#include "placement/placement.h"
#include "rendezvous/rendezvous.h"
#include "wire/wire.h"

#define RDV_MAX_NODES 4096
#define RDV_MAX_LOCAL_SIZE 1024	/* UNISUM_LOCAL_SIZE's upper bound */

/* One codec per payload (proto.c).  Every decoder returns 0, or
 * UNISUM_EPROTO when the payload is not of the message's shape (a field
 * missing, bytes left over, a string that does not fit), or UNISUM_ENOMEM;
 * the receiver checks what the values mean. */

/* What a node of a running job tells a restarted scheduler (REGISTER's
 * resume part; client_resume.c, sched_resume.c). */
#define RDV_MAX_LOST 256		/* lost servers a resume can name */
struct rdv_resume {
	uint32_t on;			/* 1: this REGISTER resumes a running job */
	uint32_t id, rank;		/* the node's, from its address book */
	uint32_t gen;			/* the book's generation (elastic jobs) */
	uint32_t local_size, workers, servers; /* the book's */
	uint32_t entered[4], done[4];	/* per barrier group: entered and completed */
	uint32_t joined;		/* 1: it joined (unisum_join) and awaits JOIN_DONE */
	uint32_t failovers;		/* the last failover it heard of (its number) */
	uint32_t held;			/* the HELDs that follow the REGISTER */
	uint32_t nlost;
	uint32_t lost[RDV_MAX_LOST];	/* the servers it heard were lost, not replaced */
};

/* REGISTER. */
struct rdv_register {
	int role;			/* CONFIG_ROLE_SERVER or CONFIG_ROLE_WORKER */
	int req_rank;			/* -1 = any; a worker's machine, a server's rank */
	int port;			/* servers: where workers connect */
	int local_rank, local_size;	/* servers: 0, 1 */
	char host[64];			/* the address peers use */
	int pid;
	char host_id[64];		/* boot id and namespaces (rdv_client_same_host) */
	int rack;			/* UNISUM_RACK: -1 = none */
	char transport[8];		/* UNISUM_TRANSPORT: "tcp" or "ucx" */
	struct rdv_resume resume;	/* resume.on 0: a fresh node */
};
void rdv_register_encode(const struct rdv_register *m, struct wire_buf *b);
int rdv_register_decode(const void *payload, size_t len, struct rdv_register *m);

/* ADDRBOOK: the head, then one entry per node. */
void rdv_book_encode_head(struct wire_buf *b, uint32_t your_id, uint32_t local_size, uint32_t n);
void rdv_book_encode_node(struct wire_buf *b, const struct rdv_node *node);
/* *nodes is malloc'd, n (1 .. RDV_MAX_NODES) entries. */
int rdv_book_decode(const void *payload, size_t len, uint32_t *your_id, uint32_t *local_size,
		    struct rdv_node **nodes, uint32_t *n);

/* A homed cut's segments (placement_place_homed): counts[i] elements
 * owned by machine owners[i]. */
#define RDV_MAX_SEGS 65536u
struct rdv_segs {
	uint32_t n;
	uint64_t *counts;
	uint32_t *owners;
};

/* DECLARE request (the dtype and count travel in the header): the name,
 * the partition size, u32 n and n x {u64 count, u32 owner machine} (a
 * homed cut's segments; segs NULL or n 0: none), u32 ndim and ndim x u64
 * (the shape; shape NULL or ndim 0: none), u32 rack (int32: the rack every
 * worker of the tensor's process set is in, whose servers should hold it;
 * -1: any).  decode fills *segs (arrays malloc'd, free with
 * rdv_segs_free), *shape and *rack. */
void rdv_declare_encode(struct wire_buf *b, const char *name, uint64_t partition_bytes,
			const struct rdv_segs *segs, const struct rdv_shape *shape, int rack,
			const char *spec);
int rdv_declare_decode(const void *payload, size_t len, char *name, size_t name_len,
		       uint64_t *partition_bytes, struct rdv_segs *segs, struct rdv_shape *shape,
		       int *rack, char *spec, size_t spec_len);
void rdv_segs_free(struct rdv_segs *segs);

/* DECLARE reply: the cut and its servers, or a refusal (-error, text).
 * decode: *status 0 with *parts (offsets filled in, counts summed as
 * sent) and *servers malloc'd, n (<= PLACEMENT_MAX_PARTS) entries; or
 * *status < 0 with why filled in. */
void rdv_placed_encode(struct wire_buf *b, uint32_t n, const struct placement_part *parts,
		       const uint32_t *servers);
void rdv_refused_encode(struct wire_buf *b, int err, const char *why);
int rdv_declare_reply_decode(const void *payload, size_t len, int *status, char *why, size_t why_len,
			     uint32_t *n, struct placement_part **parts, uint32_t **servers);

/* HELD: DECLARE's request payload (req, req_len) and its reply's cut. */
void rdv_held_encode(struct wire_buf *b, const void *req, size_t req_len, uint32_t n,
		     const struct placement_part *parts, const uint32_t *servers);
/* Splits a HELD payload into the request's and the reply's bytes (both
 * pointing into payload), for rdv_declare_decode and
 * rdv_declare_reply_decode. */
int rdv_held_split(const void *payload, size_t len, const void **req, size_t *req_len,
		   const void **reply, size_t *reply_len);

/* TUNE: rdv_tune_encode / rdv_tune_decode in rendezvous.h (worker.c's
 * tuner uses them too). */

/* This process's host for shared memory and for its processes' pids:
 * the boot id and the network and pid namespaces (see struct rdv_node). */
void rdv_host_identity(char *out, size_t len);

#endif /* UNISUM_RDV_PROTO_H */
