/*
 * timing.c - monotonic time and condition variables that wait on it.
 */
#include "timing/timing.h"

#include "unisum.h"

int64_t timing_now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t timing_now_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

int timing_cond_init(pthread_cond_t *cond)
{
	pthread_condattr_t attr;
	if (pthread_condattr_init(&attr) != 0)
		return UNISUM_ESYS;
	int rc = pthread_condattr_setclock(&attr, CLOCK_MONOTONIC) == 0 &&
			 pthread_cond_init(cond, &attr) == 0
		     ? 0
		     : UNISUM_ESYS;
	pthread_condattr_destroy(&attr);
	return rc;
}

struct timespec timing_deadline(int64_t ms)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	ts.tv_sec += (time_t)(ms / 1000);
	ts.tv_nsec += (long)(ms % 1000) * 1000000;
	if (ts.tv_nsec >= 1000000000) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000;
	}
	return ts;
}
