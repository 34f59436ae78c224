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
