#!/usr/bin/env python3
"""test_k8s_dockerfile: static checks of deploy/kubernetes/Dockerfile{,.cuda} (no Docker engine
here, so nothing is built): every FROM is pinned to a versioned tag or a digest, COPY --from names
an earlier stage, the runtime stage runs `snapserve` as a non-root user, and the runtime stage
installs what the binary needs. For the Debian image that last check is computed, not listed:
`ldd SNAPSERVE` gives the libraries, `dpkg -S` their Debian packages; each package of a library
the binary links directly (ELF NEEDED) must be on the runtime apt-get line unless the base image
has it, and every other one must come in as a dependency. Then the checker must reject broken
Dockerfiles made from the real one (a missing runtime package among them).
Usage: test_kubernetes_dockerfile.py SNAPSERVE SOURCE_DIR
"""

import functools
import os
import re
import shlex
import subprocess
import sys
import pathlib

BINARY = pathlib.Path(sys.argv[1]).resolve()
SRC = pathlib.Path(sys.argv[2]).resolve()
K8S = SRC / "deploy" / "kubernetes"
# scripts/setup.sh packages the image builds do without: services only the test suite starts.
TEST_ONLY_PACKAGES = {"prometheus", "slurm-wlm", "munge"}
# Runtime packages that provide a tool rather than a library: mpirun for several ranks in a pod.
RUNTIME_TOOLS = {"openmpi-bin"}


# --- Dockerfile parsing -------------------------------------------------------------

def instructions(text):
    """[(INSTRUCTION, rest)] with comments dropped and backslash continuations joined."""
    out, cur = [], ""
    for line in text.splitlines():
        if not cur and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if cur and line.lstrip().startswith("#"):
            continue  # comment lines inside a continued instruction
        if line.rstrip().endswith("\\"):
            cur += line.rstrip()[:-1] + " "
            continue
        cur += line
        word, _, rest = cur.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
        cur = ""
    if cur:
        word, _, rest = cur.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def stages(text):
    """[{name, image, body: [(INSTR, rest)]}] in order."""
    result = []
    for instr, rest in instructions(text):
        if instr == "FROM":
            words = [w for w in rest.split() if not w.startswith("--platform")]
            name = words[2] if len(words) >= 3 and words[1].upper() == "AS" else str(len(result))
            result.append({"name": name, "image": words[0], "body": []})
        elif result:
            result[-1]["body"].append((instr, rest))
    return result


def pinned(image):
    """A digest, or a tag with a version number in it (not `latest`, not a bare codename)."""
    if "@sha256:" in image:
        return True
    tag = image.rsplit("/", 1)[-1].partition(":")[2]
    return bool(tag) and tag != "latest" and bool(re.search(r"\d", tag))


def apt_packages(stage):
    """Words after `apt-get install` in the stage's RUN lines, options dropped."""
    pkgs = []
    for instr, rest in stage["body"]:
        if instr != "RUN":
            continue
        for cmd in re.split(r"&&|;|\|\|", rest):
            words = shlex.split(cmd, posix=True) if "$(" not in cmd else cmd.split()
            if "apt-get" in words and "install" in words:
                pkgs += [w for w in words[words.index("install") + 1:] if not w.startswith("-")]
    return pkgs


# --- Debian packages on this machine -------------------------------------------------

@functools.cache
def installed():
    """{package: [dependency names]} from dpkg's status (first alternative of each)."""
    out = subprocess.run(["dpkg-query", "-W", "-f=${Package}\t${Essential}\t${Pre-Depends}, ${Depends}\n"],
                         capture_output=True, text=True, check=True).stdout
    deps, essential = {}, set()
    for line in out.splitlines():
        name, ess, rest = line.split("\t")
        if ess == "yes":
            essential.add(name)
        deps[name] = [re.split(r"[\s(:]", d.split("|")[0].strip())[0] for d in rest.split(",") if d.strip()]
    return deps, essential


def closure(roots):
    deps, _ = installed()
    seen, todo = set(), list(roots)
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        todo += deps.get(p, [])
    return seen


@functools.cache
def base_image_packages():
    """A debian:*-slim image: the Essential packages, apt, and what they depend on."""
    _, essential = installed()
    return closure(essential | {"apt"})


@functools.cache
def owner(path):
    """Debian package owning `path` (resolving symlinks), or None."""
    for p in (path, os.path.realpath(path)):
        r = subprocess.run(["dpkg", "-S", p], capture_output=True, text=True)
        if r.returncode == 0:
            return r.stdout.split(":")[0].split(",")[0].strip()
    return None


@functools.cache
def binary_libraries():
    """(needed sonames, {soname: resolved path}) of BINARY."""
    ldd = subprocess.run(["ldd", str(BINARY)], capture_output=True, text=True, check=True).stdout
    libs = {}
    for line in ldd.splitlines():
        m = re.match(r"\s*(\S+) => (/\S+)", line)
        if m:
            libs[m.group(1)] = m.group(2)
    dyn = subprocess.run(["readelf", "-d", str(BINARY)], capture_output=True, text=True, check=True).stdout
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[(\S+)\]", dyn)
    return needed, libs


# --- the checks ----------------------------------------------------------------------

def check_structure(text):
    """Problems with stages, pins, COPY --from and the runtime stage's user/entrypoint."""
    problems = []
    st = stages(text)
    if len(st) < 2:
        return ["not multi-stage (one FROM)"]
    names = []
    for s in st:
        if s["image"] not in names and not pinned(s["image"]):
            problems.append(f"FROM {s['image']} is not pinned (use a versioned tag or @sha256 digest)")
        for instr, rest in s["body"]:
            m = re.search(r"--from=(\S+)", rest)
            if instr == "COPY" and m and m.group(1) not in names:
                problems.append(f"COPY --from={m.group(1)} in stage {s['name']} names no earlier stage (have {names})")
        names.append(s["name"])
    run = st[-1]
    users = [rest for instr, rest in run["body"] if instr == "USER"]
    if not users or users[-1].split(":")[0] in ("0", "root"):
        problems.append("runtime stage does not switch to a non-root USER")
    if ("ENTRYPOINT", '["snapserve"]') not in run["body"]:
        problems.append('runtime stage ENTRYPOINT is not ["snapserve"]')
    if ("CMD", '["serve", "--host", "0.0.0.0", "--port", "8000"]') not in run["body"]:
        problems.append('runtime stage CMD is not ["serve", "--host", "0.0.0.0", "--port", "8000"]')
    if not any(i == "COPY" and "snapserve" in r and "--from=" in r for i, r in run["body"]):
        problems.append("runtime stage does not COPY snapserve from a build stage")
    return problems


def check_build(text, cmake_flags):
    problems = []
    build = stages(text)[0]
    setup = (SRC / "scripts" / "setup.sh").read_text()
    m = re.search(r"pkgs=\((.*?)\)", setup, re.S)
    want = set(m.group(1).split()) - TEST_ONLY_PACKAGES if m else set()
    if not want:
        problems.append("scripts/setup.sh: no pkgs=(...) list found")
    missing = sorted(want - set(apt_packages(build)))
    if missing:
        problems.append(f"build stage does not install scripts/setup.sh packages {missing}")
    runs = " ".join(rest for instr, rest in build["body"] if instr == "RUN")
    for flag in cmake_flags:
        if flag not in runs:
            problems.append(f"build stage cmake lacks {flag}")
    return problems


def check_runtime_debian(text, notes=None):
    """The runtime apt-get line covers every Debian package `ldd` finds for the binary."""
    problems = []
    listed = set(apt_packages(stages(text)[-1]))
    provided = closure(listed) | base_image_packages()
    needed, libs = binary_libraries()
    used = {owner(path) for path in libs.values()}
    for extra in sorted(listed - used - RUNTIME_TOOLS):
        problems.append(f"runtime stage installs {extra}, which provides no library snapserve loads (ldd)")
    for soname, path in sorted(libs.items()):
        pkg = owner(path)
        if pkg is None:
            if "/cuda" in path:
                # This build tree was configured with CUDA (nvcc found); the CPU image is built
                # with -DSNAP_ENABLE_CUDA=OFF and does not link the CUDA runtime or NCCL.
                if notes is not None:
                    notes.append(f"note: {soname} ({path}) is CUDA, not part of the CPU image")
                continue
            problems.append(f"{soname} ({path}) belongs to no Debian package")
        elif soname in needed and pkg not in listed and pkg not in base_image_packages():
            problems.append(f"runtime stage does not install {pkg} (provides {soname}, which snapserve links)")
        elif pkg not in provided:
            problems.append(f"runtime stage lacks {pkg} (provides {soname}), neither installed nor a dependency")
    return problems


def check_runtime_derived(text):
    """Dockerfile.cuda: the build stage writes ldd + dpkg -S packages to a file the runtime installs."""
    st = stages(text)
    produced = None
    for s in st[:-1]:
        for instr, rest in s["body"]:
            out = re.findall(r"(?<![0-9&])>\s*(/\S+)", rest)  # `> FILE`, not `2>/dev/null`
            if instr == "RUN" and "ldd" in rest and "dpkg -S" in rest and out:
                produced = (s["name"], out[-1])
    if produced is None:
        return ["no build stage RUN writes the runtime package list from `ldd` + `dpkg -S`"]
    copied = None
    for instr, rest in st[-1]["body"]:
        words = rest.split()
        if instr == "COPY" and f"--from={produced[0]}" in words and produced[1] in words:
            copied = words[-1]
    if copied is None:
        return [f"runtime stage does not COPY {produced[1]} from stage {produced[0]}"]
    if f"$(cat {copied})" not in " ".join(apt_packages(st[-1])):
        return [f"runtime apt-get install does not install $(cat {copied})"]
    return []


def check_dockerfile(text, kind, notes=None):
    if kind == "debian":
        return (check_structure(text) + check_runtime_debian(text, notes)
                + check_build(text, ["-DCMAKE_BUILD_TYPE=Release", "-DSNAP_ENABLE_CUDA=OFF", "-DSNAP_BUILD_BENCH=OFF"]))
    return check_structure(text) + check_runtime_derived(text) + check_build(text, ["-DCMAKE_BUILD_TYPE=Release"])


# --- main ----------------------------------------------------------------------------

def main():
    failures = 0
    real = {"debian": (K8S / "Dockerfile").read_text(), "cuda": (K8S / "Dockerfile.cuda").read_text()}
    for kind, text in real.items():
        notes = []
        problems = check_dockerfile(text, kind, notes)
        name = "Dockerfile" if kind == "debian" else "Dockerfile.cuda"
        for n in notes:
            print(n)
        for p in problems:
            print(f"FAIL {name}: {p}")
        if not problems:
            print(f"ok   {name}")
        failures += len(problems)
    print(f"runtime libraries checked: {len(binary_libraries()[1])} from ldd {BINARY}")

    # Broken on purpose: each edit of the real Dockerfile must be caught.
    deb = real["debian"]
    broken = [
        ("runtime lacks libopenblas0-openmp", "debian", deb.replace("libopenblas0-openmp ", ""), "libopenblas0-openmp"),
        ("runtime lacks libprometheus-cpp-core1.0", "debian", deb.replace("libprometheus-cpp-core1.0 ", ""), "libprometheus-cpp-core1.0"),
        ("runtime lacks libopenmpi3", "debian", deb.replace("libopenmpi3 ", ""), "libopenmpi3"),
        ("runtime installs an unused library", "debian", deb.replace("libgomp1 ", "libgomp1 libboost-system1.74.0 "), "libboost-system1.74.0"),
        ("unpinned FROM", "debian", deb.replace("FROM debian:12.11-slim", "FROM debian:bookworm-slim"), "not pinned"),
        ("COPY --from an unknown stage", "debian", deb.replace("--from=build", "--from=builder"), "--from=builder"),
        ("root user", "debian", deb.replace("USER 10001:10001", "USER root"), "non-root"),
        ("CUDA left on", "debian", deb.replace("-DSNAP_ENABLE_CUDA=OFF", ""), "SNAP_ENABLE_CUDA=OFF"),
        ("build stage lacks a setup.sh package", "debian", deb.replace("libcli11-dev ", ""), "libcli11-dev"),
        ("cuda runtime list not installed", "cuda", real["cuda"].replace("$(cat /tmp/runtime-packages.txt)", ""), "$(cat"),
    ]
    for name, kind, text, needle in broken:
        if text == real[kind]:
            print(f"FAIL broken case '{name}': the edit did not apply (Dockerfile changed?)")
            failures += 1
            continue
        problems = check_dockerfile(text, kind)
        hit = [p for p in problems if needle in p]
        if hit:
            print(f"ok   broken Dockerfile rejected ({name}): {hit[0]}")
        else:
            print(f"FAIL broken Dockerfile accepted ({name}): no problem mentions {needle!r}; got {problems}")
            failures += 1
    if failures:
        print(f"test_k8s_dockerfile: {failures} failure(s)")
        return 1
    print("test_k8s_dockerfile: passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
