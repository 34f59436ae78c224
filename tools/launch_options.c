/*
 * launch_options.c - the command line of `unisum launch`: its options, the
 * usage and help text, and the checks that the options go together.
 *
 * Options come before the command; the first argument that is not an
 * option, or the one after "--", starts it.  An option's value may follow
 * it ("-w 4", "--workers 4") or be attached ("-w4", "--workers=4").  A
 * usage error is reported on stderr, and launch exits 2.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "launch.h"
#include "shellwords.h"
#include "tools.h"

/* Most workers on one machine (the range of UNISUM_LOCAL_SIZE). */
#define LAUNCH_LOCAL_MAX 1024

/* Most servers, and most workers of a job. */
#define LAUNCH_PROCESSES_MAX 4096

/* The usage lines, printed alone after a mistake and atop --help. */
#define LAUNCH_USAGE_LINES \
	"usage: unisum launch [-w N] [-s K] [--local-size L] [--timeout SEC] [--no-secret]\n" \
	"                     [--] CMD [ARGS...]\n" \
	"       unisum launch -w N -s K --elastic [--min-workers A] [--max-workers B]\n" \
	"                     [--host-discovery-script S] [--ssh-args ARGS] [--] CMD [ARGS...]\n" \
	"       unisum launch -H HOST:SLOTS,... | --hostfile FILE [--server-hosts HOST,...]\n" \
	"                     [--no-colocated-servers] [--scheduler-host] [--ssh-args ARGS]\n" \
	"                     [--start-timeout SEC] [--timeout SEC] [--no-secret] [--] CMD [ARGS...]\n" \
	"       unisum launch --slurm [--nproc-per-node L] [--cpu-server-nodes K]\n" \
	"                     [--no-colocated-servers] [--scheduler-host] [--srun-args ARGS]\n" \
	"                     [--timeout SEC] [--] CMD [ARGS...]\n" \
	"       unisum launch --nproc-per-node L [--nnodes N --node-rank R\n" \
	"                     --master-addr A --master-port P] [--no-scheduler] [--timeout SEC]\n" \
	"                     [--] CMD [ARGS...]\n" \
	"       unisum launch --scheduler\n"

/* `unisum launch --help`: the usage lines, then what each option does. */
static const char launch_help[] =
	LAUNCH_USAGE_LINES
	"\n"
	"Runs a whole job on this machine: the scheduler (inside this process),\n"
	"K server processes and N worker processes running CMD, with the\n"
	"environment wired (UNISUM_ROLE, UNISUM_WORKER_ID, UNISUM_LOCAL_RANK,\n"
	"UNISUM_SCHEDULER_HOST, UNISUM_SCHEDULER_PORT, ...).  The workers form\n"
	"N/L machines of L workers: the workers of a machine sum through shared\n"
	"memory and only the machine's sum goes through the servers.  Every line a\n"
	"process prints is forwarded with a \"[worker 0] \" or \"[server 0] \" prefix.\n"
	"When any process fails, everything is stopped and launch exits with that\n"
	"process's status.\n"
	"\n"
	"  -w, --workers N     worker processes (default 2)\n"
	"  -s, --servers K     server processes (default 1)\n"
	"      --local-size L  workers per machine, a divisor of N (default N: all\n"
	"                      workers are one machine; 1: every worker's tensors\n"
	"                      go through the servers)\n"
	"      --elastic       an elastic job (one worker per machine): a worker that\n"
	"                      dies is reported and the others re-form the job at the\n"
	"                      new size (unisum.torch.elastic, unisum_rejoin)\n"
	"      --min-workers A the job fails when fewer are left (default 1)\n"
	"      --max-workers B at most this many workers (default N)\n"
	"      --host-discovery-script S\n"
	"                      run every second; its lines HOST[:SLOTS] give the\n"
	"                      workers to run on each host (up to B in all): missing\n"
	"                      ones are started (other hosts over ssh: set\n"
	"                      UNISUM_NODE_HOST to this host's address) and join at\n"
	"                      the next commit, surplus ones stopped\n"
	"      --nproc-per-node L\n"
	"                      start one machine of a job whose scheduler and\n"
	"                      servers run elsewhere: L workers of CMD, with\n"
	"                      UNISUM_LOCAL_RANK 0..L-1 and UNISUM_LOCAL_SIZE=L; the\n"
	"                      environment must hold the rest: UNISUM_SCHEDULER_HOST,\n"
	"                      UNISUM_SCHEDULER_PORT, UNISUM_NUM_WORKER (machines),\n"
	"                      UNISUM_NUM_SERVER, UNISUM_WORKER_ID (this machine,\n"
	"                      from 0), the job's secret (or their DMLC_* names);\n"
	"                      worker ranks are UNISUM_WORKER_ID x L + local rank\n"
	"      --nnodes N, --node-rank R, --master-addr A, --master-port P\n"
	"                      with --nproc-per-node, as torchrun: node R of N\n"
	"                      runs L workers and a colocated server, node 0 also\n"
	"                      the scheduler at A:P.  Without them, MASTER_ADDR and\n"
	"                      MASTER_PORT with NNODES and NODE_RANK (or PET_NNODES\n"
	"                      and PET_NODE_RANK, or Kubernetes PyTorchJob's\n"
	"                      WORLD_SIZE and RANK) say the same.  Every node needs\n"
	"                      the same UNISUM_SECRET (or --no-secret)\n"
	"      --no-scheduler  with them: node 0 runs no scheduler either; one runs\n"
	"                      at A:P already (`unisum launch --scheduler` there)\n"
	"      --scheduler     alone: the scheduler role as its own process (its\n"
	"                      UNISUM_* variables are `unisum scheduler`'s), started\n"
	"                      again on the same address when it dies of a signal;\n"
	"                      the nodes wait UNISUM_TIMEOUT_MS for it and go on\n"
	"      --server-only   with --nnodes, --master-addr, --master-port and\n"
	"                      --cpu-servers, and no command: one of those CPU-only\n"
	"                      servers, as a launcher (a Kubernetes server pod, say)\n"
	"      --no-colocated-servers\n"
	"                      with -H and --server-hosts, --slurm and\n"
	"                      --cpu-server-nodes, or --cpu-servers (on every node):\n"
	"                      the nodes run workers only, the CPU-only servers\n"
	"                      are all the job's servers (a parameter server)\n"
	"      --cpu-servers K with them: K CPU-only servers join the job, each\n"
	"                      started on a host of its own with `unisum server`\n"
	"                      (UNISUM_NUM_SERVER=N+K, no UNISUM_SERVER_ID: they take\n"
	"                      ranks N.. as they come); UNISUM_NUM_SERVER=N+K says the\n"
	"                      same\n"
	"  -H, --hosts HOST[:SLOTS],...\n"
	"      --hostfile FILE  a job over ssh (OpenMPI's \"host slots=N\" lines in\n"
	"                      FILE): the scheduler here, and on every host SLOTS\n"
	"                      workers and a colocated server, started with ssh\n"
	"                      (BatchMode; this program's path and working directory\n"
	"                      on every host; the secret on ssh's stdin).  A lost\n"
	"                      ssh connection stops that host's processes\n"
	"      --ssh-args ARGS more ssh options (\"-i KEY -p 2222\", say)\n"
	"      --server-hosts HOST,...\n"
	"                      with -H: CPU-only servers, one on each HOST, also\n"
	"                      started over ssh\n"
	"      --scheduler-host\n"
	"                      with -H or --slurm: run the scheduler on the first\n"
	"                      host, beside its node (at a random port from 20000),\n"
	"                      not inside this launcher\n"
	"      --start-timeout SEC\n"
	"                      how long ssh may take to reach a host (its\n"
	"                      ConnectTimeout; default 30, 0: no limit); nodes\n"
	"                      then register within UNISUM_START_TIMEOUT_MS\n"
	"      --slurm         a job inside a Slurm allocation (in an sbatch script,\n"
	"                      or under salloc): the scheduler here, and on every\n"
	"                      node of SLURM_JOB_NODELIST L workers (--nproc-per-node,\n"
	"                      else SLURM_NTASKS_PER_NODE, else 1) and a colocated\n"
	"                      server, each node started by a job step of its own\n"
	"                      (srun --nodes=1 --nodelist=NODE --overlap; the secret\n"
	"                      on its stdin); scancel stops everything\n"
	"      --cpu-server-nodes K\n"
	"                      with --slurm: the allocation's last K nodes run one\n"
	"                      CPU-only server each, and no workers\n"
	"      --srun-args ARGS\n"
	"                      more options for each srun (\"--gpus-per-node=8\", say)\n"
	"      --worker-netns NS,NS,...\n"
	"                      run machine i's workers in network namespace NS_i\n"
	"                      (/run/netns/NS_i; one per machine): an emulated\n"
	"                      cluster, see bench/cluster/netns.sh\n"
	"      --server-netns NS,NS,...\n"
	"                      run server j in NS_j: a worker machine's namespace\n"
	"                      makes it colocated, any other a CPU-only server\n"
	"      --worker-racks R,R,...\n"
	"      --server-racks R,R,...\n"
	"                      UNISUM_RACK of each machine's workers (one per\n"
	"                      machine) and of each server (one per server): process\n"
	"                      sets and dssync groups within a rack go on its servers\n"
	"      --scheduler-netns NS\n"
	"                      the scheduler's namespace (default: machine 0's)\n"
	"      --timeout SEC   stop everything and exit 124 after SEC seconds\n"
	"                      (default 0: no limit)\n"
	"      --no-secret     no job secret: connections are not authenticated\n"
	"                      (by default a fresh UNISUM_SECRET is made for the job\n"
	"                      unless UNISUM_SECRET or UNISUM_SECRET_FILE is set)\n"
	"      --metrics[=PORT] the scheduler serves Prometheus metrics at\n"
	"                      http://ADDR:PORT/metrics and a live page at /\n"
	"                      (PORT: a free one); `unisum top` reads them\n"
	"      --cpu-report    at the end, the CPU each process used (user and\n"
	"                      system seconds, as `time` gives them) and its\n"
	"                      context switches, by process and by role; the\n"
	"                      launcher's own line holds its scheduler\n"
	"  -h, --help          print this help\n"
	"\n"
	"Every process gets UNISUM_JOB_ID (a fresh one unless it is set), which\n"
	"names the job's shared-memory segments in /dev/shm; segments left by dead\n"
	"jobs are removed at start, and the job's own when it ends.\n"
	"\n"
	"Exit status: " LAUNCH_EXIT_STATUS_TEXT;

static void usage(FILE *out)
{
	fputs(launch_help, out);
}

/* Matches option `arg` against -x / --long, in the forms "-x V", "-xV",
 * "--long V" and "--long=V".  Returns 1 with *value set, 0 when it is
 * another option, -1 when the value is missing. */
static int option_match(int argc, char **argv, int *i, const char *shortname,
			const char *longname, const char **value)
{
	const char *arg = argv[*i];
	size_t longlen = strlen(longname);

	if ((shortname && strcmp(arg, shortname) == 0) || strcmp(arg, longname) == 0) {
		if (*i + 1 >= argc)
			return -1;
		*value = argv[++*i];
		return 1;
	}
	if (strncmp(arg, longname, longlen) == 0 && arg[longlen] == '=') {
		*value = arg + longlen + 1;
		return 1;
	}
	if (shortname && strncmp(arg, shortname, 2) == 0 && arg[2] != '\0') {
		*value = arg + 2;
		return 1;
	}
	return 0;
}

/* Parses a count of processes (1..max). */
static int parse_count(const char *name, const char *value, int max, int *out)
{
	char *end;
	long v;

	errno = 0;
	v = strtol(value, &end, 10);
	if (errno || end == value || *end != '\0' || v < 1 || v > max) {
		fprintf(stderr, "unisum launch: %s needs a number of processes from 1 to %d, "
			"got '%s'\n", name, max, value);
		return -1;
	}
	*out = (int)v;
	return 0;
}

/* Parses a --worker-racks / --server-racks list of `want` racks (numbers
 * from 0) into *out (malloc'd). */
static int parse_racks(const char *option, const char *list, int want, int **out)
{
	int *racks = calloc((size_t)(want > 0 ? want : 1), sizeof *racks);
	int n = 0;
	const char *p = list;
	if (racks == NULL) {
		fprintf(stderr, "unisum launch: out of memory\n");
		return -1;
	}
	while (*p != '\0') {
		char *end;
		errno = 0;
		long v = strtol(p, &end, 10);
		if (n == want) {
			n++;	/* one too many: said below */
			break;
		}
		if (errno || end == p || (*end != ',' && *end != '\0') || v < 0 || v > (1 << 30)) {
			fprintf(stderr, "unisum launch: %s needs %d rack numbers (0 .. %d), separated by "
				"commas, got '%s'\n", option, want, 1 << 30, list);
			free(racks);
			return -1;
		}
		racks[n++] = (int)v;
		p = *end == ',' && end[1] != '\0' ? end + 1 : end;
		if (*end == ',' && end[1] == '\0') {
			fprintf(stderr, "unisum launch: %s ends with a comma: '%s'\n", option, list);
			free(racks);
			return -1;
		}
	}
	if (n != want) {
		fprintf(stderr, "unisum launch: %s names %s racks than the job's %d %s\n", option,
			n > want ? "more" : "fewer", want,
			option[2] == 'w' ? "machines (workers / --local-size)" : "servers");
		free(racks);
		return -1;
	}
	*out = racks;
	return 0;
}

int launch_racks_setup(struct launcher *l)
{
	if (l->worker_racks_opt != NULL &&
	    parse_racks("--worker-racks", l->worker_racks_opt, l->machines, &l->machine_rack) < 0)
		return -1;
	if (l->server_racks_opt != NULL &&
	    parse_racks("--server-racks", l->server_racks_opt, l->num_servers, &l->server_rack) < 0)
		return -1;
	return 0;
}

/* Parses --timeout's (or --start-timeout's) number of seconds (0 for
 * none). */
static int parse_seconds(const char *option, const char *value, double *out)
{
	char *end;

	errno = 0;
	*out = strtod(value, &end);
	if (errno || end == value || *end != '\0' || !(*out >= 0) || *out > 1e9) {
		fprintf(stderr, "unisum launch: %s needs a number of seconds "
			"(0 for none), got '%s'\n", option, value);
		return -1;
	}
	return 0;
}

/* Checks that an option's words (--ssh-args, --srun-args) split as a
 * shell would split them. */
static int parse_words(const char *option, const char *value)
{
	if (shellwords_split((char *)value, NULL) < 0) {	/* counting: value untouched */
		fprintf(stderr, "unisum launch: %s: a quote is not closed: %s\n", option, value);
		return -1;
	}
	return 0;
}

/* The options whose value is kept as given, and checked once every option
 * is read (launch_options_check); `job`: they describe a whole job (the
 * first form's), as -w does. */
static const struct text_option {
	const char *shortname, *longname;
	size_t at;			/* offsetof(struct launcher, the const char * it sets) */
	bool job;
} text_options[] = {
	{"-H", "--hosts", offsetof(struct launcher, hosts_opt), false},
	{NULL, "--hostfile", offsetof(struct launcher, hostfile_opt), false},
	{NULL, "--cpu-server-nodes", offsetof(struct launcher, cpu_server_nodes_opt), false},
	{NULL, "--server-hosts", offsetof(struct launcher, server_hosts_opt), false},
	{NULL, "--cpu-servers", offsetof(struct launcher, cpu_servers_opt), false},
	{NULL, "--nnodes", offsetof(struct launcher, nnodes_opt), false},
	{NULL, "--node-rank", offsetof(struct launcher, node_rank_opt), false},
	{NULL, "--master-addr", offsetof(struct launcher, master_addr_opt), false},
	{NULL, "--master-port", offsetof(struct launcher, master_port_opt), false},
	{NULL, "--worker-netns", offsetof(struct launcher, worker_netns_opt), true},
	{NULL, "--server-netns", offsetof(struct launcher, server_netns_opt), true},
	{NULL, "--worker-racks", offsetof(struct launcher, worker_racks_opt), true},
	{NULL, "--server-racks", offsetof(struct launcher, server_racks_opt), true},
	{NULL, "--scheduler-netns", offsetof(struct launcher, sched_netns_opt), true},
};

/* The options without a value: each sets a bool of struct launcher. */
static const struct flag_option {
	const char *name;
	size_t at;			/* offsetof(struct launcher, the bool it sets) */
} flag_options[] = {
	{"--scheduler-host", offsetof(struct launcher, sched_on_host)},
	{"--run-scheduler", offsetof(struct launcher, run_scheduler)},
	{"--no-scheduler", offsetof(struct launcher, no_scheduler)},
	{"--no-colocated-servers", offsetof(struct launcher, no_colocated)},
	{"--slurm", offsetof(struct launcher, slurm)},
	{"--remote", offsetof(struct launcher, remote)},
	{"--server-only", offsetof(struct launcher, server_only)},
	{"--no-secret", offsetof(struct launcher, no_secret)},
	{"--cpu-report", offsetof(struct launcher, cpu_report)},
};

/* argv[*i] as one of the tables' options: 1 when it is one (taken; a
 * value's option also sets *job_option when it describes a whole job), 0
 * when not, -1 when its value is missing (said). */
static int options_take_tabled(struct launcher *l, int argc, char **argv, int *i,
			       const char **job_option)
{
	const char *arg = argv[*i];
	const char *value = NULL;

	for (size_t k = 0; k < sizeof flag_options / sizeof flag_options[0]; k++) {
		if (strcmp(arg, flag_options[k].name) == 0) {
			*(bool *)((char *)l + flag_options[k].at) = true;
			return 1;
		}
	}
	for (size_t k = 0; k < sizeof text_options / sizeof text_options[0]; k++) {
		const struct text_option *o = &text_options[k];
		int m = option_match(argc, argv, i, o->shortname, o->longname, &value);
		if (m == 0)
			continue;
		if (m < 0) {
			fprintf(stderr, "unisum launch: %s needs a value\n", arg);
			return -1;
		}
		*(const char **)((char *)l + o->at) = value;
		if (o->job)
			*job_option = arg;
		return 1;
	}
	return 0;
}

/* Takes the option at argv[*i] and its value, moving *i past them; notes
 * in *job_option the last option seen that belongs to the whole-job form,
 * and in *nproc the value of --nproc-per-node.  Returns 0, 1 when it is no
 * option of launch's (nothing printed), or -1 after printing why. */
static int options_take(struct launcher *l, int argc, char **argv, int *i,
			const char **job_option, int *nproc)
{
	const char *arg = argv[*i];
	const char *value = NULL;
	int m;

	if ((m = options_take_tabled(l, argc, argv, i, job_option)) != 0)
		return m > 0 ? 0 : -1;
	if (strcmp(arg, "--metrics") == 0 || strncmp(arg, "--metrics=", 10) == 0) {
		/* --metrics alone: a free port (its value is never the next word). */
		char *end = NULL;
		long port = arg[9] == '=' ? strtol(arg + 10, &end, 10) : -1;
		if (end != NULL && (end == arg + 10 || *end != '\0' || port < 1 || port > 65535)) {
			fprintf(stderr, "unisum launch: --metrics=PORT needs a port from 1 to 65535, "
				"got '%s'\n", arg + 10);
			return -1;
		}
		l->metrics_port = (int)port;
		return 0;
	}
	if ((m = option_match(argc, argv, i, "-w", "--workers", &value)) != 0) {
		if (m < 0 || parse_count("--workers", value, LAUNCH_PROCESSES_MAX,
					 &l->num_workers) < 0)
			goto out_bad_value;
		*job_option = arg;
	} else if ((m = option_match(argc, argv, i, "-s", "--servers", &value)) != 0) {
		if (m < 0 || parse_count("--servers", value, LAUNCH_PROCESSES_MAX,
					 &l->num_servers) < 0)
			goto out_bad_value;
		*job_option = arg;
	} else if ((m = option_match(argc, argv, i, NULL, "--local-size", &value)) != 0) {
		if (m < 0 || parse_count("--local-size", value, LAUNCH_LOCAL_MAX,
					 &l->local_size) < 0)
			goto out_bad_value;
		*job_option = arg;
	} else if ((m = option_match(argc, argv, i, NULL, "--nproc-per-node", &value)) != 0) {
		if (m < 0 || parse_count("--nproc-per-node", value, LAUNCH_LOCAL_MAX, nproc) < 0)
			goto out_bad_value;
	} else if ((m = option_match(argc, argv, i, NULL, "--ssh-args", &value)) != 0) {
		if (m < 0 || parse_words("--ssh-args", value) < 0)
			goto out_bad_value;
		l->ssh_args_opt = value;
	} else if ((m = option_match(argc, argv, i, NULL, "--srun-args", &value)) != 0) {
		if (m < 0 || parse_words("--srun-args", value) < 0)
			goto out_bad_value;
		l->srun_args_opt = value;
	} else if ((m = option_match(argc, argv, i, NULL, "--start-timeout", &value)) != 0) {
		if (m < 0 || parse_seconds("--start-timeout", value, &l->start_timeout_s) < 0)
			goto out_bad_value;
	} else if ((m = option_match(argc, argv, i, NULL, "--timeout", &value)) != 0) {
		if (m < 0 || parse_seconds("--timeout", value, &l->timeout_s) < 0)
			goto out_bad_value;
	} else if ((m = launch_elastic_option(l, argc, argv, i)) <= 0) {
		if (m < 0)
			return -1;
		*job_option = l->elastic ? "--elastic" : *job_option;
	} else {
		return 1;
	}
	return 0;

out_bad_value:
	/* A malformed value was reported already; a missing one is here. */
	if (m < 0)
		fprintf(stderr, "unisum launch: %s needs a value\n", arg);
	return -1;
}

/* The options that need another one (--no-colocated-servers,
 * --scheduler-host, --run-scheduler) or exclude some (--elastic): 0, or
 * -1 after printing why. */
static int options_check_pairs(const struct launcher *l, int nproc)
{
	if ((l->elastic || l->min_workers || l->max_workers || l->discovery_script) &&
	    (l->hosts_opt || l->hostfile_opt || l->slurm || nproc > 0 || l->server_only ||
	     l->remote)) {
		fprintf(stderr, "unisum launch: --elastic (and --min-workers, --max-workers, "
			"--host-discovery-script) runs a whole job on this host (-w, -s): it does not "
			"go with -H, --hostfile, --slurm or --nproc-per-node yet\n");
		return -1;
	}
	if (l->no_colocated && !(l->server_hosts_opt || l->cpu_server_nodes_opt || l->cpu_servers_opt)) {
		fprintf(stderr, "unisum launch: --no-colocated-servers leaves the job the CPU-only "
			"servers alone: give some (--server-hosts with -H, --cpu-server-nodes with "
			"--slurm, --cpu-servers with --nnodes)\n");
		return -1;
	}
	if ((l->sched_on_host && !(l->hosts_opt || l->hostfile_opt || l->slurm)) ||
	    (l->run_scheduler && !(l->remote && l->node_rank_opt && strcmp(l->node_rank_opt, "0") == 0))) {
		fprintf(stderr, "unisum launch: --scheduler-host goes with -H, --hostfile or --slurm "
			"(--run-scheduler is how such a launcher starts node 0)\n");
		return -1;
	}
	if (l->no_scheduler && (nproc <= 0 || l->hosts_opt || l->hostfile_opt || l->slurm)) {
		fprintf(stderr, "unisum launch: --no-scheduler goes with --nproc-per-node and the "
			"node options (a node of a multi-node job whose scheduler runs on its own, "
			"`unisum launch --scheduler` at --master-addr)\n");
		return -1;
	}
	return 0;
}

/* --server-only: one CPU-only server of a multi-node job, with the node
 * options, no workers and no command.  0, or -1 after printing why. */
static int options_check_server_only(struct launcher *l, const char *job_option, int nproc)
{
	/* A CPU-only server of a multi-node job: the node options, no
	 * workers, no command. */
	if (nproc > 0 || job_option || (l->cmd && l->cmd[0]) || !l->nnodes_opt || l->slurm ||
	    !l->master_addr_opt || !l->master_port_opt || l->node_rank_opt || l->hosts_opt ||
	    l->hostfile_opt || l->ssh_args_opt || l->server_hosts_opt || l->start_timeout_s >= 0) {
		fprintf(stderr, "unisum launch: --server-only starts one CPU-only server of a "
			"multi-node job: it needs --nnodes, --master-addr and --master-port (and "
			"--cpu-servers), and takes no command\n");
		return -1;
	}
	l->one_machine = true;
	l->local_size = 1;	/* no worker is started: see launch_children_init */
	return launch_node_resolve(l);
}

/* A whole job on this host (-w, -s, --local-size, an emulated cluster's
 * namespaces): its machines.  0, or -1 after printing why. */
static int options_check_whole_job(struct launcher *l)
{
	if (l->local_size == 0) {
		/* One host, one machine: the shared-memory path by default. */
		if (l->num_workers > LAUNCH_LOCAL_MAX) {
			fprintf(stderr, "unisum launch: %d workers are too many for one machine "
				"(at most %d); pass --local-size to split them\n", l->num_workers,
				LAUNCH_LOCAL_MAX);
			return -1;
		}
		l->local_size = l->num_workers;
	}
	if (l->num_workers % l->local_size != 0) {
		fprintf(stderr, "unisum launch: --local-size %d does not divide --workers %d: "
			"every machine holds the same number of workers\n", l->local_size,
			l->num_workers);
		return -1;
	}
	l->machines = l->num_workers / l->local_size;
	if (launch_elastic_check(l) < 0)
		return -1;
	if ((l->worker_netns_opt != NULL) != (l->server_netns_opt != NULL) ||
	    (l->sched_netns_opt != NULL && l->worker_netns_opt == NULL)) {
		fprintf(stderr, "unisum launch: --worker-netns and --server-netns go together (and "
			"--scheduler-netns needs them): every process of an emulated cluster runs in "
			"a namespace\n");
		return -1;
	}
	return 0;
}

/* Checks that the options go together, and derives the job's shape from
 * them: one machine of a job (--nproc-per-node), or a whole job of
 * l->machines machines.  Returns 0, or -1 after printing why (the caller
 * prints the usage lines). */
int launch_options_check(struct launcher *l, const char *job_option, int nproc)
{
	if (options_check_pairs(l, nproc) < 0)
		return -1;
	if (l->server_only)
		return options_check_server_only(l, job_option, nproc);
	if (!l->cmd || !l->cmd[0]) {
		fprintf(stderr, "unisum launch: no command to run\n");
		return -1;
	}
	if (l->slurm) {
		if (job_option || l->remote || l->nnodes_opt || l->node_rank_opt || l->master_addr_opt ||
		    l->master_port_opt || l->cpu_servers_opt || l->hosts_opt || l->hostfile_opt ||
		    l->ssh_args_opt || l->server_hosts_opt || l->start_timeout_s >= 0) {
			fprintf(stderr, "unisum launch: --slurm takes the job's shape from the "
				"allocation (--nproc-per-node workers per node, --cpu-server-nodes for "
				"CPU-only servers): %s does not go with it\n",
				job_option ? job_option : l->remote ? "--remote" : l->hosts_opt ||
				l->hostfile_opt ? "-H/--hostfile" : l->ssh_args_opt || l->server_hosts_opt ||
				l->start_timeout_s >= 0 ? "an option of -H" : "a node option");
			return -1;
		}
		return launch_slurm_setup(l, nproc);
	}
	if (l->srun_args_opt || l->cpu_server_nodes_opt) {
		fprintf(stderr, "unisum launch: --srun-args and --cpu-server-nodes go with --slurm\n");
		return -1;
	}
	if (l->hosts_opt || l->hostfile_opt) {
		if (job_option || nproc > 0 || l->remote || l->nnodes_opt || l->node_rank_opt ||
		    l->master_addr_opt || l->master_port_opt || l->cpu_servers_opt) {
			fprintf(stderr, "unisum launch: -H and --hostfile take the job's shape from the "
				"hosts (--server-hosts for CPU-only servers): %s does not go with them\n",
				job_option ? job_option : nproc > 0 ? "--nproc-per-node" : l->remote ?
				"--remote" : "a node option");
			return -1;
		}
		return launch_hosts_setup(l);
	}
	if (l->server_hosts_opt || (!l->elastic && (l->ssh_args_opt || l->start_timeout_s >= 0))) {
		fprintf(stderr, "unisum launch: --ssh-args, --start-timeout and --server-hosts go "
			"with -H or --hostfile (the first two with --elastic too)\n");
		return -1;
	}
	if (l->remote && (nproc == 0 || !(l->nnodes_opt && l->node_rank_opt && l->master_addr_opt &&
					   l->master_port_opt))) {
		fprintf(stderr, "unisum launch: --remote is how a launcher started with -H starts a "
			"node over ssh: it needs --nproc-per-node, --nnodes, --node-rank, --master-addr "
			"and --master-port\n");
		return -1;
	}
	if (nproc > 0) {
		if (job_option) {
			fprintf(stderr, "unisum launch: %s does not go with --nproc-per-node, which "
				"starts one machine of a job described by the environment\n",
				job_option);
			return -1;
		}
		l->one_machine = true;
		l->local_size = nproc;
		l->num_servers = 0;
		return launch_node_resolve(l);
	}
	if (l->nnodes_opt || l->node_rank_opt || l->master_addr_opt || l->master_port_opt ||
	    l->cpu_servers_opt) {
		fprintf(stderr, "unisum launch: --nnodes, --node-rank, --master-addr, "
			"--master-port and --cpu-servers start one node of a multi-node job: they go "
			"with --nproc-per-node\n");
		return -1;
	}
	return options_check_whole_job(l);
}

int launch_options_parse(struct launcher *l, int argc, char **argv)
{
	const char *job_option = NULL;	/* an option of the whole-job form, seen */
	int nproc = 0;			/* --nproc-per-node */
	int rc;

	l->num_workers = 2;
	l->num_servers = 1;
	l->timeout_s = 0;
	l->cmd = NULL;

	for (int i = 1; i < argc; i++) {
		const char *arg = argv[i];

		if (strcmp(arg, "--") == 0) {
			l->cmd = &argv[i + 1];
			break;
		}
		if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0) {
			usage(stdout);
			return 1;
		}
		if (arg[0] != '-' || arg[1] == '\0') {
			l->cmd = &argv[i];
			break;
		}
		rc = options_take(l, argc, argv, &i, &job_option, &nproc);
		if (rc < 0)
			return -1;
		if (rc > 0) {
			fprintf(stderr, "unisum launch: unknown option '%s'\n", arg);
			goto out_usage;
		}
	}
	if (launch_options_check(l, job_option, nproc) < 0)
		goto out_usage;
	return 0;

out_usage:
	fputs(LAUNCH_USAGE_LINES "       (unisum launch --help for more)\n", stderr);
	return -1;
}
