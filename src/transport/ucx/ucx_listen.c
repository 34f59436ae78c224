/*
 * ucx_listen.c - the UCX transport's listeners (see ucx.c): UCX's
 * sockaddr connection manager listens; each peer that connects gets its
 * connection made at once on the UCX thread (ucx_conn_accept) and waits
 * in the listener's queue, as a socket waits in the kernel's backlog,
 * for accept(); an eventfd tells the loop that one waits.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "log/log.h"
#include "transport/stream.h"
#include "transport/ucx/ucx_int.h"
#include "unisum.h"

struct tp_listener {
	struct ucx_ctx *u;
	ucp_listener_h l;
	int evfd;
	pthread_mutex_t lock;	/* below */
	struct tp_conn **conns;		/* made, waiting for accept() */
	int fd_errno;			/* a peer refused for want of descriptors */
	size_t nconns, cap;
	bool closing;
	bool signaled;
};

/* Makes the listener's eventfd readable.  l->lock held. */
static void listener_signal(struct tp_listener *l)
{
	uint64_t one = 1;
	if (!l->signaled && write(l->evfd, &one, sizeof one) == sizeof one)
		l->signaled = true;
}

static void ucx_on_conn_request(ucp_conn_request_h req, void *arg)
{
	struct tp_listener *l = arg;
	pthread_mutex_lock(&l->lock);
	/* Taken even once the listener is shut, as a socket's backlog takes
	 * it: the peer's dial then ends when the listener is freed, at once,
	 * instead of retrying a refusal until its timeout. */
	bool take = true;
	if (l->nconns == l->cap) {
		size_t cap = l->cap ? l->cap * 2 : 16;
		struct tp_conn **r = realloc(l->conns, cap * sizeof *r);
		if (r == NULL)
			take = false;
		else
			l->conns = r, l->cap = cap;
	}
	pthread_mutex_unlock(&l->lock);
	errno = 0;
	struct tp_conn *c = take ? ucx_conn_accept(req) : NULL;
	if (c == NULL) {
		int e = errno;
		ucx_fn.ucp_listener_reject(l->l, req);
		if (e == EMFILE || e == ENFILE) {	/* accept() says so (RLIMIT_NOFILE) */
			pthread_mutex_lock(&l->lock);
			l->fd_errno = e;
			listener_signal(l);
			pthread_mutex_unlock(&l->lock);
		}
		return;
	}
	pthread_mutex_lock(&l->lock);
	l->conns[l->nconns++] = c;	/* only this thread grows it */
	listener_signal(l);
	pthread_mutex_unlock(&l->lock);
}

struct ucx_listen_cmd {
	struct ucx_cmd cmd;
	struct tp_listener *l;
	const struct sockaddr_in *sa;
	ucs_status_t status;
	int port;
};

static void ucx_do_listen(struct ucx_cmd *cmd)
{
	struct ucx_listen_cmd *c = (struct ucx_listen_cmd *)cmd;
	struct tp_listener *l = c->l;
	ucp_listener_params_t p = {
		.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER,
		.sockaddr = {.addr = (const struct sockaddr *)c->sa, .addrlen = sizeof *c->sa},
		.conn_handler = {.cb = ucx_on_conn_request, .arg = l}};
	c->status = ucx_fn.ucp_listener_create(l->u->worker, &p, &l->l);
	ucp_listener_attr_t attr = {.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR};
	if (c->status == UCS_OK && (c->status = ucx_fn.ucp_listener_query(l->l, &attr)) != UCS_OK)
		ucx_fn.ucp_listener_destroy(l->l);
	if (c->status == UCS_OK)
		c->port = ntohs(((struct sockaddr_in *)&attr.sockaddr)->sin_port);
}

static void ucx_do_unlisten(struct ucx_cmd *cmd)
{
	struct ucx_listen_cmd *c = (struct ucx_listen_cmd *)cmd;
	ucx_fn.ucp_listener_destroy(c->l->l);
}

int ucx_listen(const char *host, int port, struct tp_listener **out, int *port_out)
{
	struct sockaddr_in sa;
	int rc = stream_resolve(host, port, &sa);
	if (rc != 0)
		return rc;
	char why[256] = "";
	struct ucx_ctx *u = ucx_ctx_get(why, sizeof why);
	if (u == NULL)
		return log_fail(UNISUM_ECONFIG, "UNISUM_TRANSPORT=ucx: %s", why);
	struct tp_listener *l = calloc(1, sizeof *l);
	if (l == NULL || (l->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) < 0) {
		free(l);
		ucx_ctx_put(u);
		return log_fail(UNISUM_ESYS, "UCX listener: %s", strerror(errno));
	}
	l->u = u;
	pthread_mutex_init(&l->lock, NULL);
	struct ucx_listen_cmd c = {.cmd.fn = ucx_do_listen, .l = l, .sa = &sa};
	ucx_run(u, &c.cmd);
	if (c.status == UCS_OK) {
		*port_out = c.port;
		*out = l;
		return 0;
	}
	ucs_status_t st = c.status;
	close(l->evfd);
	pthread_mutex_destroy(&l->lock);
	free(l);
	ucx_ctx_put(u);
	return log_fail(UNISUM_ESYS, "UCX cannot listen on %s:%d: %s (is another job using the port?)",
			host, port, ucx_fn.ucs_status_string(st));
}

int ucx_accept_nb(struct tp_listener *l, struct tp_conn **out)
{
	pthread_mutex_lock(&l->lock);
	struct tp_conn *c = NULL;
	if (l->nconns > 0) {
		c = l->conns[0];
		memmove(l->conns, l->conns + 1, --l->nconns * sizeof *l->conns);
	}
	int rc = c != NULL ? 0 : l->closing ? UNISUM_ESHUTDOWN : l->fd_errno ? UNISUM_ESYS : TP_AGAIN;
	int fd_errno = l->fd_errno;
	l->fd_errno = 0;
	uint64_t n;
	if (l->nconns == 0 && !l->closing && l->signaled && read(l->evfd, &n, sizeof n) == sizeof n)
		l->signaled = false;
	pthread_mutex_unlock(&l->lock);
	if (c != NULL)
		*out = c;
	if (rc == UNISUM_ESYS) {
		char why[512];
		log_fd_limits(fd_errno, why, sizeof why);
		log_set_last_error("a peer could not be accepted over UCX: %s", why);
	}
	return rc;
}

int ucx_accept(struct tp_listener *l, struct tp_conn **out)
{
	int rc;
	while ((rc = ucx_accept_nb(l, out)) == TP_AGAIN) {
		struct pollfd p = {.fd = l->evfd, .events = POLLIN};
		poll(&p, 1, 100);
	}
	return rc;
}

void ucx_listener_shutdown(struct tp_listener *l)
{
	pthread_mutex_lock(&l->lock);
	l->closing = true;
	listener_signal(l);
	pthread_mutex_unlock(&l->lock);
}

void ucx_listener_free(struct tp_listener *l)
{
	if (l == NULL)
		return;
	ucx_listener_shutdown(l);
	struct ucx_listen_cmd c = {.cmd.fn = ucx_do_unlisten, .l = l};
	ucx_run(l->u, &c.cmd);
	for (size_t i = 0; i < l->nconns; i++)
		ucx_conn_free(l->conns[i]);
	free(l->conns);
	close(l->evfd);
	pthread_mutex_destroy(&l->lock);
	struct ucx_ctx *u = l->u;
	free(l);
	ucx_ctx_put(u);
}

int ucx_listener_fd(struct tp_listener *l)
{
	return l->evfd;
}

