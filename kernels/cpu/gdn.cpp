#include "kernels/gdn.h"

#include <cmath>
#include <vector>

#include "kernels/cpu/simd_math.h"

namespace qtk {

namespace {

// Channels per conv task: enough work per task, and cache-line friendly.
constexpr int64_t kConvChannelBlock = 64;

// note: for 2..4 taps (Qwen3.5: 4) channels are the inner loop (x and y rows
// are contiguous in c), with the block's taps and conv state transposed to
// [tap][channel] first, so the loops vectorise across channels; per channel
// and token the arithmetic is still acc = 0, then acc += w[c, j] *
// xpad[t + j, c] for j = 0..K-1, then the activation, as in
// conv_channels_any. (That loop over taps per channel, strided through x,
// was 10 % of Qwen3.5-0.8B prefill and batched decode.)

// Any kernel size: one channel at a time.
void conv_channels_any(const float* x, int64_t ldx, int64_t T, int64_t c0, int64_t c1,
                       const float* w, int64_t K, float* state, float* y, int64_t ldy,
                       bool apply_silu) {
  const int64_t S = K - 1;
  for (int64_t c = c0; c < c1; ++c) {
    const float* wc = w + c * K;
    float* st = state + c * S;
    for (int64_t t = 0; t < T; ++t) {
      float acc = 0.0f;
      for (int64_t j = 0; j < K; ++j) {
        int64_t p = t + j;
        float xv = p < S ? st[p] : x[(p - S) * ldx + c];
        acc += wc[j] * xv;
      }
      y[t * ldy + c] = apply_silu ? cpu::silu_poly(acc) : acc;
    }
    if (T >= S) {
      for (int64_t i = 0; i < S; ++i) st[i] = x[(T - S + i) * ldx + c];
    } else {
      for (int64_t i = 0; i < S - T; ++i) st[i] = st[i + T];
      for (int64_t i = 0; i < T; ++i) st[S - T + i] = x[i * ldx + c];
    }
  }
}

// Channels b0..b0+n-1 (n <= kConvChannelBlock) with KK taps (compile-time,
// so every loop below has a fixed trip count and vectorises).
template <int KK>
__attribute__((always_inline)) inline void conv_block(const float* x, int64_t ldx, int64_t T,
                                                      int64_t b0, int64_t n, const float* w,
                                                      float* state, float* y, int64_t ldy,
                                                      bool apply_silu) {
  constexpr int64_t B = kConvChannelBlock;
  constexpr int S = KK - 1;
  float wt[KK][B];
  float st[S > 0 ? S : 1][B];
  float xin[B];
  float acc[B];
  // note: lanes n..B-1 of a partial block compute on zeros and are never stored.
  for (int j = 0; j < KK; ++j) {
    for (int64_t i = 0; i < B; ++i) wt[j][i] = i < n ? w[(b0 + i) * KK + j] : 0.0f;
  }
  for (int j = 0; j < S; ++j) {
    for (int64_t i = 0; i < B; ++i) st[j][i] = i < n ? state[(b0 + i) * S + j] : 0.0f;
  }
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t i = 0; i < B; ++i) acc[i] = 0.0f;
    for (int j = 0; j < KK; ++j) {
      // xpad[t + j] is state[t + j] while t + j < S, else x[t + j - S].
      const int64_t p = t + j;
      const float* xr;
      if (p < S) {
        xr = st[p];
      } else {
        const float* row = x + (p - S) * ldx + b0;
        for (int64_t i = 0; i < B; ++i) xin[i] = i < n ? row[i] : 0.0f;
        xr = xin;
      }
      for (int64_t i = 0; i < B; ++i) acc[i] += wt[j][i] * xr[i];
    }
    if (apply_silu) {
      for (int64_t i = 0; i < B; ++i) acc[i] = cpu::silu_poly(acc[i]);
    }
    float* yr = y + t * ldy + b0;
    for (int64_t i = 0; i < n; ++i) yr[i] = acc[i];
  }
  // New state: the last S entries of [state, x].
  for (int64_t i = 0; i < n; ++i) {
    float* sc = state + (b0 + i) * S;
    const int64_t c = b0 + i;
    if (T >= S) {
      for (int j = 0; j < S; ++j) sc[j] = x[(T - S + j) * ldx + c];
    } else {
      for (int64_t j = 0; j < S - T; ++j) sc[j] = st[j + T][i];
      for (int64_t j = 0; j < T; ++j) sc[S - T + j] = x[j * ldx + c];
    }
  }
}

QTK_CLONES void conv_channels(const float* x, int64_t ldx, int64_t T, int64_t c0, int64_t c1,
                              const float* w, int64_t K, float* state, float* y, int64_t ldy,
                              bool apply_silu) {
  for (int64_t b0 = c0; b0 < c1; b0 += kConvChannelBlock) {
    const int64_t n = b0 + kConvChannelBlock < c1 ? kConvChannelBlock : c1 - b0;
    switch (K) {
      case 2:
        conv_block<2>(x, ldx, T, b0, n, w, state, y, ldy, apply_silu);
        break;
      case 3:
        conv_block<3>(x, ldx, T, b0, n, w, state, y, ldy, apply_silu);
        break;
      case 4:
        conv_block<4>(x, ldx, T, b0, n, w, state, y, ldy, apply_silu);
        break;
      default:
        conv_channels_any(x, ldx, T, b0, b0 + n, w, K, state, y, ldy, apply_silu);
        break;
    }
  }
}

// One value head of one sequence over T tokens. kv, delta, acc: f32 [Dv] scratch.
//
// note: one sweep over the state per token: the sweep for token t finishes
// token t-1 (S += k_{t-1} delta_{t-1}; o_{t-1} += S q_{t-1}) and starts token
// t (S *= exp(g_t); kv_t += S k_t) row by row, so the 64 KiB state of a
// 128 x 128 head streams through the cache once per token instead of twice.
// Every state element and every output still sees exactly the operations of
// the textbook order (update, read q, decay, read k), in increasing k.
QTK_CLONES void delta_rule_head(const float* q, int64_t ldq, const float* k, int64_t ldk,
                                const float* v, int64_t ldv, const float* g, const float* beta,
                                int64_t ldg, float* __restrict S, float* out, int64_t ldo,
                                int64_t T, int64_t Dk, int64_t Dv, float* __restrict kv,
                                float* __restrict delta, float* __restrict acc) {
  for (int64_t t = 0; t <= T; ++t) {
    const bool finish_prev = t > 0;
    const bool start_cur = t < T;
    const float* kp = finish_prev ? k + (t - 1) * ldk : nullptr;
    const float* qp = finish_prev ? q + (t - 1) * ldq : nullptr;
    const float* kt = start_cur ? k + t * ldk : nullptr;
    const float decay =
        start_cur ? static_cast<float>(std::exp(static_cast<double>(g[t * ldg]))) : 0.0f;
    for (int64_t j = 0; j < Dv; ++j) {
      kv[j] = 0.0f;
      acc[j] = 0.0f;
    }
    if (finish_prev && start_cur) {
      for (int64_t i = 0; i < Dk; ++i) {
        float* row = S + i * Dv;
        const float kpi = kp[i], qpi = qp[i], kti = kt[i];
        for (int64_t j = 0; j < Dv; ++j) {
          float sv = row[j] + kpi * delta[j];
          acc[j] += sv * qpi;
          sv = sv * decay;
          kv[j] += sv * kti;
          row[j] = sv;
        }
      }
    } else if (finish_prev) {
      for (int64_t i = 0; i < Dk; ++i) {
        float* row = S + i * Dv;
        const float kpi = kp[i], qpi = qp[i];
        for (int64_t j = 0; j < Dv; ++j) {
          float sv = row[j] + kpi * delta[j];
          acc[j] += sv * qpi;
          row[j] = sv;
        }
      }
    } else {
      for (int64_t i = 0; i < Dk; ++i) {
        float* row = S + i * Dv;
        const float kti = kt[i];
        for (int64_t j = 0; j < Dv; ++j) {
          float sv = row[j] * decay;
          kv[j] += sv * kti;
          row[j] = sv;
        }
      }
    }
    if (finish_prev) {
      float* op = out + (t - 1) * ldo;
      for (int64_t j = 0; j < Dv; ++j) op[j] = acc[j];
    }
    if (start_cur) {
      const float* vt = v + t * ldv;
      const float bt = beta[t * ldg];
      for (int64_t j = 0; j < Dv; ++j) delta[j] = (vt[j] - kv[j]) * bt;
    }
  }
}

// Per-thread scratch of 3*Dv floats (allocated once per thread and size).
float* delta_scratch(int64_t Dv) {
  thread_local std::vector<float> buf;
  if (static_cast<int64_t>(buf.size()) < 3 * Dv) buf.resize(3 * Dv);
  return buf.data();
}

}  // namespace

void causal_conv1d(const float* x, int64_t ldx, int64_t T, int64_t C, const float* w, int64_t K,
                   float* state, float* y, int64_t ldy, bool apply_silu) {
  if (T <= 0) return;
  conv_channels(x, ldx, T, 0, C, w, K, state, y, ldy, apply_silu);
}

void causal_conv1d_varlen(const float* x, int64_t ldx, int64_t num_seqs, const int32_t* q_start,
                          int64_t C, const float* w, int64_t K, float* const* states, float* y,
                          int64_t ldy, bool apply_silu, ThreadPool* pool) {
  const int64_t blocks = (C + kConvChannelBlock - 1) / kConvChannelBlock;
  parallel_for(pool, num_seqs * blocks, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      int64_t s = task / blocks;
      int64_t c0 = (task % blocks) * kConvChannelBlock;
      int64_t c1 = c0 + kConvChannelBlock < C ? c0 + kConvChannelBlock : C;
      int64_t r0 = q_start[s];
      int64_t T = q_start[s + 1] - r0;
      if (T <= 0) continue;
      conv_channels(x + r0 * ldx, ldx, T, c0, c1, w, K, states[s], y + r0 * ldy, ldy, apply_silu);
    }
  });
}

void gated_delta_rule(const float* q, int64_t ldq, const float* k, int64_t ldk, const float* v,
                      int64_t ldv, const float* g, const float* beta, int64_t ldg, float* state,
                      float* out, int64_t ldo, int64_t T, int64_t Hk, int64_t Hv, int64_t Dk,
                      int64_t Dv, ThreadPool* pool) {
  float* states[1] = {state};
  int32_t q_start[2] = {0, static_cast<int32_t>(T)};
  gated_delta_rule_varlen(q, ldq, k, ldk, v, ldv, g, beta, ldg, 1, q_start, states, out, ldo, Hk,
                          Hv, Dk, Dv, pool);
}

void gated_delta_rule_varlen(const float* q, int64_t ldq, const float* k, int64_t ldk,
                             const float* v, int64_t ldv, const float* g, const float* beta,
                             int64_t ldg, int64_t num_seqs, const int32_t* q_start,
                             float* const* states, float* out, int64_t ldo, int64_t Hk, int64_t Hv,
                             int64_t Dk, int64_t Dv, ThreadPool* pool) {
  const int64_t ratio = Hv / Hk;
  parallel_for(pool, num_seqs * Hv, [&](int64_t begin, int64_t end) {
    float* scratch = delta_scratch(Dv);
    for (int64_t task = begin; task < end; ++task) {
      int64_t s = task / Hv;
      int64_t h = task % Hv;
      int64_t kh = h / ratio;
      int64_t r0 = q_start[s];
      int64_t T = q_start[s + 1] - r0;
      if (T <= 0) continue;
      delta_rule_head(q + r0 * ldq + kh * Dk, ldq, k + r0 * ldk + kh * Dk, ldk,
                      v + r0 * ldv + h * Dv, ldv, g + r0 * ldg + h, beta + r0 * ldg + h, ldg,
                      states[s] + h * Dk * Dv, out + r0 * ldo + h * Dv, ldo, T, Dk, Dv, scratch,
                      scratch + Dv, scratch + 2 * Dv);
    }
  });
}

void gdn_gates(const float* a, const float* b, int64_t lda, const float* A, const float* dt_bias,
               float* g, float* beta, int64_t T, int64_t Hv) {
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < Hv; ++h) {
      double x = static_cast<double>(a[t * lda + h]) + static_cast<double>(dt_bias[h]);
      double sp = x > 20.0 ? x : std::log1p(std::exp(x));
      g[t * Hv + h] = static_cast<float>(static_cast<double>(A[h]) * sp);
      double bb = b[t * lda + h];
      beta[t * Hv + h] = static_cast<float>(1.0 / (1.0 + std::exp(-bb)));
    }
  }
}

}  // namespace qtk
