// The pure parts of `snapserve bench serve` (no sockets, unit-tested): the per-request
// record, percentiles and the summary (definitions as in `vllm bench serve`: TPOT excludes
// the first token, ITL is every gap between content chunks, throughputs count completed
// requests only), the table and JSON reports, an incremental SSE parser that accepts
// bytes split anywhere, and the reading of one OpenAI stream chunk.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace snap {

// --- one request ---------------------------------------------------------------

struct RequestRecord {
  bool success = false;
  std::string error;       // failure: one line ("HTTP 429: queue full", "connect: ...")
  std::string error_kind;  // failure: short category for the summary ("http_429", "timeout")
  int64_t prompt_tokens = 0;  // from the usage chunk
  int64_t output_tokens = 0;  // from the usage chunk (content chunks if the server sent none)
  bool has_ttft = false;      // false when no content chunk arrived
  double ttft_s = 0;          // request sent → first non-empty content chunk
  double e2e_s = 0;           // request sent → end of the stream
  std::vector<double> itl_s;  // gaps between consecutive content chunks
};

// --- statistics ----------------------------------------------------------------

// Linear interpolation between closest ranks (numpy's default): rank p/100·(n−1).
// `sorted` must be ascending and non-empty; p in [0, 100].
double percentile_sorted(const std::vector<double>& sorted, double p);

struct Distribution {
  int64_t count = 0;  // 0: the other fields are meaningless (reported as n/a / null)
  double mean = 0;
  double median = 0;
  double p90 = 0;
  double p99 = 0;
};

Distribution describe(std::vector<double> values);

struct BenchSummary {
  int64_t completed = 0;
  int64_t failed = 0;
  double duration_s = 0;
  int64_t total_input_tokens = 0;   // completed requests only
  int64_t total_output_tokens = 0;  // completed requests only
  double request_throughput = 0;      // completed / duration
  double output_throughput = 0;       // output tokens / duration
  double total_token_throughput = 0;  // (input + output tokens) / duration
  Distribution ttft_ms;
  Distribution tpot_ms;  // (e2e − ttft) / (output_tokens − 1), requests with > 1 token
  Distribution itl_ms;
  Distribution e2e_ms;
  std::map<std::string, int64_t> failures;  // error_kind → count
};

BenchSummary summarize(const std::vector<RequestRecord>& records, double duration_s);

// The human table (like `vllm bench serve`'s), newline-terminated.
std::string format_summary_table(const BenchSummary& summary);
// vLLM-style result: flat summary keys (mean_ttft_ms, p99_e2el_ms, ...) plus per-request
// arrays (ttfts, itls, e2els in seconds; input_lens, output_lens, errors).
nlohmann::json bench_result_json(const BenchSummary& summary,
                                 const std::vector<RequestRecord>& records);

// --- server-sent events ----------------------------------------------------------

// Feeds raw response-body bytes; returns the data of every event completed by them.
// Lines end in \n, \r\n or \r (also when split between feeds); "data:" lines of one
// event are joined by \n; comments and other fields are ignored; a blank line ends the event.
class SseParser {
 public:
  std::vector<std::string> feed(std::string_view bytes);

 private:
  void end_line();

  std::string line_;
  std::string data_;
  bool has_data_ = false;
  bool after_cr_ = false;
  std::vector<std::string> out_;
};

// What one SSE data payload of an OpenAI stream says.
struct StreamChunk {
  bool done = false;          // "[DONE]"
  bool malformed = false;     // not JSON / not an object
  std::string content;        // choices[0].text (completions) or .delta.content (chat)
  bool has_usage = false;
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  std::string error;          // an {"error": {...}} chunk: its message
};

StreamChunk parse_stream_chunk(std::string_view data, bool chat);

}  // namespace snap
