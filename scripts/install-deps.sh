#!/bin/sh
# Installs the Debian packages unisum needs.  The table below is the one
# list of them, and of the external commands that the tests, the demo, CI,
# the benchmarks and `unisum launch` (ssh, srun) run:
#
#   PACKAGE  GROUP  [COMMAND...]
#
# GROUP is
#   base   part of a minimal Debian 12 (Priority: required, what
#          `debootstrap --variant=minbase` installs): never installed here;
#   test   what `make demo`, `make test` and .ci/run need: always installed;
#   bench  what bench/ needs on top: installed by `install-deps.sh bench`,
#          which `make bench` and every bench/ script call;
#   suite  what Horovod's own test suite needs on top (tests/horovod/
#          run_suite.sh, run by hand): `install-deps.sh suite`.
# COMMANDs are the programs of that package that some script runs.
# tests/deps/check_commands.py (in `make test`) fails, naming the command,
# when a script runs a command that is not listed here, or when a listed
# package does not provide it or is not what its group says.
#
# Runs apt-get only when something is missing, so it is cheap to call from
# every `make` target.  Needs root (or sudo) the first time.
#
#   install-deps.sh [bench] [suite]  installs what is missing
#   install-deps.sh --list [GROUP]   prints the packages it would want
#   install-deps.sh --table          prints the table
set -eu

TABLE='
# A minimal Debian 12.
coreutils        base   basename cat cksum cp cut date dirname env head id ls mkdir mktemp nproc od
coreutils        base   realpath rm seq sleep sort tail tee timeout touch tr uniq wc
coreutils        base   chmod dd du mv rmdir
libc-bin         base   ldd
findutils        base   find
apt              base   apt-cache apt-get
dash             base   sh
dpkg             base   dpkg-query dpkg-deb dpkg
grep             base   grep
mawk             base   awk
mount            base   mount
sed              base   sed
util-linux       base   unshare nsenter flock setsid chrt
bsdutils         base   script

# Build, demo and tests.
build-essential  test
make             test   make
cmake            test   cmake ctest cpack
pkg-config       test
pkgconf          test   pkg-config
gcc              test   gcc
binutils         test   readelf
groff-base       test   groff
libcmocka-dev    test
libsodium-dev    test
libucx-dev       test
ucx-utils        test   ucx_info
clang            test   clang
libclang-rt-14-dev test
iproute2         test   ip tc ss
iputils-ping     test   ping
procps           test   pgrep pkill ps
python3          test
python3-minimal  test   python3
python3-numpy    test
python3-torch    test
python3-torchvision test
python3-sklearn  test
python3-tqdm     test
python3-pytest   test
python3-yaml     test
python3-pip      test
python3-venv     test
python3-setuptools test
iperf3           test   iperf3
openssh-client   test   ssh ssh-keygen
openssh-server   test   sshd
munge            test   munged munge unmunge
slurmctld        test   slurmctld
slurmd           test   slurmd
slurm-client     test   srun salloc sbatch scancel sinfo scontrol
prometheus       test   promtool prometheus
tmux             test   tmux
chromium         test   chromium
curl             test   curl

# Benchmarks only.
openmpi-bin      bench  mpirun mpicc
libopenmpi-dev   bench
gnuplot-nox      bench  gnuplot
nodejs           bench  node npm
time             bench  time

# The Horovod test suite only.
python3-cloudpickle suite
python3-packaging suite
python3-mock     suite
'

mode=install
case ${1:-} in
--list | --table)
	mode=${1#--}
	shift
	;;
esac
if [ "$mode" = table ]; then
	printf '%s\n' "$TABLE"
	exit 0
fi
groups="test"
for g in "$@"; do
	case $g in
	bench) groups="$groups bench" ;;
	suite) groups="$groups suite" ;;
	*)
		echo "install-deps: unknown group '$g' (the groups are: bench, suite)" >&2
		exit 2
		;;
	esac
done

pkgs=$(printf '%s\n' "$TABLE" |
	awk -v groups=" $groups " '!/^[ \t]*(#|$)/ && index(groups, " " $2 " ") && !seen[$1]++ { print $1 }')
if [ "$mode" = list ]; then
	echo "$pkgs"
	exit 0
fi
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
