// DeviceWeights::upload: host matrices -> bf16 device arrays (f32 and f16 are converted on the
// host, bf16 copied as is, a block-format table — a GGUF embedding the loader keeps in q8_0/
// q4_0/q4_1 even with keep_quantized = false — dequantized row by row by the loader's
// dequantizer, then rounded to bf16), vectors -> f32 device arrays.
#include "worker/device/device_weights.h"

#include <cuda_runtime.h>

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

Result<DeviceMatrix> matrix(const Matrix& m, const std::string& what) {
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
    case DType::q8_0:
    case DType::q4_0:
    case DType::q4_1: {  // the loader keeps a GGUF embedding in its block format
      const GgmlType t = m.dtype() == DType::q8_0   ? GgmlType::q8_0
                         : m.dtype() == DType::q4_0 ? GgmlType::q4_0
                                                    : GgmlType::q4_1;
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
    for (const DeviceArray* a : {&dl.attn_norm, &dl.ffn_norm, &dl.q.data, &dl.k.data, &dl.v.data, &dl.o.data,
                                 &dl.gate.data, &dl.up.data, &dl.down.data, &dl.q_bias, &dl.k_bias, &dl.v_bias,
                                 &dl.q_norm, &dl.k_norm, &dl.post_attn_norm, &dl.post_ffn_norm})
      d->bytes += a->bytes;
    d->layers.push_back(std::move(dl));
  }
  SNAP_ASSIGN_OR_RETURN(d->final_norm, vector_f32(w.final_norm, "final_norm"));
  SNAP_ASSIGN_OR_RETURN(d->lm_head, matrix(w.lm_head, "lm_head"));
  d->bytes += d->embed.data.bytes + d->final_norm.bytes + d->lm_head.data.bytes;
  return d;
}

DeviceHeadView DeviceWeights::head() const {
  const DeviceMatrix& out = output();
  DeviceHeadView v{out.data.bf16(), out.rows, out.cols};
  if (out.rows != shard.vocab_size) {  // the whole tied table: this rank's rows of it
    v.data += shard.vocab_begin * out.cols;
    v.rows = shard.vocab_size;
  }
  return v;
}

}  // namespace snap
