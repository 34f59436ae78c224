/*
 * tune.h - autotune (UNISUM_AUTOTUNE): the partition size and the credit
 * that every worker uses, epoch by epoch.
 *
 * Every UNISUM_AUTOTUNE_STEPS rounds of each tensor form an epoch, and
 * every worker uses the same partition size and credit in an epoch.
 * Worker 0 measures its step time and posts the setting of epoch e + 1
 * when it starts epoch e; the scheduler passes it to every worker, and a
 * worker about to start an epoch it has no setting for waits for it.  The
 * search tries partition sizes first (1/4, 1/2 and 2x the configured
 * one), then credits of 1, 2, 8 and 16 partitions of the best, then keeps
 * the best setting for good.  The worker cuts a tensor anew for a
 * partition size it has not used (worker.c); the credit changes at once.
 *
 * A tuner is a handle; its functions are safe from any thread.
 */
#ifndef UNISUM_WORKER_TUNE_H
#define UNISUM_WORKER_TUNE_H

#include <stdbool.h>
#include <stdint.h>

#include "rendezvous/rendezvous.h"

struct tune_setting {
	uint64_t pbytes;	/* partition size */
	uint64_t credit;	/* bytes in flight */
};

struct tune_cfg {
	int rank;			/* this worker's: 0 decides */
	bool on;			/* UNISUM_AUTOTUNE; off: epoch 0's setting for good */
	bool fit;			/* UNISUM_AUTOTUNE=2: no search, tune_fit() of what
					 * hooks.measure saw, twice (tune.c), then kept */
	uint32_t steps;			/* UNISUM_AUTOTUNE_STEPS (fit mode: 1) */
	const char *set_by;		/* off because this variable set a partition size
					 * or credit (UNISUM_AUTOTUNE=auto), or NULL */
	int timeout_ms;			/* how long a worker waits for a setting */
	struct tune_setting first;	/* the configured partition size and credit */
};

/* What the tuner needs from its worker.  Each may be called on any
 * thread, never with a lock of the tuner's held. */
/* What fit mode's meter saw (worker 0, tune_hooks.measure). */
struct tune_meas {
	double bw;		/* the link, as this worker's pushes over TCP saw it, bytes/s */
	double rtt;		/* the shortest push-to-acknowledgement, seconds */
	uint64_t bytes;		/* acknowledged push bytes over TCP: what bw is from */
	uint64_t all_bytes;	/* push bytes acknowledged over TCP and IPC */
	uint64_t pushes;	/* ... and how many pushes they were */
	double cpu_s;		/* CPU-seconds the host's cores were busy meanwhile */
};

struct tune_hooks {
	void *arg;
	/* Worker 0: hands a setting to the scheduler, which passes it on to
	 * every worker (including this one).  0 or an error. */
	int (*post)(void *arg, const struct rdv_tune *t);
	/* A setting never came, or memory ran out: fail the whole job. */
	void (*fail_job)(void *arg, int err, const char *why);
	/* The credit of the epoch now in force. */
	void (*set_credit)(void *arg, uint64_t credit);
	/* Fit mode, worker 0: what the network did since the last call that
	 * passed NULL (which only starts counting anew). */
	void (*measure)(void *arg, struct tune_meas *m);
};

/* Fit mode: the setting for a network of bandwidth bw (bytes/s) and round
 * trip rtt (s).  Partitions of about TUNE_FIT_PART_S of the bandwidth, a
 * power of two from TUNE_FIT_MIN_PART up to first.pbytes (first.pbytes itself when
 * the link is faster than that); a credit of TUNE_FIT_CREDIT_PARTS of them,
 * or twice the bandwidth-delay product when that is more.  bw <= 0 or not
 * finite (nothing crossed a network): first. */
#define TUNE_FIT_PART_S 0.001
/* The smallest fitted partition.  1 ms of a 500 Mbit/s link is 64 KiB,
 * but on the emulated cluster at 500 Mbit/s 128 KiB was faster (n = 4:
 * 1.144 s against 1.174; n = 8, where the 2 cores forwarding 16 hosts are
 * the limit: 1.246 s against 1.663): the cost per message counts too. */
#define TUNE_FIT_MIN_PART 131072
#define TUNE_FIT_CREDIT_PARTS 8
struct tune_setting tune_fit(double bw, double rtt, struct tune_setting first);

/* The CPU a message costs, weighed in (issue 50).  Measured under two
 * settings A and B (the configured one, from round 1 on: round 0 pays for
 * first touches; then the first fit), this host's busy CPU per byte the
 * worker pushed is c_m / s + c_b for messages of s bytes on average; c_m,
 * what a message costs beside its bytes (its syscalls, wake-ups, the
 * server's side of it when the server is here), is (cpb_B - cpb_A) /
 * (1/s_B - 1/s_A).  The partition is then at least what keeps that under
 * TUNE_FIT_CPU_SHARE of the link's time for it: p >= c_m bw / share.  On
 * the emulated cluster (n = 4, k = 0, 1 Gbit/s, 2 cores for every host)
 * c_m measured 0.3-0.6 ms, and 512 KiB to 1 MiB partitions ran as fast
 * as 128 KiB with a quarter to a third less CPU.  Returns c_m (s), or 0
 * when the two say nothing (messages under 1.5 times apart; more CPU per
 * byte with the larger ones: noise). */
#define TUNE_FIT_CPU_SHARE 0.25
double tune_msg_cpu(const struct tune_meas *a, const struct tune_meas *b);
/* fit (from tune_fit) with partitions of at least c_m bw /
 * TUNE_FIT_CPU_SHARE (the next power of two, up to first.pbytes), and its
 * credit grown to TUNE_FIT_CREDIT_PARTS of them. */
struct tune_setting tune_fit_cpu(struct tune_setting fit, double bw, double msg_cpu_s,
				 struct tune_setting first);

struct tuner;

/* A tuner whose epoch 0 is cfg->first; worker 0 plans its trials.
 * 0 or UNISUM_ENOMEM. */
int tune_new(const struct tune_cfg *cfg, const struct tune_hooks *hooks, struct tuner **out);
void tune_free(struct tuner *tu);

/* A setting came from the scheduler (in order).  One posted under another
 * mode or epoch length than this worker's fails the job, naming both. */
void tune_on_setting(struct tuner *tu, const struct rdv_tune *t);

/* Worker 0: round `round` of some tensor starts now.  Notes the first
 * start of each round and, at the first start of each epoch, posts the
 * setting of the next. */
void tune_saw_round(struct tuner *tu, uint32_t round);

/* The setting of `epoch`, waiting (at most cfg.timeout_ms) for worker 0 to
 * post it; puts its credit in force the first time.  *final: the setting
 * never changes again.  0; UNISUM_ECONN when the job failed meanwhile
 * (tune_stop); UNISUM_ECONFIG when it never came (the job is failed). */
int tune_setting_of(struct tuner *tu, uint32_t epoch, struct tune_setting *out, bool *final);

/* The same without waiting: 1 with the setting (its credit put in force),
 * or 0 when worker 0 has not posted it yet. */
int tune_setting_now(struct tuner *tu, uint32_t epoch, struct tune_setting *out, bool *final);

/* The job failed: waits in tune_setting_of return. */
void tune_stop(struct tuner *tu);

/* The epoch of round `round`: autotune's epochs are cfg.steps rounds
 * long, fit mode's one round. */
uint32_t tune_epoch_of(const struct tuner *tu, uint32_t round);

/* The partition size of the epoch in force. */
uint64_t tune_partition_bytes(struct tuner *tu);

#endif /* UNISUM_WORKER_TUNE_H */
