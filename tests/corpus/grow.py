#!/usr/bin/env python3
"""Regenerates the mutants (m-*) of tests/corpus/<parser>/ from its seeds (ok-*).

Deterministic (seeded by the seed's name), so a rerun rewrites the same files:
    python3 tests/corpus/grow.py
Each seed gets the mutations that broke parsers before: truncation, flipped
bytes, numbers made huge or negative, a line dropped or doubled, an embedded
NUL, a very long line.  Fuzzer finds are kept as f-* (see README).
"""
import os, random, re, sys

HERE = os.path.dirname(os.path.abspath(__file__))
PARSERS = ["graph", "warmlist", "bundle", "plan", "meta"]
NUMBER = re.compile(rb"\d+")


def lines(b):
    return b.splitlines(keepends=True) or [b""]


def mutants(seed, rng):
    n = len(seed)
    out = {}
    out["trunc-half"] = seed[: n // 2]
    out["trunc-last"] = seed[: max(n - 1, 0)]
    flip = bytearray(seed)
    for _ in range(2):
        if flip:
            i = rng.randrange(len(flip))
            flip[i] ^= 1 << rng.randrange(8)
    out["flip"] = bytes(flip)
    nums = list(NUMBER.finditer(seed))
    if nums:
        m = rng.choice(nums)
        out["huge"] = seed[: m.start()] + b"99999999999999999999" + seed[m.end():]
        m = rng.choice(nums)
        out["neg"] = seed[: m.start()] + b"-" + seed[m.start():]
    ls = lines(seed)
    i = rng.randrange(len(ls))
    out["drop-line"] = b"".join(ls[:i] + ls[i + 1:])
    i = rng.randrange(n + 1)
    out["nul"] = seed[:i] + b"\0" + seed[i:]
    i = rng.randrange(n + 1)
    out["long-line"] = seed[:i] + b"7" * 5000 + seed[i:]
    return out


def main():
    for p in PARSERS:
        d = os.path.join(HERE, p)
        for f in os.listdir(d):
            if f.startswith("m-"):
                os.remove(os.path.join(d, f))
        for f in sorted(os.listdir(d)):
            if not f.startswith("ok-"):
                continue
            seed = open(os.path.join(d, f), "rb").read()
            rng = random.Random(p + "/" + f)
            stem, ext = os.path.splitext(f[3:])
            for name, data in mutants(seed, rng).items():
                with open(os.path.join(d, "m-%s-%s%s" % (stem, name, ext)), "wb") as out:
                    out.write(data)


if __name__ == "__main__":
    sys.exit(main())
