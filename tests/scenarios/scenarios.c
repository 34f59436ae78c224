/*
 * scenarios.c - the six scenarios test_job.c and check_sums.c share, and
 * their one data generator and reference (scenarios.h says what each does).
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "scenarios.h"

/* ---- helpers ------------------------------------------------------------- */

/* Sets msg from a format, then " (last error)" when rc is a library
 * error; returns rc, or UNISUM_EINVAL for a wrong answer (rc 0). */
static int fail(int rc, char *msg, size_t len, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, len, fmt, ap);
	va_end(ap);
	if (rc < 0) {
		size_t at = strlen(msg);
		if (at < len)
			snprintf(msg + at, len - at, ": %s: %s", unisum_strerror(rc), unisum_last_error());
	}
	return rc < 0 ? rc : UNISUM_EINVAL;
}

static void say(const struct scn_ops *o, const char *fmt, ...)
{
	if (o->say == NULL)
		return;
	char line[768];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(line, sizeof line, fmt, ap);
	va_end(ap);
	o->say(o->ctx, line);
}

/* A push_pull, waited for. */
static int push_pull(const struct scn_ops *o, int t, const void *in, void *out, int flags)
{
	unisum_handle h;
	int rc = o->push_pull_async(o->ctx, t, in, out, flags, &h);
	return rc != 0 ? rc : o->wait(o->ctx, h);
}

/* FNV-1a over 8-byte words (then the last bytes), as byte-wise FNV-1a
 * would cost a multiplication per byte of every result. */
static void digest_add(struct scn_ops *o, const void *buf, size_t bytes)
{
	const uint8_t *p = buf;
	size_t i = 0;
	for (uint64_t w; i + 8 <= bytes; i += 8) {
		memcpy(&w, p + i, sizeof w);
		o->digest = (o->digest ^ w) * 0x100000001b3ull;
	}
	for (; i < bytes; i++)
		o->digest = (o->digest ^ p[i]) * 0x100000001b3ull;
}

/* ---- sums ---------------------------------------------------------------- */

/* One push_pull of tensor t (name), from `in` into `out` (in place when
 * they are one buffer), of rank inputs `salt`, checked and added to the
 * digest. */
static int one_round(struct scn_ops *o, int t, const char *name, unisum_dtype dt, size_t count,
		     uint64_t salt, bool average, uint8_t *in, uint8_t *out, char *msg, size_t len)
{
	scn_fill(o, dt, salt, in, count);
	int rc = push_pull(o, t, in, out, average ? UNISUM_AVERAGE : 0);
	if (rc != 0)
		return fail(rc, msg, len, "%s %s %s", average ? "average" : "push_pull", name,
			    in == out ? "in place" : "out of place");
	if ((rc = scn_verify(o, name, dt, salt, out, count, average, msg, len)) == 0)
		digest_add(o, out, count * unisum_dtype_size(dt));
	return rc;
}

/* Tensor `name` of count elements, the k-th size of its dtype: summed
 * (salt), then, if small, averaged (salt + 1), every result in the
 * digest.  Even k sums out of place and averages in place, odd k the
 * other way round and averages first (the tensor's first round), so that
 * both run both ways and both as a tensor's first round. */
static int sum_then_average(struct scn_ops *o, unisum_dtype dt, size_t count, size_t k,
			    uint64_t salt, char *msg, size_t len)
{
	char name[96];
	snprintf(name, sizeof name, "sums.%s.%zu", unisum_dtype_name(dt), count);
	int t = o->declare(o->ctx, name, dt, count, 0);
	if (t < 0)
		return fail(t, msg, len, "declare %s", name);
	size_t bytes = count * unisum_dtype_size(dt);
	uint8_t *in = o->alloc(o->ctx, bytes + 1, true), *out = o->alloc(o->ctx, bytes + 1, false);
	bool odd = k % 2 == 1, average = count < 100000;
	int rc = in != NULL && out != NULL ? 0 : fail(0, msg, len, "%s: out of memory", name);
	if (rc == 0 && average && odd)
		rc = one_round(o, t, name, dt, count, salt + 1, true, in, out, msg, len);
	if (rc == 0)
		rc = one_round(o, t, name, dt, count, salt, false, in, odd ? in : out, msg, len);
	if (rc == 0 && average && !odd)
		rc = one_round(o, t, name, dt, count, salt + 1, true, in, in, msg, len);
	o->free(o->ctx, in);
	o->free(o->ctx, out);
	return rc;
}

int scn_sums(struct scn_ops *o, bool big, char *msg, size_t len)
{
	uint64_t salt = 1;
	for (int d = 0; d < UNISUM_DTYPE_COUNT; d++) {
		unisum_dtype dt = (unisum_dtype)d;
		size_t p = o->partition_bytes / unisum_dtype_size(dt);
		size_t sizes[] = {0, 1, 2, 3, 17, 1000, p - 1, p, p + 1, 3 * p + 5,
				  big ? (64u << 20) / unisum_dtype_size(dt) : 0};
		for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++, salt += 2) {
			if (k > 0 && sizes[k] == 0)
				continue;
			int rc = sum_then_average(o, dt, sizes[k], k, salt, msg, len);
			if (rc != 0)
				return rc;
		}
	}
	return 0;
}

/* ---- many ---------------------------------------------------------------- */

/* Tensor i of scn_many: some of one partition's size or less, the odd ones
 * over several partitions. */
static size_t many_count(const struct scn_ops *o, int i)
{
	size_t several = 3 * o->partition_bytes / sizeof(float) + 7;
	return 1 + (size_t)i * 37 % 2000 + (i % 2 && several < 200000 ? several : 0);
}

/* Waits for n handles in reverse order, polling the odd ones first. */
static int wait_reversed(struct scn_ops *o, const unisum_handle *hs, int n, char *msg, size_t len)
{
	for (int i = n - 1; i >= 0; i--) {
		int rc = i % 2 && o->poll != NULL ? o->poll(o->ctx, hs[i]) : 0;
		if (rc < 0)
			return fail(rc, msg, len, "poll many.%d", i);
		if (rc == 0 && (rc = o->wait(o->ctx, hs[i])) != 0)
			return fail(rc, msg, len, "wait many.%d", i);
	}
	return 0;
}

/* n tensors in flight at once, each of another priority, even ones out of
 * place; waited for in reverse order. */
int scn_many(struct scn_ops *o, int n, char *msg, size_t len)
{
	int *ids = calloc((size_t)n + 1, sizeof *ids);
	unisum_handle *hs = calloc((size_t)n + 1, sizeof *hs);
	float **in = calloc((size_t)n + 1, sizeof *in), **out = calloc((size_t)n + 1, sizeof *out);
	int rc = ids && hs && in && out ? 0 : fail(0, msg, len, "many: out of memory");
	int started = 0;
	for (int i = 0; i < n && rc == 0; i++) {
		char name[64];
		snprintf(name, sizeof name, "many.%d", i);
		size_t count = many_count(o, i);
		if ((ids[i] = o->declare(o->ctx, name, UNISUM_FLOAT32, count, i % 7)) < 0) {
			rc = fail(ids[i], msg, len, "declare %s", name);
			break;
		}
		in[i] = malloc(count * sizeof(float));
		out[i] = i % 2 ? in[i] : calloc(count, sizeof(float));
		if (in[i] == NULL || out[i] == NULL)
			rc = fail(0, msg, len, "many: out of memory");
		else
			scn_fill(o, UNISUM_FLOAT32, 5000 + (uint64_t)i, in[i], count);
	}
	for (; started < n && rc == 0; started++)
		if ((rc = o->push_pull_async(o->ctx, ids[started], in[started], out[started], 0,
					     &hs[started])) != 0)
			rc = fail(rc, msg, len, "push_pull many.%d", started);
	if (rc == 0)
		rc = wait_reversed(o, hs, n, msg, len);
	for (int i = 0; i < n && rc == 0; i++)
		rc = scn_verify(o, "many", UNISUM_FLOAT32, 5000 + (uint64_t)i, out[i], many_count(o, i),
				false, msg, len);
	for (int i = 0; i < n && in != NULL && out != NULL; i++) {
		if (out[i] != in[i])
			free(out[i]);
		free(in[i]);
	}
	free(ids);
	free(hs);
	free(in);
	free(out);
	return rc;
}

/* ---- broadcast ----------------------------------------------------------- */

/* A broadcast from every root, the last first: every rank ends with the
 * root's input exactly. */
int scn_broadcast(struct scn_ops *o, char *msg, size_t len)
{
	size_t count = 3 * o->partition_bytes / sizeof(float) / 2 + 5;
	int t = o->declare(o->ctx, "broadcast", UNISUM_FLOAT32, count, 0);
	if (t < 0)
		return fail(t, msg, len, "declare broadcast");
	float *buf = o->alloc(o->ctx, count * sizeof *buf + 1, true);
	int rc = buf != NULL ? 0 : fail(0, msg, len, "broadcast: out of memory");
	for (int root = o->size - 1; root >= 0 && rc == 0; root--) {
		scn_fill(o, UNISUM_FLOAT32, 9000 + (uint64_t)o->rank, buf, count);
		unisum_handle h;
		if ((rc = o->broadcast_async(o->ctx, t, buf, root, &h)) == 0)
			rc = o->wait(o->ctx, h);
		if (rc != 0) {
			rc = fail(rc, msg, len, "broadcast from root %d", root);
			break;
		}
		for (size_t i = 0; i < count; i++) {
			uint32_t bits = (uint32_t)scn_gen_bits(UNISUM_FLOAT32, 9000 + (uint64_t)root, root, i);
			if (memcmp(&bits, &buf[i], sizeof bits) != 0) {
				float want;
				memcpy(&want, &bits, sizeof want);
				rc = fail(0, msg, len, "broadcast from root %d: element %zu is %g, expected %g",
					  root, i, buf[i], want);
				break;
			}
		}
	}
	o->free(o->ctx, buf);
	return rc;
}

/* ---- once ---------------------------------------------------------------- */

/* One-shot tensor i: int64 on even i (out of place), int32 on odd (in
 * place), of up to a few partitions. */
static int one_shot(struct scn_ops *o, int i, int *first, int64_t *in, int64_t *out, char *msg,
		    size_t len)
{
	char name[32];
	snprintf(name, sizeof name, "once.%d", i);
	unisum_dtype dt = i % 2 ? UNISUM_INT32 : UNISUM_INT64;
	size_t count = 1 + (size_t)i * 97 % 1600;
	int t = o->declare(o->ctx, name, dt, count, 0);
	if (t < 0)
		return fail(t, msg, len, "declare a one-shot tensor (%s)", name);
	if (*first < 0)
		*first = t;
	else if (t != *first)
		return fail(0, msg, len, "one-shot tensor %d got id %d, not the freed id %d", i, t, *first);
	void *res = i % 2 ? (void *)in : (void *)out;
	scn_fill(o, dt, 40000 + (uint64_t)i, in, count);
	int rc = push_pull(o, t, in, res, 0);
	if (rc != 0)
		return fail(rc, msg, len, "push_pull a one-shot tensor (%s)", name);
	if ((rc = scn_verify(o, name, dt, 40000 + (uint64_t)i, res, count, false, msg, len)) != 0)
		return rc;
	if ((rc = o->undeclare(o->ctx, t)) != 0)
		return fail(rc, msg, len, "undeclare a one-shot tensor (%s)", name);
	return 0;
}

int scn_once(struct scn_ops *o, int n, char *msg, size_t len)
{
	enum { MAX = 1600 };
	int64_t *in = malloc(MAX * sizeof *in), *out = malloc(MAX * sizeof *out);
	int first = -1, rc = in && out ? 0 : fail(0, msg, len, "once: out of memory");
	for (int i = 0; i < n && rc == 0; i++)
		rc = one_shot(o, i, &first, in, out, msg, len);
	if (rc == 0 && first >= 0) {
		int r = push_pull(o, first, in, in, 0);
		if (r != UNISUM_EINVAL)
			rc = fail(0, msg, len, "a push_pull of an undeclared id returned %d, not "
				  "UNISUM_EINVAL", r);
		else if ((r = o->undeclare(o->ctx, first)) != UNISUM_EINVAL)
			rc = fail(0, msg, len, "undeclaring an undeclared id returned %d, not "
				  "UNISUM_EINVAL", r);
	}
	free(in);
	free(out);
	return rc;
}

/* ---- disagree ------------------------------------------------------------ */

static double seconds_since(const struct timespec *t0)
{
	struct timespec t1;
	clock_gettime(CLOCK_MONOTONIC, &t1);
	return (double)(t1.tv_sec - t0->tv_sec) + (double)(t1.tv_nsec - t0->tv_nsec) / 1e9;
}

int scn_refuse_ms(int timeout_ms, int stall_abort_ms)
{
	int shorter = stall_abort_ms > 0 && stall_abort_ms < timeout_ms ? stall_abort_ms : timeout_ms;
	return shorter / 2;
}

/* One refused collective: rc must be UNISUM_EMISMATCH within o->refuse_ms
 * of t0, the message must name the tensor and both sides. */
static int expect_disagreement(const struct scn_ops *o, int rc, const struct timespec *t0,
			       const char *tensor, const char *a, const char *b, char *msg, size_t len)
{
	double took = seconds_since(t0);
	const char *err = unisum_last_error();
	char quoted[64];
	snprintf(quoted, sizeof quoted, "'%s'", tensor);
	if (rc != UNISUM_EMISMATCH || strstr(err, quoted) == NULL || strstr(err, a) == NULL ||
	    strstr(err, b) == NULL)
		return fail(0, msg, len, "a disagreement on %s returned %s (%s)", tensor,
			    unisum_strerror(rc), err);
	if (took * 1000.0 > o->refuse_ms)
		return fail(0, msg, len, "the disagreement on %s took %.2f s to fail, over %.2f s",
			    tensor, took, o->refuse_ms / 1000.0);
	say(o, "%s refused in %.3f s: %s", tensor, took, err);
	return 0;
}

/* A broadcast of `tensor` (declared now) from root, or a push_pull
 * (averaged when `average`) when root < 0; returns what it returned.  A
 * rank that comes late may find the tensor refused at its declaration
 * already: that is the same error. */
static int refused(const struct scn_ops *o, const char *tensor, unisum_dtype dt, int root,
		   void *in, void *out, bool average, size_t count)
{
	int rc = o->declare(o->ctx, tensor, dt, count, 0);
	if (rc < 0)
		return rc;
	unisum_handle h;
	int t = rc;
	rc = root >= 0 ? o->broadcast_async(o->ctx, t, in, root, &h)
		       : o->push_pull_async(o->ctx, t, in, out, average ? UNISUM_AVERAGE : 0, &h);
	return rc != 0 ? rc : o->wait(o->ctx, h);
}

/* Machine 0 against the rest, each machine agreeing within: only the
 * servers can see it. */
static int disagree_machines(const struct scn_ops *o, int32_t *buf, float *in, float *out,
			     size_t n, char *msg, size_t len)
{
	int L = o->local_size;
	bool machine0 = o->rank / L == 0;
	struct timespec t0;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	int rc = refused(o, "disagree.machines.root", UNISUM_INT32, machine0 ? 0 : L, buf, NULL, false, n);
	char root_l[48];
	snprintf(root_l, sizeof root_l, "a broadcast from root %d", L);
	rc = expect_disagreement(o, rc, &t0, "disagree.machines.root", "a broadcast from root 0",
				 root_l, msg, len);
	if (rc != 0)
		return rc;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	rc = refused(o, "disagree.machines.op", UNISUM_FLOAT32, -1, in, out, machine0, n);
	return expect_disagreement(o, rc, &t0, "disagree.machines.op", "an average", "a sum", msg, len);
}

/* Three rounds of a healthy tensor after the refusals. */
static int healthy_rounds(const struct scn_ops *o, int32_t *buf, size_t n, char *msg, size_t len)
{
	int t = o->declare(o->ctx, "healthy", UNISUM_INT32, n, 0);
	if (t < 0)
		return fail(t, msg, len, "declare healthy");
	for (int r = 0; r < 3; r++) {
		scn_fill(o, UNISUM_INT32, 11000 + (uint64_t)r, buf, n);
		int rc = push_pull(o, t, buf, buf, 0);
		if (rc != 0)
			return fail(rc, msg, len, "healthy push_pull after a disagreement");
		if ((rc = scn_verify(o, "after a disagreement", UNISUM_INT32, 11000 + (uint64_t)r, buf,
				     n, false, msg, len)) != 0)
			return rc;
	}
	return 0;
}

/* Rank 0 broadcasts from root 0, the others from root 1; then rank 0
 * averages what the others sum: every rank fails within refuse_ms naming both
 * sides, its buffers untouched (as unisum.h says: but for the machine's
 * sum a local root of a machine of several holds by then); with several
 * machines the same again with every machine agreeing within; then a
 * healthy tensor sums. */
int scn_disagree(struct scn_ops *o, char *msg, size_t len)
{
	enum { N = 1000 };
	int32_t buf[N], orig[N];
	float in[N], out[N], sentinel[N];
	struct timespec t0;
	int L = o->local_size;
	bool holds_local_sum = L > 1 && L < o->size && o->rank % L == 0;

	scn_fill(o, UNISUM_INT32, 31000 + (uint64_t)o->rank, buf, N);
	memcpy(orig, buf, sizeof buf);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	int rc = refused(o, "disagree.root", UNISUM_INT32, o->rank == 0 ? 0 : 1, buf, NULL, false, N);
	if ((rc = expect_disagreement(o, rc, &t0, "disagree.root", "a broadcast from root 0",
				      "a broadcast from root 1", msg, len)) != 0)
		return rc;
	if (!holds_local_sum && memcmp(buf, orig, sizeof buf) != 0)
		return fail(0, msg, len, "the refused broadcast wrote into the buffer");

	scn_fill(o, UNISUM_FLOAT32, 32000 + (uint64_t)o->rank, in, N);
	for (int i = 0; i < N; i++)
		sentinel[i] = out[i] = -12345.0f;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	rc = refused(o, "disagree.op", UNISUM_FLOAT32, -1, in, out, o->rank == 0, N);
	if ((rc = expect_disagreement(o, rc, &t0, "disagree.op", "an average", "a sum", msg, len)) != 0)
		return rc;
	for (int i = 0; i < N && !holds_local_sum; i++)
		if (memcmp(&out[i], &sentinel[i], sizeof out[i]) != 0)
			return fail(0, msg, len, "the refused push_pull wrote element %d of its output", i);

	if (L < o->size && (rc = disagree_machines(o, buf, in, out, N, msg, len)) != 0)
		return rc;
	return healthy_rounds(o, buf, N, msg, len);
}

/* ---- rounds -------------------------------------------------------------- */

int scn_rounds(struct scn_ops *o, unisum_dtype dt, size_t count, int n, char *msg, size_t len)
{
	int t = o->declare(o->ctx, "rounds", dt, count, 0);
	if (t < 0)
		return fail(t, msg, len, "declare rounds");
	size_t bytes = count * unisum_dtype_size(dt);
	uint8_t *in = o->alloc(o->ctx, bytes + 1, true), *out = o->alloc(o->ctx, bytes + 1, false);
	int rc = in && out ? 0 : fail(0, msg, len, "rounds: out of memory");
	for (int r = 0; r < n && rc == 0; r++) {
		uint8_t *res = r % 2 == 0 ? in : out;
		scn_fill(o, dt, 1000 + (uint64_t)r, in, count);
		if ((rc = push_pull(o, t, in, res, 0)) != 0)
			rc = fail(rc, msg, len, "rounds: round %d", r);
		else
			rc = scn_verify(o, "rounds", dt, 1000 + (uint64_t)r, res, count, false, msg, len);
	}
	o->free(o->ctx, in);
	o->free(o->ctx, out);
	return rc;
}
