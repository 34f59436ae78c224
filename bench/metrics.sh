#!/bin/sh
# metrics.sh - what the scheduler's metrics (issue 54) cost, measured side
# by side in one run:
#
# 1. Scraping at scale: W workers x S servers on this machine (256 x 32;
#    every worker its own machine) push_pull 1 MiB of float32 ITERS times
#    under `unisum launch --metrics`; meanwhile GET /metrics every 0.5 s.
#    Prints the scrape's time (curl's time_total: median and max), the
#    response's bytes and series, and what a heartbeat carries: 300 + 16 x S
#    bytes of counters per node (section 4's layout), and so the scheduler's
#    intake per second at one heartbeat a second.  Then the same scrape
#    while the job's processes wait, which is the scheduler's own cost.
# 2. The cost on the emulated cluster (as root; bench/cluster/netns.sh): n = 4
#    worker hosts at 1 Gbit/s with k = 2 CPU-only servers (and one on each
#    worker host), bench_pushpull's median of 64 MiB with nothing set,
#    without and with --metrics (and a scrape every second, as Prometheus
#    would), alternated PAIRS times, each run with the cores' busy share;
#    the ratio of the medians says whether the metrics cost anything
#    measurable beside the run-to-run noise (the spread of each side).
#
#   sh bench/metrics.sh [BUILD_DIR]
#   SIZE=256x32 ITERS=60 PAIRS=3 CLUSTER_ITERS=7 (the defaults); CLUSTER=0 skips part 2
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
BUILD=$(realpath -m "${1:-$ROOT/build}")
SIZE=${SIZE:-256x32}
ITERS=${ITERS:-60}
PAIRS=${PAIRS:-3}
CLUSTER_ITERS=${CLUSTER_ITERS:-7}
CLUSTER=${CLUSTER:-1}
[ "$(id -u)" = 0 ] || CLUSTER=0
W=${SIZE%x*} S=${SIZE#*x}
sh "$ROOT/scripts/install-deps.sh" bench
make -C "$ROOT" --no-print-directory build BUILD="$BUILD" >/dev/null
TMP=$(mktemp -d)
P=umet$$
trap 'sh "$HERE/cluster/netns.sh" down "$P" >/dev/null 2>&1 || true; rm -rf "$TMP"' EXIT
trap 'exit 130' INT TERM HUP

echo "# $(date -u '+%Y-%m-%d %H:%M') UTC, $(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -n 1), $(nproc) cores"
echo "# command: sh bench/metrics.sh; SIZE=$SIZE ITERS=$ITERS PAIRS=$PAIRS CLUSTER_ITERS=$CLUSTER_ITERS"

# scrape_loop URL OUT PERIOD : GET URL every PERIOD s until OUT.stop exists;
# one line per scrape: "time_total bytes".
scrape_loop() {
	while [ ! -e "$2.stop" ]; do
		curl -s -o "$2.last" -w '%{time_total} %{size_download}\n' --max-time 5 "$1" >>"$2" || true
		sleep "$3"
	done
}

# ---- 1. scraping at W x S ------------------------------------------------
port=$("$BUILD/check_sums" free-port)
"$BUILD/unisum" launch --metrics="$port" -w "$W" -s "$S" --local-size 1 -- \
	"$BUILD/bench_pushpull" --mib 1 --iters "$ITERS" --warmup 1 >"$TMP/scale.log" 2>&1 &
job=$!
# Scrape once every node has reported (the workers' operations show).
for _ in $(seq 600); do
	curl -s --max-time 5 "http://127.0.0.1:$port/metrics" 2>/dev/null |
		grep -q '^unisum_worker_operations_total{' && break
	sleep 0.5
done
scrape_loop "http://127.0.0.1:$port/metrics" "$TMP/scrapes" 0.5 &
loop=$!
wait "$job" || { cat "$TMP/scale.log" >&2; echo "metrics.sh: the $SIZE job failed" >&2; exit 1; }
touch "$TMP/scrapes.stop"
wait "$loop"
series=$(grep -vc '^#' "$TMP/scrapes.last" || true)
echo
echo "1. scraping: $W workers x $S servers, 1 MiB push_pulls, GET /metrics every 0.5 s while they run"
sort -n "$TMP/scrapes" | awk -v s="$series" -v S="$S" -v W="$W" '
	$2 > 0 { t[++n] = $1; b = $2 }
	END {
		if (n == 0) { print "no scrape was answered"; exit 1 }
		hb = 300 + 16 * S
		printf "scrapes %d, median %.1f ms, max %.1f ms; the answer: %.0f KiB, %d series\n",
			n, 1000 * t[int((n + 1) / 2)], 1000 * t[n], b / 1024, s
		printf "heartbeat counters: %d bytes per node at %d servers; the scheduler takes in %.0f KiB/s from %d workers\n",
			hb, S, hb * (W + S) / 1024, W
	}'
grep -E 'median_s|p50' "$TMP/scale.log" | head -n 2 | sed 's/^/  job: /'

# The same scrape while the job's W + S processes wait (check_sums holds
# them after 5 rounds: CHECK_SUMS_HOLD), so that the time is the
# scheduler's own rather than the wait for a core among W + S busy ones.
port=$("$BUILD/check_sums" free-port)
mkdir "$TMP/hold"
CHECK_SUMS_HOLD="$TMP/hold" "$BUILD/unisum" launch --metrics="$port" -w "$W" -s "$S" \
	--local-size 1 -- "$BUILD/check_sums" rounds 5 >"$TMP/hold.log" 2>&1 &
job=$!
for _ in $(seq 600); do
	[ "$(ls "$TMP/hold" | grep -c '^rank[0-9]*$')" = "$W" ] && break
	sleep 0.5
done
sleep 2
for _ in $(seq 20); do
	curl -s -o /dev/null -w '%{time_total}\n' --max-time 5 "http://127.0.0.1:$port/metrics"
done | sort -n | awk '{ t[++n] = $1 } END {
	printf "the same, while the job waits: %d scrapes, median %.1f ms, max %.1f ms\n",
		n, 1000 * t[int((n + 1) / 2)], 1000 * t[n] }'
touch "$TMP/hold/go"
wait "$job" || { cat "$TMP/hold.log" >&2; echo "metrics.sh: the held job failed" >&2; exit 1; }

# ---- 2. the cost on the emulated cluster ---------------------------------
[ "$CLUSTER" = 1 ] || { echo; echo "2. skipped (needs root for network namespaces)"; exit 0; }
NETNS="$HERE/cluster/netns.sh"
sh "$NETNS" up "$P" 8 1gbit >/dev/null
cpu_ticks() { awk '/^cpu / { t = 0; for (i = 2; i <= NF; i++) t += $i; print t - $5 - $6, t }' /proc/stat; }
servers="$P-h0,$P-h1,$P-h2,$P-h3,$P-h4,$P-h5"
# run ON : bench_pushpull's median seconds and the cores' busy percent.
run() {
	c0=$(cpu_ticks)
	port=$("$BUILD/check_sums" free-port)
	opt=""
	[ "$1" = on ] && opt="--metrics=$port"
	rm -f "$TMP/c" "$TMP/c.stop"
	"$BUILD/unisum" launch $opt -w 4 -s 6 --local-size 1 --worker-netns "$P-h0,$P-h1,$P-h2,$P-h3" \
		--server-netns "$servers" -- "$BUILD/bench_pushpull" --mib 64 --iters "$CLUSTER_ITERS" \
		--warmup 9 >"$TMP/c.log" 2>&1 &
	job=$!
	if [ "$1" = on ]; then
		url=$(sed -n 's/.*metrics at \(http[^ ,]*\).*/\1/p' "$TMP/c.log" | head -n 1)
		for _ in $(seq 50); do
			[ -n "$url" ] && break
			sleep 0.1
			url=$(sed -n 's/.*metrics at \(http[^ ,]*\).*/\1/p' "$TMP/c.log" | head -n 1)
		done
		scrape_loop "$url" "$TMP/c" 1 &
		loop=$!
	fi
	wait "$job" || { cat "$TMP/c.log" >&2; exit 1; }
	if [ "$1" = on ]; then
		touch "$TMP/c.stop"
		wait "$loop"
	fi
	echo "$(sed -n 's/.*median_s=\([0-9.]*\).*/\1/p' "$TMP/c.log") $(echo "$c0 $(cpu_ticks)" |
		awk '{ printf "%.0f", 100 * ($3 - $1) / ($4 - $2) }') $(cat "$TMP/c" 2>/dev/null | wc -l)"
}
echo
echo "2. emulated cluster: n = 4 worker hosts at 1 Gbit/s, k = 2 CPU-only servers, 64 MiB float32, median of $CLUSTER_ITERS; with metrics: a scrape every second"
printf "%-5s %-8s %10s %6s %8s\n" pair metrics median_s cpu% scrapes
for i in $(seq "$PAIRS"); do
	for m in off on; do
		set -- $(run $m)
		printf "%-5s %-8s %10s %6s %8s\n" "$i" "$m" "$1" "$2" "$3"
		echo "$m $1" >>"$TMP/pairs"
	done
done
awk '{ v[$1, ++n[$1]] = $2 }
	function med(k,   i, j, t, a) {
		for (i = 1; i <= n[k]; i++) a[i] = v[k, i]
		for (i = 1; i <= n[k]; i++) for (j = i + 1; j <= n[k]; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
		lo[k] = a[1]; hi[k] = a[n[k]]
		return a[int((n[k] + 1) / 2)]
	}
	END {
		off = med("off"); on = med("on")
		printf "median of the runs: off %.3f s (%.3f to %.3f), on %.3f s (%.3f to %.3f); on/off %.3f\n",
			off, lo["off"], hi["off"], on, lo["on"], hi["on"], on / off
	}' "$TMP/pairs"
