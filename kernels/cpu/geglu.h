// GeGLU with the tanh approximation of GELU (Gemma's MLP, transformers' gelu_pytorch_tanh):
// out[i] = gelu_tanh(gate[i]) · up[i],
// gelu_tanh(g) = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g³))). out may alias gate.
// geglu_ref is the f64 reference; geglu_cpu the SIMD path (tanh through the vector exp of
// simd.h), within ~1e-6 relative of the reference. NaN in gate or up propagates to out.
#pragma once

#include <cstdint>

namespace snap::kernels {

void geglu_ref(const float* gate, const float* up, float* out, int64_t n);
void geglu_cpu(const float* gate, const float* up, float* out, int64_t n);

}  // namespace snap::kernels
