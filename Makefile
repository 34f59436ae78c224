# The two commands of the README, and the pieces they are made of.
#   make demo   installs what is missing, builds, runs the demo job on a
#               local cluster (scheduler + 1 server + 2 workers)
#   make test   installs what is missing, builds, runs every test
BUILD ?= build
JOBS ?= $(shell nproc)

.PHONY: all deps build demo test test-sanitize bench clean

all: build

deps:
	@sh scripts/install-deps.sh

build: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release >/dev/null
	@cmake --build $(BUILD) -j $(JOBS) -- --no-print-directory

demo: build
	$(BUILD)/unisum launch -w 2 -s 1 -- $(BUILD)/train_logreg

test: build
	cd $(BUILD) && ctest --output-on-failure -j 1

# The whole suite again under AddressSanitizer + UndefinedBehaviorSanitizer.
test-sanitize: deps
	@sh scripts/install-deps.sh clang
	@CC=clang cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug \
		-DCMAKE_C_FLAGS="-fsanitize=address,undefined -fno-sanitize-recover=undefined -O1" >/dev/null
	@cmake --build build-asan -j $(JOBS)
	cd build-asan && ctest --output-on-failure -j 1

bench: build
	$(BUILD)/bench_reducer
	sh bench/tcp.sh $(BUILD)

clean:
	rm -rf $(BUILD) build-asan
