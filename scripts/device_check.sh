#!/usr/bin/env bash
# device_check.sh: the GPU checks, on a bare device machine (one H200, see
# ../shared/FIELD_NOTES.md): configure with CUDA, build every CUDA target, run the CUDA tests
# (each compares its kernel with the CPU twin) and print nvidia-smi. Meant for the device
# tool: `bash scripts/device_check.sh` from the repository root, in well under 8 minutes.
# Writes a summary to $OUT/device_check.txt when $OUT is set. Exit 1 if a test fails.
set -uo pipefail
cd "$(dirname "$0")/.."
build=${SNAP_DEVICE_BUILD:-build-device}
out=${OUT:-/tmp}
log=$out/device_check.txt
: >"$log"
say() { echo "$*" | tee -a "$log"; }

say "device_check: $(date -u '+%F %T') on $(hostname)"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | tee -a "$log"
# Only what the CUDA targets need (no model download): the CPU build's packages come from setup.sh.
if ! cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DSNAP_ENABLE_CUDA=ON -DSNAP_BUILD_BENCH=OFF >>"$log" 2>&1; then
  say "device_check: configure failed (see $log)"; exit 1
fi
grep -q "CUDA targets ON" "$log" || { say "device_check: nvcc not found, no CUDA targets"; exit 1; }
targets=(test_cuda_ops test_comm_nccl)
if ! cmake --build "$build" -j "$(nproc)" --target "${targets[@]}" >>"$log" 2>&1; then
  say "device_check: build failed (see $log)"; exit 1
fi
status=0
for t in "${targets[@]}"; do
  exe=$(find "$build" -type f -name "$t" -perm -u+x | head -1)
  start=$SECONDS
  timeout 300 "$exe" >>"$log" 2>&1
  rc=$?
  case $rc in
    0) verdict=PASS ;;
    77) verdict="SKIP (no GPU visible)" ; status=1 ;;
    *) verdict="FAIL (rc $rc)"; status=1 ;;
  esac
  say "device_check: $t: $verdict in $((SECONDS - start)) s"
done
exit $status
