#!/bin/sh
# Runs Horovod's own PyTorch suite on unisum, changing only its import line
# (`import horovod.torch as hvd` becomes `import unisum.torch as hvd`).
#
#   sh tests/horovod/run_suite.sh HOROVOD_CHECKOUT [PYTEST -k EXPRESSION]
#
# HOROVOD_CHECKOUT is a checkout (or export) of github.com/horovod/horovod at
# a release, kept outside this repository's history (e.g. in .horovod/,
# which git ignores): the script reads its test/parallel/test_torch.py and
# test/utils/common.py and copies them to a temporary folder, never into
# the repository.  common.py imports one helper of Horovod's launcher
# (in_thread); a stand-in of ours is put on the path, so no Horovod package
# is needed.
#
# Two kinds of pass, each through the servers (`--local-size 1`: both workers
# through the server) and on one machine (the launcher's default: the two
# workers sum in shared memory, and DistributedOptimizer's gradients live
# in the shared arena):
#   - each test as its own job (`unisum launch -w 2 -s 1`), each rank
#     running that one test: a test that leaves the ranks out of step
#     cannot take the rest down with it.  A stall fails the job after 20 s
#     (UNISUM_STALL_ABORT_MS) and a job is stopped after 120 s.  One line
#     per test (passed / failed / skipped, rank 0's verdict, with the first
#     error line of a failure), then the counts;
#   - the whole suite in one job, as Horovod's CI runs it under
#     horovodrun -np 2: pytest's own counts, rank 0's.
# RUN_SUITE_PASSES picks passes (default: "servers machine whole-servers
# whole-machine").  Not part of `make test`: the results go in the notes.
set -eu
SRC=${1:?usage: run_suite.sh HOROVOD_CHECKOUT [PYTEST -k EXPRESSION]}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
sh "$ROOT/scripts/install-deps.sh" suite
BUILD=${UNISUM_BUILD_DIR:-$ROOT/build}
for f in test/parallel/test_torch.py test/utils/common.py; do
	[ -f "$SRC/$f" ] || { echo "run_suite.sh: $SRC/$f is missing" >&2; exit 2; }
done
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
mkdir -p "$TMP/parallel" "$TMP/utils" "$TMP/shim/horovod/runner/util"
sed 's/^import horovod\.torch as hvd$/import unisum.torch as hvd/' "$SRC/test/parallel/test_torch.py" \
	>"$TMP/parallel/test_torch.py"
grep -q '^import unisum.torch as hvd$' "$TMP/parallel/test_torch.py" ||
	{ echo "run_suite.sh: no 'import horovod.torch as hvd' line to change" >&2; exit 2; }
cp "$SRC/test/utils/common.py" "$TMP/utils/common.py"
touch "$TMP/shim/horovod/__init__.py" "$TMP/shim/horovod/runner/__init__.py" \
	"$TMP/shim/horovod/runner/util/__init__.py"
cat >"$TMP/shim/horovod/runner/util/threads.py" <<'PY'
import threading


def in_thread(target, args=(), name=None, daemon=True, silent=False):
    def run():
        try:
            target(*args)
        except BaseException:
            if not silent:
                raise
    t = threading.Thread(target=run, name=name, daemon=daemon)
    t.start()
    return t
PY
export PYTHONPATH="$ROOT/python:$TMP/shim${PYTHONPATH:+:$PYTHONPATH}"
export UNISUM_STALL_ABORT_MS=20000
cd "$TMP/parallel"
/usr/bin/python3 -m pytest -q -p no:cacheprovider --collect-only ${2:+-k "$2"} test_torch.py |
	grep '::' >"$TMP/tests"
# each_test LABEL LAUNCH-ARGS... : every test as its own job.
each_test() {
	label=$1
	shift
	passed=0 failed=0 skipped=0
	while read -r t; do
		"$BUILD/unisum" launch -w 2 -s 1 "$@" --timeout 120 -- \
			/usr/bin/python3 -m pytest -q -p no:cacheprovider -rfEs "$t" >"$TMP/out" 2>&1 </dev/null || true
		sum=$(sed -n 's/^\[worker 0\] \(.* in [0-9.]*s\).*/\1/p' "$TMP/out" | tail -n 1)
		case $sum in
		*failed* | *error*) v=failed ;;
		*passed*) v=passed ;;
		*skipped*) v=skipped ;;
		*) v=failed ;;
		esac
		why=""
		if [ $v = failed ]; then
			why=$(grep -E '^\[worker [01]\] E  ' "$TMP/out" | head -n 1 | cut -c1-220)
			[ -n "$why" ] || why=$(grep -v '^\[worker' "$TMP/out" | tail -n 2 | tr '\n' ' ' | cut -c1-220)
		elif [ $v = skipped ]; then
			why=$(sed -n 's/^\[worker 0\] SKIPPED [^:]*: *\(.*\)/\1/p' "$TMP/out" | head -n 1 | cut -c1-160)
		fi
		eval "$v=\$(($v + 1))"
		echo "$label: $v ${t#test_torch.py::} $why"
	done <"$TMP/tests"
	echo "Horovod's test_torch.py on unisum, each test its own job, $label: $passed passed, $failed failed, $skipped skipped"
}

# whole_suite LABEL LAUNCH-ARGS... : the suite in one job (one pytest per rank).
whole_suite() {
	label=$1
	shift
	"$BUILD/unisum" launch -w 2 -s 1 "$@" --timeout 900 -- \
		/usr/bin/python3 -m pytest -q -p no:cacheprovider -rfE ${K:+-k "$K"} test_torch.py \
		>"$TMP/out" 2>&1 </dev/null || true
	grep -E '^\[worker 0\] (FAILED|ERROR) ' "$TMP/out" | sed "s/^/$label: /" | cut -c1-240
	sum=$(sed -n 's/^\[worker 0\] \(.* in [0-9.]*s\).*/\1/p' "$TMP/out" | tail -n 1)
	[ -n "$sum" ] || sum="no summary from rank 0: $(tail -n 3 "$TMP/out" | tr '\n' ' ' | cut -c1-300)"
	echo "Horovod's test_torch.py on unisum, the whole suite in one job, $label: $sum"
}

K=${2:-}
for pass in ${RUN_SUITE_PASSES:-servers machine whole-servers whole-machine}; do
	case $pass in
	servers) each_test "through the servers" --local-size 1 ;;
	machine) each_test "on one machine" ;;
	whole-servers) whole_suite "through the servers" --local-size 1 ;;
	whole-machine) whole_suite "on one machine" ;;
	*) echo "run_suite.sh: unknown pass '$pass' (servers, machine, whole-servers, whole-machine)" >&2
	   exit 2 ;;
	esac
done
