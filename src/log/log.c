/*
 * log.c - see log.h.  One write(2) per line so lines from the threads of a
 * process never interleave mid-line.
 */
#include "log/log.h"
#include "unisum.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

int log_threshold = LOG_LEVEL_WARNING;

/* Who is logging: set once the role and rank are known, read by every
 * thread, so both are atomics (the role is always a string literal). */
static _Atomic(const char *) log_role = NULL;
static atomic_int log_rank = -1;
static _Thread_local char log_last[1024];

static const char *const log_level_names[] = {
	"TRACE", "DEBUG", "INFO", "WARNING", "ERROR", "FATAL",
};

void log_set_identity(const char *role, int rank)
{
	atomic_store(&log_rank, rank);
	atomic_store(&log_role, role);
}

void log_set_level(int level)
{
	if (level >= LOG_LEVEL_TRACE && level <= LOG_LEVEL_FATAL)
		log_threshold = level;
}

int log_level_parse(const char *s)
{
	if (s[0] >= '0' && s[0] <= '5' && s[1] == '\0')
		return s[0] - '0';
	for (int i = 0; i <= LOG_LEVEL_FATAL; i++)
		if (strcasecmp(s, log_level_names[i]) == 0)
			return i;
	if (strcasecmp(s, "WARN") == 0)
		return LOG_LEVEL_WARNING;
	return -1;
}

static void log_vwrite(int level, const char *fmt, va_list ap)
{
	char line[2048];
	const char *role = atomic_load(&log_role);
	int rank = atomic_load(&log_rank), n;
	if (role == NULL)
		n = snprintf(line, sizeof line, "unisum %s: ", log_level_names[level]);
	else if (rank < 0)
		n = snprintf(line, sizeof line, "unisum[%s] %s: ", role, log_level_names[level]);
	else
		n = snprintf(line, sizeof line, "unisum[%s %d] %s: ", role, rank, log_level_names[level]);
	if (n < 0)
		return;
	int m = vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
	size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
	if (len > sizeof line - 2)
		len = sizeof line - 2;
	line[len++] = '\n';
	ssize_t rc = write(STDERR_FILENO, line, len);
	(void)rc;
}

void log_write(int level, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	log_vwrite(level, fmt, ap);
	va_end(ap);
}

/* Formats into a temporary first: callers often pass log_last_error()
 * itself as an argument, to wrap the previous message in context. */
static void log_vset_last(const char *fmt, va_list ap)
{
	char tmp[sizeof log_last];
	vsnprintf(tmp, sizeof tmp, fmt, ap);
	memcpy(log_last, tmp, sizeof log_last);
}

int log_fail(int err, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	log_vset_last(fmt, ap);
	va_end(ap);
	/* An elastic job's re-form is news, said once (a warning), not a
	 * failure of every operation it ends. */
	int level = err == UNISUM_EMEMBERSHIP ? LOG_LEVEL_DEBUG : LOG_LEVEL_ERROR;
	if (level >= log_threshold)
		log_write(level, "%s", log_last);
	return err;
}

void log_set_last_error(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	log_vset_last(fmt, ap);
	va_end(ap);
}

const char *log_last_error(void)
{
	return log_last;
}
