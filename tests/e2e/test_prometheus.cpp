// The service as a Prometheus user sees it: `snapserve serve` on a free loopback port,
// its /metrics accepted by `promtool check metrics`, a real Prometheus (Debian package,
// temporary config, 1 s scrapes) scraping it while `snapserve bench serve` loads it, and
// Prometheus' query API answering for the TTFT histogram, the per-rank KV resident bytes and
// the generation token counter. Both child processes are killed by RAII guards on any exit.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "tests/snapserve_binary.h"
#include "tests/prom_text.h"
#include "tests/e2e/http_client.h"
#include "tests/free_port.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* k_prometheus = "/usr/bin/prometheus";
constexpr const char* k_promtool = "/usr/bin/promtool";

std::string model_path() {
  if (const char* m = std::getenv("SNAP_MODEL")) return m;
  return std::string(std::getenv("HOME")) + "/.cache/snapserve/SmolLM2-135M-Instruct.Q4_1.gguf";
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

using snap::testing::free_port;

// --- child processes -----------------------------------------------------------

// A child process (argv, stdout+stderr to log) that is SIGTERMed, then SIGKILLed after
// 5 s, and reaped when the guard goes out of scope.
class ChildGuard {
 public:
  ChildGuard(const std::vector<std::string>& argv, const fs::path& log) {
    pid_ = ::fork();
    if (pid_ == 0) {
      std::FILE* f = std::fopen(log.c_str(), "w");
      if (f != nullptr) {
        ::dup2(::fileno(f), 1);
        ::dup2(::fileno(f), 2);
      }
      std::vector<char*> args;
      for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      ::execv(args[0], args.data());
      std::_Exit(127);
    }
  }
  ChildGuard(const ChildGuard&) = delete;
  ChildGuard& operator=(const ChildGuard&) = delete;
  ~ChildGuard() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGTERM);
    for (int i = 0; i < 50; ++i) {
      if (::waitpid(pid_, nullptr, WNOHANG) == pid_) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  bool started() const { return pid_ > 0; }
  bool running() const { return pid_ > 0 && ::waitpid(pid_, nullptr, WNOHANG) == 0; }

 private:
  pid_t pid_ = -1;
};

// --- HTTP (tests/e2e/http_client.h) ------------------------------------------------------

struct HttpReply {
  int status = 0;  // 0: no answer (connect/read failed or timed out)
  std::string body;
};

HttpReply http_get(int port, const std::string& target, double timeout_s = 10) {
  const snap::testing::Reply r = snap::testing::get_within(port, target, timeout_s);
  return {r.status, r.body};
}

std::string url_encode(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '_' || c == '-' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      char buf[4];
      std::snprintf(buf, sizeof buf, "%%%02X", c);
      out += buf;
    }
  }
  return out;
}

// Parses "name value" samples out of exposition text (label-less series only).
double exposed_value(const std::string& text, const std::string& name) { return snap::testing::prom_value(text, name); }

// --- the test ------------------------------------------------------------------

class Prometheus : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(model_path())) << "default model missing at " << model_path()
                                          << " (run scripts/setup.sh or set SNAP_MODEL)";
    ASSERT_TRUE(fs::exists(k_prometheus) && fs::exists(k_promtool))
        << "Debian package `prometheus` missing (" << k_prometheus << ", " << k_promtool << ")";
    tmp_ = fs::temp_directory_path() / ("snap_prom_" + std::to_string(::getpid()));
    fs::remove_all(tmp_);
    fs::create_directories(tmp_);
  }
  void TearDown() override { fs::remove_all(tmp_); }

  // Waits for "snapserve: serving MODEL on http://HOST:PORT" in the log; the port or 0.
  int wait_for_server(const ChildGuard& server, const fs::path& log, double timeout_s) {
    const std::regex re("serving .* on http://[^:]+:([0-9]+)");
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    while (std::chrono::steady_clock::now() < deadline && server.running()) {
      std::smatch m;
      const std::string text = slurp(log);
      if (std::regex_search(text, m, re)) return std::stoi(m[1].str());
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return 0;
  }

  // Runs promtool on text; its exit code and report.
  std::pair<int, std::string> promtool_check(const std::string& text) {
    const fs::path in = tmp_ / "metrics.txt", out = tmp_ / "promtool.out";
    std::ofstream(in) << text;
    const std::string cmd = std::string(k_promtool) + " check metrics <" + in.string() + " >" +
                            out.string() + " 2>&1";
    const int rc = std::system(cmd.c_str());
    return {WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, slurp(out)};
  }

  // Polls Prometheus' instant-query API until `query` has a result (timeout: false).
  bool wait_for_query(int prom_port, const std::string& query, double timeout_s, std::string* last) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    while (std::chrono::steady_clock::now() < deadline) {
      const HttpReply r = http_get(prom_port, "/api/v1/query?query=" + url_encode(query));
      *last = std::to_string(r.status) + " " + r.body;
      const json j = json::parse(r.body, nullptr, false);
      if (r.status == 200 && j.is_object() && j.value("status", "") == "success" &&
          j["data"]["result"].is_array() && !j["data"]["result"].empty()) {
        return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
    }
    return false;
  }

  fs::path tmp_;
};

TEST_F(Prometheus, ScrapesTheServerDuringALoad) {
  const std::string binary = snapserve_binary();
  const fs::path server_log = tmp_ / "server.log";
  ChildGuard server({binary, "serve", "--model", model_path(), "--host", "127.0.0.1", "--port", "0"},
                    server_log);
  ASSERT_TRUE(server.started());
  const int port = wait_for_server(server, server_log, 120);
  ASSERT_GT(port, 0) << "server did not report its address; log:\n" << slurp(server_log);

  // /metrics of a fresh server already lists the series dashboards select on.
  const HttpReply fresh = http_get(port, "/metrics");
  ASSERT_EQ(fresh.status, 200) << fresh.body;
  const auto [fresh_rc, fresh_report] = promtool_check(fresh.body);
  EXPECT_EQ(fresh_rc, 0) << "promtool check metrics on a fresh server:\n" << fresh_report;
  EXPECT_FALSE(std::isnan(exposed_value(fresh.body, "snapserve_kv_cache_resident_bytes{rank=\"0\"}"))) << fresh.body;

  // A real Prometheus scraping every second.
  const int prom_port = free_port();
  const fs::path config = tmp_ / "prom.yml";
  std::ofstream(config) << "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                           "scrape_configs:\n  - job_name: snapserve\n    static_configs:\n"
                           "      - targets: ['127.0.0.1:"
                        << port << "']\n";
  ChildGuard prometheus({k_prometheus, "--config.file=" + config.string(),
                         "--storage.tsdb.path=" + (tmp_ / "data").string(),
                         "--web.listen-address=127.0.0.1:" + std::to_string(prom_port)},
                        tmp_ / "prometheus.log");
  ASSERT_TRUE(prometheus.started());

  // The load: 6 streaming requests through our own load generator.
  const fs::path bench_json = tmp_ / "bench.json", bench_log = tmp_ / "bench.log";
  const std::string cmd = binary + " bench serve --url http://127.0.0.1:" + std::to_string(port) +
                          " --requests 6 --concurrency 2 --max-tokens 8 --prompt-len 64 --timeout 120"
                          " --json " + bench_json.string() + " >" + bench_log.string() + " 2>&1";
  const int rc = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(rc) && WEXITSTATUS(rc) == 0) << "bench serve failed:\n" << slurp(bench_log);
  const json bench = json::parse(slurp(bench_json), nullptr, false);
  ASSERT_TRUE(bench.is_object()) << slurp(bench_json);
  EXPECT_EQ(bench["completed"], 6) << slurp(bench_log);
  EXPECT_EQ(bench["failed"], 0) << slurp(bench_log);

  // The server's own counters agree with the usage the clients were told.
  const HttpReply after = http_get(port, "/metrics");
  ASSERT_EQ(after.status, 200);
  const auto [after_rc, after_report] = promtool_check(after.body);
  EXPECT_EQ(after_rc, 0) << "promtool check metrics after the load:\n" << after_report;
  EXPECT_EQ(exposed_value(after.body, "snapserve_generation_tokens_total"),
            bench["total_output_tokens"].get<double>());
  EXPECT_EQ(exposed_value(after.body, "snapserve_prompt_tokens_total"),
            bench["total_input_tokens"].get<double>());
  EXPECT_EQ(exposed_value(after.body, "snapserve_time_to_first_token_seconds_count"), 6.0);

  // Prometheus has scraped them (first samples show after a few seconds).
  ASSERT_TRUE(prometheus.running()) << slurp(tmp_ / "prometheus.log");
  for (const std::string query : {"snapserve_time_to_first_token_seconds_bucket{le=\"+Inf\"} > 0",
                                  "snapserve_kv_cache_resident_bytes{rank=\"0\"}",
                                  "snapserve_generation_tokens_total > 0"}) {
    std::string last;
    EXPECT_TRUE(wait_for_query(prom_port, query, 30, &last))
        << "no result for " << query << "; last answer: " << last << "\nprometheus log:\n"
        << slurp(tmp_ / "prometheus.log");
  }
}

}  // namespace
