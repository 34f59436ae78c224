# Integration: real scheduler, servers and workers on loopback through
# `unisum launch`; every worker checks every element against a reference
# summed in the server's (rank) order.
. "$(dirname "$0")/lib.sh"

for w in 1 2 4; do
	for s in 1 2 3; do
		run_job "every dtype, 0 elements to 64 MiB" "$w" "$s" sums --big
	done
done
run_job "1000 rounds of a small tensor" 2 2 rounds 1000
run_job "500 tensors in flight at once" 2 3 many 500
run_job "500 tensors in flight, 4 workers" 4 2 many 500
run_job "declarations in a different order on every worker" 4 3 shuffle
run_job "broadcast from every root" 4 2 broadcast
run_job "broadcast, one worker" 1 1 broadcast
# Small partitions: many partitions per tensor, tails of every size.
UNISUM_PARTITION_BYTES=1000 run_job "1000-byte partitions" 2 3 sums
finish
