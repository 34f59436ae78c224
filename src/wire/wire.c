/*
 * wire.c - header codec and control-payload helpers (see wire.h).
 * Byte order is spelled out byte by byte, so the codec is the same on any
 * host and never reads an unaligned field.
 */
#include "reducer/reducer.h"
#include "wire/wire.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void put16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
}

static void put32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static void put64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static uint16_t get16(const uint8_t *p)
{
	return (uint16_t)(p[0] | (p[1] << 8));
}

static uint32_t get32(const uint8_t *p)
{
	uint32_t v = 0;
	for (int i = 0; i < 4; i++)
		v |= (uint32_t)p[i] << (8 * i);
	return v;
}

static uint64_t get64(const uint8_t *p)
{
	uint64_t v = 0;
	for (int i = 0; i < 8; i++)
		v |= (uint64_t)p[i] << (8 * i);
	return v;
}

void wire_encode(const struct wire_hdr *h, uint8_t out[WIRE_HDR_SIZE])
{
	memset(out, 0, WIRE_HDR_SIZE);
	put32(out + 0, WIRE_MAGIC);
	out[4] = WIRE_VERSION;
	out[5] = h->type;
	put16(out + 6, h->flags);
	put32(out + 8, h->sender);
	put32(out + 12, h->round);
	put64(out + 16, h->key);
	put64(out + 24, h->count);
	put64(out + 32, h->payload_len);
	out[40] = h->dtype;
	put32(out + 44, h->aux);
}

static const char *const wire_type_names[] = {
	[WIRE_REGISTER] = "REGISTER",	  [WIRE_ADDRBOOK] = "ADDRBOOK",
	[WIRE_BARRIER] = "BARRIER",	  [WIRE_BARRIER_DONE] = "BARRIER_DONE",
	[WIRE_HEARTBEAT] = "HEARTBEAT",	  [WIRE_PUSH] = "PUSH",
	[WIRE_PUSH_ACK] = "PUSH_ACK",	  [WIRE_PULL] = "PULL",
	[WIRE_PULL_REPLY] = "PULL_REPLY", [WIRE_DECLARE_CHECK] = "DECLARE_CHECK",
	[WIRE_ERROR] = "ERROR",		  [WIRE_SHUTDOWN] = "SHUTDOWN",
	[WIRE_DECLARE] = "DECLARE",	  [WIRE_TUNE] = "TUNE",
	[WIRE_RETIRE] = "RETIRE",	  [WIRE_JOIN] = "JOIN",
	[WIRE_ANNOUNCE] = "ANNOUNCE",	  [WIRE_JOIN_DONE] = "JOIN_DONE",
	[WIRE_FAILOVER] = "FAILOVER",	  [WIRE_RESTORE] = "RESTORE",
	[WIRE_REJOIN] = "REJOIN",	  [WIRE_MIGRATE] = "MIGRATE",
	[WIRE_MOVED] = "MOVED",		  [WIRE_REFORM] = "REFORM",
	[WIRE_RESIZE] = "RESIZE",
	[WIRE_HELD] = "HELD",		  [WIRE_COPY] = "COPY",
	[WIRE_COPY_ACK] = "COPY_ACK",
};

const char *wire_type_name(int type)
{
	if (type < 1 || type > WIRE_TYPE_MAX)
		return "unknown";
	return wire_type_names[type];
}

static size_t dtype_bytes(uint8_t dtype)
{
	return unisum_dtype_size((unisum_dtype)dtype);
}

/* Whether the type carries a tensor dtype that must be valid. */
static bool type_has_dtype(uint8_t type)
{
	return type == WIRE_PUSH || type == WIRE_PULL || type == WIRE_PULL_REPLY ||
	       type == WIRE_RESTORE || type == WIRE_DECLARE_CHECK || type == WIRE_DECLARE ||
	       type == WIRE_ANNOUNCE || type == WIRE_HELD || type == WIRE_COPY;
}

/* A data message's payload (PUSH, PULL_REPLY): count x dtype bytes, the
 * 8-byte address with IPC, nothing with ZERO; never over 1 GiB. */
static int wire_check_data(const struct wire_hdr *h, char *why, size_t why_len)
{
	uint64_t want = 0;
	if (h->flags & WIRE_FLAG_COMPRESSED) {
		/* The exact length is the key's codec's: the receiver checks it. */
		if (h->dtype != UNISUM_FLOAT32 || h->count > WIRE_MAX_DATA_PAYLOAD / 4 ||
		    h->payload_len == 0 || h->payload_len > WIRE_COMPRESSED_MAX(h->count) ||
		    h->payload_len > WIRE_MAX_DATA_PAYLOAD) {
			snprintf(why, why_len, "%s: a compressed payload of %llu bytes for %llu %s "
				 "elements (float32 only, 1 to %llu bytes)", wire_type_name(h->type),
				 (unsigned long long)h->payload_len, (unsigned long long)h->count,
				 unisum_dtype_name(h->dtype),
				 (unsigned long long)WIRE_COMPRESSED_MAX(h->count));
			return UNISUM_EPROTO;
		}
		return 0;
	}
	if (!(h->flags & (WIRE_FLAG_ZERO | WIRE_FLAG_SKIP))) {
		if (h->count > WIRE_MAX_DATA_PAYLOAD / dtype_bytes(h->dtype)) {
			snprintf(why, why_len, "%s: %llu elements exceed the 1 GiB limit",
				 wire_type_name(h->type), (unsigned long long)h->count);
			return UNISUM_EPROTO;
		}
		want = h->flags & WIRE_FLAG_IPC ? WIRE_IPC_PAYLOAD : h->count * dtype_bytes(h->dtype);
	}
	if (h->payload_len != want && (h->flags & WIRE_FLAG_IPC)) {
		snprintf(why, why_len, "%s: an IPC payload is %u bytes (an address and a guard), got %llu bytes",
			 wire_type_name(h->type), WIRE_IPC_PAYLOAD, (unsigned long long)h->payload_len);
		return UNISUM_EPROTO;
	}
	if (h->payload_len != want) {
		snprintf(why, why_len, "%s: payload of %llu bytes, but %llu %s elements need %llu",
			 wire_type_name(h->type), (unsigned long long)h->payload_len,
			 (unsigned long long)h->count, unisum_dtype_name(h->dtype), (unsigned long long)want);
		return UNISUM_EPROTO;
	}
	return 0;
}

/* A compressed key's COPY: count float32s of error feedback, then the
 * round's encoding (its exact length is the key's codec's: the receiver
 * checks it; none: the round summed to ZERO); no contributors. */
static int wire_check_copy_compressed(const struct wire_hdr *h, char *why, size_t why_len)
{
	uint64_t feedback = h->count * 4ull;
	if (h->dtype != UNISUM_FLOAT32 || h->aux != 0 || h->count == 0 ||
	    h->count > WIRE_MAX_DATA_PAYLOAD / 4 || h->payload_len > WIRE_MAX_DATA_PAYLOAD ||
	    h->payload_len < feedback || h->payload_len - feedback > WIRE_COMPRESSED_MAX(h->count)) {
		snprintf(why, why_len, "COPY of a compressed key: a payload of %llu bytes for %llu "
			 "%s elements and %u contributors", (unsigned long long)h->payload_len,
			 (unsigned long long)h->count, unisum_dtype_name(h->dtype), h->aux);
		return UNISUM_EPROTO;
	}
	return 0;
}

/* A COPY: the value (count x dtype) and aux u32s, or nothing with count
 * 0 (forget the key); aux at most WIRE_COPY_MAX_CONTRIB, the whole at
 * most a data payload.  COMPRESSED: a compressed key's (above). */
static int wire_check_copy(const struct wire_hdr *h, char *why, size_t why_len)
{
	uint64_t want = 0;
	if (h->flags & WIRE_FLAG_COMPRESSED)
		return wire_check_copy_compressed(h, why, why_len);
	if (h->count > WIRE_MAX_DATA_PAYLOAD / dtype_bytes(h->dtype) ||
	    h->aux > WIRE_COPY_MAX_CONTRIB ||
	    h->count * dtype_bytes(h->dtype) + 4ull * h->aux > WIRE_MAX_DATA_PAYLOAD) {
		snprintf(why, why_len, "COPY: %llu elements and %u contributors exceed the limits",
			 (unsigned long long)h->count, h->aux);
		return UNISUM_EPROTO;
	}
	if (h->count > 0)
		want = h->count * dtype_bytes(h->dtype) + 4ull * h->aux;
	if (h->payload_len != want) {
		snprintf(why, why_len, "COPY: payload of %llu bytes, but %llu %s elements and %u "
			 "contributors need %llu", (unsigned long long)h->payload_len,
			 (unsigned long long)h->count, unisum_dtype_name(h->dtype), h->aux,
			 (unsigned long long)want);
		return UNISUM_EPROTO;
	}
	return 0;
}

/* The payload's length for the message's type. */
static int wire_check_payload(const struct wire_hdr *h, char *why, size_t why_len)
{
	switch (h->type) {
	case WIRE_PUSH:
	case WIRE_PULL_REPLY:
	case WIRE_RESTORE:
		return wire_check_data(h, why, why_len);
	case WIRE_COPY:
		return wire_check_copy(h, why, why_len);
	case WIRE_PULL:
	case WIRE_BARRIER:
	case WIRE_BARRIER_DONE:
	case WIRE_PUSH_ACK:
	case WIRE_RETIRE:
	case WIRE_JOIN:
	case WIRE_JOIN_DONE:
	case WIRE_MOVED:
	case WIRE_RESIZE:
	case WIRE_COPY_ACK:
		if (h->payload_len != 0) {
			snprintf(why, why_len, "%s: carries no payload, got %llu bytes",
				 wire_type_name(h->type), (unsigned long long)h->payload_len);
			return UNISUM_EPROTO;
		}
		return 0;
	default:
		if (h->payload_len > WIRE_MAX_CONTROL_PAYLOAD) {
			snprintf(why, why_len, "%s: payload of %llu bytes exceeds the %u-byte control limit",
				 wire_type_name(h->type), (unsigned long long)h->payload_len,
				 WIRE_MAX_CONTROL_PAYLOAD);
			return UNISUM_EPROTO;
		}
		return 0;
	}
}

int wire_decode(const uint8_t in[WIRE_HDR_SIZE], struct wire_hdr *h, char *why, size_t why_len)
{
	uint32_t magic = get32(in);
	if (magic != WIRE_MAGIC) {
		snprintf(why, why_len, "bad magic 0x%08x (not a unisum peer?)", magic);
		return UNISUM_EPROTO;
	}
	if (in[4] != WIRE_VERSION) {
		snprintf(why, why_len, "protocol version %u, this build speaks %u", in[4], WIRE_VERSION);
		return UNISUM_EPROTO;
	}
	h->type = in[5];
	h->flags = get16(in + 6);
	h->sender = get32(in + 8);
	h->round = get32(in + 12);
	h->key = get64(in + 16);
	h->count = get64(in + 24);
	h->payload_len = get64(in + 32);
	h->dtype = in[40];
	h->aux = get32(in + 44);

	if (h->type < 1 || h->type > WIRE_TYPE_MAX) {
		snprintf(why, why_len, "unknown message type %u", h->type);
		return UNISUM_EPROTO;
	}
	if (in[41] != 0 || in[42] != 0 || in[43] != 0) {
		snprintf(why, why_len, "%s: reserved header bytes are not zero", wire_type_name(h->type));
		return UNISUM_EPROTO;
	}
	uint16_t data = WIRE_FLAG_ZERO | WIRE_FLAG_IPC | WIRE_FLAG_COMPRESSED;
	uint16_t allowed = h->type == WIRE_PUSH		? data | WIRE_FLAG_PULL
			   : h->type == WIRE_PULL_REPLY ? data | WIRE_FLAG_SKIP
			   : h->type == WIRE_PULL	? WIRE_FLAG_SKIP
			   : h->type == WIRE_RESTORE ? WIRE_FLAG_COMPRESSED | WIRE_FLAG_PUSHED |
							       WIRE_FLAG_ZERO
			   : h->type == WIRE_COPY	? WIRE_FLAG_COMPRESSED
							: 0;
	int nflags = !!(h->flags & WIRE_FLAG_ZERO) + !!(h->flags & WIRE_FLAG_IPC) +
		     !!(h->flags & WIRE_FLAG_SKIP) + !!(h->flags & WIRE_FLAG_COMPRESSED);
	/* A RESTORE's ZERO is a pushed one's; PUSHED is a raw key's. */
	bool pushed = (h->flags & WIRE_FLAG_PUSHED) != 0;
	if ((h->flags & ~allowed) != 0 || nflags > 1 ||
	    (h->type == WIRE_RESTORE && (h->flags & WIRE_FLAG_ZERO) && !pushed) ||
	    (pushed && (h->flags & WIRE_FLAG_COMPRESSED))) {
		snprintf(why, why_len, "%s: unknown flags 0x%x", wire_type_name(h->type), h->flags);
		return UNISUM_EPROTO;
	}
	if (type_has_dtype(h->type) ? h->dtype >= UNISUM_DTYPE_COUNT : h->dtype != 0) {
		snprintf(why, why_len, "%s: invalid dtype %u", wire_type_name(h->type), h->dtype);
		return UNISUM_EPROTO;
	}

	/* A PUSH's collective, and a pushed RESTORE's (the push's). */
	bool push = h->type == WIRE_PUSH || pushed;
	if (push && (WIRE_OP_KIND(h->aux) > WIRE_OP_KIND_MAX ||
		     (!wire_op_has_root(h->aux) && WIRE_OP_ROOT(h->aux) != 0))) {
		snprintf(why, why_len, "%s: unknown collective 0x%x", wire_type_name(h->type), h->aux);
		return UNISUM_EPROTO;
	}
	if (push && (h->flags & WIRE_FLAG_ZERO) && wire_op_reduction(h->aux) != REDUCER_BOR &&
	    WIRE_OP_KIND(h->aux) != WIRE_OP_BROADCAST) {
		char what[64];
		snprintf(why, why_len, "%s: %s takes no ZERO contribution", wire_type_name(h->type),
			 wire_op_describe(h->aux, what, sizeof what));
		return UNISUM_EPROTO;
	}

	return wire_check_payload(h, why, why_len);
}

/* The decimal number text[0..] (digits only, at least one), or -1 when
 * it is not one or exceeds max. */
static long long wire_parse_bounded(const char *text, unsigned long long max)
{
	if (*text < '0' || *text > '9')
		return -1;
	unsigned long long v = 0;
	for (const char *p = text; *p; p++)
		if (*p < '0' || *p > '9' || (v = v * 10 + (unsigned)(*p - '0')) > max)
			return -1;
	return (long long)v;
}

int wire_sync_parse(const char *text, uint32_t *aux, int *group)
{
	if (text == NULL)
		return -1;
	*group = 0;
	if (strncmp(text, "dssync:", 7) == 0) {
		long long g = wire_parse_bounded(text + 7, 65535);
		if (g < 1)
			return -1;
		*aux = WIRE_SYNC(WIRE_SYNC_LOCKSTEP, 0);
		*group = (int)g;
		return 0;
	}
	if (strcmp(text, "sync") == 0) {
		*aux = WIRE_SYNC(WIRE_SYNC_LOCKSTEP, 0);
		return 0;
	}
	if (strcmp(text, "async") == 0) {
		*aux = WIRE_SYNC(WIRE_SYNC_ASYNC, 0);
		return 0;
	}
	long long s = strncmp(text, "ssp:", 4) == 0
			      ? wire_parse_bounded(text + 4, WIRE_SYNC_MAX_STALENESS)
			      : -1;
	if (s < 0)
		return -1;
	*aux = WIRE_SYNC(WIRE_SYNC_SSP, (uint32_t)s);
	return 0;
}

bool wire_op_has_root(uint32_t op)
{
	uint32_t k = WIRE_OP_KIND(op);
	return k == WIRE_OP_BROADCAST || k == WIRE_OP_ALLGATHER || k == WIRE_OP_ALLTOALL ||
	       k == WIRE_OP_REDUCESCATTER || k == WIRE_OP_REDUCESCATTER_AVERAGE;
}

int wire_op_reduction(uint32_t op)
{
	switch (WIRE_OP_KIND(op)) {
	case WIRE_OP_MIN:
		return REDUCER_MIN;
	case WIRE_OP_MAX:
		return REDUCER_MAX;
	case WIRE_OP_PRODUCT:
		return REDUCER_PRODUCT;
	case WIRE_OP_ALLGATHER:
	case WIRE_OP_ALLTOALL:
		return REDUCER_BOR;
	default:
		return REDUCER_SUM;	/* sum, average, broadcast (the others push ZERO), reduce-scatter */
	}
}

const char *wire_op_describe(uint32_t op, char *buf, size_t len)
{
	switch (WIRE_OP_KIND(op)) {
	case WIRE_OP_SUM:
		snprintf(buf, len, "a sum");
		break;
	case WIRE_OP_AVERAGE:
		snprintf(buf, len, "an average");
		break;
	case WIRE_OP_BROADCAST:
		snprintf(buf, len, "a broadcast from root %u", WIRE_OP_ROOT(op));
		break;
	case WIRE_OP_MIN:
		snprintf(buf, len, "a min");
		break;
	case WIRE_OP_MAX:
		snprintf(buf, len, "a max");
		break;
	case WIRE_OP_PRODUCT:
		snprintf(buf, len, "a product");
		break;
	case WIRE_OP_ALLGATHER:
		snprintf(buf, len, "an allgather of layout 0x%06x", WIRE_OP_ROOT(op));
		break;
	case WIRE_OP_ALLTOALL:
		snprintf(buf, len, "an alltoall of layout 0x%06x", WIRE_OP_ROOT(op));
		break;
	case WIRE_OP_REDUCESCATTER:
		snprintf(buf, len, "a reduce-scatter (sum) of layout 0x%06x", WIRE_OP_ROOT(op));
		break;
	case WIRE_OP_REDUCESCATTER_AVERAGE:
		snprintf(buf, len, "a reduce-scatter (average) of layout 0x%06x", WIRE_OP_ROOT(op));
		break;
	default:
		snprintf(buf, len, "an unknown collective 0x%x", op);
	}
	return buf;
}

int wire_error_build(struct wire_hdr *h, struct wire_buf *b, int err, const char *why)
{
	wire_buf_str(b, why);
	h->type = WIRE_ERROR;
	h->aux = (uint32_t)-err;
	h->payload_len = b->len;
	return b->failed ? UNISUM_ENOMEM : 0;
}

int wire_error_decode(const void *payload, size_t len, char *why, size_t why_len)
{
	struct wire_reader r;
	wire_reader_init(&r, payload, len);
	char text[1024];
	wire_read_str(&r, text, sizeof text);
	if (r.failed || r.left != 0) {
		snprintf(why, why_len, "(a malformed error message)");
		return UNISUM_EPROTO;
	}
	snprintf(why, why_len, "%s", text);
	return 0;
}

void wire_declare_check_encode(struct wire_buf *b, const char *name, const int *members, int n,
			       const char *spec)
{
	wire_buf_str(b, name);
	wire_buf_u32(b, (uint32_t)n);
	for (int i = 0; i < n; i++)
		wire_buf_u32(b, (uint32_t)members[i]);
	wire_buf_str(b, spec != NULL ? spec : "");
}

int wire_declare_check_decode(const void *payload, size_t len, char *name, size_t name_len,
			      int *members, int max_members, int *n, char *spec, size_t spec_len)
{
	struct wire_reader r;
	wire_reader_init(&r, payload, len);
	wire_read_str(&r, name, name_len);
	uint32_t count = wire_read_u32(&r);
	if (r.failed || name[0] == '\0' || count > (uint32_t)max_members || r.left < 4ull * count)
		return UNISUM_EPROTO;
	for (uint32_t i = 0; i < count; i++) {
		uint32_t m = wire_read_u32(&r);
		/* Strictly increasing: a set is its sorted ranks, each once. */
		if (m > INT32_MAX || (i > 0 && m <= (uint32_t)members[i - 1]))
			return UNISUM_EPROTO;
		members[i] = (int)m;
	}
	wire_read_str(&r, spec, spec_len);
	if (r.failed || r.left != 0)
		return UNISUM_EPROTO;
	*n = (int)count;
	return 0;
}

void wire_buf_init(struct wire_buf *b)
{
	memset(b, 0, sizeof *b);
}

void wire_buf_fini(struct wire_buf *b)
{
	free(b->data);
	memset(b, 0, sizeof *b);
}

static uint8_t *wire_buf_grow(struct wire_buf *b, size_t n)
{
	if (b->failed)
		return NULL;
	if (b->len + n > b->cap) {
		size_t cap = b->cap ? b->cap * 2 : 256;
		while (cap < b->len + n)
			cap *= 2;
		uint8_t *p = realloc(b->data, cap);
		if (p == NULL) {
			b->failed = true;
			return NULL;
		}
		b->data = p;
		b->cap = cap;
	}
	uint8_t *at = b->data + b->len;
	b->len += n;
	return at;
}

void wire_buf_u32(struct wire_buf *b, uint32_t v)
{
	uint8_t *p = wire_buf_grow(b, 4);
	if (p != NULL)
		put32(p, v);
}

void wire_buf_u64(struct wire_buf *b, uint64_t v)
{
	uint8_t *p = wire_buf_grow(b, 8);
	if (p != NULL)
		put64(p, v);
}

void wire_buf_bytes(struct wire_buf *b, const void *src, size_t n)
{
	uint8_t *p = wire_buf_grow(b, n);
	if (p != NULL && n > 0)
		memcpy(p, src, n);
}

void wire_buf_str(struct wire_buf *b, const char *s)
{
	size_t n = strlen(s);
	wire_buf_u32(b, (uint32_t)n);
	wire_buf_bytes(b, s, n);
}

void wire_reader_init(struct wire_reader *r, const void *data, size_t len)
{
	r->p = data;
	r->left = len;
	r->failed = false;
}

static const uint8_t *wire_read_bytes(struct wire_reader *r, size_t n)
{
	if (r->failed || r->left < n) {
		r->failed = true;
		return NULL;
	}
	const uint8_t *at = r->p;
	r->p += n;
	r->left -= n;
	return at;
}

uint32_t wire_read_u32(struct wire_reader *r)
{
	const uint8_t *p = wire_read_bytes(r, 4);
	return p ? get32(p) : 0;
}

uint64_t wire_read_u64(struct wire_reader *r)
{
	const uint8_t *p = wire_read_bytes(r, 8);
	return p ? get64(p) : 0;
}

void wire_read_str(struct wire_reader *r, char *dst, size_t dst_len)
{
	dst[0] = '\0';
	uint32_t n = wire_read_u32(r);
	if (r->failed)
		return;
	if (n >= dst_len) {
		r->failed = true;
		return;
	}
	const uint8_t *p = wire_read_bytes(r, n);
	if (p == NULL)
		return;
	if (memchr(p, '\0', n) != NULL) {
		r->failed = true;
		return;
	}
	memcpy(dst, p, n);
	dst[n] = '\0';
}
