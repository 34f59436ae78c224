# The two commands of the README, and the pieces they are made of.
#   make demo   installs what is missing, builds, trains a CNN on the digits
#               data set with PyTorch on a local cluster (scheduler + 1 server
#               + 2 workers)
#   make test   installs what is missing, builds, runs every test (then the
#               C suites again under ASan+UBSan and under TSan)
BUILD ?= build
JOBS ?= $(shell nproc)

.PHONY: all deps bench-deps build demo demo-c test check test-sanitize fuzz bench clean

all: build

deps:
	@sh scripts/install-deps.sh

build: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release >/dev/null
	@cmake --build $(BUILD) -j $(JOBS) -- --no-print-directory

PYTHON ?= /usr/bin/python3

demo: build
	$(BUILD)/unisum launch -w 2 -s 1 -- $(PYTHON) examples/train_digits.py

demo-c: build
	$(BUILD)/unisum launch -w 2 -s 1 -- $(BUILD)/train_logreg

# Everything: the suites, then the C suites again under ASan+UBSan and
# under ThreadSanitizer.  `make check` is the first part alone.
test: check
	@$(MAKE) --no-print-directory test-sanitize

check: build
	cd $(BUILD) && ctest --output-on-failure -j 1

# The C suites again under AddressSanitizer + UndefinedBehaviorSanitizer +
# LeakSanitizer, then under ThreadSanitizer (the Python suite loads the
# library into an uninstrumented interpreter, and the fuzzers carry their
# own sanitizers).  A report from any process fails the run.
test-sanitize: deps
	sh tests/sanitize.sh asan
	sh tests/sanitize.sh tsan

# The fuzzers for ten minutes each (make test runs them for 45 s and 20 s).
fuzz: deps
	sh tests/fuzz/run.sh 600 $(BUILD)/fuzz wire
	sh tests/fuzz/run.sh 600 $(BUILD)/fuzz auth

# What the benchmarks need on top of the tests' packages (every bench/
# script also calls it itself).
bench-deps:
	@sh scripts/install-deps.sh bench

bench: build bench-deps
	$(BUILD)/bench_reducer
	sh bench/tcp.sh $(BUILD)

clean:
	rm -rf $(BUILD) build-asan build-tsan
