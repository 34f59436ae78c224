# Integration: unisum installed as a user installs it (issue 23), into a
# temporary prefix with what `make install` runs (cmake --install), then:
#
#   - the files: unisum.h, libunisum.so with its soname (libunisum.so.MAJOR)
#     and libunisum.a, the CLI, unisum.pc and the CMake package;
#   - the installed `unisum --version` says the VERSION file's release and
#     the wire protocol's version;
#   - examples/c/train_logreg.c compiled against the prefix with
#     `pkg-config --cflags --libs unisum`, and by a small CMake project with
#     find_package(unisum), both run as jobs of the installed `unisum
#     launch` and train;
#   - unisum(1): installed, rendered by groff without a warning, naming
#     every variable `unisum info` lists;
#   - scripts/uninstall.sh (`make uninstall`) leaves the prefix empty;
#   - the Debian package (`make deb`: cpack -G DEB): its name, its
#     Depends, its files, and its `unisum --version` run from `dpkg -x`.
#
# Not under the sanitizer runs (tests/sanitize.sh): it checks packaging.
. "$(dirname "$0")/lib.sh"

REPO=$(cd "$(dirname "$0")/../.." && pwd)
PFX=$(mktemp -d)
work=$(mktemp -d)
trap 'rm -rf "$PFX" "$work"' EXIT

if ! cmake --install "$BUILD" --prefix "$PFX" >"$work/install.log" 2>&1; then
	FAILS=$((FAILS + 1))
	echo "FAIL cmake --install into $PFX:"
	sed 's/^/    /' "$work/install.log"
	finish
fi
version=$(cat "$REPO/VERSION")
major=${version%%.*}
for f in include/unisum.h lib/libunisum.so lib/libunisum.so.$major lib/libunisum.so.$version \
	lib/libunisum.a bin/unisum lib/pkgconfig/unisum.pc lib/cmake/unisum/unisumConfig.cmake \
	lib/cmake/unisum/unisumConfigVersion.cmake lib/cmake/unisum/unisumTargets.cmake \
	share/man/man1/unisum.1; do
	expect "installed: $f" test -e "$PFX/$f"
done
expect "the shared library's soname is libunisum.so.$major" \
	sh -c "readelf -d '$PFX/lib/libunisum.so.$version' | grep -q 'SONAME.*\[libunisum.so.$major\]'"
out=$("$PFX/bin/unisum" --version 2>&1)
expect "the installed unisum --version says $version and the wire version ($out)" \
	contains "$out" "^unisum $version \(wire protocol [0-9]+\)$"

# The man page, from the same table as `unisum info`.
man="$PFX/share/man/man1/unisum.1"
warnings=$(groff -man -Tutf8 -ww -z "$man" 2>&1)
expect "unisum(1) renders without a warning${warnings:+: $warnings}" [ -z "$warnings" ]
missing=""
for var in $("$PFX/bin/unisum" info | sed -n 's/^\(UNISUM_[A-Z0-9_]*\) .*/\1/p'); do
	grep -q "^\.B $var\$" "$man" || missing="$missing $var"
done
expect "... and names every variable of unisum info${missing:+ (missing:$missing)}" [ -z "$missing" ]

# pkg-config, as a Makefile would.
export PKG_CONFIG_PATH="$PFX/lib/pkgconfig"
flags=$(pkg-config --cflags --libs unisum 2>&1)
expect "pkg-config knows unisum $version" sh -c "[ \"\$(pkg-config --modversion unisum)\" = '$version' ]"
# shellcheck disable=SC2086
expect "train_logreg.c builds with pkg-config --cflags --libs unisum ($flags)" \
	gcc -O2 -o "$work/logreg_pc" "$REPO/examples/c/train_logreg.c" $flags -lm -Wl,-rpath,"$PFX/lib"
check_job "... and trains under the installed unisum launch" "$PFX/bin/unisum" launch -w 2 -s 1 \
	--local-size 1 -- "$work/logreg_pc"
expect "... to the end" contains "$LAST" "epoch 10 .*held-out accuracy 0\.[89]"

# find_package(unisum), as a CMake project would.
mkdir -p "$work/proj"
cp "$REPO/examples/c/train_logreg.c" "$work/proj/"
cat >"$work/proj/CMakeLists.txt" <<'CM'
cmake_minimum_required(VERSION 3.16)
project(uses_unisum C)
find_package(unisum 0 REQUIRED)
add_executable(logreg train_logreg.c)
target_link_libraries(logreg unisum::unisum m)
CM
expect "a CMake project finds it (find_package(unisum)) and builds train_logreg.c" \
	sh -c "cmake -S '$work/proj' -B '$work/proj/build' -DCMAKE_PREFIX_PATH='$PFX' >'$work/cmake.log' 2>&1 &&
	       cmake --build '$work/proj/build' >>'$work/cmake.log' 2>&1 || { cat '$work/cmake.log'; false; }"
check_job "... and it trains under the installed unisum launch" "$PFX/bin/unisum" launch -w 2 -s 1 \
	--local-size 1 -- "$work/proj/build/logreg"
expect "... to the end" contains "$LAST" "epoch 10 .*held-out accuracy 0\.[89]"

# make uninstall's script, from the install's manifest.
expect "uninstall removes what was installed" \
	sh -c "sh '$REPO/scripts/uninstall.sh' '$BUILD/install_manifest.txt' '$PFX' >'$work/uninstall.log'"
left=$(cd "$PFX" && find . -mindepth 1 | head -5)
expect "... and the prefix is empty again${left:+ (left: $left)}" [ -z "$left" ]

# The Debian package, as `make deb` builds it.
rm -rf "$BUILD/package"
if (cd "$BUILD" && cpack -G DEB) >"$work/cpack.log" 2>&1; then
	deb="$BUILD/package/unisum_${version}_amd64.deb"
	expect "make deb's cpack builds unisum_${version}_amd64.deb" test -f "$deb"
	expect "... which depends on libsodium" sh -c "dpkg-deb -f '$deb' Depends | grep -q libsodium23"
	files=$(dpkg-deb -c "$deb" 2>&1)
	for f in ./usr/bin/unisum ./usr/include/unisum.h ./usr/lib/libunisum.so.$version \
		./usr/lib/libunisum.so.$major ./usr/lib/libunisum.a ./usr/lib/pkgconfig/unisum.pc \
		./usr/lib/cmake/unisum/unisumConfig.cmake ./usr/share/man/man1/unisum.1; do
		expect "... holds $f" contains "$files" " $f( ->|\$)"
	done
	mkdir "$work/deb"
	dpkg -x "$deb" "$work/deb"
	out=$("$work/deb/usr/bin/unisum" --version 2>&1)
	expect "... and its unisum --version runs from dpkg -x ($out)" \
		contains "$out" "^unisum $version \(wire protocol [0-9]+\)$"
else
	FAILS=$((FAILS + 1))
	echo "FAIL cpack -G DEB:"
	sed 's/^/    /' "$work/cpack.log"
fi
finish
