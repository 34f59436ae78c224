"""ctypes bindings of the C API in include/unisum.h.

The library is looked up, in order, at ``$UNISUM_LIBRARY``, next to this
file (an installed package carries a copy), in the build tree of a source
checkout (``<repo>/build/libunisum.so``), and on the system's library path.
Every call that fails raises :class:`UnisumError` with the C library's own
message (rank, tensor, what to do).  ctypes releases the GIL during each
call, so a blocking wait never stalls other Python threads.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from typing import Iterator

# Values of unisum_dtype (part of the wire protocol).
FLOAT32, FLOAT64, FLOAT16, BFLOAT16, INT32, INT64 = range(6)

# Error codes of unisum.h.
EINVAL, ENOMEM, ECONFIG, ENOTINIT, EMISMATCH, ECONN = -1, -2, -3, -4, -5, -6
EPROTO, ETIMEDOUT, EBUSY, EREMOTE, ESYS, ESHUTDOWN, EAUTH = -7, -8, -9, -10, -11, -12, -13
EMEMBERSHIP = -14

AVERAGE, MIN, MAX, PRODUCT = 0x1, 0x2, 0x4, 0x8


class UnisumError(RuntimeError):
    """A unisum call failed; ``code`` is the negative UNISUM_E* value.

    Every failure of the C library, and every misuse that
    :mod:`unisum.torch` detects itself (a call before ``init()``, a tensor
    name reused with another shape, an unknown handle), raises this
    exception.  Its message is the C library's detailed message when there
    is one (which rank, which tensor, what to do), and ``code`` is one of the
    ``E*`` constants of :mod:`unisum._capi` (``ENOTINIT``, ``EMISMATCH``,
    ...), or 0 when no error code applies.

    Args:
        message: The text of the error.
        code: The negative ``UNISUM_E*`` value of the failure, or 0.
    """

    code: int

    def __init__(self, message: str, code: int = 0) -> None:
        super().__init__(message)
        self.code = code


def _candidates() -> Iterator[str]:
    """Yields the paths (or, last, a bare library name) to try loading
    libunisum.so from, in the order the module docstring gives."""
    env = os.environ.get("UNISUM_LIBRARY")
    if env:
        yield env
    here = os.path.dirname(os.path.abspath(__file__))
    yield os.path.join(here, "libunisum.so")
    yield os.path.join(here, os.pardir, os.pardir, "build", "libunisum.so")
    found = ctypes.util.find_library("unisum")
    if found:
        yield found


def _load() -> ctypes.CDLL:
    """Loads the first libunisum.so of _candidates() that loads; raises
    ImportError naming every place it tried when none does."""
    tried = []
    for path in _candidates():
        if os.path.sep in path and not os.path.exists(path):
            tried.append(path)
            continue
        try:
            return ctypes.CDLL(path)
        except OSError as e:
            tried.append("%s (%s)" % (path, e))
    raise ImportError(
        "unisum: cannot find libunisum.so; build it with `make` in the source tree "
        "or set UNISUM_LIBRARY. Tried: " + "; ".join(tried))


lib: ctypes.CDLL = _load()

_c_int, _c_size, _c_ptr, _c_i64 = ctypes.c_int, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_int64
for _name, _args, _ret in [
    ("unisum_init", [], _c_int),
    ("unisum_shutdown", [], _c_int),
    ("unisum_rank", [], _c_int),
    ("unisum_size", [], _c_int),
    ("unisum_local_rank", [], _c_int),
    ("unisum_local_size", [], _c_int),
    ("unisum_declare", [ctypes.c_char_p, _c_int, _c_size, _c_int], _c_int),
    ("unisum_declare_shaped", [ctypes.c_char_p, _c_int, _c_int, ctypes.POINTER(_c_i64), _c_int],
     _c_int),
    ("unisum_push_pull_async", [_c_int, _c_ptr, _c_ptr, _c_int, ctypes.POINTER(_c_i64)], _c_int),
    ("unisum_declare_in", [_c_int, ctypes.c_char_p, _c_int, _c_int, ctypes.POINTER(_c_i64),
                           _c_int], _c_int),
    ("unisum_declare_sync", [ctypes.c_char_p, _c_int, _c_size, _c_int, ctypes.c_char_p], _c_int),
    ("unisum_declare_ex", [ctypes.c_char_p, _c_int, _c_size, _c_int, ctypes.c_char_p], _c_int),
    ("unisum_process_set_add", [ctypes.POINTER(_c_int), _c_int], _c_int),
    ("unisum_process_set_remove", [_c_int], _c_int),
    ("unisum_timeline_start", [ctypes.c_char_p], _c_int),
    ("unisum_timeline_stop", [], _c_int),
    ("unisum_join", [], _c_int),
    ("unisum_rejoin", [], _c_int),
    ("unisum_membership_changed", [], _c_int),
    ("unisum_undeclare", [_c_int], _c_int),
    ("unisum_poll", [_c_i64], _c_int),
    ("unisum_poll_timeout", [_c_i64, _c_int], _c_int),
    ("unisum_poll_timeout_into", [_c_i64, _c_int, ctypes.POINTER(_c_int)], _c_int),
    ("unisum_wait", [_c_i64], _c_int),
    ("unisum_broadcast", [_c_int, _c_ptr, _c_int], _c_int),
    ("unisum_broadcast_async", [_c_int, _c_ptr, _c_int, ctypes.POINTER(_c_i64)], _c_int),
    ("unisum_allgather_async", [_c_int, _c_ptr, _c_ptr, ctypes.POINTER(ctypes.c_uint64),
                                ctypes.POINTER(_c_i64)], _c_int),
    ("unisum_allgather_begin", [_c_int, _c_ptr, ctypes.POINTER(ctypes.c_uint64),
                                ctypes.POINTER(_c_i64)], _c_int),
    ("unisum_allgather_supply", [_c_i64, _c_ptr], _c_int),
    ("unisum_reduce_scatter_async", [_c_int, _c_ptr, _c_ptr, ctypes.POINTER(ctypes.c_uint64),
                                     _c_int, ctypes.POINTER(_c_i64)], _c_int),
    ("unisum_alltoall_async", [_c_int, _c_ptr, _c_ptr, ctypes.POINTER(ctypes.c_uint64),
                               ctypes.POINTER(_c_i64)], _c_int),
    # The blocking forms too, so that no caller passes a pointer through
    # ctypes' default int (it truncates to 32 bits).
    ("unisum_push_pull", [_c_int, _c_ptr, _c_ptr, _c_int], _c_int),
    ("unisum_allgather", [_c_int, _c_ptr, _c_ptr, ctypes.POINTER(ctypes.c_uint64)], _c_int),
    ("unisum_reduce_scatter", [_c_int, _c_ptr, _c_ptr, ctypes.POINTER(ctypes.c_uint64), _c_int],
     _c_int),
    ("unisum_alltoall", [_c_int, _c_ptr, _c_ptr, ctypes.POINTER(ctypes.c_uint64)], _c_int),
    ("unisum_barrier", [], _c_int),
    ("unisum_barrier_timeout", [_c_int], _c_int),
    ("unisum_barrier_timeout_into", [_c_int, ctypes.POINTER(_c_int)], _c_int),
    ("unisum_alloc", [_c_size], _c_ptr),
    ("unisum_free", [_c_ptr], None),
    ("unisum_get_stats", [_c_ptr], _c_int),
    ("unisum_version", [], ctypes.c_char_p),
    ("unisum_strerror", [_c_int], ctypes.c_char_p),
    ("unisum_last_error", [], ctypes.c_char_p),
]:
    _fn = getattr(lib, _name)
    _fn.argtypes = _args
    _fn.restype = _ret


# unisum.h's UNISUM_STATS_SERVERS and unisum_stats, field for field.
STATS_SERVERS = 64


class Stats(ctypes.Structure):
    _fields_ = [
        ("credit_bytes", ctypes.c_uint64),
        ("partition_bytes", ctypes.c_uint64),
        ("max_inflight_bytes", ctypes.c_uint64),
        ("partitions_sent", ctypes.c_uint64),
        ("bytes_pushed", ctypes.c_uint64),
        ("bytes_pulled", ctypes.c_uint64),
        ("operations", ctypes.c_uint64),
        ("local_bytes", ctypes.c_uint64),
        ("nservers", ctypes.c_int),
        ("server_bytes", ctypes.c_uint64 * STATS_SERVERS),
    ]


def error(rc: int, what: str) -> UnisumError:
    """Returns (does not raise) the exception for a failed call.

    Its message is `what`, a colon, and the C library's detailed message of
    this thread's last error, or the text of `rc` when there is none.

    Args:
        rc: The negative error code the C call returned.
        what: The operation that failed, to begin the message with.
    """
    detail = lib.unisum_last_error().decode("utf-8", "replace")
    text = lib.unisum_strerror(rc).decode()
    return UnisumError("%s: %s" % (what, detail or text), rc)


def check(rc: int, what: str) -> int:
    """Returns `rc` when it is not an error (zero or positive).

    Args:
        rc: The value a C call returned.
        what: The operation, to begin the error message with.

    Raises:
        UnisumError: When `rc` is negative; see :func:`error`.
    """
    if rc < 0:
        raise error(rc, what)
    return rc
