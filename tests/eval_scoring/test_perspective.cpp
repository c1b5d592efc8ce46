// The Perspective-compatible endpoint of `snapserve serve --perspective-scorer
// tcc-toxic@0.3.0`, driven by the PyPI `perspective` client (tools/tox_perspective_check.py)
// and by our own Perspective client: scores equal the local classifier's, the request and
// error shapes are the API's, the client's rate limit spaces requests, its retries with
// backoff get through the endpoint's 429 quota, and failures are errors, never 0.
// Exits 77 without the model or the converted classifier files.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "tests/snapserve_binary.h"
#include "eval/scoring/perspective_client.h"
#include "eval/scoring/tox_bilstm.h"
#include "tests/eval_scoring/scoring_test_paths.h"
#include "tests/free_port.h"

namespace snap::scoring {
namespace {

namespace fs = std::filesystem;

std::string model_path() {
  if (const char* m = std::getenv("SNAP_MODEL")) return m;
  return std::string(std::getenv("HOME")) + "/.cache/snapserve/SmolLM2-135M-Instruct.Q4_1.gguf";
}

std::string slurp(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// `snapserve serve` on a free port with the Perspective route; stopped with SIGTERM.
class Server {
 public:
  Server(const std::string& dir, const std::vector<std::string>& extra) {
    port_ = snap::testing::free_port();
    err_ = dir + "/serve_" + std::to_string(port_) + ".err";
    pid_ = fork();
    if (pid_ == 0) {
      freopen(err_.c_str(), "w", stderr);
      std::string bin = snapserve_binary();
      std::vector<std::string> args = {bin, "serve", "--model", model_path(), "--port", std::to_string(port_),
                                       "--threads", "1", "--kv-cache-mib", "64", "--perspective-scorer", "tcc-toxic@0.3.0"};
      args.insert(args.end(), extra.begin(), extra.end());
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(bin.c_str(), argv.data());
      _exit(127);
    }
    for (int i = 0; i < 600 && slurp(err_).find("serving") == std::string::npos; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  ~Server() { stop(); }
  void stop() {
    if (pid_ <= 0) return;
    kill(pid_, SIGTERM);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  bool ready() const { return slurp(err_).find("serving") != std::string::npos; }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_) + "/v1alpha1/comments:analyze"; }
  std::string base() const { return "http://127.0.0.1:" + std::to_string(port_) + "/v1alpha1"; }
  std::string log() const { return slurp(err_); }

 private:
  int port_ = 0;
  pid_t pid_ = -1;
  std::string err_;
};

class PerspectiveEndpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("snap_persp_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    unsetenv("PERSPECTIVE_API_URL");
    unsetenv("PERSPECTIVE_API_KEY");
    model_ = std::move(ToxBilstm::load(testing::tcc_path("0.3.0"))).value();
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
  std::unique_ptr<ToxBilstm> model_;
};

TEST_F(PerspectiveEndpoint, PyPiClientGetsTheLocalScores) {
  Server srv(dir_.string(), {});
  ASSERT_TRUE(srv.ready()) << srv.log();
  auto fx = testing::load_fixture("tcc_toxic.json");
  std::vector<std::string> texts;
  for (const auto& s : fx["sentences"]) texts.push_back(s.get<std::string>());
  texts.resize(24);
  texts.push_back("");  // the API refuses an empty comment
  const std::string in = (dir_ / "texts.json").string(), out = (dir_ / "out.json").string();
  std::ofstream(in) << nlohmann::json(texts).dump();
  const std::string cmd = std::string(SNAP_PYTHON) + " " + SNAP_SOURCE_DIR + "/tools/tox_perspective_check.py " + srv.base() +
                          " " + in + " " + out;
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  auto res = nlohmann::json::parse(slurp(out))["results"];
  ASSERT_EQ(res.size(), texts.size() + 1);
  const int toxic = 0, threat = 3, insult = 4;
  for (size_t i = 0; i + 1 < texts.size(); ++i) {
    auto want = model_->classify(texts[i]);
    ASSERT_TRUE(res[i].contains("scores")) << i << ": " << res[i].dump();
    EXPECT_EQ(res[i]["scores"]["TOXICITY"].get<double>(), want[toxic]) << texts[i];
    EXPECT_EQ(res[i]["scores"]["INSULT"].get<double>(), want[insult]);
    EXPECT_EQ(res[i]["scores"]["THREAT"].get<double>(), want[threat]);
    EXPECT_EQ(res[i]["client_token"], "t" + std::to_string(i));
    EXPECT_EQ(res[i]["scorer"]["version"], "0.3.0");
    EXPECT_EQ(res[i]["scorer"]["sha256"], model_->file_sha256());
  }
  EXPECT_EQ(res[texts.size() - 1]["http_error"], 400);
  EXPECT_EQ(res[texts.size() - 1]["body"]["error"]["status"], "INVALID_ARGUMENT");
  EXPECT_EQ(res[texts.size()]["score_call"]["TOXICITY"].get<double>(), model_->classify("Thou lump of foul deformity.")[toxic]);
}

TEST_F(PerspectiveEndpoint, OurClientRateLimitRetriesAndErrors) {
  Server srv(dir_.string(), {});
  ASSERT_TRUE(srv.ready()) << srv.log();
  ScorerOptions o;
  o.perspective_url = srv.url();
  o.perspective_qps = 4;
  auto c = make_scorer("perspective@local-test", o);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ((*c)->info().key(), "perspective@local-test");
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 9; ++i) {
    const std::string text = "Thou art a boil, number " + std::to_string(i);
    auto r = (*c)->score(text, "");
    ASSERT_TRUE(r.error.ok()) << r.error.to_string();
    EXPECT_EQ(r.value, model_->classify(text)[0]);
    EXPECT_EQ(r.attributes["snapserveScorer"]["version"], "0.3.0");
    EXPECT_EQ(r.attributes["attempts"], 1);
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(secs, 8 / 4.0 - 0.05) << "9 requests at 4 QPS cannot take less than 2 s";
  // The server's answer to a bad attribute is an error with the raw body, not a score.
  o.perspective_attribute = "FLIRTATION";
  auto bad = make_scorer("perspective@local-test", o).value()->score("hello", "");
  EXPECT_EQ(bad.error.code(), StatusCode::k_invalid_argument) << bad.error.to_string();
  EXPECT_NE(bad.raw.find("FLIRTATION"), std::string::npos);
  // A dead endpoint: unavailable after 1 + retries attempts.
  srv.stop();
  o.perspective_attribute = "TOXICITY";
  o.perspective_retries = 2;
  o.perspective_backoff = 0.05;
  auto dead = make_scorer("perspective@local-test", o).value()->score("hello", "");
  EXPECT_EQ(dead.error.code(), StatusCode::k_unavailable) << dead.error.to_string();
  EXPECT_NE(dead.error.message().find("after 3 attempts"), std::string::npos) << dead.error.message();
}

TEST_F(PerspectiveEndpoint, RetriesWithBackoffGetThroughTheQuota) {
  Server srv(dir_.string(), {"--perspective-qps", "2"});
  ASSERT_TRUE(srv.ready()) << srv.log();
  ScorerOptions o;
  o.perspective_url = srv.url();
  o.perspective_qps = 0;  // no client-side limit: the server's quota answers 429
  o.perspective_retries = 0;
  auto eager = make_scorer("perspective@q", o).value();
  int refused = 0;
  for (int i = 0; i < 6; ++i) {
    auto r = eager->score("hello there", "");
    if (!r.error.ok()) {
      EXPECT_EQ(r.error.code(), StatusCode::k_resource_exhausted) << r.error.to_string();
      EXPECT_NE(r.raw.find("RESOURCE_EXHAUSTED"), std::string::npos);
      ++refused;
    }
  }
  EXPECT_GE(refused, 3) << "6 immediate requests against a 2 QPS quota";
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  o.perspective_retries = 5;
  o.perspective_backoff = 0.2;
  auto patient = make_scorer("perspective@q", o).value();
  int retried = 0;
  for (int i = 0; i < 6; ++i) {
    auto r = patient->score("hello there", "");
    ASSERT_TRUE(r.error.ok()) << r.error.to_string();
    retried += r.attributes["attempts"].get<int>() > 1;
  }
  EXPECT_GE(retried, 1) << "some requests must have met the quota and been retried";
}

TEST_F(PerspectiveEndpoint, GoogleEndpointNeedsAKey) {
  ScorerOptions o;
  auto r = make_scorer("perspective@2026-12-01", o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("PERSPECTIVE_API_KEY"), std::string::npos);
}

}  // namespace
}  // namespace snap::scoring

int main(int argc, char** argv) {
  if (!snap::scoring::testing::have_tcc_files() || !std::filesystem::exists(snap::scoring::model_path())) {
    std::printf("skipped: the default model or the converted tcc-toxic files are missing (scripts/setup.sh)\n");
    return 77;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
