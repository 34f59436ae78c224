/*
 * unisum.c - the `unisum` command line: dispatches to one subcommand.
 *
 *   unisum launch -w N -s K -- CMD ARGS...   a whole job on this machine
 *   unisum scheduler                         the scheduler of a cluster job
 *   unisum server                            one summation server
 *   unisum bench [-w N -s K]                 push_pull throughput table
 *   unisum bench --model resnet50|vgg16|bert-base   FIFO vs priority training step
 *   unisum info                              every environment knob
 *   unisum info --man                        unisum(1), from the same tables
 *   unisum --version                         the release and wire versions
 */
#include <stdio.h>
#include <string.h>

#include "compress/compress.h"
#include "config/config.h"
#include "log/log.h"
#include "reducer/reducer.h"
#include "rendezvous/rendezvous.h"
#include "server/server.h"
#include "tools.h"
#include "transport/auth.h"
#include "transport/transport.h"
#include "unisum.h"
#include "wire/wire.h"

/* The subcommands, for the usage text and the man page alike. */
static const struct command {
	const char *synopsis;	/* after "unisum " */
	const char *what;	/* one paragraph */
} commands[] = {
	{ "launch -w N -s K [--local-size L] -- CMD ARGS...",
	  "run a job on this machine: a scheduler, K servers and N workers running CMD (the "
	  "embedded cluster); with -H HOST:SLOTS,... or --hostfile FILE a job over ssh, with "
	  "--slurm one inside a Slurm allocation, with --nproc-per-node L one node of a multi-node "
	  "job (torchrun's and Kubernetes' variables); unisum launch --help says more" },
	{ "scheduler",
	  "run the scheduler of a cluster job (UNISUM_SCHEDULER_PORT; the job's size from "
	  "UNISUM_NUM_WORKER and UNISUM_NUM_SERVER)" },
	{ "server", "run one summation server of a job" },
	{ "bench [-w N] [-s K] [sizes...]", "push_pull throughput, 1 MiB to 256 MiB" },
	{ "bench --model resnet50|vgg16|bert-base",
	  "a training step replaying the model's gradients: iteration time, FIFO against "
	  "priority" },
	{ "info", "every environment variable, its default and value" },
	{ "top [--once] [--interval S] [JOB | HOST:PORT]",
	  "a running job's processes as a table that refreshes (CPU, memory, step time, "
	  "operations and bytes per second, each server against its Theorem 1 share, the hosts' "
	  "network, the stalls now), from the metrics of a job started with unisum launch "
	  "--metrics (or UNISUM_METRICS_PORT): by its job id on this host, or its address" },
	{ "--version", "the release and the wire protocol's version" },
};
#define NCOMMANDS (sizeof(commands) / sizeof(commands[0]))

/* Prints text wrapped at 80 columns, every line indented by `indent`
 * (the first after `used` columns already written). */
static void wrap(FILE *out, const char *text, int indent, int used)
{
	int col = used;

	while (*text) {
		int len = (int)strcspn(text, " ");

		if (col > indent && col + 1 + len > 80) {
			fprintf(out, "\n%*s", indent, "");
			col = indent;
		} else if (col > indent) {
			fputc(' ', out);
			col++;
		} else {
			fprintf(out, "%*s", indent - col, "");
			col = indent;
		}
		fwrite(text, 1, (size_t)len, out);
		col += len;
		text += len;
		while (*text == ' ')
			text++;
	}
	fputc('\n', out);
}

static void usage(FILE *out)
{
	fputs("usage: unisum <command> [options]\n\n", out);
	for (size_t i = 0; i < NCOMMANDS; i++) {
		int used = fprintf(out, "  %s", commands[i].synopsis);

		if (used > 34) {
			fputc('\n', out);
			used = 0;
		}
		wrap(out, commands[i].what, 35, used);
	}
	fputs("\nThe BytePS / ps-lite variables (DMLC_ROLE, DMLC_PS_ROOT_URI, ...) work as "
	      "aliases.\n", out);
}

/* `unisum info --man`: unisum(1), from the commands above and the
 * configuration's table, so the page cannot drift from the program. */
static void man_page(FILE *out)
{
	fprintf(out, ".TH UNISUM 1 \"\" \"unisum %s\" \"User Commands\"\n", unisum_version());
	fputs(".SH NAME\nunisum \\- the Summation Service of data\\-parallel training: launcher, "
	      "scheduler, server, benchmarks\n", out);
	fputs(".SH SYNOPSIS\n", out);
	for (size_t i = 0; i < NCOMMANDS; i++) {
		fputs(".B unisum\n", out);
		config_print_man_text(out, commands[i].synopsis);
		fputs("\n.br\n", out);
	}
	fputs(".SH DESCRIPTION\nWorkers push gradient partitions to summation servers on CPUs, "
	      "which sum them with SIMD and serve the sums back; the workers of a machine sum "
	      "through shared memory first, and the scheduler places partitions on servers by "
	      "Theorem 1 of the BytePS paper (OSDI 2020).  A program uses it through libunisum "
	      "(unisum.h) or the Python package unisum.torch; this command starts and runs the "
	      "processes of a job.\n.SH COMMANDS\n", out);
	for (size_t i = 0; i < NCOMMANDS; i++) {
		fputs(".TP\n.B ", out);
		config_print_man_text(out, commands[i].synopsis);
		fputc('\n', out);
		config_print_man_text(out, commands[i].what);
		fputs(".\n", out);
	}
	fputs(".SH ENVIRONMENT\nEvery process of a job reads these; a malformed value stops it "
	      "at start, naming the variable.  BytePS's and ps\\-lite's names work as aliases.\n",
	      out);
	config_print_man(out);
	fputs(".SH EXIT STATUS\n.B unisum launch\nexits ", out);
	config_print_man_text(out, LAUNCH_EXIT_STATUS_TEXT);
	fprintf(out, "The other commands exit 0 on success, 1 on an error, 2 on a usage error; a "
		"server that stops because another process of its job failed exits %d.\n",
		UNISUM_EXIT_ELSEWHERE);
	fputs(".SH SEE ALSO\nunisum.h, the README and docs/ARCHITECTURE.md of the source "
	      "repository.\n", out);
}

/* Loads and checks the environment of a scheduler or server process. */
static int load_role_config(struct config *cfg, int role)
{
	char err[512];
	int rc = config_load(cfg, err, sizeof err);
	if (rc == 0)
		rc = config_require(cfg, role, err, sizeof err);
	if (rc != 0) {
		fprintf(stderr, "unisum %s: %s\n", config_role_name(role), err);
		return rc;
	}
	log_set_level(cfg->log_level);
	log_set_identity(config_role_name(role), -1);
	if (auth_set_secret(cfg->secret) != 0) {
		fprintf(stderr, "unisum %s: libsodium cannot start\n", config_role_name(role));
		return UNISUM_ESYS;
	}
	return 0;
}

int scheduler_main(int argc, char **argv)
{
	(void)argc;
	(void)argv;
	struct config cfg;
	if (load_role_config(&cfg, CONFIG_ROLE_SCHEDULER) != 0)
		return 2;
	struct rdv_scheduler *s;
	int port;
	/* Nothing listens on every interface unless UNISUM_BIND asks for it. */
	const char *host = cfg.bind[0] ? cfg.bind : cfg.scheduler_host[0] ? cfg.scheduler_host : "127.0.0.1";
	/* Nodes started by hand or by a cluster engine may come after the
	 * job failed: as long as they keep trying to connect (timeout_ms),
	 * they are told why rather than finding the port closed. */
	cfg.linger_ms = cfg.timeout_ms;
	int rc = rdv_scheduler_start(host, cfg.scheduler_port, &cfg, transport_tcp(), &s, &port);
	if (rc != 0) {
		fprintf(stderr, "unisum scheduler: %s\n", unisum_last_error());
		return 1;
	}
	rc = rdv_scheduler_wait(s);
	rdv_scheduler_free(s);
	return rc == 0 ? 0 : 1;
}

int server_main(int argc, char **argv)
{
	(void)argc;
	(void)argv;
	struct config cfg;
	if (load_role_config(&cfg, CONFIG_ROLE_SERVER) != 0)
		return 2;
	bool elsewhere;
	int rc = server_run(&cfg, &elsewhere);
	if (rc != 0 && elsewhere) {
		fprintf(stderr, "unisum server: stopping because the job failed: %s (the log above "
			"names the process that failed)\n", unisum_strerror(rc));
		return UNISUM_EXIT_ELSEWHERE;
	}
	if (rc != 0) {
		fprintf(stderr, "unisum server: exiting on an error: %s (the log above says why)\n",
			unisum_strerror(rc));
		return 1;
	}
	return 0;
}

int info_main(int argc, char **argv)
{
	if (argc > 1 && strcmp(argv[1], "--man") == 0) {
		man_page(stdout);
		return 0;
	}
	printf("unisum: reducer path %s\n\nEnvironment:\n", reducer_isa_name(reducer_active_isa()));
	config_print(stdout);
	printf("\n");
	compress_print(stdout);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		usage(stderr);
		return 2;
	}
	const char *cmd = argv[1];
	if (strcmp(cmd, "launch") == 0)
		return launch_main(argc - 1, argv + 1);
	if (strcmp(cmd, "scheduler") == 0)
		return scheduler_main(argc - 1, argv + 1);
	if (strcmp(cmd, "server") == 0)
		return server_main(argc - 1, argv + 1);
	if (strcmp(cmd, "bench") == 0)
		return bench_main(argc - 1, argv + 1);
	if (strcmp(cmd, "info") == 0)
		return info_main(argc - 1, argv + 1);
	if (strcmp(cmd, "top") == 0)
		return top_main(argc - 1, argv + 1);
	if (strcmp(cmd, "--version") == 0 || strcmp(cmd, "version") == 0) {
		/* A worker and a server refuse each other unless their wire
		 * versions match. */
		printf("unisum %s (wire protocol %d)\n", unisum_version(), WIRE_VERSION);
		return 0;
	}
	if (strcmp(cmd, "-h") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "help") == 0) {
		usage(stdout);
		return 0;
	}
	fprintf(stderr, "unisum: unknown command '%s'\n\n", cmd);
	usage(stderr);
	return 2;
}
