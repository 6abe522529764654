// The kernel behind warp_matmul (kernels/cuda/warp_matmul.h) and the
// experts' products of kernels/cuda/moe.h; device code, included by their
// .cu files only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <string>
#include <type_traits>

#include "core/tuning.h"

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/mma_matmul.cuh"
#include "kernels/cuda/mma_wgmma.cuh"
#include "kernels/cuda/row_groups.cuh"
#include "kernels/cuda/warp_matmul.h"

namespace qtk::cuda::dev {

// Warps (output columns) per block.
constexpr int kWarpsPerBlock = 8;

__device__ __forceinline__ float e4m3_to_f(uint8_t b) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(b), __NV_E4M3);
  return __half2float(__half(h));
}

// Elements of K a lane takes per stretch: 16 bytes of weights (16 e4m3, 8
// bf16 or 4 f32 values).
template <class T, bool kFp8>
constexpr int lane_elems() {
  return kFp8 ? 16 : 16 / static_cast<int>(sizeof(T));
}

// The weight operand of one warp: row wrow of a dense or block-FP8 matrix.
template <class T, bool kFp8>
struct WarpWeightRow {
  const T* dense;
  const uint8_t* fp8;
  const float* scale;  // the row's scale row (FP8)
  int bc;              // scale block columns (FP8)

  // The E weights of k0 .. k0+E-1 as float (k0 a multiple of E, 16-byte aligned).
  __device__ __forceinline__ void load(int k0, float* wf) const {
    constexpr int E = lane_elems<T, kFp8>();
    const uint4 v = kFp8 ? *reinterpret_cast<const uint4*>(fp8 + k0)
                         : *reinterpret_cast<const uint4*>(dense + k0);
    if constexpr (kFp8) {
      // note: E = 16 values in one scale block (block_cols % 16 == 0).
      const auto* b = reinterpret_cast<const uint8_t*>(&v);
      const float s = scale[k0 / bc];
#pragma unroll
      for (int j = 0; j < E; ++j) wf[j] = e4m3_to_f(b[j]) * s;
    } else {
      const T* h = reinterpret_cast<const T*>(&v);
#pragma unroll
      for (int j = 0; j < E; ++j) wf[j] = to_f(h[j]);
    }
  }
  __device__ __forceinline__ float at(int k) const {
    if constexpr (kFp8)
      return e4m3_to_f(fp8[k]) * scale[k / bc];
    else
      return to_f(dense[k]);
  }
};

// One pass of a warp over its weight row for R rows rb .. rb+R-1: each
// row's sum in the fixed order of warp_matmul.h, written by lane i for row i.
// note: a row's arithmetic does not depend on R (its own accumulator, the
// same k order, the same butterfly), so passes of any width give it the
// same bits.
template <int R, class T, class Y, bool kFp8>
__device__ __forceinline__ void warp_rows_pass(const T* __restrict__ x, int64_t ldx,
                                               const int32_t* __restrict__ row_source, int rb,
                                               const WarpWeightRow<T, kFp8>& w, int K, int kvec,
                                               int lane, Y* __restrict__ y, int64_t ldy, int n) {
  constexpr int E = lane_elems<T, kFp8>();
  constexpr int X16 = E * static_cast<int>(sizeof(T)) / 16;  // 16-byte x loads per piece
  const T* xr[R];
#pragma unroll
  for (int i = 0; i < R; ++i)
    xr[i] = x + static_cast<int64_t>(row_source != nullptr ? row_source[rb + i] : rb + i) * ldx;
  float acc[R];
#pragma unroll
  for (int i = 0; i < R; ++i) acc[i] = 0.0f;
    // note: two pieces in flight per lane where a pass holds few rows (the
    // decode case, bound by the weight reads); wide passes keep one, as their
    // x loads already fill the registers. Unrolling never reorders a row's sum.
#pragma unroll(R <= 2 ? 2 : 1)
  for (int k0 = lane * E; k0 < kvec; k0 += 32 * E) {
    float wf[E];
    w.load(k0, wf);
#pragma unroll
    for (int i = 0; i < R; ++i) {
      uint4 xv[X16];
#pragma unroll
      for (int q = 0; q < X16; ++q) xv[q] = reinterpret_cast<const uint4*>(xr[i] + k0)[q];
      const T* xh = reinterpret_cast<const T*>(xv);
#pragma unroll
      for (int j = 0; j < E; ++j) acc[i] = fmaf(to_f(xh[j]), wf[j], acc[i]);
    }
  }
  for (int kk = kvec + lane; kk < K; kk += 32) {
    const float wk = w.at(kk);
#pragma unroll
    for (int i = 0; i < R; ++i) acc[i] = fmaf(to_f(xr[i][kk]), wk, acc[i]);
  }
#pragma unroll
  for (int i = 0; i < R; ++i) {
    const float v = warp_sum(acc[i]);
    if (lane == i) y[static_cast<int64_t>(rb + i) * ldy + n] = from_f<Y>(v);
  }
}

// One warp per (group, output column n): y[r, n] for the group's rows r,
// weight row g*N + n (see the note in warp_matmul.h for the order), in
// passes of 8, 4, 2 or 1 rows.
template <class T, class Y, bool kFp8>
__global__ void warp_matmul_kernel(const T* __restrict__ x, int64_t ldx, const T* __restrict__ wd,
                                   const uint8_t* __restrict__ wq, const float* __restrict__ scale,
                                   int br, int bc, int ld_scale, int N, int K, Y* __restrict__ y,
                                   int64_t ldy, RowGroups rg, bool vec) {
  pdl_begin();
  int g, r0, r1;
  if (!group_rows(rg, g, r0, r1)) return;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int n = blockIdx.x * kWarpsPerBlock + warp;
  if (n >= N) return;
  const int64_t wrow = static_cast<int64_t>(g) * N + n;
  WarpWeightRow<T, kFp8> w;
  w.dense = kFp8 ? nullptr : wd + wrow * K;
  w.fp8 = kFp8 ? wq + wrow * K : nullptr;
  w.scale = kFp8 ? scale + (wrow / br) * ld_scale : nullptr;
  w.bc = bc;
  constexpr int E = lane_elems<T, kFp8>();
  const int kvec = vec ? K / (32 * E) * (32 * E) : 0;
  for (int rb = r0; rb < r1;) {
    const int left = r1 - rb;
    if (left >= 8) {
      warp_rows_pass<8, T, Y, kFp8>(x, ldx, rg.row_source, rb, w, K, kvec, lane, y, ldy, n);
      rb += 8;
    } else if (left >= 4) {
      warp_rows_pass<4, T, Y, kFp8>(x, ldx, rg.row_source, rb, w, K, kvec, lane, y, ldy, n);
      rb += 4;
    } else if (left >= 2) {
      warp_rows_pass<2, T, Y, kFp8>(x, ldx, rg.row_source, rb, w, K, kvec, lane, y, ldy, n);
      rb += 2;
    } else {
      warp_rows_pass<1, T, Y, kFp8>(x, ldx, rg.row_source, rb, w, K, kvec, lane, y, ldy, n);
      rb += 1;
    }
  }
}

}  // namespace qtk::cuda::dev

namespace qtk::cuda {

// Checks the operands of a weight product (the what of the message).
template <class T>
void check_weight_operands(const char* what, const WeightRef<T>& w, int64_t N, int64_t K,
                           int64_t groups_y) {
  const bool fp8 = w.dense == nullptr;
  if (N > INT32_MAX || K > INT32_MAX || groups_y < 1 || groups_y > 65535 ||
      (fp8 && (w.fp8 == nullptr || w.scale == nullptr || w.block_rows < 1 || w.block_cols < 16 ||
               w.block_cols % 16 != 0)))
    fail_message(
        std::string(what) + ": unsupported operands (N " + std::to_string(N) + ", K " +
        std::to_string(K) + ", " + std::to_string(groups_y) + " groups" +
        (fp8 ? ", FP8 blocks " + std::to_string(w.block_rows) + "x" + std::to_string(w.block_cols)
             : std::string()) +
        ")");
}

inline bool aligned_to(const void* p, size_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; }

// QTK_MMA_WIDE's value for the warpgroup kernel (kernels/cuda/mma_wgmma.cuh),
// and the form wide_form returns for it.
constexpr int kWgmmaForm = 90;

// The form of the tensor-core product above 16 rows a group (QTK_MMA_WIDE):
// kWgmmaForm, the split kernel's rows per pass (64 or 32), or 0 for the
// 4-warp wide kernel. N: the output columns; rows: M, or the rows per group
// on average.
// note: without groups and above 32 rows, 32-row passes double the blocks;
// they are chosen where the waves of blocks (one block per SM) then take
// less time, a 32-row block taking kPass32Cost of a 64-row one's (0.66 to
// 0.76 on the Qwen3-8B and Qwen3-30B-A3B shapes, H200, bench/cuda/
// wide_ab.sh). At 32 rows or fewer both grids are the same and the 64-row
// form was as fast or faster. The split and warpgroup kernels need sm_90's
// shared memory per block (the warpgroup kernel also its wgmma); elsewhere
// the 4-warp kernel computes the same sums. The choice changes which
// threads compute a sum, never the sum.
inline int wide_form(int64_t N, int64_t rows, bool grouped, bool fp8) {
  const int form = tuning().mma_wide;
  if (form == 4) return 0;
  const int wg_bytes =
      fp8 ? dev::WgLayout<true, 2>::kBlockBytes : dev::WgLayout<false, 2>::kBlockBytes;
  if (form == kWgmmaForm && !grouped && wgmma_device() && wg_bytes <= max_dynamic_smem())
    return kWgmmaForm;
  int pass = form == 32 || form == 64 ? form : 0;
  if (pass == 0) {
    pass = 64;
    if (!grouped) {
      constexpr double kPass32Cost = 0.7;
      const int64_t sms = sm_count(), col_blocks = (N + dev::kSplitCols - 1) / dev::kSplitCols;
      const auto waves = [&](int64_t h) {
        return (col_blocks * ((rows + h - 1) / h) + sms - 1) / sms;
      };
      if (rows > 32 &&
          static_cast<double>(waves(32)) * kPass32Cost < static_cast<double>(waves(64)))
        pass = 32;
    }
  }
  return dev::split_block_bytes(fp8, pass) <= max_dynamic_smem() ? pass : 0;
}

// The tensor-core product (kernels/cuda/mma_matmul.cuh) over `groups`, if
// it takes these operands: false, with nothing launched, when it does not.
// pair: 0, or I = N / 2 for silu(gate) * up into y [rows, I] (the weight's
// gate rows over its up rows), which only the narrow kernel computes.
// note: with bf16 activations the tensor-core product (its narrow kernel
// for groups of up to 16 rows, the split or wide one above: the same bits)
// takes every operand whose rows it can read in 16-byte pieces of 16 k
// (K % 16 == 0, aligned rows) and whose scale blocks hold whole 64-k
// chunks; whether it runs depends on the shapes, the buffers and
// QTK_MMA_MATMUL only, never on the rows, so a row's bits stay independent
// of the batch (which of its kernels runs depends on the rows, its sums do
// not).
template <class T, class Y>
bool launch_mma_matmul(const T* x, int64_t ldx, const WeightRef<T>& w, int64_t N, int64_t K, Y* y,
                       int64_t ldy, const dev::RowGroups& groups, int64_t groups_y, int64_t pair,
                       cudaStream_t stream) {
  if constexpr (!std::is_same_v<T, __nv_bfloat16>) {
    return false;
  } else {
    const bool fp8 = w.dense == nullptr;
    const bool fits = tuning().mma_matmul && K % 16 == 0 && ldx % 8 == 0 && aligned_to(x, 16) &&
                      (fp8 ? aligned_to(w.fp8, 16) && w.block_cols % dev::kMmaChunk == 0
                           : aligned_to(w.dense, 16));
    // Rows per group: M, or on average the routed rows over the experts
    // that can have some (a bound known on the host).
    const int64_t rows = groups.offsets == nullptr ? groups.rows : groups.rows / groups_y;
    if (!fits || (pair != 0 && (rows > 16 || N != 2 * pair))) return false;
    dev::MmaOperands o{x,
                       ldx,
                       w.dense,
                       w.fp8,
                       w.scale,
                       fp8 ? static_cast<int>(w.block_rows) : 1,
                       fp8 ? static_cast<int>(w.block_cols) : dev::kMmaChunk,
                       fp8 ? static_cast<int>((K + w.block_cols - 1) / w.block_cols) : 0,
                       static_cast<int>(N),
                       static_cast<int>(K),
                       static_cast<int>(pair)};
    const int narrow_cols = pair != 0 ? 8 : 16;
    const dim3 narrow_grid(
        static_cast<unsigned>(((pair != 0 ? pair : N) + narrow_cols - 1) / narrow_cols),
        static_cast<unsigned>(groups_y));
    const dim3 narrow_block(32 * dev::kMmaRanges);
    const int wide_cols = 16 * dev::kWideWarps;
    // Without groups each block takes one pass of up to 64 rows (grid z).
    const int64_t passes =
        groups.offsets == nullptr ? (rows + dev::kWideRows - 1) / dev::kWideRows : 1;
    const dim3 wide_grid(static_cast<unsigned>((N + wide_cols - 1) / wide_cols),
                         static_cast<unsigned>(groups_y), static_cast<unsigned>(passes));
    const dim3 wide_block(32 * dev::kWideWarps);
    const auto narrow = [&](auto kernel, int smem) {
      set_max_dynamic_smem(kernel, smem);
      launch_kernel(kernel, narrow_grid, narrow_block, smem, stream, o, y, ldy, groups);
    };
    const auto wide = [&](auto kernel, int smem) {
      set_max_dynamic_smem(kernel, smem);
      launch_kernel(kernel, wide_grid, wide_block, smem, stream, o, y, ldy, groups);
    };
    // The split form (passes of pass_rows rows): without groups, each
    // column block's passes side by side in grid x.
    const int form = rows > 16 ? wide_form(N, rows, groups.offsets != nullptr, fp8) : 0;
    const int pass_rows = form == kWgmmaForm ? 0 : form;
    const auto split = [&](auto kernel) {
      const int smem = dev::split_block_bytes(fp8, pass_rows);
      const int64_t split_passes =
          groups.offsets == nullptr ? std::max<int64_t>(1, (rows + pass_rows - 1) / pass_rows) : 1;
      const dim3 grid(
          static_cast<unsigned>((N + dev::kSplitCols - 1) / dev::kSplitCols * split_passes),
          static_cast<unsigned>(groups_y));
      set_max_dynamic_smem(kernel, smem);
      launch_kernel(kernel, grid, dim3(32 * dev::kSplitWarps), smem, stream, o, y, ldy, groups,
                    static_cast<int>(split_passes));
    };
    // The warpgroup form (without groups): a cluster of 4 blocks, one per
    // K range, for each 128-column block's passes of 64 token rows (one
    // warpgroup) or 128 (two).
    // note: 128-row passes above 64 rows: one converted weight tile serves
    // twice the token rows (one warpgroup a block at M 128, two blocks an SM:
    // 43.4 vs 40.2 us at 128 x 6144 x 4096, H200).
    const int wg_groups = rows > dev::kWgGroupRows ? 2 : 1;
    const auto warpgroup = [&](auto kernel, int smem) {
      const int64_t wg_rows = dev::kWgGroupRows * wg_groups;
      const int64_t wg_passes = (rows + wg_rows - 1) / wg_rows;
      const dim3 grid(static_cast<unsigned>((N + dev::kWgCols - 1) / dev::kWgCols * wg_passes *
                                            dev::kWgCluster));
      set_max_dynamic_smem(kernel, smem);
      launch_kernel_clusters(kernel, grid, dim3(dev::kWgGroupThreads * wg_groups), smem,
                             dim3(dev::kWgCluster, 1, 1), stream, o, y, ldy, static_cast<int>(rows),
                             static_cast<int>(wg_passes));
    };
    // note: FP8 groups of up to 8 rows take a 6-deep ring a warp (5 weight
    // chunks in flight): the decode of a dense product or of one token's
    // experts. From kNarrowShallowGroups groups on (MoE steps of several
    // tokens, each choosing its own experts) the 4-deep ring, which fits
    // more blocks an SM, is faster. H200, Qwen3.5-35B-A3B FP8 experts cut
    // to 4 layers, decode tok/s with this rule / the 6-deep ring always:
    // batch 1 1,807-1,816 / 1,811-1,820, 2 3,191-3,201 / 3,139-3,141, 4
    // 5,258-5,444 / 5,039-5,041, 8 8,380-8,415 / 7,901-7,902, 16
    // 11,981-12,005 / 11,097-11,115; the 4-deep ring always lost at batch 1
    // (1,797-1,799) and on a dense Qwen3-8B FP8 cut (849 / 989). The same
    // sums either way (a ring's depth is only how far the copies run ahead).
    const bool fp8_shallow = groups.offsets != nullptr && groups_y >= dev::kNarrowShallowGroups;
    if (rows > 16 && form == kWgmmaForm && fp8 && wg_groups == 2)
      warpgroup(dev::mma_wgmma_kernel<Y, true, 2>, dev::WgLayout<true, 2>::kBlockBytes);
    else if (rows > 16 && form == kWgmmaForm && fp8)
      warpgroup(dev::mma_wgmma_kernel<Y, true, 1>, dev::WgLayout<true, 1>::kBlockBytes);
    else if (rows > 16 && form == kWgmmaForm && wg_groups == 2)
      warpgroup(dev::mma_wgmma_kernel<Y, false, 2>, dev::WgLayout<false, 2>::kBlockBytes);
    else if (rows > 16 && form == kWgmmaForm)
      warpgroup(dev::mma_wgmma_kernel<Y, false, 1>, dev::WgLayout<false, 1>::kBlockBytes);
    else if (rows <= 8 && fp8 && fp8_shallow)
      narrow(dev::mma_narrow_kernel<Y, true, 1, dev::kNarrowShallowDepth>,
             dev::NarrowLayout<true, 1, dev::kNarrowShallowDepth>::kBlockBytes);
    else if (rows <= 8 && fp8)
      narrow(dev::mma_narrow_kernel<Y, true, 1>, dev::NarrowLayout<true, 1>::kBlockBytes);
    else if (rows <= 8)
      narrow(dev::mma_narrow_kernel<Y, false, 1>, dev::NarrowLayout<false, 1>::kBlockBytes);
    else if (rows <= 16 && fp8)
      narrow(dev::mma_narrow_kernel<Y, true, 2>, dev::NarrowLayout<true, 2>::kBlockBytes);
    else if (rows <= 16)
      narrow(dev::mma_narrow_kernel<Y, false, 2>, dev::NarrowLayout<false, 2>::kBlockBytes);
    else if (pass_rows == 0 && fp8)
      wide(dev::mma_wide_kernel<Y, true>, dev::wide_smem<true>());
    else if (pass_rows == 0)
      wide(dev::mma_wide_kernel<Y, false>, dev::wide_smem<false>());
    else if (pass_rows == 32 && fp8)
      split(dev::mma_split_kernel<Y, true, 4>);
    else if (pass_rows == 32)
      split(dev::mma_split_kernel<Y, false, 4>);
    else if (fp8)
      split(dev::mma_split_kernel<Y, true, 8>);
    else
      split(dev::mma_split_kernel<Y, false, 8>);
    return true;
  }
}

// Launches the weight product over `groups` (grid rows: groups_y, one per
// possible group; 1 without groups): the tensor-core product where it
// takes the operands, else warp_matmul_kernel, which picks its vector path
// from the shapes and buffers alone.
template <class T, class Y>
void launch_warp_matmul(const char* what, const T* x, int64_t ldx, const WeightRef<T>& w, int64_t N,
                        int64_t K, Y* y, int64_t ldy, const dev::RowGroups& groups,
                        int64_t groups_y, cudaStream_t stream) {
  check_weight_operands(what, w, N, K, groups_y);
  if (launch_mma_matmul<T, Y>(x, ldx, w, N, K, y, ldy, groups, groups_y, 0, stream)) return;
  const bool fp8 = w.dense == nullptr;
  const int E = fp8 ? dev::lane_elems<T, true>() : dev::lane_elems<T, false>();
  // note: the vector path needs every row start 16-byte aligned; which path
  // runs depends on the shapes and buffers only, never on the rows.
  const bool vec = K % E == 0 && (ldx * static_cast<int64_t>(sizeof(T))) % 16 == 0 &&
                   aligned_to(x, 16) && (fp8 ? aligned_to(w.fp8, 16) : aligned_to(w.dense, 16));
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
