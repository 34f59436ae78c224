#!/bin/sh
# replicas.sh - what copying async and SSP keys to a backup server costs
# (UNISUM_REPLICAS, issue 52): the same job with replicas off and on,
# measured in the same run.
#
#   sh bench/replicas.sh [BUILD_DIR]
#
# Each job: a scheduler, 3 servers and 3 workers on this host, every
# process started by hand as on a cluster, running chaos_modes held (an
# async and an SSP:2 tensor of CHAOS_COUNT int64 each, one push_pull of
# each per step, no pause, every element checked) for STEPS steps.  The
# sizes: 50,021 elements (391 KiB a tensor, 2 partitions at the default
# size) and 1,048,576 (8 MiB, 22 partitions).  Each case runs REPS times
# (default 3), off and on alternating; the table gives the median steps
# per second of worker 0 (its first to its last step), the ratio on/off
# (goal: 0.9 or more) and the cores' busy share over the run.
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

echo "# $(date -u +%Y-%m-%d) $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1), $(nproc) cores"
echo "# sh bench/replicas.sh: 3 workers, 3 servers, chaos_modes held (async + ssp:2), $REPS runs each"
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
