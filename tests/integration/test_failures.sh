# Integration: a dead process is named, the job stops, nothing hangs.
. "$(dirname "$0")/lib.sh"

# The launcher: the first failure is named and sets the exit status.
out=$(timeout 120 "$UNISUM" launch -w 3 -s 1 --local-size 1 -- sh -c 'if [ "$UNISUM_WORKER_ID" = 1 ]; then exit 3; fi; sleep 30' 2>&1)
rc=$?
expect "launch exits with the failing worker's status" [ $rc -eq 3 ]
expect "... and names it" contains "$out" 'worker 1 .*exited with status 3'
out=$(timeout 60 "$UNISUM" launch -w 1 -s 1 --local-size 1 -- /nonexistent/program 2>&1)
rc=$?
expect "launch of a missing program exits 127" [ $rc -eq 127 ]

# A program that returns from main without unisum_shutdown (BytePS's and
# Horovod's never call it) leaves at exit: a normal end.  A worker that
# ends, with or without unisum_shutdown, while the others wait for its
# next round fails the job within seconds, named, instead of hanging.
out=$(CHECK_SUMS_NO_SHUTDOWN=1 timeout 120 "$UNISUM" launch -w 2 -s 2 --local-size 1 -- "$CHECK" rounds 5 2>&1)
rc=$?
expect "main returning without unisum_shutdown: the job ends normally (exit $rc)" [ $rc -eq 0 ]
for how in "CHECK_SUMS_NO_SHUTDOWN=1" "CHECK_SUMS_NO_SHUTDOWN=0"; do
	t0=$(date +%s)
	out=$(env $how CHECK_SUMS_EARLY=1 timeout 120 "$UNISUM" launch -w 3 -s 2 --local-size 1 -- \
		"$CHECK" rounds 5 2>&1)
	rc=$? took=$(($(date +%s) - t0))
	expect "worker 0 ends after 1 of 5 rounds ($how): the job fails (exit $rc) in $took s" \
		sh -c "[ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $took -lt 30 ]"
	expect "... and a survivor's error names worker 0 and the round" \
		contains "$out" "check_sums\[rank [12]\] FAILED: .*worker 0 closed its connection .* round 1 still waits"
done

# SIGINT to the launcher stops the whole job: it exits 130 and no server
# or worker outlives it.
"$UNISUM" launch -w 2 -s 2 --local-size 1 -- "$CHECK" rounds 100000007 >/dev/null 2>"$BUILD/sigint.log" &
lp=$!
sleep 1
kill -INT $lp
wait $lp
rc=$?
sleep 0.5
# The job's processes are the ones whose environment names its scheduler.
port=$(sed -n 's/.*scheduler on 127.0.0.1:\([0-9]*\).*/\1/p' "$BUILD/sigint.log")
left=$(grep -l -a "UNISUM_SCHEDULER_PORT=$port" /proc/[0-9]*/environ 2>/dev/null | wc -l)
rm -f "$BUILD/sigint.log"
expect "SIGINT to the launcher: it exits 130" [ $rc -eq 130 ]
expect "... and none of its servers and workers outlives it" [ -n "$port" -a "$left" -eq 0 ]

# A worker killed mid-run: every survivor's error names it.  Started by
# hand so the survivors are not stopped by the launcher first.
pport=$(free_port)
log=$(mktemp -d)
export UNISUM_NUM_WORKER=3 UNISUM_NUM_SERVER=2 UNISUM_SCHEDULER_HOST=127.0.0.1 UNISUM_SCHEDULER_PORT=$pport
start=$(date +%s)
UNISUM_ROLE=scheduler timeout 60 "$UNISUM" scheduler >"$log/scheduler" 2>&1 &
sched=$!
UNISUM_ROLE=server timeout 60 "$UNISUM" server >"$log/server0" 2>&1 &
s0=$!
UNISUM_ROLE=server timeout 60 "$UNISUM" server >"$log/server1" 2>&1 &
s1=$!
for i in 0 1 2; do
	UNISUM_ROLE=worker UNISUM_WORKER_ID=$i timeout 60 "$CHECK" die 2 50 >"$log/w$i" 2>&1 &
	eval "w$i=\$!"
done
wait $w0; r0=$?
wait $w1; r1=$?
wait $w2; r2=$?
wait $s0; rs0=$?
wait $s1; rs1=$?
wait $sched; rsc=$?
elapsed=$(($(date +%s) - start))
expect "killed worker: survivor 0 failed naming worker 2" [ $r0 -eq 3 ]
expect "killed worker: survivor 1 failed naming worker 2" [ $r1 -eq 3 ]
expect "killed worker: the victim died by SIGKILL" [ $r2 -eq 137 ]
expect "killed worker: both servers exited non-zero" [ $rs0 -ne 0 -a $rs1 -ne 0 -a $rs0 -ne 124 -a $rs1 -ne 124 ]
expect "killed worker: the servers' logs name worker 2" sh -c "grep -q 'worker 2' '$log/server0' && grep -q 'worker 2' '$log/server1'"
expect "killed worker: the scheduler exited non-zero" [ $rsc -ne 0 -a $rsc -ne 124 ]
expect "killed worker: everything ended within 20 s" [ $elapsed -le 20 ]
drop_logs "$log"

# A worker that stops (SIGSTOP) stays connected but goes silent: the
# heartbeat timeout names it on every survivor.
pport=$(free_port)
log=$(mktemp -d)
export UNISUM_SCHEDULER_PORT=$pport UNISUM_NUM_WORKER=3 UNISUM_NUM_SERVER=1
export UNISUM_HEARTBEAT_MS=100 UNISUM_TIMEOUT_MS=1500
start=$(date +%s)
UNISUM_ROLE=scheduler timeout 60 "$UNISUM" scheduler >"$log/scheduler" 2>&1 &
sched=$!
UNISUM_ROLE=server timeout 60 "$UNISUM" server >"$log/server0" 2>&1 &
s0=$!
UNISUM_ROLE=worker UNISUM_WORKER_ID=0 timeout 60 "$CHECK" stop 1 30 >"$log/w0" 2>&1 &
w0=$!
UNISUM_ROLE=worker UNISUM_WORKER_ID=1 "$CHECK" stop 1 30 >"$log/w1" 2>&1 &
w1=$!
UNISUM_ROLE=worker UNISUM_WORKER_ID=2 timeout 60 "$CHECK" stop 1 30 >"$log/w2" 2>&1 &
w2=$!
wait $w0; r0=$?
wait $w2; r2=$?
elapsed=$(($(date +%s) - start))
kill -KILL $w1 2>/dev/null
wait $w1
wait $s0; rs0=$?
wait $sched; rsc=$?
unset UNISUM_HEARTBEAT_MS UNISUM_TIMEOUT_MS
expect "stopped worker: survivor 0 failed naming worker 1" [ $r0 -eq 3 ]
expect "stopped worker: survivor 2 failed naming worker 1" [ $r2 -eq 3 ]
expect "stopped worker: the survivors' errors say it went silent" grep -q "has sent nothing for" "$log/w0"
expect "stopped worker: the server exited non-zero" [ $rs0 -ne 0 -a $rs0 -ne 124 ]
expect "stopped worker: the scheduler exited non-zero" [ $rsc -ne 0 -a $rsc -ne 124 ]
expect "stopped worker: detected within the 1.5 s timeout plus a margin (10 s)" [ $elapsed -le 10 ]
drop_logs "$log"
finish
