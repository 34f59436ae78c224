"""dist_ops.py's modes beyond the calls themselves: DDP against gloo, and
the failures (see dist_ops.py's docstring)."""

import copy
import os
import signal
import time

import torch
import torch.distributed as dist
import torch.nn as nn

from unisum.torch import ddp_hooks

STEPS = 20


class Net(nn.Module):
    """Two layers, and with `unused` a third that forward() never uses (for
    find_unused_parameters)."""

    def __init__(self, unused=False):
        super().__init__()
        torch.manual_seed(7)
        self.a = nn.Linear(6, 5)
        self.b = nn.Linear(5, 3)
        if unused:
            self.unused = nn.Linear(5, 3)

    def forward(self, x):
        return self.b(torch.tanh(self.a(x)))


def batch(step, rank, integer):
    g = torch.Generator().manual_seed(1000 * step + rank)
    if integer:
        return torch.randint(-3, 4, (4, 6), generator=g).float()
    return torch.randn(4, 6, generator=g)


def _rel(a, b):
    return max(((p - q).abs().max() / q.abs().max().clamp(min=1e-30)).item()
                for p, q in zip(a.parameters(), b.parameters()))


def _pair(rank, gloo, integer, unused=False, hook=None, **kw):
    """Net under DDP over "unisum" and over gloo, trained alike; the
    largest relative difference after each step."""
    # Integer data and weights in float64, one linear layer, the sum of its
    # outputs as the loss and a step of 1: every gradient is an integer
    # (the data's sum) and every weight stays one, so every sum is exact,
    # in any order.
    nets = [Net(unused) for _ in range(2)]
    if integer:
        torch.manual_seed(7)
        first = nn.Linear(6, 3).double()
        with torch.no_grad():
            for p in first.parameters():
                p.copy_(torch.round(p * 4))
        nets = [first, copy.deepcopy(first)]
    if hook is None:
        ours = nn.parallel.DistributedDataParallel(nets[0], **kw)
    else:
        # The group stays gloo; the hook sums through unisum.
        ours = nn.parallel.DistributedDataParallel(nets[0], process_group=gloo, **kw)
        ours.register_comm_hook(hook, ddp_hooks.push_pull_hook)
    theirs = nn.parallel.DistributedDataParallel(nets[1], process_group=gloo, **kw)
    opts = [torch.optim.SGD(m.parameters(), lr=1.0 if integer else 0.1) for m in
            (ours, theirs)]
    diffs = []
    for step in range(STEPS):
        for m, opt in zip((ours, theirs), opts):
            opt.zero_grad()
            # DDP divides each gradient by the world size before summing:
            # a loss times it leaves integers to sum.
            if integer:
                (m(batch(step, rank, True).double()).sum() * dist.get_world_size()).backward()
            else:
                m(batch(step, rank, False)).square().mean().backward()
            opt.step()
        diffs.append(_rel(ours.module, theirs.module))
    return diffs, [p.detach().view(-1)[0].item() for p in ours.parameters()]


def _no_sync(rank, gloo):
    """Two micro-batches under no_sync(), then one synchronized, against the
    same on gloo; and against the sum of the three in one pass."""
    ours = nn.parallel.DistributedDataParallel(Net())
    theirs = nn.parallel.DistributedDataParallel(Net(), process_group=gloo)
    for m in (ours, theirs):
        with m.no_sync():
            for k in range(2):
                m(batch(50 + k, rank, False)).sum().backward()
        m(batch(52, rank, False)).sum().backward()
    return max((p.grad - q.grad).abs().max().item()
               for p, q in zip(ours.parameters(), theirs.parameters()))


def _compressed(rank, gloo, state):
    """DDP over gloo with a compressing hook, 20 steps of _pair's float
    training: the loss at the first and last step, and the first weights
    (every rank's the same).  (The test runs with
    UNISUM_MIN_COMPRESS_BYTES=0: these buckets are small.)"""
    m = nn.parallel.DistributedDataParallel(Net(), process_group=gloo)
    m.register_comm_hook(state, ddp_hooks.push_pull_hook)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    losses = []
    for step in range(STEPS):
        opt.zero_grad()
        loss = m(batch(step, rank, False)).square().mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return {"losses": [losses[0], losses[-1]],
            "first": [p.detach().view(-1)[0].item() for p in m.parameters()]}


def _byteps_ddp(rank, gloo):
    """BytePS's DDP: two micro-batches under no_sync() and a third, then a
    step, against one backward of the three together and a step; and that
    against DDP over gloo.  The largest differences of the parameters."""
    from unisum.torch.parallel import DistributedDataParallel as BytePSDDP
    xs = [batch(60 + k, rank, False) for k in range(3)]
    acc = BytePSDDP(Net())
    with acc.no_sync():
        for x in xs[:2]:
            acc(x).sum().backward()
    acc(xs[2]).sum().backward()
    one = BytePSDDP(Net())
    one(torch.cat(xs)).sum().backward()
    ref = nn.parallel.DistributedDataParallel(Net(), process_group=gloo)
    ref(torch.cat(xs)).sum().backward()
    for m in (acc, one, ref):
        torch.optim.SGD(m.parameters(), lr=0.1).step()
    return {"no_sync": _rel(acc.module, one.module), "gloo": _rel(one.module, ref.module)}


def run_ddp(rank, size):
    gloo = dist.new_group(list(range(size)), backend="gloo")
    res = {}
    res["float"], res["first"] = _pair(rank, gloo, False)
    res["integer"], _ = _pair(rank, gloo, True)
    res["unused"], _ = _pair(rank, gloo, False, True, find_unused_parameters=True)
    res["static"], _ = _pair(rank, gloo, False, static_graph=True)
    res["no_sync"] = _no_sync(rank, gloo)
    res["hook"], _ = _pair(rank, gloo, False, hook=ddp_hooks.State(prefix="plain"))
    res["hook_integer"], _ = _pair(rank, gloo, True, hook=ddp_hooks.State(prefix="int"))
    for name, state in (("fp16", ddp_hooks.fp16_state("fp16")),
                        ("onebit", ddp_hooks.onebit_state(prefix="onebit")),
                        ("topk", ddp_hooks.topk_state(0.25, prefix="topk"))):
        res[name] = _compressed(rank, gloo, state)
    res["byteps"] = _byteps_ddp(rank, gloo)
    return res


def _mismatched(numel):
    t0 = time.monotonic()
    try:
        dist.all_reduce(torch.ones(numel))
        return {"message": None}
    except RuntimeError as e:
        return {"message": str(e), "seconds": time.monotonic() - t0}


def _refused(call):
    t0 = time.monotonic()
    try:
        call()
        return {"message": None}
    except RuntimeError as e:
        return {"message": str(e), "seconds": time.monotonic() - t0}


def run_mismatch(rank):
    res = {"small": _mismatched(3 + rank), "large": _mismatched(1000 + rank)}
    ops = (dist.ReduceOp.SUM, dist.ReduceOp.MAX)
    res["op_small"] = _refused(lambda: dist.all_reduce(torch.ones(4), op=ops[rank % 2]))
    res["op_large"] = _refused(lambda: dist.all_reduce(torch.ones(1000), op=ops[rank % 2]))
    res["root"] = _refused(lambda: dist.broadcast(torch.ones(5), src=rank % 2))
    for numel in (2, 3, 4, 5):      # every kept small name again: none is left broken
        t = torch.ones(numel)
        dist.all_reduce(t)
        assert t.tolist() == [2.0] * numel, t
    t = torch.ones(2)
    dist.all_reduce(t)
    res["after"] = t.tolist()
    return res


def run_timeout(rank, timeout):
    res = {}
    if rank == 0:
        t = torch.ones(2)
        work = dist.all_reduce(t, async_op=True)
        t0 = time.monotonic()
        try:
            work.wait()
            res["message"] = None
        except RuntimeError as e:
            res["message"] = str(e)
        res["seconds"] = time.monotonic() - t0
        work.get_future().wait()        # completes once rank 1 joins
        res["sum"] = t.tolist()
    else:
        time.sleep(2 * timeout.total_seconds())
        t = torch.ones(2)
        dist.all_reduce(t)
        res["sum"] = t.tolist()
    return res


def run_ddp_timeout(rank):
    """The group's timeout (2 s) reaches DDP's waits, which are C++'s:
    rank 1 starts its backward 5 s after rank 0, whose backward raises."""
    m = nn.parallel.DistributedDataParallel(Net())
    x = batch(0, rank, False)
    res = {}
    if rank == 1:
        time.sleep(5)
    t0 = time.monotonic()
    try:
        m(x).sum().backward()
        res["message"] = None
    except RuntimeError as e:
        res["message"] = str(e)
    res["seconds"] = time.monotonic() - t0
    if rank == 0:
        time.sleep(4)   # rank 1's backward (which completes rank 0's buckets) ends first
    dist.barrier()
    return res


def run_ddp_dies(rank):
    """Rank 1 exits before its backward: every survivor's backward (DDP's
    C++ waits) raises, naming it."""
    m = nn.parallel.DistributedDataParallel(Net())
    x = batch(0, rank, False)
    dist.barrier()
    if rank == 1:
        time.sleep(0.5)
        os._exit(0)
    t0 = time.monotonic()
    try:
        m(x).sum().backward()
        return {"message": None}
    except RuntimeError as e:
        return {"message": str(e), "seconds": time.monotonic() - t0}


def run_dies(rank):
    dist.barrier()
    if rank == 1:
        time.sleep(0.5)     # rank 0 is in its all_reduce by now
        os._exit(0)
    t0 = time.monotonic()
    try:
        dist.all_reduce(torch.ones(1 << 20))
        return {"message": None}
    except RuntimeError as e:
        return {"message": str(e), "seconds": time.monotonic() - t0}


def run_sigint(rank, out):
    res = {}
    if rank == 0:
        with open(os.path.join(out, "pid0"), "w") as f:
            f.write(str(os.getpid()))
        dist.barrier()
        t = torch.ones(3)
        work = dist.all_reduce(t, async_op=True)
        try:
            work.wait()
            res["interrupted"] = False
        except KeyboardInterrupt:
            res["interrupted"] = True
            res["caught"] = time.time()
        work.wait()
        res["sum"] = t.tolist()
    else:
        dist.barrier()
        time.sleep(1)
        with open(os.path.join(out, "pid0")) as f:
            pid = int(f.read())
        res["sent"] = time.time()
        os.kill(pid, signal.SIGINT)
        time.sleep(2)
        t = torch.ones(3)
        dist.all_reduce(t)
        res["sum"] = t.tolist()
    return res


def run(mode, rank, size, out, timeout):
    if mode == "ddp":
        return run_ddp(rank, size)
    if mode == "mismatch":
        return run_mismatch(rank)
    if mode == "timeout":
        return run_timeout(rank, timeout)
    if mode == "dies":
        return run_dies(rank)
    if mode == "ddp_timeout":
        return run_ddp_timeout(rank)
    if mode == "ddp_dies":
        return run_ddp_dies(rank)
    if mode == "sigint":
        return run_sigint(rank, out)
    raise SystemExit("dist_ops.py: unknown mode %r" % mode)
