"""How a job that no ``unisum launch`` started gets its scheduler and its
servers (private): the way torchrun's rendezvous gets its store.

``init_process_group("unisum")`` outside ``unisum launch`` (torchrun's
variables, or an explicit ``init_method``, ``rank`` and ``world_size``)
finds no scheduler in the environment.  Then rank 0 starts one
(``unisum scheduler``, at MASTER_ADDR, on a port free there, again on
another while the one it chose was taken before the scheduler bound it)
and makes a
job secret; the first rank of every machine starts that machine's server
(``unisum server``: one per machine, beside its workers, Theorem 1's
all-reduce placement); and every rank reads where the scheduler is, and
the secret, from the store torch.distributed already made for the group.
Machines are LOCAL_WORLD_SIZE consecutive ranks (torchrun's), or one rank
each when it is unset.  The children die with the rank that started them
(PR_SET_PDEATHSIG), and a rank waits for its children at exit, after it
left the job.
"""

from __future__ import annotations

import atexit
import ctypes
import datetime
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import time
from typing import Any, Dict, List

_children: List[subprocess.Popen] = []
_waits = False      # _wait_children is registered
_KEY = "unisum/"


def in_environment() -> bool:
    """Whether the environment already names a job (unisum launch, or the
    UNISUM_* / BytePS variables set by hand or by a cluster engine)."""
    return any(os.environ.get(v) for v in ("UNISUM_LAUNCHED", "UNISUM_SCHEDULER_HOST",
                                           "DMLC_PS_ROOT_URI"))


def _binary() -> str:
    import unisum
    here = os.path.join(os.path.dirname(os.path.abspath(unisum.__file__)), "bin", "unisum")
    if os.access(here, os.X_OK):
        return here
    found = shutil.which("unisum")
    if found is None:
        raise RuntimeError("unisum: init_process_group outside `unisum launch` starts a "
                           "scheduler and servers with the `unisum` program, which is neither "
                           "at %s nor on PATH" % here)
    return found


def _die_with_parent() -> None:
    """In the child: SIGTERM when the rank that started it dies."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGTERM, 0, 0, 0)   # PR_SET_PDEATHSIG


def _spawn(role: str, env: Dict[str, str]) -> subprocess.Popen:
    child_env = dict(os.environ)
    child_env.update(env)
    child_env["UNISUM_ROLE"] = role
    child = subprocess.Popen([_binary(), role], env=child_env, stdin=subprocess.DEVNULL,
                             preexec_fn=_die_with_parent)
    _children.append(child)
    return child


def _free_port(host: str) -> int:
    """A port of host free now: below the kernel's ephemeral range where it
    can, where the kernel never puts a connection of its own choosing."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    rng = random.SystemRandom()
    for port in [rng.randrange(10000, low) for _ in range(50)] if low > 12000 else []:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, 0))
        except OSError as e:
            raise RuntimeError("unisum: rank 0 starts the job's scheduler at %s (MASTER_ADDR, "
                               "or UNISUM_NODE_HOST), and cannot listen there: %s (is it an "
                               "address of this machine?)" % (host, e)) from None
        return int(s.getsockname()[1])


def _listens(pid: int, port: int) -> bool:
    """Whether process pid listens on TCP port `port` (one of its sockets
    among /proc/net/tcp's listeners)."""
    mine = set()
    try:
        for fd in os.listdir("/proc/%d/fd" % pid):
            try:
                mine.add(os.readlink("/proc/%d/fd/%s" % (pid, fd)))
            except OSError:
                pass
        with open("/proc/net/tcp") as f:
            rows = f.readlines()[1:]
    except OSError:
        return False
    for row in rows:
        cols = row.split()
        if (len(cols) > 9 and cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port
                and "socket:[%s]" % cols[9] in mine):
            return True
    return False


def _start_scheduler(host: str, env: Dict[str, str], timeout: float) -> int:
    """Rank 0's scheduler on a port of host free now: its port, once it
    listens there.  Another socket may take the port between the choice
    and the scheduler's bind (a busy host), and that scheduler exits at
    once: then another port, 5 times at most."""
    for _ in range(5):
        port = _free_port(host)
        child = _spawn("scheduler", dict(env, UNISUM_SCHEDULER_PORT=str(port)))
        deadline = time.monotonic() + timeout
        while child.poll() is None and time.monotonic() < deadline:
            if _listens(child.pid, port):
                return port
            time.sleep(0.01)
        _children.remove(child)
        if child.poll() is None:
            child.kill()
            child.wait()
            raise RuntimeError("unisum: the scheduler started for this job did not listen on "
                               "%s:%d within %.0f s" % (host, port, timeout))
    raise RuntimeError("unisum: the scheduler for this job would not start on %s (5 ports "
                       "tried; its error is above)" % host)


def _int_env(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise RuntimeError("unisum: %s=%r is not an integer" % (name, raw)) from None


def _wait_children() -> None:
    """At exit, after this rank left the job: its children end once every
    rank has (the scheduler tells the servers); a child still running
    after 30 s is stopped."""
    for child in _children:
        try:
            child.wait(timeout=30)
        except subprocess.TimeoutExpired:
            child.terminate()
            child.wait()


def start_job(store: Any, rank: int, size: int, timeout: datetime.timedelta) -> None:
    """Sets this process's UNISUM_* environment for a job of `size` ranks,
    starting the scheduler (rank 0) and this machine's server (its first
    rank) as described in the module docstring."""
    local_size = _int_env("LOCAL_WORLD_SIZE", 1)
    if local_size < 1 or size % local_size != 0:
        raise RuntimeError("unisum: LOCAL_WORLD_SIZE=%d does not divide the world size %d into "
                           "machines" % (local_size, size))
    local_rank = _int_env("LOCAL_RANK", rank % local_size)
    machines, machine = size // local_size, rank // local_size
    if local_rank != rank % local_size:
        raise RuntimeError("unisum: LOCAL_RANK=%d, but rank %d of machines of %d ranks is local "
                           "rank %d (unisum numbers a machine's ranks consecutively, as "
                           "torchrun)" % (local_rank, rank, local_size, rank % local_size))
    store.set_timeout(timeout)
    global _waits
    if not _waits:
        atexit.register(_wait_children)   # before init()'s: runs after it
        _waits = True
    if rank == 0:
        host = socket.gethostbyname(os.environ.get("UNISUM_NODE_HOST") or
                                    os.environ.get("MASTER_ADDR") or "127.0.0.1")
        secret = secrets.token_hex(24)
        port = _start_scheduler(host, {"UNISUM_SCHEDULER_HOST": host,
                                       "UNISUM_NUM_WORKER": str(machines),
                                       "UNISUM_NUM_SERVER": str(machines),
                                       "UNISUM_SECRET": secret},
                                min(timeout.total_seconds(), 60.0))
        store.set(_KEY + "scheduler", "%s:%d" % (host, port))
        store.set(_KEY + "secret", secret)
    host, _, port_s = store.get(_KEY + "scheduler").decode().rpartition(":")
    job = {"UNISUM_SCHEDULER_HOST": host, "UNISUM_SCHEDULER_PORT": port_s,
           "UNISUM_NUM_WORKER": str(machines), "UNISUM_NUM_SERVER": str(machines),
           "UNISUM_SECRET": store.get(_KEY + "secret").decode()}
    os.environ.pop("UNISUM_SECRET_FILE", None)
    if local_rank == 0:
        _spawn("server", dict(job, UNISUM_SERVER_ID=str(machine)))
    os.environ.update(job)
    os.environ.update({"UNISUM_ROLE": "worker", "UNISUM_WORKER_ID": str(machine),
                       "UNISUM_LOCAL_RANK": str(local_rank),
                       "UNISUM_LOCAL_SIZE": str(local_size)})
