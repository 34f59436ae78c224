/*
 * bench_model.c - `unisum bench --model NAME`: a synthetic training step
 * that replays a real model's gradients, to compare FIFO against priority
 * scheduling.
 *
 * DESIGN.  A model is its list of parameter tensors in forward order (the
 * order of torchvision's / HuggingFace's named_parameters()), generated
 * from the architecture by a short builder each: resnet50, vgg16 and
 * bert-base.  `unisum bench --model NAME --list` prints a table, so it
 * can be compared with PyTorch's.
 *
 * Run alone, the command launches itself as a local job (-w 2 -s 2 by
 * default) and then runs as every worker of it.  Each worker emulates
 * data-parallel training, once per mode, on one float32 buffer per tensor
 * (shared by the modes) with in-place push_pull and UNISUM_AVERAGE:
 *
 *   forward k:   for i = 0 .. L-1:  wait for tensor i's push_pull of
 *                                   iteration k-1 (communication blocks
 *                                   compute here), then compute fwd_i
 *   backward k:  for i = L-1 .. 0:  compute bwd_i, then push_pull_async(i)
 *
 * With UNISUM_SYNC=dssync:G it replays DS-Sync's optimizer instead, which
 * averages parameters: nothing can start before the update at the end of
 * backward, where every tensor's push_pull starts.  Overlapped
 * (UNISUM_DSSYNC_OVERLAP=1, the default) the step first waits for those
 * the last step started, which ran during this step's forward and
 * backward; with 0 it waits for its own.  The forward waits for nothing,
 * and the "first layer's wait" below is the step's wait.
 *
 * Compute is a sleep, not a busy loop: it stands for a GPU, and the CPU
 * must stay free for the network threads.  --compute-ms is split 1/3
 * forward, 2/3 backward, evenly over the tensors.  Sleeps run to absolute
 * deadlines, so timer slack does not add up over hundreds of tensors;
 * time blocked in a wait pushes the schedule back, as a stalled GPU would.
 *
 * The modes differ only in the priorities the tensors are declared with
 * (each mode declares its own names, "fifo.<i>" / "prio.<i>"):
 *   fifo      tensor i has priority i: the last layer, produced first by
 *             backward, goes first: first come, first served;
 *   priority  tensor i has priority -i: the first layer goes first, the
 *             one the next forward needs first (ByteScheduler's order).
 *
 * Measured per iteration after the warm-up: the iteration time (start of
 * forward k to start of forward k+1) and the first layer's wait (end of
 * backward k, right after tensor 0's push_pull_async, to the return of
 * its wait at the start of forward k+1).  A last forward-only pass ends
 * the last iteration and waits for everything.  The first iteration has
 * nothing to wait for, so at least one is warm-up.  Rank 0 prints the
 * header when the job is up and the table when every mode has run.
 *
 * Checking.  Worker r fills element j of tensor i with
 * ((7 i + j) mod 251) / 4 + r; every value and every sum of them is exact
 * in float32, so after the first average every worker holds exactly
 * ((7 i + j) mod 251) / 4 + (N - 1) / 2, and later averages keep it.  At
 * the end of each mode a few elements of every tensor are compared
 * exactly; any difference fails the run.  With --compressor SPEC every
 * tensor is declared compressed (unisum_declare_ex; those below
 * UNISUM_MIN_COMPRESS_BYTES go raw) and its averages are the codec's, not
 * exact: nothing is compared (tests/python/test_compress.py checks them).
 */
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "config/config.h"
#include "tools.h"
#include "unisum.h"
#include "wire/wire.h"

#define MIB (1024.0 * 1024.0)

/* ---- model tables ---------------------------------------------------------- */

/* One parameter tensor of a model. */
struct model_param {
	char name[80];		/* PyTorch's name, e.g. "layer1.0.conv2.weight" */
	size_t count;		/* elements */
};

/* A growable list of parameters in forward order. */
struct param_list {
	struct model_param *v;
	int n, cap;
	bool oom;		/* an append failed: the list is incomplete */
};

/* Appends a parameter of `count` elements named by the printf format. */
__attribute__((format(printf, 3, 4)))
static void param_add(struct param_list *l, size_t count, const char *fmt, ...)
{
	if (l->oom)
		return;
	if (l->n == l->cap) {
		int cap = l->cap ? l->cap * 2 : 64;
		struct model_param *v = realloc(l->v, (size_t)cap * sizeof *v);
		if (v == NULL) {
			l->oom = true;
			return;
		}
		l->v = v;
		l->cap = cap;
	}
	struct model_param *p = &l->v[l->n++];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(p->name, sizeof p->name, fmt, ap);
	va_end(ap);
	p->count = count;
}

/* The weight and bias of a BatchNorm or LayerNorm over `c` channels;
 * the format names the layer. */
__attribute__((format(printf, 3, 4)))
static void add_norm(struct param_list *l, size_t c, const char *fmt, ...)
{
	char prefix[64];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(prefix, sizeof prefix, fmt, ap);
	va_end(ap);
	param_add(l, c, "%s.weight", prefix);
	param_add(l, c, "%s.bias", prefix);
}

/* A Linear layer (weight out x in, bias out); the format names it. */
__attribute__((format(printf, 4, 5)))
static void add_linear(struct param_list *l, size_t in, size_t out, const char *fmt, ...)
{
	char prefix[64];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(prefix, sizeof prefix, fmt, ap);
	va_end(ap);
	param_add(l, in * out, "%s.weight", prefix);
	param_add(l, out, "%s.bias", prefix);
}

/* torchvision.models.resnet50: bottleneck blocks [3, 4, 6, 3], no conv
 * biases, a downsample (1x1 conv + BN) in the first block of each stage. */
static void build_resnet50(struct param_list *l)
{
	static const int blocks[4] = {3, 4, 6, 3};
	char prefix[48];
	size_t in = 64;

	param_add(l, 64 * 3 * 7 * 7, "conv1.weight");
	add_norm(l, 64, "bn1");
	for (int s = 0; s < 4; s++) {
		size_t width = (size_t)64 << s, out = width * 4;
		for (int b = 0; b < blocks[s]; b++) {
			snprintf(prefix, sizeof prefix, "layer%d.%d", s + 1, b);
			param_add(l, in * width, "%s.conv1.weight", prefix);
			add_norm(l, width, "%s.bn1", prefix);
			param_add(l, width * width * 9, "%s.conv2.weight", prefix);
			add_norm(l, width, "%s.bn2", prefix);
			param_add(l, width * out, "%s.conv3.weight", prefix);
			add_norm(l, out, "%s.bn3", prefix);
			if (b == 0) {
				param_add(l, in * out, "%s.downsample.0.weight", prefix);
				add_norm(l, out, "%s.downsample.1", prefix);
			}
			in = out;
		}
	}
	add_linear(l, 2048, 1000, "fc");
}

/* torchvision.models.vgg16: 13 3x3 convs with biases (configuration "D";
 * 0 marks a max-pool, which takes a slot in `features` but no
 * parameters; each conv is followed by a ReLU), then three Linear layers. */
static void build_vgg16(struct param_list *l)
{
	static const int cfg[] = {64, 64, 0, 128, 128, 0, 256, 256, 256, 0,
				  512, 512, 512, 0, 512, 512, 512, 0};
	size_t in = 3;
	int slot = 0;

	for (size_t k = 0; k < sizeof cfg / sizeof cfg[0]; k++) {
		if (cfg[k] == 0) {
			slot++;
			continue;
		}
		size_t out = (size_t)cfg[k];
		param_add(l, in * out * 9, "features.%d.weight", slot);
		param_add(l, out, "features.%d.bias", slot);
		in = out;
		slot += 2;
	}
	add_linear(l, 512 * 7 * 7, 4096, "classifier.0");
	add_linear(l, 4096, 4096, "classifier.3");
	add_linear(l, 4096, 1000, "classifier.6");
}

/* HuggingFace BertModel (bert-base-uncased) with its pooler. */
static void build_bert_base(struct param_list *l)
{
	const size_t hidden = 768, ffn = 3072, vocab = 30522, positions = 512, types = 2;
	param_add(l, vocab * hidden, "embeddings.word_embeddings.weight");
	param_add(l, positions * hidden, "embeddings.position_embeddings.weight");
	param_add(l, types * hidden, "embeddings.token_type_embeddings.weight");
	add_norm(l, hidden, "embeddings.LayerNorm");
	for (int k = 0; k < 12; k++) {
		static const char *const sublayers[] = {
			"attention.self.query", "attention.self.key", "attention.self.value",
			"attention.output.dense"};
		for (int s = 0; s < 4; s++)
			add_linear(l, hidden, hidden, "encoder.layer.%d.%s", k, sublayers[s]);
		add_norm(l, hidden, "encoder.layer.%d.attention.output.LayerNorm", k);
		add_linear(l, hidden, ffn, "encoder.layer.%d.intermediate.dense", k);
		add_linear(l, ffn, hidden, "encoder.layer.%d.output.dense", k);
		add_norm(l, hidden, "encoder.layer.%d.output.LayerNorm", k);
	}
	add_linear(l, hidden, hidden, "pooler.dense");
}

/* The models `--model` knows. */
static const struct model {
	const char *name;
	double compute_ms;		/* default --compute-ms: emulated compute per iteration */
	void (*build)(struct param_list *l);
} models[] = {
	{"resnet50", 60, build_resnet50},
	{"vgg16", 150, build_vgg16},
	{"bert-base", 120, build_bert_base},
};
#define NMODELS ((int)(sizeof models / sizeof models[0]))

static const struct model *model_find(const char *name)
{
	for (int i = 0; i < NMODELS; i++)
		if (strcmp(models[i].name, name) == 0)
			return &models[i];
	return NULL;
}

/* Fills *l with the model's parameters.  0, or -1 when out of memory
 * (the list is then freed). */
static int model_build(const struct model *m, struct param_list *l)
{
	*l = (struct param_list){0};
	m->build(l);
	if (!l->oom)
		return 0;
	free(l->v);
	*l = (struct param_list){0};
	fprintf(stderr, "unisum bench: out of memory building the table of %s\n", m->name);
	return -1;
}

static size_t param_total(const struct param_list *l)
{
	size_t total = 0;
	for (int i = 0; i < l->n; i++)
		total += l->v[i].count;
	return total;
}

/* ---- options ----------------------------------------------------------------- */

enum mode { MODE_FIFO, MODE_PRIORITY, MODE_COUNT };

static const char *const mode_names[MODE_COUNT] = {"fifo", "priority"};

struct options {
	const struct model *model;
	int workers, servers;
	int iters, warmup;
	double compute_ms;		/* < 0: the model's default */
	enum mode modes[MODE_COUNT];
	int nmodes;
	bool list;			/* print the table and exit */
	bool autotune;			/* then a second job with UNISUM_AUTOTUNE=1 */
	const char *compressor;		/* every tensor compressed (unisum_declare_ex), or NULL */
};

static void usage(FILE *out)
{
	fprintf(out,
		"usage: unisum bench --model NAME [-w WORKERS] [-s SERVERS] [--iters N] [--warmup N]\n"
		"                    [--compute-ms MS] [--modes fifo,priority] [--autotune] [--list]\n"
		"                    [--compressor SPEC]\n"
		"\n"
		"Emulates data-parallel training of NAME: every iteration a forward pass\n"
		"waits for each tensor's push_pull of the previous iteration, a backward\n"
		"pass starts one push_pull per gradient, last layer first; compute is a\n"
		"sleep of MS per iteration (1/3 forward, 2/3 backward, even per tensor).\n"
		"Each mode runs with its own priorities: fifo (the order backward makes\n"
		"the gradients) and priority (first layer first, as ByteScheduler).\n"
		"Rank 0 prints mean and median iteration time, how long the first layer\n"
		"waits for its gradient after backward ends, and priority's speedup.\n"
		"\n"
		"  models (default --compute-ms):\n");
	for (int i = 0; i < NMODELS; i++) {
		struct param_list l;
		if (model_build(&models[i], &l) != 0)
			continue;
		fprintf(out, "    %-10s %4d tensors, %12zu params, %6.1f MiB float32  (%g ms)\n",
			models[i].name, l.n, param_total(&l), (double)param_total(&l) * 4 / MIB,
			models[i].compute_ms);
		free(l.v);
	}
	fprintf(out,
		"  defaults: -w 2 -s 2 --iters 20 --warmup 3 --modes fifo,priority\n"
		"  --warmup is at least 1: the first iteration has no communication to wait for.\n"
		"  --list prints the model's tensors (name, elements) in forward order and exits.\n"
		"  --autotune then runs a second job, priority with UNISUM_AUTOTUNE=1: the\n"
		"  steps while it tries settings (11 x UNISUM_AUTOTUNE_STEPS) count as warm-up,\n"
		"  so its row shows the setting it settled on.\n");
}

/* Parses an integer in [lo, hi]; -1 after printing an error. */
static int parse_int(const char *opt, const char *value, int lo, int hi, int *out)
{
	char *end;
	errno = 0;
	long v = strtol(value, &end, 10);
	if (errno || end == value || *end != '\0' || v < lo || v > hi) {
		fprintf(stderr, "unisum bench: %s needs an integer from %d to %d, got '%s'\n", opt, lo, hi,
			value);
		return -1;
	}
	*out = (int)v;
	return 0;
}

/* Parses a comma-separated list of modes, each at most once. */
static int parse_modes(const char *value, struct options *o)
{
	char buf[128];
	snprintf(buf, sizeof buf, "%s", value);
	o->nmodes = 0;
	for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		int m = 0;
		while (m < MODE_COUNT && strcmp(tok, mode_names[m]) != 0)
			m++;
		bool seen = false;
		for (int k = 0; k < o->nmodes; k++)
			seen |= o->modes[k] == (enum mode)m;
		if (m == MODE_COUNT || seen) {
			fprintf(stderr, "unisum bench: --modes takes fifo and/or priority, each once; got '%s'\n",
				value);
			return -1;
		}
		o->modes[o->nmodes++] = (enum mode)m;
	}
	if (o->nmodes == 0) {
		fprintf(stderr, "unisum bench: --modes is empty\n");
		return -1;
	}
	return 0;
}

static void list_models(FILE *out)
{
	fprintf(out, "unisum bench: known models:");
	for (int i = 0; i < NMODELS; i++)
		fprintf(out, " %s", models[i].name);
	fprintf(out, "\n");
}

/* Fills *o from argv.  0, 1 when help was printed, -1 on a usage error. */
static int options_parse(int argc, char **argv, struct options *o)
{
	*o = (struct options){.workers = 2, .servers = 2, .iters = 20, .warmup = 3, .compute_ms = -1,
			      .modes = {MODE_FIFO, MODE_PRIORITY}, .nmodes = 2};
	const char *model = NULL;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
			usage(stdout);
			return 1;
		}
		if (strcmp(a, "--list") == 0) {
			o->list = true;
			continue;
		}
		if (strcmp(a, "--autotune") == 0) {
			o->autotune = true;
			continue;
		}
		if (strncmp(a, "--model=", 8) == 0) {
			model = a + 8;
			continue;
		}
		if (i + 1 >= argc) {
			fprintf(stderr, "unisum bench: '%s' is unknown or needs a value\n", a);
			return -1;
		}
		const char *v = argv[++i];
		int rc = 0;
		if (strcmp(a, "--model") == 0)
			model = v;
		else if (strcmp(a, "-w") == 0 || strcmp(a, "--workers") == 0)
			rc = parse_int(a, v, 1, 4096, &o->workers);
		else if (strcmp(a, "-s") == 0 || strcmp(a, "--servers") == 0)
			rc = parse_int(a, v, 1, 4096, &o->servers);
		else if (strcmp(a, "--iters") == 0)
			rc = parse_int(a, v, 1, 1000000, &o->iters);
		else if (strcmp(a, "--warmup") == 0)
			rc = parse_int(a, v, 1, 1000000, &o->warmup);
		else if (strcmp(a, "--modes") == 0)
			rc = parse_modes(v, o);
		else if (strcmp(a, "--compressor") == 0)
			o->compressor = v;
		else if (strcmp(a, "--compute-ms") == 0) {
			char *end;
			errno = 0;
			o->compute_ms = strtod(v, &end);
			if (errno || end == v || *end != '\0' || !(o->compute_ms >= 0 && o->compute_ms <= 1e6)) {
				fprintf(stderr, "unisum bench: --compute-ms needs milliseconds from 0 to 1e6, "
					"got '%s'\n", v);
				rc = -1;
			}
		} else {
			fprintf(stderr, "unisum bench: unknown option '%s'\n", a);
			rc = -1;
		}
		if (rc != 0)
			return -1;
	}
	if (model != NULL && strcmp(model, "help") == 0) {
		usage(stdout);
		return 1;
	}
	o->model = model ? model_find(model) : NULL;
	if (o->model == NULL) {
		fprintf(stderr, "unisum bench: %s '%s'\n", model ? "unknown model" : "--model needs a name",
			model ? model : "");
		list_models(stderr);
		return -1;
	}
	if (o->compute_ms < 0)
		o->compute_ms = o->model->compute_ms;
	return 0;
}

/* ---- timing -------------------------------------------------------------------- */

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Sleeps until CLOCK_MONOTONIC reaches `deadline` (seconds); returns at
 * once when it has passed. */
static void sleep_until(double deadline)
{
	struct timespec ts;
	ts.tv_sec = (time_t)deadline;
	ts.tv_nsec = (long)((deadline - (double)ts.tv_sec) * 1e9);
	if (ts.tv_nsec >= 1000000000L) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000L;
	}
	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
		;
}

static double mean(const double *v, int n)
{
	double s = 0;
	for (int i = 0; i < n; i++)
		s += v[i];
	return n ? s / n : 0;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

/* Median of v[0..n); sorts v. */
static double median(double *v, int n)
{
	if (n == 0)
		return 0;
	qsort(v, (size_t)n, sizeof *v, cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* ---- the emulated training ---------------------------------------------------- */

/* One worker's state for the whole run. */
struct trainer {
	const struct options *o;
	const struct param_list *params;
	int rank, size;
	float **bufs;			/* [L]: gradient buffers, shared by the modes */
	float **outs;			/* [L]: async / SSP: where the pulled values go (the
					 * push is a delta); else bufs (in place) */
	bool held;			/* UNISUM_SYNC is async or ssp:S */
	bool exact;			/* lock-step: the averages are checked */
	bool dssync;			/* UNISUM_SYNC is dssync:G: replays its optimizer */
	bool overlap;			/* ... with UNISUM_DSSYNC_OVERLAP=1 */
	int *ids;			/* [L]: tensor ids of the current mode */
	unisum_handle *handles;		/* [L]: in-flight push_pull, 0 = none */
	double fwd_s, bwd_s;		/* compute per tensor */
	double deadline;		/* the compute schedule: end of the current sleep */
	double *iter_ms, *ready_ms;	/* [warmup + iters]: per iteration */
};

/* The value element j of tensor i holds on worker `rank` before any
 * push_pull; see the header. */
static float fill_value(int i, size_t j, int rank)
{
	return (float)(((size_t)i * 7 + j) % 251) * 0.25f + (float)rank;
}

static int fail(const struct trainer *t, const char *what)
{
	fprintf(stderr, "unisum bench: worker %d: %s failed: %s\n", t->rank, what, unisum_last_error());
	return -1;
}

/* Allocates the buffers and the per-tensor and per-iteration arrays. */
static int trainer_alloc(struct trainer *t)
{
	int L = t->params->n, n = t->o->warmup + t->o->iters;
	t->bufs = calloc((size_t)L, sizeof *t->bufs);
	t->ids = calloc((size_t)L, sizeof *t->ids);
	t->handles = calloc((size_t)L, sizeof *t->handles);
	t->iter_ms = calloc((size_t)n, sizeof *t->iter_ms);
	t->ready_ms = calloc((size_t)n, sizeof *t->ready_ms);
	if (!t->bufs || !t->ids || !t->handles || !t->iter_ms || !t->ready_ms)
		goto out_oom;
	t->outs = calloc((size_t)L, sizeof *t->outs);
	if (t->outs == NULL)
		goto out_oom;
	for (int i = 0; i < L; i++) {
		t->bufs[i] = malloc(t->params->v[i].count * sizeof(float));
		t->outs[i] = t->held ? malloc(t->params->v[i].count * sizeof(float)) : t->bufs[i];
		if (t->bufs[i] == NULL || t->outs[i] == NULL)
			goto out_oom;
	}
	return 0;
out_oom:
	fprintf(stderr, "unisum bench: worker %d: out of memory for %.1f MiB of gradients\n", t->rank,
		(double)param_total(t->params) * 4 / MIB);
	return -1;
}

static void trainer_free(struct trainer *t)
{
	for (int i = 0; t->outs && t->held && i < t->params->n; i++)
		free(t->outs[i]);
	free(t->outs);
	for (int i = 0; t->bufs && i < t->params->n; i++)
		free(t->bufs[i]);
	free(t->bufs);
	free(t->ids);
	free(t->handles);
	free(t->iter_ms);
	free(t->ready_ms);
}

/* Declares the mode's tensors ("fifo.<i>" / "prio.<i>", in UNISUM_SYNC's
 * sync mode) and fills the buffers with this worker's values. */
static int mode_prepare(struct trainer *t, enum mode m)
{
	for (int i = 0; i < t->params->n; i++) {
		char name[32];
		snprintf(name, sizeof name, "%s.%d", m == MODE_FIFO ? "fifo" : "prio", i);
		int id = t->o->compressor != NULL
				 ? unisum_declare_ex(name, UNISUM_FLOAT32, t->params->v[i].count,
						     m == MODE_FIFO ? i : -i, t->o->compressor)
				 : unisum_declare_sync(name, UNISUM_FLOAT32, t->params->v[i].count,
						       m == MODE_FIFO ? i : -i, NULL);
		if (id < 0)
			return fail(t, t->o->compressor != NULL ? "unisum_declare_ex" : "unisum_declare_sync");
		t->ids[i] = id;
		for (size_t j = 0; j < t->params->v[i].count; j++)
			t->bufs[i][j] = fill_value(i, j, t->rank);
	}
	return 0;
}

/* Forward: waits for each tensor's previous push_pull, then computes.
 * Stores in *ready_at when tensor 0's wait returned. */
static int forward(struct trainer *t, double *ready_at)
{
	t->deadline = now_s();
	for (int i = 0; i < t->params->n; i++) {
		if (t->handles[i] != 0 && !t->dssync) {
			double t0 = now_s();
			int rc = unisum_wait(t->handles[i]);
			t->handles[i] = 0;
			if (rc != 0)
				return fail(t, "unisum_wait");
			double t1 = now_s();
			t->deadline += t1 - t0;	/* a stall delays the rest of the compute */
			if (i == 0)
				*ready_at = t1;
		}
		t->deadline += t->fwd_s;
		sleep_until(t->deadline);
	}
	return 0;
}

/* Backward: computes each gradient, last layer first, and starts its
 * push_pull. */
static int backward(struct trainer *t)
{
	for (int i = t->params->n - 1; i >= 0; i--) {
		t->deadline += t->bwd_s;
		sleep_until(t->deadline);
		if (t->dssync)
			continue;	/* dssync_step() starts them */
		/* Async and SSP take deltas and average nothing (flags 0). */
		if (unisum_push_pull_async(t->ids[i], t->bufs[i], t->outs[i],
					   t->held ? 0 : UNISUM_AVERAGE, &t->handles[i]) != 0)
			return fail(t, "unisum_push_pull_async");
	}
	return 0;
}

/* Waits for every push_pull in flight.  Stores in *ready_at when the
 * last returned. */
static int wait_all(struct trainer *t, double *ready_at)
{
	for (int i = 0; i < t->params->n; i++) {
		if (t->handles[i] == 0)
			continue;
		int rc = unisum_wait(t->handles[i]);
		t->handles[i] = 0;
		if (rc != 0)
			return fail(t, "unisum_wait");
	}
	*ready_at = now_s();
	return 0;
}

/* DS-Sync's optimizer step (unisum.torch, sync="dssync:G"), after the
 * whole backward: the parameters are averaged, not the gradients, so
 * nothing can start before the update.  Overlapped (UNISUM_DSSYNC_OVERLAP=1)
 * it waits for the averages the last step started, which ran during this
 * step's forward and backward, then starts this step's and goes on;
 * otherwise it starts this step's and waits for them.  Stores in
 * *ready_at when its waits returned. */
static int dssync_step(struct trainer *t, double *ready_at)
{
	if (t->overlap && wait_all(t, ready_at) != 0)
		return -1;
	for (int i = 0; i < t->params->n; i++)
		if (unisum_push_pull_async(t->ids[i], t->bufs[i], t->outs[i], UNISUM_AVERAGE,
					   &t->handles[i]) != 0)
			return fail(t, "unisum_push_pull_async");
	return t->overlap ? 0 : wait_all(t, ready_at);
}

/* Checks the first, middle and last element of every tensor against the
 * exact average (see the header). */
static int mode_check(const struct trainer *t, enum mode m)
{
	if (!t->exact)
		return 0;	/* groups, deltas: no one average to compare with */
	double shift = (t->size - 1) / 2.0 - t->rank;
	for (int i = 0; i < t->params->n; i++) {
		size_t count = t->params->v[i].count, at[3] = {0, count / 2, count - 1};
		for (int k = 0; k < 3; k++) {
			float want = (float)((double)fill_value(i, at[k], t->rank) + shift);
			float got = t->bufs[i][at[k]];
			if (got != want) {
				fprintf(stderr, "unisum bench: worker %d, mode %s: tensor %d (%s) element %zu "
					"is %.9g, expected %.9g: the sums are wrong\n", t->rank, mode_names[m],
					i, t->params->v[i].name, at[k], got, want);
				return -1;
			}
		}
	}
	return 0;
}

/* Runs warmup + iters iterations and a last forward; fills iter_ms and
 * ready_ms. */
static int mode_run(struct trainer *t, enum mode m)
{
	int n = t->o->warmup + t->o->iters;
	if (mode_prepare(t, m) != 0)
		return -1;
	if (unisum_barrier() != 0)
		return fail(t, "unisum_barrier");
	double start = now_s(), prev_start = 0, bwd_end = 0;
	for (int k = 0; k <= n; k++) {
		double ready_at = 0, fwd_start = now_s();
		if (forward(t, &ready_at) != 0)
			return -1;
		if (k > 0) {
			t->iter_ms[k - 1] = (fwd_start - prev_start) * 1e3;
			if (!t->dssync)
				t->ready_ms[k - 1] = (ready_at - bwd_end) * 1e3;
		}
		if (k == n)
			break;
		prev_start = fwd_start;
		if (backward(t) != 0)
			return -1;
		bwd_end = now_s();
		if (t->dssync) {
			/* The step's own wait is its "ready" time. */
			double ready = bwd_end;
			if (dssync_step(t, &ready) != 0)
				return -1;
			t->ready_ms[k] = (ready - bwd_end) * 1e3;
		}
	}
	double end_at;
	if (t->dssync && wait_all(t, &end_at) != 0)
		return -1;
	if (t->rank == 0)
		fprintf(stderr, "  ... %s %s: %d iterations in %.2f s\n", t->o->model->name, mode_names[m], n,
			now_s() - start);
	return mode_check(t, m);
}

/* Writes `bytes` for a person to read: "512 B", "4.0 KiB", "15.62 MiB". */
static void format_bytes(char *buf, size_t size, uint64_t bytes)
{
	if (bytes < 1024)
		snprintf(buf, size, "%llu B", (unsigned long long)bytes);
	else if (bytes < 1024 * 1024)
		snprintf(buf, size, "%.1f KiB", (double)bytes / 1024);
	else
		snprintf(buf, size, "%.2f MiB", (double)bytes / MIB);
}

/* The knobs of this process (config.c's table; a malformed one was
 * refused at unisum_init, or is by the job this launches). */
static const struct config *bench_config(void)
{
	static struct config cfg;
	static bool loaded;
	char err[256];
	if (!loaded && config_load(&cfg, err, sizeof err) != 0)
		cfg.autotune_steps = 10;
	loaded = true;
	return &cfg;
}

/* Prints the header of the table (rank 0). */
static void print_header(const struct trainer *t)
{
	unisum_stats st = {0};
	unisum_get_stats(&st);
	char credit[32] = "none", partition[32];
	if (st.credit_bytes != 0)
		format_bytes(credit, sizeof credit, st.credit_bytes);
	format_bytes(partition, sizeof partition, st.partition_bytes);
	printf("unisum bench --model %s: %d tensors, %.1f MiB float32, %d workers, %d servers, "
	       "compute %g ms/iteration, credit %s, partition %s, %d iterations after %d warm-up, "
	       "sync %s, compressor %s\n",
	       t->o->model->name, t->params->n, (double)param_total(t->params) * 4 / MIB, t->size,
	       bench_config()->num_servers, t->o->compute_ms, credit, partition, t->o->iters,
	       t->o->warmup, bench_config()->sync, t->o->compressor ? t->o->compressor : "none");
	printf("%-9s %12s %14s %22s\n", "mode", "iter mean", "iter median", "first-layer-ready mean");
	fflush(stdout);
}

/* What one mode measured, over the iterations after the warm-up. */
struct mode_result {
	double iter_mean, iter_median;	/* ms */
	double ready_mean;		/* ms: the first layer's wait after backward */
};

static void mode_summarize(struct trainer *t, struct mode_result *r)
{
	double *it = t->iter_ms + t->o->warmup, *rd = t->ready_ms + t->o->warmup;
	r->iter_mean = mean(it, t->o->iters);
	r->ready_mean = mean(rd, t->o->iters);
	r->iter_median = median(it, t->o->iters);
}

/* Prints the table's rows in the order the modes ran (rank 0); the
 * priority row compares with fifo when both ran. */
static void print_rows(const struct options *o, const struct mode_result *res)
{
	const struct mode_result *fifo = NULL;
	for (int k = 0; k < o->nmodes; k++)
		if (o->modes[k] == MODE_FIFO)
			fifo = &res[k];
	for (int k = 0; k < o->nmodes; k++) {
		const struct mode_result *r = &res[k];
		char label[32];
		snprintf(label, sizeof label, "%s%s", mode_names[o->modes[k]],
			 bench_config()->autotune ? "+autotune" : "");
		printf("%-9s %9.2f ms %11.2f ms %19.2f ms", label, r->iter_mean, r->iter_median,
		       r->ready_mean);
		unisum_stats st;
		if (label[strlen(mode_names[o->modes[k]])] == '+' && unisum_get_stats(&st) == 0) {
			char pb[32], cb[32];
			format_bytes(pb, sizeof pb, st.partition_bytes);
			format_bytes(cb, sizeof cb, st.credit_bytes);
			printf("   settled on partition %s, credit %s", pb, cb);
		}
		if (o->modes[k] == MODE_PRIORITY && fifo != NULL) {
			bool faster = r->iter_mean <= fifo->iter_mean;
			printf("   priority vs fifo: %.2fx %s (%+.1f%% iteration time)",
			       faster ? fifo->iter_mean / r->iter_mean : r->iter_mean / fifo->iter_mean,
			       faster ? "faster" : "slower", (r->iter_mean / fifo->iter_mean - 1) * 100);
		}
		printf("\n");
	}
	fflush(stdout);
}

static int bench_model_worker(const struct options *o, const struct param_list *params)
{
	struct trainer t = {.o = o, .params = params};
	struct mode_result res[MODE_COUNT];
	int status = 1;
	if (unisum_init() != 0) {
		fprintf(stderr, "unisum bench: %s\n", unisum_last_error());
		return 1;
	}
	t.rank = unisum_rank();
	t.size = unisum_size();
	uint32_t sync;
	int group;
	if (wire_sync_parse(bench_config()->sync, &sync, &group) == 0) {
		t.held = wire_sync_held(sync);
		t.exact = !t.held && group == 0 && o->compressor == NULL;
		t.dssync = group > 0;
		t.overlap = bench_config()->dssync_overlap != 0;
	}
	t.fwd_s = o->compute_ms / 3.0 / params->n * 1e-3;
	t.bwd_s = o->compute_ms * 2.0 / 3.0 / params->n * 1e-3;
	if (trainer_alloc(&t) != 0)
		goto out_shutdown;
	if (t.rank == 0)
		print_header(&t);
	for (int k = 0; k < o->nmodes; k++) {
		if (mode_run(&t, o->modes[k]) != 0)
			goto out_shutdown;
		mode_summarize(&t, &res[k]);
	}
	if (t.rank == 0)
		print_rows(o, res);
	status = 0;
out_shutdown:
	trainer_free(&t);
	if (unisum_shutdown() != 0 && status == 0) {
		fprintf(stderr, "unisum bench: worker %d: unisum_shutdown failed: %s\n", t.rank,
			unisum_last_error());
		status = 1;
	}
	return status;
}

/* ---- entry ----------------------------------------------------------------------- */

static void print_list(const struct model *m, const struct param_list *l)
{
	for (int i = 0; i < l->n; i++)
		printf("%s %zu\n", l->v[i].name, l->v[i].count);
	printf("# %s: %d tensors, %zu params\n", m->name, l->n, param_total(l));
}

/* Runs the job in a child process (the launcher installs signal handlers
 * and keeps state of its own), so two jobs can run one after the other. */
static int launch_child(const struct launch_opts *job)
{
	fflush(stdout);
	fflush(stderr);
	pid_t pid = fork();
	if (pid < 0) {
		perror("unisum bench: fork");
		return 1;
	}
	if (pid == 0)
		_exit(launch_run(job));
	int st;
	while (waitpid(pid, &st, 0) < 0)
		if (errno != EINTR)
			return 1;
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* Launches a local job whose workers run this same command; with
 * --autotune a second one, priority under UNISUM_AUTOTUNE=1. */
static int launch_self(const struct options *o)
{
	char self[PATH_MAX];
	if (bench_self_exe(self, sizeof self) != 0)
		return 1;
	char itbuf[16], wubuf[16], msbuf[32], modes[64] = "";
	snprintf(itbuf, sizeof itbuf, "%d", o->iters);
	snprintf(wubuf, sizeof wubuf, "%d", o->warmup);
	snprintf(msbuf, sizeof msbuf, "%.17g", o->compute_ms);
	for (int i = 0; i < o->nmodes; i++) {
		size_t len = strlen(modes);
		snprintf(modes + len, sizeof modes - len, "%s%s", i ? "," : "", mode_names[o->modes[i]]);
	}
	/* Every worker its own machine: the pipeline under test is the servers'. */
	char *cmd[] = {self, "bench", "--model", (char *)o->model->name, "--iters", itbuf, "--warmup",
		       wubuf, "--compute-ms", msbuf, "--modes", modes,
		       o->compressor ? "--compressor" : NULL, (char *)o->compressor, NULL};
	struct launch_opts job = {.num_workers = o->workers, .num_servers = o->servers,
				  .local_size = 1, .cmd = cmd};
	int rc = launch_child(&job);
	if (rc != 0 || !o->autotune)
		return rc;
	int steps = bench_config()->autotune_steps;
	snprintf(wubuf, sizeof wubuf, "%d", o->warmup + 11 * steps);
	snprintf(modes, sizeof modes, "priority");
	setenv("UNISUM_AUTOTUNE", "1", 1);
	fprintf(stderr, "unisum bench: now priority with UNISUM_AUTOTUNE=1 (%d warm-up iterations "
		"while it tries settings)\n", o->warmup + 11 * steps);
	return launch_child(&job);
}

int bench_model_main(int argc, char **argv)
{
	struct options o;
	int rc = options_parse(argc, argv, &o);
	if (rc != 0)
		return rc > 0 ? 0 : 2;
	struct param_list params;
	if (model_build(o.model, &params) != 0)
		return 1;
	if (o.list)
		print_list(o.model, &params);
	else if (bench_inside_job())
		rc = bench_model_worker(&o, &params);
	else
		rc = launch_self(&o);
	free(params.v);
	return rc;
}
