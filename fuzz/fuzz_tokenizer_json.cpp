// tokenizer.json: model type, vocabulary, merges, added tokens, pre-tokenizer; then a round
// trip through the tokenizer it built.
#include "coordinator/tokenizer/tokenizer.h"
#include "fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = snap::fuzz::write_input("tokenizer.json", data, size);
  auto tok = snap::Tokenizer::from_json(path);
  if (!tok.ok()) return 0;
  const std::vector<int32_t> ids = tok->encode("Hello, world! 123 \xc3\xa9t\xc3\xa9", true);
  (void)tok->decode(ids, false);
  return 0;
}
