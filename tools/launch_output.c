/*
 * launch_output.c - `unisum launch` forwards its children's output.
 *
 * Each child's stdout and stderr is a pipe whose read end the event loop
 * (launch.c) watches.  Each complete line is forwarded as
 * "[worker 0] line" to the launcher's own stdout (or stderr for the child's
 * stderr); the lines of one read() go out in one write(), so a chatty child
 * costs few system calls.  A line longer than the buffer is cut into
 * buffer-sized pieces, each prefixed and ended with a newline, so that
 * another process's output never lands in the middle of it.  A progress bar
 * that redraws its line with '\r' has each frame forwarded, prefixed, as it
 * is drawn.
 *
 * Only the launcher's main thread calls these functions.
 */
#include <errno.h>
#include <poll.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "launch.h"
#include "timing/timing.h"

/* After every child is gone, how long to keep reading pipes that something
 * else (a grandchild) still holds open. */
#define LAUNCH_DRAIN_MS 1000

/* Writes all of buf to fd, retrying short writes.  Output that cannot be
 * written (our stdout was closed) is dropped: the job goes on. */
static void write_all(int fd, const char *buf, size_t len)
{
	while (len > 0) {
		ssize_t n = write(fd, buf, len);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN) {
				struct pollfd p = { .fd = fd, .events = POLLOUT };

				poll(&p, 1, 1000);
				continue;
			}
			return;
		}
		buf += n;
		len -= (size_t)n;
	}
}

/* Prefixed lines waiting to be written, so that a burst of short lines
 * costs one write() rather than one per line.  Only the main thread
 * forwards output, and the batch is flushed before any other write, so
 * lines are never cut or reordered. */
static struct {
	int fd;					/* where the batch goes */
	size_t len;				/* bytes in data */
	char data[2 * LAUNCH_LINE_MAX];		/* whole prefixed lines */
} batch;

static void batch_flush(void)
{
	write_all(batch.fd, batch.data, batch.len);
	batch.len = 0;
}

/* Queues one line (or a piece of a long one) of child `c`, adding the
 * newline when `data` ends with neither a newline nor a carriage return
 * (a progress bar redrawing its line ends each frame with '\r'). */
static void stream_emit(const struct child *c, const struct stream *s, const char *data,
			size_t len)
{
	size_t prefix = strlen(c->prefix);
	bool newline = len == 0 || (data[len - 1] != '\n' && data[len - 1] != '\r');

	if (len == 1 && data[0] == '\r')
		prefix = 0;	/* a bare carriage return starting a frame: no prefix */
	if (batch.len > 0 && (batch.fd != s->out_fd ||
			      batch.len + prefix + len + 1 > sizeof(batch.data)))
		batch_flush();
	batch.fd = s->out_fd;
	memcpy(batch.data + batch.len, c->prefix, prefix);
	memcpy(batch.data + batch.len + prefix, data, len);
	batch.len += prefix + len;
	if (newline)
		batch.data[batch.len++] = '\n';
}

/* Closes a stream, forwarding its unfinished last line. */
static void stream_close(const struct child *c, struct stream *s)
{
	if (s->fd < 0)
		return;
	if (s->len > 0)
		stream_emit(c, s, s->buf, s->len);
	batch_flush();
	s->len = 0;
	close(s->fd);
	s->fd = -1;
}

bool launch_stream_read(const struct child *c, struct stream *s)
{
	size_t room = sizeof(s->buf) - s->len;
	size_t start = 0;
	ssize_t n;
	char *nl;

	if (s->fd < 0)
		return false;
	do
		n = read(s->fd, s->buf + s->len, room);
	while (n < 0 && errno == EINTR);
	if (n < 0 && errno == EAGAIN)
		return false;
	if (n <= 0) {
		stream_close(c, s);
		return false;
	}
	s->len += (size_t)n;

	/* A line ends at '\n', or at a '\r' not followed by '\n': each frame
	 * of a progress bar goes out prefixed, as it is drawn. */
	while ((nl = memchr(s->buf + start, '\n', s->len - start)) != NULL ||
	       (nl = memchr(s->buf + start, '\r', s->len - start)) != NULL) {
		char *cr = memchr(s->buf + start, '\r', (size_t)(nl - s->buf) - start);
		if (cr != NULL && cr + 1 < s->buf + s->len && cr[1] != '\n')
			nl = cr;
		else if (*nl == '\r' && nl + 1 == s->buf + s->len)
			break;	/* maybe the first half of "\r\n": wait for more */
		size_t end = (size_t)(nl - s->buf) + 1;

		stream_emit(c, s, s->buf + start, end - start);
		start = end;
	}
	if (start == 0 && s->len == sizeof(s->buf)) {
		/* A line longer than the buffer: forward this piece. */
		stream_emit(c, s, s->buf, s->len);
		start = s->len;
	}
	batch_flush();
	memmove(s->buf, s->buf + start, s->len - start);
	s->len -= start;
	return (size_t)n == room;
}

void launch_stream_drain(const struct child *c, struct stream *s)
{
	for (int i = 0; i < 256 && launch_stream_read(c, s); i++)
		;
}

int launch_output_fds(struct launcher *l, struct pollfd *fds, int first,
		      struct stream **streams, struct child **owners)
{
	int n = first;

	for (int i = 0; i < l->nchildren; i++) {
		struct child *c = &l->children[i];
		struct stream *both[2] = { &c->out, &c->err };

		for (int k = 0; k < 2; k++) {
			if (both[k]->fd < 0)
				continue;
			fds[n].fd = both[k]->fd;
			fds[n].events = POLLIN;
			fds[n].revents = 0;
			streams[n] = both[k];
			owners[n] = c;
			n++;
		}
	}
	return n;
}

void launch_output_finish(struct launcher *l)
{
	int64_t deadline = timing_now_ms() + LAUNCH_DRAIN_MS;
	size_t slots = 2 * (size_t)l->nchildren + 2;
	struct pollfd *fds = calloc(slots, sizeof(*fds));
	struct stream **streams = calloc(slots, sizeof(*streams));
	struct child **owners = calloc(slots, sizeof(*owners));

	while (fds && streams && owners) {
		int64_t left = deadline - timing_now_ms();
		int n = launch_output_fds(l, fds, 0, streams, owners);

		if (n == 0 || left <= 0)
			break;
		if (poll(fds, (nfds_t)n, (int)left) <= 0)
			continue;
		for (int i = 0; i < n; i++)
			if (fds[i].revents)
				launch_stream_read(owners[i], streams[i]);
	}
	for (int i = 0; i < l->nchildren; i++) {
		stream_close(&l->children[i], &l->children[i].out);
		stream_close(&l->children[i], &l->children[i].err);
	}
	free(fds);
	free(streams);
	free(owners);
}
