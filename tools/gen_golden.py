#!/usr/bin/env python3
"""Writes the golden logit fixtures under tests/fixtures/golden/ that the C++ tests compare
against. Golden values come from Hugging Face `transformers` (float32); the numpy reference
(tools/reference_llama.py) is run on the same ids as a cross-check and its agreement is
recorded in each fixture. Needs transformers, torch, accelerate, gguf, safetensors.

  python3 tools/gen_golden.py smollm2 [--model PATH]   # -> smollm2_q4_1.json
  python3 tools/gen_golden.py tiny                     # -> tiny_<name>.json
"""

import argparse
import datetime
import hashlib
import json
import os
import shlex
import subprocess
import sys
import tempfile

import numpy as np

TOOLS_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_DIR = os.path.dirname(TOOLS_DIR)
GOLDEN_DIR = os.path.join(REPO_DIR, "tests", "fixtures", "golden")
sys.path.insert(0, TOOLS_DIR)

import reference_gemma3  # noqa: E402
import reference_llama  # noqa: E402

DEFAULT_MODEL = os.path.expanduser("~/.cache/snapserve/SmolLM2-135M-Instruct.Q4_1.gguf")
FIXED_IDS = [0, 1, 2, 100, 1000, 30000, 49151]
TOP_K = 10
NUM_GREEDY = 32
MAX_POSITIONS = 64


# --- helpers ------------------------------------------------------------------------


def sig6(x):
    """Round to 6 significant digits, keep as a JSON number."""
    return float(f"{float(x):.6g}")


def sha256_of(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def versions():
    import gguf  # noqa: F401
    import importlib.metadata as md
    import torch
    import transformers
    return {
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "gguf": md.version("gguf"),
        "numpy": np.__version__,
        "safetensors": md.version("safetensors"),
    }


def header(extra):
    out = {
        "generator": "tools/gen_golden.py",
        "date": datetime.date.today().isoformat(),
        "versions": versions(),
    }
    out.update(extra)
    return out


def hf_logits(model, ids):
    import torch
    with torch.no_grad():
        return model(torch.tensor([ids], dtype=torch.long)).logits[0].float().numpy()


def hf_greedy(model, ids, num_new):
    """Greedy by full recomputation; does not stop at EOS so the length is fixed.
    Returns (new ids, top1 - top2 logit margin at each step)."""
    seq = list(ids)
    new, margins = [], []
    for _ in range(num_new):
        row = hf_logits(model, seq)[-1]
        top2 = np.argsort(-row, kind="stable")[:2]
        new.append(int(top2[0]))
        margins.append(sig6(row[top2[0]] - row[top2[1]]))
        seq.append(int(top2[0]))
    return new, margins


def position_records(logits, num_positions, fixed_ids):
    recs = []
    for t in range(num_positions):
        row = logits[t]
        top = np.argsort(-row, kind="stable")[:TOP_K]
        recs.append({
            "top_ids": [int(i) for i in top],
            "top_logits": [sig6(row[i]) for i in top],
            "fixed_logits": [sig6(row[i]) for i in fixed_ids],
        })
    return recs


def write_fixture(name, data):
    os.makedirs(GOLDEN_DIR, exist_ok=True)
    path = os.path.join(GOLDEN_DIR, name)
    with open(path, "w") as f:
        json.dump(data, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {path} ({os.path.getsize(path)} bytes)")
    return path


# --- SmolLM2 (GGUF Q4_1) ------------------------------------------------------------


def smollm2_prompts(tok):
    chat = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True, tokenize=False)
    plain = ("Water boils at one hundred degrees Celsius at sea level. At higher altitudes "
             "the air pressure is lower, so water boils at a lower temperature and cooking "
             "takes longer.")
    return [
        {"name": "chat_capital_of_france", "format": "chatml", "text": chat,
         "ids": tok(chat, add_special_tokens=False)["input_ids"]},
        {"name": "plain_water_boils", "format": "plain", "text": plain,
         "ids": tok(plain)["input_ids"]},
    ]


def run_smollm2(model_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory, filename = os.path.split(os.path.abspath(model_path))
    tok = AutoTokenizer.from_pretrained(directory, gguf_file=filename)
    model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=filename,
                                                 dtype=torch.float32)
    model.eval()
    cfg, weights = reference_llama.load_gguf(model_path)

    prompts = smollm2_prompts(tok)
    max_diff = 0.0
    all_agree = True
    for p in prompts:
        ids = p["ids"]
        assert len(ids) <= MAX_POSITIONS, f"prompt {p['name']} has {len(ids)} tokens"
        greedy, margins = hf_greedy(model, ids, NUM_GREEDY)
        full = ids + greedy
        ref = hf_logits(model, full)                       # prompt + continuation
        mine = reference_llama.forward(cfg, weights, full)
        diff = float(np.max(np.abs(ref - mine)))
        np_greedy = reference_llama.greedy(cfg, weights, ids, NUM_GREEDY)
        agree = np_greedy == greedy
        print(f"{p['name']}: {len(ids)} tokens, numpy vs transformers max |dlogit| "
              f"{diff:.3g} over {len(full)} positions, greedy agree {agree}")
        print(f"  continuation: {tok.decode(greedy)!r}")
        max_diff = max(max_diff, diff)
        all_agree &= agree
        p["positions"] = position_records(ref, len(ids), FIXED_IDS)
        p["greedy"] = greedy
        p["greedy_text"] = tok.decode(greedy)
        p["greedy_margins"] = margins
        p["numpy_max_abs_logit_diff"] = sig6(diff)
        p["numpy_greedy_agrees"] = agree

    data = header({
        "model_file": filename,
        "model_sha256": sha256_of(model_path),
        "golden_source": "transformers AutoModelForCausalLM.from_pretrained(dir, gguf_file=..., "
                         "dtype=float32), full recomputation per step",
        "tokenizer": "transformers AutoTokenizer from the same GGUF (ids are fed directly)",
        "notes": "positions[t] holds the logits after feeding ids[0..t]; greedy continues "
                 "for exactly num_greedy tokens without stopping at EOS; greedy_margins[i] "
                 "is top1 - top2 logit at greedy step i (small margins are fragile)",
        "top_k": TOP_K,
        "fixed_ids": FIXED_IDS,
        "num_greedy": NUM_GREEDY,
        "eos_token_id": int(tok.eos_token_id),
        "cross_check": {
            "numpy_vs_transformers_max_abs_logit_diff": sig6(max_diff),
            "greedy_agree": all_agree,
        },
        "prompts": prompts,
    })
    write_fixture("smollm2_q4_1.json", data)
    return max_diff, all_agree


# --- tiny random checkpoints (tools/make_tiny_checkpoint.py) -----------------------

# 20 ids below every tiny vocab size (288 by default), with repeats.
TINY_IDS = [272, 65, 257, 104, 33, 270, 7, 119, 65, 198, 260, 31, 286, 150, 65, 257, 2,
            99, 210, 14]
# llama3 scaling only touches wavelengths >= original_max_position / high_freq_factor
# (2048 positions), so it barely moves logits over 20 tokens: that config runs 256 ids
# with larger weights (--scale 0.2), where dropping the scaling moves logits by ~1.
TINY_LONG_IDS = [(37 * i + 11) % 288 for i in range(256)]

# name -> (make_tiny_checkpoint.py arguments except --out, ids)
TINY_CONFIGS = {
    "llama_untied": (["--arch", "llama", "--no-tie", "--seed", "1"], TINY_IDS),
    "qwen2_bias": (["--arch", "qwen2", "--tie", "--seed", "2"], TINY_IDS),
    "mistral_swa": (["--arch", "mistral", "--no-tie", "--sliding-window", "7", "--seed", "3"],
                    TINY_IDS),
    "llama3_rope": (["--arch", "llama", "--no-tie", "--rope-scaling", "llama3",
                     "--rope-theta", "500000", "--max-position", "131072", "--scale", "0.2",
                     "--seed", "4"], TINY_LONG_IDS),
    "linear_rope": (["--arch", "llama", "--no-tie", "--rope-scaling", "linear", "--seed", "5"],
                    TINY_IDS),
    "head_dim": (["--arch", "llama", "--no-tie", "--hidden", "64", "--heads", "4",
                  "--kv-heads", "2", "--head-dim", "24", "--seed", "6"], TINY_IDS),
    # Gemma3ForCausalLM: layers 0 and 2 local (window 7, RoPE base 10^4), 1 and 3 global
    # (base 10^6), 20 ids so the window bites; head_dim 32 != query_pre_attn_scalar**0.5.
    "gemma3_swa": (["--arch", "gemma3", "--tie", "--layers", "4", "--head-dim", "32",
                    "--sliding-window", "7", "--sliding-window-pattern", "2",
                    "--rope-theta", "1000000", "--seed", "7"], TINY_IDS),
}
TINY_GREEDY = 8


def make_tiny(args, out_dir):
    cmd = [sys.executable, os.path.join(TOOLS_DIR, "make_tiny_checkpoint.py"), *args,
           "--out", out_dir]
    subprocess.run(cmd, check=True)
    return {
        "gguf_sha256": sha256_of(os.path.join(out_dir, "model.gguf")),
        "safetensors_sha256": sha256_of(os.path.join(out_dir, "hf", "model.safetensors")),
    }


def recorded_positions(num_tokens):
    """All positions for short sequences; else the first 4, every 16th and the last 4."""
    if num_tokens <= 32:
        return list(range(num_tokens))
    keep = set(range(4)) | set(range(15, num_tokens, 16)) | set(range(num_tokens - 4, num_tokens))
    return sorted(keep)


def run_tiny_one(name, args, ids, work):
    import torch
    from transformers import AutoModelForCausalLM

    out_dir = os.path.join(work, name)
    hashes = make_tiny(args, out_dir)
    again = make_tiny(args, out_dir + "_again")
    if hashes != again:
        raise SystemExit(f"{name}: make_tiny_checkpoint.py is not deterministic: "
                         f"{hashes} vs {again}")

    hf_dir = os.path.join(out_dir, "hf")
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    model.eval()
    ref = hf_logits(model, ids)
    greedy, margins = hf_greedy(model, ids, TINY_GREEDY)

    diffs = {}
    reference = reference_gemma3 if "gemma3" in args else reference_llama
    for form, path in (("hf", hf_dir), ("gguf", os.path.join(out_dir, "model.gguf"))):
        cfg, weights = reference.load_model(path)
        mine = reference.forward(cfg, weights, ids)
        diffs[f"numpy_{form}_max_abs_logit_diff"] = sig6(np.max(np.abs(ref - mine)))
        diffs[f"numpy_{form}_greedy_agrees"] = (
            reference.greedy(cfg, weights, ids, TINY_GREEDY) == greedy)
    print(f"{name}: {diffs}")
    positions = recorded_positions(len(ids))

    command = "python3 tools/make_tiny_checkpoint.py " + shlex.join(args) + " --out <DIR>"
    data = header({
        "checkpoint": {
            "command": command,
            "args": args,
            "files": "<DIR>/model.gguf and <DIR>/hf/{config.json,model.safetensors}",
            **hashes,
        },
        "golden_source": "transformers AutoModelForCausalLM from <DIR>/hf, dtype=float32",
        "notes": "logits[j] is the full logit row after feeding ids[0..positions[j]] (6 "
                 "significant digits); greedy continues for num_greedy tokens from ids; the checkpoint "
                 "hashes are informational (GGUF bytes depend on the gguf writer version)",
        "cross_check": diffs,
        "ids": ids,
        "positions": positions,
        "logits": [[sig6(v) for v in ref[t]] for t in positions],
        "num_greedy": TINY_GREEDY,
        "greedy": greedy,
        "greedy_margins": margins,
    })
    write_fixture(f"tiny_{name}.json", data)
    return diffs


def run_tiny(names=None):
    worst = 0.0
    with tempfile.TemporaryDirectory(prefix="golden_tiny_") as work:
        for name, (args, ids) in TINY_CONFIGS.items():
            if names and name not in names:
                continue
            diffs = run_tiny_one(name, args, ids, work)
            worst = max(worst, *(v for k, v in diffs.items() if k.endswith("diff")))
    print(f"tiny: worst numpy vs transformers max |dlogit| {worst:.3g}")


# --- cli ----------------------------------------------------------------------------


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="which", required=True)
    s = sub.add_parser("smollm2", help="golden logits for the default SmolLM2 GGUF")
    s.add_argument("--model", default=DEFAULT_MODEL)
    t = sub.add_parser("tiny", help="golden logits for tiny random checkpoints")
    t.add_argument("names", nargs="*", help=f"subset of {sorted(TINY_CONFIGS)}")
    args = ap.parse_args(argv)
    if args.which == "smollm2":
        run_smollm2(args.model)
    else:
        run_tiny(args.names)
    return 0


if __name__ == "__main__":
    sys.exit(main())
