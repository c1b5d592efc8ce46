// GGUF reader: the fixture tests/fixtures/gguf/tiny.gguf (written by gguf.GGUFWriter,
// expected values in tiny.json from gguf.GGUFReader), the real default model, and a table
// of corrupted files written here (bad fields, truncations) that must each give a non-ok
// Status naming the file and the problem, without crashing.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "worker/model/gguf.h"

namespace snap {
namespace {

namespace fs = std::filesystem;

const std::string k_fixture = std::string(SNAP_SOURCE_DIR) + "/tests/fixtures/gguf/tiny.gguf";

nlohmann::json expected() {
  std::ifstream in(std::string(SNAP_SOURCE_DIR) + "/tests/fixtures/gguf/tiny.json");
  EXPECT_TRUE(in.good()) << "cannot open tiny.json";
  return nlohmann::json::parse(in);
}

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << "cannot write " << path;
}

std::string to_hex(const uint8_t* p, uint64_t n) {
  static const char* k_digits = "0123456789abcdef";
  std::string s;
  for (uint64_t i = 0; i < n; ++i) {
    s += k_digits[p[i] >> 4];
    s += k_digits[p[i] & 15];
  }
  return s;
}

GgufFile open_ok(const std::string& path) {
  Result<GgufFile> r = GgufFile::open(path);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return std::move(r).value();
}

// --- the fixture written by gguf.GGUFWriter ---------------------------------------------

TEST(Gguf, FixtureHeader) {
  const nlohmann::json want = expected();
  GgufFile f = open_ok(k_fixture);
  EXPECT_EQ(f.path(), k_fixture);
  EXPECT_EQ(f.version(), want["version"].get<uint32_t>());
  EXPECT_EQ(f.alignment(), want["alignment"].get<uint64_t>());
  EXPECT_EQ(f.file_size(), want["file_size"].get<uint64_t>());
  EXPECT_EQ(f.metadata().size(), want["kv_count"].get<size_t>());
  EXPECT_EQ(f.tensors().size(), want["tensor_count"].get<size_t>());
  EXPECT_EQ(f.get_string("general.architecture").value(), want["architecture"].get<std::string>());
}

TEST(Gguf, FixtureScalarMetadata) {
  GgufFile f = open_ok(k_fixture);
  const nlohmann::json want = expected();
  for (const auto& m : want["metadata"]) {
    const std::string key = m["key"];
    const GgufValue* v = f.find(key);
    ASSERT_NE(v, nullptr) << key;
    const auto type = static_cast<GgufType>(m["type"].get<uint32_t>());
    EXPECT_EQ(v->type, type) << key;
    switch (type) {
      case GgufType::u64:
        EXPECT_EQ(v->u, m["value"].get<uint64_t>()) << key;
        EXPECT_EQ(f.get_int(key).status().code(), StatusCode::k_invalid_argument) << key;
        break;
      case GgufType::u8: case GgufType::i8: case GgufType::u16: case GgufType::i16:
      case GgufType::u32: case GgufType::i32: case GgufType::i64:
        EXPECT_EQ(f.get_int(key).value(), m["value"].get<int64_t>()) << key;
        EXPECT_EQ(v->i, m["value"].get<int64_t>()) << key;
        break;
      case GgufType::f32: case GgufType::f64:
        EXPECT_EQ(f.get_float(key).value(), m["value"].get<double>()) << key;
        break;
      case GgufType::boolean:
        EXPECT_EQ(f.get_bool(key).value(), m["value"].get<bool>()) << key;
        break;
      case GgufType::string:
        EXPECT_EQ(f.get_string(key).value(), m["value"].get<std::string>()) << key;
        break;
      case GgufType::array:
        break;  // FixtureArrays
    }
  }
}

TEST(Gguf, FixtureArrays) {
  GgufFile f = open_ok(k_fixture);
  int checked = 0;
  const nlohmann::json want = expected();
  for (const auto& m : want["metadata"]) {
    if (static_cast<GgufType>(m["type"].get<uint32_t>()) != GgufType::array) continue;
    const std::string key = m["key"];
    const GgufValue* v = f.find(key);
    ASSERT_NE(v, nullptr) << key;
    ASSERT_EQ(v->type, GgufType::array) << key;
    const auto elem = static_cast<GgufType>(m["elem_type"].get<uint32_t>());
    EXPECT_EQ(v->elem_type, elem) << key;
    ASSERT_EQ(v->arr.size(), m["value"].size()) << key;
    ++checked;
    if (elem == GgufType::string) {
      EXPECT_EQ(f.get_string_array(key).value(), m["value"].get<std::vector<std::string>>()) << key;
    } else if (elem == GgufType::f32 || elem == GgufType::f64) {
      EXPECT_EQ(f.get_float_array(key).value(), m["value"].get<std::vector<double>>()) << key;
    } else if (elem == GgufType::boolean) {
      const auto want = m["value"].get<std::vector<bool>>();
      for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(v->arr[i].b, want[i]) << key << "[" << i << "]";
    } else if (elem == GgufType::array) {
      for (size_t i = 0; i < v->arr.size(); ++i) {
        const auto want = m["value"][i].get<std::vector<int64_t>>();
        ASSERT_EQ(v->arr[i].type, GgufType::array);
        ASSERT_EQ(v->arr[i].arr.size(), want.size()) << key << "[" << i << "]";
        for (size_t j = 0; j < want.size(); ++j) EXPECT_EQ(v->arr[i].arr[j].i, want[j]);
      }
    } else {
      EXPECT_EQ(f.get_int_array(key).value(), m["value"].get<std::vector<int64_t>>()) << key;
    }
  }
  EXPECT_EQ(checked, 7);
}

TEST(Gguf, GettersRejectMissingKeysAndWrongTypes) {
  GgufFile f = open_ok(k_fixture);
  EXPECT_EQ(f.get_int("no.such.key").status().code(), StatusCode::k_not_found);
  EXPECT_NE(f.get_int("no.such.key").status().message().find(k_fixture), std::string::npos);
  EXPECT_EQ(f.get_int("test.string").status().code(), StatusCode::k_invalid_argument);
  EXPECT_EQ(f.get_float("test.i32").status().code(), StatusCode::k_invalid_argument);
  EXPECT_EQ(f.get_string("test.f32").status().code(), StatusCode::k_invalid_argument);
  EXPECT_EQ(f.get_bool("test.u8").status().code(), StatusCode::k_invalid_argument);
  EXPECT_EQ(f.get_string_array("test.arr_i32").status().code(), StatusCode::k_invalid_argument);
  EXPECT_EQ(f.get_int_array("test.arr_str").status().code(), StatusCode::k_invalid_argument);
  EXPECT_EQ(f.get_float_array("test.arr_i32").status().code(), StatusCode::k_invalid_argument);
  EXPECT_EQ(f.get_int_array("test.i32").status().code(), StatusCode::k_invalid_argument);
  const std::string msg = f.get_int("test.string").status().message();
  EXPECT_NE(msg.find("test.string"), std::string::npos) << msg;
}

TEST(Gguf, FixtureTensors) {
  GgufFile f = open_ok(k_fixture);
  const nlohmann::json want = expected();
  ASSERT_EQ(f.tensors().size(), want["tensors"].size());
  for (size_t i = 0; i < want["tensors"].size(); ++i) {
    const auto& w = want["tensors"][i];
    const GgufTensor& t = f.tensors()[i];
    EXPECT_EQ(t.name, w["name"].get<std::string>());
    EXPECT_EQ(static_cast<uint32_t>(t.type), w["type"].get<uint32_t>()) << t.name;
    EXPECT_EQ(t.dims, w["dims"].get<std::vector<int64_t>>()) << t.name;
    int64_t n = 1;
    for (int64_t d : t.dims) n *= d;
    EXPECT_EQ(t.num_elements, n) << t.name;
    EXPECT_EQ(t.offset, w["offset"].get<uint64_t>()) << t.name;
    EXPECT_EQ(t.offset % f.alignment(), 0u) << t.name;
    EXPECT_EQ(t.nbytes, w["nbytes"].get<uint64_t>()) << t.name;
    ASSERT_NE(t.data, nullptr) << t.name;
    EXPECT_EQ(to_hex(t.data, t.nbytes), w["data_hex"].get<std::string>()) << t.name;
    EXPECT_EQ(f.find_tensor(t.name), &t) << t.name;
  }
  EXPECT_EQ(f.find_tensor("no.such.tensor"), nullptr);
}

// Copies share the mapping: tensor data stays readable after the original is gone.
TEST(Gguf, CopyOutlivesOriginal) {
  std::vector<GgufFile> keep;
  {
    GgufFile f = open_ok(k_fixture);
    keep.push_back(f);
  }
  const nlohmann::json want = expected();
  const GgufTensor* t = keep[0].find_tensor("t.q8_0");
  ASSERT_NE(t, nullptr);
  for (const auto& w : want["tensors"]) {
    if (w["name"] == "t.q8_0") {
      EXPECT_EQ(to_hex(t->data, t->nbytes), w["data_hex"].get<std::string>());
    }
  }
}

// --- the real default model ---------------------------------------------------------

std::string default_model_path() {
  if (const char* env = std::getenv("SNAP_MODEL"); env && *env) return env;
  const char* home = std::getenv("HOME");
  return std::string(home ? home : "") + "/.cache/snapserve/SmolLM2-135M-Instruct.Q4_1.gguf";
}

TEST(Gguf, DefaultModel) {
  const std::string path = default_model_path();
  ASSERT_TRUE(fs::exists(path)) << "default model not found at " << path
                                << " (set SNAP_MODEL or run the setup step that downloads it)";
  GgufFile f = open_ok(path);
  EXPECT_EQ(f.get_string("general.architecture").value(), "llama");
  EXPECT_EQ(f.get_int("llama.block_count").value(), 30);
  EXPECT_EQ(f.get_int("llama.embedding_length").value(), 576);
  EXPECT_EQ(f.get_int("llama.attention.head_count").value(), 9);
  EXPECT_EQ(f.get_int("llama.attention.head_count_kv").value(), 3);
  EXPECT_EQ(f.alignment(), 32u);  // the file sets no general.alignment: the default
  EXPECT_EQ(f.find("general.alignment"), nullptr);
  EXPECT_EQ(f.tensors().size(), 272u);
  EXPECT_EQ(f.get_string_array("tokenizer.ggml.tokens").value().size(), 49152u);

  const GgufTensor* emb = f.find_tensor("token_embd.weight");
  ASSERT_NE(emb, nullptr);
  EXPECT_EQ(emb->type, GgmlType::q8_0);
  EXPECT_EQ(emb->dims, (std::vector<int64_t>{576, 49152}));
  const GgufTensor* q = f.find_tensor("blk.29.attn_q.weight");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->type, GgmlType::q4_1);
  EXPECT_EQ(q->dims, (std::vector<int64_t>{576, 576}));
  const GgufTensor* norm = f.find_tensor("blk.0.attn_norm.weight");
  ASSERT_NE(norm, nullptr);
  EXPECT_EQ(norm->type, GgmlType::f32);
  int blocks_with_q = 0;
  for (int i = 0; i < 64; ++i) blocks_with_q += f.find_tensor("blk." + std::to_string(i) + ".attn_q.weight") != nullptr;
  EXPECT_EQ(blocks_with_q, 30);
  for (const GgufTensor& t : f.tensors()) {
    EXPECT_EQ(t.offset % f.alignment(), 0u) << t.name;
    EXPECT_LE(t.offset + t.nbytes, f.file_size()) << t.name;
  }
}

// --- bad input ----------------------------------------------------------------------

// A small valid GGUF v3 built field by field, remembering where each field sits so a
// test can corrupt exactly one of them.
struct Built {
  std::vector<uint8_t> bytes;
  size_t kv_count_pos = 0, kv_start = 0, arch_len_pos = 0, align_type_pos = 0;
  size_t array_len_pos = 0, tensor_table_start = 0, a_name_pos = 0, a_n_dims_pos = 0;
  size_t a_dim0_pos = 0, a_type_pos = 0, b_name_pos = 0, b_offset_pos = 0, data_start = 0;
};

class Builder {
 public:
  template <typename T>
  size_t put(T v) {
    const size_t pos = b_.size();
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    b_.insert(b_.end(), p, p + sizeof(T));
    return pos;
  }
  size_t put_string(const std::string& s) {
    const size_t pos = put<uint64_t>(s.size());
    b_.insert(b_.end(), s.begin(), s.end());
    return pos;
  }
  void pad_to(size_t alignment) {
    while (b_.size() % alignment) b_.push_back(0);
  }
  size_t size() const { return b_.size(); }
  std::vector<uint8_t>& bytes() { return b_; }

 private:
  std::vector<uint8_t> b_;
};

// tensors: "a" f32 [32, 2] at offset 0 (256 bytes), "b" q8_0 [32] at offset 256 (34 bytes).
Built build_valid() {
  Built out;
  Builder w;
  w.put<uint32_t>(0x46554747);  // "GGUF"
  w.put<uint32_t>(3);
  w.put<uint64_t>(2);
  out.kv_count_pos = w.put<uint64_t>(3);
  out.kv_start = w.size();
  w.put_string("general.architecture");
  w.put<uint32_t>(8);
  out.arch_len_pos = w.put_string("llama");
  w.put_string("general.alignment");
  out.align_type_pos = w.put<uint32_t>(4);
  w.put<uint32_t>(32);
  w.put_string("tokenizer.ggml.token_type");
  w.put<uint32_t>(9);
  w.put<uint32_t>(5);
  out.array_len_pos = w.put<uint64_t>(3);
  for (int32_t v : {1, 2, 3}) w.put<int32_t>(v);
  out.tensor_table_start = w.size();
  out.a_name_pos = w.put_string("a");
  out.a_n_dims_pos = w.put<uint32_t>(2);
  out.a_dim0_pos = w.put<uint64_t>(32);
  w.put<uint64_t>(2);
  out.a_type_pos = w.put<uint32_t>(0);
  w.put<uint64_t>(0);
  out.b_name_pos = w.put_string("b");
  w.put<uint32_t>(1);
  w.put<uint64_t>(32);
  w.put<uint32_t>(8);
  out.b_offset_pos = w.put<uint64_t>(256);
  w.pad_to(32);
  out.data_start = w.size();
  for (int i = 0; i < 256 + 34; ++i) w.put<uint8_t>(static_cast<uint8_t>(i * 7));
  out.bytes = w.bytes();
  return out;
}

template <typename T>
std::vector<uint8_t> patched(std::vector<uint8_t> b, size_t pos, T v) {
  std::memcpy(b.data() + pos, &v, sizeof(T));
  return b;
}

std::vector<uint8_t> cut(const std::vector<uint8_t>& b, size_t n) {
  return std::vector<uint8_t>(b.begin(), b.begin() + static_cast<std::ptrdiff_t>(n));
}

class GgufBadInput : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "snap_gguf_XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  // Writes bytes to dir_/name and expects open() to fail naming the path and `keyword`.
  void expect_error(const std::string& name, const std::vector<uint8_t>& bytes,
                    const std::string& keyword) {
    const std::string path = dir_ + "/" + name;
    write_bytes(path, bytes);
    expect_error_at(path, keyword);
  }
  void expect_error_at(const std::string& path, const std::string& keyword) {
    Result<GgufFile> r = GgufFile::open(path);
    ASSERT_FALSE(r.ok()) << path << " opened but should not have";
    const std::string& msg = r.status().message();
    EXPECT_EQ(msg.rfind(path, 0), 0u) << "message does not start with the path: " << msg;
    EXPECT_NE(msg.find(keyword), std::string::npos) << "expected '" << keyword << "' in: " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "message is not one line: " << msg;
  }

  std::string dir_;
};

TEST_F(GgufBadInput, BuiltFileIsValid) {
  const Built b = build_valid();
  const std::string path = dir_ + "/valid.gguf";
  write_bytes(path, b.bytes);
  GgufFile f = open_ok(path);
  ASSERT_EQ(f.tensors().size(), 2u);
  EXPECT_EQ(f.tensors()[1].offset, b.data_start + 256);
  EXPECT_EQ(f.get_int_array("tokenizer.ggml.token_type").value(), (std::vector<int64_t>{1, 2, 3}));
}

TEST_F(GgufBadInput, CorruptFieldsTable) {
  const Built b = build_valid();
  const auto& v = b.bytes;
  struct Case {
    std::string name;
    std::vector<uint8_t> bytes;
    std::string keyword;
  };
  std::vector<uint8_t> wrong_magic = v;
  std::memcpy(wrong_magic.data(), "GGML", 4);
  std::vector<uint8_t> dup_name = v;
  dup_name[b.b_name_pos + 8] = 'a';
  const std::vector<Case> cases = {
      {"wrong_magic.gguf", wrong_magic, "magic"},
      {"version1.gguf", patched<uint32_t>(v, 4, 1), "version 1"},
      {"version99.gguf", patched<uint32_t>(v, 4, 99), "version 99"},
      {"big_endian.gguf", patched<uint32_t>(v, 4, 0x03000000), "big-endian"},
      {"offset_past_end.gguf", patched<uint64_t>(v, b.b_offset_pos, 4096), "past end of file"},
      {"offset_huge.gguf", patched<uint64_t>(v, b.b_offset_pos, ~uint64_t{31}), "past end of file"},
      {"misaligned.gguf", patched<uint64_t>(v, b.b_offset_pos, 258), "misaligned"},
      {"huge_string.gguf", patched<uint64_t>(v, b.arch_len_pos, uint64_t{1} << 60), "string length"},
      {"huge_key.gguf", patched<uint64_t>(v, b.kv_start, ~uint64_t{0}), "string length"},
      {"huge_array.gguf", patched<uint64_t>(v, b.array_len_pos, uint64_t{1} << 61), "array length"},
      {"huge_kv_count.gguf", patched<uint64_t>(v, b.kv_count_pos, uint64_t{1} << 40), "kv_count"},
      {"huge_tensor_count.gguf", patched<uint64_t>(v, 8, uint64_t{1} << 40), "tensor_count"},
      {"n_dims7.gguf", patched<uint32_t>(v, b.a_n_dims_pos, 7), "n_dims 7"},
      {"zero_dim.gguf", patched<uint64_t>(v, b.a_dim0_pos, 0), "dimension"},
      {"negative_dim.gguf", patched<uint64_t>(v, b.a_dim0_pos, ~uint64_t{0}), "dimension"},
      {"overflow_dims.gguf", patched<uint64_t>(v, b.a_dim0_pos, uint64_t{1} << 62), "overflow"},
      {"ggml_type200.gguf", patched<uint32_t>(v, b.a_type_pos, 200), "unknown ggml type 200"},
      {"value_type13.gguf", patched<uint32_t>(v, b.align_type_pos, 13), "unknown value type 13"},
      {"alignment_not_pow2.gguf", patched<uint32_t>(v, b.align_type_pos + 4, 48), "alignment"},
      {"duplicate_tensor.gguf", dup_name, "duplicate tensor"},
      {"empty.gguf", {}, "truncated"},
      {"mid_header.gguf", cut(v, 12), "truncated"},
      {"mid_metadata.gguf", cut(v, b.kv_start + 30), "truncated"},
      {"mid_tensor_table.gguf", cut(v, b.a_n_dims_pos + 2), "truncated"},
      {"mid_data.gguf", cut(v, b.data_start + 100), "past end of file"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    expect_error(c.name, c.bytes, c.keyword);
  }
}

TEST_F(GgufBadInput, UnknownTypeMessageNamesTensor) {
  const Built b = build_valid();
  const std::string path = dir_ + "/t200.gguf";
  write_bytes(path, patched<uint32_t>(b.bytes, b.a_type_pos, 200));
  Result<GgufFile> r = GgufFile::open(path);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("'a'"), std::string::npos) << r.status().message();
}

TEST_F(GgufBadInput, PastEndMessageNamesTensorEndAndSize) {
  const Built b = build_valid();
  const std::string path = dir_ + "/past.gguf";
  write_bytes(path, cut(b.bytes, b.data_start + 100));
  Result<GgufFile> r = GgufFile::open(path);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::k_data_loss);
  const std::string want = path + ": tensor 'a' data ends at " + std::to_string(b.data_start + 256) +
                           " past end of file (" + std::to_string(b.data_start + 100) + " bytes)";
  EXPECT_EQ(r.status().message(), want);
}

TEST_F(GgufBadInput, NonexistentPathIsNotFound) {
  const std::string path = dir_ + "/does_not_exist.gguf";
  Result<GgufFile> r = GgufFile::open(path);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::k_not_found);
  EXPECT_EQ(r.status().message(), path + ": no such file");
}

TEST_F(GgufBadInput, DirectoryIsRejected) { expect_error_at(dir_, "not a regular file"); }

// Every prefix of the fixture that cuts into the last tensor's data must fail cleanly.
TEST_F(GgufBadInput, EveryTruncationOfFixtureFails) {
  const std::vector<uint8_t> full = read_bytes(k_fixture);
  GgufFile f = open_ok(k_fixture);
  uint64_t data_end = 0;
  for (const GgufTensor& t : f.tensors()) data_end = std::max(data_end, t.offset + t.nbytes);
  ASSERT_GT(data_end, 0u);
  const std::string path = dir_ + "/prefix.gguf";
  write_bytes(path, full);
  for (uint64_t n = data_end; n-- > 0;) {
    ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(n)), 0) << "cannot truncate " << path;
    Result<GgufFile> r = GgufFile::open(path);
    ASSERT_FALSE(r.ok()) << "prefix of " << n << " bytes opened";
    ASSERT_EQ(r.status().message().rfind(path, 0), 0u) << r.status().message();
  }
}

// Any single corrupted byte in the header, metadata or tensor table either opens to a file
// whose tensors all lie inside it, or fails with a message naming the file; never crashes
// (this test runs under ASan/UBSan in CI).
TEST_F(GgufBadInput, SingleByteCorruptionsNeverCrash) {
  const std::vector<uint8_t> full = read_bytes(k_fixture);
  const uint64_t data_start = expected()["data_start"].get<uint64_t>();
  const std::string path = dir_ + "/flip.gguf";
  write_bytes(path, full);
  // Patch in place: rewriting the whole file per case is ~100x slower on overlay filesystems.
  const int fd = ::open(path.c_str(), O_WRONLY);
  ASSERT_GE(fd, 0) << "cannot open " << path;
  auto put_byte = [&](uint64_t pos, uint8_t value) {
    ASSERT_EQ(::pwrite(fd, &value, 1, static_cast<off_t>(pos)), 1) << "cannot write " << path;
  };
  int failures = 0;
  for (uint64_t pos = 0; pos < data_start; ++pos) {
    for (uint8_t value : {uint8_t{0x00}, uint8_t{0x7f}, uint8_t{0xff}}) {
      if (full[pos] == value) continue;
      put_byte(pos, value);
      Result<GgufFile> r = GgufFile::open(path);
      put_byte(pos, full[pos]);
      if (!r.ok()) {
        ++failures;
        ASSERT_EQ(r.status().message().rfind(path, 0), 0u) << r.status().message();
        continue;
      }
      for (const GgufTensor& t : r.value().tensors()) {
        ASSERT_LE(t.offset + t.nbytes, r.value().file_size()) << "byte " << pos << ": " << t.name;
      }
    }
  }
  ::close(fd);
  EXPECT_GT(failures, 0);
}

}  // namespace
}  // namespace snap
