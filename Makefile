# The two commands of the README, and the pieces they are made of.
#   make demo   installs what is missing, builds, trains a CNN on the digits
#               data set with PyTorch on a local cluster (scheduler + 1 server
#               + 2 workers)
#   make test   installs what is missing, builds, runs every test
BUILD ?= build
JOBS ?= $(shell nproc)

.PHONY: all deps build demo demo-c test test-sanitize fuzz bench clean

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

test: build
	cd $(BUILD) && ctest --output-on-failure -j 1

# The C suites again under AddressSanitizer + UndefinedBehaviorSanitizer
# (the Python suite loads the library into an uninstrumented interpreter,
# and the fuzzer carries its own sanitizers).
test-sanitize: deps
	@sh scripts/install-deps.sh clang
	@CC=clang cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug \
		-DCMAKE_C_FLAGS="-fsanitize=address,undefined -fno-sanitize-recover=undefined -O1" >/dev/null
	@cmake --build build-asan -j $(JOBS)
	cd build-asan && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j 1 -E 'python_|fuzz_'

# The wire-codec fuzzer for ten minutes (make test runs it for 45 s).
fuzz: deps
	sh tests/fuzz/run.sh 600 $(BUILD)/fuzz

bench: build
	$(BUILD)/bench_reducer
	sh bench/tcp.sh $(BUILD)

clean:
	rm -rf $(BUILD) build-asan
