#!/bin/sh
# autotune.sh - online tuning against the best static setting, in one run.
#
#   sh bench/autotune.sh [BUILD_DIR] [MODEL] [WORKERS] [SERVERS]
#       defaults: build resnet50 2 2
#
# First a grid search: `unisum bench --model MODEL --modes priority` once
# for every static (partition size, credit) of the tuner's search space
# (partition 1024000, 2048000, 4096000, 8192000 bytes x credit 1, 2, 4, 8,
# 16 partitions), each a fresh job on loopback.  Then one job with
# UNISUM_AUTOTUNE=1 started from the defaults, whose iterations while the
# tuner explores count as warm-up: its mean is over the iterations after it
# settled.  Prints the grid, the setting autotune chose and the ratio of its
# iteration time to the best static one.
set -u
sh "$(dirname "$0")/../scripts/install-deps.sh" bench
BUILD=$(cd "${1:-build}" && pwd) || exit 2
MODEL=${2:-resnet50}
W=${3:-2}
S=${4:-2}
ITERS=${ITERS:-15}
STEPS=${STEPS:-5}
UNISUM="$BUILD/unisum"
grid=$(mktemp)
trap 'rm -f "$grid"' EXIT

mean_of() {
	sed -n 's/.*\] priority *\([0-9.]*\) ms.*/\1/p' "$1" | head -n 1
}

echo "autotune: $MODEL, $W workers, $S servers, loopback, $ITERS measured iterations per job"
printf '%12s %10s %12s\n' partition credit "iter ms"
for p in 1024000 2048000 4096000 8192000; do
	for m in 1 2 4 8 16; do
		out=$(mktemp)
		UNISUM_PARTITION_BYTES=$p UNISUM_SCHEDULING_CREDIT=$((p * m)) \
			timeout 600 "$UNISUM" bench --model "$MODEL" -w "$W" -s "$S" --modes priority \
			--iters "$ITERS" --warmup 3 >"$out" 2>&1
		ms=$(mean_of "$out")
		rm -f "$out"
		printf '%12s %10s %12s\n' "$p" "${m}p" "${ms:-failed}"
		[ -n "$ms" ] && echo "$ms $p $m" >>"$grid"
	done
done
best=$(sort -n "$grid" | head -n 1)
set -- $best
best_ms=$1 best_p=$2 best_m=$3

# Autotune: 10 trial epochs of STEPS steps, then it settles; everything
# before that is warm-up.
warm=$((STEPS * 11 + 2))
out=$(mktemp)
UNISUM_AUTOTUNE=1 UNISUM_AUTOTUNE_STEPS=$STEPS timeout 900 "$UNISUM" bench --model "$MODEL" \
	-w "$W" -s "$S" --modes priority --iters "$ITERS" --warmup "$warm" >"$out" 2>&1
tuned=$(mean_of "$out")
grep 'autotune:' "$out" | sed 's/^.*autotune:/  autotune:/'
rm -f "$out"
echo "best static: partition $best_p, credit ${best_m}p: $best_ms ms per iteration"
echo "autotune (after it settled): ${tuned:-failed} ms per iteration"
[ -n "$tuned" ] && awk -v a="$tuned" -v b="$best_ms" \
	'BEGIN { printf "autotune / best static: %.3f (%+.1f%%)\n", a / b, (a / b - 1) * 100 }'
