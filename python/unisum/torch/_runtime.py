"""Joining and leaving the job (private): init, shutdown, rejoin and
membership_changed, barrier, get_stats, BytePS's suspend and resume, and
the timeline.
"""

from __future__ import annotations

import atexit
import ctypes
import os
from typing import Any, Dict, Optional

import torch

from unisum import _capi
from unisum._capi import UnisumError
from unisum.torch import _core
from unisum.torch._core import (_SigintHold, _WAIT_SLICE_MS, _answers, _calls, _land_flying, _lock,
                                _ops, _optimizers, _pending, _poll, _rejoin_hooks, _require_init,
                                _settle, _specs, _stage_lock, _tensors, local_rank, local_size,
                                rank, size)
from unisum.torch._memory import _pool_drop
from unisum.torch.ops import _cuda_end, _pset_of, _start, synchronize

_joined = False               # the C library joined the job and has not left it
_init_pid = 0                 # the process that joined (a fork of it must not leave)
_at_exit_set = False          # _leave_at_exit is registered


def init(lazy: bool = True, comm: Any = None, process_sets: Any = None) -> None:
    """Joins the job described by the environment (UNISUM_* or the BytePS
    DMLC_* names); under `unisum launch` everything is already set.

    Blocks until the whole job has registered.  A second call, before
    shutdown(), does nothing; after shutdown() it resumes the same job with
    the same rank, as Horovod allows.

    Args:
        lazy: BytePS's keyword; unisum always joins here (its servers and
            scheduler need no lazy start), so either value does the same.
        comm: Horovod's MPI communicator or list of ranks; unisum runs
            every rank of its job, so only None (or every rank) is taken.
        process_sets: Horovod's: a list of ProcessSets (or rank lists) to
            add now (add_process_set), or "dynamic" (sets are always
            dynamic in unisum).

    Raises:
        UnisumError: When the C library cannot join the job: a missing or
            invalid setting (``ECONFIG`` names the variable), a scheduler or
            server that cannot be reached, a failed authentication, a
            timeout.
        ValueError: For a `comm` that is not every rank.
    """
    del lazy
    _join()
    _pick_device()
    if comm is not None and sorted(comm) != list(range(size())):
        raise ValueError("unisum.torch.init: comm=%r: a unisum job runs all of its ranks; "
                         "use a process set (add_process_set) for a subgroup" % (comm,))
    if process_sets is not None and process_sets != "dynamic":
        from unisum import _horovod
        for ps in process_sets:
            _horovod.add_process_set(ps)


def _pick_device() -> None:
    """With several GPUs, this process's current device is the one of its
    local rank ($LOCAL_RANK, which torchrun and `unisum launch` set, else
    local_rank()), modulo their number, as torchrun users expect; with one,
    every process of the machine shares it."""
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        return
    env = os.environ.get("LOCAL_RANK", "")
    lr = int(env) if env.isdigit() else local_rank()
    torch.cuda.set_device(lr % torch.cuda.device_count())


def _join() -> None:
    """init()'s joining."""
    global _joined, _init_pid, _at_exit_set
    with _lock:
        if _core._initialized:
            return
        if not _joined:
            _capi.check(_capi.lib.unisum_init(), "unisum.torch.init")
            _joined = True
            _init_pid = os.getpid()
        _core._initialized = True
        if not _at_exit_set:
            atexit.register(_leave_at_exit)
            _at_exit_set = True


def _leave_at_exit() -> None:
    """At interpreter exit, leaves the job (unisum_shutdown), so that a
    script ends its job normally whether or not it called shutdown()
    (BytePS's and Horovod's examples do not).  Only when no operation is
    in flight: one that is waits on other workers, and leaving would hang
    the exit; the process then ends without a goodbye and the job fails
    naming it."""
    global _joined
    if not _joined or os.getpid() != _init_pid:
        return
    try:
        _land_flying()      # a DS-Sync optimizer's last group average
    except UnisumError:
        return
    with _lock:
        pending = [op for op in _ops.values() if not op.done]
    for op in pending:
        if op.job is not None:
            from unisum import _cuda
            if not _cuda.wait(op.job, 0)[0]:
                return      # a CUDA push_pull, its C operation still to start or end
        elif op.then is not None:
            return          # a stage still to run: the others may wait on it
        elif op.c_handle is not None:
            rc = _poll(op.c_handle, 0)
            if rc == 0:
                return
            op.done = True
    with _lock:
        _joined = False
        _ops.clear()
    # A failure here was the job's, reported where it happened.
    _capi.lib.unisum_shutdown()


def shutdown() -> None:
    """Waits for operations in flight and stops using the job: every handle
    is forgotten, and every call but init() raises until init() resumes
    the same job (as Horovod allows).  The process leaves the job for good
    when it exits, also when it never calls shutdown(), as BytePS's and
    Horovod's scripts do not.  Without init(), or a second time, it does
    nothing.

    Raises:
        UnisumError: When an operation that was still in flight failed.
    """
    # A DS-Sync optimizer's group average in flight, loaded.
    dssync_error: Optional[BaseException] = None
    if _core._initialized:
        try:
            _land_flying()
        except UnisumError as e:
            dssync_error = e
    # A CUDA tensor's push_pull waits on a C operation of its own (_cuda):
    # those end first, their threads still seeing the C operations.
    with _lock:
        cuda_ops = ([(h, op) for h, op in _ops.items() if op.job is not None]
                    if _core._initialized else [])
    cuda_error: Optional[BaseException] = None
    for h, op in cuda_ops:
        from unisum import _cuda
        _cuda.wait_end(op.job, _WAIT_SLICE_MS / 1000.0)
        try:
            _cuda_end(h, op)
        except UnisumError as e:
            cuda_error = cuda_error or e
    with _lock:
        if not _core._initialized:
            return
        _core._initialized = False
        ops = sorted(((h, op) for h, op in _ops.items() if op.job is None),
                     key=lambda kv: kv[0])
    _pool_drop()
    # Every operation to its end, every stage run (the other ranks' ops
    # may wait on them), in the order they began; then each is finished
    # once, also those done but never synchronized.
    for h, op in ops:
        _settle(h, op)
    with _stage_lock:
        _pending.clear()
    with _lock:
        for h, _ in ops:
            _ops.pop(h, None)
    first_error: Optional[BaseException] = None
    for _, op in ops:
        op.failed = op.error is not None
        op.finish()
        first_error = first_error or op.error
    if first_error is not None:
        raise UnisumError("unisum.torch.shutdown: an operation in flight failed: %s"
                          % first_error, getattr(first_error, "code", _capi.EINVAL))
    if cuda_error is not None:
        raise cuda_error
    if dssync_error is not None:
        raise dssync_error


def membership_changed() -> bool:
    """Elastic jobs (``unisum launch --elastic``): whether this worker
    should call :func:`rejoin`: its membership ended (a worker was lost,
    the job re-forms) or workers wait to join.  ``elastic.State.commit()``
    polls it.

    Raises:
        UnisumError: When the job failed, or before init().
    """
    _require_init()
    return _capi.check(_capi.lib.unisum_membership_changed(),
                       "unisum.torch.membership_changed") == 1


def rejoin() -> None:
    """Elastic jobs: leaves the ended membership and joins the new one
    (blocking until it has formed; asks the scheduler to re-form when it
    has not, taking in the workers that wait).  rank() and size() change;
    every operation in flight and every declared tensor is forgotten, and
    DistributedOptimizers start their next step afresh.  The model's state
    is the caller's: ``elastic.run`` restores and broadcasts it.

    Raises:
        UnisumError: When the job is not elastic, or failed (fewer workers
            left than ``--min-workers``).
    """
    _require_init()
    # unisum_rejoin blocks until the job has re-formed (a Ctrl-C cannot
    # stop it), and what follows it must all run: a Ctrl-C comes after.
    with _SigintHold():
        _rejoin()


def _rejoin() -> None:
    """rejoin()'s work."""
    global _barrier_ended
    with _stage_lock:
        _pending.clear()
    with _lock:
        pending = list(_ops.values())
        _ops.clear()
        _tensors.clear()
        _specs.clear()
        _calls.clear()
        _answers.clear()
        _barrier_ended = False      # of the ended membership: not the next barrier()
    # Held until unisum_rejoin has ended every operation: what the hooks
    # give back (the speculative rounds' buffers, which the C library may
    # still write into).
    held = [hook() for hook in _rejoin_hooks]
    if torch.cuda.is_available():
        from unisum import _cuda
        _cuda.forget()
    # The C library waits for every operation (each failed) and joins anew;
    # the CUDA threads' jobs in flight are of the ended membership, and make
    # no C call while it does (_cuda's gate).
    if torch.cuda.is_available():
        from unisum import _cuda
        with _cuda.new_generation():
            rc = _capi.lib.unisum_rejoin()
    else:
        rc = _capi.lib.unisum_rejoin()
    for op in pending:
        if op.done and op.job is not None:
            continue    # a CUDA push_pull that ended: its threads finished it
        # Each finished once: failed when it had not ended (its C
        # operation failed with the membership), else as it ended.
        op.failed = not op.done or op.error is not None
        op.done = True
        op.finish()
    del held
    _capi.check(rc, "unisum.torch.rejoin")
    for opt in list(_optimizers):
        opt._unisum_reset()


def get_stats() -> Dict[str, Any]:
    """What this worker's pipeline has done since init(), as unisum.h's
    unisum_get_stats() says: ``operations`` (collectives completed),
    ``bytes_pushed`` and ``bytes_pulled`` (data to and from the servers),
    ``server_bytes`` (a list: what went to each server), ``local_bytes``
    (input summed from its machine's workers through shared memory),
    ``partitions_sent``, ``credit_bytes``, ``partition_bytes`` and
    ``max_inflight_bytes``.

    Raises:
        UnisumError: When init() has not been called (``ENOTINIT``).
    """
    _require_init()
    st = _capi.Stats()
    _capi.check(_capi.lib.unisum_get_stats(ctypes.byref(st)), "unisum.torch.get_stats")
    out: Dict[str, Any] = {name: getattr(st, name) for name, _ in st._fields_
                           if name not in ("server_bytes", "nservers")}
    out["server_bytes"] = list(st.server_bytes[:min(st.nservers, _capi.STATS_SERVERS)])
    return out


def barrier(process_set: Any = None) -> None:
    """Returns once every worker has called barrier() (with a Horovod
    process set: every member of it, by a push_pull among them).

    The wait returns to the interpreter every 100 ms, so a signal handler
    (Ctrl-C's KeyboardInterrupt) can interrupt it.

    Raises:
        UnisumError: When init() has not been called, or when the job
            failed.
    """
    _require_init()
    pset = _pset_of(process_set)
    if pset != 0:
        synchronize(_start(torch.zeros(1, dtype=torch.int32), False, None, 0, True, pset=pset))
        return
    global _barrier_ended
    if _barrier_ended:
        # The last call's barrier ended as a signal's exception cut it
        # off: this call is that one, already met (a new barrier would be
        # one ahead of every other worker's).
        _barrier_ended = False
        return
    # In slices, so that signal handlers run (see _wait).
    answer = ctypes.c_int(0)
    try:
        while _capi.check(_capi.lib.unisum_barrier_timeout_into(_WAIT_SLICE_MS,
                                                                ctypes.byref(answer)),
                          "unisum.torch.barrier") == 0:
            pass
    except BaseException:
        _barrier_ended = answer.value > 0
        raise


# barrier(): the barrier of the last call ended, but a signal's exception
# came as its C call returned (see _poll).
_barrier_ended = False


def suspend() -> None:
    """BytePS's suspend(): waits for the operations in flight and stops
    using the job until resume() (shutdown() keeps the process in it)."""
    shutdown()


def resume(num_workers: Optional[int] = None, num_servers: Optional[int] = None,
           global_rank: Optional[int] = None, context: Any = None) -> None:
    """BytePS's resume(): uses the job again after suspend() (init()).
    Only the job as it was.  BytePS also resumes at another size, its
    elastic training; unisum's elastic jobs change size another way, as
    Horovod's do: ``unisum launch --elastic`` adds and loses workers, and
    ``unisum.torch.elastic.run`` (or rejoin()) carries a training loop
    across each change.

    Raises:
        NotImplementedError: For a number of workers or servers, or a rank,
            other than the job's.
    """
    del context
    init()
    wanted = {"num_workers": (num_workers, size() // local_size()),
              "num_servers": (num_servers, None), "global_rank": (global_rank, rank())}
    for what, (asked, now) in wanted.items():
        if asked is not None and now is not None and int(asked) != now:
            raise NotImplementedError("unisum.torch.resume(%s=%s): the job has %s; resume() "
                                      "resumes the job as it was: for a job that changes size "
                                      "use `unisum launch --elastic` and "
                                      "unisum.torch.elastic.run (or rejoin())"
                                      % (what, asked, now))


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Horovod's: records every collective from now on into the Chrome
    trace-event JSON file `file_path` (unisum's timeline: QUEUE, PUSH, PULL
    and local reduce spans per partition) until stop_timeline().
    `mark_cycles` is taken and unused (unisum has no negotiation cycles).

    Raises:
        UnisumError: While a timeline is being written already (also the
            one UNISUM_TRACE_ON starts), or when the file cannot be written.
    """
    del mark_cycles
    _require_init()
    _capi.check(_capi.lib.unisum_timeline_start(os.fsencode(file_path)),
                "unisum.torch.start_timeline")


def stop_timeline() -> None:
    """Horovod's: ends the timeline start_timeline() began and completes
    its file."""
    _require_init()
    _capi.check(_capi.lib.unisum_timeline_stop(), "unisum.torch.stop_timeline")
