#!/usr/bin/env python3
"""SnapKV selection on a real model, computed from Hugging Face `transformers` attention.

For each layer the eager attention probabilities of the last W prompt queries (softmax over
all keys, causal mask inside the window — exactly what transformers computes) are summed
over the window queries, averaged (or maxed) over the query heads of each GQA group,
pooled (max or avg, kernel k, stride 1, padding k//2, avg counts the padding like
torch.avg_pool1d), and the top (B - W) prefix positions per KV head are kept (ties: the
lower position wins) plus the whole window. Writes the kept positions per layer and KV
head in the format of `snapserve generate --dump-kv-selection`, and can compare a dump.

  python3 tools/ref_snapkv_hf.py fixture [--model GGUF]       # -> tests/fixtures/kv_selection/smollm2_hf.json
  python3 tools/ref_snapkv_hf.py compare REF.json OURS.json   # per-head agreement
"""
import argparse
import datetime
import json
import os
import sys

import numpy as np

REPO_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_MODEL = os.path.expanduser("~/.cache/snapserve/SmolLM2-135M-Instruct.Q4_1.gguf")
OUT = os.path.join(REPO_DIR, "tests", "fixtures", "kv_selection", "smollm2_hf.json")

# A prompt with structure (a list of facts, then a question about one of them) so that the
# window's attention is peaked on a few places rather than flat.
FACTS = [
    ("Amsterdam", "tulips"), ("Berlin", "pretzels"), ("Cairo", "papyrus"), ("Dublin", "harps"),
    ("Edinburgh", "bagpipes"), ("Florence", "leather"), ("Geneva", "watches"), ("Helsinki", "saunas"),
    ("Istanbul", "carpets"), ("Jakarta", "batik"), ("Kyoto", "temples"), ("Lisbon", "tiles"),
    ("Madrid", "flamenco"), ("Nairobi", "coffee"), ("Oslo", "fjords"), ("Prague", "puppets"),
    ("Quito", "roses"), ("Rome", "fountains"), ("Seoul", "kimchi"), ("Toronto", "hockey"),
]


def prompt_text():
    lines = ["Below is a list of cities and what each is known for in this story.", ""]
    for i, (city, thing) in enumerate(FACTS):
        lines.append(f"Fact {i + 1}: In the story, the city of {city} is famous for its {thing}, "
                     f"and every visitor to {city} talks about the {thing} for days.")
    lines += ["", "Question: In the story, what is the city of Kyoto famous for?", "Answer:"]
    return "\n".join(lines)


def pool1d(x, k, kind):
    pad = k // 2
    if kind == "max":
        xp = np.concatenate([np.full(pad, -np.inf, np.float32), x, np.full(pad, -np.inf, np.float32)])
        return np.max(np.stack([xp[i:i + len(x)] for i in range(k)]), axis=0)
    xp = np.concatenate([np.zeros(pad, np.float32), x, np.zeros(pad, np.float32)])
    return np.sum(np.stack([xp[i:i + len(x)] for i in range(k)]), axis=0) / k


def select(probs_window, num_kv_heads, budget, window, kernel, pooling, gqa):
    """probs_window: [num_heads, W, N] attention probabilities of the window queries."""
    num_heads, w, n = probs_window.shape
    if n <= budget:
        return [list(range(n)) for _ in range(num_kv_heads)]
    group = num_heads // num_kv_heads
    scores = probs_window[:, :, : n - w].sum(axis=1)  # [num_heads, N - W]
    scores = scores.reshape(num_kv_heads, group, n - w)
    agg = scores.mean(axis=1) if gqa == "mean" else scores.max(axis=1)
    kept = []
    for g in range(num_kv_heads):
        pooled = pool1d(agg[g].astype(np.float32), kernel, pooling)
        order = np.lexsort((np.arange(n - w), -pooled))  # by score desc, then position asc
        top = np.sort(order[: budget - w])
        kept.append([int(p) for p in top] + list(range(n - w, n)))
    return kept


def cmd_fixture(a):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    d, f = os.path.split(os.path.abspath(a.model))
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32,
                                                 attn_implementation="eager")
    model.eval()
    ids = tok(prompt_text())["input_ids"]
    cfg = model.config
    with torch.no_grad():
        out = model(torch.tensor([ids]), output_attentions=True)
    layers = []
    for li, att in enumerate(out.attentions):
        probs = att[0, :, -a.window:, :].float().numpy()  # [heads, W, N]
        layers.append({"layer": li, "heads": select(probs, cfg.num_key_value_heads, a.budget, a.window,
                                                     a.kernel, a.pooling, a.gqa)})
    doc = {
        "generator": "tools/ref_snapkv_hf.py fixture",
        "date": datetime.date.today().isoformat(),
        "source": "transformers eager attention probabilities (float32) of the GGUF model",
        "model_file": os.path.basename(a.model),
        "policy": "snapkv",
        "prompt_tokens": len(ids),
        "ids": ids,
        "budget": a.budget, "window": a.window, "kernel": a.kernel, "pooling": a.pooling, "gqa": a.gqa,
        "layers": layers,
    }
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as fh:
        json.dump(doc, fh, separators=(",", ":"))
    print(f"wrote {a.out}: {len(ids)} tokens, {len(layers)} layers")


def agreement(ref, ours):
    """Per (layer, head): |kept_ref ∩ kept_ours| / |kept_ref|."""
    out = []
    for lr, lo in zip(ref["layers"], ours["layers"]):
        for hr, ho in zip(lr["heads"], lo["heads"]):
            out.append(len(set(hr) & set(ho)) / max(1, len(hr)))
    return np.array(out)


def cmd_compare(a):
    ref, ours = json.load(open(a.ref)), json.load(open(a.ours))
    ag = agreement(ref, ours)
    print(f"heads {len(ag)}: min agreement {ag.min():.4f}, mean {ag.mean():.4f}, "
          f"heads below 0.95: {(ag < 0.95).sum()}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    fx = sub.add_parser("fixture")
    fx.add_argument("--model", default=DEFAULT_MODEL)
    fx.add_argument("--budget", type=int, default=128)
    fx.add_argument("--window", type=int, default=32)
    fx.add_argument("--kernel", type=int, default=7)
    fx.add_argument("--pooling", default="max", choices=["max", "avg"])
    fx.add_argument("--gqa", default="mean", choices=["mean", "max"])
    fx.add_argument("--out", default=OUT)
    cp = sub.add_parser("compare")
    cp.add_argument("ref")
    cp.add_argument("ours")
    a = ap.parse_args()
    return cmd_fixture(a) if a.cmd == "fixture" else cmd_compare(a)


if __name__ == "__main__":
    sys.exit(main())
