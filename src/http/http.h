/*
 * http.h - a small HTTP/1.x server on an event loop, for the scheduler's
 * metrics: GET of a few paths, one request per connection, nothing else.
 *
 * It answers GET with what its handler gives and closes the connection
 * (Connection: close).  It refuses every other method (405), a request
 * head over HTTP_MAX_HEAD bytes (431), a malformed request line (400),
 * and closes a connection that has not finished its exchange within
 * HTTP_DEADLINE_MS (408 when the request never came: slowloris) or that
 * comes when HTTP_MAX_CONNS are open (503).  A request body is never
 * read.  Everything runs on the loop's thread and never blocks it.
 */
#ifndef UNISUM_HTTP_H
#define UNISUM_HTTP_H

#include <stddef.h>

#include "loop/loop.h"

#define HTTP_MAX_HEAD 8192
#define HTTP_MAX_CONNS 32
#define HTTP_DEADLINE_MS 5000

struct http_server;

/* The handler's answer: a status (200, 404 ...), its content type, and
 * the body (malloc'd, taken by the server; NULL with len 0 for none). */
struct http_reply {
	int status;
	const char *type;
	char *body;
	size_t len;
};

/* Called on the loop's thread for each GET, with the path (the query
 * string cut off); r comes as a 404 with no body. */
typedef void (*http_get_fn)(void *arg, const char *path, struct http_reply *r);

/* Listens on addr:port (port 0: a free one, into *port_out) and serves
 * on loop l (before it runs, or on its thread).  0, or UNISUM_ESYS /
 * UNISUM_ENOMEM with why filled in ("127.0.0.1:9091: Address already in
 * use"). */
int http_server_start(struct loop *l, const char *addr, int port, http_get_fn fn, void *arg,
		      struct http_server **out, int *port_out, char *why, size_t why_len);

/* Closes the listener and every connection; on the loop's thread or once
 * the loop no longer runs.  NULL is fine. */
void http_server_free(struct http_server *h);

#endif /* UNISUM_HTTP_H */
