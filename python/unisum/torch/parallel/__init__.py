"""BytePS's ``byteps.torch.parallel``: its DistributedDataParallel module
wrapper, on unisum's push_pull.

    from unisum.torch.parallel import DistributedDataParallel as DDP
"""

from unisum.torch.parallel.distributed import DistributedDataParallel

__all__ = ["DistributedDataParallel"]
