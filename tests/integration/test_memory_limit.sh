# Integration: a process that runs out of memory is named, with the cause,
# by itself and every other process of the job (issue 49).  Real
# scheduler, servers and workers, two ways memory runs out:
#
# - an allocation fails (a server under `ulimit -v`, RLIMIT_AS, summing
#   64 MiB tensors): the server names itself and the limits on memory,
#   and fails the job through the scheduler; every process names it;
# - the kernel's OOM killer ends a process (a worker in a memory cgroup
#   whose limit is below what it touches, cgroup v1 or v2, no swap):
#   SIGKILL, which nobody can catch; the launcher sees it and names the
#   OOM killer, and so does its scheduler (the worker is its child) in
#   what it tells every survivor.
. "$(dirname "$0")/lib.sh"

export UNISUM_SCHEDULER_HOST=127.0.0.1 UNISUM_TIMEOUT_MS=5000 UNISUM_START_TIMEOUT_MS=10000

# With less address space than a server needs for 2 workers' 64 MiB pushes.
AS='ulimit -v "$0" && exec "$@"'
log=$(mktemp -d)
HAND_MODE="sums --big" run_by_hand "$log" 2 1 server0 sh -c "$AS" "${SERVER_KB:-200000}"
expect "a server out of memory: it and every other process name it and RLIMIT_AS" \
	named_everywhere "$log" server0 "is out of memory: .*RLIMIT_AS \(\`ulimit -v\`\)=[0-9]+ MiB"
[ -n "${KEEP:-}" ] || rm -rf "$log"

# The OOM killer strikes only where nothing can be swapped out.
if [ -n "$(tail -n +2 /proc/swaps)" ]; then
	skip "a machine without swap is needed ($(tail -n +2 /proc/swaps | wc -l) swap devices)"
	finish
fi
new_cgroup memory
if [ -f "$CG/memory.limit_in_bytes" ]; then
	echo 96M >"$CG/memory.limit_in_bytes"
else
	echo 96M >"$CG/memory.max"
fi

# Worker 1 moves itself into the cgroup and sums 64 MiB tensors, each
# worker its own machine (through the server and the scheduler).
out=$(CG=$CG timeout 120 "$UNISUM" launch -w 2 -s 1 --local-size 1 -- sh -c \
	'[ "$RANK" = 1 ] && echo $$ >"$CG/cgroup.procs"; exec "$0" sums --big' "$CHECK" 2>&1)
rc=$?
killed="killed by signal 9 \(SIGKILL\): out of memory, by the kernel's OOM killer"
expect "a worker killed by the OOM killer: the job fails (rc $rc)" [ "$rc" -ne 0 ]
expect "... the launcher names it and the OOM killer" \
	contains "$out" "^unisum launch: worker 1 \(pid [0-9]+\) $killed"
# The launcher stops the survivors at once (SIGTERM), so one may end
# before it says a word; what each says of worker 1 names the cause.
told=$(printf '%s\n' "$out" | grep -E "^\[(worker 0|server 0)\].*worker 1 ")
expect "... and what worker 0 and the server say of worker 1 names the OOM killer" \
	sh -c '! printf "%s\n" "$1" | grep -Ev "$2" | grep -q .' sh "$told" "$killed"
[ "$FAILS" -eq 0 ] || printf '%s\n' "$out" | tail -n 15
finish
