"""The ``unisum`` console script of an installed package: runs the CLI the
package carries (``unisum/bin/unisum``, put there by the CMake build)."""
import os
import sys


def main():
    exe = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "unisum")
    if not os.access(exe, os.X_OK):
        sys.exit("unisum: %s is missing: this package was installed from a source tree that "
                 "was never built (run make, then install ./python again)" % exe)
    os.execv(exe, [exe] + sys.argv[1:])
