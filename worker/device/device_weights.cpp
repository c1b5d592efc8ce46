// DeviceWeights::upload: host matrices -> bf16 device arrays (f32 and f16 are converted on the
// host, bf16 copied as is, q4_0/q4_1 blocks dequantized row by row by the loader's dequantizer,
// then rounded to bf16), Q8_0 ones -> quants and scales, vectors -> f32 device arrays.
#include "worker/device/device_weights.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "worker/model/dequant.h"

namespace snap {

DeviceArray& DeviceArray::operator=(DeviceArray&& o) noexcept {
  if (this != &o) {
    cudaFree(ptr);
    ptr = o.ptr;
    bytes = o.bytes;
    o.ptr = nullptr;
    o.bytes = 0;
  }
  return *this;
}

DeviceArray::~DeviceArray() { cudaFree(ptr); }

namespace {

Result<DeviceArray> to_device(const void* host, int64_t bytes, const std::string& what) {
  DeviceArray a;
  if (bytes == 0) return a;
  cudaError_t e = cudaMalloc(&a.ptr, static_cast<size_t>(bytes));
  if (e != cudaSuccess)
    return resource_exhausted("device weights: cudaMalloc of " + std::to_string(bytes) + " bytes for " + what + ": " +
                              cudaGetErrorString(e));
  a.bytes = bytes;
  e = cudaMemcpy(a.ptr, host, static_cast<size_t>(bytes), cudaMemcpyHostToDevice);
  if (e != cudaSuccess) return internal_error("device weights: copying " + what + ": " + cudaGetErrorString(e));
  return a;
}

// A host Q8_0 matrix (ggml blocks: f16 scale, 32 int8) as the two device arrays.
Result<DeviceMatrix> q8_matrix(const Matrix& m, const std::string& what) {
  DeviceMatrix d;
  d.rows = m.rows();
  d.cols = m.cols();
  const int64_t n = m.rows() * m.cols(), blocks = n / 32;
  if (m.cols() % 32 != 0) return invalid_argument("device weights: " + what + " is Q8_0 with cols % 32 != 0");
  std::vector<int8_t> q(static_cast<size_t>(n));
  std::vector<uint16_t> scale(static_cast<size_t>(blocks));
  const int64_t block_bytes = dtype_row_bytes(DType::q8_0, 32);
  const auto* src = static_cast<const uint8_t*>(m.data());
  for (int64_t b = 0; b < blocks; ++b) {  // rows are whole blocks: block b is row b / (cols / 32)'s
    const uint8_t* blk = src + b * block_bytes;
    std::memcpy(&scale[b], blk, 2);
    std::memcpy(&q[b * 32], blk + 2, 32);
  }
  SNAP_ASSIGN_OR_RETURN(d.data, to_device(q.data(), n, what + " quants"));
  SNAP_ASSIGN_OR_RETURN(d.scales, to_device(scale.data(), blocks * 2, what + " scales"));
  return d;
}

Result<DeviceMatrix> matrix(const Matrix& m, const std::string& what) {
  if (m.layout() != kernels::WeightLayout::rows)  // the CPU matvec's tiles: load with matvec_tiles = false
    return invalid_argument("device weights: " + what + " is in the CPU matvec's tiles (LoadOptions::matvec_tiles)");
  if (m.dtype() == DType::q8_0 && !m.empty()) return q8_matrix(m, what);
  DeviceMatrix d;
  d.rows = m.rows();
  d.cols = m.cols();
  if (m.empty()) return d;
  const int64_t n = m.rows() * m.cols();
  std::vector<uint16_t> b(static_cast<size_t>(n));
  switch (m.dtype()) {
    case DType::bf16: {
      const auto* s = static_cast<const uint16_t*>(m.data());
      b.assign(s, s + n);
      break;
    }
    case DType::f32: {
      const float* s = m.f32();
      for (int64_t i = 0; i < n; ++i) b[i] = f32_to_bf16(s[i]);
      break;
    }
    case DType::f16: {
      const auto* s = static_cast<const uint16_t*>(m.data());
      for (int64_t i = 0; i < n; ++i) b[i] = f32_to_bf16(f16_to_f32(s[i]));
      break;
    }
    case DType::q4_0:
    case DType::q4_1: {  // a GGUF's blocks (LoadOptions::keep_quantized): dequantized
      const GgmlType t = m.dtype() == DType::q4_0 ? GgmlType::q4_0 : GgmlType::q4_1;
      const int64_t row_bytes = dtype_row_bytes(m.dtype(), m.cols());
      std::vector<float> row(static_cast<size_t>(m.cols()));
      for (int64_t r = 0; r < m.rows(); ++r) {
        SNAP_RETURN_IF_ERROR(dequantize(t, static_cast<const uint8_t*>(m.data()) + r * row_bytes, row.data(), m.cols()));
        for (int64_t c = 0; c < m.cols(); ++c) b[r * m.cols() + c] = f32_to_bf16(row[c]);
      }
      break;
    }
    default:
      return invalid_argument("device weights: " + what + " is " + dtype_name(m.dtype()) +
                              "; load with keep_quantized = false (dequantized at load)");
  }
  SNAP_ASSIGN_OR_RETURN(d.data, to_device(b.data(), n * 2, what));
  return d;
}

Result<DeviceArray> vector_f32(const Matrix& m, const std::string& what) {
  if (m.empty()) return DeviceArray();
  if (m.dtype() != DType::f32) return invalid_argument("device weights: " + what + " must be f32");
  return to_device(m.data(), m.rows() * m.cols() * 4, what);
}

}  // namespace

Result<std::unique_ptr<DeviceWeights>> DeviceWeights::upload(const LoadedModel& model) {
  const ModelWeights& w = model.weights;
  auto d = std::make_unique<DeviceWeights>();
  d->shard = model.shard;
  SNAP_ASSIGN_OR_RETURN(d->embed, matrix(w.embed, "embed"));
  for (size_t l = 0; l < w.layers.size(); ++l) {
    const LayerWeights& s = w.layers[l];
    const std::string p = "layer " + std::to_string(l) + " ";
    DeviceLayer dl;
    SNAP_ASSIGN_OR_RETURN(dl.attn_norm, vector_f32(s.attn_norm, p + "attn_norm"));
    SNAP_ASSIGN_OR_RETURN(dl.ffn_norm, vector_f32(s.ffn_norm, p + "ffn_norm"));
    SNAP_ASSIGN_OR_RETURN(dl.q, matrix(s.q_proj, p + "q_proj"));
    SNAP_ASSIGN_OR_RETURN(dl.k, matrix(s.k_proj, p + "k_proj"));
    SNAP_ASSIGN_OR_RETURN(dl.v, matrix(s.v_proj, p + "v_proj"));
    SNAP_ASSIGN_OR_RETURN(dl.o, matrix(s.o_proj, p + "o_proj"));
    SNAP_ASSIGN_OR_RETURN(dl.gate, matrix(s.gate_proj, p + "gate_proj"));
    SNAP_ASSIGN_OR_RETURN(dl.up, matrix(s.up_proj, p + "up_proj"));
    SNAP_ASSIGN_OR_RETURN(dl.down, matrix(s.down_proj, p + "down_proj"));
    SNAP_ASSIGN_OR_RETURN(dl.q_bias, vector_f32(s.q_bias, p + "q_bias"));
    SNAP_ASSIGN_OR_RETURN(dl.k_bias, vector_f32(s.k_bias, p + "k_bias"));
    SNAP_ASSIGN_OR_RETURN(dl.v_bias, vector_f32(s.v_bias, p + "v_bias"));
    SNAP_ASSIGN_OR_RETURN(dl.q_norm, vector_f32(s.q_norm, p + "q_norm"));
    SNAP_ASSIGN_OR_RETURN(dl.k_norm, vector_f32(s.k_norm, p + "k_norm"));
    SNAP_ASSIGN_OR_RETURN(dl.post_attn_norm, vector_f32(s.post_attn_norm, p + "post_attn_norm"));
    SNAP_ASSIGN_OR_RETURN(dl.post_ffn_norm, vector_f32(s.post_ffn_norm, p + "post_ffn_norm"));
    for (const DeviceArray* a : {&dl.attn_norm, &dl.ffn_norm, &dl.q_bias, &dl.k_bias, &dl.v_bias, &dl.q_norm,
                                 &dl.k_norm, &dl.post_attn_norm, &dl.post_ffn_norm})
      d->bytes += a->bytes;
    for (const DeviceMatrix* m : {&dl.q, &dl.k, &dl.v, &dl.o, &dl.gate, &dl.up, &dl.down}) d->bytes += m->bytes();
    d->layers.push_back(std::move(dl));
  }
  SNAP_ASSIGN_OR_RETURN(d->final_norm, vector_f32(w.final_norm, "final_norm"));
  SNAP_ASSIGN_OR_RETURN(d->lm_head, matrix(w.lm_head, "lm_head"));
  d->bytes += d->embed.bytes() + d->final_norm.bytes + d->lm_head.bytes();
  return d;
}

bool DeviceWeights::any_q8() const { return embed.q8() || lm_head.q8() || largest_q8_layer_elements() > 0; }

int64_t DeviceWeights::largest_q8_layer_elements() const {
  int64_t most = 0;
  for (const DeviceLayer& l : layers) {
    for (const DeviceMatrix* m : {&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down})
      if (m->q8()) most = std::max(most, m->rows * m->cols);
  }
  return most;
}

DeviceMatrixView DeviceWeights::head() const {
  const DeviceMatrix& out = output();
  // The whole tied table: this rank's rows of it.
  return out.rows == shard.vocab_size ? out.view() : out.view().rows_from(shard.vocab_begin, shard.vocab_size);
}

}  // namespace snap
