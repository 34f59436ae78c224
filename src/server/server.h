/*
 * server.h - the Summation Service process (`unisum server`).
 */
#ifndef UNISUM_SERVER_H
#define UNISUM_SERVER_H

#include <stdbool.h>

#include "config/config.h"

/* Runs a server until the scheduler stops the job.  Returns 0 after a clean
 * stop, a negative error when the job failed (the log says why).  Then
 * *elsewhere (when not NULL) tells whether the failure is another
 * process's, announced by the scheduler (or the scheduler lost), rather
 * than this server's own: a launcher blames the first process that failed
 * on its own. */
int server_run(const struct config *cfg, bool *elsewhere);

#endif /* UNISUM_SERVER_H */
