#!/usr/bin/env bash
# The whole test suite: set-up (idempotent), every ctest test of the Release build, then
# the tests of the parsers that take untrusted bytes (model files, tokenizer, step plans,
# API requests, batch lines) again under AddressSanitizer + UBSan.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh

export SNAP_MODEL=${SNAP_MODEL:-${SNAP_CACHE:-$HOME/.cache/snapserve}/SmolLM2-135M-Instruct.Q4_1.gguf}
build=${SNAP_BUILD:-build}
status=0
ctest --test-dir "$build" --output-on-failure -j 2 || status=1

echo "test: parser tests under AddressSanitizer + UBSan" >&2
asan=${build}-asan
cuda_off=(-DSNAP_ENABLE_CUDA=OFF -DSNAP_BUILD_BENCH=OFF)
cmake -S . -B "$asan" -DCMAKE_BUILD_TYPE=Debug -DSNAP_SANITIZE=ON "${cuda_off[@]}" >/dev/null
asan_tests=(test_gguf test_safetensors test_load_errors test_dequant test_config test_step_plan
            test_tokenizer test_openai test_batch_io test_logits_processing)
present=()
for t in "${asan_tests[@]}"; do compgen -G "tests/*/$t.cpp" >/dev/null && present+=("$t"); done
cmake --build "$asan" -j "$(nproc)" --target "${present[@]}"
ASAN_OPTIONS=detect_leaks=1 ctest --test-dir "$asan" --output-on-failure \
  -R "^($(IFS='|'; echo "${present[*]}"))\$" || status=1
exit $status
