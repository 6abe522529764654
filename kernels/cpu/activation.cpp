#include "kernels/activation.h"

#include "kernels/cpu/simd_math.h"

namespace qtk {

namespace {

QTK_CLONES void swiglu_row(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = cpu::silu_poly(gate[i]) * up[i];
}

QTK_CLONES void sigmoid_mul_row(float* x, const float* gate, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = x[i] * cpu::sigmoid_poly(gate[i]);
}

}  // namespace

void swiglu(const float* gate_up, int64_t ld, float* out, int64_t ldo, int64_t T, int64_t I) {
  for (int64_t t = 0; t < T; ++t) {
    const float* row = gate_up + t * ld;
    swiglu_row(row, row + I, out + t * ldo, I);
  }
}

void sigmoid_mul(float* x, const float* gate, int64_t n) { sigmoid_mul_row(x, gate, n); }

void sigmoid_mul_heads(float* x, int64_t ldx, const float* gate, int64_t ldg,
                       int64_t gate_head_stride, int64_t T, int64_t heads, int64_t dim) {
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      sigmoid_mul_row(x + t * ldx + h * dim, gate + t * ldg + h * gate_head_stride, dim);
    }
  }
}

}  // namespace qtk
