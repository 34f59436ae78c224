/*
 * worker.c - the worker side of unisum: the public C API of unisum.h
 * (init and shutdown, the tensor table, starting and completing
 * operations, the local path's hooks).  The server connections and the
 * PUSH and PULL stages are in conns.c, cuts and autotune in cuts.c, the
 * state they share in worker_int.h.
 *
 * DESIGN.  Every partition of a push_pull goes through the stages of
 * docs/ARCHITECTURE.md section 2.  LOCAL_REDUCE and LOCAL_BROADCAST have work only
 * when several workers share a machine (UNISUM_LOCAL_SIZE > 1): then
 * local.c sums the machine's inputs in shared memory, only the local root
 * pushes (wk_local_push, from its output buffer, where the machine's sum
 * lies) and local.c completes the operation (wk_local_done) once every
 * local rank has the result; with one machine in the job nothing goes to
 * a server at all.  The PUSH stage is one thread taking partitions from a queue
 * ordered by (priority, key) and gated by the credit
 * (UNISUM_SCHEDULING_CREDIT bytes in flight, src/sched): a high-priority
 * partition queued behind a long low-priority backlog is the next one out
 * as soon as any credit comes back, and no more bytes than the credit ever
 * wait in the sockets.  It hands each partition to its server's
 * connection, whose sending thread writes PUSH (straight from the caller's
 * input buffer) followed by PULL.  The PULL stage is the connection's
 * receiving thread: it reads the PULL_REPLY straight into the caller's
 * output buffer, divides for UNISUM_AVERAGE while the data is hot in
 * cache, gives the credit back, and completes the operation when its last
 * partition arrives.  With UNISUM_TRACE_ON every stage's span goes to the
 * timeline (src/trace).
 *
 * A job lives in its connection's pending table from the moment the PUSH
 * stage hands it over until its reply arrives or the connection dies; only the
 * receiving thread completes jobs, so once an operation is reported done
 * no thread touches the caller's buffers again.  When a connection dies,
 * its receiving thread first stops the sending thread, then fails every
 * pending job with an error that names the server.
 *
 * Locks.  `wk.lock` guards the tensor table, the operations and `failed`;
 * a connection's `lock` guards its queue and pending table.  Order:
 * wk.lock, then a connection's lock.  No lock is held during socket I/O.
 */
#include <endian.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "config/config.h"
#include "log/log.h"
#include "placement/placement.h"
#include "reducer/reducer.h"
#include "rendezvous/rendezvous.h"
#include "sched/sched.h"
#include "trace/trace.h"
#include "shm/shm.h"
#include "timing/timing.h"
#include "worker/local.h"
#include "worker/tune.h"
#include "worker/worker_int.h"
#include "transport/auth.h"
#include "transport/transport.h"
#include "unisum.h"
#include "wire/wire.h"

struct wk_state wk = {.lock = PTHREAD_MUTEX_INITIALIZER, .done_cond = PTHREAD_COND_INITIALIZER,
		      .failed_cond = PTHREAD_COND_INITIALIZER};

/* The scheduler says the job failed (or was lost): fail everything. */
static void wk_notice(void *arg, int err, const char *why)
{
	(void)arg;
	pthread_mutex_lock(&wk.lock);
	if (wk.failed == 0) {
		wk.failed = err == UNISUM_ESHUTDOWN ? UNISUM_ECONN : err;
		snprintf(wk.failed_why, sizeof wk.failed_why, "%s", why);
		pthread_cond_broadcast(&wk.failed_cond);
	}
	if (wk.tuner != NULL)
		tune_stop(wk.tuner);
	/* Unblock every connection (their threads fail the pending jobs),
	 * unless they are still being set up or already being torn down. */
	if (wk.conns_live)
		for (int s = 0; s < wk.nservers; s++)
			wk.tp->conn_shutdown(wk.conns[s].conn);
	pthread_mutex_unlock(&wk.lock);
	LOG_ERROR("%s", why);
}


/* ---- the local path's hooks (src/worker/local.c) ------------------------- */

/* Local root of several machines: partition `part` of the machine's sum is
 * in the operation's output; it goes to the PUSH stage like any other. */
static void wk_local_push(void *ctx, uint32_t part)
{
	struct wk_op *op = ctx;
	const struct wk_layout *L = op->L;
	const struct placement_part *p = &L->parts[part];
	struct wk_tensor *t = op->t;
	uint8_t *at = (uint8_t *)op->out + p->offset * t->esize;
	struct wk_job *j = malloc(sizeof *j);
	int rc = UNISUM_ENOMEM;
	if (j != NULL) {
		*j = (struct wk_job){.entry = {.priority = t->priority, .key = L->key + part,
					       .bytes = p->count * t->esize},
				     .type = JOB_PUSH_PULL, .server = (int)L->servers[part], .part = part,
				     .key = L->key + part, .round = op->wire_round, .dtype = t->dtype,
				     .count = p->count, .in = at, .out = at,
				     .divisor = (op->flags & UNISUM_AVERAGE) ? wk.size : 1,
				     .wire_op = op->wire_op, .op = op,
				     .t_queued = op->traced ? trace_now_us() : 0};
		rc = sched_push(&wk.push_q, &j->entry);
	}
	if (rc != 0) {
		free(j);
		char why[512];
		snprintf(why, sizeof why, "worker %d, tensor '%s': %s", wk.rank, t->name,
			 rc == UNISUM_ENOMEM ? "out of memory" : log_last_error());
		local_pulled(op->local, part, rc, why);
	}
}

/* The operation is complete on this worker. */
static void wk_local_done(void *ctx, int err, const char *why)
{
	struct wk_op *op = ctx;
	/* Its partitions never counted down here: complete it as the last. */
	pthread_mutex_lock(&wk.lock);
	op->remaining = 1;
	pthread_mutex_unlock(&wk.lock);
	wk_op_part_done(op, err, why);
}

static int wk_local_failed(char *why, size_t len)
{
	pthread_mutex_lock(&wk.lock);
	int err = wk.failed;
	if (err != 0)
		snprintf(why, len, "the job failed: %s", wk.failed_why);
	pthread_mutex_unlock(&wk.lock);
	return err;
}

/* The scheduler says tensor `key` can never be summed (reader thread). */
static void wk_tensor_error(void *arg, uint64_t key, const char *why)
{
	(void)arg;
	pthread_mutex_lock(&wk.lock);
	struct wk_poison *p = realloc(wk.poison, (size_t)(wk.npoison + 1) * sizeof *p);
	if (p != NULL) {
		wk.poison = p;
		p[wk.npoison].key = key;
		snprintf(p[wk.npoison].why, sizeof p[wk.npoison].why, "%s", why);
		wk.npoison++;
	}
	pthread_mutex_unlock(&wk.lock);
}

static int wk_local_poisoned(uint64_t key, char *why, size_t len)
{
	int rc = 0;
	pthread_mutex_lock(&wk.lock);
	for (int i = 0; i < wk.npoison && rc == 0; i++) {
		if (wk.poison[i].key == key) {
			snprintf(why, len, "%s", wk.poison[i].why);
			rc = UNISUM_EMISMATCH;
		}
	}
	pthread_mutex_unlock(&wk.lock);
	return rc;
}

static void wk_local_poison(uint64_t key, const char *why)
{
	rdv_client_poison_tensor(wk.rdv, key, why);
}

static void wk_local_fail_job(int err, const char *why)
{
	rdv_client_fail_job(wk.rdv, err, why);
}

static int wk_local_start(void)
{
	char job[SHM_JOB_MAX + 1];
	config_job_id(&wk.cfg, job, sizeof job);
	struct local_cfg lcfg = {.job = job, .machine = wk.cfg.worker_id,
				 .machines = wk.cfg.num_workers, .local_rank = wk.cfg.local_rank,
				 .local_size = wk.cfg.local_size, .rank = wk.rank,
				 .timeout_ms = wk.cfg.timeout_ms, .stall_warn_ms = wk.cfg.stall_warn_ms,
				 .stall_abort_ms = wk.cfg.stall_abort_ms,
				 .stage_bytes = wk.cfg.local_stage_bytes,
				 .arena_bytes = wk.cfg.local_arena_bytes};
	struct local_hooks hooks = {.push = wk_local_push, .done = wk_local_done,
				    .poison = wk_local_poison, .fail_job = wk_local_fail_job,
				    .failed = wk_local_failed, .poisoned = wk_local_poisoned};
	return local_start(&lcfg, &hooks);
}

/* ---- public API --------------------------------------------------------- */

/* 0 when unisum_init() has run, else UNISUM_ENOTINIT with a message. */
static int wk_require_init(void)
{
	return wk.initialized ? 0 : log_fail(UNISUM_ENOTINIT, "call unisum_init() first");
}

static void wk_tensor_free(struct wk_tensor *t)
{
	if (t == NULL)
		return;
	for (int c = 0; c < t->ncuts; c++) {
		free(t->cuts[c].parts);
		free(t->cuts[c].servers);
	}
	free(t->cuts);
	free(t);
}

static void wk_free_all(void)
{
	for (int i = 0; i < wk.ntensors; i++)
		wk_tensor_free(wk.tensors[i]);
	free(wk.tensors);
	free(wk.poison);
	wk.poison = NULL;
	wk.npoison = 0;
	for (int i = 0; i < wk.nops; i++)
		free(wk.ops[i]);
	free(wk.ops);
	wk.tensors = NULL;
	wk.ops = NULL;
	wk.ntensors = wk.captensors = wk.nops = wk.capops = 0;
}


/* The condition variables with timed waits, made once to wait on the
 * monotonic clock. */
static pthread_once_t wk_conds_once = PTHREAD_ONCE_INIT;

static void wk_conds_init(void)
{
	timing_cond_init(&wk.done_cond);
	timing_cond_init(&wk.failed_cond);
	pthread_cond_init(&wk.tune_cond, NULL);
}

/* Reads the worker's configuration from the environment.  0, or an error
 * with err naming the variable. */
static int wk_configure(char *err, size_t len)
{
	int rc = config_load(&wk.cfg, err, len);
	if (rc == 0 && wk.cfg.role == CONFIG_ROLE_NONE)
		wk.cfg.role = CONFIG_ROLE_WORKER;
	if (rc == 0 && wk.cfg.role != CONFIG_ROLE_WORKER) {
		snprintf(err, len, "UNISUM_ROLE=%s: unisum_init() is for workers; run `unisum %s` for "
			 "that role", config_role_name(wk.cfg.role), config_role_name(wk.cfg.role));
		rc = UNISUM_ECONFIG;
	}
	if (rc == 0)
		rc = config_require(&wk.cfg, CONFIG_ROLE_WORKER, err, len);
	return rc;
}

int unisum_init(void)
{
	char err[512];
	pthread_once(&wk_conds_once, wk_conds_init);
	if (wk.initialized)
		return 0;
	if (wk.left)
		return log_fail(UNISUM_ESHUTDOWN, "unisum_init: this process left the job with "
				"unisum_shutdown() already, and a job cannot be joined twice (the "
				"scheduler counted this worker done, and the servers stop once every "
				"worker is); call unisum_init() once per process and unisum_shutdown() "
				"at its end");
	int rc = wk_configure(err, sizeof err);
	if (rc != 0)
		return log_fail(rc, "unisum_init: %s", err);
	log_set_level(wk.cfg.log_level);
	log_set_identity("worker", wk.cfg.worker_id);
	if (auth_set_secret(wk.cfg.secret) != 0)
		return log_fail(UNISUM_ESYS, "unisum_init: libsodium cannot start");

	wk.tp = transport_tcp();
	wk.failed = 0;
	wk.nservers = wk.cfg.num_servers;
	rc = rdv_client_new(&wk.cfg, 0, wk_notice, wk_tensor_error, NULL, &wk.rdv);
	if (rc != 0)
		return log_fail(rc, "unisum_init: cannot join the job through the scheduler at %s:%d: %s",
				wk.cfg.scheduler_host, wk.cfg.scheduler_port, log_last_error());
	wk.rank = rdv_client_rank(wk.rdv);
	wk.size = wk.cfg.num_workers * wk.cfg.local_size;
	wk.local = wk.cfg.local_size > 1;
	wk.to_servers = !wk.local || (wk.cfg.num_workers > 1 && wk.cfg.local_rank == 0);
	log_set_identity("worker", wk.rank);
	rc = wk_tuner_new();	/* TUNEs that came meanwhile wait in the client */
	if (rc != 0) {
		rc = log_fail(rc, "unisum_init: out of memory");
		goto out_free_rdv;
	}
	rdv_client_on_tune(wk.rdv, wk_on_tune, NULL);
	if ((rc = trace_open(&wk.cfg, wk.rank)) != 0)
		goto out_free_rdv;
	if ((rc = sched_init(&wk.push_q, wk.cfg.credit_bytes)) != 0)
		goto out_close_trace;
	if (wk.local && (rc = wk_local_start()) != 0)
		goto out_fini_sched;
	rc = wk.to_servers ? wk_connect_servers() : 0;
	if (rc == 0 && pthread_create(&wk.push_thread, NULL, wk_push_main, NULL) != 0)
		rc = UNISUM_ESYS;
	if (rc != 0)
		goto out_close_conns;
	wk.push_started = true;
	wk.tune_stop = false;
	wk.tune_started = wk.cfg.autotune &&
			  pthread_create(&wk.tune_thread, NULL, wk_tune_main, NULL) == 0;
	if (wk.cfg.autotune && !wk.tune_started)
		LOG_WARN("cannot start the autotune thread: operations whose cut is new start on the "
			 "caller's thread");
	wk.initialized = true;
	LOG_INFO("joined as worker %d of %d (local rank %d of %d) with %d servers", wk.rank, wk.size,
		 wk.cfg.local_rank, wk.cfg.local_size, wk.nservers);
	return 0;

out_close_conns:
	wk_close_conns();
	local_stop();
out_fini_sched:
	sched_fini(&wk.push_q);
out_close_trace:
	trace_close();
out_free_rdv:
	/* The client's reader thread hands TUNEs to the tuner: it goes first. */
	rdv_client_free(wk.rdv);
	wk.rdv = NULL;
	tune_free(wk.tuner);
	wk.tuner = NULL;
	return rc;
}

int unisum_shutdown(void)
{
	if (!wk.initialized)
		return wk_require_init();
	/* Operations the caller never waited on must finish before their
	 * buffers' owner goes away. */
	pthread_mutex_lock(&wk.lock);
	for (int i = 0; i < wk.nops; i++)
		while (!wk.ops[i]->done)
			pthread_cond_wait(&wk.done_cond, &wk.lock);
	int failed = wk.failed;
	wk.tune_stop = true;
	pthread_cond_signal(&wk.tune_cond);
	pthread_mutex_unlock(&wk.lock);
	/* Every operation is done, so the autotune thread's queue and the PUSH
	 * stage's are empty. */
	if (wk.tune_started)
		pthread_join(wk.tune_thread, NULL);
	wk.tune_started = false;
	local_stop();
	sched_close(&wk.push_q);
	if (wk.push_started)
		pthread_join(wk.push_thread, NULL);
	wk.push_started = false;
	wk_close_conns();
	sched_fini(&wk.push_q);
	trace_close();
	rdv_client_free(wk.rdv);
	wk.rdv = NULL;
	tune_free(wk.tuner);
	wk.tuner = NULL;
	wk_free_all();
	wk.initialized = false;
	wk.left = true;
	return failed;
}

int unisum_rank(void)
{
	return wk.initialized ? wk.rank : UNISUM_ENOTINIT;
}

int unisum_size(void)
{
	return wk.initialized ? wk.size : UNISUM_ENOTINIT;
}

int unisum_local_rank(void)
{
	return wk.initialized ? wk.cfg.local_rank : UNISUM_ENOTINIT;
}

int unisum_local_size(void)
{
	return wk.initialized ? wk.cfg.local_size : UNISUM_ENOTINIT;
}


/* Files tensor t under an id: the first free one (an undeclared tensor's)
 * or a new one.  Returns its id (*filed), or the id of a tensor of the
 * same name another thread declared meanwhile (t is not filed), or
 * UNISUM_ENOMEM. */
static int wk_tensor_insert(struct wk_tensor *t, bool *filed)
{
	*filed = false;
	pthread_mutex_lock(&wk.lock);
	int id = -1;
	for (int i = 0; i < wk.ntensors; i++) {
		if (wk.tensors[i] == NULL) {
			if (id < 0)
				id = i;
		} else if (strcmp(wk.tensors[i]->name, t->name) == 0) {
			pthread_mutex_unlock(&wk.lock);
			return i;
		}
	}
	if (id < 0 && wk.ntensors == wk.captensors) {
		int cap = wk.captensors ? wk.captensors * 2 : 64;
		struct wk_tensor **nt = realloc(wk.tensors, (size_t)cap * sizeof *nt);
		if (nt == NULL) {
			pthread_mutex_unlock(&wk.lock);
			return UNISUM_ENOMEM;
		}
		wk.tensors = nt;
		wk.captensors = cap;
	}
	if (id < 0)
		id = wk.ntensors++;
	t->index = id;
	wk.tensors[id] = t;
	*filed = true;
	pthread_mutex_unlock(&wk.lock);
	return id;
}

int unisum_declare(const char *name, unisum_dtype dtype, size_t count, int priority)
{
	if (!wk.initialized)
		return wk_require_init();
	if (name == NULL || name[0] == '\0' || strlen(name) >= sizeof ((struct wk_tensor *)0)->name)
		return log_fail(UNISUM_EINVAL, "unisum_declare: the name must have 1 to 255 characters");
	size_t esize = unisum_dtype_size(dtype);
	if (esize == 0)
		return log_fail(UNISUM_EINVAL, "unisum_declare('%s'): unknown dtype %d", name, (int)dtype);
	if (esize > wk.cfg.partition_bytes)
		return log_fail(UNISUM_ECONFIG, "UNISUM_PARTITION_BYTES=%llu is smaller than one %s element",
				(unsigned long long)wk.cfg.partition_bytes, unisum_dtype_name(dtype));

	pthread_mutex_lock(&wk.lock);
	for (int i = 0; i < wk.ntensors; i++) {
		struct wk_tensor *t = wk.tensors[i];
		if (t == NULL || strcmp(t->name, name) != 0)
			continue;
		pthread_mutex_unlock(&wk.lock);
		if (t->dtype != dtype || t->count != count)
			return log_fail(UNISUM_EMISMATCH, "worker %d declared tensor '%s' twice: as %s[%llu] "
					"and now as %s[%zu]", wk.rank, name, unisum_dtype_name(t->dtype),
					(unsigned long long)t->count, unisum_dtype_name(dtype), count);
		return i;
	}
	pthread_mutex_unlock(&wk.lock);

	struct wk_tensor *t = calloc(1, sizeof *t);
	if (t == NULL)
		return UNISUM_ENOMEM;
	snprintf(t->name, sizeof t->name, "%s", name);
	t->dtype = dtype;
	t->count = count;
	t->esize = esize;
	t->priority = priority;
	t->cuts = calloc(1, sizeof *t->cuts);
	int rc = t->cuts == NULL ? UNISUM_ENOMEM : wk_cut(t, name, wk.cfg.partition_bytes, &t->cuts[0]);
	if (rc != 0)
		goto out_free;
	t->ncuts = 1;
	bool filed;
	rc = wk_tensor_insert(t, &filed);
	if (!filed)
		goto out_free;	/* failed, or another thread declared it meanwhile */
	trace_name_tensor(rc, t->name, t->cuts[0].nparts);
	return rc;

out_free:
	if (t->cuts != NULL) {
		free(t->cuts[0].parts);
		free(t->cuts[0].servers);
	}
	free(t->cuts);
	free(t);
	return rc;
}

/* Starts an operation: `in` NULL means "contribute zeros" (broadcast from
 * another root).  wire_op is the collective (WIRE_OP()): every worker of
 * the round must start the same one, or the round fails on all of them.
 * Never waits on the network: under autotune an operation whose cut is
 * not ready goes to wk_tune_main. */
static int wk_start(int tensor, const void *in, void *out, int flags, uint32_t wire_op,
		    unisum_handle *h)
{
	if (!wk.initialized)
		return wk_require_init();
	if (h == NULL || out == NULL || (flags & ~UNISUM_AVERAGE) != 0)
		return log_fail(UNISUM_EINVAL, "unisum_push_pull: out and the handle must not be NULL and "
				"flags may only hold UNISUM_AVERAGE (worker %d, tensor %d)", wk.rank, tensor);
	struct wk_op *op = calloc(1, sizeof *op);
	if (op == NULL)
		return UNISUM_ENOMEM;

	pthread_mutex_lock(&wk.lock);
	int rc = 0;
	if (wk.failed != 0) {
		rc = log_fail(wk.failed, "worker %d: the job has failed: %s", wk.rank, wk.failed_why);
		goto out_unlock;
	}
	if (tensor < 0 || tensor >= wk.ntensors || wk.tensors[tensor] == NULL) {
		rc = log_fail(UNISUM_EINVAL, "worker %d: tensor id %d was never declared, or was "
			      "undeclared; call unisum_declare() first", wk.rank, tensor);
		goto out_unlock;
	}
	struct wk_tensor *t = wk.tensors[tensor];
	if (t->busy) {
		rc = log_fail(UNISUM_EBUSY, "worker %d: tensor '%s' already has a push_pull in flight; wait "
			      "for it before starting the next", wk.rank, t->name);
		goto out_unlock;
	}
	if (wk.nops == wk.capops) {
		int cap = wk.capops ? wk.capops * 2 : 64;
		struct wk_op **no = realloc(wk.ops, (size_t)cap * sizeof *no);
		if (no == NULL) {
			rc = UNISUM_ENOMEM;
			goto out_unlock;
		}
		wk.ops = no;
		wk.capops = cap;
	}
	*op = (struct wk_op){.handle = ++wk.next_handle, .t = t, .flags = flags, .round = t->round++,
			     .in = in, .out = out, .wire_op = wire_op};
	t->busy = true;
	op->traced = trace_wants(op->round);
	op->t_start = op->traced ? trace_now_us() : 0;
	wk.ops[wk.nops++] = op;
	*h = op->handle;
	pthread_mutex_unlock(&wk.lock);

	/* The cut of this round: the declared one, or autotune's for its epoch. */
	const struct wk_layout *L = &t->cuts[0];
	if (wk.cfg.autotune) {
		if (wk.rank == 0)
			tune_saw_round(wk.tuner, op->round);
		L = wk_tuned_cut(op, false, &rc);
		if (L == NULL && rc == 0 && !wk.tune_started)
			L = wk_tuned_cut(op, true, &rc);	/* no thread to wait on */
		if (L == NULL && rc != 0) {
			wk_op_fail(op, rc, log_last_error());
			return 0;
		}
		if (L == NULL) {
			pthread_mutex_lock(&wk.lock);
			if (wk.tune_tail != NULL)
				wk.tune_tail->tune_next = op;
			else
				wk.tune_head = op;
			wk.tune_tail = op;
			pthread_cond_signal(&wk.tune_cond);
			pthread_mutex_unlock(&wk.lock);
			return 0;
		}
	}
	wk_launch(op, L);
	return 0;

out_unlock:
	pthread_mutex_unlock(&wk.lock);
	free(op);
	return rc;
}

int unisum_push_pull_async(int tensor, const void *in, void *out, int flags, unisum_handle *h)
{
	if (in == NULL)
		return log_fail(UNISUM_EINVAL, "unisum_push_pull: in must not be NULL (tensor %d)", tensor);
	uint32_t wire_op = WIRE_OP((flags & UNISUM_AVERAGE) ? WIRE_OP_AVERAGE : WIRE_OP_SUM, 0);
	return wk_start(tensor, in, out, flags, wire_op, h);
}

/* Finds an unreleased operation; call with wk.lock held. */
static int wk_find_op(unisum_handle h)
{
	for (int i = 0; i < wk.nops; i++)
		if (wk.ops[i]->handle == h)
			return i;
	return -1;
}

/* Releases a completed operation and returns its status; wk.lock held. */
static int wk_release(int i)
{
	struct wk_op *op = wk.ops[i];
	wk.ops[i] = wk.ops[--wk.nops];
	int rc = op->error;
	char quoted[260];
	snprintf(quoted, sizeof quoted, "'%s'", op->t->name);
	if (rc != 0 && strstr(op->why, quoted) != NULL)
		log_fail(rc, "worker %d: %s", wk.rank, op->why);	/* it names the tensor */
	else if (rc != 0)
		log_fail(rc, "worker %d, tensor '%s': %s", wk.rank, op->t->name, op->why);
	free(op);
	return rc;
}

int unisum_poll_timeout(unisum_handle h, int timeout_ms)
{
	if (!wk.initialized)
		return wk_require_init();
	if (timeout_ms < 0)
		return log_fail(UNISUM_EINVAL, "unisum_poll_timeout: timeout_ms must not be negative, "
				"got %d", timeout_ms);
	struct timespec until = timing_deadline(timeout_ms);
	pthread_mutex_lock(&wk.lock);
	int i = wk_find_op(h), rc;
	if (i < 0) {
		rc = log_fail(UNISUM_EINVAL, "unisum_poll: unknown or already released handle %lld",
			      (long long)h);
	} else {
		struct wk_op *op = wk.ops[i];
		int timed_out = 0;
		while (!op->done && timeout_ms > 0 && !timed_out)
			timed_out = pthread_cond_timedwait(&wk.done_cond, &wk.lock, &until);
		if (!op->done) {
			rc = 0;
		} else {
			rc = wk_release(wk_find_op(h));
			if (rc == 0)
				rc = 1;
		}
	}
	pthread_mutex_unlock(&wk.lock);
	return rc;
}

int unisum_poll(unisum_handle h)
{
	return unisum_poll_timeout(h, 0);
}

int unisum_wait(unisum_handle h)
{
	if (!wk.initialized)
		return wk_require_init();
	pthread_mutex_lock(&wk.lock);
	int i = wk_find_op(h), rc;
	if (i < 0) {
		rc = log_fail(UNISUM_EINVAL, "unisum_wait: unknown or already released handle %lld",
			      (long long)h);
	} else {
		struct wk_op *op = wk.ops[i];
		while (!op->done)
			pthread_cond_wait(&wk.done_cond, &wk.lock);
		rc = wk_release(wk_find_op(h));
	}
	pthread_mutex_unlock(&wk.lock);
	return rc;
}

int unisum_push_pull(int tensor, const void *in, void *out, int flags)
{
	unisum_handle h;
	int rc = unisum_push_pull_async(tensor, in, out, flags, &h);
	return rc != 0 ? rc : unisum_wait(h);
}

int unisum_broadcast_async(int tensor, void *buf, int root_rank, unisum_handle *h)
{
	if (!wk.initialized)
		return wk_require_init();
	if (buf == NULL || root_rank < 0 || root_rank >= wk.size)
		return log_fail(UNISUM_EINVAL, "unisum_broadcast: buf must not be NULL and root_rank %d "
				"must be in [0, %d) (worker %d, tensor %d)", root_rank, wk.size, wk.rank,
				tensor);
	return wk_start(tensor, wk.rank == root_rank ? buf : NULL, buf, 0,
			WIRE_OP(WIRE_OP_BROADCAST, (uint32_t)root_rank), h);
}

int unisum_broadcast(int tensor, void *buf, int root_rank)
{
	unisum_handle h;
	int rc = unisum_broadcast_async(tensor, buf, root_rank, &h);
	return rc != 0 ? rc : unisum_wait(h);
}

int unisum_undeclare(int tensor)
{
	if (!wk.initialized)
		return wk_require_init();
	pthread_mutex_lock(&wk.lock);
	struct wk_tensor *t = tensor >= 0 && tensor < wk.ntensors ? wk.tensors[tensor] : NULL;
	int rc = 0;
	if (t == NULL) {
		rc = log_fail(UNISUM_EINVAL, "unisum_undeclare: worker %d has no tensor id %d (never "
			      "declared, or undeclared already)", wk.rank, tensor);
		goto out_unlock;
	}
	bool held = t->busy;
	for (int i = 0; i < wk.nops && !held; i++)
		held = wk.ops[i]->t == t;
	if (held) {
		rc = log_fail(UNISUM_EBUSY, "unisum_undeclare: worker %d, tensor '%s' has an operation "
			      "not yet waited for; wait for its handle first", wk.rank, t->name);
		goto out_unlock;
	}
	wk.tensors[tensor] = NULL;
	pthread_mutex_unlock(&wk.lock);
	/* Each cut is its own declaration: every place that holds it lets
	 * go.  Nothing is in flight, so the servers' replies are all here. */
	wk_retire_cuts(t, NULL);
	for (int c = 0; c < t->ncuts; c++) {
		if (wk.local)
			local_forget(t->cuts[c].key);
		rdv_client_forget(wk.rdv, t->cuts[c].key);
	}
	wk_tensor_free(t);
	return 0;

out_unlock:
	pthread_mutex_unlock(&wk.lock);
	return rc;
}

int unisum_get_stats(unisum_stats *out)
{
	if (!wk.initialized)
		return wk_require_init();
	if (out == NULL)
		return log_fail(UNISUM_EINVAL, "unisum_get_stats: out must not be NULL");
	struct sched_stats st;
	sched_stats(&wk.push_q, &st);
	uint64_t pbytes = tune_partition_bytes(wk.tuner);
	*out = (unisum_stats){.credit_bytes = st.credit, .partition_bytes = pbytes,
			      .max_inflight_bytes = st.max_inflight, .partitions_sent = st.taken};
	return 0;
}

void *unisum_alloc(size_t bytes)
{
	pthread_mutex_lock(&wk.lock);
	bool local = wk.initialized && wk.local;
	pthread_mutex_unlock(&wk.lock);
	void *p = local ? local_alloc(bytes) : NULL;
	if (p == NULL) {
		size_t round = bytes == 0 ? 64 : (bytes + 63) & ~(size_t)63;
		p = round < bytes ? NULL : aligned_alloc(64, round);
	}
	return p;
}

void unisum_free(void *p)
{
	if (p != NULL && !local_free(p))
		free(p);
}

int unisum_barrier_timeout(int timeout_ms)
{
	if (!wk.initialized)
		return wk_require_init();
	if (timeout_ms < 0)
		return log_fail(UNISUM_EINVAL, "unisum_barrier_timeout: timeout_ms must not be negative, "
				"got %d", timeout_ms);
	int rc = rdv_client_barrier_wait(wk.rdv, RDV_GROUP_WORKERS, timeout_ms);
	if (rc < 0)
		return log_fail(rc, "unisum_barrier on worker %d: %s", wk.rank, log_last_error());
	return rc;
}

int unisum_barrier(void)
{
	if (!wk.initialized)
		return wk_require_init();
	int rc = rdv_client_barrier(wk.rdv, RDV_GROUP_WORKERS);
	if (rc != 0)
		return log_fail(rc, "unisum_barrier on worker %d: %s", wk.rank, log_last_error());
	return 0;
}
