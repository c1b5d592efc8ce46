#!/usr/bin/env python3
"""Two values of one policy parameter on the same prompts: a paired comparison of eval records.

`snapserve eval run` records of the same prompt (its sha256, placement and system) under
two policies that differ only in PARAM (e.g. pooling avg vs max, window 16 vs 32) form a pair.
Prints, per (task, placement, length, policy without PARAM): the pairs, how many each value
answered correctly, and the discordant pairs (right with one value only); then the total and
an exact two-sided sign test over the discordant pairs (the chance of a split at least this
uneven if neither value were better). With --list, the discordant pairs one per line.
With --reference LABEL (e.g. full), pairs whose prompt also has a record of that policy label
count how often each value answers as the reference does (the same first number in the output:
the needle tasks' answer, right or wrong): fidelity to the full cache, not only accuracy.
Records of several systems (model files, or served models @ URL) are never paired with each
other; a `system` column tells them apart when there are several. A record seen twice (a
rerun of the same case) counts once: the last one read. A file that cannot be read or a line
that is not an eval record ends it with one line naming both.

  python3 tools/eval_pairs.py RUNS.jsonl [RUNS2.jsonl ...] --param pooling --a avg --b max [--list]
                              [--reference full]
"""
import argparse
import collections
import math
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from eval_failures import not_a_record, records, system  # noqa: E402  (the same reading and names)


def sign_test(wins_a, wins_b):
    """Exact two-sided binomial sign test, p = 0.5, over wins_a + wins_b discordant pairs."""
    n = wins_a + wins_b
    if n == 0:
        return 1.0
    k = min(wins_a, wins_b)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def without(label, param):
    """The policy label without its 'param=value' word."""
    return " ".join(w for w in label.split() if not w.startswith(param + "="))


def answer(output):
    """The first number in an output (None if there is none)."""
    m = re.search(r"\d+", output)
    return m.group(0) if m else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("inputs", nargs="+", help="eval run JSONL files")
    ap.add_argument("--param", required=True, help="the policy parameter compared (pooling, window, kernel, gqa, budget)")
    ap.add_argument("--a", required=True, help="its first value (e.g. avg)")
    ap.add_argument("--b", required=True, help="its second value (e.g. max)")
    ap.add_argument("--list", action="store_true", help="also print every discordant pair")
    ap.add_argument("--reference", help="a policy label (e.g. full): count answers equal to its answer")
    a = ap.parse_args()
    # (system, prompt_sha256, placement, policy without param) -> {value: record}
    seen = collections.OrderedDict()
    reference = {}  # (system, prompt_sha256, placement) -> the reference record's output
    for path, lineno, r in records(a.inputs, "eval_pairs.py"):
        try:
            prompt = (system(r), r["prompt_sha256"], r["placement"])
            if a.reference is not None and r["policy_label"] == a.reference:
                reference[prompt] = r["output"]
            value = r["policy"].get(a.param)
            if value is None:
                continue
            key = prompt + (without(r["policy_label"], a.param),)
            item = (r["task"], r["length"], r["depth"], r["seed"], bool(r["correct"]), r["output"])
        except (KeyError, TypeError, AttributeError) as e:
            not_a_record("eval_pairs.py", path, lineno, e)
        seen.setdefault(key, {})[str(value)] = item
    cells = collections.OrderedDict()
    discordant = []
    for (who, sha, placement, label), by_value in seen.items():
        if a.a not in by_value or a.b not in by_value:
            continue
        ra, rb = by_value[a.a], by_value[a.b]
        task, length, depth, seed = ra[:4]
        c = cells.setdefault((who, task, placement, length, label), collections.Counter())
        c["pairs"] += 1
        c["a"] += ra[4]
        c["b"] += rb[4]
        ref = reference.get((who, sha, placement))
        if ref is not None:
            c["ref"] += 1
            c["a_as_ref"] += answer(ra[5]) == answer(ref)
            c["b_as_ref"] += answer(rb[5]) == answer(ref)
        if ra[4] != rb[4]:
            c["a_only" if ra[4] else "b_only"] += 1
            discordant.append((who, task, label, length, placement, depth, seed, a.a if ra[4] else a.b,
                               (ra if not ra[4] else rb)[5]))
    several = len({k[0] for k in cells}) > 1
    sys_col = "| system " if several else ""
    ref_cols = f" with {a.reference} | {a.a} as {a.reference} | {a.b} as {a.reference} |" if a.reference else ""
    print(sys_col + f"| task | placement | length | policy (without {a.param}) | pairs | {a.a} correct | "
          f"{a.b} correct | {a.a} only | {a.b} only |" + ref_cols)
    print("|---" * ((10 if several else 9) + (3 if a.reference else 0)) + "|")
    total = collections.Counter()
    for (who, task, placement, length, label), c in sorted(cells.items()):
        total.update(c)
        print((f"| {who} " if several else "") + f"| {task} | {placement} | {length} | {label} | {c['pairs']} | "
              f"{c['a']} | {c['b']} | {c['a_only']} | {c['b_only']} |" +
              (f" {c['ref']} | {c['a_as_ref']} | {c['b_as_ref']} |" if a.reference else ""))
    print(f"total: {total['pairs']} pairs; {a.param}={a.a} {total['a']}/{total['pairs']}, "
          f"{a.param}={a.b} {total['b']}/{total['pairs']}; right with {a.a} only {total['a_only']}, "
          f"with {a.b} only {total['b_only']}; exact two-sided sign test p = "
          f"{sign_test(total['a_only'], total['b_only']):.2g}")
    if a.reference:
        print(f"answers as {a.reference} (the first number of the output), of {total['ref']} pairs with a "
              f"{a.reference} record: {a.param}={a.a} {total['a_as_ref']}, {a.param}={a.b} {total['b_as_ref']}")
    if a.list:
        for who, task, label, length, placement, depth, seed, winner, loser_out in sorted(discordant):
            print((f"{who}: " if several else "") + f"{task} {label} L{length} {placement} depth {depth} seed {seed}: "
                  f"right with {a.param}={winner} only; the other answered {loser_out.strip()[:80]!r}")


if __name__ == "__main__":
    main()
