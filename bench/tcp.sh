#!/bin/sh
# unisum push_pull over loopback TCP against the ceiling of this machine:
# single-stream iperf3 on loopback, measured in the same run.
#
#   sh bench/tcp.sh [BUILD_DIR]      (default: build)
#
# For 2 workers, every push_pull moves 4 x tensor bytes through loopback
# (each worker sends its tensor and receives the sum), so the job's
# loopback throughput is 4 x bytes / time; the ratio to iperf3 is how close
# unisum comes to what the kernel can move at all on this machine.
set -eu
BUILD=${1:-build}
UNISUM="$BUILD/unisum"
command -v iperf3 >/dev/null || { echo "bench/tcp.sh: iperf3 is missing (make deps)"; exit 1; }

port=$("$BUILD/check_sums" free-port)
iperf3 -s -1 -p "$port" >/dev/null 2>&1 &
sleep 0.5
ip=$(iperf3 -c 127.0.0.1 -p "$port" -t 5 -J | python3 -c 'import json,sys; print(json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"]/8e9)')
wait
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, command: sh bench/tcp.sh"
printf 'iperf3 single stream, loopback: %.2f GB/s\n\n' "$ip"

for servers in 1 2; do
	echo "unisum bench -w 2 -s $servers:"
	out=$("$UNISUM" bench -w 2 -s "$servers" --sizes 4,64 --seconds 3 2>/dev/null)
	echo "$out" | sed -n 's/^\[worker 0\] //p' | sed -n '2,$p' | while read -r size unit rounds per ms good gu wire wu; do
		[ "$unit" = "MiB" ] || continue
		ratio=$(echo "$wire $ip" | awk '{printf "%.2f", $1 / $2}')
		echo "  $size $unit  $per ms/round  goodput $good GB/s per worker  loopback $wire GB/s  = $ratio x iperf3"
	done
	echo
done
