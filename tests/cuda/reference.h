// Scalar float64 references for the GPU tests, written from the formulas in
// kernels/cuda/cuda_kernels.h (and transformers' Qwen3 / Qwen3.5 modeling):
// plain loops, no tricks, so that each is easy to check by eye.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/cuda/cuda_kernels.h"

namespace qtk::cuda::test {

using Vec = std::vector<double>;

inline double silu_d(double x) { return x / (1.0 + std::exp(-x)); }
inline double sigmoid_d(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// x, y: [rows, cols] contiguous.
inline Vec rmsnorm_ref(const Vec& x, const Vec& w, int64_t rows, int64_t cols, double eps) {
  Vec y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t c = 0; c < cols; ++c) ss += x[r * cols + c] * x[r * cols + c];
    const double inv = 1.0 / std::sqrt(ss / cols + eps);
    for (int64_t c = 0; c < cols; ++c) y[r * cols + c] = x[r * cols + c] * inv * w[c];
  }
  return y;
}

// x, z, y: [rows = tokens*heads, dim].
inline Vec gated_rmsnorm_ref(const Vec& x, const Vec& z, const Vec& w, int64_t rows, int64_t dim,
                             double eps) {
  Vec y = rmsnorm_ref(x, w, rows, dim, eps);
  for (size_t i = 0; i < y.size(); ++i) y[i] *= silu_d(z[i]);
  return y;
}

inline Vec l2norm_ref(const Vec& x, int64_t rows, int64_t dim, double eps, double scale) {
  Vec y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t c = 0; c < dim; ++c) ss += x[r * dim + c] * x[r * dim + c];
    const double inv = scale / std::sqrt(ss + eps);
    for (int64_t c = 0; c < dim; ++c) y[r * dim + c] = x[r * dim + c] * inv;
  }
  return y;
}

// x: [tokens, heads, dim]; positions [3][tokens].
inline Vec qk_norm_rope_ref(const Vec& x, int64_t tokens, int64_t heads, int64_t dim,
                            const Vec* norm_w, double eps, const std::vector<int32_t>& pos,
                            const RopeParams& p) {
  Vec y = norm_w ? rmsnorm_ref(x, *norm_w, tokens * heads, dim, eps) : x;
  const int64_t half = p.rotary_dim / 2;
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t h = 0; h < heads; ++h) {
      double* v = &y[(t * heads + h) * dim];
      Vec rot(v, v + p.rotary_dim);
      for (int64_t j = 0; j < half; ++j) {
        int axis = 0;
        if (p.n_sections > 0) {
          if (p.interleaved) {
            if (j % 3 == 1 && j < 3 * p.sections[1]) axis = 1;
            if (j % 3 == 2 && j < 3 * p.sections[2]) axis = 2;
          } else {
            axis = j < p.sections[0] ? 0 : j < p.sections[0] + p.sections[1] ? 1 : 2;
          }
        }
        // note: the angle transformers computes (and the model must match):
        // inv_freq and pos * inv_freq in float32; only cos/sin in double.
        const float exponent = static_cast<float>(2 * j) / static_cast<float>(p.rotary_dim);
        const float inv_freq =
            1.0f / static_cast<float>(std::pow(static_cast<double>(static_cast<float>(p.theta)),
                                               static_cast<double>(exponent)));
        const double ang =
            static_cast<float>(inv_freq * static_cast<float>(pos[axis * tokens + t]));
        const double c = std::cos(ang), s = std::sin(ang);
        v[j] = rot[j] * c - rot[j + half] * s;
        v[j + half] = rot[j + half] * c + rot[j] * s;
      }
    }
  return y;
}

// The step of a varlen batch, host side.
struct HostBatch {
  std::vector<int32_t> q_start, seq_len, block_table;
  int64_t max_blocks = 0, block_size = 0;
};

// q, out [T, Hq, D]; caches [num_blocks, block_size, Hkv, D].
inline Vec attention_ref(const Vec& q, const Vec& kc, const Vec& vc, const HostBatch& b, int64_t hq,
                         int64_t hkv, int64_t d, double scale) {
  const int64_t num_seqs = static_cast<int64_t>(b.seq_len.size());
  Vec out(q.size(), 0.0);
  for (int64_t s = 0; s < num_seqs; ++s) {
    const int64_t q_len = b.q_start[s + 1] - b.q_start[s];
    for (int64_t i = 0; i < q_len; ++i) {
      const int64_t t = b.q_start[s] + i, n_keys = b.seq_len[s] - q_len + i + 1;
      for (int64_t h = 0; h < hq; ++h) {
        const int64_t kvh = h / (hq / hkv);
        auto row = [&](const Vec& cache, int64_t j) {
          const int64_t slot =
              int64_t(b.block_table[s * b.max_blocks + j / b.block_size]) * b.block_size +
              j % b.block_size;
          return &cache[(slot * hkv + kvh) * d];
        };
        Vec sc(n_keys);
        double m = -INFINITY;
        for (int64_t j = 0; j < n_keys; ++j) {
          const double* k = row(kc, j);
          double dot = 0;
          for (int64_t c = 0; c < d; ++c) dot += q[(t * hq + h) * d + c] * k[c];
          sc[j] = dot * scale;
          m = std::max(m, sc[j]);
        }
        double sum = 0;
        for (auto& e : sc) sum += (e = std::exp(e - m));
        for (int64_t j = 0; j < n_keys; ++j) {
          const double* v = row(vc, j);
          for (int64_t c = 0; c < d; ++c) out[(t * hq + h) * d + c] += sc[j] / sum * v[c];
        }
      }
    }
  }
  return out;
}

// One sequence: x [T, C], w [C, K], state [C, K-1] (updated). Returns y [T, C].
inline Vec conv1d_ref(const Vec& x, int64_t T, int64_t C, const Vec& w, int64_t K, Vec& state,
                      bool apply_silu) {
  Vec y(T * C);
  for (int64_t c = 0; c < C; ++c) {
    Vec pad(K - 1 + T);
    for (int64_t j = 0; j < K - 1; ++j) pad[j] = state[c * (K - 1) + j];
    for (int64_t t = 0; t < T; ++t) pad[K - 1 + t] = x[t * C + c];
    for (int64_t t = 0; t < T; ++t) {
      double acc = 0;
      for (int64_t j = 0; j < K; ++j) acc += w[c * K + j] * pad[t + j];
      y[t * C + c] = apply_silu ? silu_d(acc) : acc;
    }
    for (int64_t j = 0; j < K - 1; ++j) state[c * (K - 1) + j] = pad[T + j];
  }
  return y;
}

// One sequence of T tokens: q, k [T, Hk, Dk]; v [T, Hv, Dv]; g, beta [T, Hv];
// state [Hv, Dk, Dv] (updated). Returns out [T, Hv, Dv].
inline Vec gdn_ref(const Vec& q, const Vec& k, const Vec& v, const Vec& g, const Vec& beta,
                   Vec& state, int64_t T, int64_t hk, int64_t hv, int64_t dk, int64_t dv) {
  Vec out(T * hv * dv);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < hv; ++h) {
      const int64_t kh = h / (hv / hk);
      double* S = &state[h * dk * dv];
      const double* qt = &q[(t * hk + kh) * dk];
      const double* kt = &k[(t * hk + kh) * dk];
      const double* vt = &v[(t * hv + h) * dv];
      const double decay = std::exp(g[t * hv + h]), b = beta[t * hv + h];
      for (int64_t i = 0; i < dk * dv; ++i) S[i] *= decay;
      for (int64_t j = 0; j < dv; ++j) {
        double kv = 0;
        for (int64_t i = 0; i < dk; ++i) kv += kt[i] * S[i * dv + j];
        const double delta = (vt[j] - kv) * b;
        for (int64_t i = 0; i < dk; ++i) S[i * dv + j] += kt[i] * delta;
      }
      for (int64_t j = 0; j < dv; ++j) {
        double o = 0;
        for (int64_t i = 0; i < dk; ++i) o += qt[i] * S[i * dv + j];
        out[(t * hv + h) * dv + j] = o;
      }
    }
  return out;
}

// y[M, N] = x[M, K] w[N, K]^T.
inline Vec matmul_ref(const Vec& x, const Vec& w, int64_t M, int64_t N, int64_t K) {
  Vec y(M * N);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double acc = 0;
      for (int64_t k = 0; k < K; ++k) acc += x[m * K + k] * w[n * K + k];
      y[m * N + n] = acc;
    }
  return y;
}

}  // namespace qtk::cuda::test
