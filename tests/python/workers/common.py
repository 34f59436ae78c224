"""Models, data and inputs shared by the worker scripts and the tests'
single-process references.  Imports torch only (never unisum), so the test
process can compute references without joining a job."""

import json
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

IN, HIDDEN, OUT = 8, 16, 4
GLOBAL_BATCH = 16      # divisible by every worker count used (1, 2, 4)
STEPS = 20
MODEL_SEED = 1234
DATA_SEED = 99


def make_mlp(seed=MODEL_SEED):
    """A 2-layer MLP (tanh: no dead units, so no gradient is exactly zero on
    one path and not the other), float32, initialised from `seed`."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(IN, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, OUT))


def make_data(steps=STEPS, global_batch=GLOBAL_BATCH, seed=DATA_SEED):
    """Fixed random regression data: step s uses rows [s*B, (s+1)*B)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(steps * global_batch, IN, generator=g)
    w = torch.randn(IN, OUT, generator=g)
    y = torch.tanh(x @ w) + 0.1 * torch.randn(steps * global_batch, OUT, generator=g)
    return x, y


def global_batch(x, y, step, batch=GLOBAL_BATCH):
    return x[step * batch:(step + 1) * batch], y[step * batch:(step + 1) * batch]


def shard(x, y, step, rank, size, batch=GLOBAL_BATCH):
    """Worker `rank`'s equal, contiguous share of step `step`'s global batch;
    the shards of ranks 0..size-1 concatenated are the global batch."""
    xb, yb = global_batch(x, y, step, batch)
    per = batch // size
    assert per * size == batch
    return xb[rank * per:(rank + 1) * per], yb[rank * per:(rank + 1) * per]


def make_optimizer(kind, params):
    if kind == "sgd":
        return torch.optim.SGD(params, lr=0.1, momentum=0.9)
    if kind == "adam":
        # Adam is invariant to the scale of the gradient; weight decay (added
        # to the gradient before the moments) makes it see a wrong scale
        # (e.g. a sum instead of an average over workers).
        return torch.optim.Adam(params, lr=0.01, weight_decay=0.05)
    raise ValueError(kind)


def loss_fn(model, xb, yb):
    """Mean squared error: a mean over the batch, so the mean over workers of
    the per-shard mean losses' gradients is the full batch's mean gradient."""
    return F.mse_loss(model(xb), yb)


def snapshot(model):
    return [p.detach().clone() for p in model.parameters()]


def reference_training(kind, steps=STEPS):
    """ONE process, no unisum: trains on every step's whole global batch.
    Returns the parameters after every step."""
    x, y = make_data(steps)
    model = make_mlp()
    opt = make_optimizer(kind, model.parameters())
    history = []
    for step in range(steps):
        xb, yb = global_batch(x, y, step)
        opt.zero_grad()
        loss_fn(model, xb, yb).backward()
        opt.step()
        history.append(snapshot(model))
    return history


# ---- push_pull of every dtype -------------------------------------------

DTYPES = {
    "float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
    "bfloat16": torch.bfloat16, "int32": torch.int32, "int64": torch.int64,
}


def dtype_input(name, rank, n=37):
    """Worker `rank`'s input of dtype `name`.  Float values are dyadic and
    small enough that any sum over up to 4 workers is exact in that dtype
    (so the expected sum does not depend on the order of the additions);
    integers include negative values (floor vs truncating division) and,
    for int64, values above 2**53 (not representable in a double)."""
    g = torch.Generator().manual_seed(1000 * rank + len(name))
    dtype = DTYPES[name]
    if name in ("float32", "float64"):
        return (torch.randint(-4000, 4000, (n,), generator=g).double() / 64).to(dtype)
    if name == "float16":
        return (torch.randint(-120, 120, (n,), generator=g).double() / 16).to(dtype)
    if name == "bfloat16":
        return (torch.randint(-60, 60, (n,), generator=g).double() / 4).to(dtype)
    if name == "int32":
        t = torch.randint(-100000, 100000, (n,), generator=g, dtype=torch.int64)
        t[0] = -7 + rank        # small negative sums: floor division differs from truncation
        t[1] = 2**31 // 8 + rank  # large, still no overflow when summed over 4 workers
        return t.to(torch.int32)
    t = torch.randint(-10**9, 10**9, (n,), generator=g, dtype=torch.int64)
    t[0] = -7 + rank
    t[1] = 2**60 + 1 + rank   # sum over <= 4 workers stays below 2**63
    t[2] = -(2**59) - 3 * rank
    return t


def expected_dtype_result(name, size, average):
    """The exact result of summing dtype_input(name, r) over ranks 0..size-1
    (in rank order), divided by `size` when `average`: floats divide in their
    own precision (float16/bfloat16 through float32, rounded to nearest
    even, as the C library documents), integers floor-divide."""
    total = dtype_input(name, 0)
    for r in range(1, size):
        total = total + dtype_input(name, r)
    if not average:
        return total
    if name in ("float16", "bfloat16"):
        return (total.float() / size).to(DTYPES[name])
    if name in ("float32", "float64"):
        return total / size
    return torch.div(total, size, rounding_mode="floor")


def write_json(outdir, rank, obj, prefix="rank"):
    path = os.path.join(outdir, "%s%d.json" % (prefix, rank))
    with open(path + ".tmp", "w") as f:
        json.dump(obj, f)
    os.replace(path + ".tmp", path)


def read_json(outdir, rank, prefix="rank"):
    with open(os.path.join(outdir, "%s%d.json" % (prefix, rank))) as f:
        return json.load(f)


def save(outdir, rank, obj, prefix="rank"):
    path = os.path.join(outdir, "%s%d.pt" % (prefix, rank))
    torch.save(obj, path + ".tmp")
    os.replace(path + ".tmp", path)


def load(outdir, rank, prefix="rank"):
    return torch.load(os.path.join(outdir, "%s%d.pt" % (prefix, rank)))


def noncontig_base(name, rank):
    """A (6, 8) tensor of dtype `name`, different on every rank, whose views
    base[::2, 1:7] and base.t() are not contiguous."""
    return (torch.arange(48, dtype=torch.float64).reshape(6, 8) * (rank + 1) - 20).to(DTYPES[name])


def noncontig_view(base):
    return base[::2, 1:7]
