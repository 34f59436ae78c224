/*
 * test_pushq.c - the stage queue: priority-then-key order, the credit gate
 * (head-of-line, oversized entries, changing the credit), blocking pops,
 * close and drain, and the counters.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <pthread.h>

#include <cmocka.h>

#include "pushq/pushq.h"

/* A fixed-seed generator, so a failure reproduces. */
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rng(void)
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return rng_state;
}

static void shuffle(struct pushq_entry **v, size_t n)
{
	for (size_t i = n; i > 1; i--) {
		size_t j = (size_t)(rng() % i);
		struct pushq_entry *t = v[i - 1];
		v[i - 1] = v[j];
		v[j] = t;
	}
}

static bool before(const struct pushq_entry *a, const struct pushq_entry *b)
{
	if (a->priority != b->priority)
		return a->priority > b->priority;
	return a->key < b->key;
}

static void sleep_ms(long ms)
{
	struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
	nanosleep(&ts, NULL);
}

static struct pushq_entry entry(int priority, uint64_t key, size_t bytes)
{
	return (struct pushq_entry){.priority = priority, .key = key, .bytes = bytes,
				    .order = UINT64_MAX};
}

/* 1. Order: shuffled pushes come out sorted by (priority desc, key asc),
 * numbered 0, 1, 2, ... */
static void test_order(void **state)
{
	(void)state;
	enum { N = 200 };
	static const int prios[] = {-3, 0, 1, 7, 42};
	struct pushq_entry *es = calloc(N, sizeof *es);
	struct pushq_entry **ptrs = calloc(N, sizeof *ptrs);
	assert_true(es != NULL && ptrs != NULL);
	for (size_t i = 0; i < N; i++) {
		/* distinct keys, spread so key order and priority order disagree */
		es[i] = entry(prios[rng() % 5], (uint64_t)(i * 7919 % 1009) * 1000 + i, 1 + i % 13);
		ptrs[i] = &es[i];
	}
	for (int round = 0; round < 3; round++) {
		struct pushq q;
		assert_true(pushq_init(&q, 0) == 0);
		shuffle(ptrs, N);
		for (size_t i = 0; i < N; i++) {
			ptrs[i]->order = UINT64_MAX;
			assert_true(pushq_push(&q, ptrs[i]) == 0);
		}
		struct pushq_stats st;
		pushq_stats(&q, &st);
		assert_true(st.queued == N);
		const struct pushq_entry *prev = NULL;
		for (size_t i = 0; i < N; i++) {
			struct pushq_entry *e = pushq_try_pop(&q);	/* credit 0: never gated */
			assert_true(e != NULL);
			assert_true(e->order == i);
			if (prev != NULL)
				assert_true(before(prev, e));
			prev = e;
		}
		assert_true(pushq_try_pop(&q) == NULL);	/* empty */
		for (size_t i = 0; i < N; i++)
			assert_true(es[i].order < N);	/* every entry came out once */
		pushq_stats(&q, &st);
		assert_true(st.queued == 0);
		assert_true(st.taken == N);
		pushq_fini(&q);
	}
	free(ptrs);
	free(es);
}

/* Interleaved pushes and pops against a brute-force reference: each pop
 * must return the least entry of those queued at that moment. */
static void test_order_interleaved(void **state)
{
	(void)state;
	enum { N = 2000 };
	struct pushq_entry *es = calloc(N, sizeof *es);
	bool *queued = calloc(N, sizeof *queued);
	assert_true(es != NULL && queued != NULL);
	struct pushq q;
	assert_true(pushq_init(&q, 0) == 0);
	size_t pushed = 0, popped = 0;
	while (popped < N) {
		bool push = pushed < N && (pushed == popped || rng() % 3 != 0);
		if (push) {
			es[pushed] = entry((int)(rng() % 4), rng() % 100000 * N + pushed, 4);
			queued[pushed] = true;
			assert_true(pushq_push(&q, &es[pushed]) == 0);
			pushed++;
			continue;
		}
		size_t best = SIZE_MAX;
		for (size_t i = 0; i < pushed; i++)
			if (queued[i] && (best == SIZE_MAX || before(&es[i], &es[best])))
				best = i;
		struct pushq_entry *e = pushq_try_pop(&q);
		assert_true(e == &es[best]);
		assert_true(e->order == popped);
		queued[best] = false;
		popped++;
	}
	assert_true(pushq_try_pop(&q) == NULL);
	pushq_fini(&q);
	free(queued);
	free(es);
}

/* 2. Credit: 10 bytes of credit let two 4-byte entries out, not three. */
static void test_credit(void **state)
{
	(void)state;
	struct pushq q;
	assert_true(pushq_init(&q, 10) == 0);
	struct pushq_entry es[5];
	for (int i = 0; i < 5; i++) {
		es[i] = entry(0, (uint64_t)i, 4);
		assert_true(pushq_push(&q, &es[i]) == 0);
	}
	struct pushq_stats st;
	struct pushq_entry *e;
	assert_true((e = pushq_try_pop(&q)) == &es[0]);
	assert_true(e->inflight == 4);		/* in flight with it, itself included */
	assert_true((e = pushq_try_pop(&q)) == &es[1]);
	assert_true(e->inflight == 8);
	assert_true(pushq_try_pop(&q) == NULL);	/* 8 in flight, 12 > 10 */
	assert_true(pushq_try_pop(&q) == NULL);	/* still */
	pushq_stats(&q, &st);
	assert_true(st.inflight == 8);
	assert_true(st.max_inflight == 8);
	assert_true(st.queued == 3);
	assert_true(pushq_release(&q, 4) == 4);	/* returns what is still in flight */
	assert_true((e = pushq_try_pop(&q)) == &es[2]);
	assert_true(e->inflight == 8);
	assert_true(pushq_try_pop(&q) == NULL);
	pushq_stats(&q, &st);
	assert_true(st.inflight == 8);
	assert_true(st.max_inflight == 8);
	assert_true(st.max_inflight <= st.credit);
	/* release everything: two more fit, the credit is never exceeded */
	assert_true(pushq_release(&q, 8) == 0);
	assert_true(pushq_try_pop(&q) == &es[3]);
	assert_true(pushq_try_pop(&q) == &es[4]);
	assert_true(pushq_try_pop(&q) == NULL);	/* empty */
	pushq_stats(&q, &st);
	assert_true(st.max_inflight == 8);
	assert_true(st.taken == 5);
	pushq_fini(&q);
}

/* max_inflight never exceeds the credit over a long random run. */
static void test_credit_random(void **state)
{
	(void)state;
	enum { N = 1000, CREDIT = 64 };
	struct pushq_entry *es = calloc(N, sizeof *es);
	struct pushq_entry **out = calloc(N, sizeof *out);
	assert_true(es != NULL && out != NULL);
	struct pushq q;
	assert_true(pushq_init(&q, CREDIT) == 0);
	for (size_t i = 0; i < N; i++) {
		es[i] = entry((int)(rng() % 3), i, 1 + rng() % CREDIT);
		assert_true(pushq_push(&q, &es[i]) == 0);
	}
	size_t nout = 0, done = 0, inflight = 0;
	while (done < N) {
		struct pushq_entry *e;
		while ((e = pushq_try_pop(&q)) != NULL) {
			inflight += e->bytes;
			assert_true(inflight <= CREDIT);
			out[nout++] = e;
		}
		assert_true(nout > done);	/* with nothing in flight the head goes out */
		/* release a random one of those in flight */
		size_t k = done + (size_t)(rng() % (nout - done));
		struct pushq_entry *t = out[k];
		out[k] = out[done];
		out[done++] = t;
		inflight -= t->bytes;
		pushq_release(&q, t->bytes);
	}
	struct pushq_stats st;
	pushq_stats(&q, &st);
	assert_true(st.max_inflight <= CREDIT);
	assert_true(st.inflight == 0);
	assert_true(st.taken == N);
	pushq_fini(&q);
	free(out);
	free(es);
}

/* 3. Head-of-line: a high-priority entry pushed behind a blocked
 * low-priority backlog is the next one out once credit comes back. */
static void test_head_of_line(void **state)
{
	(void)state;
	enum { LOW = 50 };
	struct pushq q;
	assert_true(pushq_init(&q, 8) == 0);
	struct pushq_entry low[LOW];
	for (int i = 0; i < LOW; i++) {
		low[i] = entry(0, (uint64_t)i, 4);
		assert_true(pushq_push(&q, &low[i]) == 0);
	}
	assert_true(pushq_try_pop(&q) == &low[0]);
	assert_true(pushq_try_pop(&q) == &low[1]);
	assert_true(pushq_try_pop(&q) == NULL);	/* credit exhausted */
	struct pushq_entry high = entry(5, 1000, 4);	/* larger key: priority wins */
	assert_true(pushq_push(&q, &high) == 0);
	assert_true(pushq_try_pop(&q) == NULL);	/* still no credit */
	pushq_release(&q, 4);
	struct pushq_entry *e = pushq_try_pop(&q);
	assert_true(e == &high);
	assert_true(e->order == 2);
	assert_true(pushq_try_pop(&q) == NULL);
	pushq_release(&q, 4);
	assert_true(pushq_try_pop(&q) == &low[2]);	/* then the backlog, in order */
	pushq_fini(&q);
}

/* 4. An entry bigger than the whole credit goes out only when nothing is
 * in flight, and then alone. */
static void test_oversized(void **state)
{
	(void)state;
	struct pushq q;
	assert_true(pushq_init(&q, 8) == 0);
	struct pushq_entry small0 = entry(9, 0, 2);
	struct pushq_entry big = entry(5, 1, 20);
	struct pushq_entry small1 = entry(1, 2, 1);
	assert_true(pushq_push(&q, &small1) == 0);
	assert_true(pushq_push(&q, &big) == 0);
	assert_true(pushq_push(&q, &small0) == 0);
	assert_true(pushq_try_pop(&q) == &small0);
	assert_true(pushq_try_pop(&q) == NULL);	/* 2 in flight: big waits */
	pushq_release(&q, 1);
	assert_true(pushq_try_pop(&q) == NULL);	/* 1 in flight: still waits */
	pushq_release(&q, 1);
	assert_true(pushq_try_pop(&q) == &big);	/* nothing in flight */
	assert_true(pushq_try_pop(&q) == NULL);	/* alone: even 1 byte waits */
	struct pushq_stats st;
	pushq_stats(&q, &st);
	assert_true(st.inflight == 20);
	assert_true(st.max_inflight == 20);	/* only the oversized entry went past the credit */
	pushq_release(&q, 20);
	assert_true(pushq_try_pop(&q) == &small1);
	/* two oversized entries in a row: one at a time */
	struct pushq_entry big1 = entry(0, 10, 9), big2 = entry(0, 11, 30);
	assert_true(pushq_push(&q, &big2) == 0);
	assert_true(pushq_push(&q, &big1) == 0);
	assert_true(pushq_try_pop(&q) == NULL);	/* small1 in flight */
	pushq_release(&q, 1);
	assert_true(pushq_try_pop(&q) == &big1);
	assert_true(pushq_try_pop(&q) == NULL);
	pushq_release(&q, 9);
	assert_true(pushq_try_pop(&q) == &big2);
	pushq_stats(&q, &st);
	assert_true(st.max_inflight == 30);
	pushq_fini(&q);
}

/* 5. The head is never skipped for a smaller entry behind it. */
static void test_head_not_skipped(void **state)
{
	(void)state;
	struct pushq q;
	assert_true(pushq_init(&q, 8) == 0);
	struct pushq_entry first = entry(3, 0, 4);
	struct pushq_entry head = entry(2, 1, 6);
	struct pushq_entry tail = entry(1, 2, 2);
	assert_true(pushq_push(&q, &tail) == 0);
	assert_true(pushq_push(&q, &head) == 0);
	assert_true(pushq_push(&q, &first) == 0);
	assert_true(pushq_try_pop(&q) == &first);	/* 4 in flight, 4 free */
	assert_true(pushq_try_pop(&q) == NULL);	/* 6 > 4, and the 2 behind must not pass */
	struct pushq_stats st;
	pushq_stats(&q, &st);
	assert_true(st.inflight == 4);
	assert_true(st.queued == 2);
	pushq_release(&q, 2);
	assert_true(pushq_try_pop(&q) == &head);	/* 2 + 6 = 8 fits exactly */
	assert_true(pushq_try_pop(&q) == NULL);	/* 8 in flight */
	pushq_release(&q, 2);
	assert_true(pushq_try_pop(&q) == &tail);
	pushq_fini(&q);
}

/* 6. Raising the credit lets more out; credit 0 removes the gate. */
static void test_set_credit(void **state)
{
	(void)state;
	struct pushq q;
	assert_true(pushq_init(&q, 4) == 0);
	struct pushq_entry es[8];
	for (int i = 0; i < 8; i++) {
		es[i] = entry(0, (uint64_t)i, 4);
		assert_true(pushq_push(&q, &es[i]) == 0);
	}
	assert_true(pushq_try_pop(&q) == &es[0]);
	assert_true(pushq_try_pop(&q) == NULL);
	pushq_set_credit(&q, 12);
	assert_true(pushq_try_pop(&q) == &es[1]);
	assert_true(pushq_try_pop(&q) == &es[2]);
	assert_true(pushq_try_pop(&q) == NULL);	/* 12 in flight */
	struct pushq_stats st;
	pushq_stats(&q, &st);
	assert_true(st.credit == 12);
	assert_true(st.inflight == 12);
	pushq_set_credit(&q, 0);			/* no gate */
	for (int i = 3; i < 8; i++)
		assert_true(pushq_try_pop(&q) == &es[i]);
	assert_true(pushq_try_pop(&q) == NULL);	/* empty */
	pushq_stats(&q, &st);
	assert_true(st.credit == 0);
	assert_true(st.inflight == 32);
	assert_true(st.max_inflight == 32);
	/* lowering the credit gates again */
	pushq_set_credit(&q, 8);
	struct pushq_entry more = entry(0, 100, 1);
	assert_true(pushq_push(&q, &more) == 0);
	assert_true(pushq_try_pop(&q) == NULL);	/* 32 in flight > 8 */
	pushq_release(&q, 25);
	assert_true(pushq_try_pop(&q) == &more);	/* 7 + 1 = 8 */
	pushq_fini(&q);
}

struct popper {
	struct pushq *q;
	struct pushq_entry *got;
	int done;			/* under lock */
	pthread_mutex_t lock;
};

static void *pop_thread(void *arg)
{
	struct popper *p = arg;
	struct pushq_entry *e = pushq_pop(p->q);
	pthread_mutex_lock(&p->lock);
	p->got = e;
	p->done = 1;
	pthread_mutex_unlock(&p->lock);
	return NULL;
}

static int popper_done(struct popper *p)
{
	pthread_mutex_lock(&p->lock);
	int d = p->done;
	pthread_mutex_unlock(&p->lock);
	return d;
}

static void popper_start(struct popper *p, struct pushq *q, pthread_t *t)
{
	*p = (struct popper){.q = q};
	assert_true(pthread_mutex_init(&p->lock, NULL) == 0);
	assert_true(pthread_create(t, NULL, pop_thread, p) == 0);
}

/* 7a. pushq_pop waits for credit and returns once it comes back. */
static void test_pop_waits_for_credit(void **state)
{
	(void)state;
	struct pushq q;
	assert_true(pushq_init(&q, 8) == 0);
	struct pushq_entry a = entry(1, 0, 8), b = entry(0, 1, 4);
	assert_true(pushq_push(&q, &a) == 0);
	assert_true(pushq_push(&q, &b) == 0);
	assert_true(pushq_pop(&q) == &a);		/* fits: does not block */
	struct popper p;
	pthread_t t;
	popper_start(&p, &q, &t);
	sleep_ms(100);
	assert_true(!popper_done(&p));		/* 8 in flight: b must wait */
	pushq_release(&q, 8);
	assert_true(pthread_join(t, NULL) == 0);
	assert_true(p.got == &b);
	assert_true(b.order == 1);
	pthread_mutex_destroy(&p.lock);

	/* pushq_pop on an empty queue waits for a push */
	struct pushq_entry c = entry(0, 2, 4);
	popper_start(&p, &q, &t);
	sleep_ms(50);
	assert_true(!popper_done(&p));
	assert_true(pushq_push(&q, &c) == 0);
	assert_true(pthread_join(t, NULL) == 0);
	assert_true(p.got == &c);
	pthread_mutex_destroy(&p.lock);

	/* raising the credit also wakes it */
	struct pushq_entry d = entry(0, 3, 4);
	assert_true(pushq_push(&q, &d) == 0);	/* 8 in flight: d waits */
	popper_start(&p, &q, &t);
	sleep_ms(50);
	assert_true(!popper_done(&p));
	pushq_set_credit(&q, 12);
	assert_true(pthread_join(t, NULL) == 0);
	assert_true(p.got == &d);
	pthread_mutex_destroy(&p.lock);
	pushq_fini(&q);
}

/* 7b. pushq_close wakes a blocked pushq_pop with NULL; pushq_drain then
 * returns what is left, in order, whatever the credit. */
static void test_close_and_drain(void **state)
{
	(void)state;
	struct pushq q;
	assert_true(pushq_init(&q, 4) == 0);
	struct pushq_entry es[6];
	static const int prios[6] = {0, 2, 1, 2, 0, 1};
	for (int i = 0; i < 6; i++) {
		es[i] = entry(prios[i], (uint64_t)(10 - i), 4);
		assert_true(pushq_push(&q, &es[i]) == 0);
	}
	struct pushq_entry *first = pushq_pop(&q);
	assert_true(first == &es[3]);			/* priority 2, key 7 */
	struct popper p;
	pthread_t t;
	popper_start(&p, &q, &t);			/* blocks: credit used up */
	sleep_ms(100);
	assert_true(!popper_done(&p));
	pushq_close(&q);
	assert_true(pthread_join(t, NULL) == 0);
	assert_true(p.got == NULL);
	pthread_mutex_destroy(&p.lock);
	/* after close: pops return NULL at once, even with credit back */
	pushq_release(&q, 4);
	assert_true(pushq_pop(&q) == NULL);
	assert_true(pushq_try_pop(&q) == NULL);
	struct pushq_stats st;
	pushq_stats(&q, &st);
	assert_true(st.queued == 5);
	assert_true(st.taken == 1);
	/* drain: the rest, in order */
	static const int want[5] = {1, 5, 2, 4, 0};	/* (2,9) (1,5) (1,8) (0,6) (0,10) */
	for (int i = 0; i < 5; i++)
		assert_true(pushq_drain(&q) == &es[want[i]]);
	assert_true(pushq_drain(&q) == NULL);
	assert_true(pushq_drain(&q) == NULL);
	pushq_stats(&q, &st);
	assert_true(st.queued == 0);
	pushq_fini(&q);

	/* close wakes a pop waiting on an empty queue too */
	assert_true(pushq_init(&q, 0) == 0);
	popper_start(&p, &q, &t);
	sleep_ms(50);
	assert_true(!popper_done(&p));
	pushq_close(&q);
	assert_true(pthread_join(t, NULL) == 0);
	assert_true(p.got == NULL);
	pthread_mutex_destroy(&p.lock);
	assert_true(pushq_drain(&q) == NULL);
	pushq_fini(&q);
}

/* Several blocked poppers each get a distinct entry as credit comes back. */
static void test_many_poppers(void **state)
{
	(void)state;
	enum { T = 4 };
	struct pushq q;
	assert_true(pushq_init(&q, 4) == 0);
	struct pushq_entry hold = entry(9, 0, 4), es[T];
	assert_true(pushq_push(&q, &hold) == 0);
	assert_true(pushq_try_pop(&q) == &hold);
	for (int i = 0; i < T; i++) {
		es[i] = entry(0, (uint64_t)(i + 1), 4);
		assert_true(pushq_push(&q, &es[i]) == 0);
	}
	struct popper p[T];
	pthread_t t[T];
	for (int i = 0; i < T; i++)
		popper_start(&p[i], &q, &t[i]);
	sleep_ms(50);
	for (int i = 0; i < T; i++) {
		/* exactly one more popper finishes per release */
		pushq_release(&q, 4);
		int done = 0;
		for (int spin = 0; spin < 2000 && done < i + 1; spin++) {
			sleep_ms(1);
			done = 0;
			for (int j = 0; j < T; j++)
				done += popper_done(&p[j]);
		}
		sleep_ms(20);			/* give a wrong second wakeup time to show */
		done = 0;
		for (int j = 0; j < T; j++)
			done += popper_done(&p[j]);
		assert_true(done == i + 1);
	}
	bool seen[T] = {false};
	for (int i = 0; i < T; i++) {
		assert_true(pthread_join(t[i], NULL) == 0);
		assert_true(p[i].got != NULL);
		ptrdiff_t k = p[i].got - es;
		assert_true(k >= 0 && k < T);
		assert_true(!seen[k]);
		seen[k] = true;
		pthread_mutex_destroy(&p[i].lock);
	}
	struct pushq_stats st;
	pushq_stats(&q, &st);
	assert_true(st.max_inflight == 4);
	assert_true(st.taken == T + 1);
	pushq_fini(&q);
}

/* 8. The counters after a known sequence. */
static void test_stats(void **state)
{
	(void)state;
	struct pushq q;
	assert_true(pushq_init(&q, 100) == 0);
	struct pushq_stats st;
	pushq_stats(&q, &st);
	assert_true(st.credit == 100);
	assert_true(st.inflight == 0);
	assert_true(st.max_inflight == 0);
	assert_true(st.queued == 0);
	assert_true(st.taken == 0);
	struct pushq_entry es[6];
	for (int i = 0; i < 6; i++) {
		es[i] = entry(0, (uint64_t)i, (size_t)(10 * (i + 1)));	/* 10 .. 60 */
		assert_true(pushq_push(&q, &es[i]) == 0);
	}
	pushq_stats(&q, &st);
	assert_true(st.queued == 6);
	assert_true(st.taken == 0);
	assert_true(st.inflight == 0);
	assert_true(pushq_try_pop(&q) == &es[0]);	/* 10 in flight */
	assert_true(pushq_try_pop(&q) == &es[1]);	/* 30 */
	assert_true(pushq_try_pop(&q) == &es[2]);	/* 60 */
	assert_true(pushq_try_pop(&q) == &es[3]);	/* 100: fits exactly */
	assert_true(pushq_try_pop(&q) == NULL);	/* 150 would not */
	pushq_stats(&q, &st);
	assert_true(st.credit == 100);
	assert_true(st.inflight == 100);
	assert_true(st.max_inflight == 100);
	assert_true(st.queued == 2);
	assert_true(st.taken == 4);
	assert_true(es[3].inflight == 100);
	assert_true(pushq_release(&q, 30) == 70);
	assert_true(pushq_try_pop(&q) == NULL);	/* 70 + 50 > 100 */
	assert_true(pushq_release(&q, 50) == 20);
	assert_true(pushq_try_pop(&q) == &es[4]);	/* 20 + 50 */
	assert_true(es[4].inflight == 70);
	pushq_stats(&q, &st);
	assert_true(st.inflight == 70);
	assert_true(st.max_inflight == 100);	/* the peak stays */
	assert_true(st.queued == 1);
	assert_true(st.taken == 5);
	/* drain takes without counting: neither taken nor in flight */
	struct pushq_entry extra = entry(1, 99, 7);
	assert_true(pushq_push(&q, &extra) == 0);
	pushq_stats(&q, &st);
	assert_true(st.queued == 2);
	assert_true(pushq_drain(&q) == &extra);
	pushq_stats(&q, &st);
	assert_true(st.queued == 1);
	assert_true(st.taken == 5);
	assert_true(st.inflight == 70);
	assert_true(pushq_release(&q, 70) == 0);
	assert_true(pushq_try_pop(&q) == &es[5]);
	assert_true(es[5].order == 5);
	assert_true(es[5].inflight == 60);
	assert_true(pushq_release(&q, 60) == 0);
	pushq_set_credit(&q, 50);
	pushq_stats(&q, &st);
	assert_true(st.credit == 50);
	assert_true(st.inflight == 0);
	assert_true(st.max_inflight == 100);
	assert_true(st.queued == 0);
	assert_true(st.taken == 6);
	pushq_fini(&q);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_order),
		cmocka_unit_test(test_order_interleaved),
		cmocka_unit_test(test_credit),
		cmocka_unit_test(test_credit_random),
		cmocka_unit_test(test_head_of_line),
		cmocka_unit_test(test_oversized),
		cmocka_unit_test(test_head_not_skipped),
		cmocka_unit_test(test_set_credit),
		cmocka_unit_test(test_pop_waits_for_credit),
		cmocka_unit_test(test_close_and_drain),
		cmocka_unit_test(test_many_poppers),
		cmocka_unit_test(test_stats),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
