#!/usr/bin/env python3
"""Writes tests/fixtures/tokenizer/: a varied text set, small trained tokenizers and the
reference token ids the C++ tokenizer must reproduce exactly.

References:
  smollm2_gguf  - a `tokenizers` BPE built from the default model's GGUF vocab + merges with
                  SmolLM2's own pipeline (Digits(individual) + ByteLevel, ByteLevel decoder);
                  cross-checked against transformers' GGUF tokenizer where that is installed.
  bytebpe       - a Llama-3-style byte-level BPE (Split regex with \\p{L}/\\p{N}{1,3}, ignore_merges,
                  <|begin_of_text|> template) trained here on the text set; tokenizer.json committed.
  spm           - a Llama-2-style BPE with byte_fallback, Prepend+Replace normalizer, <s> template.
  spm_metaspace - the same model with a Metaspace pre-tokenizer instead of the normalizer.
  spm_gemma     - the same model with Gemma 3's pipeline (tokenizer.json as transformers writes
                  it for Gemma 3): Replace(" ", "▁") without Prepend, Split(" ",
                  MergedWithPrevious), Replace/ByteFallback/Fuse decoder. `--only spm_gemma`
                  builds it from the committed spm/tokenizer.json and adds its ids to
                  expected.json without retraining the others.
  spm.gguf      - the spm vocab written as a GGUF (tokenizer.ggml.model "llama", scores = -id, no
                  merges); its reference is spm's ids: sentencepiece adds the dummy "▁" prefix to
                  every text segment, as llama.cpp and the Prepend normalizer do. transformers'
                  GGUF tokenizer (Metaspace prepend_scheme=first) is only printed as a cross-check.
Chat references come from transformers' apply_chat_template (jinja) on each template.
Usage: python3 tools/gen_tokenizer_fixture.py [--model PATH.gguf] [--out DIR]
"""
import argparse
import json
import os
import random

import gguf
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from tokenizers import trainers, AddedToken

TEXTS = [
    "Hello world",
    "Hello, world! How are you today?",
    "",
    " ",
    "  leading and trailing spaces  ",
    "héllo naïve café résumé Ångström",
    "Größere Straßen über Brücken führen zu schönen Häusern.",
    "L'élève a été très intéressé par « la leçon » d'aujourd'hui.",
    "中文字符测试，这是一个句子。",
    "日本語のテキスト：ひらがな、カタカナ、漢字。",
    "한국어 문장을 토큰화합니다.",
    "مرحبا بالعالم، هذا نص عربي.",
    "Emoji: 😀 👍🏽 ❤️ 🚀✨",
    "Family: 👨‍👩‍👧‍👦 and flags 🇩🇪🇫🇷🇯🇵 and 🏳️‍🌈",
    "def main():\n\tif x == 1:\n\t\treturn [i * 2 for i in range(10)]\n    pass\n",
    "int main(void) {\n    printf(\"%d\\n\", 42);\n    return 0;\n}\n",
    "many          spaces     here\t\t\ttabs",
    "new\n\n\nlines\r\n\r\nand more\n",
    "digits 1234567 and 3.14159 and 1,000,000 and ١٢٣",
    "don't I'm we'll they've she'd it's YOU'RE Can'T",
    "<|im_start|>user\nhi<|im_end|>",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>assistant\n",
    "text before<|im_end|>text after <|endoftext|>",
    "<s>[INST] Hello [/INST]</s>",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
    "Mixed: abc123def ÀÉÎ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 ∑∫√ ½ ™ © — – … “quotes” ‘single’",
    "URL https://example.com/path?query=1&b=2#frag and email a.b@c.org",
    "   \n  \t \n",
    "a",
    "supercalifragilisticexpialidocious antidisestablishmentarianism",
    "\u00a0non-breaking\u00a0space and zero\u200bwidth",
    "ends with space ",
    "<0x41> is not a byte token in text",
]

WORDS = ("the of and to in is was for that with as on by at from his her they this which "
         "model token server cache memory attention window budget prompt sequence layer head "
         "compression kernel quantized weights running quickly slowly between beautiful "
         "government information development international experience important available "
         "question answer language system process people world during another").split()


def long_text(seed, num_words):
    rng = random.Random(seed)
    sentences = []
    count = 0
    while count < num_words:
        n = rng.randint(5, 18)
        words = [rng.choice(WORDS) for _ in range(n)]
        if rng.random() < 0.2:
            words.insert(rng.randint(0, n), str(rng.randint(0, 99999)))
        s = " ".join(words)
        s = s[0].upper() + s[1:] + rng.choice([".", ".", "!", "?", ","])
        sentences.append(s)
        count += n
        if rng.random() < 0.1:
            sentences.append("\n\n")
    return " ".join(sentences)


def gguf_field(reader, key):
    f = reader.fields[key]
    if f.types[0] == gguf.GGUFValueType.ARRAY:
        if f.types[1] == gguf.GGUFValueType.STRING:
            return [bytes(f.parts[i]).decode("utf-8") for i in f.data]
        return [f.parts[i][0].item() for i in f.data]
    if f.types[0] == gguf.GGUFValueType.STRING:
        return bytes(f.parts[-1]).decode("utf-8")
    return f.parts[-1][0].item()


def smollm2_from_gguf(path):
    r = gguf.GGUFReader(path)
    tokens = gguf_field(r, "tokenizer.ggml.tokens")
    types = gguf_field(r, "tokenizer.ggml.token_type")
    merges = [tuple(m.split(" ", 1)) for m in gguf_field(r, "tokenizer.ggml.merges")]
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab, merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                            for i in range(len(tokens)) if types[i] == 3])
    return tok, gguf_field(r, "tokenizer.chat_template")


def corpus():
    out = list(TEXTS) * 3
    for seed in range(40):
        out.append(long_text(100 + seed, 200))
    return out


def train_bytebpe():
    llama3_regex = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                    r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(llama3_regex), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                "<|end_header_id|>", "<|eot_id|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(vocab_size=1000, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(corpus(), trainer)
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                      pair="<|begin_of_text|> $A <|begin_of_text|> $B",
                                      special_tokens=[("<|begin_of_text|>", bos)])])
    return tok


def train_spm():
    """Returns (tokenizer with normalizer, tokenizer with Metaspace, vocab list, merges)."""
    base = Tokenizer(models.BPE(unk_token="<unk>"))
    base.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    base.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never", split=True)
    trainer = trainers.BpeTrainer(vocab_size=700, special_tokens=["<unk>", "<s>", "</s>"],
                                  limit_alphabet=120, show_progress=False)
    base.train_from_iterator(corpus(), trainer)
    trained = json.loads(base.to_str())["model"]
    old_vocab = sorted(trained["vocab"].items(), key=lambda kv: kv[1])
    vocab = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % b for b in range(256)]
    vocab += [t for t, _ in old_vocab if t not in ("<unk>", "<s>", "</s>")]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ", 1)) for m in trained["merges"]]
    ids = {t: i for i, t in enumerate(vocab)}

    def build(with_normalizer):
        tok = Tokenizer(models.BPE(ids, merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
        if with_normalizer:
            tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"),
                                                   normalizers.Replace(" ", "▁")])
            tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                             decoders.Fuse(), decoders.Strip(" ", 1, 0)])
        else:
            tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first",
                                                         split=False)
            tok.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Metaspace(
                replacement="▁", prepend_scheme="first", split=False)])
        tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                for t in ("<unk>", "<s>", "</s>")])
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)])
        return tok

    return build(True), build(False), vocab


def gemma_variant(spm):
    """spm's vocab and merges with Gemma 3's normalizer, pre-tokenizer and decoder."""
    tok = Tokenizer.from_str(spm.to_str())
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    return tok


def write_spm_gguf(path, vocab, chat_template):
    w = gguf.GGUFWriter(path, "llama")
    w.add_tokenizer_model("llama")
    w.add_token_list(vocab)
    w.add_token_scores([-float(i) for i in range(len(vocab))])
    types = []
    for t in vocab:
        if t == "<unk>":
            types.append(2)
        elif t in ("<s>", "</s>"):
            types.append(3)
        elif t.startswith("<0x") and len(t) == 6:
            types.append(6)
        else:
            types.append(1)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_space_prefix(True)
    w.add_chat_template(chat_template)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def reference(tok, texts, long):
    out = {"ids": [], "ids_no_special": [], "decoded": [], "round_trips": []}
    for t in texts:
        ids = tok.encode(t, add_special_tokens=True).ids
        plain = tok.encode(t, add_special_tokens=False).ids
        out["ids"].append(ids)
        out["ids_no_special"].append(plain)
        out["decoded"].append(tok.decode(ids, skip_special_tokens=False))
        out["round_trips"].append(tok.decode(plain, skip_special_tokens=False) == t)
    if long is not None:
        out["long_ids"] = tok.encode(long, add_special_tokens=False).ids
    return out


QWEN2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")
MISTRAL_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}"
    "{% endfor %}")
LLAMA2_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
    "{% set system_message = false %}{% endif %}{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}"
    "{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
    "{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}")


def render_chat(template, messages, add_generation_prompt, bos, eos):
    import jinja2  # what transformers renders chat templates with

    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True,
                             extensions=["jinja2.ext.loopcontrols"])

    def raise_exception(msg):
        raise ValueError(msg)

    env.globals["raise_exception"] = raise_exception
    return env.from_string(template).render(messages=messages, bos_token=bos, eos_token=eos,
                                            add_generation_prompt=add_generation_prompt)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.environ.get(
        "SNAP_MODEL", os.path.expanduser("~/.cache/snapserve/SmolLM2-135M-Instruct.Q4_1.gguf")))
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "fixtures", "tokenizer"))
    ap.add_argument("--only", choices=["spm_gemma"], help="add this one tokenizer to an existing fixture set")
    args = ap.parse_args()
    out = os.path.abspath(args.out)
    if args.only == "spm_gemma":
        with open(os.path.join(out, "texts.json"), encoding="utf-8") as f:
            texts = json.load(f)["texts"]
        gemma = gemma_variant(Tokenizer.from_file(os.path.join(out, "spm", "tokenizer.json")))
        os.makedirs(os.path.join(out, "spm_gemma"), exist_ok=True)
        gemma.save(os.path.join(out, "spm_gemma", "tokenizer.json"))
        with open(os.path.join(out, "expected.json"), encoding="utf-8") as f:
            expected = json.load(f)
        expected["spm_gemma"] = reference(gemma, texts, None)
        with open(os.path.join(out, "expected.json"), "w", encoding="utf-8") as f:
            json.dump(expected, f, ensure_ascii=False, separators=(",", ":"))
        return
    for sub in ("", "bytebpe", "spm", "spm_metaspace"):
        os.makedirs(os.path.join(out, sub), exist_ok=True)

    long = long_text(7, 6500)
    with open(os.path.join(out, "texts.json"), "w", encoding="utf-8") as f:
        json.dump({"texts": TEXTS, "long_text": long}, f, ensure_ascii=False, indent=0)

    expected = {}
    smol, smol_template = smollm2_from_gguf(args.model)
    expected["smollm2_gguf"] = reference(smol, TEXTS, long)
    try:
        from transformers import AutoTokenizer
        hf = AutoTokenizer.from_pretrained(os.path.dirname(args.model),
                                           gguf_file=os.path.basename(args.model))
        diffs = [t for t, ids in zip(TEXTS, expected["smollm2_gguf"]["ids"])
                 if hf.encode(t, add_special_tokens=False) != ids]
        print(f"smollm2: transformers' GGUF tokenizer differs on {len(diffs)} texts: {diffs[:3]}")
    except ImportError:
        print("smollm2: transformers not installed; no cross-check")

    bytebpe = train_bytebpe()
    bytebpe.save(os.path.join(out, "bytebpe", "tokenizer.json"))
    with open(os.path.join(out, "bytebpe", "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>",
                   "chat_template": LLAMA3_TEMPLATE}, f, indent=1)
    expected["bytebpe"] = reference(bytebpe, TEXTS, None)

    spm, spm_meta, spm_vocab = train_spm()
    spm.save(os.path.join(out, "spm", "tokenizer.json"))
    with open(os.path.join(out, "spm", "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "<s>", "eos_token": "</s>", "chat_template": MISTRAL_TEMPLATE},
                  f, indent=1)
    expected["spm"] = reference(spm, TEXTS, None)
    spm_meta.save(os.path.join(out, "spm_metaspace", "tokenizer.json"))
    expected["spm_metaspace"] = reference(spm_meta, TEXTS, None)
    gemma = gemma_variant(spm)
    os.makedirs(os.path.join(out, "spm_gemma"), exist_ok=True)
    gemma.save(os.path.join(out, "spm_gemma", "tokenizer.json"))
    expected["spm_gemma"] = reference(gemma, TEXTS, None)

    gguf_path = os.path.join(out, "spm.gguf")
    write_spm_gguf(gguf_path, spm_vocab, MISTRAL_TEMPLATE)
    try:
        from transformers import AutoTokenizer
        hf_spm = AutoTokenizer.from_pretrained(out, gguf_file="spm.gguf")
        agree = sum(hf_spm.encode(t) == ids for t, ids in zip(TEXTS, expected["spm"]["ids"]))
        print(f"spm.gguf: transformers' GGUF tokenizer agrees with spm/tokenizer.json on "
              f"{agree}/{len(TEXTS)} texts (it uses Metaspace prepend_scheme=first)")
    except ImportError:
        print("spm.gguf: transformers not installed; no cross-check")

    two = [{"role": "user", "content": "Hello! What is 2+2?"},
           {"role": "assistant", "content": "  It is 4.  "}]
    with_system = [{"role": "system", "content": "Be brief."},
                   {"role": "user", "content": "Hi"}]
    chats = []
    for name, template, bos, eos in (("smollm2", smol_template, "<|im_start|>", "<|im_end|>"),
                                     ("qwen2", QWEN2_TEMPLATE, "<|im_start|>", "<|im_end|>"),
                                     ("llama3", LLAMA3_TEMPLATE, "<|begin_of_text|>", "<|end_of_text|>"),
                                     ("mistral", MISTRAL_TEMPLATE, "<s>", "</s>"),
                                     ("llama2", LLAMA2_TEMPLATE, "<s>", "</s>")):
        for messages, gen in ((two, False), (two[:1], True), (with_system, True)):
            if name == "mistral" and messages[0]["role"] == "system":
                continue
            chats.append({"family": name, "template": template, "messages": messages,
                          "add_generation_prompt": gen,
                          "expected": render_chat(template, messages, gen, bos, eos)})
    expected["chat"] = chats

    with open(os.path.join(out, "expected.json"), "w", encoding="utf-8") as f:
        json.dump(expected, f, ensure_ascii=False, separators=(",", ":"))
    for root, _, files in os.walk(out):
        for name in files:
            p = os.path.join(root, name)
            print(f"{os.path.relpath(p, out)}: {os.path.getsize(p)} bytes")


if __name__ == "__main__":
    main()
