# Integration: several workers per machine (issue 5).  Real launcher,
# scheduler, servers and worker processes; the workers of a machine sum in
# shared memory (src/worker/local.c), the machines' roots through the
# servers.  Every worker checks every element against a reference summed in
# the same order (each machine's local ranks, then the machines), so the
# results are exact and identical on every rank.
#
# Also: a local rank killed mid-round is named by every survivor and leaves
# nothing in /dev/shm; a stale segment of a dead job is cleaned at the next
# start.
. "$(dirname "$0")/lib.sh"

# shm_left JOB : how many segments of job JOB are in /dev/shm.
shm_left() {
	ls /dev/shm 2>/dev/null | grep -c "^unisum\.$1\." || true
}

# run_local NAME WORKERS SERVERS LOCAL ARGS... : check_sums ARGS on WORKERS
# workers in machines of LOCAL; also fails when the job leaves a segment.
run_local() {
	name=$1 w=$2 s=$3 l=$4
	shift 4
	job="t$$-$w-$s-$l"
	out=$(mktemp)
	t0=$(date +%s%N)
	if UNISUM_JOB_ID=$job timeout 300 "$UNISUM" launch -w "$w" -s "$s" --local-size "$l" -- \
		"$CHECK" "$@" >"$out" 2>&1 && [ "$(shm_left "$job")" -eq 0 ]; then
		PASSES=$((PASSES + 1))
		echo "ok   $name (w=$w s=$s local=$l: $*) [$(ms_since "$t0") ms]"
	else
		FAILS=$((FAILS + 1))
		echo "FAIL $name (w=$w s=$s local=$l: $*; segments left: $(shm_left "$job")), output:"
		sed 's/^/    /' "$out"
	fi
	rm -f "$out"
}

# Local sizes 2 and 4 x machines 1 and 2 x servers 1 and 2 (local size 1
# is test_sums.sh's matrix): every dtype, sizes from 0 elements to 3
# partitions with uneven tails, plain and averaged, out of place and in
# place.  64 KiB partitions keep the 8-process reference cheap; the default
# 4 MB ones (slices of many cross-memory chunks) follow.
#
# UNISUM_TEST_LIGHT=1 (the sanitizer runs, which look for memory and thread
# errors rather than arithmetic, and run tests/component/test_job.c's in-process
# jobs of the same paths too) keeps one machine of 4 and two machines of 2,
# leaves out the 8-process and the largest jobs, and cuts every tensor in
# 64 KiB partitions.
if [ "${UNISUM_TEST_LIGHT:-0}" = 1 ]; then
	matrix="4:1:4 4:2:2"
	# Every job's tensors in 64 KiB partitions: the default 4 MB ones
	# cost half a minute per job under ThreadSanitizer.
	export UNISUM_PARTITION_BYTES=65536
else
	# (One machine with 2 servers, 2:2:2 and 4:2:4, left the servers idle
	# like 2:1:2 and 4:1:4: dropped to keep make test within its time.)
	matrix="2:1:2 4:1:2 4:2:2 4:1:4 8:1:4 8:2:4"
fi
for spec in $matrix; do
	IFS=: read -r w s l <<EOF2
$spec
EOF2
	UNISUM_PARTITION_BYTES=65536 run_local "every dtype, every tail" "$w" "$s" "$l" sums
done
# (Every dtype in 1 MB partitions on two machines of 2: the IPC pair of
# jobs below, which also compares them bit for bit with TCP.)
# More one-shot tensors than a rank's table holds at once: entries of
# undeclared tensors are reused.  (The sanitizer runs keep a few hundred.)
once=5000
[ "${UNISUM_TEST_LIGHT:-0}" = 1 ] && once=300
run_local "$once one-shot tensors, one machine" 2 1 2 once $once
run_local "$once one-shot tensors, two machines" 4 2 2 once $once
if [ "${UNISUM_TEST_LIGHT:-0}" != 1 ]; then
	run_local "every dtype, 4 MB partitions, one machine" 2 1 2 sums
	# (64 MiB tensors: through unisum_alloc's arenas below, the path a
	# machine's workers take for big gradients; by cross-memory attach
	# the 4 MB partitions above already span many chunks.)
fi
# Many small partitions: tails of every size within a partition's slices.
UNISUM_PARTITION_BYTES=1000 run_local "1000-byte partitions, two machines" 4 2 2 sums
run_local "300 rounds, inputs change every round" 4 2 2 rounds 300
run_local "200 tensors in flight, one machine" 4 1 4 many 200
run_local "200 tensors in flight, two machines" 4 2 2 many 200
run_local "declarations in a different order on every worker" 4 2 2 shuffle
run_local "broadcast from every root, one machine" 4 1 4 broadcast
run_local "broadcast from every root, two machines" 4 1 2 broadcast
# One machine, large tensors: staged through each rank's arena instead of
# read with cross-memory attach.  Stage everything here; a tiny arena
# mixes staged and unstaged tensors within one job.
export UNISUM_LOCAL_STAGE_BYTES=1
UNISUM_PARTITION_BYTES=65536 run_local "staged: every dtype, every tail" 2 1 2 sums
UNISUM_PARTITION_BYTES=65536 run_local "staged: every dtype, every tail" 4 1 4 sums
[ "${UNISUM_TEST_LIGHT:-0}" = 1 ] || run_local "staged: every dtype, 4 MB partitions" 3 1 3 sums
run_local "staged: 200 tensors in flight" 4 1 4 many 200
UNISUM_LOCAL_ARENA_BYTES=200000 run_local "staged and not, in one job" 3 1 3 many 200
run_local "staged: broadcast from every root" 4 1 4 broadcast
unset UNISUM_LOCAL_STAGE_BYTES

# The allocator path: buffers from unisum_alloc lie in each worker's shared
# arena, and the others read and write them with plain loads and stores.
# "all": every buffer there; "mixed": even ranks' inputs and odd ranks'
# outputs (the rest by cross-memory attach); a tiny arena sends most
# buffers back to malloc.  The digest of every result must match the
# cross-memory-attach run's: same inputs, same summation order.
# The sanitizer runs keep one machine of 4 with every buffer shared and
# two machines of 2 with mixed buffers.
if [ "${UNISUM_TEST_LIGHT:-0}" = 1 ]; then
	alloc_matrix="4:1:4:all 4:2:2:mixed"
else
	alloc_matrix="4:1:4:all 4:1:4:mixed 4:2:2:all 4:2:2:mixed"
fi
for spec in $alloc_matrix; do
	IFS=: read -r w s l how <<EOF2
$spec
EOF2
	CHECK_SUMS_ALLOC=$how UNISUM_PARTITION_BYTES=65536 \
		run_local "unisum_alloc ($how): every dtype, every tail" "$w" "$s" "$l" sums
done
if [ "${UNISUM_TEST_LIGHT:-0}" != 1 ]; then
	CHECK_SUMS_ALLOC=all run_local "unisum_alloc: 64 MiB tensors, one machine" 2 1 2 sums --big
	CHECK_SUMS_ALLOC=all UNISUM_LOCAL_ARENA_BYTES=300000 UNISUM_PARTITION_BYTES=65536 \
		run_local "unisum_alloc: arena full, the rest from malloc" 4 1 4 sums
fi
# 1 MB partitions: tensors of up to 3 MB span a dozen of the local reduce's
# 256 KiB chunks, at a quarter of the default 4 MB partitions' cost (the
# jobs above cover those).
digest_of() { # ALLOC-MODE: the digests of a 4-worker one-machine job
	CHECK_SUMS_ALLOC=$1 UNISUM_LOG_LEVEL=INFO UNISUM_JOB_ID="alloc$$-${1:-none}" \
		UNISUM_PARTITION_BYTES=1048576 timeout 120 \
		"$UNISUM" launch -w 4 -s 1 --local-size 4 -- "$CHECK" sums 2>&1 | tee "$log/alloc-${1:-none}" |
		sed -n 's/.*sums ok, digest \([0-9a-f]*\).*/\1/p' | sort | uniq -c | tr -s ' '
}
# A /dev/shm smaller than the arenas (Docker's is 64 MiB): unisum_alloc
# reserves its pages up front, so what does not fit comes from malloc with
# a warning instead of a SIGBUS at first touch.  Needs a private mount
# namespace, so root.
if [ "$(id -u)" = 0 ]; then
	out=$(unshare -m sh -c 'unset UNISUM_PARTITION_BYTES; mount -t tmpfs -o size=8m tmpfs /dev/shm &&
		CHECK_SUMS_ALLOC=all timeout 120 "$0" launch -w 2 -s 1 -- "$1" sums' "$UNISUM" "$CHECK" 2>&1)
	expect "unisum_alloc with /dev/shm of 8 MiB: exact sums on both ranks, no SIGBUS" \
		sh -c "[ \"\$(printf '%s\n' \"\$1\" | grep -c 'sums ok')\" -eq 2 ]" - "$out"
	expect "... and each worker says its arena found /dev/shm full" \
		contains "$out" "shared arena cannot take [0-9]+ more bytes \\(/dev/shm is full\\)"
else
	skip "the small /dev/shm case: it needs root to mount a private /dev/shm (ran as $(id -un))"
fi
if [ "${UNISUM_TEST_LIGHT:-0}" != 1 ]; then
	log=$(mktemp -d)
	dnone=$(CHECK_SUMS_ALLOC= digest_of "")
	dall=$(digest_of all)
	expect "unisum_alloc: results bit-identical to cross-memory attach, on all 4 ranks ($dall)" \
		sh -c "[ -n '$dall' ] && [ '$dall' = '$dnone' ] && echo '$dall' | grep -q '^ *4 '"
	expect "unisum_alloc: the workers read each other's arenas directly" \
		grep -q "summing them with plain loads and stores" "$log/alloc-all"
	expect "without it, nobody does" sh -c "! grep -q 'plain loads' '$log/alloc-none'"
	drop_logs "$log"
fi

# A cluster job by hand: scheduler and server started alone, each machine's
# workers by `unisum launch --nproc-per-node 2` (its UNISUM_WORKER_ID).
pport=$(free_port)
log=$(mktemp -d)
(
	export UNISUM_NUM_WORKER=2 UNISUM_NUM_SERVER=1 UNISUM_SCHEDULER_HOST=127.0.0.1
	export UNISUM_SCHEDULER_PORT=$pport UNISUM_PARTITION_BYTES=1048576
	UNISUM_ROLE=scheduler timeout 120 "$UNISUM" scheduler >"$log/scheduler" 2>&1 &
	UNISUM_ROLE=server timeout 120 "$UNISUM" server >"$log/server" 2>&1 &
	UNISUM_WORKER_ID=0 timeout 120 "$UNISUM" launch --nproc-per-node 2 -- "$CHECK" sums \
		>"$log/m0" 2>&1 &
	m0=$!
	UNISUM_WORKER_ID=1 timeout 120 "$UNISUM" launch --nproc-per-node 2 -- "$CHECK" sums \
		>"$log/m1" 2>&1
	echo $? >"$log/rc1"
	wait $m0
	echo $? >"$log/rc0"
	wait
)
expect "--nproc-per-node: both machines' launchers exit 0" \
	[ "$(cat "$log/rc0")" -eq 0 -a "$(cat "$log/rc1")" -eq 0 ]
expect "--nproc-per-node: ranks 0-3 summed right" \
	sh -c "cat '$log/m0' '$log/m1' | grep -c 'worker [0-3]\] rank [0-3]: sums ok' | grep -qx 4"
drop_logs "$log"

# IPC: a machine's root and a server on one host talk over the IPC
# transport, which passes the data by address (cross-memory attach), or
# with UNISUM_IPC=0 over TCP, the data through the socket.
# The same inputs and summation order give bit-identical results: one
# digest of every result on every rank, the same in both modes.
for ipc in 0 1; do
	out=$(UNISUM_IPC=$ipc UNISUM_LOG_LEVEL=INFO UNISUM_JOB_ID="ipc$$-$ipc" \
		UNISUM_PARTITION_BYTES=1048576 timeout 120 \
		"$UNISUM" launch -w 4 -s 2 --local-size 2 -- "$CHECK" sums 2>&1)
	digests=$(printf '%s\n' "$out" | sed -n 's/.*sums ok, digest \([0-9a-f]*\).*/\1/p')
	eval "ranks$ipc=\$(printf '%s\n' \"\$digests\" | grep -c .)"
	eval "d$ipc=\$(printf '%s\n' \"\$digests\" | sort -u)"
	eval "n$ipc=\$(printf '%s\n' \"\$out\" | grep -c 'by address (IPC')"
done
expect "IPC: each machine's root passes data to both servers by address" [ "$n1" -eq 4 ]
expect "UNISUM_IPC=0: nobody does" [ "$n0" -eq 0 ]
expect "IPC and TCP: every rank finished" [ "$ranks0" -eq 4 -a "$ranks1" -eq 4 ]
expect "IPC and TCP: one digest on every rank, bit-identical in both modes" \
	sh -c "[ -n '$d0' ] && [ '$d0' = '$d1' ] && [ \$(echo '$d0' | wc -l) -eq 1 ]"

# A local rank killed (SIGKILL) mid-run, in two machines of 2 and in one
# staging machine of 4: every survivor, on its machine and on the other,
# fails with an error naming it.  Started by hand, so the launcher does not
# stop the survivors first.  Each spec: victim, machines, local size,
# UNISUM_LOCAL_STAGE_BYTES.
for spec in "1 2 2 0" "2 2 2 0" "2 1 4 1"; do
	set -- $spec
	victim=$1 machines=$2 lsize=$3 stage=$4
	pport=$(free_port)
	log=$(mktemp -d)
	job="kill$$-$victim-$lsize"
	start=$(date +%s)
	(
		export UNISUM_NUM_WORKER=$machines UNISUM_NUM_SERVER=1 UNISUM_SCHEDULER_HOST=127.0.0.1
		export UNISUM_SCHEDULER_PORT=$pport UNISUM_LOCAL_SIZE=$lsize UNISUM_JOB_ID=$job
		export UNISUM_LOCAL_STAGE_BYTES=$stage
		UNISUM_ROLE=scheduler timeout 60 "$UNISUM" scheduler >"$log/scheduler" 2>&1 &
		UNISUM_ROLE=server timeout 60 "$UNISUM" server >"$log/server" 2>&1 &
		pids=
		for r in 0 1 2 3; do
			UNISUM_ROLE=worker UNISUM_WORKER_ID=$((r / lsize)) UNISUM_LOCAL_RANK=$((r % lsize)) \
				timeout 60 "$CHECK" die "$victim" 40 >"$log/w$r" 2>&1 &
			pids="$pids $!"
		done
		for r in 0 1 2 3; do
			set -- $pids
			shift "$r"
			wait "$1"
			echo $? >"$log/rc$r"
		done
		wait
	)
	elapsed=$(($(date +%s) - start))
	for r in 0 1 2 3; do
		rc=$(cat "$log/rc$r")
		if [ "$r" -eq "$victim" ]; then
			expect "worker $victim of machines of $lsize killed (stage=$stage): it died by SIGKILL" [ "$rc" -eq 137 ]
		else
			expect "worker $victim of machines of $lsize killed (stage=$stage): worker $r failed naming worker $victim" [ "$rc" -eq 3 ]
		fi
	done
	expect "worker $victim of machines of $lsize killed (stage=$stage): everything ended within 20 s" [ "$elapsed" -le 20 ]
	expect "worker $victim of machines of $lsize killed (stage=$stage): no segment left in /dev/shm" [ "$(shm_left "$job")" -eq 0 ]
	drop_logs "$log"
done

# The same through the launcher: it exits with the victim's status and
# leaves nothing behind.
job="launchkill$$"
out=$(UNISUM_JOB_ID=$job timeout 120 "$UNISUM" launch -w 4 -s 1 --local-size 2 -- "$CHECK" die 3 40 2>&1)
rc=$?
expect "launcher: a killed local rank sets the exit status (137)" [ $rc -eq 137 ]
expect "launcher: ... and no segment is left in /dev/shm" [ "$(shm_left "$job")" -eq 0 ]

# A stale segment of a dead job (its creator's pid is gone) is removed at
# the next start, and a job with that very id runs.
job="stale$$"
/usr/bin/python3 - "$job" <<'EOF'
import os, struct, subprocess, sys
job = sys.argv[1]
dead = subprocess.Popen(["true"]); dead.wait()        # a pid that is gone
hdr = struct.pack("<IIiIQQ32s", 0x4d535355, 1, dead.pid, 64, 4096, 0, b"")
with open("/dev/shm/unisum.%s.m0" % job, "wb") as f:
    f.write(hdr + bytes(4096))
EOF
expect "stale segment: planted" [ "$(shm_left "$job")" -eq 1 ]
out=$(UNISUM_JOB_ID=$job timeout 120 "$UNISUM" launch -w 2 -s 1 -- "$CHECK" rounds 20 2>&1)
rc=$?
expect "stale segment: the job with its id runs" [ $rc -eq 0 ]
expect "stale segment: ... and it is gone" [ "$(shm_left "$job")" -eq 0 ]
[ $rc -eq 0 ] || printf '%s\n' "$out" | sed 's/^/    /'
finish
