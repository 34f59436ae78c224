/*
 * launch_output.c - `unisum launch` forwards its children's output.
 *
 * Each child's stdout and stderr is a pipe whose read end the event loop
 * (launch.c) watches.  Each complete line is forwarded as
 * "[worker 0] line" to the launcher's own stdout (or stderr for the child's
 * stderr); the lines of one read() go out in one write(), so a chatty child
 * costs few system calls.  A line longer than the buffer is cut into
 * buffer-sized pieces, each prefixed and ended with a newline, so that
 * another process's output never lands in the middle of it.
 *
 * A progress bar (tqdm) redraws its line: each frame starts with '\r' and
 * has no newline.  On a terminal each frame is forwarded, prefixed, as it
 * is drawn, and a frame another process's output would overwrite is first
 * ended with a newline, so it stays on a line of its own.  Into a pipe or
 * a file (`make demo | tee log`) frames would pile up into one line
 * hundreds of frames long, so there the latest frame is held and goes out
 * as a prefixed line of its own at the child's next newline: the bar's
 * last state, then the line.  A frame the next line redraws (the bar's
 * final frame, ended by its newline) replaces it; a bar that lasts long
 * gets a line every LAUNCH_FRAME_EVERY_MS.
 *
 * Only the launcher's main thread calls these functions.
 */
#include <errno.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "launch.h"
#include "timing/timing.h"

/* After every child is gone, how long to keep reading pipes that something
 * else (a grandchild) still holds open. */
#define LAUNCH_DRAIN_MS 1000

/* Into a pipe or a file, a progress bar that runs this long without a
 * newline has its latest frame written as a line this often. */
#define LAUNCH_FRAME_EVERY_MS 10000

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

/* Queues prefix + data (+ a newline when `newline`) for fd. */
static void batch_put(int fd, const char *prefix, size_t plen, const char *data, size_t len,
		      bool newline)
{
	if (batch.len > 0 && (batch.fd != fd || batch.len + plen + len + 1 > sizeof(batch.data)))
		batch_flush();
	batch.fd = fd;
	memcpy(batch.data + batch.len, prefix, plen);
	memcpy(batch.data + batch.len + plen, data, len);
	batch.len += plen + len;
	if (newline)
		batch.data[batch.len++] = '\n';
}

/* Whether each of stdout and stderr is a terminal (asked once). */
static bool out_is_tty(int fd)
{
	static int tty[3] = { -1, -1, -1 };

	if (fd < 1 || fd > 2)
		return false;
	if (tty[fd] < 0)
		tty[fd] = isatty(fd) == 1;
	return tty[fd] == 1;
}

/* The stream whose frame the terminal shows last, its cursor at the
 * frame's start: anything another stream writes ends that line first. */
static const struct stream *frame_shown;

/* A piece of a terminal's stream: as it came, prefixed (a bare '\r'
 * starting a frame is not), with a newline added unless it ends with one
 * or with '\r'. */
static void tty_piece(const struct child *c, const struct stream *s, const char *data, size_t len)
{
	bool bare_cr = len == 1 && data[0] == '\r';
	bool frame = len > 0 && data[len - 1] == '\r';

	if (frame_shown != NULL && frame_shown != s) {
		batch_put(s->out_fd, "", 0, "", 0, true);
		frame_shown = NULL;
	}
	batch_put(s->out_fd, c->prefix, bare_cr ? 0 : strlen(c->prefix), data, len,
		  len == 0 || (data[len - 1] != '\n' && !frame));
	if (!bare_cr)
		frame_shown = frame ? s : NULL;
}

/* Writes s's held frame as a line of its own. */
static void frame_write(const struct child *c, struct stream *s)
{
	if (s->frame_len == 0)
		return;
	batch_put(s->out_fd, c->prefix, strlen(c->prefix), s->frame, s->frame_len, true);
	s->frame_len = 0;
	s->frame_out_ms = timing_now_ms();
}

/* Whether data[0, len) holds nothing but blanks (a bar clearing itself). */
static bool is_blank(const char *data, size_t len)
{
	for (size_t i = 0; i < len; i++)
		if (data[i] != ' ' && data[i] != '\t')
			return false;
	return true;
}

/* A frame (without its '\r') of a stream that is not a terminal's: held,
 * replacing the one held before, unless the bar has had no line for
 * LAUNCH_FRAME_EVERY_MS. */
static void frame_hold(const struct child *c, struct stream *s, const char *data, size_t len)
{
	int64_t now = timing_now_ms();

	if (!s->after_frame && s->frame_len == 0)
		s->frame_out_ms = now;	/* a new bar */
	s->after_frame = true;
	s->cleared = is_blank(data, len);
	if (s->cleared)
		return;
	if (s->frame == NULL && (s->frame = malloc(LAUNCH_LINE_MAX)) == NULL)
		return;		/* no memory for it: the frame is dropped */
	memcpy(s->frame, data, len);
	s->frame_len = len;
	if (now - s->frame_out_ms >= LAUNCH_FRAME_EVERY_MS)
		frame_write(c, s);
}

/* A piece of a stream that is not a terminal's: frames held (see the
 * header comment), a line written after the frame it follows, unless it
 * is that bar's last redraw. */
static void file_piece(const struct child *c, struct stream *s, const char *data, size_t len)
{
	if (len == 1 && data[0] == '\r')
		return;		/* a frame starts */
	if (len > 0 && data[len - 1] == '\r') {
		frame_hold(c, s, data, len - 1);
		return;
	}
	if (s->after_frame && !s->cleared)
		s->frame_len = 0;	/* this line redraws the held frame */
	frame_write(c, s);
	s->after_frame = s->cleared = false;
	batch_put(s->out_fd, c->prefix, strlen(c->prefix), data, len,
		  len == 0 || data[len - 1] != '\n');
}

/* Queues one piece of child c's stream s: a line (ending with '\n'), a
 * frame (ending with '\r'), a bare '\r' that starts a frame, or a piece
 * of a line longer than the buffer (no ending). */
static void stream_emit(const struct child *c, struct stream *s, const char *data, size_t len)
{
	if (out_is_tty(s->out_fd))
		tty_piece(c, s, data, len);
	else
		file_piece(c, s, data, len);
}

/* Closes a stream, forwarding its unfinished last line (or frame). */
static void stream_close(const struct child *c, struct stream *s)
{
	if (s->fd < 0)
		return;
	if (s->len > 0)
		stream_emit(c, s, s->buf, s->len);
	frame_write(c, s);
	free(s->frame);
	s->frame = NULL;
	if (frame_shown == s)
		frame_shown = NULL;
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

/* ---- --cpu-report ------------------------------------------------------ */

struct cpu_sum {
	double user, sys;
	long vcs, ivcs;
	int n;
};

static double tv_s(struct timeval tv)
{
	return (double)tv.tv_sec + (double)tv.tv_usec / 1e6;
}

static void cpu_add(struct cpu_sum *s, const struct rusage *ru)
{
	s->user += tv_s(ru->ru_utime);
	s->sys += tv_s(ru->ru_stime);
	s->vcs += ru->ru_nvcsw;
	s->ivcs += ru->ru_nivcsw;
	s->n++;
}

static void cpu_line(const char *what, const struct cpu_sum *s)
{
	fprintf(stderr, "unisum launch: cpu %-22s user %8.3f s  system %8.3f s  switches %ld "
		"voluntary, %ld involuntary\n", what, s->user, s->sys, s->vcs, s->ivcs);
}

/* --cpu-report: what each reaped process used (wait4's rusage, which also
 * counts the children it reaped), then the sums by role and of the whole
 * job.  A child still running (killed and never reaped) has no line.  The
 * launcher's own line (RUSAGE_SELF) includes the scheduler it runs. */
void launch_cpu_report(const struct launcher *l)
{
	static const char *const roles[] = {"servers", "workers", "ssh clients"};
	struct cpu_sum role[3] = {{0}}, all = {0}, self = {0};
	struct rusage ru;
	char what[64];

	for (int i = 0; i < l->nchildren; i++) {
		const struct child *c = &l->children[i];
		if (c->pid == 0 || c->running || c->role < 0 || c->role > 2)
			continue;
		struct cpu_sum one = {0};
		cpu_add(&one, &c->ru);
		cpu_add(&role[c->role], &c->ru);
		cpu_add(&all, &c->ru);
		cpu_line(c->name, &one);
	}
	getrusage(RUSAGE_SELF, &ru);
	cpu_add(&self, &ru);
	cpu_add(&all, &ru);
	cpu_line("launcher+scheduler", &self);
	for (int r = 0; r < 3; r++) {
		if (role[r].n == 0)
			continue;
		snprintf(what, sizeof what, "all %d %s", role[r].n, roles[r]);
		cpu_line(what, &role[r]);
	}
	cpu_line("the whole job", &all);
}
