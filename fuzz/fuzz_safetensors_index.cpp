// model.safetensors.index.json (sharded checkpoints): the weight map naming shard files.
#include <filesystem>

#include "fuzz/fuzz_common.h"
#include "worker/model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string dir = [] {
    const std::string d = snap::fuzz::scratch_dir() + "/sharded";
    std::filesystem::create_directories(d);
    return d;
  }();
  const std::string index = dir + "/model.safetensors.index.json";
  snap::fuzz::write_input("sharded/model.safetensors.index.json", data, size);
  (void)index;
  (void)snap::SafetensorsModel::open(dir);
  return 0;
}
