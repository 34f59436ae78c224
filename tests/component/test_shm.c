/*
 * test_shm.c - shared-memory segments and futex flags across real
 * processes: create/open/share, open before create, name validation,
 * double create, stale segments (killed creators, zombies, headerless
 * files), bad headers, flag wake-ups that sleep, timeouts, signals,
 * wrap-around, concurrent posters, and removing a job's segments.
 *
 * Every test uses job ids unique to this run, and checks by listing
 * /dev/shm itself (not through the code under test) that it leaves no
 * segment behind; a teardown removes whatever a failed test left.
 * Children never call cmocka: they return an exit code, 0 for success,
 * and the parent checks it.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "log/log.h"
#include "shm/shm.h"
#include "unisum.h"

/* Job ids of this run: job, a second job, one whose id starts with the
 * first's (its segments must never be taken for the first's), and one of
 * the longest length allowed. */
static char job[SHM_JOB_MAX + 1], job2[SHM_JOB_MAX + 1], job3[SHM_JOB_MAX + 1];
static char job_longest[SHM_JOB_MAX + 1];

static int64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(long ms)
{
	struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
	while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
		;
}

static void seg_path(const char *j, const char *what, char *path, size_t len)
{
	snprintf(path, len, "/dev/shm/unisum.%s.%s", j, what);
}

static bool seg_exists(const char *j, const char *what)
{
	char path[512];
	struct stat st;
	seg_path(j, what, path, sizeof path);
	return stat(path, &st) == 0;
}

static off_t seg_file_size(const char *j, const char *what)
{
	char path[512];
	struct stat st;
	seg_path(j, what, path, sizeof path);
	return stat(path, &st) == 0 ? st.st_size : -1;
}

/* Counts (remove == false) or removes the files of job j in /dev/shm,
 * without the code under test. */
static int raw_sweep(const char *j, bool remove)
{
	char prefix[128];
	int n = snprintf(prefix, sizeof prefix, "unisum.%s.", j);
	DIR *dir = opendir("/dev/shm");
	if (dir == NULL)
		return -1;
	int count = 0;
	struct dirent *de;
	while ((de = readdir(dir)) != NULL) {
		if (strncmp(de->d_name, prefix, (size_t)n) != 0)
			continue;
		count++;
		if (remove) {
			char path[512];
			snprintf(path, sizeof path, "/dev/shm/%s", de->d_name);
			unlink(path);
		}
	}
	closedir(dir);
	return count;
}

static void assert_no_segments(void)
{
	assert_int_equal(raw_sweep(job, false), 0);
	assert_int_equal(raw_sweep(job2, false), 0);
	assert_int_equal(raw_sweep(job3, false), 0);
	assert_int_equal(raw_sweep(job_longest, false), 0);
}

static int teardown(void **state)
{
	(void)state;
	raw_sweep(job, true);
	raw_sweep(job2, true);
	raw_sweep(job3, true);
	raw_sweep(job_longest, true);
	return 0;
}

/* Runs fn(arg) in a child that exits with its return value. */
static pid_t spawn(int (*fn)(void *), void *arg)
{
	fflush(NULL);
	pid_t pid = fork();
	if (pid == 0)
		_exit(fn(arg));
	return pid;
}

/* The child's exit code, or 128 + the signal that killed it. */
static int reap(pid_t pid)
{
	int status;
	while (waitpid(pid, &status, 0) < 0)
		if (errno != EINTR)
			return -1;
	return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* shm_flag_wait that also fails (with 1) when it returned only because
 * its timeout ran out: it looks at the flag once more then, so a waiter
 * that is never woken would still return 0, late.  Not a speed test: the
 * timeouts are seconds, the posts come within tens of milliseconds. */
static int wait_woken(struct shm_flag *f, uint32_t target, int timeout_ms)
{
	int64_t t0 = now_ms();
	int rc = shm_flag_wait(f, target, timeout_ms);
	if (rc == 0 && now_ms() - t0 >= timeout_ms)
		return 1;
	return rc;
}

static unsigned char pattern(size_t i)
{
	return (unsigned char)(i * 7 + 1);
}

/* ---- 1. create, share with a child, sizes and alignment ---- */

static int child_check_and_flip(void *arg)
{
	size_t bytes = *(size_t *)arg;
	struct shm_seg s;
	if (shm_seg_open(job, "data", 1000, &s) != 0)
		return 1;
	if (shm_seg_size(&s) != bytes)
		return 2;
	unsigned char *d = shm_seg_data(&s);
	if ((uintptr_t)d % SHM_DATA_ALIGN != 0)
		return 3;
	for (size_t i = 0; i < bytes; i++)
		if (d[i] != pattern(i))
			return 4;
	for (size_t i = 0; i < bytes; i++)
		d[i] = (unsigned char)~pattern(i);
	shm_seg_close(&s);
	return 0;
}

static void test_create_share(void **state)
{
	(void)state;
	size_t bytes = 4099;	/* not a multiple of anything */
	struct shm_seg seg;
	assert_int_equal(shm_seg_create(job, "data", bytes, &seg), 0);
	assert_int_equal(shm_seg_size(&seg), bytes);
	unsigned char *d = shm_seg_data(&seg);
	assert_non_null(d);
	assert_int_equal((uintptr_t)d % SHM_DATA_ALIGN, 0);
	assert_int_equal(seg_file_size(job, "data"), SHM_DATA_ALIGN + bytes);
	char path[512];
	struct stat st;
	seg_path(job, "data", path, sizeof path);
	assert_int_equal(stat(path, &st), 0);
	assert_int_equal(st.st_mode & 0777, 0600);
	for (size_t i = 0; i < bytes; i++)
		assert_int_equal(d[i], 0);
	for (size_t i = 0; i < bytes; i++)
		d[i] = pattern(i);

	pid_t pid = spawn(child_check_and_flip, &bytes);
	assert_int_equal(reap(pid), 0);
	for (size_t i = 0; i < bytes; i++)
		assert_int_equal(d[i], (unsigned char)~pattern(i));

	shm_seg_close(&seg);
	assert_null(shm_seg_data(&seg));
	assert_int_equal(shm_seg_size(&seg), 0);
	shm_seg_close(&seg);	/* twice is safe */
	assert_int_equal(shm_seg_unlink(job, "data"), 0);
	assert_false(seg_exists(job, "data"));
	assert_int_equal(shm_seg_unlink(job, "data"), 0);	/* already gone: still 0 */

	/* Boundary sizes: empty, one byte, around one alignment unit. */
	static const size_t sizes[] = {0, 1, 63, 64, 65};
	for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
		struct shm_seg a, b;
		assert_int_equal(shm_seg_create(job, "edge", sizes[k], &a), 0);
		assert_int_equal(shm_seg_open(job, "edge", 0, &b), 0);
		assert_int_equal(shm_seg_size(&a), sizes[k]);
		assert_int_equal(shm_seg_size(&b), sizes[k]);
		unsigned char *pa = shm_seg_data(&a), *pb = shm_seg_data(&b);
		assert_non_null(pa);
		assert_non_null(pb);
		assert_int_equal((uintptr_t)pa % SHM_DATA_ALIGN, 0);
		assert_int_equal((uintptr_t)pb % SHM_DATA_ALIGN, 0);
		assert_int_equal(seg_file_size(job, "edge"), SHM_DATA_ALIGN + sizes[k]);
		if (sizes[k] > 0) {
			pa[sizes[k] - 1] = 0x5a;
			assert_int_equal(pb[sizes[k] - 1], 0x5a);
		}
		shm_seg_close(&a);
		shm_seg_close(&b);
		assert_int_equal(shm_seg_unlink(job, "edge"), 0);
	}
	assert_no_segments();
}

/* ---- 2. open before create, and an open that times out ---- */

struct late_layout {
	struct shm_flag ready;	/* the creator wrote the marker */
	char pad1[56];
	struct shm_flag done;	/* the opener read it */
	char pad2[56];
	char marker[16];
};

static int child_create_late(void *arg)
{
	(void)arg;
	sleep_ms(100);
	struct shm_seg s;
	if (shm_seg_create(job, "late", sizeof(struct late_layout), &s) != 0)
		return 1;
	struct late_layout *l = shm_seg_data(&s);
	strcpy(l->marker, "hello");
	shm_flag_post(&l->ready);
	int rc = wait_woken(&l->done, 1, 5000);	/* stay alive until the parent has it */
	shm_seg_close(&s);
	return rc == 0 ? 0 : 2;
}

static void test_open_before_create(void **state)
{
	(void)state;
	int64_t t0 = now_ms();
	pid_t pid = spawn(child_create_late, NULL);
	struct shm_seg s;
	assert_int_equal(shm_seg_open(job, "late", 2000, &s), 0);
	assert_true(now_ms() - t0 >= 100);	/* it cannot exist before the child's sleep */
	assert_int_equal(shm_seg_size(&s), sizeof(struct late_layout));
	struct late_layout *l = shm_seg_data(&s);
	assert_int_equal(wait_woken(&l->ready, 1, 2000), 0);
	assert_string_equal(l->marker, "hello");
	shm_flag_post(&l->done);
	assert_int_equal(reap(pid), 0);
	shm_seg_close(&s);
	assert_int_equal(shm_seg_unlink(job, "late"), 0);

	/* Never created: the timeout error, after the timeout, within a sane bound. */
	t0 = now_ms();
	assert_int_equal(shm_seg_open(job, "never", 100, &s), UNISUM_ETIMEDOUT);
	int64_t took = now_ms() - t0;
	assert_true(took >= 100);
	assert_true(took < 1500);
	assert_null(shm_seg_data(&s));
	assert_non_null(strstr(log_last_error(), "never"));
	t0 = now_ms();
	assert_int_equal(shm_seg_open(job, "never", 0, &s), UNISUM_ETIMEDOUT);
	assert_true(now_ms() - t0 < 100);
	assert_no_segments();
}

/* ---- 3. names, arguments, double create ---- */

static int child_create_dup(void *arg)
{
	(void)arg;
	struct shm_seg s;
	return shm_seg_create(job, "dup", 100, &s) == UNISUM_EBUSY && s.base == NULL ? 0 : 1;
}

static void test_names_and_double_create(void **state)
{
	(void)state;
	char long_job[SHM_JOB_MAX + 2], long_what[SHM_WHAT_MAX + 2];
	snprintf(long_job, sizeof long_job, "%sj", job_longest);	/* SHM_JOB_MAX + 1 characters */
	memset(long_what, 'w', sizeof long_what - 1);
	long_what[sizeof long_what - 1] = '\0';		/* SHM_WHAT_MAX + 1 characters */

	const char *bad_jobs[] = {"", "a.b", "a/b", "a b", "..", "../x", "x\n", "\xc3\xbc", "a*", long_job};
	struct shm_seg s;
	for (size_t i = 0; i < sizeof bad_jobs / sizeof bad_jobs[0]; i++) {
		assert_false(shm_job_is_valid(bad_jobs[i]));
		assert_int_equal(shm_seg_create(bad_jobs[i], "x", 8, &s), UNISUM_EINVAL);
		assert_null(shm_seg_data(&s));
		assert_int_equal(shm_seg_open(bad_jobs[i], "x", 0, &s), UNISUM_EINVAL);
		assert_int_equal(shm_seg_unlink(bad_jobs[i], "x"), UNISUM_EINVAL);
		assert_int_equal(shm_clean_stale(bad_jobs[i], NULL), UNISUM_EINVAL);
		assert_int_equal(shm_unlink_job(bad_jobs[i], NULL), UNISUM_EINVAL);
	}
	assert_false(shm_job_is_valid(NULL));
	assert_int_equal(shm_seg_create(NULL, "x", 8, &s), UNISUM_EINVAL);
	assert_int_equal(shm_seg_open(NULL, "x", 0, &s), UNISUM_EINVAL);
	assert_int_equal(shm_seg_unlink(NULL, "x"), UNISUM_EINVAL);
	int removed = -1;
	assert_int_equal(shm_unlink_job(NULL, &removed), UNISUM_EINVAL);
	assert_int_equal(removed, 0);
	assert_false(seg_exists("a.b", "x"));
	assert_false(seg_exists("a", "b.x"));

	const char *bad_whats[] = {"", "a/b", "a b", "x\n", long_what, NULL};
	for (size_t i = 0; i < sizeof bad_whats / sizeof bad_whats[0]; i++) {
		assert_false(shm_what_is_valid(bad_whats[i]));
		assert_int_equal(shm_seg_create(job, bad_whats[i], 8, &s), UNISUM_EINVAL);
		assert_int_equal(shm_seg_open(job, bad_whats[i], 0, &s), UNISUM_EINVAL);
		assert_int_equal(shm_seg_unlink(job, bad_whats[i]), UNISUM_EINVAL);
	}

	/* The longest valid job id and name together. */
	long_what[SHM_WHAT_MAX] = '\0';
	assert_int_equal(strlen(job_longest), SHM_JOB_MAX);
	assert_true(shm_job_is_valid(job_longest));
	assert_true(shm_what_is_valid(long_what));
	assert_true(shm_job_is_valid("A-z_09"));
	assert_true(shm_what_is_valid("slot.3-a_b"));
	assert_int_equal(shm_seg_create(job_longest, long_what, 8, &s), 0);
	shm_seg_close(&s);
	assert_int_equal(shm_seg_unlink(job_longest, long_what), 0);
	assert_false(seg_exists(job_longest, long_what));

	/* Other bad arguments. */
	assert_int_equal(shm_seg_create(job, "huge", SIZE_MAX, &s), UNISUM_EINVAL);
	assert_int_equal(shm_seg_create(job, "huge", SIZE_MAX - SHM_DATA_ALIGN + 1, &s), UNISUM_EINVAL);
	assert_false(seg_exists(job, "huge"));
	assert_int_equal(shm_seg_open(job, "x", -1, &s), UNISUM_EINVAL);

	/* Double create of a live segment: refused here and from another
	 * process, and the first one is untouched. */
	struct shm_seg a, b;
	assert_int_equal(shm_seg_create(job, "dup", 100, &a), 0);
	memset(shm_seg_data(&a), 0x77, 100);
	assert_int_equal(shm_seg_create(job, "dup", 100, &b), UNISUM_EBUSY);
	assert_null(shm_seg_data(&b));
	assert_non_null(strstr(log_last_error(), "dup"));
	assert_int_equal(shm_seg_create(job, "dup", 4096, &b), UNISUM_EBUSY);
	assert_int_equal(reap(spawn(child_create_dup, NULL)), 0);
	assert_int_equal(seg_file_size(job, "dup"), SHM_DATA_ALIGN + 100);
	unsigned char *d = shm_seg_data(&a);
	for (size_t i = 0; i < 100; i++)
		assert_int_equal(d[i], 0x77);
	shm_seg_close(&a);
	assert_int_equal(shm_seg_unlink(job, "dup"), 0);
	assert_no_segments();
}

/* ---- 4. stale segments ---- */

struct hang_arg {
	const char *job;
	const char *what;
	int fd;			/* write end of a pipe: one byte once created */
};

static int child_create_and_hang(void *arg)
{
	struct hang_arg *h = arg;
	struct shm_seg s;
	if (shm_seg_create(h->job, h->what, 128, &s) != 0)
		return 1;
	memset(shm_seg_data(&s), 0xee, 128);
	if (write(h->fd, "x", 1) != 1)
		return 2;
	sleep_ms(30000);	/* killed long before */
	return 3;
}

/* Starts a child that creates <what> of job j and stays; returns once the
 * segment exists. */
static pid_t start_creator(const char *j, const char *what)
{
	int p[2];
	assert_int_equal(pipe(p), 0);
	struct hang_arg h = {.job = j, .what = what, .fd = p[1]};
	pid_t pid = spawn(child_create_and_hang, &h);
	close(p[1]);
	char c;
	ssize_t n;
	while ((n = read(p[0], &c, 1)) < 0 && errno == EINTR)
		;
	close(p[0]);
	if (n != 1)
		fail_msg("the creator child failed: status %d", reap(pid));
	return pid;
}

/* Kills the creator and reaps it: its segment is now stale. */
static void kill_creator(pid_t pid)
{
	assert_int_equal(kill(pid, SIGKILL), 0);
	assert_int_equal(reap(pid), 128 + SIGKILL);
}

static void test_stale(void **state)
{
	(void)state;
	int removed = -1;

	/* A killed creator's segment goes; a live one's stays; so does a
	 * stale one of another job. */
	kill_creator(start_creator(job, "stale"));
	kill_creator(start_creator(job2, "other"));
	struct shm_seg live;
	assert_int_equal(shm_seg_create(job, "live", 128, &live), 0);
	assert_true(seg_exists(job, "stale"));
	assert_int_equal(shm_clean_stale(job, &removed), 0);
	assert_int_equal(removed, 1);
	assert_false(seg_exists(job, "stale"));
	assert_true(seg_exists(job, "live"));
	assert_true(seg_exists(job2, "other"));
	assert_int_equal(shm_clean_stale(job, &removed), 0);
	assert_int_equal(removed, 0);
	assert_int_equal(shm_clean_stale(job2, &removed), 0);
	assert_int_equal(removed, 1);
	assert_false(seg_exists(job2, "other"));

	/* A segment whose creator is alive (a child this time) stays. */
	pid_t alive = start_creator(job, "alive");
	assert_int_equal(shm_clean_stale(job, &removed), 0);
	assert_int_equal(removed, 0);
	assert_true(seg_exists(job, "alive"));
	kill_creator(alive);

	/* A zombie (killed, not yet reaped) counts as gone. */
	pid_t zombie = start_creator(job, "zombie");
	assert_int_equal(kill(zombie, SIGKILL), 0);
	siginfo_t info;
	assert_int_equal(waitid(P_PID, (id_t)zombie, &info, WEXITED | WNOWAIT), 0);
	assert_int_equal(shm_clean_stale(job, &removed), 0);
	assert_int_equal(removed, 2);	/* "alive", now dead too, and "zombie" */
	assert_false(seg_exists(job, "zombie"));
	assert_false(seg_exists(job, "alive"));
	assert_int_equal(reap(zombie), 128 + SIGKILL);

	/* Creating over a stale segment replaces it with a fresh one. */
	kill_creator(start_creator(job, "reuse"));
	struct shm_seg s;
	assert_int_equal(shm_seg_create(job, "reuse", 256, &s), 0);
	assert_int_equal(seg_file_size(job, "reuse"), SHM_DATA_ALIGN + 256);
	unsigned char *d = shm_seg_data(&s);
	for (size_t i = 0; i < 256; i++)
		assert_int_equal(d[i], 0);
	shm_seg_close(&s);
	assert_int_equal(shm_seg_create(job, "reuse", 256, &s), UNISUM_EBUSY);	/* we are alive */

	/* An open never maps a stale segment: it waits for a live creator. */
	kill_creator(start_creator(job, "ghost"));
	assert_int_equal(shm_seg_open(job, "ghost", 100, &s), UNISUM_ETIMEDOUT);
	if (strstr(log_last_error(), "stale") == NULL)
		fail_msg("the error does not say stale: %s", log_last_error());

	assert_int_equal(shm_clean_stale(job, &removed), 0);
	assert_int_equal(removed, 1);	/* ghost */
	shm_seg_close(&live);
	assert_int_equal(shm_seg_unlink(job, "live"), 0);
	assert_int_equal(shm_seg_unlink(job, "reuse"), 0);
	assert_no_segments();
}

/* ---- 5. segments without a valid header ---- */

/* Creates /dev/shm/unisum.<job>.<what> by hand with `bytes` bytes, the
 * first 4 of them `magic`; returns its descriptor. */
static int raw_segment(const char *what, size_t bytes, uint32_t magic)
{
	char name[256];
	snprintf(name, sizeof name, "/unisum.%s.%s", job, what);
	int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
	assert_true(fd >= 0);
	assert_int_equal(ftruncate(fd, (off_t)bytes), 0);
	if (bytes >= sizeof magic)
		assert_int_equal(pwrite(fd, &magic, sizeof magic, 0), (ssize_t)sizeof magic);
	return fd;
}

static void age_file(int fd, int seconds)
{
	struct timespec t[2];
	clock_gettime(CLOCK_REALTIME, &t[0]);
	t[0].tv_sec -= seconds;
	t[1] = t[0];
	assert_int_equal(futimens(fd, t), 0);
}

static void test_bad_headers(void **state)
{
	(void)state;
	int removed = -1;
	struct shm_seg s;

	/* Too small for a header, and a header never written: left alone
	 * while young (a creator may be writing it), opened as "not yet". */
	int tiny = raw_segment("tiny", 0, 0);
	int blank = raw_segment("blank", 4096, 0);
	assert_int_equal(shm_clean_stale(job, &removed), 0);
	assert_int_equal(removed, 0);
	assert_true(seg_exists(job, "tiny"));
	assert_true(seg_exists(job, "blank"));
	assert_int_equal(shm_seg_open(job, "tiny", 50, &s), UNISUM_ETIMEDOUT);
	assert_int_equal(shm_seg_open(job, "blank", 50, &s), UNISUM_ETIMEDOUT);
	assert_int_equal(shm_seg_create(job, "blank", 8, &s), UNISUM_EBUSY);
	/* Older than SHM_STALE_AGE_S: removed, and a create takes the name. */
	age_file(tiny, SHM_STALE_AGE_S + 60);
	assert_int_equal(shm_clean_stale(job, &removed), 0);
	assert_int_equal(removed, 1);
	assert_false(seg_exists(job, "tiny"));
	assert_true(seg_exists(job, "blank"));
	age_file(blank, SHM_STALE_AGE_S + 60);
	assert_int_equal(shm_seg_create(job, "blank", 8, &s), 0);
	shm_seg_close(&s);
	close(tiny);
	close(blank);

	/* Somebody else's magic: an open fails at once, not by timeout. */
	int foreign = raw_segment("foreign", 256, 0x12345678);
	int64_t t0 = now_ms();
	assert_int_equal(shm_seg_open(job, "foreign", 5000, &s), UNISUM_EPROTO);
	assert_true(now_ms() - t0 < 1000);
	close(foreign);

	/* A header that disagrees with the file's size. */
	assert_int_equal(shm_seg_create(job, "sized", 128, &s), 0);
	shm_seg_close(&s);
	char path[512];
	seg_path(job, "sized", path, sizeof path);
	assert_int_equal(truncate(path, 8192), 0);
	assert_int_equal(shm_seg_open(job, "sized", 1000, &s), UNISUM_EPROTO);

	/* The creator's pid taken by another process (here: a live pid with
	 * another start time), and a pid of 0, which must never reach kill().
	 * The header's layout is shm.c's: pid at offset 8, start time at 24. */
	assert_int_equal(shm_seg_create(job, "reused", 8, &s), 0);
	shm_seg_close(&s);
	assert_int_equal(shm_seg_create(job, "nopid", 8, &s), 0);
	shm_seg_close(&s);
	char name[256];
	snprintf(name, sizeof name, "/unisum.%s.reused", job);
	int fd = shm_open(name, O_RDWR, 0);
	assert_true(fd >= 0);
	uint64_t start;
	assert_int_equal(pread(fd, &start, sizeof start, 24), (ssize_t)sizeof start);
	assert_true(start != 0);	/* /proc is there: the creator's start was recorded */
	start += 1;
	assert_int_equal(pwrite(fd, &start, sizeof start, 24), (ssize_t)sizeof start);
	close(fd);
	snprintf(name, sizeof name, "/unisum.%s.nopid", job);
	int nopid = shm_open(name, O_RDWR, 0);
	assert_true(nopid >= 0);
	int32_t zero = 0;
	assert_int_equal(pwrite(nopid, &zero, sizeof zero, 8), (ssize_t)sizeof zero);
	assert_int_equal(shm_clean_stale(job, &removed), 0);
	assert_int_equal(removed, 1);
	assert_false(seg_exists(job, "reused"));
	assert_true(seg_exists(job, "nopid"));	/* judged by age: young */
	age_file(nopid, SHM_STALE_AGE_S + 60);
	assert_int_equal(shm_clean_stale(job, &removed), 0);
	assert_int_equal(removed, 1);
	assert_false(seg_exists(job, "nopid"));
	close(nopid);

	assert_int_equal(shm_unlink_job(job, &removed), 0);
	assert_int_equal(removed, 3);	/* blank, foreign, sized */
	assert_no_segments();
}

/* ---- 6. flags: sleeping waiters wake up ---- */

struct flag_layout {
	struct shm_flag flag;
	char pad[56];
	uint64_t payload;	/* written before the post */
};

static int child_wait_flag(void *arg)
{
	(void)arg;
	struct shm_seg s;
	if (shm_seg_open(job, "flag", 1000, &s) != 0)
		return 1;
	struct flag_layout *l = shm_seg_data(&s);
	struct rusage before, after;
	getrusage(RUSAGE_SELF, &before);
	int rc = wait_woken(&l->flag, 1, 5000);
	getrusage(RUSAGE_SELF, &after);
	uint64_t payload = l->payload;
	shm_seg_close(&s);
	if (rc != 0)
		return 2;
	if (payload != 0xfeedfacecafebeefull)
		return 3;
	long cpu_us = (after.ru_utime.tv_sec - before.ru_utime.tv_sec) * 1000000L +
		      (after.ru_utime.tv_usec - before.ru_utime.tv_usec) +
		      (after.ru_stime.tv_sec - before.ru_stime.tv_sec) * 1000000L +
		      (after.ru_stime.tv_usec - before.ru_stime.tv_usec);
	return cpu_us < 20000 ? 0 : 4;	/* slept through >= 50 ms: far less CPU */
}

/* Waits (bounded) until `n` processes sleep on the flag. */
static void wait_for_sleepers(struct shm_flag *f, uint32_t n)
{
	int64_t t0 = now_ms();
	while (atomic_load(&f->waiters) != n) {
		if (now_ms() - t0 > 5000)
			fail_msg("%u waiters expected, %u there", n, atomic_load(&f->waiters));
		sleep_ms(1);
	}
}

static void test_flag_wakeup(void **state)
{
	(void)state;
	enum { WAITERS = 3 };
	struct shm_seg s;
	assert_int_equal(shm_seg_create(job, "flag", sizeof(struct flag_layout), &s), 0);
	struct flag_layout *l = shm_seg_data(&s);
	assert_int_equal(shm_flag_load(&l->flag), 0);	/* zeroed memory is a flag at 0 */
	pid_t pids[WAITERS];
	for (int i = 0; i < WAITERS; i++)
		pids[i] = spawn(child_wait_flag, NULL);
	wait_for_sleepers(&l->flag, WAITERS);
	sleep_ms(50);
	l->payload = 0xfeedfacecafebeefull;
	shm_flag_post(&l->flag);	/* one post wakes them all */
	for (int i = 0; i < WAITERS; i++)
		assert_int_equal(reap(pids[i]), 0);
	assert_int_equal(shm_flag_load(&l->flag), 1);
	assert_int_equal(atomic_load(&l->flag.waiters), 0);
	shm_seg_close(&s);
	assert_int_equal(shm_seg_unlink(job, "flag"), 0);
	assert_no_segments();
}

/* ---- 7. flags: timeouts, signals, wake-ups short of the target ---- */

static volatile sig_atomic_t usr1_count;

static void on_usr1(int sig)
{
	(void)sig;
	usr1_count++;
}

static struct shm_flag *signal_flag;

static int child_signal_then_post(void *arg)
{
	(void)arg;
	sleep_ms(30);
	kill(getppid(), SIGUSR1);	/* interrupts the futex wait: EINTR */
	sleep_ms(30);
	shm_flag_post(signal_flag);	/* a wake-up short of the target */
	sleep_ms(30);
	shm_flag_post(signal_flag);
	return 0;
}

static void test_flag_timeout_and_signals(void **state)
{
	(void)state;
	struct shm_seg s;
	assert_int_equal(shm_seg_create(job, "tmo", sizeof(struct shm_flag), &s), 0);
	struct shm_flag *f = shm_seg_data(&s);

	int64_t t0 = now_ms();
	assert_int_equal(shm_flag_wait(f, 1, 100), UNISUM_ETIMEDOUT);
	int64_t took = now_ms() - t0;
	assert_true(took >= 100);
	assert_true(took < 1500);
	t0 = now_ms();
	assert_int_equal(shm_flag_wait(f, 1, 0), UNISUM_ETIMEDOUT);
	assert_true(now_ms() - t0 < 100);
	assert_int_equal(shm_flag_wait(f, 0, 0), 0);	/* already there */
	assert_int_equal(shm_flag_wait(f, 0, -1), UNISUM_EINVAL);	/* no unbounded waits */
	assert_int_equal(shm_flag_wait(f, 1, -1), UNISUM_EINVAL);
	assert_int_equal(atomic_load(&f->waiters), 0);

	struct sigaction sa = {.sa_handler = on_usr1}, old;	/* no SA_RESTART */
	sigemptyset(&sa.sa_mask);
	assert_int_equal(sigaction(SIGUSR1, &sa, &old), 0);
	usr1_count = 0;
	signal_flag = f;
	t0 = now_ms();
	pid_t pid = spawn(child_signal_then_post, NULL);
	assert_int_equal(wait_woken(f, 2, 5000), 0);
	assert_true(now_ms() - t0 >= 90);
	assert_int_equal(usr1_count, 1);
	assert_int_equal(shm_flag_load(f), 2);
	assert_int_equal(reap(pid), 0);
	assert_int_equal(sigaction(SIGUSR1, &old, NULL), 0);

	shm_seg_close(&s);
	assert_int_equal(shm_seg_unlink(job, "tmo"), 0);
	assert_no_segments();
}

/* ---- 8. flags: wrap-around ---- */

static struct shm_flag *wrap_flag;

static int child_wait_across_wrap(void *arg)
{
	(void)arg;
	if (wait_woken(wrap_flag, 1, 5000) != 0)
		return 1;
	return shm_flag_load(wrap_flag) == 1 ? 0 : 2;
}

static void test_flag_wrap(void **state)
{
	(void)state;
	struct shm_seg s;
	assert_int_equal(shm_seg_create(job, "wrap", sizeof(struct shm_flag), &s), 0);
	struct shm_flag *f = shm_seg_data(&s);

	shm_flag_init(f, UINT32_MAX - 2);
	assert_int_equal(shm_flag_wait(f, UINT32_MAX - 2, 0), 0);
	assert_int_equal(shm_flag_wait(f, UINT32_MAX - 10, 0), 0);	/* behind */
	assert_int_equal(shm_flag_wait(f, UINT32_MAX, 0), UNISUM_ETIMEDOUT);
	assert_int_equal(shm_flag_wait(f, 1, 0), UNISUM_ETIMEDOUT);	/* 4 ahead, past the wrap */
	shm_flag_post(f);
	shm_flag_post(f);
	assert_int_equal(shm_flag_load(f), UINT32_MAX);
	assert_int_equal(shm_flag_wait(f, UINT32_MAX, 0), 0);
	assert_int_equal(shm_flag_wait(f, 0, 0), UNISUM_ETIMEDOUT);
	shm_flag_post(f);
	assert_int_equal(shm_flag_load(f), 0);
	assert_int_equal(shm_flag_wait(f, 0, 0), 0);
	assert_int_equal(shm_flag_wait(f, UINT32_MAX - 2, 0), 0);	/* behind, before the wrap */
	assert_int_equal(shm_flag_wait(f, 1, 0), UNISUM_ETIMEDOUT);
	/* Half the ring is the limit: up to 2^31 ahead waits, 2^31 - 1
	 * behind is reached. */
	assert_int_equal(shm_flag_wait(f, 0x7fffffffu, 0), UNISUM_ETIMEDOUT);
	assert_int_equal(shm_flag_wait(f, 0x80000000u, 0), UNISUM_ETIMEDOUT);
	assert_int_equal(shm_flag_wait(f, 0x80000001u, 0), 0);

	/* Another process sleeps across the wrap: 3 posts from UINT32_MAX - 1. */
	shm_flag_init(f, UINT32_MAX - 1);
	wrap_flag = f;
	pid_t pid = spawn(child_wait_across_wrap, NULL);
	wait_for_sleepers(f, 1);
	for (int i = 0; i < 3; i++) {
		sleep_ms(10);
		shm_flag_post(f);
	}
	assert_int_equal(reap(pid), 0);
	assert_int_equal(shm_flag_load(f), 1);

	shm_seg_close(&s);
	assert_int_equal(shm_seg_unlink(job, "wrap"), 0);
	assert_no_segments();
}

/* ---- 9. flags: concurrent posters ---- */

enum { POSTERS = 4, POSTS_EACH = 10000 };

static int child_post_many(void *arg)
{
	(void)arg;
	struct shm_seg s;
	if (shm_seg_open(job, "many", 1000, &s) != 0)
		return 1;
	struct shm_flag *f = shm_seg_data(&s);
	for (int i = 0; i < POSTS_EACH; i++)
		shm_flag_post(f);
	shm_seg_close(&s);
	return 0;
}

static int child_wait_all_posts(void *arg)
{
	(void)arg;
	struct shm_seg s;
	if (shm_seg_open(job, "many", 1000, &s) != 0)
		return 1;
	struct shm_flag *f = shm_seg_data(&s);
	int rc = wait_woken(f, POSTERS * POSTS_EACH, 10000);
	shm_seg_close(&s);
	return rc == 0 ? 0 : 2;
}

static void test_flag_many_posters(void **state)
{
	(void)state;
	struct shm_seg s;
	assert_int_equal(shm_seg_create(job, "many", sizeof(struct shm_flag), &s), 0);
	struct shm_flag *f = shm_seg_data(&s);
	pid_t waiter = spawn(child_wait_all_posts, NULL);
	wait_for_sleepers(f, 1);
	pid_t pids[POSTERS];
	for (int i = 0; i < POSTERS; i++)
		pids[i] = spawn(child_post_many, NULL);
	for (int i = 0; i < POSTERS; i++)
		assert_int_equal(reap(pids[i]), 0);
	assert_int_equal(reap(waiter), 0);
	assert_int_equal(shm_flag_load(f), POSTERS * POSTS_EACH);
	assert_int_equal(atomic_load(&f->waiters), 0);
	shm_seg_close(&s);
	assert_int_equal(shm_seg_unlink(job, "many"), 0);
	assert_no_segments();
}

/* ---- 10. removing a job's segments ---- */

static void test_unlink_job(void **state)
{
	(void)state;
	struct shm_seg kept, s;
	assert_int_equal(shm_seg_create(job, "a", 64, &kept), 0);
	const char *mine[] = {"b", "c.d"};
	for (size_t i = 0; i < 2; i++) {
		assert_int_equal(shm_seg_create(job, mine[i], 64, &s), 0);
		shm_seg_close(&s);
	}
	const char *theirs[] = {"a", "x"};
	for (size_t i = 0; i < 2; i++) {
		assert_int_equal(shm_seg_create(job2, theirs[i], 64, &s), 0);
		shm_seg_close(&s);
	}
	assert_int_equal(shm_seg_create(job3, "a", 64, &s), 0);	/* job3 = job + "0" */
	shm_seg_close(&s);
	assert_int_equal(raw_sweep(job, false), 3);

	int removed = -1;
	assert_int_equal(shm_unlink_job(job, &removed), 0);
	assert_int_equal(removed, 3);
	assert_int_equal(raw_sweep(job, false), 0);
	assert_int_equal(raw_sweep(job2, false), 2);
	assert_int_equal(raw_sweep(job3, false), 1);
	/* A mapping outlives the name. */
	memset(shm_seg_data(&kept), 0x42, 64);
	assert_int_equal(((unsigned char *)shm_seg_data(&kept))[63], 0x42);
	shm_seg_close(&kept);

	assert_int_equal(shm_unlink_job(job, &removed), 0);
	assert_int_equal(removed, 0);
	assert_int_equal(shm_unlink_job(job2, &removed), 0);
	assert_int_equal(removed, 2);
	assert_int_equal(shm_unlink_job(job3, NULL), 0);
	assert_no_segments();
}

int main(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	unsigned tag = (unsigned)(ts.tv_nsec ^ ts.tv_sec) & 0xffffff;
	snprintf(job, sizeof job, "shmtest-%d-%06x", (int)getpid(), tag);
	snprintf(job2, sizeof job2, "shmtest-%d-%06x-b", (int)getpid(), tag);
	snprintf(job3, sizeof job3, "shmtest-%d-%06x0", (int)getpid(), tag);	/* job + "0" */
	size_t n = (size_t)snprintf(job_longest, sizeof job_longest, "shmtest-%d-%06x-", (int)getpid(), tag);
	memset(job_longest + n, 'L', SHM_JOB_MAX - n);
	job_longest[SHM_JOB_MAX] = '\0';
	/* The tests provoke errors on purpose; their messages are checked
	 * through log_last_error() instead. */
	log_set_level(LOG_LEVEL_FATAL);

	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_create_share, teardown),
		cmocka_unit_test_teardown(test_open_before_create, teardown),
		cmocka_unit_test_teardown(test_names_and_double_create, teardown),
		cmocka_unit_test_teardown(test_stale, teardown),
		cmocka_unit_test_teardown(test_bad_headers, teardown),
		cmocka_unit_test_teardown(test_flag_wakeup, teardown),
		cmocka_unit_test_teardown(test_flag_timeout_and_signals, teardown),
		cmocka_unit_test_teardown(test_flag_wrap, teardown),
		cmocka_unit_test_teardown(test_flag_many_posters, teardown),
		cmocka_unit_test_teardown(test_unlink_job, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
