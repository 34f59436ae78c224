"""Worker: sparse gradients (nn.Embedding(sparse=True)) through
DistributedOptimizer, as Horovod's test_sparse_embeddings trains them.

    sparse_train.py OUTDIR

Two models, each trained STEPS steps on this rank's own batches (from
batches(), which the test also uses for its single-process reference):
  - "adam": an embedding alone, under torch.optim.SparseAdam, which takes
    sparse gradients only;
  - "sgd": an embedding and a dense linear layer under SGD, which takes
    both kinds: the linear layer's gradient stays in the shared arena (on
    one machine) while the embedding's stays sparse.
each once with sparse_as_dense=False (indices and values allgathered) and
once with True (summed dense).  In the "sgd" model rank 1 skips the
embedding at one step (loss_of): its contribution is an empty sparse
gradient shaped like the others'.  Checks that every sparse gradient is still
sparse after step(), and writes OUTDIR/rank<r>.pt with every final
parameter, by "<model>.<sparse_as_dense>.<name>".
"""

import os
import sys

import torch

import unisum.torch as us

ROWS, DIM, STEPS = 40, 6, 4


def batches(rank, step):
    """Rank `rank`'s indices (2 x 5, some rows shared with the other ranks,
    some its own, some repeated) and targets at `step`."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    idx = torch.randint(0, ROWS, (2, 5), generator=g)
    target = torch.randn(2, 5, DIM, generator=g)
    return idx, target


def make(kind):
    """The model of `kind` and its (not yet distributed) optimizer."""
    torch.manual_seed(7)
    emb = torch.nn.Embedding(ROWS, DIM, sparse=True)
    if kind == "adam":
        model = torch.nn.Sequential(emb)
        return model, torch.optim.SparseAdam(list(model.parameters()), lr=0.05)
    model = torch.nn.Sequential(emb, torch.nn.Linear(DIM, DIM))
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def loss_of(model, kind, rank, step):
    """Rank `rank`'s loss at `step`.  In the "sgd" model rank 1 skips the
    embedding at step 2 (its linear layer gets zeros): it then sums empty
    sparse gradients of the kind the others send."""
    idx, target = batches(rank, step)
    if kind == "sgd" and rank == 1 and step == 2:
        return ((model[1](torch.zeros(2, 5, DIM)) - target) ** 2).mean()
    return ((model(idx) - target) ** 2).mean()


def main():
    outdir = sys.argv[1]
    torch.set_num_threads(1)
    us.init()
    rank = us.rank()
    out = {}
    for kind in ("adam", "sgd"):
        for dense in (False, True):
            model, opt = make(kind)
            opt = us.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                          sparse_as_dense=dense)
            for step in range(STEPS):
                opt.zero_grad()
                loss_of(model, kind, rank, step).backward()
                opt.step()
                assert model[0].weight.grad.is_sparse, (kind, dense, step)
                if kind == "sgd":
                    assert not model[1].weight.grad.is_sparse
            for name, p in model.named_parameters():
                out["%s.%s.%s" % (kind, dense, name)] = p.detach().clone()
    torch.save(out, os.path.join(outdir, "rank%d.pt" % rank))
    us.shutdown()


if __name__ == "__main__":
    main()
