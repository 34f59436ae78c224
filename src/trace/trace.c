/*
 * trace.c - the timeline (see trace.h): a ring of fixed-size records
 * filled by the pipeline's threads and drained by one writer thread into
 * Chrome trace-event JSON.
 */
#include "trace/trace.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <sys/prctl.h>

#include "config/config.h"
#include "log/log.h"
#include "timing/timing.h"
#include "unisum.h"

#define TRACE_RING 65536	/* records; a few MB, drained ten times a second */
#define TRACE_LANE(tensor, part) ((long long)(tensor) * 131072 + (part))	/* part <= 65536 */

struct trace_rec {
	uint8_t kind;
	int tensor;
	uint32_t part, round;
	uint64_t key, bytes, order;
	int64_t start_us, end_us;
};

struct trace_tensor {
	char *name;
	uint32_t nparts;
	uint8_t *named;		/* writer-owned: lanes already named, [nparts + 1] */
};

static struct {
	atomic_bool on;
	uint32_t start_step, end_step;
	int rank;
	int64_t origin_ns;
	FILE *file;
	char path[1200];
	pthread_t writer;
	pthread_mutex_t lock;	/* the ring; held for a copy, never for I/O */
	pthread_cond_t cond;
	pthread_mutex_t names_lock;	/* the tensor table (declares and the writer) */
	struct trace_rec *ring;	/* [TRACE_RING] */
	size_t head, count;	/* oldest record, number of records */
	uint64_t dropped;
	bool closing;
	struct trace_tensor *tensors;
	int ntensors, captensors;
	bool wrote_event;	/* a comma goes before the next event */
} tr = {.lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER,
      .names_lock = PTHREAD_MUTEX_INITIALIZER};

int64_t trace_now_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	int64_t ns = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
	return (ns - tr.origin_ns) / 1000;
}

bool trace_wants(uint32_t round)
{
	return atomic_load_explicit(&tr.on, memory_order_relaxed) && round >= tr.start_step &&
	       round <= tr.end_step;
}

void trace_name_tensor(int tensor, const char *name, uint32_t nparts)
{
	if (!atomic_load(&tr.on) || tensor < 0)
		return;
	pthread_mutex_lock(&tr.names_lock);
	if (tensor >= tr.captensors) {
		int cap = tr.captensors ? tr.captensors : 64;
		while (cap <= tensor)
			cap *= 2;
		struct trace_tensor *t = realloc(tr.tensors, (size_t)cap * sizeof *t);
		if (t == NULL) {
			pthread_mutex_unlock(&tr.names_lock);
			return;
		}
		memset(t + tr.captensors, 0, (size_t)(cap - tr.captensors) * sizeof *t);
		tr.tensors = t;
		tr.captensors = cap;
	}
	struct trace_tensor *t = &tr.tensors[tensor];
	if (t->name != NULL && strcmp(t->name, name) != 0) {
		/* The id was undeclared and given to another tensor: its
		 * lanes are named anew (records still queued of the old one
		 * may show under the new name). */
		free(t->name);
		free(t->named);
		t->name = NULL;
		t->named = NULL;
	}
	if (t->name == NULL) {
		t->name = strdup(name);
		t->nparts = nparts;
		t->named = calloc((size_t)nparts + 1, 1);
	} else if (nparts > t->nparts && t->named != NULL) {
		/* Autotune cut it into more partitions: more rows. */
		uint8_t *named = realloc(t->named, (size_t)nparts + 1);
		if (named != NULL) {
			memset(named + t->nparts + 1, 0, nparts - t->nparts);
			t->named = named;
			t->nparts = nparts;
		}
	}
	if (tensor >= tr.ntensors)
		tr.ntensors = tensor + 1;
	pthread_mutex_unlock(&tr.names_lock);
}

void trace_span(enum trace_kind kind, int tensor, uint32_t part, uint32_t round, uint64_t key,
		uint64_t bytes, uint64_t order, int64_t start_us, int64_t end_us)
{
	pthread_mutex_lock(&tr.lock);
	if (tr.ring == NULL || tr.closing) {
		pthread_mutex_unlock(&tr.lock);
		return;
	}
	if (tr.count == TRACE_RING) {
		tr.dropped++;
	} else {
		tr.ring[(tr.head + tr.count) % TRACE_RING] = (struct trace_rec){
			.kind = (uint8_t)kind, .tensor = tensor, .part = part, .round = round,
			.key = key, .bytes = bytes, .order = order, .start_us = start_us,
			.end_us = end_us};
		if (++tr.count == TRACE_RING / 2)
			pthread_cond_signal(&tr.cond);
	}
	pthread_mutex_unlock(&tr.lock);
}

/* ---- writer ------------------------------------------------------------- */

static void json_string(FILE *f, const char *s)
{
	fputc('"', f);
	for (; *s; s++) {
		unsigned char ch = (unsigned char)*s;
		if (ch == '"' || ch == '\\')
			fprintf(f, "\\%c", ch);
		else if (ch < 0x20)
			fprintf(f, "\\u%04x", ch);
		else
			fputc(ch, f);
	}
	fputc('"', f);
}

static void begin_event(void)
{
	fputs(tr.wrote_event ? ",\n" : "\n", tr.file);
	tr.wrote_event = true;
}

/* Names a lane (a row in the viewer) the first time it is used.  The
 * caller holds names_lock. */
static void name_lane(const struct trace_tensor *t, int tensor, uint32_t part, bool whole)
{
	uint32_t slot = whole ? 0 : part + 1;
	if (t == NULL || t->named == NULL || slot > t->nparts || t->named[slot])
		return;
	t->named[slot] = 1;
	long long lane = TRACE_LANE(tensor, slot);
	begin_event();
	fprintf(tr.file, "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%lld,\"args\":{\"name\":",
		tr.rank, lane);
	if (whole) {
		json_string(tr.file, t->name);
	} else {
		char label[300];
		snprintf(label, sizeof label, "%s [%u]", t->name, part);
		json_string(tr.file, label);
	}
	fputs("}}", tr.file);
	begin_event();
	fprintf(tr.file, "{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":%d,\"tid\":%lld,"
		"\"args\":{\"sort_index\":%lld}}", tr.rank, lane, lane);
}

static const char *kind_name(uint8_t kind)
{
	switch (kind) {
	case TRACE_QUEUE: return "QUEUE";
	case TRACE_PUSH: return "PUSH";
	case TRACE_PULL: return "PULL";
	case TRACE_LOCAL_REDUCE: return "LOCAL_REDUCE";
	case TRACE_LOCAL_BROADCAST: return "LOCAL_BROADCAST";
	default: return "push_pull";
	}
}

static void write_rec(const struct trace_rec *r)
{
	FILE *f = tr.file;
	if (r->kind == TRACE_INFLIGHT) {
		begin_event();
		fprintf(f, "{\"name\":\"in flight\",\"ph\":\"C\",\"pid\":%d,\"ts\":%lld,"
			"\"args\":{\"bytes\":%llu}}", tr.rank, (long long)r->start_us,
			(unsigned long long)r->bytes);
		return;
	}
	const struct trace_tensor *t = r->tensor >= 0 && r->tensor < tr.ntensors
					       ? &tr.tensors[r->tensor]
					       : NULL;
	bool whole = r->kind == TRACE_TENSOR;
	name_lane(t, r->tensor, r->part, whole);
	long long lane = TRACE_LANE(r->tensor, whole ? 0 : r->part + 1);
	int64_t dur = r->end_us > r->start_us ? r->end_us - r->start_us : 0;
	begin_event();
	fputs("{\"name\":", f);
	json_string(f, whole ? (t != NULL && t->name != NULL ? t->name : "?") : kind_name(r->kind));
	fprintf(f, ",\"cat\":\"%s\",\"ph\":\"X\",\"pid\":%d,\"tid\":%lld,\"ts\":%lld,\"dur\":%lld,"
		"\"args\":{\"tensor\":", whole ? "tensor" : "partition", tr.rank, lane,
		(long long)r->start_us, (long long)dur);
	json_string(f, t != NULL && t->name != NULL ? t->name : "?");
	fprintf(f, ",\"round\":%u,\"key\":\"0x%llx\",\"bytes\":%llu", r->round,
		(unsigned long long)r->key, (unsigned long long)r->bytes);
	if (!whole)
		fprintf(f, ",\"part\":%u", r->part);
	if (r->kind == TRACE_QUEUE || r->kind == TRACE_PUSH)
		fprintf(f, ",\"order\":%llu", (unsigned long long)r->order);
	fputs("}}", f);
}

static void *trace_writer_main(void *arg)
{
	prctl(PR_SET_NAME, "unisum-trace"); /* for top -H, perf and gdb */
	(void)arg;
	struct trace_rec *batch = malloc(TRACE_RING * sizeof *batch);
	if (batch == NULL) {
		LOG_WARN("trace: out of memory for the writer; no timeline is written");
		return NULL;
	}
	pthread_mutex_lock(&tr.lock);
	for (;;) {
		if (tr.count == 0 && !tr.closing) {
			struct timespec until = timing_deadline(100);
			pthread_cond_timedwait(&tr.cond, &tr.lock, &until);
		}
		size_t n = 0;
		while (tr.count > 0) {
			batch[n++] = tr.ring[tr.head];
			tr.head = (tr.head + 1) % TRACE_RING;
			tr.count--;
		}
		bool done = tr.closing && n == 0;
		if (done)
			break;
		if (n == 0)
			continue;
		pthread_mutex_unlock(&tr.lock);
		pthread_mutex_lock(&tr.names_lock);
		for (size_t i = 0; i < n; i++)
			write_rec(&batch[i]);
		pthread_mutex_unlock(&tr.names_lock);
		fflush(tr.file);
		pthread_mutex_lock(&tr.lock);
	}
	pthread_mutex_unlock(&tr.lock);
	free(batch);
	return NULL;
}

/* ---- open and close ----------------------------------------------------- */

static int mkdir_p(const char *path)
{
	char tmp[1200];
	snprintf(tmp, sizeof tmp, "%s", path);
	for (char *p = tmp + 1; *p; p++) {
		if (*p != '/')
			continue;
		*p = '\0';
		if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
			return -1;
		*p = '/';
	}
	return mkdir(tmp, 0755) != 0 && errno != EEXIST ? -1 : 0;
}

/* tr.cond's timed waits run on the monotonic clock (made once). */
static pthread_once_t tr_cond_once = PTHREAD_ONCE_INIT;

static void tr_cond_init(void)
{
	timing_cond_init(&tr.cond);
}

/* Starts writing the timeline of worker `rank`, rounds start..end, to
 * the file tr.path, opened (`what` names where the path came from). */
static int trace_start_file(int rank, uint32_t start, uint32_t end, const char *what)
{
	pthread_once(&tr_cond_once, tr_cond_init);
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	tr.origin_ns = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
	tr.rank = rank;
	tr.start_step = start;
	tr.end_step = end;
	tr.file = fopen(tr.path, "w");
	if (tr.file == NULL)
		return log_fail(UNISUM_ECONFIG, "%s: cannot write %s: %s", what, tr.path,
				strerror(errno));
	tr.ring = malloc(TRACE_RING * sizeof *tr.ring);
	if (tr.ring == NULL) {
		fclose(tr.file);
		tr.file = NULL;
		return UNISUM_ENOMEM;
	}
	tr.head = tr.count = 0;
	tr.dropped = 0;
	tr.closing = false;
	tr.wrote_event = false;
	fputs("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[", tr.file);
	begin_event();
	fprintf(tr.file, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"args\":{\"name\":\"worker %d\"}}",
		rank, rank);
	if (pthread_create(&tr.writer, NULL, trace_writer_main, NULL) != 0) {
		fclose(tr.file);
		tr.file = NULL;
		free(tr.ring);
		tr.ring = NULL;
		return log_fail(UNISUM_ESYS, "trace: cannot start the writer thread");
	}
	atomic_store(&tr.on, true);
	LOG_INFO("tracing rounds %u..%u into %s", tr.start_step, tr.end_step, tr.path);
	return 0;
}

int trace_open(const struct config *cfg, int rank)
{
	if (!cfg->trace_on)
		return 0;
	char dir[1100], what[1200];
	snprintf(dir, sizeof dir, "%s/%d", cfg->trace_dir, rank);
	snprintf(what, sizeof what, "UNISUM_TRACE_DIR=%s", cfg->trace_dir);
	if (mkdir_p(dir) != 0)
		return log_fail(UNISUM_ECONFIG, "%s: cannot create %s: %s", what, dir, strerror(errno));
	snprintf(tr.path, sizeof tr.path, "%s/comm.json", dir);
	return trace_start_file(rank, (uint32_t)cfg->trace_start_step, (uint32_t)cfg->trace_end_step,
				what);
}

int trace_start(const char *path, int rank)
{
	if (atomic_load(&tr.on))
		return log_fail(UNISUM_EBUSY, "a timeline is being written to %s already; stop it first",
				tr.path);
	if (path == NULL || path[0] == '\0' || strlen(path) >= sizeof tr.path)
		return log_fail(UNISUM_EINVAL, "the timeline needs a file path of 1 to %zu characters",
				sizeof tr.path - 1);
	snprintf(tr.path, sizeof tr.path, "%s", path);
	return trace_start_file(rank, 0, UINT32_MAX, "the timeline");
}

bool trace_is_on(void)
{
	return atomic_load(&tr.on);
}

void trace_close(void)
{
	if (!atomic_load(&tr.on))
		return;
	atomic_store(&tr.on, false);
	pthread_mutex_lock(&tr.lock);
	tr.closing = true;
	pthread_cond_signal(&tr.cond);
	pthread_mutex_unlock(&tr.lock);
	pthread_join(tr.writer, NULL);
	fputs("\n]}\n", tr.file);
	if (fclose(tr.file) != 0)
		LOG_WARN("trace: writing %s failed: %s", tr.path, strerror(errno));
	tr.file = NULL;
	if (tr.dropped > 0)
		LOG_WARN("trace: %llu records were dropped (the writer fell behind); the timeline in %s "
			 "has gaps", (unsigned long long)tr.dropped, tr.path);
	pthread_mutex_lock(&tr.lock);
	free(tr.ring);
	tr.ring = NULL;
	pthread_mutex_unlock(&tr.lock);
	pthread_mutex_lock(&tr.names_lock);
	for (int i = 0; i < tr.ntensors; i++) {
		free(tr.tensors[i].name);
		free(tr.tensors[i].named);
	}
	free(tr.tensors);
	tr.tensors = NULL;
	tr.ntensors = tr.captensors = 0;
	pthread_mutex_unlock(&tr.names_lock);
}
