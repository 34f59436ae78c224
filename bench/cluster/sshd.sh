#!/bin/sh
# sshd.sh - a real OpenSSH server on every host of an emulated cluster
# (netns.sh), for `unisum launch -H`.  Needs root and openssh-server.
#
#   sshd.sh up PREFIX H DIR     keys in DIR (made once: a host key, a user
#                               key and its authorized_keys), one sshd per
#                               host PREFIX-h0 .. h<H-1> on its address;
#                               returns once each answers
#   sshd.sh args DIR            prints the ssh options that reach them
#                               (for --ssh-args)
#   sshd.sh down DIR            stops every sshd started with DIR
#
# Every host shares the machine's file system, users and hostname, so one
# key pair serves all; sshd runs with -f /dev/null and the options it
# needs on the command line, logging to DIR/sshd<i>.log.
set -eu

HERE=$(cd "$(dirname "$0")" && pwd)
NETNS="$HERE/netns.sh"

args() {
	echo "-i $1/user -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR"
}

case ${1:-} in
up)
	[ $# -eq 4 ] || { echo "usage: $0 up PREFIX H DIR" >&2; exit 2; }
	P=$2 H=$3 DIR=$4
	mkdir -p "$DIR" /run/sshd
	[ -f "$DIR/host" ] || ssh-keygen -q -t ed25519 -N '' -f "$DIR/host" </dev/null
	[ -f "$DIR/user" ] || ssh-keygen -q -t ed25519 -N '' -f "$DIR/user" </dev/null
	cp "$DIR/user.pub" "$DIR/authorized_keys"
	i=0
	while [ "$i" -lt "$H" ]; do
		sh "$NETNS" exec "$P" "$i" "$(command -v sshd)" -f /dev/null -h "$DIR/host" \
			-o ListenAddress="$(sh "$NETNS" addr "$P" "$i")" \
			-o AuthorizedKeysFile="$DIR/authorized_keys" -o PermitRootLogin=prohibit-password \
			-o PidFile="$DIR/sshd$i.pid" -o StrictModes=no -o MaxStartups=100 \
			-E "$DIR/sshd$i.log"
		i=$((i + 1))
	done
	# Each must answer (from host 0) before the caller goes on.
	i=0
	while [ "$i" -lt "$H" ]; do
		a=$(sh "$NETNS" addr "$P" "$i")
		n=0
		# shellcheck disable=SC2046
		until sh "$NETNS" exec "$P" 0 ssh -o BatchMode=yes $(args "$DIR") "$a" true 2>/dev/null; do
			n=$((n + 1))
			[ "$n" -lt 50 ] || { echo "sshd.sh: sshd on $a does not answer" >&2; exit 1; }
			sleep 0.1
		done
		i=$((i + 1))
	done
	;;
args)
	[ $# -eq 2 ] || { echo "usage: $0 args DIR" >&2; exit 2; }
	args "$2"
	;;
down)
	[ $# -eq 2 ] || { echo "usage: $0 down DIR" >&2; exit 2; }
	for f in "$2"/sshd*.pid; do
		[ -f "$f" ] && kill "$(cat "$f")" 2>/dev/null
		rm -f "$f"
	done
	true
	;;
*)
	echo "usage: $0 up PREFIX H DIR | args DIR | down DIR" >&2
	exit 2
	;;
esac
