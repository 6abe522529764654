// Gated DeltaNet (Qwen3.5 linear-attention layers): causal depthwise conv1d,
// the gated delta rule (recurrent form) and the small fused helpers.
#pragma once

#include <cstdint>

#include "kernels/thread_pool.h"

namespace qtk {

// One sequence's chunk of T tokens continuing from its conv state (decode:
// T = 1). With xpad = [state (K-1 rows), x (T rows)] per channel:
//   y[t, c] = act(sum_{j<K} w[c, j] * xpad[t + j, c]),  act = silu or identity
//   x: f32 [T, C] row stride ldx; w: f32 [C, K]; y: f32 [T, C] row stride ldy
//   state: f32 [C, K-1], oldest first; updated in place to the last K-1 inputs.
// y must not alias x. note: the sum runs j = 0..K-1 in order, one product and
// one add each, so a token's output depends only on its K inputs: splitting a
// prompt into chunks gives bit-identical outputs and state.
void causal_conv1d(const float* x, int64_t ldx, int64_t T, int64_t C, const float* w, int64_t K,
                   float* state, float* y, int64_t ldy, bool apply_silu);

// Many sequences at once: rows q_start[s]..q_start[s+1]-1 of x belong to
// sequence s, whose state is states[s] (f32 [C, K-1]). Parallel over
// (sequence, channel block).
void causal_conv1d_varlen(const float* x, int64_t ldx, int64_t num_seqs, const int32_t* q_start,
                          int64_t C, const float* w, int64_t K, float* const* states, float* y,
                          int64_t ldy, bool apply_silu, ThreadPool* pool);

// Recurrent gated delta rule for one sequence of T tokens. For every value
// head h (key head kh = h / (Hv / Hk)) and token t, with S = state[h]:
//   S *= exp(g[t, h]);  kv = k^T S;  delta = (v - kv) * beta[t, h];
//   S += k (outer) delta;  out[t, h] = q^T S
//   q: f32 [T, Hk, Dk] row stride ldq (already L2-normalised and scaled by
//      Dk^-1/2: see l2norm_heads); k: f32 [T, Hk, Dk] row stride ldk
//      (L2-normalised); v: f32 [T, Hv, Dv] row stride ldv
//   g (log decay), beta: f32 [T, Hv] row stride ldg
//   state: f32 [Hv, Dk, Dv] (k index before v index), updated in place
//   out: f32 [T, Hv, Dv] row stride ldo
// note: the state is float32, never bf16: the recurrence accumulates over
// thousands of steps and a coarser state drifts. Sums over Dk run in
// increasing k (vectorised across Dv, which needs no reassociation), so each
// token's update depends only on the state it starts from: one call over T
// tokens and any split into chunks give bit-identical outputs and state.
// Parallel over heads.
void gated_delta_rule(const float* q, int64_t ldq, const float* k, int64_t ldk, const float* v,
                      int64_t ldv, const float* g, const float* beta, int64_t ldg, float* state,
                      float* out, int64_t ldo, int64_t T, int64_t Hk, int64_t Hv, int64_t Dk,
                      int64_t Dv, ThreadPool* pool);

// Many sequences at once (rows q_start[s]..q_start[s+1]-1 belong to sequence
// s, state states[s]); parallel over (sequence, value head).
void gated_delta_rule_varlen(const float* q, int64_t ldq, const float* k, int64_t ldk,
                             const float* v, int64_t ldv, const float* g, const float* beta,
                             int64_t ldg, int64_t num_seqs, const int32_t* q_start,
                             float* const* states, float* out, int64_t ldo, int64_t Hk, int64_t Hv,
                             int64_t Dk, int64_t Dv, ThreadPool* pool);

// g[t, h] = A[h] * softplus(a[t, h] + dt_bias[h]), beta[t, h] = sigmoid(b[t, h])
//   a, b: f32 [T, Hv] row stride lda (e.g. columns of a projection output);
//   A = -exp(A_log): f32 [Hv]; dt_bias: f32 [Hv]; g, beta: f32 [T, Hv] contiguous.
// note: softplus like torch (threshold 20: x > 20 gives x), computed in double.
void gdn_gates(const float* a, const float* b, int64_t lda, const float* A, const float* dt_bias,
               float* g, float* beta, int64_t T, int64_t Hv);

}  // namespace qtk
