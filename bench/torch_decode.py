#!/usr/bin/env python3
"""The decoder of examples/gpt2 in PyTorch, for `make bench-decode` (issue 20).

Runs the same model (weights from `gpt2_decode --save-weights`), the same
static KV cache written in place with index_copy_, the same additive mask
and greedy argmax, token by token, in three modes: eager, torch.compile
(default) and torch.compile(mode="reduce-overhead") (CUDA graphs).  A step's
latency runs from the call to its token on the host (next.cpu()), as
gpt2_decode times Ember's; the first 8 steps are not timed.  With --tokens
(gpt2_decode --tokens), the generated tokens are compared with Ember's;
with --ember (gpt2_decode --json) the table shows both side by side.

    python3 bench/torch_decode.py --weights w.bin --ctx 128 --batch 1 \
        --tokens tokens.txt --ember ember.json
"""
import argparse
import json
import math
import sys
import time

import torch
import torch.nn.functional as F

WARMUP = 8


class Decoder(torch.nn.Module):
    def __init__(self, w, layers, dim, heads, vocab, ctx, batch, dev):
        super().__init__()
        self.L, self.C, self.H, self.V, self.T, self.B = layers, dim, heads, vocab, ctx, batch
        self.D = dim // heads
        it = iter(w)
        take = lambda *shape: torch.nn.Parameter(next(it).reshape(shape).to(dev), requires_grad=False)
        self.wte, self.wpe = take(vocab, dim), take(ctx, dim)
        self.blocks = []
        for l in range(layers):
            names = ["ln1_w", "ln1_b", "w_qkv", "b_qkv", "w_proj", "b_proj",
                     "ln2_w", "ln2_b", "w_fc", "b_fc", "w_out", "b_out"]
            shapes = [(dim,), (dim,), (dim, 3 * dim), (3 * dim,), (dim, dim), (dim,),
                      (dim,), (dim,), (dim, 4 * dim), (4 * dim,), (4 * dim, dim), (dim,)]
            blk = {}
            for n, s in zip(names, shapes):
                p = take(*s)
                self.register_parameter(f"l{l}_{n}", p)
                blk[n] = p
            kc = torch.zeros(batch, heads, ctx, self.D, device=dev)
            vc = torch.zeros(batch, heads, ctx, self.D, device=dev)
            self.register_buffer(f"l{l}_k", kc)
            self.register_buffer(f"l{l}_v", vc)
            blk["k"], blk["v"] = kc, vc
            self.blocks.append(blk)
        self.lnf_w, self.lnf_b = take(dim), take(dim)
        self.register_buffer("pos", torch.zeros(1, dtype=torch.long, device=dev))
        self.register_buffer("history", torch.zeros(batch, ctx, dtype=torch.long, device=dev))
        self.register_buffer("keys", torch.arange(ctx, device=dev))

    def reset(self, first):
        with torch.no_grad():
            for b in self.blocks:
                b["k"].zero_()
                b["v"].zero_()
            self.pos.zero_()
            self.history.zero_()
            self.history[:, 0] = first

    def heads(self, t):
        return t.view(self.B, 1, self.H, self.D).transpose(1, 2)

    def forward(self):
        tok = self.history.index_select(1, self.pos)
        x = self.wte[tok] + self.wpe[self.pos]
        mask = torch.where(self.keys <= self.pos, 0.0, float("-inf")).view(1, 1, 1, self.T)
        for b in self.blocks:
            h = F.layer_norm(x, (self.C,), b["ln1_w"], b["ln1_b"], 1e-5)
            q, k, v = (h @ b["w_qkv"] + b["b_qkv"]).split(self.C, dim=-1)
            b["k"].index_copy_(2, self.pos, self.heads(k))
            b["v"].index_copy_(2, self.pos, self.heads(v))
            y = F.scaled_dot_product_attention(self.heads(q), b["k"], b["v"], attn_mask=mask)
            y = y.transpose(1, 2).reshape(self.B, 1, self.C)
            x = x + (y @ b["w_proj"] + b["b_proj"])
            h = F.layer_norm(x, (self.C,), b["ln2_w"], b["ln2_b"], 1e-5)
            h = F.gelu(h @ b["w_fc"] + b["b_fc"], approximate="tanh")
            x = x + (h @ b["w_out"] + b["b_out"])
        h = F.layer_norm(x, (self.C,), self.lnf_w, self.lnf_b, 1e-5)
        logits = h @ self.wte.t()
        nxt = logits.argmax(-1)
        p1 = self.pos + 1
        self.history.index_copy_(1, p1, nxt)
        self.pos.copy_(p1)
        return nxt


def run(model, step, steps, first, sync):
    model.reset(first)
    lat, host = [], []
    for i in range(steps):
        t0 = time.perf_counter()
        nxt = step()
        t1 = time.perf_counter()
        nxt.cpu()
        t2 = time.perf_counter()
        if i >= WARMUP:
            lat.append(t2 - t0)
            host.append(t1 - t0)
    sync()
    toks = model.history[:, : steps + 1].cpu().tolist()
    lat.sort()
    host.sort()
    pct = lambda a, p: a[max(0, min(len(a) - 1, math.ceil(p * len(a)) - 1))]
    n = len(lat)
    return {"p50_ms": pct(lat, 0.5) * 1e3, "p90_ms": pct(lat, 0.9) * 1e3, "p99_ms": pct(lat, 0.99) * 1e3,
            "host_us": pct(host, 0.5) * 1e6, "tokens_per_s": model.B * n / sum(lat)}, toks


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--weights", required=True)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--dim", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--ctx", type=int, default=128)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=-1)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--modes", default="eager,compile,reduce-overhead")
    ap.add_argument("--tokens", help="gpt2_decode --tokens file to compare with")
    ap.add_argument("--ember", help="gpt2_decode --json file to show beside")
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    steps = a.ctx - 1 if a.steps < 0 else a.steps
    C, V, T, L = a.dim, a.vocab, a.ctx, a.layers
    sizes = [V * C, T * C] + [C, C, C * 3 * C, 3 * C, C * C, C, C, C, C * 4 * C, 4 * C, 4 * C * C, C] * L + [C, C]
    flat = torch.from_file(a.weights, size=sum(sizes), dtype=torch.float32)
    w, off = [], 0
    for s in sizes:
        w.append(flat[off: off + s])
        off += s
    dev = torch.device(a.device)
    model = Decoder(w, L, C, a.heads, V, T, a.batch, dev)
    first = torch.tensor([(b * 7919 + 1) % V for b in range(a.batch)], device=dev)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    results, tokens = {}, {}
    with torch.no_grad():
        for mode in a.modes.split(","):
            if mode == "eager":
                step = model.forward
            elif mode == "compile":
                step = torch.compile(model.forward)
            elif mode == "reduce-overhead":
                step = torch.compile(model.forward, mode="reduce-overhead")
            else:
                sys.exit(f"torch_decode: unknown mode {mode}")
            results[mode], tokens[mode] = run(model, step, steps, first, sync)
            torch._dynamo.reset()
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name() if dev.type == 'cuda' else 'cpu'}: "
          f"batch {a.batch}, context {T}, {steps} tokens")
    ember = json.load(open(a.ember))["modes"] if a.ember else {}
    rows = [(f"ember {k}", v) for k, v in ember.items()] + [(f"torch {k}", v) for k, v in results.items()]
    print(f"{'':24} {'p50 ms':>9} {'p90 ms':>9} {'p99 ms':>9} {'host us':>9} {'tokens/s':>10}")
    for name, r in rows:
        print(f"{name:24} {r['p50_ms']:9.3f} {r['p90_ms']:9.3f} {r['p99_ms']:9.3f} {r['host_us']:9.1f} "
              f"{r['tokens_per_s']:10.1f}")
    if "reduce-overhead" in results:
        ro = results["reduce-overhead"]["p50_ms"]
        for k, v in ember.items():
            print(f"ember {k} p50 vs torch.compile reduce-overhead: {ro / v['p50_ms']:.2f}x")
    ref = next(iter(tokens.values()))
    for k, t in tokens.items():
        if t != ref:
            print(f"torch {k}: tokens differ from torch {next(iter(tokens))}")
    if a.tokens:
        mine = [[int(x) for x in line.split()] for line in open(a.tokens)]
        same = mine == ref
        where = ""
        if not same:
            for b, (x, y) in enumerate(zip(mine, ref)):
                d = next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), None)
                if d is not None:
                    where = f" (first at sequence {b}, token {d}: ember {x[d]}, torch {y[d]})"
                    break
        print(f"tokens: Ember's and PyTorch's {'are the same' if same else 'differ'}{where}")
    if a.json:
        json.dump({"torch": torch.__version__, "batch": a.batch, "ctx": T, "modes": results}, open(a.json, "w"))


if __name__ == "__main__":
    main()
