// The pure parts of `snapserve bench serve`: percentiles and the summary against values
// worked out by hand, the table and JSON reports, the SSE parser on bytes split at every
// position (and one byte at a time, \r\n across feeds), and the reading of stream chunks.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "coordinator/loadgen/bench_stats.h"

namespace {

using snap::RequestRecord;

TEST(LoadgenStats, PercentileInterpolatesBetweenClosestRanks) {
  const std::vector<double> v = {1, 2, 3, 4};
  EXPECT_DOUBLE_EQ(snap::percentile_sorted(v, 0), 1.0);
  EXPECT_DOUBLE_EQ(snap::percentile_sorted(v, 50), 2.5);   // rank 1.5
  EXPECT_DOUBLE_EQ(snap::percentile_sorted(v, 90), 3.7);   // rank 2.7
  EXPECT_DOUBLE_EQ(snap::percentile_sorted(v, 99), 3.97);  // rank 2.97
  EXPECT_DOUBLE_EQ(snap::percentile_sorted(v, 100), 4.0);
  EXPECT_DOUBLE_EQ(snap::percentile_sorted({7}, 99), 7.0);
}

TEST(LoadgenStats, DescribeSortsAndHandlesEmpty) {
  const snap::Distribution d = snap::describe({4, 1, 3, 2});
  EXPECT_EQ(d.count, 4);
  EXPECT_DOUBLE_EQ(d.mean, 2.5);
  EXPECT_DOUBLE_EQ(d.median, 2.5);
  EXPECT_DOUBLE_EQ(d.p90, 3.7);
  EXPECT_DOUBLE_EQ(d.p99, 3.97);
  EXPECT_EQ(snap::describe({}).count, 0);
}

RequestRecord ok(int64_t prompt, int64_t output, double ttft, double e2e, std::vector<double> itl) {
  RequestRecord r;
  r.success = true;
  r.prompt_tokens = prompt;
  r.output_tokens = output;
  r.has_ttft = true;
  r.ttft_s = ttft;
  r.e2e_s = e2e;
  r.itl_s = std::move(itl);
  return r;
}

RequestRecord failed(const std::string& kind) {
  RequestRecord r;
  r.error_kind = kind;
  r.error = kind + ": something";
  return r;
}

std::vector<RequestRecord> sample_records() {
  return {ok(10, 5, 0.1, 0.5, {0.1, 0.1, 0.1, 0.1}),  // TPOT (0.5-0.1)/4 = 100 ms
          ok(20, 3, 0.2, 0.6, {0.2, 0.2}),            // TPOT (0.6-0.2)/2 = 200 ms
          ok(30, 1, 0.3, 0.3, {}),                    // one token: no TPOT
          failed("http_429"), failed("connect")};
}

TEST(LoadgenStats, SummaryMatchesHandComputedValues) {
  const snap::BenchSummary s = snap::summarize(sample_records(), 2.0);
  EXPECT_EQ(s.completed, 3);
  EXPECT_EQ(s.failed, 2);
  EXPECT_EQ(s.total_input_tokens, 60);
  EXPECT_EQ(s.total_output_tokens, 9);
  EXPECT_DOUBLE_EQ(s.request_throughput, 1.5);
  EXPECT_DOUBLE_EQ(s.output_throughput, 4.5);
  EXPECT_DOUBLE_EQ(s.total_token_throughput, 34.5);
  ASSERT_EQ(s.failures.size(), 2u);
  EXPECT_EQ(s.failures.at("http_429"), 1);
  EXPECT_EQ(s.failures.at("connect"), 1);

  const double eps = 1e-9;
  // TTFT ms {100, 200, 300}
  EXPECT_EQ(s.ttft_ms.count, 3);
  EXPECT_NEAR(s.ttft_ms.mean, 200.0, eps);
  EXPECT_NEAR(s.ttft_ms.median, 200.0, eps);
  EXPECT_NEAR(s.ttft_ms.p90, 280.0, eps);  // rank 1.8
  EXPECT_NEAR(s.ttft_ms.p99, 298.0, eps);  // rank 1.98
  // TPOT ms {100, 200}
  EXPECT_EQ(s.tpot_ms.count, 2);
  EXPECT_NEAR(s.tpot_ms.mean, 150.0, eps);
  EXPECT_NEAR(s.tpot_ms.median, 150.0, eps);
  EXPECT_NEAR(s.tpot_ms.p90, 190.0, eps);
  EXPECT_NEAR(s.tpot_ms.p99, 199.0, eps);
  // ITL ms {100 x4, 200 x2}
  EXPECT_EQ(s.itl_ms.count, 6);
  EXPECT_NEAR(s.itl_ms.mean, 800.0 / 6.0, eps);
  EXPECT_NEAR(s.itl_ms.median, 100.0, eps);  // rank 2.5 between two 100s
  EXPECT_NEAR(s.itl_ms.p90, 200.0, eps);
  EXPECT_NEAR(s.itl_ms.p99, 200.0, eps);
  // E2E ms {300, 500, 600}
  EXPECT_EQ(s.e2e_ms.count, 3);
  EXPECT_NEAR(s.e2e_ms.mean, 1400.0 / 3.0, eps);
  EXPECT_NEAR(s.e2e_ms.median, 500.0, eps);
  EXPECT_NEAR(s.e2e_ms.p90, 580.0, eps);
  EXPECT_NEAR(s.e2e_ms.p99, 598.0, eps);
}

TEST(LoadgenStats, AllFailedGivesEmptyDistributionsAndZeroThroughput) {
  const snap::BenchSummary s = snap::summarize({failed("timeout")}, 1.0);
  EXPECT_EQ(s.completed, 0);
  EXPECT_EQ(s.failed, 1);
  EXPECT_EQ(s.ttft_ms.count, 0);
  EXPECT_EQ(s.e2e_ms.count, 0);
  EXPECT_EQ(s.request_throughput, 0.0);
  const std::string table = snap::format_summary_table(s);
  EXPECT_NE(table.find("n/a"), std::string::npos) << table;
  const nlohmann::json j = snap::bench_result_json(s, {failed("timeout")});
  EXPECT_TRUE(j["mean_ttft_ms"].is_null());
}

TEST(LoadgenStats, TableAndJsonCarryTheSummary) {
  const std::vector<RequestRecord> records = sample_records();
  const snap::BenchSummary s = snap::summarize(records, 2.0);
  const std::string table = snap::format_summary_table(s);
  for (const char* line : {"Successful requests:", "Failed requests:", "Request throughput (req/s):",
                           "Output token throughput (tok/s):", "Mean TTFT (ms):", "P99 TPOT (ms):",
                           "Median ITL (ms):", "P90 E2EL (ms):"}) {
    EXPECT_NE(table.find(line), std::string::npos) << line << "\n" << table;
  }
  EXPECT_NE(table.find("298.00"), std::string::npos) << table;  // P99 TTFT

  const nlohmann::json j = snap::bench_result_json(s, records);
  EXPECT_EQ(j["completed"], 3);
  EXPECT_EQ(j["failed"], 2);
  EXPECT_NEAR(j["p90_ttft_ms"].get<double>(), 280.0, 1e-9);
  EXPECT_NEAR(j["median_e2el_ms"].get<double>(), 500.0, 1e-9);
  ASSERT_EQ(j["ttfts"].size(), records.size());
  ASSERT_EQ(j["itls"].size(), records.size());
  EXPECT_EQ(j["itls"][0].size(), 4u);
  EXPECT_TRUE(j["ttfts"][3].is_null());  // a failed request has no TTFT
  EXPECT_EQ(j["output_lens"][1], 3);
  EXPECT_EQ(j["errors"][4], "connect: something");
  EXPECT_EQ(j["failures"]["http_429"], 1);
}

// --- SSE -------------------------------------------------------------------------

const std::string k_stream =
    "data: {\"a\":1}\n\n"
    ": a comment\n\n"
    "data:x\r\n\r\n"
    "data: line1\ndata: line2\n\n"
    "event: ping\nid: 7\ndata: [DONE]\r\r"
    "data: unfinished";
const std::vector<std::string> k_events = {"{\"a\":1}", "x", "line1\nline2", "[DONE]"};

TEST(LoadgenSse, WholeStreamGivesEveryEvent) {
  snap::SseParser p;
  EXPECT_EQ(p.feed(k_stream), k_events);
}

TEST(LoadgenSse, EverySplitPointGivesTheSameEvents) {
  for (size_t cut = 0; cut <= k_stream.size(); ++cut) {
    snap::SseParser p;
    std::vector<std::string> got = p.feed(std::string_view(k_stream).substr(0, cut));
    for (std::string& e : p.feed(std::string_view(k_stream).substr(cut))) got.push_back(std::move(e));
    EXPECT_EQ(got, k_events) << "split at byte " << cut;
  }
}

TEST(LoadgenSse, OneByteAtATimeGivesTheSameEvents) {
  snap::SseParser p;
  std::vector<std::string> got;
  for (char c : k_stream) {
    for (std::string& e : p.feed(std::string_view(&c, 1))) got.push_back(std::move(e));
  }
  EXPECT_EQ(got, k_events);
}

TEST(LoadgenSse, CrLfSplitAcrossFeedsIsOneLineEnd) {
  snap::SseParser p;
  EXPECT_TRUE(p.feed("data: a\r").empty());
  EXPECT_TRUE(p.feed("\n").empty());  // the \n completes \r\n, not a blank line
  EXPECT_EQ(p.feed("\r\n"), std::vector<std::string>{"a"});
}

// --- stream chunks ---------------------------------------------------------------

TEST(LoadgenChunk, CompletionTextChatDeltaUsageDoneErrorMalformed) {
  auto c = snap::parse_stream_chunk(
      R"({"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":" Paris","finish_reason":null}],"usage":null})",
      false);
  EXPECT_EQ(c.content, " Paris");
  EXPECT_FALSE(c.has_usage);
  EXPECT_FALSE(c.done);

  c = snap::parse_stream_chunk(R"({"choices":[{"index":0,"delta":{"role":"assistant","content":"Hi"}}]})", true);
  EXPECT_EQ(c.content, "Hi");
  c = snap::parse_stream_chunk(R"({"choices":[{"index":0,"delta":{"role":"assistant"}}]})", true);
  EXPECT_EQ(c.content, "");
  EXPECT_FALSE(c.malformed);

  c = snap::parse_stream_chunk(
      R"({"choices":[],"usage":{"prompt_tokens":64,"completion_tokens":8,"total_tokens":72}})", false);
  EXPECT_TRUE(c.has_usage);
  EXPECT_EQ(c.prompt_tokens, 64);
  EXPECT_EQ(c.completion_tokens, 8);

  EXPECT_TRUE(snap::parse_stream_chunk("[DONE]", true).done);
  c = snap::parse_stream_chunk(R"({"error":{"message":"timed out","type":"timeout"}})", false);
  EXPECT_EQ(c.error, "timed out");
  EXPECT_TRUE(snap::parse_stream_chunk("{not json", false).malformed);
  EXPECT_TRUE(snap::parse_stream_chunk("[1,2]", false).malformed);
}

}  // namespace
