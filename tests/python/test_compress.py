"""Compressed push_pull end to end (issue 19): workers compress, servers
decompress, sum, compress once, and every worker decompresses the same
bytes.  The job's results are checked bit for bit against
workers/compress_ref.py, a plain numpy model of the same two-level scheme
(momentum and error feedback on the workers' side and the servers'),
with 3 machines of one worker and with 2 machines of 2 workers (the
machine's sum is compressed once, by its root)."""

import os

import numpy as np
import pytest

import compress_ref                # tests/python/workers/compress_ref.py (via conftest)
from conftest import check_launch, worker_env

ROUNDS = 4


def run_job(tmp_path, nworkers, local_size):
    env = worker_env({"UNISUM_PARTITION_BYTES": str(compress_ref.PARTITION_BYTES),
                      "UNISUM_PLACEMENT": "even", "UNISUM_AUTOTUNE": "0"})
    out = check_launch(nworkers, 2, "compressed.py", tmp_path, ROUNDS, env=env,
                       local_size=local_size)
    return out, [np.load(os.path.join(tmp_path, "rank%d.npz" % r)) for r in range(nworkers)]


@pytest.mark.parametrize("nworkers,local_size", [(3, 1), (4, 2)])
def test_two_level_scheme_matches_reference(tmp_path, nworkers, local_size):
    _, got = run_job(tmp_path, nworkers, local_size)
    for name in compress_ref.TENSORS:
        for r in range(1, nworkers):
            # Every worker decodes the same bytes: bitwise equal results.
            assert np.array_equal(got[r][name].view(np.uint32), got[0][name].view(np.uint32)), \
                "%s: rank %d differs from rank 0" % (name, r)
    for name in compress_ref.REFERENCED:
        want = compress_ref.expected(name, nworkers, local_size, ROUNDS)
        have = got[0][name]
        bad = np.nonzero(want.view(np.uint32) != have.view(np.uint32))
        assert bad[0].size == 0, "%s: %d of %d elements differ from the reference, first at " \
            "round %d element %d: %r != %r" % (name, bad[0].size, want.size, bad[0][0],
                                              bad[1][0], have[bad][0], want[bad][0])
    # Dithering is unbiased with error feedback: over the rounds its sums
    # track the true ones (each element's error is at most one level of the
    # partition's max norm, and what one round leaves, the next sends).
    spec, count, _ = compress_ref.TENSORS["c.dither"]
    true = sum(compress_ref.worker_input("c.dither", rk, r, count)
               for rk in range(nworkers) for r in range(ROUNDS))
    sent = got[0]["c.dither"].sum(axis=0)
    assert np.max(np.abs(sent - true)) < 2.0 * nworkers, np.max(np.abs(sent - true))
    # The bytes on the wire are the codecs' (raw: 6.6 times as many for
    # this mix); a machine's root pushes and pulls them.
    raw = sum(c * 4 for _, c, _ in compress_ref.TENSORS.values()) * ROUNDS
    pushed, pulled = (int(v) for v in got[0]["wire_bytes"])
    assert 0 < pushed < raw / 5 and 0 < pulled < raw / 5, (pushed, pulled, raw)


def simulate_training(spec, size):
    """compressed_train.py's training in one process: each rank's gradient
    through the two-level scheme of compress_ref, averaged, then SGD."""
    import torch
    import common
    s = compress_ref.parse(spec)
    x, y = common.make_data()
    models = [common.make_mlp() for _ in range(size)]
    opts = [torch.optim.SGD(m.parameters(), lr=compress_ref_lr()) for m in models]
    names = [n for n, _ in models[0].named_parameters()]
    wstate = {(r, n): None for r in range(size) for n in names}
    sstate = {n: None for n in names}
    history = []
    for step in range(common.STEPS):
        grads = []
        for r, m in enumerate(models):
            m.zero_grad()
            xs, ys = common.shard(x, y, step, r, size)
            common.loss_fn(m, xs, ys).backward()
            grads.append({n: p.grad.detach().reshape(-1).numpy().copy()
                          for n, p in m.named_parameters()})
        for n in names:
            key = compress_ref.tensor_key("gradient." + n)
            seed = compress_ref.shared_seed(s["seed"], key, step)
            acc = None
            for r in range(size):
                if wstate[(r, n)] is None:
                    wstate[(r, n)] = compress_ref.State(s, grads[r][n].size, True)
                sent = wstate[(r, n)].send(grads[r][n], seed)
                acc = sent.copy() if acc is None else (acc + sent).astype(np.float32)
            if sstate[n] is None:
                sstate[n] = compress_ref.State(s, acc.size, False)
            avg = (sstate[n].send(acc, seed) / np.float32(size)).astype(np.float32)
            for m in models:
                p = dict(m.named_parameters())[n]
                p.grad = torch.from_numpy(avg.copy()).reshape(p.shape)
        for o in opts:
            o.step()
        history.append([p.detach().clone() for p in models[0].parameters()])
    return history


def compress_ref_lr():
    import compressed_train
    return compressed_train.LR


@pytest.mark.parametrize("params", [
    {"compressor": "onebit", "ef": "vanilla", "momentum": "nesterov", "momentum_mu": 0.9},
    {"compressor": "topk", "k": 0.25, "ef": "vanilla"},
])
def test_distributed_optimizer_compression_params(tmp_path, params):
    """DistributedOptimizer(compression_params=BytePS's dict) trains exactly
    as a one-process model of the scheme does, every rank alike, with the
    wire bytes of the codec."""
    import json
    import torch
    import common
    env = worker_env({"UNISUM_MIN_COMPRESS_BYTES": "0", "UNISUM_AUTOTUNE": "0"})
    check_launch(2, 1, "compressed_train.py", tmp_path, json.dumps(params), env=env,
                 local_size=1)
    got = [common.load(tmp_path, r) for r in range(2)]
    spec = "%s,%s" % (params["compressor"], ",".join(
        "%s=%s" % (k, v) for k, v in params.items() if k != "compressor"))
    want = simulate_training(spec.replace("momentum_mu", "mu"), 2)
    for step, (a, b, w) in enumerate(zip(got[0]["params"], got[1]["params"], want)):
        for pa, pb, pw in zip(a, b, w):
            assert torch.equal(pa, pb), "step %d: the ranks differ" % step
            assert torch.equal(pa, pw), "step %d: %r != %r (the model of the scheme)" % (
                step, pa.reshape(-1)[:4], pw.reshape(-1)[:4])
    if params["compressor"] == "onebit":
        raw = sum(p.numel() * 4 for p in got[0]["params"][0]) * common.STEPS
        assert got[0]["stats"]["bytes_pushed"] < raw / 8, (got[0]["stats"], raw)


def test_unknown_compression_key_is_refused():
    from unisum.torch import optimizer as uopt
    with pytest.raises(ValueError, match="unknown key 'bogus'"):
        uopt._compression_spec({"compressor": "onebit", "bogus": 1})
    with pytest.raises(ValueError, match="needs a 'compressor'"):
        uopt._compression_spec({"ef": "vanilla"})
    assert uopt._compression_spec({"ef": "vanilla", "compressor": "onebit", "scaling": True}) == \
        "compressor=onebit,ef=vanilla,scaling=1"


def test_info_lists_the_compressors():
    import subprocess
    from conftest import LAUNCHER
    out = subprocess.run([LAUNCHER, "info"], capture_output=True, text=True, check=True).stdout
    for name in ("onebit", "topk", "randomk", "dithering", "fp16", "bf16", "ef=vanilla|sparse",
                 "UNISUM_MIN_COMPRESS_BYTES"):
        assert name in out, name


def test_join_refuses_a_compressed_tensor_in_flight(tmp_path):
    """A rank that joins while a compressed push_pull is in flight cannot
    contribute zeros through the compressor's state: every rank fails,
    naming the tensor and its spec, and nobody waits forever."""
    from conftest import run_launch, describe
    rc, out, err = run_launch(3, 2, "compressed_join.py", local_size=1, timeout=60)
    assert rc == 0, describe(rc, out, err)
    for r in range(3):
        assert "rank %d: compressed join refused" % r in out, describe(rc, out, err)


def test_python_refuses_a_name_with_another_compression():
    import unisum.torch as us
    from unisum.torch import _core as ucore, ops as uops
    ucore._specs["x.spec"] = "onebit"
    ucore._tensors["x.spec"] = (0, None, 10)
    try:
        with pytest.raises(us.UnisumError, match="compressed 'onebit' and is now used "
                                                 "uncompressed"):
            uops._declared("x.spec", None, 10, 0)
    finally:
        ucore._specs.pop("x.spec")
        ucore._tensors.pop("x.spec")
