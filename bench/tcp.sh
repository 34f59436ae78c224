#!/bin/sh
# unisum push_pull over loopback TCP against the ceiling of this machine:
# single-stream iperf3 on loopback, measured in the same run.
#
#   sh bench/tcp.sh [BUILD_DIR] [REPEATS]      (defaults: build, 3)
#
# For 2 workers, every push_pull moves 4 x tensor bytes through loopback
# (each worker sends its tensor and receives the sum), so the job's
# loopback throughput is 4 x bytes / time; the ratio to iperf3 is how close
# unisum comes to what the kernel can move at all on this machine.  A
# shared VM drifts by tens of percent within a minute, so every unisum
# measurement is bracketed by iperf3 runs just before and just after it and
# compared with their mean; the table gives every repeat and the median.
set -eu
sh "$(dirname "$0")/../scripts/install-deps.sh" bench
# The socket path is what is measured: a server on this host would
# otherwise get the data by address (IPC mode).
export UNISUM_IPC=0
BUILD=${1:-build}
REPEATS=${2:-3}
UNISUM="$BUILD/unisum"

iperf() {
	port=$("$BUILD/check_sums" free-port)
	iperf3 -s -1 -p "$port" >/dev/null 2>&1 &
	sleep 0.3
	iperf3 -c 127.0.0.1 -p "$port" -t 2 -J 2>/dev/null |
		/usr/bin/python3 -c 'import json,sys; print("%.3f" % (json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"]/8e9))'
	wait
}

echo "date: $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, command: sh bench/tcp.sh $*"
echo "2 workers, float32; loopback = 4 x tensor bytes / time; ratio = loopback / mean(iperf3 before, after)"
printf '%-8s %-7s %10s %16s %14s %14s %7s\n' servers size ms/round "goodput/worker" loopback iperf3 ratio
results=$(mktemp)
for servers in 1 2; do
	for size in 4 64; do
		for rep in $(seq "$REPEATS"); do
			before=$(iperf)
			line=$("$UNISUM" bench -w 2 -s "$servers" --sizes "$size" --seconds 2 2>/dev/null | tail -1)
			after=$(iperf)
			echo "$line" | awk -v s="$servers" -v b="$before" -v a="$after" '{
				ip = (a + b) / 2; wire = $10;
				printf "%-8s %-7s %10s %11s GB/s %9s GB/s %9.2f GB/s %7.2f\n", s, $3 " MiB", $6, $8, wire, ip, wire / ip
			}' | tee -a "$results"
		done
	done
done
echo
echo "median ratio per configuration:"
for servers in 1 2; do
	for size in 4 64; do
		awk -v s="$servers" -v z="$size" '$1 == s && $2 == z { print $NF }' "$results" | sort -n |
			awk -v s="$servers" -v z="$size" '{ v[NR] = $1 } END { printf "  %s server(s), %3s MiB: %.2f x iperf3 (%d runs)\n", s, z, v[int((NR + 1) / 2)], NR }'
	done
done
rm -f "$results"
