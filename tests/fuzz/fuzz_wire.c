/*
 * fuzz_wire.c - libFuzzer target for the wire codec (src/wire).
 *
 * Input: the first WIRE_HDR_SIZE bytes, when there are that many, are a
 * header for wire_decode(); the bytes after them (the whole input when it
 * is shorter than a header) are a control payload, read by every control
 * parser of src/rendezvous, src/server and src/worker in turn.
 *
 * What must hold, and abort()s here when it does not:
 *
 * Header.  wire_decode() accepts exactly the headers that the rules in
 * wire.h allow (an independent model of those rules is checked against
 * it both ways).  For an accepted header: re-encoding it gives back the
 * same 48 bytes; every field is the little-endian value at its offset;
 * the type has a name; the flags are ones the type takes (ZERO, IPC or
 * COMPRESSED on PUSH and PULL_REPLY, at most one, none elsewhere); the
 * dtype is valid where the type carries one and 0 elsewhere; PUSH and
 * PULL_REPLY carry count x dtype size bytes (0 with the ZERO flag,
 * WIRE_IPC_PAYLOAD = three u64s with the IPC flag; with COMPRESSED,
 * float32 only, 1 to 8 count + 8 bytes), count x dtype size never
 * overflowing nor passing WIRE_MAX_DATA_PAYLOAD unless ZERO; payload-less types carry
 * 0 bytes; control types at most WIRE_MAX_CONTROL_PAYLOAD.  A rejected header
 * yields UNISUM_EPROTO and a non-empty reason that fits the reason buffer,
 * however short that buffer is.
 *
 * Control payloads.  The reader never moves outside its payload
 * (p + left always ends at the payload's end), a read that fits advances
 * by exactly its size and returns the little-endian value, a read that
 * does not fit fails and returns 0, and failure is sticky.  A string lands
 * NUL-terminated in its destination, which is heap-allocated at exactly
 * the caller's size so AddressSanitizer catches one byte written past it;
 * it is accepted exactly when its length is below the destination size,
 * its bytes are all there and none is NUL, and it is "" when rejected.
 * A payload that parses is rebuilt with wire_buf and must come back byte
 * for byte (the encoding is canonical).
 *
 * Build and run with tests/fuzz/run.sh.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "placement/placement.h"
#include "rendezvous/rdv_proto.h"
#include "wire/wire.h"

#include "fuzz_check.h"

/* Little-endian reads written independently of wire.c's. */
static uint64_t le_bytes(const uint8_t *p, int n)
{
	uint64_t v = 0;
	for (int i = n - 1; i >= 0; i--)
		v = (v << 8) | p[i];
	return v;
}

/* ---- header ---- */

/* The IPC payload is three u64s: the data's address, the guard's address
 * and its value (wire.h); the model below says 24. */
_Static_assert(WIRE_IPC_PAYLOAD == 24, "WIRE_IPC_PAYLOAD is not three u64s");

/* Whether `type` carries a tensor dtype (wire.h's layout table). */
static bool type_is_tensor(uint8_t type)
{
	return type == WIRE_PUSH || type == WIRE_PULL || type == WIRE_PULL_REPLY ||
	       type == WIRE_RESTORE || type == WIRE_DECLARE_CHECK || type == WIRE_DECLARE ||
	       type == WIRE_ANNOUNCE || type == WIRE_HELD || type == WIRE_COPY;
}

/* Whether `type` never carries a payload.  DECLARE_CHECK is not one of
 * them: it carries the tensor's name (str), so it is a control message;
 * nor is HEARTBEAT, which carries a node's counters when asked. */
static bool type_is_payloadless(uint8_t type)
{
	return type == WIRE_PULL || type == WIRE_BARRIER || type == WIRE_BARRIER_DONE ||
	       type == WIRE_PUSH_ACK || type == WIRE_RETIRE ||
	       type == WIRE_JOIN || type == WIRE_JOIN_DONE || type == WIRE_MOVED ||
	       type == WIRE_RESIZE || type == WIRE_COPY_ACK;
}

/* Whether `type` sends tensor data: count x dtype bytes unless ZERO
 * (none) or IPC (the reference: the data's address in the sender, its
 * guard's address and value).  RESTORE is data that takes no flag but
 * COMPRESSED (a compressed key's encoded push). */
static bool type_is_data(uint8_t type)
{
	return type == WIRE_PUSH || type == WIRE_PULL_REPLY || type == WIRE_RESTORE;
}

/* Whether `flags` are ones `type` may carry: ZERO or IPC on the data
 * types, never the two together; PULL on a PUSH beside any one of them;
 * nothing on any other type. */
static bool flags_allowed(uint8_t type, uint16_t flags)
{
	if (type == WIRE_PUSH && (flags & WIRE_FLAG_PULL))
		flags &= (uint16_t)~WIRE_FLAG_PULL;
	else if (flags & WIRE_FLAG_PULL)
		return false;
	if (type == WIRE_PULL)
		return flags == 0 || flags == WIRE_FLAG_SKIP;
	if (type == WIRE_PULL_REPLY)
		return flags == 0 || flags == WIRE_FLAG_ZERO || flags == WIRE_FLAG_IPC ||
		       flags == WIRE_FLAG_SKIP || flags == WIRE_FLAG_COMPRESSED;
	if (type == WIRE_RESTORE)	/* a sum; a push: encoded, raw, or ZERO */
		return flags == 0 || flags == WIRE_FLAG_COMPRESSED || flags == WIRE_FLAG_PUSHED ||
		       flags == (WIRE_FLAG_PUSHED | WIRE_FLAG_ZERO);
	if (type == WIRE_COPY)
		return flags == 0 || flags == WIRE_FLAG_COMPRESSED;
	if (!type_is_data(type))
		return flags == 0;
	return flags == 0 || flags == WIRE_FLAG_ZERO || flags == WIRE_FLAG_IPC ||
	       flags == WIRE_FLAG_COMPRESSED;
}

/* The rules of wire.h, written from the header comment rather than from
 * wire.c: whether a well-behaved peer could have sent in[]. */
static bool model_accepts(const uint8_t in[WIRE_HDR_SIZE])
{
	uint8_t type = in[5];
	uint16_t flags = (uint16_t)le_bytes(in + 6, 2);
	uint64_t count = le_bytes(in + 24, 8);
	uint64_t payload_len = le_bytes(in + 32, 8);
	uint8_t dtype = in[40];

	if (le_bytes(in, 4) != WIRE_MAGIC || in[4] != WIRE_VERSION)
		return false;
	if (type < 1 || type > WIRE_TYPE_MAX)
		return false;
	if (in[41] != 0 || in[42] != 0 || in[43] != 0)
		return false;
	if (!flags_allowed(type, flags))
		return false;
	if (type_is_tensor(type) ? dtype >= UNISUM_DTYPE_COUNT : dtype != 0)
		return false;
	if (type == WIRE_PUSH || (type == WIRE_RESTORE && (flags & WIRE_FLAG_PUSHED))) {
		/* aux (a PUSH's, and a pushed RESTORE's: the push's): the
		 * collective, a kind in the low byte, a root above it
		 * for a broadcast, a layout hash for allgather, alltoall and
		 * reduce-scatter; a ZERO push only for broadcast, allgather and
		 * alltoall. */
		uint32_t aux = (uint32_t)le_bytes(in + 44, 4), kind = aux & 0xffu;
		bool rooted = kind == WIRE_OP_BROADCAST || kind == WIRE_OP_ALLGATHER ||
			      kind == WIRE_OP_ALLTOALL || kind == WIRE_OP_REDUCESCATTER ||
			      kind == WIRE_OP_REDUCESCATTER_AVERAGE;
		if (kind > WIRE_OP_REDUCESCATTER_AVERAGE || (!rooted && aux >> 8 != 0))
			return false;
		if ((flags & WIRE_FLAG_ZERO) && kind != WIRE_OP_BROADCAST &&
		    kind != WIRE_OP_ALLGATHER && kind != WIRE_OP_ALLTOALL)
			return false;
	}
	if (type_is_data(type)) {
		if (flags & (WIRE_FLAG_ZERO | WIRE_FLAG_SKIP))
			return payload_len == 0;
		if (flags & WIRE_FLAG_COMPRESSED)
			return dtype == UNISUM_FLOAT32 && count <= (1ull << 28) && payload_len >= 1 &&
			       payload_len <= 8 * count + 8 && payload_len <= WIRE_MAX_DATA_PAYLOAD;
		uint64_t bytes;
		if (__builtin_mul_overflow(count, (uint64_t)unisum_dtype_size(dtype), &bytes) ||
		    bytes > WIRE_MAX_DATA_PAYLOAD)
			return false;
		/* With IPC the count elements stay in the sender: only their
		 * reference travels (three u64s), but they still must fit one
		 * partition. */
		return payload_len == ((flags & WIRE_FLAG_IPC) ? 24 : bytes);
	}
	if (type == WIRE_COPY && (flags & WIRE_FLAG_COMPRESSED))
		/* A compressed key's: count float32s of error feedback, then
		 * at most an encoding's bytes (8 count + 8); no contributors. */
		return dtype == UNISUM_FLOAT32 && le_bytes(in + 44, 4) == 0 && count >= 1 &&
		       count <= (1ull << 28) && payload_len >= 4 * count &&
		       payload_len - 4 * count <= 8 * count + 8 && payload_len <= WIRE_MAX_DATA_PAYLOAD;
	if (type == WIRE_COPY) {
		/* The value and one u32 per contributor (aux, at most 65536),
		 * or nothing at all with count 0 (forget the key). */
		uint32_t n = (uint32_t)le_bytes(in + 44, 4);
		uint64_t bytes;
		if (n > 65536 || __builtin_mul_overflow(count, (uint64_t)unisum_dtype_size(dtype), &bytes) ||
		    bytes + 4ull * n > WIRE_MAX_DATA_PAYLOAD)
			return false;
		return payload_len == (count == 0 ? 0 : bytes + 4ull * n);
	}
	if (type_is_payloadless(type))
		return payload_len == 0;
	return payload_len <= WIRE_MAX_CONTROL_PAYLOAD;
}

/* The invariants of a header wire_decode() accepted. */
static void check_accepted(const uint8_t in[WIRE_HDR_SIZE], const struct wire_hdr *h)
{
	uint8_t again[WIRE_HDR_SIZE];
	wire_encode(h, again);
	CHECK(memcmp(again, in, WIRE_HDR_SIZE) == 0);

	CHECK(h->type == in[5]);
	CHECK(h->flags == le_bytes(in + 6, 2));
	CHECK(h->sender == le_bytes(in + 8, 4));
	CHECK(h->round == le_bytes(in + 12, 4));
	CHECK(h->key == le_bytes(in + 16, 8));
	CHECK(h->count == le_bytes(in + 24, 8));
	CHECK(h->payload_len == le_bytes(in + 32, 8));
	CHECK(h->dtype == in[40]);
	CHECK(h->aux == le_bytes(in + 44, 4));

	CHECK(h->type >= 1 && h->type <= WIRE_TYPE_MAX);
	CHECK(strcmp(wire_type_name(h->type), "unknown") != 0);
	CHECK(flags_allowed(h->type, h->flags));
	CHECK(__builtin_popcount(h->flags & (WIRE_FLAG_ZERO | WIRE_FLAG_IPC | WIRE_FLAG_SKIP |
					     WIRE_FLAG_COMPRESSED)) <= 1);
	if (type_is_tensor(h->type)) {
		CHECK(h->dtype < UNISUM_DTYPE_COUNT);
		CHECK(unisum_dtype_size((unisum_dtype)h->dtype) != 0);
		CHECK(strcmp(unisum_dtype_name((unisum_dtype)h->dtype), "unknown") != 0);
	} else {
		CHECK(h->dtype == 0);
	}

	/* What a receiver may allocate on the header's word. */
	CHECK(h->payload_len <= WIRE_MAX_DATA_PAYLOAD);
	if (type_is_data(h->type)) {
		if (h->flags & (WIRE_FLAG_ZERO | WIRE_FLAG_SKIP)) {
			CHECK(h->payload_len == 0);
		} else if (h->flags & WIRE_FLAG_COMPRESSED) {
			CHECK(h->dtype == UNISUM_FLOAT32);
			CHECK(h->payload_len > 0 && h->payload_len <= 8 * h->count + 8);
		} else {
			uint64_t bytes;
			size_t size = unisum_dtype_size((unisum_dtype)h->dtype);
			CHECK(!__builtin_mul_overflow(h->count, (uint64_t)size, &bytes));
			CHECK(bytes <= WIRE_MAX_DATA_PAYLOAD);
			if (h->flags & WIRE_FLAG_IPC)
				CHECK(h->payload_len == WIRE_IPC_PAYLOAD);
			else
				CHECK(h->payload_len == bytes);
		}
	} else if (type_is_payloadless(h->type)) {
		CHECK(h->payload_len == 0);
	} else if (h->type == WIRE_COPY && (h->flags & WIRE_FLAG_COMPRESSED)) {
		CHECK(h->dtype == UNISUM_FLOAT32 && h->aux == 0 && h->count >= 1);
		CHECK(h->payload_len >= 4 * h->count && h->payload_len <= WIRE_MAX_DATA_PAYLOAD);
	} else if (h->type == WIRE_COPY) {	/* a value and its contributors' counts */
		size_t size = unisum_dtype_size((unisum_dtype)h->dtype);
		CHECK(h->aux <= WIRE_COPY_MAX_CONTRIB);
		CHECK(h->payload_len == (h->count == 0 ? 0 : h->count * size + 4ull * h->aux));
	} else {
		CHECK(h->payload_len <= WIRE_MAX_CONTROL_PAYLOAD);
	}
}

/* Decodes in[] and checks the verdict and, when accepted, the header. */
static void fuzz_header(const uint8_t in[WIRE_HDR_SIZE])
{
	struct wire_hdr h;
	char why[256];
	memset(&h, 0xa5, sizeof h);
	memset(why, 0xa5, sizeof why);
	int rc = wire_decode(in, &h, why, sizeof why);
	CHECK(rc == 0 || rc == UNISUM_EPROTO);
	CHECK((rc == 0) == model_accepts(in));
	if (rc == 0) {
		check_accepted(in, &h);
		return;
	}
	CHECK(memchr(why, '\0', sizeof why) != NULL);
	CHECK(why[0] != '\0');

	/* A short reason buffer, sized exactly on the heap, is truncated and
	 * never overrun; the verdict does not depend on it. */
	size_t short_len = 1 + in[47] % 16;
	char *short_why = malloc(short_len);
	CHECK(short_why != NULL);
	memset(short_why, 0xa5, short_len);
	CHECK(wire_decode(in, &h, short_why, short_len) == rc);
	CHECK(memchr(short_why, '\0', short_len) != NULL);
	free(short_why);
}

/* Names of any type and dtype byte are strings; sizes are the known ones. */
static void fuzz_names(const uint8_t *data, size_t size)
{
	for (size_t i = 0; i < size && i < 8; i++) {
		CHECK(wire_type_name((int8_t)data[i]) != NULL);
		size_t s = unisum_dtype_size((unisum_dtype)data[i]);
		CHECK(s == 0 || s == 2 || s == 4 || s == 8);
		CHECK((s == 0) == (data[i] >= UNISUM_DTYPE_COUNT));
		CHECK(unisum_dtype_name((unisum_dtype)data[i]) != NULL);
	}
	if (size >= 4)
		CHECK(wire_type_name((int)le_bytes(data, 4)) != NULL);
}

/* ---- control payloads ---- */

/* A reader and the payload it was given, to check it against. */
struct checked_reader {
	struct wire_reader r;
	const uint8_t *start;	/* first byte of the payload */
	const uint8_t *end;	/* one past its last byte */
};

static void cr_init(struct checked_reader *c, const uint8_t *data, size_t len)
{
	wire_reader_init(&c->r, data, len);
	c->start = data;
	c->end = data + len;
	CHECK(!c->r.failed && c->r.p == data && c->r.left == len);
}

/* The reader's position stays inside the payload and agrees with left. */
static void cr_check_position(const struct checked_reader *c)
{
	CHECK(c->r.p >= c->start && c->r.p <= c->end);
	CHECK((size_t)(c->end - c->r.p) == c->r.left);
}

/* Bytes of the payload consumed so far. */
static size_t cr_consumed(const struct checked_reader *c)
{
	return (size_t)(c->r.p - c->start);
}

/* Checks one fixed-size read of n bytes that returned v. */
static void cr_check_fixed(const struct checked_reader *c, bool was_failed, const uint8_t *at, size_t left,
			   size_t n, uint64_t v)
{
	cr_check_position(c);
	if (!was_failed && left >= n) {
		CHECK(!c->r.failed);
		CHECK(c->r.p == at + n);
		CHECK(v == le_bytes(at, (int)n));
	} else {
		CHECK(c->r.failed);
		CHECK(c->r.p == at);
		CHECK(v == 0);
	}
}

static uint32_t cr_u32(struct checked_reader *c)
{
	bool was_failed = c->r.failed;
	const uint8_t *at = c->r.p;
	size_t left = c->r.left;
	uint32_t v = wire_read_u32(&c->r);
	cr_check_fixed(c, was_failed, at, left, 4, v);
	return v;
}

static uint64_t cr_u64(struct checked_reader *c)
{
	bool was_failed = c->r.failed;
	const uint8_t *at = c->r.p;
	size_t left = c->r.left;
	uint64_t v = wire_read_u64(&c->r);
	cr_check_fixed(c, was_failed, at, left, 8, v);
	return v;
}

/* Reads a string into out[dst_len] through a heap buffer of exactly
 * dst_len bytes, and checks the result against what the contract says. */
static void cr_str(struct checked_reader *c, char *out, size_t dst_len)
{
	char *dst = malloc(dst_len);
	CHECK(dst != NULL);
	memset(dst, 0xa5, dst_len);
	bool was_failed = c->r.failed;
	const uint8_t *at = c->r.p;
	size_t left = c->r.left;
	wire_read_str(&c->r, dst, dst_len);
	cr_check_position(c);
	CHECK(memchr(dst, '\0', dst_len) != NULL);

	bool fits = false;
	size_t n = 0;
	if (!was_failed && left >= 4) {
		n = (size_t)le_bytes(at, 4);
		fits = n < dst_len && n <= left - 4 && memchr(at + 4, '\0', n) == NULL;
	}
	if (fits) {
		CHECK(!c->r.failed);
		CHECK(c->r.p == at + 4 + n);
		CHECK(memcmp(dst, at + 4, n) == 0 && dst[n] == '\0');
	} else {
		CHECK(c->r.failed);
		CHECK(dst[0] == '\0');
	}
	memcpy(out, dst, dst_len);
	free(dst);
}

/* A payload that parsed, rebuilt with wire_buf, must be the bytes read. */
static void check_rebuilt(const struct wire_buf *b, const struct checked_reader *c)
{
	CHECK(!b->failed);
	CHECK(b->len == cr_consumed(c));
	CHECK(b->len == 0 || memcmp(b->data, c->start, b->len) == 0);
}

/* REGISTER (scheduler.c sched_on_register, client.c rdv_register):
 * u32 role, u32 requested rank (int32, -1 = any; a worker's machine),
 * u32 port, u32 local rank, u32 local size, str host, u32 pid,
 * str host_id (rdv_host_identity(), into 64 bytes like host).  A worker's
 * hello to a server (also REGISTER, server.c srv_on_hello) is read with
 * recv_payload, not wire_reader, and is not modelled here. */
static void parse_register(const uint8_t *data, size_t len)
{
	struct checked_reader c;
	cr_init(&c, data, len);
	uint32_t role = cr_u32(&c);
	int32_t req = (int32_t)cr_u32(&c);
	uint32_t port = cr_u32(&c);
	uint32_t local_rank = cr_u32(&c);
	uint32_t local_size = cr_u32(&c);
	char host[64], host_id[64];
	cr_str(&c, host, sizeof host);
	uint32_t pid = cr_u32(&c);
	cr_str(&c, host_id, sizeof host_id);
	if (c.r.failed)
		return;
	/* Five u32, host (length prefix and bytes), the pid, host_id. */
	CHECK(cr_consumed(&c) == 5 * 4 + 4 + strlen(host) + 4 + 4 + strlen(host_id));
	struct wire_buf b;
	wire_buf_init(&b);
	wire_buf_u32(&b, role);
	wire_buf_u32(&b, (uint32_t)req);
	wire_buf_u32(&b, port);
	wire_buf_u32(&b, local_rank);
	wire_buf_u32(&b, local_size);
	wire_buf_str(&b, host);
	wire_buf_u32(&b, pid);
	wire_buf_str(&b, host_id);
	check_rebuilt(&b, &c);
	wire_buf_fini(&b);
}

/* One node of an ADDRBOOK, as rendezvous.h's rdv_node keeps it. */
struct fuzz_node {
	uint32_t id, role, rank;
	int32_t machine;	/* -1 for servers */
	uint32_t local_rank, port;
	char host[64];
	uint32_t pid;
	char host_id[64];	/* rdv_host_identity() of the node */
};

/* ADDRBOOK (scheduler.c sched_send_addrbook, client.c rdv_register):
 * u32 id, u32 local size, u32 n, then n x {u32 id, role, rank,
 * machine (int32), local rank, port; str host; u32 pid; str host_id},
 * n in 1..RDV_MAX_NODES and
 * local size in 1..RDV_MAX_LOCAL_SIZE (the client rejects the rest before
 * reading an entry). */
static void parse_addrbook(const uint8_t *data, size_t len)
{
	struct checked_reader c;
	cr_init(&c, data, len);
	uint32_t me = cr_u32(&c);
	uint32_t local_size = cr_u32(&c);
	uint32_t n = cr_u32(&c);
	if (c.r.failed || n == 0 || n > RDV_MAX_NODES || local_size < 1 ||
	    local_size > RDV_MAX_LOCAL_SIZE)
		return;
	struct fuzz_node *nodes = calloc(n, sizeof *nodes);
	CHECK(nodes != NULL);
	/* The client reads all n entries; once the reader has failed every
	 * further read is a no-op, so one more entry after the failure is
	 * enough to check that the failure sticks. */
	uint32_t got = 0, after_failure = 0;
	size_t host_bytes = 0;	/* of host and host_id */
	for (uint32_t i = 0; i < n; i++) {
		struct fuzz_node *node = &nodes[i];
		node->id = cr_u32(&c);
		node->role = cr_u32(&c);
		node->rank = cr_u32(&c);
		node->machine = (int32_t)cr_u32(&c);
		node->local_rank = cr_u32(&c);
		node->port = cr_u32(&c);
		cr_str(&c, node->host, sizeof node->host);
		node->pid = cr_u32(&c);
		cr_str(&c, node->host_id, sizeof node->host_id);
		host_bytes += strlen(node->host) + strlen(node->host_id);
		got = i + 1;
		if (c.r.failed && ++after_failure > 1)
			break;
	}
	if (!c.r.failed) {
		CHECK(got == n);
		/* Three u32, then per entry six u32, host's length prefix, the
		 * pid and host_id's length prefix. */
		CHECK(cr_consumed(&c) == 3 * 4 + (size_t)n * (6 * 4 + 4 + 4 + 4) + host_bytes);
		struct wire_buf b;
		wire_buf_init(&b);
		wire_buf_u32(&b, me);
		wire_buf_u32(&b, local_size);
		wire_buf_u32(&b, n);
		for (uint32_t i = 0; i < n; i++) {
			wire_buf_u32(&b, nodes[i].id);
			wire_buf_u32(&b, nodes[i].role);
			wire_buf_u32(&b, nodes[i].rank);
			wire_buf_u32(&b, (uint32_t)nodes[i].machine);
			wire_buf_u32(&b, nodes[i].local_rank);
			wire_buf_u32(&b, nodes[i].port);
			wire_buf_str(&b, nodes[i].host);
			wire_buf_u32(&b, nodes[i].pid);
			wire_buf_str(&b, nodes[i].host_id);
		}
		check_rebuilt(&b, &c);
		wire_buf_fini(&b);
	}
	free(nodes);
}

/* DECLARE request (scheduler.c sched_on_declare): str name, u64 partition_bytes. */
static void parse_declare_request(const uint8_t *data, size_t len)
{
	struct checked_reader c;
	cr_init(&c, data, len);
	char name[256];
	cr_str(&c, name, sizeof name);
	uint64_t partition_bytes = cr_u64(&c);
	if (c.r.failed)
		return;
	struct wire_buf b;
	wire_buf_init(&b);
	wire_buf_str(&b, name);
	wire_buf_u64(&b, partition_bytes);
	check_rebuilt(&b, &c);
	wire_buf_fini(&b);
}

/* DECLARE_CHECK (conn.c srv_on_declare_check): str name, u32 n, n x u32
 * ranks, strictly increasing, at most the receiver's maximum (16 here),
 * then str spec (shorter than WIRE_SPEC_MAX), nothing after.
 * The model reads it field by field; the codec must accept exactly what
 * the model accepts, with the same fields, and re-encode to the input. */
static void parse_declare_check(const uint8_t *data, size_t len)
{
	enum { MAX = 16 };
	char name[256], got_name[256], spec[WIRE_SPEC_MAX], got_spec[WIRE_SPEC_MAX];
	int ranks[MAX], got[MAX], n = -1, got_n = -1;
	struct checked_reader c;
	cr_init(&c, data, len);
	cr_str(&c, name, sizeof name);
	uint32_t count = cr_u32(&c);
	bool ok = !c.r.failed && name[0] != '\0' && count <= MAX && c.r.left >= 4ull * count;
	for (uint32_t i = 0; ok && i < count; i++) {
		uint32_t r = cr_u32(&c);
		ok = r <= INT32_MAX && (i == 0 || (int)r > ranks[i - 1]);
		ranks[i] = (int)r;
	}
	if (ok) {
		cr_str(&c, spec, sizeof spec);
		ok = !c.r.failed && c.r.left == 0;
	}
	n = ok ? (int)count : -1;
	int rc = wire_declare_check_decode(data, len, got_name, sizeof got_name, got, MAX, &got_n,
					   got_spec, sizeof got_spec);
	CHECK((rc == 0) == ok);
	if (!ok)
		return;
	CHECK(got_n == n && strcmp(got_name, name) == 0 && strcmp(got_spec, spec) == 0);
	CHECK(n == 0 || memcmp(got, ranks, (size_t)n * sizeof *ranks) == 0);
	struct wire_buf b;
	wire_buf_init(&b);
	wire_declare_check_encode(&b, name, ranks, n, spec);
	check_rebuilt(&b, &c);
	wire_buf_fini(&b);
}

/* ANNOUNCE (scheduler.c sched_on_announce, client.c): str name, u32
 * ndim (at most RDV_MAX_DIMS), ndim x u64, u64 key, nothing after; what
 * the codec takes re-encodes to the same bytes. */
static void parse_announce(const uint8_t *data, size_t len)
{
	struct checked_reader c;
	cr_init(&c, data, len);
	char name[256];
	cr_str(&c, name, sizeof name);
	uint32_t ndim = cr_u32(&c);
	bool ok = !c.r.failed && name[0] != '\0' && ndim <= RDV_MAX_DIMS && c.r.left == 8ull * ndim + 8;
	struct wire_hdr h = {.dtype = UNISUM_INT32, .count = 3, .round = 9, .aux = 1, .key = 5};
	struct rdv_announce a;
	int rc = rdv_announce_decode(&h, data, len, &a);
	CHECK((rc == 0) == ok);
	if (!ok)
		return;
	for (uint32_t i = 0; i < ndim; i++)
		CHECK(a.shape.dims[i] == cr_u64(&c));
	CHECK(a.key == cr_u64(&c));
	CHECK(strcmp(a.name, name) == 0 && a.shape.ndim == ndim && a.count == 3 && a.round == 9 &&
	      a.life == 5);
	struct wire_buf b;
	struct wire_hdr out = {0};
	wire_buf_init(&b);
	rdv_announce_encode(&a, &out, &b);
	check_rebuilt(&b, &c);
	wire_buf_fini(&b);
}

/* FAILOVER (client.c, worker's failover.c): u32 n, n x {u64 key, u32
 * server}, nothing after; what the codec takes re-encodes to the same
 * bytes. */
static void parse_failover(const uint8_t *data, size_t len)
{
	struct checked_reader c;
	cr_init(&c, data, len);
	uint32_t n = cr_u32(&c);
	bool ok = !c.r.failed && c.r.left == 12ull * n;
	struct wire_hdr h = {.type = WIRE_FAILOVER, .round = 3, .aux = 2};
	struct rdv_failover f;
	int rc = rdv_failover_decode(&h, data, len, &f);
	CHECK(rc == 0 ? ok : !ok || rc == UNISUM_ENOMEM);
	if (rc != 0)
		return;
	CHECK(f.n == n && f.number == 3 && f.dead == 2);
	for (uint32_t i = 0; i < n; i++) {
		CHECK(f.keys[i] == cr_u64(&c));
		CHECK(f.servers[i] == cr_u32(&c));
	}
	struct wire_buf b;
	struct wire_hdr out = {0};
	wire_buf_init(&b);
	rdv_failover_encode(&f, &out, &b);
	check_rebuilt(&b, &c);
	wire_buf_fini(&b);
	free(f.keys);
	free(f.servers);
}

/* DECLARE reply (client.c rdv_client_declare): u32 status, then str why
 * when it is not 0, or u32 nparts and nparts x (u64 count, u32 server);
 * the client reads the parts only when exactly that many bytes are left. */
static void parse_declare_reply(const uint8_t *data, size_t len)
{
	struct checked_reader c;
	cr_init(&c, data, len);
	int32_t status = (int32_t)cr_u32(&c);
	if (status != 0) {
		char why[256];
		cr_str(&c, why, sizeof why);
		return;
	}
	uint32_t nparts = cr_u32(&c);
	if (c.r.failed || nparts > PLACEMENT_MAX_PARTS || c.r.left != (size_t)nparts * 12)
		return;
	uint64_t total = 0;
	for (uint32_t i = 0; i < nparts; i++) {
		total += cr_u64(&c);
		cr_u32(&c);
	}
	CHECK(!c.r.failed);
	CHECK(cr_consumed(&c) == 8 + 12 * (size_t)nparts);
	(void)total;
}

/* ERROR (worker.c, client.c, scheduler.c): str text, into the sizes those
 * callers use. */
static void parse_error(const uint8_t *data, size_t len, size_t text_len)
{
	struct checked_reader c;
	cr_init(&c, data, len);
	char *text = malloc(text_len);
	CHECK(text != NULL);
	cr_str(&c, text, text_len);
	if (!c.r.failed) {
		struct wire_buf b;
		wire_buf_init(&b);
		wire_buf_str(&b, text);
		check_rebuilt(&b, &c);
		wire_buf_fini(&b);
	}
	free(text);
}

/* Strings back to back into destinations of boundary sizes, to hit
 * length == size - 1, == size and == size + 1 for small sizes. */
static void parse_strings(const uint8_t *data, size_t len)
{
	static const size_t sizes[] = {1, 2, 3, 4, 5, 8, 16, 17, 63, 64, 65, 256};
	struct checked_reader c;
	cr_init(&c, data, len);
	for (size_t i = 0; i < 64 && !c.r.failed; i++) {
		size_t dst_len = sizes[i % (sizeof sizes / sizeof sizes[0])];
		char *out = malloc(dst_len);
		CHECK(out != NULL);
		cr_str(&c, out, dst_len);
		free(out);
	}
	/* and one read after the failure, which must fail too */
	char tail[8];
	cr_str(&c, tail, sizeof tail);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const uint8_t *payload = data;
	size_t payload_len = size;
	if (size >= WIRE_HDR_SIZE) {
		fuzz_header(data);
		payload = data + WIRE_HDR_SIZE;
		payload_len = size - WIRE_HDR_SIZE;
	}
	fuzz_names(data, size);

	/* The payload ends where libFuzzer's buffer ends, so AddressSanitizer
	 * also catches a read one byte past it. */
	parse_register(payload, payload_len);
	parse_addrbook(payload, payload_len);
	parse_declare_request(payload, payload_len);
	parse_declare_check(payload, payload_len);
	parse_announce(payload, payload_len);
	parse_failover(payload, payload_len);
	parse_declare_reply(payload, payload_len);
	parse_error(payload, payload_len, 400);
	parse_error(payload, payload_len, 512);
	parse_strings(payload, payload_len);
	return 0;
}
