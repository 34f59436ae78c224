#!/bin/sh
# Two builds of unisum side by side, for changes that must not move a
# figure (refactors): the same jobs, alternating old and new, each repeat
# seconds apart, in ABBA order, so the drift of a shared VM hits both alike.
#
#   sh bench/builds.sh OLD_BUILD NEW_BUILD [REPEATS]     (default 5)
#
# Build the old one from a worktree, e.g.
#   git worktree add /tmp/old 6ffc501 && cmake -S /tmp/old -B /tmp/old/build \
#     -DCMAKE_BUILD_TYPE=Release && cmake --build /tmp/old/build -j2
#
# Jobs (2 workers, float32; milliseconds per round, median of the repeats):
#   ipc   4 / 64 MiB  each worker its own machine, 1 server on this host,
#                     data by address (UNISUM_IPC=1, the default)
#   tcp   4 / 64 MiB  the same through loopback TCP (UNISUM_IPC=0)
#   local 64 MiB      one machine of 2 workers: the shared-memory reduce
# ratio = old / new: above 1 the new build is faster.
set -eu
OLD=${1:?usage: builds.sh OLD_BUILD NEW_BUILD [REPEATS]}
NEW=${2:?usage: builds.sh OLD_BUILD NEW_BUILD [REPEATS]}
REPEATS=${3:-5}
RAW=$(mktemp)
trap 'rm -f "$RAW"' EXIT

# bench BUILD IPC: "size ms" lines of `unisum bench` (4 and 64 MiB).
bench() {
	UNISUM_IPC=$2 timeout 120 "$1/unisum" bench -w 2 -s 1 --sizes 4,64 --seconds 2 2>/dev/null |
		sed 's/^\[worker [0-9]*\] //' | awk '$2 == "MiB" { print $1, $4 }'
}

# local BUILD: the median ms of a 64 MiB local reduce of 2 workers.
local_reduce() {
	timeout 120 "$1/unisum" launch -w 2 -s 1 -- "$1/bench_local_allreduce" 67108864 30 3 2>/dev/null |
		sed -n 's/.*median_ms=\([0-9.]*\).*/\1/p' | head -1
}

# ABBA: odd repeats run old first, even ones new first, so that whatever
# favours the first or the second of a pair (a VM's drift, caches) falls
# on both builds alike.
for rep in $(seq "$REPEATS"); do
	order="old new"
	[ $((rep % 2)) = 0 ] && order="new old"
	for which in $order; do
		[ $which = old ] && b=$OLD || b=$NEW
		bench "$b" 1 | while read -r size ms; do echo "$which ipc $size $ms $rep"; done >>"$RAW"
		bench "$b" 0 | while read -r size ms; do echo "$which tcp $size $ms $rep"; done >>"$RAW"
		echo "$which local 64 $(local_reduce "$b") $rep" >>"$RAW"
	done
	echo "builds.sh: repeat $rep of $REPEATS done" >&2
done

echo "date: $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores," \
	"$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)"
echo "command: sh bench/builds.sh $*"
/usr/bin/python3 - "$RAW" "$REPEATS" <<'EOF'
import collections, statistics, sys
runs = collections.defaultdict(dict)
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) == 5:
        runs[(f[0], f[1], f[2])][f[4]] = float(f[3])
print(f"2 workers, float32; ms per round, median of {sys.argv[2]} repeats (old and new alternating, ABBA);")
print("paired: the median of each repeat's old/new, with the lowest and highest")
print(f"{'job':<6} {'size':>7} {'old ms':>9} {'new ms':>9} {'old/new':>8} {'paired':>7} {'range':>11}")
for job in ("ipc", "tcp", "local"):
    for size in ("4", "64"):
        old, new = runs.get(("old", job, size)), runs.get(("new", job, size))
        if not old or not new:
            continue
        o, n = statistics.median(old.values()), statistics.median(new.values())
        r = sorted(old[k] / new[k] for k in old if k in new)
        print(f"{job:<6} {size + ' MiB':>7} {o:9.3f} {n:9.3f} {o / n:8.2f} {statistics.median(r):7.2f}"
              f" {r[0]:5.2f}-{r[-1]:.2f}")
EOF
