// The device forward end to end on a GPU: random models of three families
// (tools/make_random_model.py: llama3 rope + GQA, mistral sliding window, qwen2 bias + tied
// embeddings) loaded as the service loads them, run through DeviceForward over the device
// KV pool in prompt chunks — their attention on the tensor cores and decode steps on the
// key_threads kernel (the defaults), then again on the CUDA-core kernel and row_warps — against
// the numpy reference tools/reference_llama.py on the same ids
// (python3 + numpy, present on the GPU machine), the same bounds for both:
//   prompt logits: every position's reference top 5 within 0.05 + 2^-9·|logit| (bf16
//     activations feed the prefill GEMMs: 2^-9 relative per element, so the bound grows with
//     the logit: ~0.01 on logits of magnitude ~3, ~0.08 measured on the tied-f16 model's ~100
//     with the host twin, kernels/cuda/host, where a flat 0.05 failed);
//   greedy: the device's argmax equals the reference's at every prompt position whose top-2
//     margin exceeds 0.1, and 6 decoded tokens (GEMV path) equal the reference's greedy
//     continuation unless a step's reference margin is below 0.1 (a near-tie ends the check).
// SnapKV on the device end to end: after the prompt, compress_snapkv keeps per layer and KV
// head what worker/kv/selection.cpp's snapkv_select picks from the same window queries and
// keys (read back from the device), except documented near-ties at the cut-off; every head
// then holds exactly B entries, the dropped blocks are free, and decoding continues.
// Exits 77 without a usable GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <utility>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "common/dtype.h"
#include "kernels/cuda/block_split.h"
#include "kernels/cuda/kernels_cuda.h"
#include "tests/cuda/tiny_gemma3.h"
#include "worker/device/device_forward.h"
#include "worker/device/device_kv_pool.h"
#include "worker/device/device_weights.h"
#include "worker/kv/selection.h"
#include "worker/model/dequant.h"
#include "worker/model/weights.h"

namespace snap {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr double k_logit_tol = 0.05;
constexpr double k_logit_rel = 1.0 / 512;  // bf16's unit roundoff: the error scales with |logit|
constexpr double k_margin = 0.1;

int sh(const std::string& cmd) {
  const int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128 + WTERMSIG(rc);
}

// reference_llama.py on ids: per position {top_ids, top_logits}, and `greedy` new tokens.
json reference(const std::string& model, const std::vector<int32_t>& ids, int greedy, const fs::path& out) {
  std::string list;
  for (int32_t id : ids) {
    if (!list.empty()) list += ',';
    list += std::to_string(id);
  }
  const std::string cmd = std::string(SNAP_PYTHON) + " " SNAP_SOURCE_DIR "/tools/reference_llama.py --model " + model +
                          " --ids " + list + " --top 2 --greedy " + std::to_string(greedy) + " --out " + out.string() +
                          " >/dev/null";
  EXPECT_EQ(sh(cmd), 0) << cmd;
  std::ifstream in(out);
  return json::parse(in);
}

struct Family {
  const char* name;
  const char* args;
};

class DeviceForwardTest : public ::testing::TestWithParam<Family> {};

TEST_P(DeviceForwardTest, MatchesNumpyReference) {
  const Family f = GetParam();
  const fs::path dir = fs::temp_directory_path() / ("snap_devfwd_" + std::string(f.name) + "_" + std::to_string(getpid()));
  fs::create_directories(dir);
  const std::string model_dir = (dir / "model").string();
  ASSERT_EQ(sh(std::string(SNAP_PYTHON) + " " SNAP_SOURCE_DIR "/tools/make_random_model.py " + f.args + " --out " +
               model_dir + " >/dev/null"),
            0);
  LoadOptions opts;
  opts.keep_quantized = false;
  auto model = load_model(model_dir, opts);
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  const ModelConfig& c = model->config;
  auto weights = DeviceWeights::upload(*model);
  ASSERT_TRUE(weights.ok()) << weights.status().to_string();

  std::vector<int32_t> ids(45);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 7919 + 13) % c.vocab_size);
  const int64_t vocab = c.vocab_size;
  const json r = reference(model_dir, ids, 6, dir / "ref.json");
  ASSERT_EQ(r["positions"].size(), ids.size());
  // Greedy continuation: margins of each step from the reference on the extended ids.
  const std::vector<int32_t> want = r["greedy"].get<std::vector<int32_t>>();
  std::vector<int32_t> ext = ids;
  ext.insert(ext.end(), want.begin(), want.end() - 1);
  const json r2 = reference(model_dir, ext, 0, dir / "ref2.json");

  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  // The prompt attentions (the tensor-core mma kernel, the default; the CUDA-core one; the
  // wmma tensor-core kernel) and the decode attentions (key_threads, the default, row_warps and
  // pipelined) within the same bounds: the defaults together, then the others.
  using PA = DeviceForward::PromptAttention;
  using PK = kernels::PrefillAttention;
  using DA = kernels::DecodeAttention;
  for (const auto& [pa, pk, da] : {std::tuple{PA::tensor_cores, PK::mma, DA::key_threads},
                                   std::tuple{PA::f32, PK::mma, DA::row_warps},
                                   std::tuple{PA::tensor_cores, PK::wmma, DA::key_threads},
                                   std::tuple{PA::tensor_cores, PK::mma, DA::pipelined}}) {
    auto pool = DeviceKvPool::create({c.num_layers, c.num_kv_heads, c.head_dim, 16}, int64_t{64} << 20, stream);
    ASSERT_TRUE(pool.ok()) << pool.status().to_string();
    DeviceForward fwd(c, **weights, **pool);
    fwd.set_prompt_attention(pa);
    fwd.set_prefill_kernel(pk);
    fwd.set_decode_attention(da);
    SCOPED_TRACE(std::string("prompt attention ") + fwd.prompt_attention_name() + ", decode attention " +
                 DeviceForward::decode_attention_name(da));

    const int32_t seq = (*pool)->add_sequence();
    std::vector<float> logits(ids.size() * vocab);
    int32_t next = -1;
    for (size_t at = 0; at < ids.size(); at += 16) {  // chunks of 16, 16, 13
      const int64_t n = std::min<int64_t>(16, static_cast<int64_t>(ids.size() - at));
      const Status st = fwd.forward(seq, ids.data() + at, n, logits.data() + at * vocab, true, &next);
      ASSERT_TRUE(st.ok()) << st.to_string();
    }
    std::vector<int32_t> gen{next};
    for (int s = 1; s < 6; ++s) {
      const Status st = fwd.forward(seq, &gen.back(), 1, nullptr, false, &next);
      ASSERT_TRUE(st.ok()) << st.to_string();
      gen.push_back(next);
    }
    EXPECT_EQ((*pool)->appended(seq, 0), static_cast<int64_t>(ids.size() + 5));

    for (size_t t = 0; t < ids.size(); ++t) {
      const json& p = r["positions"][t];
      const float* row = logits.data() + t * vocab;
      for (size_t k = 0; k < p["top_ids"].size(); ++k) {
        const int64_t id = p["top_ids"][k].get<int64_t>();
        const double ref = p["top_logits"][k].get<double>();
        EXPECT_NEAR(row[id], ref, k_logit_tol + k_logit_rel * std::abs(ref)) << f.name << " position " << t << " id " << id;
      }
      int64_t best = 0;
      for (int64_t v = 1; v < vocab; ++v)
        if (row[v] > row[best]) best = v;
      const double margin = p["top_logits"][0].get<double>() - p["top_logits"][1].get<double>();
      if (margin > k_margin) {
        EXPECT_EQ(best, p["top_ids"][0].get<int64_t>()) << f.name << " argmax at " << t;
      }
    }
    for (size_t s = 0; s < want.size(); ++s) {
      const json& p = r2["positions"][ids.size() - 1 + s];
      const double margin = p["top_logits"][0].get<double>() - p["top_logits"][1].get<double>();
      if (gen[s] != want[s]) {
        EXPECT_LT(margin, k_margin) << f.name << " greedy step " << s << ": device " << gen[s] << ", reference "
                                    << want[s] << " with margin " << margin;
        break;  // past a near-tie the two continuations legitimately diverge
      }
    }
  }
  cudaStreamDestroy(stream);
  fs::remove_all(dir);
}

// Continuous batching on the device: decode_batch's row of a sequence is bitwise the logits
// forward() gives that sequence alone, whatever else shares the step — three sequences of
// different lengths (one SnapKV-compressed, so its heads are shorter than its positions; one
// long enough for its attention to be split), in batches of 3, of 2 in another order and alone —
// and the greedy ids are equal too; asked for some rows' logits only, it copies just those.
// `model_dir`: the model to load (a directory or a GGUF); dir is removed at the end.
void rows_equal_alone(const fs::path& dir, const std::string& model_dir) {
  LoadOptions opts;
  opts.keep_quantized = false;
  auto model = load_model(model_dir, opts);
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  const ModelConfig& c = model->config;
  const int64_t vocab = c.vocab_size;
  auto weights = DeviceWeights::upload(*model);
  ASSERT_TRUE(weights.ok()) << weights.status().to_string();
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  {
    auto pool = DeviceKvPool::create({c.num_layers, c.num_kv_heads, c.head_dim, 16}, int64_t{32} << 20, stream);
    ASSERT_TRUE(pool.ok()) << pool.status().to_string();
    DeviceForward fwd(c, **weights, **pool);
    const int64_t lengths[3] = {37, 90, 150};  // 150 keys: three splits of 64 (the others one)
    constexpr int k_steps = 5;
    // Two copies of each sequence: copy 0 decodes alone (forward), copy 1 in batches.
    int32_t seq[2][3];
    int32_t first[3];
    for (int i = 0; i < 3; ++i) {
      std::vector<int32_t> ids(static_cast<size_t>(lengths[i]));
      for (int64_t t = 0; t < lengths[i]; ++t) ids[t] = static_cast<int32_t>((t * 331 + 17 * i + 1) % vocab);
      for (int copy = 0; copy < 2; ++copy) {
        seq[copy][i] = (*pool)->add_sequence();
        if (i == 1) fwd.observe_window(8);  // the long one is compressed to 32 per head
        ASSERT_TRUE(fwd.forward(seq[copy][i], ids.data(), lengths[i], nullptr, false, &first[i]).ok());
        if (i == 1) {
          kernels::SnapKvCudaParams sp;
          sp.budget = 32;
          sp.window = 8;
          sp.kernel = 5;
          const Status st = fwd.compress_snapkv(seq[copy][i], sp);
          ASSERT_TRUE(st.ok()) << st.to_string();
          EXPECT_EQ((*pool)->length(seq[copy][i], 0, 0), 32);
          fwd.observe_window(0);
        }
      }
    }
    // Alone: each sequence k_steps greedy steps by itself.
    std::vector<std::vector<float>> alone(3, std::vector<float>(static_cast<size_t>(k_steps * vocab)));
    std::vector<std::vector<int32_t>> alone_ids(3);
    for (int i = 0; i < 3; ++i) {
      int32_t tok = first[i];
      for (int s = 0; s < k_steps; ++s) {
        int32_t next = -1;
        ASSERT_TRUE(fwd.forward(seq[0][i], &tok, 1, alone[i].data() + s * vocab, false, &next).ok());
        alone_ids[i].push_back(next);
        tok = next;
      }
    }
    // Batched: steps 0-1 all three (order 0 1 2), steps 2-3 two of them (order 2 0) with 1
    // alone through decode_batch, step 4 all three in order 1 2 0.
    const std::vector<std::vector<std::vector<int>>> plan = {
        {{0, 1, 2}}, {{0, 1, 2}}, {{2, 0}, {1}}, {{2, 0}, {1}}, {{1, 2, 0}}};
    int32_t tok[3] = {first[0], first[1], first[2]};
    for (int s = 0; s < k_steps; ++s) {
      for (const std::vector<int>& batch : plan[s]) {
        std::vector<int32_t> seqs, toks, next(batch.size());
        for (int i : batch) {
          seqs.push_back(seq[1][i]);
          toks.push_back(tok[i]);
        }
        // Steps 2 and 3 copy only the logits of the batch's second row (logits_rows): the first
        // row's stay as they were (NaN), its id comes from the device's argmax all the same.
        std::vector<float> logits(batch.size() * vocab, NAN);
        const std::vector<uint8_t> only_second = {0, 1};
        const bool masked = (s == 2 || s == 3) && batch.size() == 2;
        const Status st = fwd.decode_batch(seqs.data(), toks.data(), static_cast<int64_t>(batch.size()), logits.data(),
                                           next.data(), masked ? only_second.data() : nullptr);
        ASSERT_TRUE(st.ok()) << st.to_string();
        for (size_t b = 0; b < batch.size(); ++b) {
          const int i = batch[b];
          if (masked && b == 0) {
            EXPECT_TRUE(std::all_of(logits.begin(), logits.begin() + vocab, [](float x) { return std::isnan(x); }))
                << "sequence " << i << " step " << s << ": a row not asked for was copied";
          } else {
            EXPECT_EQ(std::memcmp(logits.data() + b * vocab, alone[i].data() + s * vocab, sizeof(float) * vocab), 0)
                << "sequence " << i << " step " << s << ": batched logits differ from alone";
          }
          EXPECT_EQ(next[b], alone_ids[i][s]) << "sequence " << i << " step " << s;
          tok[i] = next[b];
        }
      }
    }
    for (int i = 0; i < 3; ++i) EXPECT_EQ((*pool)->appended(seq[1][i], 0), (*pool)->appended(seq[0][i], 0));
    // Refusals change nothing: a sequence twice, a bad id, a closed sequence.
    const int32_t twice[2] = {seq[1][0], seq[1][0]}, ok_tok[2] = {1, 2};
    EXPECT_FALSE(fwd.decode_batch(twice, ok_tok, 2, nullptr, nullptr).ok());
    const int32_t bad_tok[1] = {static_cast<int32_t>(vocab)};
    EXPECT_FALSE(fwd.decode_batch(seq[1], bad_tok, 1, nullptr, nullptr).ok());
    ASSERT_TRUE((*pool)->release(seq[1][2]).ok());
    EXPECT_FALSE(fwd.decode_batch(&seq[1][2], ok_tok, 1, nullptr, nullptr).ok());
    EXPECT_EQ((*pool)->appended(seq[1][0], 0), (*pool)->appended(seq[0][0], 0));
  }
  cudaStreamDestroy(stream);
  fs::remove_all(dir);
}

TEST(DeviceBatchDecode, RowsEqualAloneBitwise) {
  const fs::path dir = fs::temp_directory_path() / ("snap_devbatch_" + std::to_string(getpid()));
  fs::create_directories(dir);
  const std::string model_dir = (dir / "model").string();
  ASSERT_EQ(sh(std::string(SNAP_PYTHON) + " " SNAP_SOURCE_DIR "/tools/make_random_model.py --shape tiny-llama3 --seed 12 --out " +
               model_dir + " >/dev/null"),
            0);
  rows_equal_alone(dir, model_dir);
}

// The same with Gemma 3's layers (test_device_generate's tiny gemma3 GGUF: local layers with a
// window of 48 between global ones, q/k norms, post-norms, GeGLU): a batch's attention launch
// takes each layer's own window, the post-norms and GeGLU run per row.
TEST(DeviceBatchDecode, Gemma3RowsEqualAloneBitwise) {
  const fs::path dir = fs::temp_directory_path() / ("snap_devbatch_g3_" + std::to_string(getpid()));
  fs::create_directories(dir);
  std::string why;
  const std::string path = test::tiny_gemma3(SNAP_PYTHON, SNAP_SOURCE_DIR, dir / "m", &why);
  if (path.empty()) {
    fs::remove_all(dir);
    GTEST_SKIP() << why;
  }
  rows_equal_alone(dir, path);
}

TEST(DeviceSnapKv, CompressionMatchesCpuSelection) {
  const fs::path dir = fs::temp_directory_path() / ("snap_devsnap_" + std::to_string(getpid()));
  fs::create_directories(dir);
  const std::string model_dir = (dir / "model").string();
  ASSERT_EQ(sh(std::string(SNAP_PYTHON) + " " SNAP_SOURCE_DIR "/tools/make_random_model.py --shape tiny-llama3 --seed 9 --out " +
               model_dir + " >/dev/null"),
            0);
  LoadOptions opts;
  opts.keep_quantized = false;
  auto model = load_model(model_dir, opts);
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  const ModelConfig& c = model->config;
  auto weights = DeviceWeights::upload(*model);
  ASSERT_TRUE(weights.ok()) << weights.status().to_string();
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  {
    auto pool = DeviceKvPool::create({c.num_layers, c.num_kv_heads, c.head_dim, 16}, int64_t{16} << 20, stream);
    ASSERT_TRUE(pool.ok()) << pool.status().to_string();
    DeviceForward fwd(c, **weights, **pool);
    kernels::SnapKvCudaParams sp;
    sp.budget = 24;
    sp.window = 8;
    sp.kernel = 5;
    const int64_t n = 70, hd = c.head_dim, nkv = c.num_kv_heads;
    std::vector<int32_t> ids(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) ids[i] = static_cast<int32_t>((i * 613 + 5) % c.vocab_size);
    const int32_t seq = (*pool)->add_sequence();
    int32_t next = -1;
    ASSERT_TRUE(fwd.forward(seq, ids.data(), 32, nullptr, false, &next).ok());
    fwd.observe_window(sp.window);
    ASSERT_TRUE(fwd.forward(seq, ids.data() + 32, n - 32, nullptr, false, &next).ok());

    // The CPU selection on the device's own keys and window queries.
    const size_t slots = static_cast<size_t>((*pool)->num_blocks()) * 16;
    std::vector<uint16_t> kslab(slots * hd);
    ASSERT_EQ(cudaMemcpy(kslab.data(), (*pool)->k_slab(), kslab.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    SnapKvParams cp;
    cp.budget = sp.budget;
    cp.window = sp.window;
    cp.kernel = sp.kernel;
    std::vector<LayerSelection> want;
    std::vector<std::vector<std::vector<float>>> want_scores;
    for (int l = 0; l < c.num_layers; ++l) {
      std::vector<float> k(static_cast<size_t>(nkv * n * hd));
      for (int g = 0; g < nkv; ++g)
        for (int64_t j = 0; j < n; ++j)
          for (int64_t d = 0; d < hd; ++d)
            k[(g * n + j) * hd + d] = bf16_to_f32(kslab[(*pool)->slot(seq, l, g, j) * hd + d]);
      std::vector<float> q(static_cast<size_t>(sp.window * c.num_heads * hd));
      ASSERT_EQ(cudaMemcpy(q.data(), fwd.window_queries(l), q.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
      LayerQk qk{q.data(), sp.window, k.data(), n * hd, n, c.num_heads, c.num_kv_heads, c.head_dim};
      auto sel = snapkv_select(qk, cp);
      auto sc = snapkv_scores(qk, cp);
      ASSERT_TRUE(sel.ok() && sc.ok());
      want.push_back(std::move(*sel));
      want_scores.push_back(std::move(*sc));
    }
    const int64_t bb = (*pool)->block_bytes();
    EXPECT_EQ((*pool)->resident_bytes(seq), c.num_layers * nkv * 5 * bb);  // 70 tokens: 5 blocks per head
    std::vector<std::vector<std::vector<int32_t>>> kept;
    const Status st = fwd.compress_snapkv(seq, sp, &kept);
    ASSERT_TRUE(st.ok()) << st.to_string();
    const int64_t prefix = n - sp.window, keep = sp.budget - sp.window;
    for (int l = 0; l < c.num_layers; ++l)
      for (int g = 0; g < nkv; ++g) {
        EXPECT_EQ((*pool)->length(seq, l, g), sp.budget);
        const std::vector<int32_t>& got = kept[l][g];
        const std::vector<int32_t>& w = want[l].kept[g];
        if (got == w) continue;
        std::vector<float> sorted = want_scores[l][g];
        std::nth_element(sorted.begin(), sorted.begin() + (keep - 1), sorted.end(), std::greater<float>());
        const double cut = sorted[keep - 1], norm = *std::max_element(sorted.begin(), sorted.end());
        std::vector<int32_t> diff;
        std::set_symmetric_difference(got.begin(), got.end(), w.begin(), w.end(), std::back_inserter(diff));
        for (int32_t j : diff)
          EXPECT_TRUE(j < prefix && std::fabs(want_scores[l][g][j] - cut) <= 1e-5 * norm)
              << "layer " << l << " head " << g << ": position " << j << " differs from the CPU selection";
      }
    EXPECT_EQ((*pool)->resident_bytes(seq), c.num_layers * nkv * 2 * bb) << "24 entries: 2 blocks per head";
    EXPECT_EQ((*pool)->full_equivalent_bytes(seq), c.num_layers * nkv * 5 * bb);
    for (int s = 0; s < 4; ++s) {
      const int32_t tok = next;
      ASSERT_TRUE(fwd.forward(seq, &tok, 1, nullptr, false, &next).ok());
      EXPECT_GE(next, 0);
      EXPECT_LT(next, c.vocab_size);
    }
    EXPECT_EQ((*pool)->length(seq, 0, 0), sp.budget + 4);
  }
  cudaStreamDestroy(stream);
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Families, DeviceForwardTest,
                         ::testing::Values(Family{"llama3_bf16", "--shape tiny-llama3 --dtype bf16 --seed 3"},
                                           Family{"mistral_window", "--shape tiny-mistral --dtype f32 --seed 5"},
                                           Family{"qwen2_f16_tied", "--shape tiny-qwen2 --dtype f16 --seed 4"}),
                         [](const auto& info) { return std::string(info.param.name); });

// A block-format matrix overwritten by another (copied into the same device arrays), and then
// freed and a third uploaded to new arrays (the same sizes, so the allocator may hand back the
// same addresses): each decode GEMV reads the matrix there now. The host twin keeps each matrix
// it has read in the CPU's layout between calls (kernels_host.cpp host_matrix) and must notice
// both. Q8_0 (kept as blocks there) and Q4_K (kept as f32 values); each against the CPU's
// dequantized values, to 1e-4.
TEST(DeviceBlockGemv, ReadsTheMatrixUploadedLast) {
  constexpr int64_t rows = 40, cols = 512;
  for (const kernels::BlockFormat f : {kernels::BlockFormat::q8_0, kernels::BlockFormat::q4_k}) {
    SCOPED_TRACE(kernels::block_format_name(f));
    const int64_t nb = rows * cols / kernels::block_format_elems(f), bb = kernels::block_format_ggml_bytes(f);
    const kernels::BlockParts parts = kernels::block_parts(f);
    std::vector<float> x(static_cast<size_t>(cols));
    for (int64_t c = 0; c < cols; ++c) x[c] = std::sin(0.37f * static_cast<float>(c));
    void *q = nullptr, *d = nullptr, *m = nullptr, *e = nullptr;
    float *dx = nullptr, *dy = nullptr;
    ASSERT_EQ(cudaMalloc(&dx, cols * sizeof(float)), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&dy, rows * sizeof(float)), cudaSuccess);
    cudaMemcpy(dx, x.data(), cols * sizeof(float), cudaMemcpyHostToDevice);
    for (uint32_t seed : {1u, 2u, 3u}) {
      std::mt19937 gen(seed);
      std::vector<uint8_t> ggml(static_cast<size_t>(nb * bb));
      for (auto& b : ggml) b = static_cast<uint8_t>(gen());
      for (int64_t b = 0; b < nb; ++b) {  // d and dmin: 2^-8 and 2^-10 times 1..2, no NaN or infinity
        const uint16_t dv = static_cast<uint16_t>(0x1c00 | (gen() & 0x3ff)), mv = static_cast<uint16_t>(0x1400 | (gen() & 0x3ff));
        std::memcpy(&ggml[b * bb + parts.d.at], &dv, 2);
        if (parts.m.at >= 0) std::memcpy(&ggml[b * bb + parts.m.at], &mv, 2);
      }
      if (f == kernels::BlockFormat::q8_0)
        for (int64_t b = 0; b < nb; ++b)
          for (int j = 0; j < 32; ++j)
            if (ggml[b * bb + 2 + j] == 0x80) ggml[b * bb + 2 + j] = 0x81;  // ggml never writes -128
      std::vector<float> w(static_cast<size_t>(rows * cols));
      ASSERT_TRUE(dequantize(ggml_type_of(kernels::block_format_dtype(f)), ggml.data(), w.data(), rows * cols).ok());
      std::vector<double> want(static_cast<size_t>(rows), 0.0);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) want[r] += static_cast<double>(w[r * cols + c]) * x[c];
      const kernels::SplitBlocks split = kernels::split_ggml_blocks(f, ggml.data(), nb);
      if (seed != 2) {  // seed 2 overwrites seed 1's arrays; seed 3 gets new ones
        for (void* p : {q, d, m, e}) ASSERT_EQ(cudaFree(p), cudaSuccess);
        ASSERT_EQ(cudaMalloc(&q, split.quants.size()), cudaSuccess);
        ASSERT_EQ(cudaMalloc(&d, split.scales.size() * 2), cudaSuccess);
        ASSERT_EQ(cudaMalloc(&m, std::max<size_t>(split.mins.size() * 2, 1)), cudaSuccess);
        ASSERT_EQ(cudaMalloc(&e, std::max<size_t>(split.extra.size(), 1)), cudaSuccess);
      }
      cudaMemcpy(q, split.quants.data(), split.quants.size(), cudaMemcpyHostToDevice);
      cudaMemcpy(d, split.scales.data(), split.scales.size() * 2, cudaMemcpyHostToDevice);
      if (!split.mins.empty()) cudaMemcpy(m, split.mins.data(), split.mins.size() * 2, cudaMemcpyHostToDevice);
      if (!split.extra.empty()) cudaMemcpy(e, split.extra.data(), split.extra.size(), cudaMemcpyHostToDevice);
      kernels::BlockWeights bw;
      bw.format = f;
      bw.quants = q;
      bw.scales = static_cast<const uint16_t*>(d);
      bw.mins = split.mins.empty() ? nullptr : static_cast<const uint16_t*>(m);
      bw.extra = split.extra.empty() ? nullptr : static_cast<const uint8_t*>(e);
      for (int call = 0; call < 2; ++call) {  // twice: the second from what the first kept
        kernels::matmul_rowwise_blocks_cuda(dx, bw, nullptr, dy, 1, rows, cols, nullptr);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        std::vector<float> y(static_cast<size_t>(rows));
        cudaMemcpy(y.data(), dy, rows * sizeof(float), cudaMemcpyDeviceToHost);
        for (int64_t r = 0; r < rows; ++r)
          ASSERT_NEAR(y[r], want[r], 1e-4 * (1.0 + std::abs(want[r]))) << "seed " << seed << " call " << call << " row " << r;
      }
    }
    for (void* p : {q, d, m, e, static_cast<void*>(dx), static_cast<void*>(dy)}) ASSERT_EQ(cudaFree(p), cudaSuccess);
  }
}

}  // namespace
}  // namespace snap

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (::testing::GTEST_FLAG(list_tests)) return RUN_ALL_TESTS();
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    std::printf("test_device_forward: no usable GPU (%s); skipping\n",
                err != cudaSuccess ? cudaGetErrorString(err) : "0 devices");
    return 77;
  }
  return RUN_ALL_TESTS();
}
