# Integration, an elastic job across emulated hosts (network namespaces
# with sshd, as test_ssh.sh): the launcher on host 0 runs 2 workers, the
# discovery script offers host 1 a slot and later host 2 one, which the
# launcher fills over ssh; the job grows to 3 and 4 workers; host 1's
# worker is killed (the job goes on, and the launcher starts another
# there: 4 again); then the script drops host 1, whose worker the launcher
# stops; the 3 left finish every step with every sum exact; nothing is
# left running on any host.  Not under the sanitizers (test_elastic.sh runs
# the C library's elastic paths there).
. "$(dirname "$0")/lib.sh"

ELASTIC="$BUILD/elastic_sums"
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
