#!/usr/bin/env python3
"""The side-by-side anchor for issue #9's decode figures: the same model directory, prompts and
decode lengths through Hugging Face transformers (eager PyTorch, bf16, SDPA attention, its
full DynamicCache), timed on the same GPU as bench_device_forward.

  python3 bench/cuda/hf_decode_anchor.py --model /tmp/snap-llama3-8b-4l \
      --contexts 8192,32768,131072 --decode 16 [--ours bench.txt] [--time-budget 120]

Per context: one prefill of the whole prompt (logits of the last position only), then
`--decode` greedy steps, each timed alone after a device synchronize; ms/token is their
median. Each context runs twice and the second pass is the one reported: the first pays
one-time costs for every new shape (cuDNN attention plans, ~40 ms a step on the H200), which a
long-running HF server pays once per length; its median is printed as "first pass". The prompt is bench_device_forward's: token i = (i * 7919 + 13) % vocab. The "x32/L"
column scales to 32 layers as bench_device_forward does (it counts the LM head 32/L times, so
it overstates both). With --ours FILE (bench_device_forward's output) it then prints the
ratio HF ms/token ÷ ours, for our full cache and our SnapKV 2048, at each context both ran;
snapserve's SnapKV rows at contexts its first table lacks come from its layer-wise table.
The issue's goal: >= 10x HF's decode speed at 128K with snapkv.

Contexts run in ascending order until --time-budget seconds have passed (the next prefill
is predicted from the last, growing ~n^2) or one fails (out of memory, say): rows printed
before stay valid. Runs on the CPU too (--device cpu, for a check of the script on a tiny
model); it never downloads anything. Exit 77 when torch or transformers is missing.
"""
import argparse
import inspect
import json
import os
import re
import statistics
import sys
import time


def parse_ours(path):
    """{context: {"full": ms, "snapkv": ms}} from bench_device_forward's tables (its DeviceForward
    table first; the layer-wise table's snapkv ms/tok fills contexts the first one lacks)."""
    rows = {}
    section = None
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if line.startswith("hf_decode_anchor"):  # this script's own output, appended to the same file
                break
            if "prefill tok/s" in line and "full ms/tok" in line:
                section = "forward"
                continue
            if line.strip().startswith("prompt") and "snapkv ms/tok" in line:
                section = "layerwise"
                continue
            if "generate --device cuda" in line or not line.startswith(" "):  # another table or program
                section = None
                continue
            cols = line.split()
            if not cols or not re.fullmatch(r"\d+", cols[0]):
                continue
            ctx = int(cols[0])
            try:
                if section == "forward" and len(cols) >= 4:
                    rows.setdefault(ctx, {})["full"] = float(cols[2])
                    rows[ctx]["snapkv"] = float(cols[3])
                elif section == "layerwise" and len(cols) >= 7:
                    rows.setdefault(ctx, {}).setdefault("snapkv", float(cols[6]))
            except ValueError:
                continue
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="a Hugging Face model directory (tools/make_random_model.py)")
    ap.add_argument("--contexts", default="8192,32768,131072", help="prompt lengths, comma-separated")
    ap.add_argument("--decode", type=int, default=16, help="greedy decode steps per context (default 16)")
    ap.add_argument("--device", default="cuda", help="torch device (default cuda; cpu checks the script)")
    ap.add_argument("--attn", default="sdpa", help="attn_implementation (default sdpa)")
    ap.add_argument("--time-budget", type=float, default=0, help="seconds; 0: no limit")
    ap.add_argument("--ours", help="bench_device_forward's output, for the ratio table")
    a = ap.parse_args()
    try:
        contexts = sorted({int(x) for x in a.contexts.split(",") if x.strip()})
    except ValueError:
        sys.exit(f"hf_decode_anchor: --contexts must be integers, got '{a.contexts}'")
    if not contexts or contexts[0] < 2 or a.decode < 1:
        sys.exit("hf_decode_anchor: need contexts >= 2 and --decode >= 1")
    if not os.path.isfile(os.path.join(a.model, "config.json")):
        sys.exit(f"hf_decode_anchor: {a.model}: no config.json (make one with tools/make_random_model.py)")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local directory; never reach for the Hub
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        import torch
        import transformers
    except ImportError as e:
        print(f"hf_decode_anchor: {e}; nothing measured")
        sys.exit(77)
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        print("hf_decode_anchor: torch sees no GPU; nothing measured")
        sys.exit(77)
    dev = torch.device(a.device)
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)

    t0 = time.time()
    # transformers >= 4.56 calls it `dtype`; older ones `torch_dtype` (and would file `dtype`
    # away in the config unread). Checked below either way.
    major_minor = tuple(int(x) for x in re.findall(r"\d+", transformers.__version__)[:2])
    kw = {"dtype" if major_minor >= (4, 56) else "torch_dtype": torch.bfloat16}
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(a.model, attn_implementation=a.attn, **kw)
    except (ValueError, ImportError) as e:  # an attention backend this install lacks
        print(f"hf_decode_anchor: attn_implementation={a.attn} refused ({e}); using eager")
        a.attn = "eager"
        model = transformers.AutoModelForCausalLM.from_pretrained(a.model, attn_implementation="eager", **kw)
    model = model.to(device=dev, dtype=torch.bfloat16).eval()
    cfg = model.config
    layers, vocab = cfg.num_hidden_layers, cfg.vocab_size
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    load_s = time.time() - t0
    fwd_params = set(inspect.signature(model.forward).parameters)
    keep = {}
    if "logits_to_keep" in fwd_params:
        keep = {"logits_to_keep": 1}
    elif "num_logits_to_keep" in fwd_params:
        keep = {"num_logits_to_keep": 1}
    # Newer transformers call the cache argument and output `cache`; older ones `past_key_values`.
    cache_kw = "cache" if "cache" in fwd_params else "past_key_values"
    get_cache = lambda o: o[cache_kw] if cache_kw in o else o.past_key_values

    def prefill_and_decode(n, steps_wanted):
        """One prompt of n tokens, then steps_wanted greedy steps: (prefill seconds, [step seconds])."""
        ids = torch.tensor([[(i * 7919 + 13) % vocab for i in range(n)]], dtype=torch.long, device=dev)
        with torch.inference_mode():
            sync()
            t = time.time()
            out = model(input_ids=ids, use_cache=True, **keep)
            sync()
            prefill_s = time.time() - t
            cache = get_cache(out)
            nxt = out.logits[:, -1:, :].argmax(-1)
            del out, ids
            steps = []
            for _ in range(steps_wanted):
                sync()
                t = time.time()
                out = model(input_ids=nxt, use_cache=True, **{cache_kw: cache})
                nxt = out.logits[:, -1:, :].argmax(-1)
                sync()
                steps.append(time.time() - t)
                cache = get_cache(out)
                del out
        return prefill_s, steps

    prefill_and_decode(min(256, contexts[0]), 3)  # warm-up: kernels loaded, cuBLAS handles made
    print(f"hf_decode_anchor: {a.model}: transformers {transformers.__version__}, torch {torch.__version__}, "
          f"{a.device}, {a.attn}, {layers} layers, hidden {cfg.hidden_size}, vocab {vocab}; weights "
          f"{params / 1e9:.2f} GB bf16 (load {load_s:.1f} s); full DynamicCache, eager decode, "
          f"{'last-position logits' if keep else 'all-position logits (no logits_to_keep here)'}")
    print(f"  {'context':<8} {'prefill tok/s':>13} {'full ms/tok':>12} {'full x32/L':>11} {'peak GB':>8} "
          f"{'first pass':>12}")
    sys.stdout.flush()

    measured = {}
    start = time.time()
    last_n = last_s = 0.0
    for n in contexts:
        predicted = last_s * (n / last_n) ** 2 if last_n else 0.0
        if a.time_budget and time.time() - start + predicted > a.time_budget:
            print(f"  {n:<8} skipped: ~{predicted:.0f} s predicted, over what is left of the {a.time_budget:.0f} s budget")
            break
        t_ctx = time.time()
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats(dev)
        try:
            # Twice: the first pass pays one-time costs per new shape (on the H200, PyTorch's
            # cuDNN attention builds a plan for every new key length: ~40 ms a step, measured
            # 2026-12-04, against ~3 ms once built); the second pass is HF's steady state.
            _, cold_steps = prefill_and_decode(n, a.decode)
            prefill_s, steps = prefill_and_decode(n, a.decode)
        except (RuntimeError, MemoryError) as e:  # torch.cuda.OutOfMemoryError is a RuntimeError
            print(f"  {n:<8} failed: {str(e).splitlines()[0][:160]}")
            break
        ms = statistics.median(steps) * 1e3
        cold_ms = statistics.median(cold_steps) * 1e3
        peak = torch.cuda.max_memory_allocated(dev) / 1e9 if dev.type == "cuda" else float("nan")
        measured[n] = ms
        print(f"  {n:<8} {n / prefill_s:13.0f} {ms:12.2f} {ms * 32 / layers:11.2f} {peak:8.2f} {cold_ms:12.2f}")
        sys.stdout.flush()
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        last_n, last_s = float(n), time.time() - t_ctx

    if a.ours:
        try:
            ours = parse_ours(a.ours)
        except OSError as e:
            sys.exit(f"hf_decode_anchor: --ours: {e}")
        print("  HF full-cache decode time ÷ snapserve's (same GPU, model, prompt; > 1: snapserve faster; goal >= 10 "
              "at 131072 with snapkv)")
        print(f"  {'context':<8} {'HF ms/tok':>10} {'ours full':>10} {'ours snapkv':>12} {'HF/full':>8} {'HF/snapkv':>10}")
        for n, ms in measured.items():
            o = ours.get(n, {})
            f, s = o.get("full"), o.get("snapkv")
            fmt = lambda v: f"{v:.2f}" if v else "-"
            print(f"  {n:<8} {ms:10.2f} {fmt(f):>10} {fmt(s):>12} {fmt(ms / f if f else None):>8} "
                  f"{fmt(ms / s if s else None):>10}")
        print("  ours_json " + json.dumps({str(k): v for k, v in sorted(ours.items())}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
