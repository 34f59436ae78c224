#!/bin/sh
# ucx.sh - the UCX transport (UNISUM_TRANSPORT=ucx) against unisum's own
# transports, side by side in one run (issue 53):
#   - loopback, UCX over TCP (UCX_TLS=tcp) against unisum's TCP
#     (UNISUM_IPC=0 for both);
#   - one host, UCX_TLS=sm,tcp (UCX 1.13 finds no shared-memory
#     transport for messages with peer error handling on, so its data goes
#     over TCP: ARCHITECTURE section 6) against unisum's IPC (UNISUM_IPC=1).
#
#   sh bench/ucx.sh [BUILD_DIR]        (default: build)
#
# Environment: PAIRS (3) alternating runs of each pair, SIZES ("4 64", MiB),
# LONG (30) and SHORT (8) rounds.
#
# Each run is `unisum launch --cpu-report -w 2 -s 2` of bench_pushpull
# --mib M (one float32 tensor, every sum checked), once with LONG and once
# with SHORT rounds.  Throughput: the LONG run's median round; the ratio
# is the peer's median over UCX's (>= 1 means UCX is as fast).  CPU: the
# whole job's user + system CPU-seconds (wait4, by the launcher), LONG
# minus SHORT over the GiB summed in between, so start-up cancels out.
# Prints one markdown table and the CPU model.
set -eu
BUILD=${1:-build}
PAIRS=${PAIRS:-3}
SIZES=${SIZES:-4 64}
LONG=${LONG:-30}
SHORT=${SHORT:-8}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
if ! "$BUILD/check_sums" ucx-available >/dev/null; then
	echo "ucx.sh: the UCX transport is not here: $("$BUILD/check_sums" ucx-available)" >&2
	exit 1
fi

# one ENV ROUNDS MIB: "median_s cpu_s" of one job.
one() {
	out=$(env $1 timeout 300 "$BUILD/unisum" launch --cpu-report -w 2 -s 2 --local-size 1 -- \
		"$BUILD/bench_pushpull" --mib "$3" --iters "$2" --warmup 3 2>&1) || {
		echo "ucx.sh: a job failed ($1):" >&2
		echo "$out" | tail -n 5 >&2
		exit 1
	}
	med=$(echo "$out" | sed -n 's/.*pushpull .*median_s=\([0-9.]*\).*/\1/p')
	cpu=$(echo "$out" | sed -n 's/.*cpu the whole job *user *\([0-9.]*\) s *system *\([0-9.]*\) s.*/\1 \2/p' |
		awk '{ print $1 + $2 }')
	echo "$med $cpu"
}

# measure NAME ENV MIB: appends "median cpu_per_gib" to $TMP/NAME.MIB.
measure() {
	set -- "$1" "$2" "$3" $(one "$2" "$LONG" "$3") $(one "$2" "$SHORT" "$3")
	awk -v m="$4" -v cl="$5" -v cs="$7" -v mib="$3" -v n=$((LONG - SHORT)) \
		'BEGIN { printf "%s %.3f\n", m, (cl - cs) / (n * mib / 1024) }' >>"$TMP/$1.$3"
}

median() { sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

TCP="UNISUM_TRANSPORT=tcp UNISUM_IPC=0"
UCXTCP="UNISUM_TRANSPORT=ucx UNISUM_IPC=0 UCX_TLS=tcp"
IPC="UNISUM_TRANSPORT=tcp UNISUM_IPC=1"
UCXSM="UNISUM_TRANSPORT=ucx UNISUM_IPC=0 UCX_TLS=sm,tcp"
for mib in $SIZES; do
	for p in $(seq "$PAIRS"); do
		measure tcp "$TCP" "$mib"
		measure ucxtcp "$UCXTCP" "$mib"
		measure ipc "$IPC" "$mib"
		measure ucxsm "$UCXSM" "$mib"
	done
done

echo "date: $(date -u '+%Y-%m-%d %H:%M') UTC, $(nproc) cores, command: sh bench/ucx.sh $BUILD (PAIRS=$PAIRS, LONG=$LONG, SHORT=$SHORT)"
echo "CPU: $(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -n 1)"
echo "UCX: $(ucx_info -v 2>/dev/null | sed -n 's/^# Version //p' | head -n 1)"
echo
echo "2 workers x 2 servers; s = median round (median over $PAIRS runs); CPU = whole job, CPU-s per GiB summed"
echo
echo "| size | peer | peer s | UCX s | UCX throughput / peer's | peer CPU/GiB | UCX CPU/GiB |"
echo "|---:|---|---:|---:|---:|---:|---:|"
for mib in $SIZES; do
	for row in "tcp ucxtcp TCP, loopback (UCX_TLS=tcp)" "ipc ucxsm IPC, one host (UCX_TLS=sm,tcp)"; do
		set -- $row
		peer=$1 ucx=$2
		shift 2
		ps=$(cut -d' ' -f1 "$TMP/$peer.$mib" | median)
		us=$(cut -d' ' -f1 "$TMP/$ucx.$mib" | median)
		pc=$(cut -d' ' -f2 "$TMP/$peer.$mib" | median)
		uc=$(cut -d' ' -f2 "$TMP/$ucx.$mib" | median)
		awk -v mib="$mib" -v name="$*" -v ps="$ps" -v us="$us" -v pc="$pc" -v uc="$uc" \
			'BEGIN { printf "| %d MiB | %s | %.4f | %.4f | %.2f | %.2f | %.2f |\n", mib, name, ps, us, ps / us, pc, uc }'
	done
done
