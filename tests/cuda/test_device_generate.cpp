// `generate --device cuda` against `generate --device cpu`: the same request through
// generate() over LlamaForward (the reference) and through the DeviceGenerator
// (coordinator/engine/device_spec.h) on the same loaded model. Models: random Llama-family
// checkpoints (tools/make_random_model.py: llama3 rope + GQA bf16, mistral sliding window f32,
// qwen2 bias + tied f16) and two tiny GGUF checkpoints of tools/make_tiny_checkpoint.py: a llama
// one and a Gemma 3 one (4 layers, local and global alternating, window 48: q/k norms, post-norms,
// GeGLU, the embedding scale, two RoPE bases; its local layers keep their window under every
// policy). They need the PyPI gguf package; on the device machine the copies
// scripts/device_deps.sh wrote into .device-deps/<carried> are used, else the case is skipped,
// saying so. Weights are
// loaded as bf16 on both sides, so the two differ only by activations (bf16 inputs to the
// prefill GEMMs on the device: 2^-9 relative) and summation order. Checked:
//   prompt logits: at every position the CPU's top 5 within 0.1 + 2^-9·(the row's largest
//     |logit|) on the device (bf16 GEMM inputs: the error grows with the logits' scale, which
//     reaches ~100 on the tied-f16 model; a flat 0.1 failed there on the host twin);
//   greedy tokens: equal at every step whose CPU top-2 margin is >= 0.1; at a closer step the
//     two may part, and the check ends there (a documented near-tie);
//   selections (snapkv, pyramidkv, adakv, h2o, streaming; snapkv, adakv and h2o over a
//     context too): the kept positions of
//     every layer and KV head (the --dump-kv-selection files) equal the CPU's (CPU KV in bf16
//     too), except near-ties at the cut-off: at most 2% of the kept entries (streaming: none);
//   layer-wise prefill (snapkv, adakv, h2o, streaming): the same against the CPU's layer-wise
//     prefill, and the device pool's peak below its own chunked prefill of the same request.
// Block-format weights: llama3_q8_0 (--weight-dtype q8_0: Q8_0 quantized at load; its down_proj,
// 328 columns, not whole blocks, stays bf16: mixed formats in one layer), tiny_gguf_q4_1 and
// gemma3_q4_0 (a GGUF's own Q4_1 / Q4_0 blocks, kept with --weight-dtype auto; the Gemma table
// is tied: the embedding gather and the LM head in Q4_0), tiny_q4_k_m (a GGUF mixing Q4_K, Q6_K
// and Q5_0 as llama.cpp's Q4_K_M does, with a tied Q4_K table), tiny_q5_k_m (the same with
// Q5_K for Q4_K) and tiny_q2_k (Q2_K with Q3_K for attn_v and Q5_0, a tied Q2_K table): the CPU's kernels read none of those formats, so its side holds them
// dequantized to f32 by the loader, the same values. The
// same checks with both sides holding the same weights (the CPU's matvec with f32 activations,
// so that each weight is the same f32 value on both): the device's decode GEMVs read those values, its prefill GEMMs the
// values rounded to bf16, so the prompt-logit bound doubles its relative part (2 · 2^-9: bf16
// weights and activations).
// On the kernel emulator, the models that repeat another's attention with other weight formats
// run the full-cache and bad-request tests only (Model::repeats).
// Exits 77 without a usable GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "coordinator/engine/device_spec.h"
#include "coordinator/engine/generate.h"
#include "kernels/matvec_act.h"
#include "tests/cuda/tiny_gemma3.h"
#include "worker/model/llama.h"
#include "worker/model/weights.h"

namespace snap {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr double k_logit_tol = 0.1;
constexpr double k_logit_rel = 1.0 / 512;  // bf16's unit roundoff: the error scales with |logit|
constexpr double k_margin = 0.1;
constexpr double k_selection_mismatch = 0.02;

int sh(const std::string& cmd) {
  const int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128 + WTERMSIG(rc);
}

struct Model {
  const char* name;
  const char* tool;  // tools/<tool>
  const char* args;
  const char* subpath;  // model path inside --out
  const char* carried = "";  // make_tiny_checkpoint.py: scripts/device_deps.sh's copy, .device-deps/<carried>
  DType weights = DType::bf16;  // LoadOptions::weight_dtype, both sides: bf16 or q8_0
  bool native = false;          // LoadOptions::keep_quantized: the GGUF's own blocks (--weight-dtype auto)
  const char* held = "bf16";    // what the device's memory report says the weights are
  // The model whose attention (shape, rope, window, norms) this one repeats with other weight
  // formats, or null. On the kernel emulator such a model runs only the full-cache and bad-request
  // tests: the weights' kernels are the same under every policy, and the policies' and layer-wise
  // prefill's kernels see the same attention as in that model's runs (its own ran 76 s of the
  // emulator's 155). The host twin and a GPU run every test on every model.
  const char* repeats = nullptr;
  bool blocks() const { return native || weights == DType::q8_0; }
};

struct Outcome {
  GenerateResult result;
  std::vector<std::vector<float>> prompt_logits;  // [position][vocab]
  std::vector<std::vector<float>> step_logits;    // [step][vocab]
};

// Each model's checkpoint is written once per process (the python tool took ~0.5 s of CPU a
// run, once per test: most of this test's CPU on the host twin), into a directory removed at exit.
const fs::path& models_dir() {
  // Never freed: the exit handler reads it after static objects are destroyed.
  static const fs::path* const dir = [] {
    const auto* d = new fs::path(fs::temp_directory_path() / ("snap_devgen_models_" + std::to_string(getpid())));
    fs::create_directories(*d);
    std::atexit([] {
      std::error_code ec;
      fs::remove_all(models_dir(), ec);
    });
    return d;
  }();
  return *dir;
}

// m's checkpoint directory, or "" when the tool failed (*cmd: the tool's command line). Models
// written by the same tool and arguments share the checkpoint (tests only read it).
fs::path written_model(const Model& m, std::string* cmd) {
  // tool + arguments -> (checkpoint directory, whether the tool succeeded)
  static std::map<std::string, std::pair<fs::path, bool>> written;
  const std::string key = std::string(m.tool) + " " + m.args;
  auto it = written.find(key);
  const fs::path out = it != written.end() ? it->second.first : models_dir() / std::to_string(written.size());
  *cmd = std::string(SNAP_PYTHON) + " " SNAP_SOURCE_DIR "/tools/" + key + " --out " + out.string() + " >/dev/null 2>&1";
  if (it == written.end()) it = written.emplace(key, std::make_pair(out, sh(*cmd) == 0)).first;
  return it->second.second ? out : fs::path();
}

class DeviceGenerateTest : public ::testing::TestWithParam<Model> {
 protected:
  void SetUp() override {
    const Model m = GetParam();
    dir_ = fs::temp_directory_path() / ("snap_devgen_" + std::string(m.name) + "_" + std::to_string(getpid()));
    fs::create_directories(dir_);
    std::string cmd;
    const fs::path written = written_model(m, &cmd);
    fs::path path = written / m.subpath;
    if (written.empty()) {
      // The device machine has no gguf package: scripts/device_deps.sh wrote the same
      // checkpoint (same arguments) into .device-deps/<carried>, carried there.
      const fs::path carried = fs::path(SNAP_SOURCE_DIR) / ".device-deps" / m.carried / m.subpath;
      if (std::string(m.tool) != "make_tiny_checkpoint.py") FAIL() << cmd;
      if (!fs::exists(carried)) GTEST_SKIP() << "no gguf package and no " << carried << " (run scripts/device_deps.sh): " << cmd;
      path = carried;
    }
    LoadOptions opts;
    opts.keep_quantized = m.native;
    opts.matvec_tiles = false;      // the device reads row-major blocks
    opts.weight_dtype = m.weights;  // the device's weights, on both sides
    if (m.blocks()) kernels::matvec_act_set(kernels::MatvecAct::f32);  // the blocks' own values on the CPU
    auto model = load_model(path.string(), opts);
    ASSERT_TRUE(model.ok()) << model.status().to_string();
    model_ = std::make_unique<LoadedModel>(std::move(model).value());
    cpu_ = std::make_unique<LlamaForward>(*model_, nullptr);
    DeviceSpec spec;
    spec.kind = DeviceKind::cuda;
    ASSERT_TRUE(check_device(spec).ok());
    auto dev = open_device_generator(spec, *model_);
    ASSERT_TRUE(dev.ok()) << dev.status().to_string();
    dev_ = std::move(dev).value();
  }
  void TearDown() override {
    dev_.reset();
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  GenerateRequest request(int64_t n, int64_t max_tokens) const {
    GenerateRequest req;
    const int64_t vocab = model_->config.vocab_size;
    for (int64_t i = 0; i < n; ++i) req.prompt_ids.push_back(static_cast<int32_t>((i * 7919 + 13) % vocab));
    req.max_tokens = max_tokens;
    req.prefill_chunk = 64;  // several chunks
    req.kv_dtype = DType::bf16;
    return req;
  }

  // Both sides on req; logits of every prompt position and of every step when asked.
  void both(const GenerateRequest& req, bool logits, Outcome& cpu, Outcome& dev) {
    const int64_t vocab = model_->config.vocab_size;
    for (int side = 0; side < 2; ++side) {
      Outcome& r = side == 0 ? cpu : dev;
      GenerateHooks hooks;
      if (logits) hooks.on_prompt_logits = [&](int64_t, const float* row) { r.prompt_logits.emplace_back(row, row + vocab); };
      hooks.on_step_logits = [&](const float* row) { r.step_logits.emplace_back(row, row + vocab); };
      auto res = side == 0 ? generate(*cpu_, req, hooks) : dev_->generate(req, hooks);
      ASSERT_TRUE(res.ok()) << (side == 0 ? "cpu: " : "device: ") << res.status().to_string();
      r.result = std::move(res).value();
    }
  }

  // Greedy tokens equal up to the first near-tie where they part; returns the steps compared.
  int compare_tokens(const Outcome& cpu, const Outcome& dev) {
    int compared = 0;
    const size_t steps = std::min(cpu.result.tokens.size(), dev.result.tokens.size());
    for (size_t s = 0; s < steps; ++s) {
      std::vector<float> row = cpu.step_logits[s];
      std::partial_sort(row.begin(), row.begin() + 2, row.end(), std::greater<float>());
      const bool near_tie = row[0] - row[1] < k_margin;
      if (cpu.result.tokens[s] != dev.result.tokens[s]) {
        EXPECT_TRUE(near_tie) << "step " << s << ": cpu " << cpu.result.tokens[s] << ", device " << dev.result.tokens[s]
                              << ", cpu margin " << row[0] - row[1];
        return compared;
      }
      ++compared;
    }
    if (compared == static_cast<int>(steps)) {
      EXPECT_EQ(cpu.result.tokens.size(), dev.result.tokens.size());
    }
    return compared;
  }

  // Kept entries that differ between the CPU's and the device's selection dumps, over all.
  // AdaKV shares a layer's slots between its heads: a near-tie between two heads' scores moves
  // a slot from one to the other, so there only the layer's total must match exactly and a
  // moved slot counts as a differing entry.
  std::pair<int64_t, int64_t> compare_selection(const fs::path& a, const fs::path& b, bool heads_share = false) {
    std::ifstream fa(a), fb(b);
    const json ja = json::parse(fa), jb = json::parse(fb);
    int64_t total = 0, differ = 0;
    EXPECT_EQ(ja["layers"].size(), jb["layers"].size());
    for (size_t l = 0; l < std::min(ja["layers"].size(), jb["layers"].size()); ++l) {
      const auto& ha = ja["layers"][l]["heads"];
      const auto& hb = jb["layers"][l]["heads"];
      EXPECT_EQ(ha.size(), hb.size()) << "layer " << l;
      size_t layer_a = 0, layer_b = 0;
      for (size_t g = 0; g < std::min(ha.size(), hb.size()); ++g) {
        const auto pa = ha[g].get<std::vector<int32_t>>(), pb = hb[g].get<std::vector<int32_t>>();
        if (!heads_share) {
          EXPECT_EQ(pa.size(), pb.size()) << "layer " << l << " head " << g;
        }
        layer_a += pa.size();
        layer_b += pb.size();
        std::vector<int32_t> common;
        std::set_intersection(pa.begin(), pa.end(), pb.begin(), pb.end(), std::back_inserter(common));
        total += static_cast<int64_t>(pa.size());
        differ += static_cast<int64_t>(std::max(pa.size(), pb.size()) - common.size());
      }
      EXPECT_EQ(layer_a, layer_b) << "layer " << l << ": kept entries over its heads";
    }
    return {differ, total};
  }

  fs::path dir_;
  std::unique_ptr<LoadedModel> model_;
  std::unique_ptr<LlamaForward> cpu_;
  std::unique_ptr<DeviceGenerator> dev_;
};

TEST_P(DeviceGenerateTest, FullCacheGreedyAndPromptLogitsMatchCpu) {
  GenerateRequest req = request(150, 16);
  Outcome cpu, dev;
  both(req, true, cpu, dev);
  ASSERT_EQ(cpu.prompt_logits.size(), dev.prompt_logits.size());
  const double rel = GetParam().blocks() ? 2 * k_logit_rel : k_logit_rel;
  double worst = 0, worst_share = 0;  // the largest difference, and the largest share of its bound
  for (size_t p = 0; p < cpu.prompt_logits.size(); ++p) {
    const std::vector<float>& c = cpu.prompt_logits[p];
    std::vector<int> idx(c.size());
    for (size_t i = 0; i < idx.size(); ++i) idx[i] = static_cast<int>(i);
    std::partial_sort(idx.begin(), idx.begin() + 5, idx.end(), [&](int x, int y) { return c[x] > c[y]; });
    double scale = 0;  // the row's largest |logit|: every logit's error comes from one hidden state's
    for (float v : c) scale = std::max(scale, std::abs(static_cast<double>(v)));
    for (int k = 0; k < 5; ++k) {
      const double d = std::abs(c[idx[k]] - dev.prompt_logits[p][idx[k]]);
      worst = std::max(worst, d);
      worst_share = std::max(worst_share, d / (k_logit_tol + rel * scale));
      EXPECT_LE(d, k_logit_tol + rel * scale) << "position " << p << " id " << idx[k];
    }
  }
  std::printf("[ info ] %s: worst top-5 prompt logit difference %.4f (at most %.0f%% of its bound)\n", GetParam().name,
              worst, 100 * worst_share);
  const int compared = compare_tokens(cpu, dev);
  std::printf("[ info ] %s: %d of %zu greedy tokens compared equal\n", GetParam().name, compared, cpu.result.tokens.size());
  EXPECT_GE(compared, 1);
  EXPECT_EQ(dev.result.stats.kv_resident_bytes, dev.result.stats.kv_full_equivalent_bytes);
  const std::string memory = dev_->describe_memory();  // the weights the device holds
  const std::string held = std::string("MiB ") + GetParam().held;
  EXPECT_NE(memory.find(held), std::string::npos) << memory;
}

// On the kernel emulator, a model that repeats another's attention (Model::repeats) skips the
// policy and layer-wise tests.
bool skip_repeat_on_emulator() {
#if defined(SNAP_KERNEL_EMULATOR)
  return DeviceGenerateTest::GetParam().repeats != nullptr;
#else
  return false;
#endif
}

TEST_P(DeviceGenerateTest, PolicySelectionsAndTokensMatchCpu) {
  if (skip_repeat_on_emulator()) GTEST_SKIP() << "kernel emulator: repeats " << GetParam().repeats << "'s attention (Model::repeats)";
  struct Case {
    const char* name;
    KvPolicyKind kind;
    int64_t context;      // context_tokens (0: whole prompt)
    int64_t prompt = 200;  // prompt tokens
  };
  for (const Case& k : {Case{"snapkv", KvPolicyKind::snapkv, 0}, Case{"pyramidkv", KvPolicyKind::pyramidkv, 0},
                        Case{"streaming", KvPolicyKind::streaming, 0}, Case{"snapkv_context", KvPolicyKind::snapkv, 160},
                        Case{"adakv", KvPolicyKind::adakv, 0}, Case{"adakv_context", KvPolicyKind::adakv, 160},
                        Case{"h2o", KvPolicyKind::h2o, 0}, Case{"h2o_context", KvPolicyKind::h2o, 160},
                        // 2 layers, budget 64, window 16: layer budgets 110 and 18, so layer 0 keeps
                        // all 100 positions while layer 1 drops (the CPU's per-layer rule).
                        Case{"pyramidkv_layer0_keeps_all", KvPolicyKind::pyramidkv, 0, 100}}) {
    SCOPED_TRACE(k.name);
    GenerateRequest req = request(k.prompt, 10);
    req.kv_policy.kind = k.kind;
    req.kv_policy.budget = 64;
    req.kv_policy.window = 16;
    req.kv_policy.kernel = 5;
    req.kv_policy.context_tokens = k.context;
    Outcome cpu, dev;
    const fs::path cpu_dump = dir_ / (std::string(k.name) + ".cpu.json"), dev_dump = dir_ / (std::string(k.name) + ".dev.json");
    req.kv_selection_dump = cpu_dump.string();
    GenerateRequest dreq = req;
    dreq.kv_selection_dump = dev_dump.string();
    {
      const int64_t vocab = model_->config.vocab_size;
      GenerateHooks hc, hd;
      hc.on_step_logits = [&](const float* row) { cpu.step_logits.emplace_back(row, row + vocab); };
      hd.on_step_logits = [&](const float* row) { dev.step_logits.emplace_back(row, row + vocab); };
      auto rc = generate(*cpu_, req, hc);
      ASSERT_TRUE(rc.ok()) << rc.status().to_string();
      auto rd = dev_->generate(dreq, hd);
      ASSERT_TRUE(rd.ok()) << rd.status().to_string();
      cpu.result = std::move(rc).value();
      dev.result = std::move(rd).value();
    }
    const auto [differ, total] = compare_selection(cpu_dump, dev_dump, k.kind == KvPolicyKind::adakv);
    std::printf("[ info ] %s %s: %lld of %lld kept entries differ\n", GetParam().name, k.name,
                static_cast<long long>(differ), static_cast<long long>(total));
    ASSERT_GT(total, 0);
    if (k.kind == KvPolicyKind::streaming) {
      EXPECT_EQ(differ, 0);
    } else {
      EXPECT_LE(differ, k_selection_mismatch * total);
    }
    EXPECT_LT(dev.result.stats.kv_resident_bytes, dev.result.stats.kv_full_equivalent_bytes);
    if (differ == 0) compare_tokens(cpu, dev);  // the same cache: the same greedy tokens
  }
}

// Layer-wise prefill on the device against the CPU's layer-wise prefill: the same selections
// (near-ties excepted, as above) and, with the same cache, the same greedy tokens; and its pool
// peak below the device's own chunked prefill of the same request (one layer's full KV + the
// compressed rest, against every layer's full KV).
TEST_P(DeviceGenerateTest, LayerwisePrefillMatchesCpuAndPeaksLower) {
  if (skip_repeat_on_emulator()) GTEST_SKIP() << "kernel emulator: repeats " << GetParam().repeats << "'s attention (Model::repeats)";
  for (const KvPolicyKind kind : {KvPolicyKind::snapkv, KvPolicyKind::adakv, KvPolicyKind::h2o, KvPolicyKind::streaming}) {
    const std::string name = kv_policy_name(kind);
    SCOPED_TRACE(name);
    GenerateRequest req = request(400, 8);
    req.kv_policy.kind = kind;
    req.kv_policy.budget = 64;
    req.kv_policy.window = 16;
    req.kv_policy.kernel = 5;
    req.kv_policy.layerwise = true;
    const fs::path cpu_dump = dir_ / (name + ".lw.cpu.json"), dev_dump = dir_ / (name + ".lw.dev.json");
    GenerateRequest dreq = req;
    req.kv_selection_dump = cpu_dump.string();
    dreq.kv_selection_dump = dev_dump.string();
    Outcome cpu, dev;
    const int64_t vocab = model_->config.vocab_size;
    GenerateHooks hc, hd;
    hc.on_step_logits = [&](const float* row) { cpu.step_logits.emplace_back(row, row + vocab); };
    hd.on_step_logits = [&](const float* row) { dev.step_logits.emplace_back(row, row + vocab); };
    auto rc = generate(*cpu_, req, hc);
    ASSERT_TRUE(rc.ok()) << rc.status().to_string();
    auto rd = dev_->generate(dreq, hd);
    ASSERT_TRUE(rd.ok()) << rd.status().to_string();
    cpu.result = std::move(rc).value();
    dev.result = std::move(rd).value();
    EXPECT_TRUE(cpu.result.stats.layerwise);
    EXPECT_TRUE(dev.result.stats.layerwise);
    const auto [differ, total] = compare_selection(cpu_dump, dev_dump, kind == KvPolicyKind::adakv);
    std::printf("[ info ] %s layer-wise %s: %lld of %lld kept entries differ\n", GetParam().name, name.c_str(),
                static_cast<long long>(differ), static_cast<long long>(total));
    ASSERT_GT(total, 0);
    EXPECT_LE(differ, (kind == KvPolicyKind::streaming ? 0.0 : k_selection_mismatch) * total);
    if (differ == 0) compare_tokens(cpu, dev);
    GenerateRequest chunked = req;
    chunked.kv_policy.layerwise = false;
    chunked.auto_layerwise = false;
    chunked.kv_selection_dump.clear();
    auto rch = dev_->generate(chunked, {});
    ASSERT_TRUE(rch.ok()) << rch.status().to_string();
    EXPECT_FALSE(rch->stats.layerwise);
    EXPECT_LT(dev.result.stats.kv_pool_peak_bytes, rch->stats.kv_pool_peak_bytes)
        << "layer-wise peak " << dev.result.stats.kv_pool_peak_bytes << " vs chunked " << rch->stats.kv_pool_peak_bytes;
    EXPECT_EQ(dev.result.stats.kv_resident_bytes, rch->stats.kv_resident_bytes);
  }
}

TEST_P(DeviceGenerateTest, BadRequestsAreRefusedInOneLine) {
  GenerateRequest req = request(40, 2);
  req.kv_block_size = 32;
  auto r = dev_->generate(req, {});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("16-token blocks"), std::string::npos) << r.status().message();
  req.kv_block_size = 16;
  req.prompt_ids[3] = static_cast<int32_t>(model_->config.vocab_size);  // out of range
  r = dev_->generate(req, {});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("outside the vocabulary"), std::string::npos) << r.status().message();
}

const std::string k_gemma3_q4_0_args = std::string(test::k_tiny_gemma3_args) + " --gguf-type q4_0";
// The K-format GGUFs (make_tiny_checkpoint.py --gguf-type q4_k_m / q5_k_m / q2_k; scripts/device_deps.sh
// carries them), the CPU and the device holding their blocks.
const std::string k_tiny_k_args =
    "--arch llama --hidden 256 --heads 8 --kv-heads 2 --head-dim 32 --intermediate 608 --tie --scale 0.04 --seed 13 ";
const std::string k_q4_k_m_args = k_tiny_k_args + "--gguf-type q4_k_m";
const std::string k_q5_k_m_args = k_tiny_k_args + "--gguf-type q5_k_m";
const std::string k_q2_k_args = k_tiny_k_args + "--gguf-type q2_k";
Model tiny_k_m(const char* name, const char* args, const char* carried, const char* held,
               const char* repeats = nullptr) {
  Model m{name, "make_tiny_checkpoint.py", args, "model.gguf", carried, DType::bf16, true, held, repeats};
  return m;
}

INSTANTIATE_TEST_SUITE_P(
    Models, DeviceGenerateTest,
    ::testing::Values(Model{"llama3_bf16", "make_random_model.py", "--shape tiny-llama3 --dtype bf16 --seed 3", ""},
                      Model{"mistral_window", "make_random_model.py", "--shape tiny-mistral --dtype f32 --seed 5", ""},
                      Model{"qwen2_f16_tied", "make_random_model.py", "--shape tiny-qwen2 --dtype f16 --seed 4", ""},
                      Model{"tiny_gguf", "make_tiny_checkpoint.py", "--arch llama --heads 8 --kv-heads 2 --head-dim 32 --seed 11",
                            "model.gguf", "tiny-gguf"},
                      Model{"gemma3_tiny", "make_tiny_checkpoint.py", test::k_tiny_gemma3_args, "model.gguf",
                            test::k_tiny_gemma3_carried},
                      Model{"llama3_q8_0", "make_random_model.py", "--shape tiny-llama3 --dtype bf16 --seed 3", "", "",
                            DType::q8_0, false, "q8_0 + bf16", "llama3_bf16"},
                      Model{"tiny_gguf_q4_1", "make_tiny_checkpoint.py",
                            "--arch llama --heads 8 --kv-heads 2 --head-dim 32 --seed 11 --gguf-type q4_1", "model.gguf",
                            "tiny-gguf-q4_1", DType::bf16, true, "q4_1 + bf16", "tiny_gguf"},
                      Model{"gemma3_q4_0", "make_tiny_checkpoint.py",
                            k_gemma3_q4_0_args.c_str(), "model.gguf",
                            "tiny-gemma3-q4_0", DType::bf16, true, "q4_0", "gemma3_tiny"},
                      tiny_k_m("tiny_q4_k_m", k_q4_k_m_args.c_str(), "tiny-q4_k_m", "q5_0 + q4_k + q6_k"),
                      tiny_k_m("tiny_q5_k_m", k_q5_k_m_args.c_str(), "tiny-q5_k_m", "q5_0 + q6_k + q5_k", "tiny_q4_k_m"),
                      tiny_k_m("tiny_q2_k", k_q2_k_args.c_str(), "tiny-q2_k", "q5_0 + q3_k + q2_k", "tiny_q4_k_m")),
    [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace snap

int main(int argc, char** argv) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    std::printf("test_device_generate: no CUDA device (%s): skipped\n",
                err != cudaSuccess ? cudaGetErrorString(err) : "0 devices");
    return 77;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
