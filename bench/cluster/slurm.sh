#!/bin/sh
# slurm.sh - a real Slurm cluster on the hosts of an emulated cluster
# (netns.sh), for `unisum launch --slurm`.  Needs root and the packages
# slurmctld, slurmd, slurm-client and munge (Slurm 22.05 here).
#
#   slurm.sh up PREFIX H DIR    a munged of its own (key and socket in DIR),
#                               slurmctld on host 0 and one slurmd per host
#                               PREFIX-h0 .. h<H-1> (nodes node0 .. node<H-1>
#                               at the hosts' addresses, 4 CPUs each);
#                               returns once every node is idle
#   slurm.sh conf DIR           prints the SLURM_CONF every command needs
#   slurm.sh down DIR           stops every daemon started with DIR
#
# The daemons enter the hosts with `nsenter --net`, not `ip netns exec`:
# the latter remounts /sys, which hides the cgroup mounts slurmd wants.
# Every node shares the machine's file system, so paths that differ per
# node go through slurm.conf's %n; proctrack/linuxproc tracks a step's
# processes by their parents, with no cgroups.
set -eu

HERE=$(cd "$(dirname "$0")" && pwd)
NETNS="$HERE/netns.sh"

# in HOST CMD... : runs CMD in host HOST's network namespace only.
in_host() {
	h=$1
	shift
	nsenter --net="/run/netns/$P-h$h" "$@"
}

case ${1:-} in
up)
	[ $# -eq 4 ] || { echo "usage: $0 up PREFIX H DIR" >&2; exit 2; }
	P=$2 H=$3 DIR=$4
	mkdir -p "$DIR/state" "$DIR/spool" "$DIR/log"
	# munge: a key and a daemon of this cluster's own (root needs --force).
	dd if=/dev/urandom of="$DIR/munge.key" bs=1024 count=1 2>/dev/null
	chmod 400 "$DIR/munge.key"
	munged --force --socket="$DIR/munge.sock" --key-file="$DIR/munge.key" \
		--pid-file="$DIR/munged.pid" --log-file="$DIR/log/munged.log" \
		--seed-file="$DIR/munged.seed"
	munge -s probe -S "$DIR/munge.sock" | unmunge -S "$DIR/munge.sock" >/dev/null ||
		{ echo "slurm.sh: munged does not answer on $DIR/munge.sock" >&2; exit 1; }
	# The controller's name must be this machine's hostname (every host
	# shares it), at host 0's address.
	cat >"$DIR/slurm.conf" <<CONF
ClusterName=unisum$P
SlurmctldHost=$(hostname)($(sh "$NETNS" addr "$P" 0))
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$DIR/munge.sock
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/linear
SchedulerType=sched/builtin
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
ReturnToService=2
KillWait=5
CONF
	i=0
	while [ "$i" -lt "$H" ]; do
		echo "NodeName=node$i NodeAddr=$(sh "$NETNS" addr "$P" "$i") CPUs=4" >>"$DIR/slurm.conf"
		i=$((i + 1))
	done
	echo "PartitionName=all Nodes=ALL Default=YES MaxTime=INFINITE State=UP" >>"$DIR/slurm.conf"
	export SLURM_CONF="$DIR/slurm.conf"
	in_host 0 slurmctld -c
	i=0
	while [ "$i" -lt "$H" ]; do
		in_host "$i" slurmd -N "node$i"
		i=$((i + 1))
	done
	# Every node idle before the caller goes on.
	n=0
	until [ "$(in_host 0 sinfo -h -t idle -o %D 2>/dev/null)" = "$H" ]; do
		n=$((n + 1))
		[ "$n" -lt 100 ] || { echo "slurm.sh: the nodes are not idle after 20 s:" >&2;
			in_host 0 sinfo >&2 || true; exit 1; }
		sleep 0.2
	done
	;;
conf)
	[ $# -eq 2 ] || { echo "usage: $0 conf DIR" >&2; exit 2; }
	echo "$2/slurm.conf"
	;;
down)
	[ $# -eq 2 ] || { echo "usage: $0 down DIR" >&2; exit 2; }
	# (A daemon may remove its pid file as it exits.)
	pids=$(cat "$2"/slurmd-*.pid "$2"/slurmctld.pid "$2"/munged.pid 2>/dev/null || true)
	for pid in $pids; do
		kill "$pid" 2>/dev/null || true
	done
	# Each gone (slurmctld saves its state first) before DIR goes.
	for pid in $pids; do
		n=0
		while kill -0 "$pid" 2>/dev/null && [ "$n" -lt 50 ]; do
			n=$((n + 1))
			sleep 0.1
		done
	done
	rm -f "$2"/slurmd-*.pid "$2"/slurmctld.pid "$2"/munged.pid
	;;
*)
	echo "usage: $0 up PREFIX H DIR | conf DIR | down DIR" >&2
	exit 2
	;;
esac
