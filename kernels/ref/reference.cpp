#include "kernels/ref/reference.h"

#include <cmath>
#include <cstring>
#include <vector>

namespace qtk::ref {

namespace {

double silu(double x) { return x / (1.0 + std::exp(-x)); }
double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

double half_to_double(uint16_t h) {
  int sign = (h >> 15) & 1;
  int e = (h >> 10) & 0x1F;
  int m = h & 0x3FF;
  double v;
  if (e == 0) {
    v = std::ldexp(static_cast<double>(m), -24);
  } else if (e == 31) {
    v = m == 0 ? INFINITY : NAN;
  } else {
    v = std::ldexp(1.0 + m / 1024.0, e - 15);
  }
  return sign ? -v : v;
}

}  // namespace

double weight_value(const void* w, DType t, int64_t index) {
  switch (t) {
    case DType::BF16: {
      uint32_t bits = static_cast<uint32_t>(static_cast<const uint16_t*>(w)[index]) << 16;
      float f;
      std::memcpy(&f, &bits, 4);
      return f;
    }
    case DType::F16:
      return half_to_double(static_cast<const uint16_t*>(w)[index]);
    default:
      return static_cast<const float*>(w)[index];
  }
}

void matmul_ref(const float* x, int64_t ldx, const void* w, DType wtype, float* y, int64_t ldy,
                int64_t M, int64_t N, int64_t K) {
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      double s = 0.0;
      for (int64_t k = 0; k < K; ++k)
        s += static_cast<double>(x[m * ldx + k]) * weight_value(w, wtype, n * K + k);
      y[m * ldy + n] = static_cast<float>(s);
    }
  }
}

void rmsnorm_ref(const float* x, int64_t ldx, const float* w, float* y, int64_t ldy, int64_t rows,
                 int64_t cols, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0.0;
    for (int64_t c = 0; c < cols; ++c) ss += static_cast<double>(x[r * ldx + c]) * x[r * ldx + c];
    double inv = 1.0 / std::sqrt(ss / cols + eps);
    for (int64_t c = 0; c < cols; ++c)
      y[r * ldy + c] = static_cast<float>(x[r * ldx + c] * inv * w[c]);
  }
}

void gated_rmsnorm_ref(const float* x, int64_t ldx, const float* z, int64_t ldz, const float* w,
                       float* y, int64_t ldy, int64_t tokens, int64_t heads, int64_t head_dim,
                       float eps) {
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      const float* xr = x + t * ldx + h * head_dim;
      const float* zr = z + t * ldz + h * head_dim;
      double ss = 0.0;
      for (int64_t c = 0; c < head_dim; ++c) ss += static_cast<double>(xr[c]) * xr[c];
      double inv = 1.0 / std::sqrt(ss / head_dim + eps);
      for (int64_t c = 0; c < head_dim; ++c) {
        y[t * ldy + h * head_dim + c] = static_cast<float>(w[c] * (xr[c] * inv) * silu(zr[c]));
      }
    }
  }
}

void l2norm_heads_ref(float* x, int64_t ldx, int64_t tokens, int64_t heads, int64_t head_dim,
                      float eps, float scale) {
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      float* xr = x + t * ldx + h * head_dim;
      double ss = 0.0;
      for (int64_t c = 0; c < head_dim; ++c) ss += static_cast<double>(xr[c]) * xr[c];
      double inv = 1.0 / std::sqrt(ss + eps);
      for (int64_t c = 0; c < head_dim; ++c) xr[c] = static_cast<float>(xr[c] * inv * scale);
    }
  }
}

void rope_apply_ref(float* x, int64_t rows, int64_t heads, int64_t head_dim, int64_t ld,
                    const int32_t* positions, int64_t rotary_dim, double theta,
                    const int64_t* mrope_section, int n_sections, bool interleaved) {
  const int64_t half = rotary_dim / 2;
  for (int64_t t = 0; t < rows; ++t) {
    for (int64_t j = 0; j < half; ++j) {
      int axis = 0;
      if (mrope_section != nullptr) {
        if (interleaved) {
          // Build the pattern T H W T H W ... like the reference slicing:
          // freqs_t[..., a:3*section[a]:3] = freqs[a][..., a:3*section[a]:3]
          for (int a = 1; a <= 2 && a < n_sections; ++a) {
            for (int64_t idx = a; idx < 3 * mrope_section[a]; idx += 3) {
              if (idx == j) axis = a;
            }
          }
        } else {
          int64_t lo = 0;
          axis = -1;
          for (int a = 0; a < n_sections && axis < 0; ++a) {
            if (j >= lo && j < lo + mrope_section[a]) axis = a;
            lo += mrope_section[a];
          }
          if (axis < 0) axis = 0;
        }
      }
      double inv_freq = std::pow(theta, -2.0 * static_cast<double>(j) / rotary_dim);
      double angle = positions[axis * rows + t] * inv_freq;
      double c = std::cos(angle), s = std::sin(angle);
      for (int64_t h = 0; h < heads; ++h) {
        float* xh = x + t * ld + h * head_dim;
        double x1 = xh[j], x2 = xh[j + half];
        xh[j] = static_cast<float>(x1 * c - x2 * s);
        xh[j + half] = static_cast<float>(x2 * c + x1 * s);
      }
    }
  }
}

void attention_ref(const float* q, const float* k, const float* v, float* out, int64_t q_len,
                   int64_t ctx, int64_t Hq, int64_t Hkv, int64_t D, float scale) {
  std::vector<double> p(ctx);
  for (int64_t i = 0; i < q_len; ++i) {
    int64_t pos = ctx - q_len + i;
    for (int64_t h = 0; h < Hq; ++h) {
      int64_t kvh = h / (Hq / Hkv);
      const float* qr = q + (i * Hq + h) * D;
      double mx = -INFINITY;
      for (int64_t j = 0; j <= pos; ++j) {
        double s = 0.0;
        for (int64_t d = 0; d < D; ++d)
          s += static_cast<double>(qr[d]) * k[(j * Hkv + kvh) * D + d];
        p[j] = s * scale;
        mx = std::max(mx, p[j]);
      }
      double sum = 0.0;
      for (int64_t j = 0; j <= pos; ++j) {
        p[j] = std::exp(p[j] - mx);
        sum += p[j];
      }
      for (int64_t d = 0; d < D; ++d) {
        double acc = 0.0;
        for (int64_t j = 0; j <= pos; ++j) acc += p[j] * v[(j * Hkv + kvh) * D + d];
        out[(i * Hq + h) * D + d] = static_cast<float>(acc / sum);
      }
    }
  }
}

void swiglu_ref(const float* gate_up, int64_t ld, float* out, int64_t ldo, int64_t T, int64_t I) {
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t i = 0; i < I; ++i) {
      out[t * ldo + i] = static_cast<float>(silu(gate_up[t * ld + i]) * gate_up[t * ld + I + i]);
    }
  }
}

void sigmoid_mul_ref(float* x, const float* gate, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = static_cast<float>(x[i] * sigmoid(gate[i]));
}

void embedding_lookup_ref(const void* table, DType t, int64_t hidden, const int32_t* ids, int64_t n,
                          float* out) {
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < hidden; ++j) {
      out[i * hidden + j] = static_cast<float>(weight_value(table, t, ids[i] * hidden + j));
    }
  }
}

void argmax_rows_ref(const float* logits, int64_t rows, int64_t vocab, int32_t* ids,
                     float* margin) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = logits + r * vocab;
    // The argmax over the finite logits; any NaN or infinity makes the margin NaN.
    bool finite = true;
    int64_t best = -1;
    for (int64_t i = 0; i < vocab; ++i) {
      if (!std::isfinite(row[i]))
        finite = false;
      else if (best < 0 || row[i] > row[best])
        best = i;
    }
    float second = -INFINITY;
    for (int64_t i = 0; i < vocab; ++i) {
      if (i != best && std::isfinite(row[i]) && row[i] > second) second = row[i];
    }
    ids[r] = static_cast<int32_t>(best < 0 ? 0 : best);
    if (margin) margin[r] = !finite ? NAN : vocab > 1 ? row[best] - second : 0.0f;
  }
}

void causal_conv1d_ref(const float* x, int64_t ldx, int64_t T, int64_t C, const float* w, int64_t K,
                       float* state, float* y, int64_t ldy, bool apply_silu) {
  const int64_t S = K - 1;
  std::vector<double> pad(S + T);
  for (int64_t c = 0; c < C; ++c) {
    for (int64_t i = 0; i < S; ++i) pad[i] = state[c * S + i];
    for (int64_t t = 0; t < T; ++t) pad[S + t] = x[t * ldx + c];
    for (int64_t t = 0; t < T; ++t) {
      double acc = 0.0;
      for (int64_t j = 0; j < K; ++j) acc += w[c * K + j] * pad[t + j];
      y[t * ldy + c] = static_cast<float>(apply_silu ? silu(acc) : acc);
    }
    for (int64_t i = 0; i < S; ++i) state[c * S + i] = static_cast<float>(pad[T + i]);
  }
}

void gated_delta_rule_ref(const float* q, const float* k, const float* v, const float* g,
                          const float* beta, float* state, float* out, int64_t T, int64_t Hk,
                          int64_t Hv, int64_t Dk, int64_t Dv) {
  std::vector<double> S(Dk * Dv), kv(Dv), delta(Dv);
  for (int64_t h = 0; h < Hv; ++h) {
    int64_t kh = h / (Hv / Hk);
    for (int64_t i = 0; i < Dk * Dv; ++i) S[i] = state[h * Dk * Dv + i];
    for (int64_t t = 0; t < T; ++t) {
      const float* qt = q + (t * Hk + kh) * Dk;
      const float* kt = k + (t * Hk + kh) * Dk;
      const float* vt = v + (t * Hv + h) * Dv;
      double decay = std::exp(static_cast<double>(g[t * Hv + h]));
      for (auto& s : S) s *= decay;
      for (int64_t j = 0; j < Dv; ++j) {
        double acc = 0.0;
        for (int64_t i = 0; i < Dk; ++i) acc += S[i * Dv + j] * kt[i];
        delta[j] = (vt[j] - acc) * beta[t * Hv + h];
      }
      for (int64_t i = 0; i < Dk; ++i) {
        for (int64_t j = 0; j < Dv; ++j) S[i * Dv + j] += kt[i] * delta[j];
      }
      for (int64_t j = 0; j < Dv; ++j) {
        double acc = 0.0;
        for (int64_t i = 0; i < Dk; ++i) acc += S[i * Dv + j] * qt[i];
        out[(t * Hv + h) * Dv + j] = static_cast<float>(acc);
      }
    }
    for (int64_t i = 0; i < Dk * Dv; ++i) state[h * Dk * Dv + i] = static_cast<float>(S[i]);
  }
}

void gdn_gates_ref(const float* a, const float* b, const float* A, const float* dt_bias, float* g,
                   float* beta, int64_t T, int64_t Hv) {
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < Hv; ++h) {
      double x = static_cast<double>(a[t * Hv + h]) + dt_bias[h];
      double sp = x > 20.0 ? x : std::log(1.0 + std::exp(x));
      g[t * Hv + h] = static_cast<float>(A[h] * sp);
      beta[t * Hv + h] = static_cast<float>(sigmoid(b[t * Hv + h]));
    }
  }
}

}  // namespace qtk::ref
