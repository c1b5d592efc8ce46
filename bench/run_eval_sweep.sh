#!/usr/bin/env bash
# The long-context quality sweep quoted in docs/eval.md, on the default model
# (SmolLM2-135M-Instruct Q4_1), in the Shakespeare haystack, greedy, chat template.
#   bash bench/run_eval_sweep.sh [BUILD_DIR] [OUT_DIR] [STEP ...]
#   Steps before the seventh sweep ran when max pooling was the default and name no pooling;
#   they now run with avg pooling (the default since the seventh sweep). To repeat one as it
#   ran, add --poolings max to its eval run lines; their records say pooling=max.
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
#        Third sweep (docs/eval.md "Third sweep"; OUT_DIR bench/results/eval13, which also holds
#        the second sweep's kernel-31 / full / streaming / h2o records of seeds 0-1 for the
#        same keys), the default kernel 31, niah_single unless said, listed in the order run;
#        the cells are as small as the load (~1 case a minute at 2K) forced:
#          p2k3        2K, seed 0, depths 0-100: full; snapkv, streaming, pyramidkv, adakv, h2o at 1024
#          context2k3  snapkv 1024, question unseen by compression (context_only), 2K, seed 0, depths 0-100
#          multikey2k3 niah_multikey at 2K, seed 0, depths 25/75: full, snapkv 1024, streaming 1024
#          dtype2k3    --kv-dtype f16 and q8_0: full and snapkv 1024 at 2K, seed 0, depths 25/75
#          len8k3      8K, depth 25, seed 0: full, snapkv 1024, streaming 1024 (3 in flight)
#          grid1k3     SnapKV one factor at a time against W 32 / max / mean: window 16 and 64,
#                      avg pooling, GQA max; budget 256, 1K, seed 0, depths 0-75
#          vt2k3       variable tracking at 2K, seeds 0-1: full, snapkv 1024, streaming 1024
#          p4k3        4K, seed 0, depths 25/75/100: full, snapkv 1024, streaming 1024
#          noise2k3    the noise haystack at 2K, depth 50, seed 0: full, snapkv 1024, streaming 1024
#          p2k3b       2K, seed 0, depths 0-100: snapkv 128/256/512, then budget 256 for streaming,
#                      pyramidkv, adakv, h2o (snapkv 2048 at 2K would be full: not run)
#          p2k3s1      p2k3 and context2k3 again with seed 1 (2 seeds per depth)
#          multikey2k3b niah_multikey at 2K, depths 0/50/100 seed 0 and 25/75 seed 1: full, snapkv 1024, streaming 1024
#          grid1k3full the whole window 16/32/64 x pooling max/avg x GQA mean/max grid of grid1k3
#          report3     eval report over every JSONL in OUT_DIR -> OUT_DIR/report
#        Fourth sweep (docs/eval.md "Fourth sweep"; OUT_DIR bench/results/eval14, which starts as
#        a copy of eval13's JSONL files so that cases measured there are skipped), ONE engine
#        thread and one request in flight (-c 1: the records' seconds are one case's own time),
#        run under `nice -n 5`:
#          p4k4        4K, seed 0, depths 0-100: snapkv 128/256/512/2048; then full and every
#                      policy at 1024 (full/snapkv/streaming 1024 are already in eval13)
#          tasks2k4    2K: niah_multivalue (depths 25/75, seeds 0-1), cwe (seeds 0-2), vt (seeds 2-3):
#                      full, snapkv 1024, streaming 1024
#          len8k4      8K, seed 0, depths 25/75: full, snapkv 256/1024, streaming, pyramidkv, adakv 1024
#          gemma4      Gemma 3 270M (plain prompts, --no-chat), 4K and 8K, depths 25/75, seed 0:
#                      full, snapkv 1024, streaming 1024 -> OUT_DIR/gemma/gemma.jsonl
#          context4k4  snapkv 1024 context_only at 4K, seed 0, depths 0-100 (p4k's prompts)
#          gemma16k4   Gemma 3 at 16K, depth 25, seed 0: full, snapkv 1024, streaming 1024
#          p4k4s1      p4k4's cells with seed 1
#          report4     eval report over OUT_DIR/*.jsonl but grid1k/dtype -> OUT_DIR/report, and over
#                      OUT_DIR/gemma/*.jsonl -> OUT_DIR/gemma/report (the report does not split by model)
#        Fifth sweep (docs/eval.md "Fifth sweep"; OUT_DIR bench/results/eval15, a fresh folder: every
#        cell is measured with this binary), ONE engine thread and one request in flight, run under
#        `OMP_NUM_THREADS=1 nice -n 5` on the quiet 2-core Zen 5 machine; larger cells on what decides
#        the goal. niah_single at depths 0-75 unless said; each step loops over seeds outermost (and
#        lengths inside), so a step cut short leaves whole seeds, every depth and policy alike:
#          goal5       2K, 4K, 8K, seeds 0-4: full, snapkv 1024, streaming 1024 (20 prompts per cell)
#          mk5         niah_multikey at 2K, 4K, 8K, seeds 0-2: full, snapkv 1024, streaming 1024
#          budget5     4K, seeds 0-2 (goal5's prompts): snapkv 128/256/512/2048, pyramidkv/adakv/h2o
#                      1024, streaming 256
#          context5    snapkv 1024 context_only at 2K and 4K, seeds 0-4 (goal5's prompts)
#          grid5       4K, budget 256, seeds 0-1, one factor at a time against the default (W 32,
#                      max pooling, kernel 31, mean GQA; its cells are budget5's): window 16 and 64,
#                      kernel 7, 15 and 63, avg pooling, GQA max (seeds 0-1 only: the 4-hour budget)
#          grid5b      the same at budget 512
#          gemma5      Gemma 3 270M (--no-chat) at 16K and 32K, depths 25/75, seeds 0-1: full,
#                      snapkv 1024, streaming 1024 -> OUT_DIR/gemma/gemma5.jsonl
#          gemma5b     Gemma 3 at 4K and 8K, depths 25/75, seeds 0-2, the same policies and file
#          report5     eval report over OUT_DIR/*.jsonl but grid5 -> OUT_DIR/report; grid5 + budget5 ->
#                      OUT_DIR/grid/report; OUT_DIR/gemma/*.jsonl but grid6 -> OUT_DIR/gemma/report;
#                      OUT_DIR/gemma/grid6.jsonl -> OUT_DIR/gemma/grid/report
#        Sixth sweep: Gemma 3 270M beyond SmolLM2's context (OUT_DIR bench/results/eval15 as well,
#        after gemma5/gemma5b; one thread, one case at a time, --no-chat), niah_single unless said:
#          gemma6      16K, depths 25/75, seeds 0-1: snapkv 256/512/2048, pyramidkv/adakv/h2o 1024,
#                      snapkv 1024 context_only -> OUT_DIR/gemma/gemma6.jsonl
#          gemma6mk    niah_multikey at 8K and 16K, depths 25/75, seeds 0-1: full, snapkv 1024,
#                      streaming 1024 -> OUT_DIR/gemma/gemma6.jsonl
#          gemma6grid  16K, budget 256, depths 25/75, seeds 0-1, one factor at a time against the
#                      default: window 16 and 64, kernel 7, 15 and 63, avg pooling -> OUT_DIR/gemma/grid6.jsonl
#        Seventh sweep: average vs max pooling on the prompts of earlier max-pooling cells, and Gemma 3
#        with more seeds (OUT_DIR bench/results/eval15 as well; one thread per process, two at a time):
#          pool7       niah_single at 8K, depths 0-75, seeds 0-4 (goal5's prompts): snapkv 1024 with
#                      avg pooling -> OUT_DIR/pool7.jsonl
#          pool7mk     niah_multikey at 4K and 8K, seeds 0-2 (mk5's prompts): snapkv 1024 with avg
#                      pooling -> OUT_DIR/pool7mk.jsonl
#          pool7g      Gemma 3 at 16K, budget 256, depths 25/75: pyramidkv and adakv with avg and max
#                      pooling, seeds 0-1 -> OUT_DIR/gemma/pool7g.jsonl
#          pool7g2     Gemma 3 at 16K, budget 256, depths 25/75: snapkv with avg and max pooling,
#                      seeds 2-3 (grid6's cell had seeds 0-1) -> OUT_DIR/gemma/pool7g2.jsonl
#          pool7p      SmolLM2 at 4K, depths 0-75, seeds 0-2 (budget5's prompts): pyramidkv and adakv
#                      1024 with avg pooling -> OUT_DIR/pool7p.jsonl
#          pool7gmk    Gemma 3 multi-key at 8K and 16K, depths 25/75, seeds 0-1 (gemma6mk's prompts):
#                      snapkv 1024 with avg pooling -> OUT_DIR/gemma/pool7gmk.jsonl
#          gemma7b     Gemma 3 at 4K and 8K, depths 25/75 (gemma5b's cells at the new default): seeds
#                      1-2 full, snapkv 1024, streaming 1024; seed 0 snapkv 1024 (sweep 4 has its
#                      max-pooling twin) -> OUT_DIR/gemma/gemma7b.jsonl
#          gemma7l     Gemma 3 at 32K, depths 25/75: seed 1 full, snapkv 1024 avg and max, streaming
#                      1024 (gemma5's missing seed); seed 0 snapkv 1024 avg -> OUT_DIR/gemma/gemma7l.jsonl
#          gemma7      Gemma 3 at 16K, depths 25/75, seeds 2-3: full, snapkv 1024, streaming 1024
#                      -> OUT_DIR/gemma/gemma7.jsonl
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
d5=(--depths 0,25,50,75,100)
one=(--haystacks shakespeare -c 1 --threads 1 --kv-cache-mib 1200 --progress-interval 60)
gemma=${SNAP_GEMMA_MODEL:-$HOME/.cache/snapserve/gemma-3-270m-q4_k_m.gguf}
# Gemma 3 runs: plain prompts (the 270M file is the pretrained model), one thread, one case at a time.
gem=(--model "$gemma" --no-chat --haystacks shakespeare -c 1 --threads 1 --kv-cache-mib 3000 --progress-interval 60)
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
    p2k3)
      "$S" eval run "${common[@]}" "${d5[@]}" --seeds 0 --tasks niah_single --lengths 2048 \
        --policies full,snapkv,streaming,pyramidkv,adakv,h2o --budgets 1024 --output "$out/p2k.jsonl" ;;
    p2k3b)
      "$S" eval run "${common[@]}" "${d5[@]}" --seeds 0 --tasks niah_single --lengths 2048 \
        --policies snapkv --budgets 128,256,512 --output "$out/p2k.jsonl"
      "$S" eval run "${common[@]}" "${d5[@]}" --seeds 0 --tasks niah_single --lengths 2048 \
        --policies streaming,pyramidkv,adakv,h2o --budgets 256 --output "$out/p2k.jsonl" ;;
    context2k3)
      "$S" eval run "${common[@]}" "${d5[@]}" --seeds 0 --tasks niah_single --lengths 2048 \
        --policies snapkv --budgets 1024 --placements context_only --output "$out/context_only.jsonl" ;;
    multikey2k3)
      "$S" eval run "${common[@]}" --depths 25,75 --seeds 0 --tasks niah_multikey --lengths 2048 \
        --policies full,snapkv,streaming --budgets 1024 --output "$out/multikey.jsonl" ;;
    vt2k3)
      "$S" eval run "${common[@]}" --seeds 0-1 --tasks vt --lengths 2048 \
        --policies full,snapkv,streaming --budgets 1024 --output "$out/vt.jsonl" ;;
    p4k3)
      "$S" eval run "${common[@]}" --depths 25,75,100 --seeds 0 --tasks niah_single --lengths 4096 \
        --policies full,snapkv,streaming --budgets 1024 --output "$out/p4k.jsonl" ;;
    len8k3)
      "$S" eval run --haystacks shakespeare -c 3 --kv-cache-mib 2000 --progress-interval 60 \
        --depths 25 --seeds 0 --tasks niah_single --lengths 8192 \
        --policies full,snapkv,streaming --budgets 1024 --output "$out/len8k.jsonl" ;;
    dtype2k3)
      for dt in f16 q8_0; do
        "$S" eval run "${common[@]}" --depths 25,75 --seeds 0 --tasks niah_single --lengths 2048 \
          --policies full,snapkv --budgets 1024 --kv-dtype "$dt" --output "$out/dtype.jsonl"
      done ;;
    grid1k3)
      for v in "--windows 16,64" "--poolings avg" "--gqa max"; do
        # shellcheck disable=SC2086
        "$S" eval run "${common[@]}" "${d4[@]}" --seeds 0 --tasks niah_single --lengths 1024 \
          --policies snapkv --budgets 256 $v --output "$out/grid1k.jsonl"
      done ;;
    p2k3s1)
      "$S" eval run "${common[@]}" "${d5[@]}" --seeds 1 --tasks niah_single --lengths 2048 \
        --policies full,snapkv,streaming,pyramidkv,adakv,h2o --budgets 1024 --output "$out/p2k.jsonl"
      "$S" eval run "${common[@]}" "${d5[@]}" --seeds 1 --tasks niah_single --lengths 2048 \
        --policies snapkv --budgets 1024 --placements context_only --output "$out/context_only.jsonl" ;;
    multikey2k3b)
      "$S" eval run "${common[@]}" --depths 0,50,100 --seeds 0 --tasks niah_multikey --lengths 2048 \
        --policies full,snapkv,streaming --budgets 1024 --output "$out/multikey.jsonl"
      "$S" eval run "${common[@]}" --depths 25,75 --seeds 1 --tasks niah_multikey --lengths 2048 \
        --policies full,snapkv,streaming --budgets 1024 --output "$out/multikey.jsonl" ;;
    grid1k3full)
      "$S" eval run "${common[@]}" "${d4[@]}" --seeds 0-1 --tasks niah_single --lengths 1024 \
        --policies snapkv --budgets 256 --windows 16,32,64 --poolings max,avg --gqa mean,max \
        --output "$out/grid1k.jsonl" ;;
    noise2k3)
      "$S" eval run --haystacks noise -c 4 --kv-cache-mib 1200 --progress-interval 60 \
        --depths 50 --seeds 0 --tasks niah_single --lengths 2048 \
        --policies full,snapkv,streaming --budgets 1024 --output "$out/noise.jsonl" ;;
    report3)
      inputs=()
      for f in "$out"/*.jsonl; do inputs+=(--input "$f"); done
      "$S" eval report --title "SmolLM2-135M-Instruct Q4_1: third sweep (kernel 31 default)" \
        --output-dir "$out/report" "${inputs[@]}" ;;
    report)
      inputs=()
      for f in "$out"/*.jsonl; do inputs+=(--input "$f"); done
      "$S" eval report --title "SmolLM2-135M-Instruct Q4_1: long-context tasks in Shakespeare" \
        --output-dir "$out/report" "${inputs[@]}" ;;
    p4k4|p4k4s1)
      sd=0; [ "$step" = p4k4s1 ] && sd=1
      "$S" eval run "${one[@]}" "${d5[@]}" --seeds "$sd" --tasks niah_single --lengths 4096 \
        --policies snapkv --budgets 128,256,512,2048 --output "$out/p4k.jsonl"
      "$S" eval run "${one[@]}" "${d5[@]}" --seeds "$sd" --tasks niah_single --lengths 4096 \
        --policies full,snapkv,streaming,pyramidkv,adakv,h2o --budgets 1024 --output "$out/p4k.jsonl" ;;
    tasks2k4)
      "$S" eval run "${one[@]}" --depths 25,75 --seeds 0-1 --tasks niah_multivalue --lengths 2048 \
        --policies full,snapkv,streaming --budgets 1024 --output "$out/multivalue.jsonl"
      "$S" eval run "${one[@]}" --seeds 0-2 --tasks cwe --lengths 2048 \
        --policies full,snapkv,streaming --budgets 1024 --output "$out/cwe.jsonl"
      "$S" eval run "${one[@]}" --seeds 2-3 --tasks vt --lengths 2048 \
        --policies full,snapkv,streaming --budgets 1024 --output "$out/vt.jsonl" ;;
    len8k4)
      "$S" eval run --haystacks shakespeare -c 1 --threads 1 --kv-cache-mib 2000 --progress-interval 60 \
        --depths 25,75 --seeds 0 --tasks niah_single --lengths 8192 \
        --policies full,snapkv,streaming,pyramidkv,adakv --budgets 1024 --output "$out/len8k.jsonl"
      "$S" eval run --haystacks shakespeare -c 1 --threads 1 --kv-cache-mib 2000 --progress-interval 60 \
        --depths 25,75 --seeds 0 --tasks niah_single --lengths 8192 \
        --policies snapkv --budgets 256 --output "$out/len8k.jsonl" ;;
    gemma4|gemma16k4)
      mkdir -p "$out/gemma"
      if [ "$step" = gemma4 ]; then gl=(--lengths 4096,8192 --depths 25,75); else gl=(--lengths 16384 --depths 25); fi
      "$S" eval run "${gem[@]}" "${gl[@]}" --seeds 0 \
        --tasks niah_single --policies full,snapkv,streaming --budgets 1024 --output "$out/gemma/gemma.jsonl" ;;
    context4k4)
      "$S" eval run "${one[@]}" "${d5[@]}" --seeds 0 --tasks niah_single --lengths 4096 \
        --policies snapkv --budgets 1024 --placements context_only --output "$out/context_only.jsonl" ;;
    report4)
      # The 1K SnapKV-parameter grid and the KV-dtype records are sweep 3's, unchanged (its report
      # has them); left out here, each of their labels would add a heatmap panel (SVG < 100 KB).
      inputs=()
      for f in "$out"/*.jsonl; do
        case "$(basename "$f")" in grid1k.jsonl|dtype.jsonl) continue ;; esac
        inputs+=(--input "$f")
      done
      "$S" eval report --title "SmolLM2-135M-Instruct Q4_1: fourth sweep" \
        --output-dir "$out/report" "${inputs[@]}"
      if compgen -G "$out/gemma/*.jsonl" > /dev/null; then
        inputs=()
        for f in "$out"/gemma/*.jsonl; do inputs+=(--input "$f"); done
        "$S" eval report --title "Gemma 3 270M Q4_K_M (plain prompts): fourth sweep" \
          --output-dir "$out/gemma/report" "${inputs[@]}"
      fi ;;
    goal5|mk5)
      task=niah_single; f=goal5; seeds=(0 1 2 3 4)
      [ "$step" = mk5 ] && { task=niah_multikey; f=mk5; seeds=(0 1 2); }
      for sd in "${seeds[@]}"; do
        for L in 2048 4096 8192; do
          "$S" eval run "${one[@]}" "${d4[@]}" --seeds "$sd" --tasks "$task" --lengths "$L" \
            --policies full,snapkv,streaming --budgets 1024 --output "$out/$f.jsonl"
        done
      done ;;
    budget5)
      for sd in 0 1 2; do
        "$S" eval run "${one[@]}" "${d4[@]}" --seeds "$sd" --tasks niah_single --lengths 4096 \
          --policies snapkv --budgets 128,256,512,2048 --output "$out/budget5.jsonl"
        "$S" eval run "${one[@]}" "${d4[@]}" --seeds "$sd" --tasks niah_single --lengths 4096 \
          --policies pyramidkv,adakv,h2o --budgets 1024 --output "$out/budget5.jsonl"
        "$S" eval run "${one[@]}" "${d4[@]}" --seeds "$sd" --tasks niah_single --lengths 4096 \
          --policies streaming --budgets 256 --output "$out/budget5.jsonl"
      done ;;
    context5)
      for sd in 0 1 2 3 4; do
        "$S" eval run "${one[@]}" "${d4[@]}" --seeds "$sd" --tasks niah_single --lengths 2048,4096 \
          --policies snapkv --budgets 1024 --placements context_only --output "$out/context5.jsonl"
      done ;;
    grid5|grid5b)
      b=256; [ "$step" = grid5b ] && b=512
      for sd in 0 1; do
        for v in "--windows 16,64" "--kernels 7,15,63" "--poolings avg" "--gqa max"; do
          # shellcheck disable=SC2086
          "$S" eval run "${one[@]}" "${d4[@]}" --seeds "$sd" --tasks niah_single --lengths 4096 \
            --policies snapkv --budgets "$b" $v --output "$out/grid5.jsonl"
        done
      done ;;
    gemma5|gemma5b)
      mkdir -p "$out/gemma"
      if [ "$step" = gemma5 ]; then lens=(16384 32768); seeds=(0 1); else lens=(4096 8192); seeds=(0 1 2); fi
      for sd in "${seeds[@]}"; do
        for L in "${lens[@]}"; do
          "$S" eval run "${gem[@]}" --lengths "$L" --depths 25,75 --seeds "$sd" \
            --tasks niah_single --policies full,snapkv,streaming --budgets 1024 --output "$out/gemma/gemma5.jsonl"
        done
      done ;;
    gemma6|gemma6mk|gemma6grid)
      mkdir -p "$out/gemma"
      g=("$S" eval run "${gem[@]}" --depths 25,75)
      for sd in 0 1; do
        case "$step" in
          gemma6)
            "${g[@]}" --seeds "$sd" --lengths 16384 --tasks niah_single --policies snapkv \
              --budgets 256,512,2048 --output "$out/gemma/gemma6.jsonl"
            "${g[@]}" --seeds "$sd" --lengths 16384 --tasks niah_single --policies pyramidkv,adakv,h2o \
              --budgets 1024 --output "$out/gemma/gemma6.jsonl"
            "${g[@]}" --seeds "$sd" --lengths 16384 --tasks niah_single --policies snapkv \
              --budgets 1024 --placements context_only --output "$out/gemma/gemma6.jsonl" ;;
          gemma6mk)
            "${g[@]}" --seeds "$sd" --lengths 8192,16384 --tasks niah_multikey \
              --policies full,snapkv,streaming --budgets 1024 --output "$out/gemma/gemma6.jsonl" ;;
          gemma6grid)
            for v in "--windows 16,64" "--kernels 7,15,63" "--poolings avg"; do
              # shellcheck disable=SC2086
              "${g[@]}" --seeds "$sd" --lengths 16384 --tasks niah_single --policies snapkv \
                --budgets 256 $v --output "$out/gemma/grid6.jsonl"
            done ;;
        esac
      done ;;
    pool7|pool7mk)
      if [ "$step" = pool7 ]; then task=niah_single; lens=8192; seeds=(0 1 2 3 4); f=pool7
      else task=niah_multikey; lens=4096,8192; seeds=(0 1 2); f=pool7mk; fi
      for sd in "${seeds[@]}"; do
        "$S" eval run "${one[@]}" "${d4[@]}" --seeds "$sd" --tasks "$task" --lengths "$lens" \
          --policies snapkv --budgets 1024 --poolings avg --output "$out/$f.jsonl"
      done ;;
    pool7p)
      for sd in 0 1 2; do
        "$S" eval run "${one[@]}" "${d4[@]}" --seeds "$sd" --tasks niah_single --lengths 4096 \
          --policies pyramidkv,adakv --budgets 1024 --poolings avg --output "$out/pool7p.jsonl"
      done ;;
    pool7g|pool7g2)
      mkdir -p "$out/gemma"
      if [ "$step" = pool7g ]; then pol=pyramidkv,adakv; seeds=(0 1); else pol=snapkv; seeds=(2 3); fi
      for sd in "${seeds[@]}"; do
        "$S" eval run "${gem[@]}" --depths 25,75 --seeds "$sd" --lengths 16384 --tasks niah_single \
          --policies "$pol" --budgets 256 --poolings avg,max --output "$out/gemma/$step.jsonl"
      done ;;
    pool7gmk)
      mkdir -p "$out/gemma"
      for sd in 0 1; do
        "$S" eval run "${gem[@]}" --depths 25,75 --seeds "$sd" --lengths 8192,16384 --tasks niah_multikey \
          --policies snapkv --budgets 1024 --poolings avg --output "$out/gemma/pool7gmk.jsonl"
      done ;;
    gemma7b|gemma7l|gemma7)
      mkdir -p "$out/gemma"
      g=("$S" eval run "${gem[@]}" --depths 25,75 --tasks niah_single --budgets 1024 --output "$out/gemma/$step.jsonl")
      case "$step" in
        gemma7b)
          for sd in 0 1 2; do
            pol=full,snapkv,streaming; [ "$sd" = 0 ] && pol=snapkv
            for L in 4096 8192; do "${g[@]}" --lengths "$L" --seeds "$sd" --policies "$pol" --poolings avg; done
          done ;;
        gemma7l)
          "${g[@]}" --lengths 32768 --seeds 1 --policies full,snapkv,streaming --poolings avg,max
          "${g[@]}" --lengths 32768 --seeds 0 --policies snapkv --poolings avg ;;
        gemma7)
          for sd in 2 3; do "${g[@]}" --lengths 16384 --seeds "$sd" --policies full,snapkv,streaming --poolings avg; done ;;
      esac ;;
    report5)
      # grid5's 14 variant labels get their own report (with budget5's default cells), so that
      # the main heatmap keeps one panel per policy (each SVG < 100 KB).
      inputs=()
      for f in "$out"/*.jsonl; do
        [ "$(basename "$f")" = grid5.jsonl ] || inputs+=(--input "$f")
      done
      "$S" eval report --title "SmolLM2-135M-Instruct Q4_1: fifth sweep" --output-dir "$out/report" "${inputs[@]}"
      if [ -f "$out/grid5.jsonl" ]; then
        inputs=(--input "$out/grid5.jsonl")
        [ -f "$out/budget5.jsonl" ] && inputs+=(--input "$out/budget5.jsonl")
        "$S" eval report --title "SmolLM2-135M-Instruct Q4_1: fifth sweep, SnapKV parameters at 4K" \
          --output-dir "$out/grid/report" "${inputs[@]}"
      fi
      if compgen -G "$out/gemma/*.jsonl" > /dev/null; then
        inputs=()
        for f in "$out"/gemma/*.jsonl; do
          [ "$(basename "$f")" = grid6.jsonl ] || inputs+=(--input "$f")
        done
        "$S" eval report --title "Gemma 3 270M Q4_K_M (plain prompts): fifth and sixth sweeps" \
          --output-dir "$out/gemma/report" "${inputs[@]}"
      fi
      if [ -f "$out/gemma/grid6.jsonl" ]; then
        "$S" eval report --title "Gemma 3 270M Q4_K_M: SnapKV parameters at 16K, budget 256" \
          --output-dir "$out/gemma/grid/report" --input "$out/gemma/grid6.jsonl"
      fi ;;
    *) echo "run_eval_sweep.sh: unknown step '$step'" >&2; exit 2 ;;
  esac
done
