#!/usr/bin/env python3
"""Plain numpy reference of the KV-cache selection algorithms (worker/kv/selection.h) and
the writer of tests/fixtures/kv_selection/ for tests/worker/test_kv_selection.cpp.

Written from the algorithm descriptions, SnapKV following the steps of the official code:
logits = q_win @ K^T / sqrt(d) in float32, causal mask inside the window only, float32
softmax (max subtracted), sum over the window rows of the prefix columns, mean/max over the
query heads of a GQA group, 1-D pooling (max: -inf padding; avg: zero padding, divided by k
always = PyTorch count_include_pad=True), top-k with ties to the lower position (stable sort
on -score), plus the window. Also AdaKV, H2O, StreamingLLM and PyramidKV budgets.

Fixtures: inputs/<set>.k.bin ([num_kv_heads, N, head_dim] f32) and <set>.q.bin
([num_queries, num_heads, head_dim] f32, the queries of the last num_queries positions),
manifest.json with the shapes, the cases (params + expected kept positions per KV head) and
the PyramidKV budgets. The C++ scores are f32 with a different summation order, so a case
is only written when no two distinct scores near its top-k boundary are closer than
MARGIN (relative); otherwise the input set is redrawn with the next seed.

Usage: python3 tools/kv_selection_reference.py [repo_root]   (deterministic)
"""
import json
import math
import os
import sys

import numpy as np

MARGIN = 2e-5


class MarginError(Exception):
    pass


# --- scores ------------------------------------------------------------------------
def softmax_rows_f32(logits):
    """Row softmax in float32 (max subtracted); -inf entries give 0."""
    m = logits.max(axis=-1, keepdims=True)
    e = np.exp(logits - m, dtype=np.float32)
    return (e / e.sum(axis=-1, keepdims=True, dtype=np.float32)).astype(np.float32)


def group_of(h, num_heads, num_kv_heads):
    return h // (num_heads // num_kv_heads)


def aggregate(per_head, num_kv_heads, how):
    """per_head: [num_heads, n] -> [num_kv_heads, n] by mean or max over each group."""
    num_heads, n = per_head.shape
    g = per_head.reshape(num_kv_heads, num_heads // num_kv_heads, n)
    return (g.mean(axis=1, dtype=np.float32) if how == "mean" else g.max(axis=1)).astype(np.float32)


def pool1d(s, kernel, pooling):
    half = kernel // 2
    n = s.shape[-1]
    if pooling == "max":
        padded = np.concatenate([np.full(half, -np.inf, np.float32), s, np.full(half, -np.inf, np.float32)])
        return np.stack([padded[j:j + kernel].max() for j in range(n)]).astype(np.float32)
    padded = np.concatenate([np.zeros(half, np.float32), s, np.zeros(half, np.float32)])
    return np.stack([padded[j:j + kernel].sum(dtype=np.float32) / np.float32(kernel) for j in range(n)]).astype(np.float32)


def window_scores(q, k, window):
    """q: [num_queries, num_heads, d] (last positions), k: [num_kv_heads, N, d].
    Returns [num_heads, N - window]: sum over the window rows of softmax probabilities."""
    num_heads, d = q.shape[1], q.shape[2]
    num_kv_heads, n = k.shape[0], k.shape[1]
    qw = q[-window:]
    out = np.zeros((num_heads, n - window), np.float32)
    for h in range(num_heads):
        kg = k[group_of(h, num_heads, num_kv_heads)]
        logits = (qw[:, h, :] @ kg.T) / np.float32(math.sqrt(d))
        logits = logits.astype(np.float32)
        pos = np.arange(n - window, n)[:, None]
        logits[np.arange(n)[None, :] > pos] = -np.inf
        p = softmax_rows_f32(logits)
        out[h] = p[:, : n - window].sum(axis=0, dtype=np.float32)
    return out


def snapkv_scores(q, k, p):
    per_head = window_scores(q, k, p["window"])
    grouped = aggregate(per_head, k.shape[0], p["aggregation"])
    return np.stack([pool1d(s, p["kernel"], p["pooling"]) for s in grouped])


def h2o_scores(q, k):
    """Accumulated attention of every query i >= j, [num_heads, N]; q holds all N queries."""
    num_heads, d = q.shape[1], q.shape[2]
    num_kv_heads, n = k.shape[0], k.shape[1]
    out = np.zeros((num_heads, n), np.float32)
    for h in range(num_heads):
        kg = k[group_of(h, num_heads, num_kv_heads)]
        logits = ((q[:, h, :] @ kg.T) / np.float32(math.sqrt(d))).astype(np.float32)
        logits[np.triu(np.ones((n, n), bool), 1)] = -np.inf
        out[h] = softmax_rows_f32(logits).sum(axis=0, dtype=np.float32)
    return out


# --- selection -----------------------------------------------------------------------
def check_margin(values, kept_mask):
    """Distinct values within MARGIN of the kept/dropped boundary could swap in f32."""
    if kept_mask.all() or not kept_mask.any():
        return
    for b in (values[kept_mask].min(), values[~kept_mask].max()):
        near = np.abs(values - b) <= MARGIN * abs(b)
        if not np.all(values[near] == b):
            raise MarginError()


def top_positions(s, m):
    """The m best by (score desc, position asc), ascending positions."""
    order = np.lexsort((np.arange(len(s)), -s))
    kept = np.sort(order[:m])
    mask = np.zeros(len(s), bool)
    mask[kept] = True
    check_margin(s, mask)
    return kept


def snapkv_select(q, k, p):
    n, b, w = k.shape[1], p["budget"], p["window"]
    if n <= b:
        return [list(range(n))] * k.shape[0]
    scores = snapkv_scores(q, k, p)
    return [top_positions(s, b - w).tolist() + list(range(n - w, n)) for s in scores]


def adakv_select(q, k, p):
    n, b, w, alpha = k.shape[1], p["budget"], p["window"], p["alpha"]
    num_kv = k.shape[0]
    if n <= b:
        return [list(range(n))] * num_kv
    scores = snapkv_scores(q, k, p)
    share = b - w
    safeguard = math.floor(alpha * share)
    kept = [set(top_positions(s, safeguard).tolist()) for s in scores]
    cand = [(s_val, g, j) for g in range(num_kv) for j, s_val in enumerate(scores[g]) if j not in kept[g]]
    vals = np.array([c[0] for c in cand], np.float32)
    order = np.lexsort((np.array([c[2] for c in cand]), np.array([c[1] for c in cand]), -vals))
    rest = num_kv * (share - safeguard)
    mask = np.zeros(len(cand), bool)
    mask[order[:rest]] = True
    check_margin(vals, mask)
    for c in order[:rest]:
        kept[cand[c][1]].add(cand[c][2])
    return [sorted(s) + list(range(n - w, n)) for s in kept]


def streaming_select(n, num_kv, p):
    b, sink = p["budget"], p["num_sink"]
    if n <= b:
        return [list(range(n))] * num_kv
    return [list(range(sink)) + list(range(n - (b - sink), n))] * num_kv


def h2o_select(q, k, p):
    n, b = k.shape[1], p["budget"]
    recent = b // 2 if p["recent"] < 0 else p["recent"]
    if n <= b:
        return [list(range(n))] * k.shape[0]
    grouped = aggregate(h2o_scores(q, k), k.shape[0], p["aggregation"])
    return [top_positions(s[: n - recent], b - recent).tolist() + list(range(n - recent, n)) for s in grouped]


def pyramid_budgets(num_layers, avg_budget, window, beta=20):
    share = avg_budget - window
    if num_layers == 1:
        return [avg_budget]
    lo = max(1, share // beta)
    hi = 2 * share - lo
    spread, den = hi - lo, num_layers - 1

    floors = [hi - (l * spread + den - 1) // den for l in range(num_layers)]  # floor(r_l)
    extra = num_layers * share - sum(floors)  # < num_layers: +1 to the first `extra` layers
    return [window + f + (1 if l < extra else 0) for l, f in enumerate(floors)]


# --- fixtures -------------------------------------------------------------------------
# name, N, num_heads, num_kv_heads, head_dim, num_queries (N: H2O possible), first seed
SETS = [
    ("a", 40, 4, 4, 16, 40, 1),
    ("b", 64, 9, 3, 64, 32, 2),
    ("c", 333, 8, 2, 16, 32, 3),
    ("d", 1000, 8, 2, 16, 32, 4),
    ("e", 120, 8, 2, 16, 120, 5),
]


def snap(budget, window, kernel, pooling, aggregation):
    return {"budget": budget, "window": window, "kernel": kernel, "pooling": pooling, "aggregation": aggregation}


CASES = {
    "a": [("snapkv", snap(12, 4, 3, "max", "mean")), ("snapkv", snap(20, 8, 1, "avg", "max")),
          ("snapkv", snap(64, 8, 7, "max", "mean")), ("snapkv", snap(40, 4, 3, "avg", "mean")),
          ("adakv", dict(snap(16, 4, 3, "max", "mean"), alpha=0.2)),
          ("h2o", {"budget": 12, "recent": -1, "aggregation": "mean"}),
          ("h2o", {"budget": 64, "recent": -1, "aggregation": "mean"}),
          ("streaming", {"budget": 12, "num_sink": 4}), ("streaming", {"budget": 40, "num_sink": 4})],
    "b": [("snapkv", snap(24, 8, 7, "max", "mean")), ("snapkv", snap(40, 8, 7, "avg", "mean")),
          ("snapkv", snap(33, 32, 3, "max", "max")), ("snapkv", snap(48, 4, 1, "avg", "max")),
          ("adakv", dict(snap(24, 8, 7, "max", "mean"), alpha=0.2)),
          ("adakv", dict(snap(40, 8, 3, "avg", "max"), alpha=0.5))],
    "c": [("snapkv", snap(100, 32, 7, "max", "mean")), ("snapkv", snap(64, 32, 7, "avg", "max")),
          ("snapkv", snap(128, 8, 3, "max", "max")), ("snapkv", snap(50, 4, 1, "avg", "mean")),
          ("adakv", dict(snap(100, 32, 7, "max", "mean"), alpha=0.2)),
          ("adakv", dict(snap(64, 8, 5, "avg", "mean"), alpha=0.0)),
          ("streaming", {"budget": 100, "num_sink": 4})],
    "d": [("snapkv", snap(200, 32, 7, "max", "mean")), ("snapkv", snap(300, 32, 7, "avg", "mean")),
          ("snapkv", snap(128, 16, 3, "max", "max")),
          ("adakv", dict(snap(200, 32, 7, "max", "mean"), alpha=0.2))],
    "e": [("snapkv", snap(40, 8, 3, "max", "mean")),
          ("h2o", {"budget": 40, "recent": -1, "aggregation": "mean"}),
          ("h2o", {"budget": 30, "recent": 6, "aggregation": "max"}),
          ("h2o", {"budget": 64, "recent": 0, "aggregation": "mean"}),
          ("adakv", dict(snap(40, 8, 3, "max", "max"), alpha=1.0))],
}

PYRAMID = [(30, 1024, 32), (30, 128, 32), (30, 40, 32), (32, 2048, 32), (2, 100, 8), (1, 64, 16), (7, 50, 10),
           (24, 512, 16, 5)]


def draw(name, n, heads, kv, d, nq, seed):
    rng = np.random.default_rng(seed)
    k = rng.standard_normal((kv, n, d), dtype=np.float32)
    q = (2.0 * rng.standard_normal((nq, heads, d))).astype(np.float32)
    return q, k


def run_case(kind, q, k, p):
    if kind == "snapkv":
        return snapkv_select(q, k, p)
    if kind == "adakv":
        return adakv_select(q, k, p)
    if kind == "h2o":
        return h2o_select(q, k, p)
    return streaming_select(k.shape[1], k.shape[0], p)


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    out_dir = os.path.join(root, "tests", "fixtures", "kv_selection")
    os.makedirs(out_dir, exist_ok=True)
    manifest = {"sets": [], "cases": [], "pyramid": []}
    for name, n, heads, kv, d, nq, seed in SETS:
        for attempt in range(50):
            q, k = draw(name, n, heads, kv, d, nq, seed + 1000 * attempt)
            try:
                results = [run_case(kind, q, k, p) for kind, p in CASES[name]]
                break
            except MarginError:
                continue
        else:
            raise SystemExit(f"set {name}: no seed with a safe margin")
        q.tofile(os.path.join(out_dir, f"{name}.q.bin"))
        k.tofile(os.path.join(out_dir, f"{name}.k.bin"))
        manifest["sets"].append({"name": name, "num_tokens": n, "num_heads": heads, "num_kv_heads": kv,
                                 "head_dim": d, "num_queries": nq, "seed": seed + 1000 * attempt})
        for (kind, p), kept in zip(CASES[name], results):
            manifest["cases"].append({"set": name, "kind": kind, "params": p,
                                      "kept": [[int(x) for x in h] for h in kept]})
        print(f"set {name}: seed {seed + 1000 * attempt}, {len(CASES[name])} cases")
    for args in PYRAMID:
        manifest["pyramid"].append({"num_layers": args[0], "avg_budget": args[1], "window": args[2],
                                    "beta": args[3] if len(args) > 3 else 20, "budgets": pyramid_budgets(*args)})
    with open(os.path.join(out_dir, "manifest.json"), "w") as f:
        json.dump(manifest, f, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
