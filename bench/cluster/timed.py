#!/usr/bin/python3
"""timed.py CMD ARGS... - runs CMD with its stdout and stderr merged and
prints every line it writes prefixed with the seconds since CMD started
(monotonic clock, 3 decimals), then "<seconds> EXIT <status>".  For
bench/cluster/launch, which reads when a line came."""
import subprocess
import sys
import time

start = time.monotonic()
proc = subprocess.Popen(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
for raw in proc.stdout:
    line = raw.decode(errors="replace").rstrip("\n")
    print("%.3f %s" % (time.monotonic() - start, line), flush=True)
rc = proc.wait()
print("%.3f EXIT %d" % (time.monotonic() - start, rc), flush=True)
sys.exit(0)
