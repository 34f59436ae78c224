/*
 * placement.h - how a tensor becomes partitions, and which server owns each.
 *
 * Partitioning: a tensor of `count` elements is cut into
 * ceil(bytes / partition_bytes) partitions of nearly equal size (they
 * differ by at most one element), every one at most partition_bytes.
 * Equal parts pipeline better and balance better than BytePS's fixed-size
 * parts with a short tail.  A tensor of 0 elements has no partitions.
 *
 * Placement policies (UNISUM_PLACEMENT), all run by the scheduler once per
 * tensor name, in the order the job first declares names, which hands the
 * result to every worker, so all workers agree whatever their order:
 *
 *   optimal  every server gets the byte share of the BytePS paper's
 *            Theorem 1 (placement_weights()).  The tensor is dealt out to
 *            the servers furthest below their share of all bytes placed
 *            so far, in pieces of at most partition_bytes; a piece is cut
 *            short to fill a server's deficit exactly (never below 4 KiB,
 *            except a tensor's last piece).  So the partitions of one
 *            tensor need not be equal, and after every tensor each
 *            server's total is within a few KiB of its share.  The default.
 *   even     equal partitions, each to the server with the fewest bytes
 *            so far (ties to the lowest rank): the pre-Theorem behaviour.
 *   hash     equal partitions, server = djb2(decimal partition key) mod S:
 *            BytePS's default, kept to measure what exact shares buy.
 *
 * Partition i of a tensor has key tensor_key + i; tensor keys come from a
 * 48-bit hash of the name shifted left by 16 bits.
 */
#ifndef UNISUM_PLACEMENT_H
#define UNISUM_PLACEMENT_H

#include <stddef.h>
#include <stdint.h>

#define PLACEMENT_MAX_PARTS 65536u

/* The smallest piece the optimal policy cuts to fill a deficit. */
#define PLACEMENT_MIN_PIECE 4096u

enum placement_policy {
	PLACEMENT_OPTIMAL = 0,
	PLACEMENT_EVEN = 1,
	PLACEMENT_HASH = 2,
};

struct placement_part {
	uint64_t offset;	/* first element */
	uint64_t count;		/* elements */
};

/* The number of partitions of a tensor, or 0 for an empty tensor.
 * Returns 0 too when elem_size > partition_bytes (check with
 * placement_parts_are_valid()). */
uint64_t placement_nparts(uint64_t count, size_t elem_size, uint64_t partition_bytes);

/* Fills parts[0..nparts) for the tensor (nparts from placement_nparts). */
void placement_partition(uint64_t count, uint64_t nparts, struct placement_part *parts);

/* Assigns each of nparts partitions (sizes in bytes) to a server: least
 * loaded first, ties to the lowest rank.  `loads` (bytes per server) is
 * updated.  servers_out[i] gets the rank for partition i. */
void placement_assign(uint64_t *loads, int nservers, const uint64_t *part_bytes, uint64_t nparts,
		      uint32_t *servers_out);

/* The key of a tensor name: a 48-bit FNV-1a hash shifted left by 16;
 * never 0. */
uint64_t placement_tensor_key(const char *name);

/* "optimal", "even" or "hash" -> the policy, or -1. */
int placement_policy_parse(const char *text);
const char *placement_policy_name(int policy);

/*
 * Theorem 1, generalised.  n worker hosts, c of them also running servers
 * (colocated), k hosts running only servers (CPU-only).  Sets the share of
 * all bytes that each colocated host and each CPU-only host should hold:
 *
 *   c = n, 0 < k < n: colocated (n-k)/(n^2+kn-2k), CPU-only 2(n-1)/(n^2+kn-2k)
 *                     (the paper; the time is 2n(n-1)M/((n^2+kn-2k)B));
 *   k = 0:            colocated 1/c (all-reduce);
 *   k >= n or c = 0:  CPU-only 1/k, colocated 0 (the parameter server);
 *   n = 1, c = 1:     everything on the colocated host (no network at all);
 *   c < n:            the same optimum (every host's traffic at most t M,
 *                     t minimal) solved for c colocated hosts.
 */
void placement_theorem_shares(int n, int c, int k, double *colocated, double *cpu_only);

/* The communication time of those shares in units of M/B (bytes over one
 * host's link bandwidth): 2n(n-1)/(n^2+kn-2k) for c = n, k <= n. */
double placement_theorem_time(int n, int c, int k);

/*
 * Per-server weights from where every node runs.  server_hosts[s] and
 * worker_hosts[w] name hosts (equal strings = same host).  A server is
 * colocated when a worker shares its host.  A host's share is split evenly
 * among its servers.  weights[s] sums to 1; colocated[s] (may be NULL) says
 * which role each server got; *n, *c, *k (may be NULL) get the counts.
 */
void placement_weights(int nservers, const char *const *server_hosts, int nworkers,
		       const char *const *worker_hosts, double *weights, int *colocated, int *n, int *c,
		       int *k);

/* Placement state of a job: the policy, weights and bytes per server. */
struct placement {
	int policy;
	int nservers;
	double *weights;	/* [nservers], summing to 1 */
	uint64_t *loads;	/* [nservers] bytes placed so far */
	uint64_t total;		/* sum of loads */
};

/* weights may be NULL (equal).  0 or UNISUM_ENOMEM. */
int placement_init(struct placement *p, int policy, int nservers, const double *weights);
void placement_fini(struct placement *p);

/* Cuts a tensor of `count` elements of esize bytes into partitions of at
 * most partition_bytes and places each (policy above).  *parts and *servers
 * are malloc'd arrays of *nparts entries (NULL for an empty tensor).
 * 0, UNISUM_EINVAL (esize > partition_bytes, or more than
 * PLACEMENT_MAX_PARTS partitions) or UNISUM_ENOMEM; p is unchanged on
 * failure. */
int placement_place(struct placement *p, uint64_t tensor_key, uint64_t count, size_t esize,
		    uint64_t partition_bytes, uint32_t *nparts, struct placement_part **parts,
		    uint32_t **servers);

/*
 * A homed cut, for the collectives whose elements each belong to one
 * machine (allgather's rows, reduce-scatter's slices, alltoall's blocks:
 * docs/ARCHITECTURE.md section 2).  The tensor is the concatenation of
 * nseg segments of seg_counts[i] elements; each is cut on its own into
 * nearly equal partitions of at most partition_bytes, so no partition
 * spans two segments, and every partition of segment i goes to server
 * seg_servers[i], the server on its owner's host, or, for a segment whose
 * owner has none (seg_servers[i] < 0), to the least loaded server.  The
 * bytes of a homed cut do not count in p's loads: they are balanced by
 * construction (every machine homes its own share) and usually one-shot.
 * Returns as placement_place().
 */
int placement_place_homed(struct placement *p, size_t esize, uint64_t partition_bytes,
			  uint32_t nseg, const uint64_t *seg_counts, const int32_t *seg_servers,
			  uint32_t *nparts, struct placement_part **parts, uint32_t **servers);

#endif /* UNISUM_PLACEMENT_H */
