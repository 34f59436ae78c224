"""Worker: Horovod's process sets in unisum.torch, every result checked exactly.

    process_sets.py

Runs on 3 or more workers.  Two sets run at the same time: A = {0, last}
and B = the ranks between (under the same tensor names, which are distinct
tensors in distinct sets).  Each checks allreduce (Sum, Average, Max,
differentiable), broadcast from its last rank, broadcast_object, an uneven
allgather, allgather_object, reducescatter, alltoall with splits, barrier
and a DistributedOptimizer of its own against references computed here;
a rank outside a set is refused; then every rank runs unnamed collectives
on the global set (the sets' unnamed calls must not put the ranks out of
step) and the sets are removed.  Prints "rank R: process sets ok".
"""

import torch

import unisum.torch as hvd


def expect(what, got, want):
    """Raises unless tensors `got` and `want` are equal, dtype included."""
    if got.dtype != want.dtype or not torch.equal(got, want):
        raise AssertionError("rank %d: %s: got %s, want %s" % (hvd.rank(), what, got, want))


def value(q, shape, dtype, salt=0):
    """Rank q's tensor: small integers, exact in every dtype."""
    n = 1
    for d in shape:
        n *= d
    return ((torch.arange(n) * 3 + q * 7 + salt) % 11 - 5).reshape(shape).to(dtype)


def in_set(ps, ranks, r):
    """The collectives of set `ps` (members `ranks`) on rank r."""
    m, k = len(ranks), ranks.index(r)
    assert ps.size() == m and ps.rank() == k and ps.included(), ps
    for dtype in (torch.float32, torch.float64, torch.int32, torch.int64, torch.float16):
        shape = (5, 3000)       # several partitions
        mine = value(r, shape, dtype)
        every = torch.stack([value(q, shape, dtype) for q in ranks])
        expect("Sum %s" % dtype, hvd.allreduce(mine, op=hvd.Sum, name="x", process_set=ps),
               every.double().sum(0).to(dtype))
        expect("Max %s" % dtype, hvd.allreduce(mine, op=hvd.Max, process_set=ps),
               every.max(0).values)
        if dtype.is_floating_point:
            expect("Average %s" % dtype, hvd.allreduce(mine, process_set=ps),
                   (every.double().sum(0) / m).to(dtype))
    # Differentiable: the gradient is the allreduce of the gradient in the set.
    x = torch.ones(4, requires_grad=True)
    (hvd.allreduce(x, op=hvd.Sum, process_set=ps) * (r + 1)).sum().backward()
    expect("allreduce's gradient", x.grad, torch.full((4,), float(sum(q + 1 for q in ranks))))
    root = ranks[-1]
    expect("broadcast", hvd.broadcast(value(r, (7, 5), torch.int64, 1), root, process_set=ps),
           value(root, (7, 5), torch.int64, 1))
    obj = hvd.broadcast_object({"from": r} if r == root else None, root, process_set=ps)
    assert obj == {"from": root}, obj
    rows = torch.full((r + 1, 2), r, dtype=torch.int32)
    expect("allgather", hvd.allgather(rows, process_set=ps),
           torch.cat([torch.full((q + 1, 2), q, dtype=torch.int32) for q in ranks]))
    assert hvd.allgather_object(("r", r), process_set=ps) == [("r", q) for q in ranks]
    t = torch.stack([value(q, (2 * m + 1, 3), torch.float32) for q in ranks]).sum(0)
    lo = sum(2 + (1 if j < 1 else 0) for j in range(k))
    want = t[lo:lo + 2 + (1 if k < 1 else 0)]
    expect("reducescatter Sum", hvd.reducescatter(value(r, (2 * m + 1, 3), torch.float32),
                                                  op=hvd.Sum, process_set=ps), want)
    splits = torch.tensor([j + 1 for j in range(m)], dtype=torch.int32)
    send = torch.cat([torch.full((j + 1,), 100 * r + ranks[j]) for j in range(m)])
    got, recv = hvd.alltoall(send, splits, process_set=ps)
    expect("alltoall", got, torch.cat([torch.full((k + 1,), 100 * q + r) for q in ranks]))
    expect("alltoall's splits", recv, torch.full((m,), k + 1, dtype=torch.int32))
    hvd.barrier(process_set=ps)
    # An optimizer of the set: every member ends with the same parameters.
    torch.manual_seed(r)
    model = torch.nn.Linear(4, 2)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), process_set=ps)
    model(torch.randn(8, 4)).pow(2).sum().backward()
    opt.step()
    w = model.weight.detach()
    expect("the set's optimizer", hvd.allgather(w.reshape(1, -1), process_set=ps),
           w.reshape(1, -1).repeat(m, 1))


def main():
    torch.set_num_threads(1)
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    assert n >= 3, "run on 3 or more workers"
    a_ranks, b_ranks = [0, n - 1], list(range(1, n - 1))
    a = hvd.add_process_set(hvd.ProcessSet([n - 1, 0]))     # any order
    b = hvd.add_process_set(b_ranks)
    assert (a.process_set_id, b.process_set_id) == (1, 2), (a, b)
    assert a.ranks == a_ranks
    for bad in ([0, n - 1], list(range(n))):
        try:
            hvd.add_process_set(bad)
        except ValueError:
            continue
        raise AssertionError("add_process_set(%s) did not raise ValueError" % bad)
    mine, other = (a, b) if r in a_ranks else (b, a)
    in_set(mine, a_ranks if mine is a else b_ranks, r)
    assert not other.included() and other.rank() is None
    try:
        hvd.allreduce(torch.ones(2), process_set=other)
    except ValueError:
        pass
    else:
        raise AssertionError("an allreduce in a set without this rank did not raise")
    # Unnamed collectives on the global set after the sets' own (each set
    # counts its unnamed calls apart): every rank still agrees.
    for i in range(3):
        expect("global Sum %d" % i, hvd.allreduce(torch.full((3,), float(r)), op=hvd.Sum),
               torch.full((3,), float(n * (n - 1) // 2)))
    expect("global allgather", hvd.allgather(torch.tensor([r])), torch.arange(n))
    # A set's allgather and the global set's, started in different orders
    # on different ranks (each set in its own order, as Horovod asks): a
    # rank waiting on one runs the other's second stage when it can.
    members = a_ranks if mine is a else b_ranks
    want_set = torch.tensor([10 + q for q in sorted(members)])
    if r == min(members):
        hs = hvd.allgather_async(torch.tensor([10 + r]), process_set=mine)
        hg = hvd.allgather_async(torch.tensor([r]))
        expect("global allgather after a set's", hvd.synchronize(hg), torch.arange(n))
        expect("set allgather before the global", hvd.synchronize(hs), want_set)
    else:
        hg = hvd.allgather_async(torch.tensor([r]))
        expect("global allgather before a set's", hvd.synchronize(hg), torch.arange(n))
        hs = hvd.allgather_async(torch.tensor([10 + r]), process_set=mine)
        expect("set allgather after the global", hvd.synchronize(hs), want_set)
    assert hvd.remove_process_set(a) and hvd.remove_process_set(b)
    assert not hvd.remove_process_set(a) and not hvd.remove_process_set(hvd.global_process_set)
    print("rank %d: process sets ok" % r, flush=True)


if __name__ == "__main__":
    main()
