#!/usr/bin/env bash
# Does KV compression change toxicity scores, and does the scorer's version change the
# ranking? SmolLM2-135M under full, snapkv and streaming at two budgets, k continuations of
# our public-domain prompts, scored by tcc-toxic@0.3.0 while generating and rescored with
# tcc-toxic@0.2.2 and profanity@1.2.2/1.5.0 afterwards (no generation); then `eval compare`.
# Small on purpose (the prompts are 10-25 tokens, so budgets are 8 and 12 with a 4-token window).
#   bench/toxicity_kv_scorers.sh [BUILD_DIR] [OUT_DIR]
# Env: PROMPTS (default 20), K (default 10), MAX_TOKENS (default 20), THREADS (default 2).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
out=${2:-${TMPDIR:-/tmp}/snapserve_toxicity_kv_scorers}
bin="$build/snapserve"
mkdir -p "$out"
db="$out/toxicity.sqlite"
prompts=eval/scoring/data/shakespeare_prompts.jsonl
common=(--db "$db" --prompts "$prompts" --limit "${PROMPTS:-20}" --k "${K:-10}" --max-tokens "${MAX_TOKENS:-20}"
        --seed 1 --threads "${THREADS:-2}" --scorer tcc-toxic@0.3.0)
run() {  # name, then KV flags
  local name=$1; shift
  echo "== $name" >&2
  "$bin" eval toxicity "${common[@]}" --name "$name" "$@" | tee "$out/$name.txt"
}
run full --kv-policy full
for b in 8 12; do
  run "snapkv-$b" --kv-policy snapkv --kv-budget "$b" --kv-window 4 --kv-kernel 3
  run "streaming-$b" --kv-policy streaming --kv-budget "$b" --kv-sinks 4
done
"$bin" eval rescore --db "$db" --scorer tcc-toxic@0.2.2 > "$out/rescore_0.2.2.txt"
for metric in emt tp fraction; do
  "$bin" eval compare --db "$db" --scorer tcc-toxic@0.2.2 --scorer tcc-toxic@0.3.0 --metric "$metric" --json "$out/compare_$metric.json" | tee "$out/compare_$metric.txt"
done
# The other scorer pair: alt-profanity-check 1.2.2 -> 1.5.0 on the same generations.
for v in 1.2.2 1.5.0; do "$bin" eval rescore --db "$db" --scorer "profanity@$v" > "$out/rescore_profanity_$v.txt"; done
for metric in emt tp; do
  "$bin" eval compare --db "$db" --scorer profanity@1.2.2 --scorer profanity@1.5.0 --metric "$metric" \
    --json "$out/compare_profanity_$metric.json" | tee "$out/compare_profanity_$metric.txt"
done
"$bin" eval export --db "$db" --format jsonl -o "$out/scores.jsonl"
echo "wrote $out" >&2
