"""Worker: misuse that Horovod and BytePS users make every day, which must
fail at once on every rank (never a wrong result, never a hang).

    misuse.py OUTDIR CASE...        the cases in turn (reinit last):

    disagree                        the ranks disagree on a broadcast's root,
                                    on average against sum, on a tensor's
                                    shape and dtype (unnamed push_pull), on a
                                    model's shapes (broadcast_parameters)
    sigint                          rank 1 blocked in a barrier, a push_pull
                                    and a broadcast gets SIGINT from rank 0
    reinit                          init(), shutdown(), init()
    skip_sync                       step() after synchronize(), with and without
                                    skip_synchronize()
    raise                           rank 1 raises ValueError while rank 0 waits

Writes OUTDIR/rank<r>.json with what happened, case by case.
"""

import os
import signal
import sys
import time
import traceback
import warnings

import torch

import common
import unisum
import unisum.torch as us
from unisum.torch import optimizer as uopt


def attempt(fn):
    """Runs fn(); what it raised, its message, its code, how long it took."""
    t0 = time.monotonic()
    try:
        fn()
        res = {"error": None}
    except unisum.UnisumError as e:
        res = {"error": "UnisumError", "message": str(e), "code": e.code}
    except Exception as e:  # the wrong kind of error: reported, the test fails on it
        res = {"error": type(e).__name__, "message": "".join(traceback.format_exception(e))}
    res["seconds"] = time.monotonic() - t0
    return res


def disagree(rank, result):
    """Every case raises on every rank; the tensors are left as they were."""
    # A broadcast whose ranks each call themselves the root.
    t = torch.full((3,), float(rank + 1))
    before = t.clone()
    result["root"] = attempt(lambda: us.broadcast_parameters({"w": t}, root_rank=rank))
    result["root"]["untouched"] = torch.equal(t, before)

    # Rank 0 averages, the others sum.
    t = torch.full((4,), float(rank + 1))
    before = t.clone()
    result["op"] = attempt(lambda: us.push_pull_(t, average=rank == 0, name="op"))
    result["op"]["untouched"] = torch.equal(t, before)

    # An unnamed push_pull whose shape differs by rank.
    t = torch.full((17 + rank,), float(rank + 1))
    before = t.clone()
    result["shape"] = attempt(lambda: us.push_pull_(t))
    result["shape"]["untouched"] = torch.equal(t, before)

    # ... whose dtype differs by rank.
    t = torch.ones(5, dtype=torch.float32 if rank == 0 else torch.float64)
    before = t.clone()
    result["dtype"] = attempt(lambda: us.push_pull_(t))
    result["dtype"]["untouched"] = torch.equal(t, before)

    # A model whose shapes differ by rank.
    torch.manual_seed(rank)
    model = torch.nn.Linear(4, 3 + rank)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    result["model"] = attempt(lambda: us.broadcast_parameters(model.state_dict(), root_rank=0))
    result["model"]["untouched"] = all(torch.equal(v, before[k])
                                       for k, v in model.state_dict().items())

    # The job goes on.
    healthy = us.push_pull(torch.full((5,), float(rank + 1)), average=False, name="healthy")
    result["healthy"] = healthy.tolist()


def sigint(rank, outdir, result):
    """Rank 1 blocks in a wait that rank 0 has not joined; rank 0 sends it
    SIGINT, waits for rank 1 to report the KeyboardInterrupt, then joins,
    and rank 1 finishes the same operation."""
    def mark(name, value=""):
        with open(os.path.join(outdir, name + ".tmp"), "w") as f:
            f.write(str(value))
        os.replace(os.path.join(outdir, name + ".tmp"), os.path.join(outdir, name))

    def wait_for(name, limit=30.0):
        path = os.path.join(outdir, name)
        end = time.monotonic() + limit
        while not os.path.exists(path):
            if time.monotonic() > end:
                raise RuntimeError("no %s after %g s" % (name, limit))
            time.sleep(0.01)
        with open(path) as f:
            return f.read()

    param = torch.zeros(8)
    waits = {
        "barrier": (us.barrier, us.barrier),
        "push_pull": None,
        "broadcast": (lambda: us.broadcast_parameters({"p": param}, root_rank=0),
                      lambda: us.broadcast_parameters({"p": param}, root_rank=0)),
    }
    for what in waits:
        if rank == 1:
            if what == "push_pull":
                h = us.push_pull_async(torch.ones(6), average=False, name="late")
                blocked, rest = (lambda: us.synchronize(h)), (lambda: us.synchronize(h))
            else:
                blocked, rest = waits[what]
            mark("ready." + what, os.getpid())
            try:
                blocked()
                result[what] = {"interrupted": False}
            except KeyboardInterrupt:
                result[what] = {"interrupted": True, "caught": time.monotonic()}
            mark("caught." + what)
            if what == "push_pull":
                result[what]["sum"] = rest().tolist()
            elif what == "barrier":
                rest()
            # An interrupted broadcast stays in flight and completes when
            # rank 0 joins; nothing to call again.
        elif rank == 0:
            pid = int(wait_for("ready." + what))
            time.sleep(0.5)  # rank 1 is blocked in the wait by now
            result[what] = {"sent": time.monotonic()}
            os.kill(pid, signal.SIGINT)
            wait_for("caught." + what)
            if what == "push_pull":
                result[what]["sum"] = us.push_pull(torch.ones(6), average=False,
                                                   name="late").tolist()
            elif what == "barrier":
                us.barrier()
            else:
                param.fill_(7.0)
                us.broadcast_parameters({"p": param}, root_rank=0)
        common.write_json(outdir, rank, result)
    us.barrier()
    # Rank 1's interrupted broadcast completes on its own: the barrier
    # does not wait for it (a fresh-clone make test read zeros here), so
    # it is given 5 s.
    end = time.monotonic() + 5.0
    while rank == 1 and param[0].item() != 7.0 and time.monotonic() < end:
        time.sleep(0.01)
    result["param"] = param.tolist()


def skip_sync(rank, result):
    """push_pulls of gradients per step: after synchronize(), step() warns
    and sums every gradient again; inside skip_synchronize() it does not."""
    calls = [0]
    real = uopt._start    # where every push_pull of the optimizer begins

    def counting(*args, **kw):
        calls[0] += 1
        return real(*args, **kw)
    uopt._start = counting
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = us.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                  named_parameters=model.named_parameters())
    x = torch.full((4, 3), float(rank + 1))
    for how in ("synchronize_then_step", "skip_synchronize", "plain_step"):
        opt.zero_grad()
        calls[0] = 0
        model(x).sum().backward()   # pushes each gradient as it appears
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if how == "synchronize_then_step":
                opt.synchronize()
                opt.step()
            elif how == "skip_synchronize":
                opt.synchronize()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                with opt.skip_synchronize():
                    opt.step()
            else:
                opt.step()
        result[how] = {"push_pulls": calls[0],
                       "warnings": [str(w.message) for w in caught]}
    uopt._start = real
    result["params"] = [p.tolist() for p in model.parameters()]


def main():
    outdir, cases = sys.argv[1], sys.argv[2:]
    torch.set_num_threads(1)
    us.init()
    rank = us.rank()
    result = {"rank": rank, "size": us.size()}
    for case in cases:
        if case == "disagree":
            disagree(rank, result)
        elif case == "sigint":
            sigint(rank, outdir, result)
        elif case == "reinit":
            us.shutdown()
            try:
                us.rank()
                raises = False
            except us.UnisumError:
                raises = True
            result["after_shutdown"] = {"initialized": us.is_initialized(), "rank_raises": raises}
            result["reinit"] = attempt(us.init)
            result["after_reinit"] = {
                "initialized": us.is_initialized(), "rank": us.rank(), "size": us.size(),
                "sum": us.push_pull(torch.full((4,), 1.0 + rank), average=False,
                                    name="after.reinit").tolist()}
            common.write_json(outdir, rank, result)
            return
        elif case == "skip_sync":
            skip_sync(rank, result)
        elif case == "raise":
            us.barrier()
            if rank == 1:
                raise ValueError("rank 1 fails on purpose")
            us.barrier()  # rank 0 waits here until the launcher stops the job
        else:
            raise SystemExit("unknown case " + case)
        common.write_json(outdir, rank, result)
    us.barrier()
    us.shutdown()


if __name__ == "__main__":
    main()
