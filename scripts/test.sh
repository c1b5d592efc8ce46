#!/usr/bin/env bash
# The whole test suite: set-up (idempotent), every ctest test of the Release build, then
# every unit test and the e2e tests that start no MPI ranks again under AddressSanitizer +
# UBSan, and the engine's concurrency tests under ThreadSanitizer.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh

export SNAP_MODEL=${SNAP_MODEL:-${SNAP_CACHE:-$HOME/.cache/snapserve}/SmolLM2-135M-Instruct.Q4_1.gguf}
build=${SNAP_BUILD:-build}
status=0
ctest --test-dir "$build" --output-on-failure -j 2 || status=1

# Every unit test that starts no MPI ranks (tests/kernels, tests/worker, tests/coordinator,
# tests/eval_scoring, the in-process and TCP communicator tests, the fuzz corpora) again
# under AddressSanitizer + UBSan (Debug: an optimised sanitizer build took over 20 min on 2
# cores).
echo "test: unit tests under AddressSanitizer + UBSan" >&2
asan=${build}-asan
cuda_off=(-DSNAP_ENABLE_CUDA=OFF -DSNAP_BUILD_BENCH=OFF)
cmake -S . -B "$asan" -DCMAKE_BUILD_TYPE=Debug -DSNAP_SANITIZE=ON "${cuda_off[@]}" >/dev/null
asan_tests=(test_comm_local test_comm_tcp test_eval_tasks)
# test_engine runs SmolLM2 for minutes; its threads are covered here on a tiny model by
# test_engine_threads (and under ThreadSanitizer below). test_eval_toxicity_cli generates
# with SmolLM2 for over a minute in Release.
for src in tests/kernels/test_*.cpp tests/worker/test_*.cpp tests/coordinator/test_*.cpp \
           tests/eval_scoring/test_*.cpp; do
  t=$(basename "$src" .cpp)
  case $t in test_engine|test_eval_toxicity_cli) ;; *) asan_tests+=("$t") ;; esac
done
# e2e tests that start no MPI ranks: the snapserve binary itself (built here; its kernels
# stay optimised, see CMakeLists.txt) runs under ASan + UBSan as generate, serve and batch
# processes driven over real HTTP and files. Measured under ASan on 2 busy cores: these five
# 4-73 s each; all of test_server ~20 min and test_batch ~10 min, so those two run their
# hostile-input, disconnect and shutdown cases only (below).
asan_tests+=(test_cli test_golden test_kv_policies test_prefill_memory test_prometheus)
asan_server_cases='Server.HealthModelsAndMetricsAnswer:Server.BadInputs*:Server.Disconnect*'
asan_server_cases+=':ServerLimits.ModelByIdHeadOptionsAndCors:ServerLimits.TimeoutIsVisibleAsSuch'
asan_server_cases+=':ServerLimits.SigtermStopsWithinTheDeadline'
asan_batch_cases='Batch.EveryLineGetsOneRecordAndBadLinesNameTheirLine:Batch.BadFlagsEndWithOneLine'
replays=()
for src in fuzz/fuzz_*.cpp; do n=$(basename "$src" .cpp); replays+=("replay_${n#fuzz_}"); done
cmake --build "$asan" -j "$(nproc)" --target snapserve test_server test_batch "${asan_tests[@]}" "${replays[@]}"
# UBSan halts too, so that a finding fails the test (in the snapserve children as well).
export ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
ctest --test-dir "$asan" --output-on-failure -j 2 \
  -R "^($(IFS='|'; echo "${asan_tests[*]}")|fuzz_replay_.*)\$" || status=1
OMP_NUM_THREADS=2 OMP_WAIT_POLICY=PASSIVE "$asan/tests/test_server" --gtest_filter="$asan_server_cases" || status=1
OMP_NUM_THREADS=2 OMP_WAIT_POLICY=PASSIVE "$asan/tests/test_batch" --gtest_filter="$asan_batch_cases" || status=1
unset ASAN_OPTIONS UBSAN_OPTIONS

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
