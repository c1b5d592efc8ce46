// The tiny Gemma 3 checkpoint of the device tests (test_device_generate, _forward, _tp, _serve):
// 4 layers, local and global alternating with a window of 48, 4 query and 2 KV heads of 32, so
// that a few hundred tokens pass the window and TP 4 replicates the KV heads. It is a GGUF (our
// loader reads Gemma 3 from GGUF alone), written by tools/make_tiny_checkpoint.py, which needs
// the PyPI gguf package; the device machine lacks it, so scripts/device_deps.sh writes the same
// checkpoint (the same arguments: keep the two in step) into .device-deps/tiny-gemma3, carried.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

namespace snap::test {

inline constexpr const char* k_tiny_gemma3_args =
    "--arch gemma3 --layers 4 --heads 4 --kv-heads 2 --head-dim 32 --hidden 64 --sliding-window 48 "
    "--sliding-window-pattern 2 --rope-theta 1000000 --seed 21";
inline constexpr const char* k_tiny_gemma3_carried = "tiny-gemma3";  // under .device-deps

// Writes the checkpoint into out_dir and returns its model.gguf; without the gguf package, the
// carried copy under source_dir; "" (and *why) when there is neither.
inline std::string tiny_gemma3(const std::string& python, const std::string& source_dir,
                               const std::filesystem::path& out_dir, std::string* why) {
  const std::string cmd = python + " " + source_dir + "/tools/make_tiny_checkpoint.py " + k_tiny_gemma3_args +
                          " --out " + out_dir.string() + " >/dev/null 2>&1";
  if (std::system(cmd.c_str()) == 0) return (out_dir / "model.gguf").string();
  const std::filesystem::path carried =
      std::filesystem::path(source_dir) / ".device-deps" / k_tiny_gemma3_carried / "model.gguf";
  if (std::filesystem::exists(carried)) return carried.string();
  *why = "no gguf package and no " + carried.string() + " (run scripts/device_deps.sh): " + cmd;
  return "";
}

}  // namespace snap::test
