// The OpenAI protocol layer without sockets: every bad body in the table is rejected with
// the HTTP status and "param" a client would check; good bodies become the EngineRequest
// they describe (prompt ids from the real SmolLM2 tokenizer); responses and SSE chunks
// have the shapes OpenAI clients parse.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "coordinator/engine/prompt.h"
#include "coordinator/http/openai.h"

namespace snap {
namespace {

using nlohmann::json;

std::string model_path() {
  if (const char* m = std::getenv("SNAP_MODEL")) return m;
  return std::string(std::getenv("HOME")) + "/.cache/snapserve/SmolLM2-135M-Instruct.Q4_1.gguf";
}

class OpenAi : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ASSERT_TRUE(std::filesystem::exists(model_path())) << "default model missing at " << model_path()
                                                       << " (run scripts/setup.sh or set SNAP_MODEL)";
    auto tok = Tokenizer::load_for_model(model_path());
    ASSERT_TRUE(tok.ok()) << tok.status().to_string();
    tokenizer_ = new Tokenizer(std::move(tok).value());
  }
  void SetUp() override {
    ASSERT_NE(tokenizer_, nullptr);
    ctx_.tokenizer = tokenizer_;
    ctx_.model_name = "smol";
    ctx_.context_length = 2048;
    ctx_.max_prompt_tokens = 2047;
    ctx_.max_tokens_limit = 2048;
    ctx_.timeout_seconds = 30;
  }
  ApiParse completions(const std::string& body) { return parse_api_request(ApiRoute::completions, body, ctx_); }
  ApiParse chat(const std::string& body) { return parse_api_request(ApiRoute::chat_completions, body, ctx_); }

  static Tokenizer* tokenizer_;
  ApiContext ctx_;
};
Tokenizer* OpenAi::tokenizer_ = nullptr;

std::string token_list(int n) {
  std::string s = "[";
  for (int i = 0; i < n; ++i) s += (i ? ",1" : "1");
  return s + "]";
}

struct BadCase {
  const char* name;
  ApiRoute route;
  std::string body;
  int status;
  std::string param;
};

TEST_F(OpenAi, BadRequestsGetStatusAndParam) {
  const ApiRoute C = ApiRoute::completions, H = ApiRoute::chat_completions;
  const std::vector<BadCase> cases = {
      {"malformed json", C, "{\"prompt\": \"hi\"", 400, ""},
      {"not an object", C, "[1, 2]", 400, ""},
      {"invalid utf-8", C, "{\"prompt\": \"a\xff" "b\"}", 400, ""},
      {"lone surrogate escape", C, "{\"prompt\": \"\\ud800\"}", 400, ""},
      {"deep nesting", C, std::string(200, '[') + std::string(200, ']'), 400, ""},
      {"missing prompt", C, "{\"max_tokens\": 4}", 400, "prompt"},
      {"prompt wrong type", C, "{\"prompt\": 5}", 400, "prompt"},
      {"prompt empty list", C, "{\"prompt\": []}", 400, "prompt"},
      {"65 prompts", C, "{\"prompt\": [" + [] { std::string s; for (int i = 0; i < 65; ++i) s += i ? ",\"a\"" : "\"a\""; return s; }() + "]}", 400, "prompt"},
      {"token id outside vocab", C, "{\"prompt\": [1, 99999999]}", 400, "prompt"},
      {"negative token id", C, "{\"prompt\": [1, -3]}", 400, "prompt"},
      {"prompt over the limit", C, "{\"prompt\": " + token_list(2100) + "}", 400, "prompt"},
      {"prompt + max_tokens over context", C, "{\"prompt\": " + token_list(2000) + ", \"max_tokens\": 100}", 400, "max_tokens"},
      {"negative max_tokens", C, "{\"prompt\": \"hi\", \"max_tokens\": -1}", 400, "max_tokens"},
      {"huge max_tokens", C, "{\"prompt\": \"hi\", \"max_tokens\": 1000000}", 400, "max_tokens"},
      {"max_tokens past int64", C, "{\"prompt\": \"hi\", \"max_tokens\": 99999999999999999999}", 400, "max_tokens"},
      {"max_tokens float", C, "{\"prompt\": \"hi\", \"max_tokens\": 1.5}", 400, "max_tokens"},
      {"max_tokens string", C, "{\"prompt\": \"hi\", \"max_tokens\": \"16\"}", 400, "max_tokens"},
      {"temperature too high", C, "{\"prompt\": \"hi\", \"temperature\": 2.5}", 400, "temperature"},
      {"temperature string", C, "{\"prompt\": \"hi\", \"temperature\": \"hot\"}", 400, "temperature"},
      {"top_p zero", C, "{\"prompt\": \"hi\", \"top_p\": 0}", 400, "top_p"},
      {"top_k below -1", C, "{\"prompt\": \"hi\", \"top_k\": -2}", 400, "top_k"},
      {"min_p above 1", C, "{\"prompt\": \"hi\", \"min_p\": 1.5}", 400, "min_p"},
      {"seed string", C, "{\"prompt\": \"hi\", \"seed\": \"x\"}", 400, "seed"},
      {"n = 0", C, "{\"prompt\": \"hi\", \"n\": 0}", 400, "n"},
      {"n = 65", C, "{\"prompt\": \"hi\", \"n\": 65}", 400, "n"},
      {"prompt list with a number", C, "{\"prompt\": [\"a\", 5]}", 400, "prompt"},
      {"prompt list with an empty one", C, "{\"prompt\": [\"a\", []]}", 400, "prompt"},
      {"stop number", C, "{\"prompt\": \"hi\", \"stop\": 5}", 400, "stop"},
      {"five stops", C, "{\"prompt\": \"hi\", \"stop\": [\"a\",\"b\",\"c\",\"d\",\"e\"]}", 400, "stop"},
      {"stream string", C, "{\"prompt\": \"hi\", \"stream\": \"yes\"}", 400, "stream"},
      {"include_usage string", C, "{\"prompt\": \"hi\", \"stream\": true, \"stream_options\": {\"include_usage\": 1}}", 400,
       "stream_options.include_usage"},
      {"logprobs over 20", C, "{\"prompt\": \"hi\", \"logprobs\": 21}", 400, "logprobs"},
      {"logprobs true on completions", C, "{\"prompt\": \"hi\", \"logprobs\": true}", 400, "logprobs"},
      {"echo + logprobs streamed", C, "{\"prompt\": \"hi\", \"echo\": true, \"logprobs\": 1, \"stream\": true}", 400, "echo"},
      {"max_tokens 0 without echo", C, "{\"prompt\": \"hi\", \"max_tokens\": 0}", 400, "max_tokens"},
      {"best_of 2", C, "{\"prompt\": \"hi\", \"best_of\": 2}", 400, "best_of"},
      {"suffix", C, "{\"prompt\": \"hi\", \"suffix\": \"end\"}", 400, "suffix"},
      {"unknown field", C, "{\"prompt\": \"hi\", \"unknown_field\": {\"x\": 1}}", 400, "unknown_field"},
      {"chat field on completions", C, "{\"prompt\": \"hi\", \"top_logprobs\": 2}", 400, "top_logprobs"},
      {"presence_penalty too high", C, "{\"prompt\": \"hi\", \"presence_penalty\": 2.5}", 400, "presence_penalty"},
      {"frequency_penalty string", C, "{\"prompt\": \"hi\", \"frequency_penalty\": \"x\"}", 400, "frequency_penalty"},
      {"repetition_penalty zero", C, "{\"prompt\": \"hi\", \"repetition_penalty\": 0}", 400, "repetition_penalty"},
      {"logit_bias list", C, "{\"prompt\": \"hi\", \"logit_bias\": [1]}", 400, "logit_bias"},
      {"logit_bias key", C, "{\"prompt\": \"hi\", \"logit_bias\": {\"abc\": 1}}", 400, "logit_bias"},
      {"logit_bias id past vocab", C, "{\"prompt\": \"hi\", \"logit_bias\": {\"49152\": 1}}", 400, "logit_bias"},
      {"logit_bias value", C, "{\"prompt\": \"hi\", \"logit_bias\": {\"12\": 101}}", 400, "logit_bias"},
      {"min_tokens negative", C, "{\"prompt\": \"hi\", \"min_tokens\": -1}", 400, "min_tokens"},
      {"stop_token_ids string", C, "{\"prompt\": \"hi\", \"stop_token_ids\": \"2\"}", 400, "stop_token_ids"},
      {"stop_token_ids past vocab", C, "{\"prompt\": \"hi\", \"stop_token_ids\": [2, 99999]}", 400, "stop_token_ids"},
      {"tools", H, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"tools\": [{\"type\": \"function\"}]}", 400, "tools"},
      {"tool_choice auto", H, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"tool_choice\": \"auto\"}", 400, "tool_choice"},
      {"functions", H, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"functions\": [{}]}", 400, "functions"},
      {"json mode", H, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"response_format\": {\"type\": \"json_object\"}}", 400, "response_format"},
      {"top_logprobs without logprobs", H, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"top_logprobs\": 2}", 400, "top_logprobs"},
      {"chat logprobs int", H, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"logprobs\": 3}", 400, "logprobs"},
      {"completions field on chat", H, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"echo\": false}", 400, "echo"},
      {"unknown model", C, "{\"model\": \"gpt-4\", \"prompt\": \"hi\"}", 404, "model"},
      {"kv_compression string", C, "{\"prompt\": \"hi\", \"kv_compression\": \"snapkv\"}", 400, "kv_compression"},
      {"kv missing policy", C, "{\"prompt\": \"hi\", \"kv_compression\": {\"budget\": 64}}", 400, "kv_compression.policy"},
      {"unknown policy", C, "{\"prompt\": \"hi\", \"kv_compression\": {\"policy\": \"magic\"}}", 400, "kv_compression.policy"},
      {"budget below window", C,
       "{\"prompt\": \"hi\", \"kv_compression\": {\"policy\": \"snapkv\", \"budget\": 16, \"window\": 32}}", 400,
       "kv_compression.budget"},
      {"even kernel", C, "{\"prompt\": \"hi\", \"kv_compression\": {\"policy\": \"snapkv\", \"budget\": 64, \"kernel\": 4}}",
       400, "kv_compression.kernel"},
      {"unknown pooling", C, "{\"prompt\": \"hi\", \"kv_compression\": {\"policy\": \"snapkv\", \"pooling\": \"median\"}}",
       400, "kv_compression.pooling"},
      {"misspelled kv key", C, "{\"prompt\": \"hi\", \"kv_compression\": {\"policy\": \"snapkv\", \"budgt\": 64}}", 400,
       "kv_compression.budgt"},
      {"negative budget", C, "{\"prompt\": \"hi\", \"kv_compression\": {\"policy\": \"h2o\", \"budget\": -4}}", 400,
       "kv_compression.budget"},
      {"missing messages", H, "{\"max_tokens\": 4}", 400, "messages"},
      {"empty messages", H, "{\"messages\": []}", 400, "messages"},
      {"messages string", H, "{\"messages\": \"hi\"}", 400, "messages"},
      {"unknown role", H, "{\"messages\": [{\"role\": \"robot\", \"content\": \"hi\"}]}", 400, "messages[0].role"},
      {"missing role", H, "{\"messages\": [{\"content\": \"hi\"}]}", 400, "messages[0].role"},
      {"content number", H, "{\"messages\": [{\"role\": \"user\", \"content\": 5}]}", 400, "messages[0].content"},
      {"content image part", H,
       "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image_url\", \"image_url\": {}}]}]}", 400,
       "messages[0].content"},
      {"negative max_completion_tokens", H,
       "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"max_completion_tokens\": -1}", 400,
       "max_completion_tokens"},
  };
  for (const BadCase& c : cases) {
    const ApiParse p = parse_api_request(c.route, c.body, ctx_);
    ASSERT_TRUE(p.error.has_value()) << c.name << ": accepted";
    EXPECT_EQ(api_error_info(p.error->kind).http_status, c.status) << c.name << ": " << p.error->message;
    EXPECT_EQ(p.error->param, c.param) << c.name << ": " << p.error->message;
    EXPECT_FALSE(p.error->message.empty()) << c.name;
    EXPECT_EQ(p.error->message.find('\n'), std::string::npos) << c.name << ": message is not one line";
  }
}

TEST_F(OpenAi, BudgetBelowWindowMessageNamesBoth) {
  const ApiParse p = completions(
      "{\"prompt\": \"hi\", \"kv_compression\": {\"policy\": \"snapkv\", \"budget\": 16, \"window\": 32}}");
  ASSERT_TRUE(p.error.has_value());
  EXPECT_NE(p.error->message.find("budget 16 must be larger than window 32"), std::string::npos) << p.error->message;
}

TEST_F(OpenAi, CompletionDefaults) {
  const ApiParse p = completions("{\"prompt\": \"The capital of France is\", \"user\": \"u-1\"}");
  ASSERT_FALSE(p.error.has_value()) << p.error->message;
  const EngineRequest& e = p.request.engine;
  EXPECT_EQ(e.prompt_ids, prompt_ids_for_text(*tokenizer_, "The capital of France is"));
  EXPECT_EQ(e.max_tokens, 16);
  EXPECT_FLOAT_EQ(e.sampling.temperature, 1.0f);
  EXPECT_FLOAT_EQ(e.sampling.top_p, 1.0f);
  EXPECT_EQ(e.sampling.top_k, 0);
  EXPECT_TRUE(e.stop.empty());
  EXPECT_FALSE(e.ignore_eos);
  EXPECT_EQ(e.kv_policy.kind, KvPolicyKind::full);
  EXPECT_DOUBLE_EQ(e.timeout_seconds, 30);
  EXPECT_FALSE(p.request.stream);
  EXPECT_FALSE(p.request.include_usage);
}

TEST_F(OpenAi, CompletionEveryField) {
  const ApiParse p = completions(R"({"model": "smol", "prompt": ["Once upon a time"], "max_tokens": 7,
      "temperature": 0, "top_p": 0.9, "top_k": -1, "min_p": 0.05, "seed": 42, "stop": ["\n", "The end"],
      "n": 1, "stream": true, "stream_options": {"include_usage": true}, "ignore_eos": true, "logprobs": null,
      "kv_compression": {"policy": "snapkv", "budget": 64, "window": 8, "kernel": 5, "pooling": "max",
                         "gqa": "max", "layerwise": true}})");
  ASSERT_FALSE(p.error.has_value()) << p.error->message;
  const EngineRequest& e = p.request.engine;
  EXPECT_EQ(e.prompt_ids, prompt_ids_for_text(*tokenizer_, "Once upon a time"));
  EXPECT_EQ(e.max_tokens, 7);
  EXPECT_FLOAT_EQ(e.sampling.temperature, 0.0f);
  EXPECT_FLOAT_EQ(e.sampling.top_p, 0.9f);
  EXPECT_EQ(e.sampling.top_k, 0);
  EXPECT_FLOAT_EQ(e.sampling.min_p, 0.05f);
  EXPECT_EQ(e.sampling.seed, 42u);
  EXPECT_EQ(e.stop, (std::vector<std::string>{"\n", "The end"}));
  EXPECT_TRUE(e.ignore_eos);
  EXPECT_TRUE(p.request.stream);
  EXPECT_TRUE(p.request.include_usage);
  EXPECT_EQ(e.kv_policy.kind, KvPolicyKind::snapkv);
  EXPECT_EQ(e.kv_policy.budget, 64);
  EXPECT_EQ(e.kv_policy.window, 8);
  EXPECT_EQ(e.kv_policy.kernel, 5);
  EXPECT_EQ(e.kv_policy.pooling, KvPooling::max);  // not the default (avg): the field is read
  EXPECT_EQ(e.kv_policy.aggregation, GqaAggregation::max);
  EXPECT_TRUE(e.kv_policy.layerwise);
}

// kv_compression with only a policy gets SnapKV's defaults, the ones docs/eval.md's sweeps chose:
// budget 1024, window 32, kernel 31, average pooling (seventh sweep), mean GQA aggregation.
TEST_F(OpenAi, SnapKvDefaults) {
  const ApiParse p = completions(R"({"prompt": "hi", "kv_compression": {"policy": "snapkv"}})");
  ASSERT_FALSE(p.error.has_value()) << p.error->message;
  const KvPolicy& k = p.request.engine.kv_policy;
  EXPECT_EQ(k.kind, KvPolicyKind::snapkv);
  EXPECT_EQ(k.budget, 1024);
  EXPECT_EQ(k.window, 32);
  EXPECT_EQ(k.kernel, 31);
  EXPECT_EQ(k.pooling, KvPooling::avg);
  EXPECT_EQ(k.aggregation, GqaAggregation::mean);
  EXPECT_FALSE(k.layerwise);
}

TEST_F(OpenAi, SamplingExtrasAndLogprobs) {
  const ApiParse c = completions(R"({"prompt": "hi", "logprobs": 3, "presence_penalty": 0.5, "frequency_penalty": -1,
      "repetition_penalty": 1.2, "logit_bias": {"12": -100, "7": 2.5}, "min_tokens": 4, "max_tokens": 8,
      "stop_token_ids": [2, 30], "best_of": 1, "suffix": null, "echo": false})");
  ASSERT_FALSE(c.error.has_value()) << c.error->message;
  const EngineRequest& e = c.request.engine;
  EXPECT_EQ(e.logprobs, 3);
  EXPECT_FLOAT_EQ(e.presence_penalty, 0.5f);
  EXPECT_FLOAT_EQ(e.frequency_penalty, -1.0f);
  EXPECT_FLOAT_EQ(e.repetition_penalty, 1.2f);
  EXPECT_EQ(e.logit_bias, (std::vector<std::pair<int32_t, float>>{{12, -100.0f}, {7, 2.5f}}));
  EXPECT_EQ(e.min_tokens, 4);
  EXPECT_EQ(e.stop_token_ids, (std::vector<int32_t>{2, 30}));
  EXPECT_EQ(completions(R"({"prompt": "hi"})").request.engine.logprobs, -1);
  EXPECT_EQ(completions(R"({"prompt": "hi", "logprobs": 0})").request.engine.logprobs, 0);
  EXPECT_EQ(completions(R"({"prompt": "hi", "logprobs": false})").request.engine.logprobs, -1);

  const std::string msg = R"("messages": [{"role": "user", "content": "hi"}])";
  auto chat_lp = [&](const std::string& extra) { return chat("{" + msg + extra + "}"); };
  EXPECT_EQ(chat_lp(R"(, "logprobs": true, "top_logprobs": 5)").request.engine.logprobs, 5);
  EXPECT_EQ(chat_lp(R"(, "logprobs": true)").request.engine.logprobs, 0);
  EXPECT_EQ(chat_lp(R"(, "logprobs": false)").request.engine.logprobs, -1);
  // Accepted because they ask for nothing we lack.
  for (const char* extra : {R"(, "tools": [])", R"(, "tool_choice": "none")", R"(, "response_format": {"type": "text"})",
                            R"(, "parallel_tool_calls": false)", R"(, "user": "u")"}) {
    const ApiParse p = chat_lp(extra);
    EXPECT_FALSE(p.error.has_value()) << extra << ": " << p.error->message;
  }
}

TEST_F(OpenAi, LogprobsInResponsesAndChunks) {
  ApiResponseMeta meta;
  meta.id = "cmpl-1";
  meta.model = "smol";
  meta.logprobs = 1;
  EngineEvent f;
  f.kind = EngineEvent::Kind::finished;
  f.finish_reason = "length";
  const std::vector<ApiLogprob> lps = {{" Paris", false, -0.25f, {{" Paris", -0.25f}}}, {"\xe2\x82", false, -1.5f, {{".", -0.5f}}}};
  const json c = json::parse(completion_response(meta, " Paris\xe2\x82", f, lps));
  const json& l = c["choices"][0]["logprobs"];
  EXPECT_EQ(l["tokens"], (json{" Paris", "bytes:\\xe2\\x82"})) << "a partial UTF-8 token in OpenAI's bytes: form";
  EXPECT_EQ(l["token_logprobs"], (json{-0.25, -1.5}));
  EXPECT_EQ(l["top_logprobs"][1], (json{{".", -0.5}, {"bytes:\\xe2\\x82", -1.5}})) << "the sampled token is listed";
  EXPECT_EQ(l["text_offset"], (json{0, 6}));

  meta.route = ApiRoute::chat_completions;
  const json h = json::parse(completion_response(meta, "x", f, lps));
  const json& content = h["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 2u);
  EXPECT_EQ(content[0]["token"], " Paris");
  EXPECT_EQ(content[1]["bytes"], (json{0xe2, 0x82}));
  EXPECT_EQ(content[1]["top_logprobs"][0]["token"], ".");
  const json chunk = json::parse(stream_chunk(meta, "x", false, "", {lps[0]}));
  EXPECT_EQ(chunk["choices"][0]["logprobs"]["content"][0]["logprob"], -0.25);
  meta.logprobs = -1;
  EXPECT_TRUE(json::parse(completion_response(meta, "x", f))["choices"][0]["logprobs"].is_null());
}

TEST_F(OpenAi, ChoicesAndPromptLists) {
  const ApiParse p = completions(R"({"prompt": ["Once upon a time", [504, 3458], "The end"], "n": 3})");
  ASSERT_FALSE(p.error.has_value()) << p.error->message;
  EXPECT_EQ(p.request.engine.n, 3);
  EXPECT_EQ(p.request.engine.prompt_ids, prompt_ids_for_text(*tokenizer_, "Once upon a time"));
  ASSERT_EQ(p.request.more_prompts.size(), 2u);
  EXPECT_EQ(p.request.more_prompts[0], (std::vector<int32_t>{504, 3458}));
  EXPECT_EQ(p.request.more_prompts[1], prompt_ids_for_text(*tokenizer_, "The end"));
  EXPECT_EQ(p.request.num_choices(), 9);
  // A list of one string is one prompt; a too-long prompt in a list is named by its index.
  EXPECT_TRUE(completions(R"({"prompt": ["Hello"]})").request.more_prompts.empty());
  const ApiParse long_one = completions("{\"prompt\": [\"ok\", " + token_list(2100) + "]}");
  ASSERT_TRUE(long_one.error.has_value());
  EXPECT_NE(long_one.error->message.find("prompt[1] has 2100 tokens"), std::string::npos) << long_one.error->message;
  EXPECT_EQ(chat(R"({"messages": [{"role": "user", "content": "hi"}], "n": 4})").request.engine.n, 4);

  ApiResponseMeta meta;
  meta.id = "cmpl-2";
  std::vector<ApiChoice> choices(4);
  for (int i = 0; i < 4; ++i) {
    choices[i].text = "t" + std::to_string(i);
    choices[i].finished.finish_reason = "length";
    choices[i].finished.prompt_tokens = i < 2 ? 5 : 7;  // two prompts, n = 2
    choices[i].finished.completion_tokens = 3;
    choices[i].finished.kv_resident_bytes = 100;
    choices[i].finished.kv_full_equivalent_bytes = 400;
  }
  const json j = json::parse(completion_response(meta, choices, 2));
  ASSERT_EQ(j["choices"].size(), 4u);
  EXPECT_EQ(j["choices"][3]["index"], 3);
  EXPECT_EQ(j["choices"][3]["text"], "t3");
  EXPECT_EQ(j["usage"]["prompt_tokens"], 12) << "each prompt once";
  EXPECT_EQ(j["usage"]["completion_tokens"], 12);
  EXPECT_EQ(j["kv"]["resident_bytes"], 400);
  EXPECT_EQ(j["kv"]["compression_ratio"], 4.0);
  EXPECT_EQ(json::parse(stream_chunk(meta, "x", false, "", {}, 3))["choices"][0]["index"], 3);
}

TEST_F(OpenAi, PromptAsTokenIds) {
  const ApiParse p = completions("{\"prompt\": [504, 3458, 282], \"max_tokens\": 3, \"top_k\": 40}");
  ASSERT_FALSE(p.error.has_value()) << p.error->message;
  EXPECT_EQ(p.request.engine.prompt_ids, (std::vector<int32_t>{504, 3458, 282}));
  EXPECT_EQ(p.request.engine.sampling.top_k, 40);
}

TEST_F(OpenAi, ChatUsesTheTemplateAndMaxCompletionTokens) {
  const ApiParse p = chat(R"({"messages": [{"role": "system", "content": "Be brief."},
      {"role": "user", "content": [{"type": "text", "text": "What is the capital "}, {"type": "text", "text": "of France?"}]}],
      "max_completion_tokens": 9, "temperature": 0})");
  ASSERT_FALSE(p.error.has_value()) << p.error->message;
  auto ids = prompt_ids_for_chat(*tokenizer_, {{"system", "Be brief."}, {"user", "What is the capital of France?"}});
  ASSERT_TRUE(ids.ok()) << ids.status().to_string();
  EXPECT_EQ(p.request.engine.prompt_ids, *ids);
  EXPECT_EQ(p.request.engine.max_tokens, 9);
  EXPECT_EQ(p.request.route, ApiRoute::chat_completions);
}

TEST_F(OpenAi, ChatDefaultMaxTokensFillsTheContext) {
  const ApiParse p = chat(R"({"messages": [{"role": "user", "content": "Hi"}]})");
  ASSERT_FALSE(p.error.has_value()) << p.error->message;
  const int64_t n = static_cast<int64_t>(p.request.engine.prompt_ids.size());
  EXPECT_GT(n, 0);
  EXPECT_EQ(p.request.engine.max_tokens, ctx_.context_length - n);
}

TEST(OpenAiErrors, KindsMapToHttpStatuses) {
  const std::vector<std::pair<ApiErrorKind, int>> table = {
      {ApiErrorKind::bad_request, 400},        {ApiErrorKind::unauthorized, 401},
      {ApiErrorKind::model_not_found, 404},    {ApiErrorKind::route_not_found, 404},
      {ApiErrorKind::method_not_allowed, 405}, {ApiErrorKind::request_timeout, 408},
      {ApiErrorKind::payload_too_large, 413},  {ApiErrorKind::too_many_requests, 429},
      {ApiErrorKind::unavailable, 503},        {ApiErrorKind::internal, 500},
  };
  for (auto [kind, status] : table) EXPECT_EQ(api_error_info(kind).http_status, status);
  EXPECT_EQ(api_error_info(api_error_from_status(resource_exhausted("queue full")).kind).http_status, 429);
  EXPECT_EQ(api_error_info(api_error_from_status(invalid_argument("bad")).kind).http_status, 400);
  EXPECT_EQ(api_error_info(api_error_from_status(internal_error("boom")).kind).http_status, 500);
}

TEST(OpenAiErrors, BodyHasOpenAiShape) {
  const json j = json::parse(api_error_body({ApiErrorKind::bad_request, "max_tokens must be at least 1", "max_tokens"}));
  ASSERT_TRUE(j.contains("error"));
  EXPECT_EQ(j["error"]["message"], "max_tokens must be at least 1");
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_EQ(j["error"]["param"], "max_tokens");
  EXPECT_TRUE(j["error"].contains("code"));
  const json k = json::parse(api_error_body({ApiErrorKind::unauthorized, "no key", ""}));
  EXPECT_TRUE(k["error"]["param"].is_null());
}

EngineEvent finished_event() {
  EngineEvent f;
  f.kind = EngineEvent::Kind::finished;
  f.finish_reason = "length";
  f.prompt_tokens = 11;
  f.completion_tokens = 5;
  f.kv_resident_bytes = 1000;
  f.kv_full_equivalent_bytes = 4000;
  return f;
}

TEST(OpenAiResponses, CompletionObject) {
  ApiRequest req;
  req.engine.kv_policy.kind = KvPolicyKind::snapkv;
  const ApiResponseMeta meta = api_response_meta(req, "smol");
  const json j = json::parse(completion_response(meta, "Paris.", finished_event()));
  EXPECT_EQ(j["id"].get<std::string>().rfind("cmpl-", 0), 0u);
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["model"], "smol");
  EXPECT_GT(j["created"].get<int64_t>(), 1700000000);
  EXPECT_EQ(j["choices"][0]["text"], "Paris.");
  EXPECT_EQ(j["choices"][0]["index"], 0);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(j["choices"][0]["logprobs"].is_null());
  EXPECT_EQ(j["usage"]["prompt_tokens"], 11);
  EXPECT_EQ(j["usage"]["completion_tokens"], 5);
  EXPECT_EQ(j["usage"]["total_tokens"], 16);
  EXPECT_EQ(j["kv"]["policy"], "snapkv");
  EXPECT_EQ(j["kv"]["resident_bytes"], 1000);
  EXPECT_EQ(j["kv"]["full_equivalent_bytes"], 4000);
  EXPECT_DOUBLE_EQ(j["kv"]["compression_ratio"].get<double>(), 4.0);
}

TEST(OpenAiResponses, ChatObjectAndChunks) {
  ApiRequest req;
  req.route = ApiRoute::chat_completions;
  const ApiResponseMeta meta = api_response_meta(req, "smol");
  const json j = json::parse(completion_response(meta, "Hello", finished_event()));
  EXPECT_EQ(j["id"].get<std::string>().rfind("chatcmpl-", 0), 0u);
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(j["choices"][0]["message"]["content"], "Hello");

  const json first = json::parse(stream_chunk(meta, "", true, ""));
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["id"], j["id"]);
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  EXPECT_TRUE(first["choices"][0]["finish_reason"].is_null());
  const json mid = json::parse(stream_chunk(meta, "Hel", false, ""));
  EXPECT_FALSE(mid["choices"][0]["delta"].contains("role"));
  EXPECT_EQ(mid["choices"][0]["delta"]["content"], "Hel");
  const json last = json::parse(stream_chunk(meta, "", false, "stop"));
  EXPECT_EQ(last["choices"][0]["finish_reason"], "stop");
  EXPECT_TRUE(last["choices"][0]["delta"].empty());
  const json usage = json::parse(stream_usage_chunk(meta, finished_event()));
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["total_tokens"], 16);
}

TEST(OpenAiResponses, CompletionChunkAndSseFraming) {
  ApiRequest req;
  const ApiResponseMeta meta = api_response_meta(req, "smol");
  const json c = json::parse(stream_chunk(meta, " Paris", false, ""));
  EXPECT_EQ(c["object"], "text_completion");
  EXPECT_EQ(c["choices"][0]["text"], " Paris");
  EXPECT_EQ(sse_event("[DONE]"), "data: [DONE]\n\n");
  const json m = json::parse(models_response("smol", 123));
  EXPECT_EQ(m["object"], "list");
  EXPECT_EQ(m["data"][0]["id"], "smol");
  EXPECT_EQ(m["data"][0]["object"], "model");
}

TEST(OpenAiUtf8, Validation) {
  EXPECT_TRUE(utf8_is_valid("plain ascii"));
  EXPECT_TRUE(utf8_is_valid("caf\xc3\xa9 \xf0\x9d\x84\x9e"));
  EXPECT_FALSE(utf8_is_valid("\xc0\xaf"));          // overlong '/'
  EXPECT_FALSE(utf8_is_valid("\xed\xa0\x80"));      // surrogate
  EXPECT_FALSE(utf8_is_valid("\xf4\x90\x80\x80"));  // past U+10FFFF
  EXPECT_FALSE(utf8_is_valid("caf\xc3"));           // cut sequence
  EXPECT_FALSE(utf8_is_valid("\x80"));
}

}  // namespace
}  // namespace snap
