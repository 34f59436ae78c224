/*
 * check_sums.c - a worker program for the integration tests.  Run it under
 * `unisum launch`; it checks what every worker receives against a reference
 * computed locally, and exits non-zero with a message on the first wrong
 * element.
 *
 * Six modes are the scenarios test_job.c runs too (tests/scenarios: sums,
 * rounds, many, broadcast, once, disagree), with their one generator and
 * reference: every worker can compute every other worker's input, and the
 * reference sums as the servers do (each machine's ranks in rank order,
 * then the machines), rounding as they do.  The other modes use the same.
 *
 *   check_sums ucx-available  exits 0 when the UCX transport is here, else 1 saying why
 *   check_sums sums [--big]   every dtype x boundary sizes (and 64 MiB with --big),
 *                             summed and averaged, in place and out of place;
 *                             prints a digest of every result
 *   check_sums rounds N       N rounds of a small tensor, inputs change every round
 *   check_sums many N         N tensors in flight at once
 *   check_sums shuffle        names declared in a different order on every worker
 *   check_sums broadcast      broadcast from every root, including non-zero ones
 *   check_sums undeclared     a push_pull of an undeclared id fails clearly
 *   check_sums mismatch       declaring a name with another size fails clearly
 *   check_sums once N         N one-shot tensors, each declared, summed and undeclared
 *                             (more than the local path's table holds at once); ids
 *                             are reused; declaring a name again before every rank
 *                             undeclared it is refused
 *   check_sums disagree       the ranks disagree on a broadcast's root, then on sum
 *                             against average: every rank fails soon (half the
 *                             shorter of UNISUM_TIMEOUT_MS and UNISUM_STALL_ABORT_MS)
 *                             naming both, its buffers untouched; with several machines
 *                             the same again with every machine agreeing within;
 *                             then a healthy round
 *   check_sums garbage PORT   rank 0 sends malformed streams to the server at
 *                             127.0.0.1:PORT; every worker then finishes rounds
 *   check_sums die R N        rank R is killed (SIGKILL) after N rounds; the
 *                             others keep pushing and exit 3 once their error
 *                             names "worker R", 1 otherwise
 *   check_sums stop R N       the same, but rank R stops (SIGSTOP): alive yet
 *                             silent, caught by the heartbeat timeout
 *   check_sums late MS        rank 1 pushes tensor 'late' MS ms after the others,
 *                             then enters a barrier MS ms after them
 *   check_sums auth PORT      with UNISUM_SECRET set: rank 0 tries the server at
 *                             127.0.0.1:PORT without the secret, with a wrong
 *                             tag and with a replayed handshake, and must be
 *                             hung up on each time; then every worker finishes rounds
 *   check_sums priority       rank 0 stops the servers (SIGSTOP to the pids in
 *                             UNISUM_TEST_SERVER_PIDS) so no credit comes back,
 *                             queues a 64-partition low-priority backlog, waits
 *                             until it has used up the credit, queues a
 *                             one-partition urgent tensor and lets the servers go
 *                             on (the send order is checked from the timeline by
 *                             test_pipeline.sh); both sums are checked
 *   check_sums failover N     N rounds of three tensors (int64 in place, int32 out of
 *                             place on many partitions, float32 averaged), all three
 *                             in flight at once, every element checked, and every 20
 *                             rounds a one-shot tensor (declared, summed, undeclared):
 *                             the servers may be killed meanwhile, and a replacement
 *                             join (server failover); prints the bytes pushed to each
 *                             server since it (re)connected; with
 *                             CHECK_SUMS_TIMES=1 each round's completion time
 *   check_sums compressed N   N rounds of compressed tensors (unisum_declare_ex), whose
 *                             exact results are known: fp16 with error feedback on
 *                             small integers (a sum of them is exact in fp16: every
 *                             residual stays 0), and onebit without scaling on +-1
 *                             (the sign of each machine's sum, then of their sum,
 *                             zero counting as +)
 *   (CHECK_SUMS_NO_SHUTDOWN=1: every mode ends by returning from main
 *   without unisum_shutdown; CHECK_SUMS_EARLY=1: in `rounds N` rank 0 runs
 *   one round only)
 *   check_sums tune N [MIB]   N rounds of a 1 MiB (or MIB MiB) int32 tensor and a
 *                             small one under autotune: every sum exact, and each
 *                             rank prints the partition size it used in every round
 *                             (the test compares the ranks' lines)
 *   check_sums skip           rank 1 never pushes tensor 'skipped' (it declares
 *                             new names until the job fails); every rank exits 3
 *                             once an error names the tensor
 *                             (UNISUM_STALL_ABORT_MS), 1 otherwise
 *   check_sums nobarrier      rank 1 never enters the barrier the others wait in
 *                             (it declares new names until the job fails); every
 *                             rank exits 3 once an error names the barrier and
 *                             worker 1 (UNISUM_STALL_ABORT_MS), 1 otherwise
 */
#include <arpa/inet.h>
#include <dirent.h>
#include <inttypes.h>
#include <malloc.h>
#include <math.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdbool.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "config/config.h"
#include "transport/auth.h"
#include "transport/transport.h"
#include "scenarios.h"
#include "check_sums/strangers.h"
#include "unisum.h"
#include "wire/wire.h"

static int rank, size;

#define FAIL(...)                                                                                  \
	do {                                                                                       \
		fprintf(stderr, "check_sums[rank %d] FAILED: ", rank);                             \
		fprintf(stderr, __VA_ARGS__);                                                      \
		fprintf(stderr, "\n");                                                             \
		exit(1);                                                                           \
	} while (0)

/* Ends a run whose failure was expected: shuts the library down first (a
 * failed job must still join every thread and close every socket), then
 * exits with 3 when the error named what it had to, 1 otherwise. */
static _Noreturn void expected_failure(bool named)
{
	unisum_shutdown();
	exit(named ? 3 : 1);
}

/* The wall clock in milliseconds (comparable across processes). */
static double now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static struct scn_ops api;	/* this rank's view of the job, for the scenarios */

/* The scenarios' input of this rank (scenarios.h's generator). */
static void fill(unisum_dtype dt, uint64_t salt, void *buf, size_t count)
{
	scn_fill(&api, dt, salt, buf, count);
}

static void verify(const char *what, unisum_dtype dt, uint64_t salt, const void *buf, size_t count,
		   bool average)
{
	char msg[512];
	if (scn_verify(&api, what, dt, salt, buf, count, average, msg, sizeof msg) != 0)
		FAIL("%s", msg);
}

/* A call that failed: says why, then shuts the library down as a careful
 * program would (a failed job must still join every thread), and exits 1. */
static void check(int rc, const char *what)
{
	if (rc >= 0)
		return;
	fprintf(stderr, "check_sums[rank %d] FAILED: %s: %s: %s\n", rank, what, unisum_strerror(rc),
		unisum_last_error());
	if (strcmp(what, "unisum_init") != 0 && strcmp(what, "unisum_shutdown") != 0)
		unisum_shutdown();
	exit(1);
}

static struct config cfg;	/* the library's own reading of the environment */

static size_t partition_elems(unisum_dtype dt)
{
	return api.partition_bytes / unisum_dtype_size(dt);
}

/* ---- the shared scenarios (tests/scenarios) on unisum.h ----------------- */

static int api_declare(void *ctx, const char *name, unisum_dtype dt, size_t count, int priority)
{
	(void)ctx;
	return unisum_declare(name, dt, count, priority);
}

static int api_push_pull_async(void *ctx, int t, const void *in, void *out, int flags,
			       unisum_handle *h)
{
	(void)ctx;
	return unisum_push_pull_async(t, in, out, flags, h);
}

static int api_poll(void *ctx, unisum_handle h)
{
	(void)ctx;
	return unisum_poll(h);
}

static int api_wait(void *ctx, unisum_handle h)
{
	(void)ctx;
	return unisum_wait(h);
}

static int api_broadcast_async(void *ctx, int t, void *buf, int root, unisum_handle *h)
{
	(void)ctx;
	return unisum_broadcast_async(t, buf, root, h);
}

static int api_undeclare(void *ctx, int t)
{
	(void)ctx;
	return unisum_undeclare(t);
}

/* Where the scenarios' buffers come from (CHECK_SUMS_ALLOC): "all": from
 * unisum_alloc; "mixed": even ranks take inputs from unisum_alloc and
 * outputs from malloc, odd ranks the other way round; unset: malloc. */
static void *api_alloc(void *ctx, size_t bytes, bool input)
{
	(void)ctx;
	const char *how = getenv("CHECK_SUMS_ALLOC");
	bool shared = how != NULL && (strcmp(how, "all") == 0 ||
				      (strcmp(how, "mixed") == 0 && (rank % 2 == 0) == input));
	return shared ? unisum_alloc(bytes) : malloc(bytes);
}

static void api_free(void *ctx, void *p)
{
	(void)ctx;
	if (getenv("CHECK_SUMS_ALLOC") != NULL)
		unisum_free(p);	/* also takes malloc's memory */
	else
		free(p);
}

static void api_say(void *ctx, const char *line)
{
	(void)ctx;
	printf("rank %d: %s\n", rank, line);
}

/* The table the scenarios call, after unisum_init; its refusals' bound
 * from the job's timeouts (cfg, loaded here). */
static void api_setup(void)
{
	const char *p = getenv("UNISUM_PARTITION_BYTES");
	char err[512];
	if (config_load(&cfg, err, sizeof err) != 0)
		FAIL("the configuration: %s", err);
	api = (struct scn_ops){
		.rank = rank, .size = size, .local_size = unisum_local_size(),
		.machines = size / unisum_local_size(),
		.partition_bytes = p ? strtoull(p, NULL, 10) : 4096000,
		.refuse_ms = scn_refuse_ms(cfg.timeout_ms, cfg.stall_abort_ms),
		.declare = api_declare, .push_pull_async = api_push_pull_async, .poll = api_poll,
		.wait = api_wait, .broadcast_async = api_broadcast_async, .undeclare = api_undeclare,
		.alloc = api_alloc, .free = api_free, .say = api_say, .digest = SCN_DIGEST_START,
	};
}

/* A scenario's end: on an error, says why, shuts the library down (a
 * failed job must still join every thread) and exits 1. */
static void scenario(int rc, const char *msg)
{
	if (rc == 0)
		return;
	fprintf(stderr, "check_sums[rank %d] FAILED: %s\n", rank, msg);
	unisum_shutdown();
	exit(1);
}

static void mode_sums(bool big)
{
	char msg[512];
	scenario(scn_sums(&api, big, msg, sizeof msg), msg);
	printf("rank %d: sums ok, digest %016llx\n", rank, (unsigned long long)api.digest);
}

/* CHECK_SUMS_EARLY=1: rank 0 runs one round only and ends, while the
 * others wait on it for the next. */
static void mode_rounds(int n)
{
	const char *early = getenv("CHECK_SUMS_EARLY");
	if (rank == 0 && early != NULL && strcmp(early, "1") == 0 && n > 1)
		n = 1;
	char msg[512];
	scenario(scn_rounds(&api, UNISUM_INT64, 37, n, msg, sizeof msg), msg);
	printf("rank %d: %d rounds ok\n", rank, n);
}

/* Server failover: N rounds of three tensors in flight at once (int64 in
 * place, int32 out of place over many partitions, float32 averaged in
 * place), every element checked, while the test kills servers.  Prints
 * the bytes pushed to each server, in order (a server that took part
 * after it joined has a non-zero count). */
static void mode_failover(int n)
{
	enum { A = 37, B = 100003, C = 30011 };
	/* CHECK_SUMS_TIMES=1: when each round completed (bench/failover.sh). */
	const char *t_env = getenv("CHECK_SUMS_TIMES");
	bool times = t_env != NULL && strcmp(t_env, "1") == 0;
	int ta = unisum_declare("fo.a", UNISUM_INT64, A, 2);
	int tb = unisum_declare("fo.b", UNISUM_INT32, B, 1);
	int tc = unisum_declare("fo.c", UNISUM_FLOAT32, C, 0);
	check(ta, "declare fo.a");
	check(tb, "declare fo.b");
	check(tc, "declare fo.c");
	int64_t *a = malloc(A * sizeof *a);
	int32_t *bin = malloc(B * sizeof *bin), *bout = malloc(B * sizeof *bout);
	float *c = malloc(C * sizeof *c);
	if (a == NULL || bin == NULL || bout == NULL || c == NULL)
		FAIL("out of memory");
	for (int r = 0; r < n; r++) {
		fill(UNISUM_INT64, 5000 + 3 * (uint64_t)r, a, A);
		fill(UNISUM_INT32, 5001 + 3 * (uint64_t)r, bin, B);
		fill(UNISUM_FLOAT32, 5002 + 3 * (uint64_t)r, c, C);
		unisum_handle h[3];
		check(unisum_push_pull_async(ta, a, a, 0, &h[0]), "fo.a");
		check(unisum_push_pull_async(tb, bin, bout, 0, &h[1]), "fo.b");
		check(unisum_push_pull_async(tc, c, c, UNISUM_AVERAGE, &h[2]), "fo.c");
		for (int i = 0; i < 3; i++)
			check(unisum_wait(h[i]), "fo wait");
		verify("fo.a", UNISUM_INT64, 5000 + 3 * (uint64_t)r, a, A, false);
		verify("fo.b", UNISUM_INT32, 5001 + 3 * (uint64_t)r, bout, B, false);
		verify("fo.c", UNISUM_FLOAT32, 5002 + 3 * (uint64_t)r, c, C, true);
		if (r % 20 == 19) {
			/* A one-shot tensor, placed now: on a replacement server
			 * too, once one came back. */
			enum { O = 20011 };
			char name[64];
			snprintf(name, sizeof name, "fo.once.%d", r);
			int to = unisum_declare(name, UNISUM_INT32, O, 0);
			check(to, "declare fo.once");
			fill(UNISUM_INT32, 7000 + (uint64_t)r, bin, O);
			check(unisum_push_pull(to, bin, bout, 0), "fo.once");
			verify(name, UNISUM_INT32, 7000 + (uint64_t)r, bout, O, false);
			check(unisum_undeclare(to), "undeclare fo.once");
		}
		if (times)
			printf("round %d done at %.3f ms\n", r, now_ms());
		else if (rank == 0 && r % 100 == 0)
			printf("rank 0: round %d ok\n", r);
	}
	free(a);
	free(bin);
	free(bout);
	free(c);
	unisum_stats st;
	check(unisum_get_stats(&st), "stats");
	printf("rank %d: bytes to each server since it (re)connected:", rank);
	for (int i = 0; i < st.nservers && i < UNISUM_STATS_SERVERS; i++)
		printf(" %llu", (unsigned long long)st.server_bytes[i]);
	printf("\n");
	printf("rank %d: %d failover rounds ok\n", rank, n);
}

/* Rank r's element i of compressed round `round`: a small integer. */
static float comp_value(int r, int round, size_t i)
{
	return (float)((int)((i * 7 + (size_t)round * 13 + (size_t)r * 5) % 61) - 30);
}

static void mode_compressed(int n)
{
	const char *t_env = getenv("CHECK_SUMS_TIMES");
	bool times = t_env != NULL && strcmp(t_env, "1") == 0;
	enum { COUNT = 100003 };	/* 400 KB: above UNISUM_MIN_COMPRESS_BYTES */
	int L = unisum_local_size(), M = size / L;
	int t16 = unisum_declare_ex("comp.fp16", UNISUM_FLOAT32, COUNT, 0, "fp16,ef=vanilla");
	check(t16, "declare comp.fp16");
	int t1 = unisum_declare_ex("comp.onebit", UNISUM_FLOAT32, COUNT, 1, "onebit,scaling=0");
	check(t1, "declare comp.onebit");
	float *a = malloc(COUNT * sizeof *a), *b = malloc(COUNT * sizeof *b);
	float *oa = malloc(COUNT * sizeof *oa), *ob = malloc(COUNT * sizeof *ob);
	if (!a || !b || !oa || !ob) {
		fprintf(stderr, "check_sums: out of memory\n");
		exit(1);
	}
	for (int round = 0; round < n; round++) {
		for (size_t i = 0; i < COUNT; i++) {
			a[i] = comp_value(rank, round, i);
			b[i] = comp_value(rank, round, i) < 0 ? -1.0f : 1.0f;
		}
		unisum_handle h16, h1;
		check(unisum_push_pull_async(t16, a, oa, round % 2 ? UNISUM_AVERAGE : 0, &h16),
		      "push_pull comp.fp16");
		check(unisum_push_pull_async(t1, b, ob, 0, &h1), "push_pull comp.onebit");
		check(unisum_wait(h16), "wait comp.fp16");
		check(unisum_wait(h1), "wait comp.onebit");
		for (size_t i = 0; i < COUNT; i++) {
			float sum = 0;
			int votes = 0;
			for (int m = 0; m < M; m++) {
				float ms = 0;
				for (int j = 0; j < L; j++) {
					sum += comp_value(m * L + j, round, i);
					ms += comp_value(m * L + j, round, i) < 0 ? -1.0f : 1.0f;
				}
				votes += ms < 0 ? -1 : 1;
			}
			float want16 = round % 2 ? sum / (float)size : sum, want1 = votes < 0 ? -1.0f : 1.0f;
			if (oa[i] != want16 || ob[i] != want1) {
				fprintf(stderr, "check_sums: rank %d compressed round %d element %zu: fp16 %g "
					"(expected %g), onebit %g (expected %g)\n", rank, round, i, oa[i],
					want16, ob[i], want1);
				exit(1);
			}
		}
		if (times)	/* (bench/soak_kills.sh: a round after a kill) */
			printf("round %d done at %.3f ms\n", round, now_ms());
	}
	free(a);
	free(b);
	free(oa);
	free(ob);
	printf("rank %d: %d compressed rounds ok\n", rank, n);
}

static void mode_many(int n)
{
	char msg[512];
	scenario(scn_many(&api, n, msg, sizeof msg), msg);
	printf("rank %d: %d tensors in flight ok\n", rank, n);
}

static void mode_shuffle(void)
{
	enum { N = 40 };
	int order[N], ids[N];
	for (int i = 0; i < N; i++)
		order[i] = i;
	srand((unsigned)(rank * 7919 + 1));
	for (int i = N - 1; i > 0; i--) {
		int j = rand() % (i + 1), tmp = order[i];
		order[i] = order[j];
		order[j] = tmp;
	}
	for (int k = 0; k < N; k++) {
		int i = order[k];
		char name[64];
		snprintf(name, sizeof name, "shuffle.%d", i);
		ids[i] = unisum_declare(name, UNISUM_INT32, 100 + (size_t)i * 1000, 0);
		check(ids[i], name);
	}
	for (int i = 0; i < N; i++) {
		size_t count = 100 + (size_t)i * 1000;
		int32_t *buf = malloc(count * sizeof *buf);
		fill(UNISUM_INT32, 7000 + (uint64_t)i, buf, count);
		check(unisum_push_pull(ids[i], buf, buf, 0), "shuffle push_pull");
		verify("shuffle", UNISUM_INT32, 7000 + (uint64_t)i, buf, count, false);
		free(buf);
	}
	printf("rank %d: shuffled declarations ok\n", rank);
}

static void mode_broadcast(void)
{
	char msg[512];
	scenario(scn_broadcast(&api, msg, sizeof msg), msg);
	printf("rank %d: broadcast ok\n", rank);
}

static void finish_round(const char *after)
{
	int t = unisum_declare("healthy", UNISUM_INT32, 1000, 0);
	check(t, "declare healthy");
	int32_t buf[1000];
	for (int r = 0; r < 3; r++) {
		fill(UNISUM_INT32, 11000 + (uint64_t)r, buf, 1000);
		check(unisum_push_pull(t, buf, buf, 0), "healthy push_pull");
		verify(after, UNISUM_INT32, 11000 + (uint64_t)r, buf, 1000, false);
	}
}

static void mode_undeclared(void)
{
	int32_t buf[4] = {0};
	int rc = unisum_push_pull(4242, buf, buf, 0);
	if (rc != UNISUM_EINVAL || strstr(unisum_last_error(), "never declared") == NULL)
		FAIL("push_pull of an undeclared id returned %d (%s)", rc, unisum_last_error());
	printf("rank %d: undeclared id rejected: %s\n", rank, unisum_last_error());
	finish_round("after an undeclared id");
	printf("rank %d: round after undeclared ok\n", rank);
}

static void mode_mismatch(void)
{
	/* Rank 0 declares first and starts pushing; every other rank then
	 * declares another size.  Every rank must fail, none may hang. */
	float early[10] = {0};
	unisum_handle h = 0;
	if (rank == 0) {
		int t = unisum_declare("mismatched", UNISUM_FLOAT32, 10, 0);
		check(t, "declare mismatched");
		check(unisum_push_pull_async(t, early, early, 0, &h), "push_pull_async mismatched");
	}
	check(unisum_barrier(), "barrier");
	if (rank != 0) {
		int rc = unisum_declare("mismatched", UNISUM_FLOAT32, 20 + (size_t)rank, 0);
		const char *msg = unisum_last_error();
		if (rc != UNISUM_EMISMATCH || strstr(msg, "float32[10]") == NULL || strstr(msg, "mismatched") == NULL)
			FAIL("mismatched declare returned %d (%s)", rc, msg);
		printf("rank %d: mismatch rejected: %s\n", rank, msg);
	}
	check(unisum_barrier(), "barrier");
	if (rank == 0) {
		/* The push_pull already in flight fails with both shapes. */
		int rc = unisum_wait(h);
		const char *msg = unisum_last_error();
		if (rc != UNISUM_EMISMATCH || strstr(msg, "float32[10]") == NULL || strstr(msg, "float32[2") == NULL)
			FAIL("the in-flight push_pull of a mismatched tensor returned %d (%s)", rc, msg);
		printf("rank %d: in-flight push_pull failed: %s\n", rank, msg);
	}
	finish_round("after a mismatch");
	printf("rank %d: round after mismatch ok\n", rank);
}

static void mode_once(int n)
{
	char msg[512];
	int32_t buf[8];
	scenario(scn_once(&api, n, msg, sizeof msg), msg);
	printf("rank %d: %d one-shot tensors ok\n", rank, n);

	/* Rank 0 declares a name again while the others still hold it. */
	int t = unisum_declare("again", UNISUM_INT32, 8, 0);
	check(t, "declare again");
	fill(UNISUM_INT32, 41000, buf, 8);
	check(unisum_push_pull(t, buf, buf, 0), "push_pull again");
	if (rank == 0) {
		check(unisum_undeclare(t), "undeclare again");
		int rc = unisum_declare("again", UNISUM_INT32, 8, 0);
		if (rc != UNISUM_EINVAL || strstr(unisum_last_error(), "new name") == NULL)
			FAIL("declaring 'again' anew before the others undeclared it returned %d (%s)", rc,
			     unisum_last_error());
		printf("rank %d: early re-declaration refused: %s\n", rank, unisum_last_error());
	}
	check(unisum_barrier(), "barrier");
	if (rank != 0)
		check(unisum_undeclare(t), "undeclare again");
	finish_round("after one-shot tensors");
}

static void mode_disagree(void)
{
	char msg[512];
	scenario(scn_disagree(&api, msg, sizeof msg), msg);
	printf("rank %d: round after disagreement ok\n", rank);
}

static void mode_auth(int port)
{
	if (rank == 0)
		strangers_auth(port, rank);
	check(unisum_barrier(), "barrier");
	finish_round("after the strangers");
	printf("rank %d: rounds after the strangers ok\n", rank);
}

static void mode_garbage(int port)
{
	if (rank == 0)
		strangers_garbage(port, rank);
	check(unisum_barrier(), "barrier");
	finish_round("after garbage");
	printf("rank %d: rounds after garbage ok\n", rank);
}

static void mode_die(int victim, int rounds, int sig)
{
	int t = unisum_declare("die", UNISUM_INT32, 1000, 0);
	check(t, "declare die");
	int32_t buf[1000];
	for (int r = 0;; r++) {
		if (rank == victim && r == rounds) {
			printf("rank %d: sending myself %s after %d rounds\n", rank, strsignal(sig), r);
			fflush(stdout);
			raise(sig);
		}
		fill(UNISUM_INT32, 13000 + (uint64_t)r, buf, 1000);
		int rc = unisum_push_pull(t, buf, buf, 0);
		if (rc != 0) {
			char want[32];
			snprintf(want, sizeof want, "worker %d", victim);
			const char *msg = unisum_last_error();
			printf("rank %d: round %d failed: %s\n", rank, r, msg);
			expected_failure(strstr(msg, want) != NULL);
		}
		verify("die", UNISUM_INT32, 13000 + (uint64_t)r, buf, 1000, false);
	}
}

static void mode_late(int ms)
{
	int t = unisum_declare("late", UNISUM_INT32, 1000, 0);
	check(t, "declare late");
	int32_t buf[1000];
	fill(UNISUM_INT32, 15000, buf, 1000);
	if (rank == 1)
		nanosleep(&(struct timespec){ms / 1000, (long)(ms % 1000) * 1000000}, NULL);
	check(unisum_push_pull(t, buf, buf, 0), "push_pull late");
	verify("late", UNISUM_INT32, 15000, buf, 1000, false);
	if (rank == 1)
		nanosleep(&(struct timespec){ms / 1000, (long)(ms % 1000) * 1000000}, NULL);
	check(unisum_barrier(), "barrier after late");
	printf("rank %d: late round ok\n", rank);
}

/* Whether every thread of process `pid` is stopped (kill() only queues
 * SIGSTOP; a thread on another core may run on for a moment). */
static bool all_threads_stopped(pid_t pid)
{
	char path[64];
	snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
	DIR *d = opendir(path);
	if (d == NULL)
		return false;
	bool stopped = true;
	for (struct dirent *e; stopped && (e = readdir(d)) != NULL;) {
		if (e->d_name[0] == '.')
			continue;
		char stat[320], buf[512];
		snprintf(stat, sizeof stat, "/proc/%d/task/%s/stat", (int)pid, e->d_name);
		FILE *f = fopen(stat, "r");
		if (f == NULL)
			continue;
		size_t n = fread(buf, 1, sizeof buf - 1, f);
		fclose(f);
		buf[n] = '\0';
		const char *state = strrchr(buf, ')');	/* "pid (comm) S ..." */
		stopped = state != NULL && (state[2] == 'T' || state[2] == 't');
	}
	closedir(d);
	return stopped;
}

static void mode_priority(void)
{
	size_t pe = partition_elems(UNISUM_INT32);
	size_t nb = 64 * pe;
	int low = unisum_declare("backlog", UNISUM_INT32, nb, 0);
	check(low, "declare backlog");
	int high = unisum_declare("urgent", UNISUM_INT32, pe, 100);
	check(high, "declare urgent");
	int32_t *a = malloc(nb * sizeof *a), *b = malloc(pe * sizeof *b);
	if (a == NULL || b == NULL)
		FAIL("out of memory");
	fill(UNISUM_INT32, 17000, a, nb);
	fill(UNISUM_INT32, 17001, b, pe);
	/* Rank 0 stops the servers: they acknowledge nothing, so no credit
	 * comes back until they go on. */
	pid_t servers[8];
	int nservers = 0;
	const char *pids = getenv("UNISUM_TEST_SERVER_PIDS");
	if (rank == 0) {
		if (pids == NULL)
			FAIL("priority needs UNISUM_TEST_SERVER_PIDS");
		for (char *p = (char *)pids, *end; *p && nservers < 8; p = end) {
			long v = strtol(p, &end, 10);
			if (end == p)
				break;
			servers[nservers++] = (pid_t)v;
		}
		for (int i = 0; i < nservers; i++)
			if (kill(servers[i], SIGSTOP) != 0)
				FAIL("cannot stop server pid %d", (int)servers[i]);
		for (int i = 0; i < nservers; i++)
			for (int tries = 0; !all_threads_stopped(servers[i]); tries++) {
				if (tries == 10000)
					FAIL("server pid %d did not stop", (int)servers[i]);
				nanosleep(&(struct timespec){0, 1000000L}, NULL);
			}
	}
	unisum_handle ha, hb;
	check(unisum_push_pull_async(low, a, a, 0, &ha), "push_pull backlog");
	if (rank == 0) {
		/* Until the credit is used up: the urgent tensor is then queued
		 * behind 62 partitions with no credit left. */
		unisum_stats st = {0};
		uint64_t want = 0;
		for (int i = 0; i < 10000; i++) {
			check(unisum_get_stats(&st), "unisum_get_stats");
			want = st.credit_bytes / (pe * sizeof(int32_t));
			if (st.partitions_sent >= want)
				break;
			nanosleep(&(struct timespec){0, 1000000L}, NULL);
		}
		if (st.partitions_sent < want)
			FAIL("the PUSH stage sent %" PRIu64 " partitions in 10 s, want %" PRIu64,
			     st.partitions_sent, want);
	}
	check(unisum_push_pull_async(high, b, b, 0, &hb), "push_pull urgent");
	for (int i = 0; i < nservers; i++)
		kill(servers[i], SIGCONT);
	check(unisum_wait(hb), "wait urgent");
	check(unisum_wait(ha), "wait backlog");
	verify("backlog", UNISUM_INT32, 17000, a, nb, false);
	verify("urgent", UNISUM_INT32, 17001, b, pe, false);
	free(a);
	free(b);
	printf("rank %d: priority sums ok\n", rank);
}

static void mode_tune(int n, int mib)
{
	enum { SMALL = 1000 };
	const size_t nbig = (size_t)(mib > 0 ? mib : 1) << 18;
	int big = unisum_declare("tuned.big", UNISUM_INT32, nbig, 0);
	check(big, "declare tuned.big");
	int small = unisum_declare("tuned.small", UNISUM_INT64, SMALL, 1);
	check(small, "declare tuned.small");
	int32_t *a = malloc(nbig * sizeof *a);
	int64_t b[SMALL];
	if (a == NULL)
		FAIL("out of memory");
	printf("rank %d: partition bytes by round:", rank);
	for (int r = 0; r < n; r++) {
		fill(UNISUM_INT32, 19000 + (uint64_t)r, a, nbig);
		fill(UNISUM_INT64, 29000 + (uint64_t)r, b, SMALL);
		unisum_handle ha, hb;
		check(unisum_push_pull_async(big, a, a, 0, &ha), "push_pull tuned.big");
		check(unisum_push_pull_async(small, b, b, 0, &hb), "push_pull tuned.small");
		check(unisum_wait(ha), "wait tuned.big");
		check(unisum_wait(hb), "wait tuned.small");
		verify("tuned.big", UNISUM_INT32, 19000 + (uint64_t)r, a, nbig, false);
		verify("tuned.small", UNISUM_INT64, 29000 + (uint64_t)r, b, SMALL, false);
		unisum_stats st;
		check(unisum_get_stats(&st), "unisum_get_stats");
		printf(" %" PRIu64, st.partition_bytes);
	}
	printf("\nrank %d: %d tuned rounds ok\n", rank, n);
	free(a);
}

/* Rank 1's wait that is no collective: it asks the scheduler for fresh
 * names until that fails (the job failed), for at most 60 s. */
static int wait_for_failure(void)
{
	for (int i = 0; i < 1200; i++) {
		char name[32];
		snprintf(name, sizeof name, "probe.%d", i);
		int rc = unisum_declare(name, UNISUM_INT32, 1, 0);
		if (rc < 0)
			return rc;
		nanosleep(&(struct timespec){0, 50000000L}, NULL);
	}
	return 0;
}

static void mode_skip(void)
{
	int t = unisum_declare("skipped", UNISUM_INT32, 1000, 0);
	check(t, "declare skipped");
	int32_t buf[1000] = {0};
	int rc = rank == 1 ? wait_for_failure() : unisum_push_pull(t, buf, buf, 0);
	const char *msg = unisum_last_error();
	printf("rank %d: %s returned %d: %s\n", rank, rank == 1 ? "waiting" : "push_pull", rc, msg);
	expected_failure(rc != 0 && strstr(msg, "'skipped'") != NULL);
}

static void mode_nobarrier(void)
{
	int rc = rank == 1 ? wait_for_failure() : unisum_barrier();
	const char *msg = unisum_last_error();
	printf("rank %d: %s returned %d: %s\n", rank, rank == 1 ? "waiting" : "barrier", rc, msg);
	expected_failure(rc != 0 && strstr(msg, "barrier") != NULL && strstr(msg, "worker 1") != NULL);
}

/* Under `unisum launch`, Horovod's and torchrun's variables must agree
 * with the library: what a ported program reads before init() is what it
 * gets after. */
static void check_launch_env(void)
{
	const char *launched = getenv("UNISUM_LAUNCHED");
	if (launched == NULL || strcmp(launched, "1") != 0)
		return;
	int L = unisum_local_size();
	const struct {
		const char *name;
		int want;
	} vars[] = {
		{"HOROVOD_RANK", rank}, {"HOROVOD_SIZE", size},
		{"HOROVOD_LOCAL_RANK", unisum_local_rank()}, {"HOROVOD_LOCAL_SIZE", L},
		{"HOROVOD_CROSS_RANK", rank / L}, {"HOROVOD_CROSS_SIZE", size / L},
		{"RANK", rank}, {"WORLD_SIZE", size},
		{"LOCAL_RANK", unisum_local_rank()}, {"LOCAL_WORLD_SIZE", L},
	};
	for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
		const char *v = getenv(vars[i].name);
		if (v == NULL || atoi(v) != vars[i].want)
			FAIL("%s is %s under unisum launch, not %d", vars[i].name, v ? v : "unset",
			     vars[i].want);
	}
	/* torchrun's master: where rank 0 serves torch.distributed's store. */
	const char *addr = getenv("MASTER_ADDR"), *port = getenv("MASTER_PORT");
	if (addr == NULL || *addr == '\0' || port == NULL || atoi(port) <= 0 || atoi(port) > 65535)
		FAIL("MASTER_ADDR and MASTER_PORT are '%s' and '%s' under unisum launch, not an "
		     "address and a port", addr ? addr : "unset", port ? port : "unset");
}

/* Keeps freed buffers for the next tensor, as a framework's caching
 * allocator does: glibc would otherwise map every large buffer anew and
 * the kernel zero it page by page, a sixth of the suite's check_sums
 * time. */
static void keep_freed_buffers(void)
{
	mallopt(M_MMAP_THRESHOLD, 1 << 30);
	mallopt(M_TRIM_THRESHOLD, INT32_MAX);
}

/* CHECK_SUMS_HOLD=DIR (test_metrics.sh): writes this rank's bytes per
 * server, as unisum_get_stats gives them, to DIR/rank<R>, then stays in
 * the job until DIR/go exists (60 s at most), so that the scheduler's
 * metrics can be read while every count is final. */
static void hold_for_scrape(const unisum_stats *st)
{
	const char *dir = getenv("CHECK_SUMS_HOLD");
	if (dir == NULL || dir[0] == '\0')
		return;
	char path[512], tmp[520];
	snprintf(path, sizeof path, "%s/rank%d", dir, rank);
	snprintf(tmp, sizeof tmp, "%s.tmp", path);
	FILE *f = fopen(tmp, "w");
	if (f == NULL)
		FAIL("cannot write %s", tmp);
	for (int s = 0; s < st->nservers && s < UNISUM_STATS_SERVERS; s++)
		fprintf(f, "%d %" PRIu64 "\n", s, st->server_bytes[s]);
	fclose(f);
	rename(tmp, path);
	snprintf(path, sizeof path, "%s/go", dir);
	for (int i = 0; i < 600 && access(path, F_OK) != 0; i++)
		usleep(100 * 1000);
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: check_sums MODE [ARG]\n");
		return 2;
	}
	if (strcmp(argv[1], "free-port") == 0)
		return strangers_free_port();
	if (strcmp(argv[1], "ucx-available") == 0) {
		char why[400];
		bool here = transport_ucx(why, sizeof why) != NULL;
		printf("%s\n", here ? "yes" : why);
		return here ? 0 : 1;
	}
	keep_freed_buffers();
	check(unisum_init(), "unisum_init");
	rank = unisum_rank();
	size = unisum_size();
	check_launch_env();
	api_setup();
	const char *mode = argv[1];
	int arg = argc > 2 ? atoi(argv[2]) : 0;
	if (strcmp(mode, "sums") == 0)
		mode_sums(argc > 2 && strcmp(argv[2], "--big") == 0);
	else if (strcmp(mode, "rounds") == 0)
		mode_rounds(arg);
	else if (strcmp(mode, "compressed") == 0)
		mode_compressed(arg);
	else if (strcmp(mode, "failover") == 0)
		mode_failover(arg);
	else if (strcmp(mode, "many") == 0)
		mode_many(arg);
	else if (strcmp(mode, "shuffle") == 0)
		mode_shuffle();
	else if (strcmp(mode, "broadcast") == 0)
		mode_broadcast();
	else if (strcmp(mode, "undeclared") == 0)
		mode_undeclared();
	else if (strcmp(mode, "mismatch") == 0)
		mode_mismatch();
	else if (strcmp(mode, "disagree") == 0)
		mode_disagree();
	else if (strcmp(mode, "once") == 0)
		mode_once(arg);
	else if (strcmp(mode, "garbage") == 0)
		mode_garbage(arg);
	else if (strcmp(mode, "die") == 0 && argc > 3)
		mode_die(arg, atoi(argv[3]), SIGKILL);
	else if (strcmp(mode, "auth") == 0)
		mode_auth(arg);
	else if (strcmp(mode, "late") == 0)
		mode_late(arg);
	else if (strcmp(mode, "skip") == 0)
		mode_skip();
	else if (strcmp(mode, "nobarrier") == 0)
		mode_nobarrier();
	else if (strcmp(mode, "priority") == 0)
		mode_priority();
	else if (strcmp(mode, "tune") == 0)
		mode_tune(arg, argc > 3 ? atoi(argv[3]) : 1);
	else if (strcmp(mode, "stop") == 0 && argc > 3)
		mode_die(arg, atoi(argv[3]), SIGSTOP);
	else
		FAIL("unknown mode %s", mode);
	/* The PUSH stage never had more bytes in flight than its credit (or
	 * one partition, which may exceed a small credit and then goes alone). */
	unisum_stats st;
	check(unisum_get_stats(&st), "unisum_get_stats");
	uint64_t bound = st.credit_bytes > st.partition_bytes ? st.credit_bytes : st.partition_bytes;
	/* Under autotune (search or fit, UNISUM_AUTOTUNE's auto resolved by
	 * config_load) the credit changed meanwhile: what was in flight under
	 * a larger one drains under the smaller. */
	if (cfg.autotune == 0 && st.max_inflight_bytes > bound)
		FAIL("%" PRIu64 " bytes were in flight at once, above the credit of %" PRIu64,
		     st.max_inflight_bytes, st.credit_bytes);
	printf("rank %d: at most %" PRIu64 " bytes in flight (credit %" PRIu64 "), %" PRIu64
	       " partitions sent\n", rank, st.max_inflight_bytes, st.credit_bytes, st.partitions_sent);
	hold_for_scrape(&st);
	/* CHECK_SUMS_NO_SHUTDOWN=1: main returns without unisum_shutdown, as
	 * BytePS and Horovod programs do; the library leaves at exit. */
	const char *no_shutdown = getenv("CHECK_SUMS_NO_SHUTDOWN");
	if (no_shutdown == NULL || strcmp(no_shutdown, "1") != 0)
		check(unisum_shutdown(), "unisum_shutdown");
	return 0;
}
