# Integration: `unisum launch` forwards its children's output with a rank
# prefix, progress bars included (issue 47).  A bar redraws its line with
# '\r' frames: into a pipe each bar leaves one prefixed line (its last
# frame) at the child's next newline, never a line hundreds of frames
# long; on a terminal (a pty, from script(1)) the frames redraw in place,
# and another process's line never lands on a frame's line.
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
finish
