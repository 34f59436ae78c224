# Integration: the scheduler dies and a new one starts at its address
# (issue 52).  Jobs of 3 workers and 3 servers started by hand, as on a
# cluster, in every sync mode: lock-step (check_sums failover: three
# tensors in flight and a one-shot tensor declared and undeclared every
# 20 rounds), compressed (fp16 with error feedback and onebit, exact),
# autotune searching (its TUNEs go on across the restarts: every rank cuts
# every round alike),
# async, SSP, dssync and allgather (chaos_modes: integer updates whose
# exact answer every worker knows).  In each, the scheduler is SIGKILLed
# at a moment drawn from the run, restarted 200 ms later on the same
# port, and killed again once every node says it is back; every worker
# must finish all its steps with every element exact and exit 0.  Then:
# a scheduler that never comes back fails every node within
# UNISUM_TIMEOUT_MS plus a margin, each naming it; and resume_probe.py
# checks the restarted scheduler's refusals on the wire (a stale
# generation, a fresh node in a resumed job, a resume to a job that
# started afresh).
. "$(dirname "$0")/lib.sh"

CHAOS="$BUILD/chaos_modes"
export UNISUM_NUM_WORKER=3 UNISUM_NUM_SERVER=3 UNISUM_SCHEDULER_HOST=127.0.0.1
export UNISUM_HEARTBEAT_MS=200 UNISUM_TIMEOUT_MS=3000 UNISUM_START_TIMEOUT_MS=20000
export CHAOS_STEP_MS=3

# start_scheduler LOG : a standalone scheduler on $UNISUM_SCHEDULER_PORT.
start_scheduler() {
	UNISUM_LOG_LEVEL=INFO UNISUM_ROLE=scheduler timeout 90 "$UNISUM" scheduler >>"$1" 2>&1 &
	echo $! >"$log/pid.scheduler"
}

# kill_scheduler : SIGKILL to the scheduler (the child of its `timeout`).
kill_scheduler() {
	tpid=$(cat "$log/pid.scheduler") spid=
	for _ in $(seq 100); do
		kill -0 "$tpid" 2>/dev/null || return 0	# it ended already
		spid=$(pgrep -P "$tpid" | head -n 1)
		[ -n "$spid" ] && break
		sleep 0.05
	done
	kill -KILL "${spid:-$tpid}" 2>/dev/null
	wait "$tpid" 2>/dev/null
}

# all_back N : waits (10 s at most) until every node's log says the
# scheduler is back N times.
all_back() {
	for _ in $(seq 200); do
		n=0
		for f in "$log"/server* "$log"/worker*; do
			[ "$(grep -c "is back: resumed" "$f")" -ge "$1" ] && n=$((n + 1))
		done
		[ $n -eq 6 ] && return 0
		kill -0 $wpids 2>/dev/null || return 1	# the job ended meanwhile
		sleep 0.05
	done
	return 1
}

# restart_run RUN LABEL OKTEXT PROGRAM ARGS... : the job, two kills.
restart_run() {
	run=$1 label=$2 oktext=$3
	shift 3
	log=$(mktemp -d) t_run=$(date +%s%N)
	export UNISUM_SCHEDULER_PORT=$(free_port)
	start_scheduler "$log/scheduler"
	for s in 0 1 2; do
		UNISUM_ROLE=server UNISUM_SERVER_ID=$s timeout 90 "$UNISUM" server \
			>"$log/server$s" 2>&1 &
	done
	wpids=
	for w in 0 1 2; do
		UNISUM_ROLE=worker UNISUM_WORKER_ID=$w timeout 90 "$@" >"$log/worker$w" 2>&1 &
		wpids="$wpids $!"
	done
	ok=true
	# Killed once the job runs (before, the nodes fail: no book yet).
	for _ in $(seq 200); do
		grep -q "workers on 3 machines registered" "$log/scheduler" && break
		sleep 0.05
	done
	for kill in 1 2; do
		sleep "$(awk -v ms=$((200 + (run * 211 + kill * 97) % 300)) 'BEGIN { printf "%.3f", ms / 1000 }')"
		if ! kill -0 $wpids 2>/dev/null; then
			echo "  $label: the job ended before kill $kill (too few steps for this machine?)"
			ok=false
			break
		fi
		kill_scheduler
		sleep 0.2
		start_scheduler "$log/scheduler"
		if ! all_back $kill; then
			echo "  $label: not every node came back after kill $kill:"
			grep -L "is back" "$log"/server* "$log"/worker* | sed 's/^/    /'
			ok=false
			break
		fi
	done
	for p in $wpids; do
		wait "$p" || ok=false
	done
	kill_scheduler
	wait
	for w in 0 1 2; do
		grep -q "$oktext" "$log/worker$w" || {
			echo "  $label: worker $w did not finish its steps; its log ends:"
			tail -n 4 "$log/worker$w" | sed 's/^/    /'
			ok=false
		}
	done
	echo "  $label: $(ms_since "$t_run") ms"
	# Autotune (check_sums tune): every rank cut every round alike.
	if grep -q "partition bytes by round" "$log/worker0"; then
		n=$(sed -n 's/.*partition bytes by round: //p' "$log"/worker* | sort -u | grep -c .)
		[ "$n" -eq 1 ] || {
			echo "  $label: the ranks used different partition sizes ($n lines)"
			ok=false
		}
	fi
	back=$(grep -ho "resumed [0-9]* ms after its loss" "$log"/server* "$log"/worker* |
		awk '{ if ($2 > m) m = $2 } END { print m + 0 }')
	echo "  $label: 2 scheduler kills, the slowest node back $back ms after the loss (200 ms down)"
	expect "$label: the scheduler killed twice and restarted, every sum exact" "$ok"
	rm -rf "$log"
}

ROUNDS=500 STEPS=800 TUNE_ROUNDS=400
restart_run 1 "lock-step" "$ROUNDS failover rounds ok" "$CHECK" failover "$ROUNDS"
restart_run 2 "async" "async $STEPS steps ok" "$CHAOS" async "$STEPS"
# The sanitizer runs (UNISUM_TEST_LIGHT=1) look for races in the resume
# itself: two modes are enough there (make test stays within its budget).
if [ "${UNISUM_TEST_LIGHT:-0}" != 1 ]; then
	restart_run 3 "ssp:2" "ssp:2 $STEPS steps ok" "$CHAOS" ssp:2 "$STEPS"
	restart_run 4 "dssync:2" "dssync:2 $STEPS steps ok" "$CHAOS" dssync:2 "$STEPS"
	restart_run 5 "allgather" "allgather $((STEPS * 2)) steps ok" "$CHAOS" allgather "$((STEPS * 2))"
	UNISUM_AUTOTUNE=1 UNISUM_AUTOTUNE_STEPS=4 UNISUM_PARTITION_BYTES=262144 \
		restart_run 7 "autotune (search)" "$TUNE_ROUNDS tuned rounds ok" "$CHECK" tune "$TUNE_ROUNDS"
	restart_run 6 "compressed" "$((STEPS / 2)) compressed rounds ok" "$CHECK" compressed "$((STEPS / 2))"
fi

# A scheduler that does not come back: every node fails naming it.
log=$(mktemp -d)
export UNISUM_SCHEDULER_PORT=$(free_port)
start_scheduler "$log/scheduler"
for s in 0 1 2; do
	UNISUM_ROLE=server UNISUM_SERVER_ID=$s timeout 60 "$UNISUM" server >"$log/server$s" 2>&1 &
done
for w in 0 1 2; do
	UNISUM_ROLE=worker UNISUM_WORKER_ID=$w timeout 60 "$CHECK" rounds 1000000 \
		>"$log/worker$w" 2>&1 &
done
sleep 1
kill_scheduler
t0=$(date +%s%N)
wait
ms=$(ms_since "$t0")
named=0
for f in "$log"/server* "$log"/worker*; do
	grep -q "lost the scheduler at 127.0.0.1:$UNISUM_SCHEDULER_PORT (connection closed) and it did not come back within 3000 ms" "$f" &&
		named=$((named + 1))
done
expect "a scheduler that never comes back: all 6 nodes fail naming it ($named did) within $ms ms (limit 6000)" \
	sh -c "[ $named -eq 6 ] && [ $ms -le 6000 ]"
rm -rf "$log"

# `unisum launch --scheduler` runs the scheduler role and starts it again
# when it dies; a node of the job (`launch --nproc-per-node 2
# --no-scheduler`: 2 workers and a server) goes on through both kills.
log=$(mktemp -d)
port=$(free_port)
UNISUM_LOG_LEVEL=INFO UNISUM_SCHEDULER_PORT=$port UNISUM_NUM_WORKER=1 UNISUM_NUM_SERVER=1 \
	timeout 90 "$UNISUM" launch --scheduler >"$log/sched" 2>&1 &
lpid=$!
timeout 90 "$UNISUM" launch --nproc-per-node 2 --nnodes 1 --node-rank 0 --master-addr 127.0.0.1 \
	--master-port "$port" --no-scheduler --no-secret -- "$CHECK" failover "$ROUNDS" \
	>"$log/node" 2>&1 &
npid=$!
for _ in $(seq 200); do
	grep -q "workers on 1 machines registered" "$log/sched" && break
	sleep 0.05
done
ok=true
for kill in 1 2; do
	sleep 0.3
	spid=$(pgrep -P "$(pgrep -P "$lpid" | head -n 1)" | head -n 1)
	[ -n "$spid" ] && kill -KILL "$spid"
	for _ in $(seq 200); do
		[ "$(grep -c "is back: resumed" "$log/node")" -ge $((3 * kill)) ] && break
		kill -0 "$npid" 2>/dev/null || break
		sleep 0.05
	done
done
wait "$npid" || ok=false
wait "$lpid" || ok=false
restarts=$(grep -c "starting another on the same address" "$log/sched")
finished=$(grep -c "$ROUNDS failover rounds ok" "$log/node")
[ "$restarts" -eq 2 ] && [ "$finished" -eq 2 ] || ok=false
$ok || { echo "  the node's log ends:"; tail -n 5 "$log/node" | sed 's/^/    /'; }
expect "launch --scheduler restarted its scheduler $restarts times; the node's 2 workers finished ($finished), exact" "$ok"
rm -rf "$log"

# The restarted scheduler's refusals, on the wire: one scheduler for a
# resumed job, one for a job that starts afresh.
port=$(free_port)
UNISUM_SCHEDULER_PORT=$port UNISUM_NUM_WORKER=1 UNISUM_NUM_SERVER=1 UNISUM_ROLE=scheduler \
	timeout 30 "$UNISUM" scheduler >/dev/null 2>&1 &
port2=$(free_port)
UNISUM_SCHEDULER_PORT=$port2 UNISUM_NUM_WORKER=1 UNISUM_NUM_SERVER=1 UNISUM_ROLE=scheduler \
	timeout 30 "$UNISUM" scheduler >/dev/null 2>&1 &
check_job "a stale generation, a fresh node in a resumed job, a resume to a fresh job: refused" \
	/usr/bin/python3 "$(dirname "$0")/resume_probe.py" "$port" "$port2"
echo "$LAST" | sed 's/^/    /'
pkill -KILL -f "UNISUM_SCHEDULER_PORT=($port|$port2)" 2>/dev/null
for p in $(jobs -p); do pkill -KILL -P "$p" 2>/dev/null; done
wait
finish
