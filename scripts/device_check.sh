#!/usr/bin/env bash
# device_check.sh: the GPU checks, on a bare device machine (one H200: CUDA 13, CMake, ninja,
# Python 3.12 + numpy/torch, none of our Debian packages, no registry; ../shared/FIELD_NOTES.md).
# Builds the STANDALONE CUDA project (kernels/cuda/CMakeLists.txt: the CPU reference kernels +
# the CUDA twins + tests/cuda, needing only OpenMP, OpenBLAS and GoogleTest, brought as .debs),
# runs every CUDA test (each kernel against its CPU twin, case by case; tensor parallelism on
# one GPU in test_device_tp; NCCL's unit tests in test_comm_nccl when libnccl is there), then
# every GPU benchmark that exists (bench_cuda_*, bench_device_forward, the Hugging Face anchor
# bench/cuda/hf_decode_anchor.py, bench_device_tp: TP 1 vs TP 2 host-staged as two processes),
# and writes a summary table. The e2e device tests that
# drive the snapserve binary (test_device_serve, test_device_tp_cli, test_device_serve_tp) run
# from .device-deps/bundle.tar.xz, built on the CPU machine (scripts/device_bundle.sh), right
# after the CUDA tests; without a bundle, step 6 tries to configure the whole project here.
#
# How a GPU session runs it (the .debs are made HERE first; they are git-ignored, so carried):
#   bash scripts/device_deps.sh                      # on the CPU machine: fills .device-deps/ (.debs + bundle)
#   run(command="bash scripts/device_check.sh", carry=[".device-deps"], timeout_s=600)
# The summary is printed last and written to $OUT/device_check.txt (full log: device_check.log,
# per-case results: test_cuda_ops.xml). Exit 0 only if every test ran on a GPU and passed.
# Budget: 8 minutes in all (SNAP_DEVICE_BUDGET_S); each step gets what is left.
# Last, while time is left: compute-sanitizer (memcheck, racecheck) over the kernel tests, for
# what the kernel emulator cannot see (device memory errors, shared-memory hazards on the real
# scheduler). `device_check.sh --sanitize` builds (or reuses the warm build) and runs only that,
# with the whole budget; `device_check.sh --bench` runs only the benchmarks (step 5), for a second
# call when the first one's benchmarks were cut short (the device's build directory is kept
# between calls while the machine is warm); `device_check.sh --long` runs only the long-prompt
# check (#9's >= 1M-token goal): layer-wise prefill + SnapKV 2048 at 256K, then 1M tokens, on a
# Llama-3-8B-shaped random model with ONE of its 32 layers (the peak is the weights + one layer's
# full KV and f32 hidden states + the compressed rest whatever the layer count; the time is per
# layer, x32 for the whole model), within the budget (the 1M row runs when 256K's time x16 fits).
# Random models at real shapes are generated on the device, never carried:
#   python3 tools/make_random_model.py --shape llama3-8b --out /tmp/llama3-8b   (16 GB bf16)
set -uo pipefail
mode=all
case ${1:-} in
  "") ;;
  --sanitize) mode=sanitize ;;
  --bench) mode=bench ;;
  --long) mode=long ;;
  *) echo "usage: device_check.sh [--sanitize | --bench | --long]" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."
root=$PWD
out=${OUT:-/tmp/snap-device-out}
mkdir -p "$out"
log=$out/device_check.log
summary=$out/device_check.txt
prefix=${SNAP_DEVICE_PREFIX:-/tmp/snap-device-prefix}
build=${SNAP_DEVICE_BUILD:-$root/build-device}
budget=${SNAP_DEVICE_BUDGET_S:-480}
start=$SECONDS
: >"$log"
: >"$summary"
rows=()  # "step|verdict|detail"
status=0

note() { echo "device_check: $*" | tee -a "$log"; }
row() {
  rows+=("$1|$2|$3")
  case $2 in PASS | INFO) ;; *) status=1 ;; esac
}
left() {  # seconds left, at least 1 (`timeout 0` would mean no limit at all)
  local l=$((budget - (SECONDS - start)))
  echo $((l > 1 ? l : 1))
}
finish() {
  {
    echo "device_check summary ($(date -u '+%F %T') UTC, $((SECONDS - start)) s, host $(hostname))"
    printf '%-34s %-6s %s\n' "step" "result" "detail"
    for r in "${rows[@]}"; do
      IFS='|' read -r a b c <<<"$r"
      printf '%-34s %-6s %s\n' "$a" "$b" "$c"
    done
    [ -s "$out/bench.txt" ] && { echo; echo "benchmarks:"; cat "$out/bench.txt"; }
    echo "overall: $([ $status = 0 ] && echo PASS || echo FAIL)"
  } | tee "$summary"
  exit $status
}

# --- 1. the machine -----------------------------------------------------------------------
gpu=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -1)
note "gpu: $gpu"
if command -v nvidia-smi >/dev/null && [ -n "$gpu" ] && ! grep -qi "fail\|not found" <<<"$gpu"; then
  row "gpu" INFO "$gpu"
else
  row "gpu" FAIL "nvidia-smi: ${gpu:-absent}"
fi
row "toolchain" INFO "$(nvcc --version 2>/dev/null | grep -o 'release [0-9.]*' | head -1); cmake $(cmake --version 2>/dev/null | head -1 | awk '{print $3}'); $(${CXX:-c++} --version 2>/dev/null | head -1)"

# --- 2. dependencies: unpack the carried .debs into a prefix ---------------------------------
shopt -s nullglob
debs=("$root"/.device-deps/*.deb)
if [ ${#debs[@]} -eq 0 ]; then
  row "deps" FAIL "no .device-deps/*.deb: run scripts/device_deps.sh here and carry .device-deps"
  finish
fi
mkdir -p "$prefix"
unpack_ok=1
for d in "${debs[@]}"; do
  if command -v dpkg-deb >/dev/null; then
    dpkg-deb -x "$d" "$prefix" >>"$log" 2>&1 || unpack_ok=0
  else  # no dpkg: a .deb is an ar archive holding data.tar.{xz,zst,gz}
    member=$(ar t "$d" | grep '^data\.tar')
    case $member in
      *.xz) ar p "$d" "$member" | tar -xJ -C "$prefix" ;;
      *.zst) ar p "$d" "$member" | zstd -dc | tar -x -C "$prefix" ;;
      *) ar p "$d" "$member" | tar -xz -C "$prefix" ;;
    esac >>"$log" 2>&1 || unpack_ok=0
  fi
done
if [ $unpack_ok = 1 ]; then
  row "deps" PASS "${#debs[@]} packages unpacked into $prefix"
else
  row "deps" FAIL "unpacking failed (see $log)"
  finish
fi
export LD_LIBRARY_PATH="$prefix/usr/lib/x86_64-linux-gnu/openblas-openmp:$prefix/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# --- 3. configure + build the standalone CUDA project --------------------------------------
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
t0=$SECONDS
if ! timeout "$(left)" cmake -S kernels/cuda -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CUDA_ARCHITECTURES="${SNAP_CUDA_ARCH:-90}" -DSNAP_DEPS_PREFIX="$prefix" \
  -DSNAP_GTEST_SOURCE="$prefix/usr/src/googletest" -DPython3_EXECUTABLE="$(command -v python3)" >>"$log" 2>&1; then
  row "configure (kernels/cuda)" FAIL "see $log: $(grep -m1 -i 'error' "$log")"
  finish
fi
row "configure (kernels/cuda)" PASS "$((SECONDS - t0)) s"
t0=$SECONDS
if ! timeout "$(left)" cmake --build "$build" -j "$(nproc)" >>"$log" 2>&1; then
  row "build (kernels/cuda)" FAIL "see $log: $(grep -m1 -E 'error|FAILED' "$log")"
  finish
fi
row "build (kernels/cuda)" PASS "$((SECONDS - t0)) s"

# --- 4. the CUDA tests, case by case ---------------------------------------------------------
# run_gtest NAME COMMAND...: one GoogleTest executable (COMMAND may start with `env VAR=...`)
# under what is left of the budget, its cases counted from its XML report into the summary.
run_gtest() {
  local name=$1 t0=$SECONDS rc counts
  shift
  timeout "$(left)" "$@" --gtest_output="xml:$out/$name.xml" >>"$log" 2>&1
  rc=$?
  counts=$(python3 - "$out/$name.xml" <<'EOF' 2>/dev/null
import sys, xml.etree.ElementTree as ET
r = ET.parse(sys.argv[1]).getroot()
cases = list(r.iter("testcase"))
failed = [f"{c.get('classname').split('/')[-1]}.{c.get('name').split('/')[-1]}" for c in cases if c.find("failure") is not None]
skipped = sum(1 for c in cases if c.find("skipped") is not None)
print(f"{len(cases) - len(failed) - skipped}/{len(cases)} cases pass" + (f", {skipped} skipped" if skipped else "") +
      (f"; failed: {' '.join(failed[:8])}" if failed else ""))
EOF
  )
  case $rc in
    0) row "$name" PASS "${counts:-all cases pass}, $((SECONDS - t0)) s" ;;
    77) row "$name" SKIP "no GPU visible to the CUDA runtime (see $log)" ;;
    124) row "$name" FAIL "timed out after $((SECONDS - t0)) s" ;;
    *) row "$name" FAIL "rc $rc; ${counts:-no per-case results}" ;;
  esac
}
# compute-sanitizer over the kernel tests (each run bounded by what is left): memcheck over every
# case, racecheck (shared memory) over the kernels that share it. A hazard or error fails the row;
# a run cut by the clock reports how far it got.
run_sanitizers() {
  local san spec tool exe filter name t0 rc lim summary nrep ncase
  san=$(command -v compute-sanitizer || true)
  [ -z "$san" ] && [ -x "$cuda_root/bin/compute-sanitizer" ] && san=$cuda_root/bin/compute-sanitizer
  if [ -z "$san" ]; then
    row "compute-sanitizer" INFO "not on this machine"
    return
  fi
  local specs=("memcheck test_cuda_ops *" "racecheck test_cuda_ops *attention*:*snapkv*:*argmax*"
    "memcheck test_cuda_policies *" "racecheck test_cuda_policies *")
  local runs_left=${#specs[@]}
  for spec in "${specs[@]}"; do
    read -r tool exe filter <<<"$spec"
    runs_left=$((runs_left - 1))
    name="sanitizer $tool $exe"
    if [ ! -x "$build/$exe" ]; then
      row "$name" FAIL "$exe not built"
      continue
    fi
    if [ "$(left)" -lt 20 ]; then
      row "$name" INFO "skipped: under 20 s left"
      continue
    fi
    t0=$SECONDS
    lim=$(($(left) / (runs_left + 1)))  # an equal share of what is left to each run still to go
    timeout "$lim" "$san" --tool "$tool" --error-exitcode 99 --print-limit 20 "$build/$exe" --gtest_filter="$filter" \
      >"$out/$tool-$exe.log" 2>&1
    rc=$?
    cat "$out/$tool-$exe.log" >>"$log"
    summary=$(grep -m1 -E "ERROR SUMMARY|RACECHECK SUMMARY" "$out/$tool-$exe.log" | sed 's/^========= //')
    case $rc in
      0) row "$name" PASS "${summary:-no errors}; $((SECONDS - t0)) s" ;;
      124)
        nrep=$(grep -c '^========= .*\(Invalid\|Race\|hazard\|Error\)' "$out/$tool-$exe.log")
        ncase=$(grep -c '^\[       OK \]' "$out/$tool-$exe.log")
        if [ "$nrep" -gt 0 ]; then
          row "$name" FAIL "cut at $((SECONDS - t0)) s after $ncase cases, $nrep reports before it (see $out/$tool-$exe.log)"
        else
          row "$name" INFO "cut at $((SECONDS - t0)) s after $ncase cases, nothing reported before it"
        fi
        ;;
      77) row "$name" SKIP "no GPU visible" ;;
      *) row "$name" FAIL "rc $rc: ${summary:-see $out/$tool-$exe.log}" ;;
    esac
  done
}
cuda_root=$(dirname "$(dirname "$(command -v nvcc)")")
if [ $mode = sanitize ]; then
  run_sanitizers
  finish
fi
if [ $mode = long ]; then
  : >"$out/bench.txt"
  long_model=${SNAP_DEVICE_LONG_MODEL_DIR:-/tmp/snap-llama3-8b-1l}
  t0=$SECONDS
  if [ ! -x "$build/bench_device_forward" ]; then
    row "long prompt" FAIL "bench_device_forward was not built"
  elif [ -f "$long_model/model.safetensors" ] ||
    timeout "$(left)" python3 tools/make_random_model.py --shape llama3-8b --layers 1 --out "$long_model" >>"$log" 2>&1; then
    timeout "$(left)" "$build/bench_device_forward" --model "$long_model" --contexts "" --decode 8 \
      --layerwise-contexts 262144,1048576 --time-budget "$(($(left) > 60 ? $(left) - 30 : 30))" \
      >>"$out/bench.txt" 2>>"$log"
    rc=$?
    case $rc in
      0) row "long prompt" PASS "$((SECONDS - t0)) s incl. the 1-layer model (table below)" ;;
      77) row "long prompt" SKIP "no GPU visible" ;;
      *) row "long prompt" FAIL "rc $rc after $((SECONDS - t0)) s (see $log)" ;;
    esac
  else
    row "long prompt" FAIL "make_random_model.py --layers 1 failed or timed out (see $log)"
  fi
  finish
fi

for exe in "$build"/test_*; do  # every test executable of the standalone project
  [ $mode = all ] || break
  [ -f "$exe" ] && [ -x "$exe" ] || continue
  run_gtest "$(basename "$exe")" "$exe"
done

# --- 4b. the e2e device tests, on binaries built on the CPU machine ---------------------------
# `serve --device cuda` over HTTP; `generate`, `serve` and `batch --device cuda --tp 2` as two
# processes on this GPU (host-staged). The whole project cannot be built here, so
# scripts/device_bundle.sh (run by device_deps.sh) built snapserve and these tests for sm_90
# there and packed them with their libraries (RPATH $ORIGIN/lib). Before the benchmarks:
# correctness first.
bundle_tar=$root/.device-deps/bundle.tar.xz
bundle=/tmp/snap-device-bundle
bundle_tests=(test_device_serve test_device_tp_cli test_device_serve_tp)
bundle_ran=0
if [ $mode = bench ]; then
  row "tests" INFO "not run: --bench runs the benchmarks only"
elif [ ! -f "$bundle_tar" ]; then
  row "bundle (e2e device tests)" INFO "no .device-deps/bundle.tar.xz (scripts/device_bundle.sh); step 6 tries a full build"
else
  rm -rf "$bundle" && mkdir -p "$bundle" && tar -xJf "$bundle_tar" -C "$bundle" >>"$log" 2>&1
  # cuBLAS is opened at first use (kernels/cuda/cublas_lazy.cpp): this machine's CUDA libraries.
  bundle_env=(env "LD_LIBRARY_PATH=$cuda_root/lib64:$cuda_root/lib:${LD_LIBRARY_PATH:-}" "SNAP_TEST_SNAPSERVE=$bundle/snapserve"
    "SNAP_TEST_SOURCE_DIR=$root" "SNAP_TEST_PYTHON=$(command -v python3)")
  if ! load=$("${bundle_env[@]}" "$bundle/snapserve" --help 2>&1 >/dev/null); then
    row "bundle (e2e device tests)" FAIL "the carried snapserve does not start here: $(head -1 <<<"$load")"
  else
    row "bundle (e2e device tests)" PASS "$(ls "$bundle/lib" | wc -l) libraries carried; snapserve starts"
    bundle_ran=1
    for t in "${bundle_tests[@]}"; do
      if [ -x "$bundle/$t" ]; then
        run_gtest "$t" "${bundle_env[@]}" "$bundle/$t"
      else
        row "$t" FAIL "not in the bundle"
      fi
    done
  fi
fi

# --- 5. GPU benchmarks (bench_cuda_* targets of the standalone project) -----------------------
: >"$out/bench.txt"
nbench=0
for exe in "$build"/bench_cuda_*; do
  [ -f "$exe" ] && [ -x "$exe" ] || continue
  nbench=$((nbench + 1))
  name=$(basename "$exe")
  t0=$SECONDS
  if timeout "$(left)" "$exe" >>"$out/bench.txt" 2>>"$log"; then
    row "$name" PASS "$((SECONDS - t0)) s (table below)"
  else
    row "$name" FAIL "rc $? after $((SECONDS - t0)) s"
  fi
done
[ $nbench = 0 ] && row "benchmarks" INFO "no bench_cuda_* target exists yet"

# The device forward end to end on a Llama-3-8B-shaped random model with 4 of its 32 layers
# (3.9 GB bf16: written here in ~1 min by numpy, never carried), 8K, 32K and 128K contexts.
fwd_model=${SNAP_DEVICE_MODEL_DIR:-/tmp/snap-llama3-8b-4l}
if [ -x "$build/bench_device_forward" ] && [ "$(left)" -gt 180 ]; then
  t0=$SECONDS
  if [ -f "$fwd_model/model.safetensors" ] ||
    timeout "$(left)" python3 tools/make_random_model.py --shape llama3-8b --layers 4 --out "$fwd_model" >>"$log" 2>&1; then
    # The full-cache table at 8K, 32K and 128K while --contexts-budget lasts (each next context is
    # predicted from the last), then layer-wise prefill + SnapKV at growing prompts with about half
    # of what is left after that (rows are flushed one by one, so a prompt cut by the timeout leaves
    # the shorter ones' rows).
    # 90 s lets 32K run whatever the first context's warm-up costs (as it always ran before).
    ctx_budget=90
    lw_budget=$(($(left) > 240 + ctx_budget ? ($(left) - 120 - ctx_budget) / 2 : 30))
    if timeout "$(left)" "$build/bench_device_forward" --model "$fwd_model" --contexts 8192,32768,131072 --decode 16 \
      --contexts-budget "$ctx_budget" \
      --layerwise-contexts 65536,131072,262144,524288,1048576 --time-budget "$lw_budget" --batches 1,8,32,64 \
      >>"$out/bench.txt" 2>>"$log"; then
      row "bench_device_forward" PASS "$((SECONDS - t0)) s incl. the model (table below)"
    else
      row "bench_device_forward" FAIL "rc $? after $((SECONDS - t0)) s (see $log)"
    fi
  else
    row "bench_device_forward" FAIL "make_random_model.py failed or timed out (see $log)"
  fi
else
  row "bench_device_forward" INFO "skipped: not built or under 180 s left"
fi

# The same model with --weight-dtype q8_0 (Q8_0 on the device, 1.0625 bytes a weight): 8K only,
# decode ms/token and its HBM floor against the bf16 rows above.
if [ -x "$build/bench_device_forward" ] && [ -f "$fwd_model/model.safetensors" ] && [ "$(left)" -gt 150 ]; then
  t0=$SECONDS
  if timeout 120 "$build/bench_device_forward" --model "$fwd_model" --contexts 8192 --decode 16 --weight-dtype q8_0 \
    >>"$out/bench.txt" 2>>"$log"; then
    row "bench_device_forward q8_0" PASS "$((SECONDS - t0)) s (table below)"
  else
    row "bench_device_forward q8_0" FAIL "rc $? after $((SECONDS - t0)) s (see $log)"
  fi
else
  row "bench_device_forward q8_0" INFO "skipped: not built, no model or under 150 s left"
fi

# The side-by-side anchor (#9): the same model, prompts and decode lengths through Hugging Face
# transformers (bf16, SDPA, its full DynamicCache) on this GPU, then HF ms/token ÷ ours, full and
# snapkv 2048, from the rows bench_device_forward wrote above (its layer-wise table gives the
# snapkv row at 131072). torch and transformers are on the device machine, not carried.
if [ -f "$fwd_model/config.json" ] && [ "$(left)" -gt 60 ]; then
  t0=$SECONDS
  lim=$(($(left) > 150 ? 120 : $(left) - 30))
  cp "$out/bench.txt" "$out/bench_ours.txt"
  timeout "$lim" python3 bench/cuda/hf_decode_anchor.py --model "$fwd_model" --contexts 8192,32768,131072 \
    --decode 16 --time-budget $((lim > 75 ? lim - 45 : 30)) --ours "$out/bench_ours.txt" >>"$out/bench.txt" 2>>"$log"
  rc=$?
  case $rc in
    0) row "hf_decode_anchor" PASS "$((SECONDS - t0)) s: HF transformers full cache vs ours (table below)" ;;
    77) row "hf_decode_anchor" INFO "torch/transformers or a GPU missing for python3 (see $log)" ;;
    *) row "hf_decode_anchor" FAIL "rc $rc after $((SECONDS - t0)) s (see $log)" ;;
  esac
else
  row "hf_decode_anchor" INFO "skipped: no model or under 60 s left"
fi

# Tensor parallelism on one GPU: TP = 1 against TP = 2 as two processes sharing the GPU through
# the host-staged exchange (TCP between them; NCCL refuses two ranks on one device), the same
# 4-layer Llama-3-8B-shaped model, a 32K prompt: what the exchange costs in prefill and decode.
if [ -x "$build/bench_device_tp" ] && [ -f "$fwd_model/model.safetensors" ] && [ "$(left)" -gt 90 ]; then
  t0=$SECONDS
  port=$((29700 + RANDOM % 200))
  tp_args=(--model "$fwd_model" --context 32768 --decode 32 --device 0)
  tp_ok=1
  timeout "$(left)" "$build/bench_device_tp" "${tp_args[@]}" --rank 0 --world-size 1 --leader "127.0.0.1:$port" \
    >>"$out/bench.txt" 2>>"$log" || tp_ok=0
  if [ $tp_ok = 1 ]; then
    lim=$(left)
    timeout "$lim" "$build/bench_device_tp" "${tp_args[@]}" --rank 1 --world-size 2 --leader "127.0.0.1:$((port + 2))" \
      2>>"$log" &
    worker=$!
    timeout "$lim" "$build/bench_device_tp" "${tp_args[@]}" --rank 0 --world-size 2 --leader "127.0.0.1:$((port + 2))" \
      >>"$out/bench.txt" 2>>"$log" || tp_ok=0
    wait $worker || tp_ok=0
  fi
  if [ $tp_ok = 1 ]; then
    row "bench_device_tp" PASS "$((SECONDS - t0)) s: tp 1 vs tp 2 host-staged on one GPU (table below)"
  else
    row "bench_device_tp" FAIL "after $((SECONDS - t0)) s (see $log)"
  fi
else
  row "bench_device_tp" INFO "skipped: not built, no model, or under 90 s left"
fi

[ $mode = bench ] && finish

# --- 6. full-project CUDA targets, only where the whole project configures --------------------
# The bare machine lacks MPI, Boost, prometheus-cpp, ... so this normally reports why it is
# skipped (not a failure of the CUDA code); on a fully provisioned GPU host it runs them:
# NCCL, `serve --device cuda` over HTTP and `generate --device cuda --tp 2` as two processes
# and `serve --device cuda --tp 2` (test_device_serve, test_device_tp_cli and
# test_device_serve_tp need the server and snapserve).
full=${build}-full
if [ $bundle_ran = 1 ]; then
  row "full project" INFO "not needed: the bundle ran test_device_serve, test_device_tp_cli, test_device_serve_tp"
elif [ "$(left)" -gt 60 ] && timeout 60 cmake -S . -B "$full" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CUDA_ARCHITECTURES="${SNAP_CUDA_ARCH:-90}" -DSNAP_BUILD_BENCH=OFF >"$out/full_configure.log" 2>&1; then
  for t in test_comm_nccl test_device_serve test_device_tp_cli test_device_serve_tp; do
    if timeout "$(left)" cmake --build "$full" -j "$(nproc)" --target "$t" >>"$log" 2>&1; then
      timeout "$(left)" "$(find "$full" -type f -name "$t" -perm -u+x | head -1)" >>"$log" 2>&1
      rc=$?
      case $rc in 0) row "$t" PASS "" ;; 77) row "$t" SKIP "no GPU" ;; *) row "$t" FAIL "rc $rc" ;; esac
    else
      row "$t" FAIL "build failed (see $log)"
    fi
  done
else
  why=$(grep -m1 -i -E "could not find|not found|no package" "$out/full_configure.log" 2>/dev/null | sed 's/^ *//')
  row "full project (test_comm_nccl, test_device_serve, test_device_tp_cli, test_device_serve_tp)" INFO "not configurable here: ${why:-no time left}"
fi

# --- 7. compute-sanitizer, with what is left (all of the budget under --sanitize) -------------
if [ "$(left)" -gt 60 ]; then
  run_sanitizers
else
  row "compute-sanitizer" INFO "skipped: under 60 s left (device_check.sh --sanitize runs only this)"
fi
finish
