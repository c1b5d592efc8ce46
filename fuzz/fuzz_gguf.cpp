// GGUF: header, metadata and tensor table (GgufFile::open), then what the loader reads from
// them: the model config and the tokenizer. Never loads tensor data.
#include "coordinator/tokenizer/tokenizer.h"
#include "fuzz/fuzz_common.h"
#include "worker/model/config.h"
#include "worker/model/gguf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = snap::fuzz::write_input("model.gguf", data, size);
  auto file = snap::GgufFile::open(path);
  if (!file.ok()) return 0;
  (void)snap::config_from_gguf(*file);
  (void)snap::Tokenizer::from_gguf(*file);
  return 0;
}
