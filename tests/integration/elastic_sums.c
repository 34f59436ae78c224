/*
 * elastic_sums.c - a worker of an elastic job (UNISUM_ELASTIC=1) for the
 * integration tests: it runs STEPS lock-step rounds of one tensor and
 * checks every element of every sum, through re-forms.
 *
 *   elastic_sums STEPS [STEP_MS]
 *
 * Worker `rank` of `size` pushes (rank + 1) * 1000 + step + i % 7 at index
 * i, so the sum is 1000 * size * (size + 1) / 2 + size * (step + i % 7):
 * exact for the size of the step's generation, and wrong if any worker's
 * push was lost, doubled or from another step.  At the start of a step it
 * polls unisum_membership_changed() (as an elastic training loop does at a
 * commit); a push_pull that fails with UNISUM_EMEMBERSHIP, or the poll,
 * makes it call unisum_rejoin(), after which rank 0's step is broadcast
 * (every worker goes on from it) and the tensor is declared again.
 *
 * ELASTIC_DIE_AT=K: this worker kills itself (SIGKILL) at the start of
 * step K.  ELASTIC_STEP_MS (or STEP_MS, which travels to other hosts):
 * a pause before each step.  Prints "step S
 * rank R size N ok" every 25 steps and "rejoined as rank R of N at step
 * S in T ms" after each re-form (T: unisum_rejoin's time); exits 0 after the last step, 1 on a wrong
 * element or an unexpected error.
 */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "unisum.h"

#define COUNT 50000

static int fail(const char *what, int rc)
{
	fprintf(stderr, "elastic_sums: %s: %s (%s)\n", what, unisum_strerror(rc),
		unisum_last_error());
	unisum_shutdown();	/* joins the library's threads */
	return 1;
}

int main(int argc, char **argv)
{
	if (argc != 2 && argc != 3)
		return fprintf(stderr, "usage: elastic_sums STEPS [STEP_MS]\n"), 2;
	long steps = atol(argv[1]);
	const char *die = getenv("ELASTIC_DIE_AT"), *pause = getenv("ELASTIC_STEP_MS");
	if (argc == 3)
		pause = argv[2];
	long die_at = die != NULL ? atol(die) : -1;
	long pause_ms = pause != NULL ? atol(pause) : 0;
	static int32_t in[COUNT], out[COUNT];
	int rc = unisum_init();
	if (rc != 0)
		return fail("unisum_init", rc);
	int64_t step = 0;
	int rejoins = 0;
	for (;;) {
		int size = unisum_size(), rank = unisum_rank();
		int st = unisum_declare("elastic.step", UNISUM_INT64, 1, 0);
		int t = unisum_declare("elastic.t", UNISUM_INT32, COUNT, 0);
		/* A worker that joined may find the job re-forming again before
		 * its first call (another worker lost meanwhile): it rejoins, as
		 * after any call (a fresh-clone make test saw it exit here). */
		rc = st < 0 ? st : t < 0 ? t : 0;
		if (rc != 0 && rc != UNISUM_EMEMBERSHIP)
			return fail("unisum_declare", rc);
		/* Every worker goes on from rank 0's step. */
		if (rc == 0)
			rc = unisum_broadcast(st, &step, 0);
		for (; rc == 0 && step < steps; step++) {
			if (unisum_membership_changed() == 1) {
				rc = UNISUM_EMEMBERSHIP;
				break;
			}
			if (step == die_at)
				kill(getpid(), SIGKILL);
			if (pause_ms > 0)
				nanosleep(&(struct timespec){.tv_nsec = pause_ms * 1000000L}, NULL);
			for (int i = 0; i < COUNT; i++)
				in[i] = (rank + 1) * 1000 + (int32_t)step + i % 7;
			rc = unisum_push_pull(t, in, out, 0);
			if (rc != 0)
				break;
			for (int i = 0; i < COUNT; i++) {
				int32_t want = 1000 * size * (size + 1) / 2 + size * ((int32_t)step + i % 7);
				if (out[i] != want) {
					fprintf(stderr, "elastic_sums: rank %d of %d, step %lld: element %d "
						"is %d, expected %d\n", rank, size, (long long)step, i,
						out[i], want);
					return 1;
				}
			}
			if (step % 25 == 0)
				printf("step %lld rank %d size %d ok\n", (long long)step, rank, size);
		}
		if (rc == 0)
			break;
		if (rc != UNISUM_EMEMBERSHIP)
			return fail("push_pull", rc);
		struct timespec t0, t1;
		clock_gettime(CLOCK_MONOTONIC, &t0);
		if ((rc = unisum_rejoin()) != 0)
			return fail("unisum_rejoin", rc);
		clock_gettime(CLOCK_MONOTONIC, &t1);
		rejoins++;
		printf("rejoined as rank %d of %d at step %lld in %.1f ms\n", unisum_rank(),
		       unisum_size(), (long long)step,
		       (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6);
		fflush(stdout);
	}
	printf("done: %ld steps, rank %d of %d, %d re-forms\n", steps, unisum_rank(), unisum_size(),
	       rejoins);
	rc = unisum_shutdown();
	return rc != 0 ? fail("unisum_shutdown", rc) : 0;
}
