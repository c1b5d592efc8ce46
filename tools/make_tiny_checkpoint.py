#!/usr/bin/env python3
"""Writes a tiny random Llama-family checkpoint in both formats with identical weights.

OUT/hf/    config.json + model.safetensors (or shards + model.safetensors.index.json)
OUT/model.gguf  the same weights as F32, llama.cpp conventions: llama-arch Q/K rows are
                permuted for interleaved RoPE (the loader must undo it), llama3 rope
                scaling as a `rope_freqs.weight` tensor, a tiny gpt2-style vocab.
Weights are seeded (numpy), so two runs with the same arguments give the same files.

--arch gemma3: the Llama tensors plus per-head q/k norms and the post-attention/post-MLP norms,
the sliding window (--sliding-window, required) and its layer pattern (--sliding-window-pattern:
every pattern-th layer is global), the global RoPE base (--rope-theta) and the local one
(--rope-local-theta). The GGUF says these as llama.cpp's converter does
(gemma3.attention.sliding_window_pattern, rope.freq_base_swa) and stores Gemma's norm weights as
(1 + w); the HF form is a Gemma3ForCausalLM directory (model_type gemma3_text, layer_types,
rope_local_base_freq, query_pre_attn_scalar = head_dim as llama.cpp assumes for the GGUF, tied
embeddings) holding w, under transformers' names (post_attention_layernorm is the attention
output's norm, pre_feedforward_layernorm the MLP input's). w = (1 + w) - 1 is exact for these
norms (within [0.5, 2], Sterbenz), so both forms hold the same numbers. --vision-language
writes the HF form as Gemma3ForConditionalGeneration instead (the 4B-27B checkpoints' form).

--gguf-type q8_0 (q4_0, q4_1, q5_1) quantizes the GGUF's matrices with the gguf package (ggml's
reference quantizers). --gguf-type q4_k_m mixes types as llama.cpp's Q4_K_M does: Q6_K for
attn_v, ffn_down and output, Q4_K for the other matrices whose rows are whole 256-weight
super-blocks, Q5_0 (the gguf package's) for those that are not; q5_k_m the same with Q5_K for
Q4_K; q3_k_m Q3_K for most matrices, Q4_K for attn_v, attn_output and ffn_down, Q6_K for
output; q2_k Q2_K for most, Q3_K for attn_v and ffn_down, Q6_K for output (the mixes of
llama.cpp's Q3_K_M and Q2_K, simplified). The gguf package cannot quantize the K formats:
quantize_k4 / quantize_q6_k / quantize_q3_k / quantize_q2_k here write valid blocks by a plain
min/max rule (not ggml's search), checked against the package's dequantizer.
"""
import argparse
import json
import math
import os
import sys

import numpy as np

import gguf
from safetensors.numpy import save_file

# Byte-level BPE (GPT-2): bytes map to printable unicode characters.
def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGE_WORDS = ["Ġt", "he", "Ġthe", "in", "er", "Ġa", "on", "re", "at", "en", "Ġs", "Ġw", "or", "an",
               "is", "it"]


def make_vocab(vocab_size):
    """256 byte tokens, merges building MERGE_WORDS, the specials, then padding tokens."""
    b2u = bytes_to_unicode()
    tokens = [b2u[b] for b in range(256)]
    merges = []
    room = vocab_size - 256 - len(SPECIALS)
    if room < 0:
        sys.exit(f"--vocab must be at least {256 + len(SPECIALS)}")
    for word in MERGE_WORDS[:room]:
        # every word above is two existing tokens: split at the longest known prefix
        for cut in range(len(word) - 1, 0, -1):
            if word[:cut] in tokens and word[cut:] in tokens:
                merges.append(f"{word[:cut]} {word[cut:]}")
                tokens.append(word)
                break
    tokens += SPECIALS
    types = [1] * (len(tokens) - len(SPECIALS)) + [3] * len(SPECIALS)
    while len(tokens) < vocab_size:
        tokens.append(f"<|extra_{len(tokens)}|>")
        types.append(4)  # user-defined
    return tokens, types, merges


def llama3_rope_factors(head_dim, theta, factor, low, high, orig):
    """llama.cpp's rope_freqs (per-frequency divisor), HF llama3 semantics."""
    out = []
    low_wavelen, high_wavelen = orig / low, orig / high
    for i in range(head_dim // 2):
        freq = 1.0 / theta ** (2 * i / head_dim)
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (orig / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def permute_qk(w, n_head):
    """llama.cpp convert_hf_to_gguf permutation of Q/K rows (weights or biases)."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def round_to(x, dtype):
    """Rounds f32 values to what the chosen storage dtype can hold, so f16/bf16
    checkpoints convert back to exactly these values."""
    if dtype == "f16":
        return x.astype(np.float16).astype(np.float32)
    if dtype == "bf16":
        u = x.astype(np.float32).view(np.uint32)
        u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
        return u.view(np.float32)
    return x


def to_storage(x, dtype):
    if dtype == "f16":
        return x.astype(np.float16)
    if dtype == "bf16":
        # safetensors.numpy has no bfloat16; callers write BF16 through raw bytes
        return (x.view(np.uint32) >> 16).astype(np.uint16)
    return x


def save_safetensors(path, tensors, dtype):
    """safetensors writer that also handles BF16 (numpy has no bfloat16 type)."""
    if dtype != "bf16":
        save_file({k: to_storage(v, dtype) for k, v in tensors.items()}, path)
        return
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        raw = to_storage(tensors[name], dtype).tobytes()
        header[name] = {"dtype": "BF16", "shape": list(tensors[name].shape),
                        "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little"))
        f.write(h)
        for b in blobs:
            f.write(b)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", choices=["llama", "mistral", "qwen2", "gemma3"], default="llama")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=0, help="explicit head_dim (0: hidden/heads)")
    ap.add_argument("--intermediate", type=int, default=96)
    ap.add_argument("--vocab", type=int, default=288)
    ap.add_argument("--tie", dest="tie", action="store_true", default=False)
    ap.add_argument("--no-tie", dest="tie", action="store_false")
    ap.add_argument("--rope-scaling", choices=["none", "linear", "llama3"], default="none")
    ap.add_argument("--rope-theta", type=float, default=10000.0)
    ap.add_argument("--sliding-window", type=int, default=0, help="mistral/qwen2/gemma3: window (0: none)")
    ap.add_argument("--sliding-window-pattern", type=int, default=6, help="gemma3: layer l is global iff (l+1) %% N == 0")
    ap.add_argument("--rope-local-theta", type=float, default=10000.0, help="gemma3: the local layers' RoPE base")
    ap.add_argument("--max-position", type=int, default=2048)
    ap.add_argument("--dtype", choices=["f32", "f16", "bf16"], default="f32",
                    help="safetensors storage (values are rounded to it, so the GGUF F32 copy is identical)")
    ap.add_argument("--shards", type=int, default=1, help=">1: model-0000k-of-0000n.safetensors + index")
    ap.add_argument("--scale", type=float, default=0.08, help="std of the random weights")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-gguf", action="store_true")
    ap.add_argument("--gguf-type", choices=["f32", "q8_0", "q4_0", "q4_1", "q5_1", "q4_k_m", "q5_k_m", "q3_k_m", "q2_k"],
                    default="f32",
                    help="the GGUF's matrices (token_embd only when tied) quantized by the gguf package "
                         "(ggml's reference quantizers): q8_0 for checking --weight-dtype q8_0, q4_0/q4_1/q5_1 for "
                         "a GGUF's own blocks on the device; q4_k_m: Q4_K, Q6_K and Q5_0 as llama.cpp's Q4_K_M; "
                         "q5_k_m: the same with Q5_K; q3_k_m: Q3_K, with Q4_K for attn_v, attn_output and "
                         "ffn_down, Q6_K for output; q2_k: Q2_K, with Q3_K for attn_v and ffn_down")
    ap.add_argument("--vision-language", action="store_true",
                    help="gemma3: the HF form as Gemma3ForConditionalGeneration (text_config, a tiny SigLIP "
                         "vision_config, language_model.model. names, two vision tensors)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()

    head_dim = a.head_dim or a.hidden // a.heads
    if a.head_dim == 0 and a.hidden % a.heads:
        sys.exit("--hidden must be a multiple of --heads unless --head-dim is given")
    if a.heads % a.kv_heads or head_dim % 2:
        sys.exit("--heads must be a multiple of --kv-heads and head_dim even")
    if a.arch == "gemma3" and a.sliding_window <= 0:
        sys.exit("--arch gemma3 needs --sliding-window > 0")
    if a.vision_language and a.arch != "gemma3":
        sys.exit("--vision-language is for --arch gemma3")
    if a.arch == "gemma3" and a.shards > 1:
        sys.exit("--arch gemma3 writes one safetensors file (no --shards)")
    bias = a.arch == "qwen2"
    gemma = a.arch == "gemma3"
    rng = np.random.default_rng(a.seed)
    q_dim, kv_dim = a.heads * head_dim, a.kv_heads * head_dim

    def rand(*shape, scale=a.scale, offset=0.0):
        return round_to((offset + scale * rng.standard_normal(shape)).astype(np.float32), a.dtype)

    # HF names and layout [out, in]; norms around 1 so activations stay sane.
    w = {"model.embed_tokens.weight": rand(a.vocab, a.hidden, scale=0.5)}
    for i in range(a.layers):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = rand(a.hidden, scale=0.1, offset=1.0)
        w[p + "self_attn.q_proj.weight"] = rand(q_dim, a.hidden)
        w[p + "self_attn.k_proj.weight"] = rand(kv_dim, a.hidden)
        w[p + "self_attn.v_proj.weight"] = rand(kv_dim, a.hidden)
        if bias:
            w[p + "self_attn.q_proj.bias"] = rand(q_dim, scale=0.05)
            w[p + "self_attn.k_proj.bias"] = rand(kv_dim, scale=0.05)
            w[p + "self_attn.v_proj.bias"] = rand(kv_dim, scale=0.05)
        w[p + "self_attn.o_proj.weight"] = rand(a.hidden, q_dim)
        w[p + "post_attention_layernorm.weight"] = rand(a.hidden, scale=0.1, offset=1.0)
        w[p + "mlp.gate_proj.weight"] = rand(a.intermediate, a.hidden)
        w[p + "mlp.up_proj.weight"] = rand(a.intermediate, a.hidden)
        w[p + "mlp.down_proj.weight"] = rand(a.hidden, a.intermediate)
        if gemma:
            w[p + "self_attn.q_norm.weight"] = rand(head_dim, scale=0.1, offset=1.0)
            w[p + "self_attn.k_norm.weight"] = rand(head_dim, scale=0.1, offset=1.0)
            w[p + "post_attention_norm.weight"] = rand(a.hidden, scale=0.1, offset=1.0)
            w[p + "post_feedforward_layernorm.weight"] = rand(a.hidden, scale=0.1, offset=1.0)
    w["model.norm.weight"] = rand(a.hidden, scale=0.1, offset=1.0)
    if not a.tie:
        w["lm_head.weight"] = rand(a.vocab, a.hidden)

    tokens, token_types, merges = make_vocab(a.vocab)
    bos_id = tokens.index("<|endoftext|>")
    eos_id = tokens.index("<|im_end|>")
    rope_scaling = None
    if a.rope_scaling == "linear":
        rope_scaling = {"type": "linear", "factor": 2.0}
    elif a.rope_scaling == "llama3":
        # Llama 3.1's published values (the GGUF reader recognizes these).
        rope_scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                        "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}

    if gemma:
        write_gemma3_hf(a, w, head_dim, bos_id, eos_id)
        if not a.no_gguf:
            write_gguf(a, w, head_dim, tokens, token_types, merges, bos_id, eos_id, rope_scaling)
        return
    arch_class = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}
    config = {
        "architectures": [arch_class[a.arch]], "model_type": a.arch,
        "vocab_size": a.vocab, "hidden_size": a.hidden, "intermediate_size": a.intermediate,
        "num_hidden_layers": a.layers, "num_attention_heads": a.heads, "num_key_value_heads": a.kv_heads,
        "rms_norm_eps": 1e-5, "rope_theta": a.rope_theta, "rope_scaling": rope_scaling,
        "max_position_embeddings": a.max_position, "tie_word_embeddings": a.tie,
        "bos_token_id": bos_id, "eos_token_id": eos_id, "hidden_act": "silu", "torch_dtype": "float32",
    }
    if a.head_dim:
        config["head_dim"] = head_dim
    if a.arch == "llama":
        config["attention_bias"] = False
    if a.arch == "mistral":
        config["sliding_window"] = a.sliding_window or None
    if a.arch == "qwen2":
        config["use_sliding_window"] = a.sliding_window > 0
        config["sliding_window"] = a.sliding_window or a.max_position

    hf_dir = os.path.join(a.out, "hf")
    os.makedirs(hf_dir, exist_ok=True)
    with open(os.path.join(hf_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    names = list(w)
    if a.shards <= 1:
        save_safetensors(os.path.join(hf_dir, "model.safetensors"), w, a.dtype)
    else:
        weight_map = {}
        groups = np.array_split(np.arange(len(names)), a.shards)
        for k, idx in enumerate(groups):
            fname = f"model-{k + 1:05d}-of-{a.shards:05d}.safetensors"
            part = {names[j]: w[names[j]] for j in idx}
            save_safetensors(os.path.join(hf_dir, fname), part, a.dtype)
            weight_map.update({n: fname for n in part})
        total = sum(v.size for v in w.values()) * (4 if a.dtype == "f32" else 2)
        with open(os.path.join(hf_dir, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)

    if a.no_gguf:
        return
    write_gguf(a, w, head_dim, tokens, token_types, merges, bos_id, eos_id, rope_scaling)


def write_gemma3_hf(a, w, head_dim, bos_id, eos_id):
    """OUT/hf as transformers' Gemma3ForCausalLM saves it (transformers 4.5x config keys)."""
    if a.rope_scaling == "llama3":
        sys.exit("--arch gemma3 takes --rope-scaling none or linear")
    layer_types = ["full_attention" if (i + 1) % a.sliding_window_pattern == 0 else "sliding_attention"
                   for i in range(a.layers)]
    config = {
        "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
        "vocab_size": a.vocab, "hidden_size": a.hidden, "intermediate_size": a.intermediate,
        "num_hidden_layers": a.layers, "num_attention_heads": a.heads, "num_key_value_heads": a.kv_heads,
        "head_dim": head_dim, "rms_norm_eps": 1e-5, "rope_theta": a.rope_theta,
        "rope_local_base_freq": a.rope_local_theta,
        "rope_scaling": {"rope_type": "linear", "factor": 2.0} if a.rope_scaling == "linear" else None,
        "sliding_window": a.sliding_window, "layer_types": layer_types,
        "query_pre_attn_scalar": head_dim,  # what llama.cpp (and our GGUF reader) take for a GGUF
        "hidden_activation": "gelu_pytorch_tanh", "final_logit_softcapping": None,
        "attn_logit_softcapping": None, "attention_bias": False,
        "max_position_embeddings": a.max_position, "tie_word_embeddings": a.tie,
        "bos_token_id": bos_id, "eos_token_id": eos_id, "pad_token_id": 0, "torch_dtype": "float32",
    }
    one = np.float32(1.0)
    hf = {"model.embed_tokens.weight": w["model.embed_tokens.weight"],
          "model.norm.weight": w["model.norm.weight"] - one}
    for i in range(a.layers):
        p = f"model.layers.{i}."
        for name in ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                     "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
                     "mlp.down_proj.weight"):
            hf[p + name] = w[p + name]
        # ours (GGUF meaning) -> transformers' Gemma3 name, norms as w = stored - 1
        for ours, theirs in (("input_layernorm", "input_layernorm"),
                             ("post_attention_norm", "post_attention_layernorm"),
                             ("post_attention_layernorm", "pre_feedforward_layernorm"),
                             ("post_feedforward_layernorm", "post_feedforward_layernorm"),
                             ("self_attn.q_norm", "self_attn.q_norm"),
                             ("self_attn.k_norm", "self_attn.k_norm")):
            g = w[p + ours + ".weight"]
            if not np.all((g >= 0.5) & (g <= 2.0)):
                sys.exit(f"{p}{ours}: norm weights outside [0.5, 2] would not survive (1 + w) - 1 exactly")
            hf[p + theirs + ".weight"] = g - one
    if not a.tie:
        hf["lm_head.weight"] = w["lm_head.weight"]
    if a.vision_language:
        # Gemma3ForConditionalGeneration: the text model under language_model., its config under
        # text_config; the vision tower's tensors are there and unread by a text-only loader.
        hf = {"language_model." + k: v for k, v in hf.items()}
        vision_rng = np.random.default_rng(a.seed + 1000)
        hf["vision_tower.vision_model.post_layernorm.weight"] = round_to(
            vision_rng.standard_normal(32).astype(np.float32), a.dtype)
        hf["multi_modal_projector.mm_soft_emb_norm.weight"] = round_to(
            vision_rng.standard_normal(32).astype(np.float32), a.dtype)
        text = dict(config)
        for key in ("architectures", "torch_dtype"):
            text.pop(key)
        config = {
            "architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
            "text_config": text,
            "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 32, "intermediate_size": 64,
                              "num_hidden_layers": 1, "num_attention_heads": 2, "image_size": 28,
                              "patch_size": 14, "vision_use_head": False},
            "mm_tokens_per_image": 4, "boi_token_index": 0, "eoi_token_index": 0,
            "image_token_index": a.vocab - 1, "eos_token_id": [eos_id], "tie_word_embeddings": a.tie,
            "torch_dtype": "float32",
        }
    hf_dir = os.path.join(a.out, "hf")
    os.makedirs(hf_dir, exist_ok=True)
    with open(os.path.join(hf_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    save_safetensors(os.path.join(hf_dir, "model.safetensors"), hf, a.dtype)


def write_gguf(a, w, head_dim, tokens, token_types, merges, bos_id, eos_id, rope_scaling):
    bias = a.arch == "qwen2"
    gemma = a.arch == "gemma3"
    garch = a.arch if a.arch in ("qwen2", "gemma3") else "llama"  # llama.cpp stores mistral as llama
    wr = gguf.GGUFWriter(os.path.join(a.out, "model.gguf"), garch)
    wr.add_name(f"tiny-{a.arch}")
    wr.add_block_count(a.layers)
    wr.add_context_length(a.max_position)
    wr.add_embedding_length(a.hidden)
    wr.add_feed_forward_length(a.intermediate)
    wr.add_head_count(a.heads)
    wr.add_head_count_kv(a.kv_heads)
    wr.add_layer_norm_rms_eps(1e-5)
    wr.add_rope_freq_base(a.rope_theta)
    wr.add_rope_dimension_count(head_dim)
    if a.head_dim:
        wr.add_key_length(head_dim)
        wr.add_value_length(head_dim)
    if a.rope_scaling == "linear":
        wr.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        wr.add_rope_scaling_factor(2.0)
    if a.sliding_window and a.arch in ("mistral", "qwen2", "gemma3"):
        wr.add_sliding_window(a.sliding_window)
    if gemma:
        wr.add_uint32("gemma3.attention.sliding_window_pattern", a.sliding_window_pattern)
        wr.add_float32("gemma3.rope.freq_base_swa", a.rope_local_theta)
    wr.add_vocab_size(a.vocab)
    wr.add_tokenizer_model("gpt2")
    wr.add_tokenizer_pre("default")
    wr.add_token_list(tokens)
    wr.add_token_types(token_types)
    wr.add_token_merges(merges)
    wr.add_bos_token_id(bos_id)
    wr.add_eos_token_id(eos_id)

    permute = garch == "llama"
    gg = {"token_embd.weight": w["model.embed_tokens.weight"]}
    if a.rope_scaling == "llama3":
        r = rope_scaling
        gg["rope_freqs.weight"] = llama3_rope_factors(head_dim, a.rope_theta, r["factor"], r["low_freq_factor"],
                                                      r["high_freq_factor"], r["original_max_position_embeddings"])
    for i in range(a.layers):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        q, k = w[p + "self_attn.q_proj.weight"], w[p + "self_attn.k_proj.weight"]
        gg[b + "attn_norm.weight"] = w[p + "input_layernorm.weight"]
        gg[b + "attn_q.weight"] = permute_qk(q, a.heads) if permute else q
        gg[b + "attn_k.weight"] = permute_qk(k, a.kv_heads) if permute else k
        gg[b + "attn_v.weight"] = w[p + "self_attn.v_proj.weight"]
        if bias:
            gg[b + "attn_q.bias"] = w[p + "self_attn.q_proj.bias"]
            gg[b + "attn_k.bias"] = w[p + "self_attn.k_proj.bias"]
            gg[b + "attn_v.bias"] = w[p + "self_attn.v_proj.bias"]
        gg[b + "attn_output.weight"] = w[p + "self_attn.o_proj.weight"]
        gg[b + "ffn_norm.weight"] = w[p + "post_attention_layernorm.weight"]
        gg[b + "ffn_gate.weight"] = w[p + "mlp.gate_proj.weight"]
        gg[b + "ffn_up.weight"] = w[p + "mlp.up_proj.weight"]
        gg[b + "ffn_down.weight"] = w[p + "mlp.down_proj.weight"]
        if gemma:
            gg[b + "attn_q_norm.weight"] = w[p + "self_attn.q_norm.weight"]
            gg[b + "attn_k_norm.weight"] = w[p + "self_attn.k_norm.weight"]
            gg[b + "post_attention_norm.weight"] = w[p + "post_attention_norm.weight"]
            gg[b + "post_ffw_norm.weight"] = w[p + "post_feedforward_layernorm.weight"]
    gg["output_norm.weight"] = w["model.norm.weight"]
    if not a.tie:
        gg["output.weight"] = w["lm_head.weight"]
    for name, t in gg.items():
        t = np.ascontiguousarray(t, dtype=np.float32)
        quantize = (a.gguf_type != "f32" and t.ndim == 2 and t.shape[1] % 32 == 0 and name != "rope_freqs.weight"
                    and (name != "token_embd.weight" or a.tie))
        if quantize:
            qtype, q = quantize_tensor(name, t, a.gguf_type)
            wr.add_tensor(name, q, raw_shape=q.shape, raw_dtype=qtype)
        else:
            wr.add_tensor(name, t)
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()


def f16_bytes(v):
    return np.asarray(v, dtype=np.float16).reshape(-1, 1).view(np.uint8)


def scale_min_subblocks(x, top, sc_max):
    """x [blocks, subs, n]: per sub-block a scale and a min (w ≈ d·sc·q − dmin·m, q in 0..top),
    quantized to sc, m in 0..sc_max against the block's f16 d and dmin (the largest over
    sc_max): (d16, dmin16, sc, m, q), the last three uint8. Q4_K/Q5_K's and Q2_K's rule."""
    lo = np.minimum(x.min(axis=2), 0.0)
    scale = (x.max(axis=2) - lo) / top
    mn = -lo
    d16 = (scale.max(axis=1) / sc_max).astype(np.float16)
    dmin16 = (mn.max(axis=1) / sc_max).astype(np.float16)
    dd, dm = d16.astype(np.float32), dmin16.astype(np.float32)
    sc = np.clip(np.round(np.divide(scale, dd[:, None], out=np.zeros_like(scale), where=dd[:, None] > 0)), 0, sc_max)
    m = np.clip(np.round(np.divide(mn, dm[:, None], out=np.zeros_like(mn), where=dm[:, None] > 0)), 0, sc_max)
    step = (dd[:, None] * sc)[:, :, None]
    q = np.clip(np.round(np.divide(x + (dm[:, None] * m)[:, :, None], step, out=np.zeros_like(x), where=step > 0)), 0, top)
    return d16, dmin16, sc.astype(np.uint8), m.astype(np.uint8), q.astype(np.uint8)


def scale_subblocks(x, q_den, sc_max, q_lo, q_hi):
    """x [blocks, subs, n]: per sub-block a scale max|x| / q_den (w ≈ d·sc·q, q in q_lo..q_hi),
    quantized to sc against the block's f16 d (the largest scale over sc_max): (d16, sc, q),
    q int32. Q6_K's and Q3_K's rule."""
    scale = np.abs(x).max(axis=2) / q_den
    d16 = (scale.max(axis=1) / sc_max).astype(np.float16)
    dd = d16.astype(np.float32)
    sc = np.clip(np.round(np.divide(scale, dd[:, None], out=np.zeros_like(scale), where=dd[:, None] > 0)), -sc_max - 1, sc_max)
    step = (dd[:, None] * sc)[:, :, None]
    q = np.clip(np.round(np.divide(x, step, out=np.zeros_like(x), where=step > 0)), q_lo, q_hi).astype(np.int32)
    return d16, sc, q


def quantize_k4(t, bits):
    """[rows, cols] (cols % 256 == 0) -> Q4_K (bits 4: [rows, cols / 256 * 144] uint8) or Q5_K
    (bits 5: 176 bytes a super-block) blocks: per 32-weight sub-block a 6-bit scale and min,
    w ≈ d·sc·q − dmin·m."""
    x = t.reshape(-1, 8, 32).astype(np.float32)
    d16, dmin16, sc, m, q = scale_min_subblocks(x, (1 << bits) - 1, 63)
    scales = np.zeros((x.shape[0], 12), np.uint8)
    for j in range(4):  # ggml's get_scale_min_k4 packing
        scales[:, j] = sc[:, j] | ((sc[:, j + 4] >> 4) << 6)
        scales[:, j + 4] = m[:, j] | ((m[:, j + 4] >> 4) << 6)
        scales[:, j + 8] = (sc[:, j + 4] & 15) | ((m[:, j + 4] & 15) << 4)
    qs = ((q[:, 0::2, :] & 15) | ((q[:, 1::2, :] & 15) << 4)).reshape(-1, 128)  # byte 32g + l: sub-blocks 2g, 2g + 1
    parts = [f16_bytes(d16), f16_bytes(dmin16), scales]
    if bits == 5:  # qh[l]: bit j the fifth bit of sub-block j's weight l
        qh = np.zeros((x.shape[0], 32), np.uint8)
        for j in range(8):
            qh |= ((q[:, j, :] >> 4) & 1) << j
        parts.append(qh)
    blocks = np.concatenate(parts + [qs], axis=1)
    return blocks.reshape(t.shape[0], -1)


def quantize_q6_k(t):
    """[rows, cols] (cols % 256 == 0) -> Q6_K blocks [rows, cols / 256 * 210] (uint8): per
    16-weight sub-block an int8 scale, w ≈ d·sc·(q − 32)."""
    d16, sc, q = scale_subblocks(t.reshape(-1, 16, 16).astype(np.float32), 31.0, 127, -32, 31)
    q = (q + 32).astype(np.uint8).reshape(-1, 2, 4, 32)  # [block][half n][quarter k][l]: weight 128n + 32k + l
    ql = np.concatenate([(q[:, :, 0] & 15) | ((q[:, :, 2] & 15) << 4), (q[:, :, 1] & 15) | ((q[:, :, 3] & 15) << 4)],
                        axis=2).reshape(-1, 128)
    qh = ((q[:, :, 0] >> 4) | ((q[:, :, 1] >> 4) << 2) | ((q[:, :, 2] >> 4) << 4) | ((q[:, :, 3] >> 4) << 6)).reshape(-1, 64)
    blocks = np.concatenate([ql, qh, sc.astype(np.int8).view(np.uint8), f16_bytes(d16)], axis=1)
    return blocks.reshape(t.shape[0], -1)


def pack_2bit(q):
    """[blocks, 256] values 0..3 -> qs [blocks, 64]: bits 2j.. of byte 32g + l hold weight
    128g + 32j + l (Q2_K's and Q3_K's layout)."""
    q = q.reshape(-1, 2, 4, 32).astype(np.uint8)  # [block][g][j][l]
    return (q[:, :, 0] | (q[:, :, 1] << 2) | (q[:, :, 2] << 4) | (q[:, :, 3] << 6)).reshape(-1, 64)


def quantize_q3_k(t):
    """[rows, cols] (cols % 256 == 0) -> Q3_K blocks [rows, cols / 256 * 110] (uint8): per
    16-weight sub-block a signed 6-bit scale, w ≈ d·sc·q with q in -4..3."""
    d16, sc, q = scale_subblocks(t.reshape(-1, 16, 16).astype(np.float32), 4.0, 31, -4, 3)
    q = (q + 4).reshape(-1, 256)
    hmask = np.zeros((q.shape[0], 32), np.uint8)
    for j in range(8):  # bit j of hmask[l]: weight 32j + l's third bit
        hmask |= ((q[:, 32 * j:32 * j + 32] >> 2) & 1).astype(np.uint8) << j
    u = (sc.astype(np.int32) + 32).astype(np.uint8)  # [block][16], 0..63
    scales = np.zeros((q.shape[0], 12), np.uint8)
    for i in range(16):  # ggml's packing: low nibbles in bytes 0-7 (lo/hi half), top bits in 8-11
        scales[:, i % 8] |= (u[:, i] & 15) << (4 * (i // 8))
        scales[:, 8 + i % 4] |= ((u[:, i] >> 4) & 3) << (2 * (i // 4))
    blocks = np.concatenate([hmask, pack_2bit(q & 3), scales, f16_bytes(d16)], axis=1)
    return blocks.reshape(t.shape[0], -1)


def quantize_q2_k(t):
    """[rows, cols] (cols % 256 == 0) -> Q2_K blocks [rows, cols / 256 * 84] (uint8): per
    16-weight sub-block a 4-bit scale and min, w ≈ d·sc·q − dmin·m with q in 0..3."""
    d16, dmin16, sc, m, q = scale_min_subblocks(t.reshape(-1, 16, 16).astype(np.float32), 3, 15)
    blocks = np.concatenate([sc | (m << 4), pack_2bit(q.reshape(-1, 256)), f16_bytes(d16), f16_bytes(dmin16)], axis=1)
    return blocks.reshape(t.shape[0], -1)


def quantize_tensor(name, t, gguf_type):
    """(ggml type, blocks) of a 2-D tensor for --gguf-type."""
    import gguf
    Q = gguf.GGMLQuantizationType
    if gguf_type not in ("q4_k_m", "q5_k_m", "q3_k_m", "q2_k"):
        qtype = {"q8_0": Q.Q8_0, "q4_0": Q.Q4_0, "q4_1": Q.Q4_1, "q5_1": Q.Q5_1}[gguf_type]
        return qtype, gguf.quants.quantize(t, qtype)
    if t.shape[1] % 256 != 0:
        return Q.Q5_0, gguf.quants.quantize(t, Q.Q5_0)
    six = name == "output.weight" or any(k in name for k in ("attn_v.", "ffn_down."))
    if name == "output.weight" or (six and gguf_type in ("q4_k_m", "q5_k_m")):
        qtype, q = Q.Q6_K, quantize_q6_k(t)
    elif gguf_type == "q3_k_m":
        qtype, q = (Q.Q4_K, quantize_k4(t, 4)) if six or "attn_output." in name else (Q.Q3_K, quantize_q3_k(t))
    elif gguf_type == "q2_k":
        qtype, q = (Q.Q3_K, quantize_q3_k(t)) if six else (Q.Q2_K, quantize_q2_k(t))
    elif gguf_type == "q4_k_m":
        qtype, q = Q.Q4_K, quantize_k4(t, 4)
    else:
        qtype, q = Q.Q5_K, quantize_k4(t, 5)
    back = gguf.quants.dequantize(q, qtype)
    err = float(np.abs(back - t).max())
    bound = 0.5 if qtype in (Q.Q2_K, Q.Q3_K) else 0.25  # 2- and 3-bit steps are a third and a quarter of the range
    if not err <= bound * float(np.abs(t).max()) + 1e-6:  # a packing error gives wild values
        sys.exit(f"{name}: {qtype.name} round trip error {err} (max |w| {float(np.abs(t).max())})")
    return qtype, q


if __name__ == "__main__":
    main()
