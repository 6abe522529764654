// One row of add_rmsnorm (kernels/cuda/cuda_kernels.h) by one block: the
// arithmetic that the add_rmsnorm kernel runs and that the MoE router front
// (moe.cu) replays in its prologue, so both give the same bits by
// construction. Device code, included by norm.cu and moe.cu.
#pragma once

#include "kernels/cuda/common.cuh"

namespace qtk::cuda::dev {

// note: one block of kRowThreads per row whatever the row count; thread t
// sums the squares of columns t, t+256, ... in order, then block_sum's fixed
// tree. The order thus depends on cols only.
// note: the fused add + RMSNorm in front of the GEMV (gemv_mma.cu) replays
// this order with 256 virtual threads: change both together
// (tests/cuda/test_gemv.cpp compares their bits).
constexpr int kRowThreads = 256;

// The first kCached columns of each thread of a row, held in registers
// between the sum of squares and the scaling.
// note: every load of a thread is issued before its first store: a store
// to the residual row would otherwise hold each next load of that row back
// by a full round trip (the compiler cannot tell the columns apart): one
// dependent trip per column a thread holds, 4 for a row of 1024 (ncu,
// Qwen3-0.6B batch-128 decode step: 4.9 us per launch for 128 rows of 1024
// before, 3.4 after).
template <class T, int kCached>
struct AddRmsNormRow {
  float v[kCached];   // the new residual's columns, as stored (rounded to T)
  float wv[kCached];  // their norm weights
  float inv;          // 1 / rms of the new residual row

  // Columns c = threadIdx.x + 256 i (i < kCached, c < cols) of
  // sum = residual + x, rounded to T, stored to sum_out where it is not
  // nullptr (it may be the residual row itself: the loads come first), and
  // the row's inverse rms. Columns past 256 kCached are summed from sum_out
  // (which then must be given). A block barrier (block_sum) orders the
  // stores before any later read of sum_out.
  __device__ __forceinline__ void run(const T* rr, const T* __restrict__ xr,
                                      const float* __restrict__ w, int cols, float eps, T* sum_out,
                                      float* red) {
    constexpr int step = kRowThreads;
    T ra[kCached], xa[kCached];
#pragma unroll
    for (int i = 0; i < kCached; ++i) {
      const int c = static_cast<int>(threadIdx.x) + i * step;
      if (c < cols) {
        ra[i] = rr[c];
        xa[i] = xr[c];
        wv[i] = w[c];
      }
    }
    float ss = 0.0f;
#pragma unroll
    for (int i = 0; i < kCached; ++i) {
      const int c = static_cast<int>(threadIdx.x) + i * step;
      if (c < cols) {
        const T sum = from_f<T>(to_f(ra[i]) + to_f(xa[i]));
        if (sum_out != nullptr) sum_out[c] = sum;  // note: the norm reads the residual as stored
        v[i] = to_f(sum);
        ss = rms_square_add(ss, v[i]);
      }
    }
    for (int c = static_cast<int>(threadIdx.x) + kCached * step; c < cols; c += step) {
      const T sum = from_f<T>(to_f(rr[c]) + to_f(xr[c]));
      sum_out[c] = sum;
      ss = rms_square_add(ss, to_f(sum));
    }
    ss = block_sum(ss, red);  // its barriers also order the stores above
    inv = rsqrtf(ss / static_cast<float>(cols) + eps);
  }

  // The normed value of the thread's cached column i.
  __device__ __forceinline__ T normed(int i) const { return from_f<T>(v[i] * inv * wv[i]); }
};

}  // namespace qtk::cuda::dev
