#!/usr/bin/env python3
"""The last step of `make bench`: one table of Ember against PyTorch.

  python3 bench/report.py --ember EMBER.json [--torch TORCH.json]
                          [--minilm MINILM.json] [--st ST.json] --out PREFIX

Reads bench_eager's --json (Ember eager and compiled, the floors measured in
the same job, first-call latencies) or bench_cuda's (the same schema, with
"device_type": "cuda": floors are the device copy and cuBLAS sgemm),
torch_bench.py's JSON when PyTorch was
importable, and optionally the MiniLM demo's and sentence-transformers'
throughput.  Prints the table, writes PREFIX.json (everything merged) and,
when gnuplot is installed, PREFIX.png.  Standard library only.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

LAZY = "the same eager code under em_lazy_begin, computed with em_realize (EMBER_JIT=1's path)"


def load(path):
    if not path or not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def fmt_ms(ms):
    if ms is None:
        return "-"
    return f"{ms * 1e3:.2f} us" if ms < 0.1 else f"{ms:.3f} ms"


def fmt_first(ms):
    return "-" if ms is None or ms < 0 else f"{ms:.0f} ms" if ms >= 10 else f"{ms:.1f} ms"


def ratio(a, b):
    return f"{a / b:.2f}x" if a and b else "-"


def merge(ember, torch):
    tw = {w["name"]: w for w in (torch or {}).get("workloads", [])}
    rows = []
    for w in ember["workloads"]:
        t = tw.get(w["name"], {})
        floor = w.get("floor_ms") or 0
        rows.append(dict(
            name=w["name"],
            ember_eager_ms=w["eager_ms"], ember_compiled_ms=w["compiled_ms"], ember_lazy_ms=w.get("lazy_ms"),
            torch_eager_ms=t.get("eager_ms"), torch_compiled_ms=t.get("compiled_ms"),
            speedup_vs_torch_eager=t["eager_ms"] / w["compiled_ms"] if t else None,
            speedup_vs_torch_compile=t["compiled_ms"] / w["compiled_ms"] if t else None,
            floor_ms=floor or None,
            ember_floor_fraction=floor / w["compiled_ms"] if floor else None,
            torch_compile_floor_fraction=floor / t["compiled_ms"] if floor and t else None,
            ember_cold_first_ms=w.get("cold_first_ms"), ember_warm_first_ms=w.get("warm_first_ms"),
            torch_cold_first_ms=t.get("cold_first_ms"), torch_warm_first_ms=t.get("warm_first_ms"),
        ))
    return rows


def on_cuda(ember):
    return ember.get("device_type") == "cuda"


def print_table(ember, torch, rows):
    if on_cuda(ember):
        print(f"\nEmber vs PyTorch on {ember['device']} (CUDA); floors measured in this job: "
              f"device copy {ember['copy_tbs']:.2f} TB/s (read + write), sgemm {ember['sgemm_tflops']:.1f} TFLOP/s")
    else:
        print(f"\nEmber vs PyTorch on the CPU ({ember['threads']} threads); floors measured in this job: "
              f"triad {ember['triad_gbs']:.1f} GB/s, sgemm {ember['sgemm_gflops']:.1f} GFLOP/s")
    if torch and on_cuda(ember):
        print(f"PyTorch {torch['torch']} on {torch.get('device', '?')}, TF32 off")
    elif torch:
        print(f"PyTorch {torch['torch']}, {torch['threads']} threads")
    else:
        print("PyTorch is not installed (python3 -c 'import torch' failed): Ember only")
    lazy = any(r["ember_lazy_ms"] is not None for r in rows)
    head = ["workload", "ember eager", "ember compiled"] + (["ember lazy"] if lazy else []) + [
        "torch eager", "torch.compile", "vs torch eager", "vs torch.compile", "of floor", "of floor (torch.compile)"]
    table = [head]
    for r in rows:
        fe, ft = r["ember_floor_fraction"], r["torch_compile_floor_fraction"]
        table.append([
            r["name"], fmt_ms(r["ember_eager_ms"]), fmt_ms(r["ember_compiled_ms"])] +
            ([fmt_ms(r["ember_lazy_ms"])] if lazy else []) + [
            fmt_ms(r["torch_eager_ms"]), fmt_ms(r["torch_compiled_ms"]),
            ratio(r["torch_eager_ms"], r["ember_compiled_ms"]),
            ratio(r["torch_compiled_ms"], r["ember_compiled_ms"]),
            f"{100 * fe:.0f}%" if fe else "-", f"{100 * ft:.0f}%" if ft else "-",
        ])
    print_rows(table)
    if lazy:
        print(f"ember lazy: {LAZY}.")
    print("'vs torch ...': that time over Ember's compiled time (above 1: Ember faster).")
    if on_cuda(ember):
        print("Medians of CUDA-event times; tiny_chain: wall time per call (2000 calls, one synchronize).")
        print("'of floor': the floor (bytes at the device copy bandwidth, or FLOP at the sgemm rate) over the time.")
    else:
        print("'of floor': the floor (bytes at the triad bandwidth, or FLOP at the sgemm rate) over the compiled time.")
    first = [["first compiled call", "ember cold", "ember warm", "torch.compile cold", "torch.compile warm"]]
    for r in rows:
        first.append([r["name"], fmt_first(r["ember_cold_first_ms"]), fmt_first(r["ember_warm_first_ms"]),
                      fmt_first(r["torch_cold_first_ms"]), fmt_first(r["torch_warm_first_ms"])])
    print()
    print_rows(first)
    print("cold: empty kernel/inductor cache, in the benchmark's process; warm: a new process, cache filled.")


def print_rows(table):
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for k, row in enumerate(table):
        print("  ".join(c.ljust(widths[i]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(row)))
        if k == 0:
            print("  ".join("-" * w for w in widths))


def print_minilm(minilm, st):
    if not minilm:
        return None
    out = dict(ember=minilm, sentence_transformers=st)
    print(f"\nMiniLM (all-MiniLM-L6-v2) on {minilm.get('device', 'cpu')}, {minilm['sentences']} sentences in one batch: "
          f"Ember eager {minilm['eager_sps']:.1f} sentences/s, compiled {minilm['compiled_sps']:.1f} sentences/s"
          + (f"; sentence-transformers {st['sps']:.1f} sentences/s (torch {st['torch']})" if st else
             "; sentence-transformers not installed"))
    return out


def plot(rows, have_torch, prefix, where):
    """Speed relative to PyTorch eager (or Ember eager without torch), per workload."""
    if not shutil.which("gnuplot"):
        print("gnuplot not found (apt-get install gnuplot-nox): no plot")
        return False
    base_key = "torch_eager_ms" if have_torch else "ember_eager_ms"
    series = [("Ember eager", "ember_eager_ms"), ("Ember compiled", "ember_compiled_ms")]
    if have_torch:
        series += [("PyTorch eager", "torch_eager_ms"), ("torch.compile", "torch_compiled_ms")]
    dat = prefix + ".dat"
    with open(dat, "w") as f:
        f.write("workload " + " ".join(f'"{s}"' for s, _ in series) + "\n")
        for r in rows:
            vals = [r[base_key] / r[k] if r.get(k) and r.get(base_key) else 0 for _, k in series]
            f.write(r["name"].replace("_", "\\\\_") + " " + " ".join(f"{v:.4f}" for v in vals) + "\n")
    base = "PyTorch eager" if have_torch else "Ember eager"
    script = f"""
set terminal pngcairo size 1100,600 font ",12"
set output "{prefix}.png"
set title "Speed relative to {base} (higher is better), {where}, medians"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.85 border -1
set boxwidth 0.9
set logscale y 2
set yrange [0.1:*]
set ytics ("0.125x" 0.125, "0.25x" 0.25, "0.5x" 0.5, "1x" 1, "2x" 2, "4x" 4, "8x" 8, "16x" 16, "32x" 32, "64x" 64)
set grid ytics
set key top left
set xtics nomirror
plot for [i=2:{len(series) + 1}] "{dat}" using i:xtic(1) title columnheader(i)
"""
    r = subprocess.run(["gnuplot"], input=script, text=True, capture_output=True)
    os.remove(dat)
    if r.returncode != 0:
        print("gnuplot failed: " + r.stderr.strip())
        return False
    return True


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ember", required=True)
    ap.add_argument("--torch", default="")
    ap.add_argument("--minilm", default="")
    ap.add_argument("--st", default="")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    ember = load(a.ember)
    if not ember:
        sys.exit(f"report.py: no Ember results in {a.ember}")
    torch = load(a.torch)
    rows = merge(ember, torch)
    print_table(ember, torch, rows)
    minilm = print_minilm(load(a.minilm), load(a.st))
    if on_cuda(ember):
        info = dict(device_type="cuda", device=ember["device"], copy_tbs=ember["copy_tbs"],
                    sgemm_tflops=ember["sgemm_tflops"])
    else:
        info = dict(threads=ember["threads"], triad_gbs=ember["triad_gbs"],
                    sgemm_gflops=ember["sgemm_gflops"], lazy=LAZY)
    result = dict(ember=info,
                  torch=dict(version=torch["torch"], threads=torch["threads"],
                             device=torch.get("device", "the CPU")) if torch else None,
                  workloads=rows, minilm=minilm)
    with open(a.out + ".json", "w") as f:
        json.dump(result, f, indent=1)
    png = plot(rows, torch is not None, a.out, ember["device"] + " (CUDA)" if on_cuda(ember) else "CPU")
    print(f"\nwrote {a.out}.json" + (f" and {a.out}.png" if png else ""))


if __name__ == "__main__":
    main()
