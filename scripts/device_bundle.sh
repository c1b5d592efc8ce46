#!/usr/bin/env bash
# device_bundle.sh: run HERE (the CPU machine with our Debian packages), before a GPU session;
# scripts/device_deps.sh calls it. The bare GPU machine cannot build the whole project (no MPI,
# Boost, prometheus-cpp, CLI11, ... and no registry), so the e2e device tests that drive the
# snapserve binary (test_device_serve, test_device_tp_cli, test_device_serve_tp) are built here,
# for the H200 (sm_90), and carried there with the shared libraries they load:
#   .device-deps/bundle.tar.xz: snapserve, the three tests, lib/ (every library ldd lists except
#   the C/C++ runtime, OpenMP and the OpenBLAS family, which the GPU machine or the carried .debs
#   have); the binaries' RPATH is $ORIGIN/lib (DT_RPATH, so it covers the libraries' own
#   dependencies too). Built without NCCL (SNAP_WITH_NCCL=OFF): a binary linked to libnccl would
#   not start where there is none; the tests use the host-staged exchange (NCCL refuses two ranks
#   on one GPU anyway). The CUDA runtime is linked dynamically (libcudart.so.13 is carried);
#   cuBLAS is opened at first use from the machine's CUDA (device_check puts it on the path).
# scripts/device_check.sh unpacks it and runs the tests with SNAP_TEST_SNAPSERVE,
# SNAP_TEST_SOURCE_DIR and SNAP_TEST_PYTHON pointing at the GPU machine's paths.
# Usage: bash scripts/device_bundle.sh   (a CUDA Release build in build-bundle/: about 10 min on
# 2 cores the first time; idempotent: rebuilt only where sources changed)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${SNAP_BUNDLE_BUILD:-build-bundle}
dest=.device-deps
tests=(test_device_serve test_device_tp_cli test_device_serve_tp)
mkdir -p "$dest"
command -v nvcc >/dev/null || { echo "device_bundle: no nvcc here: cannot build the CUDA binaries" >&2; exit 1; }
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 -DSNAP_WITH_NCCL=OFF \
  -DSNAP_BUILD_BENCH=OFF -DCMAKE_SKIP_BUILD_RPATH=OFF -DCMAKE_BUILD_RPATH='$ORIGIN/lib' \
  -DCMAKE_EXE_LINKER_FLAGS='-Wl,--disable-new-dtags' >/dev/null
cmake --build "$build" -j "$(nproc)" --target snapserve "${tests[@]}" 2>&1 | grep -E "error|warning: " || true
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/lib"
bins=("$build/snapserve")
for t in "${tests[@]}"; do bins+=("$(find "$build" -type f -name "$t" -perm -u+x | head -1)"); done
for b in "${bins[@]}"; do
  [ -x "$b" ] || { echo "device_bundle: $b was not built" >&2; exit 1; }
  cp "$b" "$stage/"
  if ldd "$b" | grep -q "not found"; then
    echo "device_bundle: $b: $(ldd "$b" | grep 'not found' | head -1)" >&2
    exit 1
  fi
  # name => path for every library the loader resolves, less what the GPU machine has itself
  # (glibc and its parts: libresolv etc. call GLIBC_PRIVATE symbols of the libc they came with,
  # so they must be the machine's own; libstdc++/libgcc_s, libgomp, the driver) or gets from the
  # carried .debs (OpenBLAS).
  ldd "$b" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' |
    grep -v -E '^(libc|libm|libdl|libpthread|librt|libresolv|libanl|libnsl|libutil|libstdc\+\+|libgcc_s|libgomp|libcuda|libopenblas|libgfortran|libquadmath)\.so' |
    while read -r name path; do cp -L "$path" "$stage/lib/$name"; done
done
# A carried library with its own RUNPATH (Open MPI's point at /usr/lib/.../openmpi/lib) would
# look for its dependencies there, not in lib/: make it $ORIGIN (patchelf, from Debian).
command -v patchelf >/dev/null || apt-get install -y -qq patchelf >/dev/null 2>&1 ||
  { apt-get update -qq >/dev/null 2>&1; apt-get install -y -qq patchelf >/dev/null; }
for l in "$stage"/lib/*; do
  if readelf -d "$l" | grep -q -E '\((RPATH|RUNPATH)\)'; then patchelf --set-rpath '$ORIGIN' "$l"; fi
done
# Every carried binary must take its libraries from lib/ (RPATH $ORIGIN/lib): whatever ldd
# resolves elsewhere must be on the list of what the GPU machine has itself.
for b in "$stage"/snapserve "$stage"/test_*; do
  readelf -d "$b" | grep -q 'RPATH.*\$ORIGIN/lib' || { echo "device_bundle: $b has no \$ORIGIN/lib RPATH" >&2; exit 1; }
  outside=$(env -u LD_LIBRARY_PATH ldd "$b" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | grep -v " $stage/lib/" |
    grep -v -E '^(libc|libm|libdl|libpthread|librt|libresolv|libanl|libnsl|libutil|libstdc\+\+|libgcc_s|libgomp|libcuda|libopenblas|libgfortran|libquadmath)\.so' || true)
  [ -z "$outside" ] || { echo "device_bundle: $(basename "$b") loads from outside the bundle: $outside" >&2; exit 1; }
done
tar -C "$stage" -cJf "$dest/bundle.tar.xz" .
echo "device_bundle: $(du -h "$dest/bundle.tar.xz" | cut -f1) in $dest/bundle.tar.xz ($(ls "$stage/lib" | wc -l) libraries," \
  "$(du -sh "$stage" | cut -f1) unpacked; built from $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . ':!.device-deps' || echo '+changes'))"
