#!/bin/sh
# Installs the Debian packages unisum needs to build, test and benchmark,
# plus any named on the command line (`install-deps.sh clang`).  Runs
# apt-get only when something is missing, so it is cheap to call from every
# `make` target.  Needs root (or sudo) the first time.
set -eu

pkgs="build-essential cmake pkg-config libcmocka-dev libsodium-dev iproute2 iperf3 python3 python3-numpy python3-torch \
	python3-torchvision python3-sklearn python3-tqdm python3-pytest python3-pip python3-venv \
	python3-setuptools clang libclang-rt-14-dev $*"
missing=""
for p in $pkgs; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0

echo "install-deps: installing$missing" >&2
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# shellcheck disable=SC2086
$SUDO apt-get install -y -qq --no-install-recommends $missing
