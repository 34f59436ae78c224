# Integration: a round some workers pushed and others did not is reported
# by the server (tensor, round, missing ranks), and with
# UNISUM_STALL_ABORT_MS fails the job on every rank instead of hanging.
. "$(dirname "$0")/lib.sh"

out=$(UNISUM_STALL_WARN_MS=300 timeout 60 "$UNISUM" launch -w 3 -s 1 --local-size 1 -- "$CHECK" late 1500 2>&1)
rc=$?
expect "a late worker: the round still completes" [ $rc -eq 0 ]
expect "a late worker: the server reports the stall, naming tensor and round" \
	contains "$out" "stall: tensor 'late' \\(partition 0\\) round 0"
expect "a late worker: ... and the missing rank" contains "$out" 'for worker\(s\) 1, which'

# Every rank must get the error, so the processes are started by hand (the
# launcher would stop the others at the first exit).
log=$(mktemp -d)
export UNISUM_NUM_WORKER=3 UNISUM_NUM_SERVER=1 UNISUM_SCHEDULER_HOST=127.0.0.1
export UNISUM_SCHEDULER_PORT=$(free_port) UNISUM_STALL_ABORT_MS=800
UNISUM_ROLE=scheduler timeout 60 "$UNISUM" scheduler >"$log/scheduler" 2>&1 &
sched=$!
UNISUM_ROLE=server timeout 60 "$UNISUM" server >"$log/server" 2>&1 &
server=$!
for w in 0 1 2; do
	UNISUM_ROLE=worker UNISUM_WORKER_ID=$w timeout 60 "$CHECK" skip >"$log/w$w" 2>&1 &
	eval "pid$w=\$!"
done
for w in 0 1 2; do
	eval "wait \$pid$w"
	rc=$?
	expect "a skipped tensor with UNISUM_STALL_ABORT_MS: worker $w fails naming it (no hang)" [ $rc -eq 3 ]
done
wait $server
expect "... the server exits non-zero" [ $? -ne 0 ]
wait $sched
expect "... the scheduler exits non-zero" [ $? -ne 0 ]
drop_logs "$log"
finish
