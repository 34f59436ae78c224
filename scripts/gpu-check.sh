#!/bin/sh
# gpu-check.sh - issue 22's checks on a machine with a GPU, in one go.
#
#   sh scripts/gpu-check.sh --prepare    # here, on the CPU machine: fills .gpu/
#   sh scripts/gpu-check.sh              # there, with .gpu/ carried along
#
# The lent machine (the `device` tool's) has torch 2.x with CUDA in its
# plain python3, nvcc and cmake, and no Debian packages and no internet:
# libsodium (which the library links) and cmocka (the C tests) may be
# missing, and pytest too.  So --prepare puts in .gpu/ (which git
# ignores) what the checks need from here: the CLI and the library built
# here (they need glibc 2.34 at most), libsodium's shared library, and
# Debian's pytest (pure Python) for a python3 that has none.  There the
# script builds afresh instead when it can (cmake, and sodium.h), without
# the C tests (-DUNISUM_TESTS=OFF), and otherwise uses what was carried:
#
#   run(command="sh scripts/gpu-check.sh", carry=[".gpu"], timeout_s=540)
#
# In order, each step's log under $OUT (default gpu-check-out/), and a
# summary of every step's verdict and figures in $OUT/summary.txt:
#   1. the machine: GPU, driver, torch, CUDA, CPU model;
#   2. the pytest suite under that torch: tests/python (CPU tests) and
#      tests/python/test_cuda.py (CUDA tensors: every dtype, 0 to 64 MiB,
#      exact, for 2 and 3 workers sharing the GPU, through the servers and
#      the local reduce; DistributedOptimizer training of an MLP and a
#      small CNN equal to one process's; broadcasts; fp16 compression);
#   3. the benchmark, bench/gpu/resnet.py: ResNet-50, synthetic data,
#      batch 32 per worker, 2 workers sharing the GPU: one worker without
#      communication (the compute bound), unisum, DDP over gloo with CUDA
#      tensors; the share of the gradients' copy time hidden behind
#      kernels and the copies' bandwidth (a profiled run), against pinned
#      cudaMemcpy measured in the same run.
# It takes about 6 minutes on an H200 with 16 cores; every step has its
# own time limit, so the whole stays within 8.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 2
GPU=$ROOT/.gpu

if [ "${1:-}" = --prepare ]; then
	make build >/dev/null || exit 1
	rm -rf "$GPU"
	mkdir -p "$GPU/build" "$GPU/lib" "$GPU/pylib"
	cp build/unisum "$GPU/build/"
	cp -L build/libunisum.so "$GPU/build/libunisum.so"
	sodium=$(ldd build/libunisum.so | sed -n 's/.*libsodium[^ ]* => \([^ ]*\).*/\1/p')
	[ -n "$sodium" ] || { echo "gpu-check: libsodium not found by ldd" >&2; exit 1; }
	cp -L "$sodium" "$GPU/lib/"
	for m in pytest _pytest pluggy iniconfig packaging attr attrs py py.py; do
		[ -e "/usr/lib/python3/dist-packages/$m" ] && cp -r "/usr/lib/python3/dist-packages/$m" "$GPU/pylib/"
	done
	du -sh "$GPU"
	echo "gpu-check: .gpu/ is ready; carry it: run(command=\"sh scripts/gpu-check.sh\", carry=[\".gpu\"])"
	exit 0
fi

OUT=${OUT:-$ROOT/gpu-check-out}
mkdir -p "$OUT"
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"
say() { echo "$*" | tee -a "$SUMMARY"; }
PY=${PYTHON:-python3}
started=$(date +%s)

# ---- 1. the machine --------------------------------------------------------
{
	date -u
	$PY -c 'import torch
for i in range(torch.cuda.device_count()):
    p = torch.cuda.get_device_properties(i)
    print("GPU %d: %s, %.0f GiB, compute capability %d.%d" % (i, p.name, p.total_memory / 2**30, p.major, p.minor))' 2>&1
	sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1
	echo "cores: $(nproc)"
	$PY -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available(), "devices", torch.cuda.device_count())'
	ldd --version 2>&1 | head -1
	command -v cmake nvcc gcc 2>&1
} >"$OUT/machine.txt" 2>&1
say "machine: $(grep -m1 '^GPU' "$OUT/machine.txt" || echo 'no GPU listed'); $(grep -m1 '^python' "$OUT/machine.txt")"

# ---- the build: here if possible, else the carried one ----------------------
BUILD=""
if command -v cmake >/dev/null 2>&1 && echo '#include <sodium.h>' | gcc -E - >/dev/null 2>&1; then
	if timeout 240 sh -c 'cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DUNISUM_TESTS=OFF \
		-DUNISUM_COPY_TO_PYTHON=OFF && cmake --build build-gpu -j "$(nproc)"' >"$OUT/build.log" 2>&1; then
		BUILD=$ROOT/build-gpu
		say "build: built here (cmake, libsodium found)"
	else
		say "build: FAILED here (see build.log); trying the carried one"
	fi
else
	echo "no cmake or no sodium.h here" >"$OUT/build.log"
fi
if [ -z "$BUILD" ]; then
	if [ -x "$GPU/build/unisum" ]; then
		BUILD=$GPU/build
		export LD_LIBRARY_PATH="$GPU/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
		say "build: carried from the CPU machine (.gpu/), libsodium from .gpu/lib"
	else
		say "build: none: no libsodium here and nothing carried (run --prepare there, carry .gpu)"
		exit 1
	fi
fi
if ! "$BUILD/unisum" --version >>"$OUT/build.log" 2>&1; then
	say "build: FAILED: $BUILD/unisum does not run here (see build.log)"
	exit 1
fi
export UNISUM_BUILD_DIR=$BUILD UNISUM_LIBRARY=$BUILD/libunisum.so
[ -f "$BUILD/libunisum.so" ] || export UNISUM_LIBRARY=$BUILD/libunisum.so.0
export PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}"
if ! $PY -c 'import pytest' >/dev/null 2>&1; then
	export PYTHONPATH="$PYTHONPATH:$GPU/pylib"
	say "pytest: the machine has none; Debian's, carried in .gpu/pylib"
fi
status=0

# ---- 2. the pytest suite ---------------------------------------------------------
run_pytest() { # NAME LIMIT_S ARGS...
	name=$1 limit=$2
	shift 2
	timeout "$limit" $PY -m pytest -q -rs -p no:cacheprovider "$@" >"$OUT/$name.log" 2>&1
	rc=$?
	say "$name: rc $rc, $(grep -E '(passed|failed|skipped|error)' "$OUT/$name.log" | tail -1)"
	grep -E '^(FAILED|ERROR) ' "$OUT/$name.log" | head -20 | sed 's/^/    /' | tee -a "$SUMMARY"
	[ "$rc" -eq 0 ] || status=1
}
run_pytest pytest-cuda 200 tests/python/test_cuda.py
run_pytest pytest-cpu 150 -x tests/python --ignore=tests/python/test_cuda.py \
	--deselect tests/python/test_install.py

# ---- 3. the benchmark ------------------------------------------------------------
B="$PY bench/gpu/resnet.py"
# GPU_CHECK_SMOKE=1: everything on the CPU, tiny: a check of this script on
# a machine without a GPU (the figures then mean nothing).
[ "${GPU_CHECK_SMOKE:-0}" = 1 ] && B="$B --device cpu --steps 2 --warmup 1 --batch 2 --image 64"
bench() { # NAME LIMIT_S COMMAND...
	name=$1 limit=$2
	shift 2
	timeout "$limit" "$@" >"$OUT/$name.log" 2>&1 || { say "$name: FAILED (see $name.log)"; status=1; }
	grep -h 'RESULT' "$OUT/$name.log" | sed 's/^\[worker [0-9]*\] //' | tee -a "$OUT/bench.txt"
}
: >"$OUT/bench.txt"
bench bench-pinned 60 $B pinned
bench bench-single 90 $B single
bench bench-unisum 120 "$BUILD/unisum" launch -w 2 -s 1 --local-size 1 -- $B unisum
bench bench-unisum-profiled 120 "$BUILD/unisum" launch -w 2 -s 1 --local-size 1 -- \
	$B unisum --profile "$OUT/profile"
port=$((29500 + $$ % 1000))
# DDP: two processes of torch.distributed over gloo (NCCL refuses two ranks
# on one device), CUDA tensors.
bench bench-ddp 120 sh -c '$1 ddp --rank 1 --world 2 --master 127.0.0.1:$2 & other=$!
	$1 ddp --rank 0 --world 2 --master 127.0.0.1:$2; rc=$?; wait $other || rc=1; exit $rc' \
	- "$B" "$port"
$PY - "$OUT/bench.txt" <<'EOF' | tee -a "$SUMMARY"
import re, sys
r = {}
for line in open(sys.argv[1]):
    kv = dict(re.findall(r"(\w+)=([\w.]+)", line))
    r[kv.get("mode")] = kv
def f(mode, key):
    try:
        return float(r[mode][key])
    except (KeyError, ValueError):
        return float("nan")
single, us, ddp = f("single", "images_per_s"), f("unisum", "images_per_s"), f("ddp", "images_per_s")
print("bench: ResNet-50, batch 32 per worker, 2 workers on one GPU (images/s, all workers)")
print("  one worker, no communication %8.1f" % single)
print("  unisum                       %8.1f   %.2fx DDP-gloo (goal 1.3x)" % (us, us / ddp))
print("  DDP over gloo                %8.1f" % ddp)
hidden, gbs = f("overlap", "hidden_share"), f("overlap", "copy_GBps")
d2h, h2d = f("pinned", "d2h_GBps"), f("pinned", "h2d_GBps")
print("  copy time hidden behind kernels: %.0f%% (goal 70%%)" % (100 * hidden))
print("  copies at %.2f GB/s; pinned cudaMemcpy d2h %.2f, h2d %.2f GB/s: %.0f%% of the slower"
      " (goal 80%%)" % (gbs, d2h, h2d, 100 * gbs / min(d2h, h2d)))
EOF
say "gpu-check: $(($(date +%s) - started)) s; $( [ $status = 0 ] && echo 'every step passed' || echo 'some step FAILED (above)')"
exit $status
