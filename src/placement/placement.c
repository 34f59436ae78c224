/*
 * placement.c - partitioning and byte-balanced assignment (see placement.h).
 */
#include "placement/placement.h"

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
