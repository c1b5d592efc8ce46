#!/usr/bin/env python3
"""Writes a Llama-family model of any shape with random weights, in Hugging Face form.

OUT/config.json, OUT/model.safetensors (bf16 by default; f16/f32), OUT/tokenizer.json and
OUT/tokenizer_config.json: everything `snapserve generate|serve|bench --model OUT` and
tools/reference_llama.py need, with no download. Benchmarks at real sizes use it, e.g.

  python3 tools/make_random_model.py --shape llama3-8b --out /tmp/llama3-8b      # 16 GB bf16
  python3 tools/make_random_model.py --shape llama3-8b --layers 2 --out /tmp/l8b-2   # 2 layers
  python3 tools/make_random_model.py --shape llama3-8b --dry-run   # config + sizes only

On the GPU machine (64 MiB of working tree can travel, so models never do) run it there:
it needs only numpy (present there, with torch); --threads N (default: all cores) draws
tensors in parallel. Weights are N(0, (scale / sqrt(in_features))^2), norms N(1, 0.05^2),
embeddings N(0, 1): activations and logits stay O(1) at any width, so greedy choices are
well separated. Seeded per tensor: the same arguments give the same bytes.
The tokenizer is byte-level BPE (tools/make_tiny_checkpoint.py's vocabulary), padded to the
vocabulary size with unreachable <|extra_N|> tokens.
"""
import argparse
import concurrent.futures
import json
import math
import os
import sys
import zlib

import numpy as np

# Needs only numpy (the GPU machine has no `gguf` package, so nothing is imported from
# make_tiny_checkpoint.py; the vocabulary below is built the same way).
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGE_WORDS = ["Ġt", "he", "Ġthe", "in", "er", "Ġa", "on", "re", "at", "en", "Ġs", "Ġw", "or", "an", "is", "it"]


def bytes_to_unicode():
    """GPT-2 byte-level BPE: each byte maps to a printable character."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    extra = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def make_vocab(vocab_size):
    """256 byte tokens, a few merges, the specials, then <|extra_N|> padding (type 4)."""
    b2u = bytes_to_unicode()
    tokens = [b2u[b] for b in range(256)]
    merges = []
    for word in MERGE_WORDS[: max(0, vocab_size - 256 - len(SPECIALS))]:
        for cut in range(len(word) - 1, 0, -1):
            if word[:cut] in tokens and word[cut:] in tokens:
                merges.append(f"{word[:cut]} {word[cut:]}")
                tokens.append(word)
                break
    tokens += SPECIALS
    types = [1] * (len(tokens) - len(SPECIALS)) + [3] * len(SPECIALS)
    while len(tokens) < vocab_size:
        tokens.append(f"<|extra_{len(tokens)}|>")
        types.append(4)
    return tokens, types, merges


# Published shapes (config.json of each model). rope: (theta, scaling or None).
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}
SHAPES = {
    "llama3-8b": dict(arch="llama", layers=32, hidden=4096, heads=32, kv_heads=8, intermediate=14336,
                      vocab=128256, rope_theta=500000.0, rope_scaling=LLAMA3_ROPE, max_position=131072,
                      tie=False),
    "llama3-1b": dict(arch="llama", layers=16, hidden=2048, heads=32, kv_heads=8, intermediate=8192,
                      vocab=128256, rope_theta=500000.0, rope_scaling=dict(LLAMA3_ROPE, factor=32.0),
                      max_position=131072, tie=True, head_dim=64),
    "mistral-7b": dict(arch="mistral", layers=32, hidden=4096, heads=32, kv_heads=8, intermediate=14336,
                       vocab=32000, rope_theta=1000000.0, rope_scaling=None, max_position=32768, tie=False,
                       sliding_window=4096),
    "qwen2-7b": dict(arch="qwen2", layers=28, hidden=3584, heads=28, kv_heads=4, intermediate=18944,
                     vocab=152064, rope_theta=1000000.0, rope_scaling=None, max_position=32768, tie=False),
    "smollm2-135m": dict(arch="llama", layers=30, hidden=576, heads=9, kv_heads=3, intermediate=1536,
                         vocab=49152, rope_theta=100000.0, rope_scaling=None, max_position=8192, tie=True),
    # Small shapes for tests: GQA, llama3 rope, odd sizes; seconds to write and to run on a CPU.
    "tiny-llama3": dict(arch="llama", layers=2, hidden=192, heads=6, kv_heads=2, intermediate=328,
                        vocab=1000, rope_theta=500000.0, rope_scaling=LLAMA3_ROPE, max_position=131072,
                        tie=False),
    "tiny-mistral": dict(arch="mistral", layers=2, hidden=128, heads=4, kv_heads=2, intermediate=256,
                         vocab=500, rope_theta=10000.0, rope_scaling=None, max_position=4096, tie=False,
                         sliding_window=16),
    "tiny-qwen2": dict(arch="qwen2", layers=2, hidden=128, heads=4, kv_heads=1, intermediate=200,
                       vocab=600, rope_theta=1000000.0, rope_scaling=None, max_position=4096, tie=True),
}
DTYPE_BYTES = {"bf16": 2, "f16": 2, "f32": 4}
ST_DTYPE = {"bf16": "BF16", "f16": "F16", "f32": "F32"}


def tensor_table(s):
    """[(name, shape, kind)] in file order; kind: embed, norm, bias or linear (shape [out, in])."""
    hd = s["head_dim"]
    q_dim, kv_dim = s["heads"] * hd, s["kv_heads"] * hd
    t = [("model.embed_tokens.weight", (s["vocab"], s["hidden"]), "embed")]
    for i in range(s["layers"]):
        p = f"model.layers.{i}."
        t.append((p + "input_layernorm.weight", (s["hidden"],), "norm"))
        t.append((p + "self_attn.q_proj.weight", (q_dim, s["hidden"]), "linear"))
        t.append((p + "self_attn.k_proj.weight", (kv_dim, s["hidden"]), "linear"))
        t.append((p + "self_attn.v_proj.weight", (kv_dim, s["hidden"]), "linear"))
        if s["arch"] == "qwen2":
            t.append((p + "self_attn.q_proj.bias", (q_dim,), "bias"))
            t.append((p + "self_attn.k_proj.bias", (kv_dim,), "bias"))
            t.append((p + "self_attn.v_proj.bias", (kv_dim,), "bias"))
        t.append((p + "self_attn.o_proj.weight", (s["hidden"], q_dim), "linear"))
        t.append((p + "post_attention_layernorm.weight", (s["hidden"],), "norm"))
        t.append((p + "mlp.gate_proj.weight", (s["intermediate"], s["hidden"]), "linear"))
        t.append((p + "mlp.up_proj.weight", (s["intermediate"], s["hidden"]), "linear"))
        t.append((p + "mlp.down_proj.weight", (s["hidden"], s["intermediate"]), "linear"))
    t.append(("model.norm.weight", (s["hidden"],), "norm"))
    if not s["tie"]:
        t.append(("lm_head.weight", (s["vocab"], s["hidden"]), "linear"))
    return t


def to_bytes(x, dtype):
    """f32 array -> little-endian bytes of the storage dtype (bf16 rounded to nearest even)."""
    if dtype == "f32":
        return x.astype("<f4").tobytes()
    if dtype == "f16":
        return x.astype("<f2").tobytes()
    u = x.astype(np.float32).view(np.uint32)
    u = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    return u.astype("<u2").tobytes()


def draw(name, shape, kind, seed, scale, dtype, rows_per_chunk=4096):
    """The tensor's bytes, drawn in row chunks so an [128256, 4096] tensor never holds f64."""
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    out = []
    rows = shape[0]
    cols = shape[1] if len(shape) > 1 else 1
    for r0 in range(0, rows, rows_per_chunk):
        n = min(rows_per_chunk, rows - r0)
        z = rng.standard_normal((n, cols), dtype=np.float32)
        if kind == "norm":
            z = 1.0 + 0.05 * z
        elif kind == "bias":
            z = 0.05 * z
        elif kind == "linear":
            z *= scale / math.sqrt(cols)
        out.append(to_bytes(z.reshape(-1) if len(shape) == 1 else z, dtype))
    return b"".join(out)


def tokenizer_files(vocab_size):
    tokens, types, merges = make_vocab(vocab_size)
    vocab, added = {}, []
    for i, (tok, ty) in enumerate(zip(tokens, types)):
        if tok in SPECIALS:
            added.append({"id": i, "content": tok, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True})
        else:
            vocab[tok] = i
    tj = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                          "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "vocab": vocab,
                  "merges": merges},
    }
    cfg = {"bos_token": "<|endoftext|>", "eos_token": "<|im_end|>", "model_max_length": 1 << 30,
           "tokenizer_class": "PreTrainedTokenizerFast"}
    return tj, cfg, tokens.index("<|endoftext|>"), tokens.index("<|im_end|>")


def hf_config(s, dtype, bos_id, eos_id):
    arch_class = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}
    c = {
        "architectures": [arch_class[s["arch"]]], "model_type": s["arch"], "vocab_size": s["vocab"],
        "hidden_size": s["hidden"], "intermediate_size": s["intermediate"], "num_hidden_layers": s["layers"],
        "num_attention_heads": s["heads"], "num_key_value_heads": s["kv_heads"], "head_dim": s["head_dim"],
        "rms_norm_eps": 1e-5, "rope_theta": s["rope_theta"], "rope_scaling": s["rope_scaling"],
        "max_position_embeddings": s["max_position"], "tie_word_embeddings": s["tie"],
        "bos_token_id": bos_id, "eos_token_id": eos_id, "hidden_act": "silu",
        "torch_dtype": {"bf16": "bfloat16", "f16": "float16", "f32": "float32"}[dtype],
    }
    if s["arch"] == "llama":
        c["attention_bias"] = False
    if s["arch"] == "mistral":
        c["sliding_window"] = s["sliding_window"] or None
    if s["arch"] == "qwen2":
        c["use_sliding_window"] = s["sliding_window"] > 0
        c["sliding_window"] = s["sliding_window"] or s["max_position"]
    return c


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", required=True, choices=sorted(SHAPES), help="base shape (fields below override it)")
    ap.add_argument("--out", help="output directory (required unless --dry-run)")
    ap.add_argument("--layers", type=int, help="number of decoder layers")
    ap.add_argument("--hidden", type=int, help="hidden_size")
    ap.add_argument("--heads", type=int, help="num_attention_heads")
    ap.add_argument("--kv-heads", type=int, help="num_key_value_heads")
    ap.add_argument("--head-dim", type=int, help="head_dim (default: hidden / heads)")
    ap.add_argument("--intermediate", type=int, help="intermediate_size (MLP)")
    ap.add_argument("--vocab", type=int, help="vocab_size (at least 259)")
    ap.add_argument("--sliding-window", type=int, help="mistral/qwen2 sliding window (0: none)")
    ap.add_argument("--max-position", type=int, help="max_position_embeddings")
    ap.add_argument("--dtype", choices=sorted(DTYPE_BYTES), default="bf16", help="safetensors storage (default bf16)")
    ap.add_argument("--scale", type=float, default=1.0, help="linear weights' std times sqrt(in_features) (default 1)")
    ap.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="tensors drawn in parallel")
    ap.add_argument("--dry-run", action="store_true", help="print the config and sizes as JSON; write nothing")
    a = ap.parse_args(argv)
    s = dict(SHAPES[a.shape])
    s.setdefault("sliding_window", 0)
    for key in ("layers", "hidden", "heads", "kv_heads", "intermediate", "vocab", "sliding_window",
                "max_position"):
        v = getattr(a, key)
        if v is not None:
            s[key] = v
    if a.head_dim is not None:
        s["head_dim"] = a.head_dim
    elif a.hidden is not None or a.heads is not None or "head_dim" not in s:
        s["head_dim"] = s["hidden"] // s["heads"]
    for key in ("layers", "hidden", "heads", "kv_heads", "intermediate", "head_dim"):
        if s[key] <= 0:
            ap.error(f"--{key.replace('_', '-')} must be positive (got {s[key]})")
    if s["heads"] % s["kv_heads"]:
        ap.error(f"--heads {s['heads']} is not a multiple of --kv-heads {s['kv_heads']}")
    if s["head_dim"] % 2:
        ap.error(f"head_dim {s['head_dim']} must be even (RoPE rotates pairs)")
    if s["vocab"] < 256 + len(SPECIALS):
        ap.error(f"--vocab must be at least {256 + len(SPECIALS)} (got {s['vocab']})")
    if s["sliding_window"] and s["arch"] == "llama":
        ap.error("--sliding-window needs a mistral or qwen2 shape")
    if not a.dry_run and not a.out:
        ap.error("--out is required (or --dry-run)")
    if a.threads < 1:
        ap.error("--threads must be at least 1")
    return a, s


def main(argv=None):
    a, s = parse_args(argv)
    table = tensor_table(s)
    nbytes = DTYPE_BYTES[a.dtype]
    params = sum(math.prod(shape) for _, shape, _ in table)
    tj, tcfg, bos_id, eos_id = tokenizer_files(s["vocab"])
    config = hf_config(s, a.dtype, bos_id, eos_id)
    kv_bytes_per_token = 2 * s["layers"] * s["kv_heads"] * s["head_dim"] * 2  # bf16 K and V
    summary = {"shape": a.shape, "config": config, "parameters": params, "weight_bytes": params * nbytes,
               "kv_bytes_per_token_bf16": kv_bytes_per_token, "tensors": len(table)}
    if a.dry_run:
        print(json.dumps(summary, indent=1))
        return 0

    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    with open(os.path.join(a.out, "tokenizer.json"), "w") as f:
        json.dump(tj, f, ensure_ascii=False)
    with open(os.path.join(a.out, "tokenizer_config.json"), "w") as f:
        json.dump(tcfg, f, indent=2)

    # safetensors: 8-byte header length, JSON header (offsets known up front), then the
    # tensors streamed in order, so a 16 GB file never sits in memory at once.
    header, off = {"__metadata__": {"format": "pt", "generator": "tools/make_random_model.py"}}, 0
    for name, shape, _ in table:
        n = math.prod(shape) * nbytes
        header[name] = {"dtype": ST_DTYPE[a.dtype], "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    path = os.path.join(a.out, "model.safetensors")
    with open(path + ".part", "wb") as f, concurrent.futures.ThreadPoolExecutor(a.threads) as pool:
        f.write(len(h).to_bytes(8, "little"))
        f.write(h)
        # Draw ahead on the pool (numpy releases the GIL while drawing), write in order.
        futures = [pool.submit(draw, name, shape, kind, a.seed, a.scale, a.dtype) for name, shape, kind in
                   table[: a.threads * 2]]
        for i in range(len(table)):
            blob = futures[i].result()
            futures[i] = None
            if i + a.threads * 2 < len(table):
                name, shape, kind = table[i + a.threads * 2]
                futures.append(pool.submit(draw, name, shape, kind, a.seed, a.scale, a.dtype))
            f.write(blob)
    os.replace(path + ".part", path)
    print(json.dumps({k: v for k, v in summary.items() if k != "config"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
