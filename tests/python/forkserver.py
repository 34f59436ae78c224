"""A fork server for the workers the Python suite launches.

Every worker of every job imports torch, whose native library alone takes
about 1.1 s of CPU to load (1.7 s with the rest of `import torch`, 3 s with
scikit-learn); the suite launches some 250 workers.  So conftest.py starts
this file once per pytest process as a server that imports them once, and
launches each worker through `unisum launch` as usual, only with this
file's client in place of the interpreter:

    unisum launch ... -- python3 -S -E forkserver.py SCRIPT ARGS...

The client (what the launcher started: its pid, its process group) hands
the server its argv, environment, working directory and standard
streams; the server forks a child that becomes the worker: it takes
those, and runs SCRIPT as `python3 SCRIPT ARGS...` would (run as
__main__, sys.path[0] its folder, atexit handlers, the exit status of an
uncaught exception or of KeyboardInterrupt).  The worker is a real
process of its own that talks to the scheduler and the servers over real
sockets; only its start is shared.

The client stands for the worker towards the launcher: it passes on every
signal it can catch (SIGINT, SIGTERM, ...) and exits as the worker did
(the same status, or killed by the same signal).  When the client dies
without passing anything on (SIGKILL, as the launcher stops a job), the
server kills the worker.  A signal sent to the worker's own pid (what a
worker prints) reaches it directly.

What differs from a user's job: the launcher's child is the client, so
the pid the launcher prints for a worker is the client's, while the
worker registers its own with the scheduler.  An elastic launcher matches
the two (each worker's output follows its rank across re-forms), so an
elastic launch never uses the fork server, and neither do the integration
tests, which check such messages.  UNISUM_TEST_FORKSERVER=0 turns it off:
every worker is then a fresh interpreter, as for a user.  A launch with
another interpreter (the installed-package tests) never uses it.
"""

import json
import os
import select
import signal
import socket
import struct
import sys

_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
              signal.SIGUSR2, signal.SIGCONT, signal.SIGWINCH)


def _send_msg(sock, obj):
    data = json.dumps(obj).encode()
    sock.sendall(struct.pack("!I", len(data)) + data)


def _recv_exact(sock, n):
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def _recv_msg(sock):
    head = _recv_exact(sock, 4)
    if head is None:
        return None
    data = _recv_exact(sock, struct.unpack("!I", head)[0])
    return None if data is None else json.loads(data)


# ---- the client: what the launcher starts ----------------------------------

def client(argv):
    """Hands argv, the environment, the working directory and fds 0-2 to
    the server; passes signals on to the worker; exits as it did."""
    path = os.environ["UNISUM_TEST_FORKSERVER"]
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    socket.send_fds(sock, [b"F"], [0, 1, 2])
    _send_msg(sock, {"argv": argv, "env": dict(os.environ), "cwd": os.getcwd()})
    reply = _recv_msg(sock)
    if reply is None:
        sys.stderr.write("forkserver: the server hung up before starting %s\n" % argv[0])
        os._exit(70)
    pid = reply["pid"]

    def forward(signum, frame):
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass
    for s in _FORWARDED:
        signal.signal(s, forward)
    status = _recv_msg(sock)
    if status is None:
        sys.stderr.write("forkserver: the server hung up while worker pid %d ran\n" % pid)
        os._exit(70)
    if "signal" in status:
        signal.signal(status["signal"], signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [status["signal"]])
        os.kill(os.getpid(), status["signal"])
    os._exit(status.get("exit", 70))


# ---- the server -------------------------------------------------------------

def _print_exc(traceback):
    """The current exception as the interpreter prints it, without the
    frames of this file and of runpy that ran the script."""
    kind, value, tb = sys.exc_info()
    while tb is not None and (tb.tb_frame.f_code.co_filename == __file__ or
                              "runpy" in tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    traceback.print_exception(kind, value, tb)


def _become_worker(argv, env, cwd, fds):
    """In the forked child: the worker `python3 argv...` would be.  Never
    returns."""
    import atexit
    import io
    import runpy
    import threading
    import traceback
    for i, fd in enumerate(fds):
        os.dup2(fd, i)
        os.close(fd)
    for s in _FORWARDED + (signal.SIGCHLD, signal.SIGPIPE):
        signal.signal(s, signal.SIG_DFL)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)   # as Python sets it up
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    for stream, fd in (("stdout", 1), ("stderr", 2)):
        setattr(sys, stream, io.TextIOWrapper(io.FileIO(fd, "w", closefd=False),
                                              encoding="utf-8", errors="backslashreplace",
                                              line_buffering=True, write_through=True))
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
    script = argv[0]
    sys.argv = list(argv)
    extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]
    sys.path[:0] = [os.path.dirname(os.path.abspath(script))] + extra
    code, interrupted = 0, False
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        if e.code is None:
            code = 0
        elif isinstance(e.code, int):
            code = e.code
        else:
            sys.stderr.write("%s\n" % (e.code,))
            code = 1
    except KeyboardInterrupt:
        _print_exc(traceback)
        interrupted = True
    except BaseException:
        _print_exc(traceback)
        code = 1
    try:
        threading._shutdown()   # as the interpreter's exit: non-daemon threads first
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        traceback.print_exc()
        code = code or 1
    if interrupted:     # as CPython's exit after an uncaught KeyboardInterrupt
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code & 0xFF)


def _accept(listener, conns):
    """Takes one client's request and forks its worker: conns maps the
    worker's pid to the client's connection."""
    conn, _ = listener.accept()
    _, fds, _, _ = socket.recv_fds(conn, 1, 3)
    req = _recv_msg(conn)
    if req is None or len(fds) != 3:
        for fd in fds:
            os.close(fd)
        conn.close()
        return
    pid = os.fork()
    if pid == 0:
        listener.close()
        for c in conns.values():
            c.close()
        conn.close()
        _become_worker(req["argv"], req["env"], req["cwd"], fds)
    for fd in fds:
        os.close(fd)
    conns[pid] = conn
    _send_msg(conn, {"pid": pid})


def _reap(conns):
    """Tells each client whose worker exited how it ended."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = conns.pop(pid, None)
        if conn is None:
            continue
        msg = {"signal": os.WTERMSIG(status)} if os.WIFSIGNALED(status) \
            else {"exit": os.WEXITSTATUS(status)}
        try:
            _send_msg(conn, msg)
        except OSError:
            pass
        conn.close()


def serve(path, preload):
    """Imports `preload`, then serves workers on the Unix socket `path`
    until stdin (a pipe from conftest.py) closes; then kills the workers
    still running."""
    for name in preload:
        try:
            __import__(name)
        except ImportError:
            pass    # the worker's own import then says what is missing
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    print("ready", flush=True)
    conns = {}
    while True:
        ready, _, _ = select.select([listener, sys.stdin] + list(conns.values()), [], [], 0.05)
        _reap(conns)
        for r in ready:
            if r is listener:
                _accept(listener, conns)
            elif r is sys.stdin:
                for pid in conns:
                    os.kill(pid, signal.SIGKILL)
                return
            else:
                # A client hung up before its worker ended (the launcher
                # killed it): the worker goes too.
                pid = next((p for p, c in conns.items() if c is r), None)
                if pid is not None and not r.recv(1):
                    os.kill(pid, signal.SIGKILL)
                    del conns[pid]      # _reap collects the worker all the same
                    r.close()


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--serve":
        serve(sys.argv[2], sys.argv[3:])
    else:
        client(sys.argv[1:])
