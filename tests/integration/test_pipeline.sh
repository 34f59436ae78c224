# Integration: the PUSH stage's priority order and credit, and the
# timeline, on real jobs over loopback.  Orders are read from what the
# worker recorded (the timeline's dispatch numbers), never from timing.
. "$(dirname "$0")/lib.sh"

PY=${PYTHON:-python3}
TRACE=$(dirname "$0")/check_trace.py
dir=$(mktemp -d)

# Priority: credit for two 64 KiB partitions; rank 0 queues 64 backlog
# partitions, waits until two are in flight (the credit is used up), then
# queues one urgent partition, while rank 1 holds back (so the servers
# complete nothing and no credit comes back meanwhile).  The urgent one
# must be the third partition out; first come, first served would make it
# the 65th.
out=$(UNISUM_PARTITION_BYTES=65536 UNISUM_SCHEDULING_CREDIT=131072 UNISUM_TRACE_ON=1 \
	UNISUM_TRACE_DIR="$dir/prio" UNISUM_TRACE_START_STEP=0 UNISUM_TRACE_END_STEP=0 \
	timeout 120 "$UNISUM" launch -w 2 -s 2 -- "$CHECK" priority 2>&1)
echo "$out" >"$dir/prio.log"
expect "priority job: both sums exact on both ranks" \
	sh -c "[ \$(grep -c 'priority sums ok' '$dir/prio.log') -eq 2 ]"
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
	timeout 120 "$UNISUM" launch -w 2 -s 2 -- "$CHECK" rounds 10 >"$dir/win.log" 2>&1
expect "traced job passes" sh -c "[ \$(grep -c '10 rounds ok' '$dir/win.log') -eq 2 ]"
for r in 0 1; do
	expect "timeline of rank $r: valid JSON, every partition's spans in rounds 3..5 only" \
		"$PY" "$TRACE" window "$dir/win/$r/comm.json" 3 5 rounds=5
done

# A bad window fails at start with the variable's name.
out=$(UNISUM_TRACE_ON=1 UNISUM_TRACE_DIR="$dir/bad" UNISUM_TRACE_START_STEP=5 \
	UNISUM_TRACE_END_STEP=2 timeout 60 "$UNISUM" launch -w 1 -s 1 -- "$CHECK" rounds 1 2>&1)
expect "END_STEP below START_STEP is refused, by name" contains "$out" "UNISUM_TRACE_END_STEP=2"

drop_logs "$dir"
finish
