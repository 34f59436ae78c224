/*
 * config.h - every environment variable unisum reads, parsed in one place.
 *
 * Each knob is declared once in config.c's table with its native name
 * (UNISUM_*), the BytePS/ps-lite aliases existing launch scripts use, its
 * default and a one-line meaning; `unisum info` prints the table.  A
 * malformed value is an error that names the variable, never a silent
 * default.  When both a native name and an alias are set, the native name
 * wins.
 */
#ifndef UNISUM_CONFIG_H
#define UNISUM_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "unisum.h"

enum config_role {
	CONFIG_ROLE_NONE = 0,
	CONFIG_ROLE_SCHEDULER = 1,
	CONFIG_ROLE_SERVER = 2,
	CONFIG_ROLE_WORKER = 3,
};

/* UNISUM_AUTOTUNE=auto, before config_load resolves it. */
#define CONFIG_AUTOTUNE_AUTO (-1)

/* The parsed environment. */
struct config {
	int role;			/* enum config_role */
	int num_workers;		/* worker machines in the job (BytePS's DMLC_NUM_WORKER);
					 * worker processes = num_workers x local_size */
	int num_servers;		/* server processes */
	char scheduler_host[256];	/* where the scheduler listens */
	int scheduler_port;		/* its port */
	int worker_id;			/* this worker's machine index, -1 = assigned by arrival
					 * (only with local_size 1) */
	int server_id;			/* requested server rank, -1 = assigned by arrival */
	char node_host[256];		/* address this node advertises (and binds, unless bind) */
	char bind[256];			/* address to listen on, "" = node_host / scheduler_host */
	int port;			/* listening port of a server, 0 = any free one */
	int local_rank;			/* rank among the workers of this machine */
	int local_size;			/* workers on this machine */
	char job_id[65];		/* names the machine's shared memory, "" = derived
					 * (see config_job_id) */
	uint64_t partition_bytes;	/* largest partition of a tensor */
	int engine_threads;		/* summation threads per server, 0 = one per core */
	int io_threads;			/* event loops serving a process's connections, 0 = from the
					 * cores, by role (server.c, links.c) */
	int log_level;			/* enum log_level */
	int timeout_ms;			/* a peer silent this long is dead; also bounds connecting */
	int start_timeout_ms;		/* registration must complete within this (0: no limit) */
	int linger_ms;			/* not from the environment: how long a scheduler whose job
					 * failed before every node registered still answers
					 * newcomers with the failure (0: not at all) */
	int heartbeat_ms;		/* how often nodes and scheduler say they are alive */
	int metrics_port;		/* the scheduler serves /metrics and its page here (0: off) */
	char metrics_addr[256];		/* ... on this address, "" = the scheduler's own */
	int stall_warn_ms;		/* a round or barrier waiting this long for some workers is logged */
	int stall_abort_ms;		/* ... and this long fails the job (0: never) */
	char secret[256];		/* the job secret ("" = no authentication) */
	char secret_file[1024];		/* where the secret was read from, or "" */
	uint64_t credit_bytes;		/* PUSH-stage credit in bytes (resolved at load, never 0) */
	uint64_t credit_parts;		/* the same in partitions (BytePS's unit), 0 = unset */
	char sync[32];			/* default sync mode: "sync" (lock-step) or "async" */
	char transport[8];		/* between workers and servers: "tcp" or "ucx" */
	int enable_async;		/* BYTEPS_ENABLE_ASYNC: 1 means sync = "async" */
	uint64_t min_compress_bytes;	/* smaller tensors go uncompressed (UNISUM_MIN_COMPRESS_BYTES) */
	int dssync_every;		/* dssync: every this many steps is a global one (0: none) */
	int dssync_cross_every;		/* ... and with racks, every this many groups across them */
	int dssync_overlap;		/* read by unisum.torch's DistributedOptimizer */
	int dssync_keep;		/* a group's tensor stays while it comes back within this
					 * many steps */
	int rack;			/* this worker's rack (UNISUM_RACK), -1: none */
	int trace_on;			/* write the timeline */
	char trace_dir[1024];		/* ... under this directory */
	uint64_t trace_start_step;	/* first round traced */
	uint64_t trace_end_step;	/* last round traced */
	int launched;			/* a child of `unisum launch` (UNISUM_LAUNCHED) */
	int autotune;			/* tune partition size and credit online: 0 off, 1 search,
					 * 2 fit (UNISUM_AUTOTUNE=auto resolved at load) */
	int autotune_auto;		/* ... resolved from auto, not set */
	char autotune_set_by[40];	/* auto resolved to 0: the variable that set a
					 * partition size or credit, else "" */
	int autotune_steps;		/* rounds per autotune epoch (trial) */
	uint64_t local_stage_bytes;	/* one machine: stage tensors this large (0: never) */
	uint64_t local_arena_bytes;	/* shared memory per local worker for staging */
	int ipc;			/* same-host servers: data by cross-memory attach */
	int allgather_phases;		/* -1 auto, 0 never, 1 always: an allgather's pulls in
					 * ring phases (src/worker/cuts.c) */
	int server_failover;		/* a lost server's partitions move to the others */
	int replicas;			/* servers copy held state to a backup (0 or 1) */
	int gather_failover;		/* workers keep homed cuts' last pushes (0 or 1) */
	int elastic;			/* workers come and go: the job re-forms */
	int elastic_min_workers;	/* ... and fails below this many */
	int placement;			/* scheduler: enum placement_policy */
};

/* Fills `cfg` from the environment.  On a malformed value returns
 * UNISUM_ECONFIG with a message naming the variable in `err`. */
int config_load(struct config *cfg, char *err, size_t err_len);

/* Checks that everything `role` needs is present (the scheduler address,
 * the job size; a worker of a machine with several workers also needs
 * UNISUM_WORKER_ID, its machine's index).  UNISUM_ECONFIG with the missing
 * variable named in `err`. */
int config_require(const struct config *cfg, int role, char *err, size_t err_len);

/* The job id that names the shared-memory segments of this machine's
 * workers, written NUL-terminated into out[len] (truncated to fit):
 * cfg->job_id when UNISUM_JOB_ID is set, else "p<port>-<hash>" from the
 * scheduler's port and an 8-hex-digit FNV-1a hash of its host, so every
 * worker of one job computes the same id without being told.  Always a
 * valid shm job id (letters, digits, '-', '_'; at most 64 characters)
 * when len >= 65. */
void config_job_id(const struct config *cfg, char *out, size_t len);

/* One per `cores_each` cores of this machine, 1 to 4: the default of a
 * pool of threads (engines; a server's loops one per core, a worker's
 * one per 8, for UNISUM_IO_THREADS=0). */
int config_per_cores(int cores_each);

/* Name of a role: "scheduler", "server", "worker" or "none". */
const char *config_role_name(int role);

/* Prints every knob, its aliases, default, meaning and current value. */
void config_print(FILE *out);

/* Writes s as roff text: backslashes escaped, hyphens as minus signs (so
 * that names copy and search as typed), never a control line. */
void config_print_man_text(FILE *out, const char *s);

/* The same table as roff, for the ENVIRONMENT section of unisum(1): a
 * tagged paragraph per variable, its meaning, aliases and default. */
void config_print_man(FILE *out);

#endif /* UNISUM_CONFIG_H */
