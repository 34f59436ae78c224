# Integration: a round some workers pushed and others did not is reported
# by the server (tensor, round, missing ranks), and with
# UNISUM_STALL_ABORT_MS fails the job on every rank instead of hanging.
. "$(dirname "$0")/lib.sh"

out=$(UNISUM_STALL_WARN_MS=300 timeout 60 "$UNISUM" launch -w 3 -s 1 -- "$CHECK" late 1500 2>&1)
rc=$?
expect "a late worker: the round still completes" [ $rc -eq 0 ]
expect "a late worker: the server reports the stall, naming tensor and round" \
	contains "$out" "stall: tensor 'late' \\(partition 0\\) round 0"
expect "a late worker: ... and the missing rank" contains "$out" 'for worker\(s\) 1, which'

out=$(UNISUM_STALL_ABORT_MS=800 timeout 60 "$UNISUM" launch -w 3 -s 1 -- "$CHECK" skip 2>&1)
rc=$?
# The first process to exit decides the status: a worker (3) or the
# server, which stops on the job's failure (1); never a hang (124).
expect "a skipped tensor with UNISUM_STALL_ABORT_MS: the job fails, no hang" [ $rc -eq 3 -o $rc -eq 1 ]
expect "... the first rank to fail names the tensor" \
	contains "$out" "rank [0-2]: (push_pull|barrier) returned .*stall: tensor 'skipped'"
[ "$FAILS" -eq 0 ] || echo "$out"
finish
