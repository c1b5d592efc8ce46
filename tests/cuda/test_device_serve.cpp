// `snapserve serve --device cuda` end to end over HTTP, on a random tiny-llama3 model
// (tools/make_random_model.py: 2 layers, 2 KV heads, head_dim 32, its own tokenizer), with a
// 1 MiB device KV pool (496 blocks of 16 tokens × one KV head). Checked as a client sees it:
//   - /health, and /metrics with the device's memory (weights, pool used/free, in use, total);
//   - batch invariance through the service: three greedy completions sent at once give the
//     texts each gives alone;
//   - every kv policy answers, compressing (resident < full-equivalent bytes), and a layer-wise
//     prefill asked for says so in its response;
//   - admission by the device pool's blocks: two prompts that fit one at a time but not
//     together both finish (the second waits), each with its text alone; one that can never
//     fit gets 400 naming the device KV blocks;
//   - cancel: a stream closed by its client frees its blocks (kv_pool_used back to 0);
//   - SIGTERM drain: a running request finishes ("length"), then the server exits 0;
//   - n > 1 as on the CPU: choice c of a sampled request is what the request with seed + c
//     gives alone (forked from a compressed cache, and from a full one), and the copies' blocks
//     go back; echo's prompt logprobs are the log-softmax of the logits `generate --device
//     cuda --dump-logits` writes, and max_tokens 0 only scores; n choices keep n copies of their
//     compressed cache reserved (a request that would not fit beside them waits).
// Exits 77 without a usable GPU (the no-GPU contract is tests/device/test_device_cli.cpp).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <future>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "tests/snapserve_binary.h"
#include "tests/cuda/tiny_gemma3.h"
#include "tests/e2e/http_client.h"
#include "tests/e2e/logits_dump_file.h"
#include "tests/e2e/server_process.h"

namespace snap {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using snap::testing::Reply;
using snap::testing::ServerProcess;

const std::string k_bin = snapserve_binary();

// The value of a /metrics series, -1 when absent: name{labels} value.
double metric(const std::string& text, const std::string& name, const std::string& label) {
  const std::regex re(name + R"(\{[^}]*)" + label + R"([^}]*\} ([0-9.e+-]+))");
  std::smatch m;
  return std::regex_search(text, m, re) ? std::stod(m[1]) : -1.0;
}

class DeviceServe : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("snap_devserve_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    const std::string cmd = test_python() + " " + test_source_dir() + "/tools/make_random_model.py --shape tiny-llama3 " +
                            "--dtype bf16 --seed 3 --out " + (dir_ / "m").string() + " >/dev/null 2>&1";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  }
  static void TearDownTestSuite() {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::unique_ptr<ServerProcess> start(const std::vector<std::string>& extra = {}, const std::string& model = "") {
    std::vector<std::string> argv = {k_bin, "serve", "--device", "cuda", "--model", model.empty() ? (dir_ / "m").string() : model,
                                     "--port", "0",
                                     "--kv-cache-mib", "1", "--prefill-chunk", "64", "--shutdown-timeout", "30"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return std::make_unique<ServerProcess>(argv);
  }
  static json completion(const std::string& prompt, int max_tokens, const json& kv = nullptr) {
    json b = {{"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}, {"ignore_eos", true}};
    if (!kv.is_null()) b["kv_compression"] = kv;
    return b;
  }
  static std::string words(int n, int seed) {
    std::string s;
    for (int i = 0; i < n; ++i) {  // appended piece by piece: GCC 12 misreads "w" + std::string&& (-Wrestrict)
      s += 'w';
      s += std::to_string((i * 7919 + seed) % 97);
      s += ' ';
    }
    return s;
  }
  // Greedy completions of `prompts` sent at once give the texts each gives alone.
  static void expect_batched_as_alone(ServerProcess& srv, const std::vector<std::string>& prompts, int max_tokens) {
    std::vector<std::future<Reply>> together;
    for (const auto& p : prompts)
      together.push_back(std::async(std::launch::async, [&, p] {
        return snap::testing::post(srv.port(), "/v1/completions", completion(p, max_tokens));
      }));
    std::vector<std::string> texts;
    for (auto& f : together) {
      const Reply r = f.get();
      ASSERT_EQ(r.status, 200) << r.body << r.error;
      texts.push_back(r.j()["choices"][0]["text"].get<std::string>());
      EXPECT_EQ(r.j()["usage"]["completion_tokens"], max_tokens);
    }
    for (size_t i = 0; i < prompts.size(); ++i) {
      const Reply r = snap::testing::post(srv.port(), "/v1/completions", completion(prompts[i], max_tokens));
      ASSERT_EQ(r.status, 200) << r.body;
      EXPECT_EQ(r.j()["choices"][0]["text"].get<std::string>(), texts[i]) << "prompt " << i << " alone vs batched";
    }
  }
  static inline fs::path dir_;
};

TEST_F(DeviceServe, HealthMetricsAndBatchInvariance) {
  auto srv = start();
  ASSERT_GT(srv->port(), 0) << srv->log();
  EXPECT_EQ(snap::testing::call(srv->port(), snap::testing::http::verb::get, "/health").status, 200);
  expect_batched_as_alone(*srv, {words(40, 1), words(90, 2), words(15, 3)}, 16);
  // The engine publishes its figures after each step: poll until the finished requests' blocks show as free.
  std::string m;
  for (int i = 0; i < 100; ++i) {
    m = snap::testing::call(srv->port(), snap::testing::http::verb::get, "/metrics").body;
    if (metric(m, "snapserve_device_memory_bytes", "kind=\"kv_pool_used\"") == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_GT(metric(m, "snapserve_device_memory_bytes", "kind=\"weights\""), 0) << m;
  EXPECT_GT(metric(m, "snapserve_device_memory_bytes", "kind=\"kv_pool_free\""), 0) << m;
  EXPECT_GT(metric(m, "snapserve_device_memory_bytes", "kind=\"kv_pool_peak\""), 0) << m;
  EXPECT_GT(metric(m, "snapserve_device_memory_bytes", "kind=\"total\""), 0) << m;
  EXPECT_EQ(metric(m, "snapserve_device_memory_bytes", "kind=\"kv_pool_used\""), 0) << m;
}

// Greedy requests that need nothing else of their logits take their ids from the device's argmax
// (no logits copied to the host): the same text as the host's sampling of copied logits, which a
// request asking for logprobs takes; /metrics counts the rows of each, also in steps that hold
// rows of both kinds (only the logprobs row's logits are copied there).
TEST_F(DeviceServe, GreedyIdsOnTheDeviceMatchTheLogitsPath) {
  auto srv = start();
  ASSERT_GT(srv->port(), 0) << srv->log();
  const std::string prompt = words(30, 5);
  const Reply ids = snap::testing::post(srv->port(), "/v1/completions", completion(prompt, 12));
  ASSERT_EQ(ids.status, 200) << ids.body;
  json with_logprobs = completion(prompt, 12);
  with_logprobs["logprobs"] = 1;
  const Reply logits = snap::testing::post(srv->port(), "/v1/completions", with_logprobs);
  ASSERT_EQ(logits.status, 200) << logits.body;
  EXPECT_EQ(ids.j()["choices"][0]["text"], logits.j()["choices"][0]["text"]);
  EXPECT_EQ(logits.j()["choices"][0]["logprobs"]["tokens"].size(), 12u) << logits.body;
  const std::string m = snap::testing::call(srv->port(), snap::testing::http::verb::get, "/metrics").body;
  // 12 tokens each: the first from the prefill's logits, 11 from decode rows.
  EXPECT_EQ(metric(m, "snapserve_decode_rows_total", "sampled_on=\"device\""), 11) << m;
  EXPECT_EQ(metric(m, "snapserve_decode_rows_total", "sampled_on=\"host\""), 11) << m;
  // Both at once, 40 tokens each (steps that hold a row of each): each row is counted by where
  // its id came from, whatever shares its step, and the texts are those alone.
  const std::string longer = words(20, 6);
  json a = completion(longer, 40), b = completion(longer, 40);
  b["logprobs"] = 1;
  const Reply alone = snap::testing::post(srv->port(), "/v1/completions", a);
  ASSERT_EQ(alone.status, 200) << alone.body;
  auto fa = std::async(std::launch::async, [&] { return snap::testing::post(srv->port(), "/v1/completions", a); });
  auto fb = std::async(std::launch::async, [&] { return snap::testing::post(srv->port(), "/v1/completions", b); });
  const Reply ra = fa.get(), rb = fb.get();
  ASSERT_EQ(ra.status, 200) << ra.body;
  ASSERT_EQ(rb.status, 200) << rb.body;
  EXPECT_EQ(ra.j()["choices"][0]["text"], alone.j()["choices"][0]["text"]);
  EXPECT_EQ(rb.j()["choices"][0]["text"], alone.j()["choices"][0]["text"]);
  const std::string m2 = snap::testing::call(srv->port(), snap::testing::http::verb::get, "/metrics").body;
  EXPECT_EQ(metric(m2, "snapserve_decode_rows_total", "sampled_on=\"device\""), 11 + 39 + 39) << m2;
  EXPECT_EQ(metric(m2, "snapserve_decode_rows_total", "sampled_on=\"host\""), 11 + 39) << m2;
}

TEST_F(DeviceServe, EveryPolicyCompresses) {
  auto srv = start();
  ASSERT_GT(srv->port(), 0) << srv->log();
  for (const char* policy : {"snapkv", "pyramidkv", "adakv", "h2o", "streaming"}) {
    const json kv = {{"policy", policy}, {"budget", 64}, {"window", 16}, {"kernel", 5}};
    const Reply r = snap::testing::post(srv->port(), "/v1/completions", completion(words(150, 4), 8, kv));
    ASSERT_EQ(r.status, 200) << policy << ": " << r.body;
    const json k = r.j()["kv"];
    EXPECT_EQ(k["policy"], policy);
    EXPECT_LT(k["resident_bytes"].get<int64_t>(), k["full_equivalent_bytes"].get<int64_t>()) << policy << ": " << k.dump();
  }
  // Layer-wise prefill asked for: the response says so, and the cache is compressed the same way.
  const json kv = {{"policy", "snapkv"}, {"budget", 64}, {"window", 16}, {"kernel", 5}, {"layerwise", true}};
  const Reply r = snap::testing::post(srv->port(), "/v1/completions", completion(words(150, 4), 8, kv));
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.j()["kv"]["prefill"], "layerwise") << r.body;
  EXPECT_LT(r.j()["kv"]["resident_bytes"].get<int64_t>(), r.j()["kv"]["full_equivalent_bytes"].get<int64_t>());
  EXPECT_EQ(r.j()["usage"]["completion_tokens"], 8);
}

// A host allocation that fails inside a step (std::bad_alloc) ends the running request with a 500
// naming the out of memory, its device blocks go back, and the server goes on serving
// ($SNAP_FAULT_BAD_ALLOC_STEP=3: the third step fails after its device operations ran).
TEST_F(DeviceServe, OutOfMemoryInAStepEndsItsRequestsAndTheServerGoesOn) {
  ServerProcess srv({"env", "SNAP_FAULT_BAD_ALLOC_STEP=3", k_bin, "serve", "--device", "cuda", "--model",
                     (dir_ / "m").string(), "--port", "0", "--kv-cache-mib", "1", "--prefill-chunk", "64",
                     "--shutdown-timeout", "30"});
  ASSERT_GT(srv.port(), 0) << srv.log();
  const json body = completion(words(20, 5), 12);
  const Reply failed = snap::testing::post(srv.port(), "/v1/completions", body);
  EXPECT_EQ(failed.status, 500) << failed.body;
  EXPECT_NE(failed.body.find("out of memory"), std::string::npos) << failed.body;
  const Reply next = snap::testing::post(srv.port(), "/v1/completions", body);
  ASSERT_EQ(next.status, 200) << next.body << srv.log();
  EXPECT_EQ(next.j()["usage"]["completion_tokens"], 12) << next.body;
  EXPECT_NE(srv.log().find("snapserve: error: out of memory: a host allocation failed during a step"), std::string::npos)
      << srv.log();
}

TEST_F(DeviceServe, ChoicesAndEchoAsOnTheCpu) {
  auto srv = start();
  ASSERT_GT(srv->port(), 0) << srv->log();
  // n = 3 sampled choices of a prompt compressed to 64 entries per head: choice c is the request
  // with seed 41 + c alone (each choice decodes its own copy of the compressed cache).
  const std::string prompt = words(150, 9);
  const json kv = {{"policy", "snapkv"}, {"budget", 64}, {"window", 16}, {"kernel", 5}};
  json body = completion(prompt, 10, kv);
  body["temperature"] = 0.9;
  body["seed"] = 41;
  body["n"] = 3;
  const Reply r = snap::testing::post(srv->port(), "/v1/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  const json rj = r.j();
  ASSERT_EQ(rj["choices"].size(), 3u) << r.body;
  EXPECT_EQ(rj["usage"]["completion_tokens"], 30) << r.body;
  std::vector<std::string> texts(3);
  for (const json& c : rj["choices"]) texts.at(c["index"].get<size_t>()) = c["text"].get<std::string>();
  EXPECT_FALSE(texts[0] == texts[1] && texts[1] == texts[2]) << "three seeds, one text: " << texts[0];
  for (int c = 0; c < 3; ++c) {
    json one = body;
    one.erase("n");
    one["seed"] = 41 + c;
    const Reply a = snap::testing::post(srv->port(), "/v1/completions", one);
    ASSERT_EQ(a.status, 200) << a.body;
    EXPECT_EQ(a.j()["choices"][0]["text"].get<std::string>(), texts[c]) << "choice " << c << " vs seed " << 41 + c << " alone";
  }
  // Full cache, greedy: two choices, each the greedy text.
  json greedy = completion(words(70, 10), 8);
  const Reply alone = snap::testing::post(srv->port(), "/v1/completions", greedy);
  ASSERT_EQ(alone.status, 200) << alone.body;
  greedy["n"] = 2;
  const Reply two = snap::testing::post(srv->port(), "/v1/completions", greedy);
  ASSERT_EQ(two.status, 200) << two.body;
  const json tj = two.j();
  ASSERT_EQ(tj["choices"].size(), 2u) << two.body;
  for (const json& c : tj["choices"]) EXPECT_EQ(c["text"], alone.j()["choices"][0]["text"]) << two.body;
  // n outside [1, 64] is refused.
  json many = greedy;
  many["n"] = 65;
  EXPECT_EQ(snap::testing::post(srv->port(), "/v1/completions", many).status, 400);

  // echo: every prompt token's logprob is the log-softmax of the dumped logits of the row before
  // it (the same device forward in the same 64-token chunks). generate makes its last chunk a
  // whole one (it must hold the observed window: 64, 64, 64, 34, 64 for 290 tokens) where serve
  // cuts 64s from the start (64, 64, 64, 64, 34), so the chunks are the same only for a prompt of
  // whole chunks: the words are chosen so (the server counts their tokens). Other chunks differ by
  // more than float rounding where the host BLAS's sums depend on the chunk's rows (OpenBLAS's
  // Zen sgemm does; on bf16 activations a last-bit change can move a logit by ~1e-3).
  std::string eprompt;
  for (int words_n = 90; words_n < 200 && eprompt.empty(); ++words_n) {
    const std::string text = words(words_n, 11);
    const Reply c = snap::testing::post(srv->port(), "/v1/completions", {{"prompt", text}, {"max_tokens", 1}});
    ASSERT_EQ(c.status, 200) << c.body;
    if (c.j()["usage"]["prompt_tokens"].get<int64_t>() % 64 == 0) eprompt = text;
  }
  ASSERT_FALSE(eprompt.empty()) << "no word count of 90..199 gave whole 64-token chunks";
  const std::string dump = (dir_ / "echo.logits").string();
  const std::string cmd = k_bin + " generate --device cuda --model " + (dir_ / "m").string() + " --prompt '" + eprompt +
                          "' --max-tokens 1 --prefill-chunk 64 --dump-logits " + dump + " >/dev/null 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  snap::testing::DumpedLogits d;
  ASSERT_TRUE(snap::testing::read_logits_dump(dump, &d)) << dump;
  const int64_t n = d.n;
  ASSERT_GT(n, 64) << "the prompt should take more than one chunk";
  const Reply e = snap::testing::post(srv->port(), "/v1/completions",
                                      {{"prompt", eprompt}, {"max_tokens", 0}, {"echo", true}, {"logprobs", 2}});
  ASSERT_EQ(e.status, 200) << e.body;
  const json lp = e.j()["choices"][0]["logprobs"];
  EXPECT_EQ(e.j()["usage"]["completion_tokens"], 0);
  ASSERT_EQ(static_cast<int64_t>(lp["token_logprobs"].size()), n) << lp.dump();
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());
  for (int64_t j = 1; j < n; ++j) {
    EXPECT_NEAR(lp["token_logprobs"][j].get<double>(), snap::testing::log_softmax_at(d.row(j - 1), d.vocab, d.ids[j]), 1e-3)
        << "prompt token " << j;
    // The 2 most likely, and the prompt token itself when it is not among them.
    EXPECT_GE(lp["top_logprobs"][j].size(), 2u);
    EXPECT_LE(lp["top_logprobs"][j].size(), 3u);
    EXPECT_TRUE(lp["top_logprobs"][j].contains(lp["tokens"][j].get<std::string>())) << lp["top_logprobs"][j].dump();
  }
  // With generation: the prompt's logprobs, then the completion's.
  const Reply g = snap::testing::post(srv->port(), "/v1/completions",
                                      {{"prompt", eprompt}, {"max_tokens", 3}, {"echo", true}, {"logprobs", 0}, {"temperature", 0}});
  ASSERT_EQ(g.status, 200) << g.body;
  EXPECT_EQ(static_cast<int64_t>(g.j()["choices"][0]["logprobs"]["tokens"].size()), n + 3) << g.body;
  // Every copy's blocks go back.
  std::string m;
  for (int i = 0; i < 100; ++i) {
    m = snap::testing::call(srv->port(), snap::testing::http::verb::get, "/metrics").body;
    if (metric(m, "snapserve_device_memory_bytes", "kind=\"kv_pool_used\"") == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(metric(m, "snapserve_device_memory_bytes", "kind=\"kv_pool_used\""), 0) << m;
}

TEST_F(DeviceServe, AdmissionByDeviceBlocks) {
  auto srv = start();
  ASSERT_GT(srv->port(), 0) << srv->log();
  // Tokens per word of this tokenizer, to size prompts against the 496-block pool
  // (2 layers x 2 KV heads = 4 blocks per 16 tokens, full policy).
  const Reply probe = snap::testing::post(srv->port(), "/v1/completions", completion(words(100, 5), 1));
  ASSERT_EQ(probe.status, 200) << probe.body;
  const double per_word = probe.j()["usage"]["prompt_tokens"].get<double>() / 100.0;
  const int fits_alone = static_cast<int>(1300 / per_word);  // ~1300 tokens: ~328 blocks, two need ~656 > 496
  const std::string a = words(fits_alone, 6), b = words(fits_alone, 7);
  auto fa = std::async(std::launch::async, [&] { return snap::testing::post(srv->port(), "/v1/completions", completion(a, 8)); });
  auto fb = std::async(std::launch::async, [&] { return snap::testing::post(srv->port(), "/v1/completions", completion(b, 8)); });
  const Reply ra = fa.get(), rb = fb.get();
  ASSERT_EQ(ra.status, 200) << ra.body;
  ASSERT_EQ(rb.status, 200) << rb.body;
  const Reply ra1 = snap::testing::post(srv->port(), "/v1/completions", completion(a, 8));
  EXPECT_EQ(ra1.j()["choices"][0]["text"], ra.j()["choices"][0]["text"]);
  const Reply big = snap::testing::post(srv->port(), "/v1/completions", completion(words(2 * fits_alone, 8), 8));
  EXPECT_EQ(big.status, 400) << big.body;
  EXPECT_NE(big.body.find("device KV blocks"), std::string::npos) << big.body;
}

// n > 1 holds n copies of its compressed cache: a request of 3 choices keeps 3 x (64 + 300 tokens)
// per head reserved after its compression (276 of the 496 blocks), so a full-cache request of
// ~400 blocks sent while it streams waits for it instead of running beside it — where the two
// would outgrow the pool (one copy's reservation: 92 + 400 <= 496 admits it, then both fail).
TEST_F(DeviceServe, ChoicesKeepEveryCopyReserved) {
  auto srv = start();
  ASSERT_GT(srv->port(), 0) << srv->log();
  const Reply probe = snap::testing::post(srv->port(), "/v1/completions", completion(words(100, 5), 1));
  ASSERT_EQ(probe.status, 200) << probe.body;
  const double per_word = probe.j()["usage"]["prompt_tokens"].get<double>() / 100.0;
  const json big = completion(words(static_cast<int>(1390 / per_word), 12), 200);  // ~(1390 + 200) / 16 x 4 = 400 blocks
  const Reply alone = snap::testing::post(srv->port(), "/v1/completions", big);
  ASSERT_EQ(alone.status, 200) << alone.body;
  json body = completion(words(150, 13), 300, {{"policy", "snapkv"}, {"budget", 64}, {"window", 16}, {"kernel", 5}});
  body["n"] = 3;
  body["temperature"] = 0.9;
  body["stream"] = true;
  std::atomic<bool> streaming{false};
  auto stream = std::async(std::launch::async, [&] {
    snap::testing::RawConn sock(srv->port());
    const std::string b = body.dump();
    sock.send_all("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  "Connection: close\r\nContent-Length: " + std::to_string(b.size()) + "\r\n\r\n" + b);
    std::string all;
    while (sock.read_some(&all, 1000))  // until the server closes (or the connection failed)
      if (all.find("data:") != std::string::npos) streaming = true;
    streaming = true;
    return all;
  });
  for (int i = 0; i < 2000 && !streaming; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const Reply b = snap::testing::post(srv->port(), "/v1/completions", big);
  const std::string streamed = stream.get();
  ASSERT_EQ(b.status, 200) << b.body;
  EXPECT_EQ(b.j()["choices"][0]["text"], alone.j()["choices"][0]["text"]);
  EXPECT_EQ(b.j()["choices"][0]["finish_reason"], "length") << b.body;
  EXPECT_NE(streamed.find("[DONE]"), std::string::npos) << streamed.substr(0, 2000);
  EXPECT_EQ(streamed.find("\"error\""), std::string::npos) << streamed.substr(streamed.find("\"error\""), 600);
}

// Gemma 3 through the service, on test_device_generate's tiny Gemma 3 GGUF (4 layers, local and
// global alternating, window 48; keep its arguments as scripts/device_deps.sh has them): three
// greedy completions sent at once give the texts each gives alone (a batch's attention launch
// takes each layer's own window; the post-norms and GeGLU run per row), and every policy
// compresses with each local layer keeping its last 48 positions, so the resident KV is exactly
// 2 local layers x 48 + 2 global layers x the budget entries per KV head (+ the generated tokens),
// in 16-token blocks.
TEST_F(DeviceServe, Gemma3BatchedAsAloneAndLocalLayersKeepTheirWindow) {
  std::string why;
  const std::string model = test::tiny_gemma3(test_python(), test_source_dir(), dir_ / "g3", &why);
  if (model.empty()) GTEST_SKIP() << why;
  auto srv = start({}, model);
  ASSERT_GT(srv->port(), 0) << srv->log();
  expect_batched_as_alone(*srv, {words(40, 1), words(90, 2), words(150, 3)}, 12);
  for (const char* policy : {"snapkv", "pyramidkv", "adakv", "h2o", "streaming"}) {
    const json kv = {{"policy", policy}, {"budget", 32}, {"window", 16}, {"kernel", 5}};
    const Reply r = snap::testing::post(srv->port(), "/v1/completions", completion(words(150, 4), 8, kv));
    ASSERT_EQ(r.status, 200) << policy << ": " << r.body;
    const json k = r.j()["kv"];
    const int64_t prompt = r.j()["usage"]["prompt_tokens"].get<int64_t>();
    ASSERT_GT(prompt, 64) << "the prompt must pass the window and the budget";
    // Slots per KV head, in the pool's 16-token blocks: the full cache holds prompt + 7
    // generated tokens in each of 4 layers (the 8th is sampled, never appended); compressed, a
    // local layer 48 + 7 and a global one budget + 7 (pyramidkv: its own layer budgets).
    const auto slots = [](int64_t entries) { return (entries + 15) / 16 * 16; };
    const int64_t full = 4 * slots(prompt + 7), local = 2 * slots(48 + 7), kept = local + 2 * slots(32 + 7);
    const int64_t resident = k["resident_bytes"].get<int64_t>(), full_bytes = k["full_equivalent_bytes"].get<int64_t>();
    if (std::string(policy) == "pyramidkv") {
      EXPECT_LT(resident * full, full_bytes * kept) << policy << ": " << k.dump();  // deeper layers keep less
      EXPECT_GT(resident * full, full_bytes * local) << policy << ": " << k.dump();
    } else {
      EXPECT_EQ(full_bytes * kept, resident * full) << policy << ": " << k.dump();
    }
  }
}

TEST_F(DeviceServe, CancelFreesBlocksAndSigtermDrains) {
  auto srv = start();
  ASSERT_GT(srv->port(), 0) << srv->log();
  {  // a stream the client closes after its first bytes
    snap::testing::RawConn sock(srv->port());
    ASSERT_TRUE(sock.ok());
    json body = completion(words(60, 9), 4000);
    body["stream"] = true;
    const std::string b = body.dump();
    const std::string req = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
                            std::to_string(b.size()) + "\r\n\r\n" + b;
    ASSERT_TRUE(sock.send_all(req));
    std::string first;
    for (int i = 0; i < 120 && first.empty(); ++i) ASSERT_TRUE(sock.read_some(&first, 1000));
    sock.close();
  }
  double used = -1;
  for (int i = 0; i < 200 && used != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    used = metric(snap::testing::call(srv->port(), snap::testing::http::verb::get, "/metrics").body,
                  "snapserve_device_memory_bytes", "kind=\"kv_pool_used\"");
  }
  EXPECT_EQ(used, 0) << "the cancelled stream's blocks were not freed";
  // A request running when SIGTERM arrives finishes within --shutdown-timeout.
  auto running = std::async(std::launch::async, [&] {
    return snap::testing::post(srv->port(), "/v1/completions", completion(words(30, 10), 300));
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const int rc = srv->terminate(60);
  const Reply r = running.get();
  EXPECT_EQ(rc, 0) << srv->log();
  ASSERT_EQ(r.status, 200) << r.body << r.error;
  EXPECT_EQ(r.j()["choices"][0]["finish_reason"], "length");
}

}  // namespace
}  // namespace snap

int main(int argc, char** argv) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    std::printf("test_device_serve: no CUDA device (%s): skipped\n", err != cudaSuccess ? cudaGetErrorString(err) : "0 devices");
    return 77;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
