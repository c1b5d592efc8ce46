// GGUF v2/v3 reader: maps the file read-only, parses header, metadata and tensor table
// through a bounds-checked cursor, and validates every size against the file size with
// overflow-safe arithmetic. Every failure is a one-line Status starting with the path.
// Layout: "GGUF" u32 version, u64 tensor_count, u64 kv_count, kv pairs, tensor infos,
// padding to general.alignment, then the data section (tensor offsets are relative to it).
#include "worker/model/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "worker/model/dequant.h"

namespace snap {

namespace {

constexpr uint32_t k_max_dims = 4;
// Nested arrays deeper than this are not produced by any writer; the bound keeps a
// hostile file from recursing the parser off the stack.
constexpr int k_max_array_depth = 8;
constexpr uint64_t k_default_alignment = 32;
// Largest metadata array we parse. Real files peak near 262144 (a vocabulary); each parsed
// element costs ~100 bytes, so the cap bounds a corrupted length to ~1.6 GB before failing.
constexpr uint64_t k_max_array_length = uint64_t{1} << 24;

const char* gguf_type_name(GgufType t) {
  switch (t) {
    case GgufType::u8: return "u8";
    case GgufType::i8: return "i8";
    case GgufType::u16: return "u16";
    case GgufType::i16: return "i16";
    case GgufType::u32: return "u32";
    case GgufType::i32: return "i32";
    case GgufType::f32: return "f32";
    case GgufType::boolean: return "bool";
    case GgufType::string: return "string";
    case GgufType::array: return "array";
    case GgufType::u64: return "u64";
    case GgufType::i64: return "i64";
    case GgufType::f64: return "f64";
  }
  return "unknown";
}

bool is_integer_type(GgufType t) {
  switch (t) {
    case GgufType::u8: case GgufType::i8: case GgufType::u16: case GgufType::i16:
    case GgufType::u32: case GgufType::i32: case GgufType::u64: case GgufType::i64:
      return true;
    default:
      return false;
  }
}

bool is_float_type(GgufType t) { return t == GgufType::f32 || t == GgufType::f64; }

// Smallest number of bytes one value of type t can occupy; 0 for an unknown type.
uint64_t min_value_size(uint32_t t) {
  switch (t) {
    case 0: case 1: case 7: return 1;
    case 2: case 3: return 2;
    case 4: case 5: case 6: return 4;
    case 10: case 11: case 12: return 8;
    case 8: return 8;    // u64 length, possibly empty
    case 9: return 12;   // u32 element type + u64 count
    default: return 0;
  }
}

// Describes a value's type for messages: "u32", "array of string".
std::string describe_type(const GgufValue& v) {
  if (v.type != GgufType::array) return gguf_type_name(v.type);
  return std::string("array of ") + gguf_type_name(v.elem_type);
}

// Bounds-checked little-endian reader over the mapped file. Every read failure is
// reported against the section currently being read (set by the caller).
class Cursor {
 public:
  Cursor(const uint8_t* data, uint64_t size, const std::string& path)
      : data_(data), size_(size), path_(path) {}

  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return size_ - pos_; }
  void set_section(std::string section) { section_ = std::move(section); }

  Status truncated(uint64_t need) const {
    return data_loss(path_ + ": truncated file: " + section_ + " needs " + std::to_string(need) +
                     " bytes at offset " + std::to_string(pos_) + " but only " +
                     std::to_string(remaining()) + " remain (file is " + std::to_string(size_) +
                     " bytes)");
  }

  template <typename T>
  Status read(T* out) {
    if (remaining() < sizeof(T)) return truncated(sizeof(T));
    std::memcpy(out, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return Status();
  }

  Status read_string(std::string* out) {
    uint64_t len = 0;
    SNAP_RETURN_IF_ERROR(read(&len));
    if (len > remaining()) {
      return data_loss(path_ + ": truncated file: " + section_ + " has string length " +
                       std::to_string(len) + " at offset " + std::to_string(pos_ - 8) +
                       " but only " + std::to_string(remaining()) + " bytes remain");
    }
    out->assign(reinterpret_cast<const char*>(data_ + pos_), static_cast<size_t>(len));
    pos_ += len;
    return Status();
  }

 private:
  const uint8_t* data_;
  uint64_t size_;
  uint64_t pos_ = 0;
  const std::string& path_;
  std::string section_ = "header";
};

Status read_value(Cursor& c, const std::string& path, const std::string& key, uint32_t type_num,
                  int depth, GgufValue* out);

Status read_array(Cursor& c, const std::string& path, const std::string& key, int depth,
                  GgufValue* out) {
  if (depth >= k_max_array_depth) {
    return data_loss(path + ": metadata key '" + key + "' nests arrays deeper than " +
                     std::to_string(k_max_array_depth) + " levels");
  }
  uint32_t elem_type = 0;
  uint64_t count = 0;
  SNAP_RETURN_IF_ERROR(c.read(&elem_type));
  SNAP_RETURN_IF_ERROR(c.read(&count));
  const uint64_t elem_min = min_value_size(elem_type);
  if (elem_min == 0) {
    return data_loss(path + ": metadata key '" + key + "' has array of unknown value type " +
                     std::to_string(elem_type));
  }
  if (count > c.remaining() / elem_min) {
    return data_loss(path + ": truncated file: metadata key '" + key + "' has array length " +
                     std::to_string(count) + " of " +
                     gguf_type_name(static_cast<GgufType>(elem_type)) + " but only " +
                     std::to_string(c.remaining()) + " bytes remain");
  }
  if (count > k_max_array_length) {
    return data_loss(path + ": metadata key '" + key + "' has array length " +
                     std::to_string(count) + " above the limit " +
                     std::to_string(k_max_array_length));
  }
  out->elem_type = static_cast<GgufType>(elem_type);
  out->arr.resize(static_cast<size_t>(count));
  for (uint64_t i = 0; i < count; ++i) {
    SNAP_RETURN_IF_ERROR(read_value(c, path, key, elem_type, depth + 1, &out->arr[i]));
  }
  return Status();
}

template <typename T>
Status read_int(Cursor& c, GgufValue* out) {
  T v{};
  SNAP_RETURN_IF_ERROR(c.read(&v));
  out->i = static_cast<int64_t>(v);
  out->u = static_cast<uint64_t>(v);
  return Status();
}

Status read_value(Cursor& c, const std::string& path, const std::string& key, uint32_t type_num,
                  int depth, GgufValue* out) {
  if (min_value_size(type_num) == 0) {
    return data_loss(path + ": metadata key '" + key + "' has unknown value type " +
                     std::to_string(type_num));
  }
  out->type = static_cast<GgufType>(type_num);
  switch (out->type) {
    case GgufType::u8: return read_int<uint8_t>(c, out);
    case GgufType::i8: return read_int<int8_t>(c, out);
    case GgufType::u16: return read_int<uint16_t>(c, out);
    case GgufType::i16: return read_int<int16_t>(c, out);
    case GgufType::u32: return read_int<uint32_t>(c, out);
    case GgufType::i32: return read_int<int32_t>(c, out);
    case GgufType::u64: return read_int<uint64_t>(c, out);
    case GgufType::i64: return read_int<int64_t>(c, out);
    case GgufType::f32: {
      float f = 0;
      SNAP_RETURN_IF_ERROR(c.read(&f));
      out->f = f;
      return Status();
    }
    case GgufType::f64: return c.read(&out->f);
    case GgufType::boolean: {
      uint8_t b = 0;
      SNAP_RETURN_IF_ERROR(c.read(&b));
      if (b > 1) {
        return data_loss(path + ": metadata key '" + key + "' has bool value " +
                         std::to_string(b) + " (expected 0 or 1)");
      }
      out->b = b != 0;
      return Status();
    }
    case GgufType::string: return c.read_string(&out->s);
    case GgufType::array: return read_array(c, path, key, depth, out);
  }
  return internal_error(path + ": unreachable value type");
}

// a + b into *out; false on overflow.
bool add_overflows(uint64_t a, uint64_t b, uint64_t* out) { return __builtin_add_overflow(a, b, out); }

// mmap owner: unmaps on last release.
std::shared_ptr<void> map_file(int fd, uint64_t size, std::string* err) {
  void* p = ::mmap(nullptr, static_cast<size_t>(size), PROT_READ, MAP_PRIVATE, fd, 0);
  if (p == MAP_FAILED) {
    *err = std::strerror(errno);
    return nullptr;
  }
  const size_t len = static_cast<size_t>(size);
  return std::shared_ptr<void>(p, [len](void* q) { ::munmap(q, len); });
}

}  // namespace

Result<GgufFile> GgufFile::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return not_found(path + ": no such file");
    return invalid_argument(path + ": cannot open: " + std::strerror(errno));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const std::string err = std::strerror(errno);
    ::close(fd);
    return invalid_argument(path + ": cannot stat: " + err);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return invalid_argument(path + ": not a regular file");
  }
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  constexpr uint64_t k_header_size = 4 + 4 + 8 + 8;
  if (file_size < k_header_size) {
    ::close(fd);
    return data_loss(path + ": truncated file: " + std::to_string(file_size) +
                     " bytes is shorter than the " + std::to_string(k_header_size) +
                     "-byte GGUF header");
  }
  std::string map_err;
  std::shared_ptr<void> mapping = map_file(fd, file_size, &map_err);
  ::close(fd);  // the mapping stays valid without the descriptor
  if (!mapping) return resource_exhausted(path + ": cannot mmap: " + map_err);
  const auto* base = static_cast<const uint8_t*>(mapping.get());

  GgufFile f;
  f.path_ = path;
  f.file_size_ = file_size;
  f.mapping_ = mapping;

  Cursor c(base, file_size, path);
  if (std::memcmp(base, "GGUF", 4) != 0) {
    char shown[32];
    std::snprintf(shown, sizeof(shown), "%02x %02x %02x %02x", base[0], base[1], base[2], base[3]);
    return data_loss(path + ": bad magic (bytes " + shown + "): not a GGUF file");
  }
  uint32_t magic = 0;
  SNAP_RETURN_IF_ERROR(c.read(&magic));
  SNAP_RETURN_IF_ERROR(c.read(&f.version_));
  if (f.version_ != 2 && f.version_ != 3) {
    if (__builtin_bswap32(f.version_) == 2 || __builtin_bswap32(f.version_) == 3) {
      return unimplemented(path + ": big-endian GGUF version " +
                           std::to_string(__builtin_bswap32(f.version_)) + " is not supported");
    }
    return unimplemented(path + ": unsupported GGUF version " + std::to_string(f.version_) +
                         " (supported: 2, 3)");
  }
  uint64_t tensor_count = 0, kv_count = 0;
  SNAP_RETURN_IF_ERROR(c.read(&tensor_count));
  SNAP_RETURN_IF_ERROR(c.read(&kv_count));
  // Each kv pair takes at least 8 (key length) + 4 (type) + 1 bytes; each tensor info
  // at least 8 (name length) + 4 (n_dims) + 4 (type) + 8 (offset) bytes.
  if (kv_count > c.remaining() / 13) {
    return data_loss(path + ": truncated file or bad header: kv_count " +
                     std::to_string(kv_count) + " cannot fit in the remaining " +
                     std::to_string(c.remaining()) + " bytes");
  }
  if (tensor_count > c.remaining() / 24) {
    return data_loss(path + ": truncated file or bad header: tensor_count " +
                     std::to_string(tensor_count) + " cannot fit in the remaining " +
                     std::to_string(c.remaining()) + " bytes");
  }

  // --- metadata ---
  for (uint64_t k = 0; k < kv_count; ++k) {
    c.set_section("metadata key " + std::to_string(k));
    std::string key;
    SNAP_RETURN_IF_ERROR(c.read_string(&key));
    c.set_section("metadata key '" + key + "'");
    uint32_t type_num = 0;
    SNAP_RETURN_IF_ERROR(c.read(&type_num));
    GgufValue v;
    SNAP_RETURN_IF_ERROR(read_value(c, path, key, type_num, 0, &v));
    if (!f.metadata_.emplace(key, std::move(v)).second) {
      return data_loss(path + ": duplicate metadata key '" + key + "'");
    }
  }
  if (const GgufValue* a = f.find("general.alignment")) {
    const bool power_of_two = is_integer_type(a->type) && a->i > 0 && (a->u & (a->u - 1)) == 0;
    if (!power_of_two) {
      return data_loss(path + ": bad general.alignment " +
                       (is_integer_type(a->type) ? std::to_string(a->i) : describe_type(*a)) +
                       " (expected a positive power of two)");
    }
    f.alignment_ = a->u;
  } else {
    f.alignment_ = k_default_alignment;
  }

  // --- tensor table ---
  std::vector<uint64_t> rel_offsets;  // per tensor, relative to the data section
  f.tensors_.reserve(static_cast<size_t>(tensor_count));
  rel_offsets.reserve(static_cast<size_t>(tensor_count));
  for (uint64_t t = 0; t < tensor_count; ++t) {
    c.set_section("tensor info " + std::to_string(t));
    GgufTensor ti;
    SNAP_RETURN_IF_ERROR(c.read_string(&ti.name));
    c.set_section("tensor info '" + ti.name + "'");
    uint32_t n_dims = 0;
    SNAP_RETURN_IF_ERROR(c.read(&n_dims));
    if (n_dims == 0 || n_dims > k_max_dims) {
      return data_loss(path + ": tensor '" + ti.name + "' has n_dims " + std::to_string(n_dims) +
                       " (expected 1.." + std::to_string(k_max_dims) + ")");
    }
    int64_t num_elements = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      uint64_t dim = 0;
      SNAP_RETURN_IF_ERROR(c.read(&dim));
      if (dim == 0 || dim > static_cast<uint64_t>(INT64_MAX)) {
        return data_loss(path + ": tensor '" + ti.name + "' has bad dimension " + std::to_string(d) +
                         " = " + std::to_string(static_cast<int64_t>(dim)) + " (must be positive)");
      }
      if (__builtin_mul_overflow(num_elements, static_cast<int64_t>(dim), &num_elements)) {
        return data_loss(path + ": tensor '" + ti.name + "' element count overflows int64");
      }
      ti.dims.push_back(static_cast<int64_t>(dim));
    }
    ti.num_elements = num_elements;
    uint32_t type_num = 0;
    SNAP_RETURN_IF_ERROR(c.read(&type_num));
    ti.type = static_cast<GgmlType>(type_num);
    const GgmlTypeInfo info = ggml_type_info(ti.type);
    if (info.type_size == 0) {
      return data_loss(path + ": tensor '" + ti.name + "' has unknown ggml type " +
                       std::to_string(type_num));
    }
    if (ti.dims[0] % info.block_size != 0) {
      return data_loss(path + ": tensor '" + ti.name + "' row of " + std::to_string(ti.dims[0]) +
                       " elements is not a multiple of the " + info.name + " block size " +
                       std::to_string(info.block_size));
    }
    Result<uint64_t> nbytes = ggml_nbytes(ti.type, num_elements);
    if (!nbytes.ok()) {
      return data_loss(path + ": tensor '" + ti.name + "': " + nbytes.status().message());
    }
    ti.nbytes = nbytes.value();
    uint64_t rel_offset = 0;
    SNAP_RETURN_IF_ERROR(c.read(&rel_offset));
    if (rel_offset % f.alignment_ != 0) {
      return data_loss(path + ": tensor '" + ti.name + "' offset " + std::to_string(rel_offset) +
                       " is misaligned (alignment " + std::to_string(f.alignment_) + ")");
    }
    if (!f.tensor_index_.emplace(ti.name, f.tensors_.size()).second) {
      return data_loss(path + ": duplicate tensor name '" + ti.name + "'");
    }
    rel_offsets.push_back(rel_offset);
    f.tensors_.push_back(std::move(ti));
  }

  // --- data section ---
  const uint64_t header_end = c.pos();
  const uint64_t pad = (f.alignment_ - header_end % f.alignment_) % f.alignment_;
  uint64_t data_start = 0;
  if (add_overflows(header_end, pad, &data_start)) {
    return data_loss(path + ": data section offset overflows");
  }
  for (size_t t = 0; t < f.tensors_.size(); ++t) {
    GgufTensor& ti = f.tensors_[t];
    uint64_t begin = 0, end = 0;
    if (add_overflows(data_start, rel_offsets[t], &begin) ||
        add_overflows(begin, ti.nbytes, &end) || end > file_size) {
      const std::string end_str =
          (begin < data_start || end < begin) ? std::string("beyond 2^64")
                                              : std::to_string(end);
      return data_loss(path + ": tensor '" + ti.name + "' data ends at " + end_str +
                       " past end of file (" + std::to_string(file_size) + " bytes)");
    }
    ti.offset = begin;
    ti.data = base + begin;
  }
  return f;
}

const GgufValue* GgufFile::find(const std::string& key) const {
  auto it = metadata_.find(key);
  return it == metadata_.end() ? nullptr : &it->second;
}

const GgufTensor* GgufFile::find_tensor(const std::string& name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

namespace {

Status missing_key(const std::string& path, const std::string& key) {
  return not_found(path + ": metadata key '" + key + "' not found");
}

Status wrong_type(const std::string& path, const std::string& key, const GgufValue& v,
                  const char* expected) {
  return invalid_argument(path + ": metadata key '" + key + "' is " + describe_type(v) +
                          ", expected " + expected);
}

// An integer value as int64; u64 values above INT64_MAX do not fit.
bool int_value(const GgufValue& v, int64_t* out) {
  if (v.type == GgufType::u64 && v.u > static_cast<uint64_t>(INT64_MAX)) return false;
  *out = v.type == GgufType::u64 ? static_cast<int64_t>(v.u) : v.i;
  return true;
}

}  // namespace

Result<int64_t> GgufFile::get_int(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) return missing_key(path_, key);
  if (!is_integer_type(v->type)) return wrong_type(path_, key, *v, "an integer");
  int64_t out = 0;
  if (!int_value(*v, &out)) {
    return invalid_argument(path_ + ": metadata key '" + key + "' value " + std::to_string(v->u) +
                            " does not fit in int64");
  }
  return out;
}

Result<double> GgufFile::get_float(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) return missing_key(path_, key);
  if (!is_float_type(v->type)) return wrong_type(path_, key, *v, "f32 or f64");
  return v->f;
}

Result<bool> GgufFile::get_bool(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) return missing_key(path_, key);
  if (v->type != GgufType::boolean) return wrong_type(path_, key, *v, "bool");
  return v->b;
}

Result<std::string> GgufFile::get_string(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) return missing_key(path_, key);
  if (v->type != GgufType::string) return wrong_type(path_, key, *v, "string");
  return v->s;
}

Result<std::vector<std::string>> GgufFile::get_string_array(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) return missing_key(path_, key);
  if (v->type != GgufType::array || v->elem_type != GgufType::string) {
    return wrong_type(path_, key, *v, "array of string");
  }
  std::vector<std::string> out;
  out.reserve(v->arr.size());
  for (const GgufValue& e : v->arr) out.push_back(e.s);
  return out;
}

Result<std::vector<int64_t>> GgufFile::get_int_array(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) return missing_key(path_, key);
  if (v->type != GgufType::array || !is_integer_type(v->elem_type)) {
    return wrong_type(path_, key, *v, "array of integers");
  }
  std::vector<int64_t> out(v->arr.size());
  for (size_t i = 0; i < v->arr.size(); ++i) {
    if (!int_value(v->arr[i], &out[i])) {
      return invalid_argument(path_ + ": metadata key '" + key + "' element " + std::to_string(i) +
                              " value " + std::to_string(v->arr[i].u) + " does not fit in int64");
    }
  }
  return out;
}

Result<std::vector<double>> GgufFile::get_float_array(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) return missing_key(path_, key);
  if (v->type != GgufType::array || !is_float_type(v->elem_type)) {
    return wrong_type(path_, key, *v, "array of f32 or f64");
  }
  std::vector<double> out;
  out.reserve(v->arr.size());
  for (const GgufValue& e : v->arr) out.push_back(e.f);
  return out;
}

}  // namespace snap
