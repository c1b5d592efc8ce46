// A sweep: the cartesian product of tasks x haystacks x lengths x depths x seeds x question
// placements x KV policies (each policy kind crossed with the parameter lists it reads:
// budgets for all but full; window, kernel, pooling, GQA aggregation for snapkv, pyramidkv
// and adakv; sinks for streaming). Parameters a policy ignores are not crossed, and `full`
// runs once per task (with the question after the context: for it both placements are
// the same computation). Each case has a stable key that names it in the JSONL output.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "eval/longctx/tasks.h"
#include "worker/kv/policy.h"

namespace snap::eval {

struct SweepFlags {
  std::string tasks = "niah_single";
  std::string haystacks = "shakespeare";
  std::string lengths = "1024";
  std::string depths = "0,25,50,75,100";
  std::string seeds = "0-2";
  std::string placements = "after";
  std::string policies = "full,snapkv";
  std::string budgets = "1024";
  std::string windows = "32";
  std::string kernels = "31";
  std::string poolings = "avg";
  std::string gqa = "mean";
  std::string sinks = "4";
};

struct EvalCase {
  TaskSpec task;
  Placement placement = Placement::after;
  KvPolicy policy;        // context_tokens still 0: set from the built task
  std::string key;        // stable id of the case
};

// "0,25,50" and "0-4" (inclusive ranges) into integers; the flag name goes in errors.
Result<std::vector<int64_t>> parse_int_list(const std::string& flag, const std::string& text);
Result<std::vector<std::string>> parse_name_list(const std::string& flag, const std::string& text);

// The policies of a sweep, validated (KvPolicy::validate), deduplicated, in flag order.
Result<std::vector<KvPolicy>> sweep_policies(const SweepFlags& f);
Result<std::vector<EvalCase>> sweep_cases(const SweepFlags& f);

// "snapkv budget=256 window=32 kernel=7 pooling=max gqa=mean" (KvPolicy::describe without
// the context cut), and the same without the budget (a line of accuracy-vs-budget).
std::string policy_label(const KvPolicy& p);
std::string policy_family(const KvPolicy& p);

}  // namespace snap::eval
