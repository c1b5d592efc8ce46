#!/usr/bin/env python3
"""test_k8s_manifests: deploy/kubernetes/validate.py passes on base/ and every overlay, and fails
on manifests broken on purpose. Each broken case is made from a real render (`kubectl kustomize`),
changed in one place, and must make validate.py exit 1 with a FAIL line naming the problem.
Usage: test_kubernetes_manifests.py SOURCE_DIR
"""

import copy
import pathlib
import subprocess
import sys
import tempfile

import yaml

SRC = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
K8S = SRC / "deploy" / "kubernetes"
VALIDATE = [sys.executable, str(K8S / "validate.py")]
failures = []


def fail(msg):
    failures.append(msg)
    print(f"FAILED: {msg}")


def render(overlay):
    out = subprocess.run(["kubectl", "kustomize", str(K8S / "overlays" / overlay)], capture_output=True, text=True, check=True)
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def find(docs, kind):
    return next(d for d in docs if d["kind"] == kind)


def run_validate(docs, tmp, name):
    path = pathlib.Path(tmp) / f"{name}.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    return subprocess.run(VALIDATE + [str(path)], capture_output=True, text=True)


# --- the real manifests ----------------------------------------------------------

overlays = sorted(d.name for d in (K8S / "overlays").iterdir() if (d / "kustomization.yaml").is_file())
for required in ("cpu", "gpu", "lws-tp", "lws-tp-gpu", "fetch-model"):
    if required not in overlays:
        fail(f"overlays/{required} is missing")
real = subprocess.run(VALIDATE, capture_output=True, text=True)
print(real.stdout, end="")
if real.returncode != 0:
    fail(f"validate.py on the real manifests exited {real.returncode}: {real.stderr.strip()}")
lines = real.stdout.splitlines()
for overlay in ["base"] + [f"overlays/{o}" for o in overlays]:
    if not any(line.startswith(f"ok   {overlay} ") for line in lines):
        fail(f"validate.py printed no document of {overlay}")
for expected in ("overlays/lws-tp LeaderWorkerSet/snapserve-tp [schemas/leaderworkerset-v1.json]",
                 "overlays/lws-tp-gpu LeaderWorkerSet/snapserve-tp [schemas/leaderworkerset-v1.json]",
                 "overlays/cpu ServiceMonitor/snapserve [schemas/servicemonitor-v1.json]",
                 "overlays/cpu Deployment/snapserve [kubernetes-validate 1.32 strict]",
                 "model-loader.yaml Pod/snapserve-model-loader [kubernetes-validate 1.32 strict]"):
    if f"ok   {expected}" not in lines:
        fail(f"validate.py did not report: ok   {expected}")

# --- what the manifests promise (the brief of deploy/kubernetes) -------------------

cpu = render("cpu")
gpu = render("gpu")
lws_docs = render("lws-tp")
lws_gpu_docs = render("lws-tp-gpu")
dep = find(cpu, "Deployment")
c = dep["spec"]["template"]["spec"]["containers"][0]
if c["command"] + c["args"][:5] != ["snapserve", "serve", "--host", "0.0.0.0", "--port", "8000"]:
    fail(f"cpu Deployment does not run `snapserve serve --host 0.0.0.0 --port 8000`: {c['command'] + c['args']}")
for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
    if (c.get(probe) or {}).get("httpGet", {}).get("path") != "/health":
        fail(f"cpu Deployment: {probe} is not GET /health")
vols = {v["name"]: v for v in dep["spec"]["template"]["spec"]["volumes"]}
mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
if vols.get(mounts.get("/dev/shm"), {}).get("emptyDir", {}).get("medium") != "Memory":
    fail("cpu Deployment: /dev/shm is not a memory emptyDir")
if vols.get(mounts.get("/models"), {}).get("persistentVolumeClaim", {}).get("claimName") != "snapserve-models":
    fail("cpu Deployment: /models is not the snapserve-models PVC")
gc = find(gpu, "Deployment")["spec"]["template"]["spec"]["containers"][0]
if str(gc["resources"]["limits"].get("nvidia.com/gpu")) != "1" or str(gc["resources"]["requests"].get("nvidia.com/gpu")) != "1":
    fail("gpu Deployment does not request and limit nvidia.com/gpu: 1")
if gc["args"][:3] != ["serve", "--device", "cuda"] or not gc["image"].endswith(":cuda"):
    fail(f"gpu Deployment does not run `serve --device cuda` on the cuda image: {gc['image']} {gc['args']}")
lws = find(lws_docs, "LeaderWorkerSet")
lwt = lws["spec"]["leaderWorkerTemplate"]
if lwt.get("restartPolicy") != "RecreateGroupOnPodRestart":
    fail(f"LeaderWorkerSet restartPolicy is {lwt.get('restartPolicy')!r}")
for role in ("leaderTemplate", "workerTemplate"):
    args = lwt[role]["spec"]["containers"][0]["args"]
    if args[args.index("--tp") + 1] != str(lwt["size"]):
        fail(f"LeaderWorkerSet {role}: --tp {args[args.index('--tp') + 1]} but size {lwt['size']}")
worker = lwt["workerTemplate"]["spec"]["containers"][0]
if any(p in worker for p in ("readinessProbe", "livenessProbe", "startupProbe")):
    fail("LeaderWorkerSet workers have probes (they serve no HTTP)")
lwt_gpu = find(lws_gpu_docs, "LeaderWorkerSet")["spec"]["leaderWorkerTemplate"]
for role in ("leaderTemplate", "workerTemplate"):
    pod = lwt_gpu[role]["spec"]
    gcont = pod["containers"][0]
    args = gcont["args"]
    if args[:3] != ["serve", "--device", "cuda"] or args[args.index("--tp") + 1] != str(lwt_gpu["size"]):
        fail(f"lws-tp-gpu {role}: not `serve --device cuda --tp {lwt_gpu['size']}`: {args}")
    if not gcont["image"].endswith(":cuda"):
        fail(f"lws-tp-gpu {role}: image {gcont['image']} is not the cuda image")
    for kind in ("requests", "limits"):
        if str(gcont["resources"][kind].get("nvidia.com/gpu")) != "1":
            fail(f"lws-tp-gpu {role}: {kind} nvidia.com/gpu is not 1")
    if pod.get("nodeSelector", {}).get("nvidia.com/gpu.present") != "true":
        fail(f"lws-tp-gpu {role}: not scheduled onto GPU nodes")
leader_ports = [p["containerPort"] for p in lwt_gpu["leaderTemplate"]["spec"]["containers"][0]["ports"]]
if 29518 not in leader_ports:
    fail(f"lws-tp-gpu leader does not expose the NCCL id port 29518 (rendezvous + 1): {leader_ports}")
svc = find(lws_docs, "Service")
if svc["spec"]["selector"].get("leaderworkerset.sigs.k8s.io/worker-index") != "0":
    fail("lws-tp Service does not select the leader (worker-index 0) only")

# --- broken on purpose: each must fail ----------------------------------------------


def container(docs):
    return find(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]


def lwt_of(docs):
    return find(docs, "LeaderWorkerSet")["spec"]["leaderWorkerTemplate"]


def broken_cases():
    """(name, base render, mutation, text the FAIL line must contain)."""
    yield "unknown field in a container", cpu, lambda d: container(d).update(imagePullPolcy="Always"), "imagePullPolcy"
    yield "wrong type (replicas a string)", cpu, lambda d: find(d, "Deployment")["spec"].update(replicas="one"), "replicas"
    yield "wrong type (containerPort a string)", gpu, lambda d: container(d)["ports"][0].update(containerPort="http"), "containerPort"
    yield ("unknown field in the LWS leaderTemplate's pod spec", lws_docs,
           lambda d: lwt_of(d)["leaderTemplate"]["spec"].update(hostNetwrk=True), "hostNetwrk")
    yield ("unknown field in an LWS worker container", lws_docs,
           lambda d: lwt_of(d)["workerTemplate"]["spec"]["containers"][0].update(commands=["x"]), "commands")
    yield "bad LWS restartPolicy", lws_docs, lambda d: lwt_of(d).update(restartPolicy="RecreateGroupOnRestart"), "restartPolicy"
    yield "missing LWS workerTemplate", lws_docs, lambda d: lwt_of(d).pop("workerTemplate"), "workerTemplate"
    yield "unknown field in the LWS spec", lws_docs, lambda d: find(d, "LeaderWorkerSet")["spec"].update(size=3), "size"
    yield ("unknown field in a ServiceMonitor endpoint", cpu,
           lambda d: find(d, "ServiceMonitor")["spec"]["endpoints"][0].update(metricsPath="/metrics"), "metricsPath")
    yield "a kind nobody can check", cpu, lambda d: d.append({"apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor",
                                                             "metadata": {"name": "x"}, "spec": {}}), "no schema for PodMonitor"
    yield ("Service port that no container has", cpu,
           lambda d: find(d, "Service")["spec"]["ports"][0].update(targetPort="metrics"), "targetPort 'metrics'")
    yield ("Service selecting no pod", lws_docs,
           lambda d: find(d, "Service")["spec"]["selector"].update({"leaderworkerset.sigs.k8s.io/worker-index": "1",
                                                                    "app.kubernetes.io/component": "server"}),
           "matches no pod template")
    yield ("ServiceMonitor on a port the Service lacks", cpu,
           lambda d: find(d, "ServiceMonitor")["spec"]["endpoints"][0].update(port="metrics"), "no port named 'metrics'")
    yield ("PVC missing from the render", cpu,
           lambda d: d.remove(find(d, "PersistentVolumeClaim")), "PVC 'snapserve-models'")


with tempfile.TemporaryDirectory() as tmp:
    # The unchanged renders, through the same file path, pass: the failures below are the edits'.
    for name, docs in (("cpu", cpu), ("gpu", gpu), ("lws-tp", lws_docs), ("lws-tp-gpu", lws_gpu_docs)):
        r = run_validate(docs, tmp, f"unchanged-{name}")
        if r.returncode != 0:
            fail(f"unchanged {name} render failed as a file:\n{r.stdout}{r.stderr}")
    for i, (name, docs, mutate, needle) in enumerate(broken_cases()):
        bad = copy.deepcopy(docs)
        mutate(bad)
        r = run_validate(bad, tmp, f"broken-{i}")
        fails = [line for line in r.stdout.splitlines() if line.startswith("FAIL")]
        if r.returncode != 1:
            fail(f"broken manifest ({name}): validate.py exited {r.returncode}, expected 1\n{r.stdout}{r.stderr}")
        elif not any(needle in line for line in fails):
            fail(f"broken manifest ({name}): no FAIL line mentions {needle!r}\n{r.stdout}")
        else:
            print(f"ok: broken manifest rejected ({name}): {next(x for x in fails if needle in x)}")

if failures:
    print(f"test_k8s_manifests: {len(failures)} failure(s)")
    sys.exit(1)
print("test_k8s_manifests: passed")
