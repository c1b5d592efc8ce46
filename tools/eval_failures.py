#!/usr/bin/env python3
"""How the wrong answers of `snapserve eval run` records are wrong, per policy.

A needle answer is wrong in one of three ways that point to different causes:
  partial    the output holds a number that starts with the expected value's first 3+
             digits but is not the value (e.g. 134435 for 1344350): the needle was found
             and its later digits were lost (with one-token digits, dropped value tokens);
  distractor the output holds another needle's value (multi-key tasks);
  absent     neither: the needle was not retrieved at all.
Prints, per (task, placement, length, policy): n, correct, and the three counts, then the
wrong records' task/policy/depth/seed/expected/output lines with --list. Records of several
systems (model files, or served models @ URL for --url runs, as `snapserve eval report` names
them) are never pooled: a first `system` column (and a `SYSTEM:` prefix on --list lines) then
tells them apart. A file that cannot be read or a line that is not an eval record ends it with
one line naming both.

  python3 tools/eval_failures.py RUNS.jsonl [RUNS2.jsonl ...] [--list]
"""
import argparse
import collections
import json
import re
import sys


def classify(rec):
    if rec["correct"]:
        return "correct"
    numbers = re.findall(r"\d+", rec["output"])
    exp = rec["expected"]
    others = set()
    for n in rec.get("needles", []):
        others.update(re.findall(r"\d{5,}", n))
    others -= set(exp)
    if any(x in others for x in numbers):
        return "distractor"
    for e in exp:
        for x in numbers:
            k = 0
            while k < min(len(x), len(e)) and x[k] == e[k]:
                k += 1
            if k >= 3 and x != e:
                return "partial"
    return "absent"


def system(rec):
    """What answered: the model file (in-process engine) or 'served_model @ URL' (--url)."""
    backend = rec.get("backend", "engine")
    if backend == "engine":
        return rec.get("model_file", "")
    return f"{rec.get('served_model', '')} @ {backend}"


def records(paths, prog):
    """Yields (path, line number, record) for every non-empty line of the files; a file that cannot
    be read or a line that is not JSON ends it with one line naming both."""
    for path in paths:
        try:
            f = open(path)
        except OSError as e:
            sys.exit(f"{prog}: {path}: cannot read it ({e.strerror})")
        with f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as e:
                    sys.exit(f"{prog}: {path}:{lineno}: not JSON ({e.msg})")
                yield path, lineno, rec


def not_a_record(prog, path, lineno, err):
    sys.exit(f"{prog}: {path}:{lineno}: not an eval run record (field {err} missing or of the wrong type)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("inputs", nargs="+", help="eval run JSONL files")
    ap.add_argument("--list", action="store_true", help="also print every wrong record")
    a = ap.parse_args()
    cells = collections.OrderedDict()
    wrong = []
    for path, lineno, r in records(a.inputs, "eval_failures.py"):
        try:
            key = (system(r), r["task"], r["placement"], r["length"], r["policy_label"])
            kind = classify(r)
            item = (key, r["depth"], r["seed"], r["expected"], kind, r["output"])
        except (KeyError, TypeError) as e:
            not_a_record("eval_failures.py", path, lineno, e)
        c = cells.setdefault(key, collections.Counter())
        c["n"] += 1
        c[kind] += 1
        if kind != "correct":
            wrong.append(item)
    several = len({k[0] for k in cells}) > 1
    sys_col = "| system " if several else ""
    print(sys_col + "| task | placement | length | policy | n | correct | partial | distractor | absent |")
    print("|---" * (10 if several else 9) + "|")
    for (who, task, placement, length, label), c in sorted(cells.items()):
        print((f"| {who} " if several else "") + f"| {task} | {placement} | {length} | {label} | {c['n']} | "
              f"{c['correct']} | {c['partial']} | {c['distractor']} | {c['absent']} |")
    if a.list:
        for key, depth, seed, exp, kind, out in sorted(wrong, key=lambda w: (w[0], w[1], w[2])):
            print((f"{key[0]}: " if several else "") + f"{key[1]} {key[4]} L{key[3]} {key[2]} depth {depth} "
                  f"seed {seed}: {kind}, expected {exp}, output {out.strip()[:100]!r}")


if __name__ == "__main__":
    main()
