# Integration: a process that runs out of descriptors names RLIMIT_NOFILE,
# and every other process of the job names that process (issue 49).  Real
# scheduler, servers and workers; one of them runs under `ulimit -n` (soft
# and hard) with too few descriptors for its connections.
#
# Checked in each case: the limited process names itself and the limit;
# the scheduler, every server and every worker name that process (role,
# rank and pid) and RLIMIT_NOFILE, instead of a missing handshake or a
# worker that left; and no process hangs.
. "$(dirname "$0")/lib.sh"

export UNISUM_SCHEDULER_HOST=127.0.0.1 UNISUM_TIMEOUT_MS=5000 UNISUM_START_TIMEOUT_MS=10000

# run_limited LOGDIR WORKERS SERVERS WHO FDS : a job of WORKERS check_sums
# workers and SERVERS servers; WHO (server0 or worker0) runs with
# RLIMIT_NOFILE at FDS.
run_limited() {
	log=$1 nw=$2 ns=$3 who=$4 fds=$5
	export UNISUM_NUM_WORKER=$nw UNISUM_NUM_SERVER=$ns UNISUM_SCHEDULER_PORT=$(free_port)
	UNISUM_ROLE=scheduler timeout 60 "$UNISUM" scheduler >"$log/scheduler" 2>&1 &
	for s in $(seq 0 $((ns - 1))); do
		set -- timeout 60 "$UNISUM" server
		[ "server$s" = "$who" ] && set -- sh -c 'ulimit -n "$0" && exec "$@"' "$fds" "$@"
		UNISUM_ROLE=server UNISUM_SERVER_ID=$s "$@" >"$log/server$s" 2>&1 &
	done
	for w in $(seq 0 $((nw - 1))); do
		set -- timeout 60 "$CHECK" sums
		[ "worker$w" = "$who" ] && set -- sh -c 'ulimit -n "$0" && exec "$@"' "$fds" "$@"
		UNISUM_ROLE=worker UNISUM_WORKER_ID=$w "$@" >"$log/worker$w" 2>&1 &
	done
	wait
}

# named LOGDIR WHO WHAT : every log names WHO's failure (WHAT, a pattern)
# with its pid and RLIMIT_NOFILE; prints the logs that do not.
named() {
	role=${2%%[0-9]*} rank=${2#"$role"} ok=0
	for f in "$1"/*; do
		if ! grep -Eq "$role $rank \(pid [0-9]+\) $3.*RLIMIT_NOFILE=[0-9]+" "$f"; then
			echo "  $(basename "$f") does not name $2's limit:"
			sed 's/^/    /' "$f" | tail -n 5
			ok=1
		fi
	done
	return $ok
}

# A server with descriptors for a few workers' connections, not eight.
log=$(mktemp -d)
run_limited "$log" 8 1 server0 "${SERVER_FDS:-12}"
expect "a server out of descriptors: it and every other process name it and RLIMIT_NOFILE" \
	named "$log" server0 "cannot take a worker's"
[ -n "${KEEP:-}" ] || rm -rf "$log"

# A worker with descriptors for its first four server connections, not its
# fifth (9 descriptors reach the sixth; 10 are enough for all six).
log=$(mktemp -d)
run_limited "$log" 2 6 worker0 "${WORKER_FDS:-8}"
expect "a worker out of descriptors: it and every other process name it and RLIMIT_NOFILE" \
	named "$log" worker0 "cannot open its connection"
[ -n "${KEEP:-}" ] || rm -rf "$log"

finish
