"""ProcessGroupUnisum: torch.distributed's calls on unisum's collectives
(private; see unisum.torch.distributed for what each call does).

Each call starts its unisum operations here, on the caller's thread, in
call order (every rank of the group makes the same calls in the same
order), and returns a Work (_work.py).  A call from torch.distributed's
Python is named by its order and declared for the call, as Horovod's
unnamed collectives are, except a small all_reduce (_small.py); DDP's calls
from C++ keep their names (_slot).  Only alltoall with sizes that differ by
rank first gathers every rank's sizes, waiting for that small gather here.
"""

from __future__ import annotations

import datetime
import re
import threading
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import ProcessGroup, ReduceOp

from unisum import _capi
from unisum._capi import UnisumError
from unisum.torch import _core
from unisum.torch._core import _DTYPES, _Op, _raise_kept, _register
from unisum.torch.functions import _broadcast_start
from unisum.torch.ops import _by_order, _start, synchronize
from unisum._horovod import basics as hb
from unisum._horovod.common import _gather_launch, _widened
from unisum.torch.distributed import _small, _work

# torch's ReduceOp -> Horovod's op (unisum._horovod.basics).
_OPS = ((ReduceOp.SUM, hb.Sum, "SUM"), (ReduceOp.AVG, hb.Average, "AVG"),
        (ReduceOp.MIN, hb.Min, "MIN"), (ReduceOp.MAX, hb.Max, "MAX"),
        (ReduceOp.PRODUCT, hb.Product, "PRODUCT"))
_PREFIX = "tdist"   # DDP's tensors' names: tdist.<kind>.<signature>.<slot>
_SLOTS = 2          # names per signature: calls of one signature in flight at once
# Dtypes the C library has no name for, carried as int32 (exact both ways;
# a sum wraps as the narrow type's would when cast back).
_NARROW = (torch.bool, torch.uint8, torch.int8, torch.int16)
_P2P = ("unisum: point-to-point %s is not supported: unisum's collectives run through its "
        "Summation Service, which has no path from one rank to another.  Use a collective "
        "(broadcast, all_to_all_single with splits) or a gloo group for it: "
        "dist.new_group(ranks, backend='gloo')")

Built = Tuple[List[int], List[torch.Tensor], Optional[Callable[[], None]]]


def _op_of(opts: Any, what: str) -> Tuple[int, str]:
    """Horovod's op for opts.reduceOp, and its name; RuntimeError for the
    ones unisum does not reduce."""
    red = getattr(opts, "reduceOp", ReduceOp.SUM)
    for torch_op, hvd_op, name in _OPS:
        if red == torch_op:
            return hvd_op, name
    names = [n for n in ("BAND", "BOR", "BXOR", "PREMUL_SUM") if red == getattr(ReduceOp, n)]
    raise RuntimeError("unisum: %s with ReduceOp.%s is not supported (unisum reduces with SUM, "
                       "AVG, MIN, MAX and PRODUCT)" % (what, names[0] if names else red))


def _check_dtype(t: torch.Tensor, what: str, complex_ok: bool = True) -> None:
    if t.dtype in _DTYPES or t.dtype in _NARROW or (complex_ok and t.is_complex()):
        return
    raise RuntimeError("unisum: %s of a %s tensor is not supported (unisum takes float32, "
                       "float64, float16, bfloat16, int64, int32, int16, int8, uint8 and bool%s)"
                       % (what, str(t.dtype).replace("torch.", ""),
                          ", and complex for SUM and AVG" if complex_ok else ""))


def _wire(t: torch.Tensor) -> Tuple[torch.Tensor, Optional[Callable[[], None]]]:
    """The tensor unisum moves for `t`, and what copies it back (None when
    it is `t` itself, or a view of it)."""
    if t.dtype in _DTYPES:
        return t, None
    if t.is_complex() and t.is_contiguous():
        return torch.view_as_real(t), None
    if t.is_complex():
        w = torch.view_as_real(t.contiguous())
        return w, lambda: t.copy_(torch.view_as_complex(w))
    w = _widened(t)
    return w, lambda: t.copy_(w.to(t.dtype))


def _flat_wire(t: torch.Tensor) -> torch.Tensor:
    """`t` as a flat tensor of a dtype the C library moves bit-exact."""
    w, _ = _wire(t.contiguous())
    return w.reshape(-1)


def _unwire(dst: torch.Tensor, src: torch.Tensor) -> None:
    """Copies wire elements `src` (_flat_wire's dtype) into `dst`."""
    if dst.is_complex():
        dst.copy_(torch.view_as_complex(src.reshape(dst.shape + (2,))))
    else:
        dst.copy_(src.reshape(dst.shape).to(dst.dtype))


class ProcessGroupUnisum(ProcessGroup):
    """The "unisum" backend's process group: a torch.distributed group whose
    collectives run on unisum's servers.  The default group is unisum's
    global set; a group of a subset (dist.new_group) is a process set."""

    def __init__(self, rank: int, size: int, timeout: datetime.timedelta) -> None:
        super().__init__(rank, size)
        self._timeout = timeout
        self._ranks: Optional[List[int]] = None
        self._set: Any = None
        self._counts: Dict[str, int] = {}       # C++ calls so far by kind and signature
        self._last: Dict[str, Any] = {}         # name -> the call that used it last
        self._retired: Dict[str, int] = {}      # kept name -> times a call on it failed
        # The call being started on this thread: whether it came from C++
        # (.cpp) and the names it used (.using).  DDP's reducer starts its
        # buckets on the autograd thread.
        self._tl = threading.local()

    def getBackendName(self) -> str:  # noqa: N802 (torch's name)
        return "unisum"

    # ---- where the group runs ------------------------------------------

    def _resolve(self) -> None:
        """This group's global ranks (by group rank) and process set, on
        its first call (torch fills _pg_group_ranks after creating it)."""
        if self._ranks is not None:
            return
        mapping = dist.distributed_c10d._pg_group_ranks.get(self)
        n = _core.size()
        ranks = sorted(mapping, key=lambda g: mapping[g]) if mapping else list(range(n))
        self._ranks = ranks
        self._set = None if ranks == list(range(n)) else _process_set(ranks)

    def _pset(self) -> int:
        self._resolve()
        return 0 if self._set is None else int(self._set.process_set_id)

    def _global(self, group_rank: int, what: str) -> int:
        self._resolve()
        if not 0 <= group_rank < len(self._ranks or []):
            raise RuntimeError("unisum: %s: root %d is not a rank of this group of %d"
                               % (what, group_rank, len(self._ranks or [])))
        return (self._ranks or [])[group_rank]

    # ---- naming and starting ----------------------------------------------

    def _slot(self, kind: str, sig: str) -> Optional[str]:
        """The name of this call's tensor.  Called from Python, None: a
        name by the call's order among the group's calls, declared for the
        call alone (as Horovod's unnamed collectives: ranks that pass
        different shapes fail at the declaration, every one of them, and
        the group goes on).  Called from C++ (DDP's reducer, its
        broadcasts of buffers), whose tensors DDP checked across the ranks
        when it was built: a name by kind and signature, then by how many
        calls of that signature the group made, modulo _SLOTS, that stays
        declared, so a training loop declares nothing after its first
        steps.  The call before on the same name must have ended (a name
        has one operation in flight): waited for here, in call order on
        every rank."""
        if not getattr(self._tl, "cpp", False):
            return None
        return self._kept("%s.%s" % (kind, sig))

    def _kept(self, key: str) -> str:
        """The next of `key`'s kept names (see _slot), the call before on
        it waited for."""
        n = self._counts.get(key, 0)
        self._counts[key] = n + 1
        name = "%s.%s.%d" % (_PREFIX, key, n % _SLOTS)
        # A failed round leaves its tensor failed for good: a name whose
        # call failed (every rank's did) is followed by a fresh one.
        if name in self._retired:
            name = "%s.r%d" % (name, self._retired[name])
        prev = self._last.get(name)
        if prev is not None:
            prev.done.wait()
        self._tl.using.append(name)
        return name

    def _run(self, what: str, build: Callable[[List[int]], Built]) -> Any:
        """Runs `build`, which starts the operation's handles (appending
        each to the list it gets as soon as it has it) and returns them
        with the result and what finishes it; returns the Work.  A start
        that fails raises RuntimeError; what it started is still waited
        for (by the completer)."""
        to_python = _work.python_caller()
        self._resolve()
        _work.hand_over_lazy()      # a call before on a kept name may be waited for
        self._tl.cpp, self._tl.using = not to_python, []
        started: List[int] = []
        try:
            handles, result, post = build(started)
        except (UnisumError, ValueError, TypeError) as e:
            failed = _work.Pending(what, started, [], None)
            self._mark(failed)
            _work.start(failed, self._timeout, False)
            raise RuntimeError("unisum: %s: %s" % (what, e)) from e
        p = _work.Pending(what, handles, result, post)
        kept = list(self._tl.using)     # only kept names are recorded
        if kept:
            p.on_error = lambda: self._retire(kept)
        self._mark(p)
        return _work.start(p, self._timeout, to_python)

    def _retire(self, names: List[str]) -> None:
        """The call on kept names `names` failed: their next use takes a
        fresh name (_kept).  Every rank's call failed alike."""
        for name in names:
            base = re.sub(r"\.r\d+$", "", name)
            self._retired[base] = self._retired.get(base, 0) + 1

    def _mark(self, p: Any) -> None:
        """Records `p` as the last call on the names it used."""
        for name in self._tl.using:
            self._last[name] = p
        self._tl.using = []

    def _gather(self, kind: str, send: torch.Tensor, recv: torch.Tensor, counts: List[int],
                flags: int = 0) -> int:
        """Starts the C library's `kind` (allgather, reducescatter,
        alltoall) of wire tensors on a one-shot name; returns its
        unisum.torch handle."""
        grp = hb._Group(self._set)
        name = _by_order(kind, pset=grp.pset)
        c_handle, finish = _gather_launch(kind, name, send, recv, counts, lambda: None, flags,
                                          grp)
        handle = _register(_Op(c_handle, send, recv, recv, finish), done=c_handle is None)
        _raise_kept()
        return handle

    def _reduce_into(self, t: torch.Tensor, op: int, started: List[int],
                     posts: List[Callable[[], None]]) -> None:
        w, back = _wire(t)
        flags, scale = _flags_of(op, w, len(self._ranks or []))
        name = self._slot("allreduce", "%s[%d].%d" % (_dtype_name(w), w.numel(), op))
        started.append(_start(w, False, name, 0, True, scale=scale, flags=flags,
                              pset=self._pset()))
        if back is not None:
            posts.append(back)

    # ---- the collectives -------------------------------------------------

    def allreduce(self, tensors: List[torch.Tensor], opts: Any = None) -> Any:
        return self._allreduce("allreduce", tensors, opts)

    def allreduce_coalesced(self, tensors: List[torch.Tensor], opts: Any = None) -> Any:
        return self._allreduce("allreduce_coalesced", tensors, opts)

    def _allreduce(self, what: str, tensors: List[torch.Tensor], opts: Any) -> Any:
        op, name = _op_of(opts, what)
        for t in tensors:
            _check_dtype(t, what, complex_ok=name in ("SUM", "AVG"))
        self._resolve()

        def build(started: List[int]) -> Built:
            posts: List[Callable[[], None]] = []
            for t in tensors:
                if not self._tl.cpp and _small.eligible(t, op):
                    self._reduce_small(what, t, op, started, posts)
                else:
                    self._reduce_into(t, op, started, posts)
            return started, tensors, _all(posts)
        return self._run(what, build)

    def _reduce_small(self, what: str, t: torch.Tensor, op: int, started: List[int],
                      posts: List[Callable[[], None]]) -> None:
        """A few elements from Python: on a kept name, checked in the same
        round (_small.py)."""
        buf = _small.buffer(t, op)
        name = self._kept("small.%s" % _small.family(t))
        started.append(_start(buf, False, name, 0, True, flags=_small.flags(op),
                              pset=self._pset()))
        posts.append(_small.finish(t, op, buf, len(self._ranks or []), what))

    def broadcast(self, tensors: List[torch.Tensor], opts: Any = None) -> Any:
        root = self._global(getattr(opts, "rootRank", 0), "broadcast")

        def build(started: List[int]) -> Built:
            for t in tensors:
                name = self._slot("broadcast", "%s%s" % (_dtype_name(t), list(t.shape)))
                started.append(_broadcast_start(t, root, name, inplace=True,
                                                one_shot=name is None, pset=self._pset()))
            return started, tensors, None
        return self._run("broadcast", build)

    def allgather(self, output_lists: List[List[torch.Tensor]], inputs: List[torch.Tensor],
                  opts: Any = None) -> Any:
        self._resolve()
        n = len(self._ranks or [])
        for outs, t in zip(output_lists, inputs):
            _check_dtype(t, "allgather")
            if len(outs) != n or any(o.numel() != t.numel() for o in outs):
                raise RuntimeError("unisum: allgather wants %d output tensors of %d elements "
                                   "each, the input's" % (n, t.numel()))

        def build(started: List[int]) -> Built:
            posts = []
            for outs, t in zip(output_lists, inputs):
                send = _flat_wire(t)
                recv = torch.empty(send.numel() * n, dtype=send.dtype)
                started.append(self._gather("allgather", send, recv, [send.numel()] * n))
                posts.append(_scatter_to(outs, recv))
            return started, [o for outs in output_lists for o in outs], _all(posts)
        return self._run("allgather", build)

    def _allgather_base(self, output: torch.Tensor, input: torch.Tensor,  # noqa: A002
                        opts: Any = None) -> Any:
        self._resolve()
        n = len(self._ranks or [])
        _check_dtype(input, "all_gather_into_tensor")
        if output.numel() != n * input.numel() or output.dtype != input.dtype:
            raise RuntimeError("unisum: all_gather_into_tensor wants an output of %d x %d %s "
                               "elements" % (n, input.numel(), input.dtype))

        def build(started: List[int]) -> Built:
            send = _flat_wire(input)
            recv = torch.empty(send.numel() * n, dtype=send.dtype)
            started.append(self._gather("allgather", send, recv, [send.numel()] * n))
            return started, [output], lambda: _unwire(output, recv)
        return self._run("all_gather_into_tensor", build)

    def reduce_scatter(self, outputs: List[torch.Tensor], input_lists: List[List[torch.Tensor]],
                       opts: Any = None) -> Any:
        self._resolve()
        n = len(self._ranks or [])
        out, ins = outputs[0], input_lists[0]
        if len(ins) != n or any(x.numel() != out.numel() for x in ins):
            raise RuntimeError("unisum: reduce_scatter wants %d input tensors of %d elements "
                               "each, the output's" % (n, out.numel()))
        return self._reduce_scatter("reduce_scatter", out,
                                    torch.cat([x.reshape(-1) for x in ins]), opts)

    def _reduce_scatter_base(self, output: torch.Tensor, input: torch.Tensor,  # noqa: A002
                             opts: Any = None) -> Any:
        self._resolve()
        n = len(self._ranks or [])
        if input.numel() != n * output.numel():
            raise RuntimeError("unisum: reduce_scatter_tensor wants an input of %d x %d "
                               "elements" % (n, output.numel()))
        return self._reduce_scatter("reduce_scatter_tensor", output, input.reshape(-1), opts)

    def _reduce_scatter(self, what: str, out: torch.Tensor, flat: torch.Tensor, opts: Any) -> Any:
        op, name = _op_of(opts, what)
        _check_dtype(flat, what, complex_ok=False)
        n, k = len(self._ranks or []), (self._ranks or []).index(_core.rank())
        m = out.numel()
        if name not in ("SUM", "AVG") or flat.dtype not in _DTYPES:
            # The C library's reduce-scatter sums or averages native
            # dtypes: the rest is an allreduce of the whole, then a slice.
            def build_all(started: List[int]) -> Built:
                whole = flat.clone()
                posts: List[Callable[[], None]] = []
                self._reduce_into(whole, op, started, posts)
                posts.append(lambda: out.copy_(whole[k * m:(k + 1) * m].reshape(out.shape)))
                return started, [out], _all(posts)
            return self._run(what, build_all)

        def build(started: List[int]) -> Built:
            send = flat.contiguous()
            recv = torch.empty(m, dtype=flat.dtype)
            flags = _capi.AVERAGE if name == "AVG" else 0
            started.append(self._gather("reducescatter", send, recv, [m] * n, flags))
            return started, [out], lambda: out.copy_(recv.reshape(out.shape))
        return self._run(what, build)

    def _matrix(self, mine: List[int]) -> List[int]:
        """Every rank's `mine` (n counts each), gathered and waited for here:
        the n x n counts of an alltoall, row s being rank s's."""
        n = len(self._ranks or [])
        send = torch.tensor(mine, dtype=torch.int64)
        recv = torch.empty(n * n, dtype=torch.int64)
        synchronize(self._gather("allgather", send, recv, [n] * n))
        return [int(c) for c in recv.tolist()]

    def _alltoall(self, what: str, send: torch.Tensor, in_counts: List[int],
                  out_counts: Optional[List[int]], even: bool) -> Tuple[torch.Tensor, List[int]]:
        """Starts nothing: checks and returns the wire buffer to receive
        into and the n x n counts (elements) of an alltoall."""
        n, k = len(self._ranks or []), (self._ranks or []).index(_core.rank())
        counts = in_counts * n if even else self._matrix(in_counts)
        column = [counts[s * n + k] for s in range(n)]
        if out_counts is not None and column != out_counts:
            raise RuntimeError("unisum: %s: this rank expects %s elements from ranks %s, but "
                               "they send %s" % (what, out_counts, self._ranks, column))
        return torch.empty(sum(column), dtype=send.dtype), counts

    def alltoall_base(self, output: torch.Tensor, input: torch.Tensor,  # noqa: A002
                      output_split_sizes: List[int], input_split_sizes: List[int],
                      opts: Any = None) -> Any:
        self._resolve()
        n = len(self._ranks or [])
        what = "all_to_all_single"
        _check_dtype(input, what)
        if input.dim() == 0 or output.dim() == 0:
            raise RuntimeError("unisum: %s takes tensors of at least one dimension" % what)
        even = not input_split_sizes and not output_split_sizes
        if even and (input.shape[0] % n or output.shape[0] % n):
            raise RuntimeError("unisum: %s without splits wants first dimensions divisible by "
                               "the group's %d ranks" % (what, n))
        ins = list(input_split_sizes) or [input.shape[0] // n] * n
        outs = list(output_split_sizes) or [output.shape[0] // n] * n
        if len(ins) != n or len(outs) != n or sum(ins) != input.shape[0] or \
                sum(outs) != output.shape[0]:
            raise RuntimeError("unisum: %s: splits %s and %s do not cut %d and %d rows among %d "
                               "ranks" % (what, input_split_sizes, output_split_sizes,
                                          input.shape[0], output.shape[0], n))
        send = _flat_wire(input)
        recv, counts = self._alltoall(what, send, [r * _row(input) for r in ins],
                                      [r * _row(output) for r in outs], even)

        def build(started: List[int]) -> Built:
            started.append(self._gather("alltoall", send, recv, counts))
            return started, [output], lambda: _unwire(output, recv)
        return self._run(what, build)

    def alltoall(self, output_tensors: List[torch.Tensor], input_tensors: List[torch.Tensor],
                 opts: Any = None) -> Any:
        self._resolve()
        n = len(self._ranks or [])
        if len(input_tensors) != n or len(output_tensors) != n:
            raise RuntimeError("unisum: all_to_all wants %d input and output tensors" % n)
        for t in input_tensors:
            _check_dtype(t, "all_to_all")
        wires = [_flat_wire(t) for t in input_tensors]
        send = torch.cat(wires) if wires else torch.empty(0)
        recv, counts = self._alltoall("all_to_all", send, [w.numel() for w in wires],
                                      [t.numel() * _width(t) for t in output_tensors],
                                      False)

        def build(started: List[int]) -> Built:
            started.append(self._gather("alltoall", send, recv, counts))
            return started, list(output_tensors), _scatter_to(list(output_tensors), recv)
        return self._run("all_to_all", build)

    def reduce(self, tensors: List[torch.Tensor], opts: Any = None) -> Any:
        """An allreduce: every rank's tensor gets the result, the root's
        as torch.distributed promises."""
        self._global(getattr(opts, "rootRank", 0), "reduce")
        return self._allreduce("reduce", tensors, opts)

    def gather(self, output_lists: List[List[torch.Tensor]], inputs: List[torch.Tensor],
               opts: Any = None) -> Any:
        """An alltoall in which every rank sends only to the root."""
        root = self._global(getattr(opts, "rootRank", 0), "gather")
        return self._to_and_from_root("gather", root, output_lists[0] if output_lists else [],
                                      inputs[0], gather=True)

    def scatter(self, outputs: List[torch.Tensor], input_lists: List[List[torch.Tensor]],
                opts: Any = None) -> Any:
        """An alltoall in which only the root sends."""
        root = self._global(getattr(opts, "rootRank", 0), "scatter")
        return self._to_and_from_root("scatter", root, input_lists[0] if input_lists else [],
                                      outputs[0], gather=False)

    def _to_and_from_root(self, what: str, root: int, many: List[torch.Tensor],
                          one: torch.Tensor, gather: bool) -> Any:
        ranks = self._ranks or []
        n, r, me = len(ranks), ranks.index(root), _core.rank()
        _check_dtype(one, what)
        if me == root and (len(many) != n or any(t.numel() != one.numel() for t in many)):
            raise RuntimeError("unisum: %s wants %d tensors of %d elements each on the root"
                               % (what, n, one.numel()))
        w = _flat_wire(one)
        # counts[s * n + d]: what rank s sends to d (one's size, to or from the root).
        counts = [w.numel() if (d == r if gather else s == r) else 0
                  for s in range(n) for d in range(n)]
        if gather:
            send, recv = w, torch.empty(w.numel() * n if me == root else 0, dtype=w.dtype)
        else:
            send = (torch.cat([_flat_wire(t) for t in many]) if me == root
                    else torch.empty(0, dtype=w.dtype))
            recv = torch.empty(w.numel(), dtype=w.dtype)

        def build(started: List[int]) -> Built:
            started.append(self._gather("alltoall", send, recv, counts))
            if gather:
                post = _scatter_to(many, recv) if me == root else None
                return started, many, post
            return started, [one], lambda: _unwire(one, recv)
        return self._run(what, build)

    def barrier(self, opts: Any = None) -> Any:
        """A sum of one zero over the group."""
        self._resolve()
        token = torch.zeros(1, dtype=torch.int32)

        def build(started: List[int]) -> Built:
            self._reduce_into(token, hb.Sum, started, [])
            return started, [], None
        return self._run("barrier", build)

    def monitored_barrier(self, timeout: Optional[datetime.timedelta] = None,
                          wait_all_ranks: bool = False) -> None:
        """barrier(), waited for here for at most `timeout` (the group's by
        default).  (torch 1.13's dist.monitored_barrier takes gloo only;
        this is the group's method, for a caller that has the group.)"""
        del wait_all_ranks
        work = self.barrier()
        limit = timeout or self._timeout
        if isinstance(work, _work.UnisumWork):
            work.wait(limit)
        else:
            work.get_future().wait()

    def send(self, tensors: List[torch.Tensor], dst: int, tag: int = 0) -> Any:
        raise RuntimeError(_P2P % "send")

    def recv(self, tensors: List[torch.Tensor], src: int, tag: int = 0) -> Any:
        raise RuntimeError(_P2P % "recv")

    def recv_anysource(self, tensors: List[torch.Tensor], tag: int = 0) -> Any:
        raise RuntimeError(_P2P % "recv")


def _dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).replace("torch.", "")


def _flags_of(op: int, t: torch.Tensor, n: int) -> Tuple[int, float]:
    """The C flags and the scale of the result for Horovod's op `op` on
    `t` among `n` ranks (integers average as Horovod's do: a sum, scaled
    in float64 and truncated)."""
    if op == hb.Average and not t.dtype.is_floating_point:
        return 0, 1.0 / n
    return hb._reduce_flags(None, op), 1.0


def _all(posts: List[Callable[[], None]]) -> Optional[Callable[[], None]]:
    """One callable running every one of `posts`, or None for none."""
    if not posts:
        return None

    def run() -> None:
        for p in posts:
            p()
    return run


def _width(t: torch.Tensor) -> int:
    """Wire elements per element of `t` (a complex one is two reals)."""
    return 2 if t.is_complex() else 1


def _row(t: torch.Tensor) -> int:
    """Wire elements in one row (first-dimension index) of `t`."""
    n = 1
    for d in t.shape[1:]:
        n *= d
    return n * _width(t)


def _scatter_to(outs: List[torch.Tensor], recv: torch.Tensor) -> Callable[[], None]:
    """What copies consecutive pieces of wire buffer `recv` into `outs`."""
    def run() -> None:
        at = 0
        for o in outs:
            n = o.numel() * _width(o)
            _unwire(o, recv[at:at + n])
            at += n
    return run


_sets: dict = {}     # ranks -> the process set of every group of those ranks


def _process_set(ranks: List[int]) -> Any:
    """The process set of `ranks` (added once, shared by every group of
    the same ranks: a set is known by its ranks)."""
    key = tuple(ranks)
    ps = _sets.get(key)
    if ps is None or ps.process_set_id is None:
        ps = _sets[key] = hb.add_process_set(list(ranks))
    return ps
