#!/usr/bin/python3
"""dist_latency.py - the latency of a small torch.distributed all_reduce,
over the backend "unisum" against gloo, measured in the same run.

    /usr/bin/python3 bench/dist_latency.py [BUILD_DIR] [--bytes 4] [--calls 500]

2 ranks on this machine, each a process.  gloo: the two processes join a
gloo group on 127.0.0.1.  unisum: `unisum launch -w 2 -s 1`, twice: with
--local-size 1 (the all_reduce goes through the server) and as one machine
(the workers' shared memory).  Each rank makes 50 untimed calls, then
--calls timed ones of dist.all_reduce (SUM, float32, --bytes bytes, not
async); rank 0 prints its p50 and p90.  The table gives each p50 and its
ratio to gloo's.
"""
import argparse
import os
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def worker(backend, nbytes, calls):
    import torch
    import torch.distributed as dist
    if backend == "unisum":
        sys.path.insert(0, os.path.join(ROOT, "python"))
        import unisum.torch.distributed  # noqa: F401  (registers the backend)
    torch.set_num_threads(1)
    dist.init_process_group(backend)
    t = torch.ones(max(1, nbytes // 4))
    for _ in range(50):
        dist.all_reduce(t)
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        dist.all_reduce(t)
        times.append(time.perf_counter() - t0)
    times.sort()
    if dist.get_rank() == 0:
        print("LATENCY p50_us=%.1f p90_us=%.1f" % (times[len(times) // 2] * 1e6,
                                                  times[int(len(times) * 0.9)] * 1e6), flush=True)
    dist.destroy_process_group()


def parse(out):
    for line in out.splitlines():
        if "LATENCY" in line:
            fields = dict(f.split("=") for f in line.split("LATENCY", 1)[1].split())
            return float(fields["p50_us"]), float(fields["p90_us"])
    raise SystemExit("dist_latency: no result:\n" + out[-3000:])


def run_gloo(a):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2",
               OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, __file__, "--worker", "gloo", "--bytes",
                               str(a.bytes), "--calls", str(a.calls)],
                              env=dict(env, RANK=str(r)), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for r in range(2)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    return parse(outs[0])


def run_unisum(a, local_size):
    cmd = [os.path.join(a.build, "unisum"), "launch", "-w", "2", "-s", "1"]
    if local_size:
        cmd += ["--local-size", str(local_size)]
    cmd += ["--", sys.executable, __file__, "--worker", "unisum", "--bytes", str(a.bytes),
            "--calls", str(a.calls)]
    env = dict(os.environ, OMP_NUM_THREADS="1",
               UNISUM_LIBRARY=os.path.join(a.build, "libunisum.so"))
    out = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, timeout=300).stdout
    return parse(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("build", nargs="?", default=os.path.join(ROOT, "build"))
    ap.add_argument("--bytes", type=int, default=4)
    ap.add_argument("--calls", type=int, default=500)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        worker(a.worker, a.bytes, a.calls)
        return
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo")
                if l.startswith("model name")), "?")
    print("# %s dist.all_reduce of %d bytes, 2 ranks, %d calls; %s, %d cores"
          % (time.strftime("%Y-%m-%d"), a.bytes, a.calls, cpu, os.cpu_count()))
    gloo = run_gloo(a)
    rows = [("gloo", gloo), ("unisum, through the server", run_unisum(a, 1)),
            ("unisum, one machine", run_unisum(a, None))]
    print("%-28s %10s %10s %12s" % ("backend", "p50_us", "p90_us", "p50/gloo"))
    for name, (p50, p90) in rows:
        print("%-28s %10.1f %10.1f %12.2f" % (name, p50, p90, p50 / gloo[0]))


if __name__ == "__main__":
    main()
