/*
 * chaos_modes.c - a worker program for the chaos tests of every sync mode
 * (tests/integration/test_chaos_modes.sh): N steps of integer-valued
 * updates whose exact answer every worker knows, so that "no update lost,
 * none applied twice" is an equality on every element.  Each step waits
 * CHAOS_STEP_MS (default 2) so that a job lasts long enough to lose its
 * processes along the way.  Exits 0 after printing "MODE N steps ok", or
 * 1 with the first wrong element.  CHECK_SUMS_TIMES=1 prints when each
 * step completed; CHAOS_COUNT sets the elements of each tensor (50021).
 *
 *   chaos_modes async N      an async tensor: the first push_pull sets the
 *                            value (rank 0's zeros; others' deltas may be
 *                            in it already), each later one adds 1 to every
 *                            element; after a barrier a zero push reads
 *                            size x N everywhere (each step's answer lies
 *                            between this rank's own count and that)
 *   chaos_modes ssp:S N      the same in SSP with staleness S
 *   chaos_modes dssync:G N   every step averages 1s within the step's group
 *                            (floor division): exactly 1, whatever the group
 *   chaos_modes allgather N  rank r gives r + 1 elements of r*1000 + step;
 *                            every rank checks the whole concatenation
 *   chaos_modes mix N        async, ssp:2 and allgather in one job: each
 *                            step runs one of each, checked as above
 *   chaos_modes held N       async and ssp:2 (the tensors whose value a
 *                            server holds: UNISUM_REPLICAS moves them)
 *   chaos_modes gathers N    each step an allgather (as above), a
 *                            reduce-scatter (rank r gives r + step + i
 *                            at element i: a slice sums to size (step +
 *                            i) + size (size - 1) / 2) and an alltoall
 *                            (rank s sends d its rows of s*100 + d +
 *                            step): the gathering collectives, whose
 *                            homed cuts move with a lost server
 *   chaos_modes feedback N   compressed tensors whose servers keep error
 *                            feedback from round to round (onebit with
 *                            scaling, top-k; both ef=vanilla): no exact
 *                            answer is known, but every step is
 *                            deterministic, so each rank prints a hash of
 *                            every output, which a run that loses servers
 *                            must print too (test_chaos_modes.sh runs
 *                            the job twice)
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "unisum.h"

/* Elements of each tensor: several partitions at the default size, or
 * CHAOS_COUNT (bench/replicas.sh). */
static size_t nelem = 50021;

static int rank, size;

static void check(int rc, const char *what)
{
	if (rc < 0) {
		fprintf(stderr, "chaos_modes[rank %d] FAILED: %s: %s\n", rank, what,
			unisum_last_error());
		exit(1);
	}
}

static void wrong(const char *mode, int step, size_t i, long long got, long long want)
{
	fprintf(stderr, "chaos_modes[rank %d] FAILED: %s step %d: element %zu is %lld, not %lld\n",
		rank, mode, step, i, got, want);
	exit(1);
}

/* CHECK_SUMS_TIMES=1: when each step completed, as check_sums prints it
 * (bench/soak_kills.sh measures a recovery from them). */
static void step_done(int step)
{
	static int times = -1;
	if (times < 0) {
		const char *v = getenv("CHECK_SUMS_TIMES");
		times = v != NULL && strcmp(v, "1") == 0;
	}
	if (times) {
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		printf("round %d done at %.3f ms\n", step, (double)ts.tv_sec * 1e3 + ts.tv_nsec / 1e6);
	}
}

static void pause_step(void)
{
	const char *v = getenv("CHAOS_STEP_MS");
	long ms = v != NULL ? atol(v) : 2;
	struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
	nanosleep(&ts, NULL);
}

/* An async or SSP tensor: deltas of 1 on a value that starts at 0. */
struct chaos_async {
	const char *mode;
	int t;
	int64_t *in, *out;
};

static void async_init(struct chaos_async *a, const char *name, const char *mode, int n)
{
	a->mode = mode;
	a->t = unisum_declare_sync(name, UNISUM_INT64, nelem, 0, mode);
	check(a->t, "declare an async tensor");
	a->in = calloc(nelem, sizeof *a->in);
	a->out = calloc(nelem, sizeof *a->out);
	if (a->in == NULL || a->out == NULL)
		exit(1);
	/* Others' deltas may be in the value already. */
	check(unisum_push_pull(a->t, a->in, a->out, 0), "the first push_pull (the value)");
	for (size_t i = 0; i < nelem; i++) {
		if (a->out[i] < 0 || a->out[i] > (int64_t)size * n)
			wrong(mode, 0, i, a->out[i], 0);
		a->in[i] = 1;
	}
}

static void async_step(struct chaos_async *a, int step, int n)
{
	check(unisum_push_pull(a->t, a->in, a->out, 0), "push_pull");
	for (size_t i = 0; i < nelem; i++)
		if (a->out[i] < step || a->out[i] > (int64_t)size * n)
			wrong(a->mode, step, i, a->out[i], step);
}

/* After a barrier (every rank's deltas in): the value is size x n. */
static void async_end(struct chaos_async *a, int n)
{
	memset(a->in, 0, nelem * sizeof *a->in);
	check(unisum_push_pull(a->t, a->in, a->out, 0), "the last push_pull");
	for (size_t i = 0; i < nelem; i++)
		if (a->out[i] != (int64_t)size * n)
			wrong(a->mode, n + 1, i, a->out[i], (long long)size * n);
	free(a->in);
	free(a->out);
}

/* An allgather: rank r gives r + 1 x 1009 elements of r*1000 + step. */
struct chaos_gather {
	int t;
	uint64_t *counts, total;
	int32_t *in, *out;
};

static void gather_init(struct chaos_gather *g, const char *name)
{
	g->counts = malloc((size_t)size * sizeof *g->counts);
	if (g->counts == NULL)
		exit(1);
	g->total = 0;
	for (int r = 0; r < size; r++)
		g->total += g->counts[r] = (uint64_t)(r + 1) * 1009;
	g->t = unisum_declare(name, UNISUM_INT32, g->total, 0);
	check(g->t, "declare an allgather tensor");
	g->in = malloc(g->counts[rank] * sizeof *g->in);
	g->out = malloc(g->total * sizeof *g->out);
	if (g->in == NULL || g->out == NULL)
		exit(1);
}

static void gather_step(struct chaos_gather *g, int step)
{
	for (uint64_t i = 0; i < g->counts[rank]; i++)
		g->in[i] = rank * 1000 + step;
	check(unisum_allgather(g->t, g->in, g->out, g->counts), "allgather");
	uint64_t at = 0;
	for (int r = 0; r < size; r++)
		for (uint64_t i = 0; i < g->counts[r]; i++, at++)
			if (g->out[at] != r * 1000 + step)
				wrong("allgather", step, at, g->out[at], r * 1000 + step);
}

static void gather_end(struct chaos_gather *g)
{
	free(g->counts);
	free(g->in);
	free(g->out);
}

static void run_async(const char *mode, int n)
{
	struct chaos_async a;
	async_init(&a, "chaos.async", mode, n);
	for (int step = 1; step <= n; step++) {
		async_step(&a, step, n);
		step_done(step);
		pause_step();
	}
	check(unisum_barrier(), "barrier");
	async_end(&a, n);
}

/* async, ssp:2 and (with `gather`) an allgather, one step of each per
 * step. */
static void run_mix(int n, bool gather)
{
	struct chaos_async as, ss;
	struct chaos_gather g;
	async_init(&as, "chaos.mix.async", "async", n);
	async_init(&ss, "chaos.mix.ssp", "ssp:2", n);
	if (gather)
		gather_init(&g, "chaos.mix.gather");
	for (int step = 1; step <= n; step++) {
		async_step(&as, step, n);
		async_step(&ss, step, n);
		if (gather)
			gather_step(&g, step);
		step_done(step);
		pause_step();
	}
	check(unisum_barrier(), "barrier");
	async_end(&as, n);
	async_end(&ss, n);
	if (gather)
		gather_end(&g);
}

/* FNV-1a over n bytes, on from h. */
static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
	const unsigned char *b = p;
	for (size_t i = 0; i < n; i++)
		h = (h ^ b[i]) * 0x100000001b3ull;
	return h;
}

static void run_feedback(int n)
{
	const char *specs[2] = {"onebit,ef=vanilla", "topk,k=0.05,ef=vanilla"};
	int t[2];
	float *in[2], *out[2];
	for (int c = 0; c < 2; c++) {
		in[c] = malloc(nelem * sizeof *in[c]);
		out[c] = malloc(nelem * sizeof *out[c]);
		if (in[c] == NULL || out[c] == NULL)
			exit(1);
	}
	for (int c = 0; c < 2; c++) {
		t[c] = unisum_declare_ex(c ? "chaos.topk" : "chaos.onebit", UNISUM_FLOAT32, nelem, c,
					 specs[c]);
		check(t[c], "declare a compressed tensor");
	}
	uint64_t h = 0xcbf29ce484222325ull;
	for (int step = 0; step < n; step++) {
		unisum_handle hd[2];
		for (int c = 0; c < 2; c++) {
			for (size_t i = 0; i < nelem; i++)
				in[c][i] = (float)((int)((i * 7 + (size_t)step * 13 + (size_t)rank * 5 +
						       (size_t)c) % 61) - 30) / 8.0f;
			check(unisum_push_pull_async(t[c], in[c], out[c], 0, &hd[c]), "push_pull");
		}
		for (int c = 0; c < 2; c++) {
			check(unisum_wait(hd[c]), "wait");
			h = fnv(h, out[c], nelem * sizeof *out[c]);
		}
		step_done(step);
		pause_step();
	}
	for (int c = 0; c < 2; c++) {
		free(in[c]);
		free(out[c]);
	}
	printf("rank %d: feedback %d steps hash %016llx\n", rank, n, (unsigned long long)h);
}

static void run_dssync(const char *mode, int n)
{
	int t = unisum_declare_sync("chaos.dssync", UNISUM_INT32, nelem, 0, mode);
	check(t, "declare chaos.dssync");
	int32_t *buf = malloc(nelem * sizeof *buf);
	if (buf == NULL)
		exit(1);
	for (int step = 0; step < n; step++) {
		for (size_t i = 0; i < nelem; i++)
			buf[i] = 1;
		check(unisum_push_pull(t, buf, buf, UNISUM_AVERAGE), "push_pull");
		for (size_t i = 0; i < nelem; i++)
			if (buf[i] != 1)
				wrong(mode, step, i, buf[i], 1);
		step_done(step);
		pause_step();
	}
	free(buf);
}

/* A reduce-scatter and an alltoall, one step each, checked. */
struct chaos_scatter {
	int rs, a2a;
	uint64_t *rcounts, *acounts, rtotal, atotal;
	int64_t *rin, *rout, *ain, *aout;
};

static void scatter_init(struct chaos_scatter *c)
{
	c->rcounts = malloc((size_t)size * sizeof *c->rcounts);
	c->acounts = malloc((size_t)size * size * sizeof *c->acounts);
	if (c->rcounts == NULL || c->acounts == NULL)
		exit(1);
	c->rtotal = c->atotal = 0;
	for (int r = 0; r < size; r++)
		c->rtotal += c->rcounts[r] = (uint64_t)(r + 2) * 997;
	for (int s = 0; s < size; s++)
		for (int d = 0; d < size; d++)
			c->atotal += c->acounts[s * size + d] = (uint64_t)(s + 2 * d + 1) * 499;
	c->rs = unisum_declare("chaos.rs", UNISUM_INT64, c->rtotal, 0);
	check(c->rs, "declare a reduce-scatter tensor");
	c->a2a = unisum_declare("chaos.a2a", UNISUM_INT64, c->atotal, 0);
	check(c->a2a, "declare an alltoall tensor");
	c->rin = malloc(c->rtotal * sizeof *c->rin);
	c->rout = malloc(c->rcounts[rank] * sizeof *c->rout);
	c->ain = malloc(c->atotal * sizeof *c->ain);
	c->aout = malloc(c->atotal * sizeof *c->aout);
	if (c->rin == NULL || c->rout == NULL || c->ain == NULL || c->aout == NULL)
		exit(1);
}

static void scatter_step(struct chaos_scatter *c, int step)
{
	for (uint64_t i = 0; i < c->rtotal; i++)
		c->rin[i] = rank + step + (int64_t)i;
	check(unisum_reduce_scatter(c->rs, c->rin, c->rout, c->rcounts, 0), "reduce_scatter");
	uint64_t at = 0;
	for (int r = 0; r < rank; r++)
		at += c->rcounts[r];
	for (uint64_t i = 0; i < c->rcounts[rank]; i++) {
		int64_t want = (int64_t)size * (step + (int64_t)(at + i)) + size * (size - 1) / 2;
		if (c->rout[i] != want)
			wrong("reduce-scatter", step, i, c->rout[i], want);
	}
	uint64_t o = 0;
	for (int d = 0; d < size; d++)
		for (uint64_t i = 0; i < c->acounts[rank * size + d]; i++)
			c->ain[o++] = rank * 100 + d + step;
	check(unisum_alltoall(c->a2a, c->ain, c->aout, c->acounts), "alltoall");
	o = 0;
	for (int s = 0; s < size; s++)
		for (uint64_t i = 0; i < c->acounts[s * size + rank]; i++, o++)
			if (c->aout[o] != s * 100 + rank + step)
				wrong("alltoall", step, o, c->aout[o], s * 100 + rank + step);
}

static void scatter_end(struct chaos_scatter *c)
{
	free(c->rcounts);
	free(c->acounts);
	free(c->rin);
	free(c->rout);
	free(c->ain);
	free(c->aout);
}

static void run_gathers(int n)
{
	struct chaos_gather g;
	struct chaos_scatter c;
	gather_init(&g, "chaos.gathers.ag");
	scatter_init(&c);
	for (int step = 0; step < n; step++) {
		gather_step(&g, step);
		scatter_step(&c, step);
		step_done(step);
		pause_step();
	}
	gather_end(&g);
	scatter_end(&c);
}

static void run_allgather(int n)
{
	struct chaos_gather g;
	gather_init(&g, "chaos.gather");
	for (int step = 0; step < n; step++) {
		gather_step(&g, step);
		step_done(step);
		pause_step();
	}
	gather_end(&g);
}

int main(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: chaos_modes async|ssp:S|dssync:G|allgather|gathers|mix|held|feedback N\n");
		return 2;
	}
	const char *mode = argv[1];
	int n = atoi(argv[2]);
	if (getenv("CHAOS_COUNT") != NULL && atol(getenv("CHAOS_COUNT")) > 0)
		nelem = (size_t)atol(getenv("CHAOS_COUNT"));
	check(unisum_init(), "init");
	rank = unisum_rank();
	size = unisum_size();
	if (strcmp(mode, "async") == 0 || strncmp(mode, "ssp:", 4) == 0)
		run_async(mode, n);
	else if (strncmp(mode, "dssync:", 7) == 0)
		run_dssync(mode, n);
	else if (strcmp(mode, "allgather") == 0)
		run_allgather(n);
	else if (strcmp(mode, "feedback") == 0)
		run_feedback(n);
	else if (strcmp(mode, "gathers") == 0)
		run_gathers(n);
	else if (strcmp(mode, "mix") == 0 || strcmp(mode, "held") == 0)
		run_mix(n, strcmp(mode, "mix") == 0);
	else
		return 2;
	check(unisum_shutdown(), "shutdown");
	printf("rank %d: %s %d steps ok\n", rank, mode, n);
	return 0;
}
