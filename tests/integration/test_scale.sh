# Integration: many processes on one machine (issue 49).  128 workers,
# each its own machine, and 16 servers (32 x 8 under the sanitizers,
# UNISUM_TEST_LIGHT=1) through `unisum launch`, summing a small tensor
# over rounds, every element checked on every rank.  While the job runs,
# the threads of every process are read from /proc: a server and a
# worker each keep a fixed number, whatever the number of their peers
# (their connections are served by event loops), and so does the
# launcher, which runs the scheduler (one thread, whatever the nodes).
. "$(dirname "$0")/lib.sh"

W=128 S=16
[ "${UNISUM_TEST_LIGHT:-0}" = 1 ] && W=32 S=8
export UNISUM_SERVER_ENGINE_THREAD=2 UNISUM_IO_THREADS=1
# Whatever the cores: a server: main (running loop 0), 2 engines, the
# scheduler client's loop, the thread that dials its backup (replicas;
# one more per further loop: 6 with a 2-core machine's default of 2).  A worker: main, PUSH, autotune, one loop, the
# reaper, the scheduler client's loop.  The launcher: main, output, the
# scheduler.  One more each for ThreadSanitizer's own; a TSan server was
# once seen with two more, so the sanitizer runs allow it.
MAX_SERVER=6 MAX_WORKER=7 MAX_LAUNCHER=5
[ "${UNISUM_TEST_LIGHT:-0}" = 1 ] && MAX_SERVER=7

log=$(mktemp -d)
# peak PATTERN : the most threads of one process matching PATTERN, each
# 0.2 s, into $log/peak.PATTERN's name, until $log/stop exists.
# Only this job's processes count (their environment holds SCALE_TAG):
# the tests beside it in ctest run servers too, over UCX with two threads
# more (a server seen with 8 threads was one of test_ucx's).
export SCALE_TAG="scale$$"
peak() {
	while [ ! -e "$log/stop" ]; do
		for p in $(pgrep -f "$1"); do
			tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "SCALE_TAG=$SCALE_TAG" &&
				awk '/^Threads:/ { print $2 }' "/proc/$p/status" 2>/dev/null
		done
		sleep 0.2
	done | sort -n | tail -n 1 >"$log/peak.$2"
}
peak "^[^ ]*unisum server" server &
p1=$!
peak "^[^ ]*check_sums rounds" worker &
p2=$!
peak "^[^ ]*unisum launch" launcher &
p3=$!
t0=$(date +%s%N)
timeout 300 "$UNISUM" launch -w "$W" -s "$S" --local-size 1 -- "$CHECK" rounds 40 >"$log/job" 2>&1
rc=$?
touch "$log/stop"
wait "$p1" "$p2" "$p3"
ok=$(grep -c "40 rounds ok" "$log/job")
expect "$W x $S: every rank's sums exact, the job ends well [$(ms_since "$t0") ms]" \
	sh -c "[ $rc -eq 0 ] && [ $ok -eq $W ]"
for role in server worker launcher; do
	eval max=\$MAX_$(echo $role | tr a-z A-Z)
	n=$(cat "$log/peak.$role")
	expect "$W x $S: a $role runs at most $max threads (seen: ${n:-none})" \
		sh -c "[ -n '$n' ] && [ '$n' -gt 0 ] && [ '$n' -le $max ]"
done
[ "$FAILS" -eq 0 ] || tail -n 20 "$log/job"
rm -rf "$log"
finish
