/*
 * stream.h - what the stream-socket transports (tcp/, ipc/) share: wire
 * messages over a connected, blocking stream socket, the accepting loop,
 * connecting with retries, and the job-secret handshake.  Internal to
 * src/transport; callers see only transport.h.
 */
#ifndef UNISUM_TRANSPORT_STREAM_H
#define UNISUM_TRANSPORT_STREAM_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/types.h>

#include "transport/transport.h"
#include "wire/wire.h"

/* A listening socket and whether listener_shutdown() was called. */
struct stream_listener {
	int fd;
	atomic_bool closing;
};

/* host (an IPv4 address or a name) and port as an IPv4 address: 0, or
 * UNISUM_ECONN with the reason in log_last_error(). */
int stream_resolve(const char *host, int port, struct sockaddr_in *sa);

/* A listening TCP socket on host:port (0: a free port): 0 with it and
 * its port, or UNISUM_ECONN (host) / UNISUM_ESYS, logged. */
int stream_listen(const char *host, int port, int *fd_out, int *port_out);

/* Blocks in accept() until a peer connects: 0 and *fd_out, UNISUM_ESHUTDOWN
 * once closing, or UNISUM_ESYS (logged; when descriptors ran out, not
 * logged: the reason, naming RLIMIT_NOFILE, is in log_last_error()).
 * Retries interruptions and (after 100 ms) running out of kernel memory.
 * sa/sa_len as for accept(). */
int stream_accept(struct stream_listener *l, struct sockaddr *sa, socklen_t *sa_len, int *fd_out);

/* listener_shutdown() and listener_free() of a stream transport. */
void stream_listener_shutdown(struct stream_listener *l);
void stream_listener_close(struct stream_listener *l);

/* Connects a new socket of `family` to sa, retrying refused attempts (the
 * peer not listening yet) until timeout_ms has passed (0: one attempt).
 * 0 and *fd_out, or UNISUM_ECONN (the reason, naming `peer`, in
 * log_last_error(); not logged) / UNISUM_ESYS (logged). */
int stream_connect(int family, const struct sockaddr *sa, socklen_t sa_len, int timeout_ms,
		   const char *peer, int *fd_out);

/* Sends hdr and hdr->payload_len bytes of payload (NULL: none) with one
 * sendmsg() and no copy.  0 or UNISUM_ECONN. */
int stream_send(int fd, const struct wire_hdr *hdr, const void *payload);

/* Reads exactly len bytes; 0, or UNISUM_ECONN on EOF or error. */
int stream_read_full(int fd, void *dst, size_t len);

/* Reads and decodes (wire_decode) the next header: 0, UNISUM_ECONN, or
 * UNISUM_EPROTO with why. */
int stream_recv_header(int fd, struct wire_hdr *hdr, char *why, size_t why_len);

/* Reads len payload bytes into dst, or discards them (dst NULL). */
int stream_recv_payload(int fd, void *dst, size_t len);

/* Runs one side of the job-secret handshake (auth.h) on fd, the peer
 * given at most a few seconds for each answer; 0 when no secret is set. */
int stream_authenticate(int fd, bool acceptor, const char *peer, char *why, size_t len);

/* ---- the non-blocking form (transport.h) ---- */

/* Makes fd non-blocking: 0 or UNISUM_ESYS. */
int stream_set_nonblocking(int fd);
/* Accepts without blocking: 0 and *fd_out (non-blocking), TP_AGAIN,
 * UNISUM_ESHUTDOWN once closing, or UNISUM_ESYS with the reason (the limit
 * when descriptors ran out) in log_last_error(). */
int stream_accept_nb(struct stream_listener *l, struct sockaddr *sa, socklen_t *sa_len, int *fd_out);
/* Reads into dst until *got reaches len: 0, TP_AGAIN or UNISUM_ECONN. */
int stream_read_nb(int fd, void *dst, size_t len, size_t *got);
/* recv_nb's first stage, the header into rx->hdr (decoded, validated):
 * 0, TP_AGAIN, UNISUM_ECONN or UNISUM_EPROTO with why. */
int stream_recv_header_nb(int fd, struct tp_rx *rx, char *why, size_t why_len);
/* recv_nb's payload stage: rx->hdr.payload_len bytes into rx->dst (NULL:
 * discarded), rx->got counting them.  0, TP_AGAIN or UNISUM_ECONN. */
int stream_recv_payload_nb(int fd, struct tp_rx *rx);
/* send_nb of tx's header (encoded into tx->head at the first call) and
 * `len` bytes of `payload`: 0, TP_AGAIN or UNISUM_ECONN. */
int stream_send_nb(int fd, struct tp_tx *tx, const void *payload, size_t len);
/* Either side's handshake (auth.h; a->connector) without blocking: 0 when
 * done or no secret is set, TP_AGAIN, or UNISUM_EAUTH with why (naming
 * `peer` on the connector's side). */
int stream_auth_nb(int fd, const char *peer, struct auth_state *a, char *why, size_t len);

/* ThreadSanitizer does not see that a message sent on one socket is what
 * another thread receives on its peer, so a job run in one process (the
 * in-process tests) would look like threads touching each other's memory
 * with nothing between them.  Each direction of a connection gets a
 * token, the same at both ends; a send releases the sender's and a
 * receive acquires the receiver's.  Nothing outside ThreadSanitizer
 * builds, where the tokens are 0.  A connection's two tokens (*tx for
 * sending, *rx for receiving) come from its addresses (TCP), or from the
 * listener's name, the connecting pid and the direction (IPC: the
 * connecting end of a Unix socket has no name). */
void stream_sync_release(uint64_t token);
void stream_sync_acquire(uint64_t token);
void stream_tcp_tokens(int fd, uint64_t *tx, uint64_t *rx);
void stream_ipc_tokens(int fd, bool acceptor, pid_t peer_pid, uint64_t *tx, uint64_t *rx);

#endif /* UNISUM_TRANSPORT_STREAM_H */
