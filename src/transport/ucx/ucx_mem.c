/*
 * ucx_mem.c - memory registered with UCX once (ucp_mem_map), so that a
 * payload sent from it or received into it carries that registration
 * (UCP_OP_ATTR_FIELD_MEMH) instead of UCX registering, or finding in its
 * own cache, the buffer of each message.  Over InfiniBand and RoCE a
 * registration pins the pages and tells the NIC about them (ibv_reg_mr):
 * costly, and what the reference system's users ran out of (byteps#216,
 * #282).  Over TCP and shared memory it is cheap and changes nothing.
 *
 * Who registers: the owners of long-lived buffers, through the
 * transport's mem_register (transport.h): a server its keys' buffers, a
 * worker its shared arena.  A table of regions, sorted by address, finds
 * the one holding a payload; each region holds a reference to the UCX
 * context, so UCX outlives every registration.
 *
 * Lent memory.  A lent payload (transport.h) stays UCX's to read until
 * its send ends, or the connection's forced close cancels it, on the UCX
 * thread, later than the caller's send returned.  Counting such sends
 * lets a caller told that its operation failed wait for them
 * (lent_settle) before it lets its buffers go: a buffer freed and reused
 * under a send would reach a server as that worker's push.  The count is
 * kept in two halves, by epoch, so that a settle waits only for the
 * sends begun before it, and traffic that goes on meanwhile (other
 * operations, other links) does not hold it: the other half (sends older
 * than the last flip) must empty first, then the settle flips (new sends
 * count in the emptied half) and waits for the current one.  An
 * unregistering settles too: UCX's sends name the registration.
 */
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "log/log.h"
#include "timing/timing.h"
#include "transport/ucx/ucx_int.h"

struct ucx_region {
	uintptr_t base;
	size_t len;
	ucp_mem_h memh;
	struct ucx_ctx *u;
};

/* Smaller buffers go by UCX's copying protocols, where a registration
 * has no use. */
#define UCX_REG_MIN 8192
#define UCX_UNREG_SETTLE_MS 1000	/* an unregistering waits this long for sends */

static pthread_rwlock_t regions_lock = PTHREAD_RWLOCK_INITIALIZER;
static struct ucx_region *regions;	/* by base */
static size_t nregions, regions_cap;
static atomic_ullong region_uses;	/* payloads that went with a registration */

static pthread_mutex_t lent_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t lent_none;	/* a half of lent_count fell to 0 */
static pthread_once_t lent_once = PTHREAD_ONCE_INIT;
static long lent_count[2];		/* lent sends UCX may still read, by epoch & 1 */
static unsigned lent_epoch;		/* which half counts the sends begun now */

struct ucx_map_cmd {
	struct ucx_cmd cmd;
	struct ucx_ctx *u;
	void *p;
	size_t len;
	ucp_mem_h memh;
	ucs_status_t status;
};

/* On the UCX thread, as every UCX call. */
static void ucx_do_mem_map(struct ucx_cmd *cmd)
{
	struct ucx_map_cmd *m = (struct ucx_map_cmd *)cmd;
	ucp_mem_map_params_t params = {
		.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH,
		.address = m->p, .length = m->len};
	m->status = ucx_fn.ucp_mem_map(m->u->context, &params, &m->memh);
}

static void ucx_do_mem_unmap(struct ucx_cmd *cmd)
{
	struct ucx_map_cmd *m = (struct ucx_map_cmd *)cmd;
	m->status = ucx_fn.ucp_mem_unmap(m->u->context, m->memh);
}

/* The index of the last region whose base is at most p, or -1.  Lock
 * held. */
static ptrdiff_t region_at(uintptr_t p)
{
	ptrdiff_t lo = 0, hi = (ptrdiff_t)nregions - 1, found = -1;
	while (lo <= hi) {
		ptrdiff_t mid = lo + (hi - lo) / 2;
		if (regions[mid].base <= p) {
			found = mid;
			lo = mid + 1;
		} else {
			hi = mid - 1;
		}
	}
	return found;
}

/* Enters r in the table: false when memory ran out. */
static bool region_add(const struct ucx_region *r)
{
	pthread_rwlock_wrlock(&regions_lock);
	bool ok = true;
	if (nregions == regions_cap) {
		size_t cap = regions_cap ? 2 * regions_cap : 16;
		struct ucx_region *grown = realloc(regions, cap * sizeof *grown);
		if (grown == NULL)
			ok = false;
		else {
			regions = grown;
			regions_cap = cap;
		}
	}
	if (ok) {
		size_t at = (size_t)(region_at(r->base) + 1);
		memmove(regions + at + 1, regions + at, (nregions - at) * sizeof *regions);
		regions[at] = *r;
		nregions++;
	}
	pthread_rwlock_unlock(&regions_lock);
	return ok;
}

void ucx_mem_register(void *p, size_t len)
{
	if (len < UCX_REG_MIN)
		return;
	char why[256];
	struct ucx_ctx *u = ucx_ctx_get(why, sizeof why);
	if (u == NULL) {
		LOG_WARN("UCX: cannot register %zu bytes: %s", len, why);
		return;
	}
	struct ucx_map_cmd m = {.cmd.fn = ucx_do_mem_map, .u = u, .p = p, .len = len};
	ucx_run(u, &m.cmd);
	if (m.status != UCS_OK) {
		LOG_WARN("UCX: cannot register %zu bytes at %p (ucp_mem_map: %s); they go as UCX "
			 "registers them per message (over InfiniBand or RoCE, see `ulimit -l`)",
			 len, p, ucx_fn.ucs_status_string(m.status));
		ucx_ctx_put(u);
		return;
	}
	struct ucx_region r = {.base = (uintptr_t)p, .len = len, .memh = m.memh, .u = u};
	if (!region_add(&r)) {
		m.cmd.fn = ucx_do_mem_unmap;
		ucx_run(u, &m.cmd);
		ucx_ctx_put(u);
		return;
	}
	LOG_DEBUG("UCX: registered %zu bytes at %p", len, p);
}

void ucx_mem_unregister(void *p)
{
	pthread_rwlock_wrlock(&regions_lock);
	ptrdiff_t i = region_at((uintptr_t)p);
	struct ucx_region r = {0};
	if (i >= 0 && regions[i].base == (uintptr_t)p) {
		r = regions[i];
		memmove(regions + i, regions + i + 1, (nregions - (size_t)i - 1) * sizeof *regions);
		nregions--;
	}
	pthread_rwlock_unlock(&regions_lock);
	if (r.u == NULL)
		return;	/* never registered (or its registration failed) */
	/* A send under way may name the registration: it goes first. */
	int left = ucx_lent_settle(UCX_UNREG_SETTLE_MS);
	if (left > 0) {
		LOG_WARN("UCX: %d lent send(s) still under way after %d ms: the registration of the "
			 "memory at %p is kept (not unmapped) for them", left, UCX_UNREG_SETTLE_MS, p);
		return;
	}
	struct ucx_map_cmd m = {.cmd.fn = ucx_do_mem_unmap, .u = r.u, .memh = r.memh};
	ucx_run(r.u, &m.cmd);
	if (m.status != UCS_OK)
		LOG_WARN("UCX: cannot unregister the memory at %p: %s", p,
			 ucx_fn.ucs_status_string(m.status));
	ucx_ctx_put(r.u);
}

ucp_mem_h ucx_mem_find(const void *p, size_t len)
{
	if (p == NULL || len == 0)
		return NULL;
	uintptr_t at = (uintptr_t)p;
	ucp_mem_h memh = NULL;
	pthread_rwlock_rdlock(&regions_lock);
	ptrdiff_t i = region_at(at);
	if (i >= 0 && at - regions[i].base <= regions[i].len &&
	    len <= regions[i].len - (at - regions[i].base))
		memh = regions[i].memh;
	pthread_rwlock_unlock(&regions_lock);
	if (memh != NULL)
		atomic_fetch_add_explicit(&region_uses, 1, memory_order_relaxed);
	return memh;
}

void ucx_mem_stats(size_t *nregions_out, unsigned long long *uses)
{
	pthread_rwlock_rdlock(&regions_lock);
	*nregions_out = nregions;
	pthread_rwlock_unlock(&regions_lock);
	*uses = atomic_load(&region_uses);
}

static void lent_init(void)
{
	timing_cond_init(&lent_none);	/* timed waits on the monotonic clock */
}

unsigned ucx_lent_begin(void)
{
	pthread_once(&lent_once, lent_init);
	pthread_mutex_lock(&lent_lock);
	unsigned half = lent_epoch & 1;
	lent_count[half]++;
	pthread_mutex_unlock(&lent_lock);
	return half;
}

void ucx_lent_end(unsigned half)
{
	pthread_mutex_lock(&lent_lock);
	if (--lent_count[half] == 0)
		pthread_cond_broadcast(&lent_none);
	pthread_mutex_unlock(&lent_lock);
}

int ucx_lent_settle(int timeout_ms)
{
	pthread_once(&lent_once, lent_init);
	struct timespec until = timing_deadline(timeout_ms);
	pthread_mutex_lock(&lent_lock);
	unsigned half = lent_epoch & 1, older = half ^ 1;
	int rc = 0;
	while (lent_count[older] > 0 && rc == 0)
		rc = pthread_cond_timedwait(&lent_none, &lent_lock, &until);
	long n = lent_count[older];	/* then: older sends not ended (none begun since) */
	if (n == 0) {
		lent_epoch++;	/* sends from now count in the emptied half */
		while (lent_count[half] > 0 && rc == 0)
			rc = pthread_cond_timedwait(&lent_none, &lent_lock, &until);
	}
	n += lent_count[half];
	int left = n > INT_MAX ? INT_MAX : (int)n;
	pthread_mutex_unlock(&lent_lock);
	return left;
}
