"""CUDA tensors through unisum.torch (issue 22), checked on every rank.

    cuda_ops.py [--big] [--cpu]

(--cpu runs the same checks on CPU tensors: a check of the checks, for a
machine without a GPU.)

Each check prints "rank R: <what> ok" or raises (the launch then fails and
names the rank).  Every expected value is computed here on the device, so
the checks need no file exchange:

- sums: push_pull of every dtype the plugin sums, sizes from 0 elements
  to 64 MiB (with --big), sum and average, out of place and in place, a
  non-contiguous tensor, eight in flight at once; every result on the
  tensor's own device and exact (small integers, exact in every dtype);
- mixed: a CPU and a CUDA tensor in flight together;
- broadcasts: broadcast_parameters, broadcast_optimizer_state and
  broadcast_object of CUDA state;
- training: DistributedOptimizer (SGD with momentum, and Adam) on the
  shared MLP of common.py and on a small CNN, on CUDA, after every step
  equal to one process training on the whole batch on the same device
  (each rank computes that reference itself), and with Compression.fp16
  within fp16's tolerance.
"""
import sys

import torch

import common
import unisum.torch as us

# TF32 would round the distributed and the single-process training apart
# (3 shards' losses are not a power of 2 from the whole batch's).
torch.backends.cudnn.allow_tf32 = False
torch.backends.cuda.matmul.allow_tf32 = False
us.init()
rank, size = us.rank(), us.size()
dev = torch.device("cpu") if "--cpu" in sys.argv else torch.device("cuda", torch.cuda.current_device())
big = "--big" in sys.argv
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64]


def values(n, dtype, salt, who):
    """Small integers, exact in every dtype even when summed over ranks."""
    i = torch.arange(n, device=dev, dtype=torch.int64)
    return ((i * 7 + salt * 3 + who) % 11).to(dtype)


def expect_sum(n, dtype, salt, average):
    total = sum(values(n, torch.int64, salt, q) for q in range(size)) if n else \
        torch.zeros(0, device=dev, dtype=torch.int64)
    if not average:
        return total.to(dtype)
    return (total.to(torch.float64) / size).to(dtype)


def same(got, want, what):
    assert got.device == want.device, "%s: result on %s, not %s" % (what, got.device, want.device)
    assert got.dtype == want.dtype and got.shape == want.shape, \
        "%s: %s%s, want %s%s" % (what, got.dtype, tuple(got.shape), want.dtype, tuple(want.shape))
    if not torch.equal(got, want):
        bad = (got != want).nonzero()[:3].flatten().tolist()
        raise AssertionError("%s: differs at %s: %s, want %s" % (
            what, bad, got.flatten()[bad].tolist(), want.flatten()[bad].tolist()))


def close(got, want, what):
    """An average: exact in float64; within the dtype's rounding otherwise
    (the C library divides in its own precision)."""
    if want.dtype == torch.float64 or want.numel() == 0:
        return same(got, want, what)
    assert got.device == want.device and got.dtype == want.dtype, what
    tol = {torch.float32: 1e-6, torch.float16: 1e-3, torch.bfloat16: 8e-3}[want.dtype]
    if not torch.allclose(got.double(), want.double(), rtol=tol, atol=0):
        raise AssertionError("%s: off by %g" % (what, (got.double() - want.double()).abs().max()))


def sizes(dtype):
    es = torch.empty((), dtype=dtype).element_size()
    out = [0, 1, 3, 1000, (1 << 20) // es + 5, (4 << 20) // es + 1]
    if big:
        out.append((64 << 20) // es)
    return out


# ---- sums ---------------------------------------------------------------
salt = 0
for dtype in DTYPES:
    for n in sizes(dtype):
        for average in ((False, True) if dtype.is_floating_point else (False,)):
            salt += 1
            x = values(n, dtype, salt, rank)
            name = "cuda.sum.%s.%d.%d" % (dtype, n, average)
            want = expect_sum(n, dtype, salt, average)
            check = close if average else same
            got = us.push_pull(x, average=average, name=name)
            check(got, want, name)
            same(x, values(n, dtype, salt, rank), name + " (input untouched)")
            y = values(n, dtype, salt, rank)
            us.push_pull_(y, average=average, name=name + ".inplace")
            check(y, want, name + " in place")
print("rank %d: cuda sums ok" % rank, flush=True)

# Non-contiguous, in place: every other column of a matrix.
m = values(64 * 10, torch.float32, 99, rank).reshape(64, 10)
view = m[:, ::2]
assert not view.is_contiguous()
us.push_pull_(view, average=False, name="cuda.strided")
want = expect_sum(64 * 10, torch.float32, 99, False).reshape(64, 10)
same(m[:, ::2], want[:, ::2], "strided in place")
same(m[:, 1::2], values(64 * 10, torch.float32, 99, rank).reshape(64, 10)[:, 1::2],
     "strided in place: the other columns untouched")

# Eight in flight at once, waited in reverse order; unnamed ones too.
xs = [values(100000 + k, torch.float32, 200 + k, rank) for k in range(8)]
hs = [us.push_pull_async(x, average=False, name=None if k % 2 else "cuda.flight.%d" % k)
      for k, x in enumerate(xs)]
for k in reversed(range(8)):
    same(us.synchronize(hs[k]), expect_sum(100000 + k, torch.float32, 200 + k, False),
         "in flight %d" % k)
print("rank %d: cuda in flight ok" % rank, flush=True)

# ---- mixed CPU and CUDA -------------------------------------------------
c = values(5000, torch.float32, 300, rank).cpu()
g = values(5000, torch.float32, 301, rank)
hc, hg = us.push_pull_async(c, average=False, name="mixed.cpu"), \
    us.push_pull_async(g, average=False, name="mixed.cuda")
same(us.synchronize(hg), expect_sum(5000, torch.float32, 301, False), "mixed: the CUDA one")
same(us.synchronize(hc), expect_sum(5000, torch.float32, 300, False).cpu(), "mixed: the CPU one")
print("rank %d: cuda mixed ok" % rank, flush=True)

# ---- broadcasts -----------------------------------------------------------
model = common.make_mlp(seed=common.MODEL_SEED + rank).to(dev)
opt = torch.optim.Adam(model.parameters(), lr=0.01)
model(torch.randn(4, common.IN, device=dev)).sum().backward()
opt.step()
us.broadcast_parameters(model.state_dict(), root_rank=0)
us.broadcast_optimizer_state(opt, root_rank=0)
# Every rank now holds rank 0's parameters: their sums are size x rank 0's.
for n, p in model.state_dict().items():
    total = us.push_pull(p.clone(), average=False, name="bcast.check." + n)
    same(total, p * size, "broadcast_parameters " + n)
state = opt.state_dict()["state"]
for k, st in state.items():
    for key in ("exp_avg", "exp_avg_sq"):
        t = st[key]
        assert t.device == dev, (k, key, t.device)
        same(us.push_pull(t.clone(), average=False, name="bcast.opt.%s.%s" % (k, key)), t * size,
             "broadcast_optimizer_state %s %s" % (k, key))
obj = us.broadcast_object({"t": torch.full((3,), float(rank), device=dev)}, root_rank=0)
same(obj["t"], torch.zeros(3, device=dev), "broadcast_object")
print("rank %d: cuda broadcasts ok" % rank, flush=True)


# ---- training -------------------------------------------------------------
BATCH = 48     # the global batch: 2, 3 and 4 workers get equal shares


def make_cnn():
    """A small CNN (a convolution, a linear layer) for 1x8x8 images."""
    torch.manual_seed(common.MODEL_SEED)
    return torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.Tanh(), torch.nn.Flatten(),
                               torch.nn.Linear(4 * 6 * 6, common.OUT))


def cnn_data():
    g = torch.Generator().manual_seed(common.DATA_SEED)
    n = common.STEPS * BATCH
    return torch.randn(n, 1, 8, 8, generator=g), torch.randn(n, common.OUT, generator=g)


def mlp_data():
    return common.make_data(global_batch=BATCH)


def train(kind, compression=None, make=common.make_mlp, data=mlp_data, tol=1e-5):
    """Checks that after every step each parameter of the distributed run
    equals one process's, trained on the whole batch on the same device."""
    x, y = data()
    x, y = x.to(dev), y.to(dev)
    model = make().to(dev)
    kw = {} if compression is None else {"compression": compression}
    opt = us.DistributedOptimizer(common.make_optimizer(kind, model.parameters()),
                                  named_parameters=model.named_parameters(), **kw)
    ref_model = make().to(dev)
    ref_opt = common.make_optimizer(kind, ref_model.parameters())
    for step in range(common.STEPS):
        xs, ys = common.shard(x, y, step, rank, size, batch=BATCH)
        opt.zero_grad()
        common.loss_fn(model, xs, ys).backward()
        opt.step()
        xb, yb = common.global_batch(x, y, step, batch=BATCH)
        ref_opt.zero_grad()
        common.loss_fn(ref_model, xb, yb).backward()
        ref_opt.step()
        for (n, p), q in zip(model.named_parameters(), ref_model.parameters()):
            assert p.device == dev
            if not torch.allclose(p, q, atol=tol, rtol=tol):
                raise AssertionError("%s%s: after step %d, %s differs from one process's by %g"
                                     % (kind, "" if compression is None else " fp16", step + 1,
                                        n, (p - q).abs().max().item()))


for kind in ("sgd", "adam"):
    train(kind)
train("sgd", us.Compression.fp16, tol=2e-2)
# cuDNN's convolutions sum in their own order: a looser bound.
train("sgd", make=make_cnn, data=cnn_data, tol=1e-4)
print("rank %d: cuda training ok" % rank, flush=True)
us.shutdown()
