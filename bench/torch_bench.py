#!/usr/bin/env python3
"""PyTorch's side of `make bench`: the workloads of bench/bench_eager.c (the
CPU sizes of WORKLOADS.md) in PyTorch eager and torch.compile, on the CPU;
with --device cuda (`make bench-cuda`), those of bench/bench_cuda.c (the GPU
sizes), TF32 off, timed with CUDA events (tiny_chain: wall time per call
over 2000 calls and one synchronize, as bench_cuda).

  python3 bench/torch_bench.py [--device cpu|cuda] [--reps N] [--threads N] [--only NAME,...] [--json FILE]

Per workload: eager and compiled medians (the same repetition counts as
bench_eager: --reps, and 50 times that for tiny_chain), and the latency of
the first torch.compile call, cold (an empty inductor cache, this process)
and warm (a new process whose inductor cache this one filled: that process
runs `--first-call NAME`).  The inductor cache is a fresh temporary folder.
bench/report.py merges the JSON with Ember's.
"""
import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

# bench_eager.c's CPU sizes; set_sizes("cuda") switches to bench_cuda.c's
N, R, C, M, K, H = 1 << 22, 8192, 1024, 256, 512, 2048
B, T, E, NH = 1, 128, 256, 4
HD = E // NH
DEV = "cpu"
DTYPE = torch.float32


def set_sizes(dev):
    global N, R, C, M, K, H, B, T, E, NH, HD, DEV
    DEV = dev
    if dev == "cuda":
        N, R, C, M, K, H = 1 << 26, 32768, 4096, 8192, 2048, 8192
        B, T, E, NH = 16, 1024, 768, 12
        HD = E // NH


def pointwise(x, a, b):
    return torch.tanh(x * a + b) * 0.5 + x


def softmax(x):
    return torch.softmax(x, dim=-1)


def layernorm(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b, 1e-5)


def mlp(x, w1, b1, w2, b2):
    return F.gelu(x @ w1 + b1, approximate="tanh") @ w2 + b2


def attention_block(x, ln1w, ln1b, wqkv, bqkv, wo, bo, ln2w, ln2b, w1, b1, w2, b2, mask):
    h = F.layer_norm(x, (E,), ln1w, ln1b, 1e-5)
    q, k, v = (h @ wqkv + bqkv).split(E, dim=-1)
    q, k, v = (t.view(B, T, NH, HD).transpose(1, 2) for t in (q, k, v))
    att = torch.softmax((q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(HD)) + mask, dim=-1)
    y = (att @ v).transpose(1, 2).reshape(B, T, E)
    x = x + (y @ wo + bo)
    h = F.layer_norm(x, (E,), ln2w, ln2b, 1e-5)
    return x + (F.gelu(h @ w1 + b1, approximate="tanh") @ w2 + b2)


def tiny_chain(x, y):
    for _ in range(5):
        x = torch.relu(x * y + 1.0) - 0.5
    return x


def workloads():
    """name -> (function, inputs), inputs as bench_eager.c makes them."""
    g = torch.Generator().manual_seed(0)

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(DEV, DTYPE)

    mask = torch.triu(torch.full((T, T), float("-inf")), 1).to(DEV, DTYPE)
    return {
        "pointwise": (pointwise, (rnd(N), rnd(N), rnd(N))),
        "softmax": (softmax, (rnd(R, C),)),
        "layernorm": (layernorm, (rnd(R, C), rnd(C), rnd(C))),
        "mlp": (mlp, (rnd(M, K), rnd(K, H, scale=K ** -0.5), rnd(H), rnd(H, K, scale=H ** -0.5), rnd(K))),
        "attention_block": (attention_block,
                            (rnd(B, T, E), rnd(E), rnd(E), rnd(E, 3 * E, scale=E ** -0.5), rnd(3 * E),
                             rnd(E, E, scale=E ** -0.5), rnd(E), rnd(E), rnd(E),
                             rnd(E, 4 * E, scale=E ** -0.5), rnd(4 * E),
                             rnd(4 * E, E, scale=(4 * E) ** -0.5), rnd(E), mask)),
        "tiny_chain": (tiny_chain, (rnd(16), rnd(16))),
        **({"gpt2_small": gpt2_small()} if DEV == "cpu" and DTYPE == torch.float32 else {}),
    }


def gpt2_small():
    """GPT-2 small's forward (torch_cold.py's modules, as bench/gpt2_small.h
    writes it): batch 2 x 64 tokens, CPU f32 only, as bench_eager runs it."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from torch_cold import gpt2_modules
    model, (x,) = gpt2_modules(torch, 12)
    for p in model.parameters():
        p.requires_grad_(False)
    return model, (x,)


def sync():
    if DEV == "cuda":
        torch.cuda.synchronize()


def median_time(fn, args, reps):
    for _ in range(3):
        fn(*args)
    if DEV == "cuda":
        return median_events(fn, args, reps)
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn(*args)
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def median_events(fn, args, reps):
    ts = []
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        fn(*args)
        e1.record()
        e1.synchronize()
        ts.append(e0.elapsed_time(e1) * 1e-3)
    return statistics.median(ts)


def wall_per_call(fn, args, n=2000):
    for _ in range(10):
        fn(*args)
    sync()
    t0 = time.perf_counter()
    for _ in range(n):
        fn(*args)
    sync()
    return (time.perf_counter() - t0) / n


def first_call(fn, args):
    torch._dynamo.reset()
    cf = torch.compile(fn)
    sync()
    t0 = time.perf_counter()
    cf(*args)
    sync()
    return time.perf_counter() - t0, cf


def warm_first_call(name, threads):
    """The first call in a new process that finds the inductor cache filled."""
    cmd = [sys.executable, os.path.abspath(__file__), "--first-call", name, "--threads", str(threads),
           "--device", DEV, "--dtype", str(DTYPE).replace("torch.", "")]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=600)
        return float(out.stdout.strip().splitlines()[-1])
    except (subprocess.SubprocessError, ValueError, IndexError) as e:
        print(f"warm first call of {name} failed: {e}", file=sys.stderr)
        return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=21)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--only", default="")
    ap.add_argument("--json", default="")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--first-call", default="", help=argparse.SUPPRESS)
    ap.add_argument("--no-warm", action="store_true",
                    help="skip the warm first call (a new process each: tens of seconds on many cores)")
    a = ap.parse_args()
    global DTYPE
    DTYPE = getattr(torch, a.dtype)
    torch.set_num_threads(a.threads)
    if a.device == "cuda":
        if not torch.cuda.is_available():
            sys.exit("torch_bench.py: --device cuda: torch finds no CUDA device")
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    set_sizes(a.device)
    W = workloads()
    if a.first_call:  # the child of a warm first-call measurement
        fn, args = W[a.first_call]
        print(first_call(fn, args)[0])
        return
    own_cache = "TORCHINDUCTOR_CACHE_DIR" not in os.environ
    if own_cache:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="torch-bench-inductor-")
    only = set(filter(None, a.only.split(",")))
    where = torch.cuda.get_device_name(0) if DEV == "cuda" else "the CPU"
    print(f"PyTorch {torch.__version__} on {where}, {torch.get_num_threads()} threads, {a.dtype}")
    print(f"{'workload':16s} {'eager':>10s} {'compiled':>10s} {'cold first':>11s} {'warm first':>11s}  rel err")
    rows = []
    for name, (fn, args) in W.items():
        if only and name not in only:
            continue
        reps = a.reps * 50 if name == "tiny_chain" and DEV == "cpu" else a.reps
        cold, cf = first_call(fn, args)
        ref, out = fn(*args), cf(*args)
        err = ((out.double() - ref.double()).norm() / ref.double().norm()).item()
        if name == "tiny_chain" and DEV == "cuda":
            te, tc = wall_per_call(fn, args), wall_per_call(cf, args)
        else:
            te, tc = median_time(fn, args, reps), median_time(cf, args, reps)
        warm = None if a.no_warm else warm_first_call(name, a.threads)
        rows.append(dict(name=name, eager_ms=te * 1e3, compiled_ms=tc * 1e3, cold_first_ms=cold * 1e3,
                         warm_first_ms=None if warm is None else warm * 1e3, rel_err=err))
        ws = f"{warm * 1e3:8.1f} ms" if warm is not None else "       n/a"
        print(f"{name:16s} {te * 1e3:8.3f}ms {tc * 1e3:8.3f}ms {cold * 1e3:8.1f} ms {ws}  {err:.1e}", flush=True)
    if own_cache:
        shutil.rmtree(os.environ["TORCHINDUCTOR_CACHE_DIR"], ignore_errors=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(torch=torch.__version__, threads=torch.get_num_threads(), device=where,
                           device_type=DEV, workloads=rows), f, indent=1)


if __name__ == "__main__":
    main()
