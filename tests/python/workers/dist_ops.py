"""Worker: torch.distributed's calls over the backend "unisum" (issue 51).

    dist_ops.py OUTDIR MODE

ops       every supported call, with async_op True and False, in the
          default group and in a new_group of ranks 0 and 1; each checked
          here against what gloo would give; writes the names of the checks
          that passed.
refused   what unisum refuses raises RuntimeError naming it, at once, and
          the group goes on: send, recv, isend, ReduceOp.BAND, a complex
          MAX.
ddp       the same model trained 20 steps by DDP over "unisum" and by DDP
          over a gloo group of the same ranks, with the same data: the
          largest relative difference of any parameter after each step, for
          float data and for integer-valued data (whose sums are exact);
          then no_sync() accumulation, find_unused_parameters and
          static_graph, each against gloo.
mismatch  ranks pass different shapes to one all_reduce, small (3 and 4
          elements) then large (1000 and 1001): each raises RuntimeError
          naming its shape; then different ops (SUM and MAX, small and
          large) and different roots of a broadcast; then the group goes
          on.
timeout   the group's timeout is 2 s; rank 0 waits for an all_reduce rank 1
          joins 4 s later: wait() raises after 2 s, naming the timeout; the
          operation completes in the background once rank 1 joins.
ddp_timeout  the group's timeout is 2 s; rank 1 starts its DDP backward 5 s
          after rank 0, whose backward (DDP's C++ waits) raises the timeout.
ddp_dies  rank 1 exits before its DDP backward; the survivors' backward
          (DDP's C++ waits) raises, naming it.
dies      rank 1 exits while the others wait in an all_reduce, which raises
          RuntimeError naming the lost rank; writes how long it took.
sigint    rank 0 waits for an all_reduce that rank 1 joins 3 s later; rank
          1 sends rank 0 SIGINT after 1 s: KeyboardInterrupt in wait();
          then the operation completes with the right sum.

With DIST_OPS_INIT (and DIST_OPS_RANK, DIST_OPS_SIZE) in the environment,
init_process_group gets that init_method, rank and world size; otherwise
torchrun's variables (which unisum launch exports).  Writes
OUTDIR/rank<R>.json.
"""

import datetime
import os
import sys
import time

import torch
import torch.distributed as dist

import common
import unisum.torch.distributed as _backend

assert _backend.BACKEND == "unisum"   # importing registered it

torch.set_num_threads(1)
OUT, MODE = sys.argv[1], sys.argv[2]
TIMEOUT = datetime.timedelta(seconds=2 if MODE in ("timeout", "ddp_timeout") else 60)
if os.environ.get("DIST_OPS_INIT"):
    # An explicit init_method, rank and world size (no torchrun variables).
    dist.init_process_group("unisum", init_method=os.environ["DIST_OPS_INIT"],
                            rank=int(os.environ["DIST_OPS_RANK"]),
                            world_size=int(os.environ["DIST_OPS_SIZE"]), timeout=TIMEOUT)
else:
    dist.init_process_group("unisum", timeout=TIMEOUT)
R, N = dist.get_rank(), dist.get_world_size()
passed = []


def check(name, got, want):
    if isinstance(got, torch.Tensor):
        ok = got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want)
    else:
        ok = got == want
    assert ok, "%s: got %s, want %s" % (name, got, want)
    passed.append(name)


def reduce_ops(group, ranks):
    """SUM, AVG, MIN, MAX, PRODUCT on every dtype family, sync and async."""
    me = ranks.index(R)
    vals = [float(r + 1) for r in range(len(ranks))]
    prod = 1.0
    for v in vals:
        prod *= v
    for op, want, name in ((dist.ReduceOp.SUM, sum(vals), "sum"),
                           (dist.ReduceOp.AVG, sum(vals) / len(vals), "avg"),
                           (dist.ReduceOp.MIN, min(vals), "min"),
                           (dist.ReduceOp.MAX, max(vals), "max"),
                           (dist.ReduceOp.PRODUCT, prod, "product")):
        for dtype in (torch.float32, torch.float64, torch.int64, torch.int8):
            if op == dist.ReduceOp.AVG and not dtype.is_floating_point:
                continue
            t = torch.full((5,), vals[me], dtype=dtype)
            work = dist.all_reduce(t, op=op, group=group, async_op=dtype == torch.float64)
            if work is not None:
                work.wait()
                assert work.is_completed() and work.is_success()
            check("all_reduce %s %s" % (name, dtype), t, torch.full((5,), want, dtype=dtype))
    # Over 64 elements: declared for the call (the small ones travel on
    # kept names with a fingerprint: unisum.torch.distributed._small).
    t = torch.full((1000,), vals[me])
    dist.all_reduce(t, group=group)
    check("all_reduce large", t, torch.full((1000,), sum(vals)))
    c = torch.full((3,), complex(me, 1))
    dist.all_reduce(c, group=group)
    check("all_reduce complex", c, torch.full((3,), complex(sum(range(len(ranks))), len(ranks))))
    ts = [torch.ones(2), torch.full((3,), 2.0)]
    dist.all_reduce_coalesced(ts, group=group)
    check("all_reduce_coalesced", torch.cat(ts), torch.cat([torch.full((2,), float(len(ranks))),
                                                            torch.full((3,), 2.0 * len(ranks))]))
    fut = dist.all_reduce(torch.ones(2), group=group, async_op=True).get_future()
    check("get_future().then", fut.then(lambda f: f.value()[0] * 10).wait(),
          torch.full((2,), 10.0 * len(ranks)))


def gathers(group, ranks):
    n, me = len(ranks), ranks.index(R)
    t = torch.arange(4.0) + 10 * me
    root = ranks[n - 1]
    dist.broadcast(t, src=root, group=group)
    check("broadcast", t, torch.arange(4.0) + 10 * (n - 1))
    b = torch.full((2,), me % 2 == 0)
    dist.broadcast(b, src=ranks[0], group=group)
    check("broadcast bool", b, torch.full((2,), True))
    outs = [torch.empty(2, 3, dtype=torch.int16) for _ in range(n)]
    dist.all_gather(outs, torch.full((2, 3), me, dtype=torch.int16), group=group)
    check("all_gather", torch.stack(outs),
          torch.stack([torch.full((2, 3), i, dtype=torch.int16) for i in range(n)]))
    out = torch.empty(n * 3)
    w = dist.all_gather_into_tensor(out, torch.full((3,), float(me)), group=group, async_op=True)
    w.wait()
    check("all_gather_into_tensor", out, torch.arange(n).repeat_interleave(3).float())
    o = torch.empty(2)
    dist.reduce_scatter(o, [torch.full((2,), float(i + me)) for i in range(n)], group=group)
    check("reduce_scatter", o, torch.full((2,), float(sum(me2 + me for me2 in range(n)))))
    o = torch.empty(2, dtype=torch.int64)
    dist.reduce_scatter_tensor(o, torch.arange(2 * n) * (me + 1), group=group)
    want = torch.arange(2 * me, 2 * me + 2) * sum(range(1, n + 1))
    check("reduce_scatter_tensor", o, want)
    o = torch.empty(2)
    dist.reduce_scatter(o, [torch.full((2,), float(i * 10 + me)) for i in range(n)],
                        op=dist.ReduceOp.MAX, group=group)
    check("reduce_scatter max", o, torch.full((2,), float(me * 10 + n - 1)))


def alltoalls(group, ranks):
    n, me = len(ranks), ranks.index(R)
    # Uneven: rank s sends d + 1 rows to rank d.
    x = torch.cat([torch.full((d + 1, 2), float(10 * me + d)) for d in range(n)])
    y = torch.empty((me + 1) * n, 2)
    dist.all_to_all_single(y, x, [me + 1] * n, [d + 1 for d in range(n)], group=group)
    check("all_to_all_single uneven", y,
          torch.cat([torch.full((me + 1, 2), float(10 * s + me)) for s in range(n)]))
    x = torch.arange(2 * n, dtype=torch.int32) + 100 * me
    y = torch.empty(2 * n, dtype=torch.int32)
    dist.all_to_all_single(y, x, group=group)
    check("all_to_all_single even", y, torch.cat([torch.arange(2 * me, 2 * me + 2,
                                                               dtype=torch.int32) + 100 * s
                                                  for s in range(n)]))
    ins = [torch.full((d + 1,), float(me)) for d in range(n)]
    outs = [torch.empty(me + 1) for _ in range(n)]
    dist.all_to_all(outs, ins, group=group)
    check("all_to_all", torch.cat(outs), torch.cat([torch.full((me + 1,), float(s))
                                                    for s in range(n)]))
    t = torch.full((3,), float(me + 1))
    dist.reduce(t, dst=ranks[0], group=group)
    if me == 0:
        check("reduce", t, torch.full((3,), float(sum(range(1, n + 1)))))
    g = [torch.empty(2) for _ in range(n)] if me == 0 else None
    dist.gather(torch.full((2,), float(me)), g, dst=ranks[0], group=group)
    if me == 0:
        check("gather", torch.stack(g), torch.arange(n).float().repeat_interleave(2).view(n, 2))
    s = torch.empty(2)
    src = ranks[n - 1]
    dist.scatter(s, [torch.full((2,), float(i)) for i in range(n)] if R == src else None,
                 src=src, group=group)
    check("scatter", s, torch.full((2,), float(me)))
    dist.barrier(group=group)
    passed.append("barrier")


def run_ops():
    everyone = list(range(N))
    for fn in (reduce_ops, gathers, alltoalls):
        fn(None, everyone)
    sub = dist.new_group([0, 1])
    if R in (0, 1):
        for fn in (reduce_ops, gathers, alltoalls):
            before = len(passed)
            fn(sub, [0, 1])
            passed[before:] = ["group " + p for p in passed[before:]]
    dist.barrier()
    return {"passed": passed}


def refusal(call):
    t0 = time.monotonic()
    try:
        call()
    except RuntimeError as e:
        return {"message": str(e), "seconds": time.monotonic() - t0}
    return {"message": None}


def run_refused():
    res = {
        "send": refusal(lambda: dist.send(torch.ones(1), dst=(R + 1) % N)),
        "recv": refusal(lambda: dist.recv(torch.ones(1), src=(R + 1) % N)),
        "isend": refusal(lambda: dist.isend(torch.ones(1), dst=(R + 1) % N)),
        "band": refusal(lambda: dist.all_reduce(torch.ones(1, dtype=torch.int32),
                                                op=dist.ReduceOp.BAND)),
        "complex_max": refusal(lambda: dist.all_reduce(torch.ones(1, dtype=torch.complex64),
                                                       op=dist.ReduceOp.MAX)),
    }
    t = torch.ones(3)
    dist.all_reduce(t)
    res["after"] = t.tolist()
    return res


def main():
    runs = {"ops": run_ops, "refused": run_refused}
    if MODE in runs:
        res = runs[MODE]()
    else:
        import dist_cases
        res = dist_cases.run(MODE, R, N, OUT, TIMEOUT)
    res["rank"] = R
    common.write_json(OUT, R, res)
    dist.destroy_process_group()


main()
