// How the SIMD matvec (decode rows, kernels/cpu/matmul.cpp) treats the activations when the
// weights are in a ggml block format (q8_0, q4_0, q4_1). f32/f16/bf16 weights ignore it. Q5_0, Q5_1
// and the K formats Q2_K to Q6_K run q16act when it is asked for, f32act under f32act and q16x2act
// under every other mode (their only integer tiles, matvec_q16act.cpp; the K formats by 32-weight
// sub-blocks).
//   f32act: weights dequantized in registers, f32 FMAs against f32 activations (the reference;
//           the default until q16x2act matched its accuracy against transformers).
//   q8act:  each activation row is quantized once per call to int8 blocks of 32 with an f32
//           scale (d = max|x|/127, q = round(x/d)), and every block's dot product is an exact
//           integer sum (AVX2 maddubs/madd) scaled by d_w·d_x: fewer instructions per weight byte.
//   q16act: as q8act with int16 activation blocks (d = max|x|/32767) and the weight quants
//           widened to int16 in registers (AVX2 vpmaddwd): 1/258 of q8act's rounding error.
//   q16x2act: q16act plus a second int16 plane holding the rounding residual at scale d/32768
//           (activations to ~2^-31 of each block's max|x|) and two more vpmaddwd per block.
//           SmolLM2 logits within 1.2e-4 of transformers at every golden position run through
//           it (f32act 8.1e-5; tests/matvec_act), ~1.5x f32act's speed on AVX2. The default on
//           AVX2 CPUs without AVX-VNNI.
//   q8x3act: each activation block quantized to 22-bit integers (d = max|x|/(127·2^14), error
//           ≤ 3/4·d ≈ 2^-21.4 of max|x|) held as three int8 digit planes, so every block's dot
//           product is exact u8 × s8 integer sums: AVX-512 VNNI vpdpbusd, 4 blocks × 4 rows at
//           a time (kernels/cpu/matvec_q8x3act.cpp); on AVX2 CPUs the same per lane in two
//           256-bit halves, with AVX-VNNI's vpdpbusd where the CPU has it (Alder Lake and later,
//           Zen 5) or vpmaddubsw + vpmaddwd (and the sign trick for q8_0) where not: the same
//           bits as the AVX-512 tiles (kernels/cpu/matvec_q8x3act_avx2.inc). SmolLM2 logits
//           within 1.4e-4 of transformers (tests/matvec_act). The default where the CPU has
//           AVX-512 VNNI or AVX-VNNI; below AVX2 it runs scalar tiles (correct, slow). The loader also
//           rearranges the weights into 4-row tiles (kernels/weight_tiles.h), which the vector
//           tiles read as one stream without gathers (same results; AVX-512 ~1.3-1.5x faster,
//           AVX2 ~1.5-2x: its row-major tile is slower than q16x2act's).
// On a CPU without AVX2 every mode runs the f32act scalar path; q8act runs its AVX2 tiles on
// AVX-512 too; q16act/q16x2act run AVX2 tiles there unless env SNAP_MATVEC_VNNI=1 selects
// their AVX-512 VNNI tiles on a CPU with avx512vnni (kernels/cpu/matvec_q16act_vnni.cpp: they
// pass their tests on such a CPU but are no faster than the AVX2 tiles there).
// Chosen process-wide: env SNAP_MATVEC=f32act|q8act|q16act|q16x2act|q8x3act (read once) or
// matvec_act_set() (CLIs).
#pragma once

#include <cstdint>
#include <string>

#include "kernels/kernels.h"

namespace snap::kernels {

enum class MatvecAct : uint8_t { f32, q8, q16, q16x2, q8x3 };

// The current choice: matvec_act_set() if called, else SNAP_MATVEC, else matvec_act_default().
MatvecAct matvec_act();
// q8x3act where its tiles have vpdpbusd (AVX-512 VNNI; AVX-VNNI at the avx2 level), else q16x2act.
MatvecAct matvec_act_default();
void matvec_act_set(MatvecAct act);
// Which instructions the current mode's tiles use here, for reports: q8x3act "avx512-vnni",
// "avx2+avx-vnni", "avx2 maddubs" or "scalar"; the other modes simd_level()'s name.
const char* matvec_act_tiles_name();
const char* matvec_act_name(MatvecAct act);  // "f32act" | "q8act" | "q16act" | "q16x2act" | "q8x3act"
// One of those names -> true and *out set; anything else -> false.
bool matvec_act_from_name(const std::string& name, MatvecAct* out);

// The q8-activation matvec on its own (whatever matvec_act() says), for the tests and the
// benchmark: y[num_tokens, rows] = q8(x) · wᵀ (+ bias). w must be q8_0, q4_0 or q4_1.
// _ref: scalar, the same activation quantization, exact integer block sums, f64 accumulation.
// _cpu: AVX2 (on AVX2 and AVX-512 machines) with rows across OpenMP threads; on a CPU without
// AVX2 it is the reference. Each token's result is independent of num_tokens (batch invariance).
void matvec_q8act_ref(const float* x, const WeightView& w, const float* bias, float* y, int64_t num_tokens);
void matvec_q8act_cpu(const float* x, const WeightView& w, const float* bias, float* y, int64_t num_tokens);

// The activation quantization both use, per token row of `cols` (a multiple of 32):
// q[cols] int8 in [-127, 127], d[cols/32] the block scales, s[cols/32] = d·Σq per block.
// A block holding a NaN or an infinity gets d = s = NaN (and q = 0), so the outputs are NaN.
void quantize_act_q8(const float* x, int64_t cols, int8_t* q, float* d, float* s);

// The q16-activation matvec (kernels/cpu/matvec_q16act.cpp), with the same contract as the
// q8act pair above: _ref scalar (exact integer block sums, f64 accumulation), _cpu AVX2 tiles.
void matvec_q16act_ref(const float* x, const WeightView& w, const float* bias, float* y, int64_t num_tokens);
void matvec_q16act_cpu(const float* x, const WeightView& w, const float* bias, float* y, int64_t num_tokens);
// Per token row of `cols` (a multiple of 32): q[cols] int16 in [-32767, 32767], d[cols/32] =
// max|x|/32767 per block, s[cols/32] = d·Σq; a non-finite block gets d = s = NaN (and q = 0).
void quantize_act_q16(const float* x, int64_t cols, int16_t* q, float* d, float* s);
// q16x2act: the same q and d, plus q2 = round((x − d·q)·32768/d) and s = d·(Σq + Σq2/32768).
void quantize_act_q16x2(const float* x, int64_t cols, int16_t* q, int16_t* q2, float* d, float* s);
void matvec_q16x2act_ref(const float* x, const WeightView& w, const float* bias, float* y, int64_t num_tokens);
void matvec_q16x2act_cpu(const float* x, const WeightView& w, const float* bias, float* y, int64_t num_tokens);

// The q8x3-activation matvec (kernels/cpu/matvec_q8x3act.cpp), with the same contract: _ref
// scalar (exact integer block sums, f64 accumulation), _cpu the AVX-512 VNNI tiles where the CPU
// has them, else scalar tiles. Per token row of `cols` (a multiple of 32): v[cols] the 22-bit
// integers V = round(x/d), |V| ≤ 127·2^14 + 8191, d[cols/32] = max|x|/(127·2^14) per block,
// s[cols/32] = d·ΣV; a non-finite block gets d = s = NaN (and V = 0).
void quantize_act_q8x3(const float* x, int64_t cols, int32_t* v, float* d, float* s);
void matvec_q8x3act_ref(const float* x, const WeightView& w, const float* bias, float* y, int64_t num_tokens);
void matvec_q8x3act_cpu(const float* x, const WeightView& w, const float* bias, float* y, int64_t num_tokens);

}  // namespace snap::kernels
