/*
 * keep.c - what a worker keeps of its pushes for server failover
 * (failover.c sends it to a lost server's successor): a compressed
 * partition's push encoded once (a re-push sends the same bytes), an
 * async partition's last push answered (UNISUM_REPLICAS), a homed cut's
 * (UNISUM_GATHER_FAILOVER), each staged as its reply arrives and kept
 * once the reply is whole.  Called by conns.c on a connection's loop
 * (the PULL stage) and its sender; below it in the layers.
 */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "compress/compress.h"
#include "log/log.h"
#include "worker/worker_int.h"

size_t wk_push_bytes(const struct wk_tensor *t, uint64_t count, const struct compress_state *cs)
{
	if (cs == NULL)
		return (size_t)count * t->esize;
	return compress_codec_of(cs->spec.kind)->bytes(&cs->spec, (size_t)count);
}

/* A compressed partition's push, into *encoded (len bytes, malloc'd):
 * it goes through the socket (IPC too), and is freed once sent.  Under
 * failover (j->kept) it is encoded once and kept with the job (j->enc):
 * a re-push after a failover sends the same bytes, and once answered it
 * is the partition's last push (wk_kept_answered).  0 or UNISUM_ENOMEM.
 * c->lock held. */
int wk_encode_push(struct wk_conn *c, struct wk_job *j, size_t len, void **encoded)
{
	struct worker *w = c->w;
	bool again = j->enc != NULL;	/* sent before: to a server lost since, or moved */
	*encoded = malloc(len ? len : 1);
	if (*encoded != NULL && j->kept != NULL && !again &&
	    (j->enc = malloc(len ? len : 1)) == NULL) {
		free(*encoded);
		*encoded = NULL;
	}
	if (*encoded == NULL) {
		LOG_ERROR("%s: out of memory compressing a push", c->label);
		return UNISUM_ENOMEM;
	}
	if (again) {
		memcpy(*encoded, j->enc, len);
		return 0;
	}
	compress_state_encode(j->cs, j->in, *encoded,
			      compress_draw_seed(&j->cs->spec, j->key, j->round, w->rank));
	if (j->enc != NULL)
		memcpy(j->enc, *encoded, len);
	atomic_fetch_add(&w->comp_in, j->count * sizeof(float));
	atomic_fetch_add(&w->comp_out, len);
	return 0;
}

/* An async key's push, being answered (UNISUM_REPLICAS): kept until the
 * next reply, which comes once the server's backup holds it; a lost
 * server's successor gets it again (wk_redeclare).  Staged before the
 * reply lands (the push may be in place), and kept once it has
 * (wk_kept_answered): a server lost in the middle of the reply leaves
 * the last push answered kept. */
void wk_keep_push(struct wk_job *j)
{
	struct wk_kept *k = j->kept;
	size_t bytes = j->count * unisum_dtype_size(j->dtype);
	if (k->homed) {	/* a homed cut's: ZERO, or its bytes (allocated now) */
		k->stage_op = j->wire_op;
		k->stage_zero = j->in == NULL;
		k->stage_bad = false;
		if (j->in == NULL)
			return;
		if (k->stage == NULL && (k->stage = malloc(bytes ? bytes : 1)) == NULL) {
			LOG_WARN("out of memory keeping a push of key 0x%llx for failover",
				 (unsigned long long)j->key);
			k->stage_bad = true;
			return;
		}
	}
	if (j->in != NULL)
		memcpy(k->stage, j->in, bytes);
	else
		memset(k->stage, 0, bytes);
}

/* The reply of job j's round came whole: the worker pushes the next
 * round next, and an async key's staged push, or a compressed one's
 * encoding, is its last answered. */
void wk_kept_answered(struct wk_job *j)
{
	struct wk_kept *k = j->kept;
	k->pulled = j->round + 1;
	if (j->enc != NULL) {
		free(k->data);
		k->data = j->enc;
		k->len = wk_push_bytes(j->op->t, j->count, j->cs);
		j->enc = NULL;
	}
	if (k->keeps_push) {
		uint8_t *t = k->data;
		k->data = k->stage;
		k->stage = t;
		bool z = k->zero;
		k->zero = k->stage_zero;
		k->stage_zero = z;
		k->op = k->stage_op;
		if (k->stage_bad) {	/* not kept: a new server would sum it wrong */
			free(k->data);
			k->data = NULL;
			k->zero = false;
		}
	}
}
