"""Worker: Horovod's names in unisum.torch, every result checked exactly.

    horovod_api.py

Imports unisum.torch as hvd, as a ported Horovod program does, and runs
allreduce (Sum, Average, Min, Max, Product, prescale and postscale factors,
in place, async, grouped, differentiable), broadcast (new tensor, in place, async,
differentiable) and the queries.  Every value is an integer small enough to
be exact in every dtype, so results compare with ==.  Prints
"rank R: horovod api ok" at the end; any mismatch raises.
"""

import os
import time

import torch

import unisum.torch as hvd


def expect(what, got, want):
    """Raises unless tensors `got` and `want` are equal, dtype included."""
    if got.dtype != want.dtype or not torch.equal(got, want):
        raise AssertionError("rank %d: %s: got %s, want %s" % (hvd.rank(), what, got, want))


def main():
    torch.set_num_threads(1)
    assert not hvd.is_initialized()
    hvd.init()
    assert hvd.is_initialized()
    r, n = hvd.rank(), hvd.size()
    assert hvd.rank() == int(os.environ["HOROVOD_RANK"]) == int(os.environ["RANK"])
    assert hvd.size() == int(os.environ["HOROVOD_SIZE"]) == int(os.environ["WORLD_SIZE"])
    assert hvd.cross_rank() == int(os.environ["HOROVOD_CROSS_RANK"])
    assert hvd.cross_size() == int(os.environ["HOROVOD_CROSS_SIZE"])
    assert hvd.is_homogeneous()
    ranks = sum(range(n))
    for dtype in (torch.float32, torch.float64, torch.int32, torch.int64, torch.float16,
                  torch.bfloat16):
        x = torch.arange(6, dtype=dtype) + r            # element i: i + r
        base = torch.arange(6, dtype=torch.int64)
        want_sum = (base * n + ranks).to(dtype)
        expect("allreduce Sum %s" % dtype, hvd.allreduce(x, op=hvd.Sum), want_sum)
        expect("allreduce average=False %s" % dtype, hvd.allreduce(x, average=False), want_sum)
        if dtype.is_floating_point:
            y = (torch.arange(6, dtype=dtype) * n + r)   # mean over ranks: i*n + (n-1)/2
            want_avg = (torch.arange(6, dtype=torch.float64) * n + ranks / n).to(dtype)
            expect("allreduce Average %s" % dtype, hvd.allreduce(y), want_avg)
            expect("allreduce pre 2, post 3 %s" % dtype,
                   hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.0, postscale_factor=3.0),
                   (want_sum.double() * 6).to(dtype))
        z = x.clone()
        out = hvd.allreduce_(z, op=hvd.Sum, name="inplace.%s" % dtype)
        assert out is z
        expect("allreduce_ %s" % dtype, z, want_sum)
        h = hvd.allreduce_async(x, op=hvd.Sum, name="async.%s" % dtype)
        expect("allreduce_async %s" % dtype, hvd.synchronize(h), want_sum)
        w = x.clone()
        h = hvd.allreduce_async_(w, op=hvd.Sum)
        while not hvd.poll(h):
            pass
        expect("allreduce_async_ then poll %s" % dtype, hvd.synchronize(h), want_sum)
        expect("allreduce_async_ in place %s" % dtype, w, want_sum)
        b = torch.full((3, 2), r, dtype=dtype)
        expect("broadcast from 1 %s" % dtype, hvd.broadcast(b, root_rank=1),
               torch.full((3, 2), 1, dtype=dtype))
        expect("... leaves its input", b, torch.full((3, 2), r, dtype=dtype))
        hvd.broadcast_(b, root_rank=n - 1, name="bcast.%s" % dtype)
        expect("broadcast_ from n-1 %s" % dtype, b, torch.full((3, 2), n - 1, dtype=dtype))
        h = hvd.broadcast_async(torch.full((4,), r, dtype=dtype), 0)
        expect("broadcast_async %s" % dtype, hvd.synchronize(h), torch.zeros(4, dtype=dtype))
    # Integers scale in float64 and truncate, as Horovod does on the CPU.
    x = torch.tensor([3, -3, 7], dtype=torch.int32) * (r + 1)
    want = sum(((torch.tensor([3, -3, 7], dtype=torch.int32) * (q + 1)).double() * 2.5).int()
               for q in range(n))
    expect("allreduce int32, prescale 2.5", hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.5),
           want.to(torch.int32))
    expect("allreduce int32, postscale 0.5",
           hvd.allreduce(x, op=hvd.Sum, postscale_factor=0.5),
           (sum(torch.tensor([3, -3, 7], dtype=torch.int32) * (q + 1) for q in range(n)).double()
            * 0.5).int().to(torch.int32))
    # Dtypes the servers do not sum still broadcast, exactly.
    for dtype in (torch.uint8, torch.int8, torch.int16, torch.bool):
        b = (torch.arange(5) + 7 * r).to(dtype)
        expect("broadcast %s" % dtype, hvd.broadcast(b, root_rank=1),
               (torch.arange(5) + 7).to(dtype))
        hvd.broadcast_(b, root_rank=0)
        expect("broadcast_ %s" % dtype, b, torch.arange(5).to(dtype))
    # grouped_allreduce is differentiable too.
    xs = [torch.ones(2, requires_grad=True), torch.ones(3, requires_grad=True)]
    outs = hvd.grouped_allreduce(xs, op=hvd.Sum)
    (outs[0].sum() * (r + 1) + outs[1].sum() * 2).backward()
    expect("grouped_allreduce's gradient 0", xs[0].grad, torch.full((2,), float(ranks + n)))
    expect("grouped_allreduce's gradient 1", xs[1].grad, torch.full((3,), float(2 * n)))
    grouped = hvd.grouped_allreduce([torch.full((2,), float(r)), torch.full((3,), float(2 * r))],
                                    op=hvd.Sum, name="grouped")
    expect("grouped_allreduce 0", grouped[0], torch.full((2,), float(ranks)))
    expect("grouped_allreduce 1", grouped[1], torch.full((3,), float(2 * ranks)))
    # Differentiable: d/dx sum(allreduce_sum(x) * c) = allreduce_sum(c).
    x = torch.ones(4, requires_grad=True)
    (hvd.allreduce(x, op=hvd.Sum) * (r + 1)).sum().backward()
    expect("allreduce's gradient", x.grad, torch.full((4,), float(ranks + n)))
    # broadcast's gradient: averaged over the workers, on the root only.
    x = torch.ones(4, requires_grad=True)
    (hvd.broadcast(x, root_rank=0) * (2 * r + 2)).sum().backward()
    want = torch.full((4,), float(2 * ranks + 2 * n) / n) if r == 0 else torch.zeros(4)
    expect("broadcast's gradient", x.grad, want)
    # allgather: rank q contributes q + 1 rows of value q, every dtype, bit for bit.
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32,
                  torch.int64, torch.uint8, torch.int8, torch.int16, torch.bool):
        mine = torch.full((r + 1, 3), r % 2 if dtype == torch.bool else r, dtype=dtype)
        want = torch.cat([torch.full((q + 1, 3), q % 2 if dtype == torch.bool else q, dtype=dtype)
                          for q in range(n)])
        expect("allgather %s" % dtype, hvd.allgather(mine), want)
    neg = torch.tensor([-0.0, float("nan"), -1.5]) if r == 0 else torch.tensor([2.0])
    got = hvd.allgather(neg)
    assert torch.signbit(got[0]) and torch.isnan(got[1]) and got[2] == -1.5, got
    expect("grouped_allgather", hvd.grouped_allgather([torch.full((1,), r), torch.full((2,), r)])[1],
           torch.tensor([q for q in range(n) for _ in range(2)]))
    assert hvd.allgather_object({"rank": r, "x": [r] * r}) == [{"rank": q, "x": [q] * q}
                                                               for q in range(n)]
    # Unnamed allgathers reuse tensors in turn (_horovod's slots): more in
    # flight than there are slots, layouts that change from call to call,
    # and each rank synchronizing in an order of its own.
    # So do reducescatters and alltoalls.
    calls = []
    for i in range(33):
        if i % 3 == 0:      # allgather: rows that change with i, or not
            rows = 1 + (i + r) % 3 if i % 2 else 2
            calls.append((hvd.allgather_async(torch.full((rows, 2), 100 * i + r)),
                          torch.cat([torch.full((1 + (i + q) % 3 if i % 2 else 2, 2), 100 * i + q)
                                     for q in range(n)])))
        elif i % 3 == 1:    # reducescatter of 2n or 2n + 1 rows
            full = torch.arange(2 * n + i % 2).unsqueeze(1).repeat(1, 2) + 100 * i
            calls.append((hvd.reducescatter_async(full + r, op=hvd.Sum),
                          torch.tensor_split(full * n + ranks, n)[r]))
        else:               # alltoall: rank q sends 1 + (q + j + i) % 2 rows to rank j
            parts = [torch.full((1 + (r + j + i) % 2, 2), 100 * i + 10 * r + j) for j in range(n)]
            calls.append((hvd.alltoall_async(torch.cat(parts), splits=[p.shape[0] for p in parts]),
                          torch.cat([torch.full((1 + (q + r + i) % 2, 2), 100 * i + 10 * q + r)
                                     for q in range(n)])))
    order = list(range(len(calls)))
    order = order[r::2] + order[1 - r % 2::2] if r % 2 else order[::-1]
    for i in order:
        got = hvd.synchronize(calls[i][0])
        expect("collective %d of many in flight" % i, got[0] if i % 3 == 2 else got, calls[i][1])
    # poll() runs the second stages up to its handle's, as synchronize()
    # does: rank 0 polls only the last of several allgathers, the others
    # synchronize them in order (each needs rank 0's stage of it).
    hs = [hvd.allgather_async(torch.full((1 + i % 2,), 10 * i + r)) for i in range(6)]
    if r == 0:
        while not hvd.poll(hs[-1]):
            time.sleep(0.001)
    for i, h in enumerate(hs):
        expect("polled allgather %d" % i, hvd.synchronize(h),
               torch.tensor([10 * i + q for q in range(n) for _ in range(1 + i % 2)]))
    # Ten in flight: the ninth and tenth take their turns on reused
    # exchange tensors while the first two are still in flight.
    hs = [hvd.allgather_async(torch.tensor([100 * i + r])) for i in range(10)]
    for i in range(10):
        expect("allgather %d of 10" % i, hvd.synchronize(hs[i]), torch.arange(n) + 100 * i)
    repeated_layouts(r, n)
    refused_on_one_rank(r, n)
    x = torch.ones(r + 1, requires_grad=True)
    (hvd.allgather(x) * torch.arange(float(n * (n + 1) // 2))).sum().backward()
    start = r * (r + 1) // 2
    expect("allgather's gradient", x.grad, torch.arange(float(start), float(start + r + 1)))
    # reducescatter: 2n + 1 rows split as torch.tensor_split does.
    t = torch.arange(float(2 * n + 1)).unsqueeze(1).repeat(1, 2) + r
    full = sum(torch.arange(float(2 * n + 1)).unsqueeze(1).repeat(1, 2) + q for q in range(n))
    mine_rows = torch.tensor_split(full, n)[r]
    expect("reducescatter Sum", hvd.reducescatter(t, op=hvd.Sum), mine_rows)
    expect("reducescatter Average", hvd.reducescatter(t), mine_rows / n)
    got = hvd.grouped_reducescatter([t, t * 2], op=hvd.Sum)
    expect("grouped_reducescatter", got[1], mine_rows * 2)
    x = torch.ones(2 * n, requires_grad=True)
    hvd.reducescatter(x, op=hvd.Sum).sum().backward()
    expect("reducescatter's gradient", x.grad, torch.full((2 * n,), float(n)))
    # alltoall: rank q sends j + 1 rows of value 10 q + j to rank j.
    sent = torch.cat([torch.full((j + 1, 2), 10 * r + j) for j in range(n)])
    got, recv = hvd.alltoall(sent, splits=torch.tensor([j + 1 for j in range(n)]))
    expect("alltoall", got, torch.cat([torch.full((r + 1, 2), 10 * q + r) for q in range(n)]))
    expect("alltoall's received splits", recv, torch.full((n,), r + 1, dtype=torch.int32))
    # Splits other than a tensor go to int32 as in Horovod: floats truncated.
    got, _ = hvd.alltoall(sent, splits=[j + 1.5 for j in range(n)])
    expect("alltoall, splits as a list of floats", got,
           torch.cat([torch.full((r + 1, 2), 10 * q + r) for q in range(n)]))
    expect("alltoall, even split", hvd.alltoall(torch.arange(2 * n) + 100 * r),
           torch.tensor([100 * q + 2 * r + i for q in range(n) for i in range(2)]))
    x = torch.ones(n, requires_grad=True)
    out = hvd.alltoall(x)
    (out * (r + 1)).sum().backward()
    expect("alltoall's gradient", x.grad, torch.tensor([float(j + 1) for j in range(n)]))
    # Horovod's optimizer._parameter_names: unique, and the same on every rank.
    model = torch.nn.Linear(3, 2)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    names = sorted(opt._parameter_names.values())
    assert len(set(names)) == 2 and hvd.allgather_object(names) == [names] * n, names
    # Min, Max and Product on the servers, every dtype, against torch's own
    # reduction of every rank's values (rank q's element i: ((i * 7 + q * 3)
    # % 5) - 2, ones for the product, which stays exact).
    for dtype in (torch.float32, torch.float64, torch.int32, torch.int64, torch.float16,
                  torch.bfloat16, torch.uint8, torch.int16):
        def vals(q, dtype=dtype):
            v = (torch.arange(3 * 5 * 7) * 7 + q * 3) % 5 - (0 if dtype == torch.uint8 else 2)
            return v.reshape(3, 5, 7).to(dtype)
        every = torch.stack([vals(q) for q in range(n)])
        if dtype in (torch.uint8, torch.int16):
            try:
                hvd.allreduce(vals(r), op=hvd.Max)
            except TypeError:
                continue
            raise AssertionError("allreduce of %s did not raise TypeError" % dtype)
        expect("allreduce Min %s" % dtype, hvd.allreduce(vals(r), op=hvd.Min), every.min(0).values)
        expect("allreduce Max %s" % dtype, hvd.allreduce(vals(r), op=hvd.Max), every.max(0).values)
        ones = torch.where(every == 0, torch.ones_like(every), every)
        expect("allreduce Product %s" % dtype, hvd.allreduce(ones[r], op=hvd.Product),
               ones.double().prod(0).to(dtype))
    # torch.minimum's rules for NaN and signed zeros.
    special = torch.tensor([float("nan"), -0.0, 0.0, 1.0]) if r == 0 else \
        torch.tensor([1.0, 0.0, -0.0, float("nan")])
    got = hvd.allreduce(special, op=hvd.Min)
    assert torch.isnan(got[0]) and torch.isnan(got[3]) and n > 1, got
    assert torch.signbit(got[1]) and torch.signbit(got[2]), got
    got = hvd.allreduce(special, op=hvd.Max)
    assert not torch.signbit(got[1]) and not torch.signbit(got[2]), got
    # The async forms do not wait for the other ranks: rank 0 starts an
    # allgather and an alltoall before a barrier that the others enter
    # first.  A second collective under a name in flight is a ValueError,
    # as in Horovod, and the first still completes.
    rows = torch.full((r + 1, 2), r)
    if r == 0:
        h1 = hvd.allgather_async(rows, name="early")
        h2 = hvd.alltoall_async(torch.arange(n) + 10 * r, name="early.a2a")
        hvd.allreduce_async(torch.ones(3), name="busy")
        for start in (lambda: hvd.allgather_async(rows, name="early"),
                      lambda: hvd.allreduce_async(torch.ones(3), name="busy")):
            try:
                start()
            except ValueError:
                continue
            raise AssertionError("a second collective of one name in flight did not raise")
        hvd.barrier()
    else:
        hvd.barrier()
        h1 = hvd.allgather_async(rows, name="early")
        h2 = hvd.alltoall_async(torch.arange(n) + 10 * r, name="early.a2a")
        hvd.allreduce_async(torch.ones(3), name="busy")
        # Rank 0 starts "busy2" only after the next barrier: in flight here.
        hvd.allreduce_async(torch.ones(3), name="busy2")
        try:
            hvd.allreduce_async(torch.ones(3), name="busy2")
        except ValueError:
            pass
        else:
            raise AssertionError("a second allreduce named 'busy2' in flight did not raise")
    hvd.barrier()
    if r == 0:
        hvd.allreduce_async(torch.ones(3), name="busy2")
    expect("allgather_async before a barrier", hvd.synchronize(h1),
           torch.cat([torch.full((q + 1, 2), q) for q in range(n)]))
    expect("alltoall_async before a barrier", hvd.synchronize(h2)[0],
           torch.tensor([10 * q + r for q in range(n)]))
    try:
        hvd.allreduce(torch.ones(2), op=hvd.Adasum)
    except NotImplementedError:
        pass
    else:
        raise AssertionError("Adasum did not raise NotImplementedError")
    more(r, n)
    print("rank %d: horovod api ok" % r, flush=True)


def repeated_layouts(r, n):
    """Allgathers whose layout repeats start before the shapes' exchange
    (_horovod's _speculate); every kind of change after a run of repeats
    still gives every rank the right result: one rank's rows, the
    trailing dimensions at the same element count, the dtype (also one
    the C library widens), and a rank that speculates while another
    cannot (its last call on the slot still in flight).  Then an error
    after repeats: every rank raises, and the next call works."""
    def want(i, rows, cols, dtype):
        return torch.cat([torch.full((rows[q], cols), (i % 12) * 10 + q, dtype=dtype)
                          for q in range(n)])

    def mine(i, rows, cols, dtype):
        return torch.full((rows[r], cols), (i % 12) * 10 + r, dtype=dtype)

    f32, same = torch.float32, [2] * n
    plan = [(same, 3, f32)] * 6
    plan += [([2 + (q == n - 1) for q in range(n)], 3, f32)] + [(same, 3, f32)] * 5
    plan += [([3] * n, 2, f32)] * 6                 # 6 elements a rank, as before
    plan += [([3] * n, 2, torch.float64)] * 6
    plan += [([3] * n, 2, torch.int8)] * 6
    from unisum._horovod import slots as _horovod
    counts = dict(_horovod._spec_counts)
    for i, (rows, cols, dtype) in enumerate(plan):
        expect("allgather %d of repeated layouts" % i, hvd.allgather(mine(i, rows, cols, dtype)),
               want(i, rows, cols, dtype))
    started = _horovod._spec_counts["started"] - counts["started"]
    held = _horovod._spec_counts["held"] - counts["held"]
    if hvd.local_size() == 1:   # else it never speculates (_speculate)
        # A call speculates when its slot's last two calls had one
        # layout: in each run of 6 the 5th and 6th do, and held; after
        # each of the 4 changes the first two did, in vain.  (20 and 11
        # after the calls above, whose layouts repeat too.)
        assert held >= 5 * 2 and started - held >= 4 * 2, (started, held)
    # Rank 0 keeps its last call on each slot in flight (unsynchronized):
    # it cannot speculate, the others can; then a layout change.  Only
    # with one worker a machine: the workers of one machine must start
    # their operations in one order (their local reduce takes them so), and
    # a stage starts when synchronize() runs it, so they must synchronize
    # alike (a limit of the plugin).
    plan = [(same, 3, f32)] * 6 + [([1 + q for q in range(n)], 3, f32)] + [(same, 3, f32)] * 3
    hs = []
    for i, (rows, cols, dtype) in enumerate(plan if hvd.local_size() == 1 else []):
        hs.append(hvd.allgather_async(mine(i, rows, cols, dtype)))
        if r != 0 or i % 3 == 0:
            for j, h in enumerate(hs):
                if h is not None:
                    expect("allgather %d, some ranks speculating" % j, hvd.synchronize(h),
                           want(j, *plan[j]))
                    hs[j] = None
    for j, h in enumerate(hs):
        if h is not None:
            expect("allgather %d, some ranks speculating" % j, hvd.synchronize(h), want(j, *plan[j]))
    if hvd.local_size() == 1:
        # poll() waits for a call's exchange, never for its data: rank 0
        # speculates on a layout that does not hold, polls, and enters a
        # barrier; the others, which cannot speculate (their last call on
        # that slot unsynchronized), enter the barrier before their stage.
        hs = [hvd.allgather_async(mine(i, same, 3, f32)) for i in range(8)]
        for i, h in enumerate(hs):
            if r == 0 or i != 6:
                expect("allgather %d before a poll" % i, hvd.synchronize(h), want(i, same, 3, f32))
        plan = ([2 + q for q in range(n)], 3, f32)
        before = _horovod._spec_counts["started"]
        h = hvd.allgather_async(mine(8, *plan))
        if r == 0:
            assert _horovod._spec_counts["started"] == before + 1, "call 8 did not speculate"
            hvd.poll(h)
        hvd.barrier()
        expect("allgather after a poll and a barrier", hvd.synchronize(h), want(8, *plan))
        if r != 0:
            expect("allgather 6 before a poll", hvd.synchronize(hs[6]), want(6, same, 3, f32))
    for i in range(6):
        expect("allgather %d before an error" % i, hvd.allgather(mine(i, same, 3, f32)),
               want(i, same, 3, f32))
    try:
        hvd.allgather(mine(0, same, 3 if r else 4, f32))
    except hvd.HorovodInternalError:
        pass
    else:
        raise AssertionError("allgathers of different trailing dimensions did not raise")
    expect("allgather after an error", hvd.allgather(mine(1, same, 3, f32)), want(1, same, 3, f32))


def refused_on_one_rank(r, n):
    """The last rank's own input is refused while the others' is fine: a
    tensor of no dimensions (also one that requires grad), a complex
    dtype, alltoall splits that do not add up or are not counts, a
    refused element of a grouped_reducescatter, an allgather in a process
    set.  Every rank's call fails within 5 s, the last rank's with its own
    error, the others' naming it (by its global rank), and the next calls
    stay paired (before, the last rank raised alone as it called, and its
    next call met the others' refused one: an allgather returned the
    wrong call's rows, a reducescatter summed two calls' tensors)."""
    last = n - 1
    rows = torch.full((2, 3), float(r))
    want = torch.cat([torch.full((2, 3), float(q)) for q in range(n)])

    def fails(what, call, named="rank %d" % last):
        t0 = time.monotonic()
        try:
            call()
        except (ValueError, TypeError) as e:
            assert r == last, "rank %d: %s: %r" % (r, what, e)
        except hvd.HorovodInternalError as e:
            assert r != last and named in str(e), "rank %d: %s: %r" % (r, what, e)
        else:
            raise AssertionError("rank %d: a refused %s did not raise" % (r, what))
        took = time.monotonic() - t0
        assert took < 5, "rank %d: %s took %.1f s" % (r, what, took)

    fine = torch.ones(n, 3)
    cases = [
        ("allgather of a 0-d tensor", lambda: hvd.allgather(torch.tensor(5.0) if r == last else rows)),
        ("allgather of complex rows",
         lambda: hvd.allgather(rows.to(torch.complex64) if r == last else rows)),
        ("allgather of a 0-d tensor that requires grad",
         lambda: hvd.allgather(torch.tensor(5.0, requires_grad=True) if r == last
                               else rows.clone().requires_grad_())),
        ("alltoall of a 0-d tensor", lambda: hvd.alltoall(torch.tensor(5.0) if r == last else fine)),
        ("alltoall of complex rows",
         lambda: hvd.alltoall(fine.to(torch.complex64) if r == last else fine, [1] * n)),
        ("alltoall with splits that do not add up",
         lambda: hvd.alltoall(fine, [2] * n if r == last else [1] * n)),
        ("alltoall with splits that are not counts",
         lambda: hvd.alltoall(fine, [1, None] + [1] * (n - 2) if r == last else [1] * n)),
        ("alltoall with a float splits tensor",
         lambda: hvd.alltoall(fine, torch.tensor([float("inf")] + [1.0] * (n - 1)) if r == last
                              else [1] * n)),
        ("alltoall with a split of inf",
         lambda: hvd.alltoall(fine, [float("inf")] + [1.0] * (n - 1) if r == last else [1] * n)),
    ]
    for what, call in cases:
        fails(what, call)
        expect("allgather after a refused %s" % what, hvd.allgather(rows), want)
    # reducescatter: no exchange; the refused rank's declaration of that
    # call's tensor makes the scheduler refuse it on every rank.
    rs_want = torch.full((1, 2), float(n * (n + 1) // 2))
    for bad in (torch.tensor(5.0), torch.ones(n, 2).to(torch.int8)):
        fails("reducescatter", lambda: hvd.reducescatter(bad if r == last else torch.ones(n, 2),
                                                         op=hvd.Sum), "worker %d" % last)
        expect("reducescatter after a refused one",
               hvd.reducescatter(torch.full((n, 2), float(r + 1)), op=hvd.Sum), rs_want)
    # A grouped_reducescatter runs every element, also after a refused one.
    group = [torch.ones(n, 2), torch.tensor(5.0) if r == last else torch.ones(n, 2),
             torch.full((n, 2), 7.0)]
    if r == last:
        time.sleep(0.3)     # the others' whole group is in flight by then
    fails("grouped_reducescatter", lambda: hvd.grouped_reducescatter(group, op=hvd.Sum),
          "worker %d" % last)
    for i in range(3):
        expect("reducescatter %d after a refused grouped one" % i,
               hvd.reducescatter(torch.full((n, 2), float(10 * i + r + 1)), op=hvd.Sum),
               torch.full((1, 2), float(10 * i * n + n * (n + 1) // 2)))
    if n >= 3:
        # In a process set of the first and the last rank: the last is
        # named by its rank in the job.
        pair = hvd.add_process_set([0, last])
        if r in (0, last):
            fails("allgather in a process set",
                  lambda: hvd.allgather(torch.tensor(5.0) if r == last else rows,
                                        process_set=pair))
            expect("allgather in a process set after a refused one",
                   hvd.allgather(rows, process_set=pair), torch.cat([want[:2], want[-2:]]))
        hvd.remove_process_set(pair)


def more(r, n):
    """SyncBatchNorm against torch's BatchNorm1d on the whole batch,
    sparse_allreduce_async, the timeline API and BytePS's last names."""
    torch.manual_seed(7)
    batch = torch.randn(2 * n, 4, 3, dtype=torch.float64)     # the same on every rank
    mine = batch[2 * r:2 * r + 2].clone().requires_grad_()
    whole = batch.clone().requires_grad_()
    sync_bn = hvd.SyncBatchNorm(4).double()
    bn = torch.nn.BatchNorm1d(4).double()
    out, ref = sync_bn(mine), bn(whole)
    assert torch.allclose(out, ref[2 * r:2 * r + 2], atol=1e-9), (out, ref)
    assert torch.allclose(sync_bn.running_mean, bn.running_mean, atol=1e-9)
    assert torch.allclose(sync_bn.running_var, bn.running_var, atol=1e-9)
    weights = torch.arange(float(whole.numel()), dtype=torch.float64).reshape(whole.shape)
    (out * weights[2 * r:2 * r + 2]).sum().backward()
    (ref * weights).sum().backward()
    assert torch.allclose(mine.grad, whole.grad[2 * r:2 * r + 2], atol=1e-9), (mine.grad,)
    assert torch.allclose(hvd.allreduce(sync_bn.weight.grad, op=hvd.Sum), bn.weight.grad,
                          atol=1e-9)
    sync_bn.eval()
    assert torch.allclose(sync_bn(mine.detach()), bn.eval()(whole.detach())[2 * r:2 * r + 2],
                          atol=1e-9)
    # sparse_allreduce_async: rank q has q + 1 at (q, q), the sum of the
    # dense tensors comes back.
    dense = torch.zeros(n, 3)
    dense[r, r % 3] = r + 1.0
    got = hvd.sparse_allreduce_async(dense.to_sparse(), name="sparse", op=hvd.Sum)()
    want = torch.zeros(n, 3)
    for q in range(n):
        want[q, q % 3] = q + 1.0
    expect("sparse_allreduce_async", got.to_dense(), want)
    # The timeline: started and stopped from code, it holds the allreduce.
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), "timeline.%d.%d.json" % (os.getpid(), r))
    hvd.start_timeline(path)
    hvd.allreduce(torch.ones(5), name="timed.tensor")
    hvd.stop_timeline()
    with open(path) as f:
        text = f.read()
    os.unlink(path)
    assert "timed.tensor" in text and ('"PUSH"' in text or '"LOCAL_REDUCE"' in text), text[:400]
    try:
        hvd.stop_timeline()
    except hvd.UnisumError:
        pass
    else:
        raise AssertionError("stop_timeline without a timeline did not raise")
    # BytePS: push_pull(version=, compression=), byteps_push_pull,
    # suspend and resume.
    x = torch.full((6,), float(r + 1))
    expect("push_pull fp16", hvd.push_pull(x, False, "bps.c", 0, 1, hvd.Compression.fp16),
           torch.full((6,), float(n * (n + 1) // 2)))
    expect("byteps_push_pull", hvd.byteps_push_pull(x, name="bps.raw", is_average=False),
           torch.full((6,), float(n * (n + 1) // 2)))
    # BytePS's submodules: ops (with the group-sync count of its DDP) and
    # compression.
    import unisum.torch.compression as bps_compression
    import unisum.torch.ops as bps_ops
    assert bps_compression.Compression.fp16 is hvd.Compression.fp16
    assert issubclass(bps_compression.FP16Compressor, bps_compression.Compressor)
    assert bps_ops.push_pull is hvd.push_pull and bps_ops.poll is hvd.poll
    assert bps_ops.byteps_torch_set_num_grads(2) == 0
    group = [torch.full((3,), float(r + k)) for k in range(3)]
    counts = []
    for k, t in enumerate(group):
        h, c = bps_ops.push_pull_group_sync_inplace(t, average=False, name="bps.group.%d" % k)
        counts.append(c)
        bps_ops.synchronize(h)
        expect("push_pull_group_sync_inplace", t, torch.full((3,), float(n * (n - 1) // 2 + n * k)))
    assert counts == [1, 2, 1], counts
    machines = hvd.cross_size()
    hvd.suspend()
    assert not hvd.is_initialized()
    hvd.resume(num_workers=machines)
    expect("after resume", hvd.push_pull(torch.ones(2), average=False), torch.full((2,), float(n)))


if __name__ == "__main__":
    main()
