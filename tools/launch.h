/*
 * launch.h - the parts of `unisum launch`, private to tools/launch*.c.
 *
 * The launcher is one `struct launcher` that every part reads and edits on
 * the calling thread (only the scheduler's waiter thread also writes to it:
 * sched_rc, before it writes its byte to the waiter pipe).  Its design is
 * the header comment of tools/launch.c; each part is one file:
 *
 *   launch.c           launch_main(), the event loop and the failure policy
 *   launch_options.c   the options, the usage and help text, their checks
 *   launch_children.c  the children's environments, fork/exec, signals
 *   launch_output.c    forwarding the children's output with a prefix
 *   launch_netns.c     --worker-netns, --server-netns, --scheduler-netns
 *   launch_job.c       the job id, secret and configuration, /dev/shm
 *                      cleanup, the in-process scheduler
 *   launch_sched.c     --scheduler: the scheduler role as a child process,
 *                      restarted when it dies
 */
#ifndef UNISUM_TOOLS_LAUNCH_H
#define UNISUM_TOOLS_LAUNCH_H

#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/resource.h>
#include <sys/types.h>

#include "config/config.h"
#include "shm/shm.h"

struct rdv_scheduler;

/* Bytes buffered per child stream; a longer line is forwarded in pieces. */
#define LAUNCH_LINE_MAX (64 * 1024)

/* How many children that failed on the news of another's failure the
 * summary lists. */
#define LAUNCH_MAX_ECHOES 8

/* Exit status of a usage error. */
#define LAUNCH_EXIT_USAGE 2

enum child_role {
	CHILD_SERVER,
	CHILD_WORKER,
	CHILD_SSH,			/* -H: the ssh client running node `rank` on its host */
};

/* One of a child's output pipes, and the partial line read from it. */
struct stream {
	int fd;				/* read end, non-blocking; -1 once at EOF */
	int out_fd;			/* where its lines go: 1 or 2 */
	size_t len;			/* bytes in buf not yet forwarded */
	char buf[LAUNCH_LINE_MAX];	/* the start of the current line */
	/* A progress bar's frames ('\r') when out_fd is not a terminal
	 * (launch_output.c): the latest one is held, to go out as a line of
	 * its own at the next '\n'. */
	char *frame;			/* the held frame (malloc'd), or NULL */
	size_t frame_len;		/* ... its length; 0: none held */
	int64_t frame_out_ms;		/* when this bar last had a frame written */
	bool after_frame;		/* the last piece was a frame */
	bool cleared;			/* ... and blank: the bar was cleared */
};

/* A server or worker process. */
struct child {
	int role;			/* enum child_role */
	int rank;			/* server or worker index */
	int job_rank;			/* elastic: the rank its prefix shows, + 1 (0: none) */
	pid_t pid;			/* process id, also its process group; 0 until spawned */
	bool running;			/* spawned and not yet reaped */
	bool signalled;			/* the launcher sent it SIGTERM or SIGKILL */
	bool removed;			/* elastic: stopped because the discovery script
					 * no longer offers its slot */
	char ehost[256];		/* elastic: the host of an ssh child running one
					 * worker there ("" for every other child) */
	char prefix[80];		/* "[worker 0] ", put before each line */
	char name[96];			/* "worker 0", "host 1 (node1)": for messages */
	char **argv;			/* an ssh child's command (malloc'd), else NULL */
	char *argv_mem[3];		/* ... the strings it owns (launch_ssh_free) */
	int stdin_fd;			/* an ssh child's stdin (the secret, then EOF to stop
					 * its node), else -1 */
	int netns;			/* index in launcher.netns, -1 = the launcher's */
	struct stream out;		/* its stdout */
	struct stream err;		/* its stderr */
	struct rusage ru;		/* its CPU and switches, once reaped (wait4) */
};

/* A named network namespace a process runs in (an emulated host). */
struct netns {
	char name[64];			/* under /run/netns */
	int fd;				/* open on it, O_CLOEXEC */
	char addr[INET_ADDRSTRLEN];	/* its first non-loopback IPv4 address */
};

/* Everything the launcher knows. */
struct launcher {
	long oom_kills;			/* /proc/vmstat's oom_kill when it started */
	/* Options. */
	int num_workers;		/* -w: worker processes of the whole job */
	int num_servers;		/* -s */
	bool server_failover;		/* UNISUM_SERVER_FAILOVER with several servers */
	int local_size;			/* --local-size, or --nproc-per-node's L; 0 = not given */
	bool one_machine;		/* --nproc-per-node: one machine of a job, no
					 * scheduler and no servers here */
	double timeout_s;		/* --timeout, 0 = none */
	bool no_secret;			/* --no-secret: run without a job secret */
	bool cpu_report;		/* --cpu-report: each process's CPU at the end */
	int metrics_port;		/* --metrics[=PORT] (-1: a free one), else 0; once
					 * configured: the scheduler's metrics port (0: off) */
	char **cmd;			/* CMD ARGS..., NULL-terminated (argv's) */
	const char *worker_netns_opt;	/* --worker-netns list, or NULL */
	const char *server_netns_opt;	/* --server-netns list, or NULL */
	const char *sched_netns_opt;	/* --scheduler-netns, or NULL */
	const char *worker_racks_opt;	/* --worker-racks list, or NULL */
	const char *server_racks_opt;	/* --server-racks list, or NULL */
	int *machine_rack;		/* [machines] UNISUM_RACK of each, or NULL */
	int *server_rack;		/* [num_servers] UNISUM_RACK of each, or NULL */

	/* One node of a multi-node job (with --nproc-per-node: --nnodes,
	 * --node-rank, --master-addr, --master-port, or torchrun's and
	 * Kubeflow's variables; launch_node.c): this machine's workers, its
	 * colocated server and, on node 0, the scheduler at the master's
	 * address.  Implies one_machine. */
	bool node_mode;
	int nnodes, node_rank;		/* machines of the job, this one's index */
	int node_servers;		/* the job's servers: nnodes colocated ones, then
					 * CPU-only ones started elsewhere (--cpu-servers) */
	const char *cpu_servers_opt;
	bool no_colocated;		/* --no-colocated-servers: the nodes run workers only;
					 * the CPU-only servers are the job's servers */
	char master_addr[256];		/* where the scheduler listens (node 0) */
	int master_port;
	/* torchrun's MASTER_ADDR and MASTER_PORT for the workers (where rank 0
	 * serves torch.distributed's store); torch_port 0: left as inherited.
	 * Set by launch_torch_master(). */
	char torch_addr[256];
	int torch_port;
	const char *nnodes_opt, *node_rank_opt, *master_addr_opt, *master_port_opt;
	bool server_only;		/* --server-only: a CPU-only server of such a job, no
					 * workers, its rank taken by arrival */
	int sched_listen_port;		/* the in-process scheduler's port, 0 = any */
	int sched_grace_ms;		/* how long the scheduler may take to finish once the
					 * children are gone (0: LAUNCH_SCHED_GRACE_MS); node 0
					 * waits for the other nodes' servers and its lingering */

	/* A job over ssh (-H host:slots,... or --hostfile; launch_ssh.c): the
	 * scheduler here, every host a node started by `ssh host unisum launch
	 * --remote ...`.  The remote launcher reads the secret from its stdin
	 * and stops its node when stdin ends (the ssh connection is gone). */
	const char *hosts_opt, *hostfile_opt, *ssh_args_opt, *server_hosts_opt;
	double start_timeout_s;		/* --start-timeout (ssh's ConnectTimeout and the
					 * scheduler's UNISUM_START_TIMEOUT_MS) */
	struct launch_host {
		char name[256];		/* as given: [user@]host */
		int slots;
	} *hosts;
	int nhosts;			/* the worker hosts, then --server-hosts' */
	int nserver_hosts;		/* ... the last this many: CPU-only servers */
	char secret[256];		/* the job's secret, for the hosts' stdin ("" = none) */
	/* A job in a Slurm allocation (--slurm; launch_slurm.c): the same,
	 * with the allocation's nodes as hosts and `srun` as the transport. */
	bool slurm;
	const char *srun_args_opt;	/* --srun-args */
	const char *cpu_server_nodes_opt; /* --cpu-server-nodes K: the last K nodes */
	bool sched_on_host;		/* --scheduler-host: node 0 (the first host) runs the
					 * scheduler, not this launcher */
	bool run_scheduler;		/* --remote --run-scheduler: ... that is this node */
	bool no_scheduler;		/* --no-scheduler: node 0 runs none either (one runs
					 * at the master's address: `launch --scheduler`) */
	bool remote;			/* --remote: a node started by such a launcher */
	bool remote_stdin_open;		/* ... and its stdin has not ended yet */

	/* The shape of the job. */
	int machines;			/* UNISUM_NUM_WORKER: num_workers / local_size, or the
					 * environment's with --nproc-per-node */
	int machine;			/* --nproc-per-node: this machine's index */
	char job_id[SHM_JOB_MAX + 1];	/* UNISUM_JOB_ID of every child */
	bool job_started;		/* children may have made segments: remove them at exit */
	char sched_host[256];		/* the scheduler's address, for the start line */
	int sched_port;			/* ... and its port */

	/* Network namespaces (--worker-netns ...): every distinct one named,
	 * which of them each machine and server runs in, and the scheduler's. */
	struct netns *netns;
	int nnetns;
	int *machine_netns;		/* [machines] */
	int *server_netns;		/* [num_servers] */
	int sched_netns;		/* -1 = the launcher's own */
	char sched_addr[INET_ADDRSTRLEN];	/* where children find the scheduler */

	/* The scheduler and the thread that waits for it. */
	struct rdv_scheduler *sched;	/* freed last, once sched_done */
	int port;			/* its port */
	pthread_t waiter;		/* runs sched_waiter() (launch_job.c) */
	bool waiter_started;		/* the thread exists */
	int waiter_pipe[2];		/* the thread writes one byte when done */
	bool sched_done;		/* rdv_scheduler_wait() returned, sched_rc is valid */
	int sched_rc;			/* its result */
	int64_t sched_failed_ms;	/* when it failed while the job ran, 0 = it did not */
	int64_t echo_ms;		/* when a child failed on the news of another's failure,
					 * 0 = none (see child_is_echo() in launch.c) */
	int echo_status;		/* ... the first one's exit status */
	char echoes[LAUNCH_MAX_ECHOES][256]; /* ... what each was, for the summary */
	int nechoes;
	bool sched_abandoned;		/* the waiter never returned: it still uses this struct */

	/* Children: servers first, then workers (only workers with
	 * --nproc-per-node). */
	struct child *children;
	int nchildren;
	int devnull;			/* /dev/null, the children's stdin */
	pid_t self;			/* our pid, for the PDEATHSIG check */

	/* Descriptors open when launch_main() began; all others are kept from
	 * the children. */
	int *entry_fds;
	int nentry_fds;

	/* Signals. */
	int sigfd;			/* signalfd of SIGCHLD, SIGINT, SIGTERM, SIGHUP */
	sigset_t entry_mask;		/* the mask to give back to children */

	/* Elastic (--elastic; launch_elastic.c): workers may be lost, and the
	 * discovery script may add or remove some, between min_workers and
	 * max_workers; the job re-forms (the scheduler) instead of failing. */
	bool elastic;
	int min_workers, max_workers;	/* 0 until given */
	const char *discovery_script;	/* --host-discovery-script, or NULL */
	int64_t discovery_next_ms;	/* when it runs next */
	int cap_children;		/* children's room: servers + max_workers */
	int next_worker;		/* the next new worker's number (names only) */
	unsigned prefix_books;		/* the scheduler's address books when the workers'
					 * prefixes last followed their ranks */
	bool elastic_ending;		/* a worker finished (exited 0): the job is ending,
					 * no worker is started any more */
	char discovery_warned[8][64];	/* hosts not this one, said once each */
	int ndiscovery_warned;
	struct launch_failing {
		char host[256];		/* "" for this one */
		int fails;		/* its workers that failed */
	} failing[64];			/* at LAUNCH_ELASTIC_FAILS, none is started there */
	int nfailing;

	/* The job's fate. */
	int64_t start_ms;		/* when the children were started */
	int64_t workers_done_ms;	/* when the last worker exited 0, 0 = not yet */
	bool stopping;			/* a failure was declared; exit_status is set */
	int exit_status;		/* the root cause's status */
	int64_t kill_at_ms;		/* when stopping: when SIGKILL follows SIGTERM */
	int64_t term_at_ms;		/* when stopping: when SIGTERM goes, unless termed */
	bool termed;			/* SIGTERM was sent */
	bool killed;			/* SIGKILL was sent */
};

/* ---- launch_options.c ---------------------------------------------------- */

/* Fills the options of `l` from argv.  Returns 0, 1 when help was printed,
 * or -1 after printing a usage error. */
int launch_options_parse(struct launcher *l, int argc, char **argv);

/* Checks the options of `l` together (job_option: an option of the
 * whole-job form seen with --nproc-per-node's nproc, or NULL) and derives
 * the job's shape (local_size, machines).  0, or -1 after printing why. */
int launch_options_check(struct launcher *l, const char *job_option, int nproc);

/* ---- launch_children.c --------------------------------------------------- */

/* "server" or "worker". */
const char *launch_role_name(int role);
/* Chooses the workers' MASTER_ADDR and MASTER_PORT (l->torch_addr,
 * l->torch_port): a node of a multi-node job, the master's address and
 * the scheduler's port + 1 (the scheduler has the master's own); one
 * machine of a job the environment names, what the user set, else the
 * scheduler's address and port + 1; a job on this machine, worker 0's
 * address (127.0.0.1, or its namespace's) and a port free here.  Elastic
 * jobs and jobs over ssh leave them as they are (their nodes choose).
 * Call once the namespaces are set up. */
void launch_torch_master(struct launcher *l);

/* Allocates l->children and describes every child, none spawned yet:
 * servers first, then workers (only workers with --nproc-per-node), with
 * their rank, output prefix and namespace.  Returns 0, or -1 after
 * printing why. */
int launch_children_init(struct launcher *l);

/* Removes from environ the variables the launcher sets per child, so that
 * leftovers in the user's shell cannot clash with the rest: with
 * --nproc-per-node those that one machine sets, else every variable of the
 * job form, those of namespaces too (the namespaces are not known yet). */
void launch_env_clear(const struct launcher *l);

/* Whether environ entry `var` is one the launcher sets (or clears) for
 * some child in some form. */
bool launch_env_set_per_child(const char *var);

/* Remembers which descriptors are open now (l->entry_fds), so that no
 * child inherits one opened later.  Returns 0, or -1 when out of memory. */
int launch_fds_snapshot(struct launcher *l);

/* Starts child `c` with its output on two new pipes.  Returns 0, or -errno
 * with nothing left behind. */
int launch_child_spawn(struct launcher *l, struct child *c);

/* Sends `sig` to the process group of every running child. */
void launch_children_signal(struct launcher *l, int sig);

/* ---- launch_elastic.c ---------------------------------------------------- */

/* Takes --elastic, --min-workers, --max-workers and
 * --host-discovery-script.  0, 1 when argv[*i] is none of them, -1 after
 * printing why. */
int launch_elastic_option(struct launcher *l, int argc, char **argv, int *i);

/* Checks them against the job's shape (the one-host whole-job form, one
 * worker per machine).  0, or -1 after printing why. */
int launch_elastic_check(struct launcher *l);

/* Every loop round: runs the discovery script when due, and starts or
 * stops workers to match the slots it offers on this host. */
void launch_elastic_tick(struct launcher *l, int64_t now);

/* Each local worker's output prefix follows its rank, which a re-form
 * changes ("[worker 0] " for the rank-0 worker whatever it was started as);
 * a worker not (yet) in the job keeps the name it was started with. */
void launch_elastic_prefixes(struct launcher *l);

/* Whether worker c's end (status, described as `what`) is the elastic
 * job's to absorb: said so, and true. */
bool launch_elastic_absorbs(struct launcher *l, const struct child *c, int status,
			    const char *what);

/* ---- launch_output.c ----------------------------------------------------- */

/* Reads what the pipe has once and forwards every complete line.  Returns
 * true when more may be waiting (the read filled the buffer's free space). */
bool launch_stream_read(const struct child *c, struct stream *s);

/* Reads a stream until it is empty, within a bound in case something keeps
 * writing into it as fast as we read. */
void launch_stream_drain(const struct child *c, struct stream *s);

/* Fills `fds` with every open child stream (and `streams`/`owners` with
 * what each entry is), after `first` fixed entries.  Returns the count. */
int launch_output_fds(struct launcher *l, struct pollfd *fds, int first,
		      struct stream **streams, struct child **owners);

/* Forwards what is left in the pipes once every child is gone; a pipe that
 * a grandchild still holds open is read for LAUNCH_DRAIN_MS at most.  Then
 * closes every pipe. */
void launch_output_finish(struct launcher *l);
void launch_cpu_report(const struct launcher *l);
/* A TCP port free on this machine now (0: none found). */
int launch_free_tcp_port(void);

/* ---- launch_netns.c ------------------------------------------------------ */

/* What launch_netns_run() returns when it could not enter the namespace. */
#define LAUNCH_NETNS_NOT_ENTERED INT_MIN

/* Runs fn(arg) with the calling thread inside namespace ns (NULL: where it
 * is), then moves it back.  Returns fn's result, or LAUNCH_NETNS_NOT_ENTERED
 * after printing why.  Failing to come back aborts: the launcher must not
 * go on in a namespace it did not mean to. */
int launch_netns_run(const struct netns *ns, int (*fn)(void *), void *arg);

/* Resolves --worker-netns, --server-netns and --scheduler-netns, and where
 * the children will find the scheduler.  0, or -1 after printing why. */
int launch_netns_setup(struct launcher *l);

/* Resolves --worker-racks and --server-racks (launch_options.c): 0, or -1
 * with the reason on stderr. */
int launch_racks_setup(struct launcher *l);

/* Closes and frees what launch_netns_setup() made, also after it failed. */
void launch_netns_free(struct launcher *l);

/* ---- launch_node.c ------------------------------------------------------- */

/* With --nproc-per-node: whether this is a node of a multi-node job (a
 * --nnodes, --node-rank, --master-addr or --master-port option, or
 * MASTER_ADDR / PET_MASTER_ADDR set while UNISUM_SCHEDULER_HOST is not),
 * and if so its shape, from the options, else torchrun's NNODES,
 * NODE_RANK, MASTER_ADDR, MASTER_PORT, their PET_ forms, else Kubeflow's
 * WORLD_SIZE and RANK (pods).  Reads the environment before anything
 * clears it.  0, or -1 after printing which option or variable is wrong. */
int launch_node_resolve(struct launcher *l);

/* Puts the job a node belongs to into the environment its children and
 * the in-process scheduler read (UNISUM_SCHEDULER_HOST, _PORT,
 * UNISUM_NUM_WORKER, UNISUM_NUM_SERVER, UNISUM_WORKER_ID, UNISUM_NODE_HOST
 * unless set), and checks the secret.  0, or -1 after printing why. */
int launch_node_environ(struct launcher *l);

/* ---- launch_ssh.c -------------------------------------------------------- */

/* -H / --hostfile: reads the hosts and derives the job's shape (one
 * machine of `slots` workers and a colocated server per host).  0, or -1
 * after printing why. */
int launch_hosts_setup(struct launcher *l);

/* Adds host name (len bytes) with `slots` (text; NULL: 1) to l->hosts
 * (arg: the launcher); `from` names the option or file for errors.  0, or
 * -1 after printing why. */
int launch_host_add(void *arg, const char *name, size_t len, const char *slots, const char *from);

/* The job's shape from l->hosts: the first `worker_hosts` run hosts[0].slots
 * workers and a colocated server each, the rest a CPU-only server each. */
void launch_hosts_shape(struct launcher *l, int worker_hosts);

/* The shell command that starts node `rank` (a host's index) there:
 * `cd CWD && exec env VARS... UNISUM launch --remote ...` (malloc'd), or
 * NULL when out of memory. */
char *launch_remote_command(const struct launcher *l, int rank);

/* Whether environ entry `var` belongs to this host alone and never
 * travels to another: the job's secret (stdin carries it), id, addresses
 * and ports. */
bool launch_env_stays_here(const char *var);

/* The scheduler's address as the hosts reach it, into l->sched_addr:
 * UNISUM_BIND, else this host's address on the route to the first host.
 * 0, or -1 after printing why. */
int launch_hosts_sched_addr(struct launcher *l);

/* --scheduler-host: the scheduler runs with node 0 on the first host, at
 * its address (as this host resolves it, or Slurm's NodeAddr) and a random
 * port from 20000, into l->sched_addr and l->port; this launcher runs none
 * (sched_done).  0, or -1 after printing why. */
int launch_hosts_sched_remote(struct launcher *l);

/* Builds ssh child c's command (c->argv), once the scheduler's port is
 * known.  0, or -ENOMEM. */
int launch_ssh_argv(struct launcher *l, struct child *c);

/* Sets c->argv to pre..., the words of `extra` (shellwords_split; NULL:
 * none), post... (pre[0] is the program; both NULL-terminated, pointers
 * kept); c then owns `mem` and `remote` (also freed on failure, and either
 * NULL fails).  0, or -ENOMEM. */
int launch_transport_argv(struct child *c, const char *const *pre, const char *extra,
			  const char *const *post, char *mem, char *remote);

/* Frees what launch_ssh_argv() or launch_srun_argv() made for c. */
void launch_ssh_free(struct child *c);

/* Parses `value` (of option or variable `name`) as an integer in
 * [lo, hi] into *out; prints "NAME='VALUE' is not WHAT (LO to HI)" and
 * returns -1 when it is not. */
int launch_parse_int(const char *name, const char *value, long lo, long hi, const char *what,
		     int *out);

/* The IPv4 address of `host` into ip (INET_ADDRSTRLEN) and this host's
 * own address on the route to it (the address `host` reaches this one
 * at) into local; port only picks a route.  0, or -1 after printing why. */
int launch_route_addr(const char *host, int port, char *ip, char *local);

/* --remote: reads the job's secret, one line, from stdin into
 * UNISUM_SECRET (an empty line: no secret).  0, or -1 after printing why. */
int launch_remote_secret(void);

/* ---- launch_slurm.c ------------------------------------------------------ */

/* --slurm: the allocation's nodes (SLURM_JOB_NODELIST) as hosts of
 * --nproc-per-node's nproc workers (0: SLURM_NTASKS_PER_NODE, else 1),
 * the last --cpu-server-nodes of them CPU-only servers.  0, or -1 after
 * printing why. */
int launch_slurm_setup(struct launcher *l, int nproc);

/* Whether environ entry `var` sizes an srun step by its tasks
 * (SLURM_CPUS_PER_TASK, SLURM_GPUS_PER_TASK, SLURM_MEM_PER_CPU, ...): an
 * allocation's values, which would give a node's one-task step one task's
 * share of it.  Kept from srun's environment. */
bool launch_slurm_env_sizes_tasks(const char *var);

/* --remote in a job step: removes the step's task identity (SLURM_PROCID
 * 0 of SLURM_NTASKS 1, ...), which would tell the workers a story other
 * than their RANK and WORLD_SIZE. */
void launch_slurm_env_untask(void);

/* The address node `name` is reached at (len bytes): the NodeAddr Slurm
 * knows it by (`scontrol show node`: what slurmctld connects to), else
 * its name; it must resolve, and not to loopback (Debian's /etc/hosts maps
 * a host's own name to 127.0.1.1).  0, or -1 after printing why. */
int launch_slurm_node_addr(const char *name, char *out, size_t len);

/* Builds the srun command of child c (node c->rank), freed by
 * launch_ssh_free().  0, or -ENOMEM. */
int launch_srun_argv(struct launcher *l, struct child *c);

/* ---- launch_job.c -------------------------------------------------------- */

/* Fixes the job's identity and shape from the options and the environment,
 * before any thread exists (it edits environ): the job id, then either the
 * job this machine belongs to (--nproc-per-node; *cfg is not touched) or
 * the in-process scheduler's configuration into *cfg, the job's secret and
 * its namespaces.  Returns 0, or the exit status after printing why. */
int launch_job_configure(struct launcher *l, struct config *cfg);

/* Prints the start line: the scheduler's address, the job, the command. */
void launch_announce(const struct launcher *l);

/* Removes the segments that dead jobs left in /dev/shm. */
void launch_shm_sweep_stale(void);

/* Removes every segment of the job, once its children are gone: what a
 * worker that crashed or was killed left behind. */
void launch_shm_finish(struct launcher *l);

/* Starts the in-process scheduler and the thread that waits for it.
 * Returns 0, or -1 after printing why (with nothing left running). */
int launch_sched_start(struct launcher *l, const struct config *cfg);

/* Takes the waiter's report once its byte arrived. */
void launch_sched_collect(struct launcher *l);

/* Lets the scheduler finish once every child is gone, aborting it if it
 * does not (see "Stopping the scheduler" in launch_job.c), and folds its
 * result into the exit status. */
void launch_sched_finish(struct launcher *l);

/* `unisum launch --scheduler` (launch_sched.c): runs `unisum scheduler`,
 * again whenever it dies of a signal; its exit status. */
int launch_scheduler_role(void);

#endif /* UNISUM_TOOLS_LAUNCH_H */
