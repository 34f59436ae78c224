/*
 * placement.h - how a tensor becomes partitions, and which server owns each.
 *
 * Partitioning: a tensor of `count` elements is cut into
 * ceil(bytes / partition_bytes) partitions of nearly equal size (they
 * differ by at most one element), every one at most partition_bytes.
 * Equal parts pipeline better and balance better than BytePS's fixed-size
 * parts with a short tail.  A tensor of 0 elements has no partitions.
 *
 * Assignment: each partition goes to the server with the fewest bytes so
 * far (ties to the lowest rank).  The scheduler runs it once per tensor
 * name, in the order the job first declares names, and hands the result
 * to every worker, so all workers agree whatever their declaration order.
 * Partition i of a tensor has key tensor_key + i; tensor keys come from a
 * 48-bit hash of the name shifted left by 16 bits.
 */
#ifndef UNISUM_PLACEMENT_H
#define UNISUM_PLACEMENT_H

#include <stddef.h>
#include <stdint.h>

#define PLACEMENT_MAX_PARTS 65536u

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

#endif /* UNISUM_PLACEMENT_H */
