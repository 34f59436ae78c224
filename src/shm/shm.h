/*
 * shm.h - named shared-memory segments and cross-process wake-up flags, the
 * building blocks of local reduce/broadcast (docs/ARCHITECTURE.md section 6).
 *
 * Segments.  A segment is a POSIX shared-memory object named
 * "/unisum.<job>.<what>" (the file /dev/shm/unisum.<job>.<what> on Linux).
 * <job> is the caller's job id, so two jobs on one host never collide, and
 * <what> names the segment within the job.  Every segment starts with a
 * 64-byte header (magic, version, creator pid and start time, size) that
 * lets an opener check what it maps and lets a cleaner tell whether the
 * creator is still alive; the caller's data area follows at offset
 * SHM_DATA_ALIGN, so it is 64-byte aligned.  Segments are created 0600:
 * every process of a job runs as the same user.
 *
 * Staleness.  A segment is stale when its creator is dead: kill(pid, 0)
 * fails with ESRCH, the pid is a zombie, or the pid now belongs to a process
 * that started at another time than the recorded creator (pid reuse).  A
 * segment whose header is missing or unreadable (smaller than the header,
 * magic not yet written, foreign magic, pid <= 0) cannot be judged by its
 * creator: it is stale only once its mtime is more than SHM_STALE_AGE_S
 * seconds old, because a creator writes its header within microseconds of
 * creating the name.  Pids are those of this pid namespace: processes that
 * share /dev/shm from different pid namespaces must not share a job id.
 *
 * Removal is not atomic with the check: a remover makes sure the name still
 * names the file it judged just before it unlinks it, which leaves a window
 * of a few instructions.  Cleaning is meant to run from the launcher, before
 * a job starts and after it ends, not concurrently with creators of the
 * same names.
 *
 * Flags.  A struct shm_flag lives inside a segment: a sequence number that
 * posters increment and waiters wait on with a futex shared between
 * processes (never FUTEX_PRIVATE_FLAG).  Zeroed memory (a fresh segment) is
 * a valid flag at sequence 0.  Every wait is bounded.
 *
 * Errors: 0 or a negative UNISUM_E* code.  Failures of the segment calls are
 * logged and recorded as the last error with the segment's name; a flag
 * wait that times out is not logged (the caller knows what it waited for).
 * Linux only (futex, /dev/shm, /proc).
 */
#ifndef UNISUM_SHM_H
#define UNISUM_SHM_H

#include <limits.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* The data area of a segment starts this many bytes into it (and is
 * aligned to it: mappings are page-aligned). */
#define SHM_DATA_ALIGN 64

/* Longest job id and segment name accepted. */
#define SHM_JOB_MAX 64
#define SHM_WHAT_MAX 128

/* A segment whose header cannot be judged is stale after this long. */
#define SHM_STALE_AGE_S 60

/* Where the segments are (glibc's shm_open uses this tmpfs). */
#define SHM_DIR "/dev/shm"

/* A mapped segment.  The file descriptor is closed as soon as the segment
 * is mapped (the mapping keeps the object alive), so a worker with many
 * partition slots does not use a descriptor for each. */
struct shm_seg {
	void *base;			/* the mapping: header, then data; NULL when closed */
	size_t map_bytes;		/* length of the mapping */
	size_t data_bytes;		/* usable bytes at base + SHM_DATA_ALIGN */
	char name[NAME_MAX + 1];	/* "/unisum.<job>.<what>", for logs */
};

/* Whether `job` is a valid job id: 1 to SHM_JOB_MAX characters among
 * letters, digits, '-' and '_' (no '.', so "unisum.<job>." prefixes of two
 * jobs never overlap). */
bool shm_job_is_valid(const char *job);

/* Whether `what` is a valid segment name: 1 to SHM_WHAT_MAX characters
 * among letters, digits, '-', '_' and '.'. */
bool shm_what_is_valid(const char *what);

/* Creates segment <what> of job <job> with `bytes` usable bytes (0 is
 * allowed), zero-filled, maps it read-write into *out and writes its
 * header.  When a segment of that name exists already and is stale (see
 * the top of this file), it is removed and created anew; when it is live
 * (or too young to judge) the call fails with UNISUM_EBUSY, the closest
 * code to EEXIST: the name is in use.  The memory is reserved now
 * (posix_fallocate): UNISUM_ENOMEM when SHM_DIR is full.  Other errors:
 * UNISUM_EINVAL (bad job id or name, size too large), UNISUM_ESYS.  On
 * error *out is left closed (base NULL) and no segment is left behind. */
int shm_seg_create(const char *job, const char *what, size_t bytes, struct shm_seg *out);

/* The same, but the memory is not reserved: pages are taken from SHM_DIR
 * as they are first touched, and a touch that finds SHM_DIR full raises
 * SIGBUS.  For large areas of which a job may use only a part. */
int shm_seg_create_sparse(const char *job, const char *what, size_t bytes, struct shm_seg *out);

/* Maps the existing segment <what> of job <job> read-write into *out,
 * after checking its header (magic, version, that its size matches the
 * file) and that its creator is alive.  The creator may not have created
 * it yet, or a stale segment of a dead creator may still hold the name
 * until a live creator replaces it: either way the call retries, sleeping
 * between tries (1 ms doubling to 32 ms), until `timeout_ms` (>= 0; 0 =
 * one try) has passed, then fails with UNISUM_ETIMEDOUT.  Other errors: UNISUM_EINVAL
 * (bad arguments), UNISUM_EPROTO (the header is not unisum's, another
 * version, or disagrees with the file's size), UNISUM_ESYS.  On error *out
 * is left closed. */
int shm_seg_open(const char *job, const char *what, int timeout_ms, struct shm_seg *out);

/* Takes the pages of [off, off + len) of a (sparse) segment's data area
 * from SHM_DIR now, so that touching them later can never raise SIGBUS
 * (madvise MADV_POPULATE_WRITE).  0, UNISUM_ENOMEM when SHM_DIR has no
 * room for them, UNISUM_ESYS when the kernel cannot (before Linux 5.14):
 * then the caller must not hand the range out. */
int shm_seg_reserve(const struct shm_seg *seg, size_t off, size_t len);

/* The usable area: SHM_DATA_ALIGN-aligned, shm_seg_size() bytes, valid
 * until shm_seg_close(); NULL on a closed segment. */
void *shm_seg_data(const struct shm_seg *seg);
size_t shm_seg_size(const struct shm_seg *seg);

/* Unmaps the segment (the name stays: see shm_seg_unlink).  Safe on a
 * closed segment and twice. */
void shm_seg_close(struct shm_seg *seg);

/* Removes the name of segment <what> of job <job>: processes that have it
 * mapped keep their mapping.  0 also when there was no such segment;
 * UNISUM_EINVAL, UNISUM_ESYS. */
int shm_seg_unlink(const char *job, const char *what);

/* Removes the stale segments (see the top of this file) of job `job`, or
 * of every job when `job` is NULL, and leaves live ones alone.  Stores the
 * number removed in *removed when it is not NULL.  Returns 0, UNISUM_EINVAL
 * (bad job id) or UNISUM_ESYS (SHM_DIR cannot be read). */
int shm_clean_stale(const char *job, int *removed);

/* Removes every segment of job `job`, live or not (the launcher calls it
 * on every exit path).  Stores the number removed in *removed when it is
 * not NULL.  Returns 0, UNISUM_EINVAL or UNISUM_ESYS (the first failure;
 * the other segments are still removed). */
int shm_unlink_job(const char *job, int *removed);

/* Whether process `pid` of this pid namespace is alive: false once it has
 * exited, also while it is a zombie nobody has reaped yet.  A pid <= 0
 * counts as alive (unknown). */
bool shm_pid_is_alive(pid_t pid);

/* Copies n bytes between this process's `local` and address `remote` of
 * process `pid` (cross-memory attach: process_vm_readv, or
 * process_vm_writev when `write`), resuming after partial copies and
 * signals.  0, or -errno (-ESRCH: the process is gone; -EPERM: not allowed
 * to; -EFAULT: a bad address or nothing copied). */
int shm_vm_copy(pid_t pid, bool write, void *local, uint64_t remote, size_t n);

/* Reads n bytes at `remote` of process `pid` into `local`, then the u64 at
 * `guard` of that process into *word, in that order (one
 * process_vm_readv when nothing is cut short): a lender that changes the
 * guard before it lets go of the data tells the reader whether what it
 * read was still lent.  0 or -errno, as shm_vm_copy. */
int shm_vm_read_guarded(pid_t pid, void *local, uint64_t remote, size_t n, uint64_t guard,
			uint64_t *word);

/* A wake-up flag shared between processes; place it in a segment, 4-byte
 * aligned (better: alone in its 64-byte line when it is hot). */
struct shm_flag {
	_Atomic uint32_t seq;		/* number of posts so far (wraps); the futex word */
	_Atomic uint32_t waiters;	/* processes inside shm_flag_wait's sleep: lets a
					 * post skip the system call when nobody sleeps;
					 * a waiter that dies leaves it high, which only
					 * costs posts a system call */
};

/* Sets the sequence number (before anyone uses the flag). */
void shm_flag_init(struct shm_flag *f, uint32_t seq);

/* The sequence number now. */
uint32_t shm_flag_load(const struct shm_flag *f);

/* Increments the sequence number and wakes every waiter of every process.
 * Release semantics: what the poster wrote before is visible to a waiter
 * that returns 0. */
void shm_flag_post(struct shm_flag *f);

/* Waits until the sequence number reaches `target`, wrap-safe:
 * (int32_t)(seq - target) >= 0, so a target up to 2^31 posts ahead is
 * waited for and one up to 2^31 - 1 posts behind counts as reached.
 * Sleeps in the kernel (after a few spins), through spurious wake-ups and
 * signals.  Returns 0 (with acquire semantics), UNISUM_ETIMEDOUT once
 * `timeout_ms` has passed, UNISUM_EINVAL for timeout_ms < 0 (no wait is
 * unbounded), UNISUM_ESYS if the futex call fails otherwise. */
int shm_flag_wait(struct shm_flag *f, uint32_t target, int timeout_ms);

#endif /* UNISUM_SHM_H */
