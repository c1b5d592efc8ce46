// Weight loading: a .gguf file (q8_0/q4_0/q4_1 matrices kept as blocks, the rest
// dequantized) or a Hugging Face directory (safetensors), into owned, 64-byte aligned
// matrices in the HF layout. Every tensor is checked for presence, type and shape before
// anything is read; then tensors are converted in parallel (OpenMP, one tensor per task).
// GGUF llama Q/K rows are un-permuted here.
#include "worker/model/weights.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "worker/model/dequant.h"
#include "worker/model/gguf.h"
#include "worker/model/safetensors.h"

namespace snap {

// ---------------------------------------------------------------------------
// Matrix

void Matrix::Free::operator()(void* p) const { std::free(p); }

Matrix::Matrix(DType dtype, int64_t rows, int64_t cols) : dtype_(dtype), rows_(rows), cols_(cols) {
  CHECK(rows >= 0 && cols >= 0) << "rows " << rows << " cols " << cols;
  const size_t bytes = static_cast<size_t>(nbytes());
  if (bytes == 0) return;
  const size_t rounded = (bytes + 63) / 64 * 64;  // aligned_alloc needs a multiple of the alignment
  void* p = std::aligned_alloc(64, rounded);
  CHECK(p != nullptr) << "out of memory allocating " << rounded << " bytes";
  data_.reset(p);
}

int64_t ModelWeights::nbytes() const {
  int64_t n = embed.nbytes() + final_norm.nbytes() + lm_head.nbytes();
  for (const LayerWeights& l : layers) {
    for (const Matrix* m : {&l.attn_norm, &l.q_proj, &l.k_proj, &l.v_proj, &l.q_bias, &l.k_bias, &l.v_bias,
                            &l.o_proj, &l.ffn_norm, &l.gate_proj, &l.up_proj, &l.down_proj}) {
      n += m->nbytes();
    }
  }
  return n;
}

namespace {

// ---------------------------------------------------------------------------
// The list of tensors to load

// One tensor to load: its name in the file, where it goes, and its expected HF shape.
struct Job {
  std::string name;
  Matrix* dst = nullptr;
  bool vector = false;  // 1-D in the file: shape [cols]; stored as [1, cols]
  int64_t rows = 1;
  int64_t cols = 0;
  DType store = DType::f32;
  int permute_heads = 0;  // > 0: undo llama.cpp's Q/K row permutation with this many heads
  int head_dim = 0;
  bool may_keep_blocks = false;  // a matmul weight: may stay in its GGUF block format
};

std::string shape_str(const std::vector<int64_t>& s) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << ']';
  return os.str();
}

std::vector<int64_t> expected_shape(const Job& j) {
  return j.vector ? std::vector<int64_t>{j.cols} : std::vector<int64_t>{j.rows, j.cols};
}

// Tensor names of one format.
struct Names {
  std::string embed, final_norm, lm_head;
  std::string layer_prefix;  // "blk." / "model.layers."
  std::string attn_norm, q, k, v, o, q_bias, k_bias, v_bias, ffn_norm, gate, up, down;
};

Names gguf_names() {
  return {"token_embd.weight", "output_norm.weight", "output.weight", "blk.",
          "attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight",
          "attn_q.bias", "attn_k.bias", "attn_v.bias", "ffn_norm.weight", "ffn_gate.weight",
          "ffn_up.weight", "ffn_down.weight"};
}

Names hf_names() {
  return {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight", "model.layers.",
          "input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
          "self_attn.v_proj.weight", "self_attn.o_proj.weight", "self_attn.q_proj.bias",
          "self_attn.k_proj.bias", "self_attn.v_proj.bias", "post_attention_layernorm.weight",
          "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"};
}

// Builds the job list and sizes `w` (matrices are allocated later, once shapes are checked).
// permute_qk: the file is a llama-arch GGUF whose Q/K rows the converter permuted.
std::vector<Job> plan_jobs(const ModelConfig& c, const Names& n, bool load_lm_head, bool permute_qk,
                           DType proj, ModelWeights* w) {
  std::vector<Job> jobs;
  const int64_t h = c.hidden_size;
  const int64_t q_dim = int64_t{c.num_heads} * c.head_dim;
  const int64_t kv_dim = int64_t{c.num_kv_heads} * c.head_dim;
  const int64_t ff = c.intermediate_size;
  auto mat = [&](std::string name, Matrix* dst, int64_t rows, int64_t cols, DType store, int heads = 0) {
    jobs.push_back({std::move(name), dst, false, rows, cols, store, permute_qk ? heads : 0, c.head_dim, true});
  };
  auto vec = [&](std::string name, Matrix* dst, int64_t len, int heads = 0) {
    jobs.push_back({std::move(name), dst, true, 1, len, DType::f32, permute_qk ? heads : 0, c.head_dim, false});
  };
  // The embedding is the largest single tensor; first, so a worker starts it early. Its
  // rows are looked up, so it is always f32.
  mat(n.embed, &w->embed, c.vocab_size, h, DType::f32);
  jobs.back().may_keep_blocks = false;
  if (load_lm_head) mat(n.lm_head, &w->lm_head, c.vocab_size, h, proj);
  vec(n.final_norm, &w->final_norm, h);
  w->layers.resize(static_cast<size_t>(c.num_layers));
  for (int i = 0; i < c.num_layers; ++i) {
    LayerWeights& l = w->layers[static_cast<size_t>(i)];
    const std::string p = n.layer_prefix + std::to_string(i) + ".";
    vec(p + n.attn_norm, &l.attn_norm, h);
    mat(p + n.q, &l.q_proj, q_dim, h, proj, c.num_heads);
    mat(p + n.k, &l.k_proj, kv_dim, h, proj, c.num_kv_heads);
    mat(p + n.v, &l.v_proj, kv_dim, h, proj);
    mat(p + n.o, &l.o_proj, h, q_dim, proj);
    if (c.attention_bias) {
      vec(p + n.q_bias, &l.q_bias, q_dim, c.num_heads);
      vec(p + n.k_bias, &l.k_bias, kv_dim, c.num_kv_heads);
      vec(p + n.v_bias, &l.v_bias, kv_dim);
    }
    vec(p + n.ffn_norm, &l.ffn_norm, h);
    mat(p + n.gate, &l.gate_proj, ff, h, proj);
    mat(p + n.up, &l.up_proj, ff, h, proj);
    mat(p + n.down, &l.down_proj, h, ff, proj);
  }
  return jobs;
}

// llama.cpp's converter stored Q/K row (head, i, j) (i < head_dim/2, j < 2) at
// head*head_dim + 2i + j, taking it from HF row head*head_dim + j*head_dim/2 + i.
// Returns the HF row of GGUF row r.
inline int64_t unpermuted_row(int64_t r, int head_dim) {
  const int64_t head = r / head_dim;
  const int64_t within = r % head_dim;
  return head * head_dim + (within % 2) * (head_dim / 2) + within / 2;
}

// Writes f32 values into the job's matrix in its storage dtype (an element type).
void store_f32(const float* src, Job& job) {
  const int64_t n = job.rows * job.cols;
  switch (job.store) {
    case DType::q8_0:
    case DType::q4_0:
    case DType::q4_1:
      CHECK(false) << "store_f32 into block format " << dtype_name(job.store) << " (" << job.name << ")";
      break;
    case DType::f32:
      if (src != job.dst->f32()) std::memcpy(job.dst->f32(), src, static_cast<size_t>(n) * sizeof(float));
      break;
    case DType::f16: {
      auto* d = static_cast<uint16_t*>(job.dst->data());
      for (int64_t i = 0; i < n; ++i) d[i] = f32_to_f16(src[i]);
      break;
    }
    case DType::bf16: {
      auto* d = static_cast<uint16_t*>(job.dst->data());
      for (int64_t i = 0; i < n; ++i) d[i] = f32_to_bf16(src[i]);
      break;
    }
  }
}

// Runs `fill(job, f32_out)` for every job in parallel; fill writes rows*cols floats in
// HF order, or, for a job stored in a block format, f32_out is null and fill writes the
// blocks into job.dst itself. The first failure (in job order) is returned.
template <typename Fill>
Status run_jobs(std::vector<Job>& jobs, Fill fill) {
  for (Job& j : jobs) *j.dst = Matrix(j.store, j.rows, j.cols);
  std::vector<Status> status(jobs.size());
  const int64_t num_jobs = static_cast<int64_t>(jobs.size());
#pragma omp parallel
  {
    std::vector<float> scratch;
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < num_jobs; ++i) {
      Job& job = jobs[static_cast<size_t>(i)];
      if (dtype_is_quantized(job.store)) {
        status[static_cast<size_t>(i)] = fill(job, nullptr);
        continue;
      }
      float* out = nullptr;
      if (job.store == DType::f32) {
        out = job.dst->f32();
      } else {
        scratch.resize(static_cast<size_t>(job.rows * job.cols));
        out = scratch.data();
      }
      status[static_cast<size_t>(i)] = fill(job, out);
      if (status[static_cast<size_t>(i)].ok()) store_f32(out, job);
    }
  }
  for (Status& s : status) {
    if (!s.ok()) return s;
  }
  return Status();
}

// ---------------------------------------------------------------------------
// GGUF

Status check_gguf(const GgufFile& g, const Job& job) {
  const GgufTensor* t = g.find_tensor(job.name);
  if (!t) return not_found(g.path() + ": missing tensor '" + job.name + "'");
  // ggml order is innermost first; we report shapes in HF (outermost-first) order.
  const std::vector<int64_t> got(t->dims.rbegin(), t->dims.rend());
  const std::vector<int64_t> want = expected_shape(job);
  if (got != want)
    return data_loss(g.path() + ": tensor '" + job.name + "' has shape " + shape_str(got) + ", expected " +
                     shape_str(want));
  const GgmlTypeInfo info = ggml_type_info(t->type);
  if (!info.dequantizable)
    return unimplemented(g.path() + ": tensor '" + job.name + "' has type " + info.name +
                         " (no dequantizer for it)");
  if (job.cols % info.block_size != 0)
    return data_loss(g.path() + ": tensor '" + job.name + "' rows of " + std::to_string(job.cols) +
                     " are not a multiple of the " + info.name + " block size " + std::to_string(info.block_size));
  return Status();
}

// The block format a GGUF tensor type is kept in, if it is one the matmul reads natively.
bool native_dtype(GgmlType type, DType* out) {
  switch (type) {
    case GgmlType::q8_0: *out = DType::q8_0; return true;
    case GgmlType::q4_0: *out = DType::q4_0; return true;
    case GgmlType::q4_1: *out = DType::q4_1; return true;
    default: return false;
  }
}

// Copies a block-format tensor's rows as they are. ggml and common/dtype.h share the block
// layout; a Q/K permutation moves whole rows, and a row is whole blocks, so un-permuting
// is a row copy.
Status copy_gguf_blocks(const GgufFile& g, const Job& job) {
  const GgufTensor& t = *g.find_tensor(job.name);
  SNAP_ASSIGN_OR_RETURN(uint64_t row_bytes, ggml_nbytes(t.type, job.cols));
  CHECK_EQ(static_cast<int64_t>(row_bytes), dtype_row_bytes(job.store, job.cols));
  auto* dst = static_cast<uint8_t*>(job.dst->data());
  if (job.permute_heads == 0) {
    std::memcpy(dst, t.data, row_bytes * static_cast<uint64_t>(job.rows));
    return Status();
  }
  for (int64_t r = 0; r < job.rows; ++r) {
    std::memcpy(dst + static_cast<uint64_t>(unpermuted_row(r, job.head_dim)) * row_bytes,
                t.data + static_cast<uint64_t>(r) * row_bytes, row_bytes);
  }
  return Status();
}

Status fill_gguf(const GgufFile& g, const Job& job, float* out) {
  if (dtype_is_quantized(job.store)) return copy_gguf_blocks(g, job);
  const GgufTensor& t = *g.find_tensor(job.name);
  if (job.permute_heads == 0) return dequantize(t.type, t.data, out, job.rows * job.cols);
  if (job.vector) {  // a bias: permute elements
    std::vector<float> tmp(static_cast<size_t>(job.cols));
    SNAP_RETURN_IF_ERROR(dequantize(t.type, t.data, tmp.data(), job.cols));
    for (int64_t r = 0; r < job.cols; ++r) out[unpermuted_row(r, job.head_dim)] = tmp[static_cast<size_t>(r)];
    return Status();
  }
  SNAP_ASSIGN_OR_RETURN(uint64_t row_bytes, ggml_nbytes(t.type, job.cols));
  for (int64_t r = 0; r < job.rows; ++r) {
    SNAP_RETURN_IF_ERROR(dequantize(t.type, t.data + static_cast<uint64_t>(r) * row_bytes,
                                    out + unpermuted_row(r, job.head_dim) * job.cols, job.cols));
  }
  return Status();
}

Result<LoadedModel> load_gguf(const std::string& path, const LoadOptions& opts) {
  SNAP_ASSIGN_OR_RETURN(GgufFile g, GgufFile::open(path));
  LoadedModel m;
  m.path = path;
  m.format = "gguf";
  SNAP_ASSIGN_OR_RETURN(m.config, config_from_gguf(g));
  // llama.cpp permutes Q/K for llama-arch files only (qwen2 uses NeoX rope and keeps HF order).
  const bool permute = m.config.arch == Arch::llama;
  const Names names = gguf_names();
  std::vector<Job> jobs = plan_jobs(m.config, names, !m.config.tie_word_embeddings, permute, opts.weight_dtype,
                                    &m.weights);
  for (const Job& j : jobs) SNAP_RETURN_IF_ERROR(check_gguf(g, j));
  if (opts.keep_quantized) {
    for (Job& j : jobs) {
      if (j.may_keep_blocks) native_dtype(g.find_tensor(j.name)->type, &j.store);
    }
    // Tied embeddings: the f32 table serves lookups; the output projection gets its own
    // copy of the file's blocks.
    DType head = DType::f32;
    if (m.config.tie_word_embeddings && native_dtype(g.find_tensor(names.embed)->type, &head)) {
      Job lm = *std::find_if(jobs.begin(), jobs.end(), [&](const Job& j) { return j.dst == &m.weights.embed; });
      lm.dst = &m.weights.lm_head;
      lm.store = head;
      lm.may_keep_blocks = true;
      jobs.insert(jobs.begin() + 1, lm);
    }
  }
  SNAP_RETURN_IF_ERROR(run_jobs(jobs, [&g](const Job& j, float* out) { return fill_gguf(g, j, out); }));
  return m;
}

// ---------------------------------------------------------------------------
// safetensors

Status check_safetensors(const SafetensorsModel& st, const std::string& dir, const Job& job) {
  const SafetensorsTensor* t = st.find(job.name);
  if (!t) return not_found(dir + ": missing tensor '" + job.name + "'");
  const std::vector<int64_t> want = expected_shape(job);
  if (t->shape != want)
    return data_loss(t->file + ": tensor '" + job.name + "' has shape " + shape_str(t->shape) + ", expected " +
                     shape_str(want));
  return Status();
}

// Tensor data in a file need not be aligned for its dtype: read through memcpy.
Status fill_safetensors(const SafetensorsModel& st, const Job& job, float* out) {
  const SafetensorsTensor& t = *st.find(job.name);
  const int64_t n = t.num_elements;
  switch (t.dtype) {
    case DType::f32:
      std::memcpy(out, t.data, static_cast<size_t>(n) * sizeof(float));
      break;
    case DType::f16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, t.data + 2 * i, 2);
        out[i] = f16_to_f32(h);
      }
      break;
    case DType::bf16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, t.data + 2 * i, 2);
        out[i] = bf16_to_f32(h);
      }
      break;
    case DType::q8_0:
    case DType::q4_0:
    case DType::q4_1:
      return unimplemented(t.file + ": tensor '" + job.name + "' is " + dtype_name(t.dtype) +
                           " (safetensors holds element types only)");
  }
  return Status();
}

Result<LoadedModel> load_hf_dir(const std::string& dir, const LoadOptions& opts) {
  LoadedModel m;
  m.path = dir;
  m.format = "safetensors";
  SNAP_ASSIGN_OR_RETURN(m.config, config_from_hf_json((std::filesystem::path(dir) / "config.json").string()));
  SNAP_ASSIGN_OR_RETURN(SafetensorsModel st, SafetensorsModel::open(dir));
  std::vector<Job> jobs = plan_jobs(m.config, hf_names(), !m.config.tie_word_embeddings, false,
                                    opts.weight_dtype, &m.weights);
  for (const Job& j : jobs) SNAP_RETURN_IF_ERROR(check_safetensors(st, dir, j));
  SNAP_RETURN_IF_ERROR(run_jobs(jobs, [&st](const Job& j, float* out) { return fill_safetensors(st, j, out); }));
  return m;
}

}  // namespace

// ---------------------------------------------------------------------------

Result<LoadedModel> load_model(const std::string& path, const LoadOptions& opts) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (ec || !fs::exists(st)) return not_found(path + ": no such file or directory");
  if (fs::is_directory(st)) return load_hf_dir(path, opts);
  char magic[4] = {};
  std::ifstream in(path, std::ios::binary);
  if (!in || !in.read(magic, 4) || std::memcmp(magic, "GGUF", 4) != 0) {
    if (path.size() >= 12 && path.compare(path.size() - 12, 12, ".safetensors") == 0)
      return invalid_argument(path + ": a bare .safetensors file has no config; pass its directory");
    return invalid_argument(path + ": not a GGUF file (bad magic) and not a model directory");
  }
  return load_gguf(path, opts);
}

}  // namespace snap
