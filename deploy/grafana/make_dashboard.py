#!/usr/bin/env python3
"""Generates deploy/grafana/snapserve-dashboard.json, the Grafana dashboard of a snapserve
fleet, from the panel table below (stdlib only). Every query filters `instance=~"$instance"`
and, where the metric has a rank label, `rank=~"$rank"`; the datasource is the `${datasource}`
variable. `make_dashboard.py` rewrites the JSON; `--stdout` prints it (the test compares)."""

import argparse
import json
import pathlib
import sys

# ---------------------------------------------------------------------------------------------
# Query helpers

DS = {"type": "prometheus", "uid": "${datasource}"}
RATE = "$__rate_interval"
QUANTILES = (0.5, 0.9, 0.99)
V1_ROUTES = "/v1/completions|/v1/chat/completions"


def sel(metric, rank=False, extra=""):
    """`metric{instance=~"$instance"[, rank=~"$rank"][, extra]}`."""
    labels = ['instance=~"$instance"']
    if rank:
        labels.append('rank=~"$rank"')
    if extra:
        labels.append(extra)
    return metric + "{" + ", ".join(labels) + "}"


def rate(metric, rank=False, extra="", by=None):
    inner = f"rate({sel(metric, rank, extra)}[{RATE}])"
    return f"sum by ({', '.join(by)}) ({inner})" if by else f"sum({inner})"


def quantile(q, histogram, rank=False, by=("le",)):
    return (f"histogram_quantile({q}, sum by ({', '.join(by)}) "
            f"(rate({sel(histogram + '_bucket', rank)}[{RATE}])))")


def target(expr, legend):
    return {"expr": expr, "legendFormat": legend}


def quantile_targets(histogram, rank=False, by=("le",), prefix=""):
    return [target(quantile(q, histogram, rank, by), f"{prefix}p{round(q * 100)}")
            for q in QUANTILES]


# 5xx share of all responses; `or ... * 0` keeps the ratio at 0 (not absent) while no 5xx
# series exists yet, so the panel shows 0 rather than "No data".
HTTP_ALL = f'sum(rate({sel("snapserve_http_requests_total")}[{RATE}]))'
HTTP_5XX = "sum(rate(" + sel("snapserve_http_requests_total", extra='code=~"5.."') + f"[{RATE}]))"
ERROR_RATIO = f"({HTTP_5XX} or {HTTP_ALL} * 0) / {HTTP_ALL}"

REPORT_AGE = f'time() - {sel("snapserve_rank_last_report_timestamp_seconds", rank=True)}'


def device_memory(kind):
    return sel("snapserve_device_memory_bytes", rank=True, extra=f'kind="{kind}"')


DEV_POOL_USED, DEV_POOL_FREE = device_memory("kv_pool_used"), device_memory("kv_pool_free")
DEV_IN_USE, DEV_TOTAL = device_memory("in_use"), device_memory("total")

# ---------------------------------------------------------------------------------------------
# Panel table: (row title, [panels]); a panel is a dict with title, kind, unit, targets,
# description and an optional width (24 columns per line) and thresholds.

def stat(title, unit, expr, description, thresholds=None):
    return {"title": title, "kind": "stat", "unit": unit, "width": 4, "height": 4,
            "targets": [target(expr, title)], "description": description,
            "thresholds": thresholds}


def series(title, unit, targets, description, width=8, thresholds=None):
    return {"title": title, "kind": "timeseries", "unit": unit, "width": width, "height": 8,
            "targets": targets, "description": description, "thresholds": thresholds}


ROWS = [
    ("Service", [
        stat("Request rate", "reqps",
             rate("snapserve_http_requests_total", extra=f'route=~"{V1_ROUTES}"'),
             "Completion and chat requests per second, every status."),
        stat("5xx ratio", "percentunit", ERROR_RATIO,
             "Share of HTTP responses with a 5xx status (429s are counted under rejections).",
             [(None, "green"), (0.01, "yellow"), (0.05, "red")]),
        stat("Running", "short", f'sum({sel("snapserve_num_requests_running")})',
             "Sequences in prefill or decode."),
        stat("Waiting", "short", f'sum({sel("snapserve_num_requests_waiting")})',
             "Requests queued for a slot or KV memory; past --max-waiting new ones get 429.",
             [(None, "green"), (1, "yellow")]),
        stat("KV pool usage", "percentunit", f'max({sel("snapserve_kv_cache_usage_ratio")})',
             "Fraction of KV blocks in use (the fullest instance).",
             [(None, "green"), (0.8, "yellow"), (0.9, "red")]),
        stat("Oldest rank report", "s", f"max({REPORT_AGE})",
             "Seconds since the least recent per-rank report reached rank 0 (reports are sent "
             "once a second; above 30 s a rank is silent).",
             [(None, "green"), (5, "yellow"), (30, "red")]),
    ]),
    ("Requests", [
        series("Request rate by route", "reqps",
               [target(rate("snapserve_http_requests_total", extra='route=~"/v1/.*"', by=["route"]),
                       "{{route}}")],
               "HTTP requests per second on the API routes (scrapes and health checks left out)."),
        series("Error responses by code", "reqps",
               [target(rate("snapserve_http_requests_total", extra='code!~"2.."', by=["code", "route"]),
                       "{{code}} {{route}}")],
               "Non-2xx responses per second: 4xx are bad requests or rejections, 5xx server-side."),
        series("Rejected requests by reason", "reqps",
               [target(rate("snapserve_request_rejected_total", by=["reason"]), "{{reason}}")],
               "429s per second; queue_full means --max-waiting requests were already queued."),
        series("Queue: running and waiting", "short",
               [target(f'sum({sel("snapserve_num_requests_running")})', "running"),
                target(f'sum({sel("snapserve_num_requests_waiting")})', "waiting")],
               "Running sequences against queued requests; a waiting line that keeps rising "
               "means the service is under-provisioned."),
        series("Finished requests by reason", "reqps",
               [target(rate("snapserve_request_success_total", by=["finished_reason"]),
                       "{{finished_reason}}")],
               "Requests finished per second: stop, length, abort (client gone), timeout, error."),
        series("Prefill and decode tokens/s", "short",
               [target(rate("snapserve_prompt_tokens_total"), "prefill (prompt tokens/s)"),
                target(rate("snapserve_generation_tokens_total"), "decode (generated tokens/s)")],
               "Prompt tokens processed and tokens generated per second."),
    ]),
    ("Latency", [
        series("Time to first token", "s", quantile_targets("snapserve_time_to_first_token_seconds"),
               "From arrival to the first token: queue time plus prefill; grows with the prompt."),
        series("Time per output token", "s", quantile_targets("snapserve_time_per_output_token_seconds"),
               "Per request: decode time over (generated tokens - 1)."),
        series("Inter-token latency", "s", quantile_targets("snapserve_inter_token_latency_seconds"),
               "Every gap between consecutive tokens of a request: shows stalls that a "
               "per-request mean hides (a long prefill sharing the step)."),
        series("End-to-end request latency", "s", quantile_targets("snapserve_e2e_request_latency_seconds"),
               "From arrival to the last token."),
        series("Queue time", "s", quantile_targets("snapserve_request_queue_time_seconds"),
               "Time a request waited before admission (slot and KV blocks)."),
        series("Prefill time", "s", quantile_targets("snapserve_request_prefill_time_seconds"),
               "From admission to the end of prefill, compression included."),
    ]),
    ("KV cache", [
        series("KV cache bytes: resident vs full-equivalent", "bytes",
               [target(sel("snapserve_kv_cache_resident_bytes", rank=True),
                       "resident {{instance}} rank {{rank}}"),
                target(sel("snapserve_kv_cache_full_equivalent_bytes", rank=True),
                       "full-equivalent {{instance}} rank {{rank}}")],
               "KV bytes held per rank after compression, against what the same sequences "
               "would hold uncompressed; the gap is what SnapKV saves.", width=12),
        series("KV pool usage", "percentunit",
               [target(sel("snapserve_kv_cache_usage_ratio"), "{{instance}}")],
               "Fraction of the KV block pool in use; admission stalls as it nears 1.",
               width=12, thresholds=[(None, "green"), (0.9, "red")]),
        series("Compression ratio by policy (mean)", "short",
               [target(f'sum by (policy) (rate({sel("snapserve_kv_compression_ratio_sum")}[{RATE}]))'
                       f' / sum by (policy) (rate({sel("snapserve_kv_compression_ratio_count")}[{RATE}]))',
                       "{{policy}}")],
               "Mean per-request full-equivalent over resident KV bytes, by kv_compression "
               "policy (1 = uncompressed)."),
        series("SnapKV selection time", "s", quantile_targets("snapserve_snapkv_selection_seconds"),
               "Time to score and select the kept positions of one sequence."),
        series("Process RSS by rank", "bytes",
               [target(sel("snapserve_process_resident_memory_bytes", rank=True),
                       "{{instance}} rank {{rank}}")],
               "Resident set size of each rank's process: weights, KV pool, buffers."),
    ]),
    ("Engine and tensor parallelism", [
        series("Step latency by phase", "s",
               quantile_targets("snapserve_step_latency_seconds", rank=True, by=("le", "phase"),
                                prefix="{{phase}} ")[0::2],
               "Duration of one engine step (p50 and p99) on the selected ranks."),
        series("Busy fraction by rank", "percentunit",
               [target(rate("snapserve_busy_seconds_total", rank=True, by=["rank"]), "rank {{rank}}")],
               "Share of wall time each rank spends running step plans."),
        series("Rank report age", "s",
               [target(REPORT_AGE, "{{instance}} rank {{rank}}")],
               "Seconds since rank 0 last received each rank's report (sent once a second); "
               "a rising line is a stuck or dead rank.", thresholds=[(None, "green"), (30, "red")]),
        series("Time in collectives by rank and op", "percentunit",
               [target(rate("snapserve_comm_seconds_total", rank=True, by=["rank", "op"]),
                       "rank {{rank}} {{op}}")],
               "Seconds per second inside all-reduce, broadcast and all-gather, waiting for "
               "peers included (a worker's broadcast includes waiting for the next step).",
               width=12),
        series("Collective traffic by rank and op", "Bps",
               [target(rate("snapserve_comm_bytes_total", rank=True, by=["rank", "op"]),
                       "rank {{rank}} {{op}}")],
               "Bytes per second sent by collectives on each rank.", width=12),
    ]),
    ("GPU (serve --device cuda)", [
        series("GPU memory by rank", "bytes",
               [target(sel("snapserve_device_memory_bytes", rank=True,
                           extra='kind=~"weights|kv_pool_used|scratch|in_use"'),
                       "{{instance}} rank {{rank}} {{kind}}")],
               "Each rank's GPU: its weights (its shard under tensor parallelism), the KV blocks in "
               "use, the forward's scratch, and all memory in use on the device (other processes "
               "included)."),
        series("Device KV pool used by rank", "percentunit",
               [target(f"{DEV_POOL_USED} / ignoring(kind) ({DEV_POOL_USED} + ignoring(kind) {DEV_POOL_FREE})",
                       "{{instance}} rank {{rank}}")],
               "Share of each rank's device KV pool (--kv-cache-mib) in use; the ranks of a "
               "tensor-parallel group hold the same blocks.",
               thresholds=[(None, "green"), (0.9, "orange"), (0.98, "red")]),
        series("GPU memory in use of total by rank", "percentunit",
               [target(f"{DEV_IN_USE} / ignoring(kind) {DEV_TOTAL}", "{{instance}} rank {{rank}}")],
               "Memory in use on each rank's GPU over its total (cudaMemGetInfo).",
               thresholds=[(None, "green"), (0.95, "red")]),
        series("Decode rows by where the token was chosen", "short",
               [target(rate("snapserve_decode_rows_total", by=["sampled_on"]), "{{sampled_on}}")],
               "Decode rows per second: device = greedy rows that need nothing else of their logits "
               "(the GPU's argmax; no logits cross to the host), host = logits copied and sampled on "
               "the CPU (temperature > 0, penalties, logit_bias, logprobs, or a step that mixes them)."),
    ]),
]

# ---------------------------------------------------------------------------------------------
# JSON assembly


def threshold_steps(pairs):
    return {"mode": "absolute",
            "steps": [{"color": color, "value": value} for value, color in pairs]}


def panel_json(p, pid, x, y):
    targets = []
    for i, t in enumerate(p["targets"]):
        targets.append({"datasource": DS, "editorMode": "code", "expr": t["expr"],
                        "legendFormat": t["legendFormat"], "range": True,
                        "refId": chr(ord("A") + i)})
    defaults = {"unit": p["unit"]}
    if p["thresholds"]:
        defaults["thresholds"] = threshold_steps(p["thresholds"])
    out = {"id": pid, "type": p["kind"], "title": p["title"], "description": p["description"],
           "datasource": DS, "gridPos": {"h": p["height"], "w": p["width"], "x": x, "y": y},
           "targets": targets}
    if p["kind"] == "stat":
        defaults.setdefault("thresholds", threshold_steps([(None, "green")]))
        out["fieldConfig"] = {"defaults": defaults, "overrides": []}
        out["options"] = {"colorMode": "value", "graphMode": "area", "justifyMode": "auto",
                          "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                          "textMode": "auto"}
    else:
        defaults["custom"] = {"drawStyle": "line", "fillOpacity": 10, "lineWidth": 1,
                              "showPoints": "never", "spanNulls": False}
        if p["thresholds"]:
            defaults["custom"]["thresholdsStyle"] = {"mode": "line"}
        defaults["min"] = 0
        out["fieldConfig"] = {"defaults": defaults, "overrides": []}
        out["options"] = {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                          "tooltip": {"mode": "multi", "sort": "desc"}}
    return out


def variable(name, label, query):
    return {"name": name, "label": label, "type": "query", "datasource": DS,
            "definition": query, "query": {"query": query, "refId": f"{name}-query"},
            "multi": True, "includeAll": True, "allValue": ".*",
            "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
            "refresh": 2, "regex": "", "sort": 3, "hide": 0, "options": []}


def dashboard():
    panels, pid, y = [], 1, 0
    for row_title, row_panels in ROWS:
        panels.append({"id": pid, "type": "row", "title": row_title, "collapsed": False,
                       "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}, "panels": []})
        pid, y, x, line_h = pid + 1, y + 1, 0, 0
        for p in row_panels:
            if x + p["width"] > 24:
                x, y, line_h = 0, y + line_h, 0
            panels.append(panel_json(p, pid, x, y))
            pid, x, line_h = pid + 1, x + p["width"], max(line_h, p["height"])
        y += line_h
    templating = [
        {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
         "current": {}, "hide": 0, "includeAll": False, "multi": False, "options": [],
         "refresh": 1, "regex": ""},
        variable("instance", "Instance", "label_values(snapserve_num_requests_running, instance)"),
        variable("rank", "Rank", 'label_values(snapserve_process_resident_memory_bytes{instance=~"$instance"}, rank)'),
    ]
    return {
        "annotations": {"list": [{"builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                                  "enable": True, "hide": True, "iconColor": "rgba(0, 211, 255, 1)",
                                  "name": "Annotations & Alerts", "type": "dashboard"}]},
        "description": "snapserve: requests, latency, KV cache and SnapKV compression, tensor-parallel ranks",
        "editable": True,
        "graphTooltip": 1,
        "links": [],
        "panels": panels,
        "refresh": "30s",
        "schemaVersion": 39,
        "tags": ["snapserve", "llm", "snapkv"],
        "templating": {"list": templating},
        "time": {"from": "now-1h", "to": "now"},
        "timepicker": {},
        "timezone": "",
        "title": "snapserve",
        "uid": "snapserve",
        "version": 1,
    }


def render():
    return json.dumps(dashboard(), indent=2) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stdout", action="store_true", help="print the JSON instead of writing it")
    args = ap.parse_args()
    text = render()
    if args.stdout:
        sys.stdout.write(text)
    else:
        out = pathlib.Path(__file__).resolve().parent / "snapserve-dashboard.json"
        out.write_text(text)
        print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
