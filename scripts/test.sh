#!/usr/bin/env bash
# The whole test suite: set-up (idempotent), every ctest test of the Release build, then
# every unit test that starts no MPI ranks again under AddressSanitizer + UBSan, and the
# engine's concurrency tests under ThreadSanitizer.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh

export SNAP_MODEL=${SNAP_MODEL:-${SNAP_CACHE:-$HOME/.cache/snapserve}/SmolLM2-135M-Instruct.Q4_1.gguf}
build=${SNAP_BUILD:-build}
status=0
ctest --test-dir "$build" --output-on-failure -j 2 || status=1

# Every unit test that starts no MPI ranks (tests/kernels, tests/worker, tests/coordinator,
# the in-process and TCP communicator tests, the fuzz corpora) again under AddressSanitizer
# + UBSan (Debug: an optimised sanitizer build took over 20 min on 2 cores).
echo "test: unit tests under AddressSanitizer + UBSan" >&2
asan=${build}-asan
cuda_off=(-DSNAP_ENABLE_CUDA=OFF -DSNAP_BUILD_BENCH=OFF)
cmake -S . -B "$asan" -DCMAKE_BUILD_TYPE=Debug -DSNAP_SANITIZE=ON "${cuda_off[@]}" >/dev/null
asan_tests=(test_comm_local test_comm_tcp)
# test_engine runs SmolLM2 for minutes; its threads are covered here on a tiny model by
# test_engine_threads (and under ThreadSanitizer below).
for src in tests/kernels/test_*.cpp tests/worker/test_*.cpp tests/coordinator/test_*.cpp; do
  t=$(basename "$src" .cpp)
  [ "$t" = test_engine ] || asan_tests+=("$t")
done
replays=()
for src in fuzz/fuzz_*.cpp; do n=$(basename "$src" .cpp); replays+=("replay_${n#fuzz_}"); done
cmake --build "$asan" -j "$(nproc)" --target "${asan_tests[@]}" "${replays[@]}"
ASAN_OPTIONS=detect_leaks=1 ctest --test-dir "$asan" --output-on-failure -j 2 \
  -R "^($(IFS='|'; echo "${asan_tests[*]}")|fuzz_replay_.*)\$" || status=1

# The engine's threads (the scheduler; clients submitting, cancelling and polling stats;
# a shutdown racing submits) under ThreadSanitizer, on a tiny random model so that it runs
# in seconds. One OpenMP thread: libgomp is not instrumented, its barriers would read as races.
echo "test: engine threads under ThreadSanitizer" >&2
tsan=${build}-tsan
cmake -S . -B "$tsan" -DCMAKE_BUILD_TYPE=Debug -DSNAP_SANITIZE_THREAD=ON "${cuda_off[@]}" >/dev/null
cmake --build "$tsan" -j "$(nproc)" --target test_engine_threads
# (The binary itself, not through ctest, whose test environment sets 2 OpenMP threads.)
OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" \
  "$tsan/tests/test_engine_threads" || status=1
exit $status
