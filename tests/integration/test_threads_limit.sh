# Integration: a process that cannot start a thread names the limit, and
# every other process of the job names that process (issue 49).  Real
# scheduler, servers and workers; one of them runs in a pids cgroup whose
# pids.max leaves it too few threads for its connections (a real kernel
# limit: RLIMIT_NPROC does not bind root, a cgroup does).
#
# Checked in each case: the limited process names itself, pthread_create's
# error and pids.max; the scheduler, every server and every worker name
# that process (role, rank and pid) and the limit, instead of a missing
# handshake or a worker that left; and no process hangs.
. "$(dirname "$0")/lib.sh"

export UNISUM_SCHEDULER_HOST=127.0.0.1 UNISUM_TIMEOUT_MS=5000 UNISUM_START_TIMEOUT_MS=10000

# The pids controller's folder, cgroup v1 or v2, or nothing.
pids_root() {
	if [ -f /sys/fs/cgroup/pids/cgroup.procs ]; then
		echo /sys/fs/cgroup/pids
	elif grep -qw pids /sys/fs/cgroup/cgroup.controllers 2>/dev/null; then
		echo /sys/fs/cgroup
	elif grep -qw pids /sys/fs/cgroup/unified/cgroup.controllers 2>/dev/null; then
		echo /sys/fs/cgroup/unified
	fi
}

ROOT=$(pids_root)
if [ "$(id -u)" != 0 ] || [ -z "$ROOT" ]; then
	skip "a pids cgroup is needed (root: $(id -un), pids controller: ${ROOT:-none})"
	finish
fi
CG="$ROOT/unisum-test-$$"
if ! mkdir "$CG" 2>/dev/null; then
	FAILS=$((FAILS + 1))
	echo "FAIL cannot make the cgroup $CG"
	finish
fi
trap 'rmdir "$CG" 2>/dev/null' EXIT

# run_limited LOGDIR WORKERS SERVERS WHO MAX : a job of WORKERS check_sums
# workers and SERVERS servers; WHO (server0 or worker0) runs in the cgroup
# with pids.max MAX.
run_limited() {
	log=$1 nw=$2 ns=$3 who=$4
	echo "$5" >"$CG/pids.max"
	export UNISUM_NUM_WORKER=$nw UNISUM_NUM_SERVER=$ns UNISUM_SCHEDULER_PORT=$(free_port)
	UNISUM_ROLE=scheduler timeout 60 "$UNISUM" scheduler >"$log/scheduler" 2>&1 &
	for s in $(seq 0 $((ns - 1))); do
		set -- timeout 60 "$UNISUM" server
		[ "server$s" = "$who" ] && set -- sh -c 'echo $$ >"$0/cgroup.procs" && exec "$@"' "$CG" "$@"
		UNISUM_ROLE=server UNISUM_SERVER_ID=$s "$@" >"$log/server$s" 2>&1 &
	done
	for w in $(seq 0 $((nw - 1))); do
		set -- timeout 60 "$CHECK" sums
		[ "worker$w" = "$who" ] && set -- sh -c 'echo $$ >"$0/cgroup.procs" && exec "$@"' "$CG" "$@"
		UNISUM_ROLE=worker UNISUM_WORKER_ID=$w "$@" >"$log/worker$w" 2>&1 &
	done
	wait
}

# named LOGDIR WHO : every log names WHO's failure to start a thread, with
# its pid and the cgroup's limit; prints the logs that do not.
named() {
	role=${2%%[0-9]*} rank=${2#"$role"} ok=0
	for f in "$1"/*; do
		if ! grep -Eq "$role $rank \(pid [0-9]+\) cannot start the threads.*pthread_create: .*pids\.max [0-9]+" "$f"; then
			echo "  $(basename "$f") does not name $2's limit:"
			sed 's/^/    /' "$f" | tail -n 5
			ok=1
		fi
	done
	return $ok
}

# A server with room for one worker's connection threads, not four.
log=$(mktemp -d)
run_limited "$log" 4 1 server0 9
expect "a server out of threads: it and every other process name it and pids.max" named "$log" server0
rm -rf "$log"

# A worker with room for its first server connection, not its third.
log=$(mktemp -d)
run_limited "$log" 2 3 worker0 6
expect "a worker out of threads: it and every other process name it and pids.max" named "$log" worker0
rm -rf "$log"

finish
