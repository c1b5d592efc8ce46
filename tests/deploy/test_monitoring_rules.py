#!/usr/bin/env python3
"""test_prometheus_rules: deploy/prometheus/ as promtool sees it. `promtool check rules` and
`promtool test rules` on the snapserve rules and their unit tests, `promtool check config` on
the example prometheus.yml, and a coverage check: every alert of the rules file has a unit
test where it fires and one where it stays silent. Exit 77 without promtool.
Usage: test_monitoring_rules.py SOURCE_DIR"""

import pathlib
import re
import shutil
import subprocess
import sys


def run(argv, cwd):
    r = subprocess.run(argv, cwd=cwd, capture_output=True, text=True)
    print(f"$ {' '.join(argv)}  (rc {r.returncode})\n{r.stdout}{r.stderr}")
    return r.returncode == 0


def alert_cases(test_text):
    """{alertname: set of 'firing'/'silent'} from the alert_rule_test entries of a test file."""
    cases, current = {}, None
    for line in test_text.splitlines():
        m = re.match(r"\s*alertname:\s*(\S+)", line)
        if m:
            current = m.group(1)
            continue
        m = re.match(r"\s*exp_alerts:\s*(\[\])?\s*$", line)
        if m and current:
            cases.setdefault(current, set()).add("silent" if m.group(1) else "firing")
            current = None
    return cases


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    promtool = shutil.which("promtool")
    if promtool is None:
        print("promtool not found: skipped")
        return 77
    prom = pathlib.Path(sys.argv[1]).resolve() / "deploy" / "prometheus"
    rules, tests = prom / "rules" / "snapserve.rules.yml", prom / "rules" / "snapserve.rules.test.yml"
    ok = run([promtool, "check", "rules", str(rules)], prom)
    ok &= run([promtool, "test", "rules", str(tests)], prom / "rules")
    ok &= run([promtool, "check", "config", str(prom / "prometheus.yml")], prom)

    alerts = re.findall(r"^\s*- alert:\s*(\S+)", rules.read_text(), re.M)
    records = re.findall(r"^\s*- record:\s*(\S+)", rules.read_text(), re.M)
    cases = alert_cases(tests.read_text())
    if not alerts or not records:
        print(f"FAIL: found {len(alerts)} alerts and {len(records)} recording rules in {rules}")
        ok = False
    for name in alerts:
        missing = {"firing", "silent"} - cases.get(name, set())
        if missing:
            print(f"FAIL: alert {name} has no unit test where it is {' or '.join(sorted(missing))}")
            ok = False
    tested_records = [r for r in records if re.search(rf"expr:\s*{re.escape(r)}\b", tests.read_text())]
    if len(tested_records) < 2:
        print(f"FAIL: only {tested_records} recording rules are unit-tested (want at least 2)")
        ok = False
    print(f"{len(alerts)} alerts, each tested firing and silent; "
          f"{len(tested_records)}/{len(records)} recording rules tested")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
