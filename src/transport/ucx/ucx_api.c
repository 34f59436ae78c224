/*
 * ucx_api.c - UCX loaded at run time, the process's UCP worker and the
 * thread that progresses it, and the endpoint table (see ucx_int.h).
 *
 * DESIGN.  libucp is opened with dlopen() the first time a listener or a
 * connection needs it, so the library and the CLI carry no dependency on
 * it: a machine without UCX runs TCP, and only asking for UCX fails,
 * saying why.  One UCP context and one worker serve the whole process
 * (thread mode SINGLE), and one thread, "unisum-ucx", progresses it: it sleeps in poll() on the
 * worker's event descriptor (ucp_worker_arm), never spinning, and runs
 * the callbacks that move messages into the connections' queues.  The
 * last reference stops it and UCX.
 */
#include <dlfcn.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "log/log.h"
#include "timing/timing.h"
#include "transport/ucx/ucx_int.h"
#include "unisum.h"

struct ucx_api ucx_fn;

static pthread_mutex_t ucx_lock = PTHREAD_MUTEX_INITIALIZER;	/* everything below */
static void *ucx_dl;
static struct ucx_ctx ucx_the;
static int ucx_refs;
static bool ucx_forked;		/* a child of a process whose UCX had started */

/* Opens libucp and finds its functions once: 0, or -1 with why. */
static int ucx_load(char *why, size_t len)
{
	if (ucx_dl != NULL)
		return 0;
	void *h = dlopen("libucp.so.0", RTLD_NOW | RTLD_GLOBAL);
	if (h == NULL) {
		snprintf(why, len, "UCX is not installed here (libucp.so.0: %s; Debian's package "
			 "is libucx0)", dlerror());
		return -1;
	}
#define UCX_FIND(name)                                                                  \
	if ((*(void **)&ucx_fn.name = dlsym(h, #name)) == NULL) {                           \
		snprintf(why, len, "libucp.so.0 lacks %s: UCX 1.13 or newer is needed", #name); \
		dlclose(h);                                                                     \
		return -1;                                                                      \
	}
	UCX_SYMBOLS(UCX_FIND)
#undef UCX_FIND
	ucx_dl = h;
	return 0;
}

/* Runs the commands posted so far: whether there were any. */
static bool ucx_run_cmds(struct ucx_ctx *u)
{
	pthread_mutex_lock(&u->cmd_lock);
	struct ucx_cmd *list = u->cmds;
	u->cmds = NULL;
	u->cmds_tail = &u->cmds;
	uint64_t n;
	if (u->cmd_signaled && read(u->cmd_fd, &n, sizeof n) == sizeof n)
		u->cmd_signaled = false;
	pthread_mutex_unlock(&u->cmd_lock);
	bool any = list != NULL;
	while (list != NULL) {
		struct ucx_cmd *cmd = list;
		list = cmd->next;
		bool sync = cmd->sync;	/* an async one may be freed by fn */
		cmd->fn(cmd);
		if (sync) {
			pthread_mutex_lock(&u->cmd_lock);
			cmd->done = true;
			pthread_cond_broadcast(&u->cmd_done);
			pthread_mutex_unlock(&u->cmd_lock);
		}
	}
	return any;
}

static _Thread_local bool ucx_on_thread;

/* A bounded turn of progress on w: whether it had anything to do. */
static bool ucx_progress_turn(ucp_worker_h w)
{
	bool busy = false;
	for (int i = 0; i < 64 && ucx_fn.ucp_worker_progress(w) != 0; i++)
		busy = true;
	return busy;
}

/* Sleeps until a worker or a command has something (at most 1 s), unless
 * one is busy already: every worker is armed first. */
static void ucx_sleep(struct ucx_ctx *u)
{
	if (ucx_fn.ucp_worker_arm(u->worker) == UCS_ERR_BUSY)
		return;
	for (size_t i = 0; i < u->ndial; i++)
		if (ucx_fn.ucp_worker_arm(u->dial[i]) == UCS_ERR_BUSY)
			return;
	struct pollfd fixed[16], *p = fixed;
	size_t all = u->nwatch + u->ndial + 2, n = all;
	if (n > 16 && (p = malloc(n * sizeof *p)) == NULL) {
		p = fixed;
		n = 2;	/* (then a 10 ms nap: the others go unwatched) */
	}
	p[0] = (struct pollfd){.fd = u->efd, .events = POLLIN};
	p[1] = (struct pollfd){.fd = u->cmd_fd, .events = POLLIN};
	for (size_t i = 2; i < n; i++)
		p[i] = (struct pollfd){.fd = i - 2 < u->nwatch ? u->watch[i - 2].fd
							    : u->dial_efd[i - 2 - u->nwatch],
				       .events = POLLIN};
	poll(p, n, n == all ? 1000 : 10);
	if (p != fixed)
		free(p);
}

/* Serves the descriptors watched (ucx_watch) that are readable, at once
 * when asleep, else every few milliseconds, so that a stream of arrivals
 * does not starve them; and each of them once a second all the same (a
 * listener's timeouts). */
static void ucx_serve_watches(struct ucx_ctx *u, bool slept)
{
	static _Thread_local int64_t last, tick;
	int64_t now = timing_now_ms();
	if (u->nwatch == 0 || (!slept && now - last < 5))
		return;
	last = now;
	bool all = now - tick >= 1000;
	if (all)
		tick = now;
	for (size_t i = 0; i < u->nwatch; i++) {
		struct pollfd p = {.fd = u->watch[i].fd, .events = POLLIN};
		if (all || poll(&p, 1, 0) == 1)
			u->watch[i].fn(u->watch[i].arg);
	}
}

static void *ucx_progress_main(void *arg)
{
	struct ucx_ctx *u = arg;
	ucx_on_thread = true;
	pthread_setname_np(pthread_self(), "unisum-ucx");
	while (!atomic_load(&u->stop)) {
		bool busy = ucx_run_cmds(u);
		/* Bounded turns, so that a stream of arrivals does not hold
		 * back the commands (sends, receives, closes). */
		busy = ucx_progress_turn(u->worker) || busy;
		for (size_t i = 0; i < u->ndial; i++)
			busy = ucx_progress_turn(u->dial[i]) || busy;
		pthread_mutex_lock(&u->cmd_lock);
		busy = busy || u->cmds != NULL;	/* posted from this thread's callbacks */
		pthread_mutex_unlock(&u->cmd_lock);
		if (!busy)
			ucx_sleep(u);
		ucx_serve_watches(u, !busy);
	}
	ucx_run_cmds(u);
	return NULL;
}

void ucx_post(struct ucx_ctx *u, struct ucx_cmd *cmd)
{
	cmd->next = NULL;
	if (!u->started)
		return;	/* a parent's object, in a child of fork(): nothing to do */
	pthread_mutex_lock(&u->cmd_lock);
	*u->cmds_tail = cmd;
	u->cmds_tail = &cmd->next;
	uint64_t one = 1;
	if (!u->cmd_signaled && !ucx_on_thread && write(u->cmd_fd, &one, sizeof one) == sizeof one)
		u->cmd_signaled = true;
	pthread_mutex_unlock(&u->cmd_lock);
}

void ucx_run(struct ucx_ctx *u, struct ucx_cmd *cmd)
{
	if (!u->started)
		return;	/* (see ucx_post) */
	if (ucx_on_thread) {
		cmd->fn(cmd);
		return;
	}
	cmd->sync = true;
	cmd->done = false;
	ucx_post(u, cmd);
	pthread_mutex_lock(&u->cmd_lock);
	while (!cmd->done)
		pthread_cond_wait(&u->cmd_done, &u->cmd_lock);
	pthread_mutex_unlock(&u->cmd_lock);
}

/* Where this machine has no RDMA device, UCX's links are TCP (or its
 * shared memory), and unless the user set UCX_RNDV_THRESH messages under
 * UCX_TCP_RNDV go eagerly: a rendezvous's handshake waits behind the
 * data queued on the link.  Measured on the emulated cluster (n = 4,
 * k = 2, 1 Gbit/s, fit mode's partitions of at most 1 MiB), UCX over TCP
 * reached 0.75 of unisum's TCP with UCX's own threshold (rendezvous) and
 * 0.97 all eager; on loopback, 4 MiB partitions, rendezvous saves two
 * copies (64 MiB: 0.12 s a round against 0.18 eagerly), so larger
 * messages keep it.  With an RDMA device UCX's own estimate stands. */
#define UCX_TCP_RNDV "2m"

/* Whether UCX's configuration (its variables or its configuration files)
 * holds name=value: a setting of UCX's own default, which unisum may
 * change; one the user set stands. */
static bool ucx_config_holds(const ucp_config_t *config, const char *name, const char *value)
{
	char *buf = NULL, want[128];
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	if (f == NULL)
		return false;
	ucx_fn.ucp_config_print(config, f, NULL, UCS_CONFIG_PRINT_CONFIG);
	fclose(f);
	snprintf(want, sizeof want, "\n%s=%s\n", name, value);
	bool holds = buf != NULL && (strstr(buf, want) != NULL ||
				     strncmp(buf, want + 1, strlen(want + 1)) == 0);
	free(buf);
	return holds;
}

static void ucx_tune(ucp_config_t *config)
{
	/* Every endpoint has peer error handling, which UCX's shared-memory
	 * message transports lack, so they are never chosen; left out unless
	 * UCX_TLS is set (its variable or UCX's configuration files), they
	 * save each worker (one a dial) their segments: 46 MB against 9 MB of
	 * a worker process with 8 servers. */
	if (ucx_config_holds(config, "UCX_TLS", "all") &&
	    ucx_fn.ucp_config_modify(config, "TLS", "^posix,sysv") != UCS_OK)
		LOG_WARN("UCX: cannot leave its shared-memory transports out; they stay");
	if (!ucx_config_holds(config, "UCX_RNDV_THRESH", "auto") ||
	    access("/sys/class/infiniband", F_OK) == 0)
		return;
	if (ucx_fn.ucp_config_modify(config, "RNDV_THRESH", UCX_TCP_RNDV) != UCS_OK)
		LOG_WARN("UCX: cannot set its rendezvous threshold to %s; its own stands", UCX_TCP_RNDV);
}

/* Makes a worker of u's context, which calls ucx_on_am with itself for
 * every active message: 0, or -1 with why. */
static int ucx_worker_make(struct ucx_ctx *u, ucp_worker_h *out, int *efd, char *why, size_t len)
{
	ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
				  .thread_mode = UCS_THREAD_MODE_SINGLE};
	ucp_worker_h w = NULL;
	const char *step = "ucp_worker_create";
	ucs_status_t st = ucx_fn.ucp_worker_create(u->context, &wp, &w);
	if (st == UCS_OK) {
		ucp_am_handler_param_t am = {
			.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
				      UCP_AM_HANDLER_PARAM_FIELD_FLAGS | UCP_AM_HANDLER_PARAM_FIELD_ARG,
			.id = UCX_AM_ID, .cb = ucx_on_am, .flags = UCP_AM_FLAG_WHOLE_MSG, .arg = w};
		if ((step = "ucp_worker_get_efd", st = ucx_fn.ucp_worker_get_efd(w, efd)) == UCS_OK &&
		    (step = "ucp_worker_set_am_recv_handler",
		     st = ucx_fn.ucp_worker_set_am_recv_handler(w, &am)) == UCS_OK) {
			*out = w;
			return 0;
		}
		ucx_fn.ucp_worker_destroy(w);
	}
	snprintf(why, len, "UCX would not start (%s): %s", step, ucx_fn.ucs_status_string(st));
	return -1;
}

/* Starts the context, the worker and its thread: 0, or -1 with why. */
static int ucx_start(struct ucx_ctx *u, char *why, size_t len)
{
	ucp_config_t *config;
	ucs_status_t st = ucx_fn.ucp_config_read(NULL, NULL, &config);
	if (st != UCS_OK) {
		snprintf(why, len, "UCX's configuration (UCX_* variables): %s",
			 ucx_fn.ucs_status_string(st));
		return -1;
	}
	ucx_tune(config);
	ucp_params_t p = {.field_mask = UCP_PARAM_FIELD_FEATURES,
			  .features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP};
	st = ucx_fn.ucp_init_version(UCP_API_MAJOR, UCP_API_MINOR, &p, config, &u->context);
	ucx_fn.ucp_config_release(config);
	if (st != UCS_OK) {
		snprintf(why, len, "UCX would not start (ucp_init): %s", ucx_fn.ucs_status_string(st));
		return -1;
	}
	if (ucx_worker_make(u, &u->worker, &u->efd, why, len) == 0) {
		atomic_store(&u->stop, false);
		u->started = true;
		u->cmds_tail = &u->cmds;
		u->cmd_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
		pthread_mutex_init(&u->cmd_lock, NULL);
		pthread_cond_init(&u->cmd_done, NULL);
		int rc = u->cmd_fd < 0 ? errno : pthread_create(&u->thread, NULL, ucx_progress_main, u);
		if (rc == 0)
			return 0;
		if (u->cmd_fd >= 0)
			close(u->cmd_fd);
		pthread_mutex_destroy(&u->cmd_lock);
		pthread_cond_destroy(&u->cmd_done);
		snprintf(why, len, "cannot start UCX's thread: %s", strerror(rc));
		ucx_fn.ucp_worker_destroy(u->worker);
	}
	ucx_fn.ucp_cleanup(u->context);
	memset(u, 0, sizeof *u);
	return -1;
}

static void ucx_forget_in_child(void);
static void ucx_orphans_drop(void);

int ucx_loadable(char *why, size_t len)
{
	pthread_mutex_lock(&ucx_lock);
	int rc = ucx_load(why, len);
	pthread_mutex_unlock(&ucx_lock);
	return rc;
}

struct ucx_ctx *ucx_ctx_get(char *why, size_t len)
{
	static pthread_once_t once = PTHREAD_ONCE_INIT;
	pthread_once(&once, ucx_forget_in_child);
	pthread_mutex_lock(&ucx_lock);
	struct ucx_ctx *u = &ucx_the;
	if (ucx_forked) {
		snprintf(why, len, "UCX was running in this process's parent, and it does not live "
			 "through fork(): start the process with exec, or use UCX only after the fork");
		u = NULL;
	} else if (ucx_refs == 0 && (ucx_load(why, len) != 0 || ucx_start(u, why, len) != 0)) {
		u = NULL;
	}
	else
		ucx_refs++;
	pthread_mutex_unlock(&ucx_lock);
	return u;
}

void ucx_ctx_put(struct ucx_ctx *u)
{
	if (u == NULL)
		return;
	pthread_mutex_lock(&ucx_lock);
	if (--ucx_refs == 0) {
		atomic_store(&u->stop, true);
		uint64_t one = 1;
		if (write(u->cmd_fd, &one, sizeof one) != sizeof one)
			LOG_WARN("UCX: cannot wake its thread to stop it: %s", strerror(errno));
		pthread_join(u->thread, NULL);
		ucx_orphans_drop();
		ucx_fn.ucp_worker_destroy(u->worker);
		free(u->dial);
		free(u->dial_efd);
		free(u->watch);
		ucx_fn.ucp_cleanup(u->context);
		close(u->cmd_fd);
		pthread_mutex_destroy(&u->cmd_lock);
		pthread_cond_destroy(&u->cmd_done);
		memset(u, 0, sizeof *u);
	}
	pthread_mutex_unlock(&ucx_lock);
}

/* ---- the endpoint table ---------------------------------------------------- */

/* Open addressing on the endpoint's address; small (a process holds a few
 * thousand connections at most), grown at half full. */
struct ucx_slot {
	ucp_ep_h ep;			/* NULL: empty; UCX_GONE: deleted */
	struct tp_conn *c;
};
#define UCX_GONE ((ucp_ep_h)(uintptr_t)1)
#define UCX_ORPHAN_MS 30000

static pthread_mutex_t map_lock = PTHREAD_MUTEX_INITIALIZER;
static struct ucx_slot *map;
static size_t map_cap, map_used;
static struct ucx_msg *orphans;

static size_t map_hash(ucp_ep_h ep, size_t cap)
{
	uint64_t x = (uint64_t)(uintptr_t)ep;
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdULL;
	x ^= x >> 33;
	return (size_t)x & (cap - 1);
}

static struct ucx_slot *map_slot(ucp_ep_h ep)
{
	for (size_t i = map_hash(ep, map_cap), n = 0; n < map_cap; i = (i + 1) & (map_cap - 1), n++) {
		if (map[i].ep == ep)
			return &map[i];
		if (map[i].ep == NULL)
			return NULL;
	}
	return NULL;
}

/* Rebuilds the table at cap (deleted slots dropped): 0 or -1. */
static int map_grow(size_t cap)
{
	struct ucx_slot *old = map, *nu = calloc(cap, sizeof *nu);
	if (nu == NULL)
		return -1;
	size_t old_cap = map_cap;
	map = nu;
	map_cap = cap;
	map_used = 0;
	for (size_t i = 0; i < old_cap; i++)
		if (old[i].ep != NULL && old[i].ep != UCX_GONE) {
			size_t j = map_hash(old[i].ep, cap);
			while (map[j].ep != NULL)
				j = (j + 1) & (cap - 1);
			map[j] = old[i];
			map_used++;
		}
	free(old);
	return 0;
}

/* The orphans left when UCX stops: their descriptors go with its worker
 * (the thread has stopped: released there, not posted). */
static void ucx_orphans_drop(void)
{
	pthread_mutex_lock(&map_lock);
	while (orphans != NULL) {
		struct ucx_msg *o = orphans;
		orphans = o->next;
		if (o->how == UCX_DATA_KEPT || (o->how == UCX_DATA_RNDV && !o->posted))
			ucx_fn.ucp_am_data_release(o->worker, o->data);
		free(o);
	}
	pthread_mutex_unlock(&map_lock);
}

/* The orphans that worker w received, released before w goes (on the
 * UCX thread). */
static void ucx_orphans_drop_of(ucp_worker_h w)
{
	pthread_mutex_lock(&map_lock);
	for (struct ucx_msg **p = &orphans; *p != NULL;) {
		struct ucx_msg *o = *p;
		if (o->worker != w) {
			p = &o->next;
			continue;
		}
		*p = o->next;
		if (o->how == UCX_DATA_KEPT || (o->how == UCX_DATA_RNDV && !o->posted))
			ucx_fn.ucp_am_data_release(w, o->data);
		free(o);
	}
	pthread_mutex_unlock(&map_lock);
}

void ucx_map_add(ucp_ep_h ep, struct tp_conn *c)
{
	pthread_mutex_lock(&map_lock);
	if ((map_used + 1) * 2 > map_cap && map_grow(map_cap ? map_cap * 2 : 64) != 0 &&
	    map_used + 1 >= map_cap) {
		pthread_mutex_unlock(&map_lock);
		LOG_ERROR("the UCX transport is out of memory for its endpoint table: %p unknown",
			  (void *)ep);
		return;
	}
	size_t i = map_hash(ep, map_cap);
	while (map[i].ep != NULL && map[i].ep != UCX_GONE)
		i = (i + 1) & (map_cap - 1);
	map[i] = (struct ucx_slot){ep, c};
	map_used++;
	pthread_mutex_unlock(&map_lock);
}

void ucx_map_del(ucp_ep_h ep)
{
	pthread_mutex_lock(&map_lock);
	struct ucx_slot *s = map_cap ? map_slot(ep) : NULL;
	if (s != NULL)
		s->ep = UCX_GONE, s->c = NULL;
	pthread_mutex_unlock(&map_lock);
}

struct tp_conn *ucx_map_find_or_park(ucp_ep_h ep, struct ucx_msg *m)
{
	pthread_mutex_lock(&map_lock);
	struct ucx_slot *s = map_cap ? map_slot(ep) : NULL;
	struct tp_conn *c = s != NULL ? s->c : NULL;
	if (c == NULL && m != NULL) {
		/* Its connection is being made on another thread; one
		 * never made (its maker failed) expires. */
		int64_t now = timing_now_ms();
		for (struct ucx_msg **p = &orphans; *p != NULL;) {
			struct ucx_msg *o = *p;
			if (now - o->at_ms > UCX_ORPHAN_MS) {
				*p = o->next;
				ucx_msg_free(o);
			} else {
				p = &o->next;
			}
		}
		m->ep = ep;
		m->at_ms = now;
		m->next = orphans;
		orphans = m;
	}
	pthread_mutex_unlock(&map_lock);
	return c;
}

void ucx_map_adopt(ucp_ep_h ep, struct tp_conn *c,
		   void (*deliver)(struct tp_conn *c, struct ucx_msg *m))
{
	pthread_mutex_lock(&map_lock);
	struct ucx_msg *mine = NULL;
	for (struct ucx_msg **p = &orphans; *p != NULL;) {
		struct ucx_msg *o = *p;
		if (o->ep == ep) {
			*p = o->next;
			o->next = mine;
			mine = o;
		} else {
			p = &o->next;
		}
	}
	/* The list holds them newest first, so mine has them in the order
	 * they came. */
	while (mine != NULL) {
		struct ucx_msg *next = mine->next;
		mine->next = NULL;
		deliver(c, mine);
		mine = next;
	}
	pthread_mutex_unlock(&map_lock);
}

/* A child of fork() has none of its parent's threads, so none of its
 * UCX, and UCX's own state (its async thread, its memory hooks) does not
 * live through fork: a child whose parent had started UCX refuses it
 * (ucx_forked); the parent's objects it holds do nothing (ucx_post).  One
 * whose parent had not starts its own. */
static void ucx_child(void)
{
	pthread_mutex_init(&ucx_lock, NULL);
	pthread_mutex_init(&map_lock, NULL);
	ucx_forked = ucx_forked || ucx_the.worker != NULL;
	memset(&ucx_the, 0, sizeof ucx_the);
	ucx_refs = 0;
	map = NULL;
	map_cap = map_used = 0;
	orphans = NULL;
}

static void ucx_forget_in_child(void)
{
	pthread_atfork(NULL, NULL, ucx_child);
}

/* Whether w is one of u's workers still (the UCX thread's). */
static bool ucx_worker_alive(const struct ucx_ctx *u, ucp_worker_h w)
{
	for (size_t i = 0; i < u->ndial; i++)
		if (u->dial[i] == w)
			return true;
	return w == u->worker;
}

static void ucx_do_release(struct ucx_cmd *cmd)
{
	struct ucx_msg *m = (struct ucx_msg *)((char *)cmd - offsetof(struct ucx_msg, cmd));
	/* (An orphan that expired may have been posted after its dial's
	 * worker was: that worker's end took its data.) */
	if (ucx_worker_alive(&ucx_the, m->worker))
		ucx_fn.ucp_am_data_release(m->worker, m->data);
	free(m);
}

void ucx_msg_free(struct ucx_msg *m)
{
	if (m == NULL)
		return;
	if (m->how == UCX_DATA_KEPT || (m->how == UCX_DATA_RNDV && !m->posted)) {
		m->cmd.fn = ucx_do_release;
		ucx_post(&ucx_the, &m->cmd);
		return;
	}
	free(m);
}

/* ---- the dialled connections' workers ------------------------------------ */

struct ucx_worker_cmd {
	struct ucx_cmd cmd;
	struct ucx_ctx *u;
	ucp_worker_h w;
	void *buf;
	size_t cap, len;
	int rc;
	char *why;
	size_t why_len;
};

static void ucx_do_worker_new(struct ucx_cmd *cmd)
{
	struct ucx_worker_cmd *c = (struct ucx_worker_cmd *)cmd;
	struct ucx_ctx *u = c->u;
	c->rc = -1;
	if (u->ndial == u->dial_cap) {
		size_t cap = u->dial_cap ? u->dial_cap * 2 : 16;
		ucp_worker_h *d = realloc(u->dial, cap * sizeof *d);
		if (d != NULL)
			u->dial = d;
		int *e = d != NULL ? realloc(u->dial_efd, cap * sizeof *e) : NULL;
		if (e == NULL) {
			snprintf(c->why, c->why_len, "out of memory for a UCX worker");
			return;
		}
		u->dial_efd = e;
		u->dial_cap = cap;
	}
	int efd;
	if (ucx_worker_make(u, &c->w, &efd, c->why, c->why_len) != 0)
		return;
	u->dial[u->ndial] = c->w;
	u->dial_efd[u->ndial++] = efd;
	c->rc = 0;
}

int ucx_worker_new(struct ucx_ctx *u, ucp_worker_h *out, char *why, size_t len)
{
	struct ucx_worker_cmd c = {.cmd.fn = ucx_do_worker_new, .u = u, .why = why, .why_len = len};
	ucx_run(u, &c.cmd);
	if (!u->started)
		snprintf(why, len, "UCX is not running in this process");
	if (c.rc == 0)
		*out = c.w;
	return u->started ? c.rc : -1;
}

static void ucx_do_worker_free(struct ucx_cmd *cmd)
{
	struct ucx_worker_cmd *c = (struct ucx_worker_cmd *)cmd;
	struct ucx_ctx *u = c->u;
	for (size_t i = 0; i < u->ndial; i++)
		if (u->dial[i] == c->w) {
			u->dial[i] = u->dial[--u->ndial];
			u->dial_efd[i] = u->dial_efd[u->ndial];
			break;
		}
	ucx_orphans_drop_of(c->w);
	ucx_fn.ucp_worker_destroy(c->w);
	free(c);
}

void ucx_worker_free(struct ucx_ctx *u, ucp_worker_h w)
{
	struct ucx_worker_cmd *c = calloc(1, sizeof *c);
	if (c == NULL) {
		LOG_ERROR("UCX: out of memory to free a connection's worker; it is kept");
		return;
	}
	c->cmd.fn = ucx_do_worker_free;
	c->u = u;
	c->w = w;
	ucx_post(u, &c->cmd);
}

static void ucx_do_worker_address(struct ucx_cmd *cmd)
{
	struct ucx_worker_cmd *c = (struct ucx_worker_cmd *)cmd;
	ucp_address_t *a;
	size_t n;
	if (ucx_fn.ucp_worker_get_address(c->w, &a, &n) != UCS_OK)
		return;
	if (n <= c->cap) {
		memcpy(c->buf, a, n);
		c->len = n;
	}
	ucx_fn.ucp_worker_release_address(c->w, a);
}

size_t ucx_worker_address(struct ucx_ctx *u, ucp_worker_h w, void *buf, size_t cap)
{
	struct ucx_worker_cmd c = {.cmd.fn = ucx_do_worker_address, .u = u, .w = w, .buf = buf,
				   .cap = cap};
	ucx_run(u, &c.cmd);
	return c.len;
}

/* ---- descriptors the UCX thread serves -------------------------------------- */

struct ucx_watch_cmd {
	struct ucx_cmd cmd;
	struct ucx_ctx *u;
	struct ucx_watch w;
	int rc;
};

static void ucx_do_watch(struct ucx_cmd *cmd)
{
	struct ucx_watch_cmd *c = (struct ucx_watch_cmd *)cmd;
	struct ucx_ctx *u = c->u;
	if (c->w.fn == NULL) {
		for (size_t i = 0; i < u->nwatch; i++)
			if (u->watch[i].fd == c->w.fd)
				u->watch[i] = u->watch[--u->nwatch];
		return;
	}
	if (u->nwatch == u->watch_cap) {
		size_t cap = u->watch_cap ? u->watch_cap * 2 : 8;
		struct ucx_watch *w = realloc(u->watch, cap * sizeof *w);
		if (w == NULL) {
			c->rc = -1;
			return;
		}
		u->watch = w;
		u->watch_cap = cap;
	}
	u->watch[u->nwatch++] = c->w;
}

int ucx_watch(struct ucx_ctx *u, int fd, void (*fn)(void *arg), void *arg)
{
	struct ucx_watch_cmd c = {.cmd.fn = ucx_do_watch, .u = u, .w = {fd, fn, arg}};
	ucx_run(u, &c.cmd);
	return u->started ? c.rc : -1;
}
