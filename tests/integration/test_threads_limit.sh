# Integration: a process that cannot start a thread names the limit, and
# every other process of the job names that process (issue 49).  Real
# scheduler, servers and workers; one of them runs in a pids cgroup whose
# pids.max leaves it too few threads for its connections (a real kernel
# limit: RLIMIT_NPROC does not bind root, a cgroup does).
#
# Checked: a server's threads do not grow with its workers, nor a
# worker's with its servers (their connections are served by event
# loops); and, where a process cannot
# start a thread, it names itself, pthread_create's error and pids.max,
# and the scheduler, every server and every worker name that process
# (role, rank and pid) and the limit, instead of a missing handshake or a
# worker that left; and no process hangs.
. "$(dirname "$0")/lib.sh"

export UNISUM_SCHEDULER_HOST=127.0.0.1 UNISUM_TIMEOUT_MS=5000 UNISUM_START_TIMEOUT_MS=10000
# A server's threads: the main one, which runs its one I/O loop (it
# accepts too), 2 engines and the scheduler client's loop (the cgroup also
# holds `timeout`).
export UNISUM_SERVER_ENGINE_THREAD=2 UNISUM_IO_THREADS=1

new_cgroup pids

# The wrapper (run_by_hand's WRAP, given "$CG") that runs a process in the
# cgroup; in_cgroup MAX sets the cgroup's pids.max.
INTO_CG='echo $$ >"$0/cgroup.procs" && exec "$@"'
in_cgroup() {
	echo "$1" >"$CG/pids.max"
}

# all_summed LOGDIR WORKERS : every worker's rounds came out right.
all_summed() {
	n=$(grep -l "rounds ok" "$1"/worker* | wc -l)
	[ "$n" = "$2" ] || { echo "  $n of $2 workers summed"; tail -n 3 "$1"/server0 "$1"/worker0; return 1; }
}

# Eight workers through a server allowed 10 tasks: it spends none per
# connection (two threads each once made it need 23).
log=$(mktemp -d)
in_cgroup 10
HAND_MODE="rounds 3" run_by_hand "$log" 8 1 server0 sh -c "$INTO_CG" "$CG"
expect "a server's threads do not grow with its workers: 8 served within pids.max 10" \
	all_summed "$log" 8
rm -rf "$log"

# A server without room for its second I/O loop's thread (the first runs
# on its main thread; under ThreadSanitizer, which adds one of its own, the
# scheduler client's thread before it).
log=$(mktemp -d)
in_cgroup 5
UNISUM_IO_THREADS=2 run_by_hand "$log" 4 1 server0 sh -c "$INTO_CG" "$CG"
expect "a server out of threads: it and every other process name it and pids.max" \
	named_everywhere "$log" server0 "cannot start its (I/O|scheduler) thread.*pthread_create: .*pids\\.max [0-9]+"
rm -rf "$log"

# A worker with eight servers allowed 9 tasks: it spends none per
# connection either (two threads each once made it need 21).
log=$(mktemp -d)
in_cgroup 9
HAND_MODE="rounds 3" run_by_hand "$log" 2 8 worker0 sh -c "$INTO_CG" "$CG"
expect "a worker's threads do not grow with its servers: 8 served within pids.max 9" \
	all_summed "$log" 2
rm -rf "$log"

# A worker without room for the threads of its links (its I/O loop, the
# reaper of ended connections; under ThreadSanitizer, which adds one of
# its own, an earlier one).
log=$(mktemp -d)
in_cgroup 5
run_by_hand "$log" 2 3 worker0 sh -c "$INTO_CG" "$CG"
expect "a worker out of threads: it and every other process name it and pids.max" \
	named_everywhere "$log" worker0 "cannot start its .*pthread_create: .*pids\\.max [0-9]+"
rm -rf "$log"

finish
