# Integration: a job of several nodes, each started on its own host the
# way torchrun and Kubernetes start one: `unisum launch --nproc-per-node 2`
# per host, told only the job's shape (issue 21).  Four hosts are network
# namespaces on a bridge (bench/cluster/netns.sh); node 0 runs the
# scheduler inside its launcher, every node a colocated server and two
# workers, and every byte between nodes crosses a veth link over TCP.
#
#   - torchrun's options (--nnodes, --node-rank, --master-addr,
#     --master-port, --cpu-servers 1 with `unisum server` on host 3):
#     every worker checks every element of every sum, and the placement
#     has a colocated server at each node's address and the CPU-only one;
#   - Kubernetes' PyTorchJob contract: the same from MASTER_ADDR,
#     MASTER_PORT, WORLD_SIZE and RANK alone;
#   - a worker killed on node 1: every node's launcher fails naming it,
#     and no process is left in any namespace;
#   - a node without the job's secret, or whose master never comes,
#     fails naming what to set or where it could not connect.
#
# Needs root (network namespaces): otherwise it is reported as skipped.
# UNISUM_TEST_LIGHT=1 (the sanitizer runs) keeps the first job and the
# errors.
. "$(dirname "$0")/lib.sh"

P="und$$"
hosts_up "$P" 4 1gbit
MASTER=$(sh "$NETNS" addr "$P" 0)
CPU_HOST=$(sh "$NETNS" addr "$P" 3)
export UNISUM_SECRET=nodes-share-this-secret-$$

# nodes NAME HOW MODE ARGS... : starts node i = 2, 1, 0 in host i (the
# master last, so the others wait for it), each `unisum launch
# --nproc-per-node 2` of check_sums MODE ARGS, told the job by HOW: "opts"
# (torchrun's options) or "env" (PyTorchJob's variables); waits for all.
# Node i's output in $log/node<i>, its status in $log/rc<i>.  "cpu" is
# "opts" with a CPU-only server on host 3 (`unisum server`, --cpu-servers
# 1), its output in $log/cpu, its status in $log/rc3.
nodes() {
	name=$1 how=$2
	shift 2
	port=$(free_port)
	cpu_opt=
	if [ "$how" = cpu ]; then
		sh "$NETNS" exec "$P" 3 env UNISUM_ROLE=server UNISUM_SCHEDULER_HOST="$MASTER" \
			UNISUM_SCHEDULER_PORT="$port" UNISUM_NUM_WORKER=3 UNISUM_NUM_SERVER=4 \
			UNISUM_NODE_HOST="$CPU_HOST" timeout 120 "$UNISUM" server >"$log/cpu" 2>&1 &
		cpu_pid=$!
		cpu_opt="--cpu-servers 1"
	fi
	for i in 2 1 0; do
		if [ "$how" != env ]; then
			# shellcheck disable=SC2086
			sh "$NETNS" exec "$P" "$i" timeout 120 "$UNISUM" launch --nproc-per-node 2 \
				--nnodes 3 --node-rank "$i" --master-addr "$MASTER" --master-port "$port" \
				$cpu_opt -- "$CHECK" "$@" >"$log/node$i" 2>&1 &
		else
			sh "$NETNS" exec "$P" "$i" env MASTER_ADDR="$MASTER" MASTER_PORT="$port" \
				WORLD_SIZE=3 RANK="$i" timeout 120 "$UNISUM" launch --nproc-per-node 2 \
				-- "$CHECK" "$@" >"$log/node$i" 2>&1 &
		fi
		eval "pid$i=\$!"
	done
	for i in 0 1 2; do
		eval "wait \$pid$i"
		echo $? >"$log/rc$i"
	done
	if [ "$how" = cpu ]; then
		wait "$cpu_pid"
		echo $? >"$log/rc3"
	fi
}

# left_in_hosts : how many processes remain in the hosts' namespaces.
left_in_hosts() {
	n=0
	for i in 0 1 2 3; do
		n=$((n + $(ip netns pids "$P-h$i" 2>/dev/null | wc -l)))
	done
	echo "$n"
}

# all_exited_0 : every node's launcher exited 0.
all_exited_0() {
	for i in 0 1 2; do
		[ "$(cat "$log/rc$i")" -eq 0 ] || return 1
	done
}

# rounds_checked : ... and all 6 workers checked 100 rounds exactly.
rounds_checked() {
	all_exited_0 && [ "$(cat "$log"/node* | grep -c '100 rounds ok')" -eq 6 ]
}

# sums_checked : ... and all 6 workers report the same digest of exact
# sums.
sums_checked() {
	all_exited_0 && [ "$(cat "$log"/node* | grep -c 'sums ok')" -eq 6 ] &&
		[ "$(cat "$log"/node* | sed -n 's/.*sums ok, digest //p' | sort -u | wc -l)" -eq 1 ]
}

# cpu_sums_checked : sums_checked (30 rounds in the sanitizer runs), and
# the CPU-only server exited 0.
cpu_sums_checked() {
	[ "$(cat "$log/rc3")" -eq 0 ] || return 1
	if [ "${UNISUM_TEST_LIGHT:-0}" = 1 ]; then
		all_exited_0 && [ "$(cat "$log"/node* | grep -c '30 rounds ok')" -eq 6 ]
	else
		sums_checked
	fi
}

log=$(mktemp -d)
t0=$(date +%s%N)
export UNISUM_LOG_LEVEL=INFO	# the scheduler's placement lines
# The sanitizer runs look for memory and thread errors in the launcher:
# 30 checked rounds do, the dtype matrix would cost a minute under TSan.
if [ "${UNISUM_TEST_LIGHT:-0}" = 1 ]; then
	nodes "torchrun options" cpu rounds 30
else
	nodes "torchrun options" cpu sums
fi
unset UNISUM_LOG_LEVEL
expect "torchrun's options: 3 nodes of 2 workers and a server each, and a CPU-only server, every sum exact on all 6 workers [$(ms_since "$t0") ms]" \
	cpu_sums_checked
expect "... node 0 ran the scheduler at the master's address" grep -q "node 0 of 3: .* and the scheduler, scheduler at $MASTER:" "$log/node0"
expect "... and placed a colocated server on each node's host, at its own address, and the CPU-only one" \
	sh -c "grep -q 'server 0 at $MASTER, colocated' '$log/node0' &&
	       grep -q 'server 1 at $(sh "$NETNS" addr "$P" 1), colocated' '$log/node0' &&
	       grep -q 'server 2 at $(sh "$NETNS" addr "$P" 2), colocated' '$log/node0' &&
	       grep -q 'server 3 at $CPU_HOST, CPU-only' '$log/node0'"
expect "... and nothing is left running on any host" [ "$(left_in_hosts)" -eq 0 ]
drop_logs "$log"

if [ "${UNISUM_TEST_LIGHT:-0}" != 1 ]; then
	log=$(mktemp -d)
	t0=$(date +%s%N)
	nodes "PyTorchJob" env rounds 100
	expect "Kubernetes PyTorchJob's variables alone (MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK): 100 rounds exact [$(ms_since "$t0") ms]" \
		rounds_checked
	expect "... and the workers got their own RANK and WORLD_SIZE (6), not the pods'" \
		sh -c "grep -q 'rank 5: 100 rounds ok' '$log/node2'"
	drop_logs "$log"

	# Worker 3 (node 1, local rank 1) kills itself after 30 rounds.
	log=$(mktemp -d)
	start=$(date +%s)
	nodes "a worker killed" opts die 3 30
	elapsed=$(($(date +%s) - start))
	expect "a worker killed on node 1: its launcher exits with its status (137)" [ "$(cat "$log/rc1")" -eq 137 ]
	expect "... the other nodes' launchers fail too" sh -c "[ \$(cat '$log/rc0') -ne 0 ] && [ \$(cat '$log/rc2') -ne 0 ]"
	expect "... and their output names worker 3" sh -c "grep -q 'worker 3' '$log/node0' && grep -q 'worker 3' '$log/node2'"
	expect "... within 20 s, leaving no process on any host" sh -c "[ $elapsed -le 20 ] && [ $(left_in_hosts) -eq 0 ]"
	drop_logs "$log"
fi

# No secret: refused before anything starts, naming what to set.
out=$(env -u UNISUM_SECRET "$UNISUM" launch --nproc-per-node 1 --nnodes 2 --node-rank 1 \
	--master-addr 127.0.0.1 -- true 2>&1)
rc=$?
expect "a node without the job's secret exits 2, naming UNISUM_SECRET and --no-secret" \
	sh -c "[ $rc -eq 2 ] && printf '%s' \"\$1\" | grep -q 'UNISUM_SECRET.*--no-secret'" _ "$out"

# A master that never comes: the node's workers give up after
# UNISUM_TIMEOUT_MS, naming the address they could not reach.
port=$(free_port)
out=$(sh "$NETNS" exec "$P" 1 env UNISUM_TIMEOUT_MS=1500 timeout 60 "$UNISUM" launch \
	--nproc-per-node 1 --nnodes 2 --node-rank 1 --master-addr "$MASTER" --master-port "$port" \
	-- "$CHECK" sums 2>&1)
rc=$?
expect "a node whose master never comes fails, naming $MASTER:$port" \
	sh -c "[ $rc -ne 0 ] && [ $rc -ne 124 ] && printf '%s' \"\$1\" | grep -q 'cannot connect to $MASTER:$port'" _ "$out"
expect "... and leaves no process behind" [ "$(left_in_hosts)" -eq 0 ]
finish
