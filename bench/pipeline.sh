#!/bin/sh
# pipeline.sh - priority scheduling against first come, first served on a
# shaped link: `unisum bench --model` with the servers and the workers in
# two network namespaces joined by a veth pair that `tc` limits to RATE
# each way, so communication dominates as it does between real machines.
#
#   sh bench/pipeline.sh [BUILD_DIR] [MODEL] [RATE] [-- BENCH ARGS...]
#       defaults: build vgg16 2gbit
#
# Needs root (ip netns, tc).  Creates the namespaces us_srv and us_wrk and
# removes them on exit, whatever happens.  The scheduler and 2 servers run
# in us_srv (10.77.0.1), 2 workers in us_wrk (10.77.0.2); iperf3 measures
# the shaped link first, in the same run.
set -u
sh "$(dirname "$0")/../scripts/install-deps.sh" bench
BUILD=$(cd "${1:-build}" && pwd) || exit 2
MODEL=${2:-vgg16}
RATE=${3:-2gbit}
shift $(($# < 3 ? $# : 3))
[ "${1:-}" = "--" ] && shift
UNISUM="$BUILD/unisum"
S=us_srv W=us_wrk
SA=10.77.0.1 WA=10.77.0.2
PORT=9377

cleanup() {
	for ns in $S $W; do
		pids=$(ip netns pids $ns 2>/dev/null)
		[ -n "$pids" ] && kill -9 $pids 2>/dev/null
	done
	ip netns del $S 2>/dev/null
	ip netns del $W 2>/dev/null
}
trap cleanup EXIT INT TERM
cleanup

ip netns add $S && ip netns add $W || exit 1
ip link add us_s0 type veth peer name us_w0 || exit 1
ip link set us_s0 netns $S && ip link set us_w0 netns $W || exit 1
ip -n $S addr add $SA/24 dev us_s0 && ip -n $W addr add $WA/24 dev us_w0 || exit 1
for ns in $S $W; do
	ip -n $ns link set lo up
done
ip -n $S link set us_s0 up && ip -n $W link set us_w0 up || exit 1
# The same limit both ways: pushes leave through us_w0, replies through us_s0.
ip netns exec $S tc qdisc add dev us_s0 root tbf rate "$RATE" burst 1mb latency 50ms || exit 1
ip netns exec $W tc qdisc add dev us_w0 root tbf rate "$RATE" burst 1mb latency 50ms || exit 1

echo "pipeline: $MODEL, servers in $S ($SA), workers in $W ($WA), link $RATE each way"
if command -v iperf3 >/dev/null 2>&1; then
	ip netns exec $S iperf3 -s -1 -p 5299 >/dev/null 2>&1 &
	sleep 0.5
	bw=$(ip netns exec $W iperf3 -c $SA -p 5299 -t 3 -f g 2>/dev/null | sed -n 's/.* \([0-9.]* Gbits\/sec\).*receiver/\1/p')
	echo "pipeline: iperf3 over the shaped link: ${bw:-?}"
fi

export UNISUM_SCHEDULER_HOST=$SA UNISUM_SCHEDULER_PORT=$PORT UNISUM_NUM_WORKER=2 UNISUM_NUM_SERVER=2
UNISUM_SECRET=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
export UNISUM_SECRET
logs=$(mktemp -d)
ip netns exec $S env UNISUM_ROLE=scheduler "$UNISUM" scheduler >"$logs/scheduler" 2>&1 &
for s in 0 1; do
	ip netns exec $S env UNISUM_ROLE=server UNISUM_SERVER_ID=$s UNISUM_NODE_HOST=$SA \
		"$UNISUM" server >"$logs/server$s" 2>&1 &
done
for w in 1 0; do
	ip netns exec $W env UNISUM_ROLE=worker UNISUM_WORKER_ID=$w UNISUM_NODE_HOST=$WA \
		timeout 1200 "$UNISUM" bench --model "$MODEL" "$@" >"$logs/worker$w" 2>&1 &
	[ $w = 0 ] && w0=$!
done
wait $w0
rc=$?
cat "$logs/worker0"
if [ $rc -ne 0 ]; then
	for f in "$logs"/*; do
		echo "--- $f"
		tail -n 20 "$f"
	done
fi
rm -rf "$logs"
exit $rc
