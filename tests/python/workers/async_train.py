"""Worker: DistributedOptimizer(sync="async"), every value checked exactly.

    async_train.py

Rank r's model starts at r + 1 everywhere; the optimizer's construction
makes every rank's rank 0's (1.0).  Then each rank takes STEPS steps of SGD
(lr 1) on its own loss sum(w * (r + 1)), whose gradient is r + 1: each
step sends the delta -(r + 1) to the servers, which add it at once, no
rank waiting for another.  Every value a rank loads is whole (its elements
agree), and once all are done the servers hold 1 - STEPS * n(n+1)/2
exactly.  Prints "rank R: async ok".
"""

import torch

import unisum.torch as hvd

STEPS = 25


def main():
    torch.set_num_threads(1)
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    model = torch.nn.Linear(64, 3, bias=False)
    with torch.no_grad():
        model.weight.fill_(float(r + 1))
    for bad in ("ssp:x", "lockstep"):
        try:
            hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0), sync=bad)
        except ValueError as e:
            assert "sync" in str(e), e
        else:
            raise AssertionError("sync=%r was taken" % bad)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0),
                                   named_parameters=model.named_parameters(), sync="async")
    assert torch.equal(model.weight, torch.ones(3, 64)), model.weight
    hvd.barrier()       # nobody steps before every rank has its first value
    for s in range(STEPS):
        opt.zero_grad()
        loss = (model.weight * float(r + 1)).sum()
        loss.backward()
        opt.step()
        w = model.weight.detach()
        assert torch.equal(w, torch.full_like(w, float(w[0, 0]))), (s, w)
        assert float(w[0, 0]) <= 1.0 - (r + 1) * (s + 1) + 1e-9, (s, float(w[0, 0]))
    hvd.barrier()       # every delta is in
    opt.zero_grad(set_to_none=True)
    opt.step()          # no gradient: a delta of zero, and the servers' value back
    want = 1.0 - STEPS * n * (n + 1) / 2
    assert torch.equal(model.weight.detach(), torch.full((3, 64), want)), \
        (float(model.weight[0, 0]), want)
    print("rank %d: async ok" % r, flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
