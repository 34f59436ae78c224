/*
 * config.c - the table of every environment knob, and its parser.
 *
 * To add a knob: add a field to struct config, a row to config_knobs[] and,
 * if its type is new, a case to config_parse_one(), and name it in
 * docs/ARCHITECTURE.md (its test checks).  Nothing else in unisum calls
 * getenv() for a UNISUM_/DMLC_/BYTEPS_ variable: everyone reads the
 * environment through config_load().
 */
#include "config/config.h"

#include <errno.h>
#include <limits.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "log/log.h"
#include "placement/placement.h"
#include "wire/wire.h"

enum knob_type {
	KNOB_INT,	/* decimal integer within [min, max] */
	KNOB_U64,	/* decimal unsigned 64-bit within [min, max] */
	KNOB_STRING,	/* any non-empty text that fits the field */
	KNOB_ROLE,	/* scheduler | server | worker */
	KNOB_LOG_LEVEL,	/* TRACE .. FATAL */
	KNOB_PLACEMENT,	/* optimal | even | hash */
	KNOB_AUTOTUNE,	/* auto | 0 | 1 | 2 (also off | search | fit) */
};

struct knob {
	const char *name;	/* native UNISUM_* name */
	const char *alias1;	/* BytePS / ps-lite name, or NULL */
	const char *alias2;	/* a second alias, or NULL */
	enum knob_type type;
	size_t offset;		/* field in struct config */
	size_t size;		/* field size (strings) */
	const char *defval;	/* default as text, NULL = none (required by some roles) */
	long long min, max;	/* range of numeric knobs */
	const char *meaning;	/* one line for `unisum info` */
};

#define FIELD(f) offsetof(struct config, f), sizeof(((struct config *)0)->f)

static const struct knob config_knobs[] = {
	{"UNISUM_ROLE", "DMLC_ROLE", NULL, KNOB_ROLE, FIELD(role), NULL, 0, 0,
	 "role of this process: scheduler, server or worker"},
	{"UNISUM_NUM_WORKER", "DMLC_NUM_WORKER", NULL, KNOB_INT, FIELD(num_workers), NULL, 1, 65535,
	 "number of worker machines in the job (worker processes: this x UNISUM_LOCAL_SIZE)"},
	{"UNISUM_NUM_SERVER", "DMLC_NUM_SERVER", NULL, KNOB_INT, FIELD(num_servers), NULL, 1, 65535,
	 "number of summation servers in the job"},
	{"UNISUM_SCHEDULER_HOST", "DMLC_PS_ROOT_URI", NULL, KNOB_STRING, FIELD(scheduler_host), NULL, 0, 0,
	 "address of the scheduler"},
	{"UNISUM_SCHEDULER_PORT", "DMLC_PS_ROOT_PORT", NULL, KNOB_INT, FIELD(scheduler_port), NULL, 1, 65535,
	 "port of the scheduler"},
	{"UNISUM_WORKER_ID", "DMLC_WORKER_ID", NULL, KNOB_INT, FIELD(worker_id), "-1", -1, 65534,
	 "index of this worker's machine, 0..NUM_WORKER-1 (-1: the scheduler assigns by arrival; "
	 "required when UNISUM_LOCAL_SIZE > 1)"},
	{"UNISUM_SERVER_ID", NULL, NULL, KNOB_INT, FIELD(server_id), "-1", -1, 65534,
	 "rank this server asks for (-1: the scheduler assigns by arrival)"},
	{"UNISUM_NODE_HOST", "DMLC_NODE_HOST", NULL, KNOB_STRING, FIELD(node_host), "127.0.0.1", 0, 0,
	 "address this node listens on and advertises to its peers"},
	{"UNISUM_BIND", NULL, NULL, KNOB_STRING, FIELD(bind), NULL, 0, 0,
	 "address a server or scheduler listens on (default: the address it advertises; "
	 "0.0.0.0 only when asked)"},
	{"UNISUM_PORT", "DMLC_PORT", NULL, KNOB_INT, FIELD(port), "0", 0, 65535,
	 "listening port of a server (0: any free port)"},
	{"UNISUM_LOCAL_RANK", "BYTEPS_LOCAL_RANK", NULL, KNOB_INT, FIELD(local_rank), "0", 0, 1023,
	 "rank of this worker among the workers of its machine"},
	{"UNISUM_LOCAL_SIZE", "BYTEPS_LOCAL_SIZE", NULL, KNOB_INT, FIELD(local_size), "1", 1, 1024,
	 "number of workers on this machine"},
	{"UNISUM_JOB_ID", NULL, NULL, KNOB_STRING, FIELD(job_id), NULL, 0, 0,
	 "names the shared memory of a machine's workers: 1-64 of [A-Za-z0-9_-] "
	 "(default: from the scheduler's port and host)"},
	{"UNISUM_PARTITION_BYTES", "BYTEPS_PARTITION_BYTES", NULL, KNOB_U64, FIELD(partition_bytes), "4096000",
	 8, 1LL << 30, "largest partition a tensor is cut into, in bytes"},
	{"UNISUM_SERVER_ENGINE_THREAD", "BYTEPS_SERVER_ENGINE_THREAD", NULL, KNOB_INT, FIELD(engine_threads),
	 "0", 0, 256, "summation threads per server (0: one per core, at most 4)"},
	{"UNISUM_IO_THREADS", NULL, NULL, KNOB_INT, FIELD(io_threads), "0", 0, 64,
	 "event-loop threads that serve a process's connections (a server's to its workers, a "
	 "worker's to the servers), whatever their number (0: a server one per core, a worker one "
	 "per 8 cores; 1 to 4)"},
	{"UNISUM_LOG_LEVEL", "BYTEPS_LOG_LEVEL", NULL, KNOB_LOG_LEVEL, FIELD(log_level), "WARNING", 0, 0,
	 "TRACE, DEBUG, INFO, WARNING, ERROR or FATAL"},
	{"UNISUM_TIMEOUT_MS", NULL, NULL, KNOB_INT, FIELD(timeout_ms), "30000", 100, INT_MAX,
	 "a node or scheduler silent this long (ms) is declared dead; also bounds connecting"},
	{"UNISUM_START_TIMEOUT_MS", NULL, NULL, KNOB_INT, FIELD(start_timeout_ms), "300000", 0, INT_MAX,
	 "every node must register with the scheduler within this long (ms) of its start, else "
	 "the job fails naming those missing (0: wait for ever, as BytePS does)"},
	{"UNISUM_METRICS_PORT", NULL, NULL, KNOB_INT, FIELD(metrics_port), "0", 0, 65535,
	 "the scheduler serves Prometheus metrics (/metrics) and a live page (/) on this port "
	 "(0: off)"},
	{"UNISUM_METRICS_ADDR", NULL, NULL, KNOB_STRING, FIELD(metrics_addr), NULL, 0, 0,
	 "address the metrics port listens on (default: the scheduler's own; 0.0.0.0 only when "
	 "asked)"},
	{"UNISUM_HEARTBEAT_MS", NULL, NULL, KNOB_INT, FIELD(heartbeat_ms), "1000", 10, INT_MAX,
	 "how often (ms) every node and the scheduler send a heartbeat"},
	{"UNISUM_LOCAL_STAGE_BYTES", NULL, NULL, KNOB_U64, FIELD(local_stage_bytes), "0", 0,
	 1LL << 50, "one machine: a tensor of at least this many bytes is staged through shared "
	 "memory instead of read straight from the other workers' memory (0: never; reading "
	 "straight was faster at every size measured, see bench/README.md)"},
	{"UNISUM_LOCAL_ARENA_BYTES", NULL, NULL, KNOB_U64, FIELD(local_arena_bytes), "268435456", 0,
	 1LL << 50, "each worker's shared arena, mapped by the other workers of its machine, for "
	 "unisum_alloc and staged tensors (pages taken as used; 0: none); what does not fit "
	 "comes from ordinary memory and goes by cross-memory attach"},
	{"UNISUM_SERVER_FAILOVER", NULL, NULL, KNOB_INT, FIELD(server_failover), "1", 0, 1,
	 "1: when a server is lost, the scheduler moves its partitions to the others and the "
	 "round completes with exact sums (lock-step tensors); 0: the job fails, naming it"},
	{"UNISUM_REPLICAS", NULL, NULL, KNOB_INT, FIELD(replicas), "1", 0, 1,
	 "1: each server copies the state of its async and SSP keys, and its compressed keys' "
	 "error feedback, after aggregation, to the next server (its backup), and answers a "
	 "pull once the backup holds it, so that failover moves those keys too (the scheduler "
	 "and every server must agree); 0: none"},
	{"UNISUM_GATHER_FAILOVER", NULL, NULL, KNOB_INT, FIELD(gather_failover), "1", 0, 1,
	 "1: each machine keeps its last push of every piece of an allgather, reduce-scatter "
	 "or alltoall (a copy of the pushed bytes each round), so that failover moves their "
	 "pieces too; 0: none, and losing a server that held one fails the job (the scheduler "
	 "and every worker must agree)"},
	{"UNISUM_ELASTIC", NULL, NULL, KNOB_INT, FIELD(elastic), "0", 0, 1,
	 "1: an elastic job (`unisum launch --elastic`): a lost worker, or workers waiting to "
	 "join, re-form the job at its new size (every worker's operations fail with "
	 "UNISUM_EMEMBERSHIP and it calls unisum_rejoin) instead of failing it; one worker per "
	 "machine, lock-step tensors only"},
	{"UNISUM_ELASTIC_MIN_WORKERS", NULL, NULL, KNOB_INT, FIELD(elastic_min_workers), "1", 1,
	 65535, "an elastic job fails when fewer workers than this are left"},
	{"UNISUM_TRANSPORT", NULL, NULL, KNOB_STRING, FIELD(transport), "tcp", 0, 0,
	 "how workers and servers move data between hosts (and on one host with UNISUM_IPC=0): "
	 "tcp, or ucx (UCX's active messages over whatever UCX picks: InfiniBand, RoCE, TCP, "
	 "shared memory; UCX_TLS, UCX_NET_DEVICES and UCX's other variables pass through); "
	 "every node of a job must agree (the scheduler's own link stays TCP)"},
	{"UNISUM_IPC", NULL, NULL, KNOB_INT, FIELD(ipc), "1", 0, 1,
	 "1: a worker and a server on the same host pass the data by cross-memory attach (the "
	 "socket carries headers only; BytePS's IPC mode); 0: through the socket"},
	{"UNISUM_ALLGATHER_PHASES", NULL, NULL, KNOB_INT, FIELD(allgather_phases), "-1", -1, 1,
	 "an allgather with one worker a machine and 3 ranks or more pulls the others' rows in "
	 "ring phases, one rank's rows after another, on 256 KiB partitions (every worker must "
	 "agree): -1 (auto) when the servers are on 3 hosts or more, whose links the phases "
	 "spare; 1 always; 0 never"},
	{"UNISUM_STALL_WARN_MS", NULL, NULL, KNOB_INT, FIELD(stall_warn_ms), "60000", 10, INT_MAX,
	 "a round some workers pushed and others not (on a server or a machine's shared memory), "
	 "or a barrier some entered and others not, this long (ms) is logged"},
	{"UNISUM_STALL_ABORT_MS", NULL, NULL, KNOB_INT, FIELD(stall_abort_ms), "0", 0, INT_MAX,
	 "such a stall this long (ms) fails the job on every rank (0: never)"},
	{"UNISUM_SECRET", NULL, NULL, KNOB_STRING, FIELD(secret), NULL, 0, 0,
	 "job secret: every connection proves it (HMAC handshake); `unisum launch` makes one"},
	{"UNISUM_SECRET_FILE", NULL, NULL, KNOB_STRING, FIELD(secret_file), NULL, 0, 0,
	 "file whose first line is the job secret (instead of UNISUM_SECRET)"},
	{"UNISUM_SCHEDULING_CREDIT", NULL, NULL, KNOB_U64, FIELD(credit_bytes), "0", 0, 1LL << 40,
	 "bytes of partitions a worker keeps in flight, highest priority first (0: 4 partitions)"},
	{"UNISUM_SCHEDULING_CREDIT_PARTS", "BYTEPS_SCHEDULING_CREDIT", NULL, KNOB_U64, FIELD(credit_parts),
	 "0", 0, 1 << 20, "the same in partitions, BytePS's unit (when UNISUM_SCHEDULING_CREDIT is 0)"},
	{"UNISUM_TRACE_ON", "BYTEPS_TRACE_ON", NULL, KNOB_INT, FIELD(trace_on), "0", 0, 1,
	 "1: write a timeline (Chrome trace JSON) of every partition's stages"},
	{"UNISUM_SYNC", NULL, NULL, KNOB_STRING, FIELD(sync), "sync", 0, 0,
	 "sync mode of tensors declared without one (unisum_declare_sync, DistributedOptimizer): "
	 "sync (lock-step), async, ssp:S (async, at most S steps apart), or dssync:G (groups of G "
	 "that change every step)"},
	{"UNISUM_MIN_COMPRESS_BYTES", "BYTEPS_MIN_COMPRESS_BYTES", NULL, KNOB_U64,
	 FIELD(min_compress_bytes), "65536", 0, 1LL << 40,
	 "a tensor declared with a compressor but smaller than this many bytes goes uncompressed"},
	{"UNISUM_DSSYNC_GLOBAL_EVERY", NULL, NULL, KNOB_INT, FIELD(dssync_every), "10", 0, 1 << 30,
	 "dssync:G: every this many steps averages over all workers instead of a group (0: never)"},
	{"UNISUM_DSSYNC_CROSS_EVERY", NULL, NULL, KNOB_INT, FIELD(dssync_cross_every), "4", 0,
	 1 << 30, "dssync:G with UNISUM_RACK: every this many steps the groups cross racks, the "
	 "others stay within them (0: never)"},
	{"UNISUM_DSSYNC_OVERLAP", NULL, NULL, KNOB_INT, FIELD(dssync_overlap), "1", 0, 1,
	 "dssync:G in DistributedOptimizer: 1: a step's group average runs during the next step's "
	 "compute and is loaded by the next step (D-PSGD's form); 0: each step waits for its own"},
	{"UNISUM_DSSYNC_KEEP", NULL, NULL, KNOB_INT, FIELD(dssync_keep), "8", 0, 1 << 16,
	 "dssync:G: a group's tensors stay declared while the group comes back within this many "
	 "steps, else they go once waited for (bounds the servers' memory)"},
	{"UNISUM_RACK", NULL, NULL, KNOB_INT, FIELD(rack), "-1", -1, 1 << 30,
	 "this node's rack (-1: none; on every worker or none): a process set or dssync:G group "
	 "whose workers share a rack goes on that rack's servers, and dssync:G groups stay within "
	 "racks"},
	{"UNISUM_ENABLE_ASYNC", "BYTEPS_ENABLE_ASYNC", NULL, KNOB_INT, FIELD(enable_async), "0", 0, 1,
	 "1: the same as UNISUM_SYNC=async (BytePS's name)"},
	{"UNISUM_TRACE_DIR", "BYTEPS_TRACE_DIR", NULL, KNOB_STRING, FIELD(trace_dir), "trace", 0, 0,
	 "where the timeline goes: DIR/<rank>/comm.json"},
	{"UNISUM_TRACE_START_STEP", "BYTEPS_TRACE_START_STEP", NULL, KNOB_U64, FIELD(trace_start_step), "10",
	 0, UINT32_MAX, "first training step (a tensor's round, from 0) on the timeline"},
	{"UNISUM_TRACE_END_STEP", "BYTEPS_TRACE_END_STEP", NULL, KNOB_U64, FIELD(trace_end_step), "20",
	 0, UINT32_MAX, "last training step on the timeline"},
	{"UNISUM_LAUNCHED", NULL, NULL, KNOB_INT, FIELD(launched), "0", 0, 1,
	 "set to 1 by `unisum launch` for its children (a tool then knows it runs inside a job)"},
	{"UNISUM_PLACEMENT", NULL, NULL, KNOB_PLACEMENT, FIELD(placement), "optimal", 0, 0,
	 "scheduler: how partitions go to servers: optimal (byte shares of the BytePS paper's "
	 "Theorem 1 for colocated and CPU-only servers), even (equal bytes per server) or hash "
	 "(BytePS's djb2 of the key)"},
	{"UNISUM_AUTOTUNE", NULL, NULL, KNOB_AUTOTUNE, FIELD(autotune), "auto", 0, 2,
	 "2 (fit): fit partition size and credit to the network measured in the first rounds "
	 "(partitions of about 1 ms of the measured bandwidth, a credit of 8 of them or twice the "
	 "bandwidth-delay product); 1 (search): try settings while training, then keep the best; "
	 "0 (off): keep the configured ones; auto: fit unless a partition size or credit is set"},
	{"UNISUM_AUTOTUNE_STEPS", NULL, NULL, KNOB_INT, FIELD(autotune_steps), "10", 4, 100000,
	 "training steps each autotune trial is measured over"},
};

#define KNOB_COUNT (sizeof config_knobs / sizeof config_knobs[0])

/* Which variable supplied a knob's value, for error messages. */
static const char *knob_source(const struct knob *k, const char **value)
{
	const char *names[3] = {k->name, k->alias1, k->alias2};
	for (int i = 0; i < 3; i++) {
		if (names[i] == NULL)
			continue;
		const char *v = getenv(names[i]);
		if (v != NULL) {
			*value = v;
			return names[i];
		}
	}
	*value = NULL;
	return NULL;
}

static int parse_ll(const char *s, long long *out)
{
	char *end;
	errno = 0;
	long long v = strtoll(s, &end, 10);
	if (errno != 0 || end == s || *end != '\0')
		return -1;
	*out = v;
	return 0;
}

static int role_parse(const char *s)
{
	if (strcasecmp(s, "scheduler") == 0)
		return CONFIG_ROLE_SCHEDULER;
	if (strcasecmp(s, "server") == 0)
		return CONFIG_ROLE_SERVER;
	if (strcasecmp(s, "worker") == 0)
		return CONFIG_ROLE_WORKER;
	return -1;
}

/* UNISUM_AUTOTUNE's value: CONFIG_AUTOTUNE_AUTO, 0..2, or -2 when malformed. */
static long long autotune_parse(const char *s)
{
	static const char *const names[] = {"off", "search", "fit"};
	long long v;
	if (strcasecmp(s, "auto") == 0)
		return CONFIG_AUTOTUNE_AUTO;
	for (int i = 0; i < 3; i++)
		if (strcasecmp(s, names[i]) == 0)
			return i;
	return parse_ll(s, &v) == 0 && v >= 0 ? v : -2;
}

static int config_parse_one(struct config *cfg, const struct knob *k, const char *var,
			    const char *text, char *err, size_t err_len)
{
	char *field = (char *)cfg + k->offset;
	long long v;

	switch (k->type) {
	case KNOB_INT:
	case KNOB_U64:
		if (parse_ll(text, &v) != 0 || v < k->min || v > k->max) {
			snprintf(err, err_len, "%s='%s' is not an integer in [%lld, %lld] (%s)", var,
				 text, k->min, k->max, k->meaning);
			return UNISUM_ECONFIG;
		}
		if (k->type == KNOB_INT)
			*(int *)field = (int)v;
		else
			*(uint64_t *)field = (uint64_t)v;
		return 0;
	case KNOB_STRING:
		if (text[0] == '\0' || strlen(text) >= k->size) {
			snprintf(err, err_len, "%s='%s' must be non-empty and under %zu characters (%s)",
				 var, text, k->size, k->meaning);
			return UNISUM_ECONFIG;
		}
		memcpy(field, text, strlen(text) + 1);
		return 0;
	case KNOB_ROLE:
		v = role_parse(text);
		if (v < 0) {
			snprintf(err, err_len, "%s='%s' must be scheduler, server or worker", var, text);
			return UNISUM_ECONFIG;
		}
		*(int *)field = (int)v;
		return 0;
	case KNOB_LOG_LEVEL:
		v = log_level_parse(text);
		if (v < 0) {
			snprintf(err, err_len, "%s='%s' must be TRACE, DEBUG, INFO, WARNING, ERROR or FATAL",
				 var, text);
			return UNISUM_ECONFIG;
		}
		*(int *)field = (int)v;
		return 0;
	case KNOB_AUTOTUNE:
		v = autotune_parse(text);
		if (v < CONFIG_AUTOTUNE_AUTO || v > k->max) {
			snprintf(err, err_len, "%s='%s' must be auto, 0 (off), 1 (search) or 2 (fit)", var,
				 text);
			return UNISUM_ECONFIG;
		}
		*(int *)field = (int)v;
		return 0;
	case KNOB_PLACEMENT:
		v = placement_policy_parse(text);
		if (v < 0) {
			snprintf(err, err_len, "%s='%s' must be optimal, even or hash", var, text);
			return UNISUM_ECONFIG;
		}
		*(int *)field = (int)v;
		return 0;
	}
	return UNISUM_ECONFIG;
}

/* Whether `id` is a job id fit to name shared memory: 1 to 64 characters
 * among letters, digits, '-' and '_' (src/shm's rule). */
static bool config_job_id_is_valid(const char *id)
{
	size_t n = strlen(id);
	if (n == 0 || n > 64)
		return false;
	for (size_t i = 0; i < n; i++) {
		char ch = id[i];
		bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
			  ch == '-' || ch == '_';
		if (!ok)
			return false;
	}
	return true;
}

/* Reads the first line of UNISUM_SECRET_FILE into cfg->secret. */
static int config_read_secret(struct config *cfg, char *err, size_t err_len)
{
	if (cfg->secret[0] != '\0') {
		snprintf(err, err_len, "UNISUM_SECRET and UNISUM_SECRET_FILE are both set: keep one");
		return UNISUM_ECONFIG;
	}
	FILE *f = fopen(cfg->secret_file, "r");
	if (f == NULL) {
		snprintf(err, err_len, "UNISUM_SECRET_FILE=%s cannot be read: %s", cfg->secret_file,
			 strerror(errno));
		return UNISUM_ECONFIG;
	}
	bool ok = fgets(cfg->secret, sizeof cfg->secret, f) != NULL;
	fclose(f);
	cfg->secret[strcspn(cfg->secret, "\r\n")] = '\0';
	if (!ok || cfg->secret[0] == '\0') {
		snprintf(err, err_len, "UNISUM_SECRET_FILE=%s holds no secret on its first line",
			 cfg->secret_file);
		return UNISUM_ECONFIG;
	}
	return 0;
}

/* UNISUM_AUTOTUNE=auto: fit mode, unless the user chose a partition size
 * or a credit (by any of their names), which then holds for good. */
static void config_resolve_autotune(struct config *cfg)
{
	static const size_t hand[] = {offsetof(struct config, partition_bytes),
				      offsetof(struct config, credit_bytes),
				      offsetof(struct config, credit_parts)};
	cfg->autotune = 2;
	for (size_t i = 0; i < KNOB_COUNT; i++) {
		const char *text;
		const char *var = knob_source(&config_knobs[i], &text);
		for (size_t j = 0; var != NULL && j < sizeof hand / sizeof hand[0]; j++) {
			if (config_knobs[i].offset == hand[j] && cfg->autotune_set_by[0] == '\0') {
				cfg->autotune = 0;
				snprintf(cfg->autotune_set_by, sizeof cfg->autotune_set_by, "%s", var);
			}
		}
	}
	cfg->autotune_auto = 1;
}

/* The checks of knobs against each other (ranks below their counts, the
 * job id, the secret file, the heartbeat below the timeout, the trace's
 * steps): 0, or UNISUM_ECONFIG (or the secret file's error) with err set. */
static int config_check_pairs(struct config *cfg, char *err, size_t err_len)
{
	if (cfg->local_rank >= cfg->local_size) {
		snprintf(err, err_len, "UNISUM_LOCAL_RANK=%d must be below UNISUM_LOCAL_SIZE=%d",
			 cfg->local_rank, cfg->local_size);
		return UNISUM_ECONFIG;
	}
	if (cfg->num_workers > 0 && cfg->worker_id >= cfg->num_workers) {
		snprintf(err, err_len, "UNISUM_WORKER_ID=%d must be below UNISUM_NUM_WORKER=%d",
			 cfg->worker_id, cfg->num_workers);
		return UNISUM_ECONFIG;
	}
	if (cfg->num_servers > 0 && cfg->server_id >= cfg->num_servers) {
		snprintf(err, err_len, "UNISUM_SERVER_ID=%d must be below UNISUM_NUM_SERVER=%d",
			 cfg->server_id, cfg->num_servers);
		return UNISUM_ECONFIG;
	}
	if (cfg->job_id[0] != '\0' && !config_job_id_is_valid(cfg->job_id)) {
		snprintf(err, err_len, "UNISUM_JOB_ID='%s' must be 1 to 64 characters among letters, digits, "
			 "'-' and '_' (it names the shared memory of a machine's workers)", cfg->job_id);
		return UNISUM_ECONFIG;
	}
	if (cfg->secret_file[0] != '\0') {
		int rc = config_read_secret(cfg, err, err_len);
		if (rc != 0)
			return rc;
	}
	if (cfg->heartbeat_ms >= cfg->timeout_ms) {
		snprintf(err, err_len, "UNISUM_HEARTBEAT_MS=%d must be below UNISUM_TIMEOUT_MS=%d",
			 cfg->heartbeat_ms, cfg->timeout_ms);
		return UNISUM_ECONFIG;
	}
	if (cfg->trace_end_step < cfg->trace_start_step) {
		snprintf(err, err_len, "UNISUM_TRACE_END_STEP=%llu must not be below UNISUM_TRACE_START_STEP=%llu",
			 (unsigned long long)cfg->trace_end_step,
			 (unsigned long long)cfg->trace_start_step);
		return UNISUM_ECONFIG;
	}
	return 0;
}

/* UNISUM_SYNC (and BYTEPS_ENABLE_ASYNC) against the rest: a known mode,
 * and lock-step with one worker a machine in an elastic job.  0, or
 * UNISUM_ECONFIG with err set. */
static int config_check_sync(struct config *cfg, char *err, size_t err_len)
{
	uint32_t sync_mode;
	int group;
	if (wire_sync_parse(cfg->sync, &sync_mode, &group) != 0) {
		snprintf(err, err_len, "UNISUM_SYNC='%s' must be sync, async, ssp:S (S a staleness "
			 "bound, 0 to %u) or dssync:G (G a group size, 1 to 65535)", cfg->sync,
			 WIRE_SYNC_MAX_STALENESS);
		return UNISUM_ECONFIG;
	}
	if (cfg->enable_async)
		snprintf(cfg->sync, sizeof cfg->sync, "async");
	if (cfg->elastic && cfg->local_size > 1) {
		snprintf(err, err_len, "UNISUM_LOCAL_SIZE=%d: an elastic job (UNISUM_ELASTIC=1) runs one "
			 "worker per machine (its machines come and go)", cfg->local_size);
		return UNISUM_ECONFIG;
	}
	if (cfg->elastic && (wire_sync_held(sync_mode) || cfg->enable_async)) {
		snprintf(err, err_len, "UNISUM_SYNC=%s: an elastic job (UNISUM_ELASTIC=1) is lock-step "
			 "(sync or dssync:G): asynchronous servers hold the parameters, which a re-formed "
			 "job would lose", cfg->sync);
		return UNISUM_ECONFIG;
	}
	return 0;
}

int config_load(struct config *cfg, char *err, size_t err_len)
{
	memset(cfg, 0, sizeof *cfg);
	for (size_t i = 0; i < KNOB_COUNT; i++) {
		const struct knob *k = &config_knobs[i];
		const char *text;
		const char *var = knob_source(k, &text);
		if (var == NULL) {
			if (k->defval == NULL)
				continue;
			var = k->name;
			text = k->defval;
		}
		int rc = config_parse_one(cfg, k, var, text, err, err_len);
		if (rc != 0)
			return rc;
	}
	int rc = config_check_pairs(cfg, err, err_len);
	if (rc == 0)
		rc = config_check_sync(cfg, err, err_len);
	if (rc == 0 && strcmp(cfg->transport, "tcp") != 0 && strcmp(cfg->transport, "ucx") != 0) {
		snprintf(err, err_len, "UNISUM_TRANSPORT='%s' must be tcp or ucx", cfg->transport);
		rc = UNISUM_ECONFIG;
	}
	if (rc != 0)
		return rc;
	if (cfg->autotune == CONFIG_AUTOTUNE_AUTO)
		config_resolve_autotune(cfg);
	if (cfg->credit_bytes == 0)
		cfg->credit_bytes = (cfg->credit_parts ? cfg->credit_parts : 4) * cfg->partition_bytes;
	if (cfg->engine_threads == 0)
		cfg->engine_threads = config_per_cores(1);
	return 0;
}

int config_per_cores(int cores_each)
{
	long n = sysconf(_SC_NPROCESSORS_ONLN) / cores_each;
	return n < 1 ? 1 : n > 4 ? 4 : (int)n;
}

int config_require(const struct config *cfg, int role, char *err, size_t err_len)
{
	const char *missing = NULL;
	if (role != CONFIG_ROLE_SCHEDULER && cfg->scheduler_host[0] == '\0')
		missing = "UNISUM_SCHEDULER_HOST (or DMLC_PS_ROOT_URI)";
	else if (cfg->scheduler_port == 0)
		missing = "UNISUM_SCHEDULER_PORT (or DMLC_PS_ROOT_PORT)";
	else if (cfg->num_workers == 0)
		missing = "UNISUM_NUM_WORKER (or DMLC_NUM_WORKER)";
	else if (cfg->num_servers == 0)
		missing = "UNISUM_NUM_SERVER (or DMLC_NUM_SERVER)";
	if (missing == NULL && role == CONFIG_ROLE_WORKER && cfg->local_size > 1 && cfg->worker_id < 0) {
		snprintf(err, err_len,
			 "UNISUM_LOCAL_SIZE=%d needs UNISUM_WORKER_ID (or DMLC_WORKER_ID; this machine's index, "
			 "0..NUM_WORKER-1): the workers of one machine find each other by it",
			 cfg->local_size);
		return UNISUM_ECONFIG;
	}
	if (missing == NULL)
		return 0;
	snprintf(err, err_len, "%s is not set: a %s needs it (run under `unisum launch`, or set it)",
		 missing, config_role_name(role));
	return UNISUM_ECONFIG;
}

void config_job_id(const struct config *cfg, char *out, size_t len)
{
	if (len == 0)
		return;
	if (cfg->job_id[0] != '\0') {
		snprintf(out, len, "%s", cfg->job_id);
		return;
	}
	uint32_t hash = 2166136261u;	/* 32-bit FNV-1a */
	for (const unsigned char *p = (const unsigned char *)cfg->scheduler_host; *p; p++)
		hash = (hash ^ *p) * 16777619u;
	snprintf(out, len, "p%d-%08x", cfg->scheduler_port, (unsigned)hash);
}

const char *config_role_name(int role)
{
	switch (role) {
	case CONFIG_ROLE_SCHEDULER:
		return "scheduler";
	case CONFIG_ROLE_SERVER:
		return "server";
	case CONFIG_ROLE_WORKER:
		return "worker";
	default:
		return "none";
	}
}

void config_print_man_text(FILE *out, const char *s)
{
	for (const char *line = s; *s; s++) {
		if (s == line && (*s == '.' || *s == '\''))
			fputs("\\&", out);	/* not a control line */
		if (*s == '\n')
			line = s + 1;
		if (*s == '\\')
			fputs("\\e", out);
		else if (*s == '-')
			fputs("\\-", out);
		else
			fputc(*s, out);
	}
}

void config_print_man(FILE *out)
{
	for (size_t i = 0; i < KNOB_COUNT; i++) {
		const struct knob *k = &config_knobs[i];

		fputs(".TP\n.B ", out);
		config_print_man_text(out, k->name);
		fputc('\n', out);
		config_print_man_text(out, k->meaning);
		fputs(".\n", out);
		if (k->alias1 != NULL) {
			fputs("Alias: ", out);
			config_print_man_text(out, k->alias1);
			if (k->alias2 != NULL) {
				fputs(", ", out);
				config_print_man_text(out, k->alias2);
			}
			fputs(".\n", out);
		}
		fputs("Default: ", out);
		config_print_man_text(out, k->defval ? k->defval : "none");
		fputs(".\n", out);
	}
}

void config_print(FILE *out)
{
	for (size_t i = 0; i < KNOB_COUNT; i++) {
		const struct knob *k = &config_knobs[i];
		const char *text;
		const char *var = knob_source(k, &text);
		fprintf(out, "%-28s %s\n", k->name, k->meaning);
		if (k->alias1 != NULL)
			fprintf(out, "%-28s   alias: %s%s%s\n", "", k->alias1, k->alias2 ? ", " : "",
				k->alias2 ? k->alias2 : "");
		fprintf(out, "%-28s   default: %s", "", k->defval ? k->defval : "(none)");
		if (var != NULL)
			fprintf(out, "; set: %s=%s", var,
				strcmp(k->name, "UNISUM_SECRET") == 0 ? "(hidden)" : text);
		fputc('\n', out);
	}
}
