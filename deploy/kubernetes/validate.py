#!/usr/bin/env python3
"""Offline check of snapserve's Kubernetes manifests; one line per document, exit 1 on any failure.

Each target is a kustomization directory (rendered with `kubectl kustomize`) or a multi-document
YAML file (`-` for stdin); without targets: base/, every overlays/*/ and model-loader.yaml next to
this script.
Built-in kinds are validated by kubernetes-validate in strict mode against Kubernetes 1.32; the
CRDs (LeaderWorkerSet, ServiceMonitor) by our JSON schemas in schemas/, whose pod templates use
kubernetes-validate's strict definitions. A kind that neither covers fails. Then, per target, the
references between documents: Services select a pod template and name one of its ports, the
ServiceMonitor selects a Service with its port, volumes of pod templates name a PVC of the render.
"""

import argparse
import importlib.resources
import json
import pathlib
import signal
import subprocess
import sys

import jsonschema
import kubernetes_validate
import referencing
import yaml

K8S_VERSION = "1.32"
HERE = pathlib.Path(__file__).resolve().parent
# (apiVersion, kind) -> our schema file under schemas/.
OWN_SCHEMAS = {
    ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"): "leaderworkerset-v1.json",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "servicemonitor-v1.json",
}
# Labels the LWS controller adds to the pods of a group (leader: index 0).
LWS_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"


class UsageError(Exception):
    pass


# --- schemas ----------------------------------------------------------------------

def strict_definitions():
    """kubernetes-validate's strict _definitions.json for K8S_VERSION (additionalProperties false)."""
    root = importlib.resources.files("kubernetes_validate") / "kubernetes-json-schema"
    dirs = sorted(d for d in root.iterdir() if d.name.startswith(f"v{K8S_VERSION}.") and d.name.endswith("-local-strict"))
    if not dirs:
        raise UsageError(f"kubernetes-validate {kubernetes_validate.__version__} has no strict schemas for {K8S_VERSION}")
    return json.loads((dirs[-1] / "_definitions.json").read_text())


def own_validators():
    defs = strict_definitions()
    registry = referencing.Registry().with_resource(defs["$id"], referencing.Resource.from_contents(defs))
    out = {}
    for key, name in OWN_SCHEMAS.items():
        schema = json.loads((HERE / "schemas" / name).read_text())
        jsonschema.Draft202012Validator.check_schema(schema)
        out[key] = (name, jsonschema.Draft202012Validator(schema, registry=registry))
    return out


def error_text(err):
    path = ".".join(str(p) for p in err.absolute_path) or "(top)"
    return f"{path}: {err.message}"


def check_document(doc, validators):
    """(checked_by, errors) for one document."""
    if not isinstance(doc, dict) or "kind" not in doc or "apiVersion" not in doc:
        return "-", ["not a Kubernetes object (no apiVersion/kind)"]
    key = (doc["apiVersion"], doc["kind"])
    if key in validators:
        name, validator = validators[key]
        errors = sorted(validator.iter_errors(doc), key=lambda e: list(map(str, e.absolute_path)))
        return f"schemas/{name}", [error_text(e) for e in errors[:5]]
    try:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:
        return f"kubernetes-validate {K8S_VERSION} strict", [error_text(e)]
    except kubernetes_validate.SchemaNotFoundError:
        return "-", [f"no schema for {doc['kind']} ({doc['apiVersion']}): kubernetes-validate does not know it "
                     f"and schemas/ has none"]
    return f"kubernetes-validate {K8S_VERSION} strict", []


# --- references between documents -----------------------------------------------

def pod_templates(doc):
    """(description, labels, pod spec) of each pod template in `doc`, with the labels the pods get."""
    kind, spec = doc.get("kind"), doc.get("spec") or {}
    if kind in ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"):
        t = spec.get("template") or {}
        yield kind, dict((t.get("metadata") or {}).get("labels") or {}), t.get("spec") or {}
    elif kind == "LeaderWorkerSet":
        lwt = spec.get("leaderWorkerTemplate") or {}
        worker = lwt.get("workerTemplate") or {}
        leader = lwt.get("leaderTemplate") or worker
        name = (doc.get("metadata") or {}).get("name", "")
        for role, t, index in (("leader", leader, "0"), ("worker", worker, "1")):
            labels = dict((t.get("metadata") or {}).get("labels") or {})
            labels.update({LWS_NAME_LABEL: name, LWS_INDEX_LABEL: index})
            yield f"LeaderWorkerSet {role}", labels, t.get("spec") or {}


def selects(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def check_references(docs):
    """One-line problems with how the documents of one render refer to each other."""
    problems = []
    templates = [t for d in docs for t in pod_templates(d)]
    services = [d for d in docs if d.get("kind") == "Service"]
    pvcs = {(d.get("metadata") or {}).get("name") for d in docs if d.get("kind") == "PersistentVolumeClaim"}
    for svc in services:
        name = svc["metadata"]["name"]
        selector = (svc.get("spec") or {}).get("selector") or {}
        chosen = [t for t in templates if selects(selector, t[1])]
        if not chosen:
            problems.append(f"Service/{name}: selector {selector} matches no pod template")
        for port in (svc.get("spec") or {}).get("ports") or []:
            target = port.get("targetPort", port.get("port"))
            for what, _, spec in chosen:
                ports = [p for c in spec.get("containers") or [] for p in c.get("ports") or []]
                if not any(target in (p.get("name"), p.get("containerPort")) for p in ports):
                    problems.append(f"Service/{name}: targetPort {target!r} is not a container port of the {what} pods")
    for sm in (d for d in docs if d.get("kind") == "ServiceMonitor"):
        name = sm["metadata"]["name"]
        labels = ((sm.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
        chosen = [s for s in services if selects(labels, (s.get("metadata") or {}).get("labels") or {})]
        if not chosen:
            problems.append(f"ServiceMonitor/{name}: selector {labels} matches no Service")
        for ep in (sm.get("spec") or {}).get("endpoints") or []:
            for s in chosen:
                if ep.get("port") not in [p.get("name") for p in (s.get("spec") or {}).get("ports") or []]:
                    problems.append(f"ServiceMonitor/{name}: Service/{s['metadata']['name']} has no port named {ep.get('port')!r}")
    for what, _, spec in templates:
        for vol in spec.get("volumes") or []:
            claim = (vol.get("persistentVolumeClaim") or {}).get("claimName")
            if claim is not None and claim not in pvcs:
                problems.append(f"{what}: volume {vol.get('name')!r} names PVC {claim!r}, which this render does not define")
    return problems


# --- targets --------------------------------------------------------------------

def render(target):
    """(label, documents) of a kustomization directory or a YAML file."""
    path = pathlib.Path(target)
    try:
        label = "stdin" if target == "-" else str(path.resolve().relative_to(HERE))
    except ValueError:
        label = str(path)
    if target != "-" and path.is_dir():
        try:
            out = subprocess.run(["kubectl", "kustomize", str(path)], capture_output=True, text=True)
        except FileNotFoundError:
            raise UsageError("kubectl not found on PATH (needed for `kubectl kustomize`)")
        if out.returncode != 0:
            last = (out.stderr.strip().splitlines() or ["(no message)"])[-1]
            raise UsageError(f"kubectl kustomize {path} failed: {last}")
        text = out.stdout
    elif target == "-":
        text = sys.stdin.read()
    elif path.is_file():
        text = path.read_text()
    else:
        raise UsageError(f"{target}: neither a kustomization directory nor a YAML file")
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as e:
        raise UsageError(f"{label}: not YAML: {str(e).splitlines()[0]}")
    if not docs:
        raise UsageError(f"{label}: no documents")
    return label, docs


def default_targets():
    overlays = sorted(str(d) for d in (HERE / "overlays").iterdir() if (d / "kustomization.yaml").is_file())
    return [str(HERE / "base")] + overlays + [str(HERE / "model-loader.yaml")]


def main():
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `validate.py | head` ends quietly
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("targets", nargs="*", help="kustomization directories or YAML files (default: base and overlays/*)")
    args = parser.parse_args()
    try:
        validators = own_validators()
        failed = 0
        for target in args.targets or default_targets():
            label, docs = render(target)
            for doc in docs:
                checked_by, errors = check_document(doc, validators)
                name = f"{doc.get('kind', '?')}/{(doc.get('metadata') or {}).get('name', '?')}" if isinstance(doc, dict) else "?"
                if errors:
                    failed += 1
                    for e in errors:
                        print(f"FAIL {label} {name}: {e} [{checked_by}]")
                else:
                    print(f"ok   {label} {name} [{checked_by}]")
            for problem in check_references([d for d in docs if isinstance(d, dict)]):
                failed += 1
                print(f"FAIL {label} {problem} [references]")
    except UsageError as e:
        print(f"validate.py: {e}", file=sys.stderr)
        return 2
    if failed:
        print(f"validate.py: {failed} failure(s)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
