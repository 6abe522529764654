// Device helpers shared by the kernels: element conversion, fixed-order block
// reductions, the token -> sequence lookup of varlen batches.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace qtk::cuda::dev {

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }

template <class T>
__device__ __forceinline__ T from_f(float x);
template <>
__device__ __forceinline__ float from_f<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// Programmatic dependent launch (kernels/cuda/launch.cuh): wait until the
// previous kernel of the stream has completed and its writes are visible,
// then allow the next kernel to be launched. Every kernel started through
// launch_kernel() calls this before touching activations and before any return.
// note: compiled out below sm_90 (launch_kernel() sets the attribute only on 9.0).
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_begin() {
  pdl_wait();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// Thread-block clusters (launch_kernel_clusters, sm_90): a barrier over
// every thread of the cluster's blocks, whose shared-memory writes before it
// are visible to the cluster's loads after it; and a load of `local`'s
// counterpart in the shared memory of the cluster's block `rank`.
// note: compiled out below sm_90, where no cluster launch happens.
__device__ __forceinline__ void cluster_barrier() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "barrier.cluster.arrive.release.aligned;\n"
      "barrier.cluster.wait.acquire.aligned;\n" ::
          : "memory");
#endif
}
__device__ __forceinline__ float cluster_load(const float* local, unsigned rank) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(local));
  uint32_t remote = 0;
  float v = 0.0f;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(a), "r"(rank));
  asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(v) : "r"(remote) : "memory");
  return v;
#else
  return *local;
#endif
}

// The warp asks L2 for `bytes` from p (a 128-byte line a lane at a time):
// for constants (weights) a kernel will read after its dependency wait.
__device__ __forceinline__ void warp_prefetch_l2(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (int64_t off = (threadIdx.x & 31) * 128; off < bytes; off += 32 * 128)
    asm volatile("prefetch.global.L2 [%0];" ::"l"(c + off));
}

__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// The GDN gates of one (token, value head): g = A * softplus(a + dt_bias)
// (softplus(x) = x for x > 20, like torch) and beta = sigmoid(b); shared by
// gdn_gates and the fused recurrent kernel so that both give the same bits.
__device__ __forceinline__ void gdn_gate_values(float a, float b, float A, float dt_bias, float& g,
                                                float& beta) {
  const float x = a + dt_bias;
  const float sp = x > 20.0f ? x : log1pf(expf(x));
  g = A * sp;
  beta = sigmoid(b);
}

// One step of a sum of squares: ss + v * v with one rounding. Every RMSNorm
// whose bits another kernel must reproduce (add_rmsnorm, the fused norm of
// gemv_mma.cu) accumulates through this.
__device__ __forceinline__ float rms_square_add(float ss, float v) { return __fmaf_rn(v, v, ss); }

// note: xor butterfly: every lane ends with the same value, and the order of
// the additions depends only on the warp size, never on the data or the grid.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// The gated RMSNorm of Qwen3.5's linear attention, one (token, head) row of
// `dim` values by one warp: x(c) gives value c as stored; the sum of squares
// of lane l over c = l, l + 32, ... in order, then warp_sum. gated_rmsnorm
// and the recurrent GDN kernel's fused norm both go through these two, so
// they give the same bits.
template <class Load>
__device__ __forceinline__ float gated_norm_inv(Load x, int dim, float eps) {
  float ss = 0.0f;
  for (int c = static_cast<int>(threadIdx.x & 31); c < dim; c += 32) ss = rms_square_add(ss, x(c));
  return rsqrtf(warp_sum(ss) / static_cast<float>(dim) + eps);
}
__device__ __forceinline__ float gated_norm_out(float w, float x, float inv, float z) {
  return w * (x * inv) * silu(z);
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Block-wide sum with a fixed order: each warp's butterfly, then the warp
// totals added in warp order by every thread. blockDim.x must be a multiple
// of 32; `red` holds at least 32 floats. All threads get the result.
__device__ __forceinline__ float block_sum(float v, float* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // protects `red` from a previous use
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float s = 0.0f;
  for (int w = 0; w < nw; ++w) s += red[w];
  return s;
}
__device__ __forceinline__ float block_max(float v, float* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float m = red[0];
  for (int w = 1; w < nw; ++w) m = fmaxf(m, red[w]);
  return m;
}

// The sequence owning token row t: the last s with q_start[s] <= t.
__device__ __forceinline__ int find_seq(const int32_t* q_start, int num_seqs, int t) {
  int lo = 0, hi = num_seqs - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (q_start[mid] <= t)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

}  // namespace qtk::cuda::dev

namespace qtk::cuda {
inline unsigned grid_1d(int64_t n, int threads) {
  return static_cast<unsigned>((n + threads - 1) / threads);
}
}  // namespace qtk::cuda
