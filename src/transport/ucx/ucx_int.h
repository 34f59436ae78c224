/*
 * ucx_int.h - what the UCX transport's two files share: UCX's functions,
 * loaded at run time (so a machine without libucx runs TCP), the
 * process's one UCP worker with the thread that progresses it, and the
 * table that finds a connection from its endpoint.  Internal to
 * src/transport/ucx; callers see transport.h.
 */
#ifndef UNISUM_TRANSPORT_UCX_INT_H
#define UNISUM_TRANSPORT_UCX_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <netinet/in.h>

#include <ucp/api/ucp.h>

#include "transport/auth.h"
#include "transport/transport.h"
#include "wire/wire.h"

/* The UCP and UCS functions the transport calls, found with dlsym. */
#define UCX_SYMBOLS(X)                                                                      \
	X(ucp_config_read) X(ucp_config_release) X(ucp_config_modify) X(ucp_init_version)   \
	X(ucp_config_print)                                                                 \
	X(ucp_cleanup)                                                                      \
	X(ucp_worker_create) X(ucp_worker_destroy) X(ucp_worker_get_efd) X(ucp_worker_arm) \
	X(ucp_worker_progress) X(ucp_worker_set_am_recv_handler)      \
	X(ucp_worker_get_address) X(ucp_worker_release_address) X(ucp_ep_create)           \
	X(ucp_ep_close_nbx) X(ucp_am_send_nbx) X(ucp_am_recv_data_nbx)                     \
	X(ucp_am_data_release) X(ucp_request_free) X(ucp_request_cancel)             \
	X(ucp_mem_map) X(ucp_mem_unmap)                                                    \
	X(ucs_status_string)

struct ucx_api {
#define UCX_FIELD(name) __typeof__(name) *name;
	UCX_SYMBOLS(UCX_FIELD)
#undef UCX_FIELD
};

/* Loaded by ucx_ctx_get(); valid while a reference is held. */
extern struct ucx_api ucx_fn;

/* A message as the AM header carries it: kind, then (WIRE) the sender's
 * sequence number of wire messages and the wire header.  BYE: the
 * sender closes the connection (its endpoint's close does not tell the
 * peer: UCX keeps a closed endpoint's socket for receiving). */
enum { UCX_HELLO = 1, UCX_AUTH = 2, UCX_WIRE = 3, UCX_BYE = 4 };
#define UCX_AM_ID 0
#define UCX_HEAD 16			/* u32 kind, u32 zero, u64 sequence */
#define UCX_WIRE_HEAD (UCX_HEAD + WIRE_HDR_SIZE)

/* A call into UCX, run on the UCX thread (ucx_post, ucx_run): only that
 * thread calls UCX, so the worker needs no lock (UCX's own for thread
 * mode MULTI is a spinlock, and the loops spinning on it while the
 * progress thread held it took most of 2 cores). */
struct ucx_cmd {
	void (*fn)(struct ucx_cmd *cmd);
	struct ucx_cmd *next;
	bool sync, done;		/* ucx_run's */
};

/* A wire message received, waiting in its connection's queue. */
struct tp_conn;
struct ucx_msg {
	struct ucx_msg *next;
	struct tp_conn *owner;		/* a rendezvous receive's connection */
	ucp_ep_h ep;			/* whose (an orphan's: its connection unknown yet) */
	ucp_worker_h worker;		/* which worker received it (it releases UCX's data) */
	int64_t at_ms;			/* when it came (orphans expire) */
	uint32_t kind;
	uint64_t seq;
	uint8_t head[WIRE_HDR_SIZE];
	void *data;			/* the payload: UCX's (kept) or inline[] */
	size_t len;
	int how;			/* UCX_DATA_* */
	bool posted, done;		/* a rendezvous receive: begun, ended */
	int status;			/* ... its status (ucs_status_t) */
	void *dst;			/* ... where it goes */
	void *req;			/* ... UCX's request, while under way */
	struct ucx_cmd cmd;		/* the receive's, or the release's */
	uint8_t inline_data[];
};
enum { UCX_DATA_NONE, UCX_DATA_INLINE, UCX_DATA_KEPT, UCX_DATA_RNDV };

/* A descriptor the UCX thread watches, and what it runs (on that
 * thread) when the descriptor is readable. */
struct ucx_watch {
	int fd;
	void (*fn)(void *arg);
	void *arg;
};

/* The process's UCP context; its accepting worker, whose address every
 * listener hands out; the workers of the connections it dialled, one
 * each (ucx_connect.c says why); and the thread that progresses them. */
struct ucx_ctx {
	ucp_context_h context;
	ucp_worker_h worker;		/* the accepting worker */
	int efd;			/* its event descriptor */
	ucp_worker_h *dial;		/* the dialled connections' workers, */
	int *dial_efd;			/* ... their event descriptors (UCX thread only) */
	size_t ndial, dial_cap;
	struct ucx_watch *watch;	/* descriptors it serves (UCX thread only) */
	size_t nwatch, watch_cap;
	int cmd_fd;			/* an eventfd: commands wait */
	pthread_t thread;
	bool started;			/* set before the thread, under ucx_lock */
	atomic_bool stop;
	pthread_mutex_t cmd_lock;	/* the commands and their ends */
	pthread_cond_t cmd_done;
	struct ucx_cmd *cmds, **cmds_tail;
	bool cmd_signaled;
};

/* Whether libucp can be loaded: 0, or -1 with why. */
int ucx_loadable(char *why, size_t len);

/* Takes a reference to the process's context, starting UCX and its
 * thread with the first: the context, or NULL with why (UCX not found,
 * or it would not start). */
struct ucx_ctx *ucx_ctx_get(char *why, size_t len);
void ucx_ctx_put(struct ucx_ctx *u);
/* Runs cmd->fn on the UCX thread: later (it may free cmd), or (ucx_run)
 * before returning, at once when called on that thread. */
void ucx_post(struct ucx_ctx *u, struct ucx_cmd *cmd);
void ucx_run(struct ucx_ctx *u, struct ucx_cmd *cmd);

/* The endpoint table: which connection an endpoint is.  Messages for an
 * endpoint not in it yet wait (orphans) and go to it when it is added. */
void ucx_map_add(ucp_ep_h ep, struct tp_conn *c);
void ucx_map_del(ucp_ep_h ep);
/* The connection of ep, or NULL (then m, unless NULL, is kept as an
 * orphan). */
struct tp_conn *ucx_map_find_or_park(ucp_ep_h ep, struct ucx_msg *m);
/* Hands the orphans of ep to deliver(c, m), under the table's lock. */
void ucx_map_adopt(ucp_ep_h ep, struct tp_conn *c,
		   void (*deliver)(struct tp_conn *c, struct ucx_msg *m));
/* Frees a message, releasing what UCX lent it (on the UCX thread). */
void ucx_msg_free(struct ucx_msg *m);

/* A dialled connection's own worker, made (ucx_worker_new: 0, or -1 with
 * why) and progressed by the UCX thread, and destroyed there
 * (ucx_worker_free: posted, so after every command posted before; the
 * messages it received and nobody took are released first). */
int ucx_worker_new(struct ucx_ctx *u, ucp_worker_h *out, char *why, size_t len);
void ucx_worker_free(struct ucx_ctx *u, ucp_worker_h w);
/* The UCX thread runs fn(arg) whenever fd is readable, from now until
 * ucx_watch(u, fd, NULL, NULL): 0, or -1 (out of memory). */
int ucx_watch(struct ucx_ctx *u, int fd, void (*fn)(void *arg), void *arg);
/* A worker's address, copied into buf (at most cap bytes): its length,
 * or 0 when UCX failed or it does not fit. */
size_t ucx_worker_address(struct ucx_ctx *u, ucp_worker_h w, void *buf, size_t cap);

/* ucx.c's connections, for ucx_connect.c: a new one (holding a
 * reference to the context); its worker w (own: the connection's alone,
 * freed with it), side and name (peer, unless NULL); its endpoint made
 * towards a worker's address (0 or UNISUM_ECONN with why); the wait for
 * the HELLO that ends a dial; a message sent; one freed without (drop) or
 * with its endpoint. */
struct tp_conn *ucx_conn_new(void);
struct ucx_ctx *ucx_conn_ctx(struct tp_conn *c);
void ucx_conn_set_worker(struct tp_conn *c, ucp_worker_h w, bool own, bool acceptor,
			 const char *peer);
int ucx_conn_connect(struct tp_conn *c, const void *addr, char *why, size_t len);
int ucx_conn_wait_hello(struct tp_conn *c, int wait_ms, char *why, size_t len);
int ucx_conn_send(struct tp_conn *c, uint32_t kind, const struct wire_hdr *hdr,
		  const void *payload, size_t len, bool lend);
void ucx_conn_drop(struct tp_conn *c);
void ucx_conn_free(struct tp_conn *c);

/* ucx_mem.c's: the transport's mem_register and mem_unregister
 * (transport.h); the registration holding [p, p + len), or NULL; how
 * many regions are registered, and how many payloads went with one (the
 * tests'). */
void ucx_mem_register(void *p, size_t len);
void ucx_mem_unregister(void *p);
ucp_mem_h ucx_mem_find(const void *p, size_t len);
void ucx_mem_stats(size_t *nregions, unsigned long long *uses);
/* Lent sends: one handed to UCX (begin: its half of the count) and
 * ended (end, cancelled included); the transport's lent_settle, how
 * many of those begun before it were left. */
unsigned ucx_lent_begin(void);
void ucx_lent_end(unsigned half);
int ucx_lent_settle(int timeout_ms);

/* ucx_connect.c's operations (transport.h): the listeners and dial. */
int ucx_dial(const char *host, int port, int timeout_ms, struct tp_conn **out);
int ucx_listen(const char *host, int port, struct tp_listener **out, int *port_out);
int ucx_accept_nb(struct tp_listener *l, struct tp_conn **out);
int ucx_accept(struct tp_listener *l, struct tp_conn **out);
void ucx_listener_shutdown(struct tp_listener *l);
void ucx_listener_free(struct tp_listener *l);
int ucx_listener_fd(struct tp_listener *l);

/* The receive side's callback for every AM (ucx.c). */
ucs_status_t ucx_on_am(void *arg, const void *header, size_t header_length, void *data,
		       size_t length, const ucp_am_recv_param_t *param);

#endif /* UNISUM_TRANSPORT_UCX_INT_H */
