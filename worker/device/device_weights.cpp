// DeviceWeights::upload: host matrices -> bf16 device arrays (f32 and f16 are converted on the
// host, bf16 copied as is), block-format ones -> quants, scales, mins and extra bytes, vectors
// -> f32 device arrays.
#include "worker/device/device_weights.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <iterator>
#include <cstring>
#include <string>

#include "kernels/cuda/block_split.h"

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

// A host block-format matrix (ggml's blocks, common/dtype.h) as the device's arrays
// (kernels/cuda/block_split.h): quants, f16 scales, mins and extra bytes, each row-major.
Result<DeviceMatrix> blocks_matrix(const Matrix& m, const std::string& what) {
  DeviceMatrix d;
  d.rows = m.rows();
  d.cols = m.cols();
  if (!kernels::block_format_of(m.dtype(), &d.format))
    return invalid_argument("device weights: " + what + " is " + dtype_name(m.dtype()) + ", not a block format");
  const int64_t per = kernels::block_format_elems(d.format);
  if (m.cols() % per != 0)
    return invalid_argument("device weights: " + what + " is in " + dtype_name(m.dtype()) + " blocks with cols % " +
                            std::to_string(per) + " != 0");
  const int64_t blocks = m.rows() * m.cols() / per;
  const kernels::SplitBlocks split =
      kernels::split_ggml_blocks(d.format, static_cast<const uint8_t*>(m.data()), blocks);
  const auto bytes = [](const auto& v) { return static_cast<int64_t>(v.size() * sizeof(v[0])); };
  SNAP_ASSIGN_OR_RETURN(d.data, to_device(split.quants.data(), bytes(split.quants), what + " quants"));
  SNAP_ASSIGN_OR_RETURN(d.scales, to_device(split.scales.data(), bytes(split.scales), what + " scales"));
  SNAP_ASSIGN_OR_RETURN(d.mins, to_device(split.mins.data(), bytes(split.mins), what + " mins"));
  SNAP_ASSIGN_OR_RETURN(d.extra, to_device(split.extra.data(), bytes(split.extra), what + " extra"));
  return d;
}

Result<DeviceMatrix> matrix(const Matrix& m, const std::string& what) {
  if (m.layout() != kernels::WeightLayout::rows)  // the CPU matvec's tiles: load with matvec_tiles = false
    return invalid_argument("device weights: " + what + " is in the CPU matvec's tiles (LoadOptions::matvec_tiles)");
  if (dtype_is_quantized(m.dtype()) && !m.empty()) return blocks_matrix(m, what);
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
    default:
      return invalid_argument("device weights: " + what + " is " + dtype_name(m.dtype()) + ", which the device cannot hold");
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

std::string DeviceWeights::storage() const {
  constexpr int k_formats = static_cast<int>(std::size(kernels::k_all_block_formats));
  bool seen[1 + k_formats] = {};  // bf16, then each block format
  const auto see = [&](const DeviceMatrix& m) {
    if (m.rows * m.cols == 0) return;
    seen[m.is_blocks() ? 1 + static_cast<int>(m.format) : 0] = true;
  };
  see(embed);
  see(lm_head);
  for (const DeviceLayer& l : layers) {
    for (const DeviceMatrix* m : {&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down}) see(*m);
  }
  std::string out;
  for (int i = 1; i <= k_formats; ++i) {  // the block formats first
    if (seen[i])
      out += (out.empty() ? "" : " + ") + std::string(kernels::block_format_name(static_cast<kernels::BlockFormat>(i - 1)));
  }
  if (seen[0]) out += out.empty() ? "bf16" : " + bf16";
  return out.empty() ? "bf16" : out;
}

int64_t DeviceWeights::largest_blocks_layer_elements() const {
  int64_t most = 0;
  for (const DeviceLayer& l : layers) {
    for (const DeviceMatrix* m : {&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down})
      if (m->is_blocks()) most = std::max(most, m->rows * m->cols);
  }
  return most;
}

DeviceMatrixView DeviceWeights::head() const {
  const DeviceMatrix& out = output();
  // The whole tied table: this rank's rows of it.
  return out.rows == shard.vocab_size ? out.view() : out.view().rows_from(shard.vocab_begin, shard.vocab_size);
}

}  // namespace snap
