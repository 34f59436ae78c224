#!/bin/sh
# sanitize.sh - the C test suites again under a sanitizer.
#
#   tests/sanitize.sh asan|tsan [BUILD_DIR]
#   tests/sanitize.sh both                        (build-asan and build-tsan)
#   tests/sanitize.sh build asan|tsan [BUILD_DIR]    (the build alone)
#
# asan: AddressSanitizer + UndefinedBehaviorSanitizer + LeakSanitizer;
# tsan: ThreadSanitizer.  Builds the whole tree with clang into BUILD_DIR
# (default build-asan or build-tsan), then runs every ctest entry except
# the Python suite (it loads the library into an uninstrumented
# interpreter), the fuzzers (they carry their own sanitizers) and the
# check of the commands (no C in it).  A tree's tests carry its kind
# (asan_integration_test_sums).  `both` builds the two trees and runs
# their tests in one ctest (make test): each run alone kept the 2 cores
# only about 63% busy (its tests wait on timeouts and daemons, and its
# last tests run alone), which the other's tests fill.
#
# Every process of every job (scheduler, servers, workers, launchers)
# writes its sanitizer reports to files in one directory, so a report from
# a process whose exit status a test does not look at (a survivor that is
# expected to fail, say) still fails the run.  Exits 0 only when every
# test passed and no process reported anything.
set -u

BUILD_ONLY=0
if [ "${1:-}" = build ]; then
	BUILD_ONLY=1
	shift
fi
KIND=${1:-}
case $KIND in
asan | tsan) ;;
both)
	if [ "$BUILD_ONLY" = 1 ] || [ $# -gt 1 ]; then
		echo "usage: $0 both (the trees are build-asan and build-tsan)" >&2
		exit 2
	fi
	;;
*)
	echo "usage: $0 [build] asan|tsan [BUILD_DIR], or $0 both" >&2
	exit 2
	;;
esac
ROOT=$(cd "$(dirname "$0")/.." && pwd) || exit 2
cd "$ROOT" || exit 2
CLANG=${CLANG:-clang}
JOBS=$(nproc)

if ! command -v "$CLANG" >/dev/null 2>&1; then
	echo "sanitize: FAIL: '$CLANG' not found; install the Debian package clang (apt-get install clang)" >&2
	exit 2
fi

# build KIND DIR: configures and builds tree DIR for sanitizer KIND.
build() {
	case $1 in
	asan) flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -O1 -g" ;;
	tsan) flags="-fsanitize=thread -O1 -g" ;;
	esac
	echo "sanitize[$1]: building $2"
	if ! CC=$CLANG cmake -S . -B "$2" -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_FLAGS="$flags" \
		-DUNISUM_COPY_TO_PYTHON=OFF -DUNISUM_TEST_ORDER="$1" -DUNISUM_TEST_TAG="$1_" >/dev/null ||
		! cmake --build "$2" -j "$JOBS" -- --no-print-directory >"$2.log" 2>&1; then
		tail -n 40 "$2.log" >&2
		echo "sanitize[$1]: FAIL: the build failed (log: $2.log)" >&2
		exit 1
	fi
}
if [ "$KIND" = both ]; then
	build asan build-asan
	build tsan build-tsan
else
	BUILD=${2:-build-$KIND}
	build "$KIND" "$BUILD"
fi
[ "$BUILD_ONLY" = 1 ] && exit 0

REPORTS=$(mktemp -d "${TMPDIR:-/tmp}/sanitize-$KIND.XXXXXX") || exit 2
trap 'rm -rf "$REPORTS"' EXIT
# exitcode 66 makes a report fail the process that saw it; the files catch
# the rest.  Thread leaks are real here too: every test program shuts the
# library down, even after an expected failure.
export ASAN_OPTIONS="detect_leaks=1:log_path=$REPORTS/report:exitcode=66"
export UBSAN_OPTIONS="print_stacktrace=1:log_path=$REPORTS/report:exitcode=66"
export TSAN_OPTIONS="halt_on_error=1:exitcode=66:log_path=$REPORTS/report"
# UCX (the UCX transport's tests) patches mmap and malloc at run time to
# watch memory for its RDMA registration cache; with those hooks
# LeakSanitizer's tracer crashed at the exit of about half the processes
# that had started UCX ("Tracer caught signal 11").  They serve RDMA
# registrations only: off here.  What UCX allocates for itself and never
# frees is not unisum's to report (tests/lsan-ucx.supp); unisum's own
# leaks still fail the run.
export UCX_MEM_MMAP_HOOK_MODE=none UCX_MEM_MALLOC_HOOKS=n
export LSAN_OPTIONS="suppressions=$ROOT/tests/lsan-ucx.supp:print_suppressions=0"
# Both runs leave out the biggest tensors and the largest jobs (see
# tests/integration/test_sums.sh and test_local.sh): they look for memory
# and thread errors, which the plain run's arithmetic checks do not need
# repeated at every size, and make test stays within its 15 minutes.
export UNISUM_TEST_LIGHT=1
started=$(date +%s)
# TSan also leaves out what it cannot see into, which costs make test's
# 15 minutes about two:
#   - the multi-node launches (test_nodes, test_ssh, test_slurm): the
#     launcher is one thread and an event loop, and the scheduler code they
#     run is in the unit tests' in-process jobs;
#   - test_local: the workers of a machine synchronise across processes
#     (shared memory, futexes), which TSan does not follow; its threads
#     within a process are test_job's in-process jobs;
#   - the reducer's unit test: single-threaded loops;
#   - test_wire_version: one message refused, single-threaded.
# ASan runs them all.  Neither runs the launcher's elastic jobs
# (test_elastic_digits, PyTorch; test_elastic_hosts, ssh): the C library's
# elastic paths are test_elastic's, which both run.  Nor test_memory_limit:
# a sanitizer reserves terabytes of address space for its shadow, which
# `ulimit -v` forbids, and triples what a process touches, which moves
# the memory cgroup's OOM kill; the paths it checks are the plain run's.
COMMON='python_|fuzz_|deps_|docs_|integration_test_install|integration_test_elastic_|integration_test_memory_limit'
TSAN="integration_test_nodes|integration_test_ssh|integration_test_slurm|integration_test_local|unit_test_reducer|integration_test_wire_version"
# And the jobs of one-threaded code (the launcher: test_cluster's racks,
# test_output, test_blame, test_scale; test_example, test_bad_input,
# test_fds_limit, test_auth: a start refused, one process): ASan runs
# them, and their servers' and workers' threads are test_sums' and
# test_failover's, which TSan runs.
TSAN="$TSAN|integration_test_cluster|integration_test_output|integration_test_blame|integration_test_scale|integration_test_example|integration_test_bad_input|integration_test_fds_limit|integration_test_auth"
# ASan leaves out test_ssh: the launcher's code it runs is test_slurm's
# (the same remote form over srun, much faster to start), and the ssh
# host and word parsers have unit tests that ASan runs.  And three
# failure suites that TSan runs (test_chaos, test_elastic, test_pipeline):
# what they add to the plain run is threads racing over a loss or a
# queue, where TSan found four races (the commits of 20f32d1, 041f6d2,
# 9299976, 5411ccb); their memory paths are test_failover's (a server
# lost, a round restored), test_chaos_modes' (replicas, modes, feedback)
# and test_job's (a worker leaving in flight), which ASan runs.  (make
# test's 10 minutes: each of the two runs alone cost about 2 of them.)
ASAN="integration_test_ssh|integration_test_chaos\$|integration_test_elastic|integration_test_pipeline"
# Slots are half-cores, as in make check (CMakeLists.txt's test loads).
# Both trees: one ctest over a directory that holds the two (ctest's
# subdirs), each tree's exclusions applied to its own tests' names, with
# a core and a half more, as measured (AMD EPYC, 2 cores,
# 2026-12-07: one after the other at 5 slots, 103 + 122 s; side by side
# at 5 slots 225 s, the cores 70% busy; at 7 slots 164, 172 and 181 s,
# 88% busy, every test passed.  With each tree's own loads, 2026-12-08:
# 5 slots 205 s, 7 slots 165 s, 9 slots 153 s, where TSan's failover and
# chaos took 47 s each against 27 alone: 7 leaves the tests' time bounds
# their margin.)
slots=$((2 * JOBS + 1))
case $KIND in
asan) EXCLUDE="$COMMON|$ASAN" ;;
tsan) EXCLUDE="$COMMON|$TSAN" ;;
both)
	slots=$((3 * JOBS + 1))
	EXCLUDE="^(asan|tsan)_.*($COMMON)|^asan_.*($ASAN)|^tsan_.*($TSAN)"
	BUILD=$(mktemp -d "${TMPDIR:-/tmp}/sanitize-both.XXXXXX") || exit 2
	trap 'rm -rf "$REPORTS" "$BUILD"' EXIT
	printf 'subdirs("%s")\nsubdirs("%s")\n' "$ROOT/build-asan" "$ROOT/build-tsan" \
		>"$BUILD/CTestTestfile.cmake" || exit 2
	;;
esac
(cd "$BUILD" && ctest --output-on-failure -j "$slots" -E "$EXCLUDE")
rc=$?
took=$(($(date +%s) - started))

found=$(ls "$REPORTS" | wc -l)
if [ "$found" -ne 0 ]; then
	for f in "$REPORTS"/*; do
		echo "---- $f" >&2
		head -n 60 "$f" >&2
	done
	echo "sanitize[$KIND]: FAIL: $found process(es) reported errors (above)" >&2
	exit 1
fi
if [ "$rc" -ne 0 ]; then
	echo "sanitize[$KIND]: FAIL: some tests failed (above), in $took s" >&2
	exit 1
fi
echo "sanitize[$KIND]: every test passed and no process reported an error, in $took s"
