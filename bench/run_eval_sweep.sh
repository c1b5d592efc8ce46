#!/usr/bin/env bash
# The long-context quality sweep quoted in docs/eval.md: single needle (and multi-key at
# 2K) in the Shakespeare haystack, depths 0/50/100 %, seeds 0-2, on the default model (SmolLM2-135M-Instruct Q4_1).
#   bash bench/run_eval_sweep.sh [BUILD_DIR] [OUT_DIR]
#   LENGTHS  prompt lengths of the full/snapkv comparison (default 1024,2048; 4096 took too
#            long on the shared 2-core machine the docs' figures come from)
# Every run is resumable: the same command again skips the cases already recorded. The
# tables and pictures land in OUT_DIR/report (report.md + SVG).
set -euo pipefail
build=${1:-build}
out=${2:-bench/results/eval}
lengths=${LENGTHS:-1024,2048}
mkdir -p "$out"
S="$build/snapserve"
common=(--haystacks shakespeare --depths 0,50,100 --seeds 0-2
        -c 4 --kv-cache-mib 1200 --progress-interval 30)
# 1. full and SnapKV at its defaults (window 32, max pooling kernel 7, mean GQA), budgets 256 and 1024
"$S" eval run "${common[@]}" --tasks niah_single --lengths "$lengths" --policies full,snapkv --budgets 256,1024 --output "$out/policies.jsonl"
# 2. SnapKV pooling kernel 15 at budget 256 (kernel 7 is in run 1)
"$S" eval run "${common[@]}" --tasks niah_single --lengths 1024 --policies snapkv --budgets 256 --kernels 15 --output "$out/kernel15.jsonl"
# 3. StreamingLLM at the budget SnapKV had (256 at 1K; 1024 at 2K, below 1K nothing is dropped)
"$S" eval run "${common[@]}" --tasks niah_single --lengths 1024 --policies streaming --budgets 256 --output "$out/streaming.jsonl"
"$S" eval run "${common[@]}" --tasks niah_single --lengths 2048 --policies streaming --budgets 1024 --output "$out/streaming.jsonl"
# 4. the question unseen by compression (context_only) for SnapKV, same budgets
"$S" eval run "${common[@]}" --tasks niah_single --lengths 1024 --policies snapkv --budgets 256 --placements context_only \
  --output "$out/context_only.jsonl"
"$S" eval run "${common[@]}" --tasks niah_single --lengths 2048 --policies snapkv --budgets 1024 --placements context_only \
  --output "$out/context_only.jsonl"
# 5. multi-key needle (3 distractor keys) at 2K: full against SnapKV 1024
"$S" eval run "${common[@]}" --tasks niah_multikey --lengths 2048 --policies full,snapkv --budgets 1024 \
  --output "$out/multikey.jsonl"
"$S" eval report --title "SmolLM2-135M-Instruct Q4_1: needles in Shakespeare" --output-dir "$out/report" \
  --input "$out/policies.jsonl" --input "$out/kernel15.jsonl" --input "$out/streaming.jsonl" \
  --input "$out/context_only.jsonl" --input "$out/multikey.jsonl"
