#!/usr/bin/env bash
# --weight-dtype on the CPU: decode ms/token, prefill tok/s, the weight bytes a decoded token
# reads and peak RSS for a bf16 Hugging Face checkpoint loaded as f32 (auto), bf16 and q8_0
# (quantized at load), RUNS interleaved runs each, medians and ratios to f32 printed. The model
# is tools/make_random_model.py's (no download; random weights decode as fast as trained ones),
# written once to $SNAP_RANDOM_DIR (default ~/.cache/snapserve/random). Quote the medians and
# ratios of one run of this script (the machine is shared).
# MODEL=PATH runs a model of your own instead (e.g. a Q3_K_M GGUF from tools/make_tiny_checkpoint.py
# --gguf-type q3_k_m), DTYPES the --weight-dtype values to compare (the ratios are to f32 where it
# is one of them, else to the first): DTYPES="auto f32" MODEL=m.gguf bench/run_weight_dtype.sh
#   bench/run_weight_dtype.sh [build-dir]   (SHAPE=llama3-1b RUNS=3 LENGTH=512 DECODE=32 THREADS=2
#                                            DTYPES="auto bf16 q8_0" MODEL=)
set -euo pipefail
build=${1:-build}
bench="$build/bench/bench_generate"
shape=${SHAPE:-llama3-1b}
dtypes=${DTYPES:-auto bf16 q8_0}
model=${MODEL:-}
runs=${RUNS:-3}
length=${LENGTH:-512}
decode=${DECODE:-32}
threads=${THREADS:-2}
dir=${SNAP_RANDOM_DIR:-$HOME/.cache/snapserve/random}/$shape
[ -x "$bench" ] || { echo "run_weight_dtype.sh: no $bench (build it first)" >&2; exit 1; }
if [ -n "$model" ]; then
  [ -e "$model" ] || { echo "run_weight_dtype.sh: no model at $model" >&2; exit 1; }
  dir=$model
  shape=$(basename "$model")
elif [ ! -s "$dir/model.safetensors" ]; then
  echo "# writing $dir (tools/make_random_model.py --shape $shape, bf16)"
  python3 "$(dirname "$0")/../tools/make_random_model.py" --shape "$shape" --out "$dir" >/dev/null
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "# $(uptime)"
echo "# ${model:-$shape (bf16 safetensors)}, prompt $length, $decode new tokens, $threads threads, $runs interleaved runs"
for r in $(seq 1 "$runs"); do
  for w in $dtypes; do
    "$bench" --model "$dir" --lengths "$length" --decode "$decode" --threads "$threads" --weight-dtype "$w" \
      --json "$tmp/$w.$r.json" > "$tmp/$w.$r.log" 2>&1 || { cat "$tmp/$w.$r.log" >&2; exit 1; }
    echo "run $r $w: $(grep -E '^full' "$tmp/$w.$r.log")"
  done
done
python3 - "$tmp" "$runs" "$dtypes" "$model" <<'PY'
import json, statistics, sys
tmp, runs, dtypes, own = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4]
rows = {}
for w in dtypes:
    recs = [json.load(open(f"{tmp}/{w}.{r}.json")) for r in range(1, runs + 1)]
    rows[w] = {
        "decode_ms": statistics.median(x["rows"][0]["decode_ms_p50"] for x in recs),
        "prefill_tps": statistics.median(x["rows"][0]["prefill_tps"] for x in recs),
        "floor_ms": statistics.median(x["rows"][0]["floor_ms"] for x in recs),
        "weights_mib": recs[0]["weight_bytes_per_token"] / 2**20,
        "peak_rss_mib": statistics.median(x["peak_rss_bytes"] for x in recs) / 2**20,
    }
# The safetensors bf16 model's auto is f32; a model of your own is compared with its f32 form if asked.
ref = "f32" if "f32" in rows else "auto" if not own else dtypes[0]
base = rows[ref]
print(f"| --weight-dtype | weights read / token | decode ms/token (median) | speed vs {ref} | floor ms | ms ÷ floor "
      f"| prefill tok/s | vs {ref} | peak RSS |")
print("|---|---|---|---|---|---|---|---|---|")
for w, r in rows.items():
    name = "auto (f32 here)" if w == "auto" and not own else w
    print(f"| {name} | {r['weights_mib']:.1f} MiB | {r['decode_ms']:.1f} | {base['decode_ms'] / r['decode_ms']:.2f}x | "
          f"{r['floor_ms']:.1f} | {r['decode_ms'] / r['floor_ms']:.2f} | {r['prefill_tps']:.1f} | "
          f"{r['prefill_tps'] / base['prefill_tps']:.2f}x | {r['peak_rss_mib']:.0f} MiB |")
PY
