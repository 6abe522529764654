#include "kernels/moe.h"

#include "kernels/cpu/simd_math.h"

namespace qtk {

namespace {

QTK_CLONES void axpy_row(float* out, const float* y, float a, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = out[i] + a * y[i];
}

}  // namespace

void moe_route(float* logits, int64_t ld, int64_t T, int64_t E, int64_t k, bool renormalize,
               int32_t* ids, float* weights) {
  for (int64_t t = 0; t < T; ++t) {
    float* p = logits + t * ld;
    // Softmax in float32: max, exp(x - max), their sum in index order, one division each.
    float mx = p[0];
    for (int64_t e = 1; e < E; ++e) mx = p[e] > mx ? p[e] : mx;
    float sum = 0.0f;
    for (int64_t e = 0; e < E; ++e) {
      p[e] = cpu::exp_poly(p[e] - mx);
      sum += p[e];
    }
    for (int64_t e = 0; e < E; ++e) p[e] = p[e] / sum;
    int32_t* id = ids + t * k;
    float* w = weights + t * k;
    for (int64_t j = 0; j < k; ++j) {
      int64_t best = -1;
      for (int64_t e = 0; e < E; ++e) {
        bool taken = false;
        for (int64_t i = 0; i < j; ++i) taken = taken || id[i] == e;
        // note: strictly greater: among equal probabilities the lower index stays.
        if (!taken && (best < 0 || p[e] > p[best])) best = e;
      }
      id[j] = static_cast<int32_t>(best);
      w[j] = p[best];
    }
    if (renormalize) {
      float s = 0.0f;
      for (int64_t j = 0; j < k; ++j) s += w[j];
      for (int64_t j = 0; j < k; ++j) w[j] = w[j] / s;
    }
  }
}

void moe_scatter_add(float* out, int64_t ldo, const float* y, int64_t ldy, const int32_t* rows,
                     const float* weights, int64_t n, int64_t H) {
  for (int64_t r = 0; r < n; ++r) axpy_row(out + rows[r] * ldo, y + r * ldy, weights[r], H);
}

void moe_add_gated(float* out, int64_t ldo, const float* y, int64_t ldy, const float* gate,
                   int64_t T, int64_t H) {
  for (int64_t t = 0; t < T; ++t)
    axpy_row(out + t * ldo, y + t * ldy, cpu::sigmoid_poly(gate[t]), H);
}

}  // namespace qtk
