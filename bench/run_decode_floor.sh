#!/usr/bin/env bash
# Decode speed against the memory-bandwidth floor, idle and with one busy competitor.
# For every model × thread count × matvec mode (f32act, q8act, q16act, q16x2act, q8x3act; MODE+rows keeps the weights in
# row-major blocks, SNAP_WEIGHT_TILES=0, where q8x3act would read its 4-row tiles) × OpenMP wait policy (spin = libgomp's
# default, spin:N = GOMP_SPINCOUNT=N, passive; snapserve's --threads-wait picks one) × competitor (none, one `yes`
# pinned to the same cores), runs build*/bench/bench_generate (prompt 512, greedy decode) and
# prints: model, weight type, threads, matvec, wait, competitor, decode tok/s, bytes read per token
# (weights + KV), GB/s achieved, and the ratio to the floor (bytes / measured triad bandwidth).
# The configurations run interleaved, round after round, and the medians are printed, so a
# noisy machine shifts them alike. Not a test.
#   bench/run_decode_floor.sh [--build DIR] [--rounds 3] [--decode 32] [--prompt 512]
#       [--threads 2[,1]] [--models A.gguf,B.gguf] [--acts f32act,q8act,q16act,q16x2act,q8x3act] [--waits spin,passive]
#       [--competitors 0,1]
set -euo pipefail

build=build rounds=3 decode=32 prompt=512 threads=2
models="${SNAP_MODEL:-$HOME/.cache/snapserve/SmolLM2-135M-Instruct.Q4_1.gguf}"
acts=f32act,q8act,q16act,q16x2act,q8x3act waits=spin,passive competitors=0,1
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2 ;;
    --rounds) rounds=$2 ;;
    --decode) decode=$2 ;;
    --prompt) prompt=$2 ;;
    --threads) threads=$2 ;;
    --models) models=$2 ;;
    --acts) acts=$2 ;;
    --waits) waits=$2 ;;
    --competitors) competitors=$2 ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "run_decode_floor.sh: unknown flag $1 (see --help)" >&2; exit 2 ;;
  esac
  shift 2
done
bench="$build/bench/bench_generate"
[ -x "$bench" ] || { echo "run_decode_floor.sh: $bench not built (cmake -DSNAP_BUILD_BENCH=ON, target bench_generate)" >&2; exit 2; }
cores="0-$(($(nproc) - 1))"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

wait_env() {  # the environment a wait mode means (kernels/thread_wait.h)
  case "$1" in
    spin) echo "" ;;
    spin:[0-9]*) echo "GOMP_SPINCOUNT=${1#spin:}" ;;
    passive) echo "OMP_WAIT_POLICY=PASSIVE" ;;
    *) echo "run_decode_floor.sh: unknown wait mode $1" >&2; exit 2 ;;
  esac
}

echo "load before: $(cut -d' ' -f1-3 /proc/loadavg), cores $cores, threads $threads, rounds $rounds"
IFS=, read -r -a thread_list <<< "$threads"
IFS=, read -r -a model_list <<< "$models"
IFS=, read -r -a act_list <<< "$acts"
IFS=, read -r -a wait_list <<< "$waits"
IFS=, read -r -a comp_list <<< "$competitors"
for ((r = 1; r <= rounds; r++)); do
  for m in "${!model_list[@]}"; do
   for th in "${thread_list[@]}"; do
    for act in "${act_list[@]}"; do
      for w in "${wait_list[@]}"; do
        for c in "${comp_list[@]}"; do
          comp_pid=""
          if [ "$c" != 0 ]; then
            for ((k = 0; k < c; k++)); do taskset -c "$cores" yes > /dev/null & comp_pid="$comp_pid $!"; done
          fi
          key="$m.$th.$act.$w.$c"
          # shellcheck disable=SC2046
          env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT $(wait_env "$w") SNAP_MATVEC="${act%+rows}" \
            SNAP_WEIGHT_TILES="$([ "${act%+rows}" = "$act" ] && echo 1 || echo 0)" \
            taskset -c "$cores" "$bench" --model "${model_list[$m]}" --lengths "$prompt" --decode "$decode" \
            --threads "$th" > "$out/$key.$r" 2>&1 || echo "failed: $key round $r" >&2
          [ -z "$comp_pid" ] || { kill $comp_pid; wait $comp_pid 2>/dev/null || true; }
        done
      done
    done
   done
  done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"

printf "%-28s %-9s %7s %-12s %-7s %-10s %9s %10s %8s %9s\n" model weights threads matvec wait competitor tok/s MiB/token GB/s x_floor
for m in "${!model_list[@]}"; do
 for th in "${thread_list[@]}"; do
  for act in "${act_list[@]}"; do
    for w in "${wait_list[@]}"; do
      for c in "${comp_list[@]}"; do
        key="$m.$th.$act.$w.$c"
        # per round: weights type, decode ms, floor ms, bandwidth GB/s, model name
        cat "$out/$key".* | awk -v model="$(basename "${model_list[$m]}" .gguf)" -v th="$th" -v act="$act" -v w="$w" -v c="$c" '
          /^model / { wt = ""; for (i = 1; i <= NF; i++) { if ($i == "weights" && wt == "") wt = $(i + 1); if ($i == "bandwidth") bw = $(i + 1) } }
          $1 == "full" { n++; ms[n] = $4; fl[n] = $6; b[n] = bw }
          END {
            if (n == 0) { printf "%-28s no result\n", model; exit }
            for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (ms[j] < ms[i]) { t = ms[i]; ms[i] = ms[j]; ms[j] = t; t = fl[i]; fl[i] = fl[j]; fl[j] = t; t = b[i]; b[i] = b[j]; b[j] = t }
            k = int((n + 1) / 2); sub(/,$/, "", wt)
            bytes = fl[k] / 1e3 * b[k] * 1e9
            printf "%-28s %-9s %7s %-12s %-7s %-10s %9.1f %10.1f %8.1f %9.2f\n", model, wt, th, act, w, (c == 0 ? "none" : c " busy"),
                   1e3 / ms[k], bytes / 1048576, bytes / (ms[k] / 1e3) / 1e9, ms[k] / fl[k]
          }'
      done
    done
  done
 done
done
