#!/usr/bin/env python3
"""torch_cold.py - issue 22: torch.compile's cold first call of the models
bench/bench_cold.c times in Ember, printed side by side with Ember's.

    python3 bench/torch_cold.py [--runs N] [--runs-10k N] [--cases gpt2,gpt2_block,minilm,mixed_1k,...]
                                [--model DIR] [--ember bench/cold.json]
    python3 bench/torch_cold.py --one CASE [--model DIR]   (one run, here)

Models (the same as bench_cold.c's):
  gpt2        GPT-2 small's 12 blocks (d 768, 12 heads, MLP 3072, causal
              attention written as a masked softmax, as Ember's is), then the
              final layer norm; input embeddings [2, 64, 768]; seeded random
              weights; torch.compile of the whole module;
  gpt2_block  one of those blocks;
  mixed_1k, mixed_10k, chain_10k, wide_10k  bench/synth.h's synthetic
              graphs, the same ops on x [64, 256] and y [256];
  minilm      the all-MiniLM-L6-v2 encoder (BERT, 6 layers, hidden 384) with
              mean pooling and L2 normalization, weights read from the model
              folder's model.safetensors, on the demo's three sentences
              (token ids from vocab.txt: the sentences are plain words).

Each run is a new Python process with new, empty TORCHINDUCTOR_CACHE_DIR and
TRITON_CACHE_DIR (so nothing of an earlier compile is reused): the model is
built and run once eagerly (untimed), then the first call of
torch.compile(model) is timed (Dynamo's trace, AOTAutograd, Inductor's
codegen and its C++ compiles, the run).  Peak RSS: the process's
(ru_maxrss) and the largest of its children's (Inductor's compile workers).
"""
import argparse
import json
import os
import re
import resource
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time

SENTENCES = ["A man is eating food.", "A man eats something.", "The sky is blue."]
DESCRIBE = {
    "gpt2": "GPT-2 small, 12 layers, one function",
    "gpt2_block": "GPT-2 small, one block",
    "gpt2_blocks": "GPT-2 small, 12 block functions",
    "minilm": "MiniLM-L6 encoder (demo, 3 sentences)",
    "mixed_1k": "synthetic mixed chain, 1,000 nodes",
    "mixed_10k": "synthetic mixed chain, 10,000 nodes",
    "chain_10k": "synthetic pointwise chain, 10,000 nodes",
    "wide_10k": "synthetic wide graph, 10,000 nodes",
    "gpt2_async": "GPT-2 small, one function, async compile",
    "minilm_async": "MiniLM-L6 encoder, async compile",
}


def gpt2_modules(torch, nlayers):
    nn, F = torch.nn, torch.nn.functional
    C, NH, HD = 768, 12, 64

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
            self.qkv, self.proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
            self.fc, self.out = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

        def attention(self, h):
            B, T, _ = h.shape
            q, k, v = self.qkv(h).split(C, dim=-1)
            q, k, v = (t.view(B, T, NH, HD).transpose(1, 2) for t in (q, k, v))
            att = (q @ k.transpose(-2, -1)) * (1.0 / HD ** 0.5)
            future = torch.ones(T, T, dtype=torch.bool, device=h.device).triu(1)
            att = torch.softmax(att.masked_fill(future, float("-inf")), dim=-1)
            return self.proj((att @ v).transpose(1, 2).reshape(B, T, C))

        def forward(self, x):
            x = x + self.attention(self.ln1(x))
            return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    class GPT2(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList(Block() for _ in range(nlayers))
            self.lnf = nn.LayerNorm(C)

        def forward(self, x):
            for b in self.blocks:
                x = b(x)
            return self.lnf(x)

    torch.manual_seed(22)
    model = (GPT2() if nlayers > 1 else Block()).eval()
    return model, (torch.randn(2, 64, C),)


def read_safetensors(torch, path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = bytearray(f.read())
    dtypes = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "I64": torch.int64}
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        a, b = e["data_offsets"]
        t = torch.frombuffer(data, dtype=dtypes[e["dtype"]], count=(b - a) // dtypes[e["dtype"]].itemsize,
                             offset=a) if b > a else torch.empty(0, dtype=dtypes[e["dtype"]])
        out[name] = t.reshape(e["shape"]).float().clone()
    return out


def minilm_module(torch, model_dir):
    nn, F = torch.nn, torch.nn.functional
    w = read_safetensors(torch, os.path.join(model_dir, "model.safetensors"))
    H, NH, L, EPS = 384, 12, 6, 1e-12

    class MiniLM(nn.Module):
        def __init__(self):
            super().__init__()
            self.p = nn.ParameterDict({k.replace(".", "_"): nn.Parameter(v, requires_grad=False)
                                       for k, v in w.items() if not k.endswith("position_ids")})

        def g(self, name):
            return self.p[name.replace(".", "_")]

        def lin(self, x, name):
            return F.linear(x, self.g(name + ".weight"), self.g(name + ".bias"))

        def ln(self, x, name):
            return F.layer_norm(x, (H,), self.g(name + ".weight"), self.g(name + ".bias"), EPS)

        def forward(self, ids, mask):
            B, T = ids.shape
            x = self.g("embeddings.word_embeddings.weight")[ids] + \
                self.g("embeddings.position_embeddings.weight")[:T] + \
                self.g("embeddings.token_type_embeddings.weight")[0]
            x = self.ln(x, "embeddings.LayerNorm")
            bias = (1.0 - mask)[:, None, None, :] * -1e9
            for i in range(L):
                p = f"encoder.layer.{i}."
                q, k, v = (self.lin(x, p + "attention.self." + n).view(B, T, NH, H // NH).transpose(1, 2)
                           for n in ("query", "key", "value"))
                att = torch.softmax(q @ k.transpose(-2, -1) / (H // NH) ** 0.5 + bias, dim=-1)
                a = self.lin((att @ v).transpose(1, 2).reshape(B, T, H), p + "attention.output.dense")
                x = self.ln(x + a, p + "attention.output.LayerNorm")
                h = self.lin(F.gelu(self.lin(x, p + "intermediate.dense")), p + "output.dense")
                x = self.ln(x + h, p + "output.LayerNorm")
            m = mask[:, :, None]
            pooled = (x * m).sum(1) / m.sum(1).clamp(min=1e-9)
            return F.normalize(pooled, dim=-1)

    vocab = {t: i for i, t in enumerate(open(os.path.join(model_dir, "vocab.txt"), encoding="utf-8").read().split("\n"))}
    rows = [[vocab["[CLS]"]] + [vocab.get(t, vocab["[UNK]"]) for t in re.findall(r"\w+|[^\w\s]", s.lower())] +
            [vocab["[SEP]"]] for s in SENTENCES]
    T = -(-max(len(r) for r in rows) // 8) * 8  # padded to a multiple of 8, as the demo does
    ids = torch.tensor([r + [0] * (T - len(r)) for r in rows])
    mask = torch.tensor([[1.0] * len(r) + [0.0] * (T - len(r)) for r in rows])
    return MiniLM().eval(), (ids, mask)


MEAN_EVERY = 50  # bench/synth.h's SY_MEAN_EVERY


def synth_module(torch, case):
    """bench/synth.h's graphs, op for op: chain links tanh(h), h * 0.9,
    h + y, h - 0.1; mixed: a mean over the last dim subtracted every 50
    nodes; wide: branches acc += tanh(x * c_b) + y, 5 nodes each."""
    kind, nodes = case.split("_")[0], 10000 if case.endswith("_10k") else 1000

    class Synth(torch.nn.Module):
        def forward(self, x, y):
            if kind == "wide":
                acc, i, b = None, 0, 0
                while i < nodes:
                    t = torch.tanh(x * (1.0 - 1e-4 * b)) + y
                    acc = t if acc is None else acc + t
                    i += 5 if b else 4
                    b += 1
                return acc
            h, i = x, 0
            while i < nodes:
                if kind == "mixed" and i % MEAN_EVERY == MEAN_EVERY - 2:
                    h = h - h.mean(dim=1, keepdim=True)
                    i += 1
                else:
                    h = (torch.tanh(h), h * 0.9, h + y, h - 0.1)[i % 4]
                i += 1
            return h

    g = torch.Generator().manual_seed(5)
    return Synth(), (torch.randn(64, 256, generator=g), torch.randn(256, generator=g))


def run_one(case, model_dir):
    import torch
    if case == "minilm":
        model, args = minilm_module(torch, model_dir)
    elif case in ("mixed_1k", "mixed_10k", "chain_10k", "wide_10k"):
        model, args = synth_module(torch, case)
    else:
        model, args = gpt2_modules(torch, 12 if case == "gpt2" else 1)
    with torch.no_grad():
        model(*args)  # eager, untimed
        compiled = torch.compile(model)
        t0 = time.perf_counter()
        compiled(*args)
        first = time.perf_counter() - t0
    self_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    kids_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(f"RESULT {case} {first:.4f} {self_mb:.1f} {kids_mb:.1f}", flush=True)


def run_child(case, model_dir):
    tmp = tempfile.mkdtemp(prefix="torch-cold-")
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=os.path.join(tmp, "inductor"),
               TRITON_CACHE_DIR=os.path.join(tmp, "triton"), TMPDIR=tmp)
    try:
        p = subprocess.run([sys.executable, os.path.abspath(__file__), "--one", case, "--model", model_dir],
                           env=env, capture_output=True, text=True, timeout=1800)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            _, _, first, rss, kids = line.split()
            return float(first), float(rss), float(kids)
    sys.stderr.write(f"torch_cold: {case} failed:\n{p.stderr[-2000:]}\n")
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--cases", default="gpt2,gpt2_block,minilm,mixed_1k,mixed_10k,chain_10k,wide_10k")
    ap.add_argument("--runs-10k", type=int, default=1,
                    help="runs of the 10,000-node graphs (about two minutes each)")
    ap.add_argument("--model", default=os.environ.get("EMBER_MODEL_DIR", "models/all-MiniLM-L6-v2"))
    ap.add_argument("--ember", help="bench_cold's --json output, printed beside torch.compile's")
    ap.add_argument("--one")
    a = ap.parse_args()
    if a.one:
        return run_one(a.one, a.model)
    import torch
    ember = json.load(open(a.ember)) if a.ember and os.path.exists(a.ember) else {}
    print(f"torch_cold: torch {torch.__version__}, torch.compile (inductor) cold first calls, "
          f"{torch.get_num_threads()} threads; medians of {a.runs} runs")
    rows = []
    for case in a.cases.split(","):
        if case == "minilm" and not os.path.exists(os.path.join(a.model, "model.safetensors")):
            print(f"{case:12s} skipped: no model files in {a.model}")
            continue
        runs = a.runs_10k if case.endswith("_10k") else a.runs
        got = [r for r in (run_child(case, a.model) for _ in range(runs)) if r]
        if not got:
            continue
        first = [g[0] for g in got]
        med = statistics.median(first)
        print(f"{case:12s} {DESCRIBE[case]:40s} {med:8.3f} s  ({min(first):.3f}-{max(first):.3f}, "
              f"{len(got)} runs)  peak RSS {statistics.median(g[1] for g in got):5.0f} MB  "
              f"children {statistics.median(g[2] for g in got):4.0f} MB")
        rows.append((case, med, got))
    if not ember:
        return
    print("\nside by side (cold first call, median; peak RSS, process + largest worker)")
    print(f"{'model':40s} {'Ember':>9s} {'torch.compile':>14s} {'ratio':>7s} {'Ember RSS':>16s} "
          f"{'torch RSS':>16s}")
    torch_of = {c: (m, g) for c, m, g in rows}
    for case, e in ember.items():
        tcase = "gpt2" if case in ("gpt2_blocks", "gpt2_async") else case.replace("_async", "")
        if tcase not in torch_of:
            continue
        m, g = torch_of[tcase]
        t_rss = f"{statistics.median(x[1] for x in g):.0f} + {statistics.median(x[2] for x in g):.0f} MB"
        e_rss = f"{e['peak_rss_mb']:.0f} + {e['worker_peak_rss_mb']:.0f} MB"
        print(f"{DESCRIBE[case]:40s} {e['first_call_s']:8.3f}s {m:13.3f}s {m / e['first_call_s']:6.1f}x "
              f"{e_rss:>16s} {t_rss:>16s}")


if __name__ == "__main__":
    main()
