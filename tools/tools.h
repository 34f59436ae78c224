/*
 * tools.h - the subcommands of the `unisum` CLI, one file each.
 * Each takes the arguments after its own name (argv[0] is the subcommand)
 * and returns the process exit status.
 */
#ifndef UNISUM_TOOLS_H
#define UNISUM_TOOLS_H

#include <stdbool.h>
#include <stddef.h>

/* The exit status of a role (`unisum server`) that stopped because the job
 * failed in another process (the scheduler said so): the launcher blames
 * a process that failed on its own first. */
#define UNISUM_EXIT_ELSEWHERE 3

/* What `unisum launch` exits with: its usage text and unisum(1) say it. */
#define LAUNCH_EXIT_STATUS_TEXT \
	"0 when every process exited 0; else the first failing\n" \
	"process's status (128 + N when killed by signal N), 1 when the\n" \
	"scheduler failed, 124 on --timeout, 130/143 on SIGINT/SIGTERM, 2 on a\n" \
	"usage error or a missing or malformed variable.\n"

int launch_main(int argc, char **argv);		/* tools/launch.c */

/* A job of `unisum launch` for a tool that launches one of its own (bench):
 * -w num_workers -s num_servers --local-size local_size (0: one machine)
 * [--timeout timeout_s] [--no-secret] -- cmd... */
struct launch_opts {
	int num_workers, num_servers, local_size;
	double timeout_s;		/* 0: none */
	bool no_secret;
	char **cmd;			/* NULL-terminated */
};

/* Runs that job as `unisum launch` would and returns its exit status.  It
 * installs signal handlers: one job per process (bench forks for the
 * next). */
int launch_run(const struct launch_opts *o);
int scheduler_main(int argc, char **argv);	/* tools/unisum.c */
int server_main(int argc, char **argv);		/* tools/unisum.c */
int bench_main(int argc, char **argv);		/* tools/bench.c */
int bench_model_main(int argc, char **argv);	/* tools/bench_model.c: bench --model */
int info_main(int argc, char **argv);		/* tools/unisum.c */
int top_main(int argc, char **argv);		/* tools/top.c */

/* tools/bench.c, for both benches: whether this process is a worker of a
 * job (launched, or configured by hand), and the path of this executable
 * (0, or 1 after printing why). */
int bench_inside_job(void);
int bench_self_exe(char *buf, size_t len);

#endif /* UNISUM_TOOLS_H */
