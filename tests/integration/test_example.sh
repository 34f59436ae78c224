# Integration: the C example trains identically on 1, 2 and 4 workers.
. "$(dirname "$0")/lib.sh"

curve() {
	timeout 120 "$UNISUM" launch -w "$1" -s "$2" -- "$BUILD/train_logreg" 6 2>/dev/null |
		sed -n 's/.*\(epoch .*\)/\1/p'
}
one=$(curve 1 1)
two=$(curve 2 1)
four=$(curve 4 2)
echo "$two"
expect "the example printed 6 epochs" [ "$(echo "$one" | grep -c epoch)" -eq 6 ]
expect "the loss falls" sh -c "echo '$one' | awk 'NR==1{a=\$4} END{exit !(\$4 < a)}'"
expect "2 workers give the same curve as 1" [ "$one" = "$two" ]
expect "4 workers give the same curve as 1" [ "$one" = "$four" ]

# `unisum bench` launches its own job and prints a row per size.
out=$(timeout 120 "$UNISUM" bench -w 2 -s 2 --sizes 1,2 --seconds 0.2 2>&1)
expect "unisum bench prints a row for 1 MiB" contains "$out" ' 1 MiB +[0-9]+ '
expect "unisum bench prints a row for 2 MiB" contains "$out" ' 2 MiB +[0-9]+ '
finish
