// Safetensors reader: hand-written files (unaligned data, __metadata__, dtypes), single
// vs sharded checkpoints holding identical tensors, and exact f16/bf16 -> f32 conversion
// through the loader (checkpoints from tools/make_tiny_checkpoint.py).
#include <gtest/gtest.h>

#include <cstring>
#include <set>

#include "tests/worker/tiny_checkpoint.h"
#include "worker/model/safetensors.h"
#include "worker/model/weights.h"

namespace snap {
namespace {

using snap::testing::TempDir;

std::string f32_bytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

float read_f32(const uint8_t* p, int64_t i) {
  float f;
  std::memcpy(&f, p + 4 * i, 4);
  return f;
}

TEST(Safetensors, ReadsHandWrittenFileWithUnalignedDataAndMetadata) {
  TempDir dir("st");
  // Two bytes of padding first, so tensor "a" starts at an odd (unaligned) offset.
  const std::vector<float> a = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f, -0.125f};
  const std::vector<uint16_t> b = {0x3c00, 0xc000, 0x7bff};  // f16: 1, -2, 65504
  std::string data = "xx" + f32_bytes(a);
  data.append(reinterpret_cast<const char*>(b.data()), b.size() * 2);
  const std::string header =
      R"({"__metadata__":{"format":"pt"},)"
      R"("a":{"dtype":"F32","shape":[2,3],"data_offsets":[2,26]},)"
      R"("b":{"dtype":"F16","shape":[3],"data_offsets":[26,32]}})";
  snap::testing::write_safetensors_raw(dir / "x.safetensors", header, data);

  Result<SafetensorsModel> m = SafetensorsModel::open(dir / "x.safetensors");
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ(m->tensors().size(), 2u);  // __metadata__ is not a tensor
  const SafetensorsTensor* ta = m->find("a");
  ASSERT_NE(ta, nullptr);
  EXPECT_EQ(ta->dtype, DType::f32);
  EXPECT_EQ(ta->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(ta->num_elements, 6);
  EXPECT_EQ(ta->nbytes, 24u);
  EXPECT_EQ(ta->file, dir / "x.safetensors");
  for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(read_f32(ta->data, i), a[static_cast<size_t>(i)]) << "i=" << i;
  const SafetensorsTensor* tb = m->find("b");
  ASSERT_NE(tb, nullptr);
  EXPECT_EQ(tb->dtype, DType::f16);
  EXPECT_EQ(tb->nbytes, 6u);
  EXPECT_EQ(std::memcmp(tb->data, b.data(), 6), 0);
  EXPECT_EQ(m->find("c"), nullptr);
}

TEST(Safetensors, ZeroSizedTensorAndEmptyHeaderAreFine) {
  TempDir dir("st");
  snap::testing::write_safetensors_raw(dir / "e.safetensors",
                                       R"({"z":{"dtype":"BF16","shape":[0,4],"data_offsets":[0,0]}})", "");
  Result<SafetensorsModel> m = SafetensorsModel::open(dir / "e.safetensors");
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  ASSERT_NE(m->find("z"), nullptr);
  EXPECT_EQ(m->find("z")->num_elements, 0);
  snap::testing::write_safetensors_raw(dir / "n.safetensors", "{}", "");
  Result<SafetensorsModel> n = SafetensorsModel::open(dir / "n.safetensors");
  ASSERT_TRUE(n.ok()) << n.status().to_string();
  EXPECT_TRUE(n->tensors().empty());
}

TEST(Safetensors, ShardedCheckpointHoldsTheSameTensorsAsSingleFile) {
  TempDir dir("st");
  ASSERT_TRUE(snap::testing::make_tiny_checkpoint(dir / "single", "--no-gguf --seed 3"));
  ASSERT_TRUE(snap::testing::make_tiny_checkpoint(dir / "sharded", "--no-gguf --seed 3 --shards 3"));
  ASSERT_FALSE(std::filesystem::exists(dir / "sharded/hf/model.safetensors"));
  Result<SafetensorsModel> single = SafetensorsModel::open(dir / "single/hf");
  Result<SafetensorsModel> sharded = SafetensorsModel::open(dir / "sharded/hf");
  ASSERT_TRUE(single.ok()) << single.status().to_string();
  ASSERT_TRUE(sharded.ok()) << sharded.status().to_string();
  ASSERT_EQ(single->tensors().size(), sharded->tensors().size());
  std::set<std::string> files;
  for (const auto& [name, t] : single->tensors()) {
    const SafetensorsTensor* s = sharded->find(name);
    ASSERT_NE(s, nullptr) << name;
    EXPECT_EQ(s->dtype, t.dtype) << name;
    EXPECT_EQ(s->shape, t.shape) << name;
    ASSERT_EQ(s->nbytes, t.nbytes) << name;
    EXPECT_EQ(std::memcmp(s->data, t.data, t.nbytes), 0) << name;
    files.insert(s->file);
  }
  EXPECT_EQ(files.size(), 3u);  // every shard contributed

  // The loader gives identical weights through either layout.
  Result<LoadedModel> a = load_model(dir / "single/hf");
  Result<LoadedModel> b = load_model(dir / "sharded/hf");
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  EXPECT_EQ(a->weights.nbytes(), b->weights.nbytes());
  const Matrix& wa = a->weights.layers[1].down_proj;
  const Matrix& wb = b->weights.layers[1].down_proj;
  ASSERT_EQ(wa.nbytes(), wb.nbytes());
  EXPECT_EQ(std::memcmp(wa.data(), wb.data(), static_cast<size_t>(wa.nbytes())), 0);
}

// The f16/bf16 checkpoints hold the f32 checkpoint's values rounded to nearest even;
// the loader must turn them back into exactly those f32 values.
void expect_matches_rounded(const Matrix& got, const Matrix& ref, DType rounding, const char* what) {
  ASSERT_EQ(got.dtype(), DType::f32) << what;
  ASSERT_EQ(got.rows(), ref.rows()) << what;
  ASSERT_EQ(got.cols(), ref.cols()) << what;
  int bad = 0;
  for (int64_t i = 0; i < got.rows() * got.cols() && bad < 5; ++i) {
    const float x = ref.f32()[i];
    const float want = rounding == DType::f16 ? f16_to_f32(f32_to_f16(x)) : bf16_to_f32(f32_to_bf16(x));
    if (!(got.f32()[i] == want)) {
      ++bad;
      ADD_FAILURE() << what << "[" << i << "] = " << got.f32()[i] << ", expected " << want;
    }
  }
}

TEST(Safetensors, F16AndBf16CheckpointsConvertExactly) {
  TempDir dir("st");
  ASSERT_TRUE(snap::testing::make_tiny_checkpoint(dir / "f32", "--no-gguf --seed 5"));
  ASSERT_TRUE(snap::testing::make_tiny_checkpoint(dir / "f16", "--no-gguf --seed 5 --dtype f16"));
  ASSERT_TRUE(snap::testing::make_tiny_checkpoint(dir / "bf16", "--no-gguf --seed 5 --dtype bf16 --shards 2"));
  Result<SafetensorsModel> raw = SafetensorsModel::open(dir / "bf16/hf");
  ASSERT_TRUE(raw.ok()) << raw.status().to_string();
  ASSERT_NE(raw->find("model.norm.weight"), nullptr);
  EXPECT_EQ(raw->find("model.norm.weight")->dtype, DType::bf16);

  Result<LoadedModel> ref = load_model(dir / "f32/hf");
  ASSERT_TRUE(ref.ok()) << ref.status().to_string();
  for (DType dt : {DType::f16, DType::bf16}) {
    Result<LoadedModel> m = load_model(dir / (std::string(dtype_name(dt)) + "/hf"));
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    expect_matches_rounded(m->weights.embed, ref->weights.embed, dt, "embed");
    expect_matches_rounded(m->weights.layers[0].q_proj, ref->weights.layers[0].q_proj, dt, "q_proj");
    expect_matches_rounded(m->weights.layers[1].ffn_norm, ref->weights.layers[1].ffn_norm, dt, "ffn_norm");
    expect_matches_rounded(m->weights.lm_head, ref->weights.lm_head, dt, "lm_head");
  }
}

TEST(Safetensors, ProjectionStorageDtypeIsHonoured) {
  TempDir dir("st");
  ASSERT_TRUE(snap::testing::make_tiny_checkpoint(dir / "m", "--no-gguf --seed 9"));
  Result<LoadedModel> ref = load_model(dir / "m/hf");
  ASSERT_TRUE(ref.ok()) << ref.status().to_string();
  for (DType dt : {DType::f16, DType::bf16}) {
    Result<LoadedModel> m = load_model(dir / "m/hf", LoadOptions{dt});
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    const LayerWeights& l = m->weights.layers[0];
    EXPECT_EQ(m->weights.embed.dtype(), DType::f32);
    EXPECT_EQ(l.attn_norm.dtype(), DType::f32);
    ASSERT_EQ(l.gate_proj.dtype(), dt);
    EXPECT_EQ(l.gate_proj.nbytes(), l.gate_proj.rows() * l.gate_proj.cols() * 2);
    const auto* bits = static_cast<const uint16_t*>(l.gate_proj.data());
    const float* want = ref->weights.layers[0].gate_proj.f32();
    for (int64_t i = 0; i < l.gate_proj.rows() * l.gate_proj.cols(); ++i) {
      const uint16_t expect = dt == DType::f16 ? f32_to_f16(want[i]) : f32_to_bf16(want[i]);
      ASSERT_EQ(bits[i], expect) << dtype_name(dt) << " i=" << i;
    }
    EXPECT_LT(m->weights.nbytes(), ref->weights.nbytes());
  }
}

}  // namespace
}  // namespace snap
