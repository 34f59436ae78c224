/*
 * log.h - levelled logging with the role and rank in every line, and the
 * per-thread "last error" message the public API hands to users.
 *
 * The level is checked before anything is formatted (LOG_DEBUG in a hot
 * loop costs one branch when debugging is off).  Lines go to stderr as
 *   unisum[worker 1] ERROR: push_pull of tensor 'fc.weight' ...
 */
#ifndef UNISUM_LOG_H
#define UNISUM_LOG_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum log_level {
	LOG_LEVEL_TRACE = 0,
	LOG_LEVEL_DEBUG = 1,
	LOG_LEVEL_INFO = 2,
	LOG_LEVEL_WARNING = 3,
	LOG_LEVEL_ERROR = 4,
	LOG_LEVEL_FATAL = 5,
};

/* The current threshold; lines below it are dropped. */
extern int log_threshold;

/* Sets the role (a string literal: it is kept, not copied) and rank
 * printed in every line ("worker", 1; rank -1 prints none).  Thread-safe. */
void log_set_identity(const char *role, int rank);
void log_set_level(int level);

/* Parses "TRACE".."FATAL" (case-insensitive) or "0".."5"; -1 if invalid. */
int log_level_parse(const char *s);

void log_write(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define LOG_AT(level, ...)                                                      \
	do {                                                                    \
		if ((level) >= log_threshold)                                   \
			log_write((level), __VA_ARGS__);                        \
	} while (0)
#define LOG_TRACE(...) LOG_AT(LOG_LEVEL_TRACE, __VA_ARGS__)
#define LOG_DEBUG(...) LOG_AT(LOG_LEVEL_DEBUG, __VA_ARGS__)
#define LOG_INFO(...) LOG_AT(LOG_LEVEL_INFO, __VA_ARGS__)
#define LOG_WARN(...) LOG_AT(LOG_LEVEL_WARNING, __VA_ARGS__)
#define LOG_ERROR(...) LOG_AT(LOG_LEVEL_ERROR, __VA_ARGS__)

/* The number after `key` on the first line of `path` that starts with it
 * (key NULL: the first line), or -1 ("max" reads as -1). */
long log_read_number(const char *path, const char *key);

/* Counts a stall report (a round, wait or barrier past
 * UNISUM_STALL_WARN_MS, logged by the caller), and how many there were in
 * this process: the metrics' unisum_stalls_total. */
void log_count_stall(void);
uint64_t log_stalls(void);

/* Records `fmt` as this thread's last error (see unisum_last_error()),
 * logs it at ERROR level and returns `err`, so callers can write
 * `return log_fail(UNISUM_EINVAL, "...")`. */
int log_fail(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* While on, this thread's log_fail records its errors without logging
 * them: a caller that expects failures and retries (a node redialing a
 * restarted scheduler) says what matters itself. */
void log_hush(bool on);

/* Records a last error without logging it (the caller logged already). */
void log_set_last_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* This thread's last error, "" when none. */
const char *log_last_error(void);

/* `code` when it is one of unisum's error codes (a peer sent it as a
 * number), else `fallback`. */
int log_known_error(int code, int fallback);

/* Why a thread could not start (pthread_create's error rc), with the
 * limits that count threads: this process's threads, RLIMIT_NPROC,
 * kernel.pid_max, kernel.threads-max and its pids cgroup's pids.max. */
void log_thread_limits(int rc, char *buf, size_t len);

/* Why a descriptor could not be had (errno `err`: EMFILE, ENFILE), with
 * the limit that was reached: RLIMIT_NOFILE's soft and hard values, or
 * the system's fs.file-max. */
void log_fd_limits(int err, char *buf, size_t len);

/* What bounds this process's memory, for an allocation that failed: what
 * it maps and holds, the limits that are set (RLIMIT_AS, RLIMIT_DATA, its
 * memory cgroup's) and what the machine has available. */
void log_memory_limits(char *buf, size_t len);

/* The kernel's count of processes its out-of-memory killer ended
 * (/proc/vmstat's oom_kill, since Linux 4.13), or -1. */
long log_oom_kills(void);
/* How a process killed by signal `sig` ended: "killed by signal 9
 * (SIGKILL)", ", core dumped" when it did, and for a SIGKILL while the
 * OOM killer's count rose above `oom_before` (log_oom_kills() when the
 * job started) ": out of memory, by the kernel's OOM killer (...)". */
void log_killed(int sig, bool core, long oom_before, char *buf, size_t len);

#endif /* UNISUM_LOG_H */
