# Integration: a job inside a Slurm allocation, `unisum launch --slurm`
# (issue 21).  Three hosts are network namespaces on a bridge
# (bench/cluster/netns.sh) forming a real Slurm 22.05 cluster
# (bench/cluster/slurm.sh): a munged of its own, slurmctld on host 0 and a
# slurmd per host, nodes node0 .. node2.  The launcher runs once per job,
# under salloc or in an sbatch script, and starts one job step per node.
#
#   - salloc -N3 --ntasks-per-node=2 with --cpu-server-nodes 1: sums
#     checked on the 4 workers of node0 and node1 (2 per node, from
#     SLURM_NTASKS_PER_NODE), node2 a CPU-only server; the secret never
#     on a command line;
#   - --no-colocated-servers: node2's CPU-only server is the only one,
#     and --scheduler-host: node0 runs the scheduler;
#   - sbatch --wait: the PyTorch demo across the 3 nodes, with no UNISUM_*
#     variable set by hand;
#   - a worker killed on node1: the launcher exits with its status, names
#     node1, nothing of the job is left on any host;
#   - node1's srun lost mid-job: the job fails naming node1, nothing left;
#   - scancel of a running batch job: everything stops;
#   - --slurm outside an allocation is refused, naming SLURM_JOB_ID.
#
# Needs root (namespaces): otherwise it is reported as skipped.
# UNISUM_TEST_LIGHT=1 (the sanitizer runs) keeps the first job and the
# refusal.
. "$(dirname "$0")/lib.sh"

REPO=$(cd "$(dirname "$0")/../.." && pwd)
outside=$(env -u SLURM_JOB_ID "$UNISUM" launch --slurm -- "$CHECK" sums 2>&1)
expect "--slurm outside an allocation is refused, naming SLURM_JOB_ID (exit 2)" \
	sh -c "[ $? -eq 2 ] && printf '%s' \"\$1\" | grep -q 'SLURM_JOB_ID is not set'" - "$outside"

P="usl$$"
sdir=$(mktemp -d)
HOSTS_CLEANUP='sh "$CLUSTER/slurm.sh" down "$sdir"; rm -rf "$sdir"'
hosts_up "$P" 3 1gbit
for c in munged slurmctld slurmd srun salloc sbatch scancel sinfo nsenter; do
	if ! command -v "$c" >/dev/null; then
		FAILS=$((FAILS + 1))
		echo "FAIL $c is missing: scripts/install-deps.sh installs munge, slurmctld, slurmd and slurm-client"
		finish
	fi
done
if ! sh "$CLUSTER/slurm.sh" up "$P" 3 "$sdir"; then
	FAILS=$((FAILS + 1))
	echo "FAIL the Slurm cluster did not come up; its logs:"
	tail -n 20 "$sdir"/log/* 2>/dev/null | sed 's/^/    /'
	finish
fi
expect "munged, slurmctld and 3 slurmd form a cluster of 3 idle nodes" true
export SLURM_CONF="$sdir/slurm.conf"

# on_host0 CMD... : CMD in host 0's network namespace (nsenter: Slurm's
# commands need nothing else of it).
on_host0() {
	nsenter --net="/run/netns/$P-h0" "$@"
}

# job_left : how many processes of a job (launchers, servers, workers,
# srun clients, Python) remain on the hosts.
job_left() {
	n=0
	for i in 0 1 2; do
		for pid in $(ip netns pids "$P-h$i" 2>/dev/null); do
			case $(cat "/proc/$pid/comm" 2>/dev/null) in
			unisum | check_sums | srun | python3) n=$((n + 1)) ;;
			esac
		done
	done
	echo "$n"
}

# settle : waits up to 10 s for the hosts to have no process of a job
# (Slurm reaps a step's processes once its srun is gone), then prints how
# many are left.
settle() {
	n=0
	while [ "$(job_left)" -ne 0 ] && [ "$n" -lt 50 ]; do
		n=$((n + 1))
		sleep 0.2
	done
	job_left
}

log=$(mktemp -d)
secret="never-on-a-command-line-$$"
ROUNDS=100
[ "${UNISUM_TEST_LIGHT:-0}" = 1 ] && ROUNDS=20	# the sanitizer runs
t0=$(date +%s%N)
UNISUM_SECRET=$secret on_host0 timeout 120 salloc -N3 --ntasks-per-node=2 \
	"$UNISUM" launch --slurm --cpu-server-nodes 1 -- "$CHECK" rounds "$ROUNDS" >"$log/sums" 2>&1 &
wait_watching_secret $! "$secret"
seen=$SEEN rc=$RC
expect "salloc + --slurm: node0 and node1 with 2 workers and a server each, node2 a CPU-only server, $ROUNDS rounds exact on all 4 workers [$(ms_since "$t0") ms]" \
	sh -c "[ $rc -eq 0 ] && [ \$(grep -c '$ROUNDS rounds ok' '$log/sums') -eq 4 ]"
expect "... each node's lines carry its name" grep -q "^\[node1\] \[worker 3\] rank 3: $ROUNDS rounds ok" "$log/sums"
expect "... and node2 ran a CPU-only server of 2 nodes and 3 servers" \
	grep -q "^\[node2\] unisum launch: a CPU-only server of a job of 2 nodes and 3 servers" "$log/sums"
expect "... the secret never showed on a command line" [ "$seen" -eq 0 ]
expect "... and nothing of the job is left on any host" [ "$(settle)" -eq 0 ]
drop_logs "$log"

if [ "${UNISUM_TEST_LIGHT:-0}" != 1 ]; then
	# A parameter server: workers only on node0 and node1, node2's server
	# the job's one server.
	log=$(mktemp -d)
	# Each worker shows what it sees of Slurm: the job, not its step's
	# one task (SLURM_PROCID 0 of SLURM_NTASKS 1).
	on_host0 timeout 120 salloc -N3 --cpus-per-task=2 "$UNISUM" launch --slurm \
		--nproc-per-node 2 --cpu-server-nodes 1 --no-colocated-servers --scheduler-host -- \
		sh -c 'echo "sees job=${SLURM_JOB_ID:-none} procid=${SLURM_PROCID:-none} ntasks=${SLURM_NTASKS:-none} cpt=${SLURM_CPUS_PER_TASK:-none} rank=$RANK"; exec "$0" rounds 20' \
		"$CHECK" >"$log/ps" 2>&1
	rc=$?
	expect "--no-colocated-servers --scheduler-host: 4 workers on node0 and node1 sum through node2's server alone, exact; node0 runs the scheduler" \
		sh -c "[ $rc -eq 0 ] && [ \$(grep -c '20 rounds ok' '$log/ps') -eq 4 ] &&
		       grep -q '^\[node2\] unisum launch: a CPU-only server of a job of 2 nodes and 1 servers' '$log/ps' &&
		       grep -q '^\[node1\] unisum launch: node 1 of 2: 2 worker(s)' '$log/ps' &&
		       grep -q '^\[node0\] unisum launch: node 0 of 2: 2 worker(s) (ranks 0 to 1) and the scheduler' '$log/ps' &&
		       ! grep -q '\[server 1\]' '$log/ps'"
	expect "... every worker sees its job and its RANK, not the step's task identity nor the allocation's per-task sizes" \
		sh -c "[ \$(grep -c 'sees job=[0-9][0-9]* procid=none ntasks=none cpt=none rank=[0-3]\$' '$log/ps') -eq 4 ]"
	drop_logs "$log"

	# The PyTorch demo as a batch job, nothing set by hand.
	log=$(mktemp -d)
	cat >"$log/demo.sh" <<JOB
#!/bin/sh
#SBATCH --nodes=3
exec "$UNISUM" launch --slurm -- /usr/bin/python3 "$REPO/examples/train_digits.py" --epochs 1
JOB
	t0=$(date +%s%N)
	(cd "$log" && env $(env | sed -n 's/^\(UNISUM_[A-Z_]*\)=.*/-u \1/p') \
		nsenter --net="/run/netns/$P-h0" timeout 240 sbatch --wait -o "$log/demo.out" "$log/demo.sh" >/dev/null)
	rc=$?
	expect "sbatch --nodes=3 + --slurm: the PyTorch demo trains across the 3 nodes (no UNISUM_* set) [$(ms_since "$t0") ms]" \
		sh -c "[ $rc -eq 0 ] && grep -q '^\[node0\] \[worker 0\] final held-out accuracy' '$log/demo.out' && grep -q 'host(s) over srun' '$log/demo.out'"
	drop_logs "$log"

	# Worker 3 (node1, local rank 1) kills itself after 30 rounds.
	log=$(mktemp -d)
	start=$(date +%s)
	on_host0 timeout 120 salloc -N3 "$UNISUM" launch --slurm --nproc-per-node 2 -- \
		"$CHECK" die 3 30 >"$log/die" 2>&1
	rc=$?
	elapsed=$(($(date +%s) - start))
	expect "a worker killed on node1: the launcher exits with its status (137)" [ "$rc" -eq 137 ]
	expect "... names node1 and worker 3" sh -c "grep -q 'host 1 (node1).*137' '$log/die' && grep -q 'worker 3' '$log/die'"
	left=$(settle)
	expect "... within 20 s ($elapsed s), leaving nothing of the job on any host ($left left)" \
		sh -c "[ $elapsed -le 20 ] && [ $left -eq 0 ]"
	drop_logs "$log"

	# node1's srun dies mid-job: its step is gone with it.
	log=$(mktemp -d)
	on_host0 timeout 120 salloc -N3 "$UNISUM" launch --slurm -- "$CHECK" rounds 1000000 >"$log/lost" 2>&1 &
	job=$!
	sleep 4	# registered and summing
	pkill -KILL -f "^srun .*--nodelist=node1 " 2>/dev/null
	wait "$job"
	rc=$?
	expect "node1's srun lost mid-job: the launcher fails naming node1" \
		sh -c "[ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q 'host 1 (node1)' '$log/lost'"
	expect "... and nothing of the job is left on any host" [ "$(settle)" -eq 0 ]
	drop_logs "$log"

	# scancel of a running batch job stops everything.
	log=$(mktemp -d)
	printf '#!/bin/sh\nexec "%s" launch --slurm -- "%s" rounds 1000000\n' "$UNISUM" "$CHECK" >"$log/long.sh"
	id=$(cd "$log" && on_host0 sbatch --parsable -N3 -o "$log/long.out" "$log/long.sh")
	n=0
	until [ "$(grep -c 'unisum launch: node . of 3' "$log/long.out" 2>/dev/null)" = 3 ] ||
		[ "$n" -ge 100 ]; do
		n=$((n + 1))
		sleep 0.2
	done
	sleep 2	# registered and summing
	t0=$(date +%s%N)
	on_host0 scancel "$id"
	n=0
	until [ "$(job_left)" -eq 0 ] || [ "$n" -ge 100 ]; do
		n=$((n + 1))
		sleep 0.1
	done
	stop_ms=$(ms_since "$t0")
	expect "scancel of a running batch job: every process of the job on every host is gone within 10 s ($stop_ms ms)" \
		[ "$(job_left)" -eq 0 ]
	drop_logs "$log"
fi
finish
