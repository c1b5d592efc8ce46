// Test helper: Prometheus text exposition lookups. Every snapserve series carries the
// constant label model_name (as vLLM's do); a key names the series without it, e.g.
// `snapserve_comm_bytes_total{op="all_reduce",rank="1"}` (labels in name order, as exposed).
#pragma once

#include <cmath>
#include <cstdlib>
#include <map>
#include <sstream>
#include <string>

namespace snap::testing {

// `name{labels}` with the model_name="..." label removed (and `name` when none is left).
inline std::string prom_key_without_model(const std::string& series) {
  const size_t open = series.find('{');
  if (open == std::string::npos) return series;
  const size_t at = series.find("model_name=\"", open);
  if (at == std::string::npos) return series;
  size_t end = at + 12;
  while (end < series.size() && series[end] != '"') end += series[end] == '\\' ? 2 : 1;
  ++end;  // past the closing quote
  std::string s = series.substr(0, at) + series.substr(end);
  // Drop the comma the label left behind, before or after it.
  const size_t cut = at;
  if (cut < s.size() && s[cut] == ',') s.erase(cut, 1);
  else if (cut > 0 && s[cut - 1] == ',') s.erase(cut - 1, 1);
  if (s.size() >= 2 && s.compare(s.size() - 2, 2, "{}") == 0) s.resize(s.size() - 2);
  return s;
}

// "key" -> value for every sample line; keys without model_name.
inline std::map<std::string, double> prom_samples(const std::string& text) {
  std::map<std::string, double> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const size_t sp = line.rfind(' ');
    if (sp == std::string::npos) continue;
    out[prom_key_without_model(line.substr(0, sp))] = std::strtod(line.c_str() + sp + 1, nullptr);
  }
  return out;
}

// The value of one series, NaN when absent.
inline double prom_value(const std::string& text, const std::string& key) {
  const auto samples = prom_samples(text);
  auto it = samples.find(key);
  return it == samples.end() ? std::nan("") : it->second;
}

}  // namespace snap::testing
