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

# With fewer descriptors than a process's connections need: `ulimit -n`.
NOFILE='ulimit -n "$0" && exec "$@"'

# A server with descriptors for a few workers' connections, not eight.
log=$(mktemp -d)
run_by_hand "$log" 8 1 server0 sh -c "$NOFILE" "${SERVER_FDS:-14}"
expect "a server out of descriptors: it and every other process name it and RLIMIT_NOFILE" \
	named_everywhere "$log" server0 "cannot take a worker's.*RLIMIT_NOFILE=[0-9]+"
[ -n "${KEEP:-}" ] || rm -rf "$log"

# A worker with descriptors for its first four server connections, not its
# fifth (11 descriptors reach the sixth; 12 are enough for all six: the
# scheduler client's loop holds two).
log=$(mktemp -d)
run_by_hand "$log" 2 6 worker0 sh -c "$NOFILE" "${WORKER_FDS:-10}"
expect "a worker out of descriptors: it and every other process name it and RLIMIT_NOFILE" \
	named_everywhere "$log" worker0 "cannot open its connection.*RLIMIT_NOFILE=[0-9]+"
[ -n "${KEEP:-}" ] || rm -rf "$log"

finish
