/*
 * phase.c - ring phases and begun rounds: when the held PULLs of a
 * gathering collective's phases go out.
 *
 * An allgather on a homed cut pulls phase by phase (a ring's order,
 * cuts.c's wk_phases_plan plans it); a begun round (unisum_allgather_begin) holds even
 * its first phase until no other operation is in flight.  The PULLs were
 * made ahead (op->pulls); this file only decides when each goes, and
 * queues it on its connection.  It calls nothing later than conns.c in
 * the layers, so the connection layer (through its upcall), cuts.c and
 * op.c may all call it.
 * The state it shares with the rest of the worker is in worker_int.h.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include "worker/worker_int.h"

/* Sends the PULLs of op's phases whose turn came (w->lock held). */
static void wk_phases_send(struct worker *w, struct wk_op *op)
{
	if (op->pulls_held)
		return;
	int from = atomic_load(&op->phase_sent) + 1, to = from - 1;
	while (to + 1 < op->nphases && op->phase_left[to] <= 1)
		to++;
	atomic_store(&op->phase_sent, to);
	/* Their jobs were made ahead: nothing here can fail but a dead
	 * connection, whose jobs fail with it.  Not once the connections
	 * close (wk_close_conns, which destroys them one by one while the
	 * others' jobs fail): the operation frees what is left. */
	for (int i = 0; to >= from && w->conns_live && i < op->npulls; i++) {
		struct wk_job *j = op->pulls[i];
		if (j == NULL || j->phase < from || j->phase > to)
			continue;
		op->pulls[i] = NULL;
		/* Where its key lives now (a failover moved it); while the lost
		 * server's hand-over runs, its connection drops the PULL and
		 * the job, pushed again, takes its PULL along. */
		j->server = (int)wk_server_of(w, j->key, (uint32_t)j->server);
		if (wk_enqueue(&w->conns[j->server], j) != 0)
			free(j);
	}
}

void wk_phase_step(struct worker *w, struct wk_op *op, int done)
{
	pthread_mutex_lock(&w->lock);
	if (done > 0)
		op->phase_left[done]--;
	wk_phases_send(w, op);
	pthread_mutex_unlock(&w->lock);
}

void wk_begun_go(struct worker *w, struct wk_op *op)
{
	if (!op->pulls_held)
		return;
	op->pulls_held = false;
	wk_phases_send(w, op);
}

void wk_begun_release(struct worker *w)
{
	struct wk_op *oldest = NULL;
	for (int i = 0; i < w->nops; i++) {
		struct wk_op *o = w->ops[i];
		if (o->done)
			continue;
		if (!o->pulls_held)
			return;		/* another round receives */
		if (oldest == NULL || o->handle < oldest->handle)
			oldest = o;
	}
	if (oldest != NULL)
		wk_begun_go(w, oldest);
}
