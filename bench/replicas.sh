#!/bin/sh
# replicas.sh - what copying async and SSP keys, and compressed keys'
# error feedback, to a backup server costs (UNISUM_REPLICAS, issue 52):
# the same jobs with replicas off and on, alternating, measured in the
# same run.  3 workers and 3 servers on this host.
#
#   sh bench/replicas.sh [BUILD_DIR]
#
# 1. Training (the issue's measure): `unisum bench --model resnet50`
#    (161 tensors, 97.5 MiB of float32) in async mode, 200 ms of emulated
#    compute per step (a sleep: a GPU), 20 steps after 3; the mean step.
#    Then the same in lock-step with every tensor compressed onebit with
#    error feedback (--compressor onebit,ef=vanilla): the copies carry
#    the servers' float32 feedback, 32 times a onebit push.
# 2. Communication alone: chaos_modes held (an async and an SSP:2 tensor
#    of CHAOS_COUNT int64, one push_pull of each per step, no pause,
#    every element checked), 50,021 elements (391 KiB a tensor) for 2000
#    steps and 1,048,576 (8 MiB) for 150; worker 0's steps per second.
#    No compute to hide a copy behind: the worst case.
# Each case runs REPS times (default 3); the table gives medians, the
# ratio (goal: 0.9 or more for training) and the cores' busy share.
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
BUILD=$(realpath -m "${1:-$ROOT/build}")
REPS=${REPS:-3}
UNISUM="$BUILD/unisum" CHECK="$BUILD/check_sums" CHAOS="$BUILD/chaos_modes"
export UNISUM_NUM_WORKER=3 UNISUM_NUM_SERVER=3 UNISUM_SCHEDULER_HOST=127.0.0.1
export CHAOS_STEP_MS=0 CHECK_SUMS_TIMES=1

busy() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8, $2 + $3 + $4 + $5 + $6 + $7 + $8 }' /proc/stat; }

# one REPLICAS COUNT STEPS: prints "steps_per_s busy_percent"
one() {
	log=$(mktemp -d)
	export UNISUM_REPLICAS=$1 CHAOS_COUNT=$2 UNISUM_SCHEDULER_PORT=$("$CHECK" free-port)
	b0=$(busy)
	UNISUM_ROLE=scheduler timeout 300 "$UNISUM" scheduler >"$log/scheduler" 2>&1 &
	for s in 0 1 2; do
		UNISUM_ROLE=server UNISUM_SERVER_ID=$s timeout 300 "$UNISUM" server >"$log/server$s" 2>&1 &
	done
	wpids=
	for w in 0 1 2; do
		UNISUM_ROLE=worker UNISUM_WORKER_ID=$w timeout 300 "$CHAOS" held "$3" >"$log/worker$w" 2>&1 &
		wpids="$wpids $!"
	done
	ok=true
	for p in $wpids; do wait "$p" || ok=false; done
	wait
	b1=$(busy)
	$ok || { echo "the job failed; worker 0's log ends:" >&2; tail -n 3 "$log/worker0" >&2; exit 1; }
	awk -v steps="$3" '/done at/ { if (!f) f = $5; l = $5 } END { printf "%.1f", (steps - 1) * 1000 / (l - f) }' "$log/worker0"
	echo "$b0 $b1" | awk '{ printf " %d\n", 100 * ($3 - $1) / ($4 - $2) }'
	rm -rf "$log"
}

median() { sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

# train REPLICAS SYNC [BENCH_ARGS...]: prints "mean_step_ms busy_percent"
train() {
	rep=$1 sync=$2
	shift 2
	b0=$(busy)
	ms=$(UNISUM_REPLICAS=$rep UNISUM_SYNC=$sync timeout 300 "$UNISUM" bench --model resnet50 -w 3 \
		-s 3 --iters 20 --warmup 3 --compute-ms 200 --modes priority "$@" 2>&1 |
		awk '/priority\+autotune|^\[worker 0\] priority / && / ms / { for (i = 1; i <= NF; i++) if ($i == "ms") { print $(i - 1); exit } }')
	b1=$(busy)
	[ -n "$ms" ] || { echo "the training replay failed" >&2; exit 1; }
	echo "$ms $(echo "$b0 $b1" | awk '{ printf "%d", 100 * ($3 - $1) / ($4 - $2) }')"
}

echo "# $(date -u +%Y-%m-%d) $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1), $(nproc) cores"
echo "# sh bench/replicas.sh: 3 workers, 3 servers, $REPS runs each, replicas off and on alternating"
printf '%-30s %12s %12s %8s %10s %10s\n' "training, resnet50, 200 ms" "off step ms" "on step ms" "off/on" "busy off" "busy on"
for case in "async" "onebit,ef=vanilla"; do
	off= on= boff= bon=
	for _ in $(seq "$REPS"); do
		if [ "$case" = async ]; then
			r=$(train 0 async); off="$off ${r% *}"; boff="$boff ${r#* }"
			r=$(train 1 async); on="$on ${r% *}"; bon="$bon ${r#* }"
		else
			r=$(train 0 sync --compressor "$case"); off="$off ${r% *}"; boff="$boff ${r#* }"
			r=$(train 1 sync --compressor "$case"); on="$on ${r% *}"; bon="$bon ${r#* }"
		fi
	done
	mo=$(echo $off | tr ' ' '\n' | median) mn=$(echo $on | tr ' ' '\n' | median)
	printf '%-30s %12s %12s %8s %9s%% %9s%%\n' "$case" "$mo" "$mn" \
		"$(awk -v a="$mo" -v b="$mn" 'BEGIN { printf "%.3f", a / b }')" \
		"$(echo $boff | tr ' ' '\n' | median)" "$(echo $bon | tr ' ' '\n' | median)"
done
echo
printf '%-10s %-8s %12s %12s %8s %10s %10s\n' elements steps "off step/s" "on step/s" "on/off" "busy off" "busy on"
for case in "50021 2000" "1048576 150"; do
	set -- $case
	off= on= boff= bon=
	for _ in $(seq "$REPS"); do
		r=$(one 0 "$1" "$2"); off="$off ${r% *}"; boff="$boff ${r#* }"
		r=$(one 1 "$1" "$2"); on="$on ${r% *}"; bon="$bon ${r#* }"
	done
	mo=$(echo $off | tr ' ' '\n' | median) mn=$(echo $on | tr ' ' '\n' | median)
	printf '%-10s %-8s %12s %12s %8s %9s%% %9s%%\n' "$1" "$2" "$mo" "$mn" \
		"$(awk -v a="$mn" -v b="$mo" 'BEGIN { printf "%.3f", a / b }')" \
		"$(echo $boff | tr ' ' '\n' | median)" "$(echo $bon | tr ' ' '\n' | median)"
done
