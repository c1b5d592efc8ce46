#!/usr/bin/env bash
# The long-context quality sweep quoted in docs/eval.md, on the default model
# (SmolLM2-135M-Instruct Q4_1), in the Shakespeare haystack, greedy, chat template.
#   bash bench/run_eval_sweep.sh [BUILD_DIR] [OUT_DIR] [STEP ...]
#   STEP   which parts to run (default: all, in this order of priority):
#          policies2k  full, snapkv 1024, streaming 1024 at 2K, depths 0-75 x seeds 0-2
#                      (+ the budget-256 cases of depth 0 recorded before the sweep was cut down)
#          kernel2k    snapkv 1024 with pooling kernels 15 and 31, same prompts as policies2k
#          others2k    pyramidkv, adakv, h2o at budget 1024, 2K, depths 0/50 x seeds 0-2
#          len4k       full, snapkv 1024 (kernels 7 and 31), streaming 1024 at 4K, depths 0/50 x seeds 0-1
#          kernel1k    snapkv 256 with kernels 7 and 31 at 1K, depths 0-75 x seeds 0-1 (a small budget)
#          gqa2k       snapkv 1024 with GQA max aggregation, same prompts as policies2k
#          context2k   snapkv 1024 with the question unseen by compression (context_only), 2K
#          grid1k      SnapKV window 16/32/64 x kernel 7/15 (max), budget 256, 1K, depths 0-75 x seeds 0-1
#          multikey2k  niah_multikey, full vs snapkv 1024, 2K
#          vt2k        variable tracking, full vs snapkv 1024, 2K, seeds 0-5
#          report      eval report over every JSONL in OUT_DIR -> OUT_DIR/report
# Depth 100 % is left out: a needle there lies inside the observation window / the recent
# tokens and every policy found it in every earlier run (1K-2K: docs/eval.md), so it only
# dilutes the differences. The cell sizes are what a shared, loaded 2-core machine
# (~80 s per 2K case with 4 in flight) allowed in the time there was.
# Every run is resumable: the same command again skips the cases already recorded.
set -euo pipefail
build=${1:-build}
out=${2:-bench/results/eval}
shift $(( $# >= 2 ? 2 : $# ))
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(policies2k kernel2k len4k kernel1k others2k gqa2k context2k grid1k multikey2k vt2k report)
mkdir -p "$out"
S="$build/snapserve"
common=(--haystacks shakespeare -c 4 --kv-cache-mib 1200 --progress-interval 60)
d4=(--depths 0,25,50,75)
for step in "${steps[@]}"; do
  echo "== $step ($(date -u +%H:%M:%S), $(uptime | sed 's/.*load/load/'))" >&2
  case "$step" in
    policies2k)
      "$S" eval run "${common[@]}" "${d4[@]}" --seeds 0-2 --tasks niah_single --lengths 2048 \
        --policies full,streaming,snapkv --budgets 1024 --output "$out/policies.jsonl" ;;
    kernel2k)
      "$S" eval run "${common[@]}" "${d4[@]}" --seeds 0-2 --tasks niah_single --lengths 2048 \
        --policies snapkv --budgets 1024 --kernels 15,31 --output "$out/kernel.jsonl" ;;
    gqa2k)
      "$S" eval run "${common[@]}" "${d4[@]}" --seeds 0-2 --tasks niah_single --lengths 2048 \
        --policies snapkv --budgets 1024 --gqa max --output "$out/kernel.jsonl" ;;
    others2k)
      "$S" eval run "${common[@]}" --depths 0,50 --seeds 0-2 --tasks niah_single --lengths 2048 \
        --policies pyramidkv,adakv,h2o --budgets 1024 --output "$out/others.jsonl" ;;
    context2k)
      "$S" eval run "${common[@]}" "${d4[@]}" --seeds 0-2 --tasks niah_single --lengths 2048 \
        --policies snapkv --budgets 1024 --placements context_only --output "$out/context_only.jsonl" ;;
    len4k)
      "$S" eval run "${common[@]}" --depths 0,50 --seeds 0-1 --tasks niah_single --lengths 4096 \
        --policies full,snapkv,streaming --budgets 1024 --kernels 7,31 --output "$out/len4k.jsonl" ;;
    kernel1k)
      "$S" eval run "${common[@]}" "${d4[@]}" --seeds 0-1 --tasks niah_single --lengths 1024 \
        --policies snapkv --budgets 256 --kernels 7,31 --output "$out/kernel1k.jsonl" ;;
    grid1k)
      "$S" eval run "${common[@]}" "${d4[@]}" --seeds 0-1 --tasks niah_single --lengths 1024 \
        --policies snapkv --budgets 256 --windows 16,32,64 --kernels 7,15 --output "$out/grid.jsonl" ;;
    multikey2k)
      "$S" eval run "${common[@]}" "${d4[@]}" --seeds 0-2 --tasks niah_multikey --lengths 2048 \
        --policies full,snapkv --budgets 1024 --output "$out/multikey.jsonl" ;;
    vt2k)
      "$S" eval run "${common[@]}" --seeds 0-5 --tasks vt --lengths 2048 \
        --policies full,snapkv --budgets 1024 --output "$out/vt.jsonl" ;;
    report)
      inputs=()
      for f in "$out"/*.jsonl; do inputs+=(--input "$f"); done
      "$S" eval report --title "SmolLM2-135M-Instruct Q4_1: long-context tasks in Shakespeare" \
        --output-dir "$out/report" "${inputs[@]}" ;;
    *) echo "run_eval_sweep.sh: unknown step '$step'" >&2; exit 2 ;;
  esac
done
