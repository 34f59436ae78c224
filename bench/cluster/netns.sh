#!/bin/sh
# netns.sh - an emulated cluster of H hosts on this machine, built from
# network namespaces, one Linux bridge and tc shaping.  Needs root, `ip`
# and `tc` (iproute2); the selftest also wants iperf3 and ping.
#
#   netns.sh up PREFIX H RATE [DELAY]   build the cluster
#   netns.sh down PREFIX                tear it down (idempotent)
#   netns.sh rate PREFIX I RATE         reshape host I's link (a straggler)
#   netns.sh addr PREFIX I              print host I's IPv4 address
#   netns.sh exec PREFIX I CMD ARGS...  run CMD inside host I
#   netns.sh with PREFIX H RATE [--delay D] -- CMD ARGS...
#                                       up, run CMD, down on any exit
#   netns.sh check PREFIX               exit 0 iff nothing of PREFIX exists
#   netns.sh selftest                   3 hosts at 200mbit: ping + iperf3
#   netns.sh selftest-racks             2 racks of 2 at 200mbit, a 100mbit
#                                       uplink: iperf3 within, across, and
#                                       after `rate`
#
# Topology.  Host i is the namespace PREFIX-h<i> (i = 0 .. H-1) with one NIC,
# eth0, the end of a veth pair whose other end, h<i>, sits in the switch
# namespace PREFIX-sw and is a port of the bridge br0 there.  Both ends are
# created directly in their namespaces, so the root namespace never holds
# any link of the cluster, not even for a moment.  Host i has the address
# 10.N.(i/250).(i%250+1)/16, N a byte hashed from PREFIX (two clusters are
# isolated from each other anyway: nothing routes between namespaces).
# IPv6 is disabled everywhere (no DAD or router-solicitation noise), lo is
# up everywhere, the MTU stays 1500 and GSO/TSO stay on.
#
# Shaping.  Every host link is full duplex at RATE (a tc rate: 1gbit,
# 500mbit, 10gbit ...): a tbf on eth0 in the host shapes what the host
# sends, a tbf on h<i> in the switch shapes what it receives, so N hosts
# sending to one are limited by that one's downlink, as on a real switch.
# tbf counts every frame as the kernel sees it at the qdisc: a GSO packet is
# charged its per-segment Ethernet+IP+TCP headers, so at MTU 1500 with TCP
# timestamps a 1514-byte frame carries 1448 bytes and the best TCP goodput
# is RATE x 1448/1514 (preamble, FCS and the inter-frame gap are not
# emulated).  DELAY (a tc time, e.g. 100us) adds a netem delay in front of
# each of those tbf, i.e. per link direction: host to host one way is
# 2 x DELAY, a ping round trip 4 x DELAY.  DELAY needs a kernel with netem
# (CONFIG_NET_SCH_NETEM); `up` says so and fails when it is missing.
#
# TCP.  Every host runs the congestion control NETNS_CC (default cubic,
# Linux's own default; NETNS_CC= keeps the machine's).  The machine's may
# misread the emulated links: this VM's default, BBR v1, measured a 1gbit
# link at 4-29 Gbit/s (tbf's burst lets 128 KiB through at memory speed)
# and a minimum round trip of 8 us, so it did not pace; its flows queued
# at the tbf, and each connection's ProbeRTT (a window of 4 segments for
# 200 ms, every 10 s) then crawled through that queue: a 64 KiB reply took
# 168 ms, and back-to-back collectives lost whole bursts of calls
# (bench/README.md).  A real NIC serializes every frame, so BBR there
# measures the link as it is.  A namespace may only take a congestion
# control that tcp_allowed_congestion_control lists: `up` adds NETNS_CC to
# that (global) list for as long as it sets the hosts, then restores it.
# A NETNS_CC the kernel cannot set fails `up`; the default, cubic, only
# warns, and the hosts keep the machine's.
#
# Racks.  With NETNS_RACKS=R (R > 1) in the environment, `up` cuts the H
# hosts into R racks of consecutive indices (rack r: hosts r*H/R up to
# (r+1)*H/R - 1), each its own bridge br<r> in the switch namespace, and
# joins each rack's bridge to a core bridge with a link shaped both ways at
# NETNS_UPLINK (a tc rate; required): traffic between two racks crosses
# two such links in series, so for two racks it is one uplink of that
# rate, shared by every flow between them (4 hosts at 1gbit behind a 1gbit
# uplink: 4:1 oversubscribed).  Addresses stay in one /16 (one L2 domain).
#
# `rate` changes host I's link, both directions, to RATE (e.g. 100mbit for
# a straggler), with burst and limit sized for RATE as `up` sizes them.
#
# `with` runs CMD in the ROOT namespace with UNISUM_NETNS_PREFIX=PREFIX,
# UNISUM_NETNS_HOSTS=H and UNISUM_NETNS_SH=<this script> in its
# environment; CMD starts programs on the hosts with `netns.sh exec`.  The
# cluster is torn down when CMD exits or when `with` gets INT, TERM or HUP
# (CMD itself is sent TERM first: a CMD that starts programs in the root
# namespace should pass the signal on); the exit status is CMD's, or
# 128+signal.
#
# `down` also ends (TERM, then KILL) any process still running in one of the
# cluster's namespaces: such a process would keep the namespace alive.
#
# Pitfall: `ip link add a type veth ...` parses "a" as "address"; always
# write `ip link add name IFNAME ...`.
set -eu

ME=$(basename "$0")
SELF=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")

die() {
	echo "$ME: $*" >&2
	exit 1
}

usage() {
	echo "usage:" >&2
	sed -n '6,13p' "$SELF" | sed 's/^# \{0,1\}//' >&2
	exit 2
}

need_root() {
	[ "$(id -u)" -eq 0 ] || die "must run as root (network namespaces, tc)"
	command -v ip >/dev/null 2>&1 || die "ip (iproute2) is missing: apt-get install -y iproute2"
	command -v tc >/dev/null 2>&1 || die "tc (iproute2) is missing: apt-get install -y iproute2"
}

check_prefix() {
	case $1 in
	'' | *[!A-Za-z0-9_.-]*) die "bad PREFIX '$1' (letters, digits, _ . - only)" ;;
	esac
	[ ${#1} -le 200 ] || die "PREFIX too long"
}

is_uint() {
	case $1 in '' | *[!0-9]*) return 1 ;; esac
}

# The cluster's namespaces that exist now: PREFIX-sw and PREFIX-h<digits>
# exactly, so that prefix "a" never touches the cluster "a-b".
namespaces() {
	ip netns list 2>/dev/null | awk -v p="$1" '{
		n = $1
		if (n == p "-sw") { print n; next }
		if (index(n, p "-h") == 1) {
			rest = substr(n, length(p) + 3)
			if (rest ~ /^[0-9]+$/) print n
		}
	}'
}

# Links in the root namespace named PREFIX or PREFIX-* (netns.sh never
# makes any there; checked by `down` and `check` all the same).
root_links() {
	ip -o link show 2>/dev/null | awk -F': ' -v p="$1" '{
		n = $2; sub(/@.*/, "", n)
		if (n == p || index(n, p "-") == 1) print n
	}'
}

# The second byte of the cluster's 10.N.0.0/16, hashed from PREFIX.
net_byte() {
	printf '%s' "$1" | cksum | awk '{ print $1 % 256 }'
}

host_addr() { # PREFIX I
	echo "10.$(net_byte "$1").$(($2 / 250)).$(($2 % 250 + 1))"
}

# RATE (tc syntax) in bytes per second, or nothing when it can't be parsed.
rate_bytes() {
	echo "$1" | awk '{
		r = tolower($0)
		if (!match(r, /^[0-9]+(\.[0-9]+)?/)) exit
		v = substr(r, 1, RLENGTH); u = substr(r, RLENGTH + 1)
		if (u == "" || u == "bit") m = 1 / 8
		else if (u == "kbit") m = 1e3 / 8
		else if (u == "mbit") m = 1e6 / 8
		else if (u == "gbit") m = 1e9 / 8
		else if (u == "tbit") m = 1e12 / 8
		else if (u == "kibit") m = 1024 / 8
		else if (u == "mibit") m = 1048576 / 8
		else if (u == "gibit") m = 1073741824 / 8
		else if (u == "bps") m = 1
		else if (u == "kbps") m = 1e3
		else if (u == "mbps") m = 1e6
		else if (u == "gbps") m = 1e9
		else exit
		if (v * m >= 1000) printf "%d\n", v * m
	}'
}

# Write a sysctl inside a namespace; tolerant of missing knobs (no IPv6).
ns_sysctl() { # NS KEY VALUE
	ip netns exec "$1" sh -c "echo $3 > /proc/sys/$2" 2>/dev/null || true
}

# Shape the egress of DEV in NS: [netem delay DELAY ->] tbf rate RATE.
# burst: 1 ms at RATE, at least 128 KiB so that a 64 KiB GSO packet plus its
# per-segment headers passes whole (a packet over the burst gets split in
# software by tbf).  limit (bytes waiting for tokens): 32 ms at RATE, at
# least 1 MiB.  A real host does not drop its own packets at its NIC (the
# driver pushes back through the qdisc), and a switch port buffers
# megabytes; with a 4 ms limit, many TCP flows sharing a link (a server
# hearing from every worker) lost 2% of their segments to the tbf, and the
# retransmission timeouts made a 0.7 s all-reduce take anywhere from 0.7 to
# 1.2 s.  With 32 ms nothing was dropped and the times held within 3%.
shape() { # NS DEV
	parent=root
	if [ -n "$DELAY" ]; then
		tc -n "$1" qdisc add dev "$2" root handle 1: netem delay "$DELAY" limit 100000
		parent="parent 1:1"
	fi
	# shellcheck disable=SC2086 # $parent is two words on purpose
	tc -n "$1" qdisc add dev "$2" $parent handle 10: tbf rate "$RATE" \
		burst "$BURST" limit "$LIMIT"
}

# Make CC (NETNS_CC: see TCP above) the congestion control of namespaces
# NS...; returns 1 when the kernel cannot.
set_cc() { # CC NS...
	cc=$1
	shift
	allowed=/proc/sys/net/ipv4/tcp_allowed_congestion_control
	(
		# One `up` at a time edits the allowed list (tests run in parallel).
		flock 9
		orig=$(cat "$allowed")
		case " $orig " in
		*" $cc "*) ;;
		*) echo "$orig $cc" >"$allowed" 2>/dev/null || true ;;
		esac
		rc=0
		for ns in "$@"; do
			ip netns exec "$ns" sh -c "echo $cc >/proc/sys/net/ipv4/tcp_congestion_control" \
				2>/dev/null || { rc=1; break; }
		done
		[ "$(cat "$allowed")" = "$orig" ] || echo "$orig" >"$allowed"
		exit $rc
	) 9>"${TMPDIR:-/tmp}/netns.sh.cc.lock"
}

cmd_up() { # PREFIX H RATE [DELAY]
	[ $# -eq 3 ] || [ $# -eq 4 ] || usage
	P=$1 H=$2 RATE=$3 DELAY=${4:-}
	check_prefix "$P"
	if ! is_uint "$H" || [ "$H" -lt 1 ] || [ "$H" -gt 1024 ]; then
		die "H must be 1 .. 1024 (a bridge has at most 1024 ports), not '$H'"
	fi
	bps=$(rate_bytes "$RATE")
	[ -n "$bps" ] || die "bad RATE '$RATE' (e.g. 1gbit, 500mbit, 100mbps)"
	need_root
	[ -z "$(namespaces "$P")" ] ||
		die "namespaces of '$P' exist already: $(namespaces "$P" | tr '\n' ' ')(netns.sh down $P)"
	BURST=$((bps / 1000))
	[ "$BURST" -ge 131072 ] || BURST=131072
	LIMIT=$((bps * 32 / 1000))
	[ "$LIMIT" -ge 1048576 ] || LIMIT=1048576

	# Undo a half-built cluster when anything below fails.
	trap 'cmd_down "$P" >/dev/null 2>&1 || true' EXIT
	trap 'exit 130' INT TERM HUP

	sw=$P-sw
	ip netns add "$sw"
	ns_sysctl "$sw" net/ipv6/conf/all/disable_ipv6 1
	ns_sysctl "$sw" net/ipv6/conf/default/disable_ipv6 1
	ip -n "$sw" link set lo up
	if [ -n "$DELAY" ] &&
		! tc -n "$sw" qdisc add dev lo root netem delay "$DELAY" 2>/dev/null; then
		die "DELAY needs the netem qdisc, which this kernel lacks (CONFIG_NET_SCH_NETEM), or bad DELAY '$DELAY'"
	fi
	[ -z "$DELAY" ] || tc -n "$sw" qdisc del dev lo root
	# No STP, so ports forward at once.
	R=${NETNS_RACKS:-1}
	if ! is_uint "$R" || [ "$R" -lt 1 ] || [ "$R" -gt "$H" ]; then
		die "NETNS_RACKS must be 1 .. H, not '$R'"
	fi
	r=0
	while [ "$r" -lt "$R" ]; do
		ip -n "$sw" link add name "br$r" type bridge stp_state 0 forward_delay 0
		ip -n "$sw" link set "br$r" up
		r=$((r + 1))
	done
	if [ "$R" -gt 1 ]; then
		[ -n "$(rate_bytes "${NETNS_UPLINK:-}")" ] ||
			die "NETNS_RACKS=$R needs NETNS_UPLINK, a tc rate (e.g. 1gbit), not '${NETNS_UPLINK:-}'"
		ip -n "$sw" link add name core type bridge stp_state 0 forward_delay 0
		ip -n "$sw" link set core up
		host_rate=$RATE
		RATE=$NETNS_UPLINK
		r=0
		while [ "$r" -lt "$R" ]; do
			ip -n "$sw" link add name "up$r" mtu 1500 type veth peer name "core$r" mtu 1500
			ip -n "$sw" link set "up$r" master "br$r"
			ip -n "$sw" link set "core$r" master core
			ip -n "$sw" link set "up$r" up
			ip -n "$sw" link set "core$r" up
			shape "$sw" "up$r"	# rack -> core
			shape "$sw" "core$r"	# core -> rack
			r=$((r + 1))
		done
		RATE=$host_rate
	fi

	i=0
	while [ "$i" -lt "$H" ]; do
		ns=$P-h$i
		ip netns add "$ns"
		ns_sysctl "$ns" net/ipv6/conf/all/disable_ipv6 1
		ns_sysctl "$ns" net/ipv6/conf/default/disable_ipv6 1
		ip -n "$ns" link set lo up
		# Both ends are born in their namespaces: nothing in the root one.
		ip -n "$sw" link add name "h$i" mtu 1500 type veth peer name eth0 mtu 1500 netns "$ns"
		ip -n "$sw" link set "h$i" master "br$((i * R / H))"
		ip -n "$sw" link set "h$i" up
		ip -n "$ns" addr add "$(host_addr "$P" "$i")/16" dev eth0
		ip -n "$ns" link set eth0 up
		shape "$ns" eth0
		shape "$sw" "h$i"
		i=$((i + 1))
	done
	CC=${NETNS_CC-cubic}
	# shellcheck disable=SC2046 # the host namespaces, one word each
	if [ -n "$CC" ] && ! set_cc "$CC" $(namespaces "$P" | grep -v -- "-sw$"); then
		why="this kernel cannot set it (available: $(cat /proc/sys/net/ipv4/tcp_available_congestion_control))"
		# Asked for: fail.  The default: say so, and go on with the machine's.
		[ -z "${NETNS_CC+set}" ] || die "NETNS_CC=$CC: $why"
		echo "$ME: warning: $CC: $why; the hosts keep the machine's congestion control" >&2
	fi
	CC=$(ip netns exec "$P-h0" cat /proc/sys/net/ipv4/tcp_congestion_control)
	trap - EXIT INT TERM HUP
	echo "$ME: up $P: $H hosts $(host_addr "$P" 0) .. $(host_addr "$P" $((H - 1))) /16, $RATE each way${DELAY:+, delay $DELAY per link direction}$([ "$R" -gt 1 ] && echo ", $R racks joined at $NETNS_UPLINK") (tbf burst $BURST limit $LIMIT, TCP $CC)"
}

cmd_down() { # PREFIX
	[ $# -eq 1 ] || usage
	P=$1
	check_prefix "$P"
	need_root
	nss=$(namespaces "$P")
	if [ -n "$nss" ]; then
		# End what still runs in the cluster, then the namespaces.
		pids=
		for ns in $nss; do
			pids="$pids $(ip netns pids "$ns" 2>/dev/null | tr '\n' ' ')"
		done
		if [ -n "$(echo "$pids" | tr -d ' ')" ]; then
			# shellcheck disable=SC2086 # a list of pids
			kill -TERM $pids 2>/dev/null || true
			n=0
			while [ $n -lt 20 ]; do
				alive=
				for p in $pids; do
					! kill -0 "$p" 2>/dev/null || alive="$alive $p"
				done
				[ -n "$alive" ] || break
				sleep 0.1
				n=$((n + 1))
			done
			# shellcheck disable=SC2086 # a list of pids
			[ -z "$alive" ] || kill -KILL $alive 2>/dev/null || true
		fi
		for ns in $nss; do
			ip netns delete "$ns" 2>/dev/null || true
		done
	fi
	cmd_check "$P" || die "down $P: something is left (see above)"
}

cmd_check() { # PREFIX
	[ $# -eq 1 ] || usage
	check_prefix "$1"
	command -v ip >/dev/null 2>&1 || die "ip (iproute2) is missing"
	left=$(namespaces "$1")
	links=$(root_links "$1")
	[ -z "$left" ] || echo "$ME: namespaces of '$1' left: $(echo "$left" | tr '\n' ' ')" >&2
	[ -z "$links" ] || echo "$ME: links of '$1' in the root namespace: $(echo "$links" | tr '\n' ' ')" >&2
	[ -z "$left" ] && [ -z "$links" ]
}

cmd_rate() { # PREFIX I RATE
	[ $# -eq 3 ] || usage
	check_prefix "$1"
	is_uint "$2" || die "bad host index '$2'"
	[ -n "$(rate_bytes "$3")" ] || die "bad RATE '$3' (e.g. 1gbit, 100mbit)"
	need_root
	ns=$1-h$2
	[ -e "/run/netns/$ns" ] || [ -e "/var/run/netns/$ns" ] || die "no host $ns (netns.sh up first)"
	bps=$(rate_bytes "$3")
	burst=$((bps / 1000))
	[ "$burst" -ge 131072 ] || burst=131072
	limit=$((bps * 32 / 1000))
	[ "$limit" -ge 1048576 ] || limit=1048576
	tc -n "$ns" qdisc change dev eth0 handle 10: tbf rate "$3" burst "$burst" limit "$limit" ||
		die "rate: cannot reshape $ns's eth0"
	tc -n "$1-sw" qdisc change dev "h$2" handle 10: tbf rate "$3" burst "$burst" \
		limit "$limit" || die "rate: cannot reshape the switch's port h$2"
	echo "$ME: host $2 of $1 now at $3 each way"
}

cmd_addr() { # PREFIX I
	[ $# -eq 2 ] || usage
	check_prefix "$1"
	is_uint "$2" || die "bad host index '$2'"
	host_addr "$1" "$2"
}

cmd_exec() { # PREFIX I CMD ARGS...
	[ $# -ge 3 ] || usage
	check_prefix "$1"
	is_uint "$2" || die "bad host index '$2'"
	need_root
	ns=$1-h$2
	[ -e "/run/netns/$ns" ] || [ -e "/var/run/netns/$ns" ] || die "no host $ns (netns.sh up first)"
	shift 2
	exec ip netns exec "$ns" "$@"
}

cmd_with() { # PREFIX H RATE [--delay D] -- CMD ARGS...
	[ $# -ge 3 ] || usage
	wp=$1 wh=$2 wr=$3
	shift 3
	wd=
	if [ "${1:-}" = --delay ]; then
		[ $# -ge 2 ] || usage
		wd=$2
		shift 2
	fi
	[ "${1:-}" = -- ] || usage
	shift
	[ $# -ge 1 ] || usage
	# Build it in a subshell: cmd_up's own traps must not replace ours.
	(cmd_up "$wp" "$wh" "$wr" "$wd")
	child=
	# On a signal: TERM to CMD, wait for it; the EXIT trap tears down.
	trap 'cmd_down "$wp" || true' EXIT
	trap '[ -z "$child" ] || { kill -TERM "$child" 2>/dev/null || true; wait "$child" 2>/dev/null || true; }; exit 143' TERM
	trap '[ -z "$child" ] || { kill -TERM "$child" 2>/dev/null || true; wait "$child" 2>/dev/null || true; }; exit 130' INT
	trap '[ -z "$child" ] || { kill -TERM "$child" 2>/dev/null || true; wait "$child" 2>/dev/null || true; }; exit 129' HUP
	# CMD runs in the background so that `wait` returns when a signal
	# arrives (a shell runs traps only between commands).
	UNISUM_NETNS_PREFIX=$wp UNISUM_NETNS_HOSTS=$wh UNISUM_NETNS_SH=$SELF "$@" &
	child=$!
	st=0
	wait "$child" || st=$?
	child=
	exit "$st"
}

# /proc/stat's busy and total jiffies over all CPUs.
cpu_jiffies() {
	awk '/^cpu /{ t = 0; for (i = 2; i <= NF; i++) t += $i; print t - $5 - $6, t }' /proc/stat
}

cmd_selftest() {
	need_root
	sh "$(dirname "$SELF")/../../scripts/install-deps.sh" bench
	P=nsst$$ rate=200mbit
	trap 'cmd_down "$P" >/dev/null 2>&1 || true' EXIT
	trap 'exit 130' INT TERM HUP
	# In a subshell: cmd_up's own traps must not replace ours.
	(cmd_up "$P" 3 "$rate")
	a0=$(host_addr "$P" 0)
	a2=$(host_addr "$P" 2)
	ip netns exec "$P-h1" ping -q -c 2 -i 0.2 -W 2 "$a0" >/dev/null || die "selftest: h1 cannot ping h0"
	ip netns exec "$P-h0" ping -q -c 2 -i 0.2 -W 2 "$a2" >/dev/null || die "selftest: h0 cannot ping h2"
	echo "$ME: selftest: ping h1->h0, h0->h2 ok"
	c0=$(cpu_jiffies)
	mbit=$(iperf_mbit "$P" 1 0)
	c1=$(cpu_jiffies)
	[ -n "$mbit" ] || die "selftest: no iperf3 result"
	bps=$(rate_bytes "$rate")
	# c0, c1: busy and total jiffies before and after.
	verdict=$(echo "$mbit $bps $c0 $c1 $(nproc)" | awk -v me="$ME" -v rate="$rate" '{
		ideal = $2 * 8 * 1448 / 1514
		r = $1 * 1e6 / ideal
		ok = (r >= 0.9 && r <= 1.02)
		printf "%s: selftest: TCP h1->h0 %.1f Mbit/s, ratio %.3f to %s x 1448/1514 = %.1f Mbit/s (%s); machine CPU busy %.0f%% of %d cores (other load included)\n",
			me, $1, r, rate, ideal / 1e6, ok ? "ok" : "NOT in 0.9-1.0", 100 * ($5 - $3) / ($6 - $4), $7
		if (!ok) print "FAIL"
	}')
	echo "$verdict" | grep -v '^FAIL$'
	cmd_down "$P"
	trap - EXIT INT TERM HUP
	echo "$ME: selftest: down, nothing left"
	case $verdict in *FAIL) exit 1 ;; esac
}

# iperf3 from host C to host S of cluster P for 3 s: the receiver's
# Mbit/s.
iperf_mbit() { # P C S
	a=$(host_addr "$1" "$3")
	ip netns exec "$1-h$3" iperf3 -s -1 -B "$a" >/dev/null 2>&1 &
	srv=$!
	n=0
	until ip netns exec "$1-h$3" ss -Hltn 'sport = :5201' | grep -q .; do
		n=$((n + 1))
		[ $n -lt 50 ] || die "selftest: iperf3 server does not listen"
		sleep 0.1
	done
	out=$(ip netns exec "$1-h$2" iperf3 -c "$a" -t 3 -f k) || die "selftest: iperf3 failed: $out"
	wait "$srv" || true
	echo "$out" | awk '/receiver/ { for (i = 2; i <= NF; i++) if ($i ~ /bits\/sec/) printf "%.3f\n", $(i - 1) / 1000 }'
}

cmd_selftest_racks() {
	need_root
	command -v iperf3 >/dev/null 2>&1 || die "iperf3 is missing: sh scripts/install-deps.sh"
	P=nsrk$$
	trap 'cmd_down "$P" >/dev/null 2>&1 || true' EXIT
	trap 'exit 130' INT TERM HUP
	(NETNS_RACKS=2 NETNS_UPLINK=100mbit cmd_up "$P" 4 200mbit)
	within=$(iperf_mbit "$P" 1 0)
	across=$(iperf_mbit "$P" 2 0)
	(cmd_rate "$P" 1 50mbit >/dev/null)
	slowed=$(iperf_mbit "$P" 1 0)
	cmd_down "$P"
	trap - EXIT INT TERM HUP
	# Ideal TCP goodput is RATE x 1448/1514: 191.3, 95.6 and 47.8 Mbit/s.
	echo "$within $across $slowed" | awk -v me="$ME" '{
		w = $1 / 191.3; a = $2 / 95.6; s = $3 / 47.8
		ok = w >= 0.85 && w <= 1.02 && a >= 0.85 && a <= 1.02 && s >= 0.85 && s <= 1.02
		printf "%s: selftest-racks: within a rack %.1f Mbit/s (%.2f of 200mbit), across the 100mbit uplink %.1f (%.2f), after rate 50mbit %.1f (%.2f): %s; down, nothing left\n",
			me, $1, w, $2, a, $3, s, ok ? "ok" : "NOT in 0.85-1.02"
		exit !ok
	}'
}

[ $# -ge 1 ] || usage
cmd=$1
shift
case $cmd in
up) cmd_up "$@" ;;
down) cmd_down "$@" ;;
check) cmd_check "$@" ;;
addr) cmd_addr "$@" ;;
exec) cmd_exec "$@" ;;
with) cmd_with "$@" ;;
selftest) cmd_selftest "$@" ;;
selftest-racks) cmd_selftest_racks "$@" ;;
rate) cmd_rate "$@" ;;
-h | --help | help) usage ;;
*) usage ;;
esac
