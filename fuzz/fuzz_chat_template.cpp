// Chat templates: the template source (which family it is) and messages of any bytes.
// Input: template source, '\0', then role '\0' content '\0' pairs.
#include <string>
#include <vector>

#include "coordinator/tokenizer/chat_template.h"
#include "coordinator/tokenizer/tokenizer.h"
#include "fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static snap::Tokenizer* tok = [] {
    auto t = snap::Tokenizer::from_json(snap::fuzz::source_path("tests/fixtures/tokenizer/bytebpe/tokenizer.json"));
    if (!t.ok()) std::abort();
    return new snap::Tokenizer(std::move(t).value());
  }();
  std::vector<std::string> parts(1);
  for (size_t i = 0; i < size; ++i) {
    if (data[i] == 0) parts.emplace_back();
    else parts.back() += static_cast<char>(data[i]);
  }
  tok->set_chat_template(parts[0]);
  std::vector<snap::ChatMessage> messages;
  for (size_t i = 1; i + 1 < parts.size(); i += 2) messages.push_back({parts[i], parts[i + 1]});
  (void)snap::apply_chat_template(*tok, messages, true);
  (void)snap::apply_chat_template(*tok, messages, false);
  return 0;
}
