// Mixture-of-experts pieces that are not matmuls: top-k routing and the
// weighted accumulation of expert outputs into each token's row.
#pragma once

#include <cstdint>

namespace qtk {

// Top-k routing, per token t < T, as transformers' Qwen3-MoE / Qwen3.5-MoE
// routers compute it:
//   p = softmax(logits[t, 0..E)) in float32
//   ids[t*k + j], weights[t*k + j] for j < k: the k largest p in decreasing
//     order, ties to the lower expert index
//   renormalize: weights[t*k + j] = p_j / (p_0 + ... + p_{k-1}), summed in
//     that (decreasing) order
//   logits: f32 [T, E] row stride ld, overwritten with p; ids: i32 [T, k];
//   weights: f32 [T, k]
// note: top-k is taken on the float32 probabilities, not the logits, as
// transformers does: two logits close enough to round to the same
// probability tie, and the tie goes to the lower index.
void moe_route(float* logits, int64_t ld, int64_t T, int64_t E, int64_t k, bool renormalize,
               int32_t* ids, float* weights);

// out[rows[r], c] += weights[r] * y[r, c] for r < n, c < H, in increasing r.
//   y: f32 [n, H] row stride ldy; out: f32 row stride ldo.
// note: each out element gets one product and one add per call, so a
// token's sum over experts depends only on the order of the calls (the
// caller goes through experts in increasing index).
void moe_scatter_add(float* out, int64_t ldo, const float* y, int64_t ldy, const int32_t* rows,
                     const float* weights, int64_t n, int64_t H);

// out[t, c] += sigmoid(gate[t]) * y[t, c] for t < T, c < H (Qwen3.5-MoE's
// gated shared expert).
void moe_add_gated(float* out, int64_t ldo, const float* y, int64_t ldy, const float* gate,
                   int64_t T, int64_t H);

}  // namespace qtk
