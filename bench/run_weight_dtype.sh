#!/usr/bin/env bash
# --weight-dtype on the CPU: decode ms/token, prefill tok/s, the weight bytes a decoded token
# reads and peak RSS for a bf16 Hugging Face checkpoint loaded as f32 (auto), bf16 and q8_0
# (quantized at load), RUNS interleaved runs each, medians and ratios to f32 printed. The model
# is tools/make_random_model.py's (no download; random weights decode as fast as trained ones),
# written once to $SNAP_RANDOM_DIR (default ~/.cache/snapserve/random). Quote the medians and
# ratios of one run of this script (the machine is shared).
#   bench/run_weight_dtype.sh [build-dir]   (SHAPE=llama3-1b RUNS=3 LENGTH=512 DECODE=32 THREADS=2)
set -euo pipefail
build=${1:-build}
bench="$build/bench/bench_generate"
shape=${SHAPE:-llama3-1b}
runs=${RUNS:-3}
length=${LENGTH:-512}
decode=${DECODE:-32}
threads=${THREADS:-2}
dir=${SNAP_RANDOM_DIR:-$HOME/.cache/snapserve/random}/$shape
[ -x "$bench" ] || { echo "run_weight_dtype.sh: no $bench (build it first)" >&2; exit 1; }
if [ ! -s "$dir/model.safetensors" ]; then
  echo "# writing $dir (tools/make_random_model.py --shape $shape, bf16)"
  python3 "$(dirname "$0")/../tools/make_random_model.py" --shape "$shape" --out "$dir" >/dev/null
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "# $(uptime)"
echo "# $shape (bf16 safetensors), prompt $length, $decode new tokens, $threads threads, $runs interleaved runs"
for r in $(seq 1 "$runs"); do
  for w in auto bf16 q8_0; do
    "$bench" --model "$dir" --lengths "$length" --decode "$decode" --threads "$threads" --weight-dtype "$w" \
      --json "$tmp/$w.$r.json" > "$tmp/$w.$r.log" 2>&1 || { cat "$tmp/$w.$r.log" >&2; exit 1; }
    echo "run $r $w: $(grep -E '^full' "$tmp/$w.$r.log")"
  done
done
python3 - "$tmp" "$runs" <<'PY'
import json, statistics, sys
tmp, runs = sys.argv[1], int(sys.argv[2])
rows = {}
for w in ("auto", "bf16", "q8_0"):
    recs = [json.load(open(f"{tmp}/{w}.{r}.json")) for r in range(1, runs + 1)]
    rows[w] = {
        "decode_ms": statistics.median(x["rows"][0]["decode_ms_p50"] for x in recs),
        "prefill_tps": statistics.median(x["rows"][0]["prefill_tps"] for x in recs),
        "floor_ms": statistics.median(x["rows"][0]["floor_ms"] for x in recs),
        "weights_mib": recs[0]["weight_bytes_per_token"] / 2**20,
        "peak_rss_mib": statistics.median(x["peak_rss_bytes"] for x in recs) / 2**20,
    }
base = rows["auto"]
print("| --weight-dtype | weights read / token | decode ms/token (median) | vs f32 | floor ms | prefill tok/s | vs f32 | peak RSS |")
print("|---|---|---|---|---|---|---|---|")
for w, r in rows.items():
    name = "auto (f32 here)" if w == "auto" else w
    print(f"| {name} | {r['weights_mib']:.0f} MiB | {r['decode_ms']:.1f} | {base['decode_ms'] / r['decode_ms']:.2f}x | "
          f"{r['floor_ms']:.1f} | {r['prefill_tps']:.1f} | {r['prefill_tps'] / base['prefill_tps']:.2f}x | "
          f"{r['peak_rss_mib']:.0f} MiB |")
PY
