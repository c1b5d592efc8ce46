#!/usr/bin/env bash
# The end-to-end figures quoted in closing notes, one command: prefill/decode speed and the
# bandwidth floor (weights auto vs f32), decode ms/token vs prompt length per KV policy,
# resident KV and peak RSS per policy at 8K, and layer-wise vs normal prefill peak RSS.
# Each configuration whose peak RSS matters runs in its own process.
#   bash bench/run_e2e.sh [BUILD_DIR] [OUT_DIR]
set -euo pipefail
build=${1:-build}
out=${2:-bench/results}
mkdir -p "$out"
b="$build/bench/bench_generate"


echo "== engine: weights auto (native Q4_1/Q8_0), 2 threads" | tee "$out/engine.txt"
$b --lengths 512,2048,8000 --decode 32 --threads 2 --json "$out/engine_auto.json" | tee -a "$out/engine.txt"
echo "== engine: weights f32, 2 threads" | tee -a "$out/engine.txt"
$b --lengths 512,2048,8000 --decode 32 --threads 2 --weight-dtype f32 --json "$out/engine_f32.json" | tee -a "$out/engine.txt"

echo "== decode vs prompt length per policy" | tee "$out/policies.txt"
$b --lengths 1024,2048,4096,8000 --decode 32 --threads 2 \
   --policies full,snapkv:256,snapkv:512,snapkv:1024 --json "$out/policies.json" | tee -a "$out/policies.txt"

echo "== per policy at 8000 tokens (own process each: peak RSS)" | tee "$out/memory.txt"
for p in full snapkv:1024 streaming:1024 h2o:1024 pyramidkv:1024 adakv:1024; do
  $b --lengths 8000 --decode 16 --threads 2 --policies "$p" | tail -2 | tee -a "$out/memory.txt"
done
echo "== layer-wise vs normal prefill, snapkv:1024 at 8000 tokens" | tee -a "$out/memory.txt"
$b --lengths 8000 --decode 16 --threads 2 --policies snapkv:1024 | tail -2 | tee -a "$out/memory.txt"
$b --lengths 8000 --decode 16 --threads 2 --policies snapkv:1024 --layerwise | tail -2 | tee -a "$out/memory.txt"
