#!/usr/bin/env bash
# The device benchmarks' code paths on the kernel emulator (CTest bench_device_smoke_emu): what
# scripts/device_check.sh runs on the GPU, here on a tiny random Llama-3 model, so that a
# benchmark that crashes, refuses its own arguments or prints a malformed table is found in
# CI rather than in a scarce GPU session. Its figures mean nothing here (emulated kernels);
# only the exchange's byte counts, which do not depend on the hardware, are checked exactly.
#   usage: bench_smoke.sh EMU_BUILD_DIR PYTHON SOURCE_DIR
set -euo pipefail
bin=$1 python=$2 src=$3
tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() {
  echo "bench_smoke: $*" >&2
  exit 1
}
# tiny-llama3: 2 layers, hidden 192, 6 query / 2 KV heads (head_dim 32), vocab 1000.
"$python" "$src/tools/make_random_model.py" --shape tiny-llama3 --out "$tmp/model" >/dev/null

# bench_device_forward: prefill + decode (full, snapkv), the generator, layer-wise prefill.
# --contexts-budget: 96 runs, then 100000 is predicted ~10^6 times as long and must be skipped
# (and left out of the generator's table).
"$bin/bench_device_forward_emu" --model "$tmp/model" --contexts 100000,96 --contexts-budget 600 --decode 2 \
  --layerwise-contexts 160 --time-budget 120 --batches 1,3 --batch-prompt 40 >"$tmp/fwd.txt" 2>&1 ||
  { cat "$tmp/fwd.txt"; fail "bench_device_forward exited $?"; }
cat "$tmp/fwd.txt"
grep -Eq '^  96 +[0-9]+ +[0-9.]+ +[0-9.]+ ' "$tmp/fwd.txt" || fail "no prefill/decode row for context 96"
grep -Eq '^  96 +[0-9.]+ +[0-9.]+ +[0-9.]+$' "$tmp/fwd.txt" || fail "no generator row for context 96"
grep -Eq '^  100000 +skipped: .*--contexts-budget' "$tmp/fwd.txt" || fail "context 100000 should be skipped by --contexts-budget"
[ "$(grep -Ec '^  100000 ' "$tmp/fwd.txt")" = 1 ] || fail "context 100000 must appear once (skipped), in no table"
grep -Eq '^  160 +[0-9]+ ' "$tmp/fwd.txt" || fail "no layer-wise prefill row for prompt 160"
# Continuous batching (--batches 1,3): a row per batch size, both step times, the ratio, tok/s, floor.
for b in 1 3; do
  grep -Eq "^  $b +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9]+ +[0-9.]+\$" "$tmp/fwd.txt" || fail "no continuous-batching row for B = $b"
done

# device_check.sh --long's invocation: no context table (--contexts ""), the layer-wise ladder only.
"$bin/bench_device_forward_emu" --model "$tmp/model" --contexts "" --decode 2 --layerwise-contexts 160 \
  --time-budget 120 >"$tmp/long.txt" 2>&1 || { cat "$tmp/long.txt"; fail "bench_device_forward --contexts '' exited $?"; }
grep -Eq '^  160 +[0-9]+ ' "$tmp/long.txt" || { cat "$tmp/long.txt"; fail "no layer-wise row for 160 without a context table"; }

# The Hugging Face anchor on the CPU, its ratio table read from the rows above (exit 77: this
# python has no torch/transformers, as in CI; its arguments and the model are checked first).
rc=0
"$python" "$src/bench/cuda/hf_decode_anchor.py" --model "$tmp/model" --contexts 96 --decode 2 --device cpu \
  --ours "$tmp/fwd.txt" >"$tmp/hf.txt" 2>&1 || rc=$?
cat "$tmp/hf.txt"
case $rc in
  0) grep -Eq '^  96 +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+$' "$tmp/hf.txt" || fail "no HF/ours ratio row for 96" ;;
  77) grep -q "nothing measured" "$tmp/hf.txt" || fail "hf_decode_anchor exited 77 without saying why" ;;
  *) fail "hf_decode_anchor exited $rc" ;;
esac

# bench_device_tp: TP 1, then TP 2 as two processes (host-staged exchange over TCP).
port=$((20000 + RANDOM % 20000))
"$bin/bench_device_tp_emu" --model "$tmp/model" --rank 0 --world-size 1 --leader "127.0.0.1:$port" --context 96 \
  --decode 2 >"$tmp/tp1.txt" 2>&1 || { cat "$tmp/tp1.txt"; fail "bench_device_tp at tp 1 exited $?"; }
"$bin/bench_device_tp_emu" --model "$tmp/model" --rank 1 --world-size 2 --leader "127.0.0.1:$((port + 2))" \
  --context 96 --decode 2 >"$tmp/tp2_rank1.txt" 2>&1 &
pids+=($!)
"$bin/bench_device_tp_emu" --model "$tmp/model" --rank 0 --world-size 2 --leader "127.0.0.1:$((port + 2))" \
  --context 96 --decode 2 >"$tmp/tp2.txt" 2>&1 || { cat "$tmp/tp2.txt" "$tmp/tp2_rank1.txt"; fail "bench_device_tp at tp 2 exited $?"; }
wait "${pids[0]}" || { cat "$tmp/tp2_rank1.txt"; fail "bench_device_tp rank 1 exited $?"; }
pids=()
cat "$tmp/tp1.txt" "$tmp/tp2.txt"
grep -q 'tp 1 (no exchange).*all_reduce 0 B + all_gather 0 B payload per token' "$tmp/tp1.txt" ||
  fail "tp 1 should exchange nothing"
# Per decoded token: 2 layers x 2 all-reduces (after o_proj and down_proj) x hidden 192 x 4 bytes,
# and the vocab-parallel LM head's gather of this rank's 500 logits x 4 bytes.
grep -q 'tp 2 (host exchange).*all_reduce 3072 B + all_gather 2000 B payload per token' "$tmp/tp2.txt" ||
  fail "tp 2's exchange bytes per token are not 3072 + 2000"
echo "bench_smoke: ok"
