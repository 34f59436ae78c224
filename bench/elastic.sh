#!/bin/sh
# elastic.sh - what losing a worker costs an elastic job (issue 20):
# the steps rolled back against the commit interval, and the re-form's
# time.
#
#   sh bench/elastic.sh [BUILD_DIR]
#
# 1. Steps lost: the digits CNN (examples/train_digits_elastic.py, 6
#    epochs) under `unisum launch -w 4 -s 2 --elastic --min-workers 2`;
#    the worker that started as rank 1 kills itself (SIGKILL) before step
#    DIE, and the other three roll back to their last commit and go on.
#    For each commit interval C and DIE it prints rank 0's "steps run",
#    "kept" (the schedule) and "lost" (run - kept: the steps redone), the
#    bound C - 1 (a loss just before a commit), the final accuracy and the
#    job's wall time.
# 2. Re-form time: elastic_sums (4 workers, 2 servers, by hand; every sum
#    checked) losing one worker: each survivor's unisum_rejoin() time, from
#    the failed push_pull to the new generation formed (the heartbeat does
#    not matter: a crash closes the connection).
# The table goes to stdout and OUT (default bench/results/elastic.txt).
set -eu

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
BUILD=$(cd "${1:-$ROOT/build}" && pwd)
OUT=${OUT:-$HERE/results/elastic.txt}
mkdir -p "$(dirname "$OUT")"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

{
	echo "# bench/elastic.sh, $(date -u +%Y-%m-%d), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores"
	echo "# 1. steps lost per failure (digits CNN, 4 workers -> 3, 6 epochs, rank 0's counts)"
	printf '%-8s %-6s %-6s %-6s %-6s %-8s %-9s %s\n' commit die run kept lost bound accuracy wall_s
	for c in 1 5 10 20; do
		for die in 23 37; do
			t0=$(date +%s%N)
			"$BUILD/unisum" launch -w 4 -s 2 --elastic --min-workers 2 -- /usr/bin/python3 \
				"$ROOT/examples/train_digits_elastic.py" --epochs 6 --commit-every $c \
				--die-at $die --die-rank 1 >"$TMP/log" 2>&1 || { cat "$TMP/log"; exit 1; }
			wall=$(( ($(date +%s%N) - t0) / 1000000 ))
			line=$(sed -n 's/.*elastic: \([0-9]*\) steps run, \([0-9]*\) kept, \([0-9]*\) lost.*/\1 \2 \3/p' "$TMP/log")
			acc=$(sed -n 's/.*final held-out accuracy: //p' "$TMP/log")
			set -- $line
			printf '%-8s %-6s %-6s %-6s %-6s %-8s %-9s %s\n' $c $die $1 $2 $3 $((c - 1)) "$acc" \
				"$(awk -v ms=$wall 'BEGIN { printf "%.1f", ms / 1000 }')"
		done
	done
	echo "# 2. re-form time: elastic_sums, 4 workers -> 3 (each survivor's unisum_rejoin, ms)"
	for run in 1 2 3; do
		export UNISUM_SCHEDULER_HOST=127.0.0.1 UNISUM_NUM_WORKER=4 UNISUM_NUM_SERVER=2
		export UNISUM_SCHEDULER_PORT=$((24000 + run)) UNISUM_ELASTIC=1 UNISUM_PARTITION_BYTES=16384
		UNISUM_ROLE=scheduler timeout 60 "$BUILD/unisum" scheduler >"$TMP/sched" 2>&1 &
		for s in 0 1; do UNISUM_ROLE=server timeout 60 "$BUILD/unisum" server >/dev/null 2>&1 & done
		for w in 0 1 2 3; do
			die=-1
			[ $w = 3 ] && die=$((50 + run * 10))
			ELASTIC_DIE_AT=$die UNISUM_ROLE=worker timeout 60 "$BUILD/elastic_sums" 200 \
				>"$TMP/w$w" 2>&1 &
		done
		wait || true
		printf 'run %d: %s\n' $run "$(sed -n 's/.* in \([0-9.]*\) ms/\1/p' "$TMP"/w[012] | tr '\n' ' ')"
	done
} | tee "$OUT"
