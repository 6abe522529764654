// Tile-order matmul column function (internal to qtk_kernels; the public
// side is kernels/matmul_tiled.h). Defined in matmul_avx512.cpp.
// note: same rule as matmul_paths.h: this header includes only <cstdint>, so
// the AVX-512 translation unit shares no inline code with others.
#pragma once

#include <cstdint>

namespace qtk::cpu {

// Computes y[m, n] for all m < M and every row n of tiles [t_begin, t_end)
// that is < N, from a bf16 weight in tile order (kernels/matmul_tiled.h),
// K a multiple of 16.
void matmul_tiled_cols_avx512(const float* x, int64_t ldx, const uint16_t* wt, float* y,
                              int64_t ldy, int64_t M, int64_t N, int64_t K, int64_t t_begin,
                              int64_t t_end);

}  // namespace qtk::cpu
