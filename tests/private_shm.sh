#!/bin/sh
# private_shm.sh CMD... : runs CMD with a /dev/shm of its own (a new mount
# namespace with a fresh tmpfs there) when it can make one (root), else as
# it is.  test_shm leaves segments stale on purpose and counts what its
# sweeps remove, and test_local plants one; `unisum launch`, which other
# tests run beside them under `ctest -j`, sweeps every dead job's segments
# on the machine (shm_clean_stale(NULL)) and so took them from under them
# (seen once in make check: the "ghost" segment gone before test_stale
# opened it).  Every process the test starts is in the namespace too.
if [ "$(id -u)" = 0 ] && unshare -m true 2>/dev/null; then
	exec unshare -m sh -c 'mount -t tmpfs -o size=256m unisum-test-shm /dev/shm && exec "$@"' \
		sh "$@"
fi
exec "$@"
