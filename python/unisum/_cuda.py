"""CUDA tensors in unisum.torch (issue 22): the pipeline of one push_pull.

The C library sums host memory only.  A CUDA tensor's push_pull goes:

1. On the caller's thread, without waiting for the GPU: an event is
   recorded on the tensor's current stream, and the device-to-host copy is
   queued on this device's copy stream behind it, into a page-locked
   staging buffer (kept per tensor name, so every step reuses it), with
   an event behind the copy.
2. The starter thread takes the operations in the order they were
   queued (autograd's order, which the priorities follow): it waits for
   each copy's event and starts the C push_pull on the staging buffer, in
   place.  Large tensors are copied in pieces (_PIECE_BYTES), each with
   its own event, and pushed as one operation once the last has landed.
3. The finisher thread waits for the C operations in the same order, and
   queues each sum's host-to-device copy on the second stream, with an
   event behind it.
4. synchronize() (and so DistributedOptimizer.step()) makes the caller's
   current stream wait for that event: the host never waits for the GPU
   unless the caller does.

Backward, the copies and the summation of different tensors overlap.  The
threads do not run Python while they wait: torch's event waits and the C
library's waits release the interpreter lock.
"""
from __future__ import annotations

import queue
import threading
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

# A tensor larger than this is copied to the host in pieces of this size,
# each with its own event (the copy of the last piece still overlaps the
# others' wait).
_PIECE_BYTES = 4 << 20


class _Streams:
    """A device's two copy streams."""

    def __init__(self, device: torch.device) -> None:
        self.d2h = torch.cuda.Stream(device=device)
        self.h2d = torch.cuda.Stream(device=device)


_lock = threading.Lock()
_streams: Dict[int, _Streams] = {}
_staging: Dict[Tuple[str, torch.dtype, int], torch.Tensor] = {}
_last_back: Dict[str, Any] = {}     # name -> the event of its last copy back
_busy: set = set()      # names whose staging buffer an operation holds
_started = False
_to_start: "queue.Queue[Optional[_Job]]" = queue.Queue()
_to_finish: "queue.Queue[Optional[_Job]]" = queue.Queue()


def streams(device: torch.device) -> _Streams:
    """The copy streams of `device`, made on first use."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    with _lock:
        s = _streams.get(index)
        if s is None:
            s = _streams[index] = _Streams(torch.device("cuda", index))
        return s


def staging(name: str, like: torch.Tensor) -> torch.Tensor:
    """The page-locked host buffer of tensor `name` (flat, like's dtype and
    element count), allocated once and reused; held until release(name).
    A second operation on a name whose first is not synchronized yet is
    refused (EBUSY), as the C library refuses it for host tensors: both
    would use the one buffer."""
    from unisum import _capi
    from unisum._capi import UnisumError
    key = (name, like.dtype, like.numel())
    with _lock:
        if name in _busy:
            raise UnisumError("unisum.torch: tensor '%s' has an operation in flight; synchronize "
                              "it first" % name, _capi.EBUSY)
        _busy.add(name)
        buf = _staging.get(key)
        if buf is None:
            buf = torch.empty(like.numel(), dtype=like.dtype, pin_memory=True)
            _staging[key] = buf
        return buf


def release(name: str, drop: bool = False) -> None:
    """The operation holding `name`'s staging buffer has ended; `drop`: a
    one-shot name's buffer goes back to PyTorch's pinned-memory cache
    (which reuses it only once the copies queued from it are done)."""
    with _lock:
        _busy.discard(name)
        if drop:
            for key in [k for k in _staging if k[0] == name]:
                del _staging[key]
            _last_back.pop(name, None)


def forget() -> None:
    """Drops the staging buffers (rejoin: the tensors are declared anew)."""
    with _lock:
        _staging.clear()
        _busy.clear()
        _last_back.clear()


# The C library's calls from the threads hold the gate; rejoin() holds it
# around unisum_rejoin, which frees and rebuilds the worker.  Jobs made
# before the last rejoin (an older generation) never call the C library.
_gate = threading.Lock()
_generation = 0


def new_generation() -> threading.Lock:
    """rejoin(): the jobs in flight belong to the ended membership.  Returns
    the gate, to hold around unisum_rejoin."""
    global _generation
    with _lock:
        _generation += 1
    return _gate


class _Job:
    """One CUDA push_pull in flight through the threads.  The callables
    come from torch.py's _start_cuda: start() starts the C operation and
    returns its handle, ready(h) says whether it is done (raising its
    error), nap(h) waits for it a millisecond at most, end_c(h) finishes it
    (synchronize), back() queues the copy back and returns its event, and
    abort() undoes the declaration of a one-shot name that never ran."""

    __slots__ = ("copied", "start", "ready", "nap", "end_c", "back", "abort", "done", "error",
                 "device", "cond", "handle", "gen")

    def __init__(self, device: torch.device, copied: List[Any], start: Callable[[], int],
                 ready: Callable[[int], bool], nap: Callable[[int], None],
                 end_c: Callable[[int], None], back: Callable[[], Any],
                 abort: Callable[[], None]) -> None:
        self.device = device
        self.copied = copied        # events of the device-to-host copies
        self.start, self.ready, self.nap, self.end_c = start, ready, nap, end_c
        self.back, self.abort = back, abort
        self.done: Optional[Any] = None     # the copy back's event, once queued
        self.error: Optional[BaseException] = None
        self.cond = threading.Condition()
        self.handle = 0             # the C operation's, once started
        with _lock:
            self.gen = _generation


def _end(job: _Job, event: Any = None, error: Optional[BaseException] = None) -> None:
    with job.cond:
        job.done, job.error = event, error
        job.cond.notify_all()


def _stale(job: _Job) -> None:
    """Raises for a job of an ended membership (under the gate)."""
    if job.gen != _generation:
        from unisum import _capi
        from unisum._capi import UnisumError
        raise UnisumError("unisum.torch: the job re-formed (rejoin) while this CUDA "
                          "push_pull was in flight", _capi.EMEMBERSHIP)


def _starter() -> None:
    while True:
        job = _to_start.get()
        if job is None:
            return
        try:
            with torch.cuda.device(job.device):
                for event in job.copied:
                    event.synchronize()
            with _gate:
                _stale(job)
                job.handle = job.start()
        except BaseException as e:      # noqa: B902 - handed to the caller
            try:
                job.abort()
            finally:
                _end(job, error=e)
            continue
        _to_finish.put(job)


def _finisher() -> None:
    """Finishes the started jobs in whatever order their C operations end
    (never one behind another: ranks may wait for them in other orders)."""
    started: List[_Job] = []
    while True:
        try:
            while True:
                job = _to_finish.get_nowait() if started else _to_finish.get()
                if job is None:
                    return
                started.append(job)
        except queue.Empty:
            pass
        progressed = False
        for job in list(started):
            try:
                with _gate:
                    _stale(job)
                    if not job.ready(job.handle):
                        continue
                    job.end_c(job.handle)
                with torch.cuda.device(job.device):
                    event = job.back()
            except BaseException as e:  # noqa: B902 - handed to the caller
                _end(job, error=e)
            else:
                _end(job, event)
            started.remove(job)
            progressed = True
        if started and not progressed:
            with _gate:
                if started[0].gen == _generation:
                    started[0].nap(started[0].handle)


def _ensure_threads() -> None:
    global _started
    with _lock:
        if _started:
            return
        for target in (_starter, _finisher):
            threading.Thread(target=target, name="unisum-cuda-" + target.__name__.strip("_"),
                             daemon=True).start()
        _started = True


def submit(job: _Job) -> _Job:
    """Queues a job for the starter thread."""
    _ensure_threads()
    _to_start.put(job)
    return job


def copy_out(name: str, send: torch.Tensor, host: torch.Tensor) -> List[Any]:
    """Queues the device-to-host copy of contiguous `send` into `host` (flat,
    `name`'s staging buffer) on the copy stream, behind everything queued
    so far on the current stream and behind the buffer's last copy back;
    returns the events its pieces complete (blocking events: the starter
    thread sleeps on them rather than spin)."""
    s = streams(send.device)
    ready = torch.cuda.Event()
    ready.record(torch.cuda.current_stream(send.device))
    with _lock:
        last = _last_back.get(name)
    flat = send.reshape(-1)
    piece = max(1, _PIECE_BYTES // max(1, send.element_size()))
    events = []
    with torch.cuda.stream(s.d2h):
        s.d2h.wait_event(ready)
        if last is not None:
            s.d2h.wait_event(last)
        for lo in range(0, flat.numel(), piece):
            hi = min(flat.numel(), lo + piece)
            host[lo:hi].copy_(flat[lo:hi], non_blocking=True)
            e = torch.cuda.Event(blocking=True)
            e.record(s.d2h)
            events.append(e)
    # The caching allocator must not hand send's memory out again before
    # the copy stream has read it.
    send.record_stream(s.d2h)
    return events


def copy_back(name: str, host: torch.Tensor, dest: torch.Tensor) -> Any:
    """Queues the host-to-device copy of `host` (flat, `name`'s staging
    buffer) into contiguous `dest` on the second stream; returns its
    event."""
    s = streams(dest.device)
    with torch.cuda.stream(s.h2d):
        dest.reshape(-1).copy_(host, non_blocking=True)
        e = torch.cuda.Event()
        e.record(s.h2d)
    dest.record_stream(s.h2d)
    with _lock:
        _last_back[name] = e
    return e


def wait_end(job: _Job, slice_s: float) -> None:
    """Waits for the job to end, returning to the interpreter every slice_s
    seconds so that signal handlers (Ctrl-C) run."""
    while not wait(job, slice_s)[0]:
        pass


def wait(job: _Job, slice_s: float) -> Tuple[bool, Optional[Any], Optional[BaseException]]:
    """Waits up to slice_s seconds for the job: (ended, its event, its
    error)."""
    with job.cond:
        if job.done is None and job.error is None:
            job.cond.wait(slice_s)
        return job.done is not None or job.error is not None, job.done, job.error
