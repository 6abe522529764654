// RMSNorm variants, l2norm and the fused per-head norm + RoPE.
#include <string>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/rope.cuh"

namespace qtk::cuda {
namespace {

using namespace dev;

// note: one block of kRowThreads per row whatever the row count; thread t sums
// columns t, t+256, ... in order, then block_sum's fixed tree. The order thus
// depends on cols only.
// note: the fused add + RMSNorm in front of the GEMV (gemv_mma.cu) replays
// add_rmsnorm's order with 256 virtual threads: change both together
// (tests/cuda/test_gemv.cpp compares their bits).
constexpr int kRowThreads = 256;

template <class T>
__global__ void rmsnorm_kernel(const T* __restrict__ x, int64_t ldx, const float* __restrict__ w,
                               T* y, int64_t ldy, int cols, float eps) {
  pdl_begin();
  __shared__ float red[32];
  const T* xr = x + blockIdx.x * ldx;
  T* yr = y + blockIdx.x * ldy;
  float ss = 0.0f;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) {
    const float v = to_f(xr[c]);
    ss += v * v;
  }
  ss = block_sum(ss, red);
  const float inv = rsqrtf(ss / static_cast<float>(cols) + eps);
  for (int c = threadIdx.x; c < cols; c += blockDim.x) yr[c] = from_f<T>(to_f(xr[c]) * inv * w[c]);
}

// note: the first kCached columns of each thread stay in registers between
// the sum of squares and the scaling (no reload of the residual after the
// block barrier) and w is read before the barrier: the batch-1 decode step's
// 56 calls are latency-bound. Same arithmetic and order as before: thread t
// still sums its columns t, t+256, ... in increasing order.
// note: all of a thread's cached loads are issued before its first store.
// A store to the residual row would otherwise hold each next load of that
// row back by a full round trip (the compiler cannot tell the columns
// apart): one dependent trip per column a thread holds, 4 for a row of
// 1024 (ncu, Qwen3-0.6B batch-128 decode step: 4.9 us per launch for 128
// rows of 1024 before, 3.4 after).
// kCached: columns per thread in registers (cols <= 256 kCached fully), the
// fewest that hold the row (registers bound the rows in flight per SM).
template <class T, int kCached>
__global__ void add_rmsnorm_kernel(T* residual, int64_t ldr, const T* __restrict__ x, int64_t ldx,
                                   const float* __restrict__ w, T* y, int64_t ldy, int cols,
                                   float eps) {
  pdl_begin();
  constexpr int step = kRowThreads;
  __shared__ float red[32];
  T* rr = residual + blockIdx.x * ldr;
  const T* xr = x + blockIdx.x * ldx;
  T* yr = y + blockIdx.x * ldy;
  T ra[kCached], xa[kCached];
  float v[kCached], wv[kCached];
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
      rr[c] = sum;  // note: the norm reads the residual as stored (rounded to T)
      v[i] = to_f(sum);
      ss = rms_square_add(ss, v[i]);
    }
  }
  for (int c = static_cast<int>(threadIdx.x) + kCached * step; c < cols; c += step) {
    const T sum = from_f<T>(to_f(rr[c]) + to_f(xr[c]));
    rr[c] = sum;
    ss = rms_square_add(ss, to_f(sum));
  }
  ss = block_sum(ss, red);  // its barriers also order the stores above
  const float inv = rsqrtf(ss / static_cast<float>(cols) + eps);
#pragma unroll
  for (int i = 0; i < kCached; ++i) {
    const int c = static_cast<int>(threadIdx.x) + i * step;
    if (c < cols) yr[c] = from_f<T>(v[i] * inv * wv[i]);
  }
  for (int c = static_cast<int>(threadIdx.x) + kCached * step; c < cols; c += step)
    yr[c] = from_f<T>(to_f(rr[c]) * inv * w[c]);
}

// One warp per (token, head) row of head_dim <= 256 values.
constexpr int kWarpsPerBlock = 4;
constexpr int kMaxHeadDim = 256;

template <class T>
__global__ void gated_rmsnorm_kernel(const T* __restrict__ x, int64_t ldx, const T* __restrict__ z,
                                     int64_t ldz, const float* __restrict__ w, T* y, int64_t ldy,
                                     int64_t rows, int heads, int dim, float eps) {
  pdl_begin();
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (row >= rows) return;
  const int lane = threadIdx.x & 31;
  const int64_t t = row / heads, h = row % heads;
  const T* xr = x + t * ldx + h * dim;
  const T* zr = z + t * ldz + h * dim;
  T* yr = y + t * ldy + h * dim;
  const float inv = gated_norm_inv([&](int c) { return to_f(xr[c]); }, dim, eps);
  for (int c = lane; c < dim; c += 32)
    yr[c] = from_f<T>(gated_norm_out(w[c], to_f(xr[c]), inv, to_f(zr[c])));
}

template <class T>
__global__ void l2norm_kernel(T* x, int64_t ld, int64_t rows, int heads, int dim, float eps,
                              float scale) {
  pdl_begin();
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (row >= rows) return;
  const int lane = threadIdx.x & 31;
  T* xr = x + (row / heads) * ld + (row % heads) * dim;
  float ss = 0.0f;
  for (int c = lane; c < dim; c += 32) {
    const float v = to_f(xr[c]);
    ss += v * v;
  }
  const float inv = rsqrtf(warp_sum(ss) + eps) * scale;
  for (int c = lane; c < dim; c += 32) xr[c] = from_f<T>(to_f(xr[c]) * inv);
}

__global__ void rope_table_kernel(float2* table, int64_t positions, RopeParams rope) {
  pdl_begin();
  const int half = static_cast<int>(rope.rotary_dim / 2);
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= positions * half) return;
  table[i] = rope_cos_sin(static_cast<int>(i % half), static_cast<int32_t>(i / half), rope);
}

// One (token, head) row of head_dim values, by one warp: optional RMSNorm,
// then RoPE, written back in place. v: the warp's f32 scratch [dim]; it
// ends holding the row as stored (each value rounded to T).
// note: dev::norm_lane + dev::rope_lane (rope.cuh, the fused decode attention) do the
// same operations in the same order with the row in registers; the two are
// compared bit for bit (tests/cuda/test_attention.cpp). Tried in S6: this
// function on that register form; the batch-128 Qwen3-0.6B step was ~3%
// slower, so it keeps its own.
// note: every load is issued before any value is used: the row, the norm
// weights, and the (cos, sin) of the lane's rotate_half pairs (position,
// then table), instead of one dependent round trip after another; a row
// per warp is latency-bound. The arithmetic and its order are unchanged.
// kPer: columns per lane (lane + 32 i), dim <= 32 kPer.
template <class T, int kPer>
__device__ __forceinline__ void norm_rope_row(T* xr, int dim, const float* __restrict__ norm_w,
                                              float eps, const int32_t* __restrict__ positions,
                                              int64_t tokens, int64_t t, const RopeParams& rope,
                                              float* v) {
  constexpr int kPairs = kPer / 2;  // rotate_half pairs per lane: j = lane + 32 p
  const int lane = threadIdx.x & 31;
  const int rd = static_cast<int>(rope.rotary_dim), half = rd / 2;
  T xa[kPer];
  float nw[kPer];
  float2 cs[kPairs];
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int c = lane + 32 * i;
    if (c < dim) {
      xa[i] = xr[c];
      nw[i] = norm_w != nullptr ? norm_w[c] : 0.0f;
    }
  }
  // rope_cos_sin_at in two rounds of independent loads (every position,
  // then every table entry); positions off the table are computed below.
  int32_t pos[kPairs];
#pragma unroll
  for (int p = 0; p < kPairs; ++p)
    if (lane + 32 * p < half) pos[p] = positions[rope_axis(lane + 32 * p, rope) * tokens + t];
#pragma unroll
  for (int p = 0; p < kPairs; ++p)
    if (lane + 32 * p < half && pos[p] >= 0 && pos[p] < rope.table_positions)
      cs[p] = rope.table[static_cast<int64_t>(pos[p]) * half + lane + 32 * p];
  float ss = 0.0f;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int c = lane + 32 * i;
    if (c < dim) {
      const float a = to_f(xa[i]);
      v[c] = a;
      ss += a * a;
    }
  }
  if (norm_w != nullptr) {
    const float inv = rsqrtf(warp_sum(ss) / static_cast<float>(dim) + eps);
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int c = lane + 32 * i;
      if (c < dim) v[c] = v[c] * inv * nw[i];
    }
  }
  __syncwarp();
#pragma unroll
  for (int p = 0; p < kPairs; ++p) {
    const int j = lane + 32 * p;
    if (j >= half) continue;
    if (pos[p] < 0 || pos[p] >= rope.table_positions) cs[p] = rope_cos_sin(j, pos[p], rope);
    const double cf = cs[p].x, sf = cs[p].y;
    const double a = v[j], b = v[j + half];
    const T lo = from_f<T>(static_cast<float>(a * cf - b * sf));
    const T hi = from_f<T>(static_cast<float>(b * cf + a * sf));
    xr[j] = lo;
    xr[j + half] = hi;
    v[j] = to_f(lo);
    v[j + half] = to_f(hi);
  }
  for (int c = rd + lane; c < dim; c += 32) {
    const T y = from_f<T>(v[c]);
    xr[c] = y;
    v[c] = to_f(y);
  }
}

template <class T, int kPer>
__global__ void qk_norm_rope_kernel(T* x, int64_t ld, int64_t rows, int heads, int dim,
                                    const float* __restrict__ norm_w, float eps,
                                    const int32_t* __restrict__ positions, int64_t tokens,
                                    RopeParams rope) {
  pdl_begin();
  __shared__ float buf[kWarpsPerBlock][kMaxHeadDim];
  const int warp = threadIdx.x >> 5;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + warp;
  if (row >= rows) return;
  const int64_t t = row / heads;
  norm_rope_row<T, kPer>(x + t * ld + (row % heads) * dim, dim, norm_w, eps, positions, tokens, t,
                         rope, buf[warp]);
}

// The fused attention-input step: per token, the hq query heads (q_norm +
// RoPE in place), the hkv key heads (k_norm + RoPE in place, then copied to
// the cache) and the hkv value heads (copied to the cache). Each value is
// computed exactly as by qk_norm_rope and kv_cache_write.
template <class T, int kPer>
__global__ void qkv_rope_cache_kernel(T* qkv, int64_t ld, int64_t rows, int hq, int hkv, int dim,
                                      const float* __restrict__ q_norm_w,
                                      const float* __restrict__ k_norm_w, float eps,
                                      const int32_t* __restrict__ positions, int64_t tokens,
                                      RopeParams rope, const int64_t* __restrict__ slot_mapping,
                                      T* k_cache, T* v_cache) {
  pdl_begin();
  __shared__ float buf[kWarpsPerBlock][kMaxHeadDim];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + warp;
  if (row >= rows) return;
  const int per_token = hq + 2 * hkv;
  const int64_t t = row / per_token;
  const int hh = static_cast<int>(row % per_token);
  T* xr = qkv + t * ld + static_cast<int64_t>(hh) * dim;
  // note: the cache slot is read before the row's work, not after it (one
  // dependent round trip less); the value rows are loaded whole before
  // their first store (the cache and the row may alias, as far as the
  // compiler knows).
  const int64_t slot = hh < hq ? -1 : slot_mapping[t];
  auto cache_row = [&] {
    const int kvh = (hh - hq) % hkv;
    return (hh < hq + hkv ? k_cache : v_cache) + slot * static_cast<int64_t>(hkv) * dim +
           static_cast<int64_t>(kvh) * dim;
  };
  if (hh >= hq + hkv) {
    if (slot < 0) return;  // a padding row (graph buckets) writes nothing
    T* dst = cache_row();
    T xa[kPer];
#pragma unroll
    for (int i = 0; i < kPer; ++i)
      if (lane + 32 * i < dim) xa[i] = xr[lane + 32 * i];
#pragma unroll
    for (int i = 0; i < kPer; ++i)
      if (lane + 32 * i < dim) dst[lane + 32 * i] = xa[i];
    return;
  }
  norm_rope_row<T, kPer>(xr, dim, hh < hq ? q_norm_w : k_norm_w, eps, positions, tokens, t, rope,
                         buf[warp]);
  if (hh < hq || slot < 0) return;  // slot < 0: a padding row writes nothing
  __syncwarp();                     // the row's lanes finished writing buf[warp]
  // The key as stored in the row: norm_rope_row leaves it in buf (exact).
  T* dst = cache_row();
  for (int c = lane; c < dim; c += 32) dst[c] = from_f<T>(buf[warp][c]);
}

}  // namespace

template <class T>
void rmsnorm(const T* x, int64_t ldx, const float* w, T* y, int64_t ldy, int64_t rows, int64_t cols,
             float eps, cudaStream_t stream) {
  if (rows == 0) return;
  launch_kernel(rmsnorm_kernel<T>, static_cast<unsigned>(rows), kRowThreads, 0, stream, x, ldx, w,
                y, ldy, static_cast<int>(cols), eps);
}

void rope_table_build(float2* table, int64_t positions, const RopeParams& rope,
                      cudaStream_t stream) {
  const int64_t n = positions * (rope.rotary_dim / 2);
  if (n <= 0) return;
  RopeParams p = rope;
  p.table = nullptr;
  p.table_positions = 0;
  launch_kernel(rope_table_kernel, grid_1d(n, 256), 256, 0, stream, table, positions, p);
}

template <class T>
void add_rmsnorm(T* residual, int64_t ldr, const T* x, int64_t ldx, const float* w, T* y,
                 int64_t ldy, int64_t rows, int64_t cols, float eps, cudaStream_t stream) {
  if (rows == 0) return;
  const auto kernel = cols <= 4 * kRowThreads   ? add_rmsnorm_kernel<T, 4>
                      : cols <= 8 * kRowThreads ? add_rmsnorm_kernel<T, 8>
                                                : add_rmsnorm_kernel<T, 16>;
  launch_kernel(kernel, static_cast<unsigned>(rows), kRowThreads, 0, stream, residual, ldr, x, ldx,
                w, y, ldy, static_cast<int>(cols), eps);
}

template <class T>
void gated_rmsnorm(const T* x, int64_t ldx, const T* z, int64_t ldz, const float* w, T* y,
                   int64_t ldy, int64_t tokens, int64_t heads, int64_t head_dim, float eps,
                   cudaStream_t stream) {
  const int64_t rows = tokens * heads;
  if (rows == 0) return;
  launch_kernel(gated_rmsnorm_kernel<T>, grid_1d(rows, kWarpsPerBlock), 32 * kWarpsPerBlock, 0,
                stream, x, ldx, z, ldz, w, y, ldy, rows, static_cast<int>(heads),
                static_cast<int>(head_dim), eps);
}

template <class T>
void l2norm_heads(T* x, int64_t ld, int64_t tokens, int64_t heads, int64_t head_dim, float eps,
                  float scale, cudaStream_t stream) {
  const int64_t rows = tokens * heads;
  if (rows == 0) return;
  launch_kernel(l2norm_kernel<T>, grid_1d(rows, kWarpsPerBlock), 32 * kWarpsPerBlock, 0, stream, x,
                ld, rows, static_cast<int>(heads), static_cast<int>(head_dim), eps, scale);
}

template <class T>
void qk_norm_rope(T* x, int64_t ld, int64_t tokens, int64_t heads, int64_t head_dim,
                  const float* norm_w, float eps, const int32_t* positions, const RopeParams& rope,
                  cudaStream_t stream) {
  if (head_dim > kMaxHeadDim || rope.rotary_dim > head_dim || rope.rotary_dim % 2 != 0)
    fail_message("qk_norm_rope: head_dim " + std::to_string(head_dim) + " (at most " +
                 std::to_string(kMaxHeadDim) + ") with rotary_dim " +
                 std::to_string(rope.rotary_dim) + " (even, <= head_dim) is not supported");
  const int64_t rows = tokens * heads;
  if (rows == 0) return;
  launch_kernel(head_dim <= 128 ? qk_norm_rope_kernel<T, 4> : qk_norm_rope_kernel<T, 8>,
                grid_1d(rows, kWarpsPerBlock), 32 * kWarpsPerBlock, 0, stream, x, ld, rows,
                static_cast<int>(heads), static_cast<int>(head_dim), norm_w, eps, positions, tokens,
                rope);
}

template <class T>
void qkv_rope_cache(T* qkv, int64_t ld, int64_t tokens, int64_t hq, int64_t hkv, int64_t head_dim,
                    const float* q_norm_w, const float* k_norm_w, float eps,
                    const int32_t* positions, const RopeParams& rope, const int64_t* slot_mapping,
                    T* k_cache, T* v_cache, cudaStream_t stream) {
  if (head_dim > kMaxHeadDim || rope.rotary_dim > head_dim || rope.rotary_dim % 2 != 0)
    fail_message("qkv_rope_cache: head_dim " + std::to_string(head_dim) + " (at most " +
                 std::to_string(kMaxHeadDim) + ") with rotary_dim " +
                 std::to_string(rope.rotary_dim) + " (even, <= head_dim) is not supported");
  const int64_t rows = tokens * (hq + 2 * hkv);
  if (rows == 0) return;
  launch_kernel(head_dim <= 128 ? qkv_rope_cache_kernel<T, 4> : qkv_rope_cache_kernel<T, 8>,
                grid_1d(rows, kWarpsPerBlock), 32 * kWarpsPerBlock, 0, stream, qkv, ld, rows,
                static_cast<int>(hq), static_cast<int>(hkv), static_cast<int>(head_dim), q_norm_w,
                k_norm_w, eps, positions, tokens, rope, slot_mapping, k_cache, v_cache);
}

#define QTK_INSTANTIATE(T)                                                                         \
  template void rmsnorm<T>(const T*, int64_t, const float*, T*, int64_t, int64_t, int64_t, float,  \
                           cudaStream_t);                                                          \
  template void add_rmsnorm<T>(T*, int64_t, const T*, int64_t, const float*, T*, int64_t, int64_t, \
                               int64_t, float, cudaStream_t);                                      \
  template void gated_rmsnorm<T>(const T*, int64_t, const T*, int64_t, const float*, T*, int64_t,  \
                                 int64_t, int64_t, int64_t, float, cudaStream_t);                  \
  template void l2norm_heads<T>(T*, int64_t, int64_t, int64_t, int64_t, float, float,              \
                                cudaStream_t);                                                     \
  template void qk_norm_rope<T>(T*, int64_t, int64_t, int64_t, int64_t, const float*, float,       \
                                const int32_t*, const RopeParams&, cudaStream_t);                  \
  template void qkv_rope_cache<T>(T*, int64_t, int64_t, int64_t, int64_t, int64_t, const float*,   \
                                  const float*, float, const int32_t*, const RopeParams&,          \
                                  const int64_t*, T*, T*, cudaStream_t);
QTK_INSTANTIATE(float)
QTK_INSTANTIATE(bf16)
#undef QTK_INSTANTIATE

}  // namespace qtk::cuda
