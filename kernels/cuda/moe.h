// The mixture-of-experts block's kernels (Qwen3-MoE, Qwen3.5-MoE) on the GPU:
// routing, grouping the routed rows by expert, the experts' products, and
// the weighted combination. Like every launcher of kernels/cuda they take
// device pointers, sizes and strides, allocate nothing and never synchronise,
// so a decode step that runs them can be captured in a CUDA graph: the number
// of rows an expert got stays on the device.
//
// note: batch invariance. The routed (token, choice) pairs always number T*k.
// Every grouped row's product is computed by one warp over K in a fixed
// order (moe_expert_matmul, kernels/cuda/warp_matmul.h), whatever the number
// of rows its expert got and wherever the row sits in the group; each token's output sums its
// experts in increasing expert index (moe_combine). So a token's output bits do not depend on which
// or how many other tokens are in the step.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/warp_matmul.h"

namespace qtk::cuda {

// Top-k routing per token t < T (the CPU's kernels/moe.h moe_route):
//   p = softmax(logits[t, 0..E)) in float32
//   ids[t*k + j], weights[t*k + j], j < k: the k largest p in decreasing
//     order, ties to the lower expert index
//   renormalize: weights divided by their sum (summed in j order)
// logits f32 [T, E] row stride ld (not modified). E <= 4096, k <= 32.
// note: up to 1024 experts one warp routes a token, beyond that one block;
// the choice depends on E only, so a token's bits never depend on T.
void moe_route(const float* logits, int64_t ld, int64_t T, int64_t E, int64_t k, bool renormalize,
               int32_t* ids, float* weights, cudaStream_t stream);

// The T*k routed pairs grouped by expert: expert e's rows are
// offsets[e] .. offsets[e+1]-1 of the grouped order.
struct MoeGroups {
  int32_t* offsets = nullptr;     // [E + 1]
  int32_t* active = nullptr;      // [E] the experts with rows, increasing; then -1
  int32_t* row_token = nullptr;   // [T*k] token of each grouped row
  int32_t* row_expert = nullptr;  // [T*k] expert of each grouped row
  int32_t* pair_row = nullptr;    // [T*k] grouped row of pair t*k + j
};

// Fills `g` from ids i32 [T, k]. E <= 4096.
// note: rows land in an expert's group in atomic order, which may differ
// from run to run; nothing reads that order (each row's product and each
// token's sum are independent of it, see the top of this file).
void moe_group(const int32_t* ids, int64_t T, int64_t k, int64_t E, const MoeGroups& g,
               cudaStream_t stream);

// The router's logits in the project's own fixed order (moe.cu,
// router_tile: one f32 fma chain per lane over 16-byte pieces, then the
// warp's butterfly), the same bits for a token whatever the batch:
//   logits[t, e] = sum_c h[t, c] * router[e, c]     t < T, e < E
// h T [T, H] row stride ldh, router T [E, H] (row stride H), logits f32
// [T, E]. T = float or bf16.
template <class T>
void moe_router_logits(const T* h, int64_t ldh, const T* router, int64_t tokens, int64_t E,
                       int64_t H, float* logits, cudaStream_t stream);

// True when moe_router_logits / moe_router_front take these operands: E <=
// 1024, H and ldh multiples of 16 / elem_size, h and router 16-byte aligned.
bool moe_router_front_supported(const void* h, int64_t ldh, const void* router, int64_t E,
                                int64_t H, int64_t elem_size);

// The block's front: moe_router_logits, moe_route and moe_group, with their
// bits. Up to 16 tokens in one launch (each block computes 8 experts'
// logits, the last block to finish routes and groups every token), more in
// three. ticket: a device counter that is zero before the first call; each
// call leaves it zero (calls on one stream may share it).
// note: one launch instead of a cuBLASLt router product plus two: the
// batch-1 decode step of Qwen3-30B-A3B ran 15.5 us of those three kernels
// per layer (H100, each alone under ncu).
template <class T>
void moe_router_front(const T* h, int64_t ldh, const T* router, int64_t tokens, int64_t E,
                      int64_t H, int64_t k, bool renormalize, float* logits, int32_t* ids,
                      float* weights, const MoeGroups& g, unsigned* ticket, cudaStream_t stream);

// The experts' products over the grouped rows (kernels/cuda/warp_matmul.h:
// one warp per row and column, fixed order): for r < rows,
//   y[r, n] = sum_k x[src(r), k] * w[e(r), n, k]      n < N, k < K
// src(r) = g.row_token[r] when gather (x is the tokens' rows), else r (x is
// already grouped). w: stacked experts [E, N, K] (HF layout per expert),
// dense T or block-FP8; T = float or bf16, Y = float or bf16; f32
// accumulation. max_active: an upper bound of the experts with rows
// (min(E, rows)). settled: g was written two or more launches before this
// one on the stream, not by the launch right before it (down_proj behind
// gate_up), so the blocks may read their groups and request their experts'
// weights before their dependency wait (dev::RowGroups::settled).
template <class T, class Y>
void moe_expert_matmul(const T* x, int64_t ldx, bool gather, const WeightRef<T>& w, int64_t N,
                       int64_t K, Y* y, int64_t ldy, int64_t rows, const MoeGroups& g,
                       int64_t max_active, bool settled, cudaStream_t stream);

// The experts' gate_up products (w [E, 2I, K], gate rows over up rows) and
// their SwiGLU in one launch: act[r, j] = silu(g) * u of y[r, j] and
// y[r, I + j], each rounded to T first; bit for bit moe_expert_matmul<T, T>
// then swiglu<T> (warp_matmul_swiglu in kernels/cuda/warp_matmul.h). False,
// with nothing launched, where the tensor-core narrow kernel does not take
// the product (the caller runs the two steps).
template <class T>
bool moe_expert_matmul_swiglu(const T* x, int64_t ldx, bool gather, const WeightRef<T>& w,
                              int64_t I, int64_t K, T* act, int64_t lda, int64_t rows,
                              const MoeGroups& g, int64_t max_active, cudaStream_t stream);

// out[t, c] (t < tokens) = sum over t's k experts in increasing expert index of
//   weights[t*k + j] * y[pair_row[t*k + j], c]
// plus, when shared != nullptr (Qwen3.5-MoE's shared expert),
//   sigmoid(h[t, :] . gate_w) * shared[t, c]
// y f32 [T*k, H] stride ldy; shared f32 [T, H] stride lds; h, gate_w, out T.
// ids, weights, pair_row and h must have been written two or more launches
// before this one on the stream (the front's, behind the experts'
// products): the kernel reads them before its dependency wait
// (dev::RowGroups::settled says why that is safe); y and shared may come
// from the launch right before.
template <class T>
void moe_combine(const float* y, int64_t ldy, const int32_t* ids, const float* weights,
                 const int32_t* pair_row, int64_t tokens, int64_t k, int64_t H, const float* shared,
                 int64_t lds, const T* h, int64_t ldh, const T* gate_w, T* out, int64_t ldo,
                 cudaStream_t stream);

}  // namespace qtk::cuda
