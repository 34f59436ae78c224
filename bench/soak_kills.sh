#!/bin/sh
# soak_kills.sh - N kills (default 100) of a running job's scheduler and
# servers, each after the last recovery, and what they cost (issue 52):
#
#   sh bench/soak.sh --kills [N] [BUILD_DIR]
#
# Jobs of 3 workers and 4 servers on this host, every process started by
# hand as on a cluster, one after another until N kills are done, at most
# 10 in a job (each then runs to its end and is checked).  Modes
# rotate: lock-step (check_sums failover: three tensors in flight, a
# one-shot tensor every 20 rounds), async, SSP, dssync, the gathering
# collectives (an allgather, a reduce-scatter and an alltoall a step)
# (chaos_modes) and compressed (check_sums).  Each job alternates: the
# scheduler SIGKILLed and started again at once on its port (what
# `unisum launch --scheduler` does), then a server SIGKILLed (failed
# over; 3 of the 4 at most, server 0 first, the home of every homed cut
# on one host; async and SSP keys, and compressed keys' error feedback,
# move to the lost server's backup, which holds their copies:
# UNISUM_REPLICAS=1; a homed cut's round is summed again from each
# machine's last push).
# Prints a line per kill: what, and its recovery:
#   scheduler: the slowest node's "resumed X ms after its loss"
#   server:    from the kill to worker 0's next completed round
# and at the end the kills, the recoveries' median and worst, and the
# updates lost: every worker checks every element of every step against
# the exact answer (integer updates), so a job that lost or doubled one
# fails; the count is of elements found wrong, and must be 0.
set -u
N=${1:-100}
BUILD=$(cd "${2:-build}" && pwd)
UNISUM="$BUILD/unisum" CHECK="$BUILD/check_sums" CHAOS="$BUILD/chaos_modes"
export UNISUM_NUM_WORKER=3 UNISUM_NUM_SERVER=4 UNISUM_SCHEDULER_HOST=127.0.0.1
export UNISUM_HEARTBEAT_MS=200 UNISUM_TIMEOUT_MS=3000 UNISUM_START_TIMEOUT_MS=20000
export CHAOS_STEP_MS=2 CHECK_SUMS_TIMES=1
kills=0 jobs=0 failed=0 wrong=0
recov=$(mktemp)

free_port() {
	"$CHECK" free-port	# as tests/integration/lib.sh
}

start_scheduler() {
	UNISUM_LOG_LEVEL=INFO UNISUM_ROLE=scheduler timeout 300 "$UNISUM" scheduler >>"$log/scheduler" 2>&1 &
	echo $! >"$log/pid.scheduler"
}

# the real process under a `timeout` pid
child_of() {
	for _ in $(seq 100); do
		c=$(pgrep -P "$1" | head -n 1)
		[ -n "$c" ] && { echo "$c"; return; }
		sleep 0.02
	done
	echo "$1"
}

alive() { kill -0 $wpids 2>/dev/null; }

kill_scheduler() {
	before=$(cat "$log"/server* "$log"/worker* | grep -c "is back: resumed")
	kill -KILL "$(child_of "$(cat "$log/pid.scheduler")")" 2>/dev/null
	wait "$(cat "$log/pid.scheduler")" 2>/dev/null
	start_scheduler
	live=$(($(ls "$log"/server* | wc -l) - lost + 3))
	for _ in $(seq 300); do
		now=$(cat "$log"/server* "$log"/worker* | grep -c "is back: resumed")
		[ $((now - before)) -ge "$live" ] && break
		alive || return 1
		sleep 0.02
	done
	ms=$(grep -ho "resumed [0-9]* ms after its loss" "$log"/server* "$log"/worker* |
		tail -n "$live" | awk '{ if ($2 > m) m = $2 } END { print m + 0 }')
	echo "$ms" >>"$recov"
	kills=$((kills + 1))
	echo "kill $kills: scheduler ($mode), every node back in $ms ms"
}

kill_server() {
	r=$lost
	t0=$(date +%s%3N)
	kill -KILL "$(child_of "$(cat "$log/pid.server$r")")" 2>/dev/null
	for _ in $(seq 300); do
		next=$(awk -v t="$t0" '/done at/ && $5 > t { print int($5 - t); exit }' "$log/worker0")
		[ -n "$next" ] && break
		alive || return 1
		sleep 0.02
	done
	[ -n "$next" ] || return 1
	echo "$next" >>"$recov"
	lost=$((lost + 1)) kills=$((kills + 1))
	echo "kill $kills: server $r ($mode), the next round $next ms later"
}

modes="lock-step async ssp:2 dssync:2 gathers compressed"
while [ "$kills" -lt "$N" ]; do
	mode=$(echo $modes | cut -d' ' -f$((jobs % 6 + 1)))
	jobs=$((jobs + 1)) lost=0
	log=$(mktemp -d)
	export UNISUM_SCHEDULER_PORT=$(free_port)
	start_scheduler
	for s in 0 1 2 3; do
		UNISUM_ROLE=server UNISUM_SERVER_ID=$s timeout 300 "$UNISUM" server >"$log/server$s" 2>&1 &
		echo $! >"$log/pid.server$s"
	done
	case $mode in
	lock-step) prog="$CHECK failover 2500" ;;
	compressed) prog="$CHECK compressed 1500" ;;
	gathers) prog="$CHAOS gathers 3000" ;;
	*) prog="$CHAOS $mode 2500" ;;
	esac
	wpids=
	for w in 0 1 2; do
		UNISUM_ROLE=worker UNISUM_WORKER_ID=$w timeout 300 $prog >"$log/worker$w" 2>&1 &
		wpids="$wpids $!"
	done
	for _ in $(seq 500); do
		grep -q "registered" "$log/scheduler" && break
		sleep 0.02
	done
	first=$kills
	while alive && [ "$kills" -lt "$N" ] && [ $((kills - first)) -lt 10 ]; do
		sleep 0.3
		alive || break
		kill_scheduler || break
		[ "$lost" -lt 3 ] && [ "$kills" -lt "$N" ] && { sleep 0.3; kill_server || break; }
	done
	for p in $wpids; do
		wait "$p" || failed=$((failed + 1))
	done
	kill -KILL "$(child_of "$(cat "$log/pid.scheduler")")" 2>/dev/null
	wait
	w=$(grep -hc "element" "$log"/worker* | awk '{ s += $1 } END { print s + 0 }')
	wrong=$((wrong + w))
	[ "$failed" -gt 0 ] && { echo "job $jobs ($mode) failed; worker 0's log ends:"; grep -v "done at" "$log/worker0" | tail -n 4; }
	rm -rf "$log"
	[ "$failed" -gt 0 ] && break
done
sort -n "$recov" | awk -v k="$kills" -v j="$jobs" -v f="$failed" -v w="$wrong" '
	{ v[NR] = $1 } END {
	printf "%d kills in %d jobs: recovery median %d ms, worst %d ms; jobs failed %d; elements wrong (updates lost) %d\n",
		k, j, v[int((NR + 1) / 2)], v[NR], f, w }'
rm -f "$recov"
[ "$failed" -eq 0 ] && [ "$wrong" -eq 0 ]
