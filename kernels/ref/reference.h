// Scalar references for every CPU kernel: the plainest loops, accumulating in
// double. Tests compare the optimised kernels against these; they are not
// meant to be fast. Shapes and layouts are those of the kernel headers.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "kernels/attention.h"

namespace qtk::ref {

// One weight element as double (bf16, f16 or f32).
double weight_value(const void* w, DType t, int64_t index);

void matmul_ref(const float* x, int64_t ldx, const void* w, DType wtype, float* y, int64_t ldy,
                int64_t M, int64_t N, int64_t K);

void rmsnorm_ref(const float* x, int64_t ldx, const float* w, float* y, int64_t ldy, int64_t rows,
                 int64_t cols, float eps);
void gated_rmsnorm_ref(const float* x, int64_t ldx, const float* z, int64_t ldz, const float* w,
                       float* y, int64_t ldy, int64_t tokens, int64_t heads, int64_t head_dim,
                       float eps);
void l2norm_heads_ref(float* x, int64_t ldx, int64_t tokens, int64_t heads, int64_t head_dim,
                      float eps, float scale);

// Straight from the formula: inv_freq = theta^(-2j/rotary_dim) and the angle
// in double, and the axis rule spelled out separately from the kernel's.
void rope_apply_ref(float* x, int64_t rows, int64_t heads, int64_t head_dim, int64_t ld,
                    const int32_t* positions, int64_t rotary_dim, double theta,
                    const int64_t* mrope_section, int n_sections, bool interleaved);

// Dense (non-paged) causal attention of one sequence: q [q_len, Hq, D],
// k, v [ctx, Hkv, D] contiguous; query row i sits at position ctx - q_len + i.
void attention_ref(const float* q, const float* k, const float* v, float* out, int64_t q_len,
                   int64_t ctx, int64_t Hq, int64_t Hkv, int64_t D, float scale);

void swiglu_ref(const float* gate_up, int64_t ld, float* out, int64_t ldo, int64_t T, int64_t I);
void sigmoid_mul_ref(float* x, const float* gate, int64_t n);
void embedding_lookup_ref(const void* table, DType t, int64_t hidden, const int32_t* ids, int64_t n,
                          float* out);
void argmax_rows_ref(const float* logits, int64_t rows, int64_t vocab, int32_t* ids, float* margin);

// Conv over the explicit padded sequence [state, x] (no state bookkeeping
// tricks); writes the new state.
void causal_conv1d_ref(const float* x, int64_t ldx, int64_t T, int64_t C, const float* w, int64_t K,
                       float* state, float* y, int64_t ldy, bool apply_silu);

// Recurrent gated delta rule with a double state (contiguous inputs:
// q, k [T, Hk, Dk], v [T, Hv, Dv], g, beta [T, Hv], state [Hv, Dk, Dv] f32
// read and written, out [T, Hv, Dv]).
void gated_delta_rule_ref(const float* q, const float* k, const float* v, const float* g,
                          const float* beta, float* state, float* out, int64_t T, int64_t Hk,
                          int64_t Hv, int64_t Dk, int64_t Dv);

void gdn_gates_ref(const float* a, const float* b, const float* A, const float* dt_bias, float* g,
                   float* beta, int64_t T, int64_t Hv);

}  // namespace qtk::ref
