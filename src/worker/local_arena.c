/*
 * local_arena.c - each rank's arena, which every local peer maps: regions
 * for staging and for unisum_alloc (first fit, pages reserved up front),
 * and the process's list of arenas, which outlive local_stop while their
 * memory is lent.  See local.c's DESIGN.
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#include "log/log.h"
#include "reducer/reducer.h"
#include "shm/shm.h"
#include "timing/timing.h"
#include "trace/trace.h"
#include "wire/wire.h"
#include "worker/lc_int.h"

/* ---- staging regions --------------------------------------------------------- */

/* Takes `len` bytes of this rank's arena, first fit: offset + 1, or 0 when
 * they do not fit now (the tensor then goes by cross-memory attach).
 * lc->lock held. */
uint64_t lc_region_take(struct local *lc, uint64_t len)
{
	if (lc->arenas == NULL || len == 0)
		return 0;
	const struct shm_seg *arena = &lc->arenas[lc->cfg.local_rank];
	uint64_t size = shm_seg_size(arena);
	if (len > size)
		return 0;
	len = (len + 4095) & ~(uint64_t)4095;
	uint64_t at = 0;
	int i = 0;
	for (; i < lc->nused; i++) {
		if (lc->used[i].off - at >= len)
			break;
		at = lc->used[i].off + lc->used[i].len;
	}
	if (at > size || len > size - at)
		return 0;
	/* Take the pages now: a sparse arena's first touch of a page that
	 * /dev/shm has no room for would raise SIGBUS in whoever touches it. */
	int rc = shm_seg_reserve(arena, at, len);
	if (rc != 0) {
		if (!lc->said_no_room)
			LOG_WARN("worker %d: its shared arena cannot take %llu more bytes (%s): using "
				 "ordinary memory and cross-memory attach instead; make /dev/shm larger "
				 "or UNISUM_LOCAL_ARENA_BYTES smaller", lc->cfg.rank, (unsigned long long)len,
				 rc == UNISUM_ENOMEM ? "/dev/shm is full" : "this kernel cannot reserve "
				 "shared memory ahead (MADV_POPULATE_WRITE needs Linux 5.14)");
		lc->said_no_room = true;
		return 0;
	}
	if (lc->nused == lc->capused) {
		int cap = lc->capused ? lc->capused * 2 : 16;
		struct lc_span *u = realloc(lc->used, (size_t)cap * sizeof *u);
		if (u == NULL)
			return 0;
		lc->used = u;
		lc->capused = cap;
	}
	memmove(&lc->used[i + 1], &lc->used[i], (size_t)(lc->nused - i) * sizeof *lc->used);
	lc->used[i] = (struct lc_span){at, len};
	lc->nused++;
	return at + 1;
}

/* Gives back the region at offset region - 1: whether there was one. */
static bool lc_region_give_locked(struct local *lc, uint64_t region)
{
	for (int i = 0; region != 0 && i < lc->nused; i++) {
		if (lc->used[i].off == region - 1) {
			memmove(&lc->used[i], &lc->used[i + 1], (size_t)(lc->nused - i - 1) * sizeof *lc->used);
			lc->nused--;
			return true;
		}
	}
	return false;
}

bool lc_region_give(struct local *lc, uint64_t region)
{
	pthread_mutex_lock(&lc->lock);
	bool had = lc_region_give_locked(lc, region);
	pthread_mutex_unlock(&lc->lock);
	return had;
}

/* Where [p, p + len) lies in this rank's arena: offset + 1, or 0 when it is
 * not wholly inside it. */
uint64_t lc_arena_offset(const struct local *lc, const void *p, uint64_t len)
{
	if (lc->arenas == NULL || p == NULL)
		return 0;
	const struct shm_seg *a = &lc->arenas[lc->cfg.local_rank];
	uintptr_t base = (uintptr_t)shm_seg_data(a), at = (uintptr_t)p;
	if (at < base || at - base > shm_seg_size(a) || len > shm_seg_size(a) - (at - base))
		return 0;
	return (uint64_t)(at - base) + 1;
}

void *local_alloc(struct local *lc, size_t bytes)
{
	if (bytes == 0)
		bytes = 1;
	pthread_mutex_lock(&lc->lock);
	uint64_t region = lc->started ? lc_region_take(lc, bytes) : 0;
	void *p = NULL;
	if (region != 0) {
		lc->nalloc++;
		p = (uint8_t *)shm_seg_data(&lc->arenas[lc->cfg.local_rank]) + region - 1;
	}
	pthread_mutex_unlock(&lc->lock);
	return p;
}

/* ---- the process's arenas ------------------------------------------------- */

/* unisum_free takes no handle, so every arena of this process that lends
 * memory is listed here: each running rank's own arena (owner set), and
 * each that outlived its rank's local_stop while its memory was still
 * out (owner NULL; unmapped when the last of it comes back: its name is
 * long gone, so a later run's arena never meets it).  Lock order:
 * lc_arenas_lock, then a rank's lock. */
static pthread_mutex_t lc_arenas_lock = PTHREAD_MUTEX_INITIALIZER;
static struct lc_arena_ref {
	struct local *owner;		/* NULL: kept past local_stop */
	struct shm_seg seg;		/* kept: the mapping */
	int nalloc;			/* kept: allocations still out */
} *lc_arenas;
static int lc_narenas, lc_caparenas;

int lc_arena_register(struct local *lc)
{
	pthread_mutex_lock(&lc_arenas_lock);
	int rc = 0;
	if (lc_narenas == lc_caparenas) {
		int cap = lc_caparenas ? 2 * lc_caparenas : 4;
		struct lc_arena_ref *a = realloc(lc_arenas, (size_t)cap * sizeof *a);
		if (a == NULL)
			rc = UNISUM_ENOMEM;
		else
			lc_arenas = a, lc_caparenas = cap;
	}
	if (rc == 0)
		lc_arenas[lc_narenas++] = (struct lc_arena_ref){.owner = lc};
	pthread_mutex_unlock(&lc_arenas_lock);
	return rc;
}

/* Takes lc's own arena off the list, or keeps it there (mapped, ownerless)
 * while unisum_alloc memory of it is still out; lc->arenas[its rank] is
 * then closed in lc (the mapping belongs to the list). */
void lc_arena_unregister(struct local *lc)
{
	pthread_mutex_lock(&lc_arenas_lock);
	for (int i = 0; i < lc_narenas; i++) {
		if (lc_arenas[i].owner != lc)
			continue;
		pthread_mutex_lock(&lc->lock);
		struct shm_seg *own = &lc->arenas[lc->cfg.local_rank];
		if (lc->nalloc > 0) {
			lc_arenas[i] = (struct lc_arena_ref){.seg = *own, .nalloc = lc->nalloc};
			*own = (struct shm_seg){0};
		} else {
			lc_arenas[i] = lc_arenas[--lc_narenas];
		}
		pthread_mutex_unlock(&lc->lock);
		break;
	}
	pthread_mutex_unlock(&lc_arenas_lock);
}

/* Gives back p to the live arena it lies in: whether it lies in one. */
static bool lc_free_live(struct local *lc, void *p)
{
	pthread_mutex_lock(&lc->lock);
	uint64_t region = lc_arena_offset(lc, p, 1);
	/* A pointer into the arena that starts no region (misuse) is still
	 * the arena's: never for free(). */
	if (region != 0 && lc_region_give_locked(lc, region))
		lc->nalloc--;
	pthread_mutex_unlock(&lc->lock);
	return region != 0;
}

bool local_free(void *p)
{
	bool found = false;
	pthread_mutex_lock(&lc_arenas_lock);
	for (int i = 0; i < lc_narenas && !found; i++) {
		struct lc_arena_ref *a = &lc_arenas[i];
		if (a->owner != NULL) {
			found = lc_free_live(a->owner, p);
			continue;
		}
		uintptr_t base = (uintptr_t)shm_seg_data(&a->seg), at = (uintptr_t)p;
		if (at < base || at - base >= shm_seg_size(&a->seg))
			continue;
		found = true;
		if (--a->nalloc == 0) {
			shm_seg_close(&a->seg);
			*a = lc_arenas[--lc_narenas];
		}
	}
	pthread_mutex_unlock(&lc_arenas_lock);
	return found;
}
