/*
 * zerocopy.c - does MSG_ZEROCOPY pay where unisum's TCP runs here?  Issue
 * 50 lists it as a candidate: the sender's copy into the socket goes, the
 * pages are pinned instead and a completion comes back on the socket's
 * error queue.  The kernel's documentation warns that data looped to a
 * local socket (loopback, and veth between network namespaces: the
 * emulated cluster) is copied anyway, later ("deferred copy"), and the
 * completion then says SO_EE_CODE_ZEROCOPY_COPIED.
 *
 *   bench_zerocopy [GIB] [CHUNK_MIB]     (default 4 GiB in 4 MiB sends)
 *
 * A receiver process reads everything from 127.0.0.1; the sender sends
 * GIB GiB in CHUNK_MIB sends, first plainly, then with MSG_ZEROCOPY (a
 * ring of 8 buffers, each reused only after its completion).  Prints, per
 * GiB sent, the sender's and the receiver's CPU-seconds (getrusage, user +
 * system) for both, their ratio, and how many completions said the kernel
 * copied after all.
 */
#include <errno.h>
#include <time.h>

#include <linux/errqueue.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef SO_ZEROCOPY
#define SO_ZEROCOPY 60
#endif
#ifndef MSG_ZEROCOPY
#define MSG_ZEROCOPY 0x4000000
#endif

#define RING 8

static double cpu_s(const struct rusage *r)
{
	return (double)r->ru_utime.tv_sec + r->ru_utime.tv_usec / 1e6 + (double)r->ru_stime.tv_sec +
	       r->ru_stime.tv_usec / 1e6;
}

static void die(const char *what)
{
	perror(what);
	exit(1);
}

/* Reads completions from fd's error queue; returns how many sends they
 * cover, and adds those the kernel copied to *copied. */
static long completions(int fd, int flags, long *copied)
{
	long n = 0;
	for (;;) {
		char ctrl[128];
		struct msghdr m = {.msg_control = ctrl, .msg_controllen = sizeof ctrl};
		if (recvmsg(fd, &m, MSG_ERRQUEUE | flags) < 0) {
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				return n;
			die("recvmsg(MSG_ERRQUEUE)");
		}
		for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
			struct sock_extended_err *e = (struct sock_extended_err *)CMSG_DATA(c);
			if (e->ee_origin != SO_EE_ORIGIN_ZEROCOPY)
				continue;
			long k = (long)(e->ee_data - e->ee_info + 1);
			n += k;
			if (e->ee_code & SO_EE_CODE_ZEROCOPY_COPIED)
				*copied += k;
		}
		flags = MSG_DONTWAIT;
	}
}

/* One run: a receiver child, GIB GiB sent; CPU-seconds of both. */
static void run(int zc, long gib, size_t chunk, double *send_cpu, double *recv_cpu, long *copied)
{
	int ls = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t al = sizeof a;
	if (ls < 0 || bind(ls, (struct sockaddr *)&a, sizeof a) != 0 || listen(ls, 1) != 0 ||
	    getsockname(ls, (struct sockaddr *)&a, &al) != 0)
		die("listen");
	pid_t pid = fork();
	if (pid == 0) {
		int c = accept(ls, NULL, NULL);
		char *buf = malloc(chunk);
		while (c >= 0 && buf && recv(c, buf, chunk, 0) > 0)
			;
		_exit(0);
	}
	close(ls);
	int s = socket(AF_INET, SOCK_STREAM, 0), one = 1;
	if (s < 0 || connect(s, (struct sockaddr *)&a, sizeof a) != 0)
		die("connect");
	if (zc && setsockopt(s, SOL_SOCKET, SO_ZEROCOPY, &one, sizeof one) != 0)
		die("SO_ZEROCOPY");
	char *ring[RING];
	for (int i = 0; i < RING; i++)
		if ((ring[i] = malloc(chunk)) == NULL || !memset(ring[i], i, chunk))
			die("malloc");
	struct rusage r0, r1, rc;
	getrusage(RUSAGE_SELF, &r0);
	long sends = gib * (1024l << 20) / (long)chunk, done = 0;
	for (long i = 0; i < sends; i++) {
		while (zc && i - done >= RING)	/* that buffer is still the kernel's */
			done += completions(s, 0, copied);
		for (size_t off = 0; off < chunk;) {
			ssize_t n = send(s, ring[i % RING] + off, chunk - off, zc ? MSG_ZEROCOPY : 0);
			if (n < 0)
				die("send");
			off += (size_t)n;
		}
	}
	while (zc && done < sends)
		done += completions(s, 0, copied);
	getrusage(RUSAGE_SELF, &r1);
	close(s);
	if (wait4(pid, NULL, 0, &rc) != pid)
		die("wait4");
	*send_cpu = (cpu_s(&r1) - cpu_s(&r0)) / (double)gib;
	*recv_cpu = cpu_s(&rc) / (double)gib;
	for (int i = 0; i < RING; i++)
		free(ring[i]);
}

int main(int argc, char **argv)
{
	long gib = argc > 1 ? atol(argv[1]) : 4;
	size_t chunk = (size_t)(argc > 2 ? atol(argv[2]) : 4) << 20;
	double s0, r0, s1, r1;
	long c0 = 0, c1 = 0;
	run(0, gib, chunk, &s0, &r0, &c0);
	run(1, gib, chunk, &s1, &r1, &c1);
	long sends = gib * (1024l << 20) / (long)chunk;
	printf("loopback TCP, %ld GiB in %zu MiB sends; CPU-seconds per GiB\n", gib, chunk >> 20);
	printf("%-14s %10s %10s %10s\n", "", "sender", "receiver", "both");
	printf("%-14s %10.3f %10.3f %10.3f\n", "copy", s0, r0, s0 + r0);
	printf("%-14s %10.3f %10.3f %10.3f\n", "MSG_ZEROCOPY", s1, r1, s1 + r1);
	printf("zerocopy/copy: sender %.2f, both %.2f; completions that say the kernel copied: "
	       "%ld of %ld\n", s1 / s0, (s1 + r1) / (s0 + r0), c1, sends);
	return 0;
}
