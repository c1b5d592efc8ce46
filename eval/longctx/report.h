// `snapserve eval report`: reads eval records (JSONL from `eval run`) and writes report.md
// (accuracy per task, placement, policy and length with Wilson 95% intervals; needle
// accuracy per depth) and SVG pictures: the needle heatmap (depth x length, one panel per
// policy), accuracy vs budget (one line per policy family) and accuracy vs length (one
// line per policy). Records of the same key and system in several inputs count once (the last
// wins). A system is what answered: the model file for the in-process engine, the served
// model at its URL for `--url`; records of several systems get a section each, never pooled.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace snap::eval {

struct Interval {
  double lo = 0, hi = 0;
};
// Wilson score interval for k successes in n trials (n = 0: [0, 1]).
Interval wilson_interval(int64_t k, int64_t n, double z = 1.959963984540054);

struct EvalRecord {
  std::string key, task, haystack, placement, policy_name, policy_label, policy_family;
  // "gemma-3-270m-q4_k_m.gguf" (engine: the model file) or "MODEL @ URL" (--url); "" if the
  // record names neither.
  std::string system;
  int64_t length = 0, budget = 0, prompt_tokens = 0;
  int depth = -1;
  bool correct = false;
  double partial = 0;
};

Result<std::vector<EvalRecord>> load_records(const std::vector<std::string>& paths);

// Writes DIR/report.md and DIR/*.svg; returns the files written (paths relative to DIR).
Result<std::vector<std::string>> write_report(const std::vector<EvalRecord>& records, const std::string& dir,
                                              const std::string& title);

}  // namespace snap::eval
