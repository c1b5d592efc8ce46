#!/usr/bin/env bash
# Tensor parallelism on this machine: prefill and decode time at TP=1 (one process pinned
# to core 0) and TP=2 (two MPI ranks, one core each), and the bytes each rank sends per
# decoded token. Writes OUT_DIR/tp.md (markdown table + the exact command lines) and
# prints it; each run's stderr report stays in OUT_DIR/tp_runs/.
#   bash bench/run_tp.sh [BUILD_DIR] [OUT_DIR]
#
# Model: SmolLM2-135M has 9 query heads, which 2 ranks cannot split, so the script writes
# (once, cached in OUT_DIR/tp_model) a RANDOM-weight checkpoint with SmolLM2-135M's shapes
# except the heads: 30 layers, hidden 576, 8 heads of head_dim 72 (q_proj/o_proj still
# 576x576), 2 KV heads, intermediate 1536, vocab 49152 tied, max position 8192, f32 GGUF.
# Weights are 532.8 MB vs SmolLM2-135M's 538.1 MB in f32 (k/v_proj are 144 rows instead of
# 192: 1% fewer bytes) and its KV cache is 34560 B/token vs 46080 B, so timings are
# representative of SmolLM2-135M f32 but the generated text is gibberish.
# The tokenizer of the random checkpoint is byte-level and adds no BOS; the prompt text avoids
# its merges, so a prompt file of L bytes is L tokens (the report's "prompt tokens" is exact).
#
# Shorter runs (smoke test): TP_LENGTHS="128" TP_MAX_TOKENS=8 TP_REPEATS=1 TP_SNAPKV_LENGTH=
# Defaults: TP_LENGTHS="512 2048" TP_MAX_TOKENS=64 TP_REPEATS=3 TP_SNAPKV_LENGTH=2048
# TP_SNAPKV_BUDGET=256 (TP_SNAPKV_LENGTH empty: no SnapKV rows).
set -euo pipefail
build=${1:-build}
out=${2:-bench/results}
lengths=${TP_LENGTHS-512 2048}
max_tokens=${TP_MAX_TOKENS:-64}
repeats=${TP_REPEATS:-3}
snapkv_length=${TP_SNAPKV_LENGTH-2048}
snapkv_budget=${TP_SNAPKV_BUDGET:-256}
here=$(cd "$(dirname "$0")/.." && pwd)
bin=$(cd "$build" && pwd)/snapserve
[ -x "$bin" ] || { echo "run_tp.sh: $bin not found (cmake --build $build --target snapserve)" >&2; exit 1; }
mkdir -p "$out/tp_runs"
out=$(cd "$out" && pwd)
model="$out/tp_model/model.gguf"

# --- checkpoint (cached) -----------------------------------------------------------
if [ ! -f "$model" ]; then
  echo "== writing the random SmolLM2-135M-shaped checkpoint to $out/tp_model"
  python3 "$here/tools/make_tiny_checkpoint.py" --out "$out/tp_model" --layers 30 --hidden 576 \
    --heads 8 --kv-heads 2 --intermediate 1536 --vocab 49152 --max-position 8192 \
    --rope-theta 100000 --tie
  rm -rf "$out/tp_model/hf"  # the same weights as safetensors: not used here
fi

# --- prompts: L bytes of words without the tokenizer's merges = L tokens -------------
prompt_lengths=$lengths
[ -n "$snapkv_length" ] && prompt_lengths="$prompt_lengths $snapkv_length"
for len in $(echo $prompt_lengths | tr ' ' '\n' | sort -un); do
  python3 - "$len" "$out/tp_runs/prompt_$len.txt" <<'EOF'
import random, sys
n, path = int(sys.argv[1]), sys.argv[2]
words = ["quick", "brown", "fox", "jumps", "by", "lazy", "dog", "box", "cup", "milk", "hub",
         "blue", "cold", "jog", "duck", "glad", "lamp", "bulk", "pump", "folk", "myth"]
rng, text = random.Random(n), ""
while len(text) < n:
    text += rng.choice(words) + rng.choice([" ", " ", " ", ". ", ", "])
open(path, "w").write(text[:n])
EOF
done

# --- runs ----------------------------------------------------------------------------
# cmd_for TP LEN POLICY_ARGS... : the command line of one configuration, into $cmd
cmd_for() {
  local tp=$1 len=$2
  shift 2
  local gen=("$bin" generate --model "$model" --prompt-file "$out/tp_runs/prompt_$len.txt"
             --max-tokens "$max_tokens" --ignore-eos --threads 1 "$@")
  if [ "$tp" = 1 ]; then
    cmd=(taskset -c 0 "${gen[@]}")
  else
    cmd=(mpirun --allow-run-as-root -np "$tp" --bind-to core "${gen[@]}" --tp "$tp")
  fi
}

configs=()  # "TP LEN POLICY" (POLICY: full or snapkv)
for len in $lengths; do configs+=("1 $len full" "2 $len full"); done
[ -n "$snapkv_length" ] && configs+=("1 $snapkv_length snapkv" "2 $snapkv_length snapkv")

: > "$out/tp_runs/commands.txt"
for c in "${configs[@]}"; do
  read -r tp len pol <<< "$c"
  extra=()
  [ "$pol" = snapkv ] && extra=(--kv-policy snapkv --kv-budget "$snapkv_budget")
  cmd_for "$tp" "$len" "${extra[@]}"
  printf '%s\t%s\n' "tp${tp}_${len}_${pol}" "$(printf '%q ' "${cmd[@]}")" >> "$out/tp_runs/commands.txt"
done

echo "== machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg) before the runs" \
  | tee "$out/tp_runs/machine.txt"
# TP=2 ranks meet 2 x layers times per token: one rank preempted by another process stalls
# both, so TP=2 needs both cores idle while TP=1 needs only core 0. Warn, do not refuse.
if awk '{ exit !($1 >= 0.5) }' /proc/loadavg; then
  echo "== WARNING: other processes are using the CPUs; TP=2 times (both cores) suffer more than TP=1 (core 0)" \
    | tee -a "$out/tp_runs/machine.txt"
  ps -eo pcpu,psr,comm --sort=-pcpu | awk 'NR > 1 && NR <= 4 && $1 > 10 { print "==   busy: " $3 " " $1 "% on core " $2 }' \
    | tee -a "$out/tp_runs/machine.txt"
fi
# Repeats are the outer loop, so TP=1 and TP=2 of one configuration alternate and see the
# same machine conditions; the speed-up is a ratio of medians from this one invocation.
for r in $(seq 1 "$repeats"); do
  for c in "${configs[@]}"; do
    read -r tp len pol <<< "$c"
    tag="tp${tp}_${len}_${pol}"
    extra=()
    [ "$pol" = snapkv ] && extra=(--kv-policy snapkv --kv-budget "$snapkv_budget")
    cmd_for "$tp" "$len" "${extra[@]}"
    echo "== run $r/$repeats: $tag"
    if ! "${cmd[@]}" > "$out/tp_runs/${tag}_r$r.out" 2> "$out/tp_runs/${tag}_r$r.log"; then
      echo "run_tp.sh: $tag run $r failed:" >&2
      tail -20 "$out/tp_runs/${tag}_r$r.log" >&2
      exit 1
    fi
  done
done
echo "== load average after the runs: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out/tp_runs/machine.txt"

# --- table -----------------------------------------------------------------------------
python3 - "$out" "$repeats" "$snapkv_budget" "$max_tokens" <<'EOF' | tee "$out/tp.md"
import re, statistics, sys
out, repeats, budget, max_tokens = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
runs = f"{out}/tp_runs"
commands = [l.rstrip("\n").split("\t") for l in open(f"{runs}/commands.txt")]

UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
def mib(text):
    v, u = text.split()
    return float(v) * UNITS[u] / 2**20

def parse(path):
    t = open(path).read()
    def grab(pattern, cast=float, default=None):
        m = re.search(pattern, t)
        if m is None:
            if default is None:
                sys.exit(f"run_tp.sh: {path}: no match for {pattern!r}")
            return default
        return cast(m.group(1))
    gen = grab(r"generated tokens (\d+)", int)
    return {
        "prompt": grab(r"prompt tokens (\d+)", int),
        "prefill_s": grab(r"prefill ([\d.]+) s"),
        "prefill_tps": grab(r"prefill [\d.]+ s \(([\d.]+) tok/s\)"),
        "decode_ms": 1000 * grab(r"decode ([\d.]+) s") / max(gen - 1, 1),
        "decode_tps": grab(r"decode [\d.]+ s \(([\d.]+) tok/s\)"),
        "kv_mib": grab(r"resident ([\d.]+ \w+),", mib),
        "rss_mib": grab(r"peak RSS ([\d.]+ \w+)", mib),
        "ar_per_tok": grab(r"per decoded token: all_reduce_sum ([\d.]+) bytes", float, -1.0),
        "bc_per_tok": grab(r"per decoded token: .* broadcast ([\d.]+) bytes", float, -1.0),
        "ag_per_tok": grab(r"per decoded token: .* all_gather ([\d.]+) bytes", float, -1.0),
        "generated": gen,
    }

rows = {}
for tag, _ in commands:
    rs = [parse(f"{runs}/{tag}_r{r}.log") for r in range(1, repeats + 1)]
    med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
    tp, length, pol = tag[2:].split("_")
    rows[(pol, int(length), int(tp))] = med

def fmt_bytes(v):
    return "—" if v < 0 else f"{v:,.0f}"

print("# Tensor parallelism on this machine (bench/run_tp.sh)\n")
print(open(f"{runs}/machine.txt").read().replace("== ", "- ").strip() + "\n")
print(f"Random-weight SmolLM2-135M-shaped model (30 layers, hidden 576, 8 heads, 2 KV heads, f32); "
      f"{max_tokens} generated tokens with --ignore-eos; medians of {repeats} run(s). TP=1 is one process "
      "on core 0, TP=2 two MPI ranks bound one per core; --threads 1 per rank. Speed-up = TP=1 median / "
      "TP=2 median of the same invocation. Bytes are sent by each rank per decoded token "
      "(all_reduce_sum: 2 x layers x hidden x 4 B expected; all_gather: the vocab-parallel LM head's "
      "logits, ceil(vocab / tp) x 4 B). KV resident and peak RSS are rank 0's, "
      "as snapserve prints them (peak RSS above 1 GiB to 0.1 GiB; it counts the GGUF pages the "
      "loader touched as well as the weights).\n")
print("| prompt tokens | KV policy | TP | prefill s | prefill tok/s | decode ms/token | decode tok/s "
      "| speed-up prefill | speed-up decode | all_reduce B/token | all_gather B/token | broadcast B/token "
      "| KV resident rank 0 | peak RSS rank 0 |")
print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for (pol, length, tp), m in sorted(rows.items(), key=lambda kv: (kv[0][0] != "full", kv[0][1], kv[0][2])):
    base = rows.get((pol, length, 1))
    sp_pre = sp_dec = "—"
    if tp != 1 and base:
        sp_pre = f"{base['prefill_s'] / m['prefill_s']:.2f}x"
        sp_dec = f"{base['decode_ms'] / m['decode_ms']:.2f}x"
    name = "full" if pol == "full" else f"snapkv:{budget}"
    print(f"| {m['prompt']:.0f} | {name} | {tp} | {m['prefill_s']:.2f} | {m['prefill_tps']:.1f} "
          f"| {m['decode_ms']:.1f} | {m['decode_tps']:.1f} | {sp_pre} | {sp_dec} | {fmt_bytes(m['ar_per_tok'])} "
          f"| {fmt_bytes(m['ag_per_tok'])} | {fmt_bytes(m['bc_per_tok'])} | {m['kv_mib']:.1f} MiB | {m['rss_mib']:.0f} MiB |")

snap = [(length, tp) for (pol, length, tp) in rows if pol == "snapkv"]
if snap:
    print(f"\nSnapKV (budget {budget}) vs full cache at the same prompt, per TP degree "
          "(decode saving = full ms/token / snapkv ms/token):\n")
    print("| prompt tokens | TP | full decode ms/token | snapkv decode ms/token | decode saving "
          "| full KV rank 0 | snapkv KV rank 0 |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for length, tp in sorted(snap):
        f, s = rows.get(("full", length, tp)), rows[("snapkv", length, tp)]
        if f is None:
            continue
        print(f"| {s['prompt']:.0f} | {tp} | {f['decode_ms']:.1f} | {s['decode_ms']:.1f} "
              f"| {f['decode_ms'] / s['decode_ms']:.2f}x | {f['kv_mib']:.1f} MiB | {s['kv_mib']:.1f} MiB |")

print(f"\nCommand lines (each run {repeats} time(s)):\n")
print("```")
for tag, cmd in commands:
    print(f"# {tag}\n{cmd.strip()}")
print("```")
EOF
