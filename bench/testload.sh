#!/bin/sh
# bench/testload.sh [BUILD_DIR] [REGEX] : each ctest entry of BUILD_DIR
# (default build) run alone, with its wall seconds and the whole machine's
# busy CPU-seconds meanwhile (/proc/stat, so that daemons, sshd's and
# slurmd's children count too), and the load in half-cores that
# CMakeLists.txt's UNISUM_TEST_LOADS table should give it on this machine
# (a test of under a second: 1, as its share is noise).  Run it on an
# otherwise idle machine: whatever else runs counts as busy.
set -u
BUILD=${1:-build}
REGEX=${2:-.}
cores=$(nproc)
busy() { awk '/^cpu / { print ($2 + $3 + $4 + $7 + $8) / 100 }' /proc/stat; }
now() { date +%s.%N; }

echo "# $(date +%F) $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)," \
	"$cores cores; each test alone: ctest -R '^NAME\$' in $BUILD"
printf '# %-32s %8s %8s %7s %5s\n' test wall_s cpu_s cores load
total_wall=0
total_cpu=0
for t in $(cd "$BUILD" && ctest -N -R "$REGEX" | awk '/Test +#/ { print $3 }'); do
	b0=$(busy)
	t0=$(now)
	(cd "$BUILD" && ctest -R "^$t\$" >/dev/null 2>&1) || echo "# $t FAILED"
	t1=$(now)
	b1=$(busy)
	awk -v t="$t" -v w="$(awk "BEGIN { print $t1 - $t0 }")" -v c="$(awk "BEGIN { print $b1 - $b0 }")" 'BEGIN {
		k = w > 0 ? c / w : 0
		# both cores: 4; one and a half: 3; one: 2; waiting: 1
		load = w < 1 ? 1 : k >= 1.4 ? 4 : k >= 1.1 ? 3 : k >= 0.5 ? 2 : 1
		printf "  %-32s %8.1f %8.1f %7.2f %5d\n", t, w, c, k, load }'
	total_wall=$(awk "BEGIN { print $total_wall + $t1 - $t0 }")
	total_cpu=$(awk "BEGIN { print $total_cpu + $b1 - $b0 }")
done
printf '# %-32s %8.1f %8.1f\n' "all, one after another" "$total_wall" "$total_cpu"
