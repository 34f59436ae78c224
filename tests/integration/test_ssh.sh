# Integration: a job over ssh, `unisum launch -H host:slots,...` (issue
# 21).  Four hosts are network namespaces on a bridge
# (bench/cluster/netns.sh), each running a real sshd (openssh-server) on
# its own address, with a host key and an authorized key made here.  The
# launcher runs on host 0 and starts every node, itself included, with the
# system's ssh client.
#
#   - a job whose sums are checked on all 6 workers of hosts 0-2, with a
#     CPU-only server on host 3 (--server-hosts) and the scheduler beside
#     host 0's node (--scheduler-host); the job's secret never shows on a
#     command line (sampled with ps while it runs);
#   - a worker killed on host 1: the launcher exits with its status, the
#     others are stopped, no process of the job is left on any host;
#   - the ssh connection to host 2 lost mid-job (its client killed): that
#     host's processes stop by themselves, the job fails naming host 2;
#   - an unreachable host fails the launch, naming it, and so does a
#     refused key.
#
# Needs root (namespaces): otherwise it is reported as skipped.
# UNISUM_TEST_LIGHT=1 (the sanitizer runs) keeps the first job and the
# unreachable host.
. "$(dirname "$0")/lib.sh"

P="uss$$"
keys=$(mktemp -d)
HOSTS_CLEANUP='sh "$CLUSTER/sshd.sh" down "$keys"; rm -rf "$keys"'
hosts_up "$P" 4 1gbit
# unisum launch -H runs the ssh client; the test runs sshd and ssh-keygen.
if ! ssh -V >/dev/null 2>&1 || ! command -v sshd >/dev/null || ! command -v ssh-keygen >/dev/null; then
	FAILS=$((FAILS + 1))
	echo "FAIL ssh, sshd or ssh-keygen is missing: scripts/install-deps.sh installs openssh-server and -client"
	finish
fi
A0=$(sh "$NETNS" addr "$P" 0)
A1=$(sh "$NETNS" addr "$P" 1)
A2=$(sh "$NETNS" addr "$P" 2)
A3=$(sh "$NETNS" addr "$P" 3)

# A host key, a user key and its authorized_keys; one sshd per host, each
# answering before this goes on (bench/cluster/sshd.sh).
expect "sshd runs and answers on every host" sh "$CLUSTER/sshd.sh" up "$P" 4 "$keys"
SSH_ARGS=$(sh "$CLUSTER/sshd.sh" args "$keys")

# launch LOG ARGS... : unisum launch ARGS on host 0, output in LOG.
launch() {
	out=$1
	shift
	sh "$NETNS" exec "$P" 0 timeout 120 "$UNISUM" launch "$@" >"$out" 2>&1
}

# job_left : how many processes of the job (launchers, servers, workers,
# ssh clients) remain on the hosts.
job_left() {
	n=0
	for i in 0 1 2 3; do
		for pid in $(ip netns pids "$P-h$i" 2>/dev/null); do
			case $(cat "/proc/$pid/comm" 2>/dev/null) in
			unisum | check_sums | ssh) n=$((n + 1)) ;;
			esac
		done
	done
	echo "$n"
}

log=$(mktemp -d)
secret="never-on-a-command-line-$$"
t0=$(date +%s%N)
ROUNDS=100
[ "${UNISUM_TEST_LIGHT:-0}" = 1 ] && ROUNDS=20	# the sanitizer runs
UNISUM_SECRET=$secret launch "$log/sums" -H "$A0:2,$A1:2,$A2:2" --server-hosts "$A3" \
	--scheduler-host --ssh-args "$SSH_ARGS" -- "$CHECK" rounds "$ROUNDS" &
wait_watching_secret $! "$secret"
seen=$SEEN rc=$RC
expect "-H over ssh: 3 hosts of 2 workers and a server each, and a CPU-only server host, $ROUNDS rounds exact on all 6 workers [$(ms_since "$t0") ms]" \
	sh -c "[ $rc -eq 0 ] && [ \$(grep -c '$ROUNDS rounds ok' '$log/sums') -eq 6 ]"
expect "... each host's lines carry its name" grep -q "^\[$A2\] \[worker 5\] rank 5: $ROUNDS rounds ok" "$log/sums"
expect "... and the server host ran a CPU-only server of 3 nodes and 4 servers" \
	grep -q "^\[$A3\] unisum launch: a CPU-only server of a job of 3 nodes and 4 servers" "$log/sums"
expect "... and host 0 the scheduler (--scheduler-host), on its own address" \
	grep -q "^\[$A0\] unisum launch: node 0 of 3: server 0 and 2 worker(s) (ranks 0 to 1) and the scheduler, scheduler at $A0:" "$log/sums"
expect "... the secret never showed on a command line" [ "$seen" -eq 0 ]
expect "... and nothing of the job is left on any host" [ "$(job_left)" -eq 0 ]
drop_logs "$log"

if [ "${UNISUM_TEST_LIGHT:-0}" != 1 ]; then
	# Worker 3 (host 1, local rank 1) kills itself after 30 rounds.
	log=$(mktemp -d)
	start=$(date +%s)
	# (A quoted word in --ssh-args, as ProxyCommand needs.)
	launch "$log/die" -H "$A0:2,$A1:2,$A2:2" --ssh-args "$SSH_ARGS -o 'LogLevel ERROR'" -- \
		"$CHECK" die 3 30
	rc=$?
	elapsed=$(($(date +%s) - start))
	expect "a worker killed on host 1: the launcher exits with its status (137)" [ "$rc" -eq 137 ]
	expect "... names host 1 and worker 3" sh -c "grep -q 'host 1 .*137' '$log/die' && grep -q 'worker 3' '$log/die'"
	left=$(job_left)
	expect "... within 20 s ($elapsed s), leaving nothing of the job on any host ($left left)" \
		sh -c "[ $elapsed -le 20 ] && [ $left -eq 0 ]"
	drop_logs "$log"

	# The ssh client of host 2 dies mid-job (the connection is lost): the
	# node on host 2 must stop by itself.
	log=$(mktemp -d)
	launch "$log/lost" -H "$A0:1,$A1:1,$A2:1" --ssh-args "$SSH_ARGS" -- "$CHECK" rounds 1000000 &
	job=$!
	sleep 4	# registered and summing
	pkill -KILL -f "ssh .*$A2 cd " 2>/dev/null
	wait "$job"
	rc=$?
	sleep 1
	left2=0
	for pid in $(ip netns pids "$P-h2"); do
		case $(cat "/proc/$pid/comm" 2>/dev/null) in
		unisum | check_sums) left2=$((left2 + 1)) ;;
		esac
	done
	expect "host 2's ssh connection lost mid-job: the launcher fails naming host 2" \
		sh -c "[ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q 'host 2' '$log/lost'"
	expect "... and host 2's own processes stopped by themselves" [ "$left2" -eq 0 ]
	expect "... as did everything else of the job" [ "$(job_left)" -eq 0 ]
	drop_logs "$log"
fi

# What stops a host's node when its ssh connection is lost, alone: a
# launcher started as -H starts one (--remote; here by hand, beside a
# standalone scheduler) reads the secret from stdin and stops its
# processes when stdin ends, while the job itself is fine.
log=$(mktemp -d)
port=$(free_port)
UNISUM_NUM_WORKER=1 UNISUM_NUM_SERVER=1 UNISUM_SCHEDULER_HOST=127.0.0.1 \
	UNISUM_SCHEDULER_PORT=$port UNISUM_SECRET=stdin-secret timeout 60 "$UNISUM" scheduler \
	>"$log/scheduler" 2>&1 &
sched=$!
start=$(date +%s)
{ echo stdin-secret; sleep 4; } | env -u UNISUM_SECRET timeout 60 "$UNISUM" launch --remote \
	--nproc-per-node 1 --nnodes 1 --node-rank 0 --master-addr 127.0.0.1 --master-port "$port" \
	-- "$CHECK" rounds 1000000 >"$log/remote" 2>&1
rc=$?
elapsed=$(($(date +%s) - start))
wait "$sched"
expect "a node started for -H stops when its stdin (the ssh connection) ends, in $elapsed s" \
	sh -c "[ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $elapsed -le 15 ] &&
	       grep -q 'connection to the launcher (ssh or srun) ended' '$log/remote'"
expect "... having joined with the secret it read there (its processes had registered)" \
	sh -c "grep -q 'lost its connection' '$log/scheduler' && ! grep -q 'secret' '$log/scheduler'"
drop_logs "$log"

# An unreachable host is named.
log=$(mktemp -d)
gone="${A0%.*}.99"
start=$(date +%s)
launch "$log/gone" -H "$A0:1,$gone:1" --ssh-args "$SSH_ARGS" --start-timeout 3 -- "$CHECK" sums
rc=$?
elapsed=$(($(date +%s) - start))
expect "an unreachable host fails the launch within the start timeout plus a margin, naming it" \
	sh -c "[ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $elapsed -le 20 ] && grep -q '$gone' '$log/gone'"
expect "... and leaves nothing behind" [ "$(job_left)" -eq 0 ]
drop_logs "$log"

# A refused key is named: the host does not know the host key as a user key.
log=$(mktemp -d)
launch "$log/refused" -H "$A1:1" --ssh-args "$(echo "$SSH_ARGS" | sed "s|-i [^ ]*|-i $keys/host|")" \
	-- "$CHECK" sums
rc=$?
expect "a refused key fails the launch, naming the host and ssh's reason" \
	sh -c "[ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q 'host 0 ($A1)' '$log/refused' &&
	       grep -q 'Permission denied' '$log/refused'"
expect "... and leaves nothing behind" [ "$(job_left)" -eq 0 ]
drop_logs "$log"
finish
