# Integration: a round some workers pushed and others did not is reported
# (tensor, round, missing ranks) by the server, or on one machine by the
# workers waiting in shared memory; a barrier some workers entered and
# others not, by the scheduler.  With UNISUM_STALL_ABORT_MS either fails
# the job on every rank instead of hanging.
. "$(dirname "$0")/lib.sh"

out=$(UNISUM_STALL_WARN_MS=300 timeout 60 "$UNISUM" launch -w 3 -s 1 --local-size 1 -- "$CHECK" late 1500 2>&1)
rc=$?
expect "a late worker: the round still completes" [ $rc -eq 0 ]
expect "a late worker: the server reports the stall, naming tensor and round" \
	contains "$out" "stall: tensor 'late' \\(partition 0\\) round 0"
expect "a late worker: ... and the missing rank" contains "$out" 'for worker\(s\) 1, which'
expect "a late worker: the scheduler reports the barrier it is late for, naming it" \
	contains "$out" "stall: a barrier has waited [0-9]+ ms for worker 1, which have not entered it"

out=$(UNISUM_STALL_WARN_MS=300 timeout 60 "$UNISUM" launch -w 3 -s 1 --local-size 3 -- "$CHECK" late 1500 2>&1)
rc=$?
expect "a late worker on one machine: the round still completes" [ $rc -eq 0 ]
expect "a late worker on one machine: the waiting workers report the stall, naming the tensor" \
	contains "$out" "stall: worker [02] has waited [0-9]+ ms for .*: tensor 'late' round 0 \(held up by worker 1"

# Every rank must get the error, so the processes are started by hand (the
# launcher would stop the others at the first exit).
# by_hand MODE WHAT [one-machine] : check_sums MODE on 3 workers (3 machines,
# or one machine of 3) and 1 server started by hand with
# UNISUM_STALL_ABORT_MS; every worker must exit 3 (the error named what it
# should), the server and the scheduler non-zero.
by_hand() {
	log=$(mktemp -d)
	(
		export UNISUM_NUM_WORKER=3 UNISUM_NUM_SERVER=1 UNISUM_SCHEDULER_HOST=127.0.0.1
		export UNISUM_SCHEDULER_PORT="$(free_port)" UNISUM_STALL_ABORT_MS=800
		if [ "${3:-}" = one-machine ]; then
			export UNISUM_NUM_WORKER=1 UNISUM_LOCAL_SIZE=3 UNISUM_JOB_ID="stall$$"
		fi
		UNISUM_ROLE=scheduler timeout 60 "$UNISUM" scheduler >"$log/scheduler" 2>&1 &
		echo $! >"$log/sched.pid"
		UNISUM_ROLE=server timeout 60 "$UNISUM" server >"$log/server" 2>&1 &
		echo $! >"$log/server.pid"
		for w in 0 1 2; do
			if [ "${3:-}" = one-machine ]; then
				id="UNISUM_WORKER_ID=0 UNISUM_LOCAL_RANK=$w"
			else
				id="UNISUM_WORKER_ID=$w"
			fi
			env UNISUM_ROLE=worker $id timeout 60 "$CHECK" "$1" >"$log/w$w" 2>&1 &
			echo $! >"$log/w$w.pid"
		done
		for p in w0 w1 w2 server sched; do
			wait "$(cat "$log/$p.pid")"
			echo $? >"$log/$p.rc"
		done
	)
	for w in 0 1 2; do
		expect "$2 with UNISUM_STALL_ABORT_MS: worker $w fails naming it (no hang)" \
			[ "$(cat "$log/w$w.rc")" -eq 3 ]
	done
	expect "... the server exits non-zero" [ "$(cat "$log/server.rc")" -ne 0 ]
	expect "... the scheduler exits non-zero" [ "$(cat "$log/sched.rc")" -ne 0 ]
	drop_logs "$log"
}
by_hand skip "a skipped tensor"
by_hand skip "a skipped tensor on one machine (shared memory)" one-machine
by_hand nobarrier "a barrier worker 1 never enters"
finish
