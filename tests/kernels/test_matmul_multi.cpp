// matmul_multi_cpu (kernels/matmul_multi.h): matrices sharing one input in one call give
// bitwise what each gives alone through matmul_cpu / matmul_rowwise_cpu, for every weight
// format (mixed in one call), f32act and q8act, each SIMD level, token counts on both sides of
// the sgemm threshold, with and without bias; the decode rows stay batch-invariant.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "common/dtype.h"
#include "kernels/kernels.h"
#include "kernels/matmul_multi.h"
#include "kernels/matvec_act.h"
#include "tests/kernels/kernel_test_util.h"

namespace snap::kernels {
namespace {

std::vector<uint8_t> random_weights(DType dtype, int64_t rows, int64_t cols, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<uint8_t> bytes(static_cast<size_t>(rows * dtype_row_bytes(dtype, cols)));
  if (!dtype_is_quantized(dtype)) {
    const int64_t n = rows * cols;
    for (int64_t i = 0; i < n; ++i) {
      const float v = u(rng);
      if (dtype == DType::f32) std::memcpy(&bytes[i * 4], &v, 4);
      const uint16_t h = dtype == DType::f16 ? f32_to_f16(v) : f32_to_bf16(v);
      if (dtype != DType::f32) std::memcpy(&bytes[i * 2], &h, 2);
    }
    return bytes;
  }
  for (auto& b : bytes) b = static_cast<uint8_t>(rng());
  for (size_t off = 0; off < bytes.size(); off += static_cast<size_t>(dtype_block_bytes(dtype))) {
    const uint16_t d = f32_to_f16(0.01f + 0.02f * std::fabs(u(rng))), m = f32_to_f16(0.05f * u(rng));
    std::memcpy(&bytes[off], &d, 2);
    if (dtype == DType::q4_1) std::memcpy(&bytes[off + 2], &m, 2);
  }
  return bytes;
}

struct Case {
  std::vector<DType> dtypes;
  std::vector<int64_t> rows;
};

TEST(MatmulMulti, EqualsEachMatrixAloneBitwise) {
  const int64_t cols = 576;
  const std::vector<Case> cases = {
      {{DType::q4_1, DType::q4_1, DType::q4_1}, {576, 192, 192}},  // SmolLM2 q/k/v
      {{DType::q4_0, DType::q4_0}, {1536, 1536}},                  // gate/up
      {{DType::q8_0, DType::q4_1, DType::f16, DType::f32}, {7, 83, 5, 1}},
      {{DType::bf16}, {13}},
  };
  std::mt19937 rng(3);
  for (const Case& c : cases) {
    std::vector<std::vector<uint8_t>> bytes;
    std::vector<std::vector<float>> bias;
    for (size_t i = 0; i < c.dtypes.size(); ++i) {
      bytes.push_back(random_weights(c.dtypes[i], c.rows[i], cols, rng));
      bias.push_back(test::random_floats(c.rows[i], 5 + static_cast<uint32_t>(i)));
    }
    for (int64_t tokens : {1, 2, 3, 5, 9}) {
      const std::vector<float> x = test::random_floats(tokens * cols, 7);
      for (MatvecAct act : {MatvecAct::f32, MatvecAct::q8}) {
        matvec_act_set(act);
        for (SimdLevel level : test::supported_levels()) {
          test::LevelGuard guard(level);
          for (bool rowwise : {false, true}) {
            for (bool with_bias : {false, true}) {
              std::vector<std::vector<float>> fused(c.dtypes.size()), alone(c.dtypes.size());
              std::vector<MatmulOut> outs;
              for (size_t i = 0; i < c.dtypes.size(); ++i) {
                fused[i].assign(tokens * c.rows[i], -1.0f);
                alone[i].assign(tokens * c.rows[i], -2.0f);
                const WeightView w{c.dtypes[i], bytes[i].data(), c.rows[i], cols};
                const float* b = with_bias ? bias[i].data() : nullptr;
                outs.push_back({w, b, fused[i].data()});
                if (rowwise) matmul_rowwise_cpu(x.data(), w, b, alone[i].data(), tokens);
                else matmul_cpu(x.data(), w, b, alone[i].data(), tokens);
              }
              matmul_multi_cpu(x.data(), outs.data(), static_cast<int>(outs.size()), tokens, rowwise);
              for (size_t i = 0; i < c.dtypes.size(); ++i) {
                EXPECT_EQ(0, std::memcmp(fused[i].data(), alone[i].data(), fused[i].size() * 4))
                    << "matrix " << i << " (" << dtype_name(c.dtypes[i]) << ") tokens " << tokens << " "
                    << matvec_act_name(act) << " " << test::level_name(level) << (rowwise ? " rowwise" : "")
                    << (with_bias ? " bias" : "");
              }
            }
          }
        }
      }
    }
  }
  matvec_act_set(MatvecAct::f32);
}

// Decode rows through the fused call: a token's outputs do not depend on the other rows.
TEST(MatmulMulti, RowwiseRowIndependentOfBatchSize) {
  const int64_t cols = 576, tokens = 11;
  std::mt19937 rng(9);
  const auto wq = random_weights(DType::q4_1, 576, cols, rng), wk = random_weights(DType::q4_1, 192, cols, rng);
  const std::vector<float> x = test::random_floats(tokens * cols, 13);
  for (MatvecAct act : {MatvecAct::f32, MatvecAct::q8}) {
    matvec_act_set(act);
    std::vector<float> q_all(tokens * 576), k_all(tokens * 192), q1(576), k1(192);
    MatmulOut all[2] = {{{DType::q4_1, wq.data(), 576, cols}, nullptr, q_all.data()},
                        {{DType::q4_1, wk.data(), 192, cols}, nullptr, k_all.data()}};
    matmul_multi_cpu(x.data(), all, 2, tokens, true);
    for (int64_t t = 0; t < tokens; ++t) {
      MatmulOut one[2] = {{all[0].w, nullptr, q1.data()}, {all[1].w, nullptr, k1.data()}};
      matmul_multi_cpu(&x[t * cols], one, 2, 1, true);
      EXPECT_EQ(0, std::memcmp(q1.data(), &q_all[t * 576], 576 * 4)) << matvec_act_name(act) << " token " << t;
      EXPECT_EQ(0, std::memcmp(k1.data(), &k_all[t * 192], 192 * 4)) << matvec_act_name(act) << " token " << t;
    }
  }
  matvec_act_set(MatvecAct::f32);
}

}  // namespace
}  // namespace snap::kernels
