#!/usr/bin/env python3
"""test_grafana_dashboard_live: every query of the Grafana dashboard and every recording rule
answers with data from a real service. Starts `snapserve serve` (queue bound 1, one running
sequence, so a burst gets 429s) and a real Prometheus (1 s scrapes and rule evaluations,
deploy/prometheus/rules/snapserve.rules.yml loaded) on loopback ports, drives a short load
(snapkv, streaming and full KV policies, an SSE stream, a 400, a 429 burst), waits until
Prometheus holds it, then runs `promtool query instant -o json` on each panel expr (template
variables substituted) and each recording rule, and requires a non-empty vector with at least
one finite value. A misspelled copy of a panel expr must be reported empty. Exit 77 without
the model or Prometheus.
DEVICE_SNAPSERVE (CUDA builds: the host twin's binary, build/host_twin/snapserve) also starts a
`serve --device cuda` scraped by the same Prometheus and given a few requests, so that the GPU
row's panels (snapserve_device_memory_bytes) must answer too; without it they are skipped, named.
Usage: test_monitoring_live.py SOURCE_DIR SNAPSERVE_BINARY [DEVICE_SNAPSERVE]"""

import concurrent.futures
import json
import math
import os
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

PROMETHEUS = "/usr/bin/prometheus"
# Grafana's variables as "All" and a range that covers the whole run (the test takes < 2 min).
SUBSTITUTIONS = {"$instance": ".*", "${instance}": ".*", "$rank": ".*", "${rank}": ".*",
                 "$__rate_interval": "5m", "$__interval": "15s", "$__range": "5m"}
LONG_TEXT = " ".join(
    f"Paragraph {i}: the archive lists shipments, their weights, their ports of call and the "
    f"clerks who signed for them in the year {1900 + i}." for i in range(12))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(method, url, body=None, timeout=120):
    """(status, body text) of one request; HTTP errors are answers, not exceptions."""
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def completion(base, max_tokens, kv=None, stream=False, prompt=LONG_TEXT):
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": stream}
    if kv:
        body["kv_compression"] = kv
    return http("POST", base + "/v1/completions", body)


# ---------------------------------------------------------------------------------------------
# Processes


class Processes:
    """Children started by this test; all terminated (then killed) by stop_all."""

    def __init__(self):
        self.children = []

    def start(self, argv, log):
        p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        self.children.append(p)
        return p

    def stop_all(self):
        for p in self.children:
            if p.poll() is None:
                p.terminate()
        for p in self.children:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def wait_for(what, fn, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(0.5)
    raise RuntimeError(f"timed out after {timeout} s waiting for {what}")


# ---------------------------------------------------------------------------------------------
# Prometheus queries


def api_query(prom, expr):
    q = urllib.parse.urlencode({"query": expr})
    status, text = http("GET", f"{prom}/api/v1/query?{q}", timeout=10)
    return json.loads(text)["data"]["result"] if status == 200 else []


def promtool_vector(promtool, prom, expr):
    """(ok, message) for one expr: ok when promtool returns a non-empty vector with a finite value."""
    r = subprocess.run([promtool, "query", "instant", "-o", "json", prom, expr],
                       capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        return False, f"promtool rc {r.returncode}: {r.stderr.strip()}"
    result = json.loads(r.stdout)
    if not isinstance(result, list) or not result:
        return False, "empty result"
    values = [float(s["value"][1]) for s in result]
    if not any(math.isfinite(v) for v in values):
        return False, f"{len(values)} series, none finite: {values[:4]}"
    return True, f"{len(values)} series"


def substitute(expr):
    for k, v in SUBSTITUTIONS.items():
        expr = expr.replace(k, v)
    if "$" in expr:
        raise ValueError(f"unsubstituted variable in {expr}")
    return expr


# ---------------------------------------------------------------------------------------------
# Load


def drive_load(base):
    """Requests of every kind a dashboard panel shows; returns {label: status} and fails on surprises."""
    codes = {}
    codes["snapkv"], _ = completion(base, 8, {"policy": "snapkv", "budget": 64, "window": 16})
    codes["streaming"], _ = completion(base, 8, {"policy": "streaming", "budget": 64, "sinks": 4})
    codes["full"], _ = completion(base, 8, {"policy": "full"})
    codes["sse"], sse = completion(base, 8, {"policy": "snapkv", "budget": 64, "window": 16}, stream=True)
    if "data: [DONE]" not in sse:
        raise RuntimeError(f"SSE stream did not end with [DONE]: {sse[-200:]!r}")
    codes["chat"], _ = http("POST", base + "/v1/chat/completions",
                            {"messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 4})
    codes["bad"], _ = http("POST", base + "/v1/completions", {"prompt": "x", "max_tokens": -3})
    codes["models"], _ = http("GET", base + "/v1/models")
    codes["health"], _ = http("GET", base + "/health")

    # Burst: one long request runs (--max-num-seqs 1), one waits (--max-waiting 1), the rest 429.
    with concurrent.futures.ThreadPoolExecutor(max_workers=6) as pool:
        long_run = pool.submit(completion, base, 48, None, False, "Count slowly:")
        time.sleep(1.0)
        burst = [pool.submit(completion, base, 4, None, False, "Hello") for _ in range(5)]
        codes["long"] = long_run.result()[0]
        burst_codes = [f.result()[0] for f in burst]
    codes["burst"] = burst_codes
    expect = {"snapkv": 200, "streaming": 200, "full": 200, "sse": 200, "chat": 200, "bad": 400,
              "models": 200, "health": 200, "long": 200}
    wrong = {k: codes[k] for k, v in expect.items() if codes[k] != v}
    if wrong or 429 not in burst_codes or not set(burst_codes) <= {200, 429}:
        raise RuntimeError(f"unexpected HTTP statuses: {codes}")
    return codes


def metric_value(text, name):
    """The value of an unlabelled series; the constant model_name label is allowed."""
    m = re.search(rf'^{re.escape(name)}(?:\{{model_name="[^"]*"\}})? (\S+)$', text, re.M)
    return float(m.group(1)) if m else None


# ---------------------------------------------------------------------------------------------


def main():
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__)
    src, snapserve = pathlib.Path(sys.argv[1]).resolve(), sys.argv[2]
    device_snapserve = sys.argv[3] if len(sys.argv) == 4 else None
    model = os.environ.get("SNAP_MODEL",
                           os.path.expanduser("~/.cache/snapserve/SmolLM2-135M-Instruct.Q4_1.gguf"))
    promtool = shutil.which("promtool")
    if not os.path.isfile(model) or not os.access(PROMETHEUS, os.X_OK) or promtool is None:
        print(f"skipped: needs the model ({model}), {PROMETHEUS} and promtool")
        return 77
    dashboard = json.loads((src / "deploy/grafana/snapserve-dashboard.json").read_text())
    rules = src / "deploy/prometheus/rules/snapserve.rules.yml"

    procs = Processes()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # ctest's timeout still cleans up
    tmp = tempfile.mkdtemp(prefix="snap-monitoring-")
    try:
        t0 = time.time()
        server_log = open(os.path.join(tmp, "snapserve.log"), "w+")
        procs.start([snapserve, "serve", "--model", model, "--port", "0", "--max-num-seqs", "1",
                     "--max-waiting", "1"], server_log)

        def served(log):  # the server's base URL once its log says it serves, else None
            log.seek(0)
            m = re.search(r"snapserve: serving \S+ on (http://\S+)", log.read())
            return m.group(1) if m else None

        base = wait_for("snapserve to serve", lambda: served(server_log), 60)
        target = base.removeprefix("http://")
        targets = [target]
        device_base = None
        if device_snapserve:
            device_log = open(os.path.join(tmp, "snapserve-device.log"), "w+")
            procs.start([device_snapserve, "serve", "--device", "cuda", "--model", model, "--port", "0",
                         "--kv-cache-mib", "64"], device_log)
            device_base = wait_for("snapserve --device cuda to serve", lambda: served(device_log), 120)
            targets.append(device_base.removeprefix("http://"))

        prom_port = free_port()
        prom = f"http://127.0.0.1:{prom_port}"
        config = os.path.join(tmp, "prometheus.yml")
        with open(config, "w") as f:
            f.write(f"global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                    f"rule_files:\n  - {rules}\n"
                    f"scrape_configs:\n  - job_name: snapserve\n    static_configs:\n"
                    f"      - targets: [{', '.join(repr(t) for t in targets)}]\n")
        procs.start([PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp}/data",
                     f"--web.listen-address=127.0.0.1:{prom_port}"],
                    open(os.path.join(tmp, "prometheus.log"), "w"))
        wait_for("Prometheus to listen", lambda: _port_open(prom_port), 30)

        # A scrape of the idle server first: rates and quantiles need a sample before the load.
        wait_for("Prometheus' first scrape", lambda: api_query(prom, "snapserve_generation_tokens_total"), 60)
        codes = drive_load(base)
        print(f"load done at {time.time() - t0:.1f} s: {codes}")
        if device_base:
            for kv in (None, {"policy": "snapkv", "budget": 64, "window": 8}):
                body = {"prompt": LONG_TEXT, "max_tokens": 8, "temperature": 0}
                if kv:
                    body["kv_compression"] = kv
                status, _ = http("POST", device_base + "/v1/completions", body)
                if status != 200:
                    raise RuntimeError(f"the device server answered {status}")
            wait_for("Prometheus to scrape the device server",
                     lambda: api_query(prom, 'snapserve_device_memory_bytes{kind="kv_pool_peak"}'), 60)

        # Prometheus holds the load once a scrape shows the server's final token count and the 429.
        generated = metric_value(http("GET", base + "/metrics")[1], "snapserve_generation_tokens_total")
        if not generated:
            raise RuntimeError("the server's /metrics shows no generated tokens after the load")

        def scraped():
            g = api_query(prom, f'snapserve_generation_tokens_total{{instance="{target}"}}')
            r = api_query(prom, 'snapserve_http_requests_total{code="429"}')
            return g and r and float(g[0]["value"][1]) >= generated
        wait_for("Prometheus to scrape the load", scraped, 60)

        loaded = json.loads(http("GET", prom + "/api/v1/rules")[1])["data"]["groups"]
        rule_list = [r for g in loaded for r in g["rules"]]
        records = [r for r in rule_list if r["type"] == "recording"]
        # Recording rules write their series a few evaluations after the data lands.
        wait_for("the recording rules' first series",
                 lambda: api_query(prom, "snapserve:ttft_seconds:p99"), 30)
        print(f"Prometheus holds the load at {time.time() - t0:.1f} s")

        failures, checked = [], 0
        for r in rule_list:
            if r.get("health") != "ok":
                failures.append(f"rule {r['name']}: health {r.get('health')}: {r.get('lastError')}")
        if not records or len(rule_list) < 10:
            failures.append(f"Prometheus loaded {len(rule_list)} rules ({len(records)} recording) from {rules}")

        queries = [(f"panel {p['title']!r} {t['refId']}", t["expr"])
                   for p in dashboard["panels"] for t in p.get("targets", [])]
        if not device_base:  # no device server: the GPU row has nothing to show
            skipped = [what for what, expr in queries if "snapserve_device_memory_bytes" in expr]
            queries = [(what, expr) for what, expr in queries if "snapserve_device_memory_bytes" not in expr]
            print(f"skipped (no DEVICE_SNAPSERVE): {', '.join(skipped)}")
        queries += [(f"recording rule {r['name']}", r["query"]) for r in records]
        for what, expr in queries:
            ok, msg = promtool_vector(promtool, prom, substitute(expr))
            checked += 1
            print(f"{'ok  ' if ok else 'FAIL'} {what}: {msg}")
            if not ok:
                failures.append(f"{what}: {msg}\n    {substitute(expr)}")

        # The check must be able to fail: a misspelled metric name is an empty panel.
        misspelled = substitute(queries[0][1]).replace("snapserve_", "snapserve_misspelled_", 1)
        ok, msg = promtool_vector(promtool, prom, misspelled)
        print(f"negative check ({msg}): {misspelled}")
        if ok or msg != "empty result":
            failures.append(f"misspelled expr was not reported empty ({msg}): {misspelled}")

        for f in failures:
            print("FAIL:", f)
        print(f"{checked} queries checked in {time.time() - t0:.1f} s, {len(failures)} failures")
        if failures:
            for log in ("snapserve.log", "prometheus.log"):
                print(f"--- tail of {log}")
                print("".join(open(os.path.join(tmp, log)).readlines()[-15:]))
        return 1 if failures else 0
    finally:
        procs.stop_all()
        shutil.rmtree(tmp, ignore_errors=True)


def _port_open(port):
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


if __name__ == "__main__":
    sys.exit(main())
