// OpenAI-compatible request parsing and response building (see openai.h). Validation
// follows OpenAI's and vLLM's rules where users rely on them (model name → 404, n=1 only,
// prompt + max_tokens within the context) and names the offending field in every error.
// nlohmann exceptions are caught here and never leave this file.
#include "coordinator/http/openai.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>

#include "coordinator/engine/prompt.h"
#include "coordinator/tokenizer/chat_template.h"

namespace snap {
namespace {

using nlohmann::json;
using MaybeError = std::optional<ApiError>;

constexpr int k_max_json_depth = 64;
constexpr size_t k_max_stop_strings = 4;
constexpr int64_t k_max_budget = int64_t{1} << 40;

ApiError bad(std::string param, std::string message) {
  return ApiError{ApiErrorKind::bad_request, std::move(message), std::move(param)};
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// Deepest [ / { nesting outside strings; stops counting past the limit.
int json_depth(std::string_view s) {
  int depth = 0, max_depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < s.size() && max_depth <= k_max_json_depth; ++i) {
    const char c = s[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      max_depth = std::max(max_depth, ++depth);
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return max_depth;
}

const json* field(const json& obj, const char* key) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

MaybeError read_int(const json& obj, const char* key, const std::string& param, int64_t lo, int64_t hi, int64_t* out) {
  const json* v = field(obj, key);
  if (!v) return {};
  double d = 0;
  if (v->is_number_unsigned()) {
    const uint64_t u = v->get<uint64_t>();
    d = u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ? 1e19 : static_cast<double>(u);
    if (u <= static_cast<uint64_t>(hi)) {
      if (static_cast<int64_t>(u) < lo) return bad(param, param + " must be at least " + std::to_string(lo) + ", got " + std::to_string(u));
      *out = static_cast<int64_t>(u);
      return {};
    }
  } else if (v->is_number_integer()) {
    const int64_t i = v->get<int64_t>();
    if (i < lo) return bad(param, param + " must be at least " + std::to_string(lo) + ", got " + std::to_string(i));
    if (i > hi) return bad(param, param + " must be at most " + std::to_string(hi) + ", got " + std::to_string(i));
    *out = i;
    return {};
  } else if (v->is_number_float()) {
    d = v->get<double>();
    if (d != std::floor(d)) return bad(param, param + " must be an integer, got " + dump(*v));
  } else {
    return bad(param, param + " must be an integer, got " + std::string(v->type_name()));
  }
  if (d < static_cast<double>(lo)) return bad(param, param + " must be at least " + std::to_string(lo) + ", got " + dump(*v));
  if (d > static_cast<double>(hi)) return bad(param, param + " must be at most " + std::to_string(hi) + ", got " + dump(*v));
  *out = static_cast<int64_t>(d);
  return {};
}

// A number in [lo, hi]; lo_open excludes lo.
MaybeError read_number(const json& obj, const char* key, const std::string& param, double lo, bool lo_open, double hi,
                       double* out) {
  const json* v = field(obj, key);
  if (!v) return {};
  if (!v->is_number()) return bad(param, param + " must be a number, got " + std::string(v->type_name()));
  const double d = v->get<double>();
  const bool low = lo_open ? !(d > lo) : !(d >= lo);
  if (low || !(d <= hi)) {
    char range[96];
    std::snprintf(range, sizeof range, "%s%g, %g]", lo_open ? "(" : "[", lo, hi);
    return bad(param, param + " must be in " + range + ", got " + dump(*v));
  }
  *out = d;
  return {};
}

MaybeError read_bool(const json& obj, const char* key, const std::string& param, bool* out) {
  const json* v = field(obj, key);
  if (!v) return {};
  if (!v->is_boolean()) return bad(param, param + " must be a boolean, got " + std::string(v->type_name()));
  *out = v->get<bool>();
  return {};
}

MaybeError read_string(const json& obj, const char* key, const std::string& param, std::string* out) {
  const json* v = field(obj, key);
  if (!v) return {};
  if (!v->is_string()) return bad(param, param + " must be a string, got " + std::string(v->type_name()));
  *out = v->get<std::string>();
  return {};
}

#define SNAP_API_TRY(expr)             \
  do {                                 \
    MaybeError snap_api_err_ = (expr); \
    if (snap_api_err_) return snap_api_err_; \
  } while (0)

// The field a KvPolicy::validate() message is about.
std::string kv_param_for(const std::string& message) {
  if (message.find("larger than window") != std::string::npos || message.find("budget") == 0 ||
      message.find("kv budget") != std::string::npos || message.find("h2o budget") != std::string::npos) {
    return "kv_compression.budget";
  }
  if (message.find("window") != std::string::npos) return "kv_compression.window";
  if (message.find("kernel") != std::string::npos) return "kv_compression.kernel";
  if (message.find("sinks") != std::string::npos) return "kv_compression.sinks";
  return "kv_compression";
}

MaybeError parse_kv_compression(const json& body, KvPolicy* policy) {
  const json* kv = field(body, "kv_compression");
  if (!kv) return {};
  if (!kv->is_object()) return bad("kv_compression", "kv_compression must be an object, got " + std::string(kv->type_name()));
  // Our own extension: a misspelled key would silently run another policy than asked.
  static const char* const k_keys[] = {"policy", "budget", "window", "kernel", "sinks", "pooling", "gqa", "layerwise"};
  for (const auto& item : kv->items()) {
    if (std::find(std::begin(k_keys), std::end(k_keys), item.key()) == std::end(k_keys)) {
      return bad("kv_compression." + item.key(),
                 "kv_compression has no field '" + item.key() +
                     "' (fields: policy, budget, window, kernel, sinks, pooling, gqa, layerwise)");
    }
  }
  std::string name;
  SNAP_API_TRY(read_string(*kv, "policy", "kv_compression.policy", &name));
  if (name.empty()) return bad("kv_compression.policy", "kv_compression.policy is required (full, snapkv, streaming, h2o, pyramidkv, adakv)");
  auto kind = kv_policy_from_name(name);
  if (!kind.ok()) return bad("kv_compression.policy", "kv_compression.policy: " + kind.status().message());
  policy->kind = kind.value();
  int64_t v = policy->budget;
  SNAP_API_TRY(read_int(*kv, "budget", "kv_compression.budget", 1, k_max_budget, &v));
  policy->budget = v;
  v = policy->window;
  SNAP_API_TRY(read_int(*kv, "window", "kv_compression.window", 1, 1 << 20, &v));
  policy->window = static_cast<int>(v);
  v = policy->kernel;
  SNAP_API_TRY(read_int(*kv, "kernel", "kv_compression.kernel", 1, 1 << 20, &v));
  policy->kernel = static_cast<int>(v);
  v = policy->num_sink;
  SNAP_API_TRY(read_int(*kv, "sinks", "kv_compression.sinks", 0, 1 << 20, &v));
  policy->num_sink = static_cast<int>(v);
  std::string s;
  SNAP_API_TRY(read_string(*kv, "pooling", "kv_compression.pooling", &s));
  if (!s.empty()) {
    auto p = kv_pooling_from_name(s);
    if (!p.ok()) return bad("kv_compression.pooling", "kv_compression.pooling: " + p.status().message());
    policy->pooling = p.value();
  }
  s.clear();
  SNAP_API_TRY(read_string(*kv, "gqa", "kv_compression.gqa", &s));
  if (!s.empty()) {
    auto g = gqa_aggregation_from_name(s);
    if (!g.ok()) return bad("kv_compression.gqa", "kv_compression.gqa: " + g.status().message());
    policy->aggregation = g.value();
  }
  SNAP_API_TRY(read_bool(*kv, "layerwise", "kv_compression.layerwise", &policy->layerwise));
  const Status st = policy->validate();
  if (!st.ok()) return bad(kv_param_for(st.message()), "kv_compression: " + st.message());
  return {};
}

MaybeError parse_stop(const json& body, std::vector<std::string>* stop) {
  const json* v = field(body, "stop");
  if (!v) return {};
  if (v->is_string()) {
    if (!v->get<std::string>().empty()) stop->push_back(v->get<std::string>());
    return {};
  }
  if (!v->is_array()) return bad("stop", "stop must be a string or a list of strings, got " + std::string(v->type_name()));
  if (v->size() > k_max_stop_strings) {
    return bad("stop", "stop takes at most " + std::to_string(k_max_stop_strings) + " strings, got " + std::to_string(v->size()));
  }
  for (const json& s : *v) {
    if (!s.is_string()) return bad("stop", "stop entries must be strings, got " + std::string(s.type_name()));
    if (!s.get<std::string>().empty()) stop->push_back(s.get<std::string>());
  }
  return {};
}

// {"token id": bias in [-100, 100], ...} (OpenAI's shape: keys are token ids as strings).
MaybeError parse_logit_bias(const json& body, const ApiContext& ctx, std::vector<std::pair<int32_t, float>>* out) {
  const json* b = field(body, "logit_bias");
  if (!b) return {};
  if (!b->is_object()) return bad("logit_bias", "logit_bias must be an object {\"token id\": bias}, got " + std::string(b->type_name()));
  if (b->size() > 1024) return bad("logit_bias", "logit_bias takes at most 1024 tokens, got " + std::to_string(b->size()));
  const int64_t vocab = ctx.tokenizer ? ctx.tokenizer->vocab_size() : std::numeric_limits<int32_t>::max();
  for (const auto& item : b->items()) {
    const std::string& key = item.key();
    char* end = nullptr;
    const long long id = key.empty() ? -1 : std::strtoll(key.c_str(), &end, 10);
    if (key.empty() || *end != '\0' || id < 0 || id >= vocab) {
      return bad("logit_bias", "logit_bias key '" + key + "' is not a token id in [0, " + std::to_string(vocab) + ")");
    }
    if (!item.value().is_number()) return bad("logit_bias", "logit_bias['" + key + "'] must be a number");
    const double v = item.value().get<double>();
    if (!(v >= -100.0 && v <= 100.0)) return bad("logit_bias", "logit_bias['" + key + "'] must be in [-100, 100], got " + dump(item.value()));
    out->emplace_back(static_cast<int32_t>(id), static_cast<float>(v));
  }
  return {};
}

MaybeError parse_stop_token_ids(const json& body, const ApiContext& ctx, std::vector<int32_t>* out) {
  const json* v = field(body, "stop_token_ids");
  if (!v) return {};
  if (!v->is_array()) return bad("stop_token_ids", "stop_token_ids must be a list of token ids, got " + std::string(v->type_name()));
  if (v->size() > 256) return bad("stop_token_ids", "stop_token_ids takes at most 256 ids");
  const int64_t vocab = ctx.tokenizer ? ctx.tokenizer->vocab_size() : std::numeric_limits<int32_t>::max();
  for (const json& t : *v) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= vocab) {
      return bad("stop_token_ids", "stop_token_ids entries must be token ids in [0, " + std::to_string(vocab) + "), got " + dump(t));
    }
    out->push_back(static_cast<int32_t>(t.get<int64_t>()));
  }
  return {};
}

// The fields each route honours. Anything else is refused by name rather than ignored: a
// client that sends `tools` or `response_format` must not get a 200 that silently did not
// do what it asked. `user` is accepted and has no effect (OpenAI's abuse-monitoring id).
MaybeError check_fields(ApiRoute route, const json& body) {
  static const char* const k_common[] = {"model", "max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop",
                                         "n", "stream", "stream_options", "ignore_eos", "kv_compression", "logprobs",
                                         "presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias",
                                         "min_tokens", "stop_token_ids", "user"};
  static const char* const k_completions[] = {"prompt", "echo", "best_of", "suffix"};
  static const char* const k_chat[] = {"messages", "max_completion_tokens", "top_logprobs", "response_format", "tools",
                                       "tool_choice", "functions", "function_call", "parallel_tool_calls"};
  auto listed = [](const auto& list, const std::string& k) {
    return std::find_if(std::begin(list), std::end(list), [&](const char* x) { return k == x; }) != std::end(list);
  };
  const bool chat = route == ApiRoute::chat_completions;
  for (const auto& item : body.items()) {
    const std::string& k = item.key();
    if (!listed(k_common, k) && !(chat ? listed(k_chat, k) : listed(k_completions, k))) {
      return bad(k, "'" + k + "' is not supported by snapserve's " + (chat ? "/v1/chat/completions" : "/v1/completions") +
                        " (see the README for the fields it honours)");
    }
  }
  // Known OpenAI fields we do not implement: refused unless they ask for nothing.
  const json* v = nullptr;
  if (!chat && (v = field(body, "best_of")) && !(v->is_number_integer() && v->get<int64_t>() == 1)) {
    return bad("best_of", "best_of is not supported (only 1)");
  }
  if (!chat && (v = field(body, "suffix")) && !(v->is_string() && v->get<std::string>().empty())) {
    return bad("suffix", "suffix (insertion) is not supported");
  }
  if (chat) {
    for (const char* k : {"tools", "functions"}) {
      if ((v = field(body, k)) && !(v->is_array() && v->empty())) return bad(k, std::string(k) + " (tool calling) is not supported");
    }
    for (const char* k : {"tool_choice", "function_call"}) {
      if ((v = field(body, k)) && !(v->is_string() && v->get<std::string>() == "none")) {
        return bad(k, std::string(k) + " is not supported (tool calling); only \"none\"");
      }
    }
    if ((v = field(body, "parallel_tool_calls")) && !(v->is_boolean())) {
      return bad("parallel_tool_calls", "parallel_tool_calls must be a boolean");
    }
    if ((v = field(body, "response_format")) &&
        !(v->is_object() && v->contains("type") && (*v)["type"].is_string() && (*v)["type"].get<std::string>() == "text")) {
      return bad("response_format", "response_format: only {\"type\": \"text\"} is supported (no JSON mode or schemas)");
    }
  }
  return {};
}

// Fields shared by both routes: sampling, stop, n, stream, ignore_eos, kv_compression.
MaybeError parse_common(const json& body, const ApiContext& ctx, ApiRequest* req) {
  EngineRequest& e = req->engine;
  double d = 1.0;  // OpenAI's default temperature
  SNAP_API_TRY(read_number(body, "temperature", "temperature", 0.0, false, 2.0, &d));
  e.sampling.temperature = static_cast<float>(d);
  d = 1.0;
  SNAP_API_TRY(read_number(body, "top_p", "top_p", 0.0, true, 1.0, &d));
  e.sampling.top_p = static_cast<float>(d);
  d = 0.0;
  SNAP_API_TRY(read_number(body, "min_p", "min_p", 0.0, false, 1.0, &d));
  e.sampling.min_p = static_cast<float>(d);
  int64_t top_k = 0;
  SNAP_API_TRY(read_int(body, "top_k", "top_k", -1, std::numeric_limits<int32_t>::max(), &top_k));
  e.sampling.top_k = top_k < 0 ? 0 : static_cast<int>(top_k);
  // No seed: a fresh one per request, as OpenAI samples differently each time.
  const json* seed = field(body, "seed");
  if (seed) {
    if (!seed->is_number_integer()) return bad("seed", "seed must be an integer, got " + std::string(seed->type_name()));
    e.sampling.seed = seed->is_number_unsigned() ? seed->get<uint64_t>() : static_cast<uint64_t>(seed->get<int64_t>());
  } else {
    e.sampling.seed = std::random_device{}() * uint64_t{0x9E3779B97F4A7C15} + std::random_device{}();
  }
  int64_t n = 1;
  SNAP_API_TRY(read_int(body, "n", "n", 1, 64, &n));
  e.n = static_cast<int>(n);
  // logprobs: completions take an int (alternatives per token; false/null = none), chat a
  // bool with top_logprobs.
  if (req->route == ApiRoute::completions) {
    const json* lp = field(body, "logprobs");
    if (lp && lp->is_boolean()) {
      if (lp->get<bool>()) return bad("logprobs", "logprobs must be an integer in [0, 20] for /v1/completions, got true");
    } else {
      int64_t k = -1;
      SNAP_API_TRY(read_int(body, "logprobs", "logprobs", 0, 20, &k));
      req->engine.logprobs = static_cast<int>(k);
    }
  } else {
    bool want = false;
    SNAP_API_TRY(read_bool(body, "logprobs", "logprobs", &want));
    int64_t top = -1;
    SNAP_API_TRY(read_int(body, "top_logprobs", "top_logprobs", 0, 20, &top));
    if (top >= 0 && !want) return bad("top_logprobs", "top_logprobs needs \"logprobs\": true");
    if (want) req->engine.logprobs = static_cast<int>(std::max<int64_t>(0, top));
  }
  d = 0.0;
  SNAP_API_TRY(read_number(body, "presence_penalty", "presence_penalty", -2.0, false, 2.0, &d));
  e.presence_penalty = static_cast<float>(d);
  d = 0.0;
  SNAP_API_TRY(read_number(body, "frequency_penalty", "frequency_penalty", -2.0, false, 2.0, &d));
  e.frequency_penalty = static_cast<float>(d);
  d = 1.0;
  SNAP_API_TRY(read_number(body, "repetition_penalty", "repetition_penalty", 0.0, true, 10.0, &d));
  e.repetition_penalty = static_cast<float>(d);
  int64_t min_tokens = 0;
  SNAP_API_TRY(read_int(body, "min_tokens", "min_tokens", 0, std::numeric_limits<int32_t>::max(), &min_tokens));
  e.min_tokens = min_tokens;
  SNAP_API_TRY(parse_logit_bias(body, ctx, &e.logit_bias));
  SNAP_API_TRY(parse_stop_token_ids(body, ctx, &e.stop_token_ids));
  SNAP_API_TRY(parse_stop(body, &e.stop));
  SNAP_API_TRY(read_bool(body, "stream", "stream", &req->stream));
  const json* so = field(body, "stream_options");
  if (so) {
    if (!so->is_object()) return bad("stream_options", "stream_options must be an object, got " + std::string(so->type_name()));
    SNAP_API_TRY(read_bool(*so, "include_usage", "stream_options.include_usage", &req->include_usage));
  }
  SNAP_API_TRY(read_bool(body, "echo", "echo", &req->echo));
  if (req->echo && req->stream && req->engine.logprobs >= 0) {
    return bad("echo", "echo with logprobs is not supported when streaming (ask without \"stream\")");
  }
  if (req->echo) req->engine.prompt_logprobs = req->engine.logprobs;
  SNAP_API_TRY(read_bool(body, "ignore_eos", "ignore_eos", &e.ignore_eos));
  SNAP_API_TRY(parse_kv_compression(body, &e.kv_policy));
  return {};
}

// One prompt: a string or a list of token ids.
MaybeError parse_one_prompt(const json& p, const ApiContext& ctx, std::vector<int32_t>* ids) {
  if (p.is_string()) {
    *ids = prompt_ids_for_text(*ctx.tokenizer, p.get<std::string>());
    return {};
  }
  const char* shape = "prompt must be a string, a list of token ids, or a list of those";
  if (!p.is_array() || p.empty()) return bad("prompt", shape);
  const int64_t vocab = ctx.tokenizer->vocab_size();
  for (const json& t : p) {
    if (!t.is_number_integer()) return bad("prompt", shape);
    const int64_t id = t.is_number_unsigned() && t.get<uint64_t>() > static_cast<uint64_t>(vocab) ? vocab : t.get<int64_t>();
    if (id < 0 || id >= vocab) {
      return bad("prompt", "prompt token id " + dump(t) + " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
    }
    ids->push_back(static_cast<int32_t>(id));
  }
  return {};
}

// "prompt": one prompt, or a list of them (strings or token-id lists), each its own choices.
// texts: each prompt as text (the string, or the ids decoded) for echo.
MaybeError parse_completion_prompts(const json& body, const ApiContext& ctx, std::vector<std::vector<int32_t>>* out,
                                    std::vector<std::string>* texts) {
  const json* p = field(body, "prompt");
  if (!p) return bad("prompt", "prompt is required");
  const bool batched = p->is_array() && !p->empty() && ((*p)[0].is_string() || (*p)[0].is_array());
  auto one_text = [&](const json& one, const std::vector<int32_t>& ids) {
    texts->push_back(one.is_string() ? one.get<std::string>() : ctx.tokenizer->decode(ids, false));
  };
  if (!batched) {
    out->emplace_back();
    SNAP_API_TRY(parse_one_prompt(*p, ctx, &out->back()));
    one_text(*p, out->back());
    return {};
  }
  if (p->size() > 64) return bad("prompt", "at most 64 prompts per request, got " + std::to_string(p->size()));
  for (const json& one : *p) {
    if (!one.is_string() && !one.is_array()) return bad("prompt", "a list of prompts holds strings or token-id lists");
    out->emplace_back();
    SNAP_API_TRY(parse_one_prompt(one, ctx, &out->back()));
    one_text(one, out->back());
  }
  return {};
}

MaybeError parse_messages(const json& body, const ApiContext& ctx, std::vector<int32_t>* ids) {
  const json* m = field(body, "messages");
  if (!m) return bad("messages", "messages is required");
  if (!m->is_array() || m->empty()) return bad("messages", "messages must be a non-empty list");
  std::vector<ChatMessage> messages;
  for (size_t i = 0; i < m->size(); ++i) {
    const json& msg = (*m)[i];
    const std::string at = "messages[" + std::to_string(i) + "]";
    if (!msg.is_object()) return bad(at, at + " must be an object, got " + std::string(msg.type_name()));
    ChatMessage cm;
    SNAP_API_TRY(read_string(msg, "role", at + ".role", &cm.role));
    if (cm.role == "developer") cm.role = "system";
    if (cm.role != "system" && cm.role != "user" && cm.role != "assistant") {
      return bad(at + ".role", at + ".role must be system, user or assistant, got '" + cm.role + "'");
    }
    const json* content = field(msg, "content");
    if (!content) return bad(at + ".content", at + ".content is required");
    if (content->is_string()) {
      cm.content = content->get<std::string>();
    } else if (content->is_array()) {
      for (const json& part : *content) {
        if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") || !part["text"].is_string()) {
          return bad(at + ".content", at + ".content parts must be {\"type\": \"text\", \"text\": string}");
        }
        cm.content += part["text"].get<std::string>();
      }
    } else {
      return bad(at + ".content", at + ".content must be a string, got " + std::string(content->type_name()));
    }
    messages.push_back(std::move(cm));
  }
  auto r = prompt_ids_for_chat(*ctx.tokenizer, messages);
  if (!r.ok()) return bad("messages", "messages: " + r.status().message());
  *ids = std::move(r).value();
  return {};
}

MaybeError parse_body(ApiRoute route, const json& body, const ApiContext& ctx, ApiRequest* req) {
  if (!body.is_object()) return bad("", "request body must be a JSON object, got " + std::string(body.type_name()));
  SNAP_API_TRY(check_fields(route, body));
  std::string model;
  SNAP_API_TRY(read_string(body, "model", "model", &model));
  if (field(body, "model") && model != ctx.model_name) {
    return ApiError{ApiErrorKind::model_not_found, "The model `" + model + "` does not exist (serving `" + ctx.model_name + "`)",
                    "model"};
  }
  SNAP_API_TRY(parse_common(body, ctx, req));

  const int64_t context = ctx.context_length > 0 ? ctx.context_length : std::numeric_limits<int64_t>::max();
  const int64_t max_prompt = ctx.max_prompt_tokens > 0 ? ctx.max_prompt_tokens : context;
  const int64_t max_tokens_limit = ctx.max_tokens_limit > 0 ? ctx.max_tokens_limit : context;
  const char* tokens_key = "max_tokens";
  int64_t max_tokens = -1;
  // echo may score the prompt alone (max_tokens 0), as log-likelihood harnesses ask.
  SNAP_API_TRY(read_int(body, "max_tokens", "max_tokens", req->echo ? 0 : 1, max_tokens_limit, &max_tokens));
  if (route == ApiRoute::chat_completions && max_tokens < 0) {
    tokens_key = "max_completion_tokens";
    SNAP_API_TRY(read_int(body, tokens_key, tokens_key, 1, max_tokens_limit, &max_tokens));
  }

  CHECK(ctx.tokenizer != nullptr) << "ApiContext without a tokenizer";
  std::vector<std::vector<int32_t>> prompts;
  const char* prompt_param = route == ApiRoute::completions ? "prompt" : "messages";
  if (route == ApiRoute::completions) {
    SNAP_API_TRY(parse_completion_prompts(body, ctx, &prompts, &req->prompt_texts));
  } else {
    prompts.emplace_back();
    SNAP_API_TRY(parse_messages(body, ctx, &prompts.back()));
  }
  const bool several = prompts.size() > 1;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const int64_t n = static_cast<int64_t>(prompts[i].size());
    const std::string what = several ? "prompt[" + std::to_string(i) + "]" : std::string(prompt_param);
    if (n == 0) return bad(prompt_param, what + " must not be empty");
    if (n > max_prompt) {
      return bad(prompt_param, what + " has " + std::to_string(n) + " tokens, more than the limit of " + std::to_string(max_prompt));
    }
    if (i == 0 && max_tokens < 0) {  // completions: 16 like OpenAI; chat: the rest of the context
      max_tokens = route == ApiRoute::completions ? 16 : std::min(max_tokens_limit, context - n);
      max_tokens = std::max<int64_t>(1, std::min(max_tokens, max_tokens_limit));
    }
    if (n + max_tokens > context) {
      return bad(tokens_key, what + " (" + std::to_string(n) + " tokens) plus " + tokens_key + " (" +
                                 std::to_string(max_tokens) + ") exceeds the context length of " + std::to_string(context));
    }
  }
  std::vector<int32_t> ids = std::move(prompts[0]);
  req->more_prompts.assign(std::make_move_iterator(prompts.begin() + 1), std::make_move_iterator(prompts.end()));
  req->engine.prompt_ids = std::move(ids);
  req->engine.max_tokens = max_tokens;
  req->engine.timeout_seconds = ctx.timeout_seconds;
  return {};
}

std::string random_hex(int n) {
  thread_local std::mt19937_64 rng{std::random_device{}() ^ static_cast<uint64_t>(
                                       std::chrono::steady_clock::now().time_since_epoch().count())};
  static const char* k_hex = "0123456789abcdef";
  std::string s(n, '0');
  for (auto& c : s) c = k_hex[rng() & 15];
  return s;
}

// Each prompt counted once (its choice 0 carries it), every choice's completion.
json usage_json(const std::vector<ApiChoice>& choices, int n) {
  int64_t prompt = 0, completion = 0;
  for (size_t i = 0; i < choices.size(); ++i) {
    if (n <= 1 || i % static_cast<size_t>(n) == 0) prompt += choices[i].finished.prompt_tokens;
    completion += choices[i].finished.completion_tokens;
  }
  return {{"prompt_tokens", prompt}, {"completion_tokens", completion}, {"total_tokens", prompt + completion}};
}

json usage_json(const EngineEvent& f) { return usage_json(std::vector<ApiChoice>{{"", f, {}}}, 1); }

// Every choice's cache at its end, summed.
json kv_json(const ApiResponseMeta& meta, const std::vector<ApiChoice>& choices) {
  int64_t resident = 0, full = 0;
  for (const ApiChoice& c : choices) {
    resident += c.finished.kv_resident_bytes;
    full += c.finished.kv_full_equivalent_bytes;
  }
  json ratio = nullptr;
  if (resident > 0) ratio = static_cast<double>(full) / resident;
  return {{"policy", kv_policy_name(meta.policy)},
          {"resident_bytes", resident},
          {"full_equivalent_bytes", full},
          {"compression_ratio", ratio},
          {"prefill", choices.empty() ? std::string("chunked") : choices[0].finished.prefill_kind}};
}

json kv_json(const ApiResponseMeta& meta, const EngineEvent& f) { return kv_json(meta, std::vector<ApiChoice>{{"", f, {}}}); }

json envelope(const ApiResponseMeta& meta, const char* object) {
  return {{"id", meta.id}, {"object", object}, {"created", meta.created}, {"model", meta.model}};
}

// A token's bytes as a JSON string: itself when valid UTF-8, else OpenAI's "bytes:\xNN..." form.
std::string token_string(const std::string& bytes) {
  if (utf8_is_valid(bytes)) return bytes;
  std::string s = "bytes:";
  char buf[8];
  for (unsigned char c : bytes) {
    std::snprintf(buf, sizeof buf, "\\x%02x", c);
    s += buf;
  }
  return s;
}

json byte_list(const std::string& bytes) {
  json a = json::array();
  for (unsigned char c : bytes) a.push_back(static_cast<int>(c));
  return a;
}

// The "logprobs" of a choice: null unless asked for.
json logprobs_json(const ApiResponseMeta& meta, const std::vector<ApiLogprob>& entries) {
  if (meta.logprobs < 0) return nullptr;
  if (meta.route == ApiRoute::chat_completions) {
    json content = json::array();
    for (const ApiLogprob& e : entries) {
      json top = json::array();
      for (const auto& [tok, lp] : e.top) top.push_back({{"token", token_string(tok)}, {"logprob", lp}, {"bytes", byte_list(tok)}});
      content.push_back({{"token", token_string(e.token)}, {"logprob", e.logprob}, {"bytes", byte_list(e.token)}, {"top_logprobs", top}});
    }
    return {{"content", content}};
  }
  json tokens = json::array(), token_logprobs = json::array(), top_logprobs = json::array(), offsets = json::array();
  int64_t offset = 0;
  for (const ApiLogprob& e : entries) {
    tokens.push_back(token_string(e.token));
    if (e.null_logprob) {  // an echoed first prompt token
      token_logprobs.push_back(nullptr);
      top_logprobs.push_back(nullptr);
    } else {
      token_logprobs.push_back(e.logprob);
      json top = json::object();
      for (const auto& [tok, lp] : e.top) top[token_string(tok)] = lp;
      top[token_string(e.token)] = e.logprob;  // the sampled (or echoed) token is always listed
      top_logprobs.push_back(top);
    }
    offsets.push_back(offset);
    offset += static_cast<int64_t>(e.token.size());
  }
  return {{"tokens", tokens}, {"token_logprobs", token_logprobs}, {"top_logprobs", top_logprobs}, {"text_offset", offsets}};
}

json finish_json(const std::string& reason) { return reason.empty() ? json(nullptr) : json(reason); }

// The closing fields of a choice, as vLLM writes them: finish_reason is "stop", "length" or
// "abort" (a cancelled request, and one past its time limit, which also says
// "abort_reason": "timeout"); stop_reason is the stop string or stop token id that ended
// it, null for EOS and everything else.
void add_finish(json& choice, const EngineEvent& f) {
  const bool timeout = f.finish_reason == "timeout";
  choice["finish_reason"] = timeout ? json("abort") : finish_json(f.finish_reason);
  choice["stop_reason"] = !f.stop_string.empty() ? json(f.stop_string)
                          : f.stop_token_id >= 0 ? json(f.stop_token_id)
                                                 : json(nullptr);
  if (timeout) choice["abort_reason"] = "timeout";
}

}  // namespace

// --- errors --------------------------------------------------------------------

ApiErrorInfo api_error_info(ApiErrorKind kind) {
  switch (kind) {
    case ApiErrorKind::bad_request: return {400, "invalid_request_error", "invalid_value"};
    case ApiErrorKind::unauthorized: return {401, "authentication_error", "invalid_api_key"};
    case ApiErrorKind::model_not_found: return {404, "invalid_request_error", "model_not_found"};
    case ApiErrorKind::route_not_found: return {404, "invalid_request_error", "not_found"};
    case ApiErrorKind::method_not_allowed: return {405, "invalid_request_error", "method_not_allowed"};
    case ApiErrorKind::request_timeout: return {408, "invalid_request_error", "request_timeout"};
    case ApiErrorKind::payload_too_large: return {413, "invalid_request_error", "payload_too_large"};
    case ApiErrorKind::too_many_requests: return {429, "rate_limit_error", "queue_full"};
    case ApiErrorKind::unavailable: return {503, "server_error", "service_unavailable"};
    case ApiErrorKind::internal: return {500, "server_error", "internal_error"};
  }
  return {500, "server_error", "internal_error"};
}

ApiError api_error_from_status(const Status& status, std::string param) {
  ApiErrorKind kind = ApiErrorKind::internal;
  if (status.code() == StatusCode::k_invalid_argument) kind = ApiErrorKind::bad_request;
  if (status.code() == StatusCode::k_resource_exhausted) kind = ApiErrorKind::too_many_requests;
  if (status.code() == StatusCode::k_unavailable) kind = ApiErrorKind::unavailable;
  if (status.code() == StatusCode::k_not_found) kind = ApiErrorKind::model_not_found;
  return ApiError{kind, status.message(), std::move(param)};
}

std::string api_error_body(const ApiError& error) {
  const ApiErrorInfo info = api_error_info(error.kind);
  json e = {{"message", error.message},
            {"type", info.type},
            {"param", error.param.empty() ? json(nullptr) : json(error.param)},
            {"code", info.code}};
  return dump(json{{"error", e}});
}

// --- requests ------------------------------------------------------------------

bool utf8_is_valid(std::string_view s) {
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    int len = 0;
    uint32_t cp = 0, min = 0;
    if ((c & 0xE0) == 0xC0) len = 2, cp = c & 0x1F, min = 0x80;
    else if ((c & 0xF0) == 0xE0) len = 3, cp = c & 0x0F, min = 0x800;
    else if ((c & 0xF8) == 0xF0) len = 4, cp = c & 0x07, min = 0x10000;
    else return false;
    if (i + len > n) return false;
    for (int k = 1; k < len; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += len;
  }
  return true;
}

ApiParse parse_api_request(ApiRoute route, std::string_view body, const ApiContext& ctx) {
  ApiParse out;
  out.request.route = route;
  if (!utf8_is_valid(body)) {
    out.error = bad("", "request body is not valid UTF-8");
    return out;
  }
  if (json_depth(body) > k_max_json_depth) {
    out.error = bad("", "request body nests JSON deeper than " + std::to_string(k_max_json_depth) + " levels");
    return out;
  }
  json j;
  try {
    j = json::parse(body);
  } catch (const json::exception& e) {
    out.error = bad("", std::string("malformed JSON: ") + e.what());
    return out;
  }
  try {
    out.error = parse_body(route, j, ctx, &out.request);
  } catch (const json::exception& e) {  // a shape the checks above missed: still the client's fault
    out.error = bad("", std::string("invalid request: ") + e.what());
  }
  return out;
}

// --- responses -----------------------------------------------------------------

ApiResponseMeta api_response_meta(const ApiRequest& request, const std::string& model_name) {
  ApiResponseMeta m;
  m.route = request.route;
  m.id = (request.route == ApiRoute::completions ? "cmpl-" : "chatcmpl-") + random_hex(24);
  m.created = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  m.model = model_name;
  m.policy = request.engine.kv_policy.kind;
  m.logprobs = request.engine.logprobs;
  return m;
}

std::string completion_response(const ApiResponseMeta& meta, const std::vector<ApiChoice>& choices, int n) {
  const bool chat = meta.route == ApiRoute::chat_completions;
  json list = json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    const ApiChoice& c = choices[i];
    json choice = {{"index", static_cast<int64_t>(i)}, {"logprobs", logprobs_json(meta, c.logprobs)}};
    add_finish(choice, c.finished);
    if (chat) choice["message"] = {{"role", "assistant"}, {"content", c.text}};
    else choice["text"] = c.text;
    list.push_back(std::move(choice));
  }
  json j = envelope(meta, chat ? "chat.completion" : "text_completion");
  j["choices"] = std::move(list);
  j["usage"] = usage_json(choices, n);
  j["kv"] = kv_json(meta, choices);
  return dump(j);
}

std::string completion_response(const ApiResponseMeta& meta, const std::string& text, const EngineEvent& finished,
                                const std::vector<ApiLogprob>& logprobs) {
  return completion_response(meta, std::vector<ApiChoice>{{text, finished, logprobs}}, 1);
}

std::string stream_chunk(const ApiResponseMeta& meta, const std::string& text, bool with_role,
                         const std::string& finish_reason, const std::vector<ApiLogprob>& logprobs, int index) {
  const bool chat = meta.route == ApiRoute::chat_completions;
  json choice = {{"index", index},
                 {"logprobs", logprobs.empty() ? json(nullptr) : logprobs_json(meta, logprobs)},
                 {"finish_reason", finish_json(finish_reason)}};
  if (chat) {
    json delta = json::object();
    if (with_role) delta["role"] = "assistant";
    if (with_role || !text.empty() || finish_reason.empty()) delta["content"] = text;
    choice["delta"] = delta;
  } else {
    choice["text"] = text;
  }
  json j = envelope(meta, chat ? "chat.completion.chunk" : "text_completion");
  j["choices"] = json::array({choice});
  return dump(j);
}

std::string stream_finish_chunk(const ApiResponseMeta& meta, const EngineEvent& finished, int index) {
  json j = json::parse(stream_chunk(meta, "", false, finished.finish_reason, {}, index));
  add_finish(j["choices"][0], finished);
  return dump(j);
}

std::string stream_usage_chunk(const ApiResponseMeta& meta, const std::vector<ApiChoice>& choices, int n) {
  json j = envelope(meta, meta.route == ApiRoute::chat_completions ? "chat.completion.chunk" : "text_completion");
  j["choices"] = json::array();
  j["usage"] = usage_json(choices, n);
  j["kv"] = kv_json(meta, choices);
  return dump(j);
}

std::string stream_usage_chunk(const ApiResponseMeta& meta, const EngineEvent& finished) {
  json j = envelope(meta, meta.route == ApiRoute::chat_completions ? "chat.completion.chunk" : "text_completion");
  j["choices"] = json::array();
  j["usage"] = usage_json(finished);
  j["kv"] = kv_json(meta, finished);
  return dump(j);
}

std::vector<ApiLogprob> api_prompt_logprobs(const Tokenizer& tokenizer, const std::vector<int32_t>& prompt_ids,
                                            const std::vector<PromptLogprob>& scored) {
  std::vector<ApiLogprob> out;
  if (prompt_ids.empty()) return out;
  ApiLogprob first;
  first.token = tokenizer.token_bytes(prompt_ids[0]);
  first.null_logprob = true;
  out.push_back(std::move(first));
  for (const PromptLogprob& p : scored) {
    ApiLogprob e;
    e.token = tokenizer.token_bytes(p.token_id);
    e.logprob = p.logprob;
    for (const auto& [id, lp] : p.top) e.top.emplace_back(tokenizer.token_bytes(id), lp);
    out.push_back(std::move(e));
  }
  return out;
}

ApiLogprob api_logprob(const Tokenizer& tokenizer, const EngineEvent& token) {
  ApiLogprob e;
  e.token = tokenizer.token_bytes(token.token_id);
  e.logprob = token.logprob;
  for (const auto& [id, lp] : token.top_logprobs) e.top.emplace_back(tokenizer.token_bytes(id), lp);
  return e;
}

std::string sse_event(const std::string& payload) { return "data: " + payload + "\n\n"; }

std::string model_response(const std::string& model_name, int64_t created) {
  return dump(json{{"id", model_name}, {"object", "model"}, {"created", created}, {"owned_by", "snapserve"}});
}

std::string models_response(const std::string& model_name, int64_t created) {
  return dump(json{{"object", "list"}, {"data", json::array({json::parse(model_response(model_name, created))})}});
}

}  // namespace snap
