#!/bin/sh
# Many processes on one machine (issue 49): W workers x S servers, every
# worker its own machine (--local-size 1, so everything goes through the
# servers), each push_pulling a 1 MiB float32 tensor 10 times
# (bench_pushpull).  For each size: whether it ran, the wall time, the
# CPU-seconds of the whole job (user and system, from the launcher's
# rusage of its children), the voluntary context switches, and the most
# threads seen in one server, in one worker and in the launcher, which
# runs the scheduler (sampled from /proc every 0.2 s while the job runs).
#
#   sh bench/scale.sh [BUILD_DIR] [WxS ...]    (defaults: build, 16x4 ... 256x32, 1024x32)
#   BASE=OTHER_BUILD sh bench/scale.sh ...     (each size with OTHER_BUILD too, right after)
#
# With BASE (a build of another commit: `git worktree add /tmp/base REV`,
# then cmake there) every size runs with that build right after this one,
# and a third row gives base/this for the wall time and the CPU-seconds.
#
# The machine's limits are printed with the table: kernel.pid_max bounds
# the threads of all processes together.
set -eu
ARGS="$*"
BUILD=${1:-build}
[ $# -gt 0 ] && shift
SIZES=${*:-16x4 64x8 128x16 256x32 1024x32}
BASE=${BASE:-}

# peak_threads PATTERN FILE : appends, every 0.2 s until FILE.stop exists,
# the most threads of one process whose command line matches PATTERN.
peak_threads() {
	while [ ! -e "$2.stop" ]; do
		max=0
		for p in $(pgrep -f "$1" 2>/dev/null); do
			t=$(awk '/^Threads:/ { print $2 }' "/proc/$p/status" 2>/dev/null || echo 0)
			[ "${t:-0}" -gt "$max" ] && max=$t
		done
		echo "$max" >>"$2"
		sleep 0.2
	done
}

# RUSAGE OUT CMD... : runs CMD, writes its wall seconds and its processes'
# user and system CPU-seconds and voluntary context switches to OUT, and
# exits with CMD's status.
RUSAGE='
import resource, subprocess, sys, time
t0 = time.monotonic()
rc = subprocess.call(sys.argv[2:])
r = resource.getrusage(resource.RUSAGE_CHILDREN)
with open(sys.argv[1], "w") as f:
    f.write("%.1f %.1f %.1f %d\n" % (time.monotonic() - t0, r.ru_utime, r.ru_stime, r.ru_nvcsw))
sys.exit(rc)
'

# run_one LABEL BUILD W S : one job; prints its row and leaves its
# figures in ROW (wall user sys ctxsw).
run_one() {
	tmp=$(mktemp -d)
	peak_threads "unisum server" "$tmp/srv" &
	p1=$!
	peak_threads "^[^ ]*bench_pushpull" "$tmp/wk" &
	p2=$!
	peak_threads "unisum launch" "$tmp/launch" &
	p3=$!
	result=ok
	/usr/bin/python3 -c "$RUSAGE" "$tmp/time" \
		"$2/unisum" launch -w "$3" -s "$4" --local-size 1 --timeout 600 -- \
		"$2/bench_pushpull" --mib 1 --iters 10 --warmup 1 >"$tmp/log" 2>&1 || result=FAILED
	touch "$tmp/srv.stop" "$tmp/wk.stop" "$tmp/launch.stop"
	wait "$p1" "$p2" "$p3"
	ROW=$(tail -n 1 "$tmp/time")
	set -- "$1" $ROW
	ts=$(sort -n "$tmp/srv" | tail -n 1)
	tw=$(sort -n "$tmp/wk" | tail -n 1)
	tl=$(sort -n "$tmp/launch" | tail -n 1)
	printf '%-15s %-6s %8s %8s %8s %12s %8s %8s %8s\n' "$1" "$result" "$2" "$3" "$4" "$5" "$ts" "$tw" "$tl"
	if [ "$result" != ok ]; then
		grep -m 3 -i 'error' "$tmp/log" | cut -c1-240 | sed 's/^/    /'
		ROW=
	fi
	rm -rf "$tmp"
}

echo "date: $(date -u '+%Y-%m-%d %H:%M UTC'), command: ${BASE:+BASE=$BASE }sh bench/scale.sh $ARGS"
echo "cpu: $(awk -F': ' '/model name/ { print $2; exit }' /proc/cpuinfo), $(nproc) cores;" \
	"kernel.pid_max $(cat /proc/sys/kernel/pid_max), RLIMIT_NOFILE $(ulimit -n)"
echo "each job: W workers (one per machine) x S servers, 1 MiB float32 push_pull, 1 + 10 rounds"
echo "threads: the most seen in one server, one worker, the launcher (its scheduler's)"
printf '%-15s %-6s %8s %8s %8s %12s %8s %8s %8s\n' "W x S" result wall_s user_s sys_s "vol. ctxsw" \
	server worker launcher
for ws in $SIZES; do
	w=${ws%x*} s=${ws#*x}
	run_one "$w x $s" "$BUILD" "$w" "$s"
	this=$ROW
	[ -n "$BASE" ] || continue
	run_one "  base" "$BASE" "$w" "$s"
	if [ -n "$this" ] && [ -n "$ROW" ]; then
		echo "$this $ROW" | awk '{ printf "%-15s %-6s %8.2f %8.2f %8.2f %12.2f\n", "  base/this", "",
			$5 / $1, $6 / $2, $7 / $3, $8 / $4 }'
	fi
done
