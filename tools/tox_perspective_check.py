#!/usr/bin/env python3
"""Drives a Perspective-compatible endpoint with the PyPI `perspective` client (1.0.3), as a
tool written for Google's API would: `PerspectiveAPI(key).analyze_comment(...)` with its URL
pointed at our host. Used by tests/eval_scoring/test_perspective.cpp.
  python3 tools/tox_perspective_check.py BASE_URL TEXTS.json OUT.json
BASE_URL like http://127.0.0.1:8000/v1alpha1 ; TEXTS.json a list of strings. OUT.json gets one
entry per text: {"scores": {ATTR: value}, "span_end": N, "client_token": ..., "scorer": {...}}
or {"http_error": code, "body": {...}}."""
import json
import sys
import urllib.error

import perspective
from perspective import PerspectiveAPI


def main():
    base, texts_path, out_path = sys.argv[1:4]
    client = PerspectiveAPI("test-key")
    client.api_client.url = base.rstrip("/") + "/{endpoint}"
    out = []
    for i, text in enumerate(json.load(open(texts_path))):
        try:
            r = client.analyze_comment(text, requested_attributes={"TOXICITY": {}, "INSULT": {}, "THREAT": {}},
                                       span_annotations=True, languages=["en"], do_not_store=True,
                                       client_token=f"t{i}")
            out.append({"scores": {k: v["summaryScore"]["value"] for k, v in r["attributeScores"].items()},
                        "span_end": r["attributeScores"]["TOXICITY"]["spanScores"][0]["end"],
                        "client_token": r.get("clientToken"), "scorer": r.get("snapserveScorer")})
        except urllib.error.HTTPError as e:
            out.append({"http_error": e.code, "body": json.loads(e.read().decode() or "null")})
    # The client's own convenience call too.
    out.append({"score_call": client.score("Thou lump of foul deformity.", ["TOXICITY"])})
    json.dump({"perspective_version": getattr(perspective, "__version__", "1.0.3"), "results": out}, open(out_path, "w"))


if __name__ == "__main__":
    main()
