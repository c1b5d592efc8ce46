#!/usr/bin/env python3
"""Read a `snapserve generate --dump-logits FILE` dump into numpy.

Usage: python3 tools/read_logits.py FILE [--top 5]   (prints the top ids per position)
As a module: ids, logits = read_logits(path)   # int32[N], float32[N, vocab]
"""
import argparse
import struct
import sys

import numpy as np


def read_logits(path):
    with open(path, "rb") as f:
        head = f.read(32)
        if len(head) != 32 or head[:8] != b"SNAPLGT1":
            raise ValueError(f"{path}: not a snapserve logits dump")
        version, dtype, n, vocab = struct.unpack("<IIqq", head[8:])
        if version != 1 or dtype != 0:
            raise ValueError(f"{path}: unsupported version {version} / dtype {dtype}")
        ids = np.frombuffer(f.read(4 * n), dtype="<i4")
        logits = np.frombuffer(f.read(4 * n * vocab), dtype="<f4")
        if ids.size != n or logits.size != n * vocab:
            raise ValueError(f"{path}: truncated")
        return ids, logits.reshape(n, vocab)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file")
    ap.add_argument("--top", type=int, default=5)
    a = ap.parse_args()
    ids, logits = read_logits(a.file)
    for p in range(len(ids)):
        top = np.argsort(-logits[p], kind="stable")[: a.top]
        print(p, int(ids[p]), " ".join(f"{int(t)}:{logits[p, t]:.4f}" for t in top))


if __name__ == "__main__":
    sys.exit(main())
