"""CUDA tensors in unisum.torch (issue 22): run by `scripts/gpu-check.sh`
on a machine with a GPU, and by `make test` everywhere else, where each
test reports SKIPPED with the reason (conftest.py lets that skip through
as root: no package installs a GPU)."""

import os

import pytest
import torch

from conftest import check_launch, worker_lines

NO_CUDA = "needs a CUDA device: torch.cuda.is_available() is False on this machine"
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA)

CHECKS = ("cuda sums", "cuda in flight", "cuda mixed", "cuda broadcasts", "cuda training")


@pytest.mark.parametrize("nworkers", [2, 3])
@pytest.mark.parametrize("machines", ["servers", "one-machine"])
def test_cuda_tensors(nworkers, machines):
    """Every worker shares the one GPU (several processes per GPU, as on the
    lent machine): every check of workers/cuda_ops.py passes on every rank,
    through the servers (--local-size 1) and through the shared-memory
    local reduce; 64 MiB tensors through the servers."""
    args = ["--big"] if machines == "servers" else []
    # scripts/gpu-check.sh sets a shorter bound (its time on the device is
    # counted).
    limit = int(os.environ.get("UNISUM_CUDA_TEST_TIMEOUT", "600"))
    out, _ = check_launch(nworkers, 1, "cuda_ops.py", *args, timeout=limit,
                          local_size=1 if machines == "servers" else None)
    for rank in range(nworkers):
        lines = worker_lines(out, rank)
        for what in CHECKS:
            assert "rank %d: %s ok" % (rank, what) in lines, out[-4000:]

