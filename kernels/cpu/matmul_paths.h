// Per-path matmul column-range functions (internal to qtk_kernels).
//
// note: each lives in its own translation unit compiled with that path's
// -m flags. Those files include nothing but <immintrin.h> and <cstdint> and
// define everything in an anonymous namespace, so no inline function or
// template built with AVX-512 instructions can be merged by the linker into
// code that runs on a CPU without them.
#pragma once

#include <cstdint>

namespace qtk::cpu {

// Weight element type codes shared by the path files.
enum MatmulWeight : int { kWeightBf16 = 0, kWeightF16 = 1, kWeightF32 = 2 };

// Computes y[m, n] for all m < M and n_begin <= n < n_end.
using MatmulColsFn = void (*)(const float* x, int64_t ldx, const void* w, int wtype, float* y,
                              int64_t ldy, int64_t M, int64_t K, int64_t n_begin, int64_t n_end);

void matmul_cols_scalar(const float* x, int64_t ldx, const void* w, int wtype, float* y,
                        int64_t ldy, int64_t M, int64_t K, int64_t n_begin, int64_t n_end);
void matmul_cols_avx2(const float* x, int64_t ldx, const void* w, int wtype, float* y, int64_t ldy,
                      int64_t M, int64_t K, int64_t n_begin, int64_t n_end);
void matmul_cols_avx512(const float* x, int64_t ldx, const void* w, int wtype, float* y,
                        int64_t ldy, int64_t M, int64_t K, int64_t n_begin, int64_t n_end);

}  // namespace qtk::cpu
