# Integration: once the launcher has named the first cause of a failure
# and begun to stop the job, no later error line (from the scheduler, a
# server or a worker) names another process as if it had failed on its
# own (issue 47).  The processes the stop takes down hear the first cause
# from the scheduler instead.  Four ways a job fails: a worker that
# fails at import (before it ever reaches the scheduler), a worker killed
# mid-run, a server killed mid-run, and Ctrl-C to the launcher.
. "$(dirname "$0")/lib.sh"
REPO=$(cd "$(dirname "$0")/../.." && pwd)
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# blamed OUT CULPRIT : the processes that the error lines of OUT after
# the launcher's first "stopping the job" name, other than CULPRIT ("worker
# 1", "server 0", or "" for none), one per line; empty when there is none.
# The "[worker 0] " prefix and a log's "unisum[...]" tag say who speaks,
# not whom it blames, and a process naming itself (where its own
# operation failed) blames nobody.
blamed() {
	printf '%s\n' "$1" | sed -n '/stopping the job/,$p' | sed '1d' |
		grep -E 'ERROR|Error:|FAILED' |
		awk -v culprit="$2" '{
			speaker = ""
			if (match($0, /^\[(worker|server) [0-9]+\] /))
				speaker = substr($0, 2, RLENGTH - 3)
			line = $0
			sub(/^\[[^]]*\] /, "", line)
			gsub(/unisum\[[^]]*\]/, "", line)
			while (match(line, /(worker|server) [0-9]+/)) {
				who = substr(line, RSTART, RLENGTH)
				if (who != culprit && who != speaker)
					print who
				line = substr(line, RSTART + RLENGTH)
			}
		}' | sort -u
}

# judge NAME OUT CULPRIT : the job failed, its launcher named CULPRIT
# first, and no later error line names another process.
judge() {
	others=$(blamed "$2" "$3")
	expect "$1: the launcher names ${3:-the signal} first" \
		contains "$(printf '%s\n' "$2" | grep 'stopping the job' | head -n 1)" "${4:-$3}"
	expect "$1: no error after it names another process${others:+ (named: $others)}" \
		[ -z "$others" ]
}

# A Python worker that fails at import, before it reaches the scheduler
# (ModuleNotFoundError), through the servers and on one machine.
cat >"$TMP/import_fails.py" <<'EOF'
import os
import time
if os.environ["RANK"] == "1":
    import no_such_module_of_this_test  # noqa: F401
import torch
import unisum.torch as us
us.init()
for i in range(600):
    us.push_pull(torch.ones(1000), name="t")
    time.sleep(0.05)
EOF
for shape in "-s 2 --local-size 1" "-s 1"; do
	# shellcheck disable=SC2086
	out=$(PYTHONPATH="$REPO/python" timeout 120 "$UNISUM" launch -w 2 $shape -- \
		/usr/bin/python3 "$TMP/import_fails.py" 2>&1)
	rc=$?
	expect "worker fails at import ($shape): the job fails with its status (exit $rc)" [ $rc -eq 1 ]
	expect "... its error is shown" contains "$out" "ModuleNotFoundError"
	judge "worker fails at import ($shape)" "$out" "worker 1"
done

# A worker killed by SIGKILL after 30 rounds.
out=$(timeout 120 "$UNISUM" launch -w 3 -s 2 --local-size 1 -- "$CHECK" die 1 30 9 2>&1)
rc=$?
expect "killed worker: the job fails (exit $rc)" [ $rc -eq 137 ]
judge "killed worker" "$out" "worker 1"

# A server killed by SIGKILL mid-run (one server: no failover).
timeout 60 "$UNISUM" launch -w 2 -s 1 --local-size 1 -- "$CHECK" rounds 100000007 \
	>"$TMP/server.log" 2>&1 &
lp=$!
# server_pid : the job's server process, once the launcher has started it.
server_pid() {
	port=$(sed -n 's/.*scheduler on 127.0.0.1:\([0-9]*\).*/\1/p' "$TMP/server.log")
	[ -n "$port" ] || return 0
	grep -l -a "UNISUM_SCHEDULER_PORT=$port" /proc/[0-9]*/environ 2>/dev/null |
		while read -r f; do
			tr '\0' '\n' <"$f" 2>/dev/null | grep -qx 'UNISUM_ROLE=server' &&
				{ d=${f%/environ}; echo "${d#/proc/}"; }
		done | head -n 1
}
victim=""
for _ in $(seq 50); do
	victim=$(server_pid)
	[ -n "$victim" ] && break
	sleep 0.2
done
sleep 1		# the rounds run
expect "killed server: found the server's process" [ -n "$victim" ]
[ -n "$victim" ] && kill -KILL "$victim"
wait $lp
rc=$?
out=$(cat "$TMP/server.log")
expect "killed server: the job fails (exit $rc)" [ $rc -eq 137 ]
judge "killed server" "$out" "server 0"

# Ctrl-C: SIGINT to the launcher while every process runs well.
"$UNISUM" launch -w 2 -s 2 --local-size 1 -- "$CHECK" rounds 100000007 >"$TMP/sigint.log" 2>&1 &
lp=$!
sleep 2
kill -INT $lp
wait $lp
rc=$?
out=$(cat "$TMP/sigint.log")
expect "Ctrl-C: the launcher exits 130 (exit $rc)" [ $rc -eq 130 ]
judge "Ctrl-C" "$out" "" "received SIGINT"

[ "$FAILS" -eq 0 ] || printf '%s\n' "--- the last job's output" "$out"
finish
