/*
 * strangers.h - check_sums's strangers (strangers.c): what a connection
 * that is no worker of the job sends a server, each checked to end in the
 * server hanging up; on rank 0 only.  Each fails the program (exit 1,
 * naming `rank`) when the server does otherwise.
 */
#ifndef CHECK_SUMS_STRANGERS_H
#define CHECK_SUMS_STRANGERS_H

/* With UNISUM_SECRET set: the server on 127.0.0.1:port is tried without
 * the secret, with a wrong tag and with a replayed handshake. */
void strangers_auth(int port, int rank);
/* Malformed streams to the server on 127.0.0.1:port. */
void strangers_garbage(int port, int rank);
/* Prints a port that is free right now; 0, or 1 when none could be had. */
int strangers_free_port(void);

#endif
