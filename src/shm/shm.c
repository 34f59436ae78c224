/*
 * shm.c - shared-memory segments and futex flags (see shm.h).
 *
 * A creator publishes a segment in this order: shm_open(O_CREAT|O_EXCL),
 * posix_fallocate to its full size, mmap, header fields, and last the
 * magic with a release store.  An opener checks them in the reverse order:
 * it treats a file smaller than the header, or a header whose magic is
 * still 0, as "not created yet" and tries again, so it never trusts a
 * half-written header.
 *
 * posix_fallocate rather than ftruncate: it reserves the memory now, so a
 * /dev/shm too small (a container's 64 MiB default) fails the create with
 * a clear message instead of killing a worker with SIGBUS at its first
 * touch of the data.
 */
#include "shm/shm.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "log/log.h"
#include "unisum.h"

#define SHM_MAGIC 0x4d535355u	/* "USSM" little-endian; never 0 */
#define SHM_VERSION 1u

/* Tries of shm_seg_create when the name exists and is stale, or vanishes
 * between the create and the look at it. */
#define SHM_CREATE_TRIES 3

/* Spins of shm_flag_wait before it sleeps in the kernel. */
#define SHM_FLAG_SPINS 64

/* The first SHM_DATA_ALIGN bytes of every segment.  magic, version and
 * creator_pid stay at these offsets in every version, so any version can
 * judge whether a segment is stale. */
struct shm_header {
	_Atomic uint32_t magic;		/* SHM_MAGIC once the rest is written; 0 before */
	uint32_t version;		/* SHM_VERSION */
	int32_t creator_pid;		/* the process that created the segment */
	uint32_t data_offset;		/* where the data area starts: SHM_DATA_ALIGN */
	uint64_t data_bytes;		/* size of the data area */
	uint64_t creator_start;		/* the creator's start time (clock ticks after
					 * boot, /proc/<pid>/stat), 0 when unknown:
					 * tells a reused pid from the creator */
	uint8_t reserved[32];		/* zero */
};
_Static_assert(sizeof(struct shm_header) == SHM_DATA_ALIGN, "the header fills the aligned prefix");

/* What a look at an existing name concluded. */
enum seg_verdict {
	SEG_LIVE,	/* in use, or too young to judge: leave it */
	SEG_STALE,	/* its creator is gone: may be removed */
	SEG_GONE,	/* the name no longer exists */
};

static int64_t now_ns(clockid_t clock)
{
	struct timespec ts;
	clock_gettime(clock, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void sleep_ns(int64_t ns)
{
	struct timespec ts = {.tv_sec = ns / 1000000000, .tv_nsec = ns % 1000000000};
	while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
		;
}

static bool name_is_valid(const char *s, size_t max, bool dot_ok)
{
	if (s == NULL)
		return false;
	size_t n = 0;
	for (; s[n] != '\0'; n++) {
		char c = s[n];
		bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
			  c == '-' || c == '_' || (dot_ok && c == '.');
		if (!ok || n >= max)
			return false;
	}
	return n > 0;
}

bool shm_job_is_valid(const char *job)
{
	return name_is_valid(job, SHM_JOB_MAX, false);
}

bool shm_what_is_valid(const char *what)
{
	return name_is_valid(what, SHM_WHAT_MAX, true);
}

/* Writes "/unisum.<job>.<what>" into name (NAME_MAX + 1 bytes), or with
 * what == NULL the prefix "unisum.<job>." of the directory entries (job
 * NULL too: "unisum.").  The caller has validated both. */
static void seg_name(const char *job, const char *what, char *name)
{
	if (what != NULL)
		snprintf(name, NAME_MAX + 1, "/unisum.%s.%s", job, what);
	else if (job != NULL)
		snprintf(name, NAME_MAX + 1, "unisum.%s.", job);
	else
		snprintf(name, NAME_MAX + 1, "unisum.");
}

/* Reads the state letter and the start time (field 22) of process `pid`
 * from /proc.  Returns 0, or -1 when the process or /proc is not there. */
static int proc_stat(pid_t pid, char *state, uint64_t *start)
{
	char path[64], buf[1024];
	snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	ssize_t n = read(fd, buf, sizeof buf - 1);
	close(fd);
	if (n <= 0)
		return -1;
	buf[n] = '\0';
	/* "pid (comm) S ppid ...": comm may hold spaces and parentheses, so
	 * the fields start after the last ')'. */
	char *p = strrchr(buf, ')');
	if (p == NULL || p[1] != ' ' || p[2] == '\0')
		return -1;
	*state = p[2];
	p += 3;
	for (int field = 4; field < 22; field++) {
		p = strchr(p + 1, ' ');
		if (p == NULL)
			return -1;
	}
	char *end;
	errno = 0;
	unsigned long long v = strtoull(p + 1, &end, 10);
	if (errno != 0 || end == p + 1)
		return -1;
	*start = v;
	return 0;
}

/* Whether the creator recorded as (pid, start) still runs: false when the
 * pid does not exist, is a zombie, or belongs to a process that started at
 * another time (a reused pid).  pid must be > 0 (kill(0, 0) would ask
 * about our own process group). */
static bool creator_is_alive(pid_t pid, uint64_t start)
{
	if (kill(pid, 0) != 0 && errno == ESRCH)
		return false;
	char state;
	uint64_t now_start;
	if (proc_stat(pid, &state, &now_start) != 0)
		return true;	/* EPERM from kill, or no /proc: it exists */
	if (state == 'Z' || state == 'X')
		return false;
	return start == 0 || now_start == start;
}

int shm_vm_copy(pid_t pid, bool write, void *local, uint64_t remote, size_t n)
{
	while (n > 0) {
		struct iovec l = {local, n}, r = {(void *)(uintptr_t)remote, n};
		ssize_t got = write ? process_vm_writev(pid, &l, 1, &r, 1, 0)
				    : process_vm_readv(pid, &l, 1, &r, 1, 0);
		if (got < 0 && errno == EINTR)
			continue;
		if (got <= 0)
			return got < 0 ? -errno : -EFAULT;
		local = (char *)local + got;
		remote += (uint64_t)got;
		n -= (size_t)got;
	}
	return 0;
}

int shm_vm_read_guarded(pid_t pid, void *local, uint64_t remote, size_t n, uint64_t guard,
			uint64_t *word)
{
	struct iovec l[2] = {{local, n}, {word, sizeof *word}};
	struct iovec r[2] = {{(void *)(uintptr_t)remote, n}, {(void *)(uintptr_t)guard, sizeof *word}};
	ssize_t got;
	do
		got = process_vm_readv(pid, l, 2, r, 2, 0);
	while (got < 0 && errno == EINTR);
	if (got == (ssize_t)(n + sizeof *word))
		return 0;	/* the kernel copies the iovecs in order */
	if (got < 0 && errno != EFAULT)
		return -errno;
	/* Cut short: the rest of the data, then the guard, one by one. */
	size_t done = got > 0 && (size_t)got < n ? (size_t)got : 0;
	int rc = shm_vm_copy(pid, false, (char *)local + done, remote + done, n - done);
	return rc != 0 ? rc : shm_vm_copy(pid, false, word, guard, sizeof *word);
}

bool shm_pid_is_alive(pid_t pid)
{
	return pid <= 0 || creator_is_alive(pid, 0);
}

/* Looks at the existing segment `name` and decides whether it is stale;
 * fills *st (for unlink_if_same) and writes why into why[64]. */
static enum seg_verdict seg_judge(const char *name, struct stat *st, char *why)
{
	int fd = shm_open(name, O_RDONLY, 0);
	if (fd < 0) {
		if (errno == ENOENT)
			return SEG_GONE;
		snprintf(why, 64, "cannot be opened (%s)", strerror(errno));
		return SEG_LIVE;
	}
	enum seg_verdict verdict = SEG_LIVE;
	if (fstat(fd, st) != 0 || !S_ISREG(st->st_mode)) {
		snprintf(why, 64, "is not a regular file");
		goto out_close_fd;
	}
	uint32_t magic = 0;
	pid_t pid = 0;
	uint64_t start = 0;
	if ((size_t)st->st_size >= sizeof(struct shm_header)) {
		struct shm_header *h = mmap(NULL, sizeof *h, PROT_READ, MAP_SHARED, fd, 0);
		if (h == MAP_FAILED) {
			snprintf(why, 64, "cannot be mapped (%s)", strerror(errno));
			goto out_close_fd;
		}
		magic = atomic_load_explicit(&h->magic, memory_order_acquire);
		pid = h->creator_pid;
		start = h->creator_start;
		munmap(h, sizeof *h);
	}
	if (magic == SHM_MAGIC && pid > 0) {
		bool alive = creator_is_alive(pid, start);
		verdict = alive ? SEG_LIVE : SEG_STALE;
		snprintf(why, 64, "its creator pid %d %s", (int)pid, alive ? "is alive" : "is gone");
	} else {
		int64_t mtime_ns = (int64_t)st->st_mtim.tv_sec * 1000000000 + st->st_mtim.tv_nsec;
		int64_t age_s = (now_ns(CLOCK_REALTIME) - mtime_ns) / 1000000000;
		verdict = age_s > SHM_STALE_AGE_S ? SEG_STALE : SEG_LIVE;
		snprintf(why, 64, "it has no unisum header and is %lld s old", (long long)age_s);
	}
out_close_fd:
	close(fd);
	return verdict;
}

/* Unlinks `name` if it still names the file described by *judged.
 * Returns 1 when removed, 0 when it is gone or was replaced meanwhile,
 * UNISUM_ESYS. */
static int unlink_if_same(const char *name, const struct stat *judged)
{
	char path[sizeof SHM_DIR + NAME_MAX + 1];
	struct stat now;
	snprintf(path, sizeof path, "%s%s", SHM_DIR, name);
	if (stat(path, &now) != 0)
		return errno == ENOENT ? 0 : log_fail(UNISUM_ESYS, "shm: cannot stat %s: %s", path,
						      strerror(errno));
	if (now.st_dev != judged->st_dev || now.st_ino != judged->st_ino)
		return 0;
	if (shm_unlink(name) != 0)
		return errno == ENOENT ? 0 : log_fail(UNISUM_ESYS, "shm: cannot remove %s: %s", name,
						      strerror(errno));
	return 1;
}

static void seg_set_closed(struct shm_seg *seg)
{
	seg->base = NULL;
	seg->map_bytes = 0;
	seg->data_bytes = 0;
	seg->name[0] = '\0';
}

static int seg_create(const char *job, const char *what, size_t bytes, bool reserve,
		      struct shm_seg *out)
{
	seg_set_closed(out);
	if (!shm_job_is_valid(job) || !shm_what_is_valid(what))
		return log_fail(UNISUM_EINVAL, "shm: invalid job id '%s' or segment name '%s' (1-%d and "
				"1-%d characters among letters, digits, '-', '_'; '.' also in the name)",
				job ? job : "(null)", what ? what : "(null)", SHM_JOB_MAX, SHM_WHAT_MAX);
	char name[NAME_MAX + 1];
	seg_name(job, what, name);
	if (bytes > (size_t)INT64_MAX - SHM_DATA_ALIGN)
		return log_fail(UNISUM_EINVAL, "shm: segment %s: %zu bytes is too large", name, bytes);
	size_t total = SHM_DATA_ALIGN + bytes;

	int fd = -1;
	for (int tries = 0; fd < 0; tries++) {
		fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
		if (fd >= 0)
			break;
		if (errno != EEXIST)
			return log_fail(UNISUM_ESYS, "shm: cannot create segment %s: %s", name,
					strerror(errno));
		struct stat st;
		char why[64] = "";
		enum seg_verdict verdict = seg_judge(name, &st, why);
		if (verdict == SEG_LIVE || tries + 1 == SHM_CREATE_TRIES)
			return log_fail(UNISUM_EBUSY, "shm: segment %s exists already and %s: another "
					"process of this job, or another job with the same id, uses it",
					name, verdict == SEG_LIVE ? why : "keeps coming back");
		if (verdict == SEG_STALE) {
			int rc = unlink_if_same(name, &st);
			if (rc < 0)
				return rc;
			if (rc == 1)
				LOG_WARN("shm: removed stale segment %s%s: %s", SHM_DIR, name, why);
		}
	}

	int rc = reserve ? posix_fallocate(fd, 0, (off_t)total)
			 : ftruncate(fd, (off_t)total) == 0 ? 0 : errno;
	if (rc != 0) {
		rc = log_fail(rc == ENOSPC ? UNISUM_ENOMEM : UNISUM_ESYS,
			      "shm: cannot reserve %zu bytes for segment %s: %s%s", total, name,
			      strerror(rc), rc == ENOSPC ? " (is " SHM_DIR " too small? a container "
			      "needs a larger --shm-size)" : "");
		goto out_unlink;
	}
	struct shm_header *h = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (h == MAP_FAILED) {
		rc = log_fail(UNISUM_ESYS, "shm: cannot map segment %s (%zu bytes): %s", name, total,
			      strerror(errno));
		goto out_unlink;
	}
	close(fd);

	char state;
	uint64_t start;
	h->version = SHM_VERSION;
	h->creator_pid = (int32_t)getpid();
	h->data_offset = SHM_DATA_ALIGN;
	h->data_bytes = bytes;
	h->creator_start = proc_stat(getpid(), &state, &start) == 0 ? start : 0;
	atomic_store_explicit(&h->magic, SHM_MAGIC, memory_order_release);

	out->base = h;
	out->map_bytes = total;
	out->data_bytes = bytes;
	memcpy(out->name, name, sizeof name);
	return 0;

out_unlink:
	shm_unlink(name);
	close(fd);
	return rc;
}

int shm_seg_create(const char *job, const char *what, size_t bytes, struct shm_seg *out)
{
	return seg_create(job, what, bytes, true, out);
}

int shm_seg_create_sparse(const char *job, const char *what, size_t bytes, struct shm_seg *out)
{
	return seg_create(job, what, bytes, false, out);
}

/* One try of shm_seg_open.  Returns 0 (mapped into *out), 1 when the
 * segment is not there yet (why says what is missing), or an error. */
static int seg_try_open(const char *name, struct shm_seg *out, char *why)
{
	int fd = shm_open(name, O_RDWR, 0);
	if (fd < 0) {
		if (errno == ENOENT) {
			snprintf(why, 96, "it does not exist");
			return 1;
		}
		return log_fail(UNISUM_ESYS, "shm: cannot open segment %s: %s", name, strerror(errno));
	}
	int rc = 1;
	struct stat st;
	if (fstat(fd, &st) != 0) {
		rc = log_fail(UNISUM_ESYS, "shm: cannot stat segment %s: %s", name, strerror(errno));
		goto out_close_fd;
	}
	if ((size_t)st.st_size < sizeof(struct shm_header)) {
		snprintf(why, 96, "its creator has not sized it yet");
		goto out_close_fd;
	}
	size_t total = (size_t)st.st_size;
	struct shm_header *h = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (h == MAP_FAILED) {
		rc = log_fail(UNISUM_ESYS, "shm: cannot map segment %s (%zu bytes): %s", name, total,
			      strerror(errno));
		goto out_close_fd;
	}
	uint32_t magic = atomic_load_explicit(&h->magic, memory_order_acquire);
	if (magic == 0) {
		snprintf(why, 96, "its creator has not written its header yet");
		goto out_unmap;
	}
	if (magic != SHM_MAGIC || h->version != SHM_VERSION) {
		rc = log_fail(UNISUM_EPROTO, "shm: segment %s is not a unisum segment of version %u "
			      "(magic 0x%08x, version %u): remove it, or use another job id",
			      name, SHM_VERSION, magic, h->version);
		goto out_unmap;
	}
	if (h->data_offset != SHM_DATA_ALIGN || h->data_bytes != total - SHM_DATA_ALIGN) {
		rc = log_fail(UNISUM_EPROTO, "shm: segment %s says %llu data bytes at offset %u but "
			      "the file has %zu bytes", name, (unsigned long long)h->data_bytes,
			      h->data_offset, total);
		goto out_unmap;
	}
	if (h->creator_pid <= 0 || !creator_is_alive(h->creator_pid, h->creator_start)) {
		snprintf(why, 96, "a stale one is there (creator pid %d is gone)", (int)h->creator_pid);
		goto out_unmap;
	}
	close(fd);
	out->base = h;
	out->map_bytes = total;
	out->data_bytes = total - SHM_DATA_ALIGN;
	memcpy(out->name, name, NAME_MAX + 1);
	return 0;

out_unmap:
	munmap(h, total);
out_close_fd:
	close(fd);
	return rc;
}

int shm_seg_open(const char *job, const char *what, int timeout_ms, struct shm_seg *out)
{
	seg_set_closed(out);
	if (!shm_job_is_valid(job) || !shm_what_is_valid(what))
		return log_fail(UNISUM_EINVAL, "shm: invalid job id '%s' or segment name '%s'",
				job ? job : "(null)", what ? what : "(null)");
	if (timeout_ms < 0)
		return log_fail(UNISUM_EINVAL, "shm: opening a segment needs a timeout >= 0, not %d ms",
				timeout_ms);
	char name[NAME_MAX + 1], why[96] = "";
	seg_name(job, what, name);
	int64_t deadline = now_ns(CLOCK_MONOTONIC) + (int64_t)timeout_ms * 1000000;
	int64_t pause_ns = 1000000;	/* 1 ms, doubling up to 32 ms */
	for (;;) {
		int rc = seg_try_open(name, out, why);
		if (rc <= 0)
			return rc;
		int64_t left = deadline - now_ns(CLOCK_MONOTONIC);
		if (left <= 0)
			return log_fail(UNISUM_ETIMEDOUT, "shm: segment %s was not ready within %d ms: %s; "
					"is the process that creates it running, with the same job id?",
					name, timeout_ms, why);
		sleep_ns(pause_ns < left ? pause_ns : left);
		if (pause_ns < 32000000)
			pause_ns *= 2;
	}
}

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23	/* Linux 5.14 */
#endif

int shm_seg_reserve(const struct shm_seg *seg, size_t off, size_t len)
{
	if (seg->base == NULL || off > shm_seg_size(seg) || len > shm_seg_size(seg) - off)
		return UNISUM_EINVAL;
	if (len == 0)
		return 0;
	uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
	uintptr_t start = (uintptr_t)shm_seg_data(seg) + off;
	uintptr_t first = start & ~(page - 1);
	if (madvise((void *)first, (size_t)(start + len - first), MADV_POPULATE_WRITE) == 0)
		return 0;
	/* EFAULT: a page would have raised SIGBUS (no room); ENOMEM likewise;
	 * EINVAL: a kernel before 5.14. */
	return errno == EFAULT || errno == ENOMEM ? UNISUM_ENOMEM : UNISUM_ESYS;
}

void *shm_seg_data(const struct shm_seg *seg)
{
	return seg->base == NULL ? NULL : (char *)seg->base + SHM_DATA_ALIGN;
}

size_t shm_seg_size(const struct shm_seg *seg)
{
	return seg->data_bytes;
}

void shm_seg_close(struct shm_seg *seg)
{
	if (seg->base != NULL)
		munmap(seg->base, seg->map_bytes);
	seg_set_closed(seg);
}

int shm_seg_unlink(const char *job, const char *what)
{
	if (!shm_job_is_valid(job) || !shm_what_is_valid(what))
		return log_fail(UNISUM_EINVAL, "shm: invalid job id '%s' or segment name '%s'",
				job ? job : "(null)", what ? what : "(null)");
	char name[NAME_MAX + 1];
	seg_name(job, what, name);
	if (shm_unlink(name) != 0 && errno != ENOENT)
		return log_fail(UNISUM_ESYS, "shm: cannot remove segment %s: %s", name, strerror(errno));
	return 0;
}

/* Walks SHM_DIR for the segments of `job` (every job when NULL) and
 * removes the stale ones, or all of them when stale_only is false. */
static int seg_sweep(const char *job, bool stale_only, int *removed)
{
	if (removed != NULL)
		*removed = 0;
	if (job != NULL && !shm_job_is_valid(job))
		return log_fail(UNISUM_EINVAL, "shm: invalid job id '%s'", job);
	char prefix[NAME_MAX + 1];
	seg_name(job, NULL, prefix);
	size_t prefix_len = strlen(prefix);
	DIR *dir = opendir(SHM_DIR);
	if (dir == NULL)
		return log_fail(UNISUM_ESYS, "shm: cannot list %s: %s", SHM_DIR, strerror(errno));
	int count = 0, first_err = 0;
	struct dirent *de;
	while ((de = readdir(dir)) != NULL) {
		if (strncmp(de->d_name, prefix, prefix_len) != 0)
			continue;
		char name[NAME_MAX + 2];
		snprintf(name, sizeof name, "/%s", de->d_name);
		int rc;
		if (stale_only) {
			struct stat st;
			char why[64] = "";
			if (seg_judge(name, &st, why) != SEG_STALE)
				continue;
			rc = unlink_if_same(name, &st);
			if (rc == 1)
				LOG_WARN("shm: removed stale segment %s%s: %s", SHM_DIR, name, why);
		} else if (shm_unlink(name) == 0) {
			rc = 1;
		} else {
			rc = errno == ENOENT ? 0 : log_fail(UNISUM_ESYS, "shm: cannot remove %s%s: %s",
							    SHM_DIR, name, strerror(errno));
		}
		if (rc == 1)
			count++;
		else if (rc < 0 && first_err == 0)
			first_err = rc;
	}
	closedir(dir);
	if (removed != NULL)
		*removed = count;
	return first_err;
}

int shm_clean_stale(const char *job, int *removed)
{
	return seg_sweep(job, true, removed);
}

int shm_unlink_job(const char *job, int *removed)
{
	if (job == NULL) {
		if (removed != NULL)
			*removed = 0;
		return log_fail(UNISUM_EINVAL, "shm: removing a job's segments needs its job id");
	}
	return seg_sweep(job, false, removed);
}

static void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ __volatile__("yield");
#endif
}

static long futex(_Atomic uint32_t *word, int op, uint32_t val, const struct timespec *timeout)
{
	return syscall(SYS_futex, (void *)word, op, val, timeout, NULL, 0);
}

static bool seq_reached(uint32_t seq, uint32_t target)
{
	return (int32_t)(seq - target) >= 0;
}

void shm_flag_init(struct shm_flag *f, uint32_t seq)
{
	atomic_store(&f->seq, seq);
	atomic_store(&f->waiters, 0);
}

uint32_t shm_flag_load(const struct shm_flag *f)
{
	return atomic_load_explicit(&f->seq, memory_order_acquire);
}

/* The increment of seq and the load of waiters here, and the increment of
 * waiters and the load of seq in shm_flag_wait, are all seq_cst: either the
 * waiter sees the new seq and does not sleep, or the poster sees the waiter
 * and wakes it.  A waiter that read seq before the increment and sleeps
 * after it is refused by the kernel (FUTEX_WAIT compares the word). */
void shm_flag_post(struct shm_flag *f)
{
	atomic_fetch_add(&f->seq, 1);
	if (atomic_load(&f->waiters) != 0)
		futex(&f->seq, FUTEX_WAKE, INT32_MAX, NULL);
}

int shm_flag_wait(struct shm_flag *f, uint32_t target, int timeout_ms)
{
	if (timeout_ms < 0)
		return log_fail(UNISUM_EINVAL, "shm: a flag wait needs a timeout >= 0, not %d ms",
				timeout_ms);
	for (int i = 0; i < SHM_FLAG_SPINS; i++) {
		if (seq_reached(atomic_load_explicit(&f->seq, memory_order_acquire), target))
			return 0;
		cpu_relax();
	}
	int64_t deadline = now_ns(CLOCK_MONOTONIC) + (int64_t)timeout_ms * 1000000;
	for (;;) {
		atomic_fetch_add(&f->waiters, 1);
		uint32_t seq = atomic_load(&f->seq);
		int64_t left = deadline - now_ns(CLOCK_MONOTONIC);
		if (seq_reached(seq, target) || left <= 0) {
			atomic_fetch_sub(&f->waiters, 1);
			return seq_reached(seq, target) ? 0 : UNISUM_ETIMEDOUT;
		}
		struct timespec ts = {.tv_sec = left / 1000000000, .tv_nsec = left % 1000000000};
		long rc = futex(&f->seq, FUTEX_WAIT, seq, &ts);
		int err = errno;
		atomic_fetch_sub(&f->waiters, 1);
		if (rc != 0 && err != EAGAIN && err != EINTR && err != ETIMEDOUT)
			return log_fail(UNISUM_ESYS, "shm: waiting on a flag failed: %s", strerror(err));
	}
}
