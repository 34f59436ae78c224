/*
 * pushq.c - the push queue: a binary heap under a mutex, gated by credit
 * (see pushq.h).
 */
#include "pushq/pushq.h"

#include <stdlib.h>

#include "unisum.h"

static bool entry_before(const struct pushq_entry *a, const struct pushq_entry *b)
{
	if (a->priority != b->priority)
		return a->priority > b->priority;
	return a->key < b->key;
}

int pushq_init(struct pushq *q, size_t credit)
{
	*q = (struct pushq){.credit = credit};
	if (pthread_mutex_init(&q->lock, NULL) != 0)
		return UNISUM_ESYS;
	if (pthread_cond_init(&q->cond, NULL) != 0) {
		pthread_mutex_destroy(&q->lock);
		return UNISUM_ESYS;
	}
	return 0;
}

void pushq_fini(struct pushq *q)
{
	free(q->heap);
	pthread_cond_destroy(&q->cond);
	pthread_mutex_destroy(&q->lock);
}

/* Whether the head may go under the credit; the caller holds the lock and
 * q->n > 0. */
static bool head_fits(const struct pushq *q)
{
	if (q->credit == 0 || q->inflight == 0)
		return true;
	return q->heap[0]->bytes <= q->credit && q->inflight + q->heap[0]->bytes <= q->credit;
}

int pushq_push(struct pushq *q, struct pushq_entry *e)
{
	pthread_mutex_lock(&q->lock);
	if (q->n == q->cap) {
		size_t cap = q->cap ? q->cap * 2 : 64;
		struct pushq_entry **h = realloc(q->heap, cap * sizeof *h);
		if (h == NULL) {
			pthread_mutex_unlock(&q->lock);
			return UNISUM_ENOMEM;
		}
		q->heap = h;
		q->cap = cap;
	}
	size_t i = q->n++;
	while (i > 0 && entry_before(e, q->heap[(i - 1) / 2])) {
		q->heap[i] = q->heap[(i - 1) / 2];
		i = (i - 1) / 2;
	}
	q->heap[i] = e;
	if (i == 0 && head_fits(q))
		pthread_cond_broadcast(&q->cond);
	pthread_mutex_unlock(&q->lock);
	return 0;
}

/* Removes the head; the caller holds the lock and q->n > 0. */
static struct pushq_entry *heap_take(struct pushq *q)
{
	struct pushq_entry *top = q->heap[0], *last = q->heap[--q->n];
	size_t i = 0;
	for (;;) {
		size_t l = 2 * i + 1, r = l + 1, m = i;
		const struct pushq_entry *best = last;
		if (l < q->n && entry_before(q->heap[l], best)) {
			m = l;
			best = q->heap[l];
		}
		if (r < q->n && entry_before(q->heap[r], best))
			m = r;
		if (m == i)
			break;
		q->heap[i] = q->heap[m];
		i = m;
	}
	if (q->n > 0)
		q->heap[i] = last;
	return top;
}

/* Takes the head; the caller holds the lock and the head fits. */
static struct pushq_entry *take_head(struct pushq *q)
{
	struct pushq_entry *e = heap_take(q);
	e->order = q->taken++;
	q->inflight += e->bytes;
	if (q->inflight > q->max_inflight)
		q->max_inflight = q->inflight;
	e->inflight = q->inflight;
	return e;
}

struct pushq_entry *pushq_pop(struct pushq *q)
{
	pthread_mutex_lock(&q->lock);
	while (!q->closed && (q->n == 0 || !head_fits(q)))
		pthread_cond_wait(&q->cond, &q->lock);
	struct pushq_entry *e = q->closed ? NULL : take_head(q);
	pthread_mutex_unlock(&q->lock);
	return e;
}

struct pushq_entry *pushq_try_pop(struct pushq *q)
{
	pthread_mutex_lock(&q->lock);
	struct pushq_entry *e = !q->closed && q->n > 0 && head_fits(q) ? take_head(q) : NULL;
	pthread_mutex_unlock(&q->lock);
	return e;
}

static size_t release(struct pushq *q, size_t bytes, bool wake)
{
	pthread_mutex_lock(&q->lock);
	q->inflight = bytes <= q->inflight ? q->inflight - bytes : 0;
	size_t left = q->inflight;
	/* Only when the head may go now: a wake-up of the PUSH stage for
	 * nothing costs two context switches (issue 49). */
	if (wake && q->n > 0 && head_fits(q))
		pthread_cond_broadcast(&q->cond);
	pthread_mutex_unlock(&q->lock);
	return left;
}

size_t pushq_release(struct pushq *q, size_t bytes)
{
	return release(q, bytes, true);
}

size_t pushq_release_quiet(struct pushq *q, size_t bytes)
{
	return release(q, bytes, false);
}

void pushq_set_credit(struct pushq *q, size_t credit)
{
	pthread_mutex_lock(&q->lock);
	q->credit = credit;
	pthread_cond_broadcast(&q->cond);
	pthread_mutex_unlock(&q->lock);
}

void pushq_close(struct pushq *q)
{
	pthread_mutex_lock(&q->lock);
	q->closed = true;
	pthread_cond_broadcast(&q->cond);
	pthread_mutex_unlock(&q->lock);
}

struct pushq_entry *pushq_drain(struct pushq *q)
{
	pthread_mutex_lock(&q->lock);
	struct pushq_entry *e = q->n > 0 ? heap_take(q) : NULL;
	pthread_mutex_unlock(&q->lock);
	return e;
}

void pushq_stats(struct pushq *q, struct pushq_stats *out)
{
	pthread_mutex_lock(&q->lock);
	*out = (struct pushq_stats){.credit = q->credit, .inflight = q->inflight,
				    .max_inflight = q->max_inflight, .queued = q->n,
				    .taken = q->taken};
	pthread_mutex_unlock(&q->lock);
}
