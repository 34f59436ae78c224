#!/bin/sh
# A long `unisum bench` (2 workers, 1 server, 16 MiB, authenticated by the
# launcher's job secret) with the resident memory of every process of the
# job sampled every 10 s: memory per process must not grow with the number
# of rounds.  Prints the first sample (at 20 s) and the last one taken
# while the job still ran.
#
#   sh bench/soak.sh [BUILD_DIR] [SECONDS]      (defaults: build, 600)
#   sh bench/soak.sh --kills [N] [BUILD_DIR]    N kills of the scheduler and
#                                               servers (bench/soak_kills.sh)
set -eu
if [ "${1:-}" = "--kills" ]; then
	shift
	exec sh "$(dirname "$0")/soak_kills.sh" "$@"
fi
sh "$(dirname "$0")/../scripts/install-deps.sh" bench
BUILD=${1:-build}
SECONDS_TOTAL=${2:-600}
out=$(mktemp)
"$BUILD/unisum" bench -w 2 -s 1 --sizes 16 --seconds "$SECONDS_TOTAL" >"$out" 2>&1 &
job=$!
sample() {
	# pid, resident KiB and command of the job's server and workers
	ps -eo pid=,rss=,args= | grep -E "unisum (server|bench --sizes)" | grep -v grep | sort -n
}
start=$(date +%s)
sleep 20
first=$(sample)
last=$first
last_at=20
while kill -0 $job 2>/dev/null; do
	sleep 10
	now=$(sample)
	if [ "$(echo "$now" | wc -l)" -eq "$(echo "$first" | wc -l)" ]; then
		last=$now
		last_at=$(($(date +%s) - start))
	fi
done
wait $job
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC'), command: sh bench/soak.sh $BUILD $SECONDS_TOTAL"
echo "resident memory (KiB) at 20 s and at $last_at s:"
echo "$first" | while read -r pid rss args; do
	end=$(echo "$last" | awk -v p="$pid" '$1 == p { print $2 }')
	printf '  %-40s %8s -> %8s KiB\n' "$(echo "$args" | cut -c1-40)" "$rss" "${end:-gone}"
done
tail -n 1 "$out"
rm -f "$out"
