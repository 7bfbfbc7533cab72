#!/usr/bin/env python3
"""Ember against PyTorch in alternating rounds, for a noisy machine.

  python3 bench/rounds.py [--rounds N] [--reps R] [--only W1,W2,...]
                          [--minilm] [--model DIR] [--json FILE]

One `make bench` job compares Ember and PyTorch measured minutes apart, and
on the project's shared 2-core machines a ratio moves by 30% and more
between jobs (docs/benchmarks.md).  This runs, for each round, each
workload's `bench/bench_eager --only W` and then `bench/torch_bench.py
--only W` (and with --minilm the demo and sentence-transformers), one
process after the other, and reports for each the median over the rounds
of each round's median, and the ratio's median and range: a ratio taken
from runs seconds apart, many times.  Run from the build directory (`make
bench-rounds`).  Needs PyTorch; the MiniLM pair needs the model files and
sentence-transformers.  Standard library only.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def run_json(cmd, env=None):
    """Runs cmd (which writes --json to a temporary file); its JSON, or None."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    try:
        r = subprocess.run(cmd + ["--json", path], stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True, env=env, timeout=1800)
        if r.returncode != 0:
            sys.stderr.write(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr[-400:]}\n")
            return None
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError, subprocess.TimeoutExpired) as e:
        sys.stderr.write(f"{' '.join(cmd)}: {e}\n")
        return None
    finally:
        os.unlink(path)


def workload(doc, name):
    for w in (doc or {}).get("workloads", []):
        if w.get("name") == name:
            return w
    return None


def summary(xs):
    xs = [x for x in xs if x is not None]
    return (statistics.median(xs), min(xs), max(xs)) if xs else (None, None, None)


def fmt(v, unit="ms"):
    return "-" if v is None else f"{v:.3f} {unit}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=11)
    ap.add_argument("--only", default="mlp,attention_block,gpt2_small")
    ap.add_argument("--minilm", action="store_true", help="also the MiniLM demo against sentence-transformers")
    ap.add_argument("--model", default=os.environ.get("EMBER_MODEL_DIR", "models/all-MiniLM-L6-v2"))
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    if a.rounds < 1 or a.reps < 1:
        sys.exit("rounds.py: --rounds and --reps must be at least 1")
    names = [n for n in a.only.split(",") if n]
    rows = {n: {"ember_eager": [], "ember": [], "torch_eager": [], "torch": [], "ratio": []} for n in names}
    minilm = {"ember": [], "st": [], "ratio": []}
    sentences = os.path.join(HERE, "minilm_sentences.txt")
    for r in range(a.rounds):
        for n in names:
            e = workload(run_json(["./bench/bench_eager", "--only", n, "--reps", str(a.reps)]), n)
            t = workload(run_json([a.python, os.path.join(HERE, "torch_bench.py"), "--only", n,
                                   "--no-warm", "--reps", str(a.reps)]), n)
            row = rows[n]
            row["ember_eager"].append(e and e["eager_ms"])
            row["ember"].append(e and e["compiled_ms"])
            row["torch_eager"].append(t and t["eager_ms"])
            row["torch"].append(t and t["compiled_ms"])
            row["ratio"].append(t["compiled_ms"] / e["compiled_ms"] if e and t else None)
            print(f"round {r + 1}: {n}: Ember {fmt(e and e['compiled_ms'])}, "
                  f"torch.compile {fmt(t and t['compiled_ms'])}", flush=True)
        if a.minilm:
            with tempfile.TemporaryDirectory() as cache:
                env = dict(os.environ, EMBER_CACHE_DIR=cache)
                e = run_json(["./examples/minilm/minilm", "--reps", str(a.reps), "--file", sentences,
                              "--model", a.model], env=env)
            env = dict(os.environ, HF_HUB_OFFLINE="1")
            s = run_json([a.python, os.path.join(HERE, "minilm_st.py"), "--reps", str(a.reps),
                          "--file", sentences, "--model", a.model], env=env)
            minilm["ember"].append(e and e["compiled_sps"])
            minilm["st"].append(s and s["sps"])
            minilm["ratio"].append(e["compiled_sps"] / s["sps"] if e and s else None)
            print(f"round {r + 1}: MiniLM: Ember {fmt(e and e['compiled_sps'], 'sentences/s')}, "
                  f"sentence-transformers {fmt(s and s['sps'], 'sentences/s')}", flush=True)
    print(f"\nmedians of {a.rounds} alternating rounds ({a.reps} reps each); ratio: torch.compile's "
          "time over Ember compiled's (range in brackets)")
    print(f"{'workload':18} {'Ember eager':>12} {'Ember':>12} {'torch eager':>12} {'torch.compile':>14} "
          f"{'ratio':>18}")
    out = {"rounds": a.rounds, "reps": a.reps, "workloads": {}}
    for n in names:
        med = {k: summary(v) for k, v in rows[n].items()}
        rm, lo, hi = med["ratio"]
        ratio = "-" if rm is None else f"{rm:.2f}x ({lo:.2f}-{hi:.2f})"
        print(f"{n:18} {fmt(med['ember_eager'][0]):>12} {fmt(med['ember'][0]):>12} "
              f"{fmt(med['torch_eager'][0]):>12} {fmt(med['torch'][0]):>14} {ratio:>18}")
        out["workloads"][n] = {k: v[0] for k, v in med.items()} | {"rounds": rows[n]}
    if a.minilm:
        med = {k: summary(v) for k, v in minilm.items()}
        rm, lo, hi = med["ratio"]
        ratio = "-" if rm is None else f"{rm:.2f}x ({lo:.2f}-{hi:.2f})"
        print(f"MiniLM, sentences/s: Ember compiled {fmt(med['ember'][0], '')}, sentence-transformers "
              f"{fmt(med['st'][0], '')}, ratio {ratio}")
        out["minilm"] = {k: v[0] for k, v in med.items()} | {"rounds": minilm}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
