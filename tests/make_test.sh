#!/bin/sh
# make_test.sh - what `make test` runs after the build: every suite (make
# check), then the C suites again under ASan+UBSan and under TSan, the two
# trees' tests side by side in one ctest (tests/sanitize.sh both), and how
# long each part took.
#
# The two sanitizer trees are built meanwhile, in the idle scheduling
# class (SCHED_IDLE: a core no test wants; the children inherit it): the
# suites leave a core idle now and then (a test waiting on a timeout, a
# daemon or a heartbeat), where built after them the two cost make test
# about 90 s of its 10 minutes on 2 cores.  (At nice 19 instead, the
# suites took 45 s longer, 463 s against 418 s, AMD EPYC, 2 cores.)  The
# sanitizer runs build again, incrementally (nothing is left to do), so a
# warm-up that failed or was cut short costs only its time: their build
# is the one that counts, and its errors are shown.
set -u
cd "$(dirname "$0")/.." || exit 2
MAKE=${MAKE:-make}

t0=$(date +%s)
# Its own session, so that a failure below stops the whole build.
setsid sh -c 'chrt -i 0 sh tests/sanitize.sh build asan &&
	chrt -i 0 sh tests/sanitize.sh build tsan' >/dev/null 2>&1 &
warm=$!
# (dash's kill takes no "--": the group is -PID after the signal.)
trap 'kill -TERM -"$warm" 2>/dev/null' EXIT
trap 'exit 130' INT TERM

$MAKE --no-print-directory check ${BUILD:+BUILD="$BUILD"} || exit 1
t1=$(date +%s)
wait "$warm"
trap - EXIT	# the group is gone: its number may be another's by now
t2=$(date +%s)
sh tests/sanitize.sh both || exit 1
t3=$(date +%s)
echo "make test: every suite passed: tests $((t1 - t0)) s, then the sanitizer builds" \
	"$((t2 - t1)) s more, ASan+UBSan and TSan side by side $((t3 - t2)) s; $((t3 - t0)) s in all"
