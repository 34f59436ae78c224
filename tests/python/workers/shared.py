"""Worker: tensors in the shared arena (unisum.torch.empty / zeros_like,
the C library's unisum_alloc) push_pulled in place and out of place, and
the gradients DistributedOptimizer puts there.

    shared.py

Prints "shared ok" after checking every result exactly; any difference
raises.  Run with UNISUM_LOG_LEVEL=INFO so the test can see that the
workers read each other's arenas directly.
"""

import torch

import unisum.torch as us


def main():
    torch.set_num_threads(1)
    us.init()
    rank, size = us.rank(), us.size()
    n = 300001                      # several partitions of 64 KiB, an odd tail
    base = torch.arange(n, dtype=torch.float32) % 251
    want = size * base + size * (size - 1) / 2

    t = us.empty(n)
    t.copy_(base + rank)
    out = us.push_pull(t, average=False, name="shared.out")
    assert torch.equal(out, want), "out of place: max diff %g" % (out - want).abs().max()
    us.push_pull_(t, average=False, name="shared.inplace")
    assert torch.equal(t, want), "in place: max diff %g" % (t - want).abs().max()

    # The optimizer's gradients start as zeros in the arena and backward
    # accumulates into them in place.
    model = torch.nn.Linear(64, 8)
    opt = us.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                  named_parameters=model.named_parameters())
    ptrs = [p.grad.data_ptr() for p in model.parameters()]
    assert all(p.grad is not None and not p.grad.any() for p in model.parameters())
    x = torch.full((4, 64), float(rank + 1))
    model(x).sum().backward()
    assert [p.grad.data_ptr() for p in model.parameters()] == ptrs, "backward replaced a gradient"
    opt.synchronize()
    # d(sum)/d(bias) = 4 rows on every rank; the weight's gradient is the
    # column sums of x: 4 (rank + 1), averaged over ranks.
    assert torch.equal(model.bias.grad, torch.full((8,), 4.0))
    mean = sum(4.0 * (r + 1) for r in range(size)) / size
    assert torch.allclose(model.weight.grad, torch.full((8, 64), mean)), model.weight.grad
    us.shutdown()
    t.add_(1)                       # still valid after shutdown
    print("shared ok")


if __name__ == "__main__":
    main()
