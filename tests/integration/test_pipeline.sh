# Integration: the PUSH stage's priority order and credit, and the
# timeline, on real jobs over loopback.  Orders are read from what the
# worker recorded (the timeline's dispatch numbers), never from timing.
. "$(dirname "$0")/lib.sh"

PY=${PYTHON:-python3}
TRACE=$(dirname "$0")/check_trace.py
dir=$(mktemp -d)

# Priority: credit for two 64 KiB partitions.  Rank 0 stops both servers
# (so nothing is acknowledged and no credit comes back), queues 64 backlog
# partitions, waits until two are out (the credit is used up), queues one
# urgent partition and lets the servers go on.  The urgent one must be the
# third partition out; first come, first served would make it the 65th.
# The job is started by hand, as on a cluster, so rank 0 knows the servers.
# The scheduler cuts equal partitions (UNISUM_PLACEMENT=even): the optimal
# placement may cut the urgent tensor in two to fill a server's share, and
# this test counts partitions.
export UNISUM_NUM_WORKER=2 UNISUM_NUM_SERVER=2 UNISUM_SCHEDULER_HOST=127.0.0.1
export UNISUM_SCHEDULER_PORT=$(free_port)
UNISUM_ROLE=scheduler UNISUM_PLACEMENT=even timeout 120 "$UNISUM" scheduler >"$dir/scheduler.log" 2>&1 &
spid=$!
pids=
for s in 0 1; do
	UNISUM_ROLE=server UNISUM_SERVER_ID=$s "$UNISUM" server >"$dir/server$s.log" 2>&1 &
	pids="$pids $!"
done
for w in 0 1; do
	UNISUM_ROLE=worker UNISUM_WORKER_ID=$w UNISUM_TEST_SERVER_PIDS="$pids" \
		UNISUM_PARTITION_BYTES=65536 UNISUM_SCHEDULING_CREDIT=131072 UNISUM_TRACE_ON=1 \
		UNISUM_TRACE_DIR="$dir/prio" UNISUM_TRACE_START_STEP=0 UNISUM_TRACE_END_STEP=0 \
		timeout 120 "$CHECK" priority >"$dir/prio$w.log" 2>&1 &
	eval "wpid$w=\$!"
done
wait "$wpid0"
rc0=$?
wait "$wpid1"
rc1=$?
wait "$spid"
for p in $pids; do
	kill -CONT "$p" 2>/dev/null
	wait "$p" 2>/dev/null
done
unset UNISUM_NUM_WORKER UNISUM_NUM_SERVER UNISUM_SCHEDULER_HOST UNISUM_SCHEDULER_PORT
out=$(cat "$dir/prio0.log")
expect "priority job: both sums exact on both ranks" \
	sh -c "[ $rc0 -eq 0 ] && [ $rc1 -eq 0 ] && grep -q 'priority sums ok' '$dir/prio1.log'"
expect "credit: exactly 131072 bytes in flight at most (recorded maximum)" \
	contains "$out" "rank 0: at most 131072 bytes in flight \(credit 131072\)"
res=$("$PY" "$TRACE" priority "$dir/prio/0/comm.json" urgent backlog 2 2>&1)
echo "    $res"
expect "priority: the urgent partition overtook the backlog (rank 0's send order)" \
	"$PY" "$TRACE" priority "$dir/prio/0/comm.json" urgent backlog 2
expect "timeline: a QUEUE, PUSH and PULL span for each of the 65 partitions" \
	"$PY" "$TRACE" window "$dir/prio/0/comm.json" 0 0 backlog=64 urgent=1

# Timeline window: rounds 3..5 of 10, a 296-byte tensor cut into 64-byte
# partitions (5 of them), on every rank, and nothing else.
UNISUM_PARTITION_BYTES=64 UNISUM_TRACE_ON=1 UNISUM_TRACE_DIR="$dir/win" \
	UNISUM_TRACE_START_STEP=3 UNISUM_TRACE_END_STEP=5 \
	timeout 120 "$UNISUM" launch -w 2 -s 2 --local-size 1 -- "$CHECK" rounds 10 >"$dir/win.log" 2>&1
expect "traced job passes" sh -c "[ \$(grep -c '10 rounds ok' '$dir/win.log') -eq 2 ]"
for r in 0 1; do
	expect "timeline of rank $r: valid JSON, every partition's spans in rounds 3..5 only" \
		"$PY" "$TRACE" window "$dir/win/$r/comm.json" 3 5 rounds=5
done

# Autotune: trials every 4 steps change the partition size and the credit
# mid-run; every sum stays exact (integer tensors, every round checked),
# every rank uses the same partition size in every round, and the tuner
# settles.
for ws in "2 2" "3 1"; do
	set -- $ws
	UNISUM_AUTOTUNE=1 UNISUM_AUTOTUNE_STEPS=4 UNISUM_PARTITION_BYTES=262144 UNISUM_LOG_LEVEL=INFO \
		timeout 300 "$UNISUM" launch -w "$1" -s "$2" --local-size 1 -- "$CHECK" tune 60 >"$dir/tune.log" 2>&1
	out=$(cat "$dir/tune.log")
	expect "autotune w=$1 s=$2: every rank's sums exact in all 60 rounds" \
		sh -c "[ \$(grep -c '60 tuned rounds ok' '$dir/tune.log') -eq $1 ]"
	sizes=$(sed -n 's/.*partition bytes by round: //p' "$dir/tune.log" | sort -u)
	expect "autotune w=$1 s=$2: every rank used the same partition size in every round" \
		sh -c "[ \$(echo '$sizes' | grep -c .) -eq 1 ]"
	expect "autotune w=$1 s=$2: the partition size changed mid-run" \
		sh -c "[ \$(echo '$sizes' | tr ' ' '\n' | sort -u | grep -c .) -ge 3 ]"
	expect "autotune w=$1 s=$2: every trial logged, then settled" \
		sh -c "grep -q 'autotune: epoch 8 ' '$dir/tune.log' && grep -q 'autotune: settled on' '$dir/tune.log'"
	for t in big small; do
		cuts=$(sed -n "s/.*every worker retired 'tuned\.$t\(@*[0-9]*\)'.*/\1/p" "$dir/tune.log" | sort -u | wc -l)
		expect "autotune w=$1 s=$2: the servers freed the 3 cuts of tuned.$t it left ($cuts)" [ "$cuts" -eq 3 ]
	done
done

# Fit mode (UNISUM_AUTOTUNE=2) over loopback TCP: worker 0 measures the
# first rounds' pushes and fits the partition size and credit to them
# (tune_fit, tests/unit/test_tune.c), then again under that fit, for good;
# every sum stays exact while the setting changes, and every rank uses the
# same size in every round.
UNISUM_IPC=0 UNISUM_AUTOTUNE=2 UNISUM_LOG_LEVEL=INFO \
	timeout 300 "$UNISUM" launch -w 2 -s 2 --local-size 1 -- "$CHECK" tune 12 >"$dir/fit.log" 2>&1
expect "autotune fit: every rank's sums exact in all 12 rounds" \
	sh -c "[ \$(grep -c '12 tuned rounds ok' '$dir/fit.log') -eq 2 ]"
sizes=$(sed -n 's/.*partition bytes by round: //p' "$dir/fit.log" | sort -u)
expect "autotune fit: every rank used the same partition size in every round" \
	sh -c "[ \$(echo '$sizes' | grep -c .) -eq 1 ]"
expect "autotune fit: worker 0 logged what it measured and chose, twice" \
	sh -c "[ \$(grep -c 'autotune fit.*bytes pushed over TCP, the link at' '$dir/fit.log') -eq 2 ]"
# Which size loopback gets depends on the machine (a link measured above
# 4 GB/s keeps the configured 4096000): test_cluster checks the direction
# on shaped links; here, that the last rounds used the fit kept for good.
first=$(echo "$sizes" | tr ' ' '\n' | grep . | head -1)
last=$(echo "$sizes" | tr ' ' '\n' | grep . | tail -1)
kept=$(sed -n 's/.*autotune fit:.*partition \([0-9]*\) B, credit [0-9]* B from step [0-9]* for good.*/\1/p' "$dir/fit.log")
expect "autotune fit: the rounds began with the configured size ($first) and ended with the fit kept ($kept)" \
	sh -c "[ '$first' = 4096000 ] && [ -n '$kept' ] && [ '$last' = '$kept' ]"

# Workers that disagree on autotune fail the job, naming the variables,
# instead of cutting their tensors differently.
# half A B: worker 0 with the environment A, worker 1 with B (env lists),
# each running `check_sums tune 20`; sets r0 and r1.
half() {
	export UNISUM_NUM_WORKER=2 UNISUM_NUM_SERVER=1 UNISUM_SCHEDULER_HOST=127.0.0.1
	export UNISUM_SCHEDULER_PORT=$(free_port) UNISUM_TIMEOUT_MS=3000 UNISUM_HEARTBEAT_MS=500
	UNISUM_ROLE=scheduler timeout 60 "$UNISUM" scheduler >"$dir/scheduler.log" 2>&1 &
	UNISUM_ROLE=server timeout 60 "$UNISUM" server >"$dir/server.log" 2>&1 &
	env UNISUM_ROLE=worker UNISUM_WORKER_ID=0 $1 timeout 60 "$CHECK" tune 20 >"$dir/half0.log" 2>&1 &
	h0=$!
	env UNISUM_ROLE=worker UNISUM_WORKER_ID=1 $2 timeout 60 "$CHECK" tune 20 >"$dir/half1.log" 2>&1 &
	h1=$!
	wait $h0
	r0=$?
	wait $h1
	r1=$?
	wait
	unset UNISUM_NUM_WORKER UNISUM_NUM_SERVER UNISUM_SCHEDULER_HOST UNISUM_SCHEDULER_PORT \
		UNISUM_TIMEOUT_MS UNISUM_HEARTBEAT_MS
}
both_say() { grep -q "$1" "$dir/half0.log" && grep -q "$1" "$dir/half1.log"; }
# Worker 0 off, worker 1 searching: worker 1 waits for settings nobody
# posts, and fails the job within UNISUM_TIMEOUT_MS.
half "UNISUM_AUTOTUNE=0" "UNISUM_AUTOTUNE=1 UNISUM_AUTOTUNE_STEPS=4"
expect "autotune on worker 1 only: both fail (exit $r0 and $r1), not hang" \
	sh -c "[ $r0 -ne 0 ] && [ $r0 -ne 124 ] && [ $r1 -ne 0 ] && [ $r1 -ne 124 ]"
expect "... and the error names UNISUM_AUTOTUNE on both" \
	both_say 'UNISUM_AUTOTUNE and UNISUM_AUTOTUNE_STEPS'
# Worker 0 fits (nothing set), worker 1 has a credit by hand, so autotune
# is off there: the first setting worker 0 posts fails the job.  (Another
# partition size on worker 1 fails at its first declare.)
half "" "UNISUM_SCHEDULING_CREDIT=1048576"
expect "a credit set on worker 1 only: both fail (exit $r0 and $r1), not hang" \
	sh -c "[ $r0 -ne 0 ] && [ $r0 -ne 124 ] && [ $r1 -ne 0 ] && [ $r1 -ne 124 ]"
expect "... and the error names fit mode and UNISUM_SCHEDULING_CREDIT on both" \
	both_say 'worker 0 autotunes with UNISUM_AUTOTUNE=2 (fit) but worker 1 has autotune off, since UNISUM_SCHEDULING_CREDIT is set'
# Search on both, epochs of different lengths.
half "UNISUM_AUTOTUNE=1 UNISUM_AUTOTUNE_STEPS=4" "UNISUM_AUTOTUNE=1 UNISUM_AUTOTUNE_STEPS=5"
expect "different UNISUM_AUTOTUNE_STEPS: both fail (exit $r0 and $r1), not hang" \
	sh -c "[ $r0 -ne 0 ] && [ $r0 -ne 124 ] && [ $r1 -ne 0 ] && [ $r1 -ne 124 ]"
expect "... and the error names both lengths" \
	both_say 'UNISUM_AUTOTUNE_STEPS=4 but worker 1 has UNISUM_AUTOTUNE=1 (search) with UNISUM_AUTOTUNE_STEPS=5'

# A bad window fails at start with the variable's name.
out=$(UNISUM_TRACE_ON=1 UNISUM_TRACE_DIR="$dir/bad" UNISUM_TRACE_START_STEP=5 \
	UNISUM_TRACE_END_STEP=2 timeout 60 "$UNISUM" launch -w 1 -s 1 --local-size 1 -- "$CHECK" rounds 1 2>&1)
expect "END_STEP below START_STEP is refused, by name" contains "$out" "UNISUM_TRACE_END_STEP=2"

drop_logs "$dir"
finish
