#!/bin/sh
# Many processes on one machine (issue 49): W workers x S servers, every
# worker its own machine (--local-size 1, so everything goes through the
# servers), each push_pulling a 1 MiB float32 tensor 1 + ITERS times, then
# a 4-byte one 1 + SMALL times (bench_pushpull; every sum checked
# exactly).  For each size it prints:
#   - launch -> first: the most, over the ranks, of the time from just
#     before `unisum launch` to the end of that rank's first push_pull;
#   - the median and p99 of the 1 MiB and of the 4-byte push_pull (an
#     iteration's time is its slowest rank's; p99 is the slowest when
#     there are fewer than 100);
#   - the wall time, the CPU-seconds of the whole job (user + system,
#     from the launcher's rusage of its children), and the CPU-seconds and
#     voluntary context switches per iteration (all iterations, the launch
#     included);
#   - the most threads and the largest peak RSS (VmHWM) of one server, one
#     worker and the launcher (which runs the scheduler), sampled from
#     /proc by one process (every 0.1 s for 2 s, then every 0.5 s).
# Then a latency row: a 4-byte push_pull of 2 workers through 1 server,
# against gloo's all_reduce (bench/peers/gloo_allreduce.py) and OpenMPI's
# MPI_Allreduce (bench/peers/mpi_allreduce.c) of 4 bytes, in the same run.
#
#   sh bench/scale.sh [BUILD_DIR] [WxS ...]    (defaults: build, 16x4 64x8 256x32 1024x32)
#   BASE=OTHER_BUILD sh bench/scale.sh ...     (each size with OTHER_BUILD too, right after)
#   ITERS=10 SMALL=30 LAT_ITERS=1000           (the defaults)
#
# BASE is a build of another commit: `git worktree add /tmp/old REV`, then
# `git -C /tmp/old checkout HEAD@{0} -- bench/pushpull.c bench/timing.h`
# from this checkout's files (cp them), and cmake there; its rows run with
# its own bench_pushpull, which must know --small.
#
# Limits, raised as a real cluster's hosts would be: `unisum launch`
# raises RLIMIT_NOFILE's soft limit to the hard one for its children; the
# table's head prints both, kernel.pid_max and kernel.threads-max (the
# threads of all processes together).
set -eu
ARGS="$*"
BUILD=${1:-build}
[ $# -gt 0 ] && shift
SIZES=${*:-16x4 64x8 256x32 1024x32}
BASE=${BASE:-}
ITERS=${ITERS:-10}
SMALL=${SMALL:-30}
LAT_ITERS=${LAT_ITERS:-1000}
HERE=$(cd "$(dirname "$0")" && pwd)
PY=/usr/bin/python3
sh "$HERE/../scripts/install-deps.sh" bench

# SAMPLER OUT : every 0.1 s for 2 s, then every 0.5 s, until OUT.stop exists, the most threads and
# the largest VmHWM (KiB) of one process of each role; writes
# "server_threads worker_threads launcher_threads server_kib worker_kib
# launcher_kib" to OUT.
SAMPLER='
import os, sys, time
out = sys.argv[1]
roles = {"server": (0, 0), "worker": (0, 0), "launcher": (0, 0)}
t0 = time.monotonic()
def role(cmd):
    argv = cmd.split(b"\0") + [b""]
    prog = os.path.basename(argv[0])
    if prog == b"bench_pushpull":
        return "worker"
    if prog == b"unisum":
        return {b"launch": "launcher", b"server": "server"}.get(argv[1])
    return None
while not os.path.exists(out + ".stop"):
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                r = role(f.read())
            if r is None:
                continue
            t = k = 0
            with open("/proc/%s/status" % pid) as f:
                for line in f:
                    if line.startswith("Threads:"):
                        t = int(line.split()[1])
                    elif line.startswith("VmHWM:"):
                        k = int(line.split()[1])
        except OSError:
            continue
        mt, mk = roles[r]
        roles[r] = (max(mt, t), max(mk, k))
    time.sleep(0.1 if time.monotonic() - t0 < 2 else 0.5)
with open(out, "w") as f:
    f.write("%d %d %d %d %d %d\n" % tuple([roles[r][0] for r in ("server", "worker", "launcher")] +
                                          [roles[r][1] for r in ("server", "worker", "launcher")]))
'

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

# field NAME LINE : the value of NAME=... in LINE; v: the same, or nan.
field() { echo "$2" | tr ' ' '\n' | sed -n "s/^$1=//p" | head -1; }
v() {
	x=$(field "$1" "$2")
	echo "${x:-nan}"
}

# run_one LABEL BUILD W S : one job; prints its row and leaves its
# figures in ROW ("wall cpu ctxsw_per_iteration"), empty when it failed.
run_one() {
	tmp=$(mktemp -d)
	$PY -c "$SAMPLER" "$tmp/peak" &
	sampler=$!
	result=ok
	PUSHPULL_T0=$(date +%s.%N) $PY -c "$RUSAGE" "$tmp/time" \
		"$2/unisum" launch -w "$3" -s "$4" --local-size 1 --timeout 900 -- \
		"$2/bench_pushpull" --mib 1 --iters "$ITERS" --warmup 1 --small "$SMALL" \
		>"$tmp/log" 2>&1 || result=FAILED
	touch "$tmp/peak.stop"
	wait "$sampler"
	set -- "$1" $(cat "$tmp/time") $(cat "$tmp/peak")
	big=$(grep -m 1 'pushpull workers=' "$tmp/log" || true)
	small=$(grep -m 1 'pushpull_small' "$tmp/log" || true)
	first=$(grep -m 1 'pushpull_launch' "$tmp/log" || true)
	iters=$((1 + ITERS + (SMALL > 0 ? SMALL + 1 : 0)))
	echo "$1 $result $(v first_max_s "$first") $(v median_s "$big") $(v p99_s "$big")" \
		"$(v median_s "$small") $(v p99_s "$small") $2 $3 $4 $5 $iters $6 $7 $8 $9 ${10} ${11}" |
		awk '{ ms = 1000; cpu = $9 + $10
		printf "%-11s %-6s %7s %8.2f %7.2f %8.3f %7.3f %6.1f %7.1f %7.3f %9.0f %3d/%d/%d %4.0f/%.0f/%.0f\n",
			$1, $2, $3, $4 * ms, $5 * ms, $6 * ms, $7 * ms, $8, cpu, cpu / $12, $11 / $12,
			$13, $14, $15, $16 / 1024, $17 / 1024, $18 / 1024 }' | sed 's/_/ /g'
	ROW="$2 $(($(echo "$3 $4" | awk '{ printf "%d", ($1 + $2) * 1000 }'))) $(($5 / iters))"
	if [ "$result" != ok ] || [ -z "$big" ]; then
		grep -m 3 -i 'error' "$tmp/log" | cut -c1-240 | sed 's/^/    /'
		ROW=
	fi
	rm -rf "$tmp"
}

echo "date: $(date -u '+%Y-%m-%d %H:%M UTC'), command: ${BASE:+BASE=$BASE }sh bench/scale.sh $ARGS"
echo "cpu: $(awk -F': ' '/model name/ { print $2; exit }' /proc/cpuinfo), $(nproc) cores;" \
	"kernel.pid_max $(cat /proc/sys/kernel/pid_max), kernel.threads-max" \
	"$(cat /proc/sys/kernel/threads-max), RLIMIT_NOFILE soft $(ulimit -Sn) hard $(ulimit -Hn)" \
	"(unisum launch raises the soft one to the hard one)"
echo "each job: W workers (one per machine) x S servers; 1 + $ITERS push_pulls of 1 MiB float32, then 1 + $SMALL of 4 bytes"
echo "launch: from just before \`unisum launch\` to the end of the first push_pull, the slowest rank"
echo "CPU: user + system of the whole job; per it.: over all $((1 + ITERS + (SMALL > 0 ? SMALL + 1 : 0))) iterations, the launch included"
echo "threads, RSS (MiB): the most in one server / one worker / the launcher (its scheduler's)"
printf '%-11s %-6s %7s %8s %7s %8s %7s %6s %7s %7s %9s %s %s\n' "W_x_S" result launch_s \
	1MiB_p50 p99_ms 4B_p50 p99_ms wall_s CPU_s CPU/it. ctxsw/it. threads RSS | sed 's/_/ /g'
for ws in $SIZES; do
	w=${ws%x*} s=${ws#*x}
	run_one "${w}_x_$s" "$BUILD" "$w" "$s"
	this=$ROW
	[ -n "$BASE" ] || continue
	run_one "__base" "$BASE" "$w" "$s"
	if [ -n "$this" ] && [ -n "$ROW" ]; then
		echo "$this $ROW" | awk '{ printf "  base/this: wall %.2f, CPU-s %.2f, voluntary context switches %.2f\n",
			$4 / $1, $5 / $2, $6 / $3 }'
	fi
done

# ---- the latency row: 2 workers, 1 server, 4 bytes ---------------------------
MPIRUN="mpirun --allow-run-as-root --oversubscribe --bind-to none --mca pml ob1 --mca btl self,vader"
peers=$(mktemp -d)
echo
echo "latency: 4 bytes, 2 processes (unisum: 2 workers, each its own machine, through 1 server)," \
	"$LAT_ITERS iterations after 100 warm-ups"
printf '%-14s %8s %8s\n' who p50_ms p99_ms
# ms SECONDS : in milliseconds.
ms() { echo "$1" | awk '{ printf "%.3f", $1 * 1000 }'; }

# lat_unisum BUILD LABEL : the unisum latency row (its p50 in UNI_P50).
lat_unisum() {
	line=$(timeout 300 "$1/unisum" launch -w 2 -s 1 --local-size 1 -- "$1/bench_pushpull" \
		--mib 0.001 --iters 1 --warmup 0 --small "$LAT_ITERS" 2>&1 | grep -m 1 pushpull_small) || true
	UNI_P50=$(field median_s "$line")
	if [ -n "$UNI_P50" ]; then
		printf '%-14s %8s %8s\n' "$2" "$(ms "$UNI_P50")" "$(ms "$(field p99_s "$line")")"
	else
		echo "$2: FAILED"
	fi
}
lat_unisum "$BUILD" unisum
THIS_P50=$UNI_P50
[ -n "$BASE" ] && lat_unisum "$BASE" "unisum (base)"
line=$(timeout 300 $PY "$HERE/peers/gloo_allreduce.py" 2 4 "$LAT_ITERS" 100 2>&1 | grep -m 1 '^gloo') || true
printf '%-14s %8s %8s\n' gloo "$(field median_ms "$line")" "$(field p99_ms "$line")"
GLOO_P50=$(field median_ms "$line")
if command -v mpicc >/dev/null && mpicc -O2 -o "$peers/mpi" "$HERE/peers/mpi_allreduce.c" 2>/dev/null; then
	line=$(timeout 300 $MPIRUN -np 2 "$peers/mpi" 4 "$LAT_ITERS" 100 2>&1 | grep -m 1 '^mpi') || true
	printf '%-14s %8s %8s\n' OpenMPI "$(field median_ms "$line")" "$(field p99_ms "$line")"
else
	echo "OpenMPI: mpicc is missing (apt-get install openmpi-bin libopenmpi-dev)"
fi
rm -rf "$peers"
if [ -n "${THIS_P50:-}" ] && [ -n "${GLOO_P50:-}" ]; then
	echo "$THIS_P50 $GLOO_P50" | awk '{ printf "unisum p50 / gloo p50: %.2f\n", $1 * 1000 / $2 }'
fi
