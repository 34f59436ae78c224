"""Worker: DistributedOptimizer(sync="ssp:1"), a slow rank holding the
others back after exactly one step, every value checked exactly.

    ssp_train.py          as below
    ssp_train.py leaves   the last rank makes one step and shuts down:
                          the others, held back for its next step, fail
                          naming it (a server fails the job once it sees
                          the rank has left, and its last push is summed);
                          prints "rank R: ssp leaves ok"

As async_train.py, with staleness 1: after the construction (rank 0's
values everywhere) and a barrier, rank 2 sleeps SLEEP seconds before its
first step.  Ranks 0 and 1 finish their first step at once (nobody is more
than one step behind), and their second only once rank 2 has pushed its
first: a step returns when every rank has pushed at least t - 1 deltas.
At the end the servers hold 1 - STEPS * n(n+1)/2 exactly.  Prints "rank R:
ssp ok".
"""

import os
import sys
import time

import torch

import unisum.torch as hvd

STEPS = 4
SLEEP = 2.0


def setup():
    torch.set_num_threads(1)
    hvd.init()
    r = hvd.rank()
    model = torch.nn.Linear(16, 2, bias=False)
    with torch.no_grad():
        model.weight.fill_(float(r + 1))
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0),
                                   named_parameters=model.named_parameters(), sync="ssp:1")
    assert torch.equal(model.weight, torch.ones(2, 16)), model.weight
    hvd.barrier()
    return model, opt


def step(model, opt):
    opt.zero_grad()
    (model.weight * float(hvd.rank() + 1)).sum().backward()
    opt.step()


def leaves():
    model, opt = setup()
    r, n = hvd.rank(), hvd.size()
    if r == n - 1:
        step(model, opt)
        hvd.shutdown()
        print("rank %d: ssp leaves ok" % r, flush=True)
        return
    t0 = time.monotonic()
    try:
        for _ in range(STEPS):
            step(model, opt)
    except Exception as e:  # noqa: B902 (any error, as long as it names the rank)
        took = time.monotonic() - t0
        assert "worker %d" % (n - 1) in str(e), e
        assert took < 30, took
        print("rank %d: ssp leaves ok (%.1f s)" % (r, took), flush=True)
        os._exit(0)
    raise AssertionError("%d steps ran although worker %d left after one" % (STEPS, n - 1))


def main():
    model, opt = setup()
    r, n = hvd.rank(), hvd.size()
    t0 = time.monotonic()
    if r == n - 1:
        time.sleep(SLEEP)
    done = []
    for s in range(STEPS):
        step(model, opt)
        done.append(time.monotonic() - t0)
    if r != n - 1:
        assert done[0] < SLEEP * 0.75, ("the first step waited for the slow rank", done)
        assert done[1] >= SLEEP * 0.9, ("the second step did not wait for the slow rank", done)
    hvd.barrier()
    opt.zero_grad(set_to_none=True)
    opt.step()
    want = 1.0 - STEPS * n * (n + 1) / 2
    assert torch.equal(model.weight.detach(), torch.full((2, 16), want)), \
        (float(model.weight[0, 0]), want)
    print("rank %d: ssp ok" % r, flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    leaves() if sys.argv[1:] == ["leaves"] else main()
