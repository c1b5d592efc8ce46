// Safetensors reader: one `*.safetensors` file, or a Hugging Face directory with a
// single `model.safetensors` or sharded files listed in `model.safetensors.index.json`.
// Files are mmapped read-only; header sizes and offsets are validated against the
// file size (a header that lies is a one-line Status, never a read past the end).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"

namespace snap {

struct SafetensorsTensor {
  std::string name;
  DType dtype = DType::f32;    // F32, F16, BF16 supported; others are an error at open
  std::vector<int64_t> shape;  // row-major, outermost first (PyTorch order)
  int64_t num_elements = 0;
  const uint8_t* data = nullptr;
  uint64_t nbytes = 0;
  std::string file;  // which shard it came from
};

class SafetensorsModel {
 public:
  // path: a .safetensors file, or a directory holding model.safetensors or
  // model.safetensors.index.json (+ shards).
  static Result<SafetensorsModel> open(const std::string& path);

  const SafetensorsTensor* find(const std::string& name) const;
  const std::map<std::string, SafetensorsTensor>& tensors() const { return tensors_; }

 private:
  std::vector<std::shared_ptr<void>> mappings_;
  std::map<std::string, SafetensorsTensor> tensors_;
};

}  // namespace snap
