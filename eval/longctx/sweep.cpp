// Sweep expansion (see sweep.h).
#include "eval/longctx/sweep.h"

#include <algorithm>
#include <cstdlib>
#include <set>

namespace snap::eval {

namespace {

std::vector<std::string> split_commas(const std::string& text) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : text + ",") {
    if (c == ',') {
      if (!cur.empty()) out.push_back(cur);
      cur.clear();
    } else if (c != ' ') {
      cur += c;
    }
  }
  return out;
}

Result<int64_t> parse_int(const std::string& flag, const std::string& s) {
  if (s.empty() || s.size() > 18) return invalid_argument(flag + ": '" + s + "' is not an integer");
  size_t i = s[0] == '-' ? 1 : 0;
  if (i == s.size()) return invalid_argument(flag + ": '" + s + "' is not an integer");
  for (size_t j = i; j < s.size(); ++j) {
    if (s[j] < '0' || s[j] > '9') return invalid_argument(flag + ": '" + s + "' is not an integer");
  }
  return std::strtoll(s.c_str(), nullptr, 10);
}

}  // namespace

Result<std::vector<int64_t>> parse_int_list(const std::string& flag, const std::string& text) {
  std::vector<int64_t> out;
  for (const std::string& item : split_commas(text)) {
    const size_t dash = item.find('-', 1);
    if (dash == std::string::npos) {
      SNAP_ASSIGN_OR_RETURN(int64_t v, parse_int(flag, item));
      out.push_back(v);
      continue;
    }
    SNAP_ASSIGN_OR_RETURN(int64_t a, parse_int(flag, item.substr(0, dash)));
    SNAP_ASSIGN_OR_RETURN(int64_t b, parse_int(flag, item.substr(dash + 1)));
    if (b < a || b - a > 100000) return invalid_argument(flag + ": range '" + item + "' is empty or too long");
    for (int64_t v = a; v <= b; ++v) out.push_back(v);
  }
  if (out.empty()) return invalid_argument(flag + ": empty list");
  return out;
}

Result<std::vector<std::string>> parse_name_list(const std::string& flag, const std::string& text) {
  std::vector<std::string> out = split_commas(text);
  if (out.empty()) return invalid_argument(flag + ": empty list");
  return out;
}

std::string policy_label(const KvPolicy& p) {
  KvPolicy q = p;
  q.context_tokens = 0;
  return q.describe();
}

std::string policy_family(const KvPolicy& p) {
  std::string s = policy_label(p);
  const size_t b = s.find(" budget=");
  if (b == std::string::npos) return s;
  const size_t e = s.find(' ', b + 1);
  return s.substr(0, b) + (e == std::string::npos ? "" : s.substr(e));
}

Result<std::vector<KvPolicy>> sweep_policies(const SweepFlags& f) {
  SNAP_ASSIGN_OR_RETURN(auto names, parse_name_list("--policies", f.policies));
  SNAP_ASSIGN_OR_RETURN(auto budgets, parse_int_list("--budgets", f.budgets));
  SNAP_ASSIGN_OR_RETURN(auto windows, parse_int_list("--windows", f.windows));
  SNAP_ASSIGN_OR_RETURN(auto kernels, parse_int_list("--kernels", f.kernels));
  SNAP_ASSIGN_OR_RETURN(auto poolings, parse_name_list("--poolings", f.poolings));
  SNAP_ASSIGN_OR_RETURN(auto gqas, parse_name_list("--gqa", f.gqa));
  SNAP_ASSIGN_OR_RETURN(auto sinks, parse_int_list("--sinks", f.sinks));
  std::vector<KvPolicy> out;
  std::set<std::string> seen;
  auto add = [&](const KvPolicy& p) -> Status {
    Status st = p.validate();
    if (!st.ok()) return invalid_argument("policy " + p.describe() + ": " + st.message());
    if (seen.insert(policy_label(p)).second) out.push_back(p);
    return {};
  };
  for (const std::string& name : names) {
    KvPolicy base;
    SNAP_ASSIGN_OR_RETURN(base.kind, kv_policy_from_name(name));
    if (base.kind == KvPolicyKind::full) {
      SNAP_RETURN_IF_ERROR(add(base));
      continue;
    }
    for (int64_t b : budgets) {
      KvPolicy p = base;
      p.budget = b;
      if (p.kind == KvPolicyKind::streaming) {
        for (int64_t s : sinks) {
          p.num_sink = static_cast<int>(s);
          SNAP_RETURN_IF_ERROR(add(p));
        }
        continue;
      }
      if (p.kind == KvPolicyKind::h2o) {
        SNAP_RETURN_IF_ERROR(add(p));
        continue;
      }
      for (int64_t w : windows) {
        for (int64_t k : kernels) {
          for (const auto& pool : poolings) {
            for (const auto& g : gqas) {
              p.window = static_cast<int>(w);
              p.kernel = static_cast<int>(k);
              SNAP_ASSIGN_OR_RETURN(p.pooling, kv_pooling_from_name(pool));
              SNAP_ASSIGN_OR_RETURN(p.aggregation, gqa_aggregation_from_name(g));
              SNAP_RETURN_IF_ERROR(add(p));
            }
          }
        }
      }
    }
  }
  return out;
}

Result<std::vector<EvalCase>> sweep_cases(const SweepFlags& f) {
  SNAP_ASSIGN_OR_RETURN(auto task_names, parse_name_list("--tasks", f.tasks));
  SNAP_ASSIGN_OR_RETURN(auto hay_names, parse_name_list("--haystacks", f.haystacks));
  SNAP_ASSIGN_OR_RETURN(auto lengths, parse_int_list("--lengths", f.lengths));
  SNAP_ASSIGN_OR_RETURN(auto depths, parse_int_list("--depths", f.depths));
  SNAP_ASSIGN_OR_RETURN(auto seeds, parse_int_list("--seeds", f.seeds));
  SNAP_ASSIGN_OR_RETURN(auto place_names, parse_name_list("--placements", f.placements));
  SNAP_ASSIGN_OR_RETURN(auto policies, sweep_policies(f));
  for (int64_t l : lengths) {
    if (l < 16 || l > (int64_t{1} << 24)) return invalid_argument("--lengths: " + std::to_string(l) + " is outside 16..2^24");
  }
  for (int64_t d : depths) {
    if (d < 0 || d > 100) return invalid_argument("--depths: " + std::to_string(d) + " is outside 0..100 (percent)");
  }
  for (int64_t s : seeds) {
    if (s < 0) return invalid_argument("--seeds: " + std::to_string(s) + " is negative");
  }
  std::vector<TaskKind> tasks;
  for (const auto& n : task_names) {
    SNAP_ASSIGN_OR_RETURN(TaskKind k, task_from_name(n));
    tasks.push_back(k);
  }
  std::vector<HaystackKind> hays;
  for (const auto& n : hay_names) {
    SNAP_ASSIGN_OR_RETURN(HaystackKind h, haystack_from_name(n));
    hays.push_back(h);
  }
  std::vector<Placement> places;
  for (const auto& n : place_names) {
    SNAP_ASSIGN_OR_RETURN(Placement p, placement_from_name(n));
    places.push_back(p);
  }
  std::vector<EvalCase> out;
  std::set<std::string> keys;
  for (TaskKind t : tasks) {
    for (HaystackKind h : hays) {
      if (!task_uses_haystack(t) && h != hays.front()) continue;  // cwe has no haystack
      for (int64_t len : lengths) {
        for (int64_t depth : depths) {
          if (!task_uses_depth(t) && depth != depths.front()) continue;
          for (int64_t seed : seeds) {
            for (Placement pl : places) {
              for (const KvPolicy& p : policies) {
                if (p.kind == KvPolicyKind::full && pl == Placement::context_only && places.size() > 1) continue;
                EvalCase c;
                c.task.kind = t;
                c.task.haystack = task_uses_haystack(t) ? h : HaystackKind::noise;
                c.task.length = len;
                c.task.depth_percent = task_uses_depth(t) ? static_cast<int>(depth) : -1;
                c.task.seed = static_cast<uint64_t>(seed);
                c.placement = pl;
                c.policy = p;
                c.key = std::string(task_name(t)) + "|" + haystack_name(c.task.haystack) + "|L" + std::to_string(len) +
                        "|d" + std::to_string(c.task.depth_percent) + "|s" + std::to_string(seed) + "|" +
                        placement_name(pl) + "|" + policy_label(p);
                if (keys.insert(c.key).second) out.push_back(std::move(c));
              }
            }
          }
        }
      }
    }
  }
  return out;
}

}  // namespace snap::eval
