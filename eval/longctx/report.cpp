// The eval report (see report.h). Records are grouped by (system, task, haystack, placement);
// the `full` records join every placement's group of their system as the reference, since full
// runs once (the two placements are the same computation for it).
#include "eval/longctx/report.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "eval/longctx/svg_plot.h"

namespace snap::eval {

Interval wilson_interval(int64_t k, int64_t n, double z) {
  if (n <= 0) return {0, 1};
  const double p = static_cast<double>(k) / n, z2 = z * z, nn = static_cast<double>(n);
  const double denom = 1 + z2 / nn;
  const double centre = (p + z2 / (2 * nn)) / denom;
  const double half = z * std::sqrt(p * (1 - p) / nn + z2 / (4 * nn * nn)) / denom;
  return {std::max(0.0, centre - half), std::min(1.0, centre + half)};
}

Result<std::vector<EvalRecord>> load_records(const std::vector<std::string>& paths) {
  using nlohmann::json;
  std::map<std::string, EvalRecord> by_key;
  std::vector<std::string> order;
  for (const std::string& path : paths) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return not_found(path + ": cannot read eval records");
    std::string line;
    int64_t lineno = 0;
    while (std::getline(in, line)) {
      ++lineno;
      if (line.empty()) continue;
      const json j = json::parse(line, nullptr, false);
      const std::string where = path + ":" + std::to_string(lineno);
      if (!j.is_object()) return invalid_argument(where + ": not a JSON object");
      EvalRecord r;
      try {
        r.key = j.at("key").get<std::string>();
        r.task = j.at("task").get<std::string>();
        r.haystack = j.at("haystack").get<std::string>();
        r.placement = j.at("placement").get<std::string>();
        r.policy_label = j.at("policy_label").get<std::string>();
        r.policy_family = j.at("policy_family").get<std::string>();
        r.policy_name = j.at("policy").at("name").get<std::string>();
        r.budget = j.at("policy").value("budget", int64_t{0});
        r.length = j.at("length").get<int64_t>();
        r.depth = j.at("depth").get<int>();
        r.prompt_tokens = j.at("prompt_tokens").get<int64_t>();
        r.correct = j.at("correct").get<bool>();
        r.partial = j.at("partial").get<double>();
        const std::string backend = j.value("backend", std::string("engine"));
        r.system = backend == "engine" ? j.value("model_file", std::string())
                                       : j.value("served_model", std::string()) + " @ " + backend;
      } catch (const json::exception& e) {
        return invalid_argument(where + ": not an eval record (" + std::string(e.what()) + ")");
      }
      const std::string k = r.system + '\n' + r.key;
      if (!by_key.count(k)) order.push_back(k);
      by_key[k] = r;
    }
  }
  std::vector<EvalRecord> out;
  for (const auto& k : order) out.push_back(by_key[k]);
  return out;
}

namespace {

struct Tally {
  int64_t k = 0, n = 0;
  double partial = 0;
  void add(const EvalRecord& r) {
    k += r.correct ? 1 : 0;
    n += 1;
    partial += r.partial;
  }
  double acc() const { return n ? static_cast<double>(k) / n : NAN; }
};

std::string cell_text(const Tally& t) {
  if (t.n == 0) return "-";
  const Interval ci = wilson_interval(t.k, t.n);
  char b[96];
  std::snprintf(b, sizeof b, "%.0f%% (%lld/%lld) [%.0f, %.0f]", 100 * t.acc(), static_cast<long long>(t.k),
                static_cast<long long>(t.n), 100 * ci.lo, 100 * ci.hi);
  return b;
}

std::string file_safe(std::string s) {
  for (char& c : s) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return s;
}

// full first, then by policy name and budget, then the label.
bool policy_less(const EvalRecord& a, const EvalRecord& b) {
  const bool fa = a.policy_name == "full", fb = b.policy_name == "full";
  if (fa != fb) return fa;
  if (a.policy_name != b.policy_name) return a.policy_name < b.policy_name;
  if (a.budget != b.budget) return a.budget < b.budget;
  return a.policy_label < b.policy_label;
}

// "snapkv budget=256 window=32 kernel=7 pooling=max gqa=mean" -> "snapkv B=256 W=32 k=7 max mean"
std::string short_label(const std::string& label) {
  std::string out;
  size_t i = 0;
  while (i < label.size()) {
    const size_t sp = label.find(' ', i);
    std::string w = label.substr(i, sp == std::string::npos ? std::string::npos : sp - i);
    i = sp == std::string::npos ? label.size() : sp + 1;
    for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
             {"budget=", "B="}, {"window=", "W="}, {"kernel=", "k="}, {"pooling=", ""}, {"gqa=", "gqa:"}}) {
      if (w.rfind(from, 0) == 0) w = to + w.substr(from.size());
    }
    out += (out.empty() ? "" : " ") + w;
  }
  return out;
}

struct Group {
  std::string system, task, haystack, placement;
  std::vector<const EvalRecord*> recs;
};

}  // namespace

Result<std::vector<std::string>> write_report(const std::vector<EvalRecord>& records, const std::string& dir,
                                              const std::string& title) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return invalid_argument(dir + ": cannot create the report directory: " + ec.message());
  if (records.empty()) return invalid_argument("no eval records to report");
  std::vector<std::string> written;
  auto write_file = [&](const std::string& name, const std::string& body) -> Status {
    std::ofstream out(fs::path(dir) / name, std::ios::binary);
    out << body;
    if (!out) return invalid_argument((fs::path(dir) / name).string() + ": cannot write");
    written.push_back(name);
    return {};
  };

  // Groups by (system, task, haystack, placement); full joins each placement of its task.
  std::map<std::tuple<std::string, std::string, std::string, std::string>, Group> groups;
  std::set<std::string> placements;
  std::map<std::string, int64_t> systems;
  for (const auto& r : records) {
    placements.insert(r.placement);
    ++systems[r.system];
  }
  const bool several = systems.size() > 1;
  for (const auto& r : records) {
    for (const std::string& pl : placements) {
      if (r.placement != pl && r.policy_name != "full") continue;
      Group& g = groups[{r.system, r.task, r.haystack, pl}];
      g.system = r.system;
      g.task = r.task;
      g.haystack = r.haystack;
      g.placement = pl;
      g.recs.push_back(&r);
    }
  }

  std::string md = "# " + title + "\n\n" + std::to_string(records.size()) +
                   " records. Cells: accuracy (correct/n) [Wilson 95% interval, %], pooled over depths and seeds. "
                   "`full` runs once per task and is the reference under every question placement.\n";
  if (several) {
    md += "\nRecords of " + std::to_string(systems.size()) +
          " systems (model file, or served model @ URL), each in its own sections, never pooled:";
    for (const auto& [sys, n] : systems) md += " " + (sys.empty() ? "(unnamed)" : "`" + sys + "`") + " " + std::to_string(n) + ";";
    md.back() = '.';
    md += "\n";
  }
  for (auto& [gk, g] : groups) {
    const bool has_own = std::any_of(g.recs.begin(), g.recs.end(), [&](const EvalRecord* r) { return r->placement == g.placement; });
    if (!has_own) continue;
    std::stable_sort(g.recs.begin(), g.recs.end(), [](const EvalRecord* a, const EvalRecord* b) { return policy_less(*a, *b); });
    std::set<int64_t> lengths;
    std::set<int> depths;
    std::vector<std::string> labels;
    std::map<std::string, std::map<int64_t, Tally>> by_len;
    std::map<std::string, std::map<std::pair<int, int64_t>, Tally>> by_depth_len;
    std::map<std::string, std::map<int64_t, Tally>> by_family_budget;
    std::map<std::string, Tally> full_all;
    std::set<int64_t> budgets;
    std::vector<std::string> families;
    for (const EvalRecord* r : g.recs) {
      if (!by_len.count(r->policy_label)) labels.push_back(r->policy_label);
      lengths.insert(r->length);
      depths.insert(r->depth);
      by_len[r->policy_label][r->length].add(*r);
      by_depth_len[r->policy_label][{r->depth, r->length}].add(*r);
      if (r->policy_name == "full") {
        full_all["full"].add(*r);
      } else if (r->budget > 0) {
        if (!by_family_budget.count(r->policy_family)) families.push_back(r->policy_family);
        by_family_budget[r->policy_family][r->budget].add(*r);
        budgets.insert(r->budget);
      }
    }
    const std::string base = file_safe((several ? g.system + "_" : "") + g.task + "_" + g.haystack + "_" + g.placement);
    const std::string who = several ? (g.system.empty() ? "(unnamed)" : g.system) + ": " : "";
    md += "\n## " + who + g.task + " on " + g.haystack + ", question " + (g.placement == "after" ? "after the context" : "unseen by compression (context_only)") + "\n\n";
    md += "| policy |";
    for (int64_t L : lengths) md += " " + std::to_string(L) + " |";
    md += "\n|---|";
    for (size_t i = 0; i < lengths.size(); ++i) md += "---|";
    md += "\n";
    for (const auto& lab : labels) {
      md += "| " + lab + " |";
      for (int64_t L : lengths) md += " " + cell_text(by_len[lab][L]) + " |";
      md += "\n";
    }
    std::vector<std::string> xs;
    for (int64_t L : lengths) xs.push_back(std::to_string(L));
    // Accuracy vs length, one line per policy.
    std::vector<LineSeries> len_series;
    for (const auto& lab : labels) {
      LineSeries s;
      s.name = short_label(lab);
      for (int64_t L : lengths) {
        const Tally& t = by_len[lab][L];
        const Interval ci = wilson_interval(t.k, t.n);
        s.y.push_back(t.acc());
        s.lo.push_back(t.n ? ci.lo : NAN);
        s.hi.push_back(t.n ? ci.hi : NAN);
      }
      len_series.push_back(s);
    }
    SNAP_RETURN_IF_ERROR(write_file("length_" + base + ".svg",
                                    svg_line_chart(who + g.task + " (" + g.haystack + ", " + g.placement + "): accuracy vs length",
                                                   "prompt tokens", "accuracy", xs, len_series)));
    md += "\n![accuracy vs length](length_" + base + ".svg)\n";
    // Accuracy vs budget, one line per policy family; full as a flat reference.
    if (!budgets.empty()) {
      std::vector<std::string> bx;
      for (int64_t b : budgets) bx.push_back(std::to_string(b));
      std::vector<LineSeries> bs;
      if (full_all.count("full")) {
        LineSeries s;
        s.name = "full (all budgets)";
        const Tally& t = full_all["full"];
        const Interval ci = wilson_interval(t.k, t.n);
        s.y.assign(bx.size(), t.acc());
        s.lo.assign(bx.size(), NAN);
        s.hi.assign(bx.size(), NAN);
        s.lo.back() = ci.lo;
        s.hi.back() = ci.hi;
        bs.push_back(s);
      }
      for (const auto& fam : families) {
        LineSeries s;
        s.name = short_label(fam);
        for (int64_t b : budgets) {
          auto it = by_family_budget[fam].find(b);
          const Tally t = it == by_family_budget[fam].end() ? Tally{} : it->second;
          const Interval ci = wilson_interval(t.k, t.n);
          s.y.push_back(t.acc());
          s.lo.push_back(t.n ? ci.lo : NAN);
          s.hi.push_back(t.n ? ci.hi : NAN);
        }
        bs.push_back(s);
      }
      SNAP_RETURN_IF_ERROR(write_file("budget_" + base + ".svg",
                                      svg_line_chart(who + g.task + " (" + g.haystack + ", " + g.placement +
                                                         "): accuracy vs KV budget (all lengths)",
                                                     "budget (tokens per KV head per layer)", "accuracy", bx, bs)));
      md += "\n![accuracy vs budget](budget_" + base + ".svg)\n";
    }
    // Needle heatmap: depth x length, one panel per policy.
    if (!depths.empty() && *depths.rbegin() >= 0) {
      std::vector<HeatmapPanel> panels;
      md += "\nBy depth (rows, % of the haystack) and length (columns), accuracy %:\n";
      for (const auto& lab : labels) {
        HeatmapPanel p;
        p.title = short_label(lab);
        p.columns = xs;
        md += "\n" + lab + "\n\n| depth |";
        for (int64_t L : lengths) md += " " + std::to_string(L) + " |";
        md += "\n|---|";
        for (size_t i = 0; i < lengths.size(); ++i) md += "---|";
        md += "\n";
        for (int d : depths) {
          p.rows.push_back(std::to_string(d) + "%");
          std::vector<double> row;
          md += "| " + std::to_string(d) + "% |";
          for (int64_t L : lengths) {
            auto it = by_depth_len[lab].find({d, L});
            const Tally t = it == by_depth_len[lab].end() ? Tally{} : it->second;
            row.push_back(t.acc());
            md += t.n ? " " + std::to_string(static_cast<int>(std::lround(100 * t.acc()))) + " (" +
                            std::to_string(t.k) + "/" + std::to_string(t.n) + ") |"
                      : " - |";
          }
          p.value.push_back(row);
          md += "\n";
        }
        panels.push_back(p);
      }
      SNAP_RETURN_IF_ERROR(write_file("heatmap_" + base + ".svg",
                                      svg_heatmaps(who + g.task + " (" + g.haystack + ", " + g.placement +
                                                       "): accuracy % by depth and length",
                                                   "prompt tokens", "needle depth", panels)));
      md += "\n![needle heatmap](heatmap_" + base + ".svg)\n";
    }
  }
  SNAP_RETURN_IF_ERROR(write_file("report.md", md));
  return written;
}

}  // namespace snap::eval
