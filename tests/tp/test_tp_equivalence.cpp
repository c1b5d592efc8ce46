// Tensor parallelism against one process, run under `mpirun -np N` (ctest label mpi):
// rank 0 first generates alone over the whole model (TP=1, in-process), then all N ranks
// generate the same request with the model sharded over them (rank 0 drives, the others
// run worker_loop). Checked, for the `full` and `snapkv` policies:
//   - identical greedy tokens (64 of them);
//   - every prompt position's logits and every decode step's logits within k_logits_bound
//     of TP=1 (only the order of the partial-sum reduction differs);
//   - the KV selection files of all ranks, concatenated by KV head, equal TP=1's, and
//     replicas of a KV head (tp > KV heads) hold identical selections;
//   - every rank's all_reduce_sum byte counter equals 2 x layers x tokens x hidden x 4, and
//     its all_gather counter (the vocab-parallel LM head) tokens x ceil(vocab / tp) x 4.
// np 3 runs SmolLM2-135M (9 query / 3 KV heads, native q4_1 shards); np 2 and 4 run a tiny
// random checkpoint with 8 query / 2 KV heads (np 4 replicates each KV head on 2 ranks),
// from its GGUF file and from its safetensors directory; its 322-token vocabulary does not
// split evenly over 4 ranks (LM head slices of 81, 81, 81 and 79 rows).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "comm/bootstrap.h"
#include "coordinator/engine/generate.h"
#include "coordinator/engine/prompt.h"
#include "coordinator/scheduler/engine.h"
#include "coordinator/tokenizer/tokenizer.h"
#include "worker/model/weights.h"
#include "worker/worker.h"

namespace snap {
namespace {

// Logits agree to this absolute bound. The shards sum o_proj and down_proj partial
// products in rank order instead of one dot product, so each layer's output differs by a
// few f32 ulps; over 30 layers that grows to ~1e-5 relative on logits of magnitude ~20.
// The measured maxima are printed by each test.
constexpr float k_logits_bound = 2e-3f;
constexpr int64_t k_new_tokens = 64;

comm::Communicator* g_comm = nullptr;

bool leader() { return g_comm->world().rank() == 0; }

struct Output {
  std::vector<int32_t> tokens;
  std::vector<float> prompt_logits;  // [prompt tokens, vocab]
  std::vector<float> step_logits;    // [generated, vocab]
  std::string error;
};

// Hooks that record prompt and step logits of a vocabulary of `vocab`.
GenerateHooks recording(Output& out, int64_t vocab) {
  GenerateHooks h;
  h.on_prompt_logits = [&out, vocab](int64_t, const float* row) {
    out.prompt_logits.insert(out.prompt_logits.end(), row, row + vocab);
  };
  h.on_step_logits = [&out, vocab](const float* row) { out.step_logits.insert(out.step_logits.end(), row, row + vocab); };
  return h;
}

// TP=1 on rank 0 alone: the whole model, no communicator.
Output run_single(const std::string& model_path, const GenerateRequest& req) {
  Output out;
  auto model = load_model(model_path);
  if (!model.ok()) {
    out.error = model.status().message();
    return out;
  }
  LlamaForward forward(*model);
  auto r = generate(forward, req, recording(out, model->config.vocab_size));
  if (!r.ok()) {
    out.error = r.status().message();
    return out;
  }
  out.tokens = r->tokens;
  return out;
}

// TP=N over the group: every rank loads its shard; rank 0 generates, the others serve plans.
// Returns rank 0's output (empty elsewhere) and checks this rank's all-reduce bytes.
Output run_sharded(const std::string& model_path, const GenerateRequest& req) {
  Output out;
  LoadOptions opts;
  opts.tp_rank = g_comm->group_rank();
  opts.tp_size = g_comm->group_size();
  auto model = load_model(model_path, opts);
  // Every rank must reach the same decision before any plan traffic.
  float failed = model.ok() ? 0.0f : 1.0f;
  EXPECT_TRUE(g_comm->all_reduce_sum(std::span<float>(&failed, 1)).ok());
  if (failed > 0) {
    out.error = model.ok() ? "another rank failed to load" : model.status().message();
    return out;
  }
  g_comm->reset_stats();
  LlamaForward forward(*model, g_comm);
  Worker worker(forward);
  if (!leader()) {
    Status st = worker_loop(worker, *g_comm);
    EXPECT_TRUE(st.ok()) << st.message();
  } else {
    StepDriver driver(worker, g_comm);
    auto r = generate(driver, req, recording(out, model->config.vocab_size));
    EXPECT_TRUE(driver.shutdown().ok());
    if (!r.ok()) out.error = r.status().message();
    if (r.ok()) out.tokens = r->tokens;
  }
  // Each rank's counter: 2 all-reduces per layer of [tokens, hidden] f32, nothing else.
  const ModelConfig& c = model->config;
  const int64_t tokens = static_cast<int64_t>(req.prompt_ids.size()) + k_new_tokens - 1;
  const comm::CommStats st = g_comm->stats();
  EXPECT_EQ(st[comm::CommOp::all_reduce_sum].bytes, 2 * c.num_layers * tokens * c.hidden_size * 4)
      << "rank " << g_comm->group_rank();
  EXPECT_EQ(st[comm::CommOp::all_reduce_sum].calls % (2 * c.num_layers), 0);
  // The vocab-parallel LM head: one all_gather of vocab_chunk floats per logits row (every
  // prompt position, as the hooks record them, and each decode step).
  EXPECT_EQ(st[comm::CommOp::all_gather].bytes, tokens * model->shard.vocab_chunk * 4)
      << "rank " << g_comm->group_rank();
  return out;
}

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  float m = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    const float d = std::fabs(a[i] - b[i]);
    if (!(d <= m)) m = std::isnan(d) ? INFINITY : d;
  }
  return m;
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  nlohmann::json j;
  if (in.good()) in >> j;
  return j;
}

// The TP=1 selection file against the N rank files: rank r's heads are global KV heads
// kv_head_begin + g; replicas must agree with each other and with TP=1.
void expect_same_selection(const std::string& single_path, const std::string& sharded_path, int tp) {
  const nlohmann::json single = read_json(single_path);
  ASSERT_TRUE(single.contains("layers"));
  const size_t num_layers = single["layers"].size();
  const size_t num_kv_heads = single["layers"][0]["heads"].size();
  std::vector<std::vector<int>> covered(num_layers, std::vector<int>(num_kv_heads, 0));
  int64_t kept_total = 0;
  for (int r = 0; r < tp; ++r) {
    const nlohmann::json part = read_json(sharded_path + ".rank" + std::to_string(r));
    ASSERT_TRUE(part.contains("layers")) << "rank " << r;
    EXPECT_EQ(part["tp_rank"].get<int>(), r);
    EXPECT_EQ(part["tp_size"].get<int>(), tp);
    const int begin = part["kv_head_begin"].get<int>();
    ASSERT_EQ(part["layers"].size(), num_layers);
    for (size_t l = 0; l < num_layers; ++l) {
      const nlohmann::json& heads = part["layers"][l]["heads"];
      for (size_t g = 0; g < heads.size(); ++g) {
        const size_t global = static_cast<size_t>(begin) + g;
        ASSERT_LT(global, num_kv_heads);
        EXPECT_EQ(heads[g], single["layers"][l]["heads"][global]) << "layer " << l << " kv head " << global << " (rank " << r << ")";
        kept_total += static_cast<int64_t>(heads[g].size());
        ++covered[l][global];
      }
    }
  }
  for (size_t l = 0; l < num_layers; ++l) {
    for (size_t g = 0; g < num_kv_heads; ++g) {
      EXPECT_EQ(covered[l][g], std::max<int>(1, tp / static_cast<int>(num_kv_heads))) << "layer " << l << " head " << g;
    }
  }
  EXPECT_GT(kept_total, 0);
}

struct Case {
  std::string name;
  std::string model;
  std::vector<int32_t> prompt;
  KvPolicy policy;
};

// Runs one case: TP=1 on rank 0, then TP=N, then rank 0 compares.
void run_case(const Case& c, const std::string& work_dir) {
  GenerateRequest req;
  req.prompt_ids = c.prompt;
  req.max_tokens = k_new_tokens;
  req.prefill_chunk = 64;  // several chunks, and a compression point inside the prompt's last one
  req.kv_policy = c.policy;
  const std::string single_sel = work_dir + "/" + c.name + ".single.json";
  const std::string sharded_sel = work_dir + "/" + c.name + ".tp.json";
  Output single;
  if (leader()) {
    GenerateRequest r1 = req;
    r1.kv_selection_dump = single_sel;
    single = run_single(c.model, r1);
  }
  GenerateRequest rn = req;
  rn.kv_selection_dump = sharded_sel;
  const Output sharded = run_sharded(c.model, rn);
  if (!leader()) return;
  ASSERT_TRUE(single.error.empty()) << single.error;
  ASSERT_TRUE(sharded.error.empty()) << sharded.error;
  ASSERT_EQ(single.tokens.size(), static_cast<size_t>(k_new_tokens));
  EXPECT_EQ(sharded.tokens, single.tokens);
  const float prompt_diff = max_abs_diff(sharded.prompt_logits, single.prompt_logits);
  const float step_diff = max_abs_diff(sharded.step_logits, single.step_logits);
  EXPECT_LE(prompt_diff, k_logits_bound);
  EXPECT_LE(step_diff, k_logits_bound);
  std::printf("[ %s tp %d ] max |logit diff| vs TP=1: prompt %.3g, decode %.3g (bound %.0e)\n", c.name.c_str(),
              g_comm->group_size(), prompt_diff, step_diff, k_logits_bound);
  expect_same_selection(single_sel, sharded_sel, g_comm->group_size());
}

KvPolicy snapkv(int64_t budget, int window, int kernel) {
  KvPolicy p;
  p.kind = KvPolicyKind::snapkv;
  p.budget = budget;
  p.window = window;
  p.kernel = kernel;
  return p;
}

std::string work_dir() {
  const std::string dir = std::string(SNAP_BINARY_DIR) + "/tp_test_np" + std::to_string(g_comm->group_size());
  if (leader()) std::filesystem::create_directories(dir);
  EXPECT_TRUE(g_comm->barrier().ok());
  return dir;
}

// --- SmolLM2-135M at TP=3 ------------------------------------------------------------

constexpr const char* k_text =
    "The history of the lighthouse at Alexandria is a story of engineering ambition. Built in the third century "
    "BC on the island of Pharos, it guided sailors into the busy harbour for more than a thousand years. Ancient "
    "writers describe three tiers: a square base, an octagonal middle and a cylindrical top, where a fire burned "
    "at night and a mirror reflected sunlight by day. Earthquakes in the fourteenth century finally brought it "
    "down, and some of its stones were later used to build the fortress of Qaitbay. Divers have since found "
    "blocks and statues in the water nearby. Question: what stood on the site of the lighthouse afterwards? "
    "Answer:";

std::string smollm2_path() {
  if (const char* env = std::getenv("SNAP_MODEL"); env && *env) return env;
  const char* home = std::getenv("HOME");
  return std::string(home ? home : "") + "/.cache/snapserve/SmolLM2-135M-Instruct.Q4_1.gguf";
}

TEST(TensorParallel, SmolLM2MatchesOneProcess) {
  if (g_comm->group_size() != 3) GTEST_SKIP() << "runs at np 3 (9 query heads, 3 KV heads)";
  const std::string model = smollm2_path();
  ASSERT_TRUE(std::filesystem::exists(model)) << model << " (run scripts/setup.sh)";
  auto tok = Tokenizer::load_for_model(model);
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  const std::vector<int32_t> prompt = prompt_ids_for_text(*tok, k_text);
  ASSERT_GT(prompt.size(), 120u);
  const std::string dir = work_dir();
  run_case({"smollm2_full", model, prompt, KvPolicy{}}, dir);
  run_case({"smollm2_snapkv", model, prompt, snapkv(64, 16, 7)}, dir);
}

// The serving engine without metrics (as `batch` runs it) keeps its workers while idle: they
// give up on a rank 0 silent for --collective-timeout (worker_loop bounds its waits), so an
// idle rank 0 sends a report at least once a second. Idle here for 3.5x a 1 s timeout, then a
// request, then a shutdown: every worker's loop must end cleanly.
TEST(TensorParallel, IdleEngineWithoutMetricsKeepsItsWorkers) {
  if (g_comm->group_size() != 3) GTEST_SKIP() << "runs at np 3 (SmolLM2)";
  const std::string model = smollm2_path();
  ASSERT_TRUE(std::filesystem::exists(model)) << model << " (run scripts/setup.sh)";
  g_comm->set_collective_timeout(std::chrono::milliseconds(1000));  // armed by agree_on_load
  if (leader()) {
    EngineConfig c;
    c.comm = g_comm;
    c.model_path = model;
    c.threads = 1;
    c.kv_cache_bytes = 32LL << 20;
    c.max_num_seqs = 1;
    c.prefill_chunk = 64;
    auto engine = Engine::create(c, nullptr);
    ASSERT_TRUE(engine.ok()) << engine.status().message();
    std::this_thread::sleep_for(std::chrono::milliseconds(3500));
    EXPECT_TRUE((*engine)->healthy());
    EngineRequest r;
    r.prompt_ids = {1, 504, 3493, 282, 1646};
    r.max_tokens = 4;
    r.ignore_eos = true;
    std::mutex mu;
    std::condition_variable cv;
    std::string finish;
    auto id = (*engine)->submit(std::move(r), [&](const EngineEvent& ev) {
      if (ev.kind != EngineEvent::Kind::finished) return;
      std::lock_guard<std::mutex> lock(mu);
      finish = ev.finish_reason + (ev.error.ok() ? "" : ": " + ev.error.message());
      cv.notify_all();
    });
    ASSERT_TRUE(id.ok()) << id.status().message();
    {
      std::unique_lock<std::mutex> lock(mu);
      EXPECT_TRUE(cv.wait_for(lock, std::chrono::seconds(120), [&] { return !finish.empty(); }));
      EXPECT_EQ(finish, "length");
    }
    (*engine)->shutdown(10);
  } else {
    LoadOptions opts;
    opts.tp_rank = g_comm->group_rank();
    opts.tp_size = g_comm->group_size();
    auto loaded = load_model(model, opts);
    const Status agreed = agree_on_load(g_comm, loaded.ok() ? Status() : loaded.status());
    ASSERT_TRUE(agreed.ok()) << agreed.message();
    LlamaForward forward(*loaded, g_comm);
    Worker worker(forward);
    const Status st = worker_loop(worker, *g_comm);
    EXPECT_TRUE(st.ok()) << "rank " << g_comm->group_rank() << ": " << st.message();
    if (!st.ok()) std::fprintf(stderr, "rank %d: %s\n", g_comm->group_rank(), st.message().c_str());
  }
  // The later tests run with no limits, as before.
  g_comm->set_collective_timeout(std::chrono::milliseconds(0));
  g_comm->arm_collective_timeout();
  g_comm->bound_broadcasts(comm::Communicator::BroadcastBound::none);
}

// --- tiny random checkpoint, 8 query / 2 KV heads, at TP=2 and TP=4 -------------------

std::string tiny_checkpoint() {
  const std::string dir = std::string(SNAP_BINARY_DIR) + "/tp_tiny_np" + std::to_string(g_comm->group_size());
  if (leader()) {
    std::filesystem::remove_all(dir);
    const std::string cmd = SNAP_PYTHON " " SNAP_SOURCE_DIR "/tools/make_tiny_checkpoint.py --out '" + dir +
                            "' --layers 3 --hidden 128 --heads 8 --kv-heads 2 --intermediate 256 --vocab 322 "
                            "--scale 0.12 --seed 4 > /dev/null";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  }
  EXPECT_TRUE(g_comm->barrier().ok());
  return dir;
}

std::vector<int32_t> random_prompt(int n, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int32_t& id : ids) id = static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab));
  return ids;
}

TEST(TensorParallel, TinyGqaMatchesOneProcess) {
  const int tp = g_comm->group_size();
  if (tp != 2 && tp != 4) GTEST_SKIP() << "runs at np 2 and 4 (8 query heads, 2 KV heads)";
  const std::string ckpt = tiny_checkpoint();
  const std::string dir = work_dir();
  const std::vector<int32_t> prompt = random_prompt(150, 320, 11);
  for (const std::string form : {"gguf", "hf"}) {
    const std::string path = form == "gguf" ? ckpt + "/model.gguf" : ckpt + "/hf";
    run_case({"tiny_" + form + "_full", path, prompt, KvPolicy{}}, dir);
    run_case({"tiny_" + form + "_snapkv", path, prompt, snapkv(40, 8, 5)}, dir);
  }
}

// A TP size that does not fit the model is refused on every rank with a clear message.
TEST(TensorParallel, IndivisibleHeadsAreRefused) {
  ModelConfig c;
  c.num_heads = 9;
  c.num_kv_heads = 3;
  c.intermediate_size = 1536;
  auto s = make_tp_shard(c, 0, 2);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("--tp 2 does not divide the model's 9 query heads"), std::string::npos)
      << s.status().message();
  c.num_heads = 12;
  c.num_kv_heads = 4;
  auto s6 = make_tp_shard(c, 0, 6);
  ASSERT_FALSE(s6.ok());
  EXPECT_NE(s6.status().message().find("4 KV heads must divide one another"), std::string::npos);
  auto s8 = make_tp_shard(c, 7, 8);
  ASSERT_FALSE(s8.ok());  // 12 heads % 8
  c.num_heads = 16;
  auto r = make_tp_shard(c, 5, 8);  // 4 KV heads on 8 ranks: each on 2
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->kv_replicas, 2);
  EXPECT_EQ(r->kv_head_begin, 2);
  EXPECT_EQ(r->num_heads, 2);
  EXPECT_EQ(r->head_begin, 10);
  EXPECT_EQ(r->q_load_begin, 8);  // the group of KV head 2: query heads 8..11
  EXPECT_EQ(r->q_load_heads, 4);
}

}  // namespace
}  // namespace snap

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  using namespace snap;
  auto world = comm::world_from_environment();
  if (!world.ok()) {
    std::fprintf(stderr, "%s\n", world.status().message().c_str());
    return 1;
  }
  auto comm = comm::make_communicator(world->size() > 1 ? comm::CommKind::mpi : comm::CommKind::single, *world);
  if (!comm.ok()) {
    std::fprintf(stderr, "%s\n", comm.status().message().c_str());
    return 1;
  }
  g_comm = comm->get();
  if (world->rank() != 0) {  // one rank prints the gtest report
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  return RUN_ALL_TESTS();
}
