# Integration: two builds that differ only in the wire protocol's version
# refuse each other, each naming both versions (issue 23).  The build makes
# unisum_wire_next, this CLI speaking the next version (CMakeLists.txt:
# the same objects but the wire codec).  Real processes over loopback:
#
#   - a server of the next version against this version's scheduler: the
#     scheduler logs "protocol version N+1, this build speaks N" and tells
#     the server, whose own error says "protocol version N, this build
#     speaks N+1"; the server exits with an error, at once;
#   - a worker of this version against a scheduler of the next one: the
#     same, the other way round.
. "$(dirname "$0")/lib.sh"

NEXT="$BUILD/unisum_wire_next"
v=$("$UNISUM" --version | sed -n 's/.*wire protocol \([0-9]*\).*/\1/p')
n=$("$NEXT" --version | sed -n 's/.*wire protocol \([0-9]*\).*/\1/p')
expect "unisum_wire_next speaks the next wire version ($v, $n)" [ "$n" = "$((v + 1))" ]

log=$(mktemp -d)
env_job() {
	env UNISUM_NUM_WORKER=1 UNISUM_NUM_SERVER=1 UNISUM_SCHEDULER_HOST=127.0.0.1 \
		UNISUM_SCHEDULER_PORT="$port" UNISUM_SECRET=versions UNISUM_START_TIMEOUT_MS=1000 \
		UNISUM_TIMEOUT_MS=1500 "$@"
}

port=$(free_port)
env_job timeout 30 "$UNISUM" scheduler >"$log/sched" 2>&1 &
sched=$!
sleep 0.3
t0=$(date +%s%N)
env_job timeout 30 "$NEXT" server >"$log/server" 2>&1
rc=$?
ms=$(ms_since "$t0")
wait "$sched"
expect "a server of wire version $n against a scheduler of $v exits with an error, in $ms ms" \
	sh -c "[ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $ms -lt 10000 ]"
expect "... the scheduler names both versions" \
	grep -q "protocol version $n, this build speaks $v" "$log/sched"
expect "... and so does the server" grep -q "protocol version $v, this build speaks $n" "$log/server"

port=$(free_port)
env_job timeout 30 "$NEXT" scheduler >"$log/sched2" 2>&1 &
sched=$!
sleep 0.3
env_job UNISUM_ROLE=worker UNISUM_WORKER_ID=0 timeout 30 "$CHECK" sums >"$log/worker" 2>&1
rc=$?
wait "$sched"
expect "a worker of wire version $v against a scheduler of $n fails naming both versions" \
	sh -c "[ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q 'protocol version $n, this build speaks $v' '$log/worker'"
expect "... as the scheduler does" grep -q "protocol version $v, this build speaks $n" "$log/sched2"
drop_logs "$log"
finish
