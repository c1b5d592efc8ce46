#!/usr/bin/env python3
"""Writes the hand-made seed inputs of tests/fixtures/fuzz/ (the fuzz targets in fuzz/ read
them; crash-* inputs found by bench/run_fuzz.sh live beside them and are not generated).
Usage: python3 tools/gen_fuzz_seeds.py [OUT_DIR]   (default tests/fixtures/fuzz)"""
import json
import os
import struct
import sys

out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "fuzz")


def w(rel, data):
    path = os.path.join(out, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


# safetensors: u64 header length, JSON header, data
hdr = json.dumps({"__metadata__": {"format": "pt"}, "w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
w("safetensors/one_tensor.safetensors", struct.pack("<Q", len(hdr)) + hdr + struct.pack("<2f", 1.0, -2.0))
hdr = json.dumps({"a": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [0, 8]},
                  "b": {"dtype": "F16", "shape": [1], "data_offsets": [8, 10]}}).encode()
w("safetensors/two_tensors.safetensors", struct.pack("<Q", len(hdr)) + hdr + bytes(10))
w("safetensors_index/index.json", json.dumps({"metadata": {"total_size": 16}, "weight_map": {
    "w": "model-00001-of-00002.safetensors", "v": "model-00002-of-00002.safetensors"}}))
w("safetensors_index/escape.json", json.dumps({"weight_map": {"w": "../../etc/passwd"}}))
# chat templates: source \0 role \0 content ...
templates = {
    "chatml": "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}",
    "llama3": "<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n{{ message['content'] | trim }}<|eot_id|>",
    "mistral": "{{ bos_token }}{% for message in messages %}[INST] {{ message['content'] }} [/INST]{% endfor %}",
    "llama2": "<<SYS>>\n{{ system }}\n<</SYS>>\n\n[INST] {{ content }} [/INST]",
}
for name, src in templates.items():
    w(f"chat_template/{name}.bin", src + "\0system\0Be brief.\0user\0What is the capital of France?\0assistant\0Paris."
      "\0user\0\u00e9t\u00e9?\0")
# API bodies: the first character picks the route ('0' completions, '1' chat), then the JSON body
bodies = [
    ("0", {"prompt": "Hello", "max_tokens": 4, "temperature": 0, "stop": ["\n"], "logprobs": 2, "n": 2}),
    ("0", {"prompt": [[1, 2, 3], "two"], "echo": True, "max_tokens": 0, "logprobs": 1, "logit_bias": {"5": -100}}),
    ("0", {"prompt": "x", "kv_compression": {"policy": "snapkv", "budget": 64, "window": 8, "kernel": 5,
                                             "pooling": "avg", "gqa": "max", "layerwise": True}}),
    ("1", {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": [{"type": "text", "text": "hi"}]}],
           "max_completion_tokens": 8, "logprobs": True, "top_logprobs": 3, "presence_penalty": 0.5, "min_tokens": 2,
           "stop_token_ids": [2], "response_format": {"type": "text"}, "stream": True,
           "stream_options": {"include_usage": True}}),
    ("1", {"messages": [{"role": "developer", "content": "x"}], "tools": [], "tool_choice": "none", "seed": 7}),
]
for i, (route, body) in enumerate(bodies):
    w(f"api_request/body{i}.txt", route + json.dumps(body))


# step plans, format v3 (worker/step_plan.cpp), little-endian: header (kv_dtype 0 = f32), five
# empty lists, report
def plan(shutdown=0, report=0):
    return struct.pack("<BBqiBq", 3, shutdown, 0, 16, 0, 512) + struct.pack("<Q", 0) * 5 + struct.pack("<B", report)


w("step_plan/empty.bin", plan())
w("step_plan/shutdown.bin", plan(shutdown=1))
w("step_plan/report.bin", plan(report=1))
# batch lines, and an output file with a partial last line
w("batch_line/completion.jsonl", json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/completions",
                                             "body": {"prompt": "hi", "max_tokens": 3}}))
w("batch_line/chat.jsonl", json.dumps({"custom_id": "b", "url": "/v1/chat/completions",
                                       "body": {"messages": [{"role": "user", "content": "hi"}]}}))
w("batch_line/records.jsonl", '{"id":"batch_req_1","custom_id":"a","line":1,"error":null}\n{"line":3}\n{"li')
w("gguf/empty.gguf", b"GGUF")
w("tokenizer_json/minimal.json", json.dumps({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]},
                                             "added_tokens": [{"id": 3, "content": "<s>", "special": True}]}))


# The tokenizer fixtures, shrunk to their first `keep` vocabulary entries and the merges among
# them: every section (normalizer, pre-tokenizer, post-processor, decoder, added tokens) stays,
# but a seed is a few KB instead of 50, so the fuzzer runs ~10x more inputs per second on it.
def shrunk_tokenizer(rel, keep):
    src = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "tokenizer", rel, "tokenizer.json")
    with open(src, encoding="utf-8") as f:
        j = json.load(f)
    m = j["model"]
    vocab = {t: i for t, i in m["vocab"].items() if i < keep}
    merges = []
    for mg in m.get("merges", []):
        a, b = mg.split(" ", 1) if isinstance(mg, str) else mg
        if a in vocab and b in vocab and a + b in vocab:
            merges.append(mg)
    m["vocab"], m["merges"] = vocab, merges
    j["added_tokens"] = [t for t in j.get("added_tokens", []) if t["id"] < keep][:4]
    return json.dumps(j, ensure_ascii=False, separators=(",", ":"))


for name, keep in (("bytebpe", 300), ("spm", 200), ("spm_metaspace", 200)):
    w(f"tokenizer_json/{name}_small.json", shrunk_tokenizer(name, keep))

# TCP communicator messages (comm/tcp_wire.h): records of a selector byte, then a 16-byte
# header {u32 magic "SNPT", u32 kind, u64 num_bytes} (selector bit 7 clear; bits 0-1 the
# collective, bits 2-6 the expected size) or a 12-byte hello {magic, rank, world_size}.
SNPT = 0x54504E53


def header(kind, n):
    return struct.pack("<IIQ", SNPT, kind, n)


def hello(rank, size):
    return struct.pack("<III", SNPT, rank, size)


# all_reduce_sum (op 0) of 8 bytes as expected, then a mismatch, then an abort notice.
w("tcp_wire/headers.bin", bytes([0 | (8 << 2)]) + header(1, 8) + bytes([1 | (8 << 2)]) + header(1, 8) +
  bytes([2]) + header(0xFF, 12))
# hellos to a world of 3 (selector 0x80 | 2: joined has 3 slots, none taken): ok, bad size, rank 0.
w("tcp_wire/hellos.bin", bytes([0x82]) + hello(1, 3) + bytes([0x82]) + hello(2, 4) + bytes([0x82]) + hello(0, 3))
