/*
 * wire.h - the message header every unisum node speaks (docs/ARCHITECTURE.md
 * section 4, which names every message type: keep it true).
 *
 * A message is a 48-byte little-endian header followed by payload_len
 * bytes of payload:
 *
 *   off size field
 *    0   4   magic        "USUM" (0x4d555355 little-endian)
 *    4   1   version      WIRE_VERSION
 *    5   1   type         enum wire_type
 *    6   2   flags        WIRE_FLAG_*, only those valid for the type
 *    8   4   sender       node id of the sender
 *   12   4   round        training round of the key (PUSH, PULL, PULL_REPLY)
 *   16   8   key          partition key
 *   24   8   count        number of elements (PUSH, PULL_REPLY, DECLARE*)
 *   32   8   payload_len  bytes that follow the header
 *   40   1   dtype        unisum_dtype (PUSH, PULL, PULL_REPLY, DECLARE*)
 *   41   3   reserved     zero
 *   44   4   aux          per type: barrier group, partition count, error code,
 *                          the collective of a PUSH (WIRE_OP_*), the sync
 *                          mode of a DECLARE or DECLARE_CHECK (WIRE_SYNC_*)
 *
 * wire_decode() rejects anything a well-behaved peer never sends: bad
 * magic or version, unknown type, flags the type does not take, non-zero
 * reserved bytes, an unknown dtype, a payload larger than the type allows
 * or one that disagrees with count x dtype.  Checks that need state (is the
 * key declared, is the round the expected one) belong to the receiver.
 *
 * Control payloads (REGISTER, ADDRBOOK, DECLARE, DECLARE_CHECK, ERROR,
 * TUNE) are built with wire_buf and read with wire_reader, which never
 * read past their end, each by one codec (below, and rdv_proto.h).
 */
#ifndef UNISUM_WIRE_H
#define UNISUM_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "unisum.h"

#define WIRE_MAGIC 0x4d555355u	/* "USUM" */
/* (A build may set another, to test that two versions refuse each other:
 * the test_wire_version program of CMakeLists.txt.) */
#ifndef WIRE_VERSION
#define WIRE_VERSION 22
#endif
#define WIRE_HDR_SIZE 48
#define WIRE_MAX_CONTROL_PAYLOAD (1u << 20)	/* 1 MiB for control messages */
#define WIRE_MAX_DATA_PAYLOAD (1ull << 30)	/* 1 GiB for one partition */
#define WIRE_COPY_MAX_CONTRIB (1u << 16)	/* a COPY's contributors at most */

enum wire_type {
	WIRE_REGISTER = 1,	/* node -> scheduler: role, host, port; worker -> server: hello */
	WIRE_ADDRBOOK = 2,	/* scheduler -> node: ids and addresses of every node */
	WIRE_BARRIER = 3,	/* node -> scheduler: entered barrier of group `aux` */
	WIRE_BARRIER_DONE = 4,	/* scheduler -> node: everyone entered */
	WIRE_HEARTBEAT = 5,	/* liveness: node <-> scheduler every UNISUM_HEARTBEAT_MS; the
				 * scheduler's aux 1 asks for the node's counters, which its
				 * next ones carry (rendezvous/metrics.h) */
	WIRE_PUSH = 6,		/* worker -> server: a partition's contribution */
	WIRE_PUSH_ACK = 7,	/* server -> worker: the PUSH of key, round arrived (credit back) */
	WIRE_PULL = 8,		/* worker -> server: send me the sum of this round */
	WIRE_PULL_REPLY = 9,	/* server -> worker: the sum */
	WIRE_DECLARE_CHECK = 10, /* worker -> server: key, dtype, count it will push; payload str name,
				  * the ranks of its process set */
	WIRE_ERROR = 11,	/* any -> any: code in aux, text in payload; to the scheduler: fail the
				 * job, or with a key, that tensor can never be summed */
	WIRE_SHUTDOWN = 12,	/* worker -> scheduler: done; scheduler -> server: stop */
	WIRE_DECLARE = 13,	/* worker <-> scheduler: name -> key and servers */
	WIRE_TUNE = 14,		/* worker 0 -> scheduler -> every worker: the setting of epoch
				 * `round` (autotune); payload u64 partition_bytes,
				 * u64 credit_bytes, u32 final, u32 mode (1 search,
				 * 2 fit), u32 steps (rounds per epoch) */
	WIRE_RETIRE = 15,	/* worker -> server: this worker is done with key for good
				 * (an autotune cut left behind, an undeclared tensor);
				 * worker -> scheduler: it undeclared the tensor of key;
				 * no payload */
	WIRE_JOIN = 16,		/* worker -> scheduler: it joined (unisum_join), no payload;
				 * scheduler -> every worker: rank `aux` joined */
	WIRE_ANNOUNCE = 17,	/* worker -> scheduler -> the joined workers: this worker runs
				 * round `round` of a push_pull (dtype, count, aux = its
				 * collective); payload str name, u32 ndim, ndim x u64 */
	WIRE_JOIN_DONE = 18,	/* scheduler -> every worker: all joined, rank `aux` last */
	WIRE_FAILOVER = 19,	/* scheduler -> every worker: server `aux` is lost, its pieces
				 * live elsewhere from now on; round = the failover's
				 * number; payload u32 n, n x {u64 key, u32 server} */
	WIRE_RESTORE = 20,	/* worker -> server, after a failover's DECLARE_CHECK: the
				 * sum of `round` of the key, as this worker received it
				 * from the lost server (count x dtype bytes, always
				 * inline) */
	WIRE_REJOIN = 21,	/* scheduler -> every worker: a replacement took lost server
				 * `aux`'s rank; payload its address book (the head and
				 * its one entry), new tensors may be placed on it */
	WIRE_MIGRATE = 22,	/* scheduler -> server: move these keys (FAILOVER's payload)
				 * to server `aux`, a replacement, from the first round
				 * nobody has pushed here yet */
	WIRE_MOVED = 23,	/* server -> worker, instead of a PUSH_ACK: the push of key,
				 * round went nowhere; that round and the next go to
				 * server `aux` (the PULL after it is dropped) */
	WIRE_REFORM = 24,	/* scheduler -> every node of an elastic job: the membership
				 * changes (payload str why); leave and register again for
				 * generation `aux`.  node -> scheduler: its answer, it will
				 * (aux = that generation), before it hangs up */
	WIRE_RESIZE = 25,	/* scheduler -> every worker of an elastic job: `aux`
				 * workers wait to join (no payload); worker -> scheduler:
				 * re-form the job now to take them in */
	WIRE_HELD = 26,		/* worker -> a restarted scheduler: a tensor it declared and
				 * where its pieces live (DECLARE's request and reply) */
	WIRE_COPY = 27,		/* server -> its backup server: the state of a key after
				 * aggregation (round = its version, aux = contributors n):
				 * count x dtype bytes of value, then n x u32 (each
				 * contributor's pushes the value holds); count 0 and no
				 * payload: forget the key */
	WIRE_COPY_ACK = 28,	/* backup -> server: it holds version `round` of key */
	WIRE_TYPE_MAX = 28,
};

/* PUSH: the contribution is all zeros and no payload follows (broadcast
 * from another root).  PULL_REPLY: the sum is all zeros, no payload. */
#define WIRE_FLAG_ZERO 0x1u

/* PUSH and PULL_REPLY over the IPC transport (src/transport/ipc; a Unix
 * socket between processes of one host): the payload is not the data but
 * three u64s (WIRE_IPC_PAYLOAD bytes): the address of the count elements
 * in the sender's memory, the address of the sender's guard word, and the
 * guard's value as sent.  The receiver copies the data with
 * process_vm_readv, in one copy instead of a socket's two, then the guard:
 * another value means the sender let go of the data meanwhile (it failed
 * the operation) and the copy is not used.  Set and consumed by that
 * transport only: callers never see it, and TCP refuses it. */
#define WIRE_FLAG_IPC 0x2u
#define WIRE_IPC_PAYLOAD 24u

/* PULL: this machine does not want the round's result of this key (a
 * reduce-scatter or alltoall whose elements here belong to other
 * machines); the server still answers once the round is complete, with a
 * PULL_REPLY flagged SKIP that carries nothing, so the slot's accounting
 * and the worker's completion stay those of every pull. */
#define WIRE_FLAG_SKIP 0x4u

/* PUSH and PULL_REPLY of a key declared with a compressor (its spec in
 * the DECLARE_CHECK, src/compress/compress.h): the payload is the codec's
 * encoding of the count float32 elements, payload_len bytes of it, at most
 * WIRE_COMPRESSED_MAX(count) (top-k's index and value per element, plus
 * its count) and at most WIRE_MAX_DATA_PAYLOAD; the receiver checks the exact length for the key's codec.
 * It goes through the socket even over IPC (the length is the codec's,
 * not count x dtype).  Exclusive with every other flag. */
#define WIRE_FLAG_COMPRESSED 0x8u

/* PUSH: the worker also pulls this round of the key, as if a PULL (no
 * flag) followed the push on the same connection (issue 50: one message
 * and one send a partition fewer).  The server answers it exactly as that
 * PULL.  Goes with any one of the flags above; a worker whose PULL must
 * wait (a ring phase) or wants none of the result (SKIP) sends its PULL
 * apart instead. */
#define WIRE_FLAG_PULL 0x10u

/* RESTORE (server failover): the payload is the worker's push of that
 * round, answered by the lost server (not the round's sum): the new
 * server sums the round again from it and the other machines' pushes,
 * and the worker pulls nothing of it; with ZERO, a ZERO push (no
 * payload).  aux: the push's collective (WIRE_OP()).  A gathering
 * collective's homed cut restores so (its machines pull with SKIP what
 * they do not need, so no one machine's reply is the round).  Only on
 * RESTORE, alone or with ZERO.  (A COMPRESSED RESTORE is always a push.) */
#define WIRE_FLAG_PUSHED 0x20u
#define WIRE_COMPRESSED_MAX(count) (8ull * (count) + 8)
/* The longest compression spec a DECLARE or DECLARE_CHECK carries, with
 * its NUL (compress.h's COMPRESS_SPEC_MAX is below it). */
#define WIRE_SPEC_MAX 192

/* A PUSH's aux names the collective its worker is in, so that whoever
 * combines the round (a server, or the workers of a machine) refuses it
 * before a byte is combined when the workers disagree: a broadcast from
 * two roots, a sum against an average, an allgather of other counts.  The
 * low byte is the kind; a broadcast carries its root rank above it, a
 * gathering collective the hash of its layout (wire_op_has_root). */
enum wire_op_kind {
	WIRE_OP_SUM = 0,
	WIRE_OP_AVERAGE = 1,
	WIRE_OP_BROADCAST = 2,
	WIRE_OP_MIN = 3,
	WIRE_OP_MAX = 4,
	WIRE_OP_PRODUCT = 5,
	WIRE_OP_ALLGATHER = 6,	/* pieces OR-ed: each machine's elements, zeros elsewhere */
	WIRE_OP_ALLTOALL = 7,	/* the same, for blocks addressed to each rank */
	WIRE_OP_REDUCESCATTER = 8,	/* a sum each machine pulls only its slice of */
	WIRE_OP_REDUCESCATTER_AVERAGE = 9,
	WIRE_OP_KIND_MAX = 9,
};
#define WIRE_OP_MAX_ROOT 0xffffffu

/* The aux of a DECLARE and a DECLARE_CHECK: how a key's pushes are
 * combined, the kind in the low byte and SSP's staleness bound above it.
 * The scheduler and the servers refuse any other value (wire_sync_valid),
 * and a tensor declared in two modes. */
enum wire_sync {
	WIRE_SYNC_LOCKSTEP = 0,	/* round r's pushes of every contributor are folded; pulls wait */
	WIRE_SYNC_ASYNC = 1,	/* the server holds the value: contributor 0's first push sets
				 * it, every later push is a delta added at once, and a pull
				 * returns the value as it stands */
	WIRE_SYNC_SSP = 2,	/* async, but a contributor that has pushed t deltas gets its
				 * pull answered only once every contributor has pushed t - S */
	WIRE_SYNC_KIND_MAX = 2,
};
#define WIRE_SYNC(kind, staleness) ((uint32_t)(kind) | (uint32_t)(staleness) << 8)
#define WIRE_SYNC_KIND(aux) ((aux) & 0xffu)
#define WIRE_SYNC_STALENESS(aux) ((aux) >> 8)
#define WIRE_SYNC_MAX_STALENESS 0xffffffu

/* Whether aux is a sync mode: a known kind, a staleness only for SSP. */
static inline bool wire_sync_valid(uint32_t aux)
{
	return WIRE_SYNC_KIND(aux) <= WIRE_SYNC_KIND_MAX &&
	       (WIRE_SYNC_KIND(aux) == WIRE_SYNC_SSP || WIRE_SYNC_STALENESS(aux) == 0);
}

/* Whether the servers hold the value of a tensor of this mode (async, SSP). */
static inline bool wire_sync_held(uint32_t aux)
{
	return WIRE_SYNC_KIND(aux) != WIRE_SYNC_LOCKSTEP;
}

/* The mode as UNISUM_SYNC spells it ("sync", "async", "ssp:2") into buf. */
static inline const char *wire_sync_text(uint32_t aux, char *buf, size_t len)
{
	if (WIRE_SYNC_KIND(aux) == WIRE_SYNC_SSP)
		snprintf(buf, len, "ssp:%u", (unsigned)WIRE_SYNC_STALENESS(aux));
	else
		snprintf(buf, len, "%s", WIRE_SYNC_KIND(aux) == WIRE_SYNC_ASYNC ? "async" : "sync");
	return buf;
}

/* Parses a sync mode as UNISUM_SYNC spells it: 0 with *aux and *group,
 * or -1.  "dssync:G" (divide and shuffle, a worker-side mode on process
 * sets, 1 <= G <= 65535) gives lock-step and *group = G; the others
 * *group = 0. */
int wire_sync_parse(const char *text, uint32_t *aux, int *group);
#define WIRE_OP(kind, root) ((uint32_t)(kind) | (uint32_t)(root) << 8)
#define WIRE_OP_KIND(op) ((op) & 0xffu)
#define WIRE_OP_ROOT(op) ((op) >> 8)

/* Whether the collective carries a value in its root field: a broadcast's
 * root, or the 24-bit hash of a gathering collective's layout (the counts
 * of every rank), so that ranks of different layouts disagree. */
bool wire_op_has_root(uint32_t op);

/* The reduction that combines the contributions of a collective
 * (REDUCER_SUM, ...; an int so that this header needs not the reducer's). */
int wire_op_reduction(uint32_t op);

/* Writes what a collective is for messages ("a sum", "an average", "a
 * broadcast from root 3") into buf; returns buf. */
const char *wire_op_describe(uint32_t op, char *buf, size_t len);

struct wire_hdr {
	uint8_t type;
	uint16_t flags;
	uint32_t sender;
	uint32_t round;
	uint64_t key;
	uint64_t count;
	uint64_t payload_len;
	uint8_t dtype;
	uint32_t aux;
};

/* Writes `h` (plus magic and version) into out[WIRE_HDR_SIZE]. */
void wire_encode(const struct wire_hdr *h, uint8_t out[WIRE_HDR_SIZE]);

/* Parses and validates in[WIRE_HDR_SIZE] into *h.  Returns 0, or
 * UNISUM_EPROTO with the reason written to `why`. */
int wire_decode(const uint8_t in[WIRE_HDR_SIZE], struct wire_hdr *h, char *why, size_t why_len);

/* Name of a message type, "unknown" otherwise. */
const char *wire_type_name(int type);

/* A growable buffer for building control payloads. */
struct wire_buf {
	uint8_t *data;
	size_t len, cap;
	bool failed;		/* an allocation failed; the content is invalid */
};

void wire_buf_init(struct wire_buf *b);
void wire_buf_fini(struct wire_buf *b);
void wire_buf_u32(struct wire_buf *b, uint32_t v);
void wire_buf_u64(struct wire_buf *b, uint64_t v);
void wire_buf_str(struct wire_buf *b, const char *s);	/* u32 length + bytes */
void wire_buf_bytes(struct wire_buf *b, const void *p, size_t n);	/* n bytes as they are */

/* The control payloads that more than one module writes or reads: one
 * codec each (the rendezvous messages have theirs in rdv_proto.h).
 *
 * ERROR: str why; the code (-err) travels in the header's aux, a tensor's
 * key in its key.  wire_error_build fills *h's type, aux and payload_len
 * and b with the payload (b initialised by the caller, who sets sender,
 * key and round and frees b); 0 or UNISUM_ENOMEM.  wire_error_decode
 * copies why (cut to why_len); 0 or UNISUM_EPROTO. */
int wire_error_build(struct wire_hdr *h, struct wire_buf *b, int err, const char *why);
int wire_error_decode(const void *payload, size_t len, char *why, size_t why_len);

/* DECLARE_CHECK: str name, the tensor's (for the server's messages), then
 * u32 n and n x u32: the worker ranks of the key's process set, strictly
 * increasing (n = 0: the global set, one push per machine); then str
 * spec: the key's compression spec in canonical form
 * (compress_spec_format), "" for none.
 * decode: 0, or UNISUM_EPROTO for a malformed or empty name, more than
 * max_members ranks, ranks out of order, or a spec longer than spec_len. */
void wire_declare_check_encode(struct wire_buf *b, const char *name, const int *members, int n,
			       const char *spec);
int wire_declare_check_decode(const void *payload, size_t len, char *name, size_t name_len,
			      int *members, int max_members, int *n, char *spec, size_t spec_len);

/* A bounds-checked reader over a received control payload. */
struct wire_reader {
	const uint8_t *p;
	size_t left;
	bool failed;		/* a read went past the end or a string was bad */
};

void wire_reader_init(struct wire_reader *r, const void *data, size_t len);
uint32_t wire_read_u32(struct wire_reader *r);
uint64_t wire_read_u64(struct wire_reader *r);
/* Copies a string into dst (NUL-terminated); fails if it does not fit or
 * holds a NUL byte. */
void wire_read_str(struct wire_reader *r, char *dst, size_t dst_len);

#endif /* UNISUM_WIRE_H */
