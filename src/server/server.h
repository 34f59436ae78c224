/*
 * server.h - the Summation Service process (`unisum server`).
 */
#ifndef UNISUM_SERVER_H
#define UNISUM_SERVER_H

#include "config/config.h"

/* Runs a server until the scheduler stops the job.  Returns 0 after a clean
 * stop, a negative error when the job failed (the log says why). */
int server_run(const struct config *cfg);

#endif /* UNISUM_SERVER_H */
