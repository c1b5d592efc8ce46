// Internal to kernels/cpu: the two paths behind matmul_cpu, exposed so the benchmark can
// measure each on its own and the tests can force each regardless of num_tokens.
#pragma once

#include <cstdint>

#include "kernels/kernels.h"

namespace snap::kernels {

// matmul_cpu uses the sgemm path from this many tokens up. Measured (bench_kernels, one
// thread, 1536×576, CPU µs matvec/sgemm): f32 tokens 4: 207/268, 8: 386/353; f16 tokens 2:
// 89/106, 4: 192/146. The f16/bf16 sgemm path works on an L2-resident converted tile and
// wins earlier. Block formats (q8_0/q4_1/q4_0, same shape and setup): tokens 4: 94/124,
// 113/135, 112/130; tokens 8: 219/219, 302/218, 230/203; so the matvec runs below 8.
constexpr int64_t k_matmul_gemm_min_tokens_f32 = 8;
constexpr int64_t k_matmul_gemm_min_tokens_half = 4;
constexpr int64_t k_matmul_gemm_min_tokens_quant = 8;

// SIMD matvec: every weight row is read once per group of 4 tokens. Memory-bound.
void matmul_matvec_cpu(const float* x, const WeightView& w, const float* bias, float* y, int64_t num_tokens);
// The same with f32 activations whatever matvec_act() says (block formats dequantized in
// registers, f32 FMAs): the values the CUDA kernels compute with, for the host twin.
void matmul_matvec_f32act_cpu(const float* x, const WeightView& w, const float* bias, float* y, int64_t num_tokens);
// OpenBLAS sgemm; f16/bf16/block-format weights are converted to f32 one tile of rows at a time.
void matmul_gemm_cpu(const float* x, const WeightView& w, const float* bias, float* y, int64_t num_tokens);

}  // namespace snap::kernels
