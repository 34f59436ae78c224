/*
 * log.c - see log.h.  One write(2) per line so lines from the threads of a
 * process never interleave mid-line.
 */
#include "log/log.h"
#include "unisum.h"

#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
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

static _Thread_local bool log_hushed;

void log_hush(bool on)
{
	log_hushed = on;
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
	if (level >= log_threshold && !log_hushed)
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

static _Atomic uint64_t log_stall_count;

void log_count_stall(void)
{
	atomic_fetch_add(&log_stall_count, 1);
}

uint64_t log_stalls(void)
{
	return atomic_load(&log_stall_count);
}

const char *log_last_error(void)
{
	return log_last;
}

long log_read_number(const char *path, const char *key)
{
	FILE *f = fopen(path, "r");
	if (f == NULL)
		return -1;
	char line[256];
	long v = -1;
	size_t klen = key != NULL ? strlen(key) : 0;
	while (fgets(line, sizeof line, f) != NULL) {
		if (key != NULL && strncmp(line, key, klen) != 0)
			continue;
		char *end;
		long n = strtol(line + klen, &end, 10);
		v = end != line + klen ? n : -1;	/* "max" reads as no limit */
		break;
	}
	fclose(f);
	return v;
}

/* A limit of this process's cgroup, v1 (controller `ctl`, file `v1`) or
 * v2 (file `v2`), or -1 for none ("max", or v1's near-2^63 no limit). */
static long long log_cgroup_limit(const char *ctl, const char *v1, const char *v2)
{
	FILE *f = fopen("/proc/self/cgroup", "r");
	if (f == NULL)
		return -1;
	char line[512], path[700];
	long long v = -1;
	while (v < 0 && fgets(line, sizeof line, f) != NULL) {
		line[strcspn(line, "\n")] = '\0';
		char *a = strchr(line, ':'), *b = a != NULL ? strchr(a + 1, ':') : NULL;
		if (b == NULL)
			continue;
		*b = '\0';
		if (strstr(a + 1, ctl) != NULL)
			snprintf(path, sizeof path, "/sys/fs/cgroup/%s%s/%s", ctl, b + 1, v1);
		else if (a[1] == '\0')
			snprintf(path, sizeof path, "/sys/fs/cgroup%s/%s", b + 1, v2);
		else
			continue;
		v = log_read_number(path, NULL);
	}
	fclose(f);
	return v >= (1LL << 60) ? -1 : v;
}

void log_thread_limits(int rc, char *buf, size_t len)
{
	struct rlimit r;
	char nproc[32] = "unlimited";
	if (getrlimit(RLIMIT_NPROC, &r) == 0 && r.rlim_cur != RLIM_INFINITY)
		snprintf(nproc, sizeof nproc, "%llu", (unsigned long long)r.rlim_cur);
	long long pids = log_cgroup_limit("pids", "pids.max", "pids.max");
	char cg[64] = "";
	if (pids >= 0)
		snprintf(cg, sizeof cg, ", its pids cgroup's pids.max %lld", pids);
	snprintf(buf, len, "pthread_create: %s: this process runs %ld threads; RLIMIT_NPROC %s "
		 "(every process and thread of the user counts), kernel.pid_max %ld, "
		 "kernel.threads-max %ld%s",
		 strerror(rc), log_read_number("/proc/self/status", "Threads:"), nproc,
		 log_read_number("/proc/sys/kernel/pid_max", NULL),
		 log_read_number("/proc/sys/kernel/threads-max", NULL), cg);
}

void log_fd_limits(int err, char *buf, size_t len)
{
	if (err == ENFILE) {
		snprintf(buf, len, "%s: the system's limit of open files (fs.file-max %ld) is "
			 "reached", strerror(err), log_read_number("/proc/sys/fs/file-max", NULL));
		return;
	}
	struct rlimit r = {0};
	getrlimit(RLIMIT_NOFILE, &r);
	char hard[32] = "unlimited";
	if (r.rlim_max != RLIM_INFINITY)
		snprintf(hard, sizeof hard, "%llu", (unsigned long long)r.rlim_max);
	snprintf(buf, len, "%s: this process has all of its RLIMIT_NOFILE=%llu descriptors open "
		 "(the hard limit is %s; `ulimit -n` raises the soft one up to it)",
		 strerror(err), (unsigned long long)r.rlim_cur, hard);
}

/* " LIMIT=n MiB" for a resource limit that is set, else nothing. */
static void log_rlimit_mib(char *buf, size_t len, int resource, const char *name)
{
	struct rlimit r;
	if (getrlimit(resource, &r) == 0 && r.rlim_cur != RLIM_INFINITY)
		snprintf(buf, len, "; %s=%llu MiB", name, (unsigned long long)(r.rlim_cur >> 20));
}

void log_memory_limits(char *buf, size_t len)
{
	char as[64] = "", data[64] = "", cg[80] = "";
	log_rlimit_mib(as, sizeof as, RLIMIT_AS, "RLIMIT_AS (`ulimit -v`)");
	log_rlimit_mib(data, sizeof data, RLIMIT_DATA, "RLIMIT_DATA (`ulimit -d`)");
	long long mem = log_cgroup_limit("memory", "memory.limit_in_bytes", "memory.max");
	if (mem >= 0)
		snprintf(cg, sizeof cg, "; its memory cgroup's limit %lld MiB", mem >> 20);
	snprintf(buf, len, "this process maps %ld MiB and holds %ld MiB%s%s%s; the machine has "
		 "%ld MiB available",
		 log_read_number("/proc/self/status", "VmSize:") >> 10,
		 log_read_number("/proc/self/status", "VmRSS:") >> 10, as, data, cg,
		 log_read_number("/proc/meminfo", "MemAvailable:") >> 10);
}

long log_oom_kills(void)
{
	return log_read_number("/proc/vmstat", "oom_kill ");
}

/* ": out of memory, by the kernel's OOM killer (...)" when its count rose
 * above `before`, else "". */
static void log_oom_note(long before, char *buf, size_t len)
{
	long now = log_oom_kills();
	buf[0] = '\0';
	if (before >= 0 && now > before)
		snprintf(buf, len, ": out of memory, by the kernel's OOM killer (oom_kill in "
			 "/proc/vmstat rose from %ld to %ld during the job; `dmesg` names the process "
			 "and its memory cgroup)", before, now);
}

void log_killed(int sig, bool core, long oom_before, char *buf, size_t len)
{
	char name[32], note[240] = "";
	const char *abbrev = sigabbrev_np(sig);
	if (abbrev != NULL)
		snprintf(name, sizeof name, "SIG%s", abbrev);
	else
		snprintf(name, sizeof name, "signal %d", sig);
	if (sig == SIGKILL)
		log_oom_note(oom_before, note, sizeof note);
	snprintf(buf, len, "killed by signal %d (%s)%s%s", sig, name, core ? ", core dumped" : "",
		 note);
}
