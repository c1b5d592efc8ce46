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

# The tests that start no MPI ranks, again under AddressSanitizer + UBSan (Debug: an
# optimised sanitizer build took over 20 min on 2 cores), all but the six slowest (below):
# the unit tests (tests/kernels, tests/worker, tests/coordinator, tests/eval_scoring, the
# in-process and TCP communicator tests, the fuzz corpora) and the e2e tests (tests/e2e, tests/gemma3, tests/matvec_act,
# tests/eval_longctx, tests/random_model, tests/device), which run the snapserve binary built
# here (its kernels stay optimised, see CMakeLists.txt) as generate, serve, batch and eval
# processes driven over real HTTP and files. Left out: the tests that start MPI ranks
# (tests/tp, test_comm_mpi*, test_comm_fault, the Slurm and deploy tests) and the CUDA ones
# (not built here). What this stage costs is in the README (Tests).
echo "test: the tests without MPI ranks under AddressSanitizer + UBSan" >&2
asan=${build}-asan
cuda_off=(-DSNAP_ENABLE_CUDA=OFF -DSNAP_BUILD_BENCH=OFF)
cmake -S . -B "$asan" -DCMAKE_BUILD_TYPE=Debug -DSNAP_SANITIZE=ON "${cuda_off[@]}" >/dev/null
asan_tests=(test_comm_local test_comm_tcp)
# Not yet here, for CI's time (ASan ctest -j 2 on this machine at load ~3.4, 2026-12-01):
# test_engine 500 s, test_batch 369 s, test_kv_dtype 206 s, test_server, test_eval_e2e and
# test_eval_toxicity_cli; test_server and test_batch run their hostile-input, disconnect and
# shutdown cases below.
asan_slow='test_engine|test_batch|test_kv_dtype|test_server|test_eval_e2e|test_eval_toxicity_cli'
for src in tests/{kernels,worker,coordinator,eval_scoring,e2e,gemma3,matvec_act,eval_longctx,random_model,device}/test_*.cpp; do
  t=$(basename "$src" .cpp)
  [[ $t =~ ^($asan_slow)$ ]] || asan_tests+=("$t")
done
asan_server_cases='Server.HealthModelsAndMetricsAnswer:Server.BadInputs*:Server.Disconnect*'
asan_server_cases+=':ServerLimits.ModelByIdHeadOptionsAndCors:ServerLimits.TimeoutIsVisibleAsSuch'
asan_server_cases+=':ServerLimits.SigtermStopsWithinTheDeadline'
asan_batch_cases='Batch.EveryLineGetsOneRecordAndBadLinesNameTheirLine:Batch.BadFlagsEndWithOneLine'
replays=()
for src in fuzz/fuzz_*.cpp; do n=$(basename "$src" .cpp); replays+=("replay_${n#fuzz_}"); done
cmake --build "$asan" -j "$(nproc)" --target snapserve test_server test_batch "${asan_tests[@]}" "${replays[@]}"
# UBSan halts too, so that a finding fails the test (in the snapserve children as well).
export ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
asan_start=$SECONDS
ctest --test-dir "$asan" --output-on-failure -j 2 \
  -R "^($(IFS='|'; echo "${asan_tests[*]}")|fuzz_replay_.*)\$" || status=1
OMP_NUM_THREADS=2 OMP_WAIT_POLICY=PASSIVE "$asan/tests/test_server" --gtest_filter="$asan_server_cases" || status=1
OMP_NUM_THREADS=2 OMP_WAIT_POLICY=PASSIVE "$asan/tests/test_batch" --gtest_filter="$asan_batch_cases" || status=1
echo "test: the ASan + UBSan tests took $((SECONDS - asan_start)) s" >&2
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
