/*
 * test_proto.c - every control payload's codec: what one side encodes the
 * other decodes unchanged, and a payload cut short, with a byte too many
 * or with a string that does not fit is refused (src/rendezvous/proto.c,
 * and ERROR and DECLARE_CHECK in src/wire/wire.c).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "config/config.h"
#include "rendezvous/rdv_proto.h"
#include "wire/wire.h"

/* Every prefix of the payload, and the payload plus one byte, must be
 * refused by decode (a function of payload and length returning 0 or an
 * error). */
typedef int (*decode_fn)(const void *payload, size_t len);

static void refuses_every_cut(const struct wire_buf *b, decode_fn decode)
{
	for (size_t n = 0; n < b->len; n++)
		assert_int_not_equal(decode(b->data, n), 0);
	uint8_t *more = calloc(b->len + 1, 1);
	assert_non_null(more);
	memcpy(more, b->data, b->len);
	assert_int_not_equal(decode(more, b->len + 1), 0);
	free(more);
	assert_int_equal(decode(b->data, b->len), 0);
}

static int decode_error(const void *p, size_t len)
{
	char why[256];
	return wire_error_decode(p, len, why, sizeof why);
}

static void test_error(void **state)
{
	(void)state;
	struct wire_buf b;
	wire_buf_init(&b);
	struct wire_hdr h = {.key = 0x70000, .round = 9};
	assert_int_equal(wire_error_build(&h, &b, UNISUM_EMISMATCH, "tensor 'w' differs"), 0);
	assert_int_equal(h.type, WIRE_ERROR);
	assert_int_equal((int)-h.aux, UNISUM_EMISMATCH);
	assert_int_equal(h.payload_len, b.len);
	assert_true(h.key == 0x70000 && h.round == 9);
	char why[64];
	assert_int_equal(wire_error_decode(b.data, b.len, why, sizeof why), 0);
	assert_string_equal(why, "tensor 'w' differs");
	/* A long text is cut to the caller's buffer, not refused. */
	char small[8];
	assert_int_equal(wire_error_decode(b.data, b.len, small, sizeof small), 0);
	assert_string_equal(small, "tensor ");
	refuses_every_cut(&b, decode_error);
	wire_buf_fini(&b);
}

static int decode_declare_check(const void *p, size_t len)
{
	char name[256], spec[WIRE_SPEC_MAX];
	int ranks[8], n;
	return wire_declare_check_decode(p, len, name, sizeof name, ranks, 8, &n, spec, sizeof spec);
}

static void test_declare_check(void **state)
{
	(void)state;
	struct wire_buf b;
	char name[256], spec[WIRE_SPEC_MAX] = "x";
	int ranks[8], n = -1;
	/* The global set. */
	wire_buf_init(&b);
	wire_declare_check_encode(&b, "layer1.weight@65536", NULL, 0, NULL);
	assert_int_equal(wire_declare_check_decode(b.data, b.len, name, sizeof name, ranks, 8, &n,
						   spec, sizeof spec), 0);
	assert_string_equal(name, "layer1.weight@65536");
	assert_string_equal(spec, "");
	assert_int_equal(n, 0);
	refuses_every_cut(&b, decode_declare_check);
	wire_buf_fini(&b);
	/* A process set: its ranks come back, and every cut is refused. */
	const int set[3] = {0, 2, 5};
	wire_buf_init(&b);
	wire_declare_check_encode(&b, "set:00ff/grad", set, 3, "onebit,ef=vanilla");
	assert_int_equal(wire_declare_check_decode(b.data, b.len, name, sizeof name, ranks, 8, &n,
						   spec, sizeof spec), 0);
	assert_string_equal(spec, "onebit,ef=vanilla");
	assert_int_equal(n, 3);
	assert_memory_equal(ranks, set, sizeof set);
	refuses_every_cut(&b, decode_declare_check);
	/* More ranks than the receiver allows. */
	assert_int_equal(wire_declare_check_decode(b.data, b.len, name, sizeof name, ranks, 2, &n,
						   spec, sizeof spec),
			 UNISUM_EPROTO);
	/* A spec longer than the receiver takes. */
	assert_int_equal(wire_declare_check_decode(b.data, b.len, name, sizeof name, ranks, 8, &n,
						   spec, 8),
			 UNISUM_EPROTO);
	wire_buf_fini(&b);
	/* Ranks out of order, or twice. */
	const int unsorted[2] = {3, 1}, twice[2] = {1, 1};
	wire_buf_init(&b);
	wire_declare_check_encode(&b, "g", unsorted, 2, NULL);
	assert_int_equal(wire_declare_check_decode(b.data, b.len, name, sizeof name, ranks, 8, &n,
						   spec, sizeof spec),
			 UNISUM_EPROTO);
	wire_buf_fini(&b);
	wire_buf_init(&b);
	wire_declare_check_encode(&b, "g", twice, 2, NULL);
	assert_int_equal(wire_declare_check_decode(b.data, b.len, name, sizeof name, ranks, 8, &n,
						   spec, sizeof spec),
			 UNISUM_EPROTO);
	wire_buf_fini(&b);
	/* An empty name. */
	wire_buf_init(&b);
	wire_declare_check_encode(&b, "", NULL, 0, NULL);
	assert_int_equal(wire_declare_check_decode(b.data, b.len, name, sizeof name, ranks, 8, &n,
						   spec, sizeof spec),
			 UNISUM_EPROTO);
	wire_buf_fini(&b);
}

static struct wire_hdr announce_hdr;

static int decode_announce(const void *p, size_t len)
{
	struct rdv_announce a;
	return rdv_announce_decode(&announce_hdr, p, len, &a);
}

static void test_announce(void **state)
{
	(void)state;
	struct rdv_announce a = {.dtype = UNISUM_FLOAT16, .count = 42, .round = 7,
				 .wire_op = 1, .life = 0xabcd0000, .key = 0x1234567890abcdefull, .shape = {.ndim = 2, .dims = {6, 7}}},
			    got;
	snprintf(a.name, sizeof a.name, "gradient.layer1.weight");
	struct wire_buf b;
	wire_buf_init(&b);
	memset(&announce_hdr, 0, sizeof announce_hdr);
	rdv_announce_encode(&a, &announce_hdr, &b);
	assert_int_equal(announce_hdr.type, WIRE_ANNOUNCE);
	assert_int_equal(announce_hdr.payload_len, b.len);
	assert_int_equal(rdv_announce_decode(&announce_hdr, b.data, b.len, &got), 0);
	assert_string_equal(got.name, a.name);
	assert_int_equal(got.dtype, a.dtype);
	assert_int_equal(got.count, 42);
	assert_int_equal(got.round, 7);
	assert_int_equal(got.wire_op, 1);
	assert_int_equal(got.life, 0xabcd0000);
	assert_int_equal(announce_hdr.key, 0xabcd0000);
	assert_true(got.key == 0x1234567890abcdefull);
	assert_int_equal(got.shape.ndim, 2);
	assert_int_equal(got.shape.dims[1], 7);
	refuses_every_cut(&b, decode_announce);
	wire_buf_fini(&b);
	/* More than RDV_MAX_DIMS dimensions. */
	wire_buf_init(&b);
	wire_buf_str(&b, "x");
	wire_buf_u32(&b, RDV_MAX_DIMS + 1);
	for (int i = 0; i <= RDV_MAX_DIMS; i++)
		wire_buf_u64(&b, 1);
	assert_int_equal(rdv_announce_decode(&announce_hdr, b.data, b.len, &got), UNISUM_EPROTO);
	wire_buf_fini(&b);
}

static int decode_register(const void *p, size_t len)
{
	struct rdv_register m;
	return rdv_register_decode(p, len, &m);
}

static void test_register(void **state)
{
	(void)state;
	struct rdv_register in = {.role = CONFIG_ROLE_WORKER, .req_rank = -1, .port = 0,
				  .local_rank = 3, .local_size = 4, .host = "10.0.0.7", .pid = 31337,
				  .host_id = "6f1c2e9a-43b7-4d0e-9a51-0c8e2b7f44d1/f0000098/effffffc",
				  .rack = 5, .transport = "ucx"};
	struct wire_buf b;
	wire_buf_init(&b);
	rdv_register_encode(&in, &b);
	struct rdv_register out;
	assert_int_equal(rdv_register_decode(b.data, b.len, &out), 0);
	assert_int_equal(out.role, in.role);
	assert_int_equal(out.req_rank, -1);
	assert_int_equal(out.port, in.port);
	assert_int_equal(out.local_rank, 3);
	assert_int_equal(out.local_size, 4);
	assert_string_equal(out.host, in.host);
	assert_int_equal(out.pid, 31337);
	assert_string_equal(out.host_id, in.host_id);
	assert_int_equal(out.rack, 5);
	assert_string_equal(out.transport, "ucx");
	refuses_every_cut(&b, decode_register);
	wire_buf_fini(&b);
}

/* A node of a running job back to a restarted scheduler: the resume
 * part travels whole; a cut one, or one naming too many lost servers, is
 * refused. */
static void test_register_resume(void **state)
{
	(void)state;
	struct rdv_register in = {.role = CONFIG_ROLE_WORKER, .req_rank = 1, .local_size = 2,
				  .local_rank = 1, .host = "10.0.0.8", .pid = 4242,
				  .host_id = "d83a1f02/f0000000/effffffc", .rack = -1};
	in.resume = (struct rdv_resume){.on = 1, .id = 6, .rank = 3, .gen = 2, .local_size = 2,
					.workers = 4, .servers = 2, .joined = 1, .failovers = 1, .held = 3,
					.entered = {0, 5, 0, 3}, .done = {0, 4, 0, 3}, .nlost = 1,
					.lost = {1}};
	struct wire_buf b;
	wire_buf_init(&b);
	rdv_register_encode(&in, &b);
	struct rdv_register out;
	assert_int_equal(rdv_register_decode(b.data, b.len, &out), 0);
	assert_memory_equal(&out.resume, &in.resume, sizeof in.resume);
	assert_string_equal(out.host, "10.0.0.8");
	refuses_every_cut(&b, decode_register);
	wire_buf_fini(&b);

	in.resume.nlost = RDV_MAX_LOST + 1;	/* encodes RDV_MAX_LOST of them */
	wire_buf_init(&b);
	rdv_register_encode(&in, &b);
	assert_int_not_equal(rdv_register_decode(b.data, b.len, &out), 0);
	wire_buf_fini(&b);
}

static int decode_held(const void *p, size_t len)
{
	const void *req, *reply;
	size_t req_len, reply_len;
	char name[64], spec[64], why[64];
	uint64_t pbytes;
	struct rdv_segs segs;
	struct rdv_shape shape;
	int rack, status;
	uint32_t n;
	struct placement_part *parts = NULL;
	uint32_t *servers = NULL;
	int rc = rdv_held_split(p, len, &req, &req_len, &reply, &reply_len);
	if (rc == 0)
		rc = rdv_declare_decode(req, req_len, name, sizeof name, &pbytes, &segs, &shape, &rack,
					spec, sizeof spec);
	if (rc != 0)
		return rc;
	rdv_segs_free(&segs);
	rc = rdv_declare_reply_decode(reply, reply_len, &status, why, sizeof why, &n, &parts,
				      &servers);
	free(parts);
	free(servers);
	return rc != 0 ? rc : status;
}

/* HELD: a tensor's request and its cut, as a worker hands them to a
 * restarted scheduler. */
static void test_held(void **state)
{
	(void)state;
	struct wire_buf req;
	wire_buf_init(&req);
	uint64_t dims[2] = {10, 200};
	struct rdv_shape shape = {.ndim = 2, .dims = {dims[0], dims[1]}};
	rdv_declare_encode(&req, "grad.w", 4096, NULL, &shape, -1, "fp16");
	struct placement_part parts[2] = {{.count = 1024}, {.count = 976}};
	uint32_t servers[2] = {1, 0};
	struct wire_buf b;
	wire_buf_init(&b);
	rdv_held_encode(&b, req.data, req.len, 2, parts, servers);
	const void *rq, *rp;
	size_t rq_len, rp_len;
	assert_int_equal(rdv_held_split(b.data, b.len, &rq, &rq_len, &rp, &rp_len), 0);
	assert_int_equal(rq_len, req.len);
	assert_memory_equal(rq, req.data, req.len);
	int status;
	char why[64];
	uint32_t n;
	struct placement_part *got;
	uint32_t *where;
	assert_int_equal(rdv_declare_reply_decode(rp, rp_len, &status, why, sizeof why, &n, &got,
						  &where), 0);
	assert_int_equal(n, 2);
	assert_int_equal(where[0], 1);
	assert_true(got[1].offset == 1024);
	free(got);
	free(where);
	refuses_every_cut(&b, decode_held);
	wire_buf_fini(&b);
	wire_buf_fini(&req);
}

static int decode_book(const void *p, size_t len)
{
	uint32_t id, local_size, n;
	struct rdv_node *nodes;
	int rc = rdv_book_decode(p, len, &id, &local_size, &nodes, &n);
	free(nodes);
	return rc;
}

static void test_addrbook(void **state)
{
	(void)state;
	struct rdv_node in[3] = {
		{.id = 1, .role = CONFIG_ROLE_SERVER, .rank = 0, .machine = -1, .port = 4000,
		 .host = "10.0.0.1", .pid = 11, .host_id = "a/1/2", .rack = 1},
		{.id = 2, .role = CONFIG_ROLE_WORKER, .rank = 0, .machine = 0, .local_rank = 0,
		 .host = "10.0.0.2", .pid = 12, .host_id = "b/1/2", .rack = -1},
		{.id = 3, .role = CONFIG_ROLE_WORKER, .rank = 1, .machine = 0, .local_rank = 1,
		 .host = "10.0.0.2", .pid = 13, .host_id = "b/1/2", .rack = 0},
	};
	struct wire_buf b;
	wire_buf_init(&b);
	rdv_book_encode_head(&b, 3, 2, 3);
	for (int i = 0; i < 3; i++)
		rdv_book_encode_node(&b, &in[i]);
	uint32_t id, local_size, n;
	struct rdv_node *out;
	assert_int_equal(rdv_book_decode(b.data, b.len, &id, &local_size, &out, &n), 0);
	assert_int_equal(id, 3);
	assert_int_equal(local_size, 2);
	assert_int_equal(n, 3);
	for (int i = 0; i < 3; i++) {
		assert_int_equal(out[i].id, in[i].id);
		assert_int_equal(out[i].role, in[i].role);
		assert_int_equal(out[i].rank, in[i].rank);
		assert_int_equal(out[i].machine, in[i].machine);
		assert_int_equal(out[i].local_rank, in[i].local_rank);
		assert_int_equal(out[i].port, in[i].port);
		assert_string_equal(out[i].host, in[i].host);
		assert_int_equal(out[i].pid, in[i].pid);
		assert_string_equal(out[i].host_id, in[i].host_id);
		assert_int_equal(out[i].rack, in[i].rack);
	}
	free(out);
	refuses_every_cut(&b, decode_book);
	wire_buf_fini(&b);
	/* No nodes at all is no address book. */
	wire_buf_init(&b);
	rdv_book_encode_head(&b, 1, 1, 0);
	assert_int_equal(decode_book(b.data, b.len), UNISUM_EPROTO);
	wire_buf_fini(&b);
}

static int decode_declare(const void *p, size_t len)
{
	char name[256];
	uint64_t pbytes;
	struct rdv_segs segs;
	struct rdv_shape shape;
	int rack;
	char spec[WIRE_SPEC_MAX];
	int rc = rdv_declare_decode(p, len, name, sizeof name, &pbytes, &segs, &shape, &rack, spec,
				    sizeof spec);
	rdv_segs_free(&segs);
	return rc;
}

static void test_declare_request(void **state)
{
	(void)state;
	struct wire_buf b;
	wire_buf_init(&b);
	rdv_declare_encode(&b, "gradient.fc1.weight", 4096000, NULL, NULL, -1, NULL);
	char name[256], spec[WIRE_SPEC_MAX];
	uint64_t pbytes = 0;
	struct rdv_segs segs;
	struct rdv_shape shape;
	int rack = 7;
	assert_int_equal(rdv_declare_decode(b.data, b.len, name, sizeof name, &pbytes, &segs, &shape,
					    &rack, spec, sizeof spec),
			 0);
	assert_int_equal(rack, -1);
	assert_string_equal(spec, "");
	assert_string_equal(name, "gradient.fc1.weight");
	assert_true(pbytes == 4096000);
	assert_int_equal(segs.n, 0);
	assert_int_equal(shape.ndim, 0);
	refuses_every_cut(&b, decode_declare);
	wire_buf_fini(&b);

	/* A homed cut's segments and a shape round-trip; every truncation
	 * is refused. */
	uint64_t counts[3] = {1000, 0, 1ull << 40};
	uint32_t owners[3] = {2, 0, 7};
	struct rdv_segs in = {.n = 3, .counts = counts, .owners = owners};
	struct rdv_shape dims = {.ndim = 3, .dims = {17, 23, 57}};
	wire_buf_init(&b);
	rdv_declare_encode(&b, "allgather.3", 65536, &in, &dims, 3, "topk,k=0.01");
	assert_int_equal(rdv_declare_decode(b.data, b.len, name, sizeof name, &pbytes, &segs, &shape,
					    &rack, spec, sizeof spec),
			 0);
	assert_int_equal(rack, 3);
	assert_string_equal(spec, "topk,k=0.01");
	assert_int_equal(segs.n, 3);
	for (int i = 0; i < 3; i++) {
		assert_true(segs.counts[i] == counts[i]);
		assert_int_equal(segs.owners[i], owners[i]);
	}
	assert_int_equal(shape.ndim, 3);
	assert_true(shape.dims[0] == 17 && shape.dims[1] == 23 && shape.dims[2] == 57);
	rdv_segs_free(&segs);
	refuses_every_cut(&b, decode_declare);
	wire_buf_fini(&b);
	/* More dimensions than a shape holds are refused. */
	wire_buf_init(&b);
	wire_buf_str(&b, "x");
	wire_buf_u64(&b, 4096);
	wire_buf_u32(&b, 0);
	wire_buf_u32(&b, RDV_MAX_DIMS + 1);
	for (int i = 0; i < RDV_MAX_DIMS + 1; i++)
		wire_buf_u64(&b, 1);
	wire_buf_u32(&b, (uint32_t)-1);
	wire_buf_str(&b, "");
	assert_int_equal(decode_declare(b.data, b.len), UNISUM_EPROTO);
	wire_buf_fini(&b);
	/* A rack below -1 is refused. */
	wire_buf_init(&b);
	rdv_declare_encode(&b, "x", 4096, NULL, NULL, -2, NULL);
	assert_int_equal(decode_declare(b.data, b.len), UNISUM_EPROTO);
	wire_buf_fini(&b);
}

static int decode_reply(const void *p, size_t len)
{
	int status;
	char why[256];
	uint32_t n;
	struct placement_part *parts;
	uint32_t *servers;
	int rc = rdv_declare_reply_decode(p, len, &status, why, sizeof why, &n, &parts, &servers);
	free(parts);
	free(servers);
	return rc;
}

static void test_declare_reply(void **state)
{
	(void)state;
	struct placement_part parts[3] = {{.count = 700}, {.count = 324}, {.count = 1}};
	uint32_t servers[3] = {0, 2, 1};
	struct wire_buf b;
	wire_buf_init(&b);
	rdv_placed_encode(&b, 3, parts, servers);
	int status = -1;
	char why[256];
	uint32_t n;
	struct placement_part *got;
	uint32_t *where;
	assert_int_equal(rdv_declare_reply_decode(b.data, b.len, &status, why, sizeof why, &n, &got,
						  &where), 0);
	assert_int_equal(status, 0);
	assert_int_equal(n, 3);
	uint64_t off = 0;
	for (int i = 0; i < 3; i++) {
		assert_true(got[i].count == parts[i].count);
		assert_true(got[i].offset == off);
		assert_int_equal(where[i], servers[i]);
		off += parts[i].count;
	}
	free(got);
	free(where);
	refuses_every_cut(&b, decode_reply);
	wire_buf_fini(&b);

	wire_buf_init(&b);
	rdv_refused_encode(&b, UNISUM_EMISMATCH, "declared as float32[10] and float32[20]");
	assert_int_equal(rdv_declare_reply_decode(b.data, b.len, &status, why, sizeof why, &n, &got,
						  &where), 0);
	assert_int_equal(status, UNISUM_EMISMATCH);
	assert_string_equal(why, "declared as float32[10] and float32[20]");
	assert_null(got);
	refuses_every_cut(&b, decode_reply);
	wire_buf_fini(&b);

	/* An empty tensor's cut has no partition. */
	wire_buf_init(&b);
	rdv_placed_encode(&b, 0, NULL, NULL);
	assert_int_equal(decode_reply(b.data, b.len), 0);
	wire_buf_fini(&b);
}

static int decode_tune(const void *p, size_t len)
{
	struct rdv_tune t;
	return rdv_tune_decode(p, len, 7, &t);
}

static void test_tune(void **state)
{
	(void)state;
	struct rdv_tune in = {.epoch = 7, .partition_bytes = 1 << 20, .credit_bytes = 4 << 20,
			      .final = true, .mode = 2, .steps = 1};
	struct wire_buf b;
	wire_buf_init(&b);
	rdv_tune_encode(&in, &b);
	struct rdv_tune out;
	assert_int_equal(rdv_tune_decode(b.data, b.len, 7, &out), 0);
	assert_int_equal(out.epoch, 7);
	assert_true(out.partition_bytes == in.partition_bytes);
	assert_true(out.credit_bytes == in.credit_bytes);
	assert_true(out.final);
	assert_int_equal(out.mode, 2);
	assert_int_equal(out.steps, 1);
	refuses_every_cut(&b, decode_tune);
	/* a mode other than search or fit, and epochs of no rounds, are refused */
	for (int bad = 0; bad < 3; bad++) {
		struct rdv_tune t = in;
		t.mode = bad == 0 ? 0 : bad == 1 ? 3 : 2;
		t.steps = bad == 2 ? 0 : 1;
		struct wire_buf c;
		wire_buf_init(&c);
		rdv_tune_encode(&t, &c);
		assert_int_equal(decode_tune(c.data, c.len), UNISUM_EPROTO);
		wire_buf_fini(&c);
	}
	wire_buf_fini(&b);
}

static int decode_failover(const void *p, size_t len)
{
	struct wire_hdr h = {.type = WIRE_FAILOVER, .round = 2, .aux = 1};
	struct rdv_failover f;
	int rc = rdv_failover_decode(&h, p, len, &f);
	if (rc == 0) {
		free(f.keys);
		free(f.servers);
	}
	return rc;
}

static void test_failover(void **state)
{
	(void)state;
	uint64_t keys[] = {0x10000, 0x10001, 0xabcdef0000ull + 7};
	uint32_t servers[] = {0, 2, 3};
	struct rdv_failover in = {.number = 2, .dead = 1, .n = 3, .keys = keys, .servers = servers};
	struct wire_buf b;
	wire_buf_init(&b);
	struct wire_hdr h = {0};
	rdv_failover_encode(&in, &h, &b);
	assert_int_equal(h.type, WIRE_FAILOVER);
	assert_int_equal(h.round, 2);
	assert_int_equal(h.aux, 1);
	assert_true(h.payload_len == b.len);
	struct rdv_failover out;
	assert_int_equal(rdv_failover_decode(&h, b.data, b.len, &out), 0);
	assert_int_equal(out.number, 2);
	assert_int_equal(out.dead, 1);
	assert_int_equal(out.n, 3);
	for (int i = 0; i < 3; i++) {
		assert_true(out.keys[i] == keys[i]);
		assert_int_equal(out.servers[i], servers[i]);
	}
	free(out.keys);
	free(out.servers);
	refuses_every_cut(&b, decode_failover);
	/* a count that promises more entries than follow */
	struct wire_buf c;
	wire_buf_init(&c);
	wire_buf_u32(&c, 1000000);
	assert_int_equal(decode_failover(c.data, c.len), UNISUM_EPROTO);
	wire_buf_fini(&c);
	wire_buf_fini(&b);
}

static int decode_metrics(const void *p, size_t len)
{
	struct rdv_metrics m;
	int rc = rdv_metrics_decode(p, len, &m);
	rdv_metrics_free(&m);
	return rc;
}

/* A HEARTBEAT's counters: every field back as sent; a payload cut short,
 * one too long, or counts of another build are refused. */
static void test_metrics(void **state)
{
	(void)state;
	uint64_t servers[3] = {1, 1ull << 40, 0}, pulled[3] = {5, 0, 1ull << 50};
	struct rdv_metrics in = {.nservers = 3, .server_bytes = servers, .server_pulled = pulled};
	for (int i = 0; i < RDV_M_COUNT; i++)
		in.v[i] = 1000ull * (uint64_t)i + 7;
	for (int i = 0; i < RDV_LAT_BUCKETS; i++)
		in.lat[i] = (uint64_t)i * 3;
	strcpy(in.stall, "server 1: tensor 'w' round 3 waits for worker(s) 2");
	struct wire_buf b;
	wire_buf_init(&b);
	rdv_metrics_encode(&in, &b);
	struct rdv_metrics out;
	assert_int_equal(rdv_metrics_decode(b.data, b.len, &out), 0);
	assert_memory_equal(out.v, in.v, sizeof in.v);
	assert_memory_equal(out.lat, in.lat, sizeof in.lat);
	assert_int_equal(out.nservers, 3);
	assert_memory_equal(out.server_bytes, servers, sizeof servers);
	assert_memory_equal(out.server_pulled, pulled, sizeof pulled);
	assert_string_equal(out.stall, in.stall);
	rdv_metrics_free(&out);
	refuses_every_cut(&b, decode_metrics);
	b.data[0] ^= 1;	/* another count of values: another build's layout */
	assert_int_equal(decode_metrics(b.data, b.len), UNISUM_EPROTO);
	wire_buf_fini(&b);
	/* the latency buckets: the bound itself is in its bucket */
	assert_int_equal(rdv_lat_bucket(0), 0);
	assert_int_equal(rdv_lat_bucket(500), 0);
	assert_int_equal(rdv_lat_bucket(501), 1);
	assert_int_equal(rdv_lat_bucket(10000000), RDV_LAT_BUCKETS - 2);
	assert_int_equal(rdv_lat_bucket(10000001), RDV_LAT_BUCKETS - 1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_error),
		cmocka_unit_test(test_declare_check),
		cmocka_unit_test(test_announce),
		cmocka_unit_test(test_register),
		cmocka_unit_test(test_register_resume),
		cmocka_unit_test(test_held),
		cmocka_unit_test(test_addrbook),
		cmocka_unit_test(test_declare_request),
		cmocka_unit_test(test_declare_reply),
		cmocka_unit_test(test_tune),
		cmocka_unit_test(test_failover),
		cmocka_unit_test(test_metrics),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
