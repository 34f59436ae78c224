"""Worker: DistributedOptimizer(compression_params=...) training
common.make_mlp() with plain SGD, the momentum and error feedback in the
compressor (BytePS's way).

    compressed_train.py OUTDIR SPEC_JSON

Writes OUTDIR/rank<r>.pt: {"params": [parameters after each step],
"stats": get_stats()}.  Run with UNISUM_MIN_COMPRESS_BYTES=0, so that
every gradient is compressed.
"""

import json
import sys

import torch

import common
import unisum.torch as us

LR = 0.1


def main():
    outdir, params = sys.argv[1], json.loads(sys.argv[2])
    torch.set_num_threads(1)
    us.init()
    rank, size = us.rank(), us.size()
    x, y = common.make_data()
    model = common.make_mlp()
    opt = us.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR),
                                  named_parameters=model.named_parameters(),
                                  compression_params=params)
    history = []
    for step in range(common.STEPS):
        xs, ys = common.shard(x, y, step, rank, size)
        opt.zero_grad()
        common.loss_fn(model, xs, ys).backward()
        opt.step()
        history.append(common.snapshot(model))
    common.save(outdir, rank, {"params": history, "stats": us.get_stats()})
    us.shutdown()


if __name__ == "__main__":
    main()
