// Matmul against a block-FP8 weight (F8_E4M3 with float32 block scales), read
// in place: no dequantized copy of the weight is made.
#pragma once

#include <cstdint>

#include "kernels/cpu_features.h"
#include "kernels/thread_pool.h"

namespace qtk {

// y[m, n] = sum_k x[m, k] * w(n, k),  w(n, k) = e4m3(wq[n, k]) * scale[n / br, k / bc]
//   x:     f32 [M, K] row stride ldx
//   wq:    e4m3fn bytes [N, K] row-major (HF nn.Linear layout)
//   scale: f32 [ceil(N/br), ceil(K/bc)] row-major; bc a multiple of 16
//   y:     f32 [M, N] row stride ldy
// Uses active_cpu_path() (amx runs the avx512 kernel). Throws qtk::Error for
// a block width that is not a positive multiple of 16.
//
// note: arithmetic. Each weight is computed as the float32 product
// e4m3 value x scale (one rounding, to nearest even; an e4m3 value has 4
// significant bits and the scale 24, so the product is not always exact in
// float32: relative error <= 2^-24 against the float64 reference). It then
// enters exactly the reduction of the f32-weight matmul of the same path
// (kernels/matmul.h: lane order, FMA or not, the fixed lane tree, zeroed
// tails), so y is bit for bit what matmul() gives on that path for an f32
// weight holding those products: the weights of `convert --dtype f32`
// (convert/dtype_convert.h). Batch invariance follows as for matmul().
void matmul_fp8(const float* x, int64_t ldx, const uint8_t* wq, const float* scale, int64_t br,
                int64_t bc, float* y, int64_t ldy, int64_t M, int64_t N, int64_t K,
                ThreadPool* pool);

// The same on an explicit path. Throws qtk::Error when the CPU cannot run it.
void matmul_fp8_on_path(CpuPath path, const float* x, int64_t ldx, const uint8_t* wq,
                        const float* scale, int64_t br, int64_t bc, float* y, int64_t ldy,
                        int64_t M, int64_t N, int64_t K, ThreadPool* pool);

}  // namespace qtk
