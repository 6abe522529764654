// Skinny products (M <= 16 rows of activations) on tensor cores: the decode
// steps' GEMMs at small batch, where cuBLASLt's kernels reach ~1 TB/s.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace qtk::cuda {

constexpr int64_t kGemvMaxM = 16;

// True when gemv_bf16 takes this call: 1 <= m <= kGemvMaxM, k, ldx and ldw
// multiples of 8, x and w 16-byte aligned.
bool gemv_bf16_supported(const void* x, int64_t ldx, const void* w, int64_t ldw, int64_t m,
                         int64_t k);

// y[i, j] = sum_k x[i, k] * w[j, k] for i < m, j < n: x bf16 [m, k] (row
// stride ldx), w bf16 [n, k] (HF layout, row stride ldw), y f32 or bf16
// [m, n] (row stride ldy). One warp per 8 output columns walks the whole K
// with mma.sync m16n8k16 (bf16 in, f32 accumulate), k-steps of 16 in
// increasing order into one accumulator from zero; the bf16 output is the
// f32 sum rounded to nearest even. No split over K, so each output is one
// fixed chain whatever m is. `warps` (1, 2 or 4; 0 = 4) warps per block
// share the token rows of each stage; it changes the speed, never a bit.
// Launched with PDL (kernels/cuda/launch.cuh): the weights are prefetched
// before the wait for the kernel that produces x.
// note: used by Gemm only for a shape class where it produced, on this GPU,
// bit for bit the output of the cuBLASLt algorithm that serves every other
// M (gemm.cpp, verify_alternates); otherwise it is not used at all.
// The fused "add, then norm" in front of a skinny product (the decode
// step's post-attention norm before gate_up and the next layer's input norm
// before its first projection): residual_out = bf16(residual + delta) for m
// rows of k values, then y = gemv(rmsnorm(residual_out) * weight). Each
// output is bit for bit add_rmsnorm (cuda_kernels.h) followed by gemv_bf16
// (tested); the normed rows are not stored. residual_out must not overlap
// residual (the other blocks still read it). k <= 4096 (the row is held in
// registers); the supported() functions say whether a call qualifies.
struct AddRmsNormInput {
  const __nv_bfloat16* residual = nullptr;  // bf16 [m, k], row stride ldr
  int64_t ldr = 0;
  const __nv_bfloat16* delta = nullptr;  // bf16 [m, k], row stride ldd
  int64_t ldd = 0;
  const float* weight = nullptr;  // f32 [k]
  float eps = 0.0f;
  __nv_bfloat16* residual_out = nullptr;  // bf16 [m, k], row stride ldo
  int64_t ldo = 0;
};

bool add_rmsnorm_gemv_supported(const AddRmsNormInput& an, const void* w, int64_t ldw, int64_t m,
                                int64_t k);

template <class OUT>
void add_rmsnorm_gemv_bf16(const AddRmsNormInput& an, const __nv_bfloat16* w, int64_t ldw, OUT* y,
                           int64_t ldy, int64_t m, int64_t n, int64_t k, cudaStream_t stream,
                           int slices = 1);

// The MLP's gate_up product with the SwiGLU as its epilogue: act[i, j] =
// bf16(silu(g) * u) for j < inter, g and u the bf16-rounded sums of x row i
// with w rows j (gate) and inter + j (up); w bf16 [2 inter, k] (row stride
// ldw), act bf16 [m, inter] (row stride ldact). Bit for bit gemv_bf16<bf16>
// into a gate_up buffer followed by swiglu (cuda_kernels.h), tested; the
// gate_up buffer is never written. Same support rules as gemv_bf16.
void gemv_swiglu_out_bf16(const __nv_bfloat16* x, int64_t ldx, const __nv_bfloat16* w, int64_t ldw,
                          __nv_bfloat16* act, int64_t ldact, int64_t m, int64_t inter, int64_t k,
                          cudaStream_t stream);

// The same behind the fused add + RMSNorm (add_rmsnorm_gemv_bf16's rules).
void add_rmsnorm_gemv_swiglu_out_bf16(const AddRmsNormInput& an, const __nv_bfloat16* w,
                                      int64_t ldw, __nv_bfloat16* act, int64_t ldact, int64_t m,
                                      int64_t inter, int64_t k, cudaStream_t stream);

// K slices (slices = kGemvSlices in gemv_bf16 and add_rmsnorm_gemv_bf16):
// K is cut into `slices` equal slices, each output's slice sums are each a
// chain from zero as above, added in slice order ((s0 + s1) + s2) + s3 in
// f32, then rounded. That is slice_sum (below) over a strided-batched
// product of the slices, which is how Gemm computes the same sums for any M
// (gemm.cpp). Shorter chains, more warps: the decode-step products whose K
// bounds their time (o_proj, down_proj) run on K / slices dependent steps.
// The SwiGLU epilogue has no sliced form.
constexpr int kGemvSlices = 4;
bool gemv_slices_supported(int64_t k, int slices);

// How a plain (unsliced, stored) product spreads its row groups of 32
// outputs over blocks, for tests: 0 (the default) lets the launch decide
// (a block per group, or, for products with K <= 1024 and many more groups
// than fit the GPU at once, the blocks that fit, each taking groups in
// turn); -1 always a block per group; N > 0 at most N blocks, each taking
// groups in turn. Never changes a bit.
void set_gemv_grid_limit(int blocks);

template <class OUT>
void gemv_bf16(const __nv_bfloat16* x, int64_t ldx, const __nv_bfloat16* w, int64_t ldw, OUT* y,
               int64_t ldy, int64_t m, int64_t n, int64_t k, cudaStream_t stream, int warps = 0,
               int slices = 1);

// y[i, j] = ((p[0][i][j] + p[1][i][j]) + ...) + p[slices-1][i][j], added
// in f32 in slice order, then stored as OUT (bf16: rounded to nearest
// even); p[s] = parts + s * stride, f32 [m, n] (row stride n). PDL-launched.
template <class OUT>
void slice_sum(const float* parts, int slices, int64_t stride, OUT* y, int64_t ldy, int64_t m,
               int64_t n, cudaStream_t stream);

}  // namespace qtk::cuda
