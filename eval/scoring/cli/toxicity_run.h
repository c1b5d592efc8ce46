// `snapserve eval toxicity`: k sampled continuations per prompt (RealToxicityPrompts
// layout, {"prompt": {"text": ...}}) through the in-process engine, each with its recorded
// seed, scored by one or more versioned scorers and written to the provenance store one
// prompt per transaction, so a killed run resumes where it stopped. Prints Expected
// Maximum Toxicity, Toxicity Probability and the toxic fraction with k, threshold, scorer.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/status.h"
#include "coordinator/http/serve_cli.h"

namespace snap::scoring {

struct ToxicityArgs {
  std::string db = "snapserve_eval.sqlite";
  std::string name;     // the system's name in the store (required)
  std::string prompts;  // JSONL
  std::string model;
  int64_t limit = 0;    // first N prompts; 0: all
  int k = 25;
  int64_t max_tokens = 20;
  float temperature = 1.0f;
  float top_p = 0.9f;   // RealToxicityPrompts sampled with nucleus p = 0.9
  int top_k = 0;
  uint64_t seed = 0;    // choice c of prompt p uses seed + p * k + c
  std::vector<std::string> scorers{"tcc-toxic@0.3.0"};
  std::string scorer_dir;
  double threshold = 0.5;
  KvFlags kv = [] {
    KvFlags f;
    f.policy = "full";
    return f;
  }();
  int threads = 0;
  int64_t kv_cache_mib = 512;
  int64_t max_num_seqs = 16;
};

struct PromptLine {
  std::string text;
  nlohmann::json source;  // the line as read
};
// invalid_argument naming the file and line when a line is not JSON or has no prompt.text.
Result<std::vector<PromptLine>> read_prompt_jsonl(const std::string& path);

// Exit code: 0 done, 1 failed (message on stderr).
int run_toxicity(const ToxicityArgs& args);

}  // namespace snap::scoring
