/*
 * http.c - the small HTTP server of http.h.
 *
 * DESIGN.  A listener and at most HTTP_MAX_CONNS connections, each a
 * watch on the loop.  A connection reads its request head into a fixed
 * buffer; once the blank line came, the request line is parsed, the
 * handler answers, and the whole response (head and body, one buffer)
 * goes out as the socket takes it; then the connection closes.  A timer
 * closes connections past their deadline and lets the listener accept
 * again after descriptors ran out.
 */
#include "http/http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "timing/timing.h"
#include "unisum.h"

struct http_conn {
	struct http_server *h;
	struct loop_io io;
	int fd;
	int64_t deadline_ms;
	bool answered;			/* writing the response */
	bool draining;			/* written: reading what the peer still sends until
					 * it closes (a lingering close: no reset eats the
					 * response) */
	size_t len;			/* bytes of head read */
	char head[HTTP_MAX_HEAD];
	char *out;			/* the response */
	size_t out_len, out_off;
};

struct http_server {
	struct loop *loop;
	int fd;
	struct loop_io lio;
	bool paused;			/* descriptors ran out: accepting waits for the tick */
	struct loop_timer tick;
	http_get_fn fn;
	void *arg;
	struct http_conn *conns[HTTP_MAX_CONNS];
};

static void http_close(struct http_conn *c)
{
	struct http_server *h = c->h;
	for (int i = 0; i < HTTP_MAX_CONNS; i++)
		if (h->conns[i] == c)
			h->conns[i] = NULL;
	loop_io_del(&c->io);
	close(c->fd);
	free(c->out);
	free(c);
}

static const char *http_reason(int status)
{
	switch (status) {
	case 200: return "OK";
	case 400: return "Bad Request";
	case 404: return "Not Found";
	case 405: return "Method Not Allowed";
	case 408: return "Request Timeout";
	case 431: return "Request Header Fields Too Large";
	case 503: return "Service Unavailable";
	default: return "Internal Server Error";
	}
}

/* Builds the response of r into c->out (r's body is taken) and starts
 * writing it. */
static void http_answer(struct http_conn *c, struct http_reply *r)
{
	char head[512];
	int n = snprintf(head, sizeof head,
			 "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
			 "Cache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\n%s"
			 "Connection: close\r\n\r\n",
			 r->status, http_reason(r->status), r->type ? r->type : "text/plain; charset=utf-8",
			 r->len, r->status == 405 ? "Allow: GET\r\n" : "");
	c->out = malloc((size_t)n + r->len);
	if (c->out == NULL) {
		free(r->body);
		http_close(c);
		return;
	}
	memcpy(c->out, head, (size_t)n);
	if (r->len > 0)
		memcpy(c->out + n, r->body, r->len);
	free(r->body);
	c->out_len = (size_t)n + r->len;
	c->answered = true;
	loop_io_set(&c->io, EPOLLOUT);
}

/* A refusal with a one-line text body. */
static void http_refuse(struct http_conn *c, int status, const char *text)
{
	struct http_reply r = {.status = status, .body = strdup(text)};
	r.len = r.body != NULL ? strlen(r.body) : 0;
	http_answer(c, &r);
}

/* The head is complete (NUL-terminated in c->head): the request line
 * decides. */
static void http_request(struct http_conn *c)
{
	char *line_end = strpbrk(c->head, "\r\n");
	if (line_end != NULL)
		*line_end = '\0';
	char *sp1 = strchr(c->head, ' ');
	char *sp2 = sp1 != NULL ? strchr(sp1 + 1, ' ') : NULL;
	if (sp1 == NULL || sp2 == NULL || strncmp(sp2 + 1, "HTTP/1.", 7) != 0 || sp1[1] != '/') {
		http_refuse(c, 400, "malformed request line\n");
		return;
	}
	*sp1 = *sp2 = '\0';
	if (strcmp(c->head, "GET") != 0) {
		http_refuse(c, 405, "only GET is served here\n");
		return;
	}
	char *path = sp1 + 1;
	path[strcspn(path, "?#")] = '\0';
	struct http_reply r = {.status = 404};
	c->h->fn(c->h->arg, path, &r);
	if (r.status == 404 && r.body == NULL) {
		http_refuse(c, 404, "not found\n");
		return;
	}
	http_answer(c, &r);
}

static void http_read(struct http_conn *c)
{
	ssize_t n = recv(c->fd, c->head + c->len, sizeof c->head - 1 - c->len, 0);
	if (n < 0 && (errno == EAGAIN || errno == EINTR))
		return;
	if (n <= 0) {
		http_close(c);
		return;
	}
	c->len += (size_t)n;
	c->head[c->len] = '\0';
	if (strstr(c->head, "\r\n\r\n") != NULL || strstr(c->head, "\n\n") != NULL)
		http_request(c);
	else if (c->len == sizeof c->head - 1)
		http_refuse(c, 431, "request head too long\n");
}

static void http_write(struct http_conn *c)
{
	ssize_t n = send(c->fd, c->out + c->out_off, c->out_len - c->out_off, MSG_NOSIGNAL);
	if (n < 0 && (errno == EAGAIN || errno == EINTR))
		return;
	if (n < 0) {
		http_close(c);
		return;
	}
	c->out_off += (size_t)n;
	if (c->out_off == c->out_len) {
		shutdown(c->fd, SHUT_WR);
		c->draining = true;
		if (c->deadline_ms > timing_now_ms() + 1000)
			c->deadline_ms = timing_now_ms() + 1000;
		loop_io_set(&c->io, EPOLLIN);
	}
}

/* A lingering close: what the peer still sends is dropped until it
 * closes (or the deadline). */
static void http_drain(struct http_conn *c)
{
	char sink[4096];
	ssize_t n = recv(c->fd, sink, sizeof sink, 0);
	if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR))
		http_close(c);
}

static void http_on_conn(struct loop_io *io, uint32_t events)
{
	struct http_conn *c = io->arg;
	if (c->draining)
		http_drain(c);
	else if (c->answered && (events & (EPOLLOUT | EPOLLERR | EPOLLHUP)))
		http_write(c);
	else if (!c->answered)
		http_read(c);
}

/* Takes the connections waiting on the listener. */
static void http_on_listen(struct loop_io *io, uint32_t events)
{
	(void)events;
	struct http_server *h = io->arg;
	for (;;) {
		int fd = accept4(h->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0) {
			if (errno == EMFILE || errno == ENFILE || errno == ENOMEM || errno == ENOBUFS) {
				h->paused = true;	/* the tick accepts again */
				loop_io_set(&h->lio, 0);
			}
			return;
		}
		int slot = 0;
		while (slot < HTTP_MAX_CONNS && h->conns[slot] != NULL)
			slot++;
		struct http_conn *c = slot < HTTP_MAX_CONNS ? calloc(1, sizeof *c) : NULL;
		if (c == NULL) {
			static const char busy[] = "HTTP/1.1 503 Service Unavailable\r\n"
						   "Content-Length: 0\r\nConnection: close\r\n\r\n";
			ssize_t ignored = send(fd, busy, sizeof busy - 1, MSG_NOSIGNAL);
			(void)ignored;
			close(fd);
			continue;
		}
		*c = (struct http_conn){.h = h, .fd = fd,
					.deadline_ms = timing_now_ms() + HTTP_DEADLINE_MS};
		if (loop_io_add(h->loop, &c->io, fd, EPOLLIN, http_on_conn, c) != 0) {
			close(fd);
			free(c);
			continue;
		}
		h->conns[slot] = c;
	}
}

/* Every 250 ms: connections past their deadline close (a request that
 * never came whole gets a 408 first), and a paused listener resumes. */
static void http_tick(struct loop_timer *t)
{
	struct http_server *h = t->arg;
	int64_t now = timing_now_ms();
	for (int i = 0; i < HTTP_MAX_CONNS; i++) {
		struct http_conn *c = h->conns[i];
		if (c == NULL || now < c->deadline_ms)
			continue;
		if (c->answered) {
			http_close(c);
		} else {
			static const char late[] = "HTTP/1.1 408 Request Timeout\r\n"
						   "Content-Length: 0\r\nConnection: close\r\n\r\n";
			ssize_t ignored = send(c->fd, late, sizeof late - 1, MSG_NOSIGNAL);
			(void)ignored;
			http_close(c);
		}
	}
	if (h->paused) {
		h->paused = false;
		loop_io_set(&h->lio, EPOLLIN);
	}
}

/* A listening socket on addr:port, or -1 with why. */
static int http_listen(const char *addr, int port, int *port_out, char *why, size_t why_len)
{
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	if (inet_pton(AF_INET, addr, &sa.sin_addr) != 1) {
		struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *res;
		int rc = getaddrinfo(addr, NULL, &hints, &res);
		if (rc != 0) {
			snprintf(why, why_len, "cannot resolve '%s': %s", addr, gai_strerror(rc));
			return -1;
		}
		sa.sin_addr = ((struct sockaddr_in *)res->ai_addr)->sin_addr;
		freeaddrinfo(res);
	}
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0), one = 1;
	if (fd < 0) {
		snprintf(why, why_len, "socket(): %s", strerror(errno));
		return -1;
	}
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	socklen_t len = sizeof sa;
	if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(fd, 64) != 0 ||
	    getsockname(fd, (struct sockaddr *)&sa, &len) != 0) {
		snprintf(why, why_len, "cannot listen on %s:%d: %s", addr, port, strerror(errno));
		close(fd);
		return -1;
	}
	*port_out = ntohs(sa.sin_port);
	return fd;
}

int http_server_start(struct loop *l, const char *addr, int port, http_get_fn fn, void *arg,
		      struct http_server **out, int *port_out, char *why, size_t why_len)
{
	struct http_server *h = calloc(1, sizeof *h);
	if (h == NULL) {
		snprintf(why, why_len, "out of memory");
		return UNISUM_ENOMEM;
	}
	h->loop = l;
	h->fn = fn;
	h->arg = arg;
	h->tick.slot = -1;
	h->fd = http_listen(addr, port, port_out, why, why_len);
	if (h->fd < 0) {
		free(h);
		return UNISUM_ESYS;
	}
	if (loop_io_add(l, &h->lio, h->fd, EPOLLIN, http_on_listen, h) != 0) {
		snprintf(why, why_len, "cannot watch the metrics port: %s", strerror(errno));
		close(h->fd);
		free(h);
		return UNISUM_ESYS;
	}
	loop_timer_start(l, &h->tick, 250, 250, http_tick, h);
	*out = h;
	return 0;
}

void http_server_free(struct http_server *h)
{
	if (h == NULL)
		return;
	for (int i = 0; i < HTTP_MAX_CONNS; i++)
		if (h->conns[i] != NULL)
			http_close(h->conns[i]);
	loop_timer_stop(h->loop, &h->tick);
	loop_io_del(&h->lio);
	close(h->fd);
	free(h);
}
