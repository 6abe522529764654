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
    acc += w[c * kernel + j] * xv;
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

}  // namespace

template <class T>
void causal_conv1d(const T* x, int64_t ldx, T* y, int64_t ldy, int64_t channels, const float* w,
                   int64_t kernel, float* state_pool, const int32_t* slot, const int32_t* q_start,
                   int64_t num_seqs, int64_t tokens, bool apply_silu, cudaStream_t stream) {
  if (kernel < 2 || kernel > kMaxKernel)
    fail_message("causal_conv1d: kernel size " + std::to_string(kernel) + " is outside 2.." +
                 std::to_string(kMaxKernel));
  if (num_seqs == 0) return;
  const int c = static_cast<int>(channels), k = static_cast<int>(kernel);
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
                                   int64_t, bool, cudaStream_t);
template void causal_conv1d<bf16>(const bf16*, int64_t, bf16*, int64_t, int64_t, const float*,
                                  int64_t, float*, const int32_t*, const int32_t*, int64_t, int64_t,
                                  bool, cudaStream_t);

}  // namespace qtk::cuda
