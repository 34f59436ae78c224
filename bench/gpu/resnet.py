"""resnet.py - ResNet-50 on synthetic data, the issue 22 benchmark.

    resnet.py single  [--steps N] [--batch B]       # one process, no communication
    resnet.py unisum  [--steps N] [--batch B] [--profile DIR]   # under unisum launch
    resnet.py ddp --rank R --world W --master ADDR:PORT [...]   # DDP over gloo
    resnet.py pinned                                # copy bandwidth, pinned memory

Every mode prints one line "RESULT mode=... images_per_s=..." (rank 0).
Training is real (SGD on synthetic 224x224 images and random labels):
forward, backward and the optimizer step, each step timed to the end of
its GPU work.  The model is written out here (torchvision is not always
installed): the standard ResNet-50, 25.6 M parameters, 161 tensors.

--profile DIR (unisum): rank 0 records 3 steps with torch.profiler and
prints the share of the gradients' device-to-host and host-to-device copy
time that overlapped a kernel on the GPU (hidden behind backward and the
rest), and the copies' bandwidth, from the trace's memcpy events.

`pinned` measures what the copies can reach: 256 MiB between the device
and page-locked host memory, each way, with CUDA events (what cudaMemcpy
does on pinned memory).

--device cpu runs the same on the CPU (a check of the script, for a
machine without a GPU); the numbers then mean nothing.
"""
import argparse
import datetime
import json
import os
import sys
import time

import torch
import torch.nn as nn


class Bottleneck(nn.Module):
    def __init__(self, cin, width, stride):
        super().__init__()
        cout = width * 4
        self.body = nn.Sequential(
            nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
            nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width),
            nn.ReLU(inplace=True),
            nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout))
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                      nn.BatchNorm2d(cout))
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        return self.relu(self.body(x) + (x if self.down is None else self.down(x)))


def resnet50(classes=1000):
    layers = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True),
              nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for i in range(blocks):
            layers.append(Bottleneck(cin, width, stride if i == 0 else 1))
            cin = width * 4
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes)]
    return nn.Sequential(*layers)


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def train(model, opt, dev, batch, steps, warmup, after_step=None, image=224):
    """Images per second over `steps` steps after `warmup`."""
    x = torch.randn(batch, 3, image, image, device=dev)
    y = torch.randint(0, 1000, (batch,), device=dev)
    loss_fn = nn.CrossEntropyLoss()
    t0 = None
    for step in range(warmup + steps):
        if step == warmup:
            sync(dev)
            t0 = time.perf_counter()
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
        if after_step is not None:
            after_step(step)
    sync(dev)
    return batch * steps / (time.perf_counter() - t0)


def overlap_report(trace_path):
    """(hidden share of the memcpy time, the memcpys' GB/s, their count)
    from a chrome trace: a copy's time is hidden where some kernel runs."""
    with open(trace_path) as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    kernels = sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                     if e.get("cat") == "kernel" and e.get("ph") == "X")
    copies = [e for e in events if e.get("cat") == "gpu_memcpy" and e.get("ph") == "X"
              and ("DtoH" in e.get("name", "") or "HtoD" in e.get("name", ""))]
    merged = []
    for lo, hi in kernels:
        if merged and lo <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    total = hidden = 0.0
    nbytes = 0
    for e in copies:
        lo, hi = e["ts"], e["ts"] + e["dur"]
        total += hi - lo
        nbytes += int(e.get("args", {}).get("bytes", 0))
        for klo, khi in merged:     # few thousand intervals: fine
            if khi <= lo:
                continue
            if klo >= hi:
                break
            hidden += min(hi, khi) - max(lo, klo)
    gbs = nbytes / (total * 1e-6) / 1e9 if total > 0 else 0.0
    return (hidden / total if total > 0 else 0.0), gbs, len(copies)


def mode_pinned(dev):
    n = 256 << 20
    host = torch.empty(n, dtype=torch.uint8, pin_memory=dev.type == "cuda")
    devbuf = torch.empty(n, dtype=torch.uint8, device=dev)
    out = {}
    for way in ("d2h", "h2d"):
        best = 0.0
        for _ in range(5):
            if dev.type == "cuda":
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                (host.copy_(devbuf, non_blocking=True) if way == "d2h"
                 else devbuf.copy_(host, non_blocking=True))
                b.record()
                b.synchronize()
                seconds = a.elapsed_time(b) / 1e3
            else:
                t0 = time.perf_counter()
                host.copy_(devbuf) if way == "d2h" else devbuf.copy_(host)
                seconds = time.perf_counter() - t0
            best = max(best, n / seconds / 1e9)
        out[way] = best
    print("RESULT mode=pinned d2h_GBps=%.2f h2d_GBps=%.2f" % (out["d2h"], out["h2d"]), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("mode", choices=["single", "unisum", "ddp", "pinned"])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--image", type=int, default=224)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--world", type=int, default=1)
    ap.add_argument("--master", default="")
    ap.add_argument("--profile", default="")
    a = ap.parse_args()
    dev = torch.device(a.device)
    if a.mode == "pinned":
        return mode_pinned(dev)
    torch.manual_seed(1)
    model = resnet50().to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    if a.mode == "single":
        ips = train(model, opt, dev, a.batch, a.steps, a.warmup, image=a.image)
        print("RESULT mode=single workers=1 images_per_s=%.1f" % ips, flush=True)
        return
    if a.mode == "ddp":
        import torch.distributed as dist
        host, port = a.master.rsplit(":", 1)
        dist.init_process_group("gloo", init_method="tcp://%s:%s" % (host, port), rank=a.rank,
                                world_size=a.world, timeout=datetime.timedelta(seconds=300))
        ddp = nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
        ips = train(ddp, opt, dev, a.batch, a.steps, a.warmup, image=a.image)
        t = torch.tensor([ips])
        dist.all_reduce(t)
        if a.rank == 0:
            print("RESULT mode=ddp workers=%d images_per_s=%.1f" % (a.world, float(t)), flush=True)
        dist.destroy_process_group()
        return
    import unisum.torch as us
    us.init()
    us.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = us.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    prof = None
    if a.profile and us.rank() == 0:
        from torch.profiler import ProfilerActivity, profile, schedule
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
        os.makedirs(a.profile, exist_ok=True)
        prof = profile(activities=acts, schedule=schedule(wait=0, warmup=1, active=3, repeat=1))
        prof.start()
    ips = train(model, opt, dev, a.batch, a.steps, a.warmup, image=a.image,
                after_step=(lambda step: prof.step()) if prof is not None else None)
    total = float(us.push_pull(torch.tensor([ips]), average=False, name="bench.ips"))
    if us.rank() == 0:
        print("RESULT mode=unisum workers=%d images_per_s=%.1f" % (us.size(), total), flush=True)
    if prof is not None:
        prof.stop()
        path = os.path.join(a.profile, "rank0.json")
        prof.export_chrome_trace(path)
        hidden, gbs, n = overlap_report(path)
        print("RESULT mode=overlap copies=%d hidden_share=%.3f copy_GBps=%.2f" % (n, hidden, gbs),
              flush=True)
    us.shutdown()


if __name__ == "__main__":
    sys.exit(main())
