/*
 * unisum.c - the `unisum` command line: dispatches to one subcommand.
 *
 *   unisum launch -w N -s K -- CMD ARGS...   a whole job on this machine
 *   unisum scheduler                         the scheduler of a cluster job
 *   unisum server                            one summation server
 *   unisum bench [-w N -s K]                 push_pull throughput table
 *   unisum bench --model resnet50|vgg16|bert-base   FIFO vs priority training step
 *   unisum info                              every environment knob
 */
#include <stdio.h>
#include <string.h>

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

static void usage(FILE *out)
{
	fprintf(out,
		"usage: unisum <command> [options]\n"
		"\n"
		"  launch -w N -s K -- CMD ARGS...  run a job on this machine: a scheduler, K servers\n"
		"                                   and N workers running CMD (the embedded cluster)\n"
		"  scheduler                        run the scheduler (UNISUM_SCHEDULER_PORT, job size\n"
		"                                   from UNISUM_NUM_WORKER / UNISUM_NUM_SERVER)\n"
		"  server                           run one summation server of a job\n"
		"  bench [-w N] [-s K] [sizes...]   push_pull throughput, 1 MiB to 256 MiB\n"
		"  bench --model resnet50|vgg16|bert-base\n"
		"                                   a training step replaying the model's gradients:\n"
		"                                   iteration time, FIFO against priority\n"
		"  info                             every environment variable, its default and value\n"
		"  --version                        the release and the wire protocol's version\n"
		"\n"
		"The BytePS / ps-lite variables (DMLC_ROLE, DMLC_PS_ROOT_URI, ...) work as aliases.\n");
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
	(void)argc;
	(void)argv;
	printf("unisum: reducer path %s\n\nEnvironment:\n", reducer_isa_name(reducer_active_isa()));
	config_print(stdout);
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
