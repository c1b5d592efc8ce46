// The HTTP API's request bodies: /v1/completions and /v1/chat/completions (the first byte
// picks the route, odd = chat: the text seeds start with "0" or "1"), every field including
// kv_compression, logit_bias and prompt lists.
#include "coordinator/http/openai.h"
#include "coordinator/tokenizer/tokenizer.h"
#include "fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static snap::Tokenizer* tok = [] {
    auto t = snap::Tokenizer::from_json(snap::fuzz::source_path("tests/fixtures/tokenizer/bytebpe/tokenizer.json"));
    if (!t.ok()) std::abort();
    return new snap::Tokenizer(std::move(t).value());
  }();
  if (size == 0) return 0;
  snap::ApiContext ctx;
  ctx.tokenizer = tok;
  ctx.model_name = "fuzz";
  ctx.context_length = 2048;
  const snap::ApiRoute route = data[0] & 1 ? snap::ApiRoute::chat_completions : snap::ApiRoute::completions;
  const std::string_view body(reinterpret_cast<const char*>(data + 1), size - 1);
  const snap::ApiParse p = snap::parse_api_request(route, body, ctx);
  if (p.error) (void)snap::api_error_body(*p.error);
  return 0;
}
