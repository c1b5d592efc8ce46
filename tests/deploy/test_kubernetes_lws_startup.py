#!/usr/bin/env python3
"""test_k8s_lws_startup: the lws-tp overlay's start-up path run for real, as local processes. The
command, args and env of the leader and worker containers come from the rendered LeaderWorkerSet;
only the model path, the HTTP host/port and --threads are replaced, and LWS's variables are set as
the controller would (LWS_LEADER_ADDRESS=127.0.0.1, LWS_GROUP_SIZE=size, LWS_WORKER_INDEX=0..N-1),
with SNAP_RENDEZVOUS_PORT moved to a free port. The leader must print its "serving" line, answer
/health with 200 and one greedy /v1/completions exactly like a one-process server, and after SIGTERM
to the leader every rank must exit 0 within 30 s. Exit 77 (skipped) without the model.
OVERLAY (default lws-tp): lws-tp-gpu runs the GPU group (`serve --device cuda --tp 3`), with
SNAPSERVE the host twin's binary (build/host_twin/snapserve: the device path on the CPU; it has no
NCCL, so the exchange is staged over the TCP group as with --tp-comm host).
Usage: test_kubernetes_lws_startup.py SNAPSERVE SOURCE_DIR [OVERLAY]
"""

import json
import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import yaml

BINARY = str(pathlib.Path(sys.argv[1]).resolve())
SRC = pathlib.Path(sys.argv[2]).resolve()
OVERLAY = sys.argv[3] if len(sys.argv) > 3 else "lws-tp"
MODEL = os.environ.get("SNAP_MODEL") or str(pathlib.Path.home() / ".cache/snapserve/SmolLM2-135M-Instruct.Q4_1.gguf")
READY_TIMEOUT_S = 300  # 3 ranks load their shards on 2 shared cores
STOP_TIMEOUT_S = 30
REQUEST = {"prompt": "The three primary colours are", "max_tokens": 24, "temperature": 0}
SERVING = re.compile(r"snapserve: serving \S+ on http://(\S+):(\d+)")
# Launcher variables of an enclosing mpirun/srun would win over LWS_* (comm/bootstrap.cpp order).
FOREIGN_LAUNCHER = re.compile(r"^(OMPI_|PMIX_|PMI_|SLURM_|LWS_)")


def die(msg):
    print(f"test_k8s_lws_startup: {msg}")
    sys.exit(1)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- the containers as the manifest describes them --------------------------------------

def lws_from_manifest():
    out = subprocess.run(["kubectl", "kustomize", str(SRC / "deploy/kubernetes/overlays" / OVERLAY)],
                         capture_output=True, text=True, check=True).stdout
    docs = [d for d in yaml.safe_load_all(out) if d]
    lws = [d for d in docs if d.get("kind") == "LeaderWorkerSet"]
    if len(lws) != 1:
        die(f"the {OVERLAY} overlay renders {len(lws)} LeaderWorkerSets, expected 1")
    return lws[0]


def snapserve_container(template, role):
    cs = [c for c in template["spec"]["containers"] if c["name"] == "snapserve"]
    if not cs:
        die(f"{role} template has no container named snapserve")
    return cs[0]


def set_flag(argv, flag, value):
    if flag in argv:
        argv[argv.index(flag) + 1] = value
    else:
        argv += [flag, value]


def process_spec(container, role, rendezvous_port):
    """(argv, env) for one rank, from the manifest with only model, host, port, threads changed."""
    argv = list(container.get("command") or []) + list(container.get("args") or [])
    if not argv or argv[0] != "snapserve" or argv[1] != "serve":
        die(f"{role} container does not run `snapserve serve`: {argv}")
    argv[0] = BINARY
    set_flag(argv, "--model", MODEL)
    set_flag(argv, "--host", "127.0.0.1")
    set_flag(argv, "--port", "0")
    set_flag(argv, "--threads", "1")  # 3 ranks on 2 cores; the pods use their CPU limit
    env = {}
    for e in container.get("env") or []:
        if "value" in e:
            env[e["name"]] = e["value"]
    if "SNAP_RENDEZVOUS_PORT" not in env:
        die(f"{role} container does not set SNAP_RENDEZVOUS_PORT")
    env["SNAP_RENDEZVOUS_PORT"] = str(rendezvous_port)
    # Kubernetes expands $(VAR) in args from the container's env; do the same.
    argv = [re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), a) for a in argv]
    left = [a for a in argv if re.search(r"\$\(\w+\)", a)]
    if left:
        die(f"{role} args keep unexpanded variables {left}")
    return argv, env


# --- processes ------------------------------------------------------------------------------

class Rank:
    def __init__(self, name, argv, env, logdir):
        self.name = name
        self.log_path = pathlib.Path(logdir) / f"{name}.log"
        self.log = open(self.log_path, "w")
        base = {k: v for k, v in os.environ.items() if not FOREIGN_LAUNCHER.match(k)}
        self.proc = subprocess.Popen(argv, env={**base, **env}, stdout=self.log, stderr=subprocess.STDOUT)

    def text(self):
        self.log.flush()
        return self.log_path.read_text(errors="replace")

    def wait_serving(self, timeout):
        until = time.monotonic() + timeout
        while time.monotonic() < until:
            m = SERVING.search(self.text())
            if m:
                return m.group(1), int(m.group(2))
            if self.proc.poll() is not None:
                die(f"{self.name} exited {self.proc.returncode} before serving:\n{self.text()}")
            time.sleep(0.2)
        die(f"{self.name} did not print its serving line within {timeout} s:\n{self.text()}")

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def http(host, port, path, body=None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(f"http://{host}:{port}{path}", data=data,
                                 headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def completion(host, port):
    status, body = http(host, port, "/v1/completions", REQUEST)
    if status != 200:
        die(f"/v1/completions on {host}:{port}: HTTP {status}: {body}")
    return json.loads(body)["choices"][0]["text"]


def main():
    if not os.path.isfile(MODEL):
        print(f"test_k8s_lws_startup: skipped: model {MODEL} not present (set SNAP_MODEL or run scripts/setup.sh)")
        return 77
    lws = lws_from_manifest()
    lwt = lws["spec"]["leaderWorkerTemplate"]
    size = int(lwt.get("size", 1))
    leader_c = snapserve_container(lwt.get("leaderTemplate") or lwt["workerTemplate"], "leader")
    worker_c = snapserve_container(lwt["workerTemplate"], "worker")
    # The leader must expose the port the workers dial.
    manifest_port = next((e.get("value") for e in leader_c.get("env") or [] if e["name"] == "SNAP_RENDEZVOUS_PORT"), None)
    exposed = [p["containerPort"] for p in leader_c.get("ports") or []]
    if manifest_port is None or int(manifest_port) not in exposed:
        die(f"leader sets SNAP_RENDEZVOUS_PORT={manifest_port} but exposes container ports {exposed}")

    with tempfile.TemporaryDirectory(prefix="snap_lws_") as logdir:
        ranks = []
        try:
            # The answer of one process with the same flags, without tensor parallelism.
            argv, env = process_spec(leader_c, "leader", free_port())
            single_argv = [a for i, a in enumerate(argv) if a != "--tp" and (i == 0 or argv[i - 1] != "--tp")]
            single = Rank("single", single_argv, {}, logdir)
            ranks.append(single)
            host, port = single.wait_serving(READY_TIMEOUT_S)
            expected = completion(host, port)
            single.proc.send_signal(signal.SIGTERM)
            if single.proc.wait(STOP_TIMEOUT_S) != 0:
                die(f"the one-process server exited {single.proc.returncode}:\n{single.text()}")
            print(f"one process: {expected!r}")

            rendezvous = free_port()
            group = []
            for index in range(size):
                c, role = (leader_c, "leader") if index == 0 else (worker_c, "worker")
                argv, env = process_spec(c, role, rendezvous)
                env.update(LWS_LEADER_ADDRESS="127.0.0.1", LWS_GROUP_SIZE=str(size), LWS_WORKER_INDEX=str(index))
                if index == 0:
                    print("leader:", " ".join(argv), f"(SNAP_RENDEZVOUS_PORT={rendezvous})")
                group.append(Rank(f"rank{index}", argv, env, logdir))
            ranks += group
            leader = group[0]
            host, port = leader.wait_serving(READY_TIMEOUT_S)
            status, body = http(host, port, "/health")
            if status != 200:
                die(f"/health: HTTP {status}: {body}")
            got = completion(host, port)
            print(f"LWS group of {size}: {got!r}")
            if got != expected:
                die(f"TP={size} answered {got!r}, one process {expected!r}")

            leader.proc.send_signal(signal.SIGTERM)
            until = time.monotonic() + STOP_TIMEOUT_S
            for r in group:
                try:
                    rc = r.proc.wait(max(0.1, until - time.monotonic()))
                except subprocess.TimeoutExpired:
                    die(f"{r.name} still running {STOP_TIMEOUT_S} s after SIGTERM to the leader:\n{r.text()}")
                if rc != 0:
                    die(f"{r.name} exited {rc}:\n{r.text()}")
            if "snapserve: stopped" not in leader.text():
                die(f"the leader did not report a clean stop:\n{leader.text()}")
            print(f"all {size} ranks exited 0 after SIGTERM to the leader")
        finally:
            for r in ranks:
                r.kill()
    print(f"test_k8s_lws_startup: {OVERLAY}: passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
