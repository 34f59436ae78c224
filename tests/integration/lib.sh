# Shared helpers of the integration tests (sourced; $1 of the test is the
# build directory).  Every job runs with a hard timeout, so no test hangs.
set -u
BUILD=$(cd "$1" && pwd)
UNISUM="$BUILD/unisum"
CHECK="$BUILD/check_sums"
FAILS=0
PASSES=0
SKIPS=0

# ms_since T0 : milliseconds since T0 (a `date +%s%N`), to show what a
# job cost beside its name.
ms_since() {
	echo $((($(date +%s%N) - $1) / 1000000))
}

# check_job NAME CMD... : runs the job CMD under a hard timeout and counts
# it; prints its output when it fails.  LAST holds its output afterwards.
check_job() {
	name=$1
	shift
	out=$(mktemp)
	t0=$(date +%s%N)
	if timeout 300 "$@" >"$out" 2>&1; then
		PASSES=$((PASSES + 1))
		echo "ok   $name [$(ms_since "$t0") ms]"
	else
		FAILS=$((FAILS + 1))
		echo "FAIL $name, output:"
		sed 's/^/    /' "$out"
	fi
	LAST=$(cat "$out")
	rm -f "$out"
}

# run_job NAME WORKERS SERVERS ARGS... : runs check_sums ARGS as a job.
run_job() {
	name=$1 w=$2 s=$3
	shift 3
	check_job "$name (w=$w s=$s: $*)" "$UNISUM" launch -w "$w" -s "$s" --local-size 1 -- \
		"$CHECK" "$@"
}

# run_by_hand LOGDIR WORKERS SERVERS WHO WRAP... : a job of WORKERS
# check_sums workers (`sums`, or $HAND_MODE) and SERVERS servers started one by one, not
# by a launcher, each under a 60 s timeout, their logs in LOGDIR
# (scheduler, server0, worker0, ...); WHO (server0, worker1, ...) runs
# under WRAP, a command that ends by exec'ing the arguments it is given.
# The caller exports UNISUM_SCHEDULER_HOST and any limits.
run_by_hand() {
	log=$1 nw=$2 ns=$3 who=$4
	shift 4
	export UNISUM_NUM_WORKER=$nw UNISUM_NUM_SERVER=$ns UNISUM_SCHEDULER_PORT=$(free_port)
	UNISUM_ROLE=scheduler timeout 60 "$UNISUM" scheduler >"$log/scheduler" 2>&1 &
	for r in $(seq 0 $((nw + ns - 1))); do
		role=server rank=$r
		[ "$r" -ge "$ns" ] && role=worker rank=$((r - ns))
		if [ "$role$rank" = "$who" ]; then
			run_wrapped "$role" "$rank" "$@" >"$log/$role$rank" 2>&1 &
		else
			run_wrapped "$role" "$rank" >"$log/$role$rank" 2>&1 &
		fi
	done
	wait
}

# run_wrapped ROLE RANK [WRAP...] : run_by_hand's one process.
run_wrapped() {
	role=$1 rank=$2
	shift 2
	if [ "$role" = server ]; then
		UNISUM_ROLE=server UNISUM_SERVER_ID=$rank "$@" timeout 60 "$UNISUM" server
	else
		UNISUM_ROLE=worker UNISUM_WORKER_ID=$rank "$@" timeout 60 "$CHECK" ${HAND_MODE:-sums}
	fi
}

# named_everywhere LOGDIR WHO REGEX : every log in LOGDIR names WHO
# (server0, worker1, ...) as "server 0 (pid N) " followed by REGEX (an
# extended regular expression); prints the logs that do not.
named_everywhere() {
	role=${2%%[0-9]*} rank=${2#"$role"} ok=0
	for f in "$1"/*; do
		if ! grep -Eq "$role $rank \(pid [0-9]+\) $3" "$f"; then
			echo "  $(basename "$f") does not name $2's failure:"
			sed 's/^/    /' "$f" | tail -n 5
			ok=1
		fi
	done
	return $ok
}

# expect NAME CONDITION-COMMAND... : counts a named assertion.
expect() {
	name=$1
	shift
	if "$@"; then
		PASSES=$((PASSES + 1))
		echo "ok   $name"
	else
		FAILS=$((FAILS + 1))
		echo "FAIL $name"
	fi
}

# contains TEXT REGEX : whether TEXT has a line matching the extended REGEX
# (for `expect NAME contains "$out" REGEX`; safe for any quotes in TEXT).
contains() {
	printf '%s\n' "$1" | grep -E -q -- "$2"
}

# drop_logs DIR : prints every log in DIR when an assertion has failed so
# far, then removes DIR.
drop_logs() {
	if [ "$FAILS" -ne 0 ]; then
		for f in "$1"/*; do
			[ -f "$f" ] || continue
			echo "--- $f"
			cat "$f"
		done
	fi
	rm -rf "$1"
}

# skip REASON : a part of the test that cannot run here, and why.  The
# test then ends as Skipped (exit 77, ctest's SKIP_RETURN_CODE), never as
# passed.  As root (CI) everything can run, so there a skip is a failure.
skip() {
	if [ "$(id -u)" = 0 ]; then
		FAILS=$((FAILS + 1))
		echo "FAIL as root nothing may be skipped, yet: $1"
	else
		SKIPS=$((SKIPS + 1))
		echo "SKIPPED $1"
	fi
}

# finish : prints the closing line and exits with the verdict: 1 when an
# assertion failed, else 77 when something was skipped, else 0.
finish() {
	echo "$PASSES passed, $FAILS failed, $SKIPS skipped"
	[ "$FAILS" -eq 0 ] || exit 1
	[ "$SKIPS" -eq 0 ] || exit 77
	exit 0
}

# cgroup_root CONTROLLER : the folder of a cgroup controller (pids,
# memory), cgroup v1 or v2, or nothing.
cgroup_root() {
	if [ -f "/sys/fs/cgroup/$1/cgroup.procs" ]; then
		echo "/sys/fs/cgroup/$1"
	elif grep -qw "$1" /sys/fs/cgroup/cgroup.controllers 2>/dev/null; then
		echo /sys/fs/cgroup
	elif grep -qw "$1" /sys/fs/cgroup/unified/cgroup.controllers 2>/dev/null; then
		echo /sys/fs/cgroup/unified
	fi
}

# new_cgroup CONTROLLER : a cgroup of CONTROLLER for this test in $CG,
# removed at exit; without root or the controller the test skips (a
# failure as root) and finishes.
new_cgroup() {
	cg_root=$(cgroup_root "$1")
	if [ "$(id -u)" != 0 ] || [ -z "$cg_root" ]; then
		skip "a $1 cgroup is needed (root: $(id -un), $1 controller: ${cg_root:-none})"
		finish
	fi
	CG="$cg_root/unisum-test-$$"
	if ! mkdir "$CG" 2>/dev/null; then
		FAILS=$((FAILS + 1))
		echo "FAIL cannot make the cgroup $CG"
		finish
	fi
	trap 'rmdir "$CG" 2>/dev/null' EXIT
}

# stranger_job LOG MODE [HOOK]: a job of a scheduler, a server on a known
# port and 2 workers, started by hand as on a cluster, each worker running
# `check_sums MODE PORT` (strangers sent to the server's port before its
# rounds: garbage, auth); HOOK, when given, runs once the server started.
# Logs in LOG; exit codes in rc0, rc1 (workers), rcs (server), rcp
# (scheduler).
stranger_job() {
	sport=$(free_port)
	UNISUM_NUM_WORKER=2 UNISUM_NUM_SERVER=1 UNISUM_SCHEDULER_HOST=127.0.0.1
	UNISUM_SCHEDULER_PORT=$(free_port)
	export UNISUM_NUM_WORKER UNISUM_NUM_SERVER UNISUM_SCHEDULER_HOST UNISUM_SCHEDULER_PORT
	UNISUM_ROLE=scheduler timeout 120 "$UNISUM" scheduler >"$1/scheduler" 2>&1 &
	sched=$!
	UNISUM_ROLE=server UNISUM_PORT=$sport timeout 120 "$UNISUM" server >"$1/server" 2>&1 &
	server=$!
	[ -z "${3:-}" ] || "$3"
	UNISUM_ROLE=worker UNISUM_WORKER_ID=0 timeout 120 "$CHECK" "$2" "$sport" >"$1/w0" 2>&1 &
	w0=$!
	UNISUM_ROLE=worker UNISUM_WORKER_ID=1 timeout 120 "$CHECK" "$2" "$sport" >"$1/w1" 2>&1
	rc1=$?
	wait $w0
	rc0=$?
	wait $server
	rcs=$?
	wait $sched
	rcp=$?
	unset UNISUM_NUM_WORKER UNISUM_NUM_SERVER UNISUM_SCHEDULER_HOST UNISUM_SCHEDULER_PORT
}

# free_port : a TCP port nobody listens on right now.
free_port() {
	"$BUILD/check_sums" free-port
}

# wait_watching_secret PID SECRET : waits for background job PID, looking
# at every process's command line meanwhile (5 times a second); sets SEEN
# to how many looks found SECRET there, and RC to the job's status.
wait_watching_secret() {
	SEEN=0
	while kill -0 "$1" 2>/dev/null; do
		ps -eo args | grep -v grep | grep -q -- "$2" && SEEN=$((SEEN + 1))
		sleep 0.2
	done
	wait "$1"
	RC=$?
}

# hosts_up PREFIX H RATE : H emulated hosts PREFIX-h0 .. (network
# namespaces on a bridge, links at RATE: bench/cluster/netns.sh), removed
# when the test exits, after running the commands in HOSTS_CLEANUP if set.
# Without root the test is skipped; hosts that cannot be built fail it.
# Sets CLUSTER (bench/cluster) and NETNS (its netns.sh).
# cluster_job NAME WORKERS LOCAL ARGS... : check_sums ARGS on hosts 0 and 1
# of hosts_up's 3 (servers beside them) and a CPU-only server on host 2.
# LAUNCH_OPTS: more options of unisum launch.
cluster_job() {
	name=$1 w=$2 l=$3
	shift 3
	p=$HOSTS_PREFIX
	check_job "$name" env UNISUM_LOG_LEVEL=INFO "$UNISUM" launch -w "$w" -s 3 --local-size "$l" \
		--worker-netns "$p-h0,$p-h1" --server-netns "$p-h0,$p-h1,$p-h2" ${LAUNCH_OPTS:-} \
		-- "$CHECK" "$@"
}

hosts_up() {
	if [ "$(id -u)" != 0 ]; then
		skip "emulated hosts need root to make network namespaces (ran as $(id -un))"
		finish
	fi
	CLUSTER="$(cd "$(dirname "$0")/../.." && pwd)/bench/cluster"
	NETNS="$CLUSTER/netns.sh"
	HOSTS_PREFIX=$1
	trap 'eval "${HOSTS_CLEANUP:-}"; sh "$NETNS" down "$HOSTS_PREFIX" >/dev/null 2>&1' EXIT
	trap 'exit 130' INT TERM HUP
	if ! sh "$NETNS" up "$1" "$2" "$3" >/dev/null; then
		FAILS=$((FAILS + 1))
		echo "FAIL the emulated hosts could not be built (ip, tc and veth are needed)"
		finish
	fi
}
