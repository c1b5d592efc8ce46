// Tensor parallelism on the device: TP = P ranks (threads on one GPU, each with its shard,
// its own stream and KV pool) against TP = 1 on the same GPU. The ranks meet through an
// in-process host communicator (ThreadComm below: the rank-order sum of comm/communicator.h),
// so this is the host-staged path of DeviceExchange — the one several ranks on one GPU take
// (NCCL refuses that) — with every device-side piece of the TP forward in play: sharded
// weights, the row-parallel reduce after o_proj and down_proj, the vocab-parallel LM head and
// its gather (vocabularies that do not divide by P included), per-rank KV pools, SnapKV per
// rank, and the generators' lockstep protocol (rank 0's request header and token ids).
// Checked:
//   prompt logits (DeviceForward, every position): TP = P's top 5 within 0.1 of TP = 1's —
//     the two differ by the order of the row-parallel sums (f32) and, through them, by which
//     way some bf16 roundings of the GEMM inputs fall (2^-9 relative), the mechanism and
//     bound of the device-vs-CPU test;
//   greedy tokens (DeviceGenerator, full and snapkv): equal at every step whose TP = 1 top-2
//     margin is >= 0.1 (a documented near-tie may part them, and the check ends there);
//   snapkv selections: each rank's dump (path.rank<r>, KV heads from kv_head_begin) equals
//     TP = 1's for those heads, except near-ties at the cut-off (at most 2% of the kept entries);
//   replicated KV heads (tp > KV heads): every replica scores with the whole GQA group and
//     selects what one rank selects.
// Exits 77 without a usable GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <barrier>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "comm/communicator.h"
#include "coordinator/engine/device_spec.h"
#include "tests/cuda/tiny_gemma3.h"
#include "worker/device/device_exchange.h"
#include "worker/device/device_forward.h"
#include "worker/device/device_kv_pool.h"
#include "worker/device/device_weights.h"
#include "worker/model/weights.h"

namespace snap {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr double k_logit_tol = 0.1;
constexpr double k_margin = 0.1;
constexpr double k_selection_mismatch = 0.02;

// --- an in-process group of P ranks (threads) ------------------------------------------------
class ThreadGroup {
 public:
  explicit ThreadGroup(int p) : p_(p), sync_(p), ptrs_(static_cast<size_t>(p)) {}
  int size() const { return p_; }
  // Every rank publishes a pointer; once all have, each runs `read` over them; nobody goes on
  // (and writes its buffer) before every rank has read.
  void exchange(int rank, const void* mine, const std::function<void(const std::vector<const void*>&)>& read) {
    ptrs_[rank] = mine;
    sync_.arrive_and_wait();
    read(ptrs_);
    sync_.arrive_and_wait();
  }

 private:
  int p_;
  std::barrier<> sync_;
  std::vector<const void*> ptrs_;
};

class ThreadComm final : public comm::Communicator {
 public:
  ThreadComm(ThreadGroup& g, int rank) : Communicator(comm::World::make(rank, g.size()).value()), g_(g) {}
  const char* backend_name() const override { return "threads"; }
  [[noreturn]] void abort_job(const std::string& message, int) override {
    std::fprintf(stderr, "rank %d: %s\n", group_rank(), message.c_str());
    std::abort();
  }

 protected:
  Status do_all_reduce_sum(void* buf, int64_t count, DType dtype) override {
    const int p = g_.size();
    const size_t bytes = static_cast<size_t>(count) * dtype_size(dtype);
    std::vector<uint8_t> blocks(bytes * p);
    g_.exchange(group_rank(), buf, [&](const std::vector<const void*>& ptrs) {
      for (int r = 0; r < p; ++r) std::memcpy(blocks.data() + r * bytes, ptrs[r], bytes);
    });
    comm::sum_blocks_in_rank_order(blocks.data(), p, count, count, dtype, buf);
    return {};
  }
  Status do_all_gather(const void* send, void* recv, int64_t count, DType dtype) override {
    const size_t bytes = static_cast<size_t>(count) * dtype_size(dtype);
    g_.exchange(group_rank(), send, [&](const std::vector<const void*>& ptrs) {
      for (int r = 0; r < g_.size(); ++r) std::memcpy(static_cast<uint8_t*>(recv) + r * bytes, ptrs[r], bytes);
    });
    return {};
  }
  Status do_broadcast(void* buf, int64_t count, DType dtype, int root) override {
    return do_broadcast_bytes(buf, count * dtype_size(dtype), root);
  }
  Status do_broadcast_bytes(void* buf, int64_t num_bytes, int root) override {
    g_.exchange(group_rank(), buf, [&](const std::vector<const void*>& ptrs) {
      if (group_rank() != root) std::memcpy(buf, ptrs[root], static_cast<size_t>(num_bytes));
    });
    return {};
  }
  Status do_barrier() override {
    g_.exchange(group_rank(), nullptr, [](const std::vector<const void*>&) {});
    return {};
  }

 private:
  ThreadGroup& g_;
};

// --- models ----------------------------------------------------------------------------------
int sh(const std::string& cmd) {
  const int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128 + WTERMSIG(rc);
}

struct Model {
  const char* name;
  const char* args;  // tools/<tool>
  int tp;
  const char* tool = "make_random_model.py";
  const char* subpath = "";  // the model inside --out
  const char* carried = "";  // make_tiny_checkpoint.py: scripts/device_deps.sh's copy, .device-deps/<carried>
};

class DeviceTpTest : public ::testing::TestWithParam<Model> {
 protected:
  void SetUp() override {
    const Model m = GetParam();
    dir_ = fs::temp_directory_path() / ("snap_devtp_" + std::string(m.name) + "_" + std::to_string(getpid()));
    fs::create_directories(dir_);
    const std::string cmd = std::string(SNAP_PYTHON) + " " SNAP_SOURCE_DIR "/tools/" + m.tool + " " + m.args +
                            " --out " + (dir_ / "m").string() + " >/dev/null 2>&1";
    fs::path path = dir_ / "m" / m.subpath;
    if (sh(cmd) != 0) {  // the device machine has no gguf package: scripts/device_deps.sh's copy
      ASSERT_NE(*m.carried, '\0') << cmd;
      path = fs::path(SNAP_SOURCE_DIR) / ".device-deps" / m.carried / m.subpath;
      if (!fs::exists(path)) GTEST_SKIP() << "no gguf package and no " << path << " (run scripts/device_deps.sh): " << cmd;
    }
    for (int r = 0; r <= m.tp; ++r) {  // [0]: the whole model (tp 1); [1 + r]: rank r's shard
      LoadOptions opts;
      opts.keep_quantized = false;
      opts.weight_dtype = DType::bf16;
      if (r > 0) {
        opts.tp_rank = r - 1;
        opts.tp_size = m.tp;
      }
      auto model = load_model(path.string(), opts);
      ASSERT_TRUE(model.ok()) << model.status().to_string();
      models_.push_back(std::make_unique<LoadedModel>(std::move(model).value()));
    }
    spec_.kind = DeviceKind::cuda;
    ASSERT_TRUE(check_device(spec_).ok());
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  const LoadedModel& whole() const { return *models_[0]; }
  const LoadedModel& shard(int r) const { return *models_[1 + r]; }
  int tp() const { return GetParam().tp; }

  std::vector<int32_t> prompt(int64_t n) const {
    std::vector<int32_t> ids;
    for (int64_t i = 0; i < n; ++i) ids.push_back(static_cast<int32_t>((i * 7919 + 13) % whole().config.vocab_size));
    return ids;
  }

  // Every prompt position's logits from DeviceForward on `model` (rank `rank` of `group`, or
  // alone), prefilled in chunks of 48; empty off rank 0.
  static Status prompt_logits(const LoadedModel& model, ThreadComm* group, const std::vector<int32_t>& ids,
                              std::vector<float>* out) {
    cudaSetDevice(0);
    SNAP_ASSIGN_OR_RETURN(std::unique_ptr<DeviceWeights> w, DeviceWeights::upload(model));
    cudaStream_t stream = nullptr;
    if (cudaStreamCreate(&stream) != cudaSuccess) return internal_error("cudaStreamCreate");
    Status st;
    {
      const ModelConfig& c = model.config;
      const DeviceKvShape shape{c.num_layers, model.shard.num_kv_heads, c.head_dim, 16};
      auto pool = DeviceKvPool::create(shape, int64_t{64} << 20, stream);
      if (!pool.ok()) return pool.status();
      std::unique_ptr<DeviceExchange> ex;
      if (group != nullptr) ex = std::make_unique<DeviceExchange>(*group, stream);
      DeviceForward fwd(c, *w, **pool, ex.get());
      const int32_t seq = (*pool)->add_sequence();
      const int64_t n = static_cast<int64_t>(ids.size()), vocab = c.vocab_size;
      out->assign(static_cast<size_t>(n * vocab), 0.0f);
      for (int64_t s = 0; s < n && st.ok(); s += 48) {
        const int64_t len = std::min<int64_t>(48, n - s);
        st = fwd.forward(seq, ids.data() + s, len, out->data() + s * vocab, true, nullptr);
      }
      if (!fwd.is_logits_rank()) out->clear();
    }
    cudaStreamDestroy(stream);
    return st;
  }

  // The request on TP = P generators (rank 0 generate(), the others follow()), threads.
  Result<GenerateResult> generate_tp(const GenerateRequest& req) {
    ThreadGroup g(tp());
    std::vector<std::unique_ptr<ThreadComm>> comms;
    for (int r = 0; r < tp(); ++r) comms.push_back(std::make_unique<ThreadComm>(g, r));
    std::vector<Status> statuses(static_cast<size_t>(tp()));
    Result<GenerateResult> lead = internal_error("not run");
    std::vector<std::thread> threads;
    for (int r = 0; r < tp(); ++r) {
      threads.emplace_back([&, r] {
        cudaSetDevice(0);
        auto gen = open_device_generator(spec_, shard(r), comms[r].get(), comms[r].get());
        if (!gen.ok()) {  // every rank fails alike here (same model, same device)
          statuses[r] = gen.status();
          return;
        }
        if (r == 0) {
          lead = (*gen)->generate(req, {});
          statuses[r] = (*gen)->shutdown();
        } else {
          statuses[r] = (*gen)->follow();
        }
      });
    }
    for (auto& t : threads) t.join();
    for (int r = 0; r < tp(); ++r)
      if (!statuses[r].ok()) return Status(statuses[r].code(), "rank " + std::to_string(r) + ": " + statuses[r].message());
    return lead;
  }

  fs::path dir_;
  DeviceSpec spec_;
  std::vector<std::unique_ptr<LoadedModel>> models_;
};

TEST_P(DeviceTpTest, PromptLogitsMatchOneRank) {
  const std::vector<int32_t> ids = prompt(150);
  std::vector<float> one;
  ASSERT_TRUE(prompt_logits(whole(), nullptr, ids, &one).ok());
  ThreadGroup g(tp());
  std::vector<std::unique_ptr<ThreadComm>> comms;
  for (int r = 0; r < tp(); ++r) comms.push_back(std::make_unique<ThreadComm>(g, r));
  std::vector<std::vector<float>> outs(static_cast<size_t>(tp()));
  std::vector<Status> statuses(static_cast<size_t>(tp()));
  std::vector<std::thread> threads;
  for (int r = 0; r < tp(); ++r)
    threads.emplace_back([&, r] { statuses[r] = prompt_logits(shard(r), comms[r].get(), ids, &outs[r]); });
  for (auto& t : threads) t.join();
  for (int r = 0; r < tp(); ++r) ASSERT_TRUE(statuses[r].ok()) << "rank " << r << ": " << statuses[r].to_string();
  for (int r = 1; r < tp(); ++r) EXPECT_TRUE(outs[r].empty()) << "rank " << r << " received logits";
  const std::vector<float>& many = outs[0];
  ASSERT_EQ(many.size(), one.size());
  const int64_t vocab = whole().config.vocab_size;
  double worst = 0;
  for (size_t p = 0; p < ids.size(); ++p) {
    const float* a = one.data() + p * vocab;
    const float* b = many.data() + p * vocab;
    std::vector<int> idx(static_cast<size_t>(vocab));
    for (int64_t i = 0; i < vocab; ++i) idx[i] = static_cast<int>(i);
    std::partial_sort(idx.begin(), idx.begin() + 5, idx.end(), [&](int x, int y) { return a[x] > a[y]; });
    for (int k = 0; k < 5; ++k) {
      const double d = std::abs(a[idx[k]] - b[idx[k]]);
      ASSERT_FALSE(std::isnan(b[idx[k]])) << "position " << p << " id " << idx[k];
      worst = std::max(worst, d);
      EXPECT_LE(d, k_logit_tol) << "position " << p << " id " << idx[k];
    }
    // The last rank's vocabulary slice (shorter when P does not divide the vocabulary) too.
    EXPECT_LE(std::abs(a[vocab - 1] - b[vocab - 1]), 4 * k_logit_tol) << "position " << p << ", the last id";
  }
  std::printf("[ info ] %s tp %d: worst top-5 prompt logit difference vs tp 1 %.4f\n", GetParam().name, tp(), worst);
}

// Greedy tokens of the generators at TP = P vs TP = 1, full and snapkv; snapkv's selections.
TEST_P(DeviceTpTest, GeneratorsMatchOneRank) {
  auto one_gen = open_device_generator(spec_, whole());
  ASSERT_TRUE(one_gen.ok()) << one_gen.status().to_string();
  for (const KvPolicyKind kind : {KvPolicyKind::full, KvPolicyKind::snapkv}) {
    SCOPED_TRACE(kv_policy_name(kind));
    GenerateRequest req;
    req.prompt_ids = prompt(200);
    req.max_tokens = 12;
    req.prefill_chunk = 64;
    req.kv_dtype = DType::bf16;
    req.kv_policy.kind = kind;
    req.kv_policy.budget = 64;
    req.kv_policy.window = 16;
    req.kv_policy.kernel = 5;
    const std::string tag = kv_policy_name(kind);
    const fs::path one_dump = dir_ / (tag + ".tp1.json"), tp_dump = dir_ / (tag + ".tp.json");
    GenerateRequest one_req = req;
    one_req.kv_selection_dump = one_dump.string();
    std::vector<std::vector<float>> margins_src;
    GenerateHooks hooks;
    const int64_t vocab = whole().config.vocab_size;
    hooks.on_step_logits = [&](const float* row) { margins_src.emplace_back(row, row + vocab); };
    auto one = (*one_gen)->generate(one_req, hooks);
    ASSERT_TRUE(one.ok()) << one.status().to_string();
    req.kv_selection_dump = tp_dump.string();
    auto many = generate_tp(req);
    ASSERT_TRUE(many.ok()) << many.status().to_string();
    // Tokens: equal up to the first near-tie.
    int compared = 0;
    const size_t steps = std::min(one->tokens.size(), many->tokens.size());
    for (size_t s = 0; s < steps; ++s) {
      std::vector<float> row = margins_src[s];
      std::partial_sort(row.begin(), row.begin() + 2, row.end(), std::greater<float>());
      if (one->tokens[s] != many->tokens[s]) {
        EXPECT_LT(row[0] - row[1], k_margin) << "step " << s << ": tp 1 " << one->tokens[s] << ", tp " << tp() << " "
                                             << many->tokens[s];
        break;
      }
      ++compared;
    }
    std::printf("[ info ] %s tp %d %s: %d of %zu greedy tokens equal\n", GetParam().name, tp(), tag.c_str(), compared,
                one->tokens.size());
    EXPECT_GE(compared, 1);
    // KV per rank: each holds its KV heads (replicas hold the same head).
    EXPECT_EQ(many->stats.kv_full_equivalent_bytes * whole().config.num_kv_heads,
              one->stats.kv_full_equivalent_bytes * shard(0).shard.num_kv_heads);
    if (kind == KvPolicyKind::full) continue;
    // Selections: the ranks' dumps together are TP = 1's.
    std::ifstream f1(one_dump);
    const json j1 = json::parse(f1);
    int64_t total = 0, differ = 0;
    for (int r = 0; r < tp(); ++r) {
      std::ifstream fr(tp_dump.string() + ".rank" + std::to_string(r));
      ASSERT_TRUE(fr.good()) << "rank " << r << " wrote no selection dump";
      const json jr = json::parse(fr);
      EXPECT_EQ(jr["tp_rank"], r);
      EXPECT_EQ(jr["tp_size"], tp());
      const int begin = jr["kv_head_begin"];
      for (size_t l = 0; l < j1["layers"].size(); ++l) {
        const auto& heads = jr["layers"][l]["heads"];
        for (size_t g = 0; g < heads.size(); ++g) {
          const auto a = j1["layers"][l]["heads"][begin + g].get<std::vector<int32_t>>();
          const auto b = heads[g].get<std::vector<int32_t>>();
          EXPECT_EQ(a.size(), b.size()) << "layer " << l << " head " << begin + g;
          std::vector<int32_t> common;
          std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(common));
          total += static_cast<int64_t>(a.size());
          differ += static_cast<int64_t>(a.size() - common.size());
        }
      }
    }
    std::printf("[ info ] %s tp %d snapkv: %lld of %lld kept entries differ from tp 1\n", GetParam().name, tp(),
                static_cast<long long>(differ), static_cast<long long>(total));
    ASSERT_GT(total, 0);
    EXPECT_LE(differ, k_selection_mismatch * total);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Models, DeviceTpTest,
    ::testing::Values(
        // 1001 ids over 2 ranks: slices of 501 and 500 (the padded gather).
        Model{"llama3_tp2", "--shape tiny-llama3 --dtype bf16 --seed 3 --vocab 1001", 2},
        Model{"mistral_window_tp2", "--shape tiny-mistral --dtype f32 --seed 5", 2},
        // 4 ranks, one KV head each; 1003 ids: 251, 251, 251, 250.
        Model{"llama3_tp4", "--shape tiny-llama3 --dtype bf16 --seed 7 --heads 8 --kv-heads 4 --head-dim 32 --vocab 1003", 4},
        // Replicated KV heads: 4 ranks over 2 KV heads (each on 2 ranks, 2 of its 4 query heads
        // per rank, the whole group scoring), and qwen2's one KV head on both ranks (biases,
        // tied f16 embeddings).
        Model{"llama3_tp4_replicated", "--shape tiny-llama3 --dtype bf16 --seed 9 --heads 8 --kv-heads 2 --head-dim 32 --vocab 1001", 4},
        Model{"qwen2_replicated_tp2", "--shape tiny-qwen2 --dtype f16 --seed 4", 2},
        // Gemma 3 (tiny_gemma3.h): 4 ranks over 2 KV heads, so replicated, with the q/k norms,
        // local/global layers, post-norms after the row-parallel sums, GeGLU; 288 ids: 72 each.
        Model{"gemma3_tp4_replicated", test::k_tiny_gemma3_args, 4, "make_tiny_checkpoint.py", "model.gguf",
              test::k_tiny_gemma3_carried}),
    [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace snap

int main(int argc, char** argv) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    std::printf("no CUDA device (%s): skipped\n", e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    return 77;
  }
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
