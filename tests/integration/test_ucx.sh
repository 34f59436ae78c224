# Integration: the UCX transport (UNISUM_TRANSPORT=ucx) with real
# processes.  On loopback over UCX's TCP (UCX_TLS=tcp) and over its shared
# memory as far as UCX uses it (UCX_TLS=sm,tcp: with peer error handling
# UCX 1.13 finds no shared-memory transport for messages and makes TCP
# lanes; see ARCHITECTURE section 6): every dtype and boundary size,
# tensors in flight, compressed pushes, each server's log saying it
# listens over ucx.  The chaos suite (3 runs) over UCX on loopback.
# Between emulated hosts
# (network namespaces, UCX over TCP): the sums, then a server killed half
# way through a round (failover: every sum exact).  A bad UNISUM_TRANSPORT fails at
# start naming it; nodes that disagree on the transport fail at
# registration, every one of them naming both.  (The contract test over
# UCX is tests/component/test_transport.c; test_job runs in one process
# over UCX with TEST_JOB_TRANSPORT=ucx, which ctest does.)
#
# Without libucx the transport is not there: reported SKIPPED with the
# reason (as root, a skip fails: CI installs it through install-deps.sh).
. "$(dirname "$0")/lib.sh"

if ! "$CHECK" ucx-available >/dev/null 2>&1; then
	skip "the UCX transport is not here: $("$CHECK" ucx-available 2>&1)"
	finish
fi

export UNISUM_TRANSPORT=ucx UNISUM_IPC=0
on_ucx() {
	[ "$(printf '%s\n' "$LAST" | grep -c "listening on .* (ucx)")" -eq "$1" ]
}

# The sanitizer runs (UNISUM_TEST_LIGHT=1) keep the loopback jobs over
# UCX_TLS=tcp, the bad value and the disagreement: the transport's paths,
# not the suites again.
tlss="tcp sm,tcp"
[ "${UNISUM_TEST_LIGHT:-0}" = 1 ] && tlss=tcp
for tls in $tlss; do
	export UCX_TLS=$tls
	UNISUM_PARTITION_BYTES=65536 check_job "UCX_TLS=$tls: every dtype, 0 elements to 3 partitions (w=2 s=3)" \
		env UNISUM_LOG_LEVEL=INFO "$UNISUM" launch -w 2 -s 3 --local-size 1 -- "$CHECK" sums
	expect "  ... every server listened over ucx" on_ucx 3
	# sm,tcp moves its data over the same TCP lanes (ARCHITECTURE
	# section 6): its sums job says that it runs; the rest is tcp's.
	[ "$tls" = tcp ] || continue
	run_job "UCX_TLS=$tls: 500 tensors in flight" 2 2 many 500
	UNISUM_PARTITION_BYTES=65536 run_job "UCX_TLS=$tls: compressed push_pulls" 3 2 compressed 4
done
export UCX_TLS=tcp
[ "${UNISUM_TEST_LIGHT:-0}" = 1 ] ||
	run_job "UCX: the default 4 MB partitions (rendezvous into the tensor)" 2 2 sums

# A bad value fails at start, naming the variable.
out=$(UNISUM_TRANSPORT=rdma "$UNISUM" launch -w 1 -s 1 -- "$CHECK" sums 2>&1)
expect "UNISUM_TRANSPORT=rdma fails at start, naming the variable" \
	contains "$out" "UNISUM_TRANSPORT='rdma' must be tcp or ucx"

# Nodes that disagree: server 0 over UCX, everyone else over TCP.
log=$(mktemp -d)
export UNISUM_SCHEDULER_HOST=127.0.0.1 UNISUM_TIMEOUT_MS=3000
UNISUM_TRANSPORT=tcp run_by_hand "$log" 2 2 server0 env UNISUM_TRANSPORT=ucx
named=0
for f in "$log"/*; do
	grep -q "UNISUM_TRANSPORT=ucx but .* has UNISUM_TRANSPORT=tcp\|UNISUM_TRANSPORT=tcp but .* has UNISUM_TRANSPORT=ucx" \
		"$f" && named=$((named + 1))
done
expect "a job whose nodes disagree on the transport fails, every process naming both ($named of 5)" \
	[ "$named" -eq 5 ]
drop_logs "$log"
unset UNISUM_SCHEDULER_HOST UNISUM_TIMEOUT_MS

# Strangers' bytes on a server's UCX port (stranger_job: random bytes,
# wire messages of unisum's TCP, a truncated header): each connection is
# closed alone and the job goes on.  UCX 1.13's own listener aborted the
# server on such bytes (ARCHITECTURE section 6, "Strangers").
log=$(mktemp -d)
stranger_job "$log" garbage
expect "strangers on a server's UCX port: every process finished cleanly" \
	[ "$rc0 $rc1 $rcs $rcp" = "0 0 0 0" ]
expect "  ... the server closed each of the 6 connections, saying why" \
	[ "$(grep -c "UCX: closing the connection of .*not a unisum UCX peer" "$log/server")" -eq 6 ]
drop_logs "$log"

[ "${UNISUM_TEST_LIGHT:-0}" = 1 ] && finish
# The chaos suite over UCX (3 of its runs: the scheduler, a server and a
# worker killed; then 2 elastic runs): every survivor names the victim
# in time, or finishes exact.  A survivor once got a sum with a failed
# worker's freed input, sent by UCX after all (ARCHITECTURE section 6,
# "Lent buffers"); not in 12 whole suites over UCX since, two at a time.
# (All of it, and test_failover, test_elastic and test_chaos_modes, pass
# over UCX run by hand: bench/README.md.)
check_job "the chaos suite over UCX_TLS=tcp (test_chaos.sh, 3 runs)" \
	env CHAOS_RUNS=3 CHAOS_ELASTIC_RUNS=2 sh "$(dirname "$0")/test_chaos.sh" "$BUILD"
printf '%s\n' "$LAST" | grep -E "^(ok|FAIL)|worst" | sed 's/^/    /'

# Between emulated hosts: UCX over the veths.
P="usx$$"
hosts_up "$P" 3 1gbit
cluster_job "3 hosts over UCX: every dtype, 0 elements to 3 partitions" 2 1 sums
expect "  ... every server listened over ucx" on_ucx 3
ROUNDS=600
UNISUM_TEST_CRASH_AFTER_REPLIES=300:1 cluster_job \
	"3 hosts over UCX: server 1 dies half-way through a round, 2 machines of 2" 4 2 failover $ROUNDS
expect "  ... the launcher went on without it" \
	contains "$LAST" "server 1 .*killed by signal 9.*the job goes on without it"
expect "  ... every worker finished, exact" \
	[ "$(printf '%s\n' "$LAST" | grep -c "$ROUNDS failover rounds ok")" -eq 4 ]
sh "$NETNS" down "$P"
finish
