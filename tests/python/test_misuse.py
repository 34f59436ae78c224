"""Misuse that Horovod and BytePS users make every day fails at once on
every rank: never a wrong result, never a hang (issue 14).

The cases run workers/misuse.py under `unisum launch` on both paths: every
tensor through the servers (--local-size 1), and one machine whose workers
sum in shared memory (the launcher's default).  Every rank's results are
checked.  The cases that leave the job running share one launch per path
(the disagreements, skip_synchronize, then init after shutdown).
"""

import json

import pytest

import common                      # tests/python/workers/common.py (via conftest)
from unisum import _capi
from conftest import describe, run_launch

PATHS = [pytest.param(1, id="servers"), pytest.param(None, id="one-machine")]


@pytest.fixture(scope="module")
def misuse(tmp_path_factory):
    """misuse(local_size) -> (rc, out, err, per-rank results) of one launch of
    misuse.py disagree skip_sync reinit on that path, made once."""
    cache = {}

    def get(local_size):
        if local_size not in cache:
            outdir = tmp_path_factory.mktemp("misuse")
            rc, out, err = run_launch(2, 1, "misuse.py", outdir, "disagree", "skip_sync", "reinit",
                                      timeout=60, local_size=local_size)
            cache[local_size] = (rc, out, err, results(outdir, rc, out, err))
        return cache[local_size]
    return get


def results(tmp_path, rc, out, err, nworkers=2):
    found = []
    for r in range(nworkers):
        try:
            found.append(common.read_json(tmp_path, r))
        except FileNotFoundError:
            pytest.fail("rank %d wrote no result: %s" % (r, describe(rc, out, err)))
    return found


@pytest.mark.parametrize("local_size", PATHS)
def test_disagreements_fail_every_rank_at_once(misuse, local_size):
    """Ranks that disagree on a broadcast's root (broadcast_parameters with
    root_rank=rank), on average against sum, on an unnamed tensor's shape
    or dtype, or on a model's shapes (broadcast_parameters) each raise
    UnisumError (UNISUM_EMISMATCH) on every rank within 2 s, naming the
    tensor and both values; no tensor is written; then the job goes on."""
    rc, out, err, found = misuse(local_size)
    both = {
        "root": ("a broadcast from root 0", "a broadcast from root 1"),
        "op": ("an average", "a sum"),
        "shape": ("float32[17]", "float32[18]"),
        "dtype": ("float32[5]", "float64[5]"),
        "model": ("float32[3]", "float32[4]"),
    }
    for res in found:
        for case, values in both.items():
            got = res[case]
            what = "rank %d, %s: %s" % (res["rank"], case, json.dumps(got))
            assert got["error"] == "UnisumError", what
            assert got["code"] == _capi.EMISMATCH, what
            assert "tensor '" in got["message"], what
            for v in values:
                assert v in got["message"], what
            assert got["seconds"] < 2.0, what
            assert got["untouched"], what
        assert res["healthy"] == [3.0] * 5, json.dumps(res)
    assert rc == 0, describe(rc, out, err)


@pytest.mark.parametrize("local_size", PATHS)
def test_sigint_reaches_a_rank_blocked_in_a_wait(tmp_path, local_size):
    """Rank 1 waits in a barrier, a push_pull and a broadcast that rank 0
    has not joined; SIGINT raises KeyboardInterrupt there within 1 s.  The
    operation stays in flight: once rank 0 joins, the barrier and the
    push_pull complete with the right sum, and the broadcast writes root's
    value."""
    rc, out, err = run_launch(2, 1, "misuse.py", tmp_path, "sigint", timeout=90,
                              local_size=local_size)
    assert rc == 0, describe(rc, out, err)
    sender, blocked = results(tmp_path, rc, out, err)
    for what in ("barrier", "push_pull", "broadcast"):
        assert blocked[what]["interrupted"], json.dumps(blocked)
        delay = blocked[what]["caught"] - sender[what]["sent"]
        assert 0 <= delay < 1.0, "%s: KeyboardInterrupt %.3f s after SIGINT" % (what, delay)
    assert sender["push_pull"]["sum"] == blocked["push_pull"]["sum"] == [2.0] * 6
    assert sender["param"] == blocked["param"] == [7.0] * 8


# speculated: through the servers only, where allgathers speculate (with
# several workers a machine they never do, and its ranks synchronize
# differently, which the workers of one machine must not).
@pytest.mark.parametrize("mode,local_size", [
    pytest.param(m, p.values[0], id="%s-%s" % (p.id, m))
    for m in ("push_pull", "allgather", "completed", "stage", "join", "speculated")
    for p in PATHS
    if m != "speculated" or p.values[0] == 1])
def test_interrupt_as_an_operation_starts(mode, local_size):
    """Ctrl-C's KeyboardInterrupt right as the C call that starts an
    operation returns (before its handle is kept): the operation stays on
    record, its result buffer held (not handed to a new result while the
    C library writes into it), and synchronize() of an allgather so
    interrupted returns its result when called again; so does one
    interrupted while a speculation that did not hold ends (speculated).
    A wait interrupted as it ends keeps the C library's answer: the
    retried synchronize() returns the result, a retried barrier() is the
    same barrier (completed).  A SIGINT inside an allgather's second
    stage comes once its rows have started (stage); one while join()
    blocks comes once it has ended, and the next join() is that one
    (join)."""
    rc, out, err = run_launch(2, 1, "interrupted.py", mode, timeout=60, local_size=local_size)
    assert rc == 0, describe(rc, out, err)
    for r in range(2):
        assert "rank %d: interrupted %s ok" % (r, mode) in out, describe(rc, out, err)


def test_interrupted_answers_end_with_the_membership():
    """Elastic: a wait and a barrier interrupted as they ended, neither
    called again, then rejoin(): the new membership's operations, which
    the C library numbers afresh, get their own answers (not the kept
    ones), and its first barrier() is a barrier."""
    rc, out, err = run_launch(2, 1, "interrupted.py", "rejoin", timeout=60, local_size=1,
                              elastic=True)
    assert rc == 0, describe(rc, out, err)
    for r in range(2):
        assert "rank %d: interrupted rejoin ok" % r in out, describe(rc, out, err)


@pytest.mark.parametrize("local_size", PATHS)
def test_init_after_shutdown_resumes_the_job(misuse, local_size):
    """init(), shutdown(), init(), as Horovod's own tests do: shutdown()
    only stops using the job (is_initialized() is False, calls raise), and
    the second init() resumes it at once with the same rank and size; a
    push_pull after it sums right, and the process leaves at exit."""
    rc, out, err, found = misuse(local_size)
    assert rc == 0, describe(rc, out, err)
    for res in found:
        got = res["reinit"]
        assert got["error"] is None, json.dumps(got)
        assert got["seconds"] < 1.0, json.dumps(got)
        assert res["after_shutdown"] == {"initialized": False, "rank_raises": True}, \
            json.dumps(res)
        assert res["after_reinit"] == {"initialized": True, "rank": res["rank"],
                                       "size": res["size"], "sum": [3.0] * 4}, json.dumps(res)


@pytest.mark.parametrize("local_size", PATHS)
def test_step_after_synchronize_warns_and_skip_synchronize(misuse, local_size):
    """step() after synchronize() warns and sums every gradient again (2
    push_pulls from backward, 2 from step, as Horovod); with
    skip_synchronize() it sums nothing more; a plain step() sums each
    gradient once.  The ranks end with equal parameters."""
    rc, out, err, found = misuse(local_size)
    assert rc == 0, describe(rc, out, err)
    for res in found:
        again = res["synchronize_then_step"]
        assert again["push_pulls"] == 4, json.dumps(res)
        assert len(again["warnings"]) == 1 and "skip_synchronize" in again["warnings"][0], \
            json.dumps(again)
        assert res["skip_synchronize"] == {"push_pulls": 2, "warnings": []}, json.dumps(res)
        assert res["plain_step"] == {"push_pulls": 2, "warnings": []}, json.dumps(res)
    assert found[0]["params"] == found[1]["params"]


@pytest.mark.parametrize("local_size", PATHS)
def test_launcher_names_the_worker_whose_python_raised(tmp_path, local_size):
    """Rank 1 raises ValueError while rank 0 waits in a barrier: the
    launcher's summary names worker 1, not the server or rank 0 that exit
    on the news (a race the kernel may report in either order)."""
    rc, out, err = run_launch(2, 1, "misuse.py", tmp_path, "raise", timeout=60,
                              local_size=local_size)
    assert rc == 1, describe(rc, out, err)
    first = [l for l in err.splitlines()
             if l.startswith("unisum launch: ") and l.endswith("stopping the job")]
    assert first and first[0].startswith("unisum launch: worker 1 ("), describe(rc, out, err)
