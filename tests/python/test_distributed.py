"""torch.distributed's backend "unisum" (unisum.torch.distributed, issue 51).

workers/dist_ops.py runs each case under `unisum launch` (on both paths:
every tensor through the servers, and one machine whose workers sum in
shared memory) or, for the two ways in without the launcher, as processes
started here with torchrun's variables or an explicit init_method; each
rank writes what it saw, checked here.
"""

import os
import socket
import subprocess
import sys

import pytest

import common                      # tests/python/workers/common.py (via conftest)
from conftest import PYTHON, PYTHON_DIR, WORKERS_DIR, describe, run_launch, worker_env

PATHS = [pytest.param(1, id="servers"), pytest.param(None, id="one-machine")]


def launched(tmp_path, nworkers, mode, local_size=1, ok=True, nservers=2, env=None):
    rc, out, err = run_launch(nworkers, nservers, "dist_ops.py", tmp_path, mode, timeout=90,
                              local_size=local_size, env=worker_env(env))
    if ok:
        assert rc == 0, describe(rc, out, err)
    found = []
    for r in range(nworkers):
        try:
            found.append(common.read_json(tmp_path, r))
        except FileNotFoundError:
            found.append(None)
    return found, (rc, out, err)


# The checks dist_ops.py ops makes in a group of every rank (and again,
# prefixed "group ", in a new_group of ranks 0 and 1).
REDUCTIONS = ["all_reduce %s torch.%s" % (op, dt) for op in ("sum", "avg", "min", "max",
                                                               "product")
              for dt in ("float32", "float64", "int64", "int8")
              if op != "avg" or dt.startswith("float")]
CALLS = REDUCTIONS + [
    "all_reduce large", "all_reduce complex", "all_reduce_coalesced", "get_future().then", "broadcast",
    "broadcast bool", "all_gather", "all_gather_into_tensor", "reduce_scatter",
    "reduce_scatter_tensor", "reduce_scatter max", "all_to_all_single uneven",
    "all_to_all_single even", "all_to_all", "scatter", "barrier"]
ROOT_ONLY = ["reduce", "gather"]     # checked on the root (rank 0) alone


def expected(rank, nworkers):
    mine = CALLS + (ROOT_ONLY if rank == 0 else [])
    grouped = ["group " + c for c in mine] if rank in (0, 1) else []
    return sorted(mine + grouped)


@pytest.mark.parametrize("nworkers,local_size", [
    pytest.param(2, 1, id="servers-2"), pytest.param(3, 1, id="servers-3"),
    pytest.param(2, None, id="one-machine-2"), pytest.param(3, None, id="one-machine-3")])
def test_every_call(tmp_path, nworkers, local_size):
    """Every supported call on 2 and 3 ranks, through the servers and on one
    machine, async_op True and False, in the default group and in a
    new_group of a subset; results as gloo gives them."""
    found, _ = launched(tmp_path, nworkers, "ops", local_size)
    for r, res in enumerate(found):
        assert res is not None, "rank %d wrote nothing" % r
        assert sorted(res["passed"]) == expected(r, nworkers), res["passed"]


def test_refusals_name_what_and_the_group_goes_on(tmp_path):
    """send, recv and isend fail at once naming what to use instead;
    ReduceOp.BAND and a complex MAX fail naming the op; then an
    all_reduce still sums."""
    found, _ = launched(tmp_path, 2, "refused")
    for res in found:
        for p2p in ("send", "recv", "isend"):
            assert "point-to-point" in res[p2p]["message"], res
            assert "gloo group" in res[p2p]["message"], res
            assert res[p2p]["seconds"] < 0.5, res
        assert "ReduceOp.BAND is not supported" in res["band"]["message"], res
        assert "complex" in res["complex_max"]["message"], res
        assert res["after"] == [2.0] * 3, res


@pytest.mark.parametrize("nworkers,local_size", [
    pytest.param(3, 1, id="servers-3"), pytest.param(2, None, id="one-machine-2")])
def test_ddp_trains_as_over_gloo(tmp_path, nworkers, local_size):
    """DDP over "unisum" and DDP over gloo, same model, same data, 20
    steps: parameters agree within 1e-6 relative after every step, and
    exactly with integer-valued data; so do find_unused_parameters,
    static_graph and no_sync() accumulation, and DDP over gloo with
    unisum's push_pull hook; every rank ends with the same parameters.
    The compressing hooks (fp16, onebit, topk) train, every rank alike:
    fp16 within 1e-2 of uncompressed, and through the servers none
    exactly uncompressed (on one machine nothing crosses a network, and
    nothing is compressed).
    BytePS's DDP: no_sync() accumulation gives the parameters of one
    backward over the same samples, and those of DDP over gloo."""
    found, _ = launched(tmp_path, nworkers, "ddp", local_size,
                        env={"UNISUM_MIN_COMPRESS_BYTES": "0"})
    for res in found:
        for case in ("float", "unused", "static", "hook"):
            assert len(res[case]) == 20 and max(res[case]) <= 1e-6, (case, res[case])
        assert res["integer"] == [0.0] * 20, res["integer"]
        assert res["hook_integer"] == [0.0] * 20, res["hook_integer"]
        assert res["no_sync"] <= 1e-6, res
        assert res["first"] == found[0]["first"], "ranks ended apart"
        assert res["byteps"]["no_sync"] <= 1e-6 and res["byteps"]["gloo"] <= 1e-6, res["byteps"]
        for codec in ("fp16", "onebit", "topk"):
            assert res[codec]["first"] == found[0][codec]["first"], (codec, "ranks apart")
            if local_size == 1:     # one machine sums in shared memory: nothing to compress
                assert res[codec]["first"] != res["first"], (codec, "not compressed")
        close = [abs(a - b) / abs(b) for a, b in zip(res["fp16"]["first"], res["first"])]
        assert max(close) < 1e-2, close
    for codec in ("fp16", "onebit", "topk"):
        first = sum(r[codec]["losses"][0] for r in found)
        last = sum(r[codec]["losses"][1] for r in found)
        assert last < 0.5 * first, (codec, first, last)


@pytest.mark.parametrize("local_size", PATHS)
def test_shape_mismatch_fails_every_rank(tmp_path, local_size):
    """Ranks that pass different shapes to one all_reduce each raise
    RuntimeError within 2 s naming their own; the next all_reduce sums.
    Small (the fingerprint beside the elements) and large (the
    declaration, which names both).  So do ranks that disagree on the op
    (small and large) and on a broadcast's root."""
    found, _ = launched(tmp_path, 2, "mismatch", local_size)
    for res in found:
        small, large = res["small"], res["large"]
        assert small["message"] is not None and large["message"] is not None, res
        assert "disagree" in small["message"], res
        assert "float32[%d]" % (3 + res["rank"]) in small["message"], res
        assert "float32[1000]" in large["message"] and "float32[1001]" in large["message"], res
        for case in (small, large):
            assert case["seconds"] < 2.0, res
        # Ranks that disagree on the op, or on a broadcast's root, fail too.
        for case in ("op_small", "op_large", "root"):
            assert res[case]["message"] is not None, (case, res)
            assert res[case]["seconds"] < 2.0, (case, res)
        for case in ("op_small", "op_large"):
            assert "a sum" in res[case]["message"] and "a max" in res[case]["message"], res
        assert "root 0" in res["root"]["message"] and "root 1" in res["root"]["message"], res
        assert res["after"] == [2.0, 2.0], res


def test_timeout_fires_and_the_operation_completes(tmp_path):
    """With timeout=2 s, rank 0's wait() for an all_reduce rank 1 joins 4 s
    later raises after 2 s, naming the timeout; the operation completes
    once rank 1 joins, with the right sum."""
    found, _ = launched(tmp_path, 2, "timeout")
    first = found[0]
    assert "timed out after 2.000 s" in first["message"], first
    assert 1.9 <= first["seconds"] < 3.0, first
    assert first["sum"] == found[1]["sum"] == [2.0, 2.0]


def test_timeout_reaches_ddp(tmp_path):
    """DDP's waits are C++'s; with timeout=2 s, rank 0's backward, waiting
    for a bucket rank 1 sends 5 s later, raises naming the timeout."""
    found, _ = launched(tmp_path, 2, "ddp_timeout")
    first = found[0]
    assert first["message"] is not None and "timed out after 2.000 s" in first["message"], first
    assert first["seconds"] < 4.5, first
    assert found[1]["message"] is None, found[1]


def survivors_name_worker_1(found):
    """Ranks 0 and 2 each raised RuntimeError naming worker 1 within 5 s."""
    for r in (0, 2):
        res = found[r]
        assert res is not None and res["message"] is not None, (r, res)
        assert "worker 1" in res["message"], (r, res)
        assert res["seconds"] < 5.0, (r, res)


@pytest.mark.parametrize("local_size", PATHS)
def test_a_dead_rank_is_named(tmp_path, local_size):
    """Of 3 ranks, rank 1 exits while the others wait in an all_reduce:
    each survivor's call raises RuntimeError naming worker 1 within 5 s."""
    found, _ = launched(tmp_path, 3, "dies", local_size, ok=False)
    survivors_name_worker_1(found)


def test_a_dead_rank_is_named_in_ddp(tmp_path):
    """Of 3 ranks, rank 1 exits before its DDP backward: each survivor's
    backward (DDP's waits are C++'s) raises RuntimeError naming worker 1
    within 5 s, and no process crashes."""
    found, (rc, out, err) = launched(tmp_path, 3, "ddp_dies", ok=False)
    assert "SIGSEGV" not in out + err, describe(rc, out, err)
    survivors_name_worker_1(found)


def test_ctrl_c_reaches_wait(tmp_path):
    """SIGINT raises KeyboardInterrupt in a wait() for an all_reduce rank 1
    has not joined, within 1 s; the next wait() returns the right sum."""
    found, _ = launched(tmp_path, 2, "sigint")
    first, second = found
    assert first["interrupted"], first
    assert 0 <= first["caught"] - second["sent"] < 1.0, (first, second)
    assert first["sum"] == second["sum"] == [2.0] * 3


def _free_port():
    """A port free now, chosen as the product's bootstrap chooses its
    scheduler's: below the kernel's ephemeral range where it can, as
    check_sums free-port (one the kernel picked may go to another test's
    socket before the scheduler binds it)."""
    from unisum.torch.distributed import _bootstrap
    return _bootstrap._free_port("127.0.0.1")


def _unlaunched(tmp_path, envs):
    """Runs dist_ops.py ops as one process per environment in `envs`, no
    launcher: the group starts its own scheduler and servers."""
    procs = []
    for extra in envs:
        env = worker_env(extra)
        env["PYTHONPATH"] = os.pathsep.join([PYTHON_DIR, WORKERS_DIR])
        for v in ("UNISUM_LAUNCHED", "UNISUM_SCHEDULER_HOST", "DMLC_PS_ROOT_URI",
                  "UNISUM_TEST_FORKSERVER"):
            env.pop(v, None)
        procs.append(subprocess.Popen(
            [PYTHON, os.path.join(WORKERS_DIR, "dist_ops.py"), str(tmp_path), "ops"], env=env,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True))
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=120)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail("a rank hung:\n" + "\n".join(q.communicate()[0][-2000:] for q in procs))
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out[-3000:]
    for r in range(len(envs)):
        res = common.read_json(tmp_path, r)
        assert sorted(res["passed"]) == expected(r, len(envs)), res["passed"]


def test_torchrun_variables_alone(tmp_path):
    """torchrun's variables, no unisum launch: 4 ranks as 2 machines of 2
    (LOCAL_WORLD_SIZE): rank 0 starts the scheduler, each machine's first
    rank its server; every call works."""
    port = _free_port()
    _unlaunched(tmp_path, [
        {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(r),
         "WORLD_SIZE": "4", "LOCAL_RANK": str(r % 2), "LOCAL_WORLD_SIZE": "2"}
        for r in range(4)])


def test_explicit_init_method(tmp_path):
    """init_method="tcp://...", rank and world_size given, no torchrun
    variables: one rank a machine."""
    port = _free_port()
    _unlaunched(tmp_path, [
        {"DIST_OPS_INIT": "tcp://127.0.0.1:%d" % port, "DIST_OPS_RANK": str(r),
         "DIST_OPS_SIZE": "2"} for r in range(2)])


def test_scheduler_port_taken_first(monkeypatch):
    """Rank 0's scheduler outside the launcher: when the port chosen for it
    is taken before it binds (another socket got there first), it is
    started again on another, and the port returned is the one it listens
    on."""
    from unisum.torch.distributed import _bootstrap
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    ports = [taken.getsockname()[1], _free_port()]
    monkeypatch.setattr(_bootstrap, "_free_port", lambda host: ports.pop(0))
    before = len(_bootstrap._children)
    try:
        port = _bootstrap._start_scheduler("127.0.0.1", {
            "UNISUM_SCHEDULER_HOST": "127.0.0.1", "UNISUM_NUM_WORKER": "1",
            "UNISUM_NUM_SERVER": "1", "UNISUM_SECRET": "s"}, 30.0)
        assert port != taken.getsockname()[1] and not ports
        child = _bootstrap._children[-1]
        assert len(_bootstrap._children) == before + 1 and child.poll() is None
        assert _bootstrap._listens(child.pid, port)
    finally:
        taken.close()
        for child in _bootstrap._children[before:]:
            child.kill()
            child.wait()
        del _bootstrap._children[before:]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
