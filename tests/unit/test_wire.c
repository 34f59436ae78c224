/*
 * test_wire.c - the header codec: round trips, and rejection of every
 * malformed field (magic, version, type, flags, reserved bytes, dtype,
 * payload length against count x dtype and against the limits), plus the
 * bounds-checked control-payload reader.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "wire/wire.h"

static int decode(const uint8_t *buf, struct wire_hdr *h, char *why)
{
	return wire_decode(buf, h, why, 256);
}

static void test_round_trip_every_type(void **state)
{
	(void)state;
	for (int type = 1; type <= WIRE_TYPE_MAX; type++) {
		struct wire_hdr in = {.type = (uint8_t)type, .sender = 0xdeadbeef, .round = 0xfffffffe,
				      .key = 0x0123456789abcdefull, .aux = 0x80000001u};
		if (type == WIRE_PUSH || type == WIRE_PULL_REPLY || type == WIRE_RESTORE) {
			in.dtype = UNISUM_BFLOAT16;
			in.count = 12345;
			in.payload_len = 12345 * 2;
			if (type == WIRE_PUSH)
				in.aux = WIRE_OP(WIRE_OP_BROADCAST, WIRE_OP_MAX_ROOT);
		} else if (type == WIRE_COPY) {	/* the value, then aux contributors' counts */
			in.dtype = UNISUM_BFLOAT16;
			in.count = 12345;
			in.aux = 3;
			in.payload_len = 12345 * 2 + 3 * 4;
		} else if (type == WIRE_PULL || type == WIRE_DECLARE_CHECK || type == WIRE_DECLARE ||
			   type == WIRE_ANNOUNCE) {
			in.dtype = UNISUM_INT64;
			in.count = 7;
		} else if (type != WIRE_BARRIER && type != WIRE_BARRIER_DONE && type != WIRE_HEARTBEAT &&
			   type != WIRE_PUSH_ACK && type != WIRE_RETIRE && type != WIRE_JOIN &&
			   type != WIRE_JOIN_DONE && type != WIRE_MOVED && type != WIRE_RESIZE &&
			   type != WIRE_COPY_ACK) {
			in.payload_len = 100;
		}
		uint8_t buf[WIRE_HDR_SIZE];
		wire_encode(&in, buf);
		struct wire_hdr out;
		char why[256] = "";
		assert_int_equal(decode(buf, &out, why), 0);
		assert_int_equal(out.type, in.type);
		assert_int_equal(out.flags, in.flags);
		assert_int_equal(out.sender, in.sender);
		assert_int_equal(out.round, in.round);
		assert_true(out.key == in.key);
		assert_true(out.count == in.count);
		assert_true(out.payload_len == in.payload_len);
		assert_int_equal(out.dtype, in.dtype);
		assert_int_equal(out.aux, in.aux);
	}
}

static void test_layout_is_little_endian(void **state)
{
	(void)state;
	struct wire_hdr h = {.type = WIRE_PULL, .sender = 0x04030201, .key = 0x0807060504030201ull,
			     .dtype = UNISUM_FLOAT16};
	uint8_t buf[WIRE_HDR_SIZE];
	wire_encode(&h, buf);
	assert_memory_equal(buf, "USUM", 4);
	assert_int_equal(buf[4], WIRE_VERSION);
	assert_int_equal(buf[5], WIRE_PULL);
	assert_int_equal(buf[8], 1);
	assert_int_equal(buf[11], 4);
	assert_int_equal(buf[16], 1);
	assert_int_equal(buf[23], 8);
	assert_int_equal(buf[40], UNISUM_FLOAT16);
}

/* A valid PUSH to corrupt one field at a time. */
static void good_push(uint8_t buf[WIRE_HDR_SIZE])
{
	struct wire_hdr h = {.type = WIRE_PUSH, .key = 1, .round = 3, .dtype = UNISUM_FLOAT32, .count = 10,
			     .payload_len = 40};
	wire_encode(&h, buf);
}

static void expect_reject(const uint8_t *buf, const char *needle)
{
	struct wire_hdr h;
	char why[256] = "";
	assert_int_equal(decode(buf, &h, why), UNISUM_EPROTO);
	if (strstr(why, needle) == NULL)
		fail_msg("reason '%s' does not mention '%s'", why, needle);
}

static void test_rejects_each_malformed_field(void **state)
{
	(void)state;
	uint8_t buf[WIRE_HDR_SIZE];
	struct wire_hdr h;
	char why[256];

	good_push(buf);
	assert_int_equal(decode(buf, &h, why), 0);

	good_push(buf);
	buf[0] ^= 0xff;
	expect_reject(buf, "magic");

	good_push(buf);
	buf[4] = WIRE_VERSION + 1;
	expect_reject(buf, "version");

	good_push(buf);
	buf[5] = 0;
	expect_reject(buf, "unknown message type");
	buf[5] = WIRE_TYPE_MAX + 1;
	expect_reject(buf, "unknown message type");

	good_push(buf);
	buf[6] = 0x4;	/* a flag PUSH does not take */
	expect_reject(buf, "flags");

	for (int i = 41; i <= 43; i++) {
		good_push(buf);
		buf[i] = 1;
		expect_reject(buf, "reserved");
	}

	good_push(buf);
	buf[40] = UNISUM_DTYPE_COUNT;
	expect_reject(buf, "dtype");

	good_push(buf);
	buf[32] = 41;	/* payload_len != count x 4 */
	expect_reject(buf, "payload");

	/* count so large that count x size overflows or passes 1 GiB */
	struct wire_hdr big = {.type = WIRE_PUSH, .dtype = UNISUM_FLOAT64, .count = 1ull << 61,
			       .payload_len = 0};
	wire_encode(&big, buf);
	expect_reject(buf, "1 GiB");

	/* a dtype on a type that carries none */
	struct wire_hdr bar = {.type = WIRE_BARRIER, .dtype = 1};
	wire_encode(&bar, buf);
	expect_reject(buf, "dtype");

	/* payloads on types that carry none, and oversized control payloads */
	struct wire_hdr pull = {.type = WIRE_PULL, .payload_len = 1};
	wire_encode(&pull, buf);
	expect_reject(buf, "no payload");
	struct wire_hdr reg = {.type = WIRE_REGISTER, .payload_len = WIRE_MAX_CONTROL_PAYLOAD + 1ull};
	wire_encode(&reg, buf);
	expect_reject(buf, "control limit");
}

static void test_zero_flag(void **state)
{
	(void)state;
	uint8_t buf[WIRE_HDR_SIZE];
	struct wire_hdr h = {.type = WIRE_PUSH, .flags = WIRE_FLAG_ZERO, .dtype = UNISUM_INT32, .count = 5,
			     .aux = WIRE_OP(WIRE_OP_BROADCAST, 1)};
	wire_encode(&h, buf);
	struct wire_hdr out;
	char why[256];
	assert_int_equal(decode(buf, &out, why), 0);
	/* ZERO with a payload is malformed */
	h.payload_len = 20;
	wire_encode(&h, buf);
	expect_reject(buf, "payload");
	/* ZERO is not a PULL flag */
	struct wire_hdr p = {.type = WIRE_PULL, .flags = WIRE_FLAG_ZERO};
	wire_encode(&p, buf);
	expect_reject(buf, "flags");
}

static void test_ipc_flag(void **state)
{
	(void)state;
	uint8_t buf[WIRE_HDR_SIZE];
	struct wire_hdr out;
	char why[256];
	/* IPC: the payload is a 24-byte reference whatever the count */
	struct wire_hdr h = {.type = WIRE_PULL_REPLY, .flags = WIRE_FLAG_IPC, .dtype = UNISUM_FLOAT32,
			     .count = 1000, .payload_len = WIRE_IPC_PAYLOAD};
	wire_encode(&h, buf);
	assert_int_equal(decode(buf, &out, why), 0);
	assert_int_equal(out.flags, WIRE_FLAG_IPC);
	h.type = WIRE_PUSH;
	wire_encode(&h, buf);
	assert_int_equal(decode(buf, &out, why), 0);
	/* ... not the data */
	h.payload_len = 4000;
	wire_encode(&h, buf);
	expect_reject(buf, "address");
	/* never with ZERO, never on a PULL */
	h.payload_len = WIRE_IPC_PAYLOAD;
	h.flags = WIRE_FLAG_IPC | WIRE_FLAG_ZERO;
	wire_encode(&h, buf);
	expect_reject(buf, "flags");
	struct wire_hdr p = {.type = WIRE_PULL, .flags = WIRE_FLAG_IPC};
	wire_encode(&p, buf);
	expect_reject(buf, "flags");
}

/* A PUSH names its collective; anything else in aux is refused. */
static void test_push_collective(void **state)
{
	(void)state;
	struct wire_hdr in = {.type = WIRE_PUSH, .dtype = UNISUM_FLOAT32, .count = 1, .payload_len = 4};
	uint8_t buf[WIRE_HDR_SIZE];
	struct wire_hdr out;
	char why[256] = "", text[64];
	const uint32_t good[] = {WIRE_OP(WIRE_OP_SUM, 0), WIRE_OP(WIRE_OP_AVERAGE, 0),
				 WIRE_OP(WIRE_OP_BROADCAST, 0), WIRE_OP(WIRE_OP_BROADCAST, 7),
				 WIRE_OP(WIRE_OP_MIN, 0), WIRE_OP(WIRE_OP_MAX, 0),
				 WIRE_OP(WIRE_OP_PRODUCT, 0), WIRE_OP(WIRE_OP_ALLGATHER, 0),
				 WIRE_OP(WIRE_OP_ALLTOALL, 0), WIRE_OP(WIRE_OP_REDUCESCATTER, 0),
				 WIRE_OP(WIRE_OP_REDUCESCATTER_AVERAGE, 0),
				 WIRE_OP(WIRE_OP_ALLGATHER, 0xabcdef)};
	for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
		in.aux = good[i];
		wire_encode(&in, buf);
		assert_int_equal(decode(buf, &out, why), 0);
		assert_int_equal(out.aux, good[i]);
	}
	const uint32_t bad[] = {WIRE_OP_KIND_MAX + 1, 0xff, WIRE_OP(WIRE_OP_SUM, 1),
				WIRE_OP(WIRE_OP_AVERAGE, 2), WIRE_OP(WIRE_OP_MIN, 1)};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		in.aux = bad[i];
		wire_encode(&in, buf);
		assert_int_equal(decode(buf, &out, why), UNISUM_EPROTO);
		assert_non_null(strstr(why, "unknown collective"));
	}
	assert_string_equal(wire_op_describe(WIRE_OP(WIRE_OP_BROADCAST, 3), text, sizeof text),
			    "a broadcast from root 3");
	assert_string_equal(wire_op_describe(WIRE_OP(WIRE_OP_AVERAGE, 0), text, sizeof text),
			    "an average");
	assert_string_equal(wire_op_describe(WIRE_OP(WIRE_OP_SUM, 0), text, sizeof text), "a sum");
	assert_string_equal(wire_op_describe(WIRE_OP(WIRE_OP_MAX, 0), text, sizeof text), "a max");
	/* A ZERO contribution only where zero is the identity and means
	 * "nothing of mine": broadcast, allgather, alltoall. */
	struct wire_hdr z = {.type = WIRE_PUSH, .flags = WIRE_FLAG_ZERO, .dtype = UNISUM_FLOAT32,
			     .count = 4};
	const uint32_t zero_ok[] = {WIRE_OP(WIRE_OP_BROADCAST, 1), WIRE_OP(WIRE_OP_ALLGATHER, 0),
				    WIRE_OP(WIRE_OP_ALLTOALL, 0)};
	for (size_t i = 0; i < sizeof zero_ok / sizeof zero_ok[0]; i++) {
		z.aux = zero_ok[i];
		wire_encode(&z, buf);
		assert_int_equal(decode(buf, &out, why), 0);
	}
	const uint32_t zero_bad[] = {WIRE_OP(WIRE_OP_MIN, 0), WIRE_OP(WIRE_OP_PRODUCT, 0),
				     WIRE_OP(WIRE_OP_REDUCESCATTER, 0)};
	for (size_t i = 0; i < sizeof zero_bad / sizeof zero_bad[0]; i++) {
		z.aux = zero_bad[i];
		wire_encode(&z, buf);
		assert_int_equal(decode(buf, &out, why), UNISUM_EPROTO);
		assert_non_null(strstr(why, "no ZERO"));
	}
}

/* SKIP: a PULL that wants no data, and its empty reply; nowhere else. */
static void test_skip_flag(void **state)
{
	(void)state;
	uint8_t buf[WIRE_HDR_SIZE];
	struct wire_hdr out;
	char why[256];
	struct wire_hdr p = {.type = WIRE_PULL, .flags = WIRE_FLAG_SKIP, .dtype = UNISUM_FLOAT32};
	wire_encode(&p, buf);
	assert_int_equal(decode(buf, &out, why), 0);
	assert_int_equal(out.flags, WIRE_FLAG_SKIP);
	struct wire_hdr r = {.type = WIRE_PULL_REPLY, .flags = WIRE_FLAG_SKIP, .dtype = UNISUM_FLOAT32,
			     .count = 1000};
	wire_encode(&r, buf);
	assert_int_equal(decode(buf, &out, why), 0);
	/* the reply carries nothing */
	r.payload_len = 4000;
	wire_encode(&r, buf);
	expect_reject(buf, "payload");
	/* never with ZERO or IPC, never on a PUSH */
	r.payload_len = 0;
	r.flags = WIRE_FLAG_SKIP | WIRE_FLAG_ZERO;
	wire_encode(&r, buf);
	expect_reject(buf, "flags");
	struct wire_hdr u = {.type = WIRE_PUSH, .flags = WIRE_FLAG_SKIP, .dtype = UNISUM_FLOAT32,
			     .count = 1, .payload_len = 4};
	wire_encode(&u, buf);
	expect_reject(buf, "flags");
}

/* PULL (issue 50): a PUSH that carries its PULL, with any one of the
 * data flags or none; on nothing but a PUSH. */
static void test_pull_flag(void **state)
{
	(void)state;
	uint8_t buf[WIRE_HDR_SIZE];
	struct wire_hdr out;
	char why[256];
	struct wire_hdr u = {.type = WIRE_PUSH, .flags = WIRE_FLAG_PULL, .dtype = UNISUM_FLOAT32,
			     .count = 10, .payload_len = 40, .key = 7, .round = 3};
	wire_encode(&u, buf);
	assert_int_equal(decode(buf, &out, why), 0);
	assert_int_equal(out.flags, WIRE_FLAG_PULL);
	assert_int_equal(out.payload_len, 40);
	u.flags = WIRE_FLAG_PULL | WIRE_FLAG_IPC;
	u.payload_len = WIRE_IPC_PAYLOAD;
	wire_encode(&u, buf);
	assert_int_equal(decode(buf, &out, why), 0);
	assert_int_equal(out.flags, WIRE_FLAG_PULL | WIRE_FLAG_IPC);
	u.flags = WIRE_FLAG_PULL | WIRE_FLAG_ZERO;
	u.aux = WIRE_OP(WIRE_OP_BROADCAST, 1);
	u.payload_len = 0;
	wire_encode(&u, buf);
	assert_int_equal(decode(buf, &out, why), 0);
	/* still never two data flags */
	u.flags = WIRE_FLAG_PULL | WIRE_FLAG_ZERO | WIRE_FLAG_IPC;
	wire_encode(&u, buf);
	expect_reject(buf, "flags");
	/* never on a PULL, its reply, or a RESTORE */
	struct wire_hdr p = {.type = WIRE_PULL, .flags = WIRE_FLAG_PULL, .dtype = UNISUM_FLOAT32};
	wire_encode(&p, buf);
	expect_reject(buf, "flags");
	struct wire_hdr r = {.type = WIRE_PULL_REPLY, .flags = WIRE_FLAG_PULL, .dtype = UNISUM_FLOAT32,
			     .count = 1, .payload_len = 4};
	wire_encode(&r, buf);
	expect_reject(buf, "flags");
	r.type = WIRE_RESTORE;
	wire_encode(&r, buf);
	expect_reject(buf, "flags");
}

/* RESTORE (failover): a data message of count x dtype bytes, inline, with
 * no flag at all. */
static void test_restore(void **state)
{
	(void)state;
	uint8_t buf[WIRE_HDR_SIZE];
	struct wire_hdr r = {.type = WIRE_RESTORE, .dtype = UNISUM_INT32, .count = 5, .payload_len = 20,
			     .round = 9, .key = 0x10002};
	wire_encode(&r, buf);
	struct wire_hdr h;
	char why[256] = "";
	assert_int_equal(decode(buf, &h, why), 0);
	r.payload_len = 16;
	wire_encode(&r, buf);
	expect_reject(buf, "payload");
	r.payload_len = 20;
	for (unsigned f = 1; f < WIRE_FLAG_COMPRESSED; f <<= 1) {
		r.flags = (uint16_t)f;
		r.payload_len = f == WIRE_FLAG_IPC ? 8 : 20;
		wire_encode(&r, buf);
		expect_reject(buf, "flags");
	}
	/* A compressed key's (wire 19): the push it encoded, float32 only. */
	r.flags = WIRE_FLAG_COMPRESSED;
	wire_encode(&r, buf);
	expect_reject(buf, "float32");
	r.dtype = UNISUM_FLOAT32;
	r.payload_len = 8;	/* onebit of 5 elements: the scale and a word */
	wire_encode(&r, buf);
	assert_int_equal(decode(buf, &h, why), 0);
	r.flags = WIRE_FLAG_COMPRESSED | WIRE_FLAG_ZERO;
	wire_encode(&r, buf);
	expect_reject(buf, "flags");
	/* A homed cut's (wire 20): the push answered, raw, its collective in
	 * aux; ZERO only with PUSHED, and only of a collective that takes it. */
	r = (struct wire_hdr){.type = WIRE_RESTORE, .flags = WIRE_FLAG_PUSHED,
			      .dtype = UNISUM_INT32, .count = 5, .payload_len = 20, .round = 9,
			      .key = 0x10002, .aux = WIRE_OP_SUM};
	wire_encode(&r, buf);
	assert_int_equal(decode(buf, &h, why), 0);
	r.flags = WIRE_FLAG_PUSHED | WIRE_FLAG_ZERO;
	r.payload_len = 0;
	wire_encode(&r, buf);
	expect_reject(buf, "takes no ZERO");
	r.aux = WIRE_OP_ALLGATHER;
	wire_encode(&r, buf);
	assert_int_equal(decode(buf, &h, why), 0);
	r.flags = WIRE_FLAG_ZERO;
	wire_encode(&r, buf);
	expect_reject(buf, "flags");
	r.flags = WIRE_FLAG_PUSHED | WIRE_FLAG_COMPRESSED;
	r.dtype = UNISUM_FLOAT32;
	r.payload_len = 8;
	wire_encode(&r, buf);
	expect_reject(buf, "flags");
	r = (struct wire_hdr){.type = WIRE_RESTORE, .flags = WIRE_FLAG_PUSHED,
			      .dtype = UNISUM_INT32, .count = 5, .payload_len = 20, .aux = 0x7f};
	wire_encode(&r, buf);
	expect_reject(buf, "unknown collective");
}

/* A COPY (replica.c): the value, then a u32 per contributor; one of
 * no elements and no payload forgets the key; COPY_ACK carries none. */
static void test_copy(void **state)
{
	(void)state;
	uint8_t buf[WIRE_HDR_SIZE];
	struct wire_hdr c = {.type = WIRE_COPY, .dtype = UNISUM_INT64, .count = 5, .aux = 3,
			     .payload_len = 5 * 8 + 3 * 4, .round = 7, .key = 0x10002};
	wire_encode(&c, buf);
	struct wire_hdr h;
	char why[256] = "";
	assert_int_equal(decode(buf, &h, why), 0);
	c.payload_len = 5 * 8;	/* the contributors' counts missing */
	wire_encode(&c, buf);
	expect_reject(buf, "contributors need 52");
	c.payload_len = 5 * 8 + 3 * 4;
	c.aux = WIRE_COPY_MAX_CONTRIB + 1;
	wire_encode(&c, buf);
	expect_reject(buf, "exceed the limits");
	c = (struct wire_hdr){.type = WIRE_COPY, .dtype = UNISUM_INT64, .key = 0x10002};
	wire_encode(&c, buf);
	assert_int_equal(decode(buf, &h, why), 0);	/* forget */
	c.payload_len = 4;
	wire_encode(&c, buf);
	expect_reject(buf, "payload");
	/* A compressed key's (wire 19): error feedback, then an encoding or
	 * nothing (ZERO); float32, no contributors. */
	c = (struct wire_hdr){.type = WIRE_COPY, .flags = WIRE_FLAG_COMPRESSED,
			      .dtype = UNISUM_FLOAT32, .count = 5, .payload_len = 5 * 4 + 8,
			      .round = 3, .key = 0x10002};
	wire_encode(&c, buf);
	assert_int_equal(decode(buf, &h, why), 0);
	c.payload_len = 5 * 4;
	wire_encode(&c, buf);
	assert_int_equal(decode(buf, &h, why), 0);
	c.payload_len = 5 * 4 - 1;	/* the feedback cut short */
	wire_encode(&c, buf);
	expect_reject(buf, "compressed key");
	c.payload_len = 5 * 4 + 8 * 5 + 9;	/* more than any encoding */
	wire_encode(&c, buf);
	expect_reject(buf, "compressed key");
	c.payload_len = 5 * 4 + 8;
	c.aux = 1;
	wire_encode(&c, buf);
	expect_reject(buf, "compressed key");
	struct wire_hdr a = {.type = WIRE_COPY_ACK, .round = 7, .key = 0x10002, .payload_len = 1};
	wire_encode(&a, buf);
	expect_reject(buf, "carries no payload");
}

static void test_reader_bounds(void **state)
{
	(void)state;
	struct wire_buf b;
	wire_buf_init(&b);
	wire_buf_u32(&b, 7);
	wire_buf_u64(&b, 1ull << 40);
	wire_buf_str(&b, "hello");
	assert_false(b.failed);

	struct wire_reader r;
	char s[16];
	wire_reader_init(&r, b.data, b.len);
	assert_int_equal(wire_read_u32(&r), 7);
	assert_true(wire_read_u64(&r) == 1ull << 40);
	wire_read_str(&r, s, sizeof s);
	assert_string_equal(s, "hello");
	assert_false(r.failed);
	assert_int_equal(r.left, 0);
	wire_read_u32(&r);
	assert_true(r.failed);

	/* every truncation fails instead of reading past the end */
	for (size_t cut = 0; cut < b.len; cut++) {
		wire_reader_init(&r, b.data, cut);
		wire_read_u32(&r);
		wire_read_u64(&r);
		wire_read_str(&r, s, sizeof s);
		assert_true(r.failed);
	}

	/* a string longer than the destination fails */
	wire_reader_init(&r, b.data + 12, b.len - 12);
	char tiny[4];
	wire_read_str(&r, tiny, sizeof tiny);
	assert_true(r.failed);
	assert_string_equal(tiny, "");

	/* a string holding a NUL byte fails */
	uint8_t nul[] = {3, 0, 0, 0, 'a', 0, 'b'};
	wire_reader_init(&r, nul, sizeof nul);
	wire_read_str(&r, s, sizeof s);
	assert_true(r.failed);
	wire_buf_fini(&b);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_round_trip_every_type),
		cmocka_unit_test(test_layout_is_little_endian),
		cmocka_unit_test(test_rejects_each_malformed_field),
		cmocka_unit_test(test_zero_flag),
		cmocka_unit_test(test_ipc_flag),
		cmocka_unit_test(test_push_collective),
		cmocka_unit_test(test_skip_flag),
		cmocka_unit_test(test_pull_flag),
		cmocka_unit_test(test_restore),
		cmocka_unit_test(test_copy),
		cmocka_unit_test(test_reader_bounds),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
