// Dense matmul against a weight matrix in Hugging Face layout.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "kernels/cpu_features.h"
#include "kernels/thread_pool.h"

namespace qtk {

// y[m, n] = sum_k x[m, k] * w[n, k]
//   x: f32 [M, K] row stride ldx
//   w: bf16 | f16 | f32 [N, K] row-major, contiguous (the HF nn.Linear layout)
//   y: f32 [M, N] row stride ldy
// Accumulates in f32. Uses active_cpu_path(). Throws qtk::Error for other
// weight dtypes.
//
// note: batch invariance: the reduction order of y[m, n] is fixed by the path
// alone: lane l of a vector accumulator (16 lanes on avx512, 8 on avx2 and
// scalar) sums x[m,k]*w[n,k] for k = l, l+L, l+2L, ... in increasing k with
// one fused multiply-add each, then the lanes are added in a fixed tree. Row
// and column tiling and the thread split (threads own whole columns) change
// which registers hold an accumulator, never the arithmetic, so row m of an
// M-row call is bit-identical to the same row computed alone. The amx path
// with bf16 weights fixes its order differently (k blocks of 32 on AMX tiles,
// kernels/cpu/matmul_amx.cpp) under the same rule.
void matmul(const float* x, int64_t ldx, const void* w, DType wtype, float* y, int64_t ldy,
            int64_t M, int64_t N, int64_t K, ThreadPool* pool);

// The same on an explicit path (tests run every supported path). Throws
// qtk::Error when the CPU cannot run it.
void matmul_on_path(CpuPath path, const float* x, int64_t ldx, const void* w, DType wtype, float* y,
                    int64_t ldy, int64_t M, int64_t N, int64_t K, ThreadPool* pool);

}  // namespace qtk
