#!/usr/bin/env python3
"""Which needle positions a KV policy kept: a task (or eval record) beside a selection dump.

`snapserve eval tasks` / `eval run` records carry `needle_tokens` (each needle's prompt
positions [begin, end)); `snapserve generate --dump-kv-selection FILE` writes the kept
prompt positions per layer and KV head. This prints, per layer, how much of each needle
every KV head kept (whole sentence, and its last `--tail` tokens: for niah needles with
SmolLM2's one-token digits that is the 7-digit value and the period), and where the kept
positions of the whole cache lie (share in each tenth of the prompt), so a failing record
can be read as "the value was dropped in layers X" or "the value was kept and the model
still missed it".

  python3 tools/eval_needle_kept.py TASK.jsonl[:LINE] SELECTION.json [--tail 8]
"""
import argparse
import json
import sys


def load_task(spec):
    path, _, line = spec.partition(":")
    with open(path) as f:
        rows = [json.loads(l) for l in f if l.strip()]
    i = int(line) if line else 0
    if not 0 <= i < len(rows):
        sys.exit(f"eval_needle_kept: {path} has {len(rows)} lines, no line {i}")
    r = rows[i]
    if "needle_tokens" not in r:
        sys.exit(f"eval_needle_kept: {path}:{i} has no needle_tokens (written by an older snapserve)")
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("task", help="JSONL of eval tasks or records, optionally :LINE (0-based, default 0)")
    ap.add_argument("selection", help="snapserve generate --dump-kv-selection output")
    ap.add_argument("--tail", type=int, default=8, help="tokens at a needle's end counted as its value (default 8)")
    a = ap.parse_args()
    task = load_task(a.task)
    with open(a.selection) as f:
        sel = json.load(f)
    n = sel["compressed_tokens"]
    if "prompt_tokens" in task and sel.get("prompt_tokens") not in (None, task["prompt_tokens"]):
        print(f"warning: selection has {sel.get('prompt_tokens')} prompt tokens, task {task['prompt_tokens']}")
    spans = [tuple(s) for s in task["needle_tokens"]]
    print(f"prompt {sel.get('prompt_tokens')} tokens, compressed {n}, policy {sel.get('policy')} "
          f"budget {sel.get('budget')} window {sel.get('window')} kernel {sel.get('kernel')} "
          f"pooling {sel.get('pooling')} gqa {sel.get('gqa')}")
    for k, (b, e) in enumerate(spans):
        print(f"needle {k}: positions [{b}, {e}) = {100.0 * b / max(n, 1):.0f}% of the compressed prefix: "
              f"{task['needles'][k]!r}")
    tenths_total = [0] * 10
    whole_layers = [0] * len(spans)
    print("layer  " + "  ".join(f"needle{k} kept/len, value kept per head" for k in range(len(spans))))
    for li, layer in enumerate(sel["layers"]):
        cols = []
        for k, (b, e) in enumerate(spans):
            vb = max(b, e - a.tail)
            per_head = []
            all_heads_value = True
            for kept in layer["heads"]:
                s = set(kept)
                whole = sum(1 for p in range(b, e) if p in s)
                val = sum(1 for p in range(vb, e) if p in s)
                per_head.append(f"{whole}/{e - b}:{val}/{e - vb}")
                all_heads_value &= val == e - vb
            whole_layers[k] += 1 if all_heads_value else 0
            cols.append(" ".join(per_head))
        for kept in layer["heads"]:
            for p in kept:
                if p < n:
                    tenths_total[min(9, p * 10 // n)] += 1
        print(f"{li:5d}  " + "   ".join(cols))
    for k in range(len(spans)):
        print(f"needle {k}: value kept by every head in {whole_layers[k]} of {len(sel['layers'])} layers")
    tot = sum(tenths_total) or 1
    print("kept positions by tenth of the prompt: " +
          " ".join(f"{100.0 * c / tot:.0f}%" for c in tenths_total))


if __name__ == "__main__":
    main()
