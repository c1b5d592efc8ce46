#!/usr/bin/env bash
# The whole test suite: set-up (idempotent), every ctest test of the Release build, then
# every unit test and the e2e tests that start no MPI ranks again under AddressSanitizer +
# UBSan, the CUDA kernels on the kernel emulator under the same, and the engine's concurrency
# tests under ThreadSanitizer.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh

export SNAP_MODEL=${SNAP_MODEL:-${SNAP_CACHE:-$HOME/.cache/snapserve}/SmolLM2-135M-Instruct.Q4_1.gguf}
build=${SNAP_BUILD:-build}
status=0
ctest --test-dir "$build" --output-on-failure -j 2 || status=1

# The tests that start no MPI ranks, again under AddressSanitizer + UBSan (Debug: an
# optimised sanitizer build took over 20 min on 2 cores): the unit tests (tests/kernels,
# tests/worker, tests/coordinator, tests/eval_scoring, the in-process and TCP communicator
# tests, the fuzz corpora) and the e2e tests (tests/e2e, tests/gemma3, tests/matvec_act,
# tests/eval_longctx, tests/random_model, tests/device). Left out: the tests that start MPI
# ranks (tests/tp, test_comm_mpi*, test_comm_fault, the Slurm and deploy tests) and the CUDA
# ones (not built here). What this stage costs is in the README (Tests).
# - In-process tests are built here: the code they call is instrumented, except that the
#   model links the kernels uninstrumented (snap_kernels_e2e, see CMakeLists.txt); the kernel
#   tests themselves link the instrumented kernels.
# - The e2e drivers (a test that calls snapserve_binary(), tests/snapserve_binary.h) run from
#   the Release build against this build's snapserve: the serve, batch, generate and eval
#   processes under test are the instrumented ones, and the drivers are not rebuilt here.
echo "test: the tests without MPI ranks under AddressSanitizer + UBSan" >&2
asan=${build}-asan
cuda_off=(-DSNAP_ENABLE_CUDA=OFF -DSNAP_BUILD_BENCH=OFF)
cmake -S . -B "$asan" -DCMAKE_BUILD_TYPE=Debug -DSNAP_SANITIZE=ON "${cuda_off[@]}" >/dev/null
asan_tests=(test_comm_local test_comm_tcp)
drivers=()
for src in tests/{kernels,worker,coordinator,eval_scoring,e2e,gemma3,matvec_act,eval_longctx,random_model,device}/test_*.cpp; do
  t=$(basename "$src" .cpp)
  # test_device_cli expects what its own build has (CUDA or not), so it is built here too.
  if grep -q 'snapserve_binary()' "$src" && ! grep -q SNAP_TEST_BUILD_HAS_CUDA "$src"; then
    drivers+=("$t")
  else
    asan_tests+=("$t")
  fi
done
replays=()
for src in fuzz/fuzz_*.cpp; do n=$(basename "$src" .cpp); replays+=("replay_${n#fuzz_}"); done
cmake --build "$asan" -j "$(nproc)" --target snapserve "${asan_tests[@]}" "${replays[@]}"
# UBSan halts too, so that a finding fails the test (in the snapserve children as well).
export ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
asan_start=$SECONDS
ctest --test-dir "$asan" --output-on-failure -j 2 \
  -R "^($(IFS='|'; echo "${asan_tests[*]}")|fuzz_replay_.*)\$" || status=1
SNAP_TEST_SNAPSERVE=$(cd "$asan" && pwd)/snapserve ctest --test-dir "$build" --output-on-failure -j 2 \
  -R "^($(IFS='|'; echo "${drivers[*]}"))\$" || status=1
echo "test: the ASan + UBSan tests took $((SECONDS - asan_start)) s" >&2

# The CUDA kernels on the kernel emulator (kernels/cuda/emu) under ASan + UBSan, when this
# machine has nvcc (the emulator is part of the CUDA build): the op and policy tables and the
# emulator's own test. Every kernel's global and shared memory accesses are checked, as
# compute-sanitizer's memcheck would on a GPU. Only these targets are built (~1.5 min).
if [ -f "$build/kernels/cuda/emu/test_cuda_ops_emu" ]; then
  echo "test: the CUDA kernels on the kernel emulator under AddressSanitizer + UBSan" >&2
  emu_asan=${build}-emu-asan
  emu_tests=(test_kernel_emulator test_cuda_ops_emu test_cuda_policies_emu)
  emu_start=$SECONDS
  cmake -S . -B "$emu_asan" -DCMAKE_BUILD_TYPE=Debug -DSNAP_SANITIZE=ON -DSNAP_BUILD_BENCH=OFF >/dev/null
  cmake --build "$emu_asan" -j "$(nproc)" --target "${emu_tests[@]}"
  ctest --test-dir "$emu_asan" --output-on-failure -j 2 -R "^($(IFS='|'; echo "${emu_tests[*]}"))\$" || status=1
  echo "test: the emulated kernels under ASan + UBSan took $((SECONDS - emu_start)) s" >&2
fi
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
