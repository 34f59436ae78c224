/*
 * tune.c - autotune: settings by epoch, and worker 0's search (tune.h).
 *
 * Locks: `lock` guards the settings every worker knows (epochs, final,
 * applied, stopped); `post_lock` guards worker 0's measurements and plan.
 * Order: post_lock, then lock.  No lock is held while a hook runs, but
 * set_credit, which runs under `lock` so that an older epoch's credit
 * never lands last (it only sets the PUSH queue's credit).
 */
#include "worker/tune.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "log/log.h"
#include "timing/timing.h"
#include "unisum.h"

struct tuner {
	struct tune_cfg cfg;
	struct tune_hooks hooks;
	pthread_mutex_t lock;		/* the settings */
	pthread_cond_t cond;		/* a setting came, or the job failed */
	struct tune_setting *epochs;	/* [nepochs]: known settings; epoch 0 the configured one */
	uint32_t nepochs, cap;
	bool final;			/* later epochs keep the last setting */
	uint32_t applied;		/* the credit of this epoch is in force */
	bool stopped;			/* the job failed: stop waiting */
	bool mismatch;			/* worker 0's mode differs: the job was failed */
	/* Worker 0's search, under post_lock. */
	pthread_mutex_t post_lock;
	int64_t *round_us;		/* when round r first started */
	uint32_t nrounds, caprounds;
	double *epoch_ms;		/* median step time of each epoch, < 0 unknown */
	struct tune_setting plan[8];	/* trials of the current phase */
	int nplan, planned;		/* how many, how many posted */
	uint32_t phase_last;		/* the last epoch of the current phase's trials */
	int phase;			/* 0 partition sizes, 1 credits, 2 settled (under both locks) */
	uint32_t fit_epoch;		/* fit mode: the epoch that posted the first fit, 0: none */
	struct tune_setting fit_first;	/* ... and that fit */
	struct tune_meas fit_meas;	/* ... and what it was fitted from (the configured setting) */
	uint32_t last_posted;		/* the latest epoch posted (0: none) */
	struct tune_setting last_setting; /* ... and its setting */
};

static uint64_t clamp_pbytes(uint64_t p)
{
	return p < 65536 ? 65536 : p > (1ull << 30) ? 1ull << 30 : p;
}

struct tune_setting tune_fit(double bw, double rtt, struct tune_setting first)
{
	if (!(bw > 0) || isinf(bw) || isnan(bw))
		return first;
	double want = bw * TUNE_FIT_PART_S;
	uint64_t p = first.pbytes < TUNE_FIT_MIN_PART ? first.pbytes : TUNE_FIT_MIN_PART;
	if (want >= (double)first.pbytes) {
		p = first.pbytes;
	} else {
		/* The power of two nearest to want (geometrically), in range. */
		while (p * 2 <= first.pbytes && (double)p * 1.4142135623730951 < want)
			p *= 2;
	}
	uint64_t credit = TUNE_FIT_CREDIT_PARTS * p;
	double bdp2 = 2 * bw * (rtt > 0 && !isnan(rtt) ? rtt : 0);
	if (bdp2 > (double)credit && bdp2 < (double)(1ull << 40))
		credit = ((uint64_t)bdp2 + p - 1) / p * p;
	return (struct tune_setting){p, credit};
}

double tune_msg_cpu(const struct tune_meas *a, const struct tune_meas *b)
{
	if (a->pushes == 0 || b->pushes == 0 || a->all_bytes == 0 || b->all_bytes == 0)
		return 0;
	double sa = (double)a->all_bytes / (double)a->pushes;
	double sb = (double)b->all_bytes / (double)b->pushes;
	/* Under 1.5 times apart, the difference is noise.  (The solution
	 * below is the same whichever setting had the larger messages.) */
	if (fmin(sa, sb) * 1.5 > fmax(sa, sb))
		return 0;
	double cpb_a = a->cpu_s / (double)a->all_bytes, cpb_b = b->cpu_s / (double)b->all_bytes;
	double c = (cpb_b - cpb_a) / (1 / sb - 1 / sa);
	return c > 0 && isfinite(c) ? c : 0;
}

struct tune_setting tune_fit_cpu(struct tune_setting fit, double bw, double msg_cpu_s,
				 struct tune_setting first)
{
	if (!(msg_cpu_s > 0) || !(bw > 0) || isinf(bw) || fit.pbytes >= first.pbytes)
		return fit;
	double want = msg_cpu_s * bw / TUNE_FIT_CPU_SHARE;
	uint64_t p = fit.pbytes;
	while (p * 2 <= first.pbytes && (double)p < want)
		p *= 2;
	if ((double)p < want)
		p = first.pbytes;
	if (p == fit.pbytes)
		return fit;
	uint64_t credit = fit.credit > TUNE_FIT_CREDIT_PARTS * p ? (fit.credit + p - 1) / p * p
								  : TUNE_FIT_CREDIT_PARTS * p;
	return (struct tune_setting){p, credit};
}

int tune_new(const struct tune_cfg *cfg, const struct tune_hooks *hooks, struct tuner **out)
{
	struct tuner *tu = calloc(1, sizeof *tu);
	if (tu == NULL)
		return UNISUM_ENOMEM;
	tu->epochs = malloc(16 * sizeof *tu->epochs);
	if (tu->epochs == NULL) {
		free(tu);
		return UNISUM_ENOMEM;
	}
	tu->cfg = *cfg;
	if (cfg->fit)
		tu->cfg.steps = 1;	/* measure one round, fit from the next but one */
	tu->hooks = *hooks;
	pthread_mutex_init(&tu->lock, NULL);
	pthread_mutex_init(&tu->post_lock, NULL);
	timing_cond_init(&tu->cond);
	tu->cap = 16;
	tu->epochs[0] = cfg->first;
	tu->nepochs = 1;
	tu->final = !cfg->on;
	uint64_t p = cfg->first.pbytes;
	uint64_t sizes[] = {clamp_pbytes(p / 4), clamp_pbytes(p / 2), clamp_pbytes(p * 2)};
	for (int i = 0; i < 3; i++)
		if (sizes[i] != p)
			tu->plan[tu->nplan++] = (struct tune_setting){sizes[i], 4 * sizes[i]};
	*out = tu;
	return 0;
}

void tune_free(struct tuner *tu)
{
	if (tu == NULL)
		return;
	free(tu->epochs);
	free(tu->round_us);
	free(tu->epoch_ms);
	pthread_mutex_destroy(&tu->lock);
	pthread_mutex_destroy(&tu->post_lock);
	pthread_cond_destroy(&tu->cond);
	free(tu);
}

/* This worker's autotune mode in words, for the error of a mismatch. */
static void tune_mode_text(int mode, uint32_t steps, const char *set_by, char *out, size_t len)
{
	if (mode == 2)
		snprintf(out, len, "UNISUM_AUTOTUNE=2 (fit)");
	else if (mode == 1)
		snprintf(out, len, "UNISUM_AUTOTUNE=1 (search) with UNISUM_AUTOTUNE_STEPS=%u", steps);
	else if (set_by != NULL)
		snprintf(out, len, "autotune off, since %s is set", set_by);
	else
		snprintf(out, len, "UNISUM_AUTOTUNE=0 (off)");
}

void tune_on_setting(struct tuner *tu, const struct rdv_tune *t)
{
	int mode = !tu->cfg.on ? 0 : tu->cfg.fit ? 2 : 1;
	if ((uint32_t)mode != t->mode || (mode != 0 && t->steps != tu->cfg.steps)) {
		pthread_mutex_lock(&tu->lock);
		bool told = tu->mismatch;
		tu->mismatch = true;
		pthread_mutex_unlock(&tu->lock);
		if (told)
			return;
		char theirs[160], mine[160], why[768];
		tune_mode_text((int)t->mode, t->steps, NULL, theirs, sizeof theirs);
		tune_mode_text(mode, tu->cfg.steps, tu->cfg.set_by, mine, sizeof mine);
		snprintf(why, sizeof why, "worker 0 autotunes with %s but worker %d has %s: every "
			 "worker must cut its tensors alike; set UNISUM_AUTOTUNE, UNISUM_AUTOTUNE_STEPS, "
			 "UNISUM_PARTITION_BYTES and UNISUM_SCHEDULING_CREDIT the same on every worker",
			 theirs, tu->cfg.rank, mine);
		tu->hooks.fail_job(tu->hooks.arg, UNISUM_ECONFIG, why);
		return;
	}
	pthread_mutex_lock(&tu->lock);
	if (t->epoch == tu->nepochs && !tu->final) {
		if (tu->nepochs == tu->cap) {
			uint32_t cap = tu->cap * 2;
			struct tune_setting *e = realloc(tu->epochs, cap * sizeof *e);
			if (e == NULL) {
				pthread_mutex_unlock(&tu->lock);
				tu->hooks.fail_job(tu->hooks.arg, UNISUM_ENOMEM, "out of memory for autotune");
				return;
			}
			tu->epochs = e;
			tu->cap = cap;
		}
		tu->epochs[tu->nepochs++] = (struct tune_setting){t->partition_bytes, t->credit_bytes};
		tu->final = t->final;
		pthread_cond_broadcast(&tu->cond);
	}
	pthread_mutex_unlock(&tu->lock);
}

void tune_stop(struct tuner *tu)
{
	pthread_mutex_lock(&tu->lock);
	tu->stopped = true;
	pthread_cond_broadcast(&tu->cond);
	pthread_mutex_unlock(&tu->lock);
}

/* The known setting of `epoch` into *out, its credit put in force the
 * first time.  Called with lock held, once it is known. */
static void tune_take(struct tuner *tu, uint32_t epoch, struct tune_setting *out, bool *final)
{
	*out = tu->epochs[epoch < tu->nepochs ? epoch : tu->nepochs - 1];
	*final = tu->final && epoch + 1 >= tu->nepochs;
	if (epoch > tu->applied) {
		/* Under the lock, so an older epoch's credit never lands last. */
		tu->applied = epoch;
		tu->hooks.set_credit(tu->hooks.arg, out->credit);
	}
}

int tune_setting_now(struct tuner *tu, uint32_t epoch, struct tune_setting *out, bool *final)
{
	pthread_mutex_lock(&tu->lock);
	bool known = epoch < tu->nepochs || tu->final;
	if (known)
		tune_take(tu, epoch, out, final);
	pthread_mutex_unlock(&tu->lock);
	return known;
}

int tune_setting_of(struct tuner *tu, uint32_t epoch, struct tune_setting *out, bool *final)
{
	/* Worker 0 posts epoch e + 1 when it starts epoch e, a whole epoch
	 * before anyone needs it; waiting longer than the failure timeout
	 * means it never will (UNISUM_AUTOTUNE or _STEPS differ). */
	struct timespec until = timing_deadline(tu->cfg.timeout_ms);
	pthread_mutex_lock(&tu->lock);
	int timed_out = 0;
	while (epoch >= tu->nepochs && !tu->final && !tu->stopped && timed_out == 0)
		timed_out = pthread_cond_timedwait(&tu->cond, &tu->lock, &until);
	if (epoch >= tu->nepochs && !tu->final) {
		bool stopped = tu->stopped;
		pthread_mutex_unlock(&tu->lock);
		if (stopped)
			return UNISUM_ECONN;
		char why[400];
		snprintf(why, sizeof why, "worker %d waited %d ms for worker 0's autotune setting of "
			 "steps %u on: are UNISUM_AUTOTUNE and UNISUM_AUTOTUNE_STEPS the same on every "
			 "worker?", tu->cfg.rank, tu->cfg.timeout_ms, epoch * tu->cfg.steps);
		tu->hooks.fail_job(tu->hooks.arg, UNISUM_ECONFIG, why);
		return log_fail(UNISUM_ECONFIG, "%s", why);
	}
	tune_take(tu, epoch, out, final);
	pthread_mutex_unlock(&tu->lock);
	return 0;
}

uint32_t tune_epoch_of(const struct tuner *tu, uint32_t round)
{
	return round / tu->cfg.steps;
}

uint64_t tune_partition_bytes(struct tuner *tu)
{
	pthread_mutex_lock(&tu->lock);
	uint64_t p = tu->epochs[tu->applied < tu->nepochs ? tu->applied : tu->nepochs - 1].pbytes;
	pthread_mutex_unlock(&tu->lock);
	return p;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

/* Median step time of epoch e (ms), from the first starts of its rounds;
 * the first step of an epoch pays for new cuts and is left out. */
static double tune_epoch_ms(const struct tuner *tu, uint32_t e)
{
	uint32_t n = tu->cfg.steps, first = e * n + 1, last = (e + 1) * n;
	double d[64];
	int k = 0;
	for (uint32_t r = first; r < last && r + 1 < tu->nrounds && k < 64; r++)
		d[k++] = (double)(tu->round_us[r + 1] - tu->round_us[r]) / 1000.0;
	if (k == 0)
		return -1;
	qsort(d, (size_t)k, sizeof d[0], cmp_double);
	return k % 2 ? d[k / 2] : (d[k / 2 - 1] + d[k / 2]) / 2;
}

/* The best measured epoch before `upto` (-1: none). */
static int tune_best(const struct tuner *tu, uint32_t upto)
{
	int best = -1;
	for (uint32_t e = 0; e < upto; e++)
		if (tu->epoch_ms[e] >= 0 && (best < 0 || tu->epoch_ms[e] < tu->epoch_ms[best]))
			best = (int)e;
	return best;
}

/* Partition size found (setting b): plans the credits to try, in
 * partitions of it, and returns the first. */
static struct tune_setting tune_plan_credits(struct tuner *tu, const struct tune_setting *b)
{
	static const int mult[] = {1, 2, 8, 16};
	tu->nplan = tu->planned = 0;
	for (int i = 0; i < 4; i++) {
		uint64_t c = b->pbytes * (uint64_t)mult[i];
		if (c != b->credit)
			tu->plan[tu->nplan++] = (struct tune_setting){b->pbytes, c};
	}
	tu->phase = 1;
	tu->planned = 1;
	return tu->plan[0];
}

/* Fit mode, worker 0, at the first start of epoch e.  Epoch 1 keeps the
 * configured setting (nothing is measured when it must be posted).  Then
 * a first fit of what was measured under the configured setting: where
 * that setting is bad for the network, the network is slow under it and
 * the fit comes out low, so a second fit, measured under the first (in
 * its second epoch: the first pays for the new cuts), is kept for good.  Under TUNE_FIT_MIN_BYTES over TCP the measurement goes
 * on, the setting in force kept, for up to TUNE_FIT_TRIES epochs; then
 * that setting stays (a job on one host has nothing to measure). */
#define TUNE_FIT_MIN_BYTES (2u << 20)
/* Rounds measured under each setting: one alone let the CPU a message
 * costs come out anywhere from 20 to 500 us on the emulated cluster. */
#define TUNE_FIT_ROUNDS 2
#define TUNE_FIT_TRIES 4
static void tune_fit_log(struct tuner *tu, uint32_t e, const struct tune_meas *m,
			 const struct rdv_tune *next, bool enough, double msg_cpu)
{
	char cpu[160] = "";
	if (msg_cpu > 0)
		snprintf(cpu, sizeof cpu, ", this host's CPU %.1f us a message beside its bytes "
			 "(partitions of at least %.0f B keep that under %.0f%% of the link's time)",
			 msg_cpu * 1e6, msg_cpu * m->bw / TUNE_FIT_CPU_SHARE, TUNE_FIT_CPU_SHARE * 100);
	LOG_INFO("autotune fit%s: %llu bytes pushed over TCP, the link at %.1f MB/s, shortest push "
		 "to acknowledgement %.3f ms%s: partition %llu B, credit %llu B from step %u%s "
		 "(configured: %llu B, %llu B)%s",
		 next->final ? "" : " (first)", (unsigned long long)m->bytes, m->bw / 1e6,
		 m->rtt * 1e3, cpu, (unsigned long long)next->partition_bytes,
		 (unsigned long long)next->credit_bytes, (e + 1) * tu->cfg.steps,
		 next->final ? " for good" : "", (unsigned long long)tu->cfg.first.pbytes,
		 (unsigned long long)tu->cfg.first.credit,
		 enough ? "" : " (too little crossed a network to measure: kept)");
}

static bool tune_decide_fit(struct tuner *tu, uint32_t e, struct rdv_tune *next)
{
	struct tune_setting cur = tu->fit_epoch != 0 ? tu->fit_first : tu->cfg.first;
	*next = (struct rdv_tune){.epoch = e + 1, .partition_bytes = cur.pbytes,
				  .credit_bytes = cur.credit};
	if (e == 0)
		return true;
	if (e == 1 && tu->fit_epoch == 0) {
		/* Round 0 paid for first touches (every buffer's pages, every
		 * connection's start): measure from round 1. */
		tu->hooks.measure(tu->hooks.arg, NULL);
		return true;
	}
	if (tu->fit_epoch == 0 && e < 1 + TUNE_FIT_ROUNDS)
		return true;	/* the configured setting's rounds go on */
	if (tu->fit_epoch != 0 && e <= tu->fit_epoch + 2) {
		/* Epoch e - 1 still ran the configured setting, or was the first
		 * under the first fit, which pays for its new cuts: measure from
		 * now. */
		tu->hooks.measure(tu->hooks.arg, NULL);
		return true;
	}
	if (tu->fit_epoch != 0 && e < tu->fit_epoch + 2 + TUNE_FIT_ROUNDS)
		return true;	/* the first fit's rounds go on */
	struct tune_meas m = {0};
	tu->hooks.measure(tu->hooks.arg, &m);
	uint32_t since = tu->fit_epoch != 0 ? tu->fit_epoch + 2 : 0;
	bool enough = m.bytes >= TUNE_FIT_MIN_BYTES;
	if (!enough && e < since + TUNE_FIT_TRIES)
		return true;	/* keep counting */
	struct tune_setting fit = enough ? tune_fit(m.bw, m.rtt, tu->cfg.first) : cur;
	double msg_cpu = 0;
	if (enough && tu->fit_epoch != 0) {
		/* The second fit: what a message costs, from both settings. */
		msg_cpu = tune_msg_cpu(&tu->fit_meas, &m);
		fit = tune_fit_cpu(fit, m.bw, msg_cpu, tu->cfg.first);
	}
	next->partition_bytes = fit.pbytes;
	next->credit_bytes = fit.credit;
	next->final = tu->fit_epoch != 0 || !enough;
	if (next->final) {
		tu->phase = 2;
	} else {
		tu->fit_epoch = e;
		tu->fit_first = fit;
		tu->fit_meas = m;
		tu->hooks.measure(tu->hooks.arg, NULL);
	}
	tune_fit_log(tu, e, &m, next, enough, msg_cpu);
	return true;
}

/* Worker 0, at the first start of epoch e: records how epoch e - 1 went
 * and decides epoch e + 1.  Called with both locks held.  Returns whether
 * *next is to be posted. */
static bool tune_decide(struct tuner *tu, uint32_t e, struct rdv_tune *next)
{
	if (tu->cfg.fit)
		return tu->phase == 2 ? false : tune_decide_fit(tu, e, next);
	uint32_t steps = tu->cfg.steps;
	if (e >= 1) {
		double ms = tune_epoch_ms(tu, e - 1);
		tu->epoch_ms[e - 1] = ms;
		const struct tune_setting *s = &tu->epochs[e - 1];
		LOG_WARN("autotune: epoch %u (steps %u-%u): partition %llu B, credit %llu B: %.2f ms per "
			 "step (median)", e - 1, (e - 1) * steps, e * steps - 1,
			 (unsigned long long)s->pbytes, (unsigned long long)s->credit, ms);
	}
	if (tu->phase == 2)
		return false;
	*next = (struct rdv_tune){.epoch = e + 1};
	int best = tune_best(tu, e);
	struct tune_setting pick;
	if (tu->planned < tu->nplan) {
		pick = tu->plan[tu->planned++];	/* the next trial of this phase */
		tu->phase_last = e + 1;
	} else if (tu->phase_last >= e || best < 0) {
		/* The last trial is still being measured: hold the best so far. */
		pick = tu->epochs[best >= 0 ? best : 0];
	} else if (tu->phase == 0) {
		pick = tune_plan_credits(tu, &tu->epochs[best]);
		tu->phase_last = e + 1;
	} else {
		tu->phase = 2;
		pick = tu->epochs[best];
		next->final = true;
		LOG_WARN("autotune: settled on partition %llu B, credit %llu B after %u trials: %.2f ms "
			 "per step (the configured setting: %.2f); no more trials",
			 (unsigned long long)pick.pbytes, (unsigned long long)pick.credit, e,
			 tu->epoch_ms[best], tu->epoch_ms[0]);
	}
	next->partition_bytes = pick.pbytes;
	next->credit_bytes = pick.credit;
	return true;
}

/* Worker 0: posts *t, stamped with this tuner's mode and epoch length. */
static int tune_post(struct tuner *tu, struct rdv_tune *t)
{
	t->mode = tu->cfg.fit ? 2 : 1;
	t->steps = tu->cfg.steps;
	return tu->hooks.post(tu->hooks.arg, t);
}

/* Worker 0, out of memory for its measurements: ends the trials with the
 * current setting, for every worker, from the next epoch on.  Called with
 * post_lock held. */
static void tune_give_up(struct tuner *tu)
{
	pthread_mutex_lock(&tu->lock);
	tu->phase = 2;
	struct tune_setting cur = tu->last_posted == 0 ? tu->epochs[0] : tu->last_setting;
	pthread_mutex_unlock(&tu->lock);
	/* The setting of the latest epoch posted holds from the next one on. */
	struct rdv_tune t = {.epoch = tu->last_posted + 1, .partition_bytes = cur.pbytes,
			     .credit_bytes = cur.credit, .final = true};
	LOG_WARN("autotune: out of memory for measurements; keeping partition %llu B, credit %llu B",
		 (unsigned long long)cur.pbytes, (unsigned long long)cur.credit);
	if (tune_post(tu, &t) != 0)
		LOG_WARN("autotune: cannot post the last setting: %s", log_last_error());
}

/* Room for the first start of round `round` and its epoch's time.
 * false when out of memory.  Called with post_lock held. */
static bool tune_grow(struct tuner *tu, uint32_t round)
{
	if (round < tu->caprounds)
		return true;
	uint32_t cap = tu->caprounds ? tu->caprounds : 256;
	while (cap <= round)
		cap *= 2;
	uint32_t old_ne = tu->caprounds / tu->cfg.steps + 2;
	uint32_t ne = cap / tu->cfg.steps + 2;
	int64_t *r = realloc(tu->round_us, cap * sizeof *r);
	if (r != NULL)
		tu->round_us = r;
	double *m = realloc(tu->epoch_ms, ne * sizeof *m);
	if (m != NULL) {
		for (uint32_t i = tu->caprounds ? old_ne : 0; i < ne; i++)
			m[i] = -1;
		tu->epoch_ms = m;
	}
	if (r == NULL || m == NULL)
		return false;
	tu->caprounds = cap;
	return true;
}

void tune_saw_round(struct tuner *tu, uint32_t round)
{
	pthread_mutex_lock(&tu->post_lock);
	if (round < tu->nrounds || tu->phase == 2) {
		pthread_mutex_unlock(&tu->post_lock);
		return;
	}
	if (!tune_grow(tu, round)) {
		tune_give_up(tu);
		pthread_mutex_unlock(&tu->post_lock);
		return;
	}
	int64_t now = timing_now_us();
	while (tu->nrounds <= round)
		tu->round_us[tu->nrounds++] = now;
	struct rdv_tune next;
	bool post = false;
	if (round % tu->cfg.steps == 0) {
		pthread_mutex_lock(&tu->lock);
		post = tune_decide(tu, round / tu->cfg.steps, &next);
		pthread_mutex_unlock(&tu->lock);
	}
	if (post) {
		tu->last_posted = next.epoch;
		tu->last_setting = (struct tune_setting){next.partition_bytes, next.credit_bytes};
		if (tune_post(tu, &next) != 0)
			LOG_WARN("autotune: cannot post the next setting: %s", log_last_error());
	}
	pthread_mutex_unlock(&tu->post_lock);
}
