#!/usr/bin/env python3
"""Converts the TF-IDF vectorizer and calibrated LinearSVC that the PyPI package
alt-profanity-check ships (profanity_check/data/{vectorizer,model}.joblib) into the JSON our
C++ reads (eval/scoring/profanity.h): vocabulary by column, idf, and per calibration fold the
LinearSVC coef/intercept and the sigmoid a, b. The joblib pickles are read with stand-in
classes for scikit-learn's, so only joblib and numpy are needed (not the exact scikit-learn
each release pins).
  python3 tools/tox_profanity_convert.py SDIST.tar.gz VERSION OUT.json
"""
import hashlib
import io
import json
import os
import sys
import tarfile

import joblib.numpy_pickle as npk
import numpy as np


class _Stub:
    def __init__(self, *a, **k):
        pass

    def __setstate__(self, state):
        if isinstance(state, dict):
            self.__dict__.update(state)
        else:
            self.__dict__["state"] = state


class _Unpickler(npk.NumpyUnpickler):
    def find_class(self, module, name):
        if module.startswith("sklearn") or module.startswith("scipy"):
            return type(name, (_Stub,), {})
        return super().find_class(module, name)


def load(data, name):
    return _Unpickler(name, io.BytesIO(data), ensure_native_byte_order=True).load()


def idf_of(tfidf):
    d = tfidf.__dict__
    if "idf_" in d:
        return np.asarray(d["idf_"], dtype=np.float64)
    diag = d["_idf_diag"].__dict__  # older releases: a scipy sparse diagonal matrix
    return np.asarray(diag["data"], dtype=np.float64).ravel()


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    src, version, out = sys.argv[1:]
    tar = tarfile.open(src)
    files = {}
    for m in tar.getmembers():
        base = os.path.basename(m.name)
        if m.name.endswith("profanity_check/data/" + base) and base in ("vectorizer.joblib", "model.joblib"):
            files[base] = tar.extractfile(m).read()
    if len(files) != 2:
        sys.exit(f"tox_profanity_convert: {src} lacks profanity_check/data/{{vectorizer,model}}.joblib")
    vec = load(files["vectorizer.joblib"], "vectorizer.joblib").__dict__
    model = load(files["model.joblib"], "model.joblib").__dict__
    for key, want in (("lowercase", True), ("ngram_range", (1, 1)), ("analyzer", "word"), ("binary", False),
                      ("sublinear_tf", False), ("norm", "l2"), ("use_idf", True), ("strip_accents", None),
                      ("token_pattern", r"(?u)\b\w\w+\b")):
        if vec.get(key) != want:
            sys.exit(f"tox_profanity_convert: vectorizer {key} = {vec.get(key)!r}, our C++ implements {want!r}")
    vocab = [None] * len(vec["vocabulary_"])
    for w, i in vec["vocabulary_"].items():
        vocab[int(i)] = w
    idf = idf_of(vec["_tfidf"])
    folds = []
    for cc in model["calibrated_classifiers_"]:
        d = cc.__dict__
        est = (d.get("estimator") or d.get("base_estimator")).__dict__
        cal = d["calibrators"][0].__dict__
        folds.append({"coef": np.asarray(est["coef_"], dtype=np.float64).ravel().tolist(),
                      "intercept": float(np.asarray(est["intercept_"]).ravel()[0]),
                      "a": float(cal["a_"]), "b": float(cal["b_"])})
    if model.get("method") != "sigmoid" or list(np.asarray(model["classes_"]).tolist()) != [0, 1]:
        sys.exit("tox_profanity_convert: not a sigmoid-calibrated binary model")
    doc = {"format": "snapprof-tfidf-svc-1", "package": "alt-profanity-check", "package_version": version,
           "sklearn_version": model.get("_sklearn_version"),
           "vectorizer_sha256": hashlib.sha256(files["vectorizer.joblib"]).hexdigest(),
           "model_sha256": hashlib.sha256(files["model.joblib"]).hexdigest(),
           "vocab": vocab, "idf": idf.tolist(), "folds": folds}
    if len(idf) != len(vocab) or any(len(f["coef"]) != len(vocab) for f in folds):
        sys.exit("tox_profanity_convert: vocabulary, idf and coef sizes differ")
    with open(out + ".part", "w") as f:
        json.dump(doc, f, ensure_ascii=False)
    os.replace(out + ".part", out)
    print(f"tox_profanity_convert: {src} ({version}, sklearn {doc['sklearn_version']}, {len(vocab)} words, "
          f"{len(folds)} folds) -> {out}")


if __name__ == "__main__":
    main()
