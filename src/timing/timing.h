/*
 * timing.h - the one clock of unisum: monotonic milliseconds, and
 * condition variables whose timed waits run on that clock too, so that a
 * step of the wall clock (NTP, a suspended VM) never cuts a wait short or
 * stretches it.
 */
#ifndef UNISUM_TIMING_H
#define UNISUM_TIMING_H

#include <pthread.h>
#include <stdint.h>
#include <time.h>

/* Milliseconds, and microseconds, on CLOCK_MONOTONIC (an arbitrary origin). */
int64_t timing_now_ms(void);
int64_t timing_now_us(void);

/* Initialises `cond` so that pthread_cond_timedwait() takes deadlines on
 * CLOCK_MONOTONIC (from timing_deadline).  0 or a negative error. */
int timing_cond_init(pthread_cond_t *cond);

/* The CLOCK_MONOTONIC instant `ms` milliseconds from now (ms >= 0), for a
 * timed wait on a condition variable made by timing_cond_init. */
struct timespec timing_deadline(int64_t ms);

#endif /* UNISUM_TIMING_H */
