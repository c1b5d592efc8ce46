#!/usr/bin/env python3
"""Reference scores of alt-profanity-check on the sentences of tools/tox_fixtures.py, from
the package's own Python (profanity_check.predict_prob) under the scikit-learn version each
release pins (1.2.2 -> scikit-learn 1.2.2, 1.5.0 -> 1.5.0), merged into
tests/fixtures/scoring/profanity.json. Run once per version with a Python that has that
scikit-learn (e.g. a venv: pip install scikit-learn==1.5.0 "numpy<2" joblib):
  PY -m pip ...; PY tools/tox_profanity_fixtures.py VERSION UNPACKED_SDIST_DIR
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from tox_fixtures import SENTENCES  # noqa: E402


def main():
    version, src = sys.argv[1:3]
    sys.path.insert(0, src)
    import numpy
    import sklearn
    from profanity_check import predict_prob
    path = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "scoring", "profanity.json")
    doc = json.load(open(path)) if os.path.exists(path) else {"generator": "tools/tox_profanity_fixtures.py",
                                                               "sentences": SENTENCES, "versions": {}}
    if doc["sentences"] != SENTENCES:
        sys.exit("tox_profanity_fixtures: the fixture holds other sentences; delete it and run every version again")
    doc["versions"][version] = {"reference": f"alt-profanity-check {version} profanity_check.predict_prob",
                                "sklearn": sklearn.__version__, "numpy": numpy.__version__,
                                "scores": [float(p) for p in predict_prob(SENTENCES)]}
    with open(path, "w") as f:
        json.dump(doc, f)
        f.write("\n")
    print(f"profanity {version} (sklearn {sklearn.__version__}): {len(SENTENCES)} sentences -> {os.path.normpath(path)}")


if __name__ == "__main__":
    main()
