#!/bin/sh
# unisum push_pull on one machine against OpenMPI, PyTorch gloo and the
# memory-traffic bound, all measured in the same run.
#
#   sh bench/local.sh [BUILD_DIR]              (default: build)
#
# For P in 2 4 and 16, 64, 128 MiB of float32 per process, one row each:
#   bound   every input read once and every output written once:
#           2 x P x bytes / the copy traffic bandwidth of P processes, one
#           thread each, copying at the same time (BUILD/bench_copybw,
#           measured just before the row's other columns);
#   unisum  BUILD/unisum launch -w P -s 1 -- BUILD/bench_local_allreduce
#           (UNISUM_LAUNCH_ARGS adds launcher options), buffers from malloc;
#   alloc   the same with buffers from unisum_alloc (BENCH_ALLOC=1): the
#           workers' shared arenas, read and written with plain loads and
#           stores instead of cross-memory attach;
#   mpi     OpenMPI MPI_Allreduce, pml ob1 with btl self,vader (shared
#           memory; vader's default single-copy mechanism, CMA);
#   gloo    torch.distributed all_reduce with the gloo backend (loopback TCP).
# Every time is the median over ITERS calls (after WARMUP) of the slowest
# process's time per call, each call after a barrier.  A column that fails
# prints "fail" and the run goes on; a failure's output is kept in
# $TMPDIR/unisum-local.*.log.  Prints a markdown table for bench/README.md.
set -u
sh "$(dirname "$0")/../scripts/install-deps.sh" bench
BUILD=${1:-build}
PY=/usr/bin/python3
HERE=$(cd "$(dirname "$0")" && pwd)
PEERS="$BUILD/peers"
MPIRUN="mpirun --allow-run-as-root --oversubscribe --bind-to none --mca pml ob1 --mca btl self,vader"
LAUNCH_ARGS=${UNISUM_LAUNCH_ARGS:-}
LIMIT=180	# seconds for one measurement
LOG=$(mktemp "${TMPDIR:-/tmp}/unisum-local.XXXXXX.log")

# ---- build ------------------------------------------------------------------
if [ -f "$BUILD/CMakeCache.txt" ]; then
	cmake --build "$BUILD" --target unisum_cli bench_copybw bench_local_allreduce >>"$LOG" 2>&1 ||
		echo "bench/local.sh: building unisum failed (see $LOG)" >&2
else
	echo "bench/local.sh: $BUILD is not a CMake build dir (cmake -S . -B $BUILD first)" >&2
fi
mkdir -p "$PEERS"
if command -v mpicc >/dev/null; then
	mpicc -O2 -Wall -o "$PEERS/mpi_allreduce" "$HERE/peers/mpi_allreduce.c" >>"$LOG" 2>&1 ||
		echo "bench/local.sh: mpicc failed (see $LOG)" >&2
else
	echo "bench/local.sh: mpicc is missing (apt-get install openmpi-bin libopenmpi-dev)" >&2
fi

# ---- one measurement ----------------------------------------------------------
# field KEY LINE: the value of KEY=... in LINE
field() { echo "$2" | tr ' ' '\n' | sed -n "s/^$1=//p" | head -1; }

# measure TAG CMD...: runs CMD under the time limit and prints the first
# output line that starts with TAG (launcher prefixes stripped), or nothing.
measure() {
	tag=$1
	shift
	out=$(timeout -k 5 "$LIMIT" "$@" 2>&1)
	rc=$?
	line=$(echo "$out" | sed 's/^\[worker [0-9]*\] //' | grep "^$tag procs=" | head -1)
	if [ $rc -ne 0 ] || [ -z "$line" ]; then
		{ echo "== rc=$rc: $*"; echo "$out" | tail -20; } >>"$LOG"
		echo "bench/local.sh: $tag failed (rc=$rc): $*" >&2
		return 0
	fi
	echo "$line" >&2
	echo "$line"
}

# ---- the run ------------------------------------------------------------------
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, command: sh bench/local.sh $*"
echo
echo "float32, out of place; ms = median over calls of the slowest process's time per call;"
echo "bound = 2 x procs x size / copy traffic (GB/s, P processes copying at once, same run)"
echo
echo "| procs | size | copy GB/s | bound ms | unisum ms | alloc ms | mpi ms | gloo ms | mpi/unisum | mpi/alloc | gloo/unisum | gloo/alloc | alloc/bound |"
echo "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
for P in 2 4; do
	for MIB in 16 64 128; do
		BYTES=$((MIB * 1024 * 1024))
		if [ "$MIB" -le 16 ]; then ITERS=20; else ITERS=10; fi
		WARMUP=3
		copy=$(measure copy "$BUILD/bench_copybw" "$P" "$BYTES")
		mpi=$(measure mpi $MPIRUN -np "$P" "$PEERS/mpi_allreduce" "$BYTES" "$ITERS" "$WARMUP")
		gloo=$(measure gloo "$PY" "$HERE/peers/gloo_allreduce.py" "$P" "$BYTES" "$ITERS" "$WARMUP")
		# shellcheck disable=SC2086
		uni=$(measure unisum "$BUILD/unisum" launch -w "$P" -s 1 $LAUNCH_ARGS --timeout "$LIMIT" -- \
			"$BUILD/bench_local_allreduce" "$BYTES" "$ITERS" "$WARMUP")
		# shellcheck disable=SC2086
		alloc=$(BENCH_ALLOC=1 measure unisum-alloc "$BUILD/unisum" launch -w "$P" -s 1 $LAUNCH_ARGS \
			--timeout "$LIMIT" -- "$BUILD/bench_local_allreduce" "$BYTES" "$ITERS" "$WARMUP")
		awk -v p="$P" -v mib="$MIB" -v bytes="$BYTES" \
		    -v gbps="$(field traffic_GBps "$copy")" -v u="$(field median_ms "$uni")" \
		    -v a="$(field median_ms "$alloc")" \
		    -v m="$(field median_ms "$mpi")" -v g="$(field median_ms "$gloo")" 'BEGIN {
			b = gbps != "" ? 2 * p * bytes / (gbps * 1e9) * 1e3 : ""
			printf "| %d | %d MiB | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", p, mib,
				gbps != "" ? sprintf("%.1f", gbps) : "fail",
				b != "" ? sprintf("%.2f", b) : "fail",
				u != "" ? u : "fail", a != "" ? a : "fail",
				m != "" ? m : "fail", g != "" ? g : "fail",
				(m != "" && u != "") ? sprintf("%.2f", m / u) : "-",
				(m != "" && a != "") ? sprintf("%.2f", m / a) : "-",
				(g != "" && u != "") ? sprintf("%.2f", g / u) : "-",
				(g != "" && a != "") ? sprintf("%.2f", g / a) : "-",
				(a != "" && b != "") ? sprintf("%.2f", a / b) : "-"
		}'
	done
done
echo
[ -s "$LOG" ] && echo "log of the build and of any failure: $LOG" >&2
exit 0
