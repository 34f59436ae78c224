"""The constants of python/unisum/_capi.py, copied from include/unisum.h,
agree with the header: every error code, dtype and flag, by name and value."""

import os
import re

from unisum import _capi
from conftest import REPO


def header_constants():
    with open(os.path.join(REPO, "include", "unisum.h")) as f:
        text = f.read()
    found = dict((m.group(1), int(m.group(2)))
                 for m in re.finditer(r"^\s*UNISUM_([A-Z0-9_]+)\s*=\s*(-?\d+),", text, re.M))
    found.update((m.group(1), int(m.group(2), 0))
                 for m in re.finditer(r"^#define UNISUM_([A-Z_]+)\s+(0x[0-9a-fA-F]+|\d+)", text, re.M))
    return found


def test_every_error_code_agrees():
    consts = header_constants()
    codes = {k: v for k, v in consts.items() if k.startswith("E")}
    assert len(codes) >= 13, codes
    for name, value in codes.items():
        assert hasattr(_capi, name), "_capi lacks UNISUM_%s" % name
        assert getattr(_capi, name) == value, "UNISUM_%s is %d in unisum.h, %d in _capi" % (
            name, value, getattr(_capi, name))


def test_every_dtype_and_flag_agrees():
    consts = header_constants()
    for name in ("FLOAT32", "FLOAT64", "FLOAT16", "BFLOAT16", "INT32", "INT64", "AVERAGE"):
        assert getattr(_capi, name) == consts[name], name
