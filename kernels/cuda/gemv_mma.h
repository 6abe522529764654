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
// [m, n] (row stride ldy). One warp per 16 output columns walks the whole K
// with mma.sync m16n8k16 (bf16 in, f32 accumulate), k-steps of 16 in
// increasing order into one accumulator from zero; the bf16 output is the
// f32 sum rounded to nearest even. No split over K, so each output is one
// fixed chain whatever m is.
// note: used by Gemm only for a shape class where it produced, on this GPU,
// bit for bit the output of the cuBLASLt algorithm that serves every other
// M (gemm.cpp, verify_alternates); otherwise it is not used at all.
template <class OUT>
void gemv_bf16(const __nv_bfloat16* x, int64_t ldx, const __nv_bfloat16* w, int64_t ldw, OUT* y,
               int64_t ldy, int64_t m, int64_t n, int64_t k, cudaStream_t stream);

}  // namespace qtk::cuda
