#!/usr/bin/env python3
"""test_grafana_dashboard_static: deploy/grafana/snapserve-dashboard.json is exactly what
make_dashboard.py generates, and is a dashboard Grafana can load: schemaVersion >= 38, the
datasource/instance/rank variables, unique panel ids, non-overlapping gridPos in 24 columns,
a datasource and targets on every panel, every selector filtered by instance (and by rank where
the metric has a rank label), every metric name one that coordinator/metrics/metrics.cpp
registers. Also the provisioning files. Usage: test_monitoring_dashboard.py SOURCE_DIR"""

import json
import pathlib
import re
import subprocess
import sys

# Metrics with a rank label (metrics.cpp): their selectors must carry rank=~"$rank".
RANK_METRICS = {
    "snapserve_kv_cache_resident_bytes", "snapserve_kv_cache_full_equivalent_bytes",
    "snapserve_process_resident_memory_bytes", "snapserve_comm_bytes_total",
    "snapserve_comm_seconds_total", "snapserve_busy_seconds_total",
    "snapserve_step_latency_seconds", "snapserve_rank_last_report_timestamp_seconds",
    "snapserve_device_memory_bytes",
}
SELECTOR = re.compile(r"\b(snapserve_[a-z0-9_]+)\s*(\{[^}]*\})?")
HISTOGRAM_SUFFIX = re.compile(r"_(bucket|sum|count)$")


def base_name(metric):
    return HISTOGRAM_SUFFIX.sub("", metric)


def selector_errors(expr, known):
    """Problems of one PromQL expression's snapserve selectors; [] when it is fine."""
    errors, found = [], False
    for m in SELECTOR.finditer(expr):
        found = True
        metric, labels = m.group(1), m.group(2) or ""
        if 'instance=~"$instance"' not in labels:
            errors.append(f'{metric}: no instance=~"$instance"')
        if base_name(metric) in RANK_METRICS and 'rank=~"$rank"' not in labels:
            errors.append(f'{metric}: has a rank label but no rank=~"$rank"')
        if known is not None and metric not in known and base_name(metric) not in known:
            errors.append(f"{metric}: not a metric of coordinator/metrics/metrics.cpp")
    if not found:
        errors.append("no snapserve metric")
    return errors


def check_panels(d, known, fail):
    ids, cells = set(), {}
    for p in d["panels"]:
        title = p.get("title", "?")
        if p.get("id") in ids or not isinstance(p.get("id"), int):
            fail(f"panel {title!r}: id {p.get('id')!r} missing or not unique")
        ids.add(p.get("id"))
        g = p.get("gridPos", {})
        if not all(isinstance(g.get(k), int) for k in "hwxy") or g["x"] + g["w"] > 24:
            fail(f"panel {title!r}: bad gridPos {g}")
            continue
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                if (x, y) in cells:
                    fail(f"panel {title!r} overlaps {cells[(x, y)]!r} at x={x} y={y}")
                    break
                cells[(x, y)] = title
        if p.get("type") == "row":
            continue
        if p.get("datasource") != {"type": "prometheus", "uid": "${datasource}"}:
            fail(f"panel {title!r}: datasource {p.get('datasource')!r}")
        targets = p.get("targets", [])
        if not targets:
            fail(f"panel {title!r}: no targets")
        if len({t.get("refId") for t in targets}) != len(targets):
            fail(f"panel {title!r}: refIds not unique")
        for t in targets:
            expr = t.get("expr", "")
            if "$instance" not in expr:
                fail(f"panel {title!r}: expr does not mention $instance: {expr}")
            for e in selector_errors(expr, known):
                fail(f"panel {title!r}: {e}")
    return len(ids)


def check_variables(d, fail):
    tv = {v["name"]: v for v in d.get("templating", {}).get("list", [])}
    ds = tv.get("datasource", {})
    if ds.get("type") != "datasource" or ds.get("query") != "prometheus":
        fail(f"variable datasource: {ds!r}")
    for name, metric in (("instance", "snapserve_num_requests_running"),
                         ("rank", "snapserve_process_resident_memory_bytes")):
        v = tv.get(name, {})
        q = v.get("query", {}).get("query", "") if isinstance(v.get("query"), dict) else v.get("query", "")
        if (v.get("type") != "query" or not v.get("multi") or not v.get("includeAll")
                or not re.fullmatch(rf"label_values\({metric}(\{{[^}}]*\}})?, {name}\)", q)
                or v.get("datasource", {}).get("uid") != "${datasource}"):
            fail(f"variable {name}: {v!r}")


def check_provisioning(grafana, fail):
    ds = (grafana / "provisioning" / "datasources" / "prometheus.yaml").read_text()
    dash = (grafana / "provisioning" / "dashboards" / "snapserve.yaml").read_text()
    try:
        import yaml  # optional: a real parse where PyYAML is installed
        ds_doc, dash_doc = yaml.safe_load(ds), yaml.safe_load(dash)
        if ds_doc.get("apiVersion") != 1 or ds_doc["datasources"][0].get("type") != "prometheus":
            fail(f"datasource provisioning: {ds_doc!r}")
        prov = dash_doc["providers"][0]
        if dash_doc.get("apiVersion") != 1 or prov.get("type") != "file" or not prov["options"].get("path"):
            fail(f"dashboard provisioning: {dash_doc!r}")
    except ImportError:
        for text, needle in ((ds, "type: prometheus"), (dash, "type: file"), (dash, "path:")):
            if needle not in text or "apiVersion: 1" not in text:
                fail(f"provisioning file lacks {needle!r} or apiVersion: 1")


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    src = pathlib.Path(sys.argv[1]).resolve()
    grafana = src / "deploy" / "grafana"
    failures = []
    fail = failures.append

    generated = subprocess.run([sys.executable, str(grafana / "make_dashboard.py"), "--stdout"],
                               capture_output=True, text=True, check=True).stdout
    committed = (grafana / "snapserve-dashboard.json").read_text()
    if generated != committed:
        fail("snapserve-dashboard.json differs from make_dashboard.py's output: "
             "run python3 deploy/grafana/make_dashboard.py")
    d = json.loads(committed)
    if not isinstance(d.get("schemaVersion"), int) or d["schemaVersion"] < 38:
        fail(f"schemaVersion {d.get('schemaVersion')!r} < 38")
    if not d.get("uid") or not d.get("title"):
        fail("dashboard has no uid or title")

    known = set(re.findall(r'"(snapserve_[a-z0-9_]+)"', (src / "coordinator/metrics/metrics.cpp").read_text()))
    num_panels = check_panels(d, known, fail)
    check_variables(d, fail)
    check_provisioning(grafana, fail)

    # The checker itself must catch a wrong selector, or this test cannot fail.
    for bad in ('rate(snapserve_busy_seconds_total{instance=~"$instance"}[5m])',
                'sum(snapserve_num_requests_running)',
                'sum(snapserve_num_requests_runing{instance=~"$instance"})'):
        if not selector_errors(bad, known):
            fail(f"selector check accepted a bad expression: {bad}")

    for f in failures:
        print("FAIL:", f)
    print(f"{num_panels} panels checked, {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
