"""Worker: push_pull of every supported dtype, non-contiguous tensors,
asynchronous handles, and the errors for unsupported inputs.

    dtypes.py OUTDIR

Inputs come from common.dtype_input / common.noncontig_base, so the test
computes the exact expected results itself.  Writes OUTDIR/rank<r>.pt.
"""

import sys
import time

import torch

import common
import unisum
import unisum.torch as us


def wait_by_polling(handle, seconds=60):
    """poll() until True; returns how many polls said False."""
    deadline = time.monotonic() + seconds
    false_polls = 0
    while not us.poll(handle):
        false_polls += 1
        if time.monotonic() > deadline:
            raise RuntimeError("poll() never returned True")
        time.sleep(0.001)
    return false_polls


def main():
    outdir = sys.argv[1]
    torch.set_num_threads(1)
    us.init()
    rank, size = us.rank(), us.size()
    res = {"rank": rank, "size": size, "dtypes": {}}

    for name in common.DTYPES:
        t = common.dtype_input(name, rank)
        orig = t.clone()
        r = {}
        r["sum"] = us.push_pull(t, average=False, name="sum." + name)
        r["avg_default"] = us.push_pull(t, name="avg." + name)       # average=True by default
        r["input_unchanged"] = torch.equal(t, orig)
        a = t.clone()
        r["inplace_returns_same_object"] = us.push_pull_(a, average=True, name="avg_." + name) is a
        r["avg_inplace"] = a
        r["sum_unnamed"] = us.push_pull(t, average=False)
        r["out_dtype"] = str(r["sum"].dtype)

        # Non-contiguous, out of place: the result has the view's shape and values.
        base = common.noncontig_base(name, rank)
        view = common.noncontig_view(base)
        assert not view.is_contiguous()
        before = base.clone()
        r["nc_out"] = us.push_pull(view, average=False, name="nc_out." + name)
        r["nc_out_base_unchanged"] = torch.equal(base, before)
        # Non-contiguous, in place: only the view's elements change.
        base2 = common.noncontig_base(name, rank)
        us.push_pull_(common.noncontig_view(base2), average=True, name="nc_in." + name)
        r["nc_in_base"] = base2
        # A transposed tensor, in place.
        base3 = common.noncontig_base(name, rank)
        tr = base3.t()
        assert not tr.is_contiguous()
        us.push_pull_(tr, average=False, name="nc_t." + name)
        r["nc_t_base"] = base3
        res["dtypes"][name] = r

    # Asynchronous operations: several in flight at once, finished out of order.
    a = common.dtype_input("float32", rank)
    b = common.dtype_input("int64", rank).clone()
    base = common.noncontig_base("float64", rank)
    h_a = us.push_pull_async(a, average=False, name="async.a")
    h_b = us.push_pull_async_inplace(b, average=True, name="async.b")
    h_c = us.push_pull_async_inplace(common.noncontig_view(base), average=False, name="async.c")
    h_d = us.push_pull_async(common.dtype_input("bfloat16", rank))    # unnamed, averaged
    asyn = {}
    wait_by_polling(h_b)
    asyn["poll_true_again"] = us.poll(h_b)      # stays True until synchronize()
    asyn["b_sync_returns_input"] = us.synchronize(h_b) is b
    asyn["b"] = b
    asyn["d"] = us.synchronize(h_d)
    wait_by_polling(h_c)
    us.synchronize(h_c)
    asyn["c_base"] = base
    asyn["a"] = us.synchronize(h_a)
    asyn["a_input_unchanged"] = torch.equal(a, common.dtype_input("float32", rank))
    try:
        us.synchronize(h_a)
        asyn["resync_error"] = None
    except unisum.UnisumError as e:
        asyn["resync_error"] = str(e)
    res["async"] = asyn

    # Unsupported inputs: TypeError, raised before anything is sent, so no
    # other rank is kept waiting and the job goes on.
    errors = {}
    for label, bad in [("uint8", torch.ones(4, dtype=torch.uint8)),
                       ("bool", torch.ones(4, dtype=torch.bool)),
                       ("int16", torch.ones(4, dtype=torch.int16)),
                       ("complex64", torch.ones(4, dtype=torch.complex64)),
                       ("list", [1.0, 2.0])]:
        for how in ("push_pull", "push_pull_", "push_pull_async"):
            key = "%s/%s" % (label, how)
            try:
                getattr(us, how)(bad, name="bad." + label)
                errors[key] = None
            except TypeError as e:
                errors[key] = ("TypeError", str(e))
            except Exception as e:
                errors[key] = (type(e).__name__, str(e))
        try:
            us.push_pull(bad)            # unnamed: must not leak a slot either
            errors[label + "/unnamed"] = None
        except Exception as e:
            errors[label + "/unnamed"] = (type(e).__name__, str(e))
    res["errors"] = errors
    # The job is healthy afterwards.
    res["after_errors"] = us.push_pull(torch.full((3,), float(rank)), average=False)

    common.save(outdir, rank, res)
    us.barrier()
    us.shutdown()


if __name__ == "__main__":
    main()
