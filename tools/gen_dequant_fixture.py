#!/usr/bin/env python3
"""Writes the fixtures for tests/worker/test_dequant.cpp and tests/worker/test_gguf.cpp.

tests/fixtures/dequant/: for each ggml type, <type>.raw (random block bytes with sane
finite f16 scales) and <type>.f32 (the f32 output of gguf.quants.dequantize, the
reference), plus manifest.json (type numbers, element counts, block/type sizes).
tests/fixtures/gguf/: tiny.gguf written by gguf.GGUFWriter (metadata of every value type,
arrays, nested arrays, tensors of several types, alignment 64) and tiny.json with the
values a reader must find, cross-checked with gguf.GGUFReader.

Usage: python3 tools/gen_dequant_fixture.py [repo_root]   (deterministic: fixed seed)
"""
import json
import os
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES

# type -> (number of blocks, byte offsets of the f16 scale/min fields inside a block)
TYPES = {
    T.F32: (256, []),
    T.F16: (256, []),
    T.BF16: (256, []),
    T.Q4_0: (8, [0]),
    T.Q4_1: (8, [0, 2]),
    T.Q5_0: (8, [0]),
    T.Q5_1: (8, [0, 2]),
    T.Q8_0: (8, [0]),
    T.Q2_K: (3, [80, 82]),
    T.Q3_K: (3, [108]),
    T.Q4_K: (3, [0, 2]),
    T.Q5_K: (3, [0, 2]),
    T.Q6_K: (3, [208]),
}


def sane_f16(rng, n):
    """Random finite f16 values of both signs over several magnitudes."""
    v = rng.standard_normal(n) * np.exp2(rng.integers(-12, 2, n))
    return v.astype(np.float16)


def raw_blocks(rng, qtype, n_blocks, scale_offsets):
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    if qtype == T.F32:
        return rng.standard_normal(n_blocks).astype(np.float32).view(np.uint8)
    if qtype == T.F16:
        v = sane_f16(rng, n_blocks)
        v[:4] = np.array([0.0, -0.0, 6e-8, -3e-5], dtype=np.float16)  # zeros and subnormals
        return v.view(np.uint8)
    if qtype == T.BF16:
        f = rng.standard_normal(n_blocks).astype(np.float32)
        return (f.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    data = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)
    for off in scale_offsets:
        scales = sane_f16(rng, n_blocks)
        data[:, off:off + 2] = scales.view(np.uint8).reshape(n_blocks, 2)
    # one subnormal scale, so the f16 subnormal path is covered too
    data[0, scale_offsets[0]:scale_offsets[0] + 2] = np.array([3], dtype=np.uint16).view(np.uint8)
    return data.reshape(-1)


def write_dequant(root, rng):
    out_dir = os.path.join(root, "tests/fixtures/dequant")
    os.makedirs(out_dir, exist_ok=True)
    manifest = []
    for qtype, (n_blocks, offsets) in TYPES.items():
        block_size, type_size = GGML_QUANT_SIZES[qtype]
        raw = raw_blocks(rng, qtype, n_blocks, offsets)
        assert raw.size == n_blocks * type_size
        expected = np.asarray(gguf.quants.dequantize(raw, qtype), dtype=np.float32).reshape(-1)
        n = n_blocks * block_size
        assert expected.size == n, (qtype.name, expected.size, n)
        assert np.all(np.isfinite(expected)), qtype.name
        name = qtype.name.lower()
        raw.tofile(os.path.join(out_dir, name + ".raw"))
        expected.astype("<f4").tofile(os.path.join(out_dir, name + ".f32"))
        manifest.append({"name": name, "type": int(qtype), "n": n, "block_size": block_size,
                         "type_size": type_size, "nbytes": int(raw.size)})
    with open(os.path.join(out_dir, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")


# (key, GGUFValueType name, value) -- one of every scalar type, arrays, a nested array.
VT = gguf.GGUFValueType
METADATA = [
    ("test.u8", VT.UINT8, 200),
    ("test.i8", VT.INT8, -100),
    ("test.u16", VT.UINT16, 60000),
    ("test.i16", VT.INT16, -30000),
    ("test.u32", VT.UINT32, 4000000000),
    ("test.i32", VT.INT32, -2000000000),
    ("test.f32", VT.FLOAT32, 0.15625),
    ("test.bool_true", VT.BOOL, True),
    ("test.bool_false", VT.BOOL, False),
    ("test.string", VT.STRING, "héllo, gguf"),
    ("test.empty_string", VT.STRING, ""),
    ("test.u64", VT.UINT64, 18000000000000000000),
    ("test.i64", VT.INT64, -9000000000000000000),
    ("test.f64", VT.FLOAT64, -2.718281828459045),
]
ARRAYS = [
    ("test.arr_i32", VT.INT32, [1, -2, 3, -4, 5]),
    ("test.arr_u8", VT.UINT8, [0, 7, 255]),
    ("test.arr_f32", VT.FLOAT32, [0.5, -1.25, 3.0]),
    ("test.arr_f64", VT.FLOAT64, [1e-300, 2.5]),
    ("test.arr_str", VT.STRING, ["a", "", "<|im_start|>", "Ġthe"]),
    ("test.arr_bool", VT.BOOL, [True, False, True]),
]
NESTED = ("test.arr_nested", [[1, 2], [3, 4, 5]])  # array of arrays of i32


def write_gguf(root, rng):
    out_dir = os.path.join(root, "tests/fixtures/gguf")
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "tiny.gguf")
    w = gguf.GGUFWriter(path, "llama")
    w.add_custom_alignment(64)
    for key, vt, val in METADATA:
        w.add_key_value(key, val, vt)
    for key, vt, val in ARRAYS:
        w.add_key_value(key, val, VT.ARRAY, sub_type=vt)
    w.add_key_value(NESTED[0], [list(map(int, a)) for a in NESTED[1]], VT.ARRAY)

    tensors = []
    f32 = rng.standard_normal((3, 8)).astype(np.float32)        # dims [8, 3]
    w.add_tensor("t.f32", f32)
    f16 = rng.standard_normal((2, 5)).astype(np.float16)        # dims [5, 2]
    w.add_tensor("t.f16", f16)
    vec = rng.standard_normal(7).astype(np.float32)             # dims [7]
    w.add_tensor("t.vec", vec)
    q8 = raw_blocks(rng, T.Q8_0, 4, [0]).reshape(2, 2 * 34)     # dims [64, 2]
    w.add_tensor("t.q8_0", q8, raw_dtype=T.Q8_0)
    q4k = raw_blocks(rng, T.Q4_K, 2, [0, 2]).reshape(2, 144)    # dims [256, 2]
    w.add_tensor("t.q4_k", q4k, raw_dtype=T.Q4_K)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    # Expected values come from gguf.GGUFReader, an independent reader of the same file.
    r = gguf.GGUFReader(path)
    for t in r.tensors:
        raw = np.asarray(r.data[t.data_offset:t.data_offset + t.n_bytes], dtype=np.uint8)
        tensors.append({"name": t.name, "type": int(t.tensor_type),
                        "dims": [int(d) for d in t.shape], "offset": int(t.data_offset),
                        "nbytes": int(t.n_bytes), "data_hex": raw.tobytes().hex()})
    meta = []
    for key, vt, val in METADATA:
        meta.append({"key": key, "type": int(vt), "value": val})
    for key, vt, val in ARRAYS:
        meta.append({"key": key, "type": int(VT.ARRAY), "elem_type": int(vt), "value": val})
    meta.append({"key": NESTED[0], "type": int(VT.ARRAY), "elem_type": int(VT.ARRAY),
                 "value": NESTED[1]})
    for m in meta:  # the file must hold what we asked for
        assert m["key"] in r.fields, m["key"]
    expected = {"version": 3, "alignment": 64, "architecture": "llama",
                "kv_count": len(r.fields) - 3,  # GGUFReader adds 3 header pseudo-fields
                "tensor_count": len(r.tensors), "data_start": int(r.data_offset),
                "file_size": os.path.getsize(path), "metadata": meta, "tensors": tensors}
    with open(os.path.join(out_dir, "tiny.json"), "w") as f:
        json.dump(expected, f, indent=1, ensure_ascii=False)
        f.write("\n")


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    rng = np.random.default_rng(20240607)
    write_dequant(root, rng)
    write_gguf(root, rng)


if __name__ == "__main__":
    main()
