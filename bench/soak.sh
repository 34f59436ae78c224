#!/bin/sh
# A long `unisum bench` (2 workers, 1 server, 16 MiB, authenticated by the
# launcher's job secret) with the resident memory of every process of the
# job sampled near its start and near its end: memory per process must not
# grow with the number of rounds.
#
#   sh bench/soak.sh [BUILD_DIR] [SECONDS]      (defaults: build, 600)
set -eu
BUILD=${1:-build}
SECONDS_TOTAL=${2:-600}
out=$(mktemp)
"$BUILD/unisum" bench -w 2 -s 1 --sizes 16 --seconds "$SECONDS_TOTAL" >"$out" 2>&1 &
job=$!
sample() {
	# pid, resident KiB and command of the job's processes
	ps -eo pid=,rss=,args= | grep -E "unisum (server|bench)" | grep -v -E "launch|grep" | sort -n
}
sleep 20
first=$(sample)
sleep $((SECONDS_TOTAL - 30))
last=$(sample)
wait $job
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC'), command: sh bench/soak.sh $BUILD $SECONDS_TOTAL"
echo "resident memory (KiB) at 20 s and at $((SECONDS_TOTAL - 10)) s:"
echo "$first" | while read -r pid rss args; do
	end=$(echo "$last" | awk -v p="$pid" '$1 == p { print $2 }')
	printf '  pid %-7s %-40s %8s -> %8s KiB\n' "$pid" "$(echo "$args" | cut -c1-40)" "$rss" "${end:-gone}"
done
tail -n 2 "$out"
rm -f "$out"
