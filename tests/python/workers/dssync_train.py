"""Worker: DistributedOptimizer(sync="dssync:2") with
UNISUM_DSSYNC_GLOBAL_EVERY=3, every value checked exactly.

    dssync_train.py [exit]

Rank r's parameters start at r + 1, and every gradient is 1 (the loss is
the weights' sum) at lr 1, so each step subtracts 1 and averages: within a
group of 2 that changes every step, and every third step over all
workers.  Averaging within the groups of a partition keeps the workers'
total, so the average B_s of step s is the mean of the start, (n + 1) /
2, less s + 1 on a global step, and otherwise within the start's range
less s + 1.

UNISUM_DSSYNC_OVERLAP=0: step s ends holding B_s.  Overlapped (the
default): step s loads B_{s-1} (the start for s = 0), subtracts 1 and
leaves B_s in flight; so step 0 ends holding r, nothing averaged yet, and
the step after a global one holds the mean less s + 1.  synchronize()
then loads the average in flight; a step after it and a write of the
start values by the script, then global_average(), gives every rank the
mean of the start: the average of that step, still in flight, must not
land on the written values.  Prints
"rank R: dssync ok <the final weight, as hex>".

With "exit" the script drops the optimizer and ends after its steps
without global_average() or shutdown(): the average still in flight must
keep its buffers, end, and the job leave normally.
"""

import gc
import os
import sys
import weakref

import torch

import unisum.torch as hvd

STEPS = 7


def main():
    torch.set_num_threads(1)
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    overlap = os.environ.get("UNISUM_DSSYNC_OVERLAP", "1") != "0"
    model = torch.nn.Linear(8, 2, bias=False)
    with torch.no_grad():
        model.weight.fill_(float(r + 1))
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0),
                                   named_parameters=model.named_parameters(), sync="dssync:2")
    mean = (n + 1) / 2
    for s in range(STEPS):
        opt.zero_grad()
        model.weight.sum().backward()
        opt.step()
        w = model.weight.detach()
        v = float(w[0, 0])
        assert torch.equal(w, torch.full_like(w, v)), (s, w)
        assert 1.0 - (s + 1) <= v <= float(n) - (s + 1), (s, v)
        if overlap and s == 0:
            assert v == float(r), ("the first step's own update, nothing averaged", v)
        if (s + 1 - overlap) % 3 == 0 and s >= overlap:
            assert v == mean - (s + 1), ("a global step", s, v, mean)
    if sys.argv[1:] == ["exit"]:
        # The script drops the optimizer; its average in flight still
        # writes into the optimizer's buffers, so they must stay alive.
        held = weakref.ref(opt)
        del opt
        gc.collect()
        assert held() is not None or not overlap, "an optimizer freed with its average in flight"
        print("rank %d: dssync exits" % r, flush=True)
        return
    # synchronize() loads the average in flight: step 5 was global, so
    # step 6's group average is every rank's mean less STEPS.
    opt.synchronize()
    w = model.weight.detach()
    assert torch.equal(w, torch.full_like(w, mean - STEPS)), ("synchronize", w)
    # One more step, then the script writes the parameters (as
    # load_state_dict would): the average still in flight must not land
    # on top of them, so the global average is of what was written.
    opt.zero_grad()
    model.weight.sum().backward()
    opt.step()
    with torch.no_grad():
        model.weight.fill_(float(r + 1))
    opt.global_average()
    w = model.weight.detach()
    assert torch.equal(w, torch.full_like(w, mean)), ("written values averaged", w)
    print("rank %d: dssync ok %s" % (r, w.numpy().tobytes().hex()), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
