// Weight loading: a .gguf file (q8_0/q4_0/q4_1/q5_0/q5_1/q2_k-q6_k matrices kept as blocks, the rest
// dequantized) or a Hugging Face directory (safetensors), into owned, 64-byte aligned
// matrices in the HF layout. Every tensor is checked for presence, type and shape before
// anything is read; then tensors are converted in parallel (OpenMP, one tensor per task).
// GGUF llama Q/K rows are un-permuted here.
#include "worker/model/weights.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/sys.h"
#include "kernels/weight_tiles.h"
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

void Matrix::pack_tiles4() {
  if (layout_ == kernels::WeightLayout::tiles4) return;
  CHECK(dtype_is_quantized(dtype_)) << "pack_tiles4 on a " << dtype_name(dtype_) << " matrix";
  kernels::weight_tiles4_pack(dtype_, data_.get(), rows_, cols_);
  layout_ = kernels::WeightLayout::tiles4;
}

int64_t ModelWeights::nbytes() const {
  int64_t n = embed.nbytes() + final_norm.nbytes() + lm_head.nbytes();
  for (const LayerWeights& l : layers) {
    for (const Matrix* m : {&l.attn_norm, &l.q_proj, &l.k_proj, &l.v_proj, &l.q_bias, &l.k_bias, &l.v_bias,
                            &l.o_proj, &l.ffn_norm, &l.gate_proj, &l.up_proj, &l.down_proj, &l.q_norm,
                            &l.k_norm, &l.post_attn_norm, &l.post_ffn_norm}) {
      n += m->nbytes();
    }
  }
  return n;
}

namespace {

// ---------------------------------------------------------------------------
// The list of tensors to load

// One tensor to load: its name in the file, where it goes, its shape in the file, and the
// slice of it this rank keeps: rows [row_begin, row_begin + rows) and columns [col_begin,
// col_begin + cols) of the HF layout (a vector's elements are its columns).
struct Job {
  std::string name;
  Matrix* dst = nullptr;
  bool vector = false;  // 1-D in the file: shape [file_cols]; stored as [1, cols]
  int64_t file_rows = 1;
  int64_t file_cols = 0;
  int64_t row_begin = 0;
  int64_t col_begin = 0;
  int64_t rows = 1;
  int64_t cols = 0;
  DType store = DType::f32;
  int permute_heads = 0;  // > 0: undo llama.cpp's Q/K row permutation (heads of head_dim rows)
  int head_dim = 0;
  bool may_keep_blocks = false;  // a matmul weight: may stay in its GGUF block format
  float offset = 0.0f;           // added to every value read (Gemma's safetensors norms hold w of x * (1 + w))
  bool requantize = false;       // stored as q8_0 from a source that is not q8_0 blocks: read f32, quantize
  bool whole() const { return rows == file_rows && cols == file_cols; }
};

std::string shape_str(const std::vector<int64_t>& s) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << ']';
  return os.str();
}

std::vector<int64_t> expected_shape(const Job& j) {
  return j.vector ? std::vector<int64_t>{j.file_cols} : std::vector<int64_t>{j.file_rows, j.file_cols};
}

// Tensor names of one format.
struct Names {
  std::string embed, final_norm, lm_head;
  std::string layer_prefix;  // "blk." / "model.layers."
  std::string attn_norm, q, k, v, o, q_bias, k_bias, v_bias, ffn_norm, gate, up, down;
  std::string q_norm, k_norm, post_attn_norm, post_ffn_norm;  // gemma3
  float norm_offset = 0.0f;  // added to every RMSNorm weight read (Job::offset)
};

Names gguf_names() {
  return {"token_embd.weight", "output_norm.weight", "output.weight", "blk.",
          "attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight",
          "attn_q.bias", "attn_k.bias", "attn_v.bias", "ffn_norm.weight", "ffn_gate.weight",
          "ffn_up.weight", "ffn_down.weight", "attn_q_norm.weight", "attn_k_norm.weight",
          "post_attention_norm.weight", "post_ffw_norm.weight"};
}

Names hf_names() {
  return {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight", "model.layers.",
          "input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
          "self_attn.v_proj.weight", "self_attn.o_proj.weight", "self_attn.q_proj.bias",
          "self_attn.k_proj.bias", "self_attn.v_proj.bias", "post_attention_layernorm.weight",
          "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight", "", "", "", ""};
}

// Gemma3ForCausalLM: the MLP's input norm is pre_feedforward_layernorm, and
// post_attention_layernorm is the norm on the attention output (the Llama family's
// post_attention_layernorm is the MLP's input norm). Gemma3RMSNorm computes x * (1 + w)
// with w as stored; the forward multiplies by its weight, so the loader adds the 1 (in f32:
// the multiplier transformers computes, bit for bit).
Names hf_names(const ModelConfig& c) {
  Names n = hf_names();
  if (c.arch != Arch::gemma3) return n;
  n.ffn_norm = "pre_feedforward_layernorm.weight";
  n.q_norm = "self_attn.q_norm.weight";
  n.k_norm = "self_attn.k_norm.weight";
  n.post_attn_norm = "post_attention_layernorm.weight";
  n.post_ffn_norm = "post_feedforward_layernorm.weight";
  n.norm_offset = 1.0f;
  return n;
}

// Gemma3ForConditionalGeneration holds the text model under language_model.model. (as the
// checkpoints on the Hub and transformers 5's save_pretrained name it) or model.language_model.
// (transformers 4.52-4.5x's own names); the vision tower's tensors are never read.
Names hf_names(const ModelConfig& c, const SafetensorsModel& st) {
  Names n = hf_names(c);
  if (c.arch != Arch::gemma3) return n;
  for (const char* prefix : {"language_model.model.", "model.language_model."}) {
    const std::string p = prefix;
    if (!st.find(p + "embed_tokens.weight")) continue;
    n.embed = p + "embed_tokens.weight";
    n.final_norm = p + "norm.weight";
    n.layer_prefix = p + "layers.";
    n.lm_head = p == "language_model.model." ? "language_model.lm_head.weight" : "lm_head.weight";
    break;
  }
  return n;
}

// Builds the job list of one shard and sizes `w` (matrices are allocated later, once
// shapes are checked). permute_qk: the file is a llama-arch GGUF whose Q/K rows the
// converter permuted. The embedding is always whole; the LM head only on the shard that
// computes logits.
std::vector<Job> plan_jobs(const ModelConfig& c, const TpShard& sh, const Names& n, bool load_lm_head,
                           bool permute_qk, DType proj, ModelWeights* w) {
  std::vector<Job> jobs;
  const int64_t h = c.hidden_size;
  const int64_t hd = c.head_dim;
  const int64_t q_dim = int64_t{c.num_heads} * hd;
  const int64_t kv_dim = int64_t{c.num_kv_heads} * hd;
  const int64_t ff = c.intermediate_size;
  // Column-parallel: rows [row0, row0 + rows) of [file_rows, cols].
  auto col_par = [&](std::string name, Matrix* dst, int64_t file_rows, int64_t cols, int64_t row0, int64_t rows,
                     int heads = 0) {
    Job j{std::move(name), dst, false, file_rows, cols, row0, 0, rows, cols, proj, permute_qk ? heads : 0,
          c.head_dim, true};
    jobs.push_back(std::move(j));
  };
  // Row-parallel: columns [col0, col0 + cols) of [rows, file_cols].
  auto row_par = [&](std::string name, Matrix* dst, int64_t rows, int64_t file_cols, int64_t col0, int64_t cols) {
    Job j{std::move(name), dst, false, rows, file_cols, 0, col0, rows, cols, proj, 0, c.head_dim, true};
    jobs.push_back(std::move(j));
  };
  // A vector; elements [e0, e0 + len) of file_len.
  auto vec = [&](std::string name, Matrix* dst, int64_t file_len, int64_t e0, int64_t len, int heads = 0) {
    Job j{std::move(name), dst, true, 1, file_len, 0, e0, 1, len, DType::f32, permute_qk ? heads : 0, c.head_dim,
          false};
    jobs.push_back(std::move(j));
  };
  // An RMSNorm weight: a vector plus the format's offset.
  auto norm = [&](std::string name, Matrix* dst, int64_t len) {
    vec(std::move(name), dst, len, 0, len);
    jobs.back().offset = n.norm_offset;
  };
  // The embedding is the largest single tensor; first, so a worker starts it early. f32
  // unless the loader keeps it in blocks (embed_in_blocks).
  col_par(n.embed, &w->embed, c.vocab_size, h, 0, c.vocab_size);
  jobs.back().store = DType::f32;
  jobs.back().may_keep_blocks = false;
  if (load_lm_head) col_par(n.lm_head, &w->lm_head, c.vocab_size, h, sh.vocab_begin, sh.vocab_size);
  norm(n.final_norm, &w->final_norm, h);
  const int64_t q0 = sh.q_load_begin * hd, q_rows = sh.q_load_heads * hd;
  const int64_t kv0 = sh.kv_head_begin * hd, kv_rows = sh.num_kv_heads * hd;
  const int64_t o0 = sh.head_begin * hd, o_cols = sh.num_heads * hd;
  w->layers.resize(static_cast<size_t>(c.num_layers));
  for (int i = 0; i < c.num_layers; ++i) {
    LayerWeights& l = w->layers[static_cast<size_t>(i)];
    const std::string p = n.layer_prefix + std::to_string(i) + ".";
    norm(p + n.attn_norm, &l.attn_norm, h);
    col_par(p + n.q, &l.q_proj, q_dim, h, q0, q_rows, c.num_heads);
    col_par(p + n.k, &l.k_proj, kv_dim, h, kv0, kv_rows, c.num_kv_heads);
    col_par(p + n.v, &l.v_proj, kv_dim, h, kv0, kv_rows);
    row_par(p + n.o, &l.o_proj, h, q_dim, o0, o_cols);
    if (c.attention_bias) {
      vec(p + n.q_bias, &l.q_bias, q_dim, q0, q_rows, c.num_heads);
      vec(p + n.k_bias, &l.k_bias, kv_dim, kv0, kv_rows, c.num_kv_heads);
      vec(p + n.v_bias, &l.v_bias, kv_dim, kv0, kv_rows);
    }
    norm(p + n.ffn_norm, &l.ffn_norm, h);
    col_par(p + n.gate, &l.gate_proj, ff, h, sh.ff_begin, sh.ff_size);
    col_par(p + n.up, &l.up_proj, ff, h, sh.ff_begin, sh.ff_size);
    row_par(p + n.down, &l.down_proj, h, ff, sh.ff_begin, sh.ff_size);
    if (c.qk_norm) {  // one weight for every head: whole on every shard
      norm(p + n.q_norm, &l.q_norm, hd);
      norm(p + n.k_norm, &l.k_norm, hd);
    }
    if (c.post_norms) {
      norm(p + n.post_attn_norm, &l.post_attn_norm, h);
      norm(p + n.post_ffn_norm, &l.post_ffn_norm, h);
    }
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

// The inverse: the GGUF row holding HF row r (identity when the job is not permuted).
inline int64_t file_row(const Job& job, int64_t r) {
  if (job.permute_heads == 0) return r;
  const int64_t half = job.head_dim / 2;
  const int64_t head = r / job.head_dim;
  const int64_t within = r % job.head_dim;
  return head * job.head_dim + 2 * (within % half) + within / half;
}

// Writes the f32 values of `job`'s rows (job.rows of them) into its matrix from row
// `first_row` on, in the storage dtype (an element type, or q8_0 quantized row by row:
// LoadOptions::weight_dtype q8_0).
Status store_f32(const float* src, const Job& job, int64_t first_row, const std::string& source) {
  const int64_t n = job.rows * job.cols;
  const int64_t first = first_row * job.cols;  // elements before this slab
  switch (job.store) {
    case DType::q8_0: {
      CHECK(job.requantize && job.cols % 32 == 0) << job.name;
      const int64_t row_bytes = dtype_row_bytes(DType::q8_0, job.cols);
      auto* d = static_cast<uint8_t*>(job.dst->data()) + first_row * row_bytes;
      for (int64_t r = 0; r < job.rows; ++r) {
        if (!quantize_q8_0(src + r * job.cols, d + r * row_bytes, job.cols))
          return data_loss(source + ": tensor '" + job.name + "' holds a NaN or infinite value (row " +
                           std::to_string(job.row_begin + r) + "): it cannot be quantized to q8_0");
      }
      break;
    }
    case DType::q4_0:
    case DType::q4_1:
    case DType::q5_0:
    case DType::q5_1:
    case DType::q4_k:
    case DType::q6_k:
    case DType::q5_k:
    case DType::q3_k:
    case DType::q2_k:
      CHECK(false) << "store_f32 into block format " << dtype_name(job.store) << " (" << job.name << ")";
      break;
    case DType::f32:
      if (src != job.dst->f32() + first)
        std::memcpy(job.dst->f32() + first, src, static_cast<size_t>(n) * sizeof(float));
      break;
    case DType::f16: {
      auto* d = static_cast<uint16_t*>(job.dst->data()) + first;
      for (int64_t i = 0; i < n; ++i) d[i] = f32_to_f16(src[i]);
      break;
    }
    case DType::bf16: {
      auto* d = static_cast<uint16_t*>(job.dst->data()) + first;
      for (int64_t i = 0; i < n; ++i) d[i] = f32_to_bf16(src[i]);
      break;
    }
  }
  return Status();
}

// Before anything is allocated: the weights as the jobs store them must fit in what this process
// may still take (common/sys.h memory_headroom: MemAvailable, the cgroup's limit, ulimit -v), or
// the load stops with one line naming both, where the allocation would otherwise be killed by the
// OOM killer (a pod or Slurm job at its limit) or abort mid-load. SNAP_NO_MEMORY_CHECK=1 skips it.
Status check_fits_in_memory(const std::vector<Job>& jobs, const std::string& source, const LoadOptions& opts) {
  if (const char* skip = std::getenv("SNAP_NO_MEMORY_CHECK"); skip != nullptr && std::strcmp(skip, "1") == 0)
    return Status();
  int64_t need = 0, f32_bytes = 0;
  for (const Job& j : jobs) {
    const int64_t b = j.rows * dtype_row_bytes(j.store, j.cols);
    need += b;
    if (j.store == DType::f32 && !j.vector) f32_bytes += b;
  }
  const MemoryHeadroom room = memory_headroom();
  if (room.bytes < 0 || need <= room.bytes) return Status();
  std::string hint;
  if (opts.weight_dtype != DType::q8_0 && f32_bytes > need / 2)
    hint = "; --weight-dtype q8_0 stores the f32 matrices (" + mib_text(f32_bytes) + ") in about a quarter of that";
  return resource_exhausted(source + ": the weights need " + mib_text(need) + " as loaded here but this process may take " +
                            mib_text(room.bytes) + " more (" + room.limit + ")" + hint +
                            "; SNAP_NO_MEMORY_CHECK=1 loads anyway");
}

// Runs `fill(job, f32_out)` for every job in parallel; fill writes rows*cols floats in
// HF order, or, for a job stored in a block format it copies (not requantize), f32_out is
// null and fill writes the blocks into job.dst itself. The first failure (in job order) is
// returned; `source` (the file) names it where fill does not.
template <typename Fill>
Status run_jobs(std::vector<Job>& jobs, const std::string& source, int64_t scratch_floats, Fill fill) {
  for (Job& j : jobs) *j.dst = Matrix(j.store, j.rows, j.cols);
  std::vector<Status> status(jobs.size());
  const int64_t num_jobs = static_cast<int64_t>(jobs.size());
#pragma omp parallel
  {
    std::vector<float> scratch;
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < num_jobs; ++i) {
      Job& job = jobs[static_cast<size_t>(i)];
      if (dtype_is_quantized(job.store) && !job.requantize) {
        status[static_cast<size_t>(i)] = fill(job, nullptr);
        continue;
      }
      // f32 is read in place. Other storage goes through f32 scratch a slab of rows at a time,
      // so that the scratch stays scratch_floats per thread however large the tensor (Llama 3's
      // 128,256 x 4,096 embedding table would take 2 GiB whole).
      const bool in_place = job.store == DType::f32;
      const int64_t slab = in_place ? job.rows : std::max<int64_t>(1, scratch_floats / job.cols);
      Status& st = status[static_cast<size_t>(i)];
      for (int64_t r0 = 0; r0 < job.rows && st.ok(); r0 += slab) {
        Job part = job;
        part.row_begin = job.row_begin + r0;
        part.rows = std::min(slab, job.rows - r0);
        float* out = nullptr;
        if (in_place) {
          out = job.dst->f32();
        } else {
          scratch.resize(static_cast<size_t>(part.rows * part.cols));
          out = scratch.data();
        }
        st = fill(part, out);
        if (!st.ok()) break;
        if (job.offset != 0.0f) {
          for (int64_t e = 0; e < part.rows * part.cols; ++e) out[e] += job.offset;
        }
        st = store_f32(out, part, r0, source);
      }
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
  if (job.file_cols % info.block_size != 0)
    return data_loss(g.path() + ": tensor '" + job.name + "' rows of " + std::to_string(job.file_cols) +
                     " are not a multiple of the " + info.name + " block size " + std::to_string(info.block_size));
  return Status();
}

// The matrices the decode matvec reads (projections and the LM head: a tied table too, whose
// looked-up rows are then unpacked) into its 4-row tiles, where it reads them (LoadOptions).
void pack_for_matvec(ModelWeights* w) {
  auto pack = [](Matrix& m) {
    if (!m.empty() && kernels::weight_tiles4_wanted(m.dtype())) m.pack_tiles4();
  };
  for (LayerWeights& l : w->layers) {
    for (Matrix* m : {&l.q_proj, &l.k_proj, &l.v_proj, &l.o_proj, &l.gate_proj, &l.up_proj, &l.down_proj}) pack(*m);
  }
  pack(w->lm_head.empty() ? w->embed : w->lm_head);
}

// The block format a GGUF tensor type is kept in, if it is one the matmuls read natively (the
// CPU's and the device's: q8_0, q4_0, q4_1, q5_0, q5_1, q2_k .. q6_k).
bool native_dtype(GgmlType type, DType* out) {
  DType t;
  if (!dtype_of(type, &t) || !dtype_is_quantized(t) || !dtype_cpu_blocks(t)) return false;
  *out = t;
  return true;
}

// Copies a block-format tensor's slice as it is. ggml and common/dtype.h share the block
// layout; a Q/K permutation moves whole rows within a head, and a row is whole blocks, so
// un-permuting is a row copy and a block-aligned column slice is a run of blocks.
Status copy_gguf_blocks(const GgufFile& g, const Job& job) {
  const GgufTensor& t = *g.find_tensor(job.name);
  SNAP_ASSIGN_OR_RETURN(uint64_t file_row_bytes, ggml_nbytes(t.type, job.file_cols));
  SNAP_ASSIGN_OR_RETURN(uint64_t col_offset, ggml_nbytes(t.type, job.col_begin));
  const auto row_bytes = static_cast<uint64_t>(dtype_row_bytes(job.store, job.cols));
  auto* dst = static_cast<uint8_t*>(job.dst->data());
  if (job.whole() && job.permute_heads == 0) {
    std::memcpy(dst, t.data, file_row_bytes * static_cast<uint64_t>(job.rows));
    return Status();
  }
  for (int64_t r = 0; r < job.rows; ++r) {
    const auto src_row = static_cast<uint64_t>(file_row(job, job.row_begin + r));
    std::memcpy(dst + static_cast<uint64_t>(r) * row_bytes, t.data + src_row * file_row_bytes + col_offset,
                row_bytes);
  }
  return Status();
}

Status fill_gguf(const GgufFile& g, const Job& job, float* out) {
  if (dtype_is_quantized(job.store) && !job.requantize) return copy_gguf_blocks(g, job);
  const GgufTensor& t = *g.find_tensor(job.name);
  if (job.whole() && job.permute_heads == 0) return dequantize(t.type, t.data, out, job.rows * job.cols);
  if (job.vector) {  // a bias or norm: elements [col_begin, col_begin + cols), un-permuted
    std::vector<float> tmp(static_cast<size_t>(job.file_cols));
    SNAP_RETURN_IF_ERROR(dequantize(t.type, t.data, tmp.data(), job.file_cols));
    for (int64_t e = 0; e < job.cols; ++e) out[e] = tmp[static_cast<size_t>(file_row(job, job.col_begin + e))];
    return Status();
  }
  SNAP_ASSIGN_OR_RETURN(uint64_t file_row_bytes, ggml_nbytes(t.type, job.file_cols));
  std::vector<float> row(static_cast<size_t>(job.file_cols));
  for (int64_t r = 0; r < job.rows; ++r) {
    const auto src_row = static_cast<uint64_t>(file_row(job, job.row_begin + r));
    SNAP_RETURN_IF_ERROR(dequantize(t.type, t.data + src_row * file_row_bytes, row.data(), job.file_cols));
    std::memcpy(out + r * job.cols, row.data() + job.col_begin, static_cast<size_t>(job.cols) * sizeof(float));
  }
  return Status();
}

// LoadOptions::weight_dtype q8_0: the matrices the matmul reads (projections, an untied LM
// head) are stored as q8_0 where their slice is whole blocks of 32 (else f32), quantized from
// what the file holds (the GGUF loader copies q8_0 tensors as they are).
void plan_q8_0(std::vector<Job>& jobs) {
  for (Job& j : jobs) {
    if (j.store != DType::q8_0) continue;
    if (j.may_keep_blocks && j.col_begin % 32 == 0 && j.cols % 32 == 0) {
      j.requantize = true;
    } else {
      j.store = DType::f32;
    }
  }
}

// The embedding table kept in a block format (lookups dequantize their rows, LlamaForward::
// embed): tied, it is also the LM head, and a tensor-parallel shard that computes only part
// of the vocabulary gets its rows as a copy of their own (lookups need the whole table).
void embed_in_blocks(std::vector<Job>& jobs, LoadedModel& m, DType table, bool requantize) {
  Job& embed = *std::find_if(jobs.begin(), jobs.end(), [&](const Job& j) { return j.dst == &m.weights.embed; });
  embed.store = table;
  embed.requantize = requantize;
  if (m.config.tie_word_embeddings && m.shard.vocab_size != m.config.vocab_size) {
    Job lm = embed;
    lm.dst = &m.weights.lm_head;
    lm.row_begin = m.shard.vocab_begin;  // this rank's vocabulary rows
    lm.rows = m.shard.vocab_size;
    lm.may_keep_blocks = true;
    jobs.insert(jobs.begin() + 1, lm);
  }
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
  SNAP_ASSIGN_OR_RETURN(m.shard, make_tp_shard(m.config, opts.tp_rank, opts.tp_size));
  std::vector<Job> jobs = plan_jobs(m.config, m.shard, names, !m.config.tie_word_embeddings, permute,
                                    opts.weight_dtype, &m.weights);
  for (const Job& j : jobs) SNAP_RETURN_IF_ERROR(check_gguf(g, j));
  if (opts.weight_dtype == DType::q8_0) {
    const bool embed_q8_0 = g.find_tensor(names.embed)->type == GgmlType::q8_0;
    plan_q8_0(jobs);
    for (Job& j : jobs) {
      if (j.requantize && g.find_tensor(j.name)->type == GgmlType::q8_0) j.requantize = false;  // copied
    }
    // Tied, the table is the LM head: q8_0 too (an untied table is only looked up: f32).
    if (m.config.tie_word_embeddings && m.config.hidden_size % 32 == 0)
      embed_in_blocks(jobs, m, DType::q8_0, !embed_q8_0);
  } else if (opts.keep_quantized) {
    for (Job& j : jobs) {
      // A column slice stays in blocks only when it starts and ends on a block boundary.
      DType kept = DType::f32;
      if (j.may_keep_blocks && native_dtype(g.find_tensor(j.name)->type, &kept) &&
          j.col_begin % dtype_block_elems(kept) == 0 && j.cols % dtype_block_elems(kept) == 0)
        j.store = kept;
    }
    // An embedding table in a block format stays in it: SmolLM2-135M holds 30 MB of q8_0
    // instead of a 113 MB f32 table.
    DType table = DType::f32;
    if (native_dtype(g.find_tensor(names.embed)->type, &table)) embed_in_blocks(jobs, m, table, false);
  }
  SNAP_RETURN_IF_ERROR(check_fits_in_memory(jobs, path, opts));
  SNAP_RETURN_IF_ERROR(run_jobs(jobs, path, opts.scratch_floats,
                                [&g](const Job& j, float* out) { return fill_gguf(g, j, out); }));
  if (opts.matvec_tiles) pack_for_matvec(&m.weights);
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

// Tensor data in a file need not be aligned for its dtype: read through memcpy. Reads the
// job's slice, rows [row_begin, +rows) × columns [col_begin, +cols).
Status fill_safetensors(const SafetensorsModel& st, const Job& job, float* out) {
  const SafetensorsTensor& t = *st.find(job.name);
  auto widen = [&](auto convert, int64_t elem_bytes) {
    for (int64_t r = 0; r < job.rows; ++r) {
      const uint8_t* src = t.data + ((job.row_begin + r) * job.file_cols + job.col_begin) * elem_bytes;
      float* dst = out + r * job.cols;
      for (int64_t c = 0; c < job.cols; ++c) dst[c] = convert(src + c * elem_bytes);
    }
  };
  switch (t.dtype) {
    case DType::f32:
      widen([](const uint8_t* p) { float f; std::memcpy(&f, p, 4); return f; }, 4);
      break;
    case DType::f16:
      widen([](const uint8_t* p) { uint16_t h; std::memcpy(&h, p, 2); return f16_to_f32(h); }, 2);
      break;
    case DType::bf16:
      widen([](const uint8_t* p) { uint16_t h; std::memcpy(&h, p, 2); return bf16_to_f32(h); }, 2);
      break;
    case DType::q8_0:
    case DType::q4_0:
    case DType::q4_1:
    case DType::q5_0:
    case DType::q5_1:
    case DType::q4_k:
    case DType::q6_k:
    case DType::q5_k:
    case DType::q3_k:
    case DType::q2_k:
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
  SNAP_ASSIGN_OR_RETURN(m.shard, make_tp_shard(m.config, opts.tp_rank, opts.tp_size));
  std::vector<Job> jobs = plan_jobs(m.config, m.shard, hf_names(m.config, st), !m.config.tie_word_embeddings, false,
                                    opts.weight_dtype, &m.weights);
  for (const Job& j : jobs) SNAP_RETURN_IF_ERROR(check_safetensors(st, dir, j));
  if (opts.weight_dtype == DType::q8_0) {
    plan_q8_0(jobs);
    if (m.config.tie_word_embeddings && m.config.hidden_size % 32 == 0) embed_in_blocks(jobs, m, DType::q8_0, true);
  }
  SNAP_RETURN_IF_ERROR(check_fits_in_memory(jobs, dir, opts));
  SNAP_RETURN_IF_ERROR(run_jobs(jobs, dir, opts.scratch_floats,
                                [&st](const Job& j, float* out) { return fill_safetensors(st, j, out); }));
  if (opts.matvec_tiles) pack_for_matvec(&m.weights);
  return m;
}

}  // namespace

// ---------------------------------------------------------------------------

Status apply_weight_dtype(const std::string& name, LoadOptions* opts) {
  opts->keep_quantized = name == "auto";
  if (name == "auto" || name == "f32") {
    opts->weight_dtype = DType::f32;
  } else if (name == "f16") {
    opts->weight_dtype = DType::f16;
  } else if (name == "bf16") {
    opts->weight_dtype = DType::bf16;
  } else if (name == "q8_0") {
    opts->weight_dtype = DType::q8_0;
  } else {
    return invalid_argument("--weight-dtype '" + name + "' is not one of auto, f32, f16, bf16, q8_0");
  }
  return Status();
}

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
