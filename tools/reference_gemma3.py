#!/usr/bin/env python3
"""Plain numpy reference forward pass for Gemma 3 (text) from a GGUF file or an HF directory.

The readable reference the C++ engine's gemma3 path (worker/model/llama.cpp with the
ModelConfig gemma3 options) and the golden fixture tests/fixtures/golden/gemma3_270m_q4_k_m.json
are checked against, beside tools/reference_llama.py. Weights are dequantized to float32
with the `gguf` package; matmuls in float32, norms, softmax and RoPE in float64.

What Gemma 3 adds to the Llama decoder, each checked against transformers'
models/gemma3/modeling_gemma3.py and configuration_gemma3.py (Gemma3TextConfig):
  - embeddings times sqrt(hidden_size) (Gemma3TextScaledWordEmbedding, in the model dtype:
    float32 here);
  - four RMSNorms per layer: input, post-attention (on the attention output, before the
    residual add), pre-feedforward, post-feedforward; Gemma3RMSNorm is x * (1 + w), and
    llama.cpp's converter stores w + 1 in the GGUF (transformers' GGUF loader subtracts
    the 1 again), so the stored weights multiply directly;
  - q_norm / k_norm: RMSNorm over head_dim of every q and k head, before RoPE;
  - attention scale query_pre_attn_scalar ** -0.5: config.json states it; a GGUF does not,
    and llama.cpp takes head_dim (hidden_size / heads for the 62-layer 27B), the published
    value of every Gemma 3 (256 for 270M-12B);
  - layer_types: sliding_attention unless (i + 1) % 6 == 0 (sliding_window_pattern 6);
    sliding layers see keys s with t - window < s <= t and use RoPE base
    rope_local_base_freq = 10,000; full layers use rope_theta (GGUF rope.freq_base);
  - GeGLU MLP: down(gelu_tanh(gate(x)) * up(x)) (hidden_activation gelu_pytorch_tanh);
  - tied embeddings (no output.weight), no final logit soft-capping.

  python3 tools/reference_gemma3.py --model gemma-3-270m-q4_k_m.gguf --ids 2,100,200 [--greedy N]
"""

import argparse
import dataclasses
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference_llama import apply_rope, linear, rms_norm  # noqa: E402

SLIDING_WINDOW_PATTERN = 6
ROPE_LOCAL_BASE = 10000.0
QUERY_PRE_ATTN_SCALAR = 256.0


@dataclasses.dataclass
class Config:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float          # global layers
    rope_local_theta: float    # sliding layers
    sliding_window: int
    sliding_window_pattern: int
    query_pre_attn_scalar: float

    def is_sliding(self, layer):
        return (layer + 1) % self.sliding_window_pattern != 0


def load_gguf(path):
    """Returns (Config, weights) with GGUF tensor names, dequantized to float32 [out, in]."""
    import gguf

    reader = gguf.GGUFReader(path)

    def field(name, default=None):
        f = reader.fields.get(name)
        if f is None:
            return default
        return f.contents()

    arch = field("general.architecture")
    if arch != "gemma3":
        raise ValueError(f"{path}: general.architecture is {arch!r}, not 'gemma3'")
    tensors = {}
    for t in reader.tensors:
        arr = gguf.quants.dequantize(t.data, t.tensor_type)
        tensors[t.name] = np.asarray(arr, dtype=np.float32).reshape([int(d) for d in reversed(t.shape)])
    if "output.weight" in tensors:
        raise ValueError(f"{path}: untied output.weight: not a Gemma 3 layout this reference knows")
    hidden = int(field("gemma3.embedding_length"))
    num_heads = int(field("gemma3.attention.head_count"))
    cfg = Config(
        vocab_size=tensors["token_embd.weight"].shape[0],
        hidden_size=hidden,
        intermediate_size=int(field("gemma3.feed_forward_length")),
        num_layers=int(field("gemma3.block_count")),
        num_heads=num_heads,
        num_kv_heads=int(field("gemma3.attention.head_count_kv", num_heads)),
        head_dim=int(field("gemma3.attention.key_length", hidden // num_heads)),
        rms_norm_eps=float(field("gemma3.attention.layer_norm_rms_epsilon", 1e-6)),
        rope_theta=float(field("gemma3.rope.freq_base", 1e6)),
        rope_local_theta=float(field("gemma3.rope.freq_base_swa", ROPE_LOCAL_BASE)),
        sliding_window=int(field("gemma3.attention.sliding_window")),
        sliding_window_pattern=int(field("gemma3.attention.sliding_window_pattern", SLIDING_WINDOW_PATTERN)),
        query_pre_attn_scalar=0.0,
    )
    cfg.query_pre_attn_scalar = float(cfg.hidden_size / cfg.num_heads if cfg.num_layers == 62 else cfg.head_dim)
    return cfg, tensors


# transformers' Gemma3ForCausalLM names -> the GGUF names forward() reads. Its
# post_attention_layernorm is the attention output's norm; pre_feedforward_layernorm is the
# MLP input's. Norm weights are stored as w (Gemma3RMSNorm: x * (1 + w)).
HF_LAYER_NAMES = {
    "input_layernorm.weight": ("attn_norm.weight", True),
    "self_attn.q_proj.weight": ("attn_q.weight", False),
    "self_attn.k_proj.weight": ("attn_k.weight", False),
    "self_attn.v_proj.weight": ("attn_v.weight", False),
    "self_attn.o_proj.weight": ("attn_output.weight", False),
    "self_attn.q_norm.weight": ("attn_q_norm.weight", True),
    "self_attn.k_norm.weight": ("attn_k_norm.weight", True),
    "post_attention_layernorm.weight": ("post_attention_norm.weight", True),
    "pre_feedforward_layernorm.weight": ("ffn_norm.weight", True),
    "post_feedforward_layernorm.weight": ("post_ffw_norm.weight", True),
    "mlp.gate_proj.weight": ("ffn_gate.weight", False),
    "mlp.up_proj.weight": ("ffn_up.weight", False),
    "mlp.down_proj.weight": ("ffn_down.weight", False),
}


def load_hf(directory):
    """Returns (Config, weights) from a Gemma3ForCausalLM directory (config.json, one
    model.safetensors), renamed to the GGUF names and with 1 added to the norms."""
    import json

    from safetensors.numpy import load_file

    with open(os.path.join(directory, "config.json")) as f:
        c = json.load(f)
    if c.get("model_type") != "gemma3_text":
        raise ValueError(f"{directory}: model_type is {c.get('model_type')!r}, not 'gemma3_text'")
    raw = load_file(os.path.join(directory, "model.safetensors"))
    if "lm_head.weight" in raw:
        raise ValueError(f"{directory}: untied lm_head.weight: not a Gemma 3 layout this reference knows")
    one = np.float32(1.0)
    w = {"token_embd.weight": raw["model.embed_tokens.weight"].astype(np.float32),
         "output_norm.weight": raw["model.norm.weight"].astype(np.float32) + one}
    for i in range(int(c["num_hidden_layers"])):
        for theirs, (ours, is_norm) in HF_LAYER_NAMES.items():
            t = raw[f"model.layers.{i}.{theirs}"].astype(np.float32)
            w[f"blk.{i}.{ours}"] = t + one if is_norm else t
    types = c["layer_types"]
    pattern = next((i + 1 for i, t in enumerate(types) if t == "full_attention"), len(types) + 1)
    if any((t == "full_attention") != ((i + 1) % pattern == 0) for i, t in enumerate(types)):
        raise ValueError(f"{directory}: layer_types is not every {pattern}th layer full")
    if c.get("rope_scaling"):
        raise ValueError(f"{directory}: rope scaling is not in this reference")
    cfg = Config(
        vocab_size=int(c["vocab_size"]),
        hidden_size=int(c["hidden_size"]),
        intermediate_size=int(c["intermediate_size"]),
        num_layers=int(c["num_hidden_layers"]),
        num_heads=int(c["num_attention_heads"]),
        num_kv_heads=int(c["num_key_value_heads"]),
        head_dim=int(c["head_dim"]),
        rms_norm_eps=float(c["rms_norm_eps"]),
        rope_theta=float(c["rope_theta"]),
        rope_local_theta=float(c.get("rope_local_base_freq", ROPE_LOCAL_BASE)),
        sliding_window=int(c["sliding_window"]),
        sliding_window_pattern=pattern,
        query_pre_attn_scalar=float(c.get("query_pre_attn_scalar", QUERY_PRE_ATTN_SCALAR)),
    )
    return cfg, w


def load_model(path):
    """A .gguf file or a Gemma3ForCausalLM directory."""
    return load_hf(path) if os.path.isdir(path) else load_gguf(path)


def inv_freq(theta, head_dim):
    return 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))


def attention(q, k, v, window, scale):
    """q [T, nh, hd], k/v [T, nkv, hd] -> [T, nh*hd]; causal, window 0 = none."""
    num_tokens, num_heads, head_dim = q.shape
    group = num_heads // k.shape[1]
    t_idx = np.arange(num_tokens)[:, None]
    s_idx = np.arange(num_tokens)[None, :]
    allowed = s_idx <= t_idx
    if window > 0:
        allowed &= (t_idx - s_idx) < window
    out = np.empty((num_tokens, num_heads, head_dim), dtype=np.float32)
    for h in range(num_heads):
        kv = h // group
        scores = (q[:, h, :].astype(np.float64) @ k[:, kv, :].astype(np.float64).T) * scale
        scores = np.where(allowed, scores, -np.inf)
        scores -= scores.max(axis=-1, keepdims=True)
        p = np.exp(scores)
        p /= p.sum(axis=-1, keepdims=True)
        out[:, h, :] = (p @ v[:, kv, :].astype(np.float64)).astype(np.float32)
    return out.reshape(num_tokens, num_heads * head_dim)


def gelu_tanh(x):
    x64 = x.astype(np.float64)
    return (0.5 * x64 * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x64 + 0.044715 * x64 ** 3)))).astype(np.float32)


def head_norm(x, weight, eps):
    """RMSNorm over the last axis of x [T, heads, head_dim]."""
    t, n, d = x.shape
    return rms_norm(x.reshape(t * n, d), weight, eps).reshape(t, n, d)


def forward(cfg, w, ids, positions_wanted=None):
    """Logits [len(positions_wanted), vocab] (all positions when None), float32."""
    ids = np.asarray(ids, dtype=np.int64)
    num_tokens = len(ids)
    positions = np.arange(num_tokens)
    freq_global = inv_freq(cfg.rope_theta, cfg.head_dim)
    freq_local = inv_freq(cfg.rope_local_theta, cfg.head_dim)
    scale = cfg.query_pre_attn_scalar ** -0.5
    embed_scale = np.float32(math.sqrt(cfg.hidden_size))
    x = w["token_embd.weight"][ids].astype(np.float32) * embed_scale
    eps = cfg.rms_norm_eps
    for i in range(cfg.num_layers):
        p = f"blk.{i}."
        sliding = cfg.is_sliding(i)
        h = rms_norm(x, w[p + "attn_norm.weight"], eps)
        q = linear(h, w[p + "attn_q.weight"]).reshape(num_tokens, cfg.num_heads, cfg.head_dim)
        k = linear(h, w[p + "attn_k.weight"]).reshape(num_tokens, cfg.num_kv_heads, cfg.head_dim)
        v = linear(h, w[p + "attn_v.weight"]).reshape(num_tokens, cfg.num_kv_heads, cfg.head_dim)
        q = head_norm(q, w[p + "attn_q_norm.weight"], eps)
        k = head_norm(k, w[p + "attn_k_norm.weight"], eps)
        f = freq_local if sliding else freq_global
        q = apply_rope(q, positions, f)
        k = apply_rope(k, positions, f)
        a = attention(q, k, v, cfg.sliding_window if sliding else 0, scale)
        a = linear(a, w[p + "attn_output.weight"])
        x = x + rms_norm(a, w[p + "post_attention_norm.weight"], eps)
        h = rms_norm(x, w[p + "ffn_norm.weight"], eps)
        m = linear(gelu_tanh(linear(h, w[p + "ffn_gate.weight"])) * linear(h, w[p + "ffn_up.weight"]),
                   w[p + "ffn_down.weight"])
        x = x + rms_norm(m, w[p + "post_ffw_norm.weight"], eps)
    if positions_wanted is not None:
        x = x[np.asarray(positions_wanted, dtype=np.int64)]
    x = rms_norm(x, w["output_norm.weight"], eps)
    return linear(x, w["token_embd.weight"])


def greedy(cfg, w, ids, num_new):
    """Greedy continuation by full recomputation (no KV cache: simplest to trust)."""
    seq = list(ids)
    out = []
    for _ in range(num_new):
        nxt = int(np.argmax(forward(cfg, w, seq, [len(seq) - 1])[0]))
        out.append(nxt)
        seq.append(nxt)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="gemma3 .gguf file or Gemma3ForCausalLM directory")
    ap.add_argument("--ids", required=True, help="comma-separated token ids")
    ap.add_argument("--greedy", type=int, default=0, help="greedy-decode N new tokens")
    ap.add_argument("--top", type=int, default=5, help="top-k ids printed for the last position")
    args = ap.parse_args(argv)
    ids = [int(s) for s in args.ids.split(",") if s.strip()]
    cfg, w = load_model(args.model)
    row = forward(cfg, w, ids, [len(ids) - 1])[0]
    top = np.argsort(-row, kind="stable")[: args.top]
    print("last position top " + " ".join(f"{int(i)}:{row[i]:.4f}" for i in top))
    if args.greedy:
        print("greedy", ",".join(str(i) for i in greedy(cfg, w, ids, args.greedy)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
