# Integration, elastic jobs (UNISUM_ELASTIC=1, `unisum launch --elastic`):
# a lost worker re-forms the job at its new size instead of failing it,
# and workers that start while it runs join it.
# - jobs of 4 workers and 2 servers started by hand (elastic_sums: every
#   element of every sum checked against the size of its generation): one
#   worker SIGKILLs itself at a step derived from the run, a fifth starts a
#   moment later; every survivor and the newcomer finish every step, the
#   scheduler re-formed at 3 and then at 4 workers, and the newcomer's rank
#   is in the log;
# - a loss that leaves fewer workers than UNISUM_ELASTIC_MIN_WORKERS fails
#   the job, and every survivor's error says why;
# - the digits CNN under `unisum launch --elastic --min-workers 2` (4
#   workers): one worker is killed mid-epoch and training finishes on 3
#   with an accuracy within 1 point of an uninterrupted run (both runs are
#   deterministic: lock-step sums in rank order, a rollback to the commit
#   of the step the loss is at); then the same with the discovery script
#   offering 4 slots: the launcher starts a fifth process in the dead one's
#   slot, which joins, and every final rank holds the same parameters;
# - across emulated hosts (network namespaces with sshd, as test_ssh.sh):
#   the launcher on host 0 runs 2 workers, the discovery script offers
#   host 1 a slot and later host 2 one, which the launcher fills over ssh;
#   the job grows to 3 and 4 workers; host 1's worker is killed (the job
#   goes on, and the launcher starts another there: 4 again); then the
#   script drops host 1, whose worker the launcher stops; the 3 left
#   finish every step with every sum exact; nothing is left running on
#   any host.
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
	sleep 1.5
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
unset UNISUM_NUM_WORKER UNISUM_NUM_SERVER UNISUM_SCHEDULER_PORT UNISUM_ELASTIC ELASTIC_STEP_MS
# The launcher's jobs run with the defaults users get: the short timeouts
# above would call a server starved while four interpreters import torch
# on two cores hung (seen in make test).
unset UNISUM_HEARTBEAT_MS UNISUM_TIMEOUT_MS UNISUM_START_TIMEOUT_MS UNISUM_PARTITION_BYTES

if [ "${UNISUM_TEST_LIGHT:-0}" = 1 ]; then
	# The sanitizers look at the C library, which the jobs above ran.
	echo "(the PyTorch digits part runs in the plain build, not under the sanitizers)"
	finish
fi

# PyTorch: the digits CNN, uninterrupted and then losing a worker.
export UNISUM_LIBRARY="$BUILD/libunisum.so"
TRAIN="$REPO/examples/train_digits_elastic.py"
hosts=$(mktemp)
printf '#!/bin/sh\necho localhost:4\n' >"$hosts"
chmod +x "$hosts"
check_job "digits, 4 elastic workers, uninterrupted" "$UNISUM" launch -w 4 -s 2 --elastic \
	--min-workers 2 -- /usr/bin/python3 "$TRAIN" --epochs 10
base=$(printf '%s\n' "$LAST" | sed -n 's/.*final held-out accuracy: //p')
check_job "digits, 4 elastic workers, one killed at step 20: finishes on 3" \
	"$UNISUM" launch -w 4 -s 2 --elastic --min-workers 2 -- /usr/bin/python3 "$TRAIN" \
	--epochs 10 --die-at 20 --die-rank 1
acc=$(printf '%s\n' "$LAST" | sed -n 's/.*final held-out accuracy: //p')
echo "     accuracy: uninterrupted ${base:-?}, losing a worker ${acc:-?}"
expect "  ... the accuracy is within 1 point of the uninterrupted run" \
	awk -v a="${acc:-0}" -v b="${base:-1}" 'BEGIN { d = a - b; exit !(d < 0.01 && d > -0.01) }'
expect "  ... the launcher went on without the killed worker" \
	contains "$LAST" "killed by signal 9 .*the elastic job goes on without it"
expect "  ... on 3 workers, each with the same parameters" \
	[ "$(printf '%s\n' "$LAST" | sed -n 's/.* of 3 (started as [0-9]*): parameters //p' |
	     sort | uniq -c | awk '{ print $1 }')" = 3 ]
# prefixed_by_rank OUT : every "rank R of N" line of OUT carries "[worker R]"
# (workers started as 2 and 3 are ranks 1 and 2 after the re-form).
prefixed_by_rank() {
	lines=$(printf '%s\n' "$1" | grep -E '^\[worker [0-9]+\] rank [0-9]+ of [0-9]+ \(started as')
	[ -n "$lines" ] && ! printf '%s\n' "$lines" |
		grep -Ev '^\[worker ([0-9]+)\] rank \1 of' >/dev/null
}
expect "  ... each rank's output carries its rank after the re-form ([worker R])" \
	prefixed_by_rank "$LAST"
check_job "digits, 4 elastic workers, one killed at step 20, a fifth process joins" \
	"$UNISUM" launch -w 4 -s 2 --elastic --min-workers 2 --max-workers 4 \
	--host-discovery-script "$hosts" -- /usr/bin/python3 "$TRAIN" --epochs 12 --die-at 20 \
	--die-rank 1 --step-ms 40
rm -f "$hosts"
expect "  ... and started a fifth process, which joined" \
	contains "$LAST" "started worker 4 \(pid [0-9]+\); it joins"
expect "  ... every rank's output carries its rank ([worker R])" prefixed_by_rank "$LAST"
expect "  ... the job re-formed at 3, then at 4 workers" \
	contains "$LAST" "re-formed \(generation 2\) with 4 workers"
digests=$(printf '%s\n' "$LAST" | sed -n 's/.* of 4 (started as [0-9]*): parameters //p' | sort -u)
expect "  ... every final rank holds the same parameters ($(printf '%s\n' "$LAST" |
	grep -c 'of 4 (started as') ranks, digests: $(echo $digests))" \
	[ "$(printf '%s\n' "$digests" | grep -c .)" -eq 1 ]

# Across hosts: the discovery script's other hosts get workers over ssh.
P="uel$$"
keys=$(mktemp -d)
flag=$(mktemp -u)
HOSTS_CLEANUP='sh "$CLUSTER/sshd.sh" down "$keys"; rm -rf "$keys" "$flag" "$flag.gone" "$hosts"'
hosts_up "$P" 3 1gbit
A0=$(sh "$NETNS" addr "$P" 0)
A1=$(sh "$NETNS" addr "$P" 1)
A2=$(sh "$NETNS" addr "$P" 2)
expect "sshd runs and answers on every host" sh "$CLUSTER/sshd.sh" up "$P" 3 "$keys"
SSH_ARGS=$(sh "$CLUSTER/sshd.sh" args "$keys")
hosts=$(mktemp)
# Host 1 until $flag.gone (it is lost), host 2 from $flag on.
printf '#!/bin/sh\necho %s:2\n[ -e %s.gone ] || echo %s:1\n[ -e %s ] && echo %s:1\nexit 0\n' \
	"$A0" "$flag" "$A1" "$flag" "$A2" >"$hosts"
chmod +x "$hosts"
out=$(mktemp)
UNISUM_NODE_HOST=$A0 sh "$NETNS" exec "$P" 0 timeout 120 "$UNISUM" launch -w 2 -s 1 --elastic \
	--min-workers 2 --max-workers 4 --host-discovery-script "$hosts" --ssh-args "$SSH_ARGS" -- \
	"$ELASTIC" 1000 10 >"$out" 2>&1 &
launcher=$!
# Host 1's worker joins first; then host 2's; then host 1's is killed and
# replaced; then host 1 is dropped.
await() { # REGEX : waits up to 15 s for the launcher's output to match
	for _ in $(seq 150); do
		grep -Eq "$1" "$out" && return 0
		sleep 0.1
	done
	return 1
}
await "re-formed \(generation [0-9]*\) with 3 workers"
touch "$flag"
await "re-formed \(generation [0-9]*\) with 4 workers"
victim=
for pid in $(ip netns pids "$P-h1" 2>/dev/null); do
	[ "$(cat "/proc/$pid/comm" 2>/dev/null)" = elastic_sums ] && victim=$pid
done
[ -n "$victim" ] && kill -KILL "$victim"
await "was lost .*; 3 workers go on"
await "re-formed \(generation [4-9]\) with 4 workers"
touch "$flag.gone"
wait "$launcher"
rc=$?
LAST=$(cat "$out")
expect "hosts: the elastic job over ssh ends well (launcher exit $rc)" [ $rc -eq 0 ]
expect "  ... host 1's worker joined (3 workers)" contains "$LAST" "with 3 workers"
expect "  ... then host 2's (4 workers)" contains "$LAST" "with 4 workers"
expect "  ... host 1's worker was killed (pid ${victim:-none}) and the job went on" \
	contains "$LAST" "worker [0-9]+ \($A1\) .*the elastic job goes on without it"
expect "  ... the launcher started another there, and the job grew back to 4" \
	contains "$LAST" "re-formed \(generation [4-9]\) with 4 workers"
expect "  ... then stopped it when the script dropped host 1" \
	contains "$LAST" "offers 0 slot\(s\) on $A1: stopping worker"
expect "  ... the 3 left finished every step, sums exact (2 here, host 2's)" \
	[ "$(printf '%s\n' "$LAST" | grep -c 'done: 1000 steps, rank [0-2] of 3')" -eq 3 ]
expect "  ... host 2's among them" contains "$LAST" "\($A2\)\] .*done: 1000 steps"
left=0
for i in 0 1 2; do
	for pid in $(ip netns pids "$P-h$i" 2>/dev/null); do
		case $(cat "/proc/$pid/comm" 2>/dev/null) in
		unisum | elastic_sums | ssh) left=$((left + 1)) ;;
		esac
	done
done
expect "  ... no process of the job is left on any host ($left)" [ $left -eq 0 ]
[ "$FAILS" -eq 0 ] || sed 's/^/    /' "$out"
rm -f "$out"
finish
