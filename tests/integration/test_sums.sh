# Integration: real scheduler, servers and workers on loopback through
# `unisum launch`; every worker checks every element against a reference
# summed in the server's (rank) order.
#
# Every dtype and boundary size on 1, 2 and 4 workers x 1, 2 and 3 servers,
# with 64 KiB partitions (3 partitions are 192 KiB, so the matrix is cheap;
# tests/component/test_job.c runs the same corners in one process); the default
# 4 MB partitions on two of those, and the 64 MiB tensors (thousands of
# partitions) on one.
#
# UNISUM_TEST_LIGHT=1 (the sanitizer runs; under ThreadSanitizer every
# access costs tens of times more; they look for memory and thread errors,
# not arithmetic, and run test_job's in-process jobs too) keeps the corners
# of the matrix, leaves out the default-size and 64 MiB tensors and runs
# 200 rounds instead of 1000.
. "$(dirname "$0")/lib.sh"

what="every dtype, 0 elements to 3 partitions"
if [ "${UNISUM_TEST_LIGHT:-0}" = 1 ]; then
	matrix="1:1 2:2 4:3" rounds=200
else
	matrix="1:1 1:2 1:3 2:1 2:2 2:3 4:1 4:2 4:3" rounds=1000
fi
for spec in $matrix; do
	UNISUM_PARTITION_BYTES=65536 run_job "$what" "${spec%:*}" "${spec#*:}" sums
done
if [ "${UNISUM_TEST_LIGHT:-0}" != 1 ]; then
	run_job "$what of 4 MB" 1 2 sums
	run_job "$what of 4 MB" 4 3 sums
	run_job "every dtype, 0 elements to 64 MiB" 2 2 sums --big
fi
run_job "$rounds rounds of a small tensor" 2 2 rounds "$rounds"
# Servers on this host get the data by address (IPC) unless UNISUM_IPC=0:
# some jobs go through the socket.
UNISUM_IPC=0 run_job "500 tensors in flight at once, data through the socket" 2 3 many 500
run_job "500 tensors in flight, 4 workers" 4 2 many 500
# Compressed tensors: the machine's root encodes, the servers decode, sum
# and encode once; IPC sends the encodings through the socket.
# (The sanitizer runs: 2 rounds, enough for every state's second use.)
crounds=6
[ "${UNISUM_TEST_LIGHT:-0}" = 1 ] && crounds=2
UNISUM_PARTITION_BYTES=65536 run_job "compressed push_pulls, 3 machines" 3 2 compressed $crounds
UNISUM_PARTITION_BYTES=65536 check_job "compressed push_pulls, 2 machines of 2 (w=4 s=2)" \
	"$UNISUM" launch -w 4 -s 2 --local-size 2 -- "$CHECK" compressed $crounds
run_job "declarations in a different order on every worker" 4 3 shuffle
run_job "broadcast from every root" 4 2 broadcast
run_job "broadcast, one worker" 1 1 broadcast
run_job "one-shot tensors: declared, summed, undeclared; ids reused" 2 2 once 300
# Small partitions: many partitions per tensor, tails of every size.
UNISUM_PARTITION_BYTES=1000 run_job "1000-byte partitions" 2 3 sums
UNISUM_PARTITION_BYTES=1000 UNISUM_IPC=0 run_job "1000-byte partitions, data through the socket" 2 3 sums
finish
