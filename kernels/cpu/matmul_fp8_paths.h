// Per-path FP8 matmul column-range functions (internal to qtk_kernels); the
// same per-file rules as matmul_paths.h.
#pragma once

#include <cstdint>

namespace qtk::cpu {

// Computes y[m, n] for all m < M and n_begin <= n < n_end (kernels/matmul_fp8.h).
// sld: row stride of scale (ceil(K / bc)). big_scales: some |scale| >= 2^8
// (or the caller did not check); see the note in matmul_fp8_avx512.cpp.
using MatmulFp8ColsFn = void (*)(const float* x, int64_t ldx, const uint8_t* wq, const float* scale,
                                 int64_t sld, int64_t br, int64_t bc, float* y, int64_t ldy,
                                 int64_t M, int64_t K, int64_t n_begin, int64_t n_end,
                                 bool big_scales);

void matmul_fp8_cols_scalar(const float* x, int64_t ldx, const uint8_t* wq, const float* scale,
                            int64_t sld, int64_t br, int64_t bc, float* y, int64_t ldy, int64_t M,
                            int64_t K, int64_t n_begin, int64_t n_end, bool big_scales);
void matmul_fp8_cols_avx2(const float* x, int64_t ldx, const uint8_t* wq, const float* scale,
                          int64_t sld, int64_t br, int64_t bc, float* y, int64_t ldy, int64_t M,
                          int64_t K, int64_t n_begin, int64_t n_end, bool big_scales);
void matmul_fp8_cols_avx512(const float* x, int64_t ldx, const uint8_t* wq, const float* scale,
                            int64_t sld, int64_t br, int64_t bc, float* y, int64_t ldy, int64_t M,
                            int64_t K, int64_t n_begin, int64_t n_end, bool big_scales);

}  // namespace qtk::cpu
