/*
 * loop.c - the event loop (see loop.h).
 *
 * DESIGN.  One epoll set, level-triggered: a callback that leaves bytes
 * unread is simply called again next round, so no callback has to drain
 * its descriptor (one connection cannot starve the others).  Timers sit
 * in a binary heap ordered by when they fire; the loop sleeps in
 * epoll_wait until the first is due.  Other threads reach the loop
 * through an eventfd: loop_post() queues a call under a mutex and writes
 * the eventfd, loop_wake() only writes it.  A watch removed while the
 * round's events are being dispatched is struck from the rest of the
 * round, so its owner may free it at once.
 */
#include "loop/loop.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include <sys/prctl.h>

#include "log/log.h"
#include "timing/timing.h"
#include "unisum.h"

#define LOOP_BATCH 64

struct loop_post {
	void (*fn)(void *arg);
	void *arg;
	struct loop_post *next;
};

struct loop {
	int epfd;
	struct loop_io wake;		/* the eventfd other threads write */
	pthread_t thread;		/* the one running it ... */
	atomic_bool running;		/* ... while this is set */
	atomic_bool stop;
	struct loop_timer **heap;	/* [ntimers], soonest first */
	int ntimers, cap_timers;
	pthread_mutex_t post_lock;	/* the queue below */
	struct loop_post *posts, **posts_tail;
	struct epoll_event batch[LOOP_BATCH];	/* this round's events ... */
	int batch_n, batch_i;		/* ... how many, the one being run */
};

static void loop_wake_read(struct loop_io *io, uint32_t events)
{
	(void)events;
	uint64_t n;
	while (read(io->fd, &n, sizeof n) < 0 && errno == EINTR)
		;
}

int loop_new(struct loop **out)
{
	struct loop *l = calloc(1, sizeof *l);
	if (l == NULL)
		return UNISUM_ENOMEM;
	l->epfd = epoll_create1(EPOLL_CLOEXEC);
	int evfd = l->epfd < 0 ? -1 : eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (evfd < 0) {
		char why[300];
		int e = errno;
		if (e == EMFILE || e == ENFILE)
			log_fd_limits(e, why, sizeof why);
		else
			snprintf(why, sizeof why, "%s", strerror(e));
		int rc = log_fail(UNISUM_ESYS, "cannot make an event loop: %s: %s",
				  l->epfd < 0 ? "epoll_create1()" : "eventfd()", why);
		if (l->epfd >= 0)
			close(l->epfd);
		free(l);
		return rc;
	}
	pthread_mutex_init(&l->post_lock, NULL);
	l->posts_tail = &l->posts;
	atomic_init(&l->running, false);
	atomic_init(&l->stop, false);
	if (loop_io_add(l, &l->wake, evfd, EPOLLIN, loop_wake_read, NULL) != 0) {
		close(evfd);
		loop_free(l);
		return UNISUM_ESYS;
	}
	*out = l;
	return 0;
}

void loop_free(struct loop *l)
{
	if (l == NULL)
		return;
	if (l->wake.loop != NULL) {
		loop_io_del(&l->wake);
		close(l->wake.fd);
	}
	while (l->posts != NULL) {
		struct loop_post *p = l->posts;
		l->posts = p->next;
		free(p);
	}
	close(l->epfd);
	free(l->heap);
	pthread_mutex_destroy(&l->post_lock);
	free(l);
}

bool loop_on_thread(const struct loop *l)
{
	return atomic_load(&l->running) && pthread_equal(l->thread, pthread_self());
}

int loop_io_add(struct loop *l, struct loop_io *io, int fd, uint32_t events,
		void (*fn)(struct loop_io *io, uint32_t events), void *arg)
{
	io->loop = l;
	io->fd = fd;
	io->events = events;
	io->fn = fn;
	io->arg = arg;
	struct epoll_event ev = {.events = events, .data.ptr = io};
	if (epoll_ctl(l->epfd, EPOLL_CTL_ADD, fd, &ev) != 0) {
		io->loop = NULL;
		return log_fail(UNISUM_ESYS, "epoll_ctl(ADD): %s", strerror(errno));
	}
	return 0;
}

int loop_io_set(struct loop_io *io, uint32_t events)
{
	io->events = events;
	struct epoll_event ev = {.events = events, .data.ptr = io};
	if (epoll_ctl(io->loop->epfd, EPOLL_CTL_MOD, io->fd, &ev) != 0)
		return log_fail(UNISUM_ESYS, "epoll_ctl(MOD): %s", strerror(errno));
	return 0;
}

void loop_io_del(struct loop_io *io)
{
	struct loop *l = io->loop;
	if (l == NULL)
		return;
	epoll_ctl(l->epfd, EPOLL_CTL_DEL, io->fd, NULL);
	for (int i = l->batch_i + 1; i < l->batch_n; i++)
		if (l->batch[i].data.ptr == io)
			l->batch[i].data.ptr = NULL;
	io->loop = NULL;
}

/* ---- timers: a binary heap by due_ms -------------------------------------- */

static void heap_swap(struct loop *l, int a, int b)
{
	struct loop_timer *t = l->heap[a];
	l->heap[a] = l->heap[b];
	l->heap[b] = t;
	l->heap[a]->slot = a;
	l->heap[b]->slot = b;
}

/* Restores the heap around slot i after its timer's due_ms changed. */
static void heap_fix(struct loop *l, int i)
{
	while (i > 0 && l->heap[(i - 1) / 2]->due_ms > l->heap[i]->due_ms) {
		heap_swap(l, i, (i - 1) / 2);
		i = (i - 1) / 2;
	}
	for (;;) {
		int c = 2 * i + 1, best = i;
		if (c < l->ntimers && l->heap[c]->due_ms < l->heap[best]->due_ms)
			best = c;
		if (c + 1 < l->ntimers && l->heap[c + 1]->due_ms < l->heap[best]->due_ms)
			best = c + 1;
		if (best == i)
			return;
		heap_swap(l, i, best);
		i = best;
	}
}

void loop_timer_stop(struct loop *l, struct loop_timer *t)
{
	int i = t->slot;
	if (i < 0 || i >= l->ntimers || l->heap[i] != t)
		return;
	t->slot = -1;
	l->ntimers--;
	if (i == l->ntimers)
		return;
	l->heap[i] = l->heap[l->ntimers];
	l->heap[i]->slot = i;
	heap_fix(l, i);
}

void loop_timer_start(struct loop *l, struct loop_timer *t, int ms, int period_ms,
		      void (*fn)(struct loop_timer *t), void *arg)
{
	if (t->slot >= 0 && t->slot < l->ntimers && l->heap[t->slot] == t)
		loop_timer_stop(l, t);
	t->due_ms = timing_now_ms() + (ms > 0 ? ms : 0);
	t->period_ms = period_ms;
	t->fn = fn;
	t->arg = arg;
	if (l->ntimers == l->cap_timers) {
		int cap = l->cap_timers ? 2 * l->cap_timers : 16;
		struct loop_timer **grown = realloc(l->heap, (size_t)cap * sizeof *grown);
		if (grown == NULL) {
			/* Nothing else to do: a timer that cannot wait fires at once. */
			t->slot = -1;
			fn(t);
			return;
		}
		l->heap = grown;
		l->cap_timers = cap;
	}
	t->slot = l->ntimers;
	l->heap[l->ntimers++] = t;
	heap_fix(l, t->slot);
}

/* Fires every timer that is due; returns the ms until the next (-1: none). */
static int loop_run_timers(struct loop *l)
{
	for (;;) {
		if (l->ntimers == 0)
			return -1;
		struct loop_timer *t = l->heap[0];
		int64_t now = timing_now_ms();
		if (t->due_ms > now) {
			int64_t wait = t->due_ms - now;
			return wait > 60000 ? 60000 : (int)wait;
		}
		if (t->period_ms > 0) {
			/* Next after now: a late loop does not fire a burst. */
			t->due_ms = now + t->period_ms;
			heap_fix(l, 0);
		} else {
			loop_timer_stop(l, t);
		}
		t->fn(t);
	}
}

/* ---- calls from other threads ---------------------------------------------- */

void loop_wake(struct loop *l)
{
	uint64_t one = 1;
	while (write(l->wake.fd, &one, sizeof one) < 0 && errno == EINTR)
		;
}

int loop_post(struct loop *l, void (*fn)(void *arg), void *arg)
{
	struct loop_post *p = malloc(sizeof *p);
	if (p == NULL)
		return UNISUM_ENOMEM;
	p->fn = fn;
	p->arg = arg;
	p->next = NULL;
	pthread_mutex_lock(&l->post_lock);
	*l->posts_tail = p;
	l->posts_tail = &p->next;
	pthread_mutex_unlock(&l->post_lock);
	loop_wake(l);
	return 0;
}

static void loop_run_posts(struct loop *l)
{
	pthread_mutex_lock(&l->post_lock);
	struct loop_post *p = l->posts;
	l->posts = NULL;
	l->posts_tail = &l->posts;
	pthread_mutex_unlock(&l->post_lock);
	while (p != NULL) {
		struct loop_post *next = p->next;
		p->fn(p->arg);
		free(p);
		p = next;
	}
}

void loop_stop(struct loop *l)
{
	atomic_store(&l->stop, true);
	loop_wake(l);
}

void loop_run(struct loop *l, void (*after)(void *arg), void *arg)
{
	l->thread = pthread_self();
	atomic_store(&l->running, true);
	while (!atomic_load(&l->stop)) {
		int wait = loop_run_timers(l);
		int n = epoll_wait(l->epfd, l->batch, LOOP_BATCH, wait);
		if (n < 0 && errno != EINTR) {
			LOG_ERROR("epoll_wait(): %s", strerror(errno));
			break;
		}
		l->batch_n = n > 0 ? n : 0;
		for (l->batch_i = 0; l->batch_i < l->batch_n; l->batch_i++) {
			struct loop_io *io = l->batch[l->batch_i].data.ptr;
			if (io != NULL)
				io->fn(io, l->batch[l->batch_i].events);
		}
		l->batch_n = l->batch_i = 0;
		loop_run_timers(l);
		loop_run_posts(l);
		if (after != NULL)
			after(arg);
	}
	atomic_store(&l->running, false);
	atomic_store(&l->stop, false);
}

/* ---- a pool of loops ---------------------------------------------------------- */

static void *loop_pool_main(void *arg)
{
	struct loop_pool_thread *t = arg;
	prctl(PR_SET_NAME, t->pool->name); /* for top -H, perf and gdb */
	loop_run(t->loop, t->pool->after, t->pool->arg);
	return NULL;
}

int loop_pool_start(struct loop_pool *p, int n, int *thread_rc)
{
	*thread_rc = 0;
	p->n = n;
	p->loops = calloc((size_t)n, sizeof *p->loops);
	p->threads = calloc((size_t)n, sizeof *p->threads);
	if (p->loops == NULL || p->threads == NULL)
		return log_fail(UNISUM_ENOMEM, "out of memory");
	for (; p->made < n; p->made++) {
		int i = p->made, rc = loop_new(&p->loops[i]);
		if (rc != 0)
			return rc;
		p->threads[i] = (struct loop_pool_thread){.pool = p, .loop = p->loops[i]};
		if (i == 0 && p->on_caller)
			continue;
		rc = pthread_create(&p->threads[i].thread, NULL, loop_pool_main, &p->threads[i]);
		if (rc != 0) {
			loop_free(p->loops[i]);
			p->loops[i] = NULL;
			*thread_rc = rc;
			return UNISUM_ESYS;
		}
	}
	return 0;
}

void loop_pool_halt(struct loop_pool *p)
{
	if (p->halted)
		return;
	p->halted = true;
	for (int i = 0; i < p->made; i++)
		loop_stop(p->loops[i]);
	for (int i = p->on_caller ? 1 : 0; i < p->made; i++)
		pthread_join(p->threads[i].thread, NULL);
}

void loop_pool_free(struct loop_pool *p)
{
	loop_pool_halt(p);
	for (int i = 0; i < p->made; i++)
		loop_free(p->loops[i]);
	free(p->loops);
	free(p->threads);
	p->loops = NULL;
	p->threads = NULL;
	p->n = p->made = 0;
}
