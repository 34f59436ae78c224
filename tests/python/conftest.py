"""Helpers of the unisum.torch test suite.

Multi-worker tests run a worker script from tests/python/workers/ under
`unisum launch` (scheduler + K servers + N worker processes on loopback);
each worker writes its results into a directory the test passes on the
command line, named by rank, and the test compares them across ranks and
against a single-process reference computed here (no unisum needed).

Paths are relative to this file: the repository root is two levels up, the
build directory is $UNISUM_BUILD_DIR if set, else <repo>/build.
"""

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
PYTHON_DIR = os.path.join(REPO, "python")
WORKERS_DIR = os.path.join(HERE, "workers")
BUILD_DIR = os.path.abspath(os.environ.get("UNISUM_BUILD_DIR") or os.path.join(REPO, "build"))
LAUNCHER = os.path.join(BUILD_DIR, "unisum")
LIBRARY = os.path.join(BUILD_DIR, "libunisum.so")
# The interpreter running the tests has torch (Debian's /usr/bin/python3
# here); the workers use the same one.
PYTHON = sys.executable

# A test that cannot run here is skipped with its reason (pytest -rs), and
# the run exits 77, which ctest shows as Skipped, never as passed.  As root
# (CI) install-deps.sh has installed everything a test needs, so there a
# skip fails the run; except a GPU test's (test_cuda.py, its own ctest
# entry): no package installs a GPU.
_SKIPPED = []
_NO_GPU = "needs a CUDA device"


def pytest_runtest_logreport(report):
    if report.skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else ""
        _SKIPPED.append((report.nodeid, _NO_GPU in str(reason)))


def pytest_sessionfinish(session, exitstatus):
    if not _SKIPPED or exitstatus != 0:
        return
    if os.geteuid() == 0 and not all(gpu for _, gpu in _SKIPPED):
        print("\nFAIL as root nothing may be skipped, yet: " +
              ", ".join(n for n, gpu in _SKIPPED if not gpu))
        session.exitstatus = 1
    else:
        session.exitstatus = 77


# Lets the test modules import the shared model/data helpers (workers/common.py)
# and unisum itself (for the in-process tests and the reference computations).
for _p in (WORKERS_DIR, PYTHON_DIR):
    if _p not in sys.path:
        sys.path.insert(0, _p)

# Every launch gets this unless the test asks for another: long enough for the
# slowest launch of the suite on a loaded 2-core machine, short enough that a
# hang fails the test instead of the whole run.
DEFAULT_TIMEOUT = 120


# The fork server (forkserver.py): one per pytest process, started at its
# first launch; UNISUM_TEST_FORKSERVER=0 launches every worker as a fresh
# interpreter instead.
FORKSERVER = os.path.join(HERE, "forkserver.py")
_forkserver = {}


def _forkserver_path():
    """The socket of this process's fork server, started now if need be;
    None when it is turned off or would not start."""
    if os.environ.get("UNISUM_TEST_FORKSERVER", "1") == "0":
        return None
    if "path" not in _forkserver:
        tmp = tempfile.mkdtemp(prefix="unisum-forkserver.")
        path = os.path.join(tmp, "sock")
        env = worker_env()
        env.pop("UNISUM_TEST_FORKSERVER", None)
        proc = subprocess.Popen([PYTHON, FORKSERVER, "--serve", path, "torch", "numpy",
                                 "sklearn.datasets"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, env=env, cwd=REPO)
        ready = proc.stdout.readline().strip() == b"ready"
        _forkserver.update(path=path if ready else None, proc=proc, tmp=tmp)
        if not ready:
            proc.kill()
    return _forkserver["path"]


def pytest_unconfigure(config):
    proc = _forkserver.get("proc")
    if proc is not None:
        proc.stdin.close()      # the server kills what still runs, and exits
        proc.wait(timeout=30)
        shutil.rmtree(_forkserver["tmp"], ignore_errors=True)


def worker_env(extra=None):
    """The environment of launched workers: unisum importable from the
    source tree, the library of the build directory the launcher comes from,
    one thread per process (2 cores, several processes)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [PYTHON_DIR] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.setdefault("UNISUM_LIBRARY", LIBRARY)
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONWARNINGS"] = "ignore"   # Debian's setuptools/distutils noise
    if extra:
        env.update(extra)
    return env


def run_launch(nworkers, nservers, script, *args, timeout=DEFAULT_TIMEOUT, env=None,
               cwd=None, python=None, local_size=None, elastic=False):
    """Runs `unisum launch -w N -s K [--local-size L] --timeout T -- python
    script args...` and returns (returncode, stdout, stderr).  Without
    local_size the launcher's default applies, as for a user: all workers
    form one machine and sum in shared memory; local_size=1 sends every
    tensor through the servers; `elastic` adds --elastic.  `script` is a path,
    or a file name in tests/python/workers/.  The launcher's own --timeout
    stops the job (exit 124); a second, harder timeout kills the launcher's
    whole process group should the launcher itself hang, and returns -9."""
    if not os.access(LAUNCHER, os.X_OK):
        pytest.fail("%s is missing: build first (cmake -S . -B build && cmake --build build)"
                    % LAUNCHER)
    script = str(script)
    if not os.path.isabs(script):
        in_workers = os.path.join(WORKERS_DIR, script)
        script = in_workers if os.path.exists(in_workers) else os.path.join(REPO, script)
    cmd = [LAUNCHER, "launch", "-w", str(nworkers), "-s", str(nservers)]
    if local_size is not None:
        cmd += ["--local-size", str(local_size)]
    if elastic:
        cmd += ["--elastic"]
    env = dict(env if env is not None else worker_env())
    # Not for an elastic job: its launcher knows a worker by the pid the
    # worker registered, which is the forked worker's, not the client's.
    served = _forkserver_path() if python is None and not elastic else None
    if served is not None:
        # The workers forked from the fork server (forkserver.py), which
        # has torch imported already; its client stands for each.
        env["UNISUM_TEST_FORKSERVER"] = served
        interp = [PYTHON, "-S", "-E", FORKSERVER]
    else:
        env.pop("UNISUM_TEST_FORKSERVER", None)
        interp = [python or PYTHON]
    cmd += ["--timeout", str(int(timeout)), "--"] + interp + [script] + [str(a) for a in args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=cwd or REPO, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout + 20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return -9, out, err + "\n[conftest] launcher killed after %d s\n" % (timeout + 20)
    except BaseException:
        # pytest itself stopped (Ctrl-C, a `timeout -s INT`): the job, in a
        # session of its own, must not outlive it.
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    return proc.returncode, out, err


def describe(rc, out, err):
    """The end of a launch's output, for assertion messages."""
    return "exit status %s\n--- stdout ---\n%s\n--- stderr ---\n%s" % (rc, out[-4000:], err[-6000:])


def check_launch(nworkers, nservers, script, *args, **kw):
    """run_launch() that fails the test unless every process exited 0."""
    rc, out, err = run_launch(nworkers, nservers, script, *args, **kw)
    assert rc == 0, "launch of %s failed: %s" % (script, describe(rc, out, err))
    return out, err


def worker_lines(out, rank):
    """The lines worker `rank` printed, without the "[worker i] " prefix."""
    prefix = "[worker %d] " % rank
    return [line[len(prefix):] for line in out.splitlines() if line.startswith(prefix)]


def final_accuracy(out):
    """The `final held-out accuracy: X` of rank 0 (examples/train_digits.py)."""
    found = [re.match(r"final held-out accuracy: ([0-9.]+)\s*$", l.strip())
             for l in worker_lines(out, 0)]
    found = [float(m.group(1)) for m in found if m]
    assert len(found) == 1, "rank 0 printed %d final accuracies:\n%s" % (len(found), out[-3000:])
    return found[0]


@pytest.fixture(scope="session")
def launch():
    """launch(nworkers, nservers, script, *args, timeout=120) ->
    (returncode, stdout, stderr); see run_launch()."""
    return run_launch
