/*
 * sched.c - stage queues: a binary heap under a mutex, gated by credit
 * (see sched.h).
 */
#include "sched/sched.h"

#include <stdlib.h>

#include "unisum.h"

static bool entry_before(const struct sched_entry *a, const struct sched_entry *b)
{
	if (a->priority != b->priority)
		return a->priority > b->priority;
	return a->key < b->key;
}

int sched_init(struct sched_queue *q, size_t credit)
{
	*q = (struct sched_queue){.credit = credit};
	if (pthread_mutex_init(&q->lock, NULL) != 0)
		return UNISUM_ESYS;
	if (pthread_cond_init(&q->cond, NULL) != 0) {
		pthread_mutex_destroy(&q->lock);
		return UNISUM_ESYS;
	}
	return 0;
}

void sched_fini(struct sched_queue *q)
{
	free(q->heap);
	pthread_cond_destroy(&q->cond);
	pthread_mutex_destroy(&q->lock);
}

int sched_push(struct sched_queue *q, struct sched_entry *e)
{
	pthread_mutex_lock(&q->lock);
	if (q->n == q->cap) {
		size_t cap = q->cap ? q->cap * 2 : 64;
		struct sched_entry **h = realloc(q->heap, cap * sizeof *h);
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
	if (i == 0)
		pthread_cond_broadcast(&q->cond);
	pthread_mutex_unlock(&q->lock);
	return 0;
}

/* Removes the head; the caller holds the lock and q->n > 0. */
static struct sched_entry *heap_take(struct sched_queue *q)
{
	struct sched_entry *top = q->heap[0], *last = q->heap[--q->n];
	size_t i = 0;
	for (;;) {
		size_t l = 2 * i + 1, r = l + 1, m = i;
		const struct sched_entry *best = last;
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

static bool head_fits(const struct sched_queue *q)
{
	if (q->credit == 0 || q->inflight == 0)
		return true;
	return q->heap[0]->bytes <= q->credit && q->inflight + q->heap[0]->bytes <= q->credit;
}

/* Takes the head; the caller holds the lock and the head fits. */
static struct sched_entry *take_head(struct sched_queue *q)
{
	struct sched_entry *e = heap_take(q);
	e->order = q->taken++;
	q->inflight += e->bytes;
	if (q->inflight > q->max_inflight)
		q->max_inflight = q->inflight;
	e->inflight = q->inflight;
	return e;
}

struct sched_entry *sched_pop(struct sched_queue *q)
{
	pthread_mutex_lock(&q->lock);
	while (!q->closed && (q->n == 0 || !head_fits(q)))
		pthread_cond_wait(&q->cond, &q->lock);
	struct sched_entry *e = q->closed ? NULL : take_head(q);
	pthread_mutex_unlock(&q->lock);
	return e;
}

struct sched_entry *sched_try_pop(struct sched_queue *q)
{
	pthread_mutex_lock(&q->lock);
	struct sched_entry *e = !q->closed && q->n > 0 && head_fits(q) ? take_head(q) : NULL;
	pthread_mutex_unlock(&q->lock);
	return e;
}

size_t sched_release(struct sched_queue *q, size_t bytes)
{
	pthread_mutex_lock(&q->lock);
	q->inflight = bytes <= q->inflight ? q->inflight - bytes : 0;
	size_t left = q->inflight;
	pthread_cond_broadcast(&q->cond);
	pthread_mutex_unlock(&q->lock);
	return left;
}

void sched_set_credit(struct sched_queue *q, size_t credit)
{
	pthread_mutex_lock(&q->lock);
	q->credit = credit;
	pthread_cond_broadcast(&q->cond);
	pthread_mutex_unlock(&q->lock);
}

void sched_close(struct sched_queue *q)
{
	pthread_mutex_lock(&q->lock);
	q->closed = true;
	pthread_cond_broadcast(&q->cond);
	pthread_mutex_unlock(&q->lock);
}

struct sched_entry *sched_drain(struct sched_queue *q)
{
	pthread_mutex_lock(&q->lock);
	struct sched_entry *e = q->n > 0 ? heap_take(q) : NULL;
	pthread_mutex_unlock(&q->lock);
	return e;
}

void sched_stats(struct sched_queue *q, struct sched_stats *out)
{
	pthread_mutex_lock(&q->lock);
	*out = (struct sched_stats){.credit = q->credit, .inflight = q->inflight,
				    .max_inflight = q->max_inflight, .queued = q->n,
				    .taken = q->taken};
	pthread_mutex_unlock(&q->lock);
}
