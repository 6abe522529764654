// The kernel behind warp_matmul (kernels/cuda/warp_matmul.h) and the
// experts' products of kernels/cuda/moe.h; device code, included by their
// .cu files only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <climits>
#include <cstdint>
#include <string>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/warp_matmul.h"

namespace qtk::cuda::dev {

// Rows of one group a warp takes at a time (one pass over the weight row),
// and warps (output columns) per block.
constexpr int kWarpRows = 8;
constexpr int kWarpsPerBlock = 8;

__device__ __forceinline__ float e4m3_to_f(uint8_t b) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(b), __NV_E4M3);
  return __half2float(__half(h));
}

// Where a block's rows come from.
struct RowGroups {
  const int32_t* offsets = nullptr;    // [G + 1] group g's rows; nullptr: one group of `rows`
  const int32_t* active = nullptr;     // [gridDim.y] the group of each block row; -1: none
  const int32_t* row_source = nullptr;  // x row of each row; nullptr: the row itself
  int rows = 0;
};

// One warp per (group, output column n): y[r, n] for the group's rows r,
// weight row g*N + n (see the note in warp_matmul.h for the order).
template <class T, class Y, bool kFp8>
__global__ void warp_matmul_kernel(const T* __restrict__ x, int64_t ldx,
                                   const T* __restrict__ wd, const uint8_t* __restrict__ wq,
                                   const float* __restrict__ scale, int br, int bc, int ld_scale,
                                   int N, int K, Y* __restrict__ y, int64_t ldy, RowGroups rg,
                                   bool vec) {
  pdl_begin();
  int g = 0, r0 = 0, r1 = rg.rows;
  if (rg.offsets != nullptr) {
    g = rg.active[blockIdx.y];
    if (g < 0) return;
    r0 = rg.offsets[g];
    r1 = rg.offsets[g + 1];
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int n = blockIdx.x * kWarpsPerBlock + warp;
  if (n >= N) return;
  const int64_t wrow = static_cast<int64_t>(g) * N + n;
  const T* wdr = kFp8 ? nullptr : wd + wrow * K;
  const uint8_t* wqr = kFp8 ? wq + wrow * K : nullptr;
  const float* sr = kFp8 ? scale + (wrow / br) * ld_scale : nullptr;
  constexpr int V = 16 / sizeof(T);
  const int kvec = vec ? K / (32 * V) * (32 * V) : 0;
  for (int rb = r0; rb < r1; rb += kWarpRows) {
    const int nr = min(kWarpRows, r1 - rb);
    const T* xr[kWarpRows];
#pragma unroll
    for (int i = 0; i < kWarpRows; ++i) {
      const int r = rb + min(i, nr - 1);  // short passes repeat the last row (not written)
      xr[i] = x + static_cast<int64_t>(rg.row_source != nullptr ? rg.row_source[r] : r) * ldx;
    }
    float acc[kWarpRows];
#pragma unroll
    for (int i = 0; i < kWarpRows; ++i) acc[i] = 0.0f;
    for (int k0 = lane * V; k0 < kvec; k0 += 32 * V) {
      float wf[V];
      if constexpr (kFp8) {
        // V e4m3 bytes (8 or 4), all in one scale block (block_cols % 16 == 0).
        uint8_t b[V];
        if constexpr (V == 8) {
          *reinterpret_cast<uint2*>(b) = *reinterpret_cast<const uint2*>(wqr + k0);
        } else {
          *reinterpret_cast<uint32_t*>(b) = *reinterpret_cast<const uint32_t*>(wqr + k0);
        }
        const float s = sr[k0 / bc];
#pragma unroll
        for (int j = 0; j < V; ++j) wf[j] = e4m3_to_f(b[j]) * s;
      } else {
        const uint4 wv = *reinterpret_cast<const uint4*>(wdr + k0);
        const T* wh = reinterpret_cast<const T*>(&wv);
#pragma unroll
        for (int j = 0; j < V; ++j) wf[j] = to_f(wh[j]);
      }
#pragma unroll
      for (int i = 0; i < kWarpRows; ++i) {
        const uint4 xv = *reinterpret_cast<const uint4*>(xr[i] + k0);
        const T* xh = reinterpret_cast<const T*>(&xv);
#pragma unroll
        for (int j = 0; j < V; ++j) acc[i] = fmaf(to_f(xh[j]), wf[j], acc[i]);
      }
    }
    for (int kk = kvec + lane; kk < K; kk += 32) {
      float wk;
      if constexpr (kFp8)
        wk = e4m3_to_f(wqr[kk]) * sr[kk / bc];
      else
        wk = to_f(wdr[kk]);
#pragma unroll
      for (int i = 0; i < kWarpRows; ++i) acc[i] = fmaf(to_f(xr[i][kk]), wk, acc[i]);
    }
#pragma unroll
    for (int i = 0; i < kWarpRows; ++i) {
      const float v = warp_sum(acc[i]);
      if (lane == i && i < nr) y[static_cast<int64_t>(rb + i) * ldy + n] = from_f<Y>(v);
    }
  }
}

}  // namespace qtk::cuda::dev

namespace qtk::cuda {

// Launches warp_matmul_kernel over `groups` (grid rows: groups_y, one per
// possible group; 1 without groups). Checks the sizes and picks the vector
// path from the shapes and buffers alone.
template <class T, class Y>
void launch_warp_matmul(const char* what, const T* x, int64_t ldx, const WeightRef<T>& w,
                        int64_t N, int64_t K, Y* y, int64_t ldy, const dev::RowGroups& groups,
                        int64_t groups_y, cudaStream_t stream) {
  const bool fp8 = w.dense == nullptr;
  if (N > INT32_MAX || K > INT32_MAX || groups_y < 1 || groups_y > 65535 ||
      (fp8 && (w.fp8 == nullptr || w.scale == nullptr || w.block_rows < 1 ||
               w.block_cols < 16 || w.block_cols % 16 != 0)))
    fail_message(std::string(what) + ": unsupported operands (N " + std::to_string(N) + ", K " +
                 std::to_string(K) + ", " + std::to_string(groups_y) + " groups" +
                 (fp8 ? ", FP8 blocks " + std::to_string(w.block_rows) + "x" +
                            std::to_string(w.block_cols)
                      : std::string()) +
                 ")");
  constexpr int V = 16 / sizeof(T);
  const auto aligned = [](const void* p, size_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; };
  // note: the vector path needs every row start aligned; which path runs
  // depends on the shapes and buffers only, never on the rows.
  const bool vec = K % V == 0 && ldx % V == 0 && aligned(x, 16) &&
                   (fp8 ? aligned(w.fp8, V) : aligned(w.dense, 16));
  const dim3 grid(static_cast<unsigned>((N + dev::kWarpsPerBlock - 1) / dev::kWarpsPerBlock),
                  static_cast<unsigned>(groups_y));
  const dim3 block(32 * dev::kWarpsPerBlock);
  const int ld_scale = fp8 ? static_cast<int>((K + w.block_cols - 1) / w.block_cols) : 0;
  if (fp8)
    launch_kernel(dev::warp_matmul_kernel<T, Y, true>, grid, block, 0, stream, x, ldx,
                  static_cast<const T*>(nullptr), w.fp8, w.scale, static_cast<int>(w.block_rows),
                  static_cast<int>(w.block_cols), ld_scale, static_cast<int>(N),
                  static_cast<int>(K), y, ldy, groups, vec);
  else
    launch_kernel(dev::warp_matmul_kernel<T, Y, false>, grid, block, 0, stream, x, ldx, w.dense,
                  static_cast<const uint8_t*>(nullptr), static_cast<const float*>(nullptr), 1, 16,
                  0, static_cast<int>(N), static_cast<int>(K), y, ldy, groups, vec);
}

}  // namespace qtk::cuda
