/*
 * loop.h - an event loop: descriptors watched with epoll, timers and
 * calls posted from other threads, all run on the one thread that runs
 * the loop (see loop.c for the design; conn.h drives a transport's
 * connection on it).
 *
 * Threading contract.  loop_run() runs on one thread, the loop's.  Every
 * function here is for that thread (or for the owner before the loop runs
 * and after it returned), except loop_post(), loop_wake() and loop_stop(),
 * which any thread may call, and loop_io_set(), which any thread may call
 * for a watch it owns (epoll_ctl is thread-safe).  Nothing the loop calls
 * may block for long: it delays every other descriptor and timer.
 */
#ifndef UNISUM_LOOP_H
#define UNISUM_LOOP_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

struct loop;

/* A watched descriptor, embedded in its owner's structure. */
struct loop_io {
	struct loop *loop;
	int fd;
	uint32_t events;	/* EPOLLIN | EPOLLOUT as watched now */
	void (*fn)(struct loop_io *io, uint32_t events);
	void *arg;
};

/* A timer, embedded in its owner's structure; fires once, or every
 * period_ms when that is above 0. */
struct loop_timer {
	int64_t due_ms;		/* timing_now_ms() when it fires */
	int period_ms;
	int slot;		/* its place in the loop's heap, -1: not started */
	void (*fn)(struct loop_timer *t);
	void *arg;
};

/* A new loop: 0 and *out, or UNISUM_ESYS / UNISUM_ENOMEM (logged, naming
 * the limit when descriptors ran out). */
int loop_new(struct loop **out);
/* Frees a loop that is not running; its watches must be gone. */
void loop_free(struct loop *l);

/* Runs the loop on the calling thread until loop_stop().  After every
 * round of events, timers and posted calls it calls after(arg) when that
 * is not NULL (the owner's place to look at its state as a whole). */
void loop_run(struct loop *l, void (*after)(void *arg), void *arg);
/* Makes loop_run() return after its current round; any thread. */
void loop_stop(struct loop *l);
/* Whether the calling thread is the one running l. */
bool loop_on_thread(const struct loop *l);

/* Watches fd for `events` (EPOLLIN, EPOLLOUT; level-triggered), calling
 * fn(io, events seen) on the loop's thread.  0 or UNISUM_ESYS. */
int loop_io_add(struct loop *l, struct loop_io *io, int fd, uint32_t events,
		void (*fn)(struct loop_io *io, uint32_t events), void *arg);
/* Changes what io waits for; any thread.  0 or UNISUM_ESYS. */
int loop_io_set(struct loop_io *io, uint32_t events);
/* Stops watching io (the descriptor stays open); no call for it follows,
 * not even one for an event already collected this round. */
void loop_io_del(struct loop_io *io);

/* Starts t to fire after `ms` (and then every `period_ms` when above 0). */
void loop_timer_start(struct loop *l, struct loop_timer *t, int ms, int period_ms,
		      void (*fn)(struct loop_timer *t), void *arg);
/* Stops t if it is started; it does not fire afterwards. */
void loop_timer_stop(struct loop *l, struct loop_timer *t);

/* Runs fn(arg) on the loop's thread soon; any thread.  0, or UNISUM_ENOMEM
 * (nothing will run). */
int loop_post(struct loop *l, void (*fn)(void *arg), void *arg);
/* Wakes the loop so that its `after` runs; any thread. */
void loop_wake(struct loop *l);

/* A process's fixed pool of loops (a server's, a worker's): each on a
 * thread of its own named `name`, running loop_run(loop, after, arg),
 * except loop 0 when `on_caller` (its owner runs it on a thread it has). */
struct loop_pool {
	struct loop **loops;	/* [n] */
	int n, made;		/* loops, and how many were made (with their threads) */
	bool on_caller, halted;
	const char *name;
	void (*after)(void *arg);
	void *arg;
	struct loop_pool_thread {
		struct loop_pool *pool;
		struct loop *loop;
		pthread_t thread;
	} *threads;		/* [n] */
};

/* Makes p's n loops and starts their threads (p zeroed, then name, after,
 * arg and on_caller set by the caller).  0, UNISUM_ENOMEM, or UNISUM_ESYS:
 * a loop could not be made (out of descriptors, the limit named in
 * log_last_error()), or a thread could not start (pthread_create's error
 * in *thread_rc, else 0).  loop_pool_free undoes whatever was made. */
int loop_pool_start(struct loop_pool *p, int n, int *thread_rc);
/* Stops every loop and joins their threads; its connections are no longer
 * served.  Once only, whatever the number of calls. */
void loop_pool_halt(struct loop_pool *p);
/* Halts p, then frees its loops. */
void loop_pool_free(struct loop_pool *p);

#endif /* UNISUM_LOOP_H */
