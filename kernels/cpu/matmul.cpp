// y[num_tokens, rows] = x[num_tokens, cols] · Wᵀ (+ bias) for f32, f16 and bf16 weights.
// matmul_ref: f64 dot products. matmul_cpu: decode-sized batches go to a SIMD matvec
// (rows split across OpenMP threads, 4 rows × up to 4 tokens per register block, so each
// weight byte is loaded once per 4 tokens); larger batches go to OpenBLAS sgemm.
#include "kernels/cpu/matmul.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <vector>

#include "common/check.h"
#include "kernels/cpu/simd.h"

namespace snap::kernels {

namespace {

template <DType D>
inline float load_w(const void* w, int64_t i) {
  if constexpr (D == DType::f32) return static_cast<const float*>(w)[i];
  if constexpr (D == DType::f16) return f16_to_f32(static_cast<const uint16_t*>(w)[i]);
  if constexpr (D == DType::bf16) return bf16_to_f32(static_cast<const uint16_t*>(w)[i]);
  return 0.0f;
}

// Below this many multiply-adds a parallel region costs more than it saves (~5 µs fork/join
// on this 2-core box vs ~3 µs for 64K bf16 FMAs at memory speed).
constexpr int64_t k_parallel_min_work = 1 << 16;
constexpr int k_block_rows = 4;
constexpr int k_block_tokens = 4;

// --- scalar -----------------------------------------------------------------
template <DType D>
void matvec_block_scalar(const float* x, const void* w, int64_t rows, int64_t cols, const float* bias, float* y,
                         int64_t num_tokens, int64_t r) {
  const int64_t r_end = std::min(rows, r + k_block_rows);
  for (int64_t i = r; i < r_end; ++i) {
    for (int64_t t = 0; t < num_tokens; ++t) {
      const float* xt = x + t * cols;
      float acc = 0.0f;
      for (int64_t c = 0; c < cols; ++c) acc += xt[c] * load_w<D>(w, i * cols + c);
      y[t * rows + i] = acc + (bias ? bias[i] : 0.0f);
    }
  }
}

// --- AVX2 + FMA + F16C ------------------------------------------------------
template <DType D>
SNAP_TARGET_AVX2 inline __m256 load8_avx2(const void* w, int64_t i) {
  if constexpr (D == DType::f32) {
    return _mm256_loadu_ps(static_cast<const float*>(w) + i);
  } else {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(w) + i));
    if constexpr (D == DType::f16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
}

template <DType D, int NT>
SNAP_TARGET_AVX2 void matvec_tile_avx2(const float* x, const void* w, int64_t rows, int64_t cols, const float* bias,
                                       float* y, int64_t r) {
  const int nr = static_cast<int>(std::min<int64_t>(k_block_rows, rows - r));
  int64_t row[k_block_rows];  // rows past the end repeat the last one; their results are dropped
  for (int k = 0; k < k_block_rows; ++k) row[k] = std::min(r + k, rows - 1) * cols;
  __m256 acc[k_block_rows][NT];
  for (int k = 0; k < k_block_rows; ++k)
    for (int t = 0; t < NT; ++t) acc[k][t] = _mm256_setzero_ps();
  int64_t c = 0;
  for (; c + 8 <= cols; c += 8) {
    __m256 xv[NT];
    for (int t = 0; t < NT; ++t) xv[t] = _mm256_loadu_ps(x + t * cols + c);
    for (int k = 0; k < k_block_rows; ++k) {
      const __m256 wv = load8_avx2<D>(w, row[k] + c);
      for (int t = 0; t < NT; ++t) acc[k][t] = _mm256_fmadd_ps(wv, xv[t], acc[k][t]);
    }
  }
  for (int k = 0; k < nr; ++k) {
    for (int t = 0; t < NT; ++t) {
      float s = hsum_avx2(acc[k][t]);
      for (int64_t cc = c; cc < cols; ++cc) s += x[t * cols + cc] * load_w<D>(w, row[k] + cc);
      y[t * rows + r + k] = s + (bias ? bias[r + k] : 0.0f);
    }
  }
}

// --- AVX-512 ----------------------------------------------------------------
template <DType D>
SNAP_TARGET_AVX512 inline __m512 load16_avx512(const void* w, int64_t i, __mmask16 m) {
  if constexpr (D == DType::f32) {
    return _mm512_maskz_loadu_ps(m, static_cast<const float*>(w) + i);
  } else {
    const __m256i h = _mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(w) + i);
    if constexpr (D == DType::f16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
}

template <DType D, int NT>
SNAP_TARGET_AVX512 void matvec_tile_avx512(const float* x, const void* w, int64_t rows, int64_t cols,
                                           const float* bias, float* y, int64_t r) {
  const int nr = static_cast<int>(std::min<int64_t>(k_block_rows, rows - r));
  int64_t row[k_block_rows];
  for (int k = 0; k < k_block_rows; ++k) row[k] = std::min(r + k, rows - 1) * cols;
  __m512 acc[k_block_rows][NT];
  for (int k = 0; k < k_block_rows; ++k)
    for (int t = 0; t < NT; ++t) acc[k][t] = _mm512_setzero_ps();
  for (int64_t c = 0; c < cols; c += 16) {
    // Full mask except on the last, partial chunk: one loop, no scalar tail.
    const __mmask16 m = cols - c >= 16 ? __mmask16(0xffff) : __mmask16((1u << (cols - c)) - 1);
    __m512 xv[NT];
    for (int t = 0; t < NT; ++t) xv[t] = _mm512_maskz_loadu_ps(m, x + t * cols + c);
    for (int k = 0; k < k_block_rows; ++k) {
      const __m512 wv = load16_avx512<D>(w, row[k] + c, m);
      for (int t = 0; t < NT; ++t) acc[k][t] = _mm512_fmadd_ps(wv, xv[t], acc[k][t]);
    }
  }
  for (int k = 0; k < nr; ++k)
    for (int t = 0; t < NT; ++t) y[t * rows + r + k] = hsum_avx512(acc[k][t]) + (bias ? bias[r + k] : 0.0f);
}

// --- dispatch ---------------------------------------------------------------
using TileFn = void (*)(const float*, const void*, int64_t, int64_t, const float*, float*, int64_t);

template <DType D>
TileFn pick_tile(SimdLevel level, int nt) {
  if (level == SimdLevel::avx512) {
    switch (nt) {
      case 1: return matvec_tile_avx512<D, 1>;
      case 2: return matvec_tile_avx512<D, 2>;
      case 3: return matvec_tile_avx512<D, 3>;
      default: return matvec_tile_avx512<D, 4>;
    }
  }
  switch (nt) {
    case 1: return matvec_tile_avx2<D, 1>;
    case 2: return matvec_tile_avx2<D, 2>;
    case 3: return matvec_tile_avx2<D, 3>;
    default: return matvec_tile_avx2<D, 4>;
  }
}

template <DType D>
void matvec(const float* x, const WeightView& w, const float* bias, float* y, int64_t num_tokens) {
  const SimdLevel level = simd_level();
  const int64_t rows = w.rows, cols = w.cols;
  const int64_t num_blocks = (rows + k_block_rows - 1) / k_block_rows;
  const bool parallel = rows * cols * num_tokens >= k_parallel_min_work;
  if (level == SimdLevel::scalar) {
#pragma omp parallel for schedule(static) if (parallel)
    for (int64_t b = 0; b < num_blocks; ++b)
      matvec_block_scalar<D>(x, w.data, rows, cols, bias, y, num_tokens, b * k_block_rows);
    return;
  }
  const int64_t full_groups = num_tokens / k_block_tokens;
  const int rest = static_cast<int>(num_tokens % k_block_tokens);
  const TileFn full = pick_tile<D>(level, k_block_tokens);
  const TileFn tail = rest ? pick_tile<D>(level, rest) : nullptr;
  // Token groups innermost: a block of 4 rows (≤ 4·cols·4 bytes) stays in L1 across groups.
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t b = 0; b < num_blocks; ++b) {
    for (int64_t g = 0; g < full_groups; ++g) {
      const int64_t t0 = g * k_block_tokens;
      full(x + t0 * cols, w.data, rows, cols, bias, y + t0 * rows, b * k_block_rows);
    }
    if (tail) {
      const int64_t t0 = full_groups * k_block_tokens;
      tail(x + t0 * cols, w.data, rows, cols, bias, y + t0 * rows, b * k_block_rows);
    }
  }
}

// --- f16/bf16 → f32 row conversion for the sgemm path ------------------------
template <DType D>
SNAP_TARGET_AVX512 void convert_avx512(const void* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? __mmask16(0xffff) : __mmask16((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(dst + i, m, load16_avx512<D>(src, i, m));
  }
}

template <DType D>
SNAP_TARGET_AVX2 void convert_avx2(const void* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, load8_avx2<D>(src, i));
  for (; i < n; ++i) dst[i] = load_w<D>(src, i);
}

template <DType D>
void convert_rows(const void* src, float* dst, int64_t n) {
  switch (simd_level()) {
    case SimdLevel::avx512: return convert_avx512<D>(src, dst, n);
    case SimdLevel::avx2: return convert_avx2<D>(src, dst, n);
    case SimdLevel::scalar:
      for (int64_t i = 0; i < n; ++i) dst[i] = load_w<D>(src, i);
      return;
  }
}

// f16/bf16 prefill: convert a tile of W rows to f32 (sized to stay in L2, 1 MiB per core
// here: 256 KiB) and sgemm it, rather than a hand-blocked SIMD GEMM: OpenBLAS reaches 63–81
// GFLOP/s per core at 512 tokens on f32, and the tiled f16 path 55–65 GFLOP/s (bench_kernels,
// one thread), i.e. conversion costs 10–20%, far less than matching OpenBLAS's blocking would.
constexpr int64_t k_tile_bytes = 256 << 10;

template <DType D>
void gemm_converted(const float* x, const WeightView& w, float* y, int64_t num_tokens) {
  const int64_t rows = w.rows, cols = w.cols;
  const int64_t tile_rows = std::max<int64_t>(16, k_tile_bytes / (cols * 4));
  std::vector<float> tile(static_cast<size_t>(std::min(tile_rows, rows) * cols));
  const auto* src = static_cast<const uint16_t*>(w.data);
  for (int64_t r0 = 0; r0 < rows; r0 += tile_rows) {
    const int64_t nr = std::min(tile_rows, rows - r0);
    convert_rows<D>(src + r0 * cols, tile.data(), nr * cols);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(num_tokens), static_cast<int>(nr),
                static_cast<int>(cols), 1.0f, x, static_cast<int>(cols), tile.data(), static_cast<int>(cols), 0.0f,
                y + r0, static_cast<int>(rows));
  }
}

}  // namespace

// --- reference ----------------------------------------------------------------
void matmul_ref(const float* x, const WeightView& w, const float* bias, float* y, int64_t num_tokens) {
  for (int64_t t = 0; t < num_tokens; ++t) {
    for (int64_t r = 0; r < w.rows; ++r) {
      double acc = bias ? bias[r] : 0.0;
      for (int64_t c = 0; c < w.cols; ++c) {
        const int64_t i = r * w.cols + c;
        float wv = 0.0f;
        switch (w.dtype) {
          case DType::f32: wv = load_w<DType::f32>(w.data, i); break;
          case DType::f16: wv = load_w<DType::f16>(w.data, i); break;
          case DType::bf16: wv = load_w<DType::bf16>(w.data, i); break;
        }
        acc += static_cast<double>(x[t * w.cols + c]) * wv;
      }
      y[t * w.rows + r] = static_cast<float>(acc);
    }
  }
}

// --- fast paths -----------------------------------------------------------------
void matmul_matvec_cpu(const float* x, const WeightView& w, const float* bias, float* y, int64_t num_tokens) {
  CHECK(w.data != nullptr && w.rows > 0 && w.cols > 0) << "matmul: empty weight";
  switch (w.dtype) {
    case DType::f32: return matvec<DType::f32>(x, w, bias, y, num_tokens);
    case DType::f16: return matvec<DType::f16>(x, w, bias, y, num_tokens);
    case DType::bf16: return matvec<DType::bf16>(x, w, bias, y, num_tokens);
  }
}

void matmul_gemm_cpu(const float* x, const WeightView& w, const float* bias, float* y, int64_t num_tokens) {
  CHECK(w.data != nullptr && w.rows > 0 && w.cols > 0) << "matmul: empty weight";
  switch (w.dtype) {
    case DType::f32:
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(num_tokens), static_cast<int>(w.rows),
                  static_cast<int>(w.cols), 1.0f, x, static_cast<int>(w.cols), static_cast<const float*>(w.data),
                  static_cast<int>(w.cols), 0.0f, y, static_cast<int>(w.rows));
      break;
    case DType::f16: gemm_converted<DType::f16>(x, w, y, num_tokens); break;
    case DType::bf16: gemm_converted<DType::bf16>(x, w, y, num_tokens); break;
  }
  if (bias) {
    for (int64_t t = 0; t < num_tokens; ++t)
      for (int64_t r = 0; r < w.rows; ++r) y[t * w.rows + r] += bias[r];
  }
}

void matmul_cpu(const float* x, const WeightView& w, const float* bias, float* y, int64_t num_tokens) {
  const int64_t min_gemm = w.dtype == DType::f32 ? k_matmul_gemm_min_tokens_f32 : k_matmul_gemm_min_tokens_half;
  if (num_tokens < min_gemm) return matmul_matvec_cpu(x, w, bias, y, num_tokens);
  matmul_gemm_cpu(x, w, bias, y, num_tokens);
}

}  // namespace snap::kernels
