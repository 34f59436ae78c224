"""Small all_reduces from torch.distributed's Python on kept names, checked
in the same round (private; ProcessGroupUnisum.allreduce).

A call from Python is named by its order and declared for the call, so
that ranks that disagree fail at the declaration; for a few bytes that
declaration costs more than the sum (bench/README.md).  A tensor of at
most SMALL elements (SUM, AVG, MIN or MAX) instead travels in one of two
kept buffers per family (float64 for the floating dtypes and the integers
up to int32; int64 for int64), named by the family and the call's order
among the family's calls modulo two, with the call's fingerprint beside
its elements: two hashes of its dtype, element count and op, each with its
square for SUM and AVG (sum(f)^2 == n sum(f^2) only when every rank's f is
the same), or with its negation for MIN and MAX (max(f) == -max(-f) only
then).  The buffer's size is the same for every such call, so ranks that
disagree still complete the round, find the fingerprints apart, and each
raises; nothing is left in flight.  Sums run in float64, each rounded once
to the tensor's dtype (two ranks: what gloo gives; more: within an ulp).
"""

from __future__ import annotations

import zlib
from typing import Callable, Dict, List, Tuple

import torch

from unisum import _capi
from unisum._horovod import basics as hb

SMALL = 64          # elements at most
_EXTRA = 4          # the fingerprint: f1, g(f1), f2, g(f2)
_FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32,
           torch.int16, torch.int8, torch.uint8, torch.bool)


def eligible(t: torch.Tensor, op: int) -> bool:
    return (t.numel() <= SMALL and op in (hb.Sum, hb.Average, hb.Min, hb.Max) and
            (t.dtype in _FLOATS or t.dtype == torch.int64) and not t.is_cuda)


def family(t: torch.Tensor) -> str:
    return "i64" if t.dtype == torch.int64 else "f64"


def _hashes(t: torch.Tensor, op: int) -> List[int]:
    key = ("%s[%d].%d" % (t.dtype, t.numel(), op)).encode()
    return [zlib.crc32(key) % 4093 + 1, zlib.crc32(key[::-1]) % 4091 + 1]


_templates: Dict[Tuple[torch.dtype, int, int], torch.Tensor] = {}


def buffer(t: torch.Tensor, op: int) -> torch.Tensor:
    """The buffer to reduce for `t`: its elements, zeros, the fingerprint
    (a template per dtype, size and op, copied)."""
    key = (t.dtype, t.numel(), op)
    template = _templates.get(key)
    if template is None:
        wire = torch.int64 if family(t) == "i64" else torch.float64
        fp = []
        for f in _hashes(t, op):
            fp += [f, f * f if op in (hb.Sum, hb.Average) else -f]
        template = torch.zeros(SMALL + _EXTRA, dtype=wire)
        template[SMALL:] = torch.tensor(fp, dtype=wire)
        _templates[key] = template
    buf = template.clone()
    buf[:t.numel()].copy_(t.detach().reshape(-1))
    return buf


def flags(op: int) -> int:
    return {hb.Sum: 0, hb.Average: 0, hb.Min: _capi.MIN, hb.Max: _capi.MAX}[op]


def finish(t: torch.Tensor, op: int, buf: torch.Tensor, n: int,
           what: str) -> Callable[[], None]:
    """What checks the fingerprints once the buffer is reduced among `n`
    ranks, then writes the result into `t` (RuntimeError when the ranks
    disagree)."""
    def run() -> None:
        fp = [int(v) for v in buf[SMALL:].tolist()]
        same = all(a * a == n * b if op in (hb.Sum, hb.Average) else a == -b
                   for a, b in zip(fp[0::2], fp[1::2]))
        if not same:
            raise RuntimeError(
                "unisum: %s: the ranks disagree on this call: this rank's is %s[%d] with %s, "
                "another rank's differs (its dtype, element count or op).  Every rank must "
                "make the same calls, with the same shapes and ops, in the same order"
                % (what, str(t.dtype).replace("torch.", ""), t.numel(),
                   hb._OP_NAMES.get(op, op)))
        data = buf[:t.numel()]
        if op == hb.Average:
            data = data.to(torch.float64) / n
        t.copy_(data.to(t.dtype).view(t.shape))
    return run
