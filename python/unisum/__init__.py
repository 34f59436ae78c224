"""unisum: fast gradient summation for data-parallel training.

The PyTorch API lives in :mod:`unisum.torch` (``import unisum.torch as us``);
this package itself only finds and loads ``libunisum.so`` (see
:mod:`unisum._capi`).
"""

from unisum._capi import UnisumError
from unisum._version import __version__

__all__ = ["UnisumError", "__version__"]
