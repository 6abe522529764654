// Causal depthwise conv1d over a varlen batch with per-slot state.
#include <string>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/launch.cuh"

namespace qtk::cuda {
namespace {

using namespace dev;
constexpr int kMaxKernel = 8;

// One term of a tap sum: both kernel forms below add the taps j = 0..K-1
// in order through this one expression, so they give the same bits.
__device__ __forceinline__ float conv_tap(float acc, float w, float x) {
  return __fmaf_rn(w, x, acc);
}

// y[t, c] = sum_j w[c, j] * xpad[i + j], xpad = [state (K-1 values), x of the
// sequence], i the token's index in this step's rows. The sum runs j = 0..K-1.
template <class T>
__global__ void conv1d_kernel(const T* __restrict__ x, int64_t ldx, T* __restrict__ y, int64_t ldy,
                              int channels, const float* __restrict__ w, int kernel,
                              const float* __restrict__ state_pool,
                              const int32_t* __restrict__ slot, const int32_t* __restrict__ q_start,
                              int num_seqs, int64_t tokens, bool apply_silu) {
  pdl_begin();
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= tokens * channels) return;
  const int t = static_cast<int>(idx / channels), c = static_cast<int>(idx % channels);
  const int s = find_seq(q_start, num_seqs, t);
  const int t0 = q_start[s], i = t - t0, km1 = kernel - 1;
  const float* st = state_pool + (static_cast<int64_t>(slot[s]) * channels + c) * km1;
  float acc = 0.0f;
  for (int j = 0; j < kernel; ++j) {
    const int p = i + j;
    const float xv = p < km1 ? st[p] : to_f(x[static_cast<int64_t>(t0 + p - km1) * ldx + c]);
    acc = conv_tap(acc, w[c * kernel + j], xv);
  }
  y[static_cast<int64_t>(t) * ldy + c] = from_f<T>(apply_silu ? silu(acc) : acc);
}

// The new state is the last K-1 values of xpad. Runs after conv1d_kernel (same
// stream), one thread per (sequence, channel), reading before writing.
template <class T>
__global__ void conv1d_state_kernel(const T* __restrict__ x, int64_t ldx, int channels, int kernel,
                                    float* state_pool, const int32_t* __restrict__ slot,
                                    const int32_t* __restrict__ q_start, int num_seqs) {
  pdl_begin();
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= static_cast<int64_t>(num_seqs) * channels) return;
  const int s = static_cast<int>(idx / channels), c = static_cast<int>(idx % channels);
  const int t0 = q_start[s], q_len = q_start[s + 1] - t0, km1 = kernel - 1;
  float* st = state_pool + (static_cast<int64_t>(slot[s]) * channels + c) * km1;
  float next[kMaxKernel];
  for (int m = 0; m < km1; ++m) {
    const int p = q_len + m;
    next[m] = p < km1 ? st[p] : to_f(x[static_cast<int64_t>(t0 + p - km1) * ldx + c]);
  }
  for (int m = 0; m < km1; ++m) st[m] = next[m];
}

// Both steps in one launch, for steps whose runs are short (decode steps:
// one token each): thread (sequence, channel) walks its run in order with the
// K-1 newest inputs of xpad in registers, writes each output as
// conv1d_kernel does (the same taps in the same order), then stores the
// window as the new state, reading nothing it has written.
// note: a thread's work grows with its run, hence only below
// kConvShortRunMax tokens; longer runs take the two kernels above, whose
// threads each produce one output.
template <class T>
__global__ void conv1d_short_runs_kernel(const T* __restrict__ x, int64_t ldx, T* __restrict__ y,
                                         int64_t ldy, int channels, const float* __restrict__ w,
                                         int kernel, float* state_pool,
                                         const int32_t* __restrict__ slot,
                                         const int32_t* __restrict__ q_start, int num_seqs,
                                         bool apply_silu) {
  pdl_begin();
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= static_cast<int64_t>(num_seqs) * channels) return;
  const int s = static_cast<int>(idx / channels), c = static_cast<int>(idx % channels);
  const int t0 = q_start[s], t1 = q_start[s + 1], km1 = kernel - 1;
  float* st = state_pool + (static_cast<int64_t>(slot[s]) * channels + c) * km1;
  float win[kMaxKernel], wc[kMaxKernel];
#pragma unroll
  for (int j = 0; j < kMaxKernel; ++j) {
    win[j] = j < km1 ? st[j] : 0.0f;
    wc[j] = j < kernel ? w[c * kernel + j] : 0.0f;
  }
  for (int t = t0; t < t1; ++t) {
    const float xv = to_f(x[static_cast<int64_t>(t) * ldx + c]);
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < kMaxKernel; ++j)
      if (j < kernel) acc = conv_tap(acc, wc[j], j < km1 ? win[j] : xv);
    y[static_cast<int64_t>(t) * ldy + c] = from_f<T>(apply_silu ? silu(acc) : acc);
#pragma unroll
    for (int j = 0; j + 1 < kMaxKernel; ++j)
      if (j < km1) win[j] = j + 1 < km1 ? win[j + 1] : xv;
  }
#pragma unroll
  for (int j = 0; j < kMaxKernel; ++j)
    if (j < km1) st[j] = win[j];
}

}  // namespace

template <class T>
void causal_conv1d(const T* x, int64_t ldx, T* y, int64_t ldy, int64_t channels, const float* w,
                   int64_t kernel, float* state_pool, const int32_t* slot, const int32_t* q_start,
                   int64_t num_seqs, int64_t tokens, int64_t max_run, bool apply_silu,
                   cudaStream_t stream) {
  if (kernel < 2 || kernel > kMaxKernel)
    fail_message("causal_conv1d: kernel size " + std::to_string(kernel) + " is outside 2.." +
                 std::to_string(kMaxKernel));
  if (num_seqs == 0) return;
  const int c = static_cast<int>(channels), k = static_cast<int>(kernel);
  if (max_run <= kConvShortRunMax) {
    launch_kernel(conv1d_short_runs_kernel<T>, grid_1d(num_seqs * channels, 256), 256, 0, stream, x,
                  ldx, y, ldy, c, w, k, state_pool, slot, q_start, static_cast<int>(num_seqs),
                  apply_silu);
    return;
  }
  if (tokens > 0) {
    launch_kernel(conv1d_kernel<T>, grid_1d(tokens * channels, 256), 256, 0, stream, x, ldx, y, ldy,
                  c, w, k, state_pool, slot, q_start, static_cast<int>(num_seqs), tokens,
                  apply_silu);
  }
  launch_kernel(conv1d_state_kernel<T>, grid_1d(num_seqs * channels, 256), 256, 0, stream, x, ldx,
                c, k, state_pool, slot, q_start, static_cast<int>(num_seqs));
}

template void causal_conv1d<float>(const float*, int64_t, float*, int64_t, int64_t, const float*,
                                   int64_t, float*, const int32_t*, const int32_t*, int64_t,
                                   int64_t, int64_t, bool, cudaStream_t);
template void causal_conv1d<bf16>(const bf16*, int64_t, bf16*, int64_t, int64_t, const float*,
                                  int64_t, float*, const int32_t*, const int32_t*, int64_t, int64_t,
                                  int64_t, bool, cudaStream_t);

}  // namespace qtk::cuda
