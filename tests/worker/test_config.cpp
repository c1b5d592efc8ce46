// ModelConfig from hand-written config.json files: defaults, per-architecture rules
// (qwen2 bias and use_sliding_window, mistral sliding_window, llama attention_bias, Gemma 3's
// layer pattern and scales), rope_scaling and transformers 5's rope_parameters, eos lists
// (with generation_config.json), and the errors for unsupported or missing fields;
// plus GGUF metadata (tiny GGUF from tools/make_tiny_checkpoint.py) and validate().
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include <nlohmann/json.hpp>

#include "tests/worker/tiny_checkpoint.h"
#include "worker/model/config.h"
#include "worker/model/gguf.h"

namespace snap {
namespace {

using json = nlohmann::json;
using snap::testing::TempDir;

json base_llama() {
  return json{{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"}, {"vocab_size", 1000},
              {"hidden_size", 256}, {"intermediate_size", 512}, {"num_hidden_layers", 3},
              {"num_attention_heads", 8}, {"rms_norm_eps", 1e-5}, {"max_position_embeddings", 4096}};
}

Result<ModelConfig> parse(const TempDir& dir, const json& j) {
  const std::string path = dir / "config.json";
  snap::testing::write_file(path, j.dump());
  return config_from_hf_json(path);
}

// A config that `edit` breaks: one line naming the file, with the expected code and words.
struct BadConfig {
  const char* what;
  std::function<void(json&)> edit;
  StatusCode code;
  const char* needle;
};

template <size_t N>
void expect_one_line_errors(const json& base, const BadConfig (&cases)[N]) {
  TempDir dir("cfg");
  const std::string path = dir / "config.json";
  for (const BadConfig& c : cases) {
    json j = base;
    c.edit(j);
    Result<ModelConfig> r = parse(dir, j);
    ASSERT_FALSE(r.ok()) << c.what;
    EXPECT_EQ(r.status().code(), c.code) << c.what << ": " << r.status().to_string();
    const std::string& m = r.status().message();
    EXPECT_EQ(m.rfind(path + ": ", 0), 0u) << c.what << ": " << m;
    EXPECT_NE(m.find(c.needle), std::string::npos) << c.what << ": " << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << c.what;
  }
}

TEST(HfConfig, LlamaDefaults) {
  TempDir dir("cfg");
  Result<ModelConfig> c = parse(dir, base_llama());
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->arch, Arch::llama);
  EXPECT_STREQ(arch_name(c->arch), "llama");
  EXPECT_EQ(c->vocab_size, 1000);
  EXPECT_EQ(c->hidden_size, 256);
  EXPECT_EQ(c->intermediate_size, 512);
  EXPECT_EQ(c->num_layers, 3);
  EXPECT_EQ(c->num_heads, 8);
  EXPECT_EQ(c->num_kv_heads, 8);  // defaults to num_attention_heads
  EXPECT_EQ(c->head_dim, 32);
  EXPECT_EQ(c->rope.head_dim, 32);
  EXPECT_EQ(c->rope.theta, 10000.0f);
  EXPECT_EQ(c->rope.scaling, kernels::RopeScaling::none);
  EXPECT_FLOAT_EQ(c->rms_norm_eps, 1e-5f);
  EXPECT_EQ(c->max_position, 4096);
  EXPECT_EQ(c->sliding_window, 0);
  EXPECT_FALSE(c->tie_word_embeddings);
  EXPECT_FALSE(c->attention_bias);
  EXPECT_EQ(c->bos_token_id, -1);
  EXPECT_TRUE(c->eos_token_ids.empty());
}

TEST(HfConfig, ExplicitFieldsAndEosList) {
  TempDir dir("cfg");
  json j = base_llama();
  j["num_key_value_heads"] = 2;
  j["head_dim"] = 48;  // differs from hidden/heads = 32
  j["rope_theta"] = 500000.0;
  j["tie_word_embeddings"] = true;
  j["attention_bias"] = true;
  j["bos_token_id"] = 1;
  j["eos_token_id"] = {7, 9};
  Result<ModelConfig> c = parse(dir, j);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->num_kv_heads, 2);
  EXPECT_EQ(c->head_dim, 48);
  EXPECT_EQ(c->rope.head_dim, 48);
  EXPECT_EQ(c->rope.theta, 500000.0f);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_TRUE(c->attention_bias);
  EXPECT_EQ(c->bos_token_id, 1);
  EXPECT_EQ(c->eos_token_ids, (std::vector<int32_t>{7, 9}));
  j["eos_token_id"] = 5;
  Result<ModelConfig> d = parse(dir, j);
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  EXPECT_EQ(d->eos_token_ids, std::vector<int32_t>{5});
}

TEST(HfConfig, RopeScalingForms) {
  TempDir dir("cfg");
  json j = base_llama();
  j["rope_scaling"] = {{"type", "linear"}, {"factor", 4.0}};
  Result<ModelConfig> lin = parse(dir, j);
  ASSERT_TRUE(lin.ok()) << lin.status().to_string();
  EXPECT_EQ(lin->rope.scaling, kernels::RopeScaling::linear);
  EXPECT_EQ(lin->rope.factor, 4.0f);

  j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 32.0}, {"low_freq_factor", 1.0},
                       {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}};
  Result<ModelConfig> l3 = parse(dir, j);
  ASSERT_TRUE(l3.ok()) << l3.status().to_string();
  EXPECT_EQ(l3->rope.scaling, kernels::RopeScaling::llama3);
  EXPECT_EQ(l3->rope.factor, 32.0f);
  EXPECT_EQ(l3->rope.low_freq_factor, 1.0f);
  EXPECT_EQ(l3->rope.high_freq_factor, 4.0f);
  EXPECT_EQ(l3->rope.original_max_position, 8192);

  j["rope_scaling"] = nullptr;
  Result<ModelConfig> none = parse(dir, j);
  ASSERT_TRUE(none.ok()) << none.status().to_string();
  EXPECT_EQ(none->rope.scaling, kernels::RopeScaling::none);

  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  Result<ModelConfig> yarn = parse(dir, j);
  ASSERT_FALSE(yarn.ok());
  EXPECT_EQ(yarn.status().code(), StatusCode::k_unimplemented);
  EXPECT_NE(yarn.status().message().find("'yarn'"), std::string::npos) << yarn.status().message();

  j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}};
  Result<ModelConfig> partial = parse(dir, j);
  ASSERT_FALSE(partial.ok());
  EXPECT_EQ(partial.status().code(), StatusCode::k_not_found);
  EXPECT_NE(partial.status().message().find("low_freq_factor"), std::string::npos) << partial.status().message();
}

// transformers 5 saves rope_theta and the scaling as one rope_parameters object; a Llama 3.1
// config saved that way must not fall back to the default base and no scaling.
TEST(HfConfig, RopeParametersOfTransformers5) {
  TempDir dir("cfg");
  json j = base_llama();
  j["rope_parameters"] = {{"rope_type", "llama3"}, {"rope_theta", 500000.0}, {"factor", 8.0},
                          {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                          {"original_max_position_embeddings", 8192}};
  Result<ModelConfig> l3 = parse(dir, j);
  ASSERT_TRUE(l3.ok()) << l3.status().to_string();
  EXPECT_EQ(l3->rope.theta, 500000.0f);
  EXPECT_EQ(l3->rope.scaling, kernels::RopeScaling::llama3);
  EXPECT_EQ(l3->rope.factor, 8.0f);
  EXPECT_EQ(l3->rope.original_max_position, 8192);

  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1e6}};
  Result<ModelConfig> plain = parse(dir, j);
  ASSERT_TRUE(plain.ok()) << plain.status().to_string();
  EXPECT_EQ(plain->rope.theta, 1e6f);
  EXPECT_EQ(plain->rope.scaling, kernels::RopeScaling::none);

  j["rope_parameters"] = {{"rope_type", "yarn"}, {"rope_theta", 1e6}, {"factor", 4.0}};
  Result<ModelConfig> yarn = parse(dir, j);
  ASSERT_FALSE(yarn.ok());
  EXPECT_EQ(yarn.status().code(), StatusCode::k_unimplemented);
  EXPECT_NE(yarn.status().message().find("rope_parameters type 'yarn'"), std::string::npos)
      << yarn.status().message();
}

// gemma-3-270m-it's config.json as transformers 4.5x saved it (tie_word_embeddings and
// head_dim left to their Gemma3TextConfig defaults).
json base_gemma3() {
  json types = json::array();
  for (int l = 0; l < 18; ++l) types.push_back((l + 1) % 6 == 0 ? "full_attention" : "sliding_attention");
  return json{{"architectures", {"Gemma3ForCausalLM"}}, {"model_type", "gemma3_text"}, {"vocab_size", 262144},
              {"hidden_size", 640}, {"intermediate_size", 2048}, {"num_hidden_layers", 18},
              {"num_attention_heads", 4}, {"num_key_value_heads", 1}, {"rms_norm_eps", 1e-6},
              {"rope_theta", 1000000.0}, {"rope_local_base_freq", 10000.0}, {"rope_scaling", nullptr},
              {"sliding_window", 512}, {"layer_types", types}, {"query_pre_attn_scalar", 256},
              {"hidden_activation", "gelu_pytorch_tanh"}, {"final_logit_softcapping", nullptr},
              {"attn_logit_softcapping", nullptr}, {"max_position_embeddings", 32768},
              {"bos_token_id", 2}, {"eos_token_id", 1}, {"use_bidirectional_attention", false}};
}

void expect_gemma3_270m(const Result<ModelConfig>& c) {
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->arch, Arch::gemma3);
  EXPECT_EQ(c->head_dim, 256);  // Gemma3TextConfig's default, not hidden / heads = 160
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_EQ(c->sliding_window, 512);
  EXPECT_EQ(c->sliding_window_pattern, 6);
  EXPECT_TRUE(c->layer_is_local(4));
  EXPECT_FALSE(c->layer_is_local(5));
  EXPECT_EQ(c->rope.theta, 1e6f);
  EXPECT_EQ(c->rope.scaling, kernels::RopeScaling::none);
  EXPECT_EQ(c->rope_local_theta, 10000.0f);
  EXPECT_TRUE(c->qk_norm);
  EXPECT_TRUE(c->post_norms);
  EXPECT_TRUE(c->gelu_mlp);
  EXPECT_EQ(c->embed_scale, static_cast<float>(std::sqrt(640.0)));
  EXPECT_EQ(c->attn_scale, 1.0f / 16.0f);
  EXPECT_EQ(c->max_position, 32768);
  EXPECT_EQ(c->eos_token_ids, std::vector<int32_t>{1});
}

// The same model from transformers 4's keys, from the older sliding_window_pattern, and from
// transformers 5's rope_parameters (one object per layer type).
TEST(HfConfig, Gemma3TextFromEveryConfigForm) {
  TempDir dir("cfg");
  expect_gemma3_270m(parse(dir, base_gemma3()));

  json old = base_gemma3();
  old.erase("layer_types");
  old["sliding_window_pattern"] = 6;
  expect_gemma3_270m(parse(dir, old));
  old.erase("sliding_window_pattern");  // Gemma3TextConfig's default is 6 too
  expect_gemma3_270m(parse(dir, old));

  json v5 = base_gemma3();
  v5.erase("rope_theta");
  v5.erase("rope_local_base_freq");
  v5.erase("rope_scaling");
  v5["rope_parameters"] = {{"full_attention", {{"rope_type", "default"}, {"rope_theta", 1000000.0}}},
                           {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 10000.0}}}};
  expect_gemma3_270m(parse(dir, v5));

  // Gemma 3 4B's linear scaling applies to the global layers alone.
  v5["rope_parameters"]["full_attention"] = {{"rope_type", "linear"}, {"factor", 8.0}, {"rope_theta", 1000000.0}};
  v5["rope_parameters"]["sliding_attention"]["rope_theta"] = 20000.0;
  Result<ModelConfig> scaled = parse(dir, v5);
  ASSERT_TRUE(scaled.ok()) << scaled.status().to_string();
  EXPECT_EQ(scaled->rope.scaling, kernels::RopeScaling::linear);
  EXPECT_EQ(scaled->rope.factor, 8.0f);
  EXPECT_EQ(scaled->rope_local_theta, 20000.0f);
}

// gemma-3-4b-it's config.json: Gemma3ForConditionalGeneration, whose text_config states only
// what differs from Gemma3TextConfig's defaults; we serve its text model.
TEST(HfConfig, Gemma3VisionLanguageCheckpointServesItsTextModel) {
  TempDir dir("cfg");
  const json j = {
      {"architectures", {"Gemma3ForConditionalGeneration"}}, {"model_type", "gemma3"},
      {"boi_token_index", 255999}, {"eoi_token_index", 256000}, {"eos_token_id", {1, 106}},
      {"image_token_index", 262144}, {"mm_tokens_per_image", 256}, {"torch_dtype", "bfloat16"},
      {"text_config",
       {{"hidden_size", 2560}, {"intermediate_size", 10240}, {"model_type", "gemma3_text"},
        {"num_hidden_layers", 34}, {"rope_scaling", {{"factor", 8.0}, {"rope_type", "linear"}}},
        {"sliding_window", 1024}}},
      {"vision_config", {{"model_type", "siglip_vision_model"}, {"hidden_size", 1152}}}};
  Result<ModelConfig> c = parse(dir, j);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->arch, Arch::gemma3);
  EXPECT_EQ(c->vocab_size, 262208);
  EXPECT_EQ(c->hidden_size, 2560);
  EXPECT_EQ(c->num_layers, 34);
  EXPECT_EQ(c->num_heads, 8);
  EXPECT_EQ(c->num_kv_heads, 4);
  EXPECT_EQ(c->head_dim, 256);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_EQ(c->sliding_window, 1024);
  EXPECT_EQ(c->sliding_window_pattern, 6);
  EXPECT_EQ(c->rope.theta, 1e6f);
  EXPECT_EQ(c->rope.scaling, kernels::RopeScaling::linear);  // global layers only
  EXPECT_EQ(c->rope.factor, 8.0f);
  EXPECT_EQ(c->rope_local_theta, 10000.0f);
  EXPECT_EQ(c->max_position, 131072);
  EXPECT_EQ(c->eos_token_ids, (std::vector<int32_t>{1, 106}));
  EXPECT_EQ(c->bos_token_id, 2);
  EXPECT_EQ(c->attn_scale, 1.0f / 16.0f);

  json bad = j;
  bad["text_config"]["hidden_size"] = "big";
  Result<ModelConfig> b = parse(dir, bad);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().message().rfind(dir / "config.json" + " text_config: field 'hidden_size'", 0), 0u)
      << b.status().message();
  bad.erase("text_config");
  Result<ModelConfig> none = parse(dir, bad);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("needs a 'text_config' object"), std::string::npos)
      << none.status().message();
}

// generation_config.json's stop ids (an -it checkpoint's <end_of_turn>) join config.json's.
TEST(HfConfig, GenerationConfigEosJoinsConfigEos) {
  TempDir dir("cfg");
  snap::testing::write_file(dir / "generation_config.json", R"({"eos_token_id": [1, 106], "top_k": 64})");
  Result<ModelConfig> c = parse(dir, base_gemma3());
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->eos_token_ids, (std::vector<int32_t>{1, 106}));
  snap::testing::write_file(dir / "generation_config.json", R"({"do_sample": true})");
  Result<ModelConfig> none = parse(dir, base_gemma3());
  ASSERT_TRUE(none.ok()) << none.status().to_string();
  EXPECT_EQ(none->eos_token_ids, std::vector<int32_t>{1});
  snap::testing::write_file(dir / "generation_config.json", R"({"eos_token_id": [1,)");
  Result<ModelConfig> bad = parse(dir, base_gemma3());
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::k_data_loss);
  EXPECT_EQ(bad.status().message(), (dir / "generation_config.json") + ": not a JSON object");
}

// Gemma 3 variants the forward does not compute are refused by name, not run wrongly.
TEST(HfConfig, Gemma3VariantsWeDoNotRunAreOneLineErrors) {
  const BadConfig cases[] = {
      {"soft-capping", [](json& j) { j["final_logit_softcapping"] = 30.0; }, StatusCode::k_unimplemented,
       "final_logit_softcapping (logit soft-capping) is not supported"},
      {"irregular layers", [](json& j) { j["layer_types"][7] = "full_attention"; }, StatusCode::k_unimplemented,
       "layer 7 is \"full_attention\""},
      {"unknown layer type", [](json& j) { j["layer_types"][0] = "chunked_attention"; },
       StatusCode::k_invalid_argument, "layer_types[0] is \"chunked_attention\""},
      {"short layer_types", [](json& j) { j["layer_types"].erase(0); }, StatusCode::k_invalid_argument,
       "layer_types must be a list of num_hidden_layers (18) strings"},
      {"erf gelu", [](json& j) { j["hidden_activation"] = "gelu"; }, StatusCode::k_unimplemented,
       "hidden_activation 'gelu' is not supported"},
      {"embedding model", [](json& j) { j["use_bidirectional_attention"] = true; }, StatusCode::k_unimplemented,
       "use_bidirectional_attention"},
      {"scaled local rope",
       [](json& j) {
         j["rope_parameters"] = {{"full_attention", {{"rope_type", "default"}, {"rope_theta", 1e6}}},
                                 {"sliding_attention", {{"rope_type", "linear"}, {"factor", 2.0}}}};
       },
       StatusCode::k_unimplemented, "rope_parameters.sliding_attention.rope_type 'linear'"},
      {"no window", [](json& j) { j["sliding_window"] = 0; }, StatusCode::k_invalid_argument,
       "sliding_window = 0 is out of range"},
  };
  expect_one_line_errors(base_gemma3(), cases);
}

TEST(HfConfig, Qwen2AlwaysHasBiasAndWindowOnlyWhenEnabled) {
  TempDir dir("cfg");
  json j = base_llama();
  j["architectures"] = {"Qwen2ForCausalLM"};
  j["model_type"] = "qwen2";
  j["sliding_window"] = 4096;
  j["use_sliding_window"] = false;
  Result<ModelConfig> off = parse(dir, j);
  ASSERT_TRUE(off.ok()) << off.status().to_string();
  EXPECT_EQ(off->arch, Arch::qwen2);
  EXPECT_TRUE(off->attention_bias);
  EXPECT_EQ(off->sliding_window, 0);
  j["use_sliding_window"] = true;
  Result<ModelConfig> on = parse(dir, j);
  ASSERT_TRUE(on.ok()) << on.status().to_string();
  EXPECT_EQ(on->sliding_window, 4096);
}

TEST(HfConfig, MistralSlidingWindowNullOrInt) {
  TempDir dir("cfg");
  json j = base_llama();
  j.erase("architectures");  // model_type alone is enough
  j["model_type"] = "mistral";
  j["sliding_window"] = nullptr;
  Result<ModelConfig> none = parse(dir, j);
  ASSERT_TRUE(none.ok()) << none.status().to_string();
  EXPECT_EQ(none->arch, Arch::mistral);
  EXPECT_EQ(none->sliding_window, 0);
  EXPECT_FALSE(none->attention_bias);
  j["sliding_window"] = 4096;
  Result<ModelConfig> w = parse(dir, j);
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  EXPECT_EQ(w->sliding_window, 4096);
}

TEST(HfConfig, BadConfigsAreOneLineErrors) {
  const BadConfig cases[] = {
      {"unsupported arch", [](json& j) { j["architectures"] = {"GPT2LMHeadModel"}; }, StatusCode::k_unimplemented,
       "unsupported architecture 'GPT2LMHeadModel' (supported: llama, mistral, qwen2, gemma3_text, gemma3)"},
      {"missing hidden_size", [](json& j) { j.erase("hidden_size"); }, StatusCode::k_not_found,
       "missing field 'hidden_size'"},
      {"missing layers", [](json& j) { j.erase("num_hidden_layers"); }, StatusCode::k_not_found,
       "missing field 'num_hidden_layers'"},
      {"string vocab", [](json& j) { j["vocab_size"] = "big"; }, StatusCode::k_invalid_argument, "'vocab_size'"},
      {"heads not divisible", [](json& j) { j["num_key_value_heads"] = 3; }, StatusCode::k_invalid_argument,
       "num_kv_heads"},
      {"hidden not divisible", [](json& j) { j["num_attention_heads"] = 7; }, StatusCode::k_invalid_argument,
       "num_attention_heads"},
      {"negative layers", [](json& j) { j["num_hidden_layers"] = -1; }, StatusCode::k_invalid_argument,
       "num_hidden_layers"},
      {"eos past vocab", [](json& j) { j["eos_token_id"] = 5000; }, StatusCode::k_invalid_argument, "eos_token_id"},
      {"no arch", [](json& j) { j.erase("architectures"); j.erase("model_type"); }, StatusCode::k_not_found,
       "'architectures'"},
  };
  expect_one_line_errors(base_llama(), cases);
  TempDir dir("cfg");
  const std::string path = dir / "config.json";
  snap::testing::write_file(path, "{\"vocab_size\": 10,");
  Result<ModelConfig> bad = config_from_hf_json(path);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::k_data_loss);
  EXPECT_EQ(bad.status().message(), path + ": not valid JSON");
}

TEST(ModelConfigValidate, CatchesInconsistentValues) {
  ModelConfig c;
  c.vocab_size = 100;
  c.hidden_size = 64;
  c.intermediate_size = 128;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 16;
  c.rope.head_dim = 16;
  c.max_position = 128;
  EXPECT_TRUE(c.validate("x").ok()) << c.validate("x").to_string();
  ModelConfig odd = c;
  odd.head_dim = odd.rope.head_dim = 15;
  EXPECT_EQ(odd.validate("x").code(), StatusCode::k_invalid_argument);
  ModelConfig kv = c;
  kv.num_kv_heads = 3;
  EXPECT_EQ(kv.validate("x").code(), StatusCode::k_invalid_argument);
  ModelConfig eps = c;
  eps.rms_norm_eps = 0.0f;
  EXPECT_EQ(eps.validate("x").code(), StatusCode::k_invalid_argument);
  ModelConfig rope = c;
  rope.rope.head_dim = 8;
  EXPECT_EQ(rope.validate("x").code(), StatusCode::k_invalid_argument);
  EXPECT_EQ(rope.validate("m.gguf").message().rfind("m.gguf: ", 0), 0u);
}

TEST(GgufConfig, ReadsMetadataOfTinyCheckpoint) {
  TempDir dir("cfg");
  ASSERT_TRUE(snap::testing::make_tiny_checkpoint(
      dir.path(), "--arch llama --seed 2 --hidden 48 --heads 4 --kv-heads 2 --head-dim 16 --layers 3 "
                  "--intermediate 80 --vocab 300 --rope-theta 250000 --rope-scaling llama3 --tie"));
  Result<GgufFile> g = GgufFile::open(dir / "model.gguf");
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  Result<ModelConfig> c = config_from_gguf(*g);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->arch, Arch::llama);
  EXPECT_EQ(c->num_layers, 3);
  EXPECT_EQ(c->hidden_size, 48);
  EXPECT_EQ(c->intermediate_size, 80);
  EXPECT_EQ(c->num_heads, 4);
  EXPECT_EQ(c->num_kv_heads, 2);
  EXPECT_EQ(c->head_dim, 16);
  EXPECT_EQ(c->vocab_size, 300);
  EXPECT_EQ(c->rope.theta, 250000.0f);
  EXPECT_EQ(c->rope.scaling, kernels::RopeScaling::llama3);
  EXPECT_EQ(c->rope.factor, 8.0f);
  EXPECT_EQ(c->rope.original_max_position, 8192);
  EXPECT_EQ(c->max_position, 2048);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_FALSE(c->attention_bias);
  EXPECT_EQ(c->name, "tiny-llama");
  // The tool's vocab: 256 bytes, 16 merges, then <|endoftext|> (bos) and <|im_end|> (eos).
  EXPECT_EQ(c->bos_token_id, 272);
  EXPECT_EQ(c->eos_token_ids, std::vector<int32_t>{274});
}

// A Gemma 3 GGUF does not state query_pre_attn_scalar: as llama.cpp, we take head_dim, or
// hidden_size / heads for the 62-layer 27B (whose published scalar is 168, head_dim 128).
TEST(GgufConfig, Gemma3AttentionScaleIsLlamaCppsRule) {
  for (int layers : {4, 62}) {
    TempDir dir("cfg");
    ASSERT_TRUE(snap::testing::make_tiny_checkpoint(
        dir.path(), "--arch gemma3 --tie --hidden 64 --heads 4 --kv-heads 2 --head-dim 32 --intermediate 32 "
                    "--sliding-window 8 --sliding-window-pattern 2 --layers " + std::to_string(layers)));
    Result<GgufFile> g = GgufFile::open(dir / "model.gguf");
    ASSERT_TRUE(g.ok()) << g.status().to_string();
    Result<ModelConfig> c = config_from_gguf(*g);
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    EXPECT_EQ(c->arch, Arch::gemma3);
    EXPECT_EQ(c->head_dim, 32);
    EXPECT_EQ(c->attn_scale, static_cast<float>(1.0 / std::sqrt(layers == 62 ? 64.0 / 4 : 32.0))) << layers;
  }
}

}  // namespace
}  // namespace snap
