// KvPolicy names, validation and the resident size it implies.
#include "worker/kv/policy.h"

#include <algorithm>

namespace snap {

const char* kv_policy_name(KvPolicyKind k) {
  switch (k) {
    case KvPolicyKind::full: return "full";
    case KvPolicyKind::snapkv: return "snapkv";
    case KvPolicyKind::streaming: return "streaming";
    case KvPolicyKind::h2o: return "h2o";
    case KvPolicyKind::pyramidkv: return "pyramidkv";
    case KvPolicyKind::adakv: return "adakv";
  }
  return "?";
}

Result<KvPolicyKind> kv_policy_from_name(const std::string& name) {
  for (KvPolicyKind k : {KvPolicyKind::full, KvPolicyKind::snapkv, KvPolicyKind::streaming, KvPolicyKind::h2o,
                         KvPolicyKind::pyramidkv, KvPolicyKind::adakv}) {
    if (name == kv_policy_name(k)) return k;
  }
  return invalid_argument("unknown KV policy '" + name + "' (expected full, snapkv, streaming, h2o, pyramidkv, adakv)");
}

Result<KvPooling> kv_pooling_from_name(const std::string& name) {
  if (name == "max") return KvPooling::max;
  if (name == "avg") return KvPooling::avg;
  return invalid_argument("unknown pooling '" + name + "' (expected max or avg)");
}

Result<GqaAggregation> gqa_aggregation_from_name(const std::string& name) {
  if (name == "mean") return GqaAggregation::mean;
  if (name == "max") return GqaAggregation::max;
  return invalid_argument("unknown GQA aggregation '" + name + "' (expected mean or max)");
}

Status KvPolicy::validate() const {
  if (kind == KvPolicyKind::full) return {};
  if (budget < 1) return invalid_argument("kv budget must be >= 1, got " + std::to_string(budget));
  if (context_tokens < 0) return invalid_argument("context tokens must be >= 0");
  switch (kind) {
    case KvPolicyKind::snapkv:
    case KvPolicyKind::pyramidkv:
    case KvPolicyKind::adakv: {
      SnapKvParams p;
      p.budget = budget;
      p.window = window;
      p.kernel = kernel;
      SNAP_RETURN_IF_ERROR(snapkv_validate(p));
      if (kind == KvPolicyKind::adakv && (adakv_alpha < 0 || adakv_alpha > 1)) {
        return invalid_argument("adakv alpha must be in [0, 1]");
      }
      if (kind == KvPolicyKind::pyramidkv && pyramid_beta < 1) return invalid_argument("pyramid beta must be >= 1");
      return {};
    }
    case KvPolicyKind::streaming:
      if (num_sink < 0 || num_sink >= budget) {
        return invalid_argument("streaming sinks (" + std::to_string(num_sink) + ") must be below the budget (" +
                                std::to_string(budget) + ")");
      }
      return {};
    case KvPolicyKind::h2o:
      if (budget < 2) return invalid_argument("h2o budget must be >= 2 (half heavy hitters, half recent)");
      return {};
    case KvPolicyKind::full: return {};
  }
  return {};
}

int64_t KvPolicy::kept_per_head(int64_t n) const {
  if (kind == KvPolicyKind::full) return n;
  return std::min(n, budget);
}

std::string KvPolicy::describe() const {
  std::string s = kv_policy_name(kind);
  if (kind == KvPolicyKind::full) return s;
  s += " budget=" + std::to_string(budget);
  if (kind == KvPolicyKind::snapkv || kind == KvPolicyKind::pyramidkv || kind == KvPolicyKind::adakv) {
    s += " window=" + std::to_string(window) + " kernel=" + std::to_string(kernel) +
         " pooling=" + (pooling == KvPooling::max ? "max" : "avg") +
         " gqa=" + (aggregation == GqaAggregation::mean ? "mean" : "max");
  }
  if (kind == KvPolicyKind::streaming) s += " sinks=" + std::to_string(num_sink);
  if (context_tokens > 0) s += " context_only=" + std::to_string(context_tokens);
  if (layerwise) s += " layerwise";
  return s;
}

}  // namespace snap
