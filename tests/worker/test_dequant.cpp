// Dequantization against the reference of the PyPI package `gguf`: for every type, random
// blocks (tests/fixtures/dequant/<type>.raw) must decode bit-exactly to <type>.f32, which
// tools/gen_dequant_fixture.py wrote with gguf.quants.dequantize. Also type sizes, the
// multi-threaded path, and the errors for unknown types and partial blocks.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kernels/cpu/matmul.h"
#include "kernels/cpu/simd.h"
#include "tests/kernels/kernel_test_util.h"
#include "worker/model/dequant.h"

namespace snap {
namespace {

const std::string k_dir = std::string(SNAP_SOURCE_DIR) + "/tests/fixtures/dequant/";

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot open fixture " << path;
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

nlohmann::json manifest() {
  std::ifstream in(k_dir + "manifest.json");
  EXPECT_TRUE(in.good()) << "cannot open " << k_dir << "manifest.json";
  return nlohmann::json::parse(in);
}

std::vector<float> as_floats(const std::vector<uint8_t>& bytes) {
  std::vector<float> out(bytes.size() / 4);
  std::memcpy(out.data(), bytes.data(), out.size() * 4);
  return out;
}

// Bit-exact comparison; prints the first few mismatches with their index.
void expect_bits_equal(const std::vector<float>& got, const std::vector<float>& want,
                       const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int shown = 0;
  size_t mismatches = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    uint32_t a, b;
    std::memcpy(&a, &got[i], 4);
    std::memcpy(&b, &want[i], 4);
    if (a != b) {
      ++mismatches;
      if (shown++ < 5) ADD_FAILURE() << what << " [" << i << "]: got " << got[i] << ", want " << want[i];
    }
  }
  EXPECT_EQ(mismatches, 0u) << what << ": " << mismatches << " of " << got.size() << " differ";
}

TEST(Dequant, ManifestCoversEveryDequantizableType) {
  std::vector<std::string> names;
  for (const auto& e : manifest()) names.push_back(e["name"]);
  const std::vector<std::string> want = {"f32",  "f16",  "bf16", "q4_0", "q4_1", "q5_0", "q5_1",
                                         "q8_0", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k"};
  EXPECT_EQ(names, want);
}

TEST(Dequant, EveryTypeBitExactWithGgufReference) {
  for (const auto& e : manifest()) {
    const std::string name = e["name"];
    const auto type = static_cast<GgmlType>(e["type"].get<uint32_t>());
    const int64_t n = e["n"];
    const std::vector<uint8_t> raw = read_bytes(k_dir + name + ".raw");
    const std::vector<float> want = as_floats(read_bytes(k_dir + name + ".f32"));
    ASSERT_EQ(raw.size(), e["nbytes"].get<size_t>()) << name;
    ASSERT_EQ(want.size(), static_cast<size_t>(n)) << name;
    for (float v : want) ASSERT_TRUE(std::isfinite(v)) << name << ": fixture holds a non-finite value";

    std::vector<float> got(static_cast<size_t>(n), -1.0f);
    const Status s = dequantize(type, raw.data(), got.data(), n);
    ASSERT_TRUE(s.ok()) << name << ": " << s.to_string();
    expect_bits_equal(got, want, name);
  }
}

// The CPU's matmul kernels on every block format they read (common/dtype.h dtype_cpu_blocks:
// every block format: q8_0, q4_0, q4_1, q5_0, q5_1, q2_k .. q6_k), over the same fixture blocks as one matrix: with one-hot
// activations (token t = column t) each output is one weight exactly, so every path — the
// reference, the f32-activation matvec and the converting sgemm, at every SIMD level — must give
// the gguf package's values bit for bit (their own decoders, kernels/cpu/matmul.cpp, not this
// file's), but for −0, which a sum from +0 returns as +0.
TEST(Dequant, CpuMatmulKernelsReadTheBlocksAsTheGgufPackage) {
  int formats = 0;
  for (const auto& e : manifest()) {
    const std::string name = e["name"];
    DType dtype;
    if (!dtype_of(static_cast<GgmlType>(e["type"].get<uint32_t>()), &dtype) || !dtype_cpu_blocks(dtype)) continue;
    ++formats;
    const std::vector<uint8_t> raw = read_bytes(k_dir + name + ".raw");
    const std::vector<float> want = as_floats(read_bytes(k_dir + name + ".f32"));
    const int64_t cols = 256, rows = static_cast<int64_t>(want.size()) / cols;
    ASSERT_GT(rows, 0) << name;
    ASSERT_EQ(static_cast<int64_t>(raw.size()), rows * dtype_row_bytes(dtype, cols)) << name;
    const kernels::WeightView w{dtype, raw.data(), rows, cols};
    std::vector<float> x(static_cast<size_t>(cols * cols), 0.0f);
    for (int64_t t = 0; t < cols; ++t) x[t * cols + t] = 1.0f;
    // y[t][r] = w[r][t]: back to the fixture's order.
    const auto check = [&](void (*fn)(const float*, const kernels::WeightView&, const float*, float*, int64_t),
                           int64_t tokens, const std::string& what) {
      std::vector<float> y(static_cast<size_t>(tokens * rows)), got(static_cast<size_t>(tokens * rows));
      fn(x.data(), w, nullptr, y.data(), tokens);
      std::vector<float> want_part;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t t = 0; t < tokens; ++t) {
          got[r * tokens + t] = y[t * rows + r];
          want_part.push_back(want[r * cols + t] + 0.0f);  // −0: a sum from +0 gives +0
        }
      expect_bits_equal(got, want_part, name + " " + what);
    };
    check(kernels::matmul_ref, cols, "matmul_ref");
    for (kernels::SimdLevel level : kernels::test::supported_levels()) {
      kernels::test::LevelGuard guard(level);
      const std::string at = std::string(" at ") + kernels::test::level_name(level);
      check(kernels::matmul_matvec_f32act_cpu, cols, "f32act matvec" + at);
      check(kernels::matmul_gemm_cpu, cols, "sgemm" + at);
    }
  }
  EXPECT_EQ(formats, 10);
}

TEST(Dequant, TypeInfoAndNbytesMatchGgufPackage) {
  for (const auto& e : manifest()) {
    const std::string name = e["name"];
    const auto type = static_cast<GgmlType>(e["type"].get<uint32_t>());
    const GgmlTypeInfo info = ggml_type_info(type);
    EXPECT_EQ(std::string(info.name), name);
    EXPECT_EQ(info.block_size, e["block_size"].get<int64_t>()) << name;
    EXPECT_EQ(info.type_size, e["type_size"].get<int64_t>()) << name;
    EXPECT_TRUE(info.dequantizable) << name;
    Result<uint64_t> nb = ggml_nbytes(type, e["n"].get<int64_t>());
    ASSERT_TRUE(nb.ok()) << name << ": " << nb.status().to_string();
    EXPECT_EQ(nb.value(), e["nbytes"].get<uint64_t>()) << name;
    if (info.block_size > 1) {
      Result<uint64_t> partial = ggml_nbytes(type, info.block_size + 1);
      EXPECT_FALSE(partial.ok()) << name;
      EXPECT_NE(partial.status().message().find("block size"), std::string::npos)
          << partial.status().message();
    }
  }
}

// 200 copies of the fixture blocks take the OpenMP path; every copy must match the
// single-threaded reference.
TEST(Dequant, LargeBuffersMatchReferenceBlockForBlock) {
  constexpr int k_copies = 200;
  for (const auto& e : manifest()) {
    const std::string name = e["name"];
    const auto type = static_cast<GgmlType>(e["type"].get<uint32_t>());
    const int64_t n = e["n"];
    const std::vector<uint8_t> raw = read_bytes(k_dir + name + ".raw");
    const std::vector<float> want1 = as_floats(read_bytes(k_dir + name + ".f32"));
    std::vector<uint8_t> big;
    std::vector<float> want;
    for (int c = 0; c < k_copies; ++c) {
      big.insert(big.end(), raw.begin(), raw.end());
      want.insert(want.end(), want1.begin(), want1.end());
    }
    std::vector<float> got(want.size(), -1.0f);
    const Status s = dequantize(type, big.data(), got.data(), n * k_copies);
    ASSERT_TRUE(s.ok()) << name << ": " << s.to_string();
    expect_bits_equal(got, want, name + " x" + std::to_string(k_copies));
  }
}

// The one DType <-> GgmlType table (dequant.h): every DType has the ggml type of the same
// block size and bytes, and back; the ggml types without a DType have none.
TEST(Dequant, EveryDTypeHasTheGgmlTypeOfItsBytes) {
  for (const DType t : {DType::f32, DType::f16, DType::bf16, DType::q8_0, DType::q4_0, DType::q4_1, DType::q5_0,
                        DType::q5_1, DType::q4_k, DType::q6_k, DType::q5_k, DType::q3_k, DType::q2_k}) {
    const GgmlType g = ggml_type_of(t);
    const GgmlTypeInfo info = ggml_type_info(g);
    EXPECT_EQ(info.block_size, dtype_block_elems(t)) << dtype_name(t);
    EXPECT_EQ(info.type_size, dtype_block_bytes(t)) << dtype_name(t);
    EXPECT_EQ(std::string(info.name), dtype_name(t)) << dtype_name(t);
    DType back = DType::f32;
    EXPECT_TRUE(dtype_of(g, &back)) << dtype_name(t);
    EXPECT_EQ(back, t) << dtype_name(t);
  }
  for (const GgmlType g : {GgmlType::q8_1, GgmlType::q8_k,
                           static_cast<GgmlType>(200)}) {
    DType t = DType::f32;
    EXPECT_FALSE(dtype_of(g, &t)) << ggml_type_info(g).name;
  }
}

TEST(Dequant, UnknownTypeIsUnimplementedAndNamed) {
  float out[256];
  uint8_t in[512] = {};
  const Status s = dequantize(static_cast<GgmlType>(200), in, out, 32);
  EXPECT_EQ(s.code(), StatusCode::k_unimplemented);
  EXPECT_NE(s.message().find("200"), std::string::npos) << s.message();
  EXPECT_EQ(std::string(ggml_type_info(static_cast<GgmlType>(200)).name), "unknown");
  EXPECT_FALSE(ggml_nbytes(static_cast<GgmlType>(200), 32).ok());
}

TEST(Dequant, Q8KAndQ8_1AreUnimplementedButSized) {
  float out[256];
  uint8_t in[512] = {};
  for (GgmlType t : {GgmlType::q8_k, GgmlType::q8_1}) {
    const GgmlTypeInfo info = ggml_type_info(t);
    const Status s = dequantize(t, in, out, info.block_size);
    EXPECT_EQ(s.code(), StatusCode::k_unimplemented) << info.name;
    EXPECT_NE(s.message().find(info.name), std::string::npos) << s.message();
    EXPECT_TRUE(ggml_nbytes(t, info.block_size).ok()) << info.name;
  }
}

TEST(Dequant, PartialBlockIsInvalidArgument) {
  float out[64];
  uint8_t in[64] = {};
  const Status s = dequantize(GgmlType::q4_1, in, out, 33);
  EXPECT_EQ(s.code(), StatusCode::k_invalid_argument);
  EXPECT_NE(s.message().find("block size"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace snap
