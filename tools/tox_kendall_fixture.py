#!/usr/bin/env python3
"""Kendall tau-b reference cases for tests/eval_scoring: scipy.stats.kendalltau (tau-b, the
default variant) on orderings with and without ties, written to
tests/fixtures/scoring/kendall.json. Run: python3 tools/tox_kendall_fixture.py"""
import json
import os
import random

import scipy
from scipy.stats import kendalltau


def main():
    rng = random.Random(13)
    cases = [
        ("no_ties", [1, 2, 3, 4, 5], [3, 4, 1, 2, 5]),
        ("reversed", [1, 2, 3, 4], [4, 3, 2, 1]),
        ("ties_in_x", [1, 1, 2, 2, 3, 4], [1, 2, 3, 4, 5, 6]),
        ("ties_in_both", [1, 1, 2, 3, 3, 3], [2, 1, 2, 3, 3, 1]),
        ("joint_ties", [0.5, 0.5, 0.2, 0.9], [0.1, 0.1, 0.0, 0.4]),
        ("two", [0.3, 0.7], [0.9, 0.1]),
        ("all_tied_x", [1, 1, 1], [1, 2, 3]),
    ]
    for n in (7, 12, 30):
        for t in range(2):
            x = [rng.randint(0, 4) for _ in range(n)]  # few values: many ties
            y = [rng.randint(0, 5) for _ in range(n)]
            cases.append((f"random_ties_n{n}_{t}", x, y))
        x = [rng.random() for _ in range(n)]
        cases.append((f"random_floats_n{n}", x, [v + rng.gauss(0, 0.3) for v in x]))
    out = {"generator": "tools/tox_kendall_fixture.py", "scipy": scipy.__version__, "cases": []}
    for name, x, y in cases:
        tau = kendalltau(x, y).statistic
        out["cases"].append({"name": name, "x": x, "y": y, "tau_b": None if tau != tau else float(tau)})
    path = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "scoring", "kendall.json")
    with open(path, "w") as f:
        # One case per line: small diffs when a case is added.
        head = {k: v for k, v in out.items() if k != "cases"}
        f.write(json.dumps(head)[:-1] + ', "cases": [\n')
        f.write(",\n".join(json.dumps(c) for c in out["cases"]) + "\n]}\n")
    print(f"wrote {len(cases)} cases to {os.path.normpath(path)}")


if __name__ == "__main__":
    main()
