# Integration: `unisum launch` forwards its children's output with a rank
# prefix, progress bars included (issue 47).  A bar redraws its line with
# '\r' frames: into a pipe each bar leaves one prefixed line (its last
# frame) at the child's next newline, never a line hundreds of frames
# long; on a terminal (a pty, from script(1)) the frames redraw in place,
# and another process's line never lands on a frame's line.  Then
# --cpu-report's lines (issue 50).
. "$(dirname "$0")/lib.sh"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# Rank 0 draws bars: "A" cleared before a line (tqdm's leave=False), "B"
# ended by its final frame's newline (leave=True), frames split across
# writes; "C" shows a frame while rank 1 prints a line.  Both then sum
# one round, so that the job ends as jobs do.
cat >"$TMP/bars.sh" <<'EOF'
if [ "$RANK" = 0 ]; then
	printf '\rA 1'
	sleep 0.2
	printf '\rA 2\rA 3\r      \rafter A\n\rB 1\rB 2\rB final\nplain line\n'
	printf '\rC 1\rC 2\r'
	sleep 1
	printf 'C end\n'
else
	sleep 0.7
	echo other
fi
exec "$CHECK" rounds 1 >/dev/null
EOF
export CHECK

# Into a pipe.
out=$(timeout 60 "$UNISUM" launch -w 2 -s 1 --local-size 1 -- sh "$TMP/bars.sh" 2>/dev/null)
rc=$?
expect "bars into a pipe: the job ends well (exit $rc)" [ $rc -eq 0 ]
w0=$(printf '%s\n' "$out" | grep '^\[worker 0\]' | tr '\n' '|')
expect "... rank 0's lines are each bar's last frame and its lines ($w0)" \
	[ "$w0" = "[worker 0] A 3|[worker 0] after A|[worker 0] B final|[worker 0] plain line|[worker 0] C end|" ]
expect "... no carriage return reaches the pipe" sh -c "! printf '%s' \"\$1\" | grep -q \"\$(printf '\r')\"" - "$out"
expect "... rank 1's line is whole" contains "$out" '^\[worker 1\] other$'

# On a terminal.
if command -v script >/dev/null 2>&1; then
	tty=$(timeout 60 script -qec "'$UNISUM' launch -w 2 -s 1 --local-size 1 -- sh '$TMP/bars.sh'" \
		/dev/null 2>/dev/null | tr -d '\r')
	# With the carriage returns gone, a frame and what redraws it share a line.
	expect "bars on a terminal: the frames redraw rank 0's line, each prefixed" \
		contains "$tty" '^\[worker 0\] A 1\[worker 0\] A 2\[worker 0\] A 3\[worker 0\] +\[worker 0\] after A$'
	expect "... rank 1's line starts a line of its own, after the frame it would overwrite" \
		contains "$tty" '^\[worker 1\] other$'
	expect "... and the bar goes on after it" contains "$tty" '^\[worker 0\] C 2\[worker 0\] C end$'
else
	skip "script(1) (bsdutils) is missing: the terminal part cannot run"
fi
[ "$FAILS" -eq 0 ] || printf '%s\n' "--- pipe:" "$out" "--- terminal:" "${tty:-}"

# --cpu-report: what each process used, by role and in all, as wait4 gives
# it.  Worker 1 spins for a while first, so its line must show it.
cat >"$TMP/spin.sh" <<'EOF'
if [ "$RANK" = 1 ]; then
	i=0
	while [ $i -lt 300000 ]; do i=$((i + 1)); done
fi
exec "$CHECK" rounds 2 >/dev/null
EOF
cpu=$(timeout 60 "$UNISUM" launch --cpu-report -w 2 -s 1 --local-size 1 -- sh "$TMP/spin.sh" 2>&1 >/dev/null)
num='[0-9]+\.[0-9]{3} s'
for who in 'server 0' 'worker 0' 'worker 1' 'launcher\+scheduler' 'all 1 servers' 'all 2 workers' \
	'the whole job'; do
	expect "--cpu-report: a line for $who" contains "$cpu" \
		"^unisum launch: cpu $who +user +$num +system +$num +switches [0-9]+ voluntary, [0-9]+ involuntary$"
done
user_of() { printf '%s\n' "$cpu" | sed -n "s/^unisum launch: cpu $1 *user *\([0-9.]*\) s.*/\1/p"; }
expect "... worker 1 spun: at least 0.1 s of user CPU ($(user_of 'worker 1') s)" \
	awk -v u="$(user_of 'worker 1')" 'BEGIN { exit !(u >= 0.1) }'
expect "... the workers' sum is worker 0's and worker 1's" \
	awk -v a="$(user_of 'worker 0')" -v b="$(user_of 'worker 1')" -v s="$(user_of 'all 2 workers')" \
	'BEGIN { d = a + b - s; exit !(d < 0.002 && d > -0.002) }'
[ "$FAILS" -eq 0 ] || printf '%s\n' "--- cpu report:" "$cpu"
finish
