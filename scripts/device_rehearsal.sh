#!/usr/bin/env bash
# device_rehearsal.sh: run HERE, before a GPU session, to see scripts/device_check.sh get as far
# as it can without a GPU on a machine that, like the bare device machine, has none of our
# Debian packages. A GPU session has 15 minutes of device time; a build or bundle that breaks
# there wastes them. The rehearsal machine is a Debian 13 (trixie) chroot: GCC 14 (libstdc++
# headers that include less than GCC 12's do), glibc 2.41, CMake, ninja, Python 3.13 with only
# numpy 2.x and safetensors in a venv, and this machine's CUDA toolkit bind-mounted; no OpenBLAS,
# nlohmann-json, GoogleTest, MPI, Boost or prometheus-cpp. The device machine (an Ubuntu 24.04
# image: glibc 2.39, GCC 13, Python 3.12, numpy 2.5; ../.library/device/KINDS.md) sits between
# this machine and the chroot, so what passes on both sides should pass there.
#
# What it checks, in the chroot:
#  1. device_check.sh with its carried .device-deps: the .debs unpack, the standalone
#     kernels/cuda project configures and builds, test_cublas_lazy passes, every CUDA test and
#     benchmark exits 77 (no GPU) instead of failing to start, the bundle's snapserve starts
#     (its carried libraries resolve against a newer glibc and libstdc++) and its e2e tests skip;
#  2. with --emu (after `make -C build` of the *_emu targets): the device tests on the kernel
#     emulator (test_device_forward_emu, test_device_tp_emu, test_device_generate_emu), so the
#     Python tools they call (make_random_model.py, reference_llama.py) run under numpy 2.x and
#     the carried tiny GGUF checkpoint is found where the gguf package is missing.
# Needs root (debootstrap, chroot, bind mounts) and the Debian and PyPI mirrors; the chroot is
# kept in $SNAP_REHEARSAL_ROOT (default /tmp/snap-bare, ~700 MB, ~3 min to make the first time).
# Usage: bash scripts/device_deps.sh && bash scripts/device_rehearsal.sh [--emu]
# Exit 0 when every step did what it must without a GPU; the summary says what did not.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
bare=${SNAP_REHEARSAL_ROOT:-/tmp/snap-bare}
emu=0
[ "${1:-}" = --emu ] && emu=1
fail() { echo "device_rehearsal: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || fail "needs root (debootstrap, chroot, mount)"
[ -f .device-deps/bundle.tar.xz ] || fail "no .device-deps/bundle.tar.xz: run scripts/device_deps.sh first"
cuda=$(readlink -f "$(dirname "$(command -v nvcc)")/..") || fail "no nvcc here"

# --- the chroot ------------------------------------------------------------------------------
if [ ! -x "$bare/usr/bin/g++" ]; then
  command -v debootstrap >/dev/null || apt-get install -y -qq debootstrap >/dev/null || fail "cannot install debootstrap"
  echo "device_rehearsal: making a Debian 13 chroot in $bare (a few minutes)"
  debootstrap --variant=minbase --include=build-essential,cmake,ninja-build,python3,python3-venv,xz-utils,binutils,procps \
    trixie "$bare" http://deb.debian.org/debian >/tmp/snap-rehearsal-debootstrap.log 2>&1 ||
    fail "debootstrap failed (see /tmp/snap-rehearsal-debootstrap.log)"
fi
if [ ! -x "$bare/opt/venv/bin/python3" ]; then
  whl=$(mktemp -d)
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.13 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    numpy safetensors -d "$whl" || fail "pip download of numpy and safetensors failed"
  mkdir -p "$bare/tmp/whl" && cp "$whl"/*.whl "$bare/tmp/whl/" && rm -rf "$whl"
  chroot "$bare" sh -c '/usr/bin/python3 -m venv /opt/venv && /opt/venv/bin/pip install -q --no-index /tmp/whl/*.whl' ||
    fail "cannot make the chroot's venv"
fi
mounts=()
bind() {  # bind SRC DEST-inside-the-chroot
  mkdir -p "$bare$2"
  mountpoint -q "$bare$2" || { mount --bind "$1" "$bare$2" && mounts+=("$bare$2"); } || fail "cannot bind $1"
}
cleanup() { for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do umount "${mounts[i]}" 2>/dev/null; done; }
trap cleanup EXIT
bind "$cuda" /usr/local/cuda
bind /proc /proc
bind /dev /dev
# python3 on the PATH is the venv (the device machine's python3 is a venv too).
printf '#!/bin/sh\nexec /opt/venv/bin/python3 "$@"\n' >"$bare/usr/local/bin/python3"
chmod +x "$bare/usr/local/bin/python3"

# --- the working tree, as the device tool sends it: tracked and untracked-not-ignored files,
# plus the carried .device-deps ------------------------------------------------------------
tree=$bare/work/tree
rm -rf "$tree" && mkdir -p "$tree"
git ls-files -z --cached --others --exclude-standard | xargs -0 -I{} cp --parents -a {} "$tree/" 2>/dev/null
cp -a .device-deps "$tree/"
echo "device_rehearsal: $(du -sh "$tree" | cut -f1) of working tree in $tree"

# --- 1. device_check.sh, no GPU --------------------------------------------------------------
out=$bare/tmp/rehearsal-out
rm -rf "$out" "$bare/tmp/snap-device-prefix" "$bare/tmp/snap-device-bundle"
chroot "$bare" env -i HOME=/root PATH=/usr/local/cuda/bin:/usr/local/bin:/usr/bin:/bin OUT=/tmp/rehearsal-out \
  SNAP_DEVICE_BUDGET_S=1800 bash /work/tree/scripts/device_check.sh >/dev/null 2>&1
summary=$out/device_check.txt
[ -s "$summary" ] || fail "device_check.sh wrote no summary (see $out/device_check.log)"
cat "$summary"
verdict=0
expect() {  # expect STEP-REGEX RESULT-REGEX WHY
  local line
  line=$(grep -E "^$1 " "$summary" | head -1)
  if [ -z "$line" ]; then
    echo "device_rehearsal: FAIL: no '$1' row ($3)"; verdict=1
  elif ! grep -qE "$2" <<<"$line"; then
    echo "device_rehearsal: FAIL: $line  (expected $3)"; verdict=1
  fi
}
expect 'deps' ' PASS ' 'the carried .debs unpack'
expect 'configure \(kernels/cuda\)' ' PASS ' 'the standalone project configures with only the .debs'
expect 'build \(kernels/cuda\)' ' PASS ' 'the standalone project builds with GCC 14 and CUDA 13'
expect 'test_cublas_lazy' ' PASS ' 'no GPU needed'
expect 'bundle \(e2e device tests\)' ' PASS ' 'the carried snapserve starts on glibc 2.41'
for t in test_cuda_ops test_cuda_policies test_device_forward test_device_generate test_device_kv_pool test_device_tp \
  test_device_serve test_device_tp_cli test_device_serve_tp; do
  expect "$t" ' SKIP ' 'exit 77: no GPU'
done
for b in bench_cuda_kernels bench_cuda_kv_pool bench_device_forward; do
  expect "$b" 'rc 77' 'exit 77: no GPU'
done

# --- 2. the device tests on the kernel emulator, under the chroot's Python --------------------
if [ $emu = 1 ]; then
  py=$(sed -n 's/^_Python3_EXECUTABLE:INTERNAL=//p' build/CMakeCache.txt)  # compiled into the tests
  [ -n "$py" ] || fail "no build/CMakeCache.txt: build the *_emu targets first"
  mkdir -p "$bare$(dirname "$py")" "$bare/tmp/rehearsal-emu/lib" "$bare$root"
  [ "$py" = /usr/local/bin/python3 ] || printf '#!/bin/sh\nexec /opt/venv/bin/python3 "$@"\n' >"$bare$py"
  chmod +x "$bare$py"
  bind "$tree" "$root"  # SNAP_SOURCE_DIR compiled into the tests: the tree (with .device-deps/tiny-gguf)
  deps=$bare/tmp/snap-device-prefix/usr/lib/x86_64-linux-gnu
  for t in test_device_forward_emu test_device_tp_emu test_device_generate_emu; do
    exe=build/kernels/cuda/emu/$t
    [ -x "$exe" ] || fail "$exe is not built"
    cp "$exe" "$bare/tmp/rehearsal-emu/"
    # What the chroot lacks (PCRE2, prometheus-cpp) comes from here; OpenBLAS from the .debs.
    ldd "$exe" | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | grep -E 'pcre2|prometheus' |
      xargs -r -I{} cp -L {} "$bare/tmp/rehearsal-emu/lib/"
    t0=$SECONDS
    if chroot "$bare" env -i HOME=/root PATH=/usr/local/bin:/usr/bin:/bin \
      LD_LIBRARY_PATH=/tmp/rehearsal-emu/lib:${deps#"$bare"}/openblas-openmp:${deps#"$bare"} \
      "/tmp/rehearsal-emu/$t" >"$out/$t.log" 2>&1; then
      echo "device_rehearsal: $t passed in the chroot ($(grep -c '^\[       OK' "$out/$t.log") cases, $((SECONDS - t0)) s)"
    else
      echo "device_rehearsal: FAIL: $t in the chroot (see $out/$t.log): $(grep -m1 -E 'Failure|rror' "$out/$t.log")"
      verdict=1
    fi
  done
fi
echo "device_rehearsal: $([ $verdict = 0 ] && echo PASS || echo FAIL)"
exit $verdict
