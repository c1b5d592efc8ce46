// Prompt ids for the default model: the chat prompt built from the GGUF's chat template
// equals, token for token, the ids transformers produced for the golden fixture.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "coordinator/engine/prompt.h"

namespace snap {
namespace {

std::string model_path() {
  if (const char* m = std::getenv("SNAP_MODEL")) return m;
  return std::string(std::getenv("HOME")) + "/.cache/snapserve/SmolLM2-135M-Instruct.Q4_1.gguf";
}

TEST(PromptIds, SmolLM2ChatMatchesTransformers) {
  auto tok = Tokenizer::load_for_model(model_path());
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  std::ifstream in(std::string(SNAP_SOURCE_DIR) + "/tests/fixtures/golden/smollm2_q4_1.json");
  const auto golden = nlohmann::json::parse(in);
  const auto& chat = golden["prompts"][0];
  ASSERT_EQ(chat["format"], "chatml");
  auto ids = prompt_ids_for_chat(*tok, {{"user", "What is the capital of France?"}});
  ASSERT_TRUE(ids.ok()) << ids.status().to_string();
  EXPECT_EQ(*ids, chat["ids"].get<std::vector<int32_t>>());
  EXPECT_EQ(tok->decode(*ids, false), chat["text"].get<std::string>());
}

TEST(PromptIds, SmolLM2PlainTextMatchesTransformers) {
  auto tok = Tokenizer::load_for_model(model_path());
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  std::ifstream in(std::string(SNAP_SOURCE_DIR) + "/tests/fixtures/golden/smollm2_q4_1.json");
  const auto golden = nlohmann::json::parse(in);
  const auto& plain = golden["prompts"][1];
  EXPECT_EQ(prompt_ids_for_text(*tok, plain["text"].get<std::string>()), plain["ids"].get<std::vector<int32_t>>());
}

}  // namespace
}  // namespace snap
