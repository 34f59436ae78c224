# Integration: with a job secret, peers that cannot prove it (no secret, a
# wrong one, a replayed handshake) are hung up on before any of their bytes
# is read as a message, and the job completes correctly meanwhile.
. "$(dirname "$0")/lib.sh"

export UNISUM_SECRET=correct-horse-battery

# A worker with the wrong secret cannot even register.
wrong_secret_worker() {
	out=$(UNISUM_SECRET=wrong UNISUM_ROLE=worker UNISUM_WORKER_ID=0 UNISUM_TIMEOUT_MS=3000 \
		timeout 30 "$CHECK" rounds 1 2>&1)
	rc=$?
	expect "a worker with a wrong secret fails to join" [ $rc -ne 0 -a $rc -ne 124 ]
	expect "... and says the secret differs" contains "$out" "UNISUM_SECRET|secret"
}

log=$(mktemp -d)
stranger_job "$log" auth wrong_secret_worker
expect "strangers rejected: no secret, wrong secret, replayed handshake (worker 0's checks)" [ $rc0 -eq 0 ]
expect "the job completed correctly meanwhile" [ $rc1 -eq 0 -a $rcs -eq 0 -a $rcp -eq 0 ]
expect "the server logged each rejection" [ "$(grep -c 'job secret' "$log/server")" -ge 3 ]
expect "the scheduler logged the wrong-secret worker" grep -q "job secret" "$log/scheduler"
drop_logs "$log"
finish
