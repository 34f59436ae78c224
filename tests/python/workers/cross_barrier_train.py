"""Worker: BytePS's CrossBarrier (unisum.torch.cross_barrier) trains as
DistributedOptimizer does.

    cross_barrier_train.py

For SGD with momentum and for Adam, trains one model with
DistributedOptimizer and an identical one with CrossBarrier, on the same
batches (this rank's own), STEPS steps, with BytePS's example loop
(zero_grad, forward, backward, step) and its broadcasts first.  The model
has a parameter that no leaf module holds (updated at step()), and a layer
that rank 1 skips in one step (its zeros summed).  After the loop every
parameter of the two must be equal, bit for bit; midway, CrossBarrier's
step() must have returned with updates still waiting.  Prints
"cross_barrier ok".
"""

import torch

import unisum.torch.cross_barrier as bps

STEPS = 5


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.a = torch.nn.Linear(6, 8)
        self.b = torch.nn.Linear(8, 8)
        self.c = torch.nn.Linear(8, 2)
        self.scale = torch.nn.Parameter(torch.ones(2))     # held by no leaf module

    def forward(self, x, skip_b=False):
        h = torch.relu(self.a(x))
        if not skip_b:
            h = torch.relu(self.b(h))
        return self.c(h) * self.scale


def train(kind, crossing):
    rank = bps.rank()
    model = Net()
    if kind == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-3)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
    if crossing:
        opt = bps.CrossBarrier(model, opt, named_parameters=model.named_parameters(),
                               num_steps=STEPS)
    else:
        opt = bps.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    bps.broadcast_parameters(model.state_dict(), root_rank=0)
    bps.broadcast_optimizer_state(opt, root_rank=0)
    g = torch.Generator().manual_seed(rank)
    for step in range(STEPS):
        x, y = torch.randn(4, 6, generator=g), torch.randn(4, 2, generator=g)
        opt.zero_grad()
        loss = ((model(x, skip_b=(rank == 1 and step == 2)) - y) ** 2).mean()
        loss.backward()
        opt.step()
        if crossing and step == 1:
            assert opt._waiting, "step() waited for every sum"
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def main():
    torch.set_num_threads(1)
    bps.init()
    for kind in ("sgd", "adam"):
        plain, crossed = train(kind, False), train(kind, True)
        for name in plain:
            assert torch.equal(plain[name], crossed[name]), \
                "%s %s: max diff %g" % (kind, name, (plain[name] - crossed[name]).abs().max())
    bps.shutdown()
    print("cross_barrier ok")


if __name__ == "__main__":
    main()
