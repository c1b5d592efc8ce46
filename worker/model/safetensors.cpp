// Safetensors reader. File layout: u64 little-endian header length N, N bytes of JSON
// header {name: {dtype, shape, data_offsets: [begin, end)}, "__metadata__": {...}}, then
// the data section; offsets are relative to its start. Each file is mmapped read-only
// once; every size and offset is checked against the file before a pointer is formed.
#include "worker/model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

namespace snap {
namespace {

using json = nlohmann::json;

// ---------------------------------------------------------------------------
// mmap

struct Mapping {
  std::shared_ptr<void> keep;  // munmaps when the last owner goes
  const uint8_t* data = nullptr;
  uint64_t size = 0;
};

Result<Mapping> map_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) return not_found(path + ": no such file");
    return invalid_argument(path + ": cannot open: " + std::strerror(err));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return invalid_argument(path + ": not a regular file");
  }
  Mapping m;
  m.size = static_cast<uint64_t>(st.st_size);
  if (m.size < 8) {
    ::close(fd);
    return data_loss(path + ": file is " + std::to_string(m.size) +
                     " bytes, too short for a safetensors header");
  }
  void* p = ::mmap(nullptr, m.size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int err = errno;
  ::close(fd);
  if (p == MAP_FAILED) return internal_error(path + ": mmap failed: " + std::strerror(err));
  const uint64_t size = m.size;
  m.keep = std::shared_ptr<void>(p, [size](void* q) { ::munmap(q, size); });
  m.data = static_cast<const uint8_t*>(p);
  return m;
}

// ---------------------------------------------------------------------------
// header parsing

// Returns the element size, or 0 for a dtype we know but do not load.
int dtype_from_name(const std::string& name, DType* out) {
  if (name == "F32") { *out = DType::f32; return 4; }
  if (name == "F16") { *out = DType::f16; return 2; }
  if (name == "BF16") { *out = DType::bf16; return 2; }
  return 0;
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << ']';
  return os.str();
}

// Parses one tensor entry; `data` / `data_size` describe the file's data section.
Status parse_entry(const std::string& path, const std::string& name, const json& e,
                   const uint8_t* data, uint64_t data_size, SafetensorsTensor* t) {
  const std::string where = path + ": tensor '" + name + "'";
  if (!e.is_object()) return data_loss(where + ": header entry is not an object");
  const auto dt = e.find("dtype");
  const auto sh = e.find("shape");
  const auto off = e.find("data_offsets");
  if (dt == e.end() || !dt->is_string()) return data_loss(where + ": missing string 'dtype'");
  if (sh == e.end() || !sh->is_array()) return data_loss(where + ": missing array 'shape'");
  if (off == e.end() || !off->is_array() || off->size() != 2)
    return data_loss(where + ": 'data_offsets' must be [begin, end]");

  const std::string dtype_str = dt->get<std::string>();
  const int esize = dtype_from_name(dtype_str, &t->dtype);
  if (esize == 0)
    return unimplemented(where + " has dtype " + dtype_str + " (supported: F32, F16, BF16)");

  // Bound each dimension and the product so numel * esize cannot overflow.
  constexpr int64_t k_max_elements = int64_t{1} << 48;
  int64_t numel = 1;
  for (const json& d : *sh) {
    if (!d.is_number_integer() || d.get<int64_t>() < 0)
      return data_loss(where + ": shape entries must be non-negative integers");
    const int64_t v = d.get<int64_t>();
    if (v != 0 && numel > k_max_elements / v)
      return data_loss(where + ": shape " + sh->dump() + " is too large");
    numel *= v;
    t->shape.push_back(v);
  }
  const json& b = (*off)[0];
  const json& en = (*off)[1];
  if (!b.is_number_unsigned() || !en.is_number_unsigned())
    return data_loss(where + ": 'data_offsets' must be non-negative integers");
  const uint64_t begin = b.get<uint64_t>();
  const uint64_t end = en.get<uint64_t>();
  if (begin > end || end > data_size)
    return data_loss(where + ": data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                     ") outside the data section of " + std::to_string(data_size) + " bytes");
  const uint64_t want = static_cast<uint64_t>(numel) * static_cast<uint64_t>(esize);
  if (end - begin != want)
    return data_loss(where + ": data_offsets span " + std::to_string(end - begin) + " bytes but " +
                     dtype_str + " " + shape_string(t->shape) + " needs " + std::to_string(want));
  t->name = name;
  t->num_elements = numel;
  t->nbytes = want;
  t->data = data + begin;
  t->file = path;
  return Status();
}

// Maps one .safetensors file and adds its tensors to `out`; a name already present is
// an error (two shards claiming one tensor).
Status load_file(const std::string& path, std::vector<std::shared_ptr<void>>* mappings,
                 std::map<std::string, SafetensorsTensor>* out) {
  SNAP_ASSIGN_OR_RETURN(Mapping m, map_file(path));
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | m.data[i];
  if (header_len > m.size - 8)
    return data_loss(path + ": header length " + std::to_string(header_len) + " runs past the end of the " +
                     std::to_string(m.size) + "-byte file");
  const char* hbegin = reinterpret_cast<const char*>(m.data + 8);
  const json header = json::parse(hbegin, hbegin + header_len, nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded()) return data_loss(path + ": header is not valid JSON");
  if (!header.is_object()) return data_loss(path + ": header is not a JSON object");

  const uint8_t* data = m.data + 8 + header_len;
  const uint64_t data_size = m.size - 8 - header_len;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    SafetensorsTensor t;
    SNAP_RETURN_IF_ERROR(parse_entry(path, name, entry, data, data_size, &t));
    if (out->count(name)) {
      return data_loss(path + ": tensor '" + name + "' also appears in " + out->at(name).file);
    }
    out->emplace(name, std::move(t));
  }
  mappings->push_back(std::move(m.keep));
  return Status();
}

Result<json> read_json_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found(path + ": cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  json j = json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return data_loss(path + ": not valid JSON");
  return j;
}

// Sharded checkpoint: weight_map {tensor: shard file}; every shard opened once, and every
// tensor the index names must be in the shard it names.
Status load_index(const std::string& index_path, std::vector<std::shared_ptr<void>>* mappings,
                  std::map<std::string, SafetensorsTensor>* out) {
  SNAP_ASSIGN_OR_RETURN(json index, read_json_file(index_path));
  const auto wm = index.is_object() ? index.find("weight_map") : index.end();
  if (wm == index.end() || !wm->is_object())
    return data_loss(index_path + ": missing object 'weight_map'");
  const std::filesystem::path dir = std::filesystem::path(index_path).parent_path();
  std::set<std::string> shards;
  for (const auto& [name, file] : wm->items()) {
    if (!file.is_string()) return data_loss(index_path + ": weight_map['" + name + "'] is not a string");
    const std::string f = file.get<std::string>();
    if (f.empty() || f.find('/') != std::string::npos || f == "." || f == "..")
      return data_loss(index_path + ": weight_map['" + name + "'] names '" + f + "', not a file in this directory");
    shards.insert(f);
  }
  if (shards.empty()) return data_loss(index_path + ": weight_map is empty");
  for (const std::string& f : shards) {
    SNAP_RETURN_IF_ERROR(load_file((dir / f).string(), mappings, out));
  }
  for (const auto& [name, file] : wm->items()) {
    const std::string shard = (dir / file.get<std::string>()).string();
    const auto it = out->find(name);
    if (it == out->end())
      return not_found(index_path + ": tensor '" + name + "' is listed for " + shard + " but not in it");
    if (it->second.file != shard)
      return data_loss(index_path + ": tensor '" + name + "' is listed for " + shard + " but is in " +
                       it->second.file);
  }
  return Status();
}

}  // namespace

// ---------------------------------------------------------------------------

Result<SafetensorsModel> SafetensorsModel::open(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (ec || !fs::exists(st)) return not_found(path + ": no such file or directory");

  SafetensorsModel model;
  if (fs::is_directory(st)) {
    const fs::path single = fs::path(path) / "model.safetensors";
    const fs::path index = fs::path(path) / "model.safetensors.index.json";
    if (fs::exists(single, ec)) {
      SNAP_RETURN_IF_ERROR(load_file(single.string(), &model.mappings_, &model.tensors_));
    } else if (fs::exists(index, ec)) {
      SNAP_RETURN_IF_ERROR(load_index(index.string(), &model.mappings_, &model.tensors_));
    } else {
      return not_found(path + ": no model.safetensors or model.safetensors.index.json");
    }
  } else if (path.size() >= 5 && path.compare(path.size() - 5, 5, ".json") == 0) {
    SNAP_RETURN_IF_ERROR(load_index(path, &model.mappings_, &model.tensors_));
  } else {
    SNAP_RETURN_IF_ERROR(load_file(path, &model.mappings_, &model.tensors_));
  }
  return model;
}

const SafetensorsTensor* SafetensorsModel::find(const std::string& name) const {
  const auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

}  // namespace snap
