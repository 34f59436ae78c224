# Integration: bad input gets a clear error and the job goes on.
. "$(dirname "$0")/lib.sh"

run_job "a push_pull of an undeclared tensor id fails clearly" 2 1 undeclared
run_job "a size mismatch between workers fails clearly at declare" 3 2 mismatch
run_job "a broadcast from two roots, a sum against an average: refused on every rank" 3 2 disagree
check_job "... the same among the workers of one machine (shared memory)" \
	"$UNISUM" launch -w 3 -s 1 --local-size 3 -- "$CHECK" disagree
check_job "... the same across machines of 2 workers each" \
	"$UNISUM" launch -w 4 -s 2 --local-size 2 -- "$CHECK" disagree

# Garbage to a server's port (stranger_job: the pieces started by hand).
log=$(mktemp -d)
stranger_job "$log" garbage
expect "garbage: worker 0 survived and finished its rounds" [ $rc0 -eq 0 ]
expect "garbage: worker 1 finished its rounds" [ $rc1 -eq 0 ]
expect "garbage: the server kept serving and exited cleanly" [ $rcs -eq 0 ]
expect "garbage: the scheduler exited cleanly" [ $rcp -eq 0 ]
expect "garbage: the server logged why it closed a connection" grep -q "closing a connection from" "$log/server"
drop_logs "$log"

# A bad environment value fails at start and names the variable.
out=$(UNISUM_NUM_WORKER=two UNISUM_NUM_SERVER=1 UNISUM_SCHEDULER_HOST=127.0.0.1 \
	UNISUM_SCHEDULER_PORT=1 timeout 20 "$UNISUM" server 2>&1)
rc=$?
expect "a malformed UNISUM_NUM_WORKER exits 2" [ $rc -eq 2 ]
expect "... and names the variable" contains "$out" UNISUM_NUM_WORKER
out=$(DMLC_ROLE=worker DMLC_NUM_WORKER=1 DMLC_NUM_SERVER=1 DMLC_PS_ROOT_URI=127.0.0.1 \
	DMLC_PS_ROOT_PORT=99999 timeout 20 "$CHECK" rounds 1 2>&1)
rc=$?
expect "an out-of-range DMLC_PS_ROOT_PORT fails unisum_init" [ $rc -ne 0 ]
expect "... and names the variable" contains "$out" DMLC_PS_ROOT_PORT
out=$(UNISUM_PARTITION_BYTES=4k timeout 60 "$UNISUM" launch -w 1 -s 1 --local-size 1 -- "$CHECK" rounds 1 2>&1)
expect "a malformed UNISUM_PARTITION_BYTES names the variable" contains "$out" UNISUM_PARTITION_BYTES
out=$(env -u UNISUM_SCHEDULER_PORT -u DMLC_PS_ROOT_PORT UNISUM_NUM_WORKER=1 UNISUM_NUM_SERVER=1 \
	UNISUM_SCHEDULER_HOST=127.0.0.1 timeout 20 "$CHECK" rounds 1 2>&1)
expect "a missing scheduler port names the variable" contains "$out" UNISUM_SCHEDULER_PORT
finish
