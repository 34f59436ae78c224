/*
 * placement.c - partitioning and byte-balanced assignment (see placement.h).
 */
#include "placement/placement.h"

#include <stdlib.h>
#include <string.h>

#include "unisum.h"

uint64_t placement_nparts(uint64_t count, size_t elem_size, uint64_t partition_bytes)
{
	if (count == 0 || elem_size == 0 || elem_size > partition_bytes)
		return 0;
	uint64_t per_part = partition_bytes / elem_size;
	return count / per_part + (count % per_part != 0);
}

void placement_partition(uint64_t count, uint64_t nparts, struct placement_part *parts)
{
	if (nparts == 0)
		return;
	uint64_t base = count / nparts, extra = count % nparts, off = 0;
	for (uint64_t i = 0; i < nparts; i++) {
		parts[i].offset = off;
		parts[i].count = base + (i < extra ? 1 : 0);
		off += parts[i].count;
	}
}

void placement_assign(uint64_t *loads, int nservers, const uint64_t *part_bytes, uint64_t nparts,
		      uint32_t *servers_out)
{
	for (uint64_t i = 0; i < nparts; i++) {
		int best = 0;
		for (int s = 1; s < nservers; s++)
			if (loads[s] < loads[best])
				best = s;
		loads[best] += part_bytes[i];
		servers_out[i] = (uint32_t)best;
	}
}

uint64_t placement_tensor_key(const char *name)
{
	uint64_t h = 0xcbf29ce484222325ull;
	for (const unsigned char *p = (const unsigned char *)name; *p; p++) {
		h ^= *p;
		h *= 0x100000001b3ull;
	}
	/* Fold the top bits in so all 64 bits of the hash matter. */
	h ^= h >> 48;
	h &= 0xffffffffffffull;
	/* Key 0 means "no tensor" in ERROR messages. */
	return (h ? h : 1) << 16;
}

int placement_policy_parse(const char *text)
{
	if (strcmp(text, "optimal") == 0)
		return PLACEMENT_OPTIMAL;
	if (strcmp(text, "even") == 0)
		return PLACEMENT_EVEN;
	if (strcmp(text, "hash") == 0)
		return PLACEMENT_HASH;
	return -1;
}

const char *placement_policy_name(int policy)
{
	switch (policy) {
	case PLACEMENT_OPTIMAL:
		return "optimal";
	case PLACEMENT_EVEN:
		return "even";
	case PLACEMENT_HASH:
		return "hash";
	}
	return "?";
}

void placement_theorem_shares(int n, int c, int k, double *colocated, double *cpu_only)
{
	*colocated = 0;
	*cpu_only = 0;
	if (c > 0 && (k == 0 || n <= 1)) {
		/* All-reduce; or one worker host, whose own server costs no
		 * network at all. */
		*colocated = 1.0 / c;
	} else if (c == 0 || k >= n) {
		if (k > 0)
			*cpu_only = 1.0 / k;
	} else if (n == 2) {
		/* Each worker host sends and receives M whatever its server
		 * holds; CPU-only hosts may take up to M/n each. */
		*cpu_only = 1.0 / n;
		*colocated = (1.0 - (double)k / n) / c;
	} else {
		/* Host traffic in units of M: a worker host with a server of
		 * share x moves 1 + (n-2)x each way, a CPU-only host n y.
		 * Setting both to t and c x + k y = 1 gives t; for c = n this
		 * is the paper's 2n(n-1)/(n^2+kn-2k). */
		double a = (double)c / (n - 2);
		double t = (1.0 + a) / (a + (double)k / n);
		*colocated = (t - 1.0) / (n - 2);
		*cpu_only = t / n;
	}
}

double placement_theorem_time(int n, int c, int k)
{
	if (n <= 1)
		return 0;
	double x, y;
	placement_theorem_shares(n, c, k, &x, &y);
	/* The busiest host: a worker host moves 1 - x out to other servers
	 * plus (n-1)x of its server's replies; a CPU-only host n y. */
	double t = c < n ? 1.0 : 0.0;
	double worker = 1.0 - x + (n - 1) * x;
	if (c > 0 && worker > t)
		t = worker;
	if (k > 0 && n * y > t)
		t = n * y;
	return t;
}

static int host_index(const char *const *hosts, int nhosts, const char *h)
{
	for (int i = 0; i < nhosts; i++)
		if (strcmp(hosts[i], h) == 0)
			return i;
	return -1;
}

void placement_weights(int nservers, const char *const *server_hosts, int nworkers,
		       const char *const *worker_hosts, double *weights, int *colocated, int *n_out,
		       int *c_out, int *k_out)
{
	/* Distinct worker hosts; then each server host once. */
	int n = 0, c = 0, k = 0;
	for (int w = 0; w < nworkers; w++)
		if (host_index(worker_hosts, w, worker_hosts[w]) < 0)
			n++;
	for (int s = 0; s < nservers; s++) {
		if (host_index(server_hosts, s, server_hosts[s]) >= 0)
			continue;	/* host already counted */
		if (host_index(worker_hosts, nworkers, server_hosts[s]) >= 0)
			c++;
		else
			k++;
	}
	double x, y;
	placement_theorem_shares(n, c, k, &x, &y);
	for (int s = 0; s < nservers; s++) {
		int on_host = 0;
		for (int t = 0; t < nservers; t++)
			on_host += strcmp(server_hosts[t], server_hosts[s]) == 0;
		int col = host_index(worker_hosts, nworkers, server_hosts[s]) >= 0;
		weights[s] = (col ? x : y) / on_host;
		if (colocated != NULL)
			colocated[s] = col;
	}
	if (n_out != NULL)
		*n_out = n;
	if (c_out != NULL)
		*c_out = c;
	if (k_out != NULL)
		*k_out = k;
}

int placement_init(struct placement *p, int policy, int nservers, const double *weights)
{
	memset(p, 0, sizeof *p);
	p->policy = policy;
	p->nservers = nservers;
	p->weights = calloc((size_t)nservers, sizeof *p->weights);
	p->loads = calloc((size_t)nservers, sizeof *p->loads);
	if (p->weights == NULL || p->loads == NULL) {
		placement_fini(p);
		return UNISUM_ENOMEM;
	}
	double sum = 0;
	for (int s = 0; s < nservers; s++)
		sum += weights != NULL && weights[s] > 0 ? weights[s] : 0;
	for (int s = 0; s < nservers; s++)
		p->weights[s] = sum > 0 ? (weights[s] > 0 ? weights[s] / sum : 0) : 1.0 / nservers;
	return 0;
}

void placement_fini(struct placement *p)
{
	free(p->weights);
	free(p->loads);
	p->weights = NULL;
	p->loads = NULL;
}

/* BytePS's default key-to-server hash: djb2 over the key in decimal. */
static uint32_t placement_djb2(uint64_t key, int nservers)
{
	char buf[24];
	int len = 0;
	do {
		buf[len++] = (char)('0' + key % 10);
		key /= 10;
	} while (key != 0);
	uint64_t h = 5381;
	while (len > 0)
		h = h * 33 + (unsigned char)buf[--len];
	return (uint32_t)(h % (uint64_t)nservers);
}

/* Orders a tensor's pieces so that every server's pieces are spread
 * evenly through it: piece j of server s, ending at e bytes of the A_s
 * bytes s gets from this tensor, goes at position e / A_s (ties to the
 * lower server, then the earlier piece); offsets follow the new order.
 * The deal alone hands a server its whole deficit in one run, so a
 * pipeline that pushes partitions in order would load one server's link
 * while the others idle; interleaved, every link carries its share at
 * every moment. */
struct placement_piece {
	double at;
	uint32_t server;
	uint32_t index;
	uint64_t count;
};

static int placement_piece_cmp(const void *a, const void *b)
{
	const struct placement_piece *x = a, *y = b;
	if (x->at != y->at)
		return x->at < y->at ? -1 : 1;
	if (x->server != y->server)
		return x->server < y->server ? -1 : 1;
	return (x->index > y->index) - (x->index < y->index);
}

static void placement_interleave(struct placement_part *parts, uint32_t *servers, uint32_t np,
				 int nservers)
{
	struct placement_piece *pc = malloc((size_t)np * sizeof *pc);
	uint64_t *total = calloc((size_t)nservers, sizeof *total);
	uint64_t *sofar = calloc((size_t)nservers, sizeof *sofar);
	if (pc == NULL || total == NULL || sofar == NULL)
		goto out;	/* keep the deal's order: correct, only less smooth */
	for (uint32_t i = 0; i < np; i++)
		total[servers[i]] += parts[i].count;
	for (uint32_t i = 0; i < np; i++) {
		uint32_t s = servers[i];
		sofar[s] += parts[i].count;
		pc[i] = (struct placement_piece){.at = (double)sofar[s] / (double)total[s],
						 .server = s, .index = i, .count = parts[i].count};
	}
	qsort(pc, np, sizeof *pc, placement_piece_cmp);
	uint64_t off = 0;
	for (uint32_t i = 0; i < np; i++) {
		parts[i] = (struct placement_part){.offset = off, .count = pc[i].count};
		servers[i] = pc[i].server;
		off += pc[i].count;
	}
out:
	free(pc);
	free(total);
	free(sofar);
}

/* The optimal policy's cut: pieces to the servers furthest below their
 * share of the bytes placed so far (this tensor included). */
static uint32_t placement_deal(const struct placement *p, uint64_t *loads, uint64_t count,
			       size_t esize, uint64_t max_elems, struct placement_part *parts,
			       uint32_t *servers, uint32_t cap)
{
	double total = (double)(p->total + count * esize);
	uint64_t min_elems = (PLACEMENT_MIN_PIECE + esize - 1) / esize;
	if (min_elems > max_elems)
		min_elems = max_elems;
	uint64_t off = 0;
	uint32_t np = 0;
	while (off < count && np < cap) {
		int best = -1;
		double best_d = 0;
		for (int s = 0; s < p->nservers; s++) {
			if (p->weights[s] <= 0)
				continue;
			double d = p->weights[s] * total - (double)loads[s];
			if (best < 0 || d > best_d) {
				best = s;
				best_d = d;
			}
		}
		uint64_t left = count - off;
		uint64_t want = best_d > 0 ? (uint64_t)(best_d / (double)esize) : 0;
		if (want < min_elems)
			want = min_elems;
		uint64_t take = left < want ? left : want;
		if (take > max_elems)
			take = max_elems;
		if (left - take < min_elems && left <= max_elems)
			take = left;	/* no crumb at the end */
		parts[np] = (struct placement_part){.offset = off, .count = take};
		servers[np] = (uint32_t)best;
		loads[best] += take * esize;
		off += take;
		np++;
	}
	if (off != count)
		return 0;
	placement_interleave(parts, servers, np, p->nservers);
	return np;
}

int placement_place(struct placement *p, uint64_t tensor_key, uint64_t count, size_t esize,
		    uint64_t partition_bytes, uint32_t *nparts, struct placement_part **parts_out,
		    uint32_t **servers_out)
{
	*nparts = 0;
	*parts_out = NULL;
	*servers_out = NULL;
	if (esize == 0 || esize > partition_bytes)
		return UNISUM_EINVAL;
	if (count == 0)
		return 0;
	uint64_t equal = placement_nparts(count, esize, partition_bytes);
	/* The deal adds at most about two pieces per server to the equal cut. */
	uint64_t cap = equal + 2 * (uint64_t)p->nservers + 2;
	if (equal > PLACEMENT_MAX_PARTS)
		return UNISUM_EINVAL;
	if (cap > PLACEMENT_MAX_PARTS)
		cap = PLACEMENT_MAX_PARTS;
	struct placement_part *parts = calloc(cap, sizeof *parts);
	uint32_t *servers = calloc(cap, sizeof *servers);
	uint64_t *loads = malloc((size_t)p->nservers * sizeof *loads);
	if (parts == NULL || servers == NULL || loads == NULL) {
		free(parts);
		free(servers);
		free(loads);
		return UNISUM_ENOMEM;
	}
	memcpy(loads, p->loads, (size_t)p->nservers * sizeof *loads);
	uint64_t np = 0;
	if (p->policy == PLACEMENT_OPTIMAL)
		np = placement_deal(p, loads, count, esize, partition_bytes / esize, parts, servers,
				    (uint32_t)cap);
	if (np == 0) {
		/* even, hash, or a deal that would not fit: equal partitions */
		np = equal;
		placement_partition(count, np, parts);
		memcpy(loads, p->loads, (size_t)p->nservers * sizeof *loads);
		for (uint64_t i = 0; i < np; i++) {
			uint64_t b = parts[i].count * esize;
			if (p->policy == PLACEMENT_HASH) {
				servers[i] = placement_djb2(tensor_key + i, p->nservers);
				loads[servers[i]] += b;
			} else {
				placement_assign(loads, p->nservers, &b, 1, &servers[i]);
			}
		}
	}
	memcpy(p->loads, loads, (size_t)p->nservers * sizeof *loads);
	p->total += count * esize;
	free(loads);
	*nparts = (uint32_t)np;
	*parts_out = parts;
	*servers_out = servers;
	return 0;
}

int placement_place_homed(struct placement *p, size_t esize, uint64_t partition_bytes,
			  uint32_t nseg, const uint64_t *seg_counts, const int32_t *seg_servers,
			  uint32_t *nparts, struct placement_part **parts_out, uint32_t **servers_out)
{
	*nparts = 0;
	*parts_out = NULL;
	*servers_out = NULL;
	if (esize == 0 || esize > partition_bytes)
		return UNISUM_EINVAL;
	uint64_t total = 0;
	for (uint32_t i = 0; i < nseg; i++) {
		uint64_t k = placement_nparts(seg_counts[i], esize, partition_bytes);
		if (k > PLACEMENT_MAX_PARTS || total + k > PLACEMENT_MAX_PARTS ||
		    (seg_servers[i] >= 0 && seg_servers[i] >= p->nservers))
			return UNISUM_EINVAL;
		total += k;
	}
	if (total == 0)
		return 0;
	struct placement_part *parts = calloc(total, sizeof *parts);
	uint32_t *servers = calloc(total, sizeof *servers);
	uint64_t *loads = malloc((size_t)p->nservers * sizeof *loads);
	if (parts == NULL || servers == NULL || loads == NULL) {
		free(parts);
		free(servers);
		free(loads);
		return UNISUM_ENOMEM;
	}
	memcpy(loads, p->loads, (size_t)p->nservers * sizeof *loads);
	uint64_t np = 0, offset = 0;
	for (uint32_t i = 0; i < nseg; i++) {
		uint64_t k = placement_nparts(seg_counts[i], esize, partition_bytes);
		placement_partition(seg_counts[i], k, parts + np);
		for (uint64_t j = 0; j < k; j++) {
			parts[np + j].offset += offset;
			if (seg_servers[i] >= 0) {
				servers[np + j] = (uint32_t)seg_servers[i];
			} else {
				uint64_t b = parts[np + j].count * esize;
				placement_assign(loads, p->nservers, &b, 1, &servers[np + j]);
			}
		}
		np += k;
		offset += seg_counts[i];
	}
	free(loads);
	*nparts = (uint32_t)np;
	*parts_out = parts;
	*servers_out = servers;
	return 0;
}
