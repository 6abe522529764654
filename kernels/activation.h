// Element-wise activations: SwiGLU and sigmoid gating.
#pragma once

#include <cstdint>

namespace qtk {

// out[t, i] = silu(gate_up[t, i]) * gate_up[t, I + i]
//   gate_up: f32 [T, 2I] (gate columns then up columns) row stride ld
//   out: f32 [T, I] row stride ldo (may alias gate_up when ldo == ld).
void swiglu(const float* gate_up, int64_t ld, float* out, int64_t ldo, int64_t T, int64_t I);

// x[i] *= sigmoid(gate[i]) for i < n.
void sigmoid_mul(float* x, const float* gate, int64_t n);

// The attention output gate of Qwen3.5, per head:
//   x[t*ldx + h*dim + d] *= sigmoid(gate[t*ldg + h*gate_head_stride + d])
// (q_proj yields [query | gate] per head, so gate_head_stride = 2*dim there).
void sigmoid_mul_heads(float* x, int64_t ldx, const float* gate, int64_t ldg,
                       int64_t gate_head_stride, int64_t T, int64_t heads, int64_t dim);

}  // namespace qtk
