#!/bin/sh
# uninstall.sh MANIFEST ROOT - removes every file `cmake --install` listed
# in MANIFEST (`make install` writes build/install_manifest.txt, its paths
# with DESTDIR), then each directory that held one and is empty now, up to
# ROOT (the install's DESTDIR + PREFIX), which stays.  Files that are gone
# already are skipped; nothing outside ROOT is touched.
set -eu
[ $# -eq 2 ] || { echo "usage: $0 MANIFEST ROOT" >&2; exit 2; }
manifest=$1
root=$(realpath -m "$2")
[ -f "$manifest" ] || { echo "uninstall: no $manifest: nothing was installed from this build" >&2; exit 1; }
dirs=$(mktemp)
trap 'rm -f "$dirs"' EXIT
while IFS= read -r f || [ -n "$f" ]; do  # (the manifest has no final newline)
	case $(realpath -m "$f") in
	"$root"/*) ;;
	*) echo "uninstall: $f is not under $root: left alone" >&2; continue ;;
	esac
	if [ -e "$f" ] || [ -L "$f" ]; then
		rm -f "$f"
		echo "removed $f"
	fi
	dirname "$f" >>"$dirs"
done <"$manifest"
# Deepest first, each then its parents, while empty and below the root.
sort -u -r "$dirs" | while IFS= read -r d; do
	d=$(realpath -m "$d")
	while [ "$d" != "$root" ] && [ "${d#"$root"/}" != "$d" ] && rmdir "$d" 2>/dev/null; do
		echo "removed $d/"
		d=$(dirname "$d")
	done
done
