#!/usr/bin/env python3
"""Writes a GGUF model out as a Hugging Face directory through transformers, as a user's
transformers would save it: config.json (transformers 5 writes rope_parameters), f32
model.safetensors (the GGUF dequantized by transformers' GGUF loader), generation_config.json,
tokenizer.json and tokenizer_config.json (+ chat_template.jinja when the tokenizer has one).
The directory and the GGUF hold the same weights, so snapserve must give the same prompt ids,
text and (to rounding) logits from both: the check of the HF reader on real models.

Needs a venv with torch, transformers, gguf, safetensors (e.g. /work/venv-ref):
  /work/venv-ref/bin/python tools/hf_dir_from_gguf.py ~/.cache/snapserve/gemma-3-270m-q4_k_m.gguf /tmp/gemma3-hf \\
      [--eos 1,106]
  build/snapserve generate --model /tmp/gemma3-hf --chat --prompt '...' --dump-logits A.bin   (and the GGUF: B.bin)
  (tools/read_logits.py reads both)
"""
import argparse
import json
import os


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("gguf", help="the .gguf file")
    ap.add_argument("out", help="output directory")
    ap.add_argument("--eos", help="comma-separated eos ids for generation_config.json (an -it model's end of turn)")
    a = ap.parse_args()

    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory, name = os.path.split(os.path.abspath(a.gguf))
    tok = AutoTokenizer.from_pretrained(directory, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype=torch.float32)
    os.makedirs(a.out, exist_ok=True)
    # save_pretrained refuses a model loaded from GGUF ("quantized with gguf"): write the
    # tensors and the configs directly. Tied weights are stored once, as transformers does.
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    save_file(state, os.path.join(a.out, "model.safetensors"), metadata={"format": "pt"})
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.save_pretrained(a.out)
    model.generation_config.save_pretrained(a.out)
    tok.save_pretrained(a.out)
    if a.eos:
        path = os.path.join(a.out, "generation_config.json")
        g = json.load(open(path))
        g["eos_token_id"] = [int(x) for x in a.eos.split(",")]
        json.dump(g, open(path, "w"), indent=2)
    print(f"wrote {a.out}: {type(model).__name__}, {len(state)} tensors")


if __name__ == "__main__":
    main()
