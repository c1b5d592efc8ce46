#!/usr/bin/env python3
"""Plain numpy reference forward pass for Llama-family decoders (llama, mistral, qwen2).

Reads either a GGUF file (through the `gguf` package) or a Hugging Face directory
(config.json + *.safetensors). Weights are dequantized to float32 in the HF layout
([out, in], rotate_half RoPE); matmuls run in float32, norms/softmax in float64.
This file is the readable reference the C++ engine and the golden fixtures are checked
against: correctness and clarity over speed.

  python3 tools/reference_llama.py --model PATH --ids 1,2,3 [--greedy N] [--out f.json]
"""

import argparse
import dataclasses
import glob
import json
import math
import os
import sys

import numpy as np


# --- config -------------------------------------------------------------------------


@dataclasses.dataclass
class Config:
    arch: str                 # "llama", "mistral" or "qwen2"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict         # {"type": "none"|"linear"|"llama3", "factor": ..., ...}
    sliding_window: int        # 0: full causal attention
    tie_word_embeddings: bool
    attention_bias: bool


def _hf_rope_scaling(cfg_json):
    """HF keeps RoPE scaling in `rope_scaling` (older) or `rope_parameters` (newer)."""
    rs = cfg_json.get("rope_scaling") or cfg_json.get("rope_parameters") or {}
    kind = rs.get("rope_type", rs.get("type", "default")) or "default"
    if kind == "default":
        return {"type": "none"}
    if kind == "linear":
        return {"type": "linear", "factor": float(rs["factor"])}
    if kind == "llama3":
        return {
            "type": "llama3",
            "factor": float(rs["factor"]),
            "low_freq_factor": float(rs["low_freq_factor"]),
            "high_freq_factor": float(rs["high_freq_factor"]),
            "original_max_position": int(rs["original_max_position_embeddings"]),
        }
    raise ValueError(f"config.json: unsupported rope scaling type {kind!r}")


def _hf_rope_theta(cfg_json):
    if "rope_theta" in cfg_json:
        return float(cfg_json["rope_theta"])
    rp = cfg_json.get("rope_parameters") or {}
    return float(rp.get("rope_theta", 10000.0))


def config_from_hf(cfg_json):
    arch = cfg_json["model_type"]
    if arch not in ("llama", "mistral", "qwen2"):
        raise ValueError(f"config.json: unsupported model_type {arch!r}")
    num_heads = int(cfg_json["num_attention_heads"])
    hidden = int(cfg_json["hidden_size"])
    head_dim = cfg_json.get("head_dim") or hidden // num_heads
    # Sliding window: mistral uses it whenever set; qwen2 only with use_sliding_window
    # (and then only from layer max_window_layers on, which we do not support).
    window = cfg_json.get("sliding_window") or 0
    if arch == "qwen2" and not cfg_json.get("use_sliding_window", False):
        window = 0
    if arch == "llama":
        window = 0
    if arch == "qwen2":
        bias = True
    else:
        bias = bool(cfg_json.get("attention_bias", False))
    return Config(
        arch=arch,
        vocab_size=int(cfg_json["vocab_size"]),
        hidden_size=hidden,
        intermediate_size=int(cfg_json["intermediate_size"]),
        num_layers=int(cfg_json["num_hidden_layers"]),
        num_heads=num_heads,
        num_kv_heads=int(cfg_json.get("num_key_value_heads") or num_heads),
        head_dim=int(head_dim),
        rms_norm_eps=float(cfg_json.get("rms_norm_eps", 1e-6)),
        rope_theta=_hf_rope_theta(cfg_json),
        rope_scaling=_hf_rope_scaling(cfg_json),
        sliding_window=int(window),
        tie_word_embeddings=bool(cfg_json.get("tie_word_embeddings", False)),
        attention_bias=bias,
    )


# --- weight loading -----------------------------------------------------------------
# Weights dict keys follow HF naming ("model.layers.0.self_attn.q_proj.weight", ...),
# values are float32 numpy arrays in the HF layout ([out, in] for matrices).


def load_hf(directory):
    from safetensors.numpy import load_file

    with open(os.path.join(directory, "config.json")) as f:
        cfg = config_from_hf(json.load(f))
    weights = {}
    files = sorted(glob.glob(os.path.join(directory, "*.safetensors")))
    if not files:
        raise FileNotFoundError(f"{directory}: no *.safetensors files")
    for path in files:
        for name, arr in _load_safetensors_f32(path, load_file).items():
            weights[name] = arr
    return cfg, weights


def _load_safetensors_f32(path, load_file):
    try:
        tensors = load_file(path)
        return {k: np.asarray(v, dtype=np.float32) for k, v in tensors.items()}
    except TypeError:
        # numpy has no bfloat16: read bf16 tensors by hand (upper 16 bits of a float32).
        return _load_safetensors_manual(path)


def _load_safetensors_manual(path):
    with open(path, "rb") as f:
        header_len = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(header_len))
        base = 8 + header_len
        out = {}
        for name, info in header.items():
            if name == "__metadata__":
                continue
            start, end = info["data_offsets"]
            f.seek(base + start)
            raw = f.read(end - start)
            dtype = info["dtype"]
            if dtype == "BF16":
                bits = np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16
                arr = bits.view(np.float32)
            else:
                np_dtype = {"F32": np.float32, "F16": np.float16, "F64": np.float64}[dtype]
                arr = np.frombuffer(raw, dtype=np_dtype).astype(np.float32)
            out[name] = arr.reshape(info["shape"])
        return out


def _gguf_field(reader, key, default=None):
    field = reader.fields.get(key)
    if field is None:
        return default
    return field.contents()


def _unpermute_qk(w, n_head):
    """Undo the llama.cpp converter's permutation of a Q or K projection [out, in]
    (it wrote w.reshape(n_head, 2, hd//2, in).swapaxes(1, 2).reshape(w.shape) to turn
    the HF rotate_half layout into GGML's interleaved-pair RoPE layout)."""
    rest = w.shape[1:]
    return (w.reshape(n_head, w.shape[0] // n_head // 2, 2, *rest)
            .swapaxes(1, 2)
            .reshape(w.shape))


def load_gguf(path):
    import gguf

    reader = gguf.GGUFReader(path)
    arch = _gguf_field(reader, "general.architecture")
    if arch not in ("llama", "mistral", "qwen2"):
        raise ValueError(f"{path}: unsupported general.architecture {arch!r}")

    def key(name, default=None):
        return _gguf_field(reader, f"{arch}.{name}", default)

    tensors = {}
    for t in reader.tensors:
        # ggml lists dims fastest-first (ne0 = in); numpy wants [out, in].
        arr = gguf.quants.dequantize(t.data, t.tensor_type)
        tensors[t.name] = np.asarray(arr, dtype=np.float32).reshape(
            [int(d) for d in reversed(t.shape)])

    hidden = int(key("embedding_length"))
    num_heads = int(key("attention.head_count"))
    num_kv_heads = int(key("attention.head_count_kv", num_heads))
    head_dim = int(key("attention.key_length", hidden // num_heads))
    vocab = key("vocab_size")
    if vocab is None:
        vocab = tensors["token_embd.weight"].shape[0]

    scaling_type = key("rope.scaling.type", "none") or "none"
    if scaling_type == "linear":
        rope_scaling = {"type": "linear", "factor": float(key("rope.scaling.factor"))}
    elif "rope_freqs.weight" in tensors:
        # llama3 scaling: the converter stores per-frequency divisors instead of params.
        rope_scaling = {"type": "freq_factors",
                        "freq_factors": tensors["rope_freqs.weight"].astype(np.float64)}
    elif scaling_type in ("none", ""):
        rope_scaling = {"type": "none"}
    else:
        raise ValueError(f"{path}: unsupported rope.scaling.type {scaling_type!r}")

    cfg = Config(
        arch=arch,
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=int(key("feed_forward_length")),
        num_layers=int(key("block_count")),
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        rms_norm_eps=float(key("attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(key("rope.freq_base", 10000.0)),
        rope_scaling=rope_scaling,
        sliding_window=int(key("attention.sliding_window", 0) or 0),
        tie_word_embeddings="output.weight" not in tensors,
        attention_bias="blk.0.attn_q.bias" in tensors,
    )

    permuted = arch in ("llama", "mistral")
    w = {
        "model.embed_tokens.weight": tensors["token_embd.weight"],
        "model.norm.weight": tensors["output_norm.weight"],
    }
    if not cfg.tie_word_embeddings:
        w["lm_head.weight"] = tensors["output.weight"]
    names = {
        "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
        "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
        "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
        "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
    }
    for i in range(cfg.num_layers):
        for g_name, hf_name in names.items():
            for suffix in ("weight", "bias"):
                t = tensors.get(f"blk.{i}.{g_name}.{suffix}")
                if t is None:
                    continue
                if permuted and g_name == "attn_q":
                    t = _unpermute_qk(t, cfg.num_heads)
                elif permuted and g_name == "attn_k":
                    t = _unpermute_qk(t, cfg.num_kv_heads)
                w[f"model.layers.{i}.{hf_name}.{suffix}"] = t
    return cfg, w


def load_model(path):
    if os.path.isdir(path):
        return load_hf(path)
    return load_gguf(path)


# --- forward pass -------------------------------------------------------------------


def rope_inv_freq(cfg):
    """inv_freq[i] = theta^(-2i/head_dim), then scaled (HF semantics), float64."""
    d = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (np.arange(0, d, 2, dtype=np.float64) / d))
    rs = cfg.rope_scaling
    if rs["type"] == "none":
        return inv_freq
    if rs["type"] == "linear":
        return inv_freq / rs["factor"]
    if rs["type"] == "freq_factors":
        return inv_freq / rs["freq_factors"]
    if rs["type"] == "llama3":
        factor = rs["factor"]
        low, high = rs["low_freq_factor"], rs["high_freq_factor"]
        old_ctx = rs["original_max_position"]
        low_freq_wavelen = old_ctx / low
        high_freq_wavelen = old_ctx / high
        wavelen = 2.0 * math.pi / inv_freq
        out = np.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_ctx / wavelen - low) / (high - low)
        smoothed = (1.0 - smooth) * out / factor + smooth * out
        medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
        return np.where(medium, smoothed, out)
    raise ValueError(f"unknown rope scaling {rs['type']!r}")


def rms_norm(x, weight, eps):
    """x [T, H] f32 -> f32; statistics in float64."""
    x64 = x.astype(np.float64)
    inv = 1.0 / np.sqrt(np.mean(x64 * x64, axis=-1, keepdims=True) + eps)
    return (x64 * inv * weight.astype(np.float64)).astype(np.float32)


def apply_rope(x, positions, inv_freq):
    """x [T, n_head, head_dim] in the rotate_half layout: pairs (i, i + head_dim/2)."""
    angles = positions[:, None].astype(np.float64) * inv_freq[None, :]   # [T, hd/2]
    cos = np.cos(angles)[:, None, :]
    sin = np.sin(angles)[:, None, :]
    half = x.shape[-1] // 2
    x1 = x[..., :half].astype(np.float64)
    x2 = x[..., half:].astype(np.float64)
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(np.float32)


def attention(q, k, v, sliding_window):
    """q [T, nh, hd], k/v [T, nkv, hd] -> [T, nh*hd]. Causal; with a window w, query t
    sees keys s with t - w < s <= t (HF semantics: w keys including itself)."""
    num_tokens, num_heads, head_dim = q.shape
    group = num_heads // k.shape[1]
    t_idx = np.arange(num_tokens)[:, None]
    s_idx = np.arange(num_tokens)[None, :]
    allowed = s_idx <= t_idx
    if sliding_window > 0:
        allowed &= (t_idx - s_idx) < sliding_window
    out = np.empty((num_tokens, num_heads, head_dim), dtype=np.float32)
    scale = 1.0 / math.sqrt(head_dim)
    for h in range(num_heads):
        kv = h // group
        scores = (q[:, h, :].astype(np.float64) @ k[:, kv, :].astype(np.float64).T) * scale
        scores = np.where(allowed, scores, -np.inf)
        scores -= scores.max(axis=-1, keepdims=True)
        p = np.exp(scores)
        p /= p.sum(axis=-1, keepdims=True)
        out[:, h, :] = (p @ v[:, kv, :].astype(np.float64)).astype(np.float32)
    return out.reshape(num_tokens, num_heads * head_dim)


def linear(x, w, b=None):
    y = x @ w.T
    if b is not None:
        y = y + b
    return y.astype(np.float32)


def silu(x):
    x64 = x.astype(np.float64)
    return (x64 / (1.0 + np.exp(-x64))).astype(np.float32)


def forward(cfg, w, ids):
    """ids: list of token ids (positions 0..T-1). Returns logits [T, vocab] float32."""
    ids = np.asarray(ids, dtype=np.int64)
    num_tokens = len(ids)
    positions = np.arange(num_tokens)
    inv_freq = rope_inv_freq(cfg)
    x = w["model.embed_tokens.weight"][ids].astype(np.float32)       # [T, hidden]
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        h = rms_norm(x, w[p + "input_layernorm.weight"], cfg.rms_norm_eps)
        q = linear(h, w[p + "self_attn.q_proj.weight"], w.get(p + "self_attn.q_proj.bias"))
        k = linear(h, w[p + "self_attn.k_proj.weight"], w.get(p + "self_attn.k_proj.bias"))
        v = linear(h, w[p + "self_attn.v_proj.weight"], w.get(p + "self_attn.v_proj.bias"))
        q = apply_rope(q.reshape(num_tokens, cfg.num_heads, cfg.head_dim), positions, inv_freq)
        k = apply_rope(k.reshape(num_tokens, cfg.num_kv_heads, cfg.head_dim), positions, inv_freq)
        v = v.reshape(num_tokens, cfg.num_kv_heads, cfg.head_dim)
        a = attention(q, k, v, cfg.sliding_window)
        x = x + linear(a, w[p + "self_attn.o_proj.weight"], w.get(p + "self_attn.o_proj.bias"))
        h = rms_norm(x, w[p + "post_attention_layernorm.weight"], cfg.rms_norm_eps)
        gate = linear(h, w[p + "mlp.gate_proj.weight"])
        up = linear(h, w[p + "mlp.up_proj.weight"])
        x = x + linear(silu(gate) * up, w[p + "mlp.down_proj.weight"])
    x = rms_norm(x, w["model.norm.weight"], cfg.rms_norm_eps)
    head = w.get("lm_head.weight")
    if head is None or cfg.tie_word_embeddings:
        head = w["model.embed_tokens.weight"]
    return linear(x, head)


def greedy(cfg, w, ids, num_new):
    """Greedy continuation by full recomputation (no KV cache: simplest to trust)."""
    seq = list(ids)
    out = []
    for _ in range(num_new):
        next_id = int(np.argmax(forward(cfg, w, seq)[-1]))
        out.append(next_id)
        seq.append(next_id)
    return out


# --- cli ----------------------------------------------------------------------------


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help=".gguf file or HF directory")
    ap.add_argument("--ids", required=True, help="comma-separated token ids")
    ap.add_argument("--greedy", type=int, default=0, help="greedy-decode N new tokens")
    ap.add_argument("--top", type=int, default=5, help="top-k ids printed per position")
    ap.add_argument("--out", help="write full logits summary as JSON here")
    args = ap.parse_args(argv)

    ids = [int(s) for s in args.ids.split(",") if s.strip()]
    cfg, w = load_model(args.model)
    logits = forward(cfg, w, ids)
    summary = {"model": args.model, "ids": ids, "positions": []}
    for t in range(len(ids)):
        row = logits[t]
        top = np.argsort(-row, kind="stable")[: args.top]
        summary["positions"].append({
            "top_ids": [int(i) for i in top],
            "top_logits": [float(row[i]) for i in top],
        })
        print(f"pos {t:3d} id {ids[t]:6d} top " +
              " ".join(f"{int(i)}:{row[i]:.4f}" for i in top))
    if args.greedy:
        cont = greedy(cfg, w, ids, args.greedy)
        summary["greedy"] = cont
        print("greedy", ",".join(str(i) for i in cont))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(summary, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
