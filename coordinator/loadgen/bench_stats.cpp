// Statistics, reports and stream parsing for `snapserve bench serve` (see bench_stats.h).
#include "coordinator/loadgen/bench_stats.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>

#include "common/check.h"

namespace snap {

using nlohmann::json;

// --- statistics ----------------------------------------------------------------

double percentile_sorted(const std::vector<double>& sorted, double p) {
  CHECK(!sorted.empty()) << "percentile of no values";
  CHECK(p >= 0.0 && p <= 100.0) << "percentile " << p;
  const double rank = p / 100.0 * static_cast<double>(sorted.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  const double frac = rank - static_cast<double>(lo);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * frac;
}

Distribution describe(std::vector<double> values) {
  Distribution d;
  if (values.empty()) return d;
  std::sort(values.begin(), values.end());
  d.count = static_cast<int64_t>(values.size());
  d.mean = std::accumulate(values.begin(), values.end(), 0.0) / static_cast<double>(values.size());
  d.median = percentile_sorted(values, 50.0);
  d.p90 = percentile_sorted(values, 90.0);
  d.p99 = percentile_sorted(values, 99.0);
  return d;
}

BenchSummary summarize(const std::vector<RequestRecord>& records, double duration_s) {
  BenchSummary s;
  s.duration_s = duration_s;
  std::vector<double> ttft, tpot, itl, e2e;
  for (const RequestRecord& r : records) {
    if (!r.success) {
      ++s.failed;
      ++s.failures[r.error_kind.empty() ? "unknown" : r.error_kind];
      continue;
    }
    ++s.completed;
    s.total_input_tokens += r.prompt_tokens;
    s.total_output_tokens += r.output_tokens;
    e2e.push_back(r.e2e_s * 1e3);
    if (r.has_ttft) {
      ttft.push_back(r.ttft_s * 1e3);
      if (r.output_tokens > 1) {
        tpot.push_back((r.e2e_s - r.ttft_s) / static_cast<double>(r.output_tokens - 1) * 1e3);
      }
    }
    for (double g : r.itl_s) itl.push_back(g * 1e3);
  }
  if (duration_s > 0) {
    s.request_throughput = static_cast<double>(s.completed) / duration_s;
    s.output_throughput = static_cast<double>(s.total_output_tokens) / duration_s;
    s.total_token_throughput =
        static_cast<double>(s.total_input_tokens + s.total_output_tokens) / duration_s;
  }
  s.ttft_ms = describe(std::move(ttft));
  s.tpot_ms = describe(std::move(tpot));
  s.itl_ms = describe(std::move(itl));
  s.e2e_ms = describe(std::move(e2e));
  return s;
}

// --- reports -------------------------------------------------------------------

namespace {

constexpr int k_table_width = 50;

void row(std::string& out, const std::string& label, const std::string& value) {
  char buf[128];
  std::snprintf(buf, sizeof buf, "%-40s %s\n", label.c_str(), value.c_str());
  out += buf;
}

std::string fmt(double v, int decimals = 2) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

void heading(std::string& out, const std::string& title, char fill) {
  const int pad = k_table_width - static_cast<int>(title.size()) - 2;
  const int left = std::max(pad / 2, 1), right = std::max(pad - pad / 2, 1);
  out += std::string(left, fill) + " " + title + " " + std::string(right, fill) + "\n";
}

void distribution_rows(std::string& out, const std::string& title, const std::string& name,
                       const Distribution& d) {
  heading(out, title, '-');
  auto value = [&](double v) { return d.count == 0 ? std::string("n/a") : fmt(v); };
  row(out, "Mean " + name + " (ms):", value(d.mean));
  row(out, "Median " + name + " (ms):", value(d.median));
  row(out, "P90 " + name + " (ms):", value(d.p90));
  row(out, "P99 " + name + " (ms):", value(d.p99));
}

json stat_or_null(const Distribution& d, double v) { return d.count == 0 ? json(nullptr) : json(v); }

void distribution_json(json& j, const std::string& name, const Distribution& d) {
  j["mean_" + name + "_ms"] = stat_or_null(d, d.mean);
  j["median_" + name + "_ms"] = stat_or_null(d, d.median);
  j["p90_" + name + "_ms"] = stat_or_null(d, d.p90);
  j["p99_" + name + "_ms"] = stat_or_null(d, d.p99);
}

}  // namespace

std::string format_summary_table(const BenchSummary& s) {
  std::string out;
  heading(out, "Serving Benchmark Result", '=');
  row(out, "Successful requests:", std::to_string(s.completed));
  row(out, "Failed requests:", std::to_string(s.failed));
  for (const auto& [kind, n] : s.failures) row(out, "  failed (" + kind + "):", std::to_string(n));
  row(out, "Benchmark duration (s):", fmt(s.duration_s));
  row(out, "Total input tokens:", std::to_string(s.total_input_tokens));
  row(out, "Total generated tokens:", std::to_string(s.total_output_tokens));
  row(out, "Request throughput (req/s):", fmt(s.request_throughput));
  row(out, "Output token throughput (tok/s):", fmt(s.output_throughput));
  row(out, "Total token throughput (tok/s):", fmt(s.total_token_throughput));
  distribution_rows(out, "Time to First Token", "TTFT", s.ttft_ms);
  distribution_rows(out, "Time per Output Token (excl. 1st token)", "TPOT", s.tpot_ms);
  distribution_rows(out, "Inter-token Latency", "ITL", s.itl_ms);
  distribution_rows(out, "End-to-end Latency", "E2EL", s.e2e_ms);
  out += std::string(k_table_width, '=') + "\n";
  return out;
}

json bench_result_json(const BenchSummary& s, const std::vector<RequestRecord>& records) {
  json j;
  j["completed"] = s.completed;
  j["failed"] = s.failed;
  j["failures"] = s.failures;
  j["duration"] = s.duration_s;
  j["total_input_tokens"] = s.total_input_tokens;
  j["total_output_tokens"] = s.total_output_tokens;
  j["request_throughput"] = s.request_throughput;
  j["output_throughput"] = s.output_throughput;
  j["total_token_throughput"] = s.total_token_throughput;
  distribution_json(j, "ttft", s.ttft_ms);
  distribution_json(j, "tpot", s.tpot_ms);
  distribution_json(j, "itl", s.itl_ms);
  distribution_json(j, "e2el", s.e2e_ms);
  json input_lens = json::array(), output_lens = json::array(), ttfts = json::array(),
       itls = json::array(), e2els = json::array(), errors = json::array();
  for (const RequestRecord& r : records) {
    input_lens.push_back(r.prompt_tokens);
    output_lens.push_back(r.output_tokens);
    ttfts.push_back(r.has_ttft ? json(r.ttft_s) : json(nullptr));
    itls.push_back(r.itl_s);
    e2els.push_back(r.e2e_s);
    errors.push_back(r.error);
  }
  j["input_lens"] = std::move(input_lens);
  j["output_lens"] = std::move(output_lens);
  j["ttfts"] = std::move(ttfts);
  j["itls"] = std::move(itls);
  j["e2els"] = std::move(e2els);
  j["errors"] = std::move(errors);
  return j;
}

// --- server-sent events ----------------------------------------------------------

std::vector<std::string> SseParser::feed(std::string_view bytes) {
  out_.clear();
  for (char c : bytes) {
    if (after_cr_) {
      after_cr_ = false;
      if (c == '\n') continue;  // the \n of a \r\n already ended the line
    }
    if (c == '\r') {
      after_cr_ = true;
      end_line();
    } else if (c == '\n') {
      end_line();
    } else {
      line_ += c;
    }
  }
  return std::move(out_);
}

void SseParser::end_line() {
  if (line_.empty()) {  // blank line: dispatch
    if (has_data_) out_.push_back(std::move(data_));
    data_.clear();
    has_data_ = false;
    return;
  }
  std::string_view line(line_);
  if (line.front() != ':') {  // ':' starts a comment
    const size_t colon = line.find(':');
    const std::string_view field = line.substr(0, colon);
    std::string_view value = colon == std::string_view::npos ? "" : line.substr(colon + 1);
    if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
    if (field == "data") {
      if (has_data_) data_ += '\n';
      data_.append(value);
      has_data_ = true;
    }
  }
  line_.clear();
}

StreamChunk parse_stream_chunk(std::string_view data, bool chat) {
  StreamChunk c;
  if (data == "[DONE]") {
    c.done = true;
    return c;
  }
  const json j = json::parse(data, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) {
    c.malformed = true;
    return c;
  }
  if (auto e = j.find("error"); e != j.end()) {
    c.error = e->is_object() && e->contains("message") && (*e)["message"].is_string()
                  ? (*e)["message"].get<std::string>()
                  : e->dump();
    return c;
  }
  if (auto ch = j.find("choices"); ch != j.end() && ch->is_array() && !ch->empty()) {
    const json& first = (*ch)[0];
    const json* text = nullptr;
    if (chat) {
      if (auto d = first.find("delta"); d != first.end() && d->is_object()) {
        if (auto t = d->find("content"); t != d->end()) text = &*t;
      }
    } else if (auto t = first.find("text"); t != first.end()) {
      text = &*t;
    }
    if (text != nullptr && text->is_string()) c.content = text->get<std::string>();
  }
  if (auto u = j.find("usage"); u != j.end() && u->is_object()) {
    auto int_field = [&](const char* name) -> int64_t {
      auto f = u->find(name);
      return f != u->end() && f->is_number_integer() ? f->get<int64_t>() : 0;
    };
    c.has_usage = true;
    c.prompt_tokens = int_field("prompt_tokens");
    c.completion_tokens = int_field("completion_tokens");
  }
  return c;
}

}  // namespace snap
