#!/usr/bin/env bash
# The whole test suite: set-up (idempotent), every ctest test of the Release build, then
# every unit test and the e2e tests that start no MPI ranks again under AddressSanitizer +
# UBSan, the CUDA kernels on the kernel emulator under the same, and the engine's concurrency
# tests under ThreadSanitizer.
set -euo pipefail
cd "$(dirname "$0")/.."
# Each stage's wall time, printed together at the end (CI's time budget is spent here).
stage_times=()
stage_start=$SECONDS
stage() {  # stage "what just finished"
  stage_times+=("$(printf '%5d s  %s' $((SECONDS - stage_start)) "$1")")
  stage_start=$SECONDS
}
bash scripts/setup.sh
stage "set-up and the Release build (scripts/setup.sh)"

export SNAP_MODEL=${SNAP_MODEL:-${SNAP_CACHE:-$HOME/.cache/snapserve}/SmolLM2-135M-Instruct.Q4_1.gguf}
build=${SNAP_BUILD:-build}
status=0
# A fresh checkout's ctest has no timings of its own, so it started the tests in the order they
# are declared: the long ones that take the "cores" lock (MPI, Slurm, Kubernetes, Grafana: ~260 s,
# test_slurm_batch mostly waiting on Slurm) then ran one after another at the end with the other
# slot idle. Seeded with a CI run's times it starts the longest first, as it does on a machine
# that has run the suite before (ctest updates the file after each run).
costs="$build/Testing/Temporary/CTestCostData.txt"
[ -f "$costs" ] || { mkdir -p "$(dirname "$costs")" && cp tests/ctest_cost_data.txt "$costs"; }
# The emulated kernel tables in the launch-order schedule run once, in the emulator's ASan + UBSan
# stage below (the same runs with every memory access checked), not here too; their
# reverse-order runs (*_emu_reverse) stay here. Without nvcc there is no emulator build.
skip_here=()
[ -f "$build/kernels/cuda/emu/test_cuda_ops_emu" ] && skip_here=(-E '^(test_cuda_ops_emu|test_cuda_policies_emu|test_kernel_emulator)$')
ctest --test-dir "$build" --output-on-failure -j 2 "${skip_here[@]}" || status=1
stage "the Release tests"

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
# The sanitizer builds compile faster with line tables only (-g1: the reports' stack traces
# keep their files and lines) and the libraries in unity batches (SNAP_UNITY, CMakeLists.txt).
debug_fast=(-DCMAKE_CXX_FLAGS_DEBUG=-g1 -DSNAP_UNITY=ON)
# The emulator's sanitizer build below compiles the CPU kernels, the model's loaders and comm/
# with the flags this one uses: through ccache it takes those objects from here instead of
# compiling them again. NOHASHDIR: the two builds are in different directories. The cache is
# $build-ccache unless CCACHE_DIR says otherwise. (Installed here, not by setup.sh: the
# product's build and its Dockerfiles, which install setup.sh's packages, do not use it.)
if ! command -v ccache >/dev/null; then
  sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq ccache >/dev/null 2>&1 || echo "test: no ccache (compiling without it)" >&2
fi
if command -v ccache >/dev/null; then
  case $build in /*) cache_dir=$build-ccache ;; *) cache_dir=$(pwd)/$build-ccache ;; esac
  export CCACHE_DIR=${CCACHE_DIR:-$cache_dir} CCACHE_NOHASHDIR=1
  debug_fast+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
# Each build below names its targets as one set (SNAP_BUILD_SET, CMakeLists.txt: --target a b c
# would build them one after another, a core idle while each test's one source compiled).
set_of() { local IFS=';'; echo "$*"; }
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
cmake -S . -B "$asan" -DCMAKE_BUILD_TYPE=Debug -DSNAP_SANITIZE=ON "${cuda_off[@]}" "${debug_fast[@]}" \
  -DSNAP_BUILD_SET="$(set_of snapserve "${asan_tests[@]}" "${replays[@]}")" >/dev/null
cmake --build "$asan" -j "$(nproc)" --target build_set
stage "the ASan + UBSan build"
# UBSan halts too, so that a finding fails the test (in the snapserve children as well).
export ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
ctest --test-dir "$asan" --output-on-failure -j 2 \
  -R "^($(IFS='|'; echo "${asan_tests[*]}")|fuzz_replay_.*)\$" || status=1
SNAP_TEST_SNAPSERVE=$(cd "$asan" && pwd)/snapserve ctest --test-dir "$build" --output-on-failure -j 2 \
  -R "^($(IFS='|'; echo "${drivers[*]}"))\$" || status=1
stage "the ASan + UBSan tests"

# The CUDA kernels on the kernel emulator (kernels/cuda/emu) under ASan + UBSan, when this
# machine has nvcc (the emulator is part of the CUDA build): the op and policy tables and the
# emulator's own test. Every kernel's global and shared memory accesses are checked, as
# compute-sanitizer's memcheck would on a GPU. Only these targets are built.
if [ -f "$build/kernels/cuda/emu/test_cuda_ops_emu" ]; then
  echo "test: the CUDA kernels on the kernel emulator under AddressSanitizer + UBSan" >&2
  emu_asan=${build}-emu-asan
  emu_tests=(test_kernel_emulator test_cuda_ops_emu test_cuda_policies_emu)
  cmake -S . -B "$emu_asan" -DCMAKE_BUILD_TYPE=Debug -DSNAP_SANITIZE=ON -DSNAP_BUILD_BENCH=OFF "${debug_fast[@]}" \
    -DSNAP_BUILD_SET="$(set_of "${emu_tests[@]}")" >/dev/null
  cmake --build "$emu_asan" -j "$(nproc)" --target build_set
  stage "the emulator's ASan + UBSan build"
  # The ops table as its two shards (kernels/cuda/emu/CMakeLists.txt), one per core.
  ctest --test-dir "$emu_asan" --output-on-failure -j 2 \
    -R '^(test_kernel_emulator|test_cuda_ops_emu_shard[01]|test_cuda_policies_emu)$' || status=1
  stage "the emulated kernels under ASan + UBSan"
fi
unset ASAN_OPTIONS UBSAN_OPTIONS

# The engine's threads (the scheduler; clients submitting, cancelling and polling stats;
# a shutdown racing submits) under ThreadSanitizer, on a tiny random model so that it runs
# in seconds. One OpenMP thread: libgomp is not instrumented, its barriers would read as races.
echo "test: engine threads under ThreadSanitizer" >&2
tsan=${build}-tsan
cmake -S . -B "$tsan" -DCMAKE_BUILD_TYPE=Debug -DSNAP_SANITIZE_THREAD=ON "${cuda_off[@]}" "${debug_fast[@]}" >/dev/null
cmake --build "$tsan" -j "$(nproc)" --target test_engine_threads
stage "the ThreadSanitizer build"
# (The binary itself, not through ctest, whose test environment sets 2 OpenMP threads.)
OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" \
  "$tsan/tests/test_engine_threads" || status=1
stage "the engine's threads under ThreadSanitizer"
echo "test: time per stage (${SECONDS} s in all):" >&2
printf '  %s\n' "${stage_times[@]}" >&2
exit $status
