#!/usr/bin/env python3
"""PyTorch's side of `make bench-attention` (bench/bench_attention.c is
Ember's): the same sweep (B batches, H heads, T = 128 ... max-t, D = 64 and
128, causal or a bool padding mask keeping the first 3T/4 keys), f32 on the
CPU, or with --device cuda on the GPU (defaults B=4 H=16 T up to 8192, as
bench_attention's; TF32 off):

  sdpa      torch.nn.functional.scaled_dot_product_attention, eager (its
            fused CPU flash kernel)
  compiled  torch.compile of attention written by hand (matmul, scale,
            mask, softmax, matmul): Inductor's fuse_attention rewrites it
            into the same kernel

  python3 bench/torch_attention.py [--device cpu|cuda] [--reps N] [--max-t T]
          [--batch B] [--heads H] [--threads N] [--no-compile] [--dtype f32|bf16|f16]
          [--ember bench/attention.json]

Medians after one untimed call (two for torch.compile, whose first call
compiles).  On CUDA a sample is a run of calls (about 5 ms) ended by
torch.cuda.synchronize(), divided by their number, as bench_attention
times Ember.  With --ember, Ember's times from bench_attention --json are
printed beside them, with Ember compiled's speedup over each.
"""
import argparse
import json
import math
import statistics
import time

import torch
import torch.nn.functional as F


def manual(q, k, v, mask, causal):
    s = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
    if causal:
        T = q.shape[-2]
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1),
                          float("-inf"))
    else:
        s = s.masked_fill(~mask, float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def timed(fn, reps, warm, gpu=False):
    sync = torch.cuda.synchronize if gpu else (lambda: None)
    with torch.no_grad():
        for _ in range(warm):
            fn()
        n = 1
        if gpu:
            sync()
            t0 = time.perf_counter()
            fn()
            sync()
            one = time.perf_counter() - t0
            n = 1 if one > 5e-3 else min(200, int(5e-3 / max(one, 1e-7)) + 1)
        t = []
        for _ in range(reps):
            sync()
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            sync()
            t.append((time.perf_counter() - t0) / n)
    return statistics.median(t)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--max-t", type=int, default=None)
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--heads", type=int, default=None)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--ember", default=None)
    ap.add_argument("--dtype", default="f32", choices=("f32", "bf16", "f16"))
    a = ap.parse_args()
    gpu = a.device == "cuda"
    a.max_t = a.max_t or (8192 if gpu else 4096)
    a.batch = a.batch or (4 if gpu else 1)
    a.heads = a.heads or (16 if gpu else 8)
    if gpu:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    if a.threads:
        torch.set_num_threads(a.threads)
    ember = {}
    if a.ember:
        for r in json.load(open(a.ember)):
            ember[(r["T"], r["D"], r["mask"])] = r
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[a.dtype]
    torch.manual_seed(0)
    print(f"attention sweep on {a.device}, B={a.batch} H={a.heads}, {a.dtype}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, median of {a.reps} (ms)")
    hdr = f"{'T':<6} {'D':<4} {'mask':<8} {'sdpa':>9} {'t.compile':>10}"
    if ember:
        hdr += f" {'ember eager':>12} {'ember comp':>11} {'vs sdpa':>8} {'vs t.comp':>9}"
    print(hdr)
    Ts = [t for t in (128, 512, 1024, 2048, 4096, 8192) if t <= a.max_t]
    for T in Ts:
        for D in (64, 128):
            for causal in (True, False):
                q, k, v = (torch.randn(a.batch, a.heads, T, D, device=a.device, dtype=dtype)
                           for _ in range(3))
                mask = (torch.arange(T, device=a.device) < 3 * T // 4).reshape(1, 1, 1, T)
                mask = mask.expand(a.batch, 1, 1, T).contiguous()
                ts = timed(lambda: F.scaled_dot_product_attention(
                    q, k, v, attn_mask=None if causal else mask, is_causal=causal), a.reps, 1, gpu)
                tc = float("nan")
                if not a.no_compile:
                    torch._dynamo.reset()
                    cf = torch.compile(manual, dynamic=False)
                    tc = timed(lambda: cf(q, k, v, mask, causal), a.reps, 2, gpu)
                name = "causal" if causal else "padding"
                line = f"{T:<6} {D:<4} {name:<8} {ts * 1e3:9.3f} {tc * 1e3:10.3f}"
                e = ember.get((T, D, name))
                if e:
                    ec = e["compiled_ms"]
                    line += (f" {e['eager_ms']:12.3f} {ec:11.3f} {ts * 1e3 / ec:7.2f}x"
                             f" {tc * 1e3 / ec:8.2f}x")
                print(line, flush=True)


if __name__ == "__main__":
    main()
