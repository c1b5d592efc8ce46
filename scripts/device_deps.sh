#!/usr/bin/env bash
# device_deps.sh: run HERE (a Debian 12 machine with a package registry), before a GPU session.
# Downloads the few Debian packages that scripts/device_check.sh needs on the bare GPU machine
# (no registry there) into .device-deps/ (git-ignored, carried by the device `run` tool):
#   googletest           GoogleTest sources (built there with its own compiler: no ABI risk)
#   libopenblas*-openmp  cblas.h + libopenblas.so.0, which the CPU reference kernels link
#   libgfortran5, libquadmath0  OpenBLAS's runtime dependencies
#   nlohmann-json3-dev   header-only JSON, for the model loader (config.json, safetensors)
# Those come to ~13 MB (the run tool carries at most 64 MiB). Idempotent: a present .deb is kept.
# Then scripts/device_bundle.sh: snapserve and the e2e device tests built here for sm_90, with
# their shared libraries (.device-deps/bundle.tar.xz), since the full project cannot be built there.
# Usage: bash scripts/device_deps.sh   (then see scripts/device_check.sh for the run invocation)
set -euo pipefail
cd "$(dirname "$0")/.."
dest=.device-deps
pkgs=(googletest libopenblas0-openmp libopenblas-openmp-dev libgfortran5 libquadmath0 nlohmann-json3-dev)
mkdir -p "$dest"
cd "$dest"
for p in "${pkgs[@]}"; do
  if compgen -G "${p}_*.deb" >/dev/null; then
    echo "device_deps: $p present"
    continue
  fi
  if ! apt-get download "$p" >/dev/null 2>apt.err; then
    # apt's lists may be missing on a fresh machine: refresh them once and retry.
    apt-get update -qq >/dev/null 2>&1 || true
    apt-get download "$p" >/dev/null 2>apt.err || { echo "device_deps: cannot download $p: $(tail -1 apt.err)" >&2; exit 1; }
  fi
  echo "device_deps: downloaded $(ls "${p}"_*.deb)"
done
rm -f apt.err
# The tiny GGUF checkpoints of test_device_generate (tools/make_tiny_checkpoint.py needs the PyPI
# gguf package, which the device machine lacks): written here, carried with the .debs. The
# arguments are the tests' (test_device_generate's Models list; tests/cuda/tiny_gemma3.h).
if [ ! -f tiny-gguf/model.gguf ]; then
  python3 ../tools/make_tiny_checkpoint.py --arch llama --heads 8 --kv-heads 2 --head-dim 32 --seed 11 --out tiny-gguf >/dev/null
  echo "device_deps: wrote tiny-gguf/model.gguf"
fi
if [ ! -f tiny-gemma3/model.gguf ]; then
  python3 ../tools/make_tiny_checkpoint.py --arch gemma3 --layers 4 --heads 4 --kv-heads 2 --head-dim 32 --hidden 64 \
    --sliding-window 48 --sliding-window-pattern 2 --rope-theta 1000000 --seed 21 --out tiny-gemma3 >/dev/null
  echo "device_deps: wrote tiny-gemma3/model.gguf"
fi
# The same two with the GGUF's own Q4_1 / Q4_0 blocks (the device keeps them with --weight-dtype auto).
if [ ! -f tiny-gguf-q4_1/model.gguf ]; then
  python3 ../tools/make_tiny_checkpoint.py --arch llama --heads 8 --kv-heads 2 --head-dim 32 --seed 11 --gguf-type q4_1 \
    --out tiny-gguf-q4_1 >/dev/null
  echo "device_deps: wrote tiny-gguf-q4_1/model.gguf"
fi
if [ ! -f tiny-gemma3-q4_0/model.gguf ]; then
  python3 ../tools/make_tiny_checkpoint.py --arch gemma3 --layers 4 --heads 4 --kv-heads 2 --head-dim 32 --hidden 64 \
    --sliding-window 48 --sliding-window-pattern 2 --rope-theta 1000000 --seed 21 --gguf-type q4_0 \
    --out tiny-gemma3-q4_0 >/dev/null
  echo "device_deps: wrote tiny-gemma3-q4_0/model.gguf"
fi
# GGUFs mixing Q4_K (Q5_K), Q6_K and Q5_0 as llama.cpp's Q4_K_M (Q5_K_M) does, and Q2_K with Q3_K
# (test_device_generate's tiny_q4_k_m, tiny_q5_k_m and tiny_q2_k).
for k in q4_k_m q5_k_m q2_k; do
  if [ ! -f tiny-$k/model.gguf ]; then
    python3 ../tools/make_tiny_checkpoint.py --arch llama --hidden 256 --heads 8 --kv-heads 2 --head-dim 32 \
      --intermediate 608 --tie --scale 0.04 --seed 13 --gguf-type $k --out tiny-$k >/dev/null
    echo "device_deps: wrote tiny-$k/model.gguf"
  fi
done
# snapserve and the e2e device tests, built here for the H200 with their libraries
# (scripts/device_bundle.sh; skip with SNAP_NO_BUNDLE=1).
cd ..
[ "${SNAP_NO_BUNDLE:-0}" = 1 ] || bash scripts/device_bundle.sh
du -sh "$dest" | awk '{print "device_deps: " $1 " in .device-deps/"}'
