// Matrix products computed one output element per warp, in a fixed order:
// the product for weights the cuBLASLt path (kernels/cuda/gemm.h) cannot
// take — block-FP8 weights (weight-only FP8: e4m3 weights, bf16 or f32
// activations, f32 accumulation) and the experts of a mixture-of-experts
// block (kernels/cuda/moe.h), whose rows per expert are known only on the
// device.
//
// note: batch invariance. Each output element y[r, n] is one warp's sum over
// K: lane l takes elements l*E .. l*E+E-1 of every 32*E-element stretch of K
// (E = 16 bytes of weights: 16 e4m3, 8 bf16 or 4 f32 values), then the tail
// one element per lane, each with fmaf in increasing k; the 32 partials are
// added by a xor butterfly. A warp takes up to 8 rows per pass over its
// weight row (fewer for the last rows); each row keeps its own sum.
// That order depends only on K and on whether the vector path runs (which
// depends on the shapes and buffers, never on M), so a row's bits are the
// same in a call of 1 row or of 5,000.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace qtk::cuda {

// A weight operand [N, K] (HF layout), or stacked experts [G, N, K].
// note: an FP8 weight is each e4m3 value times its block's float32 scale,
// computed in f32 (one rounding) before it enters the sum, as the CPU's
// matmul_fp8 does (kernels/matmul_fp8.h).
template <class T>
struct WeightRef {
  const T* dense = nullptr;                // T [.., N, K]; or nullptr and:
  const uint8_t* fp8 = nullptr;            // e4m3fn [.., N, K]
  const float* scale = nullptr;            // f32 [ceil(rows/block_rows), ceil(K/block_cols)]; the
                                           // rows counted over the stacked experts (G * N)
  int64_t block_rows = 0, block_cols = 0;  // block_cols a multiple of 16
};

// y[m, n] = sum_k x[m, k] * w[n, k] for m < M, n < N. T = float or bf16
// (activations; dense weights are T too); Y = float or bf16.
template <class T, class Y>
void warp_matmul(const T* x, int64_t ldx, const WeightRef<T>& w, Y* y, int64_t ldy, int64_t M,
                 int64_t N, int64_t K, cudaStream_t stream);

// act[m, j] = silu(g) * u for j < I, where g and u are y[m, j] and
// y[m, I + j] of the product with w [2I, K] (gate rows over up rows), each
// rounded to T as warp_matmul would store them: the product and the SwiGLU
// in one launch, bit for bit warp_matmul<T, T> then swiglu<T>. Only where
// the tensor-core narrow kernel computes the product (bf16 activations, up
// to 16 rows; kernels/cuda/mma_matmul.cuh); false, with nothing launched,
// elsewhere (the caller runs the two steps).
template <class T>
bool warp_matmul_swiglu(const T* x, int64_t ldx, const WeightRef<T>& w, T* act, int64_t lda,
                        int64_t M, int64_t I, int64_t K, cudaStream_t stream);

// The form warp_matmul's tensor-core product takes above 16 rows a group
// (kernels/cuda/warp_matmul.cuh, wide_form): 90 the warpgroup kernel, 64 or
// 32 the split kernel's rows per pass, 0 the 4-warp kernel. N: the output
// columns; rows: M, or the rows per group on average. For tests.
int mma_wide_form(int64_t N, int64_t rows, bool grouped, bool fp8);

}  // namespace qtk::cuda
