#!/bin/sh
# run.sh - builds a fuzzer and runs it for a while.
#
#   tests/fuzz/run.sh SECONDS [BUILD_DIR] [TARGET]
#
# TARGET is wire (the wire codec, tests/fuzz/fuzz_wire.c; the default) or
# auth (the connection handshake, tests/fuzz/fuzz_auth.c).  Builds the
# harness with libFuzzer, AddressSanitizer and UndefinedBehaviorSanitizer
# into BUILD_DIR (default build/fuzz, relative to the repository root),
# then fuzzes for SECONDS on a scratch copy of tests/fuzz/corpus/TARGET:
# the committed seeds are never written to.
# Exits 0 only when the fuzzer ran the whole time without a crash, leak,
# undefined behaviour, timeout or out-of-memory; otherwise it prints the
# input that failed (hex) and where it was saved.  A missing clang or
# libFuzzer is a failure that names the Debian package to install, never a
# silent skip.  Set CLANG to use another clang binary.
set -u

TARGET=${3:-wire}
NAME=fuzz_$TARGET

die() {
	echo "$NAME: $*" >&2
	exit 2
}

if [ $# -lt 1 ] || [ $# -gt 3 ]; then
	die "usage: $0 SECONDS [BUILD_DIR] [wire|auth]"
fi
case $TARGET in
wire) SOURCES="src/wire/wire.c src/wire/dtype.c src/rendezvous/proto.c" LIBS= ;;
auth) SOURCES="src/transport/auth.c" LIBS=-lsodium ;;
*) die "TARGET must be wire or auth, got '$TARGET'" ;;
esac
SECONDS_TO_RUN=$1
case $SECONDS_TO_RUN in
'' | *[!0-9]*) die "SECONDS must be a whole number of seconds, got '$SECONDS_TO_RUN'" ;;
esac
[ "$SECONDS_TO_RUN" -ge 1 ] || die "SECONDS must be at least 1"

ROOT=$(cd "$(dirname "$0")/../.." && pwd) || die "cannot find the repository root"
cd "$ROOT" || die "cannot cd to $ROOT"
BUILD=${2:-build/fuzz}
mkdir -p "$BUILD" || die "cannot create the build directory $BUILD"
BUILD=$(cd "$BUILD" && pwd)
CLANG=${CLANG:-clang}

# The toolchain: clang itself, then the libFuzzer runtime it links against.
if ! command -v "$CLANG" >/dev/null 2>&1; then
	die "FAIL: '$CLANG' not found; install the Debian package clang-14 (apt-get install clang-14 libclang-rt-14-dev) or set CLANG"
fi
major=$("$CLANG" -dumpversion 2>/dev/null | cut -d. -f1)
rt_pkg="libclang-rt-${major:-14}-dev"
# Its own name: ctest runs the wire and auth targets at once, in one
# build directory.
probe="$BUILD/probe-$TARGET.$$"
printf '%s\n' '#include <stddef.h>' '#include <stdint.h>' \
	'int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n);' \
	'int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { (void)d; (void)n; return 0; }' \
	>"$probe.c"
if ! "$CLANG" -fsanitize=fuzzer,address,undefined "$probe.c" -o "$probe" >"$probe.log" 2>&1; then
	sed 's/^/    /' "$probe.log" >&2
	die "FAIL: $CLANG cannot link a libFuzzer target; install the Debian package $rt_pkg (apt-get install $rt_pkg)"
fi
rm -f "$probe" "$probe.c" "$probe.log"

# The harness.
BIN="$BUILD/$NAME"
echo "$NAME: building $BIN"
if ! "$CLANG" -std=c11 -D_GNU_SOURCE -g -O1 -Wall -Wextra \
	-fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
	-Iinclude -Isrc $SOURCES "tests/fuzz/$NAME.c" $LIBS -o "$BIN"; then
	die "FAIL: the harness does not build (see the compiler output above)"
fi

# A scratch corpus, so new inputs never land in the committed seeds.
SEEDS="$ROOT/tests/fuzz/corpus/$TARGET"
[ -d "$SEEDS" ] || die "FAIL: no seed corpus at $SEEDS (run tests/fuzz/make_corpus.py)"
# Seeds of another wire version stop at the version check: a fuzzer fed
# them tests almost nothing, and says nothing of it.
/usr/bin/python3 "$ROOT/tests/fuzz/make_corpus.py" --check "$ROOT/tests/fuzz/corpus" >&2 ||
	die "FAIL: the seed corpus is not what make_corpus.py writes (WIRE_VERSION changed?): run tests/fuzz/make_corpus.py"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/$NAME.XXXXXX") || die "cannot create a scratch directory"
trap 'rm -rf "$WORK"' EXIT
mkdir "$WORK/corpus" "$WORK/artifacts"
cp "$SEEDS"/* "$WORK/corpus/"
LOG="$BUILD/$NAME.log"
started=$(date +%s)
DICT=
[ -f "$ROOT/tests/fuzz/$TARGET.dict" ] && DICT="-dict=$ROOT/tests/fuzz/$TARGET.dict"

echo "$NAME: fuzzing for $SECONDS_TO_RUN s on a copy of $(ls "$SEEDS" | wc -l) seeds (log: $LOG)"
# -timeout: one input running 10 s is a hang.  detect_leaks is on by default
# under ASan; halt_on_error and the UBSan flags make every report fatal.
ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:halt_on_error=1:abort_on_error=0} \
UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1} \
	"$BIN" -max_total_time="$SECONDS_TO_RUN" -timeout=10 -rss_limit_mb=2048 \
	-print_final_stats=1 -artifact_prefix="$WORK/artifacts/" \
	$DICT "$WORK/corpus" >"$LOG" 2>&1
rc=$?
wall=$(($(date +%s) - started))

execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$LOG" | tail -n 1)
took=$(sed -n 's/^Done [0-9]* runs in \([0-9]*\) second.*/\1/p' "$LOG" | tail -n 1)
cov=$(grep -o 'cov: [0-9]* ft: [0-9]* corp: [0-9]*/[0-9]*[a-zA-Z]*' "$LOG" | tail -n 1)
[ -n "$execs" ] || execs=$(grep -o '^#[0-9]*' "$LOG" | tail -n 1 | tr -d '#')
[ -n "$took" ] || took=$wall

# Any saved artifact is a failure too, whatever the exit status says.
found=$(ls "$WORK/artifacts" | wc -l)
if [ "$rc" -ne 0 ] || [ "$found" -ne 0 ]; then
	# The report: from the first line that says what went wrong.
	sed -n '/ERROR: \|invariant broken\|runtime error:\|deadly signal\|ALARM:\|out-of-memory/,$p' "$LOG" |
		grep -v '^ *0x[0-9a-f]*: \|^Shadow\|^  [A-Z][a-zA-Z ]*: ' | head -n 80 >&2
	mkdir -p "$BUILD/artifacts"
	for f in "$WORK"/artifacts/*; do
		[ -f "$f" ] || continue
		cp "$f" "$BUILD/artifacts/"
		echo "$NAME: failing input $BUILD/artifacts/$(basename "$f"):" >&2
		od -An -tx1 -v "$f" | sed 's/^/    /' >&2
	done
	echo "$NAME: ${execs:-?} executions in $took s, FAILED (libFuzzer exit $rc, $found failing input(s); full log $LOG)"
	exit 1
fi
echo "$NAME: coverage at the end: ${cov:-unknown}"
echo "$NAME: ${execs:-?} executions in $took s, 0 crashes"
