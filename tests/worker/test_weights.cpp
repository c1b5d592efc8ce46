// Weight loader: the GGUF and safetensors forms of the same tiny checkpoint (written by
// tools/make_tiny_checkpoint.py, GGUF Q/K rows permuted as llama.cpp does) load to
// bit-identical weights and equal configs; the default model loads with its known
// config, its dequantized values match the `gguf` package (committed spot-check), and
// loaded natively it keeps q4_1/q8_0 blocks whose matmul equals the dequantized one.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>

#include <nlohmann/json.hpp>

#include "kernels/cpu/matmul.h"
#include "kernels/cpu/simd.h"
#include "kernels/weight_tiles.h"
#include "tests/worker/tiny_checkpoint.h"
#include "worker/model/dequant.h"
#include "worker/model/weights.h"

namespace snap {
namespace {

using snap::testing::TempDir;

void expect_same_matrix(const Matrix& a, const Matrix& b, const std::string& what) {
  ASSERT_EQ(a.dtype(), b.dtype()) << what;
  ASSERT_EQ(a.rows(), b.rows()) << what;
  ASSERT_EQ(a.cols(), b.cols()) << what;
  if (a.empty()) return;
  const float* x = a.f32();
  const float* y = b.f32();
  int bad = 0;
  for (int64_t i = 0; i < a.rows() * a.cols() && bad < 5; ++i) {
    if (std::memcmp(&x[i], &y[i], 4) != 0) {
      ++bad;
      ADD_FAILURE() << what << " [" << i / a.cols() << ", " << i % a.cols() << "]: gguf " << x[i]
                    << " vs safetensors " << y[i];
    }
  }
}

// Equal configs; `arch_may_differ`: llama.cpp stores mistral as llama.
void expect_same_config(const ModelConfig& g, const ModelConfig& h, bool arch_may_differ) {
  if (!arch_may_differ) {
    EXPECT_EQ(g.arch, h.arch);
  }
  EXPECT_EQ(g.vocab_size, h.vocab_size);
  EXPECT_EQ(g.hidden_size, h.hidden_size);
  EXPECT_EQ(g.intermediate_size, h.intermediate_size);
  EXPECT_EQ(g.num_layers, h.num_layers);
  EXPECT_EQ(g.num_heads, h.num_heads);
  EXPECT_EQ(g.num_kv_heads, h.num_kv_heads);
  EXPECT_EQ(g.head_dim, h.head_dim);
  EXPECT_EQ(g.rms_norm_eps, h.rms_norm_eps);
  EXPECT_EQ(g.rope.theta, h.rope.theta);
  EXPECT_EQ(g.rope.head_dim, h.rope.head_dim);
  EXPECT_EQ(g.rope.scaling, h.rope.scaling);
  EXPECT_EQ(g.rope.factor, h.rope.factor);
  EXPECT_EQ(g.rope.low_freq_factor, h.rope.low_freq_factor);
  EXPECT_EQ(g.rope.high_freq_factor, h.rope.high_freq_factor);
  EXPECT_EQ(g.rope.original_max_position, h.rope.original_max_position);
  EXPECT_EQ(g.max_position, h.max_position);
  EXPECT_EQ(g.sliding_window, h.sliding_window);
  EXPECT_EQ(g.tie_word_embeddings, h.tie_word_embeddings);
  EXPECT_EQ(g.attention_bias, h.attention_bias);
  EXPECT_EQ(g.bos_token_id, h.bos_token_id);
  EXPECT_EQ(g.eos_token_ids, h.eos_token_ids);
}

struct Variant {
  const char* name;
  const char* args;
  Arch arch;
  bool tied;
  bool bias;
  int sliding_window;
  kernels::RopeScaling scaling;
};

const Variant k_variants[] = {
    {"llama_untied", "--arch llama --no-tie --seed 1", Arch::llama, false, false, 0, kernels::RopeScaling::none},
    {"llama_tied", "--arch llama --tie --seed 2", Arch::llama, true, false, 0, kernels::RopeScaling::none},
    {"qwen2_bias", "--arch qwen2 --seed 3 --kv-heads 1", Arch::qwen2, false, true, 0, kernels::RopeScaling::none},
    {"mistral_window", "--arch mistral --seed 4 --sliding-window 32", Arch::mistral, false, false, 32,
     kernels::RopeScaling::none},
    {"llama_head_dim", "--arch llama --seed 5 --hidden 48 --heads 4 --kv-heads 2 --head-dim 16", Arch::llama, false,
     false, 0, kernels::RopeScaling::none},
    {"llama3_rope", "--arch llama --tie --seed 6 --rope-scaling llama3 --rope-theta 500000", Arch::llama, true, false, 0,
     kernels::RopeScaling::llama3},
    {"linear_rope", "--arch llama --seed 7 --rope-scaling linear --heads 2 --kv-heads 2", Arch::llama, false, false,
     0, kernels::RopeScaling::linear},
};

class BothFormats : public ::testing::TestWithParam<Variant> {};

TEST_P(BothFormats, LoadToIdenticalWeightsAndConfig) {
  const Variant& v = GetParam();
  TempDir dir(v.name);
  ASSERT_TRUE(snap::testing::make_tiny_checkpoint(dir.path(), v.args));
  LoadOptions f32;
  f32.keep_quantized = false;
  Result<LoadedModel> g = load_model(dir / "model.gguf", f32);
  Result<LoadedModel> h = load_model(dir / "hf", f32);
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  EXPECT_EQ(g->format, "gguf");
  EXPECT_EQ(h->format, "safetensors");

  const ModelConfig& c = h->config;
  EXPECT_EQ(c.arch, v.arch);
  EXPECT_EQ(c.tie_word_embeddings, v.tied);
  EXPECT_EQ(c.attention_bias, v.bias);
  EXPECT_EQ(c.sliding_window, v.sliding_window);
  EXPECT_EQ(c.rope.scaling, v.scaling);
  expect_same_config(g->config, c, v.arch == Arch::mistral);
  if (v.arch == Arch::mistral) {
    EXPECT_EQ(g->config.arch, Arch::llama);
  }

  const ModelWeights& gw = g->weights;
  const ModelWeights& hw = h->weights;
  EXPECT_EQ(gw.nbytes(), hw.nbytes());
  expect_same_matrix(gw.embed, hw.embed, "embed");
  expect_same_matrix(gw.final_norm, hw.final_norm, "final_norm");
  expect_same_matrix(gw.lm_head, hw.lm_head, "lm_head");
  EXPECT_EQ(gw.lm_head.empty(), v.tied);
  EXPECT_EQ(&gw.output(), v.tied ? &gw.embed : &gw.lm_head);
  ASSERT_EQ(gw.layers.size(), hw.layers.size());
  for (size_t i = 0; i < gw.layers.size(); ++i) {
    const LayerWeights& a = gw.layers[i];
    const LayerWeights& b = hw.layers[i];
    const std::string l = "layer " + std::to_string(i) + " ";
    expect_same_matrix(a.attn_norm, b.attn_norm, l + "attn_norm");
    expect_same_matrix(a.q_proj, b.q_proj, l + "q_proj");
    expect_same_matrix(a.k_proj, b.k_proj, l + "k_proj");
    expect_same_matrix(a.v_proj, b.v_proj, l + "v_proj");
    expect_same_matrix(a.q_bias, b.q_bias, l + "q_bias");
    expect_same_matrix(a.k_bias, b.k_bias, l + "k_bias");
    expect_same_matrix(a.v_bias, b.v_bias, l + "v_bias");
    expect_same_matrix(a.o_proj, b.o_proj, l + "o_proj");
    expect_same_matrix(a.ffn_norm, b.ffn_norm, l + "ffn_norm");
    expect_same_matrix(a.gate_proj, b.gate_proj, l + "gate_proj");
    expect_same_matrix(a.up_proj, b.up_proj, l + "up_proj");
    expect_same_matrix(a.down_proj, b.down_proj, l + "down_proj");
    EXPECT_EQ(a.q_bias.empty(), !v.bias);
    EXPECT_EQ(a.q_proj.rows(), int64_t{c.num_heads} * c.head_dim);
    EXPECT_EQ(a.k_proj.rows(), int64_t{c.num_kv_heads} * c.head_dim);
  }
}

INSTANTIATE_TEST_SUITE_P(TinyCheckpoints, BothFormats, ::testing::ValuesIn(k_variants),
                         [](const ::testing::TestParamInfo<Variant>& i) { return std::string(i.param.name); });

// ---------------------------------------------------------------------------
// --weight-dtype q8_0: quantized at load

void expect_same_bytes(const Matrix& a, const Matrix& b, const std::string& what) {
  ASSERT_EQ(dtype_name(a.dtype()), std::string(dtype_name(b.dtype()))) << what;
  ASSERT_EQ(a.rows(), b.rows()) << what;
  ASSERT_EQ(a.cols(), b.cols()) << what;
  if (a.empty()) return;
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), static_cast<size_t>(a.nbytes()))) << what;
}

void expect_same_weights(const ModelWeights& a, const ModelWeights& b, const std::string& what) {
  expect_same_bytes(a.embed, b.embed, what + " embed");
  expect_same_bytes(a.lm_head, b.lm_head, what + " lm_head");
  expect_same_bytes(a.final_norm, b.final_norm, what + " final_norm");
  ASSERT_EQ(a.layers.size(), b.layers.size());
  for (size_t i = 0; i < a.layers.size(); ++i) {
    const LayerWeights& x = a.layers[i];
    const LayerWeights& y = b.layers[i];
    const std::string l = what + " layer " + std::to_string(i) + " ";
    const std::pair<const char*, Matrix LayerWeights::*> members[] = {
        {"attn_norm", &LayerWeights::attn_norm}, {"q_proj", &LayerWeights::q_proj},
        {"k_proj", &LayerWeights::k_proj},       {"v_proj", &LayerWeights::v_proj},
        {"q_bias", &LayerWeights::q_bias},       {"k_bias", &LayerWeights::k_bias},
        {"v_bias", &LayerWeights::v_bias},       {"o_proj", &LayerWeights::o_proj},
        {"ffn_norm", &LayerWeights::ffn_norm},   {"gate_proj", &LayerWeights::gate_proj},
        {"up_proj", &LayerWeights::up_proj},     {"down_proj", &LayerWeights::down_proj}};
    for (const auto& [name, m] : members) expect_same_bytes(x.*m, y.*m, l + name);
  }
}

// The reference is a GGUF whose matrices the `gguf` package quantized to Q8_0 (ggml's
// reference quantizer; make_tiny_checkpoint.py --gguf-type q8_0), loaded as it is. The HF f32
// form and the F32 GGUF of the same weights, loaded with weight_dtype q8_0, give the same
// blocks byte for byte (Q/K un-permuted rows, slices of every tensor-parallel rank, the tied
// table as the LM head, an untied table left f32), and the same blocks as a q8_0 GGUF copied.
// With --intermediate 96 a tp-2 rank's down_proj columns [48, 96) are not whole blocks: that
// slice stays f32 (from the file's values, so there the Q8_0 GGUF differs: it is not compared).
TEST(QuantizeAtLoad, Q8_0EqualsGgmlsQuantizerBlockForBlock) {
  for (const char* args : {"--arch llama --tie --seed 2 --intermediate 128",
                           "--arch llama --no-tie --seed 1 --intermediate 128",
                           "--arch qwen2 --tie --seed 3 --kv-heads 1 --intermediate 96"}) {
    const bool aligned = std::string(args).find("96") == std::string::npos;
    TempDir q8("q8"), f32("f32");
    ASSERT_TRUE(snap::testing::make_tiny_checkpoint(q8.path(), std::string(args) + " --gguf-type q8_0"));
    ASSERT_TRUE(snap::testing::make_tiny_checkpoint(f32.path(), args));
    for (int tp : {1, 2}) {
      for (int rank = 0; rank < tp; ++rank) {
        const std::string what = std::string(args) + " tp " + std::to_string(tp) + " rank " + std::to_string(rank);
        LoadOptions as_is;  // the Q8_0 GGUF's blocks copied (keep_quantized)
        as_is.matvec_tiles = false;
        as_is.tp_rank = rank;
        as_is.tp_size = tp;
        LoadOptions quantize = as_is;
        ASSERT_TRUE(apply_weight_dtype("q8_0", &quantize).ok());
        LoadOptions in_slabs = quantize;  // 7 rows of 64 at a time: slabs and a short last one
        in_slabs.scratch_floats = 7 * 64 + 5;
        Result<LoadedModel> ref = load_model(q8 / "model.gguf", as_is);
        Result<LoadedModel> hf = load_model(f32 / "hf", quantize);
        Result<LoadedModel> gf = load_model(f32 / "model.gguf", quantize);
        Result<LoadedModel> gq = load_model(q8 / "model.gguf", quantize);
        Result<LoadedModel> hs = load_model(f32 / "hf", in_slabs);
        Result<LoadedModel> gs = load_model(f32 / "model.gguf", in_slabs);
        ASSERT_TRUE(ref.ok() && hf.ok() && gf.ok() && gq.ok() && hs.ok() && gs.ok()) << what;
        expect_same_weights(hf->weights, hs->weights, what + " hf in slabs");
        expect_same_weights(gf->weights, gs->weights, what + " f32 gguf in slabs (Q/K rows un-permuted per slab)");
        EXPECT_EQ(hf->weights.layers[0].q_proj.dtype(), DType::q8_0) << what;
        EXPECT_EQ(hf->weights.output().dtype(), DType::q8_0) << what;
        EXPECT_EQ(hf->weights.embed.dtype(), hf->config.tie_word_embeddings ? DType::q8_0 : DType::f32) << what;
        expect_same_weights(hf->weights, gf->weights, what + " hf vs f32 gguf");
        if (aligned || tp == 1) {
          expect_same_weights(ref->weights, hf->weights, what + " hf");
          expect_same_weights(ref->weights, gq->weights, what + " q8_0 gguf");
        } else {
          EXPECT_EQ(hf->weights.layers[0].down_proj.dtype(), DType::f32) << what;
          EXPECT_EQ(hf->weights.layers[0].up_proj.dtype(), DType::q8_0) << what;
        }
      }
    }
  }
}

// Non-f32 storage is read through f32 scratch a slab of rows at a time (scratch_floats): one
// slab or many, GGUF (Q/K rows un-permuted per slab) or safetensors, the same bytes.
TEST(LoadScratch, Bf16SameBytesInOneSlabOrMany) {
  for (const char* args : {"--arch llama --no-tie --seed 1", "--arch qwen2 --tie --seed 3 --hidden 48 --head-dim 16"}) {
    TempDir dir("slabs");
    ASSERT_TRUE(snap::testing::make_tiny_checkpoint(dir.path(), args));
    LoadOptions whole;
    ASSERT_TRUE(apply_weight_dtype("bf16", &whole).ok());
    LoadOptions slabs = whole;
    slabs.scratch_floats = 100;  // one or two rows at a time
    Result<LoadedModel> a = load_model(dir / "model.gguf", whole);
    Result<LoadedModel> b = load_model(dir / "model.gguf", slabs);
    Result<LoadedModel> c = load_model(dir / "hf", slabs);
    ASSERT_TRUE(a.ok() && b.ok() && c.ok()) << args;
    EXPECT_EQ(a->weights.layers[0].q_proj.dtype(), DType::bf16);
    expect_same_weights(a->weights, b->weights, std::string(args) + " gguf slabs");
    expect_same_weights(a->weights, c->weights, std::string(args) + " hf slabs");
  }
}

// Rounding as ggml's: d = amax / 127, q = round half away from zero (x / d); a zero block is
// d = 0, q = 0; a NaN or infinity refuses (no block holds one); the loader names the tensor.
TEST(QuantizeAtLoad, Q8_0RoundsAsGgmlAndRefusesNonFinite) {
  float x[64] = {};
  x[0] = 127.0f;  // d = 1
  x[1] = 2.5f;    // ties away from zero: 3, not 2
  x[2] = -2.5f;
  x[3] = -0.49f;
  uint8_t blocks[68];
  ASSERT_TRUE(quantize_q8_0(x, blocks, 64));
  uint16_t d;
  std::memcpy(&d, blocks, 2);
  EXPECT_EQ(f16_to_f32(d), 1.0f);
  EXPECT_EQ(static_cast<int8_t>(blocks[2]), 127);
  EXPECT_EQ(static_cast<int8_t>(blocks[3]), 3);
  EXPECT_EQ(static_cast<int8_t>(blocks[4]), -3);
  EXPECT_EQ(static_cast<int8_t>(blocks[5]), 0);
  std::memcpy(&d, blocks + 34, 2);  // the second block is all zeros
  EXPECT_EQ(d, 0);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(blocks[36 + j], 0);
  x[40] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_FALSE(quantize_q8_0(x, blocks, 64));
  x[40] = std::numeric_limits<float>::infinity();
  EXPECT_FALSE(quantize_q8_0(x, blocks, 64));

  TempDir dir("q8nan");
  ASSERT_TRUE(snap::testing::make_tiny_checkpoint(dir.path(), "--arch llama --no-tie --seed 1 --no-gguf"));
  // Poison weight [1, 6] of layer 1's up_proj ([96, 64] f32, little-endian) in the safetensors file.
  const std::string file = dir / "hf/model.safetensors";
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  uint64_t header_len = 0;
  f.read(reinterpret_cast<char*>(&header_len), 8);
  std::string header(header_len, '\0');
  f.read(header.data(), static_cast<std::streamsize>(header_len));
  const auto meta = nlohmann::json::parse(header)["model.layers.1.mlp.up_proj.weight"];
  const float nan = std::numeric_limits<float>::quiet_NaN();
  f.seekp(static_cast<std::streamoff>(8 + header_len + meta["data_offsets"][0].get<uint64_t>() + 4 * 70));
  f.write(reinterpret_cast<const char*>(&nan), 4);
  f.close();
  LoadOptions quantize;
  ASSERT_TRUE(apply_weight_dtype("q8_0", &quantize).ok());
  Result<LoadedModel> m = load_model(dir / "hf", quantize);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::k_data_loss);
  EXPECT_NE(m.status().message().find("tensor 'model.layers.1.mlp.up_proj.weight' holds a NaN or infinite value "
                                      "(row 1): it cannot be quantized to q8_0"),
            std::string::npos)
      << m.status().message();
  EXPECT_TRUE(load_model(dir / "hf", LoadOptions{}).ok());  // f32 keeps what the file says
  EXPECT_FALSE(apply_weight_dtype("q4_k", &quantize).ok());
}

// A GGUF mixing Q4_K, Q6_K and Q5_0 as llama.cpp's Q4_K_M (make_tiny_checkpoint.py --gguf-type
// q4_k_m; tied Q4_K table), its Q5_K_M twin (Q5_K for Q4_K), a Q3_K_M mix (Q3_K, Q4_K for v and o),
// a Q2_K mix (Q2_K, Q3_K for v) and an all-Q5_1 file: the default load (keep_quantized, the CPU's
// and the device's: both read every format, dtype_cpu_blocks) keeps those matrices in the file's
// blocks (the Q/K rows un-permuted as whole rows); each kept matrix dequantized equals the f32
// load's (keep_quantized off), bit for bit, at tp 1 and on both ranks of tp 2 (where down_proj's
// 304-column slices are off the block grid, and o_proj's 128 off the K formats' 256: f32 in both).
TEST(DeviceBlocks, KQuantsKeptInTheirBlocks) {
  struct Mix {
    const char* gguf_type;
    DType k, v, o, down, o_tp2;  // most matrices' (q_proj, the tied table), v_proj's, o_proj's, down_proj's, o_proj's at tp 2
  };
  const DType f32 = DType::f32;
  for (const Mix mix : {Mix{"q4_k_m", DType::q4_k, DType::q6_k, DType::q4_k, DType::q5_0, f32},
                        Mix{"q5_k_m", DType::q5_k, DType::q6_k, DType::q5_k, DType::q5_0, f32},
                        Mix{"q3_k_m", DType::q3_k, DType::q4_k, DType::q4_k, DType::q5_0, f32},
                        Mix{"q2_k", DType::q2_k, DType::q3_k, DType::q2_k, DType::q5_0, f32},
                        Mix{"q5_1", DType::q5_1, DType::q5_1, DType::q5_1, DType::q5_1, DType::q5_1}}) {
    const DType k = mix.k;
    TempDir dir("kquant");
    ASSERT_TRUE(snap::testing::make_tiny_checkpoint(
        dir.path(), std::string("--arch llama --hidden 256 --heads 8 --kv-heads 2 --head-dim 32 --intermediate 608 --tie "
                                "--seed 13 --gguf-type ") + mix.gguf_type));
    for (int tp : {1, 2}) {
      for (int rank = 0; rank < tp; ++rank) {
        const std::string what = std::string(dtype_name(k)) + " tp " + std::to_string(tp) + " rank " + std::to_string(rank);
        LoadOptions blocks;
        blocks.matvec_tiles = false;
        blocks.tp_rank = rank;
        blocks.tp_size = tp;
        LoadOptions f32s = blocks;
        f32s.keep_quantized = false;
        Result<LoadedModel> c = load_model(dir / "model.gguf", f32s);
        Result<LoadedModel> d = load_model(dir / "model.gguf", blocks);
        ASSERT_TRUE(c.ok() && d.ok()) << what;
        const LayerWeights& dl = d->weights.layers[0];
        EXPECT_EQ(dl.q_proj.dtype(), k) << what;
        EXPECT_EQ(dl.v_proj.dtype(), mix.v) << what;
        EXPECT_EQ(dl.o_proj.dtype(), tp == 1 ? mix.o : mix.o_tp2) << what;
        EXPECT_EQ(dl.down_proj.dtype(), tp == 1 ? mix.down : DType::f32) << what;
        EXPECT_EQ(d->weights.output().dtype(), k) << what;
        // The tied table is whole on every rank; a rank's kept LM head is a copy of its vocabulary
        // rows (the f32 load reads them from the table: offset vocab_begin).
        std::vector<std::pair<const Matrix*, const Matrix*>> pairs = {{&d->weights.embed, &c->weights.embed},
                                                                     {&d->weights.output(), &c->weights.output()}};
        for (size_t l = 0; l < d->weights.layers.size(); ++l) {
          const LayerWeights& a = d->weights.layers[l];
          const LayerWeights& b = c->weights.layers[l];
          for (auto [x, y] : {std::pair{&a.q_proj, &b.q_proj}, {&a.k_proj, &b.k_proj}, {&a.v_proj, &b.v_proj},
                              {&a.o_proj, &b.o_proj}, {&a.gate_proj, &b.gate_proj}, {&a.up_proj, &b.up_proj},
                              {&a.down_proj, &b.down_proj}})
            pairs.emplace_back(x, y);
        }
        int kept = 0;
        for (auto [x, y] : pairs) {
          ASSERT_EQ(y->dtype(), DType::f32) << what;
          const bool head_rows = x->rows() != y->rows();  // a rank's LM head: its rows of the table
          if (head_rows) {
            ASSERT_EQ(x->rows(), d->shard.vocab_size) << what;
          }
          const int64_t from = head_rows ? d->shard.vocab_begin : 0;
          ASSERT_EQ(x->cols(), y->cols()) << what;
          std::vector<float> v(static_cast<size_t>(x->rows() * x->cols()));
          if (x->dtype() == DType::f32) {
            std::memcpy(v.data(), x->f32(), v.size() * 4);
          } else {
            ++kept;
            ASSERT_TRUE(dequantize(ggml_type_of(x->dtype()), x->data(), v.data(), x->rows() * x->cols()).ok()) << what;
          }
          ASSERT_EQ(std::memcmp(v.data(), y->f32() + from * y->cols(), v.size() * 4), 0)
              << what << ": a " << dtype_name(x->dtype()) << " matrix";
        }
        EXPECT_GE(kept, tp == 1 ? 16 : 12) << what;
      }
    }
  }
}

// ---------------------------------------------------------------------------
// The default model

// The default model fully dequantized to f32 (native = false) or with its blocks kept
// (native = true, the default LoadOptions); each loaded once.
const LoadedModel& default_model(bool native) {
  const auto load = [native] {
    const std::string path = snap::testing::default_model_path();
    LoadOptions opts;
    opts.keep_quantized = native;
    return new Result<LoadedModel>(std::filesystem::exists(path)
                                       ? load_model(path, opts)
                                       : Result<LoadedModel>(not_found(path + ": default model not found; "
                                                                       "set SNAP_MODEL or run scripts/setup.sh")));
  };
  static const Result<LoadedModel>* f32 = nullptr;
  static const Result<LoadedModel>* blocks = nullptr;
  const Result<LoadedModel>*& m = native ? blocks : f32;
  if (!m) m = load();
  if (!m->ok()) ADD_FAILURE() << m->status().to_string();
  return m->value();
}

TEST(DefaultModel, LoadsWithExpectedConfig) {
  const std::string path = snap::testing::default_model_path();
  ASSERT_TRUE(std::filesystem::exists(path)) << path << " missing: set SNAP_MODEL or run scripts/setup.sh";
  const LoadedModel& m = default_model(false);
  const ModelConfig& c = m.config;
  EXPECT_EQ(c.arch, Arch::llama);
  EXPECT_EQ(c.num_layers, 30);
  EXPECT_EQ(c.hidden_size, 576);
  EXPECT_EQ(c.intermediate_size, 1536);
  EXPECT_EQ(c.num_heads, 9);
  EXPECT_EQ(c.num_kv_heads, 3);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.vocab_size, 49152);
  EXPECT_EQ(c.rope.theta, 100000.0f);
  EXPECT_EQ(c.rope.scaling, kernels::RopeScaling::none);
  EXPECT_EQ(c.max_position, 8192);
  EXPECT_FLOAT_EQ(c.rms_norm_eps, 1e-5f);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_EQ(c.eos_token_ids, std::vector<int32_t>{2});
  EXPECT_TRUE(m.weights.lm_head.empty());
  EXPECT_EQ(m.weights.embed.rows(), 49152);
  EXPECT_EQ(m.weights.layers.size(), 30u);
  // 134.5M parameters, all f32.
  EXPECT_EQ(m.weights.nbytes(), int64_t{134515008} * 4);
}

const Matrix* find_matrix(const ModelWeights& w, const std::string& gguf_name) {
  if (gguf_name == "token_embd.weight") return &w.embed;
  if (gguf_name == "output_norm.weight") return &w.final_norm;
  int layer = -1;
  char field[64] = {};
  if (std::sscanf(gguf_name.c_str(), "blk.%d.%63s", &layer, field) != 2) return nullptr;
  if (layer < 0 || static_cast<size_t>(layer) >= w.layers.size()) return nullptr;
  const LayerWeights& l = w.layers[static_cast<size_t>(layer)];
  const std::string f = field;
  if (f == "attn_q.weight") return &l.q_proj;
  if (f == "attn_k.weight") return &l.k_proj;
  if (f == "attn_v.weight") return &l.v_proj;
  if (f == "attn_output.weight") return &l.o_proj;
  if (f == "ffn_gate.weight") return &l.gate_proj;
  if (f == "ffn_up.weight") return &l.up_proj;
  if (f == "ffn_down.weight") return &l.down_proj;
  if (f == "attn_norm.weight") return &l.attn_norm;
  if (f == "ffn_norm.weight") return &l.ffn_norm;
  return nullptr;
}

TEST(DefaultModel, DequantizedValuesMatchGgufPackage) {
  const std::string path = snap::testing::default_model_path();
  ASSERT_TRUE(std::filesystem::exists(path)) << path << " missing: set SNAP_MODEL or run scripts/setup.sh";
  std::ifstream in(SNAP_SOURCE_DIR "/tests/fixtures/smollm2_weight_spotcheck.json");
  ASSERT_TRUE(in) << "missing fixture; run tools/make_weight_spotcheck.py";
  const nlohmann::json doc = nlohmann::json::parse(in);
  const ModelWeights& w = default_model(false).weights;
  ASSERT_GE(doc["entries"].size(), 10u);
  for (const auto& e : doc["entries"]) {
    const std::string name = e["tensor"];
    const Matrix* m = find_matrix(w, name);
    ASSERT_NE(m, nullptr) << name;
    const int64_t row = e["row"];
    const int64_t col = e["col"];
    const auto& values = e["values"];
    ASSERT_LT(row, m->rows()) << name;
    ASSERT_LE(col + static_cast<int64_t>(values.size()), m->cols()) << name;
    for (size_t k = 0; k < values.size(); ++k) {
      const float want = values[k].get<float>();
      const float got = m->f32()[row * m->cols() + col + static_cast<int64_t>(k)];
      EXPECT_EQ(got, want) << name << " (" << e["type"].get<std::string>() << ") [" << row << ", "
                           << col + static_cast<int64_t>(k) << "]";
    }
  }
}

// Default LoadOptions keep the file's blocks: q4_1 projections and the q8_0 embedding table,
// which is also the (tied) LM head — no f32 copy of the table; per decoded token that reads
// ~1/5 of the f32 model's bytes. Looked-up rows equal the dequantized table's bit for bit.
TEST(DefaultModel, LoadsNativeBlocksByDefault) {
  const std::string path = snap::testing::default_model_path();
  ASSERT_TRUE(std::filesystem::exists(path)) << path << " missing: set SNAP_MODEL or run scripts/setup.sh";
  EXPECT_TRUE(LoadOptions{}.keep_quantized);
  const ModelWeights& q = default_model(true).weights;
  const ModelWeights& f = default_model(false).weights;
  const int64_t vocab = 49152, hidden = 576;
  ASSERT_EQ(q.embed.dtype(), DType::q8_0);
  EXPECT_EQ(q.embed.rows(), vocab);
  EXPECT_EQ(q.embed.cols(), hidden);
  EXPECT_EQ(q.final_norm.dtype(), DType::f32);
  EXPECT_TRUE(q.lm_head.empty());
  EXPECT_EQ(&q.output(), &q.embed);
  EXPECT_EQ(f.embed.dtype(), DType::f32);
  int64_t expect = q.final_norm.nbytes() + vocab * (hidden / 32) * 34;
  for (const LayerWeights& l : q.layers) {
    for (const Matrix* m : {&l.q_proj, &l.k_proj, &l.v_proj, &l.o_proj, &l.gate_proj, &l.up_proj, &l.down_proj}) {
      EXPECT_EQ(m->dtype(), DType::q4_1);
      expect += m->rows() * (m->cols() / 32) * 20;
    }
    EXPECT_EQ(l.attn_norm.dtype(), DType::f32);
    expect += l.attn_norm.nbytes() + l.ffn_norm.nbytes();
  }
  EXPECT_EQ(q.nbytes(), expect);
  // Bytes a decode step streams: everything (in both, the table is the head).
  const double streamed_native = static_cast<double>(q.nbytes());
  const double streamed_f32 = static_cast<double>(f.nbytes());
  EXPECT_LT(streamed_native / streamed_f32, 0.2);
  EXPECT_GT(streamed_native / streamed_f32, 0.15);
  // The decode matvec's matrices are in its 4-row tiles where it reads them (the tied table too).
  const kernels::WeightLayout want_layout =
      kernels::weight_tiles4_wanted(DType::q8_0) ? kernels::WeightLayout::tiles4 : kernels::WeightLayout::rows;
  EXPECT_EQ(q.embed.layout(), want_layout);
  EXPECT_EQ(q.layers[3].gate_proj.layout(), want_layout);
  // Rows of the q8_0 table unpacked and dequantized one at a time (as LlamaForward::embed looks
  // them up) equal the f32 table's rows.
  const int64_t row_bytes = dtype_row_bytes(DType::q8_0, hidden);
  std::vector<float> x(hidden);
  std::vector<uint8_t> row(static_cast<size_t>(row_bytes));
  for (int32_t id : {0, 1, 2, 17, 4242, 49151}) {
    kernels::weight_tiles4_unpack_rows(q.embed.view(), id, 1, row.data());
    ASSERT_TRUE(dequantize(GgmlType::q8_0, row.data(), x.data(), hidden).ok());
    for (int64_t i = 0; i < hidden; ++i) ASSERT_EQ(x[i], f.embed.f32()[id * hidden + i]) << "token " << id << " dim " << i;
  }
}

// matmul_cpu on the kept blocks equals matmul_cpu on the same tensor dequantized by
// worker/model/dequant.cpp (bit-exact with the gguf package), for permuted (q_proj) and
// plain q4_1 matrices and the q8_0 head, on the matvec (1, 3, 4 tokens) and sgemm (40)
// paths at every SIMD level. Both see identical weights, so only the f32 summation order
// may differ: x ∈ [-1, 1], ≤ 1536 terms ⇒ ≲ 1e-6 of max |y|; 1e-5 normalized.
TEST(DefaultModel, NativeMatmulEqualsDequantizedMatmul) {
  const std::string path = snap::testing::default_model_path();
  ASSERT_TRUE(std::filesystem::exists(path)) << path << " missing: set SNAP_MODEL or run scripts/setup.sh";
  const ModelWeights& q = default_model(true).weights;
  const ModelWeights& f = default_model(false).weights;
  ASSERT_EQ(q.layers.size(), f.layers.size());
  const size_t last = q.layers.size() - 1;
  const std::pair<const Matrix*, const Matrix*> pairs[] = {
      {&q.layers[0].q_proj, &f.layers[0].q_proj},       {&q.layers[0].k_proj, &f.layers[0].k_proj},
      {&q.layers[last].gate_proj, &f.layers[last].gate_proj}, {&q.layers[last].down_proj, &f.layers[last].down_proj},
      {&q.output(), &f.embed},
  };
  std::mt19937 gen(42);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<kernels::SimdLevel> levels{kernels::SimdLevel::scalar};
  if (kernels::simd_level_supported() >= kernels::SimdLevel::avx2) levels.push_back(kernels::SimdLevel::avx2);
  if (kernels::simd_level_supported() >= kernels::SimdLevel::avx512) levels.push_back(kernels::SimdLevel::avx512);
  for (const auto& [native, dense] : pairs) {
    ASSERT_NE(native->dtype(), DType::f32);
    ASSERT_EQ(dense->dtype(), DType::f32);
    ASSERT_EQ(native->rows(), dense->rows());
    ASSERT_EQ(native->cols(), dense->cols());
    for (int64_t num_tokens : {1, 3, 4, 40}) {
      std::vector<float> x(static_cast<size_t>(num_tokens * native->cols()));
      for (float& v : x) v = dist(gen);
      const size_t n = static_cast<size_t>(num_tokens * native->rows());
      for (kernels::SimdLevel level : levels) {
        kernels::simd_level_override(level);
        std::vector<float> got(n), want(n);
        kernels::matmul_cpu(x.data(), native->view(), nullptr, got.data(), num_tokens);
        kernels::matmul_cpu(x.data(), dense->view(), nullptr, want.data(), num_tokens);
        double max_ref = 1.0;
        for (float v : want) max_ref = std::max(max_ref, std::fabs(static_cast<double>(v)));
        int bad = 0;
        for (size_t i = 0; i < n && bad < 5; ++i) {
          const double err = std::fabs(static_cast<double>(got[i]) - want[i]) / max_ref;
          if (!(err <= 1e-5)) {
            ++bad;
            ADD_FAILURE() << dtype_name(native->dtype()) << " " << native->rows() << "x" << native->cols()
                          << " tokens " << num_tokens << " level " << static_cast<int>(level) << " [" << i
                          << "]: native " << got[i] << " vs dequantized " << want[i];
          }
        }
      }
      kernels::simd_level_override(kernels::simd_level_supported());
    }
  }
}

}  // namespace
}  // namespace snap
