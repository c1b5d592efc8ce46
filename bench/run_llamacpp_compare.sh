#!/usr/bin/env bash
# snapserve side by side with llama.cpp on one GGUF, same threads, interleaved (not a test).
# Fetches the llama-cpp-python 0.3.36 sdist (pip download --no-binary), builds llama-bench and
# llama-simple from its vendor/llama.cpp (CPU, Release, GGML_NATIVE, no CURL; cached), then runs
# round after round, every measurement its own process under /usr/bin/time -v:
#   llama-bench -p L -n 0 --no-warmup (prefill, cold as snapserve's is), -p 0 -n D -d L (decode
#   at depth L), default f16 KV;
#   snapserve generate on an L-token text prompt, --max-tokens D --ignore-eos, per config
#   DTYPE/POLICY[:BUDGET] (prefill tok/s, decode tok/s, peak RSS); at the largest L also the
#   first config with SNAP_ATTENTION_TILES=0 (prefill attention row by row).
# Once at the largest L: peak RSS of llama-simple (the same prompt, f16 KV) and of snapserve per
# --rss-dtypes x {full, snapkv 1024} not measured in the rounds. Prints medians, ratios
# snapserve/llama.cpp, load before/after.
#   bench/run_llamacpp_compare.sh [--build DIR] [--model GGUF] [--rounds 3] [--lengths 512,2048,8192]
#       [--decode 32] [--threads 2] [--configs f32/full,f32/snapkv:256,...,f16/snapkv:1024]
#       [--rss-dtypes f32,f16,q8_0 | --no-rss] [--no-tiles] [--cache DIR] [--out DIR]
# --configs: default every f32,f16 x full,snapkv:256,snapkv:1024; --build: snapserve's build dir
# (DIR/snapserve); --cache: where the sdist and llama.cpp build live (default
# ~/.cache/snapserve/llamacpp); --out: logs and results.tsv (default a new dir under the cache);
# --no-tiles: skip the SNAP_ATTENTION_TILES=0 runs; --no-rss: skip the once-only RSS runs.
set -euo pipefail

build=build rounds=3 lengths=512,2048,8192 decode=32 threads=2
model="${SNAP_MODEL:-$HOME/.cache/snapserve/SmolLM2-135M-Instruct.Q4_1.gguf}"
configs=f32/full,f32/snapkv:256,f32/snapkv:1024,f16/full,f16/snapkv:256,f16/snapkv:1024
rss_dtypes=f32,f16,q8_0 tiles=1 rss=1
cache="$HOME/.cache/snapserve/llamacpp" out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2 ;;
    --model) model=$2 ;;
    --rounds) rounds=$2 ;;
    --lengths) lengths=$2 ;;
    --decode) decode=$2 ;;
    --threads) threads=$2 ;;
    --configs) configs=$2 ;;
    --rss-dtypes) rss_dtypes=$2 ;;
    --cache) cache=$2 ;;
    --out) out=$2 ;;
    --no-tiles) tiles=0; shift; continue ;;
    --no-rss) rss=0; shift; continue ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "run_llamacpp_compare.sh: unknown flag $1 (see --help)" >&2; exit 2 ;;
  esac
  [ $# -ge 2 ] || { echo "run_llamacpp_compare.sh: $1 needs a value" >&2; exit 2; }
  shift 2
done
snap="$build/snapserve"
[ -x "$snap" ] || { echo "run_llamacpp_compare.sh: $snap not built (cmake --build $build --target snapserve)" >&2; exit 2; }
[ -f "$model" ] || { echo "run_llamacpp_compare.sh: model $model not found" >&2; exit 2; }
[ -x /usr/bin/time ] || { echo "run_llamacpp_compare.sh: /usr/bin/time missing (apt-get install time)" >&2; exit 2; }

# --- llama.cpp: fetch the sdist, build the two tools once ---------------------------------
version=0.3.36
src="$cache/llama_cpp_python-$version/vendor/llama.cpp"
lbuild="$cache/build"
mkdir -p "$cache"
if [ ! -x "$lbuild/bin/llama-bench" ] || [ ! -x "$lbuild/bin/llama-simple" ]; then
  if [ ! -d "$src" ]; then
    [ -f "$cache/llama_cpp_python-$version.tar.gz" ] ||
      pip download --no-deps --no-binary :all: "llama-cpp-python==$version" -d "$cache"
    tar xzf "$cache/llama_cpp_python-$version.tar.gz" -C "$cache"
  fi
  cmake -S "$src" -B "$lbuild" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
    -DLLAMA_OPENSSL=OFF -DGGML_CUDA=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF \
    -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_TOOLS=ON -DBUILD_SHARED_LIBS=OFF > "$cache/cfg.log"
  cmake --build "$lbuild" -j"$(nproc)" --target llama-bench llama-simple > "$cache/build.log"
fi
lbench="$lbuild/bin/llama-bench" lsimple="$lbuild/bin/llama-simple"
vendored=$(sed -n 's/.*update llama.cpp to ggml-org\/llama.cpp@\([0-9a-f]*\).*/\1/p' \
  "$cache/llama_cpp_python-$version/CHANGELOG.md" | head -1)

[ -n "$out" ] || out="$cache/run-$(date -u +%Y%m%dT%H%M%S)"
mkdir -p "$out"
res="$out/results.tsv"   # kind engine config length round metric value
: > "$res"

# --- prompts: plain English-looking text, fixed seed; ~1.11 tokens per word for SmolLM2 -------
words_text() {
  awk -v n="$1" 'BEGIN {
    split("the of and to in is was for on that with as by at from it his an were are which this be or had not but have they their one all been has more its there when who some time would other into after first only years these two new about over also may most than many such then them people where during used those between through three each both under much while world city part well school found state because system same known since high early life later long water until large called another group being work day", w, " ");
    nw = length(w); s = 12345; c = 0;
    while (c < n) { len = 6 + (s % 9); line = "";
      for (i = 0; i < len && c < n; i++) { s = (s * 1103515245 + 12345) % 2147483648;
        line = line (i ? " " : "") w[1 + int(s / 65536) % nw]; c++ }
      printf "%s.%s", line, (c % 97 < 10 ? "\n" : " ") }
    printf "\n" }'
}
IFS=, read -r -a len_list <<< "$lengths"
IFS=, read -r -a cfg_list <<< "$configs"
for c in "${cfg_list[@]}"; do
  [[ "$c" =~ ^(f32|bf16|f16|q8_0)/[a-z]+(:[0-9]+)?$ ]] ||
    { echo "run_llamacpp_compare.sh: bad config '$c' (DTYPE/POLICY[:BUDGET], e.g. f16/snapkv:1024)" >&2; exit 2; }
done
IFS=, read -r -a rss_list <<< "$rss_dtypes"
maxlen=${len_list[-1]}
for L in "${len_list[@]}"; do words_text $((L * 9 / 10)) > "$out/prompt_$L.txt"; done

rss_mib() { awk -F': ' '/Maximum resident set size/ {printf "%.1f", $2 / 1024}' "$1"; }
record() { printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$@" >> "$res"; }

# llama-bench, one test per process; $1 tag, $2 length, $3 round, rest: llama-bench args
run_llama() {
  local tag=$1 L=$2 r=$3; shift 3
  local log="$out/llama_${tag}_${L}_r$r"
  /usr/bin/time -v "$lbench" -m "$model" -t "$threads" -r 1 -o jsonl "$@" > "$log.json" 2> "$log.err" ||
    echo "llama-bench failed ($tag $L round $r): see $log.err" >&2
  local ts; ts=$(python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])["avg_ts"])' "$log.json" 2>/dev/null || true)
  record llama.cpp f16 "$L" "$r" "$tag" "$ts"
  record llama.cpp f16 "$L" "$r" "rss_$tag" "$(rss_mib "$log.err")"
}

# snapserve generate; $1 config label (dtype/policy[/notiles]), $2 length, $3 round, $4 dtype,
# $5 policy NAME[:BUDGET], $6 env (e.g. SNAP_ATTENTION_TILES=0 or "")
run_snap() {
  local cfg=$1 L=$2 r=$3 dt=$4 pol=$5 envs=$6
  local log; log="$out/snap_$(echo "$cfg" | tr '/:' '__')_${L}_r$r.err"
  local args=(--kv-dtype "$dt" --kv-policy "${pol%%:*}")
  [[ "$pol" == *:* ]] && args+=(--kv-budget "${pol##*:}")
  env $envs /usr/bin/time -v "$snap" generate --model "$model" --prompt-file "$out/prompt_$L.txt" \
    --max-tokens "$decode" --ignore-eos --threads "$threads" "${args[@]}" > /dev/null 2> "$log" ||
    echo "snapserve failed ($cfg $L round $r): see $log" >&2
  local ptoks pf dc
  ptoks=$(sed -n 's/.*prompt tokens \([0-9]*\), prefill.*/\1/p' "$log")
  pf=$(sed -n 's/.*prompt tokens [0-9]*, prefill [0-9.]* s (\([0-9.]*\) tok\/s).*/\1/p' "$log")
  dc=$(sed -n 's/.*generated tokens [0-9]* .*decode [0-9.]* s (\([0-9.]*\) tok\/s).*/\1/p' "$log")
  record snapserve "$cfg" "$L" "$r" prompt_tokens "$ptoks"
  record snapserve "$cfg" "$L" "$r" prefill "$pf"
  record snapserve "$cfg" "$L" "$r" decode "$dc"
  record snapserve "$cfg" "$L" "$r" rss "$(rss_mib "$log")"
}

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
echo "load before: $load_before; $(nproc) cores, threads $threads, rounds $rounds, out $out"
for ((r = 1; r <= rounds; r++)); do
  for L in "${len_list[@]}"; do
    run_llama pp "$L" "$r" -p "$L" -n 0 --no-warmup
    for c in "${cfg_list[@]}"; do run_snap "$c" "$L" "$r" "${c%%/*}" "${c#*/}" ""; done
    run_llama tg "$L" "$r" -p 0 -n "$decode" -d "$L"
    if [ "$tiles" = 1 ] && [ "$L" = "$maxlen" ]; then
      c=${cfg_list[0]}
      run_snap "$c/notiles" "$L" "$r" "${c%%/*}" "${c#*/}" SNAP_ATTENTION_TILES=0
    fi
    echo "round $r length $L done, load $(cut -d' ' -f1-3 /proc/loadavg)"
  done
done
# peak RSS, one process each, at the largest length
if [ "$rss" = 1 ]; then
  /usr/bin/time -v "$lsimple" -m "$model" -n 16 "$(cat "$out/prompt_$maxlen.txt")" \
    > "$out/llama_simple.out" 2> "$out/llama_simple.err" || true
  record llama.cpp f16 "$maxlen" 1 rss_simple "$(rss_mib "$out/llama_simple.err")"
  record llama.cpp f16 "$maxlen" 1 simple_prompt_tokens \
    "$(sed -n 's/.*prompt eval time.*\/ *\([0-9]*\) tokens.*/\1/p' "$out/llama_simple.err" | head -1)"
  for dt in "${rss_list[@]}"; do
    for pol in full snapkv:1024; do
      grep -q "^snapserve	$dt/$pol	$maxlen	1	rss	" "$res" || run_snap "$dt/$pol" "$maxlen" 1 "$dt" "$pol" ""
    done
  done
fi
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
echo "load after: $load_after"

python3 - "$res" "$vendored" "$load_before" "$load_after" "$maxlen" "$decode" <<'EOF'
import collections, statistics, sys
res, vendored, lb, la, maxlen, decode = sys.argv[1:]
v = collections.defaultdict(list)
by_round = collections.defaultdict(dict)
for line in open(res):
    eng, cfg, L, r, metric, val = line.rstrip("\n").split("\t")
    if val:
        v[(eng, cfg, int(L), metric)].append(float(val))
        by_round[(eng, cfg, int(L), metric)][r] = float(val)
med = {k: statistics.median(x) for k, x in v.items()}
lens = sorted({k[2] for k in v})
cfgs = []
for k in v:
    if k[0] == "snapserve" and k[1] not in cfgs and k[3] == "prefill":
        cfgs.append(k[1])
def f(x, p=1): return "-" if x is None else f"{x:.{p}f}"
def n(k): return len(v.get(k, []))
print(f"\nllama.cpp {vendored} (llama-cpp-python 0.3.36 vendor), f16 KV; medians; load {lb} -> {la}")
print(f"| length | engine / config | prompt tok | prefill tok/s | x llama | decode tok/s ({decode}) | x llama | peak RSS MiB | runs |")
print("|---:|---|---:|---:|---:|---:|---:|---:|---:|")
for L in lens:
    lp, lt = med.get(("llama.cpp", "f16", L, "pp")), med.get(("llama.cpp", "f16", L, "tg"))
    print(f"| {L} | llama.cpp pp{L} / tg{decode}@d{L} | {L} | {f(lp)} | 1.00 | {f(lt, 2)} | 1.00 "
          f"| {f(med.get(('llama.cpp', 'f16', L, 'rss_pp')))} (pp) {f(med.get(('llama.cpp', 'f16', L, 'rss_tg')))} (tg) "
          f"| {n(('llama.cpp', 'f16', L, 'pp'))} |")
    for c in cfgs:
        p, d = med.get(("snapserve", c, L, "prefill")), med.get(("snapserve", c, L, "decode"))
        if p is None: continue
        pt = med.get(("snapserve", c, L, "prompt_tokens"))
        print(f"| {L} | snapserve {c} | {f(pt, 0)} | {f(p)} | {f(p / lp if lp and p else None, 2)} | {f(d, 2)} "
              f"| {f(d / lt if lt and d else None, 2)} | {f(med.get(('snapserve', c, L, 'rss')))} | {n(('snapserve', c, L, 'prefill'))} |")
L = int(maxlen)
print(f"\npeak RSS at {L} (one process each; snapserve generate --max-tokens {decode}):")
rl = med.get(("llama.cpp", "f16", L, "rss_simple"))
print(f"| process | peak RSS MiB | x llama-simple |\n|---|---:|---:|")
st = med.get(("llama.cpp", "f16", L, "simple_prompt_tokens"))
print(f"| llama-simple -n 16 ({f(st, 0)}-token prompt, f16 KV, n_ctx = prompt + 16) | {f(rl)} | 1.00 |")
print(f"| llama-bench -p {L} -n 0 (f16 KV) | {f(med.get(('llama.cpp', 'f16', L, 'rss_pp')))} | "
      f"{f(med.get(('llama.cpp', 'f16', L, 'rss_pp')) / rl if rl else None, 2)} |")
for (eng, c, LL, m), x in sorted(med.items()):
    if eng == "snapserve" and LL == L and m == "rss" and "notiles" not in c:
        print(f"| snapserve {c} | {f(x)} | {f(x / rl if rl else None, 2)} |")
nt = [k for k in med if k[1].endswith("/notiles") and k[3] == "prefill"]
for k in nt:
    with_t = by_round[("snapserve", k[1][: -len("/notiles")], k[2], "prefill")]
    pairs = [by_round[k][r] / with_t[r] for r in sorted(by_round[k]) if r in with_t and with_t[r]]
    if pairs:
        print(f"\nprefill at {k[2]}, {k[1][:-8]}: median tiles {med[('snapserve', k[1][:-8], k[2], 'prefill')]:.1f} tok/s, "
              f"SNAP_ATTENTION_TILES=0 {med[k]:.1f} tok/s; time with tiles / without, per round "
              f"{' '.join(f'{x:.2f}' for x in pairs)}, median {statistics.median(pairs):.2f}")
EOF
echo "results: $res"
