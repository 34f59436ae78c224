#!/bin/sh
# cost.sh - what summing a gradient costs in CPU, per role: unisum's
# Summation Service path against gloo's ring all_reduce, the same gradient
# in the same run (issue 50).
#
#   sh bench/cost.sh [BUILD_DIR]         (default: build)
#
# Environment: MIB (64, the gradient), LONG (40) and SHORT (5) rounds,
# SERVERS (1; issue 50's loopback row is 2),
# TRANSPORTS ("tcp ipc"; ipc is a server reading its workers' memory,
# UNISUM_IPC=1, tcp the loopback socket, UNISUM_IPC=0).
#
# The job: 2 workers, each its own machine (UNISUM_LOCAL_SIZE=1), and
# SERVERS servers, started by hand with the scheduler, every process under
# /usr/bin/time: user and system CPU-seconds, voluntary and involuntary
# context switches (getrusage, as wait4 returns it).  The workers run
# bench_pushpull --mib MIB (one float32 tensor, every sum checked).  gloo:
# bench/peers/gloo_allreduce.py, 2 processes, the same bytes, its parent
# and children under /usr/bin/time together.  Each configuration runs
# twice, LONG and SHORT rounds; the difference, divided by the GiB of
# gradient summed in the LONG - SHORT rounds (one MIB gradient a round),
# is the steady cost per GiB: start-up (joining, Python and torch
# imports) cancels out.  Prints one markdown table, and the CPU model.
set -eu
BUILD=${1:-build}
MIB=${MIB:-64}
LONG=${LONG:-40}
SHORT=${SHORT:-5}
TRANSPORTS=${TRANSPORTS:-tcp ipc}
SERVERS=${SERVERS:-1}
HERE=$(cd "$(dirname "$0")" && pwd)
PY=/usr/bin/python3
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
sh "$HERE/../scripts/install-deps.sh" bench
BYTES=$((MIB * 1048576))
# One line per process: "user sys voluntary involuntary".
TIMEFMT='%U %S %w %c'

# unisum_job TRANSPORT ROUNDS: the job once; the roles' lines go to
# $TMP/<role>.<rounds>.
unisum_job() {
	ipc=1
	[ "$1" = tcp ] && ipc=0
	export UNISUM_IPC=$ipc UNISUM_NUM_WORKER=2 UNISUM_NUM_SERVER=$SERVERS UNISUM_LOCAL_SIZE=1
	export UNISUM_SCHEDULER_HOST=127.0.0.1 UNISUM_SCHEDULER_PORT=$("$BUILD/check_sums" free-port)
	UNISUM_ROLE=scheduler /usr/bin/time -f "$TIMEFMT" -o "$TMP/scheduler.$2" \
		timeout 300 "$BUILD/unisum" scheduler >"$TMP/log.scheduler" 2>&1 &
	s=0
	while [ "$s" -lt "$SERVERS" ]; do
		UNISUM_ROLE=server UNISUM_SERVER_ID=$s /usr/bin/time -f "$TIMEFMT" -o "$TMP/server$s.$2" \
			timeout 300 "$BUILD/unisum" server >"$TMP/log.server$s" 2>&1 &
		s=$((s + 1))
	done
	for w in 0 1; do
		UNISUM_ROLE=worker UNISUM_WORKER_ID=$w /usr/bin/time -f "$TIMEFMT" \
			-o "$TMP/worker$w.$2" timeout 300 "$BUILD/bench_pushpull" --mib "$MIB" \
			--iters "$2" --warmup 9 >"$TMP/log.worker$w" 2>&1 &
	done
	if ! wait; then
		echo "cost.sh: the unisum job failed ($1, $2 rounds):" >&2
		tail -n 3 "$TMP"/log.* >&2
		exit 1
	fi
}

# gloo_job ROUNDS: gloo's all_reduce of the same bytes, 2 processes.
gloo_job() {
	/usr/bin/time -f "$TIMEFMT" -o "$TMP/gloo.$1" \
		timeout 300 "$PY" "$HERE/peers/gloo_allreduce.py" 2 "$BYTES" "$1" 1 >"$TMP/log.gloo" 2>&1 ||
		{ echo "cost.sh: gloo failed:" >&2; tail -n 3 "$TMP/log.gloo" >&2; exit 1; }
}

# row NAME FILE...: the steady cost of the processes whose LONG and SHORT
# lines are FILE.LONG and FILE.SHORT (summed over FILEs).
row() {
	name=$1
	shift
	for f in "$@"; do
		cat "$f.$LONG"
	done >"$TMP/long"
	for f in "$@"; do
		cat "$f.$SHORT"
	done >"$TMP/short"
	"$PY" - "$name" "$TMP/long" "$TMP/short" "$((LONG - SHORT))" "$MIB" <<'EOF'
import sys
name, long_f, short_f, rounds, mib = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
def total(path):
    t = [0.0] * 4
    for line in open(path):
        f = line.split()
        if len(f) == 4:
            t = [a + float(b) for a, b in zip(t, f)]
    return t
d = [a - b for a, b in zip(total(long_f), total(short_f))]
gib = rounds * mib / 1024
print(f"| {name} | {d[0] / gib:.3f} | {d[1] / gib:.3f} | {(d[0] + d[1]) / gib:.3f} | "
      f"{d[2] / rounds:.0f} | {d[3] / rounds:.0f} |")
EOF
}

echo "date: $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores," \
	"$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)"
echo "command: sh bench/cost.sh $*  (MIB=$MIB LONG=$LONG SHORT=$SHORT)"
echo "2 workers, $SERVERS server(s), float32 $MIB MiB; per GiB of gradient summed, start-up cancelled (LONG - SHORT rounds)"
echo
echo "| job, role | user s/GiB | sys s/GiB | CPU s/GiB | voluntary cs/round | involuntary cs/round |"
echo "|---|---|---|---|---|---|"
for n in "$LONG" "$SHORT"; do
	gloo_job "$n"
done
gloo=$(row "gloo ring, 2 processes" "$TMP/gloo")
echo "$gloo"
for t in $TRANSPORTS; do
	for n in "$LONG" "$SHORT"; do
		unisum_job "$t" "$n"
	done
	row "unisum $t: worker 0" "$TMP/worker0"
	row "unisum $t: both workers" "$TMP/worker0" "$TMP/worker1"
	servers=$(ls "$TMP"/server*."$LONG" | sed "s/\.$LONG\$//")
	row "unisum $t: servers" $servers
	row "unisum $t: scheduler" "$TMP/scheduler"
	all=$(row "unisum $t: all roles" "$TMP/worker0" "$TMP/worker1" $servers "$TMP/scheduler")
	echo "$all"
	echo "$all $gloo" | awk -F'|' -v t="$t" '{ r[t] = $5 / $12 } END { printf "ratio %s %.2f\n", t, r[t] }' >>"$TMP/ratios"
done
echo
awk '{ printf "unisum %s, all roles, against gloo: %s x its CPU per GiB\n", $2, $3 }' "$TMP/ratios"
