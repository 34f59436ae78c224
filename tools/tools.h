/*
 * tools.h - the subcommands of the `unisum` CLI, one file each.
 * Each takes the arguments after its own name (argv[0] is the subcommand)
 * and returns the process exit status.
 */
#ifndef UNISUM_TOOLS_H
#define UNISUM_TOOLS_H

int launch_main(int argc, char **argv);		/* tools/launch.c */
int scheduler_main(int argc, char **argv);	/* tools/unisum.c */
int server_main(int argc, char **argv);		/* tools/unisum.c */
int bench_main(int argc, char **argv);		/* tools/bench.c */
int bench_model_main(int argc, char **argv);	/* tools/bench_model.c: bench --model */
int info_main(int argc, char **argv);		/* tools/unisum.c */

#endif /* UNISUM_TOOLS_H */
