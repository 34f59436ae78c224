/*
 * lc_int.h - the state of the local path and the functions its files
 * share (internal to src/worker): local.c holds the segment's table, the
 * waits, the stage threads and the public functions of local.h;
 * local_reduce.c the copies, LOCAL_REDUCE and LOCAL_BROADCAST;
 * local_arena.c the arenas (staging regions and unisum_alloc).  See
 * local.c's DESIGN.
 */
#ifndef UNISUM_WORKER_LC_INT_H
#define UNISUM_WORKER_LC_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "shm/shm.h"
#include "worker/local.h"

#define LC_MAGIC 0x4c434f4cu	/* "LOCL" */
#define LC_TABLE 4096		/* cut keys a rank may use at once */
#define LC_TOMB UINT64_MAX	/* an entry's key once every rank undeclared it: reusable */
#define LC_CHUNK (256u * 1024u)	/* bytes summed at a time: stays in L2 */
#define LC_SLICE_MS 50		/* longest sleep between checks */
#define LC_QUIESCE_MS 2000	/* a failing rank waits this long for peers to let go */

struct lc_entry {
	_Atomic uint64_t key;		/* cut key + 1; 0 = free */
	_Atomic uint32_t round;		/* latest round posted */
	_Atomic int32_t err;		/* this rank's part of that round failed */
	_Atomic uint64_t in, out;	/* its buffers, in its own address space */
	_Atomic uint64_t reduced;	/* partitions whose slice it summed */
	_Atomic uint64_t pulled;	/* local root: replies in its output */
	_Atomic uint64_t bcast;		/* 1: it copied the result / let go */
	_Atomic uint64_t region;	/* staged: offset + 1 of its region in its arena, 0 none */
	_Atomic uint64_t staged;	/* staged: partitions of its input staged for the others */
	_Atomic uint64_t in_arena;	/* its input lies in its arena (unisum_alloc): offset + 1, 0 no */
	_Atomic uint64_t out_arena;	/* the same for its output */
	_Atomic uint32_t wire_op;	/* the collective of that round (WIRE_OP()) */
	_Atomic uint32_t retired;	/* 1: its rank undeclared the tensor (local_forget) */
	uint64_t pad[3];
};

struct lc_rank {
	_Atomic int32_t pid;
	_Atomic int32_t attached;
	char pad[56];
	struct lc_entry table[LC_TABLE];
};

struct lc_seg {
	_Atomic uint32_t magic;
	uint32_t local_size;
	char pad[56];
	struct shm_flag flag;
	char pad2[64 - sizeof(struct shm_flag)];
	struct lc_rank ranks[];
};

struct lc_peer {
	pid_t pid;
	struct lc_entry *e;		/* its entry of this op's key */
	uint64_t in, out;		/* its buffers for this round */
	uint8_t *region;		/* its region of this round in its arena (mapped here), or NULL */
	const uint8_t *in_map;		/* its input, mapped here (it lies in its arena), or NULL */
	uint8_t *out_map;		/* its output, the same */
};

struct local_op {
	struct local *lc;		/* the rank it belongs to */
	struct local_req req;
	struct local_op *next;		/* in a stage queue */
	struct local_op *stage_next;	/* in the staging queue */
	bool staged;			/* the staging thread is done with it (under lock) */
	uint64_t seq;			/* submission order */
	struct lc_entry *mine;
	struct lc_peer *peers;		/* [local_size] */
	uint64_t bytes;			/* the whole tensor */
	uint64_t region;		/* offset + 1 of its region in this rank's arena, 0 none */
	int blocker;			/* the rank an unmet wait condition waits for */
	/* Under lc->lock: */
	uint32_t pushed, npulled;	/* local root of several machines */
	int err;			/* first error */
	char why[512];
};

struct lc_queue {
	struct local_op *head;		/* (priority desc, seq asc) */
	bool closed;
};

/* One rank's local path (a handle: several may live in one process). */
struct local {
	struct local_cfg cfg;
	_Atomic uint64_t summed_bytes;	/* input bytes this rank folded (lc_sum_chunk) */
	struct local_hooks hooks;
	char job[SHM_JOB_MAX + 1];
	struct shm_seg shm;
	struct lc_seg *seg;
	pthread_mutex_t lock;		/* queues, ops' counters, the table's inserts */
	pthread_cond_t cond;		/* a queue or a pull count changed */
	struct lc_queue reduce_q, bcast_q;
	struct local_op *stage_head, *stage_tail;	/* staging: submission order */
	pthread_t reduce_thread, bcast_thread, stage_thread;
	bool reduce_started, bcast_started, finish_started, stage_started;
	struct local_op *finish;	/* lent operations waiting for the others (under lock) */
	pthread_t finish_thread;
	atomic_bool started;
	uint64_t next_seq;
	void *tmp[2], *acc;		/* LC_CHUNK each */
	/* Each rank's arena, mapped by all: staging regions (one machine,
	 * large tensors) and unisum_alloc's memory, which the peers then read
	 * and write with plain loads and stores instead of cross-memory
	 * attach. */
	struct shm_seg *arenas;		/* [local_size]; NULL without arenas */
	bool staging;			/* stage tensors of cfg.stage_bytes and more */
	struct lc_span {
		uint64_t off, len;
	} *used;			/* this rank's regions in use, by offset (under lock) */
	int nused, capused;
	int nalloc;			/* of them, unisum_alloc's (under lock) */
	bool said_no_room;		/* logged that the arena found /dev/shm full */
	uint64_t *forgot;		/* keys this rank undeclared, entries not yet reclaimed */
	int nforgot, capforgot;		/* (under lock) */
	atomic_bool said_direct;	/* logged the first use of a peer's arena */
};

static inline uint64_t lc_pack(uint32_t round, uint32_t count)
{
	return (uint64_t)round << 32 | count;
}

/* A counter's value for `round`: UINT32_MAX when it is already of a later
 * round (that rank is past this one), 0 for an earlier one. */
static inline uint32_t lc_count(const _Atomic uint64_t *c, uint32_t round)
{
	uint64_t v = atomic_load_explicit(c, memory_order_acquire);
	uint32_t r = (uint32_t)(v >> 32);
	if (r == round)
		return (uint32_t)v;
	return (int32_t)(r - round) > 0 ? UINT32_MAX : 0;
}

static inline void lc_post(struct local *lc)
{
	shm_flag_post(&lc->seg->flag);
}

static inline int lc_rank_of(const struct local *lc, int q)
{
	return lc->cfg.machine * lc->cfg.local_size + q;
}

/* A condition: 1 met, 0 not yet (op->blocker: the rank it waits for),
 * < 0 failed (op->why says why). */
typedef int (*lc_cond_fn)(struct local_op *op, void *arg);

/* local_wait.c: the table.  Rank q's entry of `key`, or NULL; freeing
 * an entry every rank retired (lc_bury, and lc_reclaim for all such of
 * this rank's); this rank's entry for `key`, a new one (*fresh) when it
 * had none (lc_claim; NULL: the table is full).  Then a local
 * operation's errors and its waits. */
struct lc_entry *lc_find(struct local *lc, int q, uint64_t key);
void lc_bury(struct local *lc, struct lc_entry *e);
void lc_reclaim(struct local *lc);
struct lc_entry *lc_claim(struct local *lc, uint64_t key, bool *fresh);
int lc_cond_posted(struct local_op *op, void *arg);
int lc_cond_reduced(struct local_op *op, void *arg);
int lc_cond_staged(struct local_op *op, void *arg);
int lc_err(struct local_op *op);
int lc_peer_failed(struct local_op *op, int q);
int lc_wait(struct local_op *op, lc_cond_fn cond, void *arg, const char *what);
void lc_fail(struct local_op *op, int err, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* local_reduce.c */
void lc_broadcast(struct local_op *op);
int lc_cond_let_go(struct local_op *op, void *arg);
uint8_t *lc_my_region(const struct local_op *op);
int lc_reduce(struct local_op *op);
void lc_stage(struct local_op *op, uint8_t *region, uint32_t p);

/* local_arena.c (lc->lock held, but lc_region_give and the registry's
 * functions take it) */
uint64_t lc_arena_offset(const struct local *lc, const void *p, uint64_t len);
bool lc_region_give(struct local *lc, uint64_t region);
uint64_t lc_region_take(struct local *lc, uint64_t len);
int lc_arena_register(struct local *lc);
void lc_arena_unregister(struct local *lc);

#endif /* UNISUM_WORKER_LC_INT_H */
