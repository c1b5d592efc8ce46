// Every CUDA op against its CPU reference over ONE table of ops x awkward shapes (the ggml
// test-backend-ops habit): each row names op and shape, runs the CUDA twin and the reference
// on the same inputs, and compares by normalized max error (|got − want| / max(1, max|want|),
// NaN never passes, first mismatches printed). Without a usable GPU the binary prints why and
// exits 77, which ctest reports as skipped. Tolerances, stated per op in the table:
//   exact (0)   gathers, residual add, bf16 conversion, argmax: no arithmetic to differ in.
//   1e-6..1e-5  f32 element-wise ops (rms_norm 1e-5: a 5125-term f32 sum of squares).
//   1e-4        GEMMs on bf16-exact inputs and attention: the reference sums in f64, the GPU in
//               f32 (error ~ sqrt(K)·2^-24 relative, ~1e-6 at K = 14336; 1e-4 leaves margin
//               for the worst-case K·2^-24 = 8.5e-4 growth that random signs do not reach).
//   1e-2        the cuBLAS path against UNROUNDED f32 activations: bf16 keeps 8 significant bits
//               (2^-9 relative per element), random-sign errors grow as sqrt(K) like the sum.
// Batch invariance is checked bitwise: a decode row alone equals the same row in a batch.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iterator>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "kernels/attention_paged.h"
#include "kernels/cpu/geglu.h"
#include "kernels/cuda/block_split.h"
#include "kernels/cuda/kernels_cuda.h"
#include "kernels/kernels.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/kernels/kernel_test_util.h"
#include "worker/kv/selection.h"
#include "worker/model/dequant.h"

namespace snap::kernels {
namespace {

using ::testing::AssertionFailure;
using ::testing::AssertionResult;
using ::testing::AssertionSuccess;

using namespace cuda_test;  // NOLINT: the shared test pieces (cuda_test_util.h)

AssertionResult bitwise_equal(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size()) return AssertionFailure() << "sizes " << got.size() << " vs " << want.size();
  for (size_t i = 0; i < got.size(); ++i)
    if (f32_to_bits(got[i]) != f32_to_bits(want[i]))
      return AssertionFailure() << "first bit difference at [" << i << "]: " << got[i] << " vs " << want[i];
  return AssertionSuccess();
}

// --- the table ------------------------------------------------------------------------------

struct OpCase {
  std::string name;  // op_shape, the gtest parameter name
  std::function<AssertionResult()> run;
};

void add_rms_norm(std::vector<OpCase>& t) {
  for (int64_t hidden : {7, 83, 576, 769, 5125})
    for (int64_t tokens : {1, 3, 17, 128})
      t.push_back({"rms_norm_h" + std::to_string(hidden) + "_t" + std::to_string(tokens), [=]() -> AssertionResult {
                     const auto x = test::random_floats(tokens * hidden, 1, -3.0f, 3.0f);
                     const auto w = test::random_floats(hidden, 2, 0.5f, 1.5f);
                     std::vector<float> want(x.size());
                     rms_norm_ref(x.data(), w.data(), want.data(), tokens, hidden, 1e-5f);
                     DeviceBuffer<float> dx(x), dw(w), dy(x.size());
                     rms_norm_cuda(dx.ptr, dw.ptr, dy.ptr, tokens, hidden, 1e-5f, nullptr);
                     if (auto r = sync_ok(); !r) return r;
                     const auto got = dy.to_host();
                     return test::all_close(got.data(), want.data(), static_cast<int64_t>(got.size()), 1e-5);
                   }});
}

void add_rope(std::vector<OpCase>& t) {
  struct Scaling {
    const char* name;
    RopeConfig cfg;
  };
  std::vector<Scaling> scalings(3);
  scalings[0].name = "none";
  scalings[1].name = "linear";
  scalings[1].cfg.scaling = RopeScaling::linear;
  scalings[1].cfg.factor = 2.0f;
  scalings[2].name = "llama3";
  scalings[2].cfg.theta = 500000.0f;
  scalings[2].cfg.scaling = RopeScaling::llama3;
  scalings[2].cfg.factor = 8.0f;
  for (const Scaling& s : scalings)
    for (int head_dim : {64, 128})
      for (int heads : {1, 3, 9})
        for (int64_t tokens : {1, 17, 128}) {
          RopeConfig cfg = s.cfg;
          cfg.head_dim = head_dim;
          t.push_back({std::string("rope_") + s.name + "_d" + std::to_string(head_dim) + "_h" + std::to_string(heads) +
                           "_t" + std::to_string(tokens),
                       [=]() -> AssertionResult {
                         const std::vector<float> inv = rope_inv_freq(cfg);
                         std::vector<int32_t> pos(static_cast<size_t>(tokens));
                         for (int64_t i = 0; i < tokens; ++i) pos[i] = static_cast<int32_t>((i * 7919) % 131072);
                         const auto x = test::random_floats(tokens * heads * head_dim, 5, -2.0f, 2.0f);
                         std::vector<float> want = x;
                         rope_ref(want.data(), pos.data(), tokens, heads, head_dim, inv.data());
                         DeviceBuffer<float> dx(x), dinv(inv);
                         DeviceBuffer<int32_t> dpos(pos);
                         rope_cuda(dx.ptr, dpos.ptr, tokens, heads, head_dim, dinv.ptr, nullptr);
                         if (auto r = sync_ok(); !r) return r;
                         const auto got = dx.to_host();
                         if (auto c = test::all_close(got.data(), want.data(), static_cast<int64_t>(got.size()), 1e-6); !c)
                           return c;
                         // q and k in one launch (k: 2 heads of other values): each the bits of its own rope_cuda.
                         const auto kx = test::random_floats(tokens * 2 * head_dim, 6, -2.0f, 2.0f);
                         DeviceBuffer<float> dq(x), dk(kx), dk_alone(kx);
                         rope_qk_cuda(dq.ptr, heads, dk.ptr, 2, dpos.ptr, tokens, head_dim, dinv.ptr, nullptr);
                         rope_cuda(dk_alone.ptr, dpos.ptr, tokens, 2, head_dim, dinv.ptr, nullptr);
                         if (auto r = sync_ok(); !r) return r;
                         if (auto c = bitwise_equal(dq.to_host(), got); !c) return c << " (rope_qk_cuda q)";
                         return bitwise_equal(dk.to_host(), dk_alone.to_host()) << " (rope_qk_cuda k)";
                       }});
        }
}

void add_elementwise(std::vector<OpCase>& t) {
  for (int64_t n : {1, 7, 83, 769, 5125, 100003}) {
    t.push_back({"swiglu_n" + std::to_string(n), [=]() -> AssertionResult {
                   const auto gate = test::random_floats(n, 1, -30.0f, 30.0f);
                   const auto up = test::random_floats(n, 2, -2.0f, 2.0f);
                   std::vector<float> want(static_cast<size_t>(n));
                   swiglu_ref(gate.data(), up.data(), want.data(), n);
                   DeviceBuffer<float> dg(gate), du(up), dout(static_cast<size_t>(n));
                   swiglu_cuda(dg.ptr, du.ptr, dout.ptr, n, nullptr);
                   if (auto r = sync_ok(); !r) return r;
                   const auto got = dout.to_host();
                   return test::all_close(got.data(), want.data(), n, 2e-6);
                 }});
    // GeGLU against the f64 reference: gates over the range where tanh bends and saturates
    // (|inner| > 9 rounds to ±1 in f32), up of both signs; out aliasing gate as the forward calls it.
    t.push_back({"geglu_n" + std::to_string(n), [=]() -> AssertionResult {
                   const auto gate = test::random_floats(n, 11, -12.0f, 12.0f);
                   const auto up = test::random_floats(n, 12, -2.0f, 2.0f);
                   std::vector<float> want(static_cast<size_t>(n));
                   geglu_ref(gate.data(), up.data(), want.data(), n);
                   DeviceBuffer<float> dg(gate), du(up);
                   geglu_cuda(dg.ptr, du.ptr, dg.ptr, n, nullptr);
                   if (auto r = sync_ok(); !r) return r;
                   const auto got = dg.to_host();
                   return test::all_close(got.data(), want.data(), n, 2e-6);
                 }});
    t.push_back({"scale_n" + std::to_string(n), [=]() -> AssertionResult {
                   const auto x = test::random_floats(n, 13, -5.0f, 5.0f);
                   const float s = 25.298221f;  // Gemma 3 270M's sqrt(640)
                   std::vector<float> want(x);
                   for (float& v : want) v *= s;
                   DeviceBuffer<float> dx(x);
                   scale_cuda(dx.ptr, s, n, nullptr);
                   if (auto r = sync_ok(); !r) return r;
                   return bitwise_equal(dx.to_host(), want);
                 }});
    t.push_back({"residual_add_n" + std::to_string(n), [=]() -> AssertionResult {
                   const auto x = test::random_floats(n, 3, -5.0f, 5.0f);
                   const auto y = test::random_floats(n, 4, -5.0f, 5.0f);
                   std::vector<float> want(x);
                   for (int64_t i = 0; i < n; ++i) want[i] += y[i];
                   DeviceBuffer<float> dx(x), dy(y);
                   residual_add_cuda(dx.ptr, dy.ptr, n, nullptr);
                   if (auto r = sync_ok(); !r) return r;
                   return bitwise_equal(dx.to_host(), want);
                 }});
    t.push_back({"f32_to_bf16_n" + std::to_string(n), [=]() -> AssertionResult {
                   auto x = test::random_floats(n, 6, -100.0f, 100.0f);
                   if (n > 3) {  // exact ties: round half to even both ways, and an overflow to inf
                     x[0] = bits_to_f32(0x3F808000u);
                     x[1] = bits_to_f32(0x3F818000u);
                     x[2] = 3.4e38f;
                   }
                   const std::vector<uint16_t> want = to_bf16(x);
                   DeviceBuffer<float> dx(x);
                   DeviceBuffer<uint16_t> dy(static_cast<size_t>(n));
                   f32_to_bf16_cuda(dx.ptr, as_bf16(dy.ptr), n, nullptr);
                   if (auto r = sync_ok(); !r) return r;
                   const auto got = dy.to_host();
                   for (int64_t i = 0; i < n; ++i)
                     if (got[i] != want[i])
                       return AssertionFailure() << "[" << i << "] " << x[i] << ": got 0x" << std::hex << got[i]
                                                 << " want 0x" << want[i];
                   return AssertionSuccess();
                 }});
    t.push_back({"bf16_to_f32_n" + std::to_string(n), [=]() -> AssertionResult {
                   const std::vector<uint16_t> x = to_bf16(test::random_floats(n, 7, -100.0f, 100.0f));
                   DeviceBuffer<uint16_t> dx(x);
                   DeviceBuffer<float> dy(static_cast<size_t>(n));
                   bf16_to_f32_cuda(as_bf16(dx.ptr), dy.ptr, n, nullptr);
                   if (auto r = sync_ok(); !r) return r;
                   std::vector<float> want(static_cast<size_t>(n));
                   for (int64_t i = 0; i < n; ++i) want[i] = bf16_to_f32(x[i]);
                   return bitwise_equal(dy.to_host(), want);
                 }});
  }
}

void add_embedding(std::vector<OpCase>& t) {
  for (int64_t vocab : {7, 1000})
    for (int64_t hidden : {7, 83, 576, 4096})
      for (int64_t tokens : {1, 17}) {
        t.push_back({"embedding_v" + std::to_string(vocab) + "_h" + std::to_string(hidden) + "_t" + std::to_string(tokens),
                     [=]() -> AssertionResult {
                       const auto table = to_bf16(test::random_floats(vocab * hidden, 7, -1.0f, 1.0f));
                       std::vector<int32_t> ids(static_cast<size_t>(tokens));
                       for (int64_t i = 0; i < tokens; ++i) ids[i] = static_cast<int32_t>((i * 31 + vocab - 1) % vocab);
                       std::vector<float> want(static_cast<size_t>(tokens * hidden));
                       for (int64_t i = 0; i < tokens; ++i)
                         for (int64_t c = 0; c < hidden; ++c) want[i * hidden + c] = bf16_to_f32(table[ids[i] * hidden + c]);
                       DeviceBuffer<uint16_t> dt(table);
                       DeviceBuffer<int32_t> di(ids);
                       DeviceBuffer<float> dout(want.size());
                       embedding_gather_cuda(as_bf16(dt.ptr), di.ptr, tokens, hidden, vocab, dout.ptr, nullptr);
                       if (auto r = sync_ok(); !r) return r;
                       return bitwise_equal(dout.to_host(), want);
                     }});
      }
  t.push_back({"embedding_bad_id_is_nan", []() -> AssertionResult {
                 const auto table = to_bf16(test::random_floats(10 * 16, 7));
                 const std::vector<int32_t> ids{3, 10, -1};
                 DeviceBuffer<uint16_t> dt(table);
                 DeviceBuffer<int32_t> di(ids);
                 DeviceBuffer<float> dout(3 * 16);
                 embedding_gather_cuda(as_bf16(dt.ptr), di.ptr, 3, 16, 10, dout.ptr, nullptr);
                 if (auto r = sync_ok(); !r) return r;
                 const auto got = dout.to_host();
                 for (int c = 0; c < 16; ++c) {
                   if (got[c] != bf16_to_f32(table[3 * 16 + c])) return AssertionFailure() << "row 0 col " << c;
                   if (!std::isnan(got[16 + c]) || !std::isnan(got[32 + c]))
                     return AssertionFailure() << "an out-of-range id must give NaN, col " << c;
                 }
                 return AssertionSuccess();
               }});
}

struct GemmShape {
  int64_t tokens, rows, cols;
  bool bias;
};
const GemmShape k_gemm_shapes[] = {{1, 7, 83, false},    {3, 83, 576, true},    {17, 769, 576, false},
                                   {128, 576, 1536, true}, {9, 1000, 14336, false}, {33, 5125, 64, true},
                                   {2, 37, 1288, true}};  // 161 16-byte chunks per row: lanes get 5 or 6

std::string gemm_name(const char* op, const GemmShape& s) {
  return std::string(op) + "_t" + std::to_string(s.tokens) + "_r" + std::to_string(s.rows) + "_c" +
         std::to_string(s.cols) + (s.bias ? "_bias" : "");
}

void add_matmul(std::vector<OpCase>& t) {
  for (const GemmShape& s : k_gemm_shapes) {
    t.push_back({gemm_name("matmul_bf16_cublas", s), [=]() -> AssertionResult {
                   const auto x = test::random_floats(s.tokens * s.cols, 11, -1.0f, 1.0f);
                   const auto wb = to_bf16(test::random_floats(s.rows * s.cols, 12, -1.0f, 1.0f));
                   const auto bias = test::random_floats(s.rows, 13, -1.0f, 1.0f);
                   const auto xb = to_bf16(x);
                   const WeightView w{DType::bf16, wb.data(), s.rows, s.cols};
                   std::vector<float> want(static_cast<size_t>(s.tokens * s.rows)), want_f32 = want;
                   const std::vector<float> xr = from_bf16(xb);  // what the GEMM multiplies
                   matmul_ref(xr.data(), w, s.bias ? bias.data() : nullptr, want.data(), s.tokens);
                   matmul_ref(x.data(), w, s.bias ? bias.data() : nullptr, want_f32.data(), s.tokens);
                   cublasHandle_t h = nullptr;
                   if (cublas_create(&h) != CUBLAS_STATUS_SUCCESS)
                     return AssertionFailure() << "cublasCreate failed " << cublas_load_error();
                   DeviceBuffer<uint16_t> dx(xb), dw(wb);
                   DeviceBuffer<float> db(bias), dy(want.size());
                   const cublasStatus_t st = matmul_bf16_cuda(h, as_bf16(dx.ptr), as_bf16(dw.ptr), s.bias ? db.ptr : nullptr,
                                                              dy.ptr, s.tokens, s.rows, s.cols, nullptr);
                   auto r = sync_ok();
                   cublas_destroy(h);
                   if (st != CUBLAS_STATUS_SUCCESS) return AssertionFailure() << "cublasGemmEx status " << st;
                   if (!r) return r;
                   const auto got = dy.to_host();
                   const int64_t n = static_cast<int64_t>(got.size());
                   if (auto c = test::all_close(got.data(), want.data(), n, 1e-4); !c) return c << " (bf16-exact inputs)";
                   if (auto c = test::all_close(got.data(), want_f32.data(), n, 1e-2); !c) return c << " (vs f32 activations)";
                   return AssertionSuccess();
                 }});
    t.push_back({gemm_name("matmul_rowwise", s), [=]() -> AssertionResult {
                   const auto x = test::random_floats(s.tokens * s.cols, 21, -1.0f, 1.0f);
                   const auto wb = to_bf16(test::random_floats(s.rows * s.cols, 22, -1.0f, 1.0f));
                   const auto bias = test::random_floats(s.rows, 23, -1.0f, 1.0f);
                   const WeightView w{DType::bf16, wb.data(), s.rows, s.cols};
                   std::vector<float> want(static_cast<size_t>(s.tokens * s.rows));
                   matmul_ref(x.data(), w, s.bias ? bias.data() : nullptr, want.data(), s.tokens);
                   DeviceBuffer<float> dx(x), db(bias), dy(want.size()), dy1(static_cast<size_t>(s.rows));
                   DeviceBuffer<uint16_t> dw(wb);
                   const float* bp = s.bias ? db.ptr : nullptr;
                   matmul_rowwise_cuda(dx.ptr, as_bf16(dw.ptr), bp, dy.ptr, s.tokens, s.rows, s.cols, nullptr);
                   if (auto r = sync_ok(); !r) return r;
                   const auto got = dy.to_host();
                   if (auto c = test::all_close(got.data(), want.data(), static_cast<int64_t>(got.size()), 1e-4); !c)
                     return c;
                   // One load in flight per lane gives the same bits as four (the default).
                   matmul_rowwise_cuda(dx.ptr, as_bf16(dw.ptr), bp, dy.ptr, s.tokens, s.rows, s.cols, nullptr, 1);
                   if (auto r = sync_ok(); !r) return r;
                   if (auto c = bitwise_equal(dy.to_host(), got); !c) return c << " (1 load in flight vs 4)";
                   // Batch invariance: every row alone gives the bits it had in the batch.
                   for (int64_t tok = 0; tok < s.tokens; ++tok) {
                     matmul_rowwise_cuda(dx.ptr + tok * s.cols, as_bf16(dw.ptr), bp, dy1.ptr, 1, s.rows, s.cols, nullptr);
                     if (auto r = sync_ok(); !r) return r;
                     const std::vector<float> row(got.begin() + tok * s.rows, got.begin() + (tok + 1) * s.rows);
                     if (auto c = bitwise_equal(dy1.to_host(), row); !c) return c << " (token " << tok << " alone vs in batch)";
                   }
                   return AssertionSuccess();
                 }});
  }
}

// The fused decode GEMVs give each output the bits of the separate launches: q/k/v-like
// outputs of different heights in one launch (4 outputs: two launches), o_proj/down_proj added
// into the residual stream, gate and up with SwiGLU, and with GeGLU.
void add_matmul_fused(std::vector<OpCase>& t) {
  for (const GemmShape& s : k_gemm_shapes) {
    t.push_back({gemm_name("matmul_rowwise_fused", s), [=]() -> AssertionResult {
                   const auto x = test::random_floats(s.tokens * s.cols, 41, -1.0f, 1.0f);
                   DeviceBuffer<float> dx(x);
                   const int64_t heights[4] = {s.rows, s.rows / 4 + 1, 3, s.rows / 2 + 5};
                   std::vector<std::unique_ptr<DeviceBuffer<uint16_t>>> dw;
                   std::vector<std::unique_ptr<DeviceBuffer<float>>> db, dy, dsep;
                   RowwiseOut outs[4];
                   for (int i = 0; i < 4; ++i) {
                     dw.push_back(std::make_unique<DeviceBuffer<uint16_t>>(
                         to_bf16(test::random_floats(heights[i] * s.cols, 42 + i, -1.0f, 1.0f))));
                     db.push_back(std::make_unique<DeviceBuffer<float>>(test::random_floats(heights[i], 46 + i, -1.0f, 1.0f)));
                     dy.push_back(std::make_unique<DeviceBuffer<float>>(static_cast<size_t>(s.tokens * heights[i])));
                     dsep.push_back(std::make_unique<DeviceBuffer<float>>(static_cast<size_t>(s.tokens * heights[i])));
                     outs[i] = {as_bf16(dw[i]->ptr), (s.bias || i == 2) ? db[i]->ptr : nullptr, dy[i]->ptr, heights[i], {}};
                     matmul_rowwise_cuda(dx.ptr, outs[i].w, outs[i].bias, dsep[i]->ptr, s.tokens, heights[i], s.cols, nullptr);
                   }
                   matmul_rowwise_multi_cuda(dx.ptr, outs, 4, s.tokens, s.cols, nullptr);
                   if (auto r = sync_ok(); !r) return r;
                   for (int i = 0; i < 4; ++i)
                     if (auto c = bitwise_equal(dy[i]->to_host(), dsep[i]->to_host()); !c)
                       return c << " (multi output " << i << " vs its own launch)";
                   // Residual: y += x·w0ᵀ (+ bias) vs matmul_rowwise_cuda then residual_add_cuda.
                   const auto y0 = test::random_floats(s.tokens * s.rows, 50, -3.0f, 3.0f);
                   DeviceBuffer<float> fused(y0), sep(y0);
                   matmul_rowwise_residual_cuda(dx.ptr, outs[0].w, outs[0].bias, fused.ptr, s.tokens, s.rows, s.cols, nullptr);
                   residual_add_cuda(sep.ptr, dsep[0]->ptr, s.tokens * s.rows, nullptr);
                   if (auto r = sync_ok(); !r) return r;
                   if (auto c = bitwise_equal(fused.to_host(), sep.to_host()); !c) return c << " (residual)";
                   // SwiGLU of outputs 0 (gate) and a second matrix of the same height (up).
                   DeviceBuffer<uint16_t> dup(to_bf16(test::random_floats(s.rows * s.cols, 51, -1.0f, 1.0f)));
                   DeviceBuffer<float> up(static_cast<size_t>(s.tokens * s.rows)), gate(up.n), act(up.n), want(up.n);
                   matmul_rowwise_cuda(dx.ptr, outs[0].w, nullptr, gate.ptr, s.tokens, s.rows, s.cols, nullptr);
                   matmul_rowwise_cuda(dx.ptr, as_bf16(dup.ptr), nullptr, up.ptr, s.tokens, s.rows, s.cols, nullptr);
                   swiglu_cuda(gate.ptr, up.ptr, want.ptr, s.tokens * s.rows, nullptr);
                   matmul_rowwise_swiglu_cuda(dx.ptr, outs[0].w, as_bf16(dup.ptr), act.ptr, s.tokens, s.rows, s.cols, nullptr);
                   if (auto r = sync_ok(); !r) return r;
                   if (auto c = bitwise_equal(act.to_host(), want.to_host()); !c) return c << " (swiglu)";
                   geglu_cuda(gate.ptr, up.ptr, want.ptr, s.tokens * s.rows, nullptr);
                   matmul_rowwise_geglu_cuda(dx.ptr, outs[0].w, as_bf16(dup.ptr), act.ptr, s.tokens, s.rows, s.cols, nullptr);
                   if (auto r = sync_ok(); !r) return r;
                   if (auto c = bitwise_equal(act.to_host(), want.to_host()); !c) return c << " (geglu)";
                   return AssertionSuccess();
                 }});
  }
}

// --- block-format weights (Q8_0, Q4_0, Q4_1, Q5_0, Q4_K, Q5_K, Q6_K) -------------------------
// A random block-format matrix [rows, cols] as the device holds it (quants, f16 scale bits,
// mins, extra bytes) and as llama.cpp's blocks (common/dtype.h, ggml), which the CPU reference
// (matmul_ref, f64) reads: Q8_0/Q4_0/Q4_1 directly; Q5_0/Q4_K/Q5_K/Q6_K through the CPU's
// dequantizer (worker/model/dequant.h, bit-exact with the `gguf` package's), as f32. Scales
// cover normal and subnormal f16 (row 0's are subnormal, row 1's zero) and both signs.
bool cpu_block_dtype(BlockFormat f) { return dtype_cpu_int_blocks(block_format_dtype(f)); }
struct BlocksHost {
  BlockFormat format;
  DType dtype;
  std::vector<uint8_t> q, e;
  std::vector<uint16_t> d, m;
  std::vector<uint8_t> blocks;
  std::vector<float> values;  // each weight, as the kernels compute it
  int64_t rows = 0, cols = 0;
  // What matmul_ref reads.
  WeightView ref() const {
    return cpu_block_dtype(format) ? WeightView{dtype, blocks.data(), rows, cols}
                                   : WeightView{DType::f32, values.data(), rows, cols};
  }
};
// Q5_0, Q5_1 and the K formats: random ggml blocks (random quant, high-bit and sub-scale bytes; d and dmin as
// below), split by split_ggml_blocks, values from the CPU's dequantizer.
BlocksHost random_ggml_blocks(BlockFormat format, int64_t rows, int64_t cols,
                              const std::function<uint16_t(int64_t)>& f16, std::mt19937& gen) {
  std::uniform_int_distribution<int> byte(0, 255);
  BlocksHost h;
  h.format = format;
  h.dtype = DType::f32;
  const int64_t per = block_format_elems(format), nb = rows * cols / per, bb = block_format_ggml_bytes(format);
  const BlockParts parts = block_parts(format);
  h.blocks.resize(static_cast<size_t>(nb * bb));
  for (auto& v : h.blocks) v = static_cast<uint8_t>(byte(gen));
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t row = b / (cols / per);
    const uint16_t d = row == 1 && rows > 2 ? 0 : f16(row);
    std::memcpy(&h.blocks[b * bb + parts.d.at], &d, 2);
    if (parts.m.at >= 0) {
      const uint16_t m = f16(row);
      std::memcpy(&h.blocks[b * bb + parts.m.at], &m, 2);
    }
  }
  SplitBlocks split = split_ggml_blocks(format, h.blocks.data(), nb);
  h.q = std::move(split.quants);
  h.d = std::move(split.scales);
  h.m = std::move(split.mins);
  h.e = std::move(split.extra);
  h.values.resize(static_cast<size_t>(rows * cols));
  const Status st = dequantize(ggml_type_of(block_format_dtype(format)), h.blocks.data(), h.values.data(), rows * cols);
  if (!st.ok()) std::abort();
  return h;
}
BlocksHost random_blocks(BlockFormat format, int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> byte(0, 255), exp(5, 16), man(0, 1023), sign(0, 1);
  const auto f16 = [&](int64_t row) {
    const int e = row == 0 ? 0 : exp(gen);  // exponent 0: subnormal (or zero)
    return static_cast<uint16_t>((sign(gen) << 15) | (e << 10) | man(gen));
  };
  if (!cpu_block_dtype(format)) {
    BlocksHost h = random_ggml_blocks(format, rows, cols, f16, gen);
    h.rows = rows;
    h.cols = cols;
    return h;
  }
  BlocksHost h;
  h.format = format;
  h.rows = rows;
  h.cols = cols;
  h.dtype = block_format_dtype(format);
  const int64_t nb = rows * cols / 32, qb = format == BlockFormat::q8_0 ? 32 : 16;
  h.q.resize(static_cast<size_t>(nb * qb));
  for (auto& v : h.q) v = static_cast<uint8_t>(byte(gen));
  if (format == BlockFormat::q8_0)
    for (auto& v : h.q)
      if (v == 0x80) v = 0x81;  // ggml's quantizer never writes -128
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t row = b / (cols / 32);
    h.d.push_back(row == 1 && rows > 2 ? 0 : f16(row));
    if (format == BlockFormat::q4_1) h.m.push_back(f16(row));
  }
  const int64_t bb = dtype_row_bytes(h.dtype, 32), head = format == BlockFormat::q4_1 ? 4 : 2;
  h.blocks.resize(static_cast<size_t>(nb * bb));
  h.values.resize(static_cast<size_t>(rows * cols));
  for (int64_t b = 0; b < nb; ++b) {
    std::memcpy(&h.blocks[b * bb], &h.d[b], 2);
    if (format == BlockFormat::q4_1) std::memcpy(&h.blocks[b * bb + 2], &h.m[b], 2);
    std::memcpy(&h.blocks[b * bb + head], &h.q[b * qb], static_cast<size_t>(qb));
    const float d = f16_to_f32(h.d[b]);
    for (int j = 0; j < 32; ++j) {
      float w;
      if (format == BlockFormat::q8_0) {
        w = d * static_cast<float>(static_cast<int8_t>(h.q[b * 32 + j]));
      } else {
        const uint8_t by = h.q[b * 16 + (j & 15)];
        const float nib = static_cast<float>(j < 16 ? by & 15 : by >> 4);
        w = format == BlockFormat::q4_0 ? d * (nib - 8.0f) : d * nib + f16_to_f32(h.m[b]);
      }
      h.values[b * 32 + j] = w;
    }
  }
  return h;
}

// The host arrays on the device, and their BlockWeights.
struct BlocksDevice {
  DeviceBuffer<uint8_t> q, e;
  DeviceBuffer<uint16_t> d, m;
  BlockWeights w;
  explicit BlocksDevice(const BlocksHost& h) : q(h.q), e(h.e), d(h.d), m(h.m) {
    w.format = h.format;
    w.quants = q.ptr;
    w.scales = d.ptr;
    w.mins = block_format_has_mins(h.format) ? m.ptr : nullptr;
    w.extra = h.e.empty() ? nullptr : e.ptr;
  }
};

const char* format_name(BlockFormat f) { return block_format_name(f); }

// Block-format shapes: cols a multiple of 32; 1312 = 41 blocks (Q8_0: 82 16-byte loads per row,
// lanes get 2 or 3; Q4: 41 loads, lanes get 1 or 2); 4128 = 129 blocks: every Q4 lane runs the
// four-loads-in-flight loop once (it needs 128 blocks) and lane 0 one block more.
const GemmShape k_block_shapes[] = {{1, 7, 32, false},   {3, 83, 576, true},     {17, 769, 576, false},
                                    {2, 37, 1312, true}, {3, 37, 4128, true},    {9, 1000, 14336, false}};
// The K formats' (cols a multiple of 256): 1280 = 40 units (lanes get 1 or 2); 4352 = 136 units:
// every lane runs the four-loads loop once; 512 with 17 tokens: three groups. Q3_K and Q2_K take
// 64 weights a unit (4352: 68 units, lanes get 2 or 3), and 8448 = 132 units runs their loop.
const GemmShape k_kblock_shapes[] = {{1, 7, 256, false}, {3, 83, 768, true}, {17, 129, 512, false},
                                     {2, 37, 1280, true}, {3, 37, 4352, true}};
bool k_format(BlockFormat f) { return block_format_elems(f) == 256; }
std::vector<GemmShape> block_shapes(BlockFormat f) {
  if (!k_format(f)) return {std::begin(k_block_shapes), std::end(k_block_shapes)};
  std::vector<GemmShape> v(std::begin(k_kblock_shapes), std::end(k_kblock_shapes));
  if (f == BlockFormat::q3_k || f == BlockFormat::q2_k) v.push_back({3, 19, 8448, true});
  return v;
}

// The block-format GEMV against the CPU's f64 reference on the same blocks (1e-4, as the bf16
// GEMV: each weight is exact in f32, Q4_1's rounded once as the CPU's), bitwise the same with 1
// or 4 loads in flight, batch-invariant, and on an unaligned x (the scalar path) within the same
// bound; the fused forms bitwise their separate launches (a bf16 output between two block ones:
// three launches); the dequantization for cuBLAS and the embedding gather exact; a cuBLAS GEMM
// into a slab of y's columns (ldy) leaves the other columns alone. Q4_0 and Q4_1 over five of
// the shapes (the emulator's time), Q8_0 over all six.
void add_matmul_blocks(std::vector<OpCase>& t) {
  for (const BlockFormat f : k_all_block_formats)
    for (const GemmShape& s : block_shapes(f)) {
      if (f != BlockFormat::q8_0 && s.cols == 14336) continue;  // the emulator's time; 4128 runs Q4's loop
      const std::string fn = format_name(f);
      t.push_back({gemm_name(("matmul_rowwise_" + fn).c_str(), s), [=]() -> AssertionResult {
                     const auto x = test::random_floats(s.tokens * s.cols, 61, -1.0f, 1.0f);
                     const BlocksHost h = random_blocks(f, s.rows, s.cols, 62);
                     const auto bias = test::random_floats(s.rows, 63, -1.0f, 1.0f);
                     std::vector<float> want(static_cast<size_t>(s.tokens * s.rows));
                     matmul_ref(x.data(), h.ref(), s.bias ? bias.data() : nullptr, want.data(), s.tokens);
                     DeviceBuffer<float> dx(x), db(bias), dy(want.size()), dy1(static_cast<size_t>(s.rows));
                     const BlocksDevice w(h);
                     const float* bp = s.bias ? db.ptr : nullptr;
                     matmul_rowwise_blocks_cuda(dx.ptr, w.w, bp, dy.ptr, s.tokens, s.rows, s.cols, nullptr);
                     if (auto r = sync_ok(); !r) return r;
                     const auto got = dy.to_host();
                     const int64_t n = static_cast<int64_t>(got.size());
                     if (auto c = test::all_close(got.data(), want.data(), n, 1e-4); !c) return c;
                     matmul_rowwise_blocks_cuda(dx.ptr, w.w, bp, dy.ptr, s.tokens, s.rows, s.cols, nullptr, 1);
                     if (auto r = sync_ok(); !r) return r;
                     if (auto c = bitwise_equal(dy.to_host(), got); !c) return c << " (1 load in flight vs 4)";
                     for (int64_t tok = 0; tok < s.tokens; ++tok) {
                       matmul_rowwise_blocks_cuda(dx.ptr + tok * s.cols, w.w, bp, dy1.ptr, 1, s.rows, s.cols, nullptr);
                       if (auto r = sync_ok(); !r) return r;
                       const std::vector<float> row(got.begin() + tok * s.rows, got.begin() + (tok + 1) * s.rows);
                       if (auto c = bitwise_equal(dy1.to_host(), row); !c) return c << " (token " << tok << " alone vs in batch)";
                     }
                     // x one float off 16-byte alignment: the scalar path, same bound.
                     std::vector<float> x1(x.size() + 1, 0.0f);
                     std::copy(x.begin(), x.end(), x1.begin() + 1);
                     DeviceBuffer<float> dx1(x1);
                     matmul_rowwise_blocks_cuda(dx1.ptr + 1, w.w, bp, dy.ptr, s.tokens, s.rows, s.cols, nullptr);
                     if (auto r = sync_ok(); !r) return r;
                     const auto scalar = dy.to_host();
                     if (auto c = test::all_close(scalar.data(), want.data(), n, 1e-4); !c) return c << " (scalar path)";
                     return AssertionSuccess();
                   }});
      t.push_back({gemm_name(("matmul_rowwise_" + fn + "_fused").c_str(), s), [=]() -> AssertionResult {
                     const auto x = test::random_floats(s.tokens * s.cols, 71, -1.0f, 1.0f);
                     DeviceBuffer<float> dx(x);
                     const int64_t heights[4] = {s.rows, s.rows / 4 + 1, 3, s.rows / 2 + 5};
                     std::vector<std::unique_ptr<BlocksDevice>> dq;
                     std::vector<std::unique_ptr<DeviceBuffer<uint16_t>>> dw;
                     std::vector<std::unique_ptr<DeviceBuffer<float>>> db, dy, dsep;
                     RowwiseOut outs[4];
                     for (int i = 0; i < 4; ++i) {  // output 2 is bf16, the others in blocks
                       dq.push_back(std::make_unique<BlocksDevice>(random_blocks(f, heights[i], s.cols, 72 + i)));
                       dw.push_back(std::make_unique<DeviceBuffer<uint16_t>>(
                           to_bf16(test::random_floats(heights[i] * s.cols, 76 + i, -1.0f, 1.0f))));
                       db.push_back(std::make_unique<DeviceBuffer<float>>(test::random_floats(heights[i], 80 + i, -1.0f, 1.0f)));
                       dy.push_back(std::make_unique<DeviceBuffer<float>>(static_cast<size_t>(s.tokens * heights[i])));
                       dsep.push_back(std::make_unique<DeviceBuffer<float>>(static_cast<size_t>(s.tokens * heights[i])));
                       const float* bias = (s.bias || i == 2) ? db[i]->ptr : nullptr;
                       outs[i] = {as_bf16(dw[i]->ptr), bias, dy[i]->ptr, heights[i], {}};
                       if (i == 2) {
                         matmul_rowwise_cuda(dx.ptr, outs[i].w, bias, dsep[i]->ptr, s.tokens, heights[i], s.cols, nullptr);
                       } else {
                         outs[i].blocks = dq[i]->w;
                         matmul_rowwise_blocks_cuda(dx.ptr, dq[i]->w, bias, dsep[i]->ptr, s.tokens, heights[i], s.cols, nullptr);
                       }
                     }
                     matmul_rowwise_multi_cuda(dx.ptr, outs, 4, s.tokens, s.cols, nullptr);
                     if (auto r = sync_ok(); !r) return r;
                     for (int i = 0; i < 4; ++i)
                       if (auto c = bitwise_equal(dy[i]->to_host(), dsep[i]->to_host()); !c)
                         return c << " (multi output " << i << " vs its own launch)";
                     const auto y0 = test::random_floats(s.tokens * s.rows, 84, -3.0f, 3.0f);
                     DeviceBuffer<float> fused(y0), sep(y0);
                     matmul_rowwise_residual_blocks_cuda(dx.ptr, dq[0]->w, outs[0].bias, fused.ptr, s.tokens, s.rows, s.cols,
                                                         nullptr);
                     residual_add_cuda(sep.ptr, dsep[0]->ptr, s.tokens * s.rows, nullptr);
                     if (auto r = sync_ok(); !r) return r;
                     if (auto c = bitwise_equal(fused.to_host(), sep.to_host()); !c) return c << " (residual)";
                     const BlocksDevice upw(random_blocks(f, s.rows, s.cols, 85));
                     DeviceBuffer<float> up(static_cast<size_t>(s.tokens * s.rows)), gate(up.n), act(up.n), want(up.n);
                     matmul_rowwise_blocks_cuda(dx.ptr, dq[0]->w, nullptr, gate.ptr, s.tokens, s.rows, s.cols, nullptr);
                     matmul_rowwise_blocks_cuda(dx.ptr, upw.w, nullptr, up.ptr, s.tokens, s.rows, s.cols, nullptr);
                     swiglu_cuda(gate.ptr, up.ptr, want.ptr, s.tokens * s.rows, nullptr);
                     matmul_rowwise_swiglu_blocks_cuda(dx.ptr, dq[0]->w, upw.w, act.ptr, s.tokens, s.rows, s.cols, nullptr);
                     if (auto r = sync_ok(); !r) return r;
                     if (auto c = bitwise_equal(act.to_host(), want.to_host()); !c) return c << " (swiglu)";
                     geglu_cuda(gate.ptr, up.ptr, want.ptr, s.tokens * s.rows, nullptr);
                     matmul_rowwise_geglu_blocks_cuda(dx.ptr, dq[0]->w, upw.w, act.ptr, s.tokens, s.rows, s.cols, nullptr);
                     if (auto r = sync_ok(); !r) return r;
                     if (auto c = bitwise_equal(act.to_host(), want.to_host()); !c) return c << " (geglu)";
                     return AssertionSuccess();
                   }});
    }
  for (const BlockFormat f : k_all_block_formats) {
    t.push_back({std::string("dequant_") + format_name(f) + "_to_bf16", [=]() -> AssertionResult {
                   const BlocksHost h = random_blocks(f, 37, k_format(f) ? 1280 : 1312, 91);
                   std::vector<uint16_t> want(h.values.size());
                   for (size_t i = 0; i < want.size(); ++i) want[i] = f32_to_bf16(h.values[i]);
                   const BlocksDevice w(h);
                   DeviceBuffer<uint16_t> out(want.size());
                   dequant_blocks_to_bf16_cuda(w.w, static_cast<int64_t>(want.size()), as_bf16(out.ptr), nullptr);
                   if (auto r = sync_ok(); !r) return r;
                   const auto got = out.to_host();
                   for (size_t i = 0; i < got.size(); ++i)
                     if (got[i] != want[i]) return AssertionFailure() << "element " << i << ": " << got[i] << " vs " << want[i];
                   return AssertionSuccess();
                 }});
    t.push_back({std::string("embedding_") + format_name(f), [=]() -> AssertionResult {
                   const int64_t vocab = 300, hidden = k_format(f) ? 512 : 576, tokens = 19;
                   const BlocksHost table = random_blocks(f, vocab, hidden, 92);
                   std::vector<int32_t> ids(static_cast<size_t>(tokens));
                   for (int64_t i = 0; i < tokens; ++i) ids[i] = static_cast<int32_t>((i * 31 + vocab - 1) % vocab);
                   ids[3] = 0;                             // the subnormal-scale row
                   ids[4] = static_cast<int32_t>(vocab);  // out of range: NaN
                   const BlocksDevice w(table);
                   DeviceBuffer<int32_t> di(ids);
                   DeviceBuffer<float> out(static_cast<size_t>(tokens * hidden));
                   embedding_gather_blocks_cuda(w.w, di.ptr, tokens, hidden, vocab, out.ptr, nullptr);
                   if (auto r = sync_ok(); !r) return r;
                   const auto got = out.to_host();
                   for (int64_t i = 0; i < tokens; ++i)
                     for (int64_t c = 0; c < hidden; ++c) {
                       const float g = got[i * hidden + c];
                       if (i == 4) {
                         if (!std::isnan(g)) return AssertionFailure() << "an out-of-range id must give NaN, col " << c;
                       } else if (f32_to_bits(g) != f32_to_bits(table.values[ids[i] * hidden + c])) {
                         return AssertionFailure() << "token " << i << " col " << c << ": " << g;
                       }
                     }
                   return AssertionSuccess();
                 }});
  }
  t.push_back({"matmul_bf16_cublas_ldy_slab", []() -> AssertionResult {
                 const int64_t tokens = 5, rows = 96, cols = 64, r0 = 32, m = 40;
                 const auto x = test::random_floats(tokens * cols, 93, -1.0f, 1.0f);
                 const auto wb = to_bf16(test::random_floats(rows * cols, 94, -1.0f, 1.0f));
                 const auto bias = test::random_floats(rows, 95, -1.0f, 1.0f);
                 const auto xb = to_bf16(x);
                 const std::vector<float> xr = from_bf16(xb);
                 std::vector<float> full(static_cast<size_t>(tokens * rows));
                 matmul_ref(xr.data(), WeightView{DType::bf16, wb.data(), rows, cols}, bias.data(), full.data(), tokens);
                 cublasHandle_t h = nullptr;
                 if (cublas_create(&h) != CUBLAS_STATUS_SUCCESS)
                   return AssertionFailure() << "cublasCreate failed " << cublas_load_error();
                 const std::vector<float> sentinel(full.size(), -7.0f);
                 DeviceBuffer<uint16_t> dx(xb), dw(wb);
                 DeviceBuffer<float> db(bias), dy(sentinel);
                 // Rows [r0, r0 + m) of w into columns [r0, r0 + m) of y [tokens, rows].
                 const cublasStatus_t st = matmul_bf16_cuda(h, as_bf16(dx.ptr), as_bf16(dw.ptr) + r0 * cols, db.ptr + r0,
                                                            dy.ptr + r0, tokens, m, cols, nullptr, rows);
                 auto r = sync_ok();
                 cublas_destroy(h);
                 if (st != CUBLAS_STATUS_SUCCESS) return AssertionFailure() << "cublasGemmEx status " << st;
                 if (!r) return r;
                 const auto got = dy.to_host();
                 for (int64_t t = 0; t < tokens; ++t)
                   for (int64_t c = 0; c < rows; ++c) {
                     const float g = got[t * rows + c], w = full[t * rows + c];
                     const bool in = c >= r0 && c < r0 + m;
                     if (!in && g != -7.0f) return AssertionFailure() << "column " << c << " outside the slab written";
                     if (in && std::abs(g - w) > 1e-4 * std::max(1.0f, std::abs(w)))
                       return AssertionFailure() << "token " << t << " column " << c << ": " << g << " vs " << w;
                   }
                 return AssertionSuccess();
               }});
}

void add_argmax(std::vector<OpCase>& t) {
  for (int64_t vocab : {1, 7, 300, 49152, 128256})
    for (int64_t tokens : {1, 5}) {
      t.push_back({"argmax_v" + std::to_string(vocab) + "_t" + std::to_string(tokens), [=]() -> AssertionResult {
                     auto logits = test::random_floats(tokens * vocab, 31, -10.0f, 10.0f);
                     for (int64_t r = 0; r < tokens; ++r) {
                       float* row = logits.data() + r * vocab;
                       if (r == 1 && vocab > 4) {  // a tie: the lower id must win
                         row[vocab - 1] = 50.0f;
                         row[vocab / 2] = 50.0f;
                       }
                       if (r == 2 && vocab > 4) row[0] = std::numeric_limits<float>::quiet_NaN();  // NaN never wins
                       if (r == 3) std::fill(row, row + vocab, -std::numeric_limits<float>::infinity());
                       if (r == 4 && vocab > 4) row[vocab - 2] = std::numeric_limits<float>::infinity();
                     }
                     std::vector<int32_t> want(static_cast<size_t>(tokens));
                     SamplingParams greedy;
                     Rng rng(0);
                     for (int64_t r = 0; r < tokens; ++r) want[r] = sample_ref(logits.data() + r * vocab, vocab, greedy, rng);
                     DeviceBuffer<float> dl(logits);
                     DeviceBuffer<int32_t> di(static_cast<size_t>(tokens));
                     argmax_cuda(dl.ptr, tokens, vocab, di.ptr, nullptr);
                     if (auto r = sync_ok(); !r) return r;
                     const auto got = di.to_host();
                     for (int64_t r = 0; r < tokens; ++r)
                       if (got[r] != want[r]) return AssertionFailure() << "row " << r << ": got " << got[r] << " want " << want[r];
                     return AssertionSuccess();
                   }});
    }
}

// --- attention over the paged cache ----------------------------------------------------------

// Runs attention_paged_cuda (tc: attention_prefill_tc_cuda with kernel `prefill`) on
// q/positions; the output on the host. `decode`: which kernel attention_paged_cuda runs the
// decode form on.
AssertionResult run_attention_cuda(const DevicePaged& d, const std::vector<float>& q, const std::vector<int32_t>& qpos,
                                   const AttentionParams& p, std::vector<float>& got, bool tc = false,
                                   DecodeAttention decode = DecodeAttention::key_threads,
                                   PrefillAttention prefill = PrefillAttention::mma) {
  const int64_t n = static_cast<int64_t>(qpos.size());
  DeviceBuffer<float> dq(q), dout(q.size());
  DeviceBuffer<int32_t> dpos(qpos);
  const size_t ws = tc ? 0 : attention_paged_cuda_workspace_bytes(n, p, d.view.max_length);
  DeviceBuffer<char> dws(ws);
  if (tc)
    CUDA_TRY(attention_prefill_tc_cuda(dq.ptr, dpos.ptr, n, d.view, p, dout.ptr, nullptr, prefill));
  else
    CUDA_TRY(attention_paged_cuda(dq.ptr, dpos.ptr, n, d.view, p, dout.ptr, dws.ptr, ws, nullptr, decode));
  if (auto r = sync_ok(); !r) return r;
  got = dout.to_host();
  return AssertionSuccess();
}

const std::vector<AttnShape>& attention_shapes() {
  static const std::vector<AttnShape> shapes = {
      {"smollm2_prefill", 9, 3, 64, {100, 100, 100}, 100, false, false, 0},
      {"llama3_chunk_vs_cache", 32, 8, 128, {300, 300, 300, 300, 300, 300, 300, 300}, 37, false, false, 0},
      {"llama3_decode_ragged", 32, 8, 128, {0, 1, 17, 513, 1000, 1500, 2048, 4999}, 1, true, true, 0},
      {"llama3_decode_4_rows", 32, 8, 128, {700, 9, 1030, 64, 5, 2100, 512, 513}, 4, true, true, 0},
      {"qwen2_group7_decode", 28, 4, 128, {600, 5, 1200, 33}, 1, true, true, 0},
      {"qwen2_group7_prefill_gaps", 28, 4, 128, {600, 5, 1200, 33}, 19, false, true, 0},
      {"mistral_window_prefill", 8, 2, 64, {700, 700}, 50, false, false, 64},
      {"mistral_window_decode", 8, 2, 64, {700, 1800}, 1, true, true, 100},
      {"gemma_d256_prefill", 4, 1, 256, {300}, 20, false, false, 0},
      {"gemma_d256_decode", 4, 1, 256, {3000}, 1, true, false, 512},
      {"d96_decode", 6, 2, 96, {77, 1025}, 1, true, true, 0},
      {"group16_prefill", 16, 1, 64, {40}, 5, false, false, 0},
      {"group32_rows96_unsplit", 32, 1, 32, {2000}, 3, true, false, 0},
      {"group3_rows21", 9, 3, 64, {7, 30, 64}, 7, false, true, 0},
      // 65 splits of 64 keys against a 32-thread merge block: the merge's weights in 3 tiles.
      {"d32_decode_65_splits", 4, 1, 32, {4100}, 2, true, true, 0},
  };
  return shapes;
}

// The queries and positions of an attention case: after every key (decode), or the last
// num_tokens positions (a prompt chunk against its cache).
AttentionParams attention_params(const AttnShape& s) {
  AttentionParams p;
  p.num_heads = s.num_heads;
  p.num_kv_heads = s.num_kv_heads;
  p.head_dim = s.head_dim;
  p.scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  p.sliding_window = s.window;
  return p;
}
std::vector<int32_t> attention_positions(const AttnShape& s, const PagedFixture& f) {
  std::vector<int32_t> qpos(static_cast<size_t>(s.num_tokens));
  for (int64_t i = 0; i < s.num_tokens; ++i)
    qpos[i] = s.decode ? f.max_pos + 1 + static_cast<int32_t>(i) : f.max_pos - static_cast<int32_t>(s.num_tokens - 1 - i);
  return qpos;
}

// One attention case against attention_paged_ref within 1e-4 (the kernels are f32-accurate:
// the tensor-core ones' bf16 pairs carry q·scale and the weights to 2^-18), then row invariance:
// each query alone gives the bits it had among the others.
// mma_bf16 rounds q·scale and the weights to bf16 once: within 1e-2 (relative to max(1, |out|)).
// Why that bound: a score moves by Σ_i δ_i·q_i·k_i·scale with |δ_i| ≤ 2^-9, about 2^-9·‖q∘k‖·scale
// ≈ 1.3e-3 for these inputs (q in [-2, 2], k in [-1, 1]), each weight by as much relative, and
// the weight's own rounding adds up to 2^-9 ≈ 2e-3; the output, a weighted mean of V rows in
// [-1, 1], moves by about that: 1e-2 leaves a factor of ~3-5. (It fails 1e-4: the split matters.)
AssertionResult attention_case(const AttnShape& s, bool tc, DecodeAttention decode = DecodeAttention::key_threads,
                               PrefillAttention prefill = PrefillAttention::mma) {
  const PagedFixture f(s, 41);
  const AttentionParams p = attention_params(s);
  const std::vector<int32_t> qpos = attention_positions(s, f);
  const auto q = test::random_floats(s.num_tokens * s.num_heads * s.head_dim, 43, -2.0f, 2.0f);
  std::vector<float> want(q.size()), got;
  attention_paged_ref(q.data(), qpos.data(), s.num_tokens, f.cpu_view(), p, want.data());
  const DevicePaged d(f, s.head_dim);
  if (auto r = run_attention_cuda(d, q, qpos, p, got, tc, decode, prefill); !r) return r;
  const double tol = tc && prefill == PrefillAttention::mma_bf16 ? 1e-2 : 1e-4;
  if (auto c = test::all_close(got.data(), want.data(), static_cast<int64_t>(got.size()), tol); !c) return c;
  const int64_t row = static_cast<int64_t>(s.num_heads) * s.head_dim;
  for (int64_t i = 0; i < s.num_tokens && s.num_tokens > 1; i += std::max<int64_t>(1, s.num_tokens / 3)) {
    const std::vector<float> q1(q.begin() + i * row, q.begin() + (i + 1) * row);
    std::vector<float> got1;
    if (auto r = run_attention_cuda(d, q1, {qpos[i]}, p, got1, tc, decode, prefill); !r) return r;
    const std::vector<float> in_batch(got.begin() + i * row, got.begin() + (i + 1) * row);
    // Alone, a prefill query may take attention_paged_cuda's decode form (the key_threads kernel,
    // or the split); then only the tolerance holds.
    const bool same_form =
        tc || ((attention_paged_cuda_workspace_bytes(1, p, f.max_len) == 0) ==
                   (attention_paged_cuda_workspace_bytes(s.num_tokens, p, f.max_len) == 0) &&
               (decode == DecodeAttention::row_warps ||
                attention_decode_form(1, p) == attention_decode_form(s.num_tokens, p)));
    if (same_form) {
      if (auto c = bitwise_equal(got1, in_batch); !c) return c << " (query " << i << " alone)";
    } else if (auto c = test::all_close(got1.data(), in_batch.data(), row, 1e-4); !c) {
      return c << " (query " << i << " alone, split form)";
    }
  }
  return AssertionSuccess();
}

void add_attention(std::vector<OpCase>& t) {
  for (const AttnShape& s : attention_shapes())
    t.push_back({std::string("attention_paged_") + s.name, [=]() { return attention_case(s, false); }});
  // The decode form on the row_warps kernel too (the prompt form runs it whatever is asked).
  for (const AttnShape& s : attention_shapes())
    if (attention_decode_form(s.num_tokens, attention_params(s)))
      t.push_back({std::string("attention_paged_row_warps_") + s.name,
                   [=]() { return attention_case(s, false, DecodeAttention::row_warps); }});
  // The decode form pipelined (cp.async, two stages): against the reference as every kernel,
  // and bit for bit key_threads' output (the same operations on the same values).
  for (const AttnShape& s : attention_shapes())
    if (attention_decode_form(s.num_tokens, attention_params(s)))
      t.push_back({std::string("attention_paged_pipelined_") + s.name, [=]() -> AssertionResult {
                     if (auto r = attention_case(s, false, DecodeAttention::pipelined); !r) return r;
                     const PagedFixture f(s, 41);
                     const AttentionParams p = attention_params(s);
                     const std::vector<int32_t> qpos = attention_positions(s, f);
                     const auto q = test::random_floats(s.num_tokens * s.num_heads * s.head_dim, 43, -2.0f, 2.0f);
                     const DevicePaged d(f, s.head_dim);
                     std::vector<float> piped, plain;
                     if (auto r = run_attention_cuda(d, q, qpos, p, piped, false, DecodeAttention::pipelined); !r) return r;
                     if (auto r = run_attention_cuda(d, q, qpos, p, plain, false, DecodeAttention::key_threads); !r) return r;
                     return bitwise_equal(piped, plain) << " (pipelined vs key_threads)";
                   }});
  // K/V that are not 16-byte aligned take the scalar loads (the pool's views never are): the
  // same bits as the vector loads give on the aligned copy.
  for (const char* name : {"llama3_decode_4_rows", "qwen2_group7_prefill_gaps"}) {
    t.push_back({std::string("attention_paged_misaligned_kv_") + name, [name]() -> AssertionResult {
                   const auto it = std::find_if(attention_shapes().begin(), attention_shapes().end(),
                                                [&](const AttnShape& x) { return std::string(x.name) == name; });
                   const AttnShape& s = *it;
                   const PagedFixture f(s, 41);
                   const AttentionParams p = attention_params(s);
                   const std::vector<int32_t> qpos = attention_positions(s, f);
                   const auto q = test::random_floats(s.num_tokens * s.num_heads * s.head_dim, 43, -2.0f, 2.0f);
                   std::vector<float> aligned, misaligned;
                   if (auto r = run_attention_cuda(DevicePaged(f, s.head_dim), q, qpos, p, aligned); !r) return r;
                   const DevicePaged d(f, s.head_dim, true);
                   if (auto r = run_attention_cuda(d, q, qpos, p, misaligned); !r) return r;
                   if (attention_prefill_tc_supported(p, d.view))
                     return AssertionFailure() << "the tensor-core kernel must refuse K/V 2 bytes off alignment";
                   return bitwise_equal(misaligned, aligned);
                 }});
  }
  t.push_back({"attention_paged_rejects_bad_shapes", []() -> AssertionResult {
                 AttnShape s{"bad", 4, 2, 48, {10, 10}, 1, true, false, 0};
                 const PagedFixture f(s, 5);
                 const DevicePaged d(f, 48);
                 AttentionParams p{4, 2, 48, 0.1f, 0};
                 if (attention_paged_cuda(nullptr, nullptr, 1, d.view, p, nullptr, nullptr, 0, nullptr) != cudaErrorInvalidValue)
                   return AssertionFailure() << "head_dim 48 (not a multiple of 32) must be refused";
                 p.head_dim = 64;
                 p.num_kv_heads = 3;
                 if (attention_paged_cuda(nullptr, nullptr, 1, d.view, p, nullptr, nullptr, 0, nullptr) != cudaErrorInvalidValue)
                   return AssertionFailure() << "4 heads over 3 KV heads must be refused";
                 return AssertionSuccess();
               }});
}

// --- a decode step of many sequences (attention_decode_rows_cuda) ------------------------------

// Sequences of one pool: `seqs` views of num_kv_heads heads each, cut from one fixture whose
// heads are every sequence's heads in turn (so the views share the slabs, as the pool's do).
struct RowsShape {
  const char* name;
  int num_heads, num_kv_heads, head_dim;
  std::vector<std::vector<int64_t>> lengths;  // [sequence][KV head]
  bool gaps;
  int window;
};

const std::vector<RowsShape>& rows_shapes() {
  static const std::vector<RowsShape> shapes = [] {
    std::vector<RowsShape> v = {
        // Split and unsplit rows side by side: an empty sequence, one key, ragged heads (AdaKV),
        // SnapKV's 2048, a long one.
        {"llama3_8_seqs",
         32,
         8,
         128,
         {{0, 0, 0, 0, 0, 0, 0, 0},
          {1, 1, 1, 1, 1, 1, 1, 1},
          {17, 513, 3, 2048, 64, 65, 900, 1},
          {2048, 2048, 2048, 2048, 2048, 2048, 2048, 2048},
          {4999, 4999, 4999, 4999, 4999, 4999, 4999, 4999},
          {300, 300, 300, 300, 300, 300, 300, 300},
          {1030, 7, 1030, 7, 1030, 7, 1030, 7},
          {40, 40, 40, 40, 40, 40, 40, 40}},
         true,
         0},
        {"qwen2_group7_3_seqs", 28, 4, 128, {{600, 5, 1200, 33}, {9, 9, 9, 9}, {1500, 1500, 1500, 1500}}, true, 0},
        {"mistral_window_3_seqs", 8, 2, 64, {{700, 1800}, {90, 90}, {1200, 150}}, false, 100},
        {"gemma_d256_2_seqs", 4, 1, 256, {{3000}, {200}}, false, 0},
        {"d96_2_seqs", 6, 2, 96, {{77, 1025}, {300, 2}}, true, 0},
    };
    // 70 sequences: more than one launch's 64.
    RowsShape many{"d32_70_seqs", 4, 1, 32, {}, true, 0};
    for (int b = 0; b < 70; ++b) many.lengths.push_back({(b * 37) % 700 + (b % 5 == 0 ? 0 : 1)});
    v.push_back(many);
    return v;
  }();
  return shapes;
}

// One sequence's rows against its own view (attention_paged_cuda) and all of them in one call
// (attention_decode_rows_cuda): each row bitwise the same, and within 1e-4 of the CPU
// reference. Row b's query sits at max_pos + 1 + 3b, so sliding windows differ by row.
AssertionResult decode_rows_case(const RowsShape& rs, DecodeAttention decode) {
  AttnShape s{rs.name, rs.num_heads, static_cast<int>(rs.num_kv_heads * rs.lengths.size()), rs.head_dim, {}, 1, true,
              rs.gaps, rs.window};
  for (const auto& seq : rs.lengths) s.lengths.insert(s.lengths.end(), seq.begin(), seq.end());
  const PagedFixture f(s, 43);
  const DevicePaged d(f, rs.head_dim);
  AttentionParams p{rs.num_heads, rs.num_kv_heads, rs.head_dim, 1.0f / std::sqrt(static_cast<float>(rs.head_dim)),
                    rs.window};
  const int64_t n = static_cast<int64_t>(rs.lengths.size()), qd = int64_t{rs.num_heads} * rs.head_dim;
  std::vector<PagedKvCuda> views(static_cast<size_t>(n), d.view);
  std::vector<int32_t> qpos(static_cast<size_t>(n));
  for (int64_t b = 0; b < n; ++b) {
    views[b].heads = d.view.heads + b * rs.num_kv_heads;
    views[b].max_length = *std::max_element(rs.lengths[b].begin(), rs.lengths[b].end());
    qpos[b] = f.max_pos + 1 + 3 * static_cast<int32_t>(b);
  }
  const auto q = test::random_floats(n * qd, 44, -2.0f, 2.0f);
  DeviceBuffer<float> dq(q), dout(q.size());
  DeviceBuffer<int32_t> dpos(qpos);
  const size_t ws = attention_decode_rows_workspace_bytes(n, views.data(), p);
  DeviceBuffer<char> dws(ws);
  if (ws > 0 && attention_decode_rows_cuda(dq.ptr, dpos.ptr, n, views.data(), p, dout.ptr, dws.ptr, ws - 1, nullptr,
                                           decode) != cudaErrorInvalidValue)
    return AssertionFailure() << "a workspace one byte short must be refused";
  CUDA_TRY(attention_decode_rows_cuda(dq.ptr, dpos.ptr, n, views.data(), p, dout.ptr, dws.ptr, ws, nullptr, decode));
  if (auto r = sync_ok(); !r) return r;
  const std::vector<float> got = dout.to_host();
  PagedKv cpu = f.cpu_view();
  for (int64_t b = 0; b < n; ++b) {
    const std::vector<float> qb(q.begin() + b * qd, q.begin() + (b + 1) * qd);
    const std::vector<float> row(got.begin() + b * qd, got.begin() + (b + 1) * qd);
    std::vector<float> want(static_cast<size_t>(qd));
    cpu.heads = f.heads.data() + b * rs.num_kv_heads;
    attention_paged_ref(qb.data(), &qpos[b], 1, cpu, p, want.data());
    if (auto c = test::all_close(row.data(), want.data(), qd, 1e-4); !c) return c << " (sequence " << b << ")";
    DeviceBuffer<float> dq1(qb), dout1(qb.size());
    DeviceBuffer<int32_t> dpos1(std::vector<int32_t>{qpos[b]});
    const size_t ws1 = attention_paged_cuda_workspace_bytes(1, p, views[b].max_length);
    DeviceBuffer<char> dws1(ws1);
    CUDA_TRY(attention_paged_cuda(dq1.ptr, dpos1.ptr, 1, views[b], p, dout1.ptr, dws1.ptr, ws1, nullptr, decode));
    if (auto r = sync_ok(); !r) return r;
    if (auto c = bitwise_equal(dout1.to_host(), row); !c) return c << " (sequence " << b << " alone vs in the step)";
  }
  return AssertionSuccess();
}

void add_decode_rows(std::vector<OpCase>& t) {
  const std::pair<const char*, DecodeAttention> kernels[] = {{"attention_decode_rows_", DecodeAttention::key_threads},
                                                             {"attention_decode_rows_pipelined_", DecodeAttention::pipelined},
                                                             {"attention_decode_rows_row_warps_", DecodeAttention::row_warps}};
  for (const auto& [prefix, decode] : kernels)
    for (const RowsShape& s : rows_shapes())
      t.push_back({std::string(prefix) + s.name, [s, decode = decode]() { return decode_rows_case(s, decode); }});
  t.push_back({"attention_decode_rows_rejects_other_slabs", []() -> AssertionResult {
                 AttnShape s{"two", 4, 2, 64, {10, 10}, 1, true, false, 0};
                 const PagedFixture f(s, 5);
                 const DevicePaged a(f, 64), b(f, 64);
                 AttentionParams p{4, 2, 64, 0.1f, 0};
                 const PagedKvCuda views[2] = {a.view, b.view};
                 DeviceBuffer<float> dq(static_cast<size_t>(2 * 4 * 64)), dout(dq.n);
                 DeviceBuffer<int32_t> dpos(std::vector<int32_t>{50, 50});
                 if (attention_decode_rows_cuda(dq.ptr, dpos.ptr, 2, views, p, dout.ptr, nullptr, 0, nullptr) !=
                     cudaErrorInvalidValue)
                   return AssertionFailure() << "views of two different pools must be refused";
                 const PagedKvCuda same[2] = {a.view, a.view};
                 CUDA_TRY(attention_decode_rows_cuda(dq.ptr, dpos.ptr, 2, same, p, dout.ptr, nullptr, 0, nullptr));
                 return sync_ok();
               }});
}

// --- the tensor-core prompt kernel (attention_prefill_tc_cuda) --------------------------------

// Every shape on each of the three kernels: mma (the default, "attention_prefill_tc_*"),
// mma_bf16 and wmma.
void add_attention_tc(std::vector<OpCase>& t) {
  const std::pair<const char*, PrefillAttention> kernels[] = {
      {"attention_prefill_tc_", PrefillAttention::mma},
      {"attention_prefill_mma_bf16_", PrefillAttention::mma_bf16},
      {"attention_prefill_wmma_", PrefillAttention::wmma}};
  for (const auto& [prefix, kernel] : kernels) {
    for (const AttnShape& s : attention_shapes())
      t.push_back({std::string(prefix) + s.name,
                   [=]() { return attention_case(s, true, DecodeAttention::key_threads, kernel); }});
    if (kernel != PrefillAttention::wmma)  // 8 warps (128 rows per block): the 4-warp bits exactly
      for (const AttnShape& s : attention_shapes())
        t.push_back({std::string(prefix) + "8_warps_" + s.name, [=]() -> AssertionResult {
                       const PagedFixture f(s, 41);
                       const AttentionParams p = attention_params(s);
                       const std::vector<int32_t> qpos = attention_positions(s, f);
                       const auto q = test::random_floats(s.num_tokens * s.num_heads * s.head_dim, 43, -2.0f, 2.0f);
                       const DevicePaged d(f, s.head_dim);
                       std::vector<float> four;
                       if (auto r = run_attention_cuda(d, q, qpos, p, four, true, DecodeAttention::key_threads, kernel); !r)
                         return r;
                       DeviceBuffer<float> dq(q), dout(q.size());
                       DeviceBuffer<int32_t> dpos(qpos);
                       CUDA_TRY(attention_prefill_mma_cuda(dq.ptr, dpos.ptr, s.num_tokens, d.view, p, dout.ptr, nullptr,
                                                           kernel == PrefillAttention::mma_bf16, 8));
                       if (auto r = sync_ok(); !r) return r;
                       return bitwise_equal(dout.to_host(), four);
                     }});
    t.push_back({std::string(prefix) + "rejects_bad_shapes", [kernel]() -> AssertionResult {
                   AttnShape s{"bad", 4, 2, 64, {10, 10}, 1, true, false, 0};
                   const PagedFixture f(s, 5);
                   const DevicePaged d(f, 64);
                   AttentionParams p{4, 2, 48, 0.1f, 0};
                   if (attention_prefill_tc_cuda(nullptr, nullptr, 1, d.view, p, nullptr, nullptr, kernel) !=
                       cudaErrorInvalidValue)
                     return AssertionFailure() << "head_dim 48 (not a multiple of 32) must be refused";
                   p.head_dim = 64;
                   p.num_kv_heads = 3;
                   if (attention_prefill_tc_cuda(nullptr, nullptr, 1, d.view, p, nullptr, nullptr, kernel) !=
                       cudaErrorInvalidValue)
                     return AssertionFailure() << "4 heads over 3 KV heads must be refused";
                   p.num_kv_heads = 2;
                   PagedKvCuda odd = d.view;
                   odd.k_block_stride += 4;  // rows no longer 16-byte aligned
                   if (attention_prefill_tc_cuda(nullptr, nullptr, 1, odd, p, nullptr, nullptr, kernel) !=
                       cudaErrorInvalidValue)
                     return AssertionFailure() << "a K block stride that is not a multiple of 8 elements must be refused";
                   if (kernel != PrefillAttention::wmma &&
                       attention_prefill_mma_cuda(nullptr, nullptr, 1, d.view, p, nullptr, nullptr,
                                                  kernel == PrefillAttention::mma_bf16, 6) != cudaErrorInvalidValue)
                     return AssertionFailure() << "6 warps (neither 4 nor 8) must be refused";
                   return AssertionSuccess();
                 }});
  }
}

// --- SnapKV selection vs worker/kv/selection.cpp ----------------------------------------------

struct SnapShape {
  const char* name;
  int num_heads, num_kv_heads, head_dim;
  int64_t num_tokens, budget;
  int window, kernel;
  bool max_pooling, max_aggregation;
};

// Per KV head: |got − want| <= tol · max|want| (scores are small probabilities, so the
// comparison is relative to the head's own scale, not to 1).
AssertionResult scores_close(const std::vector<float>& got, const std::vector<std::vector<float>>& want, double tol) {
  const int64_t prefix = static_cast<int64_t>(want[0].size());
  for (size_t g = 0; g < want.size(); ++g) {
    double norm = 0.0;
    for (float x : want[g]) norm = std::max(norm, std::fabs(static_cast<double>(x)));
    for (int64_t j = 0; j < prefix; ++j) {
      const float a = got[g * prefix + j], b = want[g][j];
      if (std::isnan(a) || !(std::fabs(static_cast<double>(a) - b) <= tol * norm))
        return AssertionFailure() << "KV head " << g << " position " << j << ": got " << a << " want " << b
                                  << " (head max " << norm << ", tol " << tol << ")";
    }
  }
  return AssertionSuccess();
}

void add_snapkv(std::vector<OpCase>& t) {
  const std::vector<SnapShape> shapes = {
      {"smollm2_b256", 9, 3, 64, 1000, 256, 32, 7, true, false},
      {"llama3_b1024", 32, 8, 128, 3000, 1024, 32, 7, true, false},
      {"avgpool_maxagg", 8, 2, 64, 777, 100, 16, 5, false, true},
      {"qwen2_group7_k1_avg", 28, 4, 128, 513, 200, 8, 1, false, false},
      {"d96_w24", 6, 2, 96, 300, 64, 24, 3, true, false},
      {"gemma_d256", 4, 1, 256, 400, 128, 32, 7, true, false},
  };
  for (const SnapShape& s : shapes) {
    t.push_back({std::string("snapkv_select_") + s.name, [=]() -> AssertionResult {
                   AttnShape a{"", s.num_heads, s.num_kv_heads, s.head_dim,
                               std::vector<int64_t>(static_cast<size_t>(s.num_kv_heads), s.num_tokens), 1, true, false, 0};
                   const PagedFixture f(a, 51);
                   // The same keys, contiguous per head, for the CPU selection.
                   const int64_t n = s.num_tokens, hd = s.head_dim;
                   std::vector<float> kc(static_cast<size_t>(s.num_kv_heads * n * hd));
                   for (int g = 0; g < s.num_kv_heads; ++g)
                     for (int64_t j = 0; j < n; ++j)
                       for (int64_t d = 0; d < hd; ++d)
                         kc[(g * n + j) * hd + d] = f.kf[(f.tables[g][j / k_block] * k_block + j % k_block) * hd + d];
                   const auto qw = test::random_floats(s.window * s.num_heads * hd, 53, -2.0f, 2.0f);
                   LayerQk qk;
                   qk.q = qw.data();
                   qk.num_queries = s.window;
                   qk.k = kc.data();
                   qk.kv_head_stride = n * hd;
                   qk.num_tokens = n;
                   qk.num_heads = s.num_heads;
                   qk.num_kv_heads = s.num_kv_heads;
                   qk.head_dim = s.head_dim;
                   SnapKvParams cp;
                   cp.budget = s.budget;
                   cp.window = s.window;
                   cp.kernel = s.kernel;
                   cp.pooling = s.max_pooling ? KvPooling::max : KvPooling::avg;
                   cp.aggregation = s.max_aggregation ? GqaAggregation::max : GqaAggregation::mean;
                   auto want_scores = snapkv_scores(qk, cp);
                   auto want_sel = snapkv_select(qk, cp);
                   if (!want_scores.ok() || !want_sel.ok()) return AssertionFailure() << "CPU selection failed";

                   const DevicePaged d(f, s.head_dim);
                   AttentionParams p{s.num_heads, s.num_kv_heads, s.head_dim, 0.0f, 0};
                   SnapKvCudaParams sp{s.budget, s.window, s.kernel, s.max_pooling, s.max_aggregation};
                   const int64_t prefix = n - s.window;
                   const size_t ws = snapkv_select_cuda_workspace_bytes(n, p, sp);
                   if (ws == 0) return AssertionFailure() << "workspace size 0 for a valid shape";
                   DeviceBuffer<float> dq(qw), dscores(static_cast<size_t>(prefix * s.num_kv_heads));
                   DeviceBuffer<int32_t> dkept(static_cast<size_t>(s.budget * s.num_kv_heads));
                   DeviceBuffer<char> dws(ws);
                   CUDA_TRY(snapkv_select_cuda(dq.ptr, d.view, n, p, sp, dscores.ptr, dkept.ptr, dws.ptr, ws, nullptr));
                   if (auto r = sync_ok(); !r) return r;
                   const auto got_scores = dscores.to_host();
                   if (auto c = scores_close(got_scores, *want_scores, 1e-5); !c) return c;
                   // Kept positions: equal to the CPU's, except where a position's CPU score is
                   // within 1e-5 of the head's cut-off (a floating-point near-tie).
                   const auto got_kept = dkept.to_host();
                   const int64_t keep = s.budget - s.window;
                   for (int g = 0; g < s.num_kv_heads; ++g) {
                     const std::vector<int32_t> got(got_kept.begin() + g * s.budget, got_kept.begin() + (g + 1) * s.budget);
                     const std::vector<int32_t>& want = want_sel->kept[g];
                     if (got == want) continue;
                     if (!std::is_sorted(got.begin(), got.end()) || got.size() != want.size())
                       return AssertionFailure() << "KV head " << g << ": kept positions not sorted or wrong count";
                     std::vector<float> sorted = (*want_scores)[g];
                     std::nth_element(sorted.begin(), sorted.begin() + (keep - 1), sorted.end(), std::greater<float>());
                     const double cut = sorted[keep - 1];
                     const double norm = *std::max_element(sorted.begin(), sorted.end());
                     std::vector<int32_t> diff;
                     std::set_symmetric_difference(got.begin(), got.end(), want.begin(), want.end(), std::back_inserter(diff));
                     for (int32_t j : diff)
                       if (j >= prefix || std::fabs((*want_scores)[g][j] - cut) > 1e-5 * norm)
                         return AssertionFailure() << "KV head " << g << ": position " << j << " (score "
                                                   << (j < prefix ? (*want_scores)[g][j] : 0.0f) << ", cut-off " << cut
                                                   << ") differs from the CPU's selection and is no near-tie";
                   }
                   return AssertionSuccess();
                 }});
  }
  t.push_back({"snapkv_select_rejects_bad_params", []() -> AssertionResult {
                 const AttentionParams p{4, 2, 64, 0.0f, 0};
                 const PagedKvCuda kv;
                 for (SnapKvCudaParams sp : {SnapKvCudaParams{32, 32, 7, true, false}, SnapKvCudaParams{100, 16, 4, true, false},
                                             SnapKvCudaParams{1000, 16, 7, true, false}}) {
                   if (snapkv_select_cuda_workspace_bytes(500, p, sp) != 0 ||
                       snapkv_select_cuda(nullptr, kv, 500, p, sp, nullptr, nullptr, nullptr, 0, nullptr) != cudaErrorInvalidValue)
                     return AssertionFailure() << "budget " << sp.budget << " window " << sp.window << " kernel " << sp.kernel
                                               << " over 500 tokens must be refused";
                 }
                 return AssertionSuccess();
               }});
}

std::vector<OpCase> all_cases() {
  std::vector<OpCase> t;
  add_rms_norm(t);
  add_rope(t);
  add_elementwise(t);
  add_embedding(t);
  add_matmul(t);
  add_matmul_fused(t);
  add_matmul_blocks(t);
  add_argmax(t);
  add_attention(t);
  add_decode_rows(t);
  add_attention_tc(t);
  add_snapkv(t);
  return t;
}

void PrintTo(const OpCase& c, std::ostream* os) { *os << c.name; }

class CudaOp : public ::testing::TestWithParam<OpCase> {};

TEST_P(CudaOp, MatchesCpu) { EXPECT_TRUE(GetParam().run()); }

// The one BlockFormat <-> DType table (block_split.h): each format's DType has its block
// size and ggml bytes, and back; element types have no format.
TEST(BlockFormats, EachHasTheDTypeOfItsBytes) {
  for (const BlockFormat f : k_all_block_formats) {
    const DType t = block_format_dtype(f);
    EXPECT_TRUE(dtype_is_quantized(t)) << block_format_name(f);
    EXPECT_EQ(dtype_block_elems(t), block_format_elems(f)) << block_format_name(f);
    EXPECT_EQ(dtype_block_bytes(t), block_format_ggml_bytes(f)) << block_format_name(f);
    EXPECT_STREQ(dtype_name(t), block_format_name(f));
    // The parts split_ggml_blocks copies tile the block: every byte in exactly one part.
    const BlockParts p = block_parts(f);
    std::vector<int> owners(static_cast<size_t>(block_format_ggml_bytes(f)), 0);
    for (const BlockParts::Part& part : {p.q, p.d, p.m, p.e})
      for (int64_t b = part.at; part.at >= 0 && b < part.at + part.bytes; ++b)
        if (b < static_cast<int64_t>(owners.size())) ++owners[static_cast<size_t>(b)];
    EXPECT_EQ(std::count(owners.begin(), owners.end(), 1), static_cast<std::ptrdiff_t>(owners.size()))
        << block_format_name(f) << ": a byte in no part or in two";
    EXPECT_EQ(p.q.bytes, block_quant_row_bytes(f, block_format_elems(f))) << block_format_name(f);
    EXPECT_EQ(p.e.at >= 0 ? p.e.bytes : 0, block_extra_row_bytes(f, block_format_elems(f))) << block_format_name(f);
    EXPECT_EQ(p.m.at >= 0, block_format_has_mins(f)) << block_format_name(f);
    BlockFormat back = BlockFormat::q8_0;
    EXPECT_TRUE(block_format_of(t, &back)) << block_format_name(f);
    EXPECT_EQ(back, f) << block_format_name(f);
  }
  EXPECT_EQ(std::size(k_all_block_formats), 10u);
  for (const DType t : {DType::f32, DType::f16, DType::bf16}) {
    BlockFormat f = BlockFormat::q8_0;
    EXPECT_FALSE(block_format_of(t, &f)) << dtype_name(t);
  }
}

INSTANTIATE_TEST_SUITE_P(Table, CudaOp, ::testing::ValuesIn(all_cases()),
                         [](const ::testing::TestParamInfo<OpCase>& info) { return info.param.name; });

}  // namespace
}  // namespace snap::kernels

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (::testing::GTEST_FLAG(list_tests)) return RUN_ALL_TESTS();  // the table's names, no GPU needed
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    std::printf("test_cuda_ops: no usable GPU (%s); skipping\n",
                err != cudaSuccess ? cudaGetErrorString(err) : "0 devices");
    return 77;
  }
  return RUN_ALL_TESTS();
}
