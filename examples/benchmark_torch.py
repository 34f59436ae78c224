"""Training throughput of unisum.torch against PyTorch DDP (gloo), 1 vs N workers.

    /usr/bin/python3 examples/benchmark_torch.py [--workers 2] [--model resnet18] ...

Method.  Every worker trains a torchvision model (resnet18 by default) with
SGD on one fixed synthetic batch (--batch-size images of 3 x --image-size
squared pixels, random labels, different on every worker), so no data
loading is measured.  After --warmup steps the workers meet at a barrier,
rank 0 starts a clock, every worker runs --steps steps, the workers meet at
a barrier again and rank 0 stops the clock:

    throughput = steps * batch size * workers / elapsed seconds

Each configuration runs in fresh processes:

  unisum   `unisum launch -w W -s 1` runs W copies of this script (they see
           UNISUM_LAUNCHED) with DistributedOptimizer and broadcast_parameters;
  ddp      W copies of this script join a gloo process group on 127.0.0.1
           and wrap the model in DistributedDataParallel;
  ddp-unisum  the same DDP under `unisum launch -w W -s 1`, its process
           group the backend "unisum" (unisum.torch.distributed).

for W = 1 and W = --workers.  Scaling efficiency is throughput(N) divided by
N * throughput(1) of the same system; the 1-worker runs still go through
the system's communication path (a unisum server, a gloo all-reduce), so
each system is compared with itself.  Every worker uses --threads intra-op
threads (1 by default, also for the 1-worker runs, so that efficiency
compares equal work per worker).  At the end the workers check that their
parameters agree (a sum over all parameters, compared with rank 0's).
Both average the gradients; DDP also broadcasts rank 0's BatchNorm buffers
before every forward pass, DistributedOptimizer leaves them local.

Rank 0 of each run prints one line "BENCH_RESULT {json}", which this
script, run without UNISUM_LAUNCHED and without --ddp-worker, collects into
a table.  Every run has a hard time limit (--timeout).

The launcher is $UNISUM_BUILD_DIR/unisum, else <repo>/build/unisum.
"""

import argparse
import datetime
import importlib
import json
import os
import shlex
import socket
import subprocess
import sys
import time

# Usable straight from a source checkout, without installing the package.
REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir)
sys.path.insert(0, os.path.join(REPO, "python"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import torchvision  # noqa: E402

RESULT_MARK = "BENCH_RESULT "
WORKER_OPTIONS = ("model", "batch_size", "image_size", "steps", "warmup", "threads", "seed")


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2, help="N, compared with 1 worker")
    ap.add_argument("--model", default="resnet18", help="a torchvision.models constructor")
    ap.add_argument("--batch-size", type=int, default=16, help="per worker")
    ap.add_argument("--image-size", type=int, default=32)
    ap.add_argument("--steps", type=int, default=50, help="timed steps")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=120, help="seconds per run, hard limit")
    ap.add_argument("--ddp-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--ddp-unisum", action="store_true", help=argparse.SUPPRESS)
    return ap.parse_args()


# ---------------------------------------------------------------- workers

def build(args, rank):
    """The model, a plain SGD optimizer and this worker's synthetic batch."""
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed + rank)    # replicas differ until the first broadcast
    model = getattr(torchvision.models, args.model)(num_classes=10)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(args.batch_size, 3, args.image_size, args.image_size)
    y = torch.randint(0, 10, (args.batch_size,))
    return model, optimizer, x, y


def timed_training(model, optimizer, x, y, args, barrier):
    """Runs the warmup and the timed steps; returns the timed seconds."""
    model.train()

    def step():
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()

    for _ in range(args.warmup):
        step()
    barrier()
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    barrier()
    return time.perf_counter() - start


def replicas_agree(model, rank, allreduce_sum):
    """Whether every worker's parameters sum to rank 0's (within 1e-6 relative)."""
    with torch.no_grad():
        mine = sum(p.double().sum() for p in model.parameters()).reshape(1)
    ref = allreduce_sum(mine if rank == 0 else torch.zeros(1, dtype=torch.float64))
    off = (mine - ref).abs() > 1e-6 * max(1.0, ref.abs().item())
    return allreduce_sum(off.double()).item() == 0


def report(system, size, args, elapsed, agree):
    print(RESULT_MARK + json.dumps({
        "system": system, "workers": size, "elapsed": elapsed,
        "samples_per_s": args.steps * args.batch_size * size / elapsed,
        "replicas_agree": agree}), flush=True)


def unisum_worker(args):
    import unisum.torch as us

    us.init()
    rank, size = us.rank(), us.size()
    model, optimizer, x, y = build(args, rank)
    optimizer = us.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    us.broadcast_parameters(model.state_dict(), root_rank=0)
    elapsed = timed_training(model, optimizer, x, y, args, us.barrier)
    agree = replicas_agree(model, rank, lambda t: us.push_pull(t, average=False, name="check"))
    if rank == 0:
        report("unisum", size, args, elapsed, agree)
    us.shutdown()


def ddp_worker(args, backend="gloo"):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    if backend == "unisum":
        importlib.import_module("unisum.torch.distributed")    # registers the backend
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group(backend, rank=rank, world_size=size,
                            timeout=datetime.timedelta(seconds=args.timeout))
    model, optimizer, x, y = build(args, rank)
    ddp_model = DistributedDataParallel(model)    # broadcasts rank 0's parameters

    def allreduce_sum(t):
        dist.all_reduce(t)
        return t

    elapsed = timed_training(ddp_model, optimizer, x, y, args, dist.barrier)
    agree = replicas_agree(model, rank, allreduce_sum)
    if rank == 0:
        report("ddp" if backend == "gloo" else "ddp-unisum", size, args, elapsed, agree)
    if backend == "unisum":
        return      # leaves its job at exit
    # Every collective is done.  Exit without tearing down: in torch 1.13 the
    # Reducer's destructor (GIL held) can wait forever for a gloo thread that
    # needs the GIL to free a tensor.
    sys.stdout.flush()
    os._exit(0)


# ----------------------------------------------------------- orchestrator

def worker_argv(args, *extra):
    """This script's command line for a worker, with the same settings."""
    argv = [sys.executable, os.path.abspath(__file__), *extra]
    for opt in WORKER_OPTIONS:
        argv += ["--" + opt.replace("_", "-"), str(getattr(args, opt))]
    return argv + ["--timeout", str(args.timeout)]


def worker_env(args):
    return dict(os.environ, OMP_NUM_THREADS=str(args.threads), PYTHONUNBUFFERED="1")


def parse_result(output):
    for line in output.splitlines():
        if RESULT_MARK in line:
            return json.loads(line.split(RESULT_MARK, 1)[1])
    return None


def launcher_path():
    build_dir = os.environ.get("UNISUM_BUILD_DIR", os.path.join(REPO, "build"))
    return os.path.normpath(os.path.join(build_dir, "unisum"))


def run_unisum(args, workers, *extra):
    """One unisum job of `workers` workers and one server; returns (result, output)."""
    launcher = launcher_path()
    if not os.access(launcher, os.X_OK):
        return None, "no launcher at %s: build it (cmake -S . -B build && cmake --build build) " \
                     "or set UNISUM_BUILD_DIR" % launcher
    cmd = [launcher, "launch", "-w", str(workers), "-s", "1",
           "--timeout", str(int(args.timeout)), "--", *worker_argv(args, *extra)]
    try:
        proc = subprocess.run(cmd, env=worker_env(args), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=args.timeout + 10)
    except subprocess.TimeoutExpired as e:
        output = e.output.decode(errors="replace") if isinstance(e.output, bytes) else e.output
        return None, (output or "") + "\n(killed after %.0f s)" % (args.timeout + 10)
    return parse_result(proc.stdout) if proc.returncode == 0 else None, proc.stdout


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ddp(args, workers):
    """`workers` DDP processes on one gloo group; returns (result, output)."""
    env = dict(worker_env(args), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               WORLD_SIZE=str(workers))
    procs = [subprocess.Popen(worker_argv(args, "--ddp-worker"), env=dict(env, RANK=str(r)),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(workers)]
    deadline = time.monotonic() + args.timeout
    outputs, ok = [], True
    for rank, proc in enumerate(procs):
        try:
            out, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
            out += "\n(killed after %.0f s)" % args.timeout
        ok = ok and proc.returncode == 0
        outputs.append("".join("[rank %d] %s\n" % (rank, l) for l in out.splitlines()))
    output = "".join(outputs)
    return parse_result(output) if ok else None, output


def print_table(args, results):
    """results: {(system, workers): result or None}."""
    n = args.workers
    print("%-8s %7s %12s %12s %11s %8s" % ("system", "workers", "samples/s", "per worker",
                                           "efficiency", "agree"))
    for system in ("unisum", "ddp", "ddp-unisum"):
        one = results.get((system, 1))
        for workers in sorted({1, n}):
            r = results.get((system, workers))
            if r is None:
                print("%-8s %7d %12s" % (system, workers, "FAILED"))
                continue
            total = r["samples_per_s"]
            eff = "%.3f" % (total / (n * one["samples_per_s"])) if workers == n and one else "-"
            print("%-8s %7d %12.1f %12.1f %11s %8s" % (
                system, workers, total, total / workers, eff, r["replicas_agree"]))
    u, d = results.get(("unisum", n)), results.get(("ddp", n))
    if u and d:
        print("unisum / DDP throughput at %d workers: %.3f"
              % (n, u["samples_per_s"] / d["samples_per_s"]))
    du = results.get(("ddp-unisum", n))
    if du and d:
        print("DDP over unisum / DDP over gloo throughput at %d workers: %.3f"
              % (n, du["samples_per_s"] / d["samples_per_s"]))


def orchestrate(args):
    print("date:    %s" % datetime.datetime.now().astimezone().isoformat(timespec="seconds"))
    print("command: %s" % " ".join(shlex.quote(a) for a in [sys.executable] + sys.argv))
    print("setup:   %s, batch %d per worker, %dx%dx3 synthetic images, %d warmup + %d timed "
          "steps, %d cpu(s), torch %s" % (args.model, args.batch_size, args.image_size,
                                          args.image_size, args.warmup, args.steps,
                                          os.cpu_count(), torch.__version__))
    print("threads: %d torch thread(s) per worker in every run, 1-worker runs included, so "
          "that efficiency compares equal work per worker" % args.threads, flush=True)
    runners = {"unisum": run_unisum, "ddp": run_ddp,
               "ddp-unisum": lambda a, w: run_unisum(a, w, "--ddp-unisum")}
    results = {}
    for system, runner in runners.items():
        for workers in sorted({1, args.workers}):
            start = time.monotonic()
            result, output = runner(args, workers)
            took = time.monotonic() - start
            if result is None:
                print("%s with %d worker(s) failed after %.1f s; its output:\n%s"
                      % (system, workers, took, output.rstrip()), flush=True)
            else:
                print("%-6s %d worker(s): %.1f samples/s (run took %.1f s)"
                      % (system, workers, result["samples_per_s"], took), flush=True)
            results[(system, workers)] = result
    print()
    print_table(args, results)
    return 0 if all(results.values()) else 1


def main():
    args = parse_args()
    if os.environ.get("UNISUM_LAUNCHED") and args.ddp_unisum:
        ddp_worker(args, "unisum")
    elif os.environ.get("UNISUM_LAUNCHED"):
        unisum_worker(args)
    elif args.ddp_worker:
        ddp_worker(args)
    else:
        sys.exit(orchestrate(args))


if __name__ == "__main__":
    main()
