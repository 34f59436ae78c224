# Integration, chaos in every sync mode (issue 52): jobs of 3 workers and
# 3 servers started by hand, as on a cluster, losing processes to SIGKILL
# one after another, each once the job has recovered from the last, at
# moments drawn from the run.  Every worker checks every element of every
# step against the exact answer (integer updates: "no update lost, none
# doubled" is an equality) and must finish and exit 0.
#   - lock-step (check_sums failover: three tensors in flight and a
#     one-shot tensor declared and undeclared every 20 rounds) and dssync:2
#     (chaos_modes): a server, then the scheduler, then another server;
#   - async and SSP:2 together (chaos_modes held: a step of each per
#     step; their values are copied to each server's backup,
#     UNISUM_REPLICAS=1 by default): a server, then the scheduler, then
#     another server (the second takes over keys the first's loss moved);
#   - compressed (check_sums compressed: fp16 with error feedback and
#     onebit, exact): a server, then the scheduler, then another server;
#   - the gathering collectives (chaos_modes gathers: an allgather, a
#     reduce-scatter and an alltoall a step, exact; 8 KiB partitions and
#     ring phases on): server 0 (on one host it holds every homed cut:
#     each machine's home), then the scheduler, then server 1 (where the
#     homed cuts may have moved); each machine keeps its last push of a
#     homed piece, and the new server sums the round again from them;
#   - an autotune search (its TUNEs go on across the restarts: every
#     rank cuts every round alike): the scheduler, twice.
# Compressed tensors whose error feedback matters (chaos_modes feedback:
# onebit and top-k, ef=vanilla, no exact answer known) print a hash of
# every output: a job whose server dies right after the first reply of
# a round (before that round's feedback reached the backup, so the new
# server sums the round again from the workers' kept pushes) prints the
# hash of a job that lost nothing.
# Two servers lost at once (a server and its backup): the async keys of
# the first have no copy left, and every worker fails naming a key and
# both servers, without a hang.
# A killed scheduler is started again 100 ms later on its port; the nodes
# wait for it and register again with what they know.  Then: a scheduler
# that never comes back fails every node within UNISUM_TIMEOUT_MS plus a
# margin, each naming it; `unisum launch --scheduler` restarts the
# scheduler it runs under a node (`launch --nproc-per-node 2
# --no-scheduler`); and resume_probe.py checks a restarted scheduler's
# refusals on the wire (a stale generation, a fresh node in a resumed job,
# a resume to a job that started afresh).
. "$(dirname "$0")/lib.sh"

CHAOS="$BUILD/chaos_modes"
export UNISUM_NUM_WORKER=3 UNISUM_NUM_SERVER=3 UNISUM_SCHEDULER_HOST=127.0.0.1
export UNISUM_HEARTBEAT_MS=200 UNISUM_TIMEOUT_MS=3000 UNISUM_START_TIMEOUT_MS=20000
export CHAOS_STEP_MS=3

# start_scheduler LOG : a standalone scheduler on $UNISUM_SCHEDULER_PORT.
start_scheduler() {
	UNISUM_LOG_LEVEL=${SCHED_LOG_LEVEL:-INFO} UNISUM_ROLE=scheduler timeout 90 "$UNISUM" scheduler \
		>>"$1" 2>&1 &
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

# all_back N : waits (10 s at most) until every live node's log says the
# scheduler is back N times.
all_back() {
	for _ in $(seq 200); do
		n=0
		for f in "$log"/server* "$log"/worker*; do
			[ "$(grep -c "is back: resumed" "$f")" -ge "$1" ] && n=$((n + 1))
		done
		[ $n -eq $((6 - lost)) ] && return 0
		kill -0 $wpids 2>/dev/null || return 1	# the job ended meanwhile
		sleep 0.05
	done
	return 1
}

# kill_server R : SIGKILL to server R; waits (10 s at most) for the
# scheduler's failover of it and for the workers to go on past it.
kill_server() {
	kill -KILL "$(pgrep -P "$(cat "$log/pid.server$1")" | head -n 1)" 2>/dev/null
	lost=$((lost + 1))
	for _ in $(seq 200); do
		grep -q "failover $lost: server $1 is lost" "$log/scheduler" && return 0
		kill -0 $wpids 2>/dev/null || return 1
		sleep 0.05
	done
	return 1
}

# start_job LIMIT PROGRAM ARGS... : in $log, a scheduler,
# $UNISUM_NUM_SERVER servers (at $SERVER_LOG_LEVEL, default WARNING) and
# $UNISUM_NUM_WORKER workers running PROGRAM (each under `timeout LIMIT`;
# the workers' pids in $wpids); returns once the job runs (before, a kill
# fails the nodes: no book yet).
start_job() {
	limit=$1
	shift
	export UNISUM_SCHEDULER_PORT=$(free_port)
	start_scheduler "$log/scheduler"
	for s in $(seq 0 $((UNISUM_NUM_SERVER - 1))); do
		UNISUM_LOG_LEVEL=${SERVER_LOG_LEVEL:-WARNING} UNISUM_ROLE=server UNISUM_SERVER_ID=$s \
			timeout "$limit" "$UNISUM" server >"$log/server$s" 2>&1 &
		echo $! >"$log/pid.server$s"
	done
	wpids=
	for w in $(seq 0 $((UNISUM_NUM_WORKER - 1))); do
		UNISUM_ROLE=worker UNISUM_WORKER_ID=$w timeout "$limit" "$@" >"$log/worker$w" 2>&1 &
		wpids="$wpids $!"
	done
	for _ in $(seq 200); do
		grep -q "workers on $UNISUM_NUM_WORKER machines registered" "$log/scheduler" && break
		sleep 0.05
	done
}

# restart_run RUN LABEL OKTEXT KILLS PROGRAM ARGS... : the job, and the
# kills in order (scheduler, server).
restart_run() {
	run=$1 label=$2 oktext=$3 kills=$4
	shift 4
	log=$(mktemp -d) t_run=$(date +%s%N)
	start_job 90 "$@"
	lost=0 restarts=0 ok=true kill=0
	for victim in $kills; do
		kill=$((kill + 1))
		sleep "$(awk -v ms=$((150 + (run * 211 + kill * 97) % 150)) 'BEGIN { printf "%.3f", ms / 1000 }')"
		if ! kill -0 $wpids 2>/dev/null; then
			echo "  $label: the job ended before kill $kill (too few steps for this machine?)"
			ok=false
			break
		fi
		if [ "$victim" = server ]; then
			# servers 1 then 2 (a server's loss moves its pieces to the
			# others), or from $VICTIM0
			kill_server "$((lost + ${VICTIM0:-1}))" && continue
			echo "  $label: no failover of server $lost after kill $kill"
			ok=false
			break
		fi
		kill_scheduler
		sleep 0.1
		start_scheduler "$log/scheduler"
		restarts=$((restarts + 1))
		if ! all_back $restarts; then
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
	echo "  $label: kills $(echo $kills | tr ' ' ','); the slowest node back $back ms after the scheduler's loss (100 ms down)"
	expect "$label: $(echo $kills | sed 's/ /, then /g') killed, every element exact" "$ok"
	rm -rf "$log"
}

ROUNDS=400 STEPS=700 TUNE_ROUNDS=300 NODE_ROUNDS=2500
restart_run 1 "lock-step" "$ROUNDS failover rounds ok" "server scheduler server" \
	"$CHECK" failover "$ROUNDS"
# The sanitizer runs (UNISUM_TEST_LIGHT=1) look for races in the resume
# and the failovers: the lock-step job has them all (make test stays
# within its budget).
if [ "${UNISUM_TEST_LIGHT:-0}" != 1 ]; then
	restart_run 2 "dssync:2" "dssync:2 $STEPS steps ok" "server scheduler server" \
		"$CHAOS" dssync:2 "$STEPS"
	restart_run 3 "async and ssp:2" "held 500 steps ok" "server scheduler server" \
		"$CHAOS" held 500
	VICTIM0=0 UNISUM_PARTITION_BYTES=8192 UNISUM_ALLGATHER_PHASES=1 \
		restart_run 4 "allgather, reduce-scatter, alltoall" "gathers 400 steps ok" \
		"server scheduler server" "$CHAOS" gathers 400
	UNISUM_AUTOTUNE=1 UNISUM_AUTOTUNE_STEPS=4 UNISUM_PARTITION_BYTES=262144 \
		restart_run 5 "autotune (search)" "$TUNE_ROUNDS tuned rounds ok" "scheduler scheduler" \
		"$CHECK" tune "$TUNE_ROUNDS"
	restart_run 6 "compressed" "450 compressed rounds ok" "server scheduler server" \
		"$CHECK" compressed 450
fi

# feedback_run LOG [SERVER...] : chaos_modes feedback 300 in LOG, each
# SERVER killed 0.4 s after the last; its hashes, one line.
feedback_run() {
	log=$1
	shift
	start_job 60 "$CHAOS" feedback 300
	for victim in "$@"; do
		sleep 0.4
		kill -KILL "$(pgrep -P "$(cat "$log/pid.server$victim")")"
	done
	for p in $wpids; do wait "$p"; done
	kill_scheduler
	wait
	sed -n 's/.*feedback 300 steps hash //p' "$log"/worker* | sort | tr '\n' ' '
}

# Not in the sanitizer runs (make test's budget): the hung backup's test
# below runs the same code there (copies, a takeover, a failover).
if [ "${UNISUM_TEST_LIGHT:-0}" != 1 ]; then
	log=$(mktemp -d)
	ref=$(feedback_run "$log")
	rm -rf "$log"
	log=$(mktemp -d)
	SERVER_LOG_LEVEL=DEBUG
	got=$(UNISUM_TEST_CRASH_AFTER_REPLIES=40:1 UNISUM_TEST_CRASH_KEY_NAME=chaos.onebit \
		feedback_run "$log")
	SERVER_LOG_LEVEL=WARNING
	again=$(cat "$log"/server0 "$log"/server2 | grep -c "push restored, summed again")
	crashed=$(grep -c "killing this server after the first reply" "$log/server1")
	echo "  hashes without a loss: $ref; with server 1 lost: $got"
	expect "compressed with error feedback: server 1 lost after a round's first reply ($crashed), the round summed again from kept pushes ($again), every output as without a loss" \
		sh -c "[ -n '$ref' ] && [ '$ref' = '$got' ] && [ $crashed -eq 1 ] && [ $again -ge 1 ]"
	rm -rf "$log"
	# Server 1, then server 2, which took over its keys: the feedback it
	# copied since (to server 0) goes on.
	log=$(mktemp -d)
	got=$(feedback_run "$log" 1 2)
	rm -rf "$log"
	expect "compressed with error feedback: server 1, then server 2 (which took its keys over) lost, every output as without a loss" \
		sh -c "[ '$ref' = '$got' ]"
	# One machine: its re-pushes are its rounds, but it keeps its last
	# push all the same (its error feedback must not run twice).
	export UNISUM_NUM_WORKER=1
	log=$(mktemp -d)
	ref=$(feedback_run "$log")
	rm -rf "$log"
	log=$(mktemp -d)
	got=$(feedback_run "$log" 1)
	rm -rf "$log"
	export UNISUM_NUM_WORKER=3
	echo "  one machine: hashes without a loss: $ref; with server 1 lost: $got"
	expect "compressed with error feedback, one machine: server 1 lost, every output as without a loss" \
		sh -c "[ -n '$ref' ] && [ '$ref' = '$got' ]"

	# A server and its backup lost at once: the job fails (the first's async
	# keys have no copy left), every worker naming a key and both servers.
	log=$(mktemp -d)
	start_job 60 "$CHAOS" held 1000000
	sleep 0.4
	kill -KILL "$(pgrep -P "$(cat "$log/pid.server1")")" "$(pgrep -P "$(cat "$log/pid.server2")")"
	t0=$(date +%s%N)
	for p in $wpids; do wait "$p"; done
	ms=$(ms_since "$t0")
	named=0
	for w in 0 1 2; do
		grep -q "FAILED.*took over key 0x[0-9a-f]* of 'chaos.mix.*no whole copy of the key was left.*(servers lost so far: 1, 2)" \
			"$log/worker$w" && named=$((named + 1))
	done
	[ $named -eq 3 ] || tail -n 3 "$log"/worker*
	expect "a server and its backup lost at once: all 3 workers fail naming a key and both ($named did) within $ms ms (limit 10000)" \
		sh -c "[ $named -eq 3 ] && [ $ms -le 10000 ]"
	kill_scheduler
	wait
	rm -rf "$log"

	# A backup that dies while it catches up: 4 servers and one async key
	# (one partition) on server S; S's backup S+1 is lost (it held nothing
	# but the copy), S copies the key to S+2 (catching up) and S+2 is killed
	# as soon as S says so; S copies it to S+3.  Then S is lost: the key
	# moves to S+3, which holds the copy, and the job ends exact.
	log=$(mktemp -d)
	export UNISUM_NUM_SERVER=4 CHAOS_COUNT=1000
	SCHED_LOG_LEVEL=DEBUG SERVER_LOG_LEVEL=INFO
	start_job 60 "$CHAOS" async 900
	SCHED_LOG_LEVEL=INFO SERVER_LOG_LEVEL=WARNING
	S=
	for _ in $(seq 200); do
		S=$(sed -n "s/.*placed 'chaos.async' part 0 .* on server \([0-9]*\)$/\1/p" "$log/scheduler")
		[ -n "$S" ] && break
		sleep 0.05
	done
	ok=false
	if [ -n "$S" ]; then
		b1=$(((S + 1) % 4)) b2=$(((S + 2) % 4)) b3=$(((S + 3) % 4))
		sleep 0.3
		kill -KILL "$(pgrep -P "$(cat "$log/pid.server$b1")")"
		for _ in $(seq 400); do
			grep -q "copies its async keys to server $b2" "$log/server$S" && break
			sleep 0.005
		done
		kill -KILL "$(pgrep -P "$(cat "$log/pid.server$b2")")"
		for _ in $(seq 200); do
			grep -q "copies its async keys to server $b3" "$log/server$S" && break
			sleep 0.05
		done
		sleep 0.3
		kill -KILL "$(pgrep -P "$(cat "$log/pid.server$S")")"
		ok=true
	fi
	for p in $wpids; do wait "$p" || ok=false; done
	kill_scheduler
	wait
	finished=$(cat "$log"/worker* | grep -c "async 900 steps ok")
	took=$(grep -c "taken over from server ${S:-?}'s copy" "$log/server${b3:-0}")
	export UNISUM_NUM_SERVER=3
	unset CHAOS_COUNT
	[ "$finished" -eq 3 ] && [ "$took" -ge 1 ] || ok=false
	$ok || { tail -n 3 "$log"/worker* "$log/server$S"; }
	expect "a backup lost while it catches up: the next one takes the copy; then its server lost (the key on server ${S:-?}, backups tried ${b1:-?}, ${b2:-?}, ${b3:-?}); $finished workers finished exact" "$ok"
	rm -rf "$log"
fi

# A primary's link to its backup cut while both live (a network's blip:
# UNISUM_TEST_CUT_BACKUP_MS, every server's first link): each primary
# dials the next server and copies everything there; each backup that
# lost its link drops that primary's copies once UNISUM_TIMEOUT_MS and a
# margin pass with no failover of it (they are stale from then on: a
# later declaration of one of those keys there must not take one).
if [ "${UNISUM_TEST_LIGHT:-0}" != 1 ]; then
	log=$(mktemp -d)
	export UNISUM_TIMEOUT_MS=1000
	SERVER_LOG_LEVEL=INFO
	UNISUM_TEST_CUT_BACKUP_MS=300 start_job 60 "$CHAOS" held 1100
	SERVER_LOG_LEVEL=WARNING
	ok=true
	for p in $wpids; do wait "$p" || ok=false; done
	kill_scheduler
	wait
	unset UNISUM_TEST_CUT_BACKUP_MS
	finished=$(cat "$log"/worker* | grep -c "held 1100 steps ok")
	cuts=$(cat "$log"/server* | grep -c "UNISUM_TEST_CUT_BACKUP_MS: server .* cuts its link")
	drops=$(cat "$log"/server* | grep -c "dropped the [1-9][0-9]* copies of server .*it was not failed over")
	[ "$finished" -eq 3 ] && [ "$cuts" -eq 3 ] && [ "$drops" -eq 3 ] || {
		ok=false
		grep -h "cuts its link\|dropped the\|lost its backup" "$log"/server* | sed 's/^/    /'
	}
	expect "a primary's link to its backup cut while both live ($cuts of 3): each backup drops the stale copies ($drops of 3); $finished workers finished exact" "$ok"
	export UNISUM_TIMEOUT_MS=3000
	rm -rf "$log"
fi

# A backup that hangs (SIGSTOP: alive, its links open, silent): the
# scheduler fails it over after UNISUM_TIMEOUT_MS and tells the servers
# too, so its primary cuts the link and copies to the next (else every
# reply waiting for the hung backup would wait with it); exact.
log=$(mktemp -d)
export UNISUM_TIMEOUT_MS=1000
SERVER_LOG_LEVEL=INFO
steps=450	# about 2 s; under the sanitizers (about 20 ms a step) 200
[ "${UNISUM_TEST_LIGHT:-0}" = 1 ] && steps=200
start_job 60 "$CHAOS" held $steps
SERVER_LOG_LEVEL=WARNING
sleep 0.4
stopped=$(pgrep -P "$(cat "$log/pid.server1")")
kill -STOP "$stopped"
ok=true
for p in $wpids; do wait "$p" || ok=false; done
kill -KILL "$stopped"
kill -CONT "$stopped"
kill_scheduler
wait
finished=$(cat "$log"/worker* | grep -c "held $steps steps ok")
cut=$(grep -c "server 0 lost its backup, server 1" "$log/server0")
[ "$finished" -eq 3 ] && [ "$cut" -ge 1 ] || { ok=false; tail -n 3 "$log"/worker* "$log/server0"; }
expect "a hung backup (SIGSTOP) is cut off by its primary once failed over; $finished workers finished exact" "$ok"
export UNISUM_TIMEOUT_MS=3000
rm -rf "$log"

# A scheduler that does not come back: every node fails naming it (here
# after 1.5 s).
log=$(mktemp -d)
export UNISUM_TIMEOUT_MS=1500
start_job 60 "$CHECK" rounds 1000000
sleep 0.3
kill_scheduler
t0=$(date +%s%N)
wait
ms=$(ms_since "$t0")
named=0
for f in "$log"/server* "$log"/worker*; do
	grep -q "lost the scheduler at 127.0.0.1:$UNISUM_SCHEDULER_PORT (connection closed) and it did not come back within 1500 ms" "$f" &&
		named=$((named + 1))
done
expect "a scheduler that never comes back: all 6 nodes fail naming it ($named did) within $ms ms (limit 4500)" \
	sh -c "[ $named -eq 6 ] && [ $ms -le 4500 ]"
export UNISUM_TIMEOUT_MS=3000
rm -rf "$log"

# `unisum launch --scheduler` runs the scheduler role and starts it again
# when it dies; a node of the job (`launch --nproc-per-node 2
# --no-scheduler`: 2 workers and a server) goes on through both kills.
# (Not in the sanitizer runs: the launcher is no library code.)
if [ "${UNISUM_TEST_LIGHT:-0}" != 1 ]; then
	log=$(mktemp -d)
	port=$(free_port)
	UNISUM_LOG_LEVEL=INFO UNISUM_SCHEDULER_PORT=$port UNISUM_NUM_WORKER=1 UNISUM_NUM_SERVER=1 \
		timeout 90 "$UNISUM" launch --scheduler >"$log/sched" 2>&1 &
	lpid=$!
	timeout 90 "$UNISUM" launch --nproc-per-node 2 --nnodes 1 --node-rank 0 --master-addr 127.0.0.1 \
		--master-port "$port" --no-scheduler --no-secret -- "$CHECK" failover "$NODE_ROUNDS" \
		>"$log/node" 2>&1 &
	npid=$!
	for _ in $(seq 200); do
		grep -q "workers on 1 machines registered" "$log/sched" && break
		sleep 0.05
	done
	ok=true
	for kill in 1 2; do
		sleep 0.3
		kill -0 "$npid" 2>/dev/null || { echo "  the job ended before kill $kill"; break; }
		spid=
		for _ in $(seq 100); do
			cpid=$(pgrep -P "$lpid" | head -n 1)
			spid=${cpid:+$(pgrep -P "$cpid" | head -n 1)}
			[ -n "$spid" ] && break
			sleep 0.02
		done
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
	finished=$(grep -c "$NODE_ROUNDS failover rounds ok" "$log/node")
	[ "$restarts" -eq 2 ] && [ "$finished" -eq 2 ] || ok=false
	$ok || { echo "  the node's log ends:"; tail -n 5 "$log/node" | sed 's/^/    /'; }
	expect "launch --scheduler restarted its scheduler $restarts times; the node's 2 workers finished ($finished), exact" "$ok"
	rm -rf "$log"
fi

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
