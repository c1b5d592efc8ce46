// safetensors: the 8-byte length, the JSON header and the tensor table against the file size.
#include "fuzz/fuzz_common.h"
#include "worker/model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = snap::fuzz::write_input("model.safetensors", data, size);
  (void)snap::SafetensorsModel::open(path);
  return 0;
}
