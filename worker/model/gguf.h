// GGUF v2/v3 reader (the llama.cpp file format): header, typed metadata, tensor table,
// alignment, and the tensor data mmapped read-only. Every structural problem (truncated
// file, bad magic, tensor past the end, overflowing sizes) is a one-line Status naming
// the file and what is wrong; nothing here aborts on bad input.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace snap {

// ggml tensor types (numbering is the file format's).
enum class GgmlType : uint32_t {
  f32 = 0, f16 = 1, q4_0 = 2, q4_1 = 3, q5_0 = 6, q5_1 = 7, q8_0 = 8, q8_1 = 9,
  q2_k = 10, q3_k = 11, q4_k = 12, q5_k = 13, q6_k = 14, q8_k = 15, bf16 = 30,
};

// GGUF metadata value types (numbering is the file format's).
enum class GgufType : uint32_t {
  u8 = 0, i8 = 1, u16 = 2, i16 = 3, u32 = 4, i32 = 5, f32 = 6, boolean = 7,
  string = 8, array = 9, u64 = 10, i64 = 11, f64 = 12,
};

struct GgufValue {
  GgufType type = GgufType::u32;
  // Scalars: integers in i (signed) / u (unsigned), floats in f, bool in b. Every integer
  // type fills both i and u; floats also fill f only.
  int64_t i = 0;
  uint64_t u = 0;
  double f = 0.0;
  bool b = false;
  std::string s;                // string
  GgufType elem_type = GgufType::u8;  // array element type
  std::vector<GgufValue> arr;   // array elements
};

struct GgufTensor {
  std::string name;
  GgmlType type = GgmlType::f32;
  std::vector<int64_t> dims;  // ggml order: dims[0] is the innermost (contiguous) dimension
  int64_t num_elements = 0;
  uint64_t offset = 0;        // absolute byte offset in the file
  uint64_t nbytes = 0;
  const uint8_t* data = nullptr;  // into the mapping
};

class GgufFile {
 public:
  static Result<GgufFile> open(const std::string& path);

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t file_size() const { return file_size_; }

  const GgufValue* find(const std::string& key) const;
  const std::map<std::string, GgufValue>& metadata() const { return metadata_; }
  // Typed lookups: not_found if absent, invalid_argument if the type does not fit.
  Result<int64_t> get_int(const std::string& key) const;
  Result<double> get_float(const std::string& key) const;
  Result<bool> get_bool(const std::string& key) const;
  Result<std::string> get_string(const std::string& key) const;
  Result<std::vector<std::string>> get_string_array(const std::string& key) const;
  Result<std::vector<int64_t>> get_int_array(const std::string& key) const;
  Result<std::vector<double>> get_float_array(const std::string& key) const;

  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  const GgufTensor* find_tensor(const std::string& name) const;

 private:
  std::string path_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t file_size_ = 0;
  std::shared_ptr<void> mapping_;  // keeps the mmap alive; copies share it
  std::map<std::string, GgufValue> metadata_;
  std::vector<GgufTensor> tensors_;
  std::map<std::string, size_t> tensor_index_;
};

}  // namespace snap
