"""Worker: DistributedOptimizer(sync="dssync:2") with
UNISUM_DSSYNC_GLOBAL_EVERY=3, every value checked exactly.

    dssync_train.py

Rank r's parameters start at r + 1 and the optimizer changes nothing
(lr 0), so each step only averages: within a group of 2 that changes
every step, and every third step over all workers.  Averaging within the
groups of a partition keeps the workers' total, so a global step gives
every rank the mean of the start, (n + 1) / 2, exactly; between them each
value stays within the start's range.  global_average() at the end does
the same.  Prints "rank R: dssync ok <the final weight, as hex>".
"""

import torch

import unisum.torch as hvd

STEPS = 7


def main():
    torch.set_num_threads(1)
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    model = torch.nn.Linear(8, 2, bias=False)
    with torch.no_grad():
        model.weight.fill_(float(r + 1))
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.0),
                                   named_parameters=model.named_parameters(), sync="dssync:2")
    mean = (n + 1) / 2
    values = set()
    for s in range(STEPS):
        opt.zero_grad()
        model.weight.sum().backward()
        opt.step()
        w = model.weight.detach()
        v = float(w[0, 0])
        assert torch.equal(w, torch.full_like(w, v)), (s, w)
        assert 1.0 <= v <= float(n), (s, v)
        if (s + 1) % 3 == 0:
            assert v == mean, ("a global step", s, v, mean)
        values.add(v)
    opt.global_average()
    w = model.weight.detach()
    assert torch.equal(w, torch.full_like(w, mean)), w
    print("rank %d: dssync ok %s" % (r, w.numpy().tobytes().hex()), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
