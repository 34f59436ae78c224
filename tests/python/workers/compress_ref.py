"""A plain reference of unisum's two-level compression (BytePS's scheme),
written from src/compress/compress.h's layouts and state.c's formulas, not
from the C code: test_compress.py checks the job's results against it
bit for bit.

Per partition of a tensor (the even cut: UNISUM_PLACEMENT=even), in wire
round r:
  machine m's input  = the sum of its workers' inputs (local reduce)
  its root sends     = encode(momentum and error feedback of that input)
  the server's sum   = decode(machine 0) + decode(machine 1) + ... (float32)
  every worker gets  = decode(encode(server's error feedback of the sum)),
                       divided by the number of workers for an average.

numpy only: the worker script imports it too."""

import numpy as np

AVERAGE = 1                     # UNISUM_AVERAGE
PARTITION_BYTES = 80000         # the test's UNISUM_PARTITION_BYTES
MASK64 = (1 << 64) - 1

# name -> (spec, elements, push_pull flags).  Above 64 KiB unless noted.
TENSORS = {
    "c.onebit": ("onebit,ef=vanilla,momentum=nesterov,mu=0.9", 50003, 0),
    "c.onebit.avg": ("onebit,scaling=0", 40000, AVERAGE),
    "c.topk": ("topk,k=0.01,ef=vanilla", 50003, AVERAGE),
    "c.randomk": ("randomk,k=0.05,ef=sparse,seed=3", 30011, 0),
    "c.fp16": ("fp16", 30000, 0),
    "c.bf16": ("bf16,ef=vanilla", 30000, 0),
    "c.dither": ("dithering,s=7,ef=vanilla", 50003, 0),
    "c.small": ("onebit", 1000, 0),     # 4000 bytes: below the minimum, uncompressed
}
# The ones this reference computes (dithering's draws are checked by the
# unit tests; end to end every rank must get the same bytes).
REFERENCED = [n for n in TENSORS if n != "c.dither"]


def worker_input(name, rank, rnd, count):
    """Rank `rank`'s input to push_pull number `rnd` of tensor `name`."""
    seed = (sum(name.encode()) * 7919 + rank * 104729 + rnd * 1299709) & 0xffffffff
    x = np.random.default_rng(seed).standard_normal(count).astype(np.float32)
    if rnd % 3 == 2:
        x[::97] = 0.0           # some exact zeros (onebit's +scale, ties in top-k)
    return x


# ---- seeds (compress.h) ----------------------------------------------------

def mix64(x):
    x = (x + 0x9e3779b97f4a7c15) & MASK64
    x = ((x ^ (x >> 30)) * 0xbf58476d1ce4e5b9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94d049bb133111eb) & MASK64
    return x ^ (x >> 31)


def shared_seed(job_seed, key, rnd):
    """compress_seed(job_seed, key, round, -1): what every rank draws alike."""
    x = mix64(job_seed ^ mix64(key))
    return mix64(x ^ mix64((rnd + 0x51ed27) & MASK64))


def tensor_key(name):
    """placement_tensor_key: FNV-1a of the name, folded to 48 bits, << 16."""
    h = 0xcbf29ce484222325
    for b in name.encode():
        h = ((h ^ b) * 0x100000001b3) & MASK64
    h ^= h >> 48
    h &= 0xffffffffffff
    return (h or 1) << 16


def partitions(count, esize=4):
    """The even cut: (offset, count) of each partition."""
    per = PARTITION_BYTES // esize
    n = count // per + (count % per != 0)
    base, extra = divmod(count, n)
    out, off = [], 0
    for i in range(n):
        c = base + (1 if i < extra else 0)
        out.append((off, c))
        off += c
    return out


# ---- specs ----------------------------------------------------------------

def parse(spec):
    words = spec.split(",")
    kv = dict(w.split("=", 1) for w in words[1:])
    s = {"kind": words[0], "scaling": kv.get("scaling", "1") == "1",
         "k": float(kv.get("k", "0")), "seed": int(kv.get("seed", "0")),
         "ef": kv.get("ef", "none"), "nesterov": kv.get("momentum") == "nesterov",
         "mu": np.float32(float(kv.get("mu", "0.9")))}
    return s


def kcount(s, n):
    k = s["k"] if s["k"] >= 1 else np.ceil(s["k"] * n)
    return int(min(max(k, 1), n))


# ---- codecs: encode returns what decode needs ---------------------------------

def onebit_scale(x):
    """mean |x| summed in compress.h's order."""
    a = np.abs(x).astype(np.float32)
    n = len(a)
    whole = n // 32
    total = 0.0
    lanes = np.zeros(8, np.float32)
    words = a[:whole * 32].reshape(whole, 4, 8)
    t = (words[:, 0] + words[:, 1]) + (words[:, 2] + words[:, 3])    # float32
    for start in range(0, whole, 1024):
        chunk = t[start:start + 1024]
        lanes = np.cumsum(np.vstack([lanes[None, :], chunk]), axis=0, dtype=np.float32)[-1]
        if start + 1024 <= whole:
            for j in range(8):
                total += float(lanes[j])
            lanes = np.zeros(8, np.float32)
    for j in range(8):
        total += float(lanes[j])
    part = np.float32(0)
    for v in a[whole * 32:]:
        part = np.float32(part + v)
    total += float(part)
    return np.float32(total / n)


def bf16(x):
    """float32 -> bfloat16 (nearest-even) -> float32; NaN stays NaN."""
    b = x.view(np.uint32).astype(np.uint64)
    r = ((b + 0x7fff + ((b >> 16) & 1)) >> 16) << 16
    out = r.astype(np.uint32).view(np.float32).copy()
    out[np.isnan(x)] = np.nan
    return out


def roundtrip(s, x, seed):
    """decode(encode(x)) for spec s, float32."""
    n = len(x)
    kind = s["kind"]
    if kind == "fp16":
        return x.astype(np.float16).astype(np.float32)
    if kind == "bf16":
        return bf16(x)
    if kind == "onebit":
        scale = onebit_scale(x) if s["scaling"] else np.float32(1.0)
        neg = np.signbit(x)
        return np.where(neg, -scale, scale).astype(np.float32)
    if kind == "topk":
        k = kcount(s, n)
        bits = (x.view(np.uint32) & 0x7fffffff).astype(np.int64)
        idx = np.sort(np.argsort(-bits, kind="stable")[:k])
        out = np.zeros(n, np.float32)
        out[idx] = x[idx]
        return out
    if kind == "randomk":
        out = np.zeros(n, np.float32)
        idx = randomk_indices(n, kcount(s, n), seed)
        out[idx] = x[idx]
        return out
    raise ValueError(kind)


def randomk_indices(n, k, seed):
    state, idx = seed, []
    for j in range(k):
        lo, hi = j * n // k, (j + 1) * n // k
        state = mix64(state)
        idx.append(lo + (((state >> 32) * (hi - lo)) >> 32))
    return np.array(idx, np.int64)


class State:
    """compress_state: momentum (workers) and error feedback of one partition."""

    def __init__(self, s, n, worker):
        self.s = s
        self.m = np.zeros(n, np.float32) if worker and s["nesterov"] else None
        self.e = np.zeros(n, np.float32) if s["ef"] != "none" else None

    def send(self, g, seed):
        """What the partition's message decodes to, updating the state."""
        s, x = self.s, g
        if self.m is not None:
            self.m = (s["mu"] * self.m + g).astype(np.float32)
            x = (g + s["mu"] * self.m).astype(np.float32)
        if s["ef"] == "vanilla":
            y = (x + self.e).astype(np.float32)
            sent = roundtrip(s, y, seed)
            self.e = (y - sent).astype(np.float32)
            return sent
        if s["ef"] == "sparse":
            self.e = (self.e + x).astype(np.float32)
            sent = roundtrip(s, self.e, seed)
            self.e[randomk_indices(len(x), kcount(s, len(x)), seed)] = 0
            return sent
        return roundtrip(s, x, seed)


def expected(name, size, local_size, rounds, min_bytes=65536):
    """What every worker gets from each of `rounds` push_pulls of tensor
    `name` in a job of `size` workers, `local_size` per machine."""
    spec, count, flags = TENSORS[name]
    assert local_size in (1, 2), "the local sum's order is modelled for 1 or 2"
    s = parse(spec)
    compressed = count * 4 >= min_bytes
    machines = size // local_size
    key0 = tensor_key(name)
    parts = partitions(count)
    wstate = [[State(s, c, True) for _, c in parts] for _ in range(machines)]
    sstate = [State(s, c, False) for _, c in parts]
    out = np.empty((rounds, count), np.float32)
    for r in range(rounds):
        xs = [worker_input(name, rank, r, count) for rank in range(size)]
        msum = []
        for m in range(machines):
            v = xs[m * local_size]
            for j in range(1, local_size):
                v = (v + xs[m * local_size + j]).astype(np.float32)
            msum.append(v)
        for p, (off, c) in enumerate(parts):
            seed = shared_seed(s["seed"], key0 + p, r)
            acc = None
            for m in range(machines):
                g = msum[m][off:off + c]
                got = wstate[m][p].send(g, seed) if compressed else g
                acc = got.copy() if acc is None else (acc + got).astype(np.float32)
            res = sstate[p].send(acc, seed) if compressed else acc
            if flags & AVERAGE:
                res = (res / np.float32(size)).astype(np.float32)
            out[r, off:off + c] = res
    return out
