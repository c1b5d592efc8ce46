// The OpenAI-compatible protocol as pure functions (no sockets): parse and validate
// /v1/completions and /v1/chat/completions bodies into an EngineRequest, build the response
// objects and SSE chunks, and the OpenAI-style error object. Every API error's HTTP status
// comes from api_error_info(), the one place that maps error kinds to HTTP codes.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"
#include "coordinator/scheduler/engine.h"
#include "coordinator/tokenizer/tokenizer.h"

namespace snap {

// --- errors --------------------------------------------------------------------

enum class ApiErrorKind : uint8_t {
  bad_request,         // malformed JSON, wrong type, missing field, out-of-range value
  unauthorized,        // missing or wrong API key
  model_not_found,     // "model" names something we do not serve
  route_not_found,     // unknown path
  method_not_allowed,  // known path, wrong method
  request_timeout,     // the request did not arrive in time
  payload_too_large,   // body over the limit
  too_many_requests,   // engine queue full
  unavailable,         // too many connections, not healthy, shutting down
  internal,            // the engine failed
};

struct ApiErrorInfo {
  int http_status;
  const char* type;  // OpenAI "type"
  const char* code;  // OpenAI "code"
};

// The one switch from error kind to HTTP status and OpenAI type/code.
ApiErrorInfo api_error_info(ApiErrorKind kind);

struct ApiError {
  ApiErrorKind kind = ApiErrorKind::bad_request;
  std::string message;
  std::string param;  // the offending field ("max_tokens", "kv_compression.budget"); "" = null
};

// An engine Status as an API error: invalid_argument → bad_request, resource_exhausted →
// too_many_requests, not_found → model_not_found, the rest → internal.
ApiError api_error_from_status(const Status& status, std::string param = "");
// {"error": {"message", "type", "param", "code"}}
std::string api_error_body(const ApiError& error);

// --- requests ------------------------------------------------------------------

enum class ApiRoute : uint8_t { completions, chat_completions };

struct ApiContext {
  const Tokenizer* tokenizer = nullptr;
  std::string model_name;         // the served name; a request's "model" must equal it
  int64_t context_length = 0;     // prompt + max_tokens must fit; 0: unchecked
  int64_t max_prompt_tokens = 0;  // 0: context_length
  int64_t max_tokens_limit = 0;   // 0: context_length
  double timeout_seconds = 0;     // copied into EngineRequest::timeout_seconds
};

struct ApiRequest {
  ApiRoute route = ApiRoute::completions;
  EngineRequest engine;  // the first prompt; engine.n choices of each prompt
  // /v1/completions with a list of prompts: the second and later ones (same parameters).
  // Choice index of prompt p's choice c: p * engine.n + c (OpenAI's order).
  std::vector<std::vector<int32_t>> more_prompts;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  // echo (completions): each choice's text starts with its prompt; with logprobs, the
  // prompt's tokens are listed first (the first with a null logprob).
  bool echo = false;
  std::vector<std::string> prompt_texts;  // with echo: each prompt as text
  int num_prompts() const { return 1 + static_cast<int>(more_prompts.size()); }
  int num_choices() const { return num_prompts() * engine.n; }
};

struct ApiParse {
  std::optional<ApiError> error;  // set: the request is rejected with it
  ApiRequest request;
};

// Parses and validates one body (null treated as absent). A field the route does not honour
// (unknown, or an OpenAI feature snapserve lacks such as tools) is a 400 naming it.
ApiParse parse_api_request(ApiRoute route, std::string_view body, const ApiContext& ctx);

// True when bytes are well-formed UTF-8 (no overlongs, surrogates or code points past U+10FFFF).
bool utf8_is_valid(std::string_view bytes);

// --- responses -----------------------------------------------------------------

// Stable per-response fields: "cmpl-…"/"chatcmpl-…", the creation time, the served name.
struct ApiResponseMeta {
  ApiRoute route = ApiRoute::completions;
  std::string id;
  int64_t created = 0;
  std::string model;
  KvPolicyKind policy = KvPolicyKind::full;
  int logprobs = -1;  // the request's EngineRequest::logprobs: -1 = no logprobs in the response
};

// One output token's log-probabilities, ready for the response.
struct ApiLogprob {
  std::string token;  // the token's bytes
  bool null_logprob = false;  // an echoed first prompt token: nothing to score it against
  float logprob = 0.0f;
  std::vector<std::pair<std::string, float>> top;  // most likely first
};
// From a token event (EngineRequest::logprobs >= 0).
ApiLogprob api_logprob(const Tokenizer& tokenizer, const EngineEvent& token);
// An echoed prompt's entries: its first token (null logprob), then the scored ones.
std::vector<ApiLogprob> api_prompt_logprobs(const Tokenizer& tokenizer, const std::vector<int32_t>& prompt_ids,
                                            const std::vector<PromptLogprob>& scored);

ApiResponseMeta api_response_meta(const ApiRequest& request, const std::string& model_name);

// One finished choice of a response.
struct ApiChoice {
  std::string text;
  EngineEvent finished;
  std::vector<ApiLogprob> logprobs;
};
// The whole response of several choices (in index order; n choices per prompt): usage
// counts each prompt once and every choice's completion; kv sums every choice's cache.
std::string completion_response(const ApiResponseMeta& meta, const std::vector<ApiChoice>& choices, int n);
// The whole non-streaming response; `finished` is the engine's final event; `logprobs` the
// output tokens' entries when meta.logprobs >= 0 (chat: {"content": [...]}; completions:
// {"tokens", "token_logprobs", "top_logprobs", "text_offset"}).
std::string completion_response(const ApiResponseMeta& meta, const std::string& text, const EngineEvent& finished,
                                const std::vector<ApiLogprob>& logprobs = {});
// One SSE chunk object (no "data: " framing): a text delta (with its tokens' logprobs when
// asked); chat's first chunk carries the assistant role; a chunk with finish_reason set
// closes the choice.
std::string stream_chunk(const ApiResponseMeta& meta, const std::string& text, bool with_role,
                         const std::string& finish_reason, const std::vector<ApiLogprob>& logprobs = {},
                         int index = 0);
// The chunk that closes the choice: finish_reason ("abort" for a timeout, with
// "abort_reason": "timeout") and stop_reason (the stop string or stop token id, else null).
std::string stream_finish_chunk(const ApiResponseMeta& meta, const EngineEvent& finished, int index = 0);
// The usage chunk (choices: []) sent before [DONE] when stream_options.include_usage.
std::string stream_usage_chunk(const ApiResponseMeta& meta, const EngineEvent& finished);
std::string stream_usage_chunk(const ApiResponseMeta& meta, const std::vector<ApiChoice>& choices, int n);
// "data: PAYLOAD\n\n"
std::string sse_event(const std::string& payload);
// GET /v1/models
std::string models_response(const std::string& model_name, int64_t created);
// GET /v1/models/{id}: the one model object
std::string model_response(const std::string& model_name, int64_t created);

}  // namespace snap
