"""Worker: a parameter used on some ranks only.

    unused.py OUTDIR

Rank 1 never uses the second layer, so its gradient hook never fires
there.  DistributedOptimizer must push zeros for it on rank 1 (as Horovod
does) instead of leaving rank 0 waiting forever; both ranks then hold the
same parameters.  Writes OUTDIR/rank<r>.pt with the final parameters.
"""

import os
import sys

import torch

import unisum.torch as us


def main():
    outdir = sys.argv[1]
    torch.set_num_threads(1)
    us.init()
    rank = us.rank()
    torch.manual_seed(0)
    a, b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)
    params = list(a.named_parameters(prefix="a")) + list(b.named_parameters(prefix="b"))
    opt = us.DistributedOptimizer(torch.optim.SGD([p for _, p in params], lr=0.1),
                                  named_parameters=params)
    x = torch.ones(2, 4)
    for _ in range(3):
        opt.zero_grad()
        out = a(x).sum() if rank == 1 else b(a(x)).sum()
        out.backward()
        opt.step()
    torch.save({n: p.detach() for n, p in params}, os.path.join(outdir, "rank%d.pt" % rank))
    us.shutdown()


if __name__ == "__main__":
    main()
