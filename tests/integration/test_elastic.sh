# Integration, elastic jobs (UNISUM_ELASTIC=1) started by hand: a lost
# worker re-forms the job at its new size instead of failing it, and
# workers that start while it runs join it.  (The launcher's elastic jobs:
# test_elastic_digits.sh, with PyTorch, and test_elastic_hosts.sh, over
# ssh.)
# - jobs of 4 workers and 2 servers started by hand (elastic_sums: every
#   element of every sum checked against the size of its generation): one
#   worker SIGKILLs itself at a step derived from the run, a fifth starts a
#   moment later; every survivor and the newcomer finish every step, the
#   scheduler re-formed at 3 and then at 4 workers, and the newcomer's rank
#   is in the log;
# - a loss that leaves fewer workers than UNISUM_ELASTIC_MIN_WORKERS fails
#   the job, and every survivor's error says why.
. "$(dirname "$0")/lib.sh"

REPO=$(cd "$(dirname "$0")/../.." && pwd)
ELASTIC="$BUILD/elastic_sums"
RUNS=2
[ "${UNISUM_TEST_LIGHT:-0}" = 1 ] && RUNS=1
export UNISUM_SCHEDULER_HOST=127.0.0.1 UNISUM_HEARTBEAT_MS=200 UNISUM_TIMEOUT_MS=3000
export UNISUM_START_TIMEOUT_MS=10000 UNISUM_PARTITION_BYTES=16384 UNISUM_ELASTIC=1

# job LOGDIR WORKERS STEPS : a scheduler, 2 servers and WORKERS workers
# (worker$w.env holds each one's extra VAR=VALUE), each under a hard
# timeout; pids in LOGDIR/pid.*.
job() {
	export UNISUM_NUM_WORKER=$2 UNISUM_NUM_SERVER=2 UNISUM_SCHEDULER_PORT=$(free_port)
	UNISUM_ROLE=scheduler timeout 90 "$UNISUM" scheduler >"$1/scheduler" 2>&1 &
	echo $! >"$1/pid.scheduler"
	for s in 0 1; do
		UNISUM_ROLE=server timeout 90 "$UNISUM" server >"$1/server$s" 2>&1 &
		echo $! >"$1/pid.server$s"
	done
	for w in $(seq 0 $(($2 - 1))); do
		worker "$1" "$w" "$3"
	done
}

worker() {
	eval "extra=\${WORKER_ENV_$2:-ELASTIC_NONE=1}"
	env "$extra" UNISUM_ROLE=worker timeout 90 "$ELASTIC" "$3" >"$1/worker$2" 2>&1 &
	echo $! >"$1/pid.worker$2"
}

# exited LOGDIR NAME : NAME's exit status.
exited() {
	wait "$(cat "$1/pid.$2")"
}

export ELASTIC_STEP_MS=5
for run in $(seq "$RUNS"); do
	log=$(mktemp -d)
	die=$((30 + run * 17))
	export WORKER_ENV_3=ELASTIC_DIE_AT=$die
	job "$log" 4 400
	# The fifth starts once the loss happened (on a loaded machine, the
	# sanitizer runs, a fixed 1.5 s could come first): the job re-forms
	# at 3, then takes it in at 4.
	for _ in $(seq 300); do
		kill -0 "$(cat "$log/pid.worker3")" 2>/dev/null || break
		sleep 0.1
	done
	sleep 0.3
	worker "$log" 4 400
	good=true
	for p in worker0 worker1 worker2 worker4 server0 server1 scheduler; do
		exited "$log" $p || { echo "  $p exited $?"; tail -n 3 "$log/$p"; good=false; }
	done
	expect "elastic run $run: worker 3 lost at step $die, a fifth joined: every sum exact, all done" \
		$good
	expect "  ... every survivor finished all 400 steps" \
		[ "$(cat "$log"/worker[0124] | grep -c 'done: 400 steps')" -eq 4 ]
	expect "  ... the job re-formed at 3 workers after the loss" \
		grep -q "re-formed (generation 1) with 3 workers" "$log/scheduler"
	expect "  ... and at 4 with the newcomer" grep -Eq "re-formed .* with 4 workers .*\(new\)" \
		"$log/scheduler"
	expect "  ... the newcomer's rank is in its log" grep -Eq "rank [0-3] of 4" "$log/worker4"
	drop_logs "$log"
	unset WORKER_ENV_3
done

# Below the minimum: the job fails, saying why, on every survivor.
log=$(mktemp -d)
export WORKER_ENV_2=ELASTIC_DIE_AT=20 UNISUM_ELASTIC_MIN_WORKERS=3
job "$log" 3 200
for p in worker0 worker1; do
	exited "$log" $p
	expect "below --min-workers: $p fails, naming the minimum" \
		grep -q "fewer than the elastic job's minimum (UNISUM_ELASTIC_MIN_WORKERS=3)" "$log/$p"
done
exited "$log" scheduler
expect "  ... and the scheduler fails the job" [ $? -ne 0 ]
drop_logs "$log"
unset WORKER_ENV_2 UNISUM_ELASTIC_MIN_WORKERS
finish
