// `snapserve batch` input lines and the output records built from them, and the output
// file's resume scan over arbitrary bytes.
#include <string>

#include "coordinator/batch/batch_io.h"
#include "fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const snap::BatchInput in = snap::parse_batch_line(7, text);
  (void)snap::batch_line_is_blank(text);
  (void)snap::batch_output_record(in, 400, "", text, "invalid_value", in.error.value_or(""), nullptr);
  const std::string path = snap::fuzz::write_input("out.jsonl", data, size);
  (void)snap::BatchOutput::open(path, snap::ShardSpec{0, 2});
  return 0;
}
