/*
 * train_logreg.c - data-parallel logistic regression with the unisum C API.
 *
 *   unisum launch -w 2 -s 1 -- ./train_logreg [epochs]
 *
 * Every worker generates the same synthetic data set (so no files are
 * needed), takes its share of every global mini-batch, computes the
 * gradient of its share, and sums the gradients of all workers with
 * unisum_push_pull().  Dividing the sum by the global batch size gives the
 * exact gradient of the whole batch, so the loss curve is the same on 1
 * worker and on N workers (float64 sums, printed to 6 digits).
 * Only the public API of unisum.h is used.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "unisum.h"

enum {
	FEATURES = 32,
	SAMPLES = 8192,
	HELD_OUT = 2048,
	BATCH = 256,		/* global mini-batch, split across workers */
};

static double lr = 0.5;

/* A small deterministic generator, identical on every worker. */
static uint64_t rng_state = 0x853c49e6748fea9bull;

static double uniform(void)
{
	rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
	return (double)(rng_state >> 11) / 9007199254740992.0;
}

static double gaussian(void)
{
	double u = uniform() + 1e-12, v = uniform();
	return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

static double sigmoid(double z)
{
	return 1.0 / (1.0 + exp(-z));
}

static int die(const char *what, int rc)
{
	fprintf(stderr, "train_logreg: %s failed: %s (%s)\n", what, unisum_strerror(rc),
		unisum_last_error());
	return 1;
}

int main(int argc, char **argv)
{
	int epochs = argc > 1 ? atoi(argv[1]) : 10;
	int rc = unisum_init();
	if (rc != 0)
		return die("unisum_init", rc);
	int rank = unisum_rank(), size = unisum_size();

	/* The data: x ~ N(0, 1), y ~ Bernoulli(sigmoid(w_true . x)). */
	static double x[SAMPLES + HELD_OUT][FEATURES];
	static int y[SAMPLES + HELD_OUT];
	double w_true[FEATURES];
	for (int j = 0; j < FEATURES; j++)
		w_true[j] = gaussian();
	for (int i = 0; i < SAMPLES + HELD_OUT; i++) {
		double z = 0;
		for (int j = 0; j < FEATURES; j++) {
			x[i][j] = gaussian();
			z += w_true[j] * x[i][j];
		}
		y[i] = uniform() < sigmoid(z);
	}

	/* Model: weights + bias, initialised on rank 0 and broadcast. */
	double w[FEATURES + 1];
	for (int j = 0; j <= FEATURES; j++)
		w[j] = rank == 0 ? 0.01 * (j % 5) : 1e9;	/* garbage off rank 0 */
	int t_w = unisum_declare("logreg.weights", UNISUM_FLOAT64, FEATURES + 1, 0);
	int t_g = unisum_declare("logreg.gradient", UNISUM_FLOAT64, FEATURES + 1, 1);
	int t_stats = unisum_declare("logreg.stats", UNISUM_FLOAT64, 3, 0);
	if (t_w < 0 || t_g < 0 || t_stats < 0)
		return die("unisum_declare", t_w < 0 ? t_w : t_g < 0 ? t_g : t_stats);
	if ((rc = unisum_broadcast(t_w, w, 0)) != 0)
		return die("unisum_broadcast", rc);

	if (rank == 0)
		printf("logistic regression: %d samples, %d features, global batch %d, %d worker(s)\n",
		       SAMPLES, FEATURES, BATCH, size);
	for (int epoch = 1; epoch <= epochs; epoch++) {
		for (int b = 0; b < SAMPLES / BATCH; b++) {
			/* This worker's slice of the global batch. */
			int lo = b * BATCH + rank * BATCH / size, hi = b * BATCH + (rank + 1) * BATCH / size;
			double g[FEATURES + 1];
			memset(g, 0, sizeof g);
			for (int i = lo; i < hi; i++) {
				double z = w[FEATURES];
				for (int j = 0; j < FEATURES; j++)
					z += w[j] * x[i][j];
				double err = sigmoid(z) - y[i];
				for (int j = 0; j < FEATURES; j++)
					g[j] += err * x[i][j];
				g[FEATURES] += err;
			}
			if ((rc = unisum_push_pull(t_g, g, g, 0)) != 0)
				return die("unisum_push_pull", rc);
			for (int j = 0; j <= FEATURES; j++)
				w[j] -= lr * g[j] / BATCH;
		}
		/* Training loss and held-out accuracy, summed over shards. */
		double stats[3] = {0, 0, 0};
		for (int i = rank; i < SAMPLES; i += size) {
			double z = w[FEATURES];
			for (int j = 0; j < FEATURES; j++)
				z += w[j] * x[i][j];
			double p = sigmoid(z);
			stats[0] -= y[i] ? log(p + 1e-15) : log(1 - p + 1e-15);
		}
		for (int i = SAMPLES + rank; i < SAMPLES + HELD_OUT; i += size) {
			double z = w[FEATURES];
			for (int j = 0; j < FEATURES; j++)
				z += w[j] * x[i][j];
			stats[1] += (z > 0) == y[i];
			stats[2] += 1;
		}
		if ((rc = unisum_push_pull(t_stats, stats, stats, 0)) != 0)
			return die("unisum_push_pull", rc);
		if (rank == 0)
			printf("epoch %2d  loss %.6f  held-out accuracy %.4f\n", epoch, stats[0] / SAMPLES,
			       stats[1] / stats[2]);
	}
	if ((rc = unisum_shutdown()) != 0)
		return die("unisum_shutdown", rc);
	return 0;
}
