#!/usr/bin/env python3
"""Test vectors for tests/kernels: RoPE inv_freq from Hugging Face transformers' own
rope init functions (llama3 and linear scaling), and the first outputs of the
splitmix64-seeded xoshiro256** generator from an independent Python implementation.
Prints C++ initializers; paste them into tests/kernels/test_rope.cpp / test_sampling.cpp.
Usage: python3 tools/gen_kernel_vectors.py
"""
import math

M64 = (1 << 64) - 1


def hf_inv_freq(rope_type, theta, head_dim, **params):
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rope = {"rope_type": rope_type, "rope_theta": theta, **params}
    cfg = LlamaConfig(hidden_size=head_dim * 4, num_attention_heads=4, head_dim=head_dim,
                      max_position_embeddings=131072, rope_parameters=rope)
    fn = ROPE_INIT_FUNCTIONS[rope_type] if rope_type != "default" else None
    if fn is None:
        return [1.0 / theta ** (i / head_dim) for i in range(0, head_dim, 2)]
    inv, _ = fn(cfg, "cpu")
    return inv.tolist()


def splitmix64(state):
    state = (state + 0x9E3779B97F4A7C15) & M64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return state, z ^ (z >> 31)


def xoshiro_outputs(seed, n):
    s = []
    for _ in range(4):
        seed, v = splitmix64(seed)
        s.append(v)
    rotl = lambda x, k: ((x << k) | (x >> (64 - k))) & M64
    out = []
    for _ in range(n):
        out.append((rotl((s[1] * 5) & M64, 7) * 9) & M64)
        t = (s[1] << 17) & M64
        s[2] ^= s[0]
        s[3] ^= s[1]
        s[1] ^= s[2]
        s[0] ^= s[3]
        s[2] ^= t
        s[3] = rotl(s[3], 45)
    return out


def cpp_float(v):
    t = f"{v:.9g}"
    return (t if any(c in t for c in ".e") else t + ".0") + "f"


def main():
    llama3 = hf_inv_freq("llama3", 500000.0, 128, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                         original_max_position_embeddings=8192)
    print("// llama3: theta 500000, head_dim 128, factor 8, low 1, high 4, original_max 8192")
    print("const float k_hf_llama3_inv_freq[64] = {" + ", ".join(cpp_float(v) for v in llama3) + "};")
    linear = hf_inv_freq("linear", 10000.0, 64, factor=4.0)
    print("// linear: theta 10000, head_dim 64, factor 4")
    print("const float k_hf_linear_inv_freq[32] = {" + ", ".join(cpp_float(v) for v in linear) + "};")
    for seed in (0, 42):
        outs = xoshiro_outputs(seed, 4)
        print(f"// xoshiro256** seeded by splitmix64({seed})")
        print(f"const uint64_t k_xoshiro_seed{seed}[4] = {{" + ", ".join(f"0x{v:016x}ull" for v in outs) + "};")


if __name__ == "__main__":
    main()
