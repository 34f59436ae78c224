# Integration: an emulated cluster.  bench/cluster/netns.sh builds hosts as
# network namespaces on a bridge with shaped links; `unisum launch` starts
# the scheduler, the servers and the workers each inside its host, so every
# byte between hosts crosses a veth link over real TCP.  Two worker hosts
# with a colocated server each and one CPU-only host, 1 Gbit/s links; then
# two machines of two workers each (shared memory inside a namespace).
# Every result is checked exactly, the placement gives the CPU-only server
# the share of Theorem 1, and nothing the test made (namespaces, links) is
# left behind.  Then fit mode on links at 250 Mbit/s and 10 Gbit/s: the
# faster network gets the larger partition size and credit.
#
# Needs root (network namespaces): otherwise it is reported as skipped.
# UNISUM_TEST_LIGHT=1 (the sanitizer runs) keeps the first job only.
. "$(dirname "$0")/lib.sh"

P="ust$$"
hosts_up "$P" 3 1gbit
reaches() { ip netns exec "$P-h$1" ping -c 1 -W 2 "$(sh "$NETNS" addr "$P" "$2")" >/dev/null; }
expect "the hosts reach each other" reaches 1 0

# (cluster_job: lib.sh's, on these 3 hosts.)
cluster_job "2 worker hosts + 1 CPU-only host: every dtype, 0 elements to 3 partitions" 2 1 sums
# n = 2, k = 1: the CPU-only server holds 2(n-1)/(n^2+kn-2k) = 1/2 of the
# bytes, each colocated one (n-k)/(n^2+kn-2k) = 1/4.
expect "the scheduler found 2 worker hosts and 1 CPU-only host" \
	contains "$LAST" "placement optimal: 2 worker hosts, 2 of them with servers \(colocated\), 1 CPU-only"
expect "the CPU-only server's share is 1/2" \
	contains "$LAST" "server 2 at [0-9.]+, CPU-only, share 0\.5000"
expect "the colocated servers' shares are 1/4" \
	contains "$LAST" "server 0 at [0-9.]+, colocated, share 0\.2500"
expect "the bytes placed match the shares" \
	contains "$LAST" "server 2 holds [0-9]+ bytes, 0\.(49[5-9]|50[0-5])[0-9] of all"
expect "workers reached the servers on other hosts over TCP" \
	contains "$LAST" "scheduler on 10\.[0-9.]+:[0-9]+"
# The sanitizer runs (UNISUM_TEST_LIGHT=1) keep only the first job.
if [ "${UNISUM_TEST_LIGHT:-0}" != 1 ]; then
	cluster_job "2 machines of 2 workers in 2 namespaces" 4 2 sums
	UNISUM_PLACEMENT=hash cluster_job "the same with BytePS's hash placement" 2 1 sums
	# Racks from the launcher: host 0 in rack 0, hosts 1 and 2 in rack 1;
	# each rack gets its own placement among its servers and worker hosts.
	LAUNCH_OPTS="--worker-racks 0,1 --server-racks 0,1,1" \
		cluster_job "racks from --worker-racks and --server-racks" 2 1 sums
	expect "rack 1's placement: its worker host, its colocated server, its CPU-only server" \
		contains "$LAST" "placement rack 1: 1 worker hosts, 1 of them with servers, 1 CPU-only"
	expect "rack 0's placement: its worker host and its colocated server" \
		contains "$LAST" "placement rack 0: 1 worker hosts, 1 of them with servers, 0 CPU-only"
fi

sh "$NETNS" down "$P"

# Fit mode, the default, on shaped links at two very different rates: the
# same job (nothing set) on 3 hosts at 250 Mbit/s and at 10 Gbit/s.
# Worker 0 measures what its pushes get and every worker fits the
# partition size and credit to it, so the faster network must end with
# the larger partitions and credit, and every sum stays exact while the
# setting changes (check_sums tune: 16 rounds of a 4 MiB tensor and a
# small one, every rank printing its partition size in every round).
# fit_at RATE: runs the job; sets FIT to "partition credit" of the fit
# kept for good, or "" when none was logged.
fit_at() {
	FIT=""
	if ! sh "$NETNS" up "$P" 3 "$1" >/dev/null; then
		FAILS=$((FAILS + 1))
		echo "FAIL the emulated cluster at $1 could not be built"
		return
	fi
	cluster_job "fit mode at $1, nothing set: 16 rounds" 2 1 tune 16 4
	sh "$NETNS" down "$P"
	expect "fit mode at $1: every rank's sums exact in all 16 rounds" \
		sh -c "[ \$(echo \"\$1\" | grep -c '16 tuned rounds ok') -eq 2 ]" - "$LAST"
	sizes=$(echo "$LAST" | sed -n 's/.*partition bytes by round: //p' | sort -u)
	expect "fit mode at $1: every rank used the same partition size in every round" \
		[ "$(echo "$sizes" | grep -c .)" -eq 1 ]
	FIT=$(echo "$LAST" | sed -n 's/.*autotune fit:.*partition \([0-9]*\) B, credit \([0-9]*\) B from step [0-9]* for good.*/\1 \2/p')
	expect "fit mode at $1: worker 0 logged the fit it kept ($FIT)" [ -n "$FIT" ]
	last=$(echo "$sizes" | tr ' ' '\n' | grep . | tail -1)
	expect "fit mode at $1: the last rounds used it" [ "$last" = "${FIT%% *}" ]
}
if [ "${UNISUM_TEST_LIGHT:-0}" != 1 ]; then
	fit_at 250mbit
	slow=$FIT
	# What worker 0 measures at 10 Gbit/s is what 2 shared cores can push
	# through the veths at that moment: on a busy machine (a noisy
	# neighbour, the sanitizer builds beside) it can fall under the 1
	# Gbit/s that larger partitions need, and fit the same as 250 Mbit/s.
	# That is measurement, not the fit: up to 3 tries, each one reported.
	for try in 1 2 3; do
		fit_at 10gbit
		fast=$FIT
		[ -n "$slow" ] && [ -n "$fast" ] && [ "${fast%% *}" -gt "${slow%% *}" ] && break
		echo "     (try $try at 10gbit fit $fast, no larger than $slow: $(echo "$LAST" |
			sed -n 's/.*\(the link at [0-9.]* MB\/s\).*/\1/p' | head -1))"
	done
	expect "the faster network got larger partitions ($slow against $fast: partition, credit)" \
		sh -c "[ -n '$slow' ] && [ -n '$fast' ] && [ ${fast%% *} -gt ${slow%% *} ]"
	expect "... and a larger credit" \
		sh -c "[ -n '$slow' ] && [ -n '$fast' ] && [ ${fast##* } -gt ${slow##* } ]"
fi
# Racks (the sync-modes benchmark's topology): within a rack a host gets
# its link's rate, across racks the shaped uplink's, and `rate` slows one
# host down (iperf3, 3 s each; the selftest tears its cluster down).
if [ "${UNISUM_TEST_LIGHT:-0}" != 1 ]; then
	expect "racks: full rate within a rack, the uplink's across, a straggler's after rate" \
		sh "$NETNS" selftest-racks
fi
expect "no namespace or link of the test is left" sh "$NETNS" check "$P"
finish
