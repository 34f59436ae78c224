# The two commands of the README, and the pieces they are made of.
#   make demo   installs what is missing, builds, trains a CNN on the digits
#               data set with PyTorch on a local cluster (a scheduler, 2
#               servers, 2 machines of 2 workers), then reports where the
#               bytes went
#   make test   installs what is missing, builds, runs every test (then the
#               C suites again under ASan+UBSan and under TSan)
BUILD ?= build
JOBS ?= $(shell nproc)
# make install / uninstall: where, and under which staging root.
PREFIX ?= /usr/local
DESTDIR ?=

.PHONY: all deps bench-deps build demo demo-c test check test-sanitize fuzz bench clean \
        install uninstall deb wheel

all: build

deps:
	@sh scripts/install-deps.sh

build: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release >/dev/null
	@cmake --build $(BUILD) -j $(JOBS) -- --no-print-directory

PYTHON ?= /usr/bin/python3

demo: build
	$(BUILD)/unisum launch -w 4 -s 2 --local-size 2 -- $(PYTHON) examples/train_digits.py --lr 0.06

demo-c: build
	$(BUILD)/unisum launch -w 2 -s 1 -- $(BUILD)/train_logreg

# Everything: the suites, then the C suites again under ASan+UBSan and
# under ThreadSanitizer (their trees built meanwhile, at the lowest
# priority), and how long each part took: tests/make_test.sh.  `make
# check` is the first part alone.
test: build
	@MAKE="$(MAKE)" BUILD="$(BUILD)" sh tests/make_test.sh

# ctest's slots are half-cores, plus one for a test that only waits; each
# test takes as many as it keeps busy (its PROCESSORS, in CMakeLists.txt).
SLOTS ?= $(shell expr 2 \* $(JOBS) + 1)
check: build
	cd $(BUILD) && ctest --output-on-failure -j $(SLOTS)

# The C suites again under AddressSanitizer + UndefinedBehaviorSanitizer +
# LeakSanitizer and under ThreadSanitizer, side by side (the Python suite loads the
# library into an uninstrumented interpreter, and the fuzzers carry their
# own sanitizers).  A report from any process fails the run.
test-sanitize: deps
	sh tests/sanitize.sh both

# The fuzzers for ten minutes each (make test runs them for 15 s and 3 s).
fuzz: deps
	sh tests/fuzz/run.sh 600 $(BUILD)/fuzz wire
	sh tests/fuzz/run.sh 600 $(BUILD)/fuzz auth

# What the benchmarks need on top of the tests' packages (every bench/
# script also calls it itself).
bench-deps:
	@sh scripts/install-deps.sh bench

bench: build bench-deps
	$(BUILD)/bench_reducer
	$(BUILD)/bench_compress
	sh bench/tcp.sh $(BUILD)

# unisum.h, libunisum.so (soname libunisum.so.MAJOR) and libunisum.a, the
# unisum CLI, unisum.pc and the CMake package, under $(DESTDIR)$(PREFIX).
install: build
	DESTDIR="$(DESTDIR)" cmake --install $(BUILD) --prefix "$(PREFIX)"

# unisum_<version>_amd64.deb (CPack), with what make install installs,
# under /usr.
deb: build
	cd $(BUILD) && cpack -G DEB >/dev/null && ls package/unisum_*.deb

# build/dist/unisum-<version>-cpXY-cpXY-linux_x86_64.whl: the Python
# package with the library and the CLI (`unisum` on PATH), offline.
wheel: build
	cd python && $(PYTHON) -m pip wheel --no-deps --no-build-isolation --no-index -q -w ../$(BUILD)/dist .
	ls $(BUILD)/dist/unisum-*.whl

# Removes exactly what the last install put there (its manifest), and the
# directories it leaves empty below the prefix.
uninstall:
	sh scripts/uninstall.sh "$(BUILD)/install_manifest.txt" "$(DESTDIR)$(PREFIX)"

clean:
	rm -rf $(BUILD) build-asan build-tsan
