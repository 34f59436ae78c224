#!/bin/sh
# collectives.sh - unisum's allgather, reduce-scatter and alltoall against
# PyTorch's gloo on this host (loopback), in the same run.
#
#   bench/collectives.sh [BUILD_DIR]
#
# For 2 and 4 workers: gloo's processes (one per rank, 127.0.0.1) and a
# unisum job of as many workers, each its own machine with a server
# (`unisum launch -w N -s N --local-size 1`: the colocated layout of a
# cluster, here all on one host), both running bench/peers/collectives.py
# on 4 and 64 MiB of float32.  Prints one table: the median seconds of each
# and gloo/unisum (above 1: unisum is faster).  ITERS (default 5) and
# WARMUP (2) set the timed and untimed calls.  The CPU model heads the
# table.
set -eu

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$(realpath -m "${1:-$ROOT/build}")
PY=/usr/bin/python3
PEER="$ROOT/bench/peers/collectives.py"
ITERS=${ITERS:-5}
WARMUP=${WARMUP:-2}
MIB=${MIB:-4,64}

sh "$ROOT/scripts/install-deps.sh" bench >/dev/null
make -C "$ROOT" --no-print-directory build BUILD="$BUILD" >/dev/null
export PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}"

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

for n in 2 4; do
	port=$((29600 + n))
	r=0
	while [ "$r" -lt "$n" ]; do
		timeout 900 "$PY" "$PEER" gloo --rank "$r" --world "$n" --master "127.0.0.1:$port" \
			--mib "$MIB" --iters "$ITERS" --warmup "$WARMUP" >"$out/gloo.$n.$r" 2>&1 &
		r=$((r + 1))
	done
	if ! wait; then
		cat "$out"/gloo.$n.* >&2
		echo "collectives.sh: the gloo job of $n failed" >&2
		exit 1
	fi
	if ! timeout 900 "$BUILD/unisum" launch -w "$n" -s "$n" --local-size 1 -- \
		"$PY" "$PEER" unisum --mib "$MIB" --iters "$ITERS" --warmup "$WARMUP" \
		>"$out/unisum.$n" 2>&1; then
		cat "$out/unisum.$n" >&2
		echo "collectives.sh: the unisum job of $n failed" >&2
		exit 1
	fi
done

cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)
echo "# $(date -u +%Y-%m-%d) loopback, $(nproc) cores, $cpu; median of $ITERS after $WARMUP"
printf "# %-14s %6s %5s %10s %10s %12s\n" op MiB n unisum_s gloo_s gloo/unisum
cat "$out"/gloo.*.0 "$out"/unisum.* | sed 's/^\[worker [0-9]*\] //' | awk '
	/ mib=/ {
		op = $2; sub(/=.*/, "", op)
		for (i = 3; i <= NF; i++) { split($i, kv, "="); f[kv[1]] = kv[2] }
		key = op " " f["mib"] " " f["world"]
		t[$1, key] = f["median_s"]
		if (!(key in seen)) { seen[key] = 1; keys[++nk] = key }
		if ($1 == "gloo" && $2 ~ /=/) note = "gloo has no reduce_scatter here: its column is all_reduce plus a slice"
	}
	END {
		for (i = 1; i <= nk; i++) {
			split(keys[i], k, " ")
			u = t["unisum", keys[i]]; g = t["gloo", keys[i]]
			printf "%-16s %6s %5s %10.4f %10.4f %12.2f\n", k[1], k[2], k[3], u, g, g / u
		}
		if (note) print "# " note
	}'
