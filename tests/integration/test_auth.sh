# Integration: with a job secret, peers that cannot prove it (no secret, a
# wrong one, a replayed handshake) are hung up on before any of their bytes
# is read as a message, and the job completes correctly meanwhile.
. "$(dirname "$0")/lib.sh"

log=$(mktemp -d)
sport=$(free_port)
export UNISUM_NUM_WORKER=2 UNISUM_NUM_SERVER=1 UNISUM_SCHEDULER_HOST=127.0.0.1
export UNISUM_SCHEDULER_PORT=$(free_port) UNISUM_SECRET=correct-horse-battery
UNISUM_ROLE=scheduler timeout 60 "$UNISUM" scheduler >"$log/scheduler" 2>&1 &
sched=$!
UNISUM_ROLE=server UNISUM_PORT=$sport timeout 60 "$UNISUM" server >"$log/server" 2>&1 &
server=$!

# A worker with the wrong secret cannot even register.
out=$(UNISUM_SECRET=wrong UNISUM_ROLE=worker UNISUM_WORKER_ID=0 UNISUM_TIMEOUT_MS=3000 \
	timeout 30 "$CHECK" rounds 1 2>&1)
rc=$?
expect "a worker with a wrong secret fails to join" [ $rc -ne 0 -a $rc -ne 124 ]
expect "... and says the secret differs" contains "$out" "UNISUM_SECRET|secret"

UNISUM_ROLE=worker UNISUM_WORKER_ID=0 timeout 60 "$CHECK" auth "$sport" >"$log/w0" 2>&1 &
w0=$!
UNISUM_ROLE=worker UNISUM_WORKER_ID=1 timeout 60 "$CHECK" auth "$sport" >"$log/w1" 2>&1
r1=$?
wait $w0
r0=$?
wait $server
rs=$?
wait $sched
rsc=$?
expect "strangers rejected: no secret, wrong secret, replayed handshake (worker 0's checks)" [ $r0 -eq 0 ]
expect "the job completed correctly meanwhile" [ $r1 -eq 0 -a $rs -eq 0 -a $rsc -eq 0 ]
expect "the server logged each rejection" [ "$(grep -c 'job secret' "$log/server")" -ge 3 ]
expect "the scheduler logged the wrong-secret worker" grep -q "job secret" "$log/scheduler"
drop_logs "$log"
finish
