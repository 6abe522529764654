// Elementwise kernels: SwiGLU, sigmoid gate, GDN gates, embedding lookup,
// argmax with margin, dtype conversions.
#include <cfloat>

#include <string>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/launch.cuh"

namespace qtk::cuda {
namespace {

using namespace dev;
constexpr int kThreads = 256;

// One thread per kSwigluPer consecutive columns of a token row (grid: x =
// tokens, y = column blocks); with `vec` (bf16, 16-byte aligned rows) the
// gate, up and output columns move as one 16-byte access each.
// note: the element formula is the scalar one, so the bits do not change;
// at the prefill's 8192 tokens the one-thread-per-element form with int64
// division ran at ~1.2 TB/s (121 us per call, 11 % of the step).
constexpr int kSwigluPer = 8;

template <class T>
__global__ void swiglu_kernel(const T* __restrict__ gate_up, int64_t ld, T* __restrict__ out,
                              int64_t ldo, int inter, bool vec) {
  pdl_begin();
  const int c0 = (blockIdx.y * blockDim.x + threadIdx.x) * kSwigluPer;
  if (c0 >= inter) return;
  const T* g = gate_up + static_cast<int64_t>(blockIdx.x) * ld;
  const T* u = g + inter;
  T* o = out + static_cast<int64_t>(blockIdx.x) * ldo;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    if (vec) {
      const uint4 gv = *reinterpret_cast<const uint4*>(g + c0);
      const uint4 uv = *reinterpret_cast<const uint4*>(u + c0);
      const auto* gh = reinterpret_cast<const T*>(&gv);
      const auto* uh = reinterpret_cast<const T*>(&uv);
      uint4 ov;
      auto* oh = reinterpret_cast<T*>(&ov);
#pragma unroll
      for (int j = 0; j < kSwigluPer; ++j) oh[j] = from_f<T>(silu(to_f(gh[j])) * to_f(uh[j]));
      *reinterpret_cast<uint4*>(o + c0) = ov;
      return;
    }
  }
  for (int c = c0; c < c0 + kSwigluPer && c < inter; ++c)
    o[c] = from_f<T>(silu(to_f(g[c])) * to_f(u[c]));
}

template <class T>
__global__ void sigmoid_mul_kernel(T* x, int64_t ldx, const T* __restrict__ gate, int64_t ldg,
                                   int64_t rows, int64_t cols) {
  pdl_begin();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * cols) return;
  const int64_t r = i / cols, c = i % cols;
  x[r * ldx + c] = from_f<T>(to_f(x[r * ldx + c]) * sigmoid(to_f(gate[r * ldg + c])));
}

template <class T>
__global__ void gdn_gates_kernel(const T* __restrict__ a, int64_t lda, const T* __restrict__ b,
                                 int64_t ldb, const float* __restrict__ A,
                                 const float* __restrict__ dt_bias, float* g, float* beta,
                                 int64_t tokens, int64_t hv) {
  pdl_begin();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= tokens * hv) return;
  const int64_t t = i / hv, h = i % hv;
  gdn_gate_values(to_f(a[t * lda + h]), to_f(b[t * ldb + h]), A[h], dt_bias[h], g[i], beta[i]);
}

template <class T, class Table>
__global__ void embedding_kernel(const Table* __restrict__ table, int64_t hidden,
                                 const int32_t* __restrict__ ids, int64_t n, T* out, int64_t ldo) {
  pdl_begin();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n * hidden) return;
  const int64_t r = i / hidden, c = i % hidden;
  out[r * ldo + c] = from_f<T>(to_f(table[static_cast<int64_t>(ids[r]) * hidden + c]));
}

struct Top2 {
  float best;
  int id;
  float second;
};

// Merges two candidates; ties keep the lower id. Exact, so the result does not
// depend on the order of merging.
__device__ __forceinline__ Top2 merge(Top2 x, Top2 y) {
  const bool x_wins = x.best > y.best || (x.best == y.best && x.id < y.id);
  if (x_wins) return {x.best, x.id, fmaxf(x.second, y.best)};
  return {y.best, y.id, fmaxf(y.second, x.best)};
}

// Folds logit v of column c into t: the same rule as merge(), so the result
// does not depend on the order in which a thread visits its columns.
__device__ __forceinline__ void fold(Top2& t, float v, int c) {
  if (v > t.best || (v == t.best && c < t.id)) {
    t.second = t.best;
    t.best = v;
    t.id = c;
  } else {
    t.second = fmaxf(t.second, v);
  }
}

// note: one block of 1024 threads per row. A thread reads its columns as
// float4 groups, kUnroll groups (16 logits) in flight per iteration when the
// row is 16-byte aligned: a row of 151,936 logits took 32 us with one
// dependent 4-byte load per thread per iteration (latency-bound), the
// batch-1 decode step's largest fixed cost after lm_head.
__global__ void argmax_kernel(const float* __restrict__ logits, int64_t ld, int64_t vocab,
                              int32_t* ids, float* margin) {
  pdl_begin();
  constexpr int kUnroll = 4;
  __shared__ Top2 part[32];
  const float* row = logits + blockIdx.x * ld;
  Top2 t{-FLT_MAX, INT32_MAX, -FLT_MAX};
  int64_t scalar_from = 0;
  if (reinterpret_cast<uintptr_t>(row) % 16 == 0) {
    const int64_t groups = vocab / 4;
    const float4* row4 = reinterpret_cast<const float4*>(row);
    const int64_t step = static_cast<int64_t>(blockDim.x);
    int64_t g = threadIdx.x;
    for (; g + (kUnroll - 1) * step < groups; g += kUnroll * step) {
      float4 v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) v[u] = row4[g + u * step];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int c = static_cast<int>((g + u * step) * 4);
        fold(t, v[u].x, c);
        fold(t, v[u].y, c + 1);
        fold(t, v[u].z, c + 2);
        fold(t, v[u].w, c + 3);
      }
    }
    for (; g < groups; g += step) {
      const float4 v = row4[g];
      const int c = static_cast<int>(g * 4);
      fold(t, v.x, c);
      fold(t, v.y, c + 1);
      fold(t, v.z, c + 2);
      fold(t, v.w, c + 3);
    }
    scalar_from = groups * 4;
  }
  for (int64_t c = scalar_from + threadIdx.x; c < vocab; c += blockDim.x)
    fold(t, row[c], static_cast<int>(c));
  for (int o = 16; o > 0; o >>= 1) {
    Top2 u{__shfl_xor_sync(0xffffffffu, t.best, o), __shfl_xor_sync(0xffffffffu, t.id, o),
           __shfl_xor_sync(0xffffffffu, t.second, o)};
    t = merge(t, u);
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) part[warp] = t;
  __syncthreads();
  if (threadIdx.x == 0) {
    Top2 r = part[0];
    for (int w = 1; w < static_cast<int>(blockDim.x >> 5); ++w) r = merge(r, part[w]);
    ids[blockIdx.x] = r.id;
    margin[blockIdx.x] = r.best - r.second;
  }
}

__global__ void f32_to_bf16_kernel(const float* __restrict__ x, __nv_bfloat16* y, int64_t n) {
  pdl_begin();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = __float2bfloat16_rn(x[i]);
}
__global__ void bf16_to_f32_kernel(const __nv_bfloat16* __restrict__ x, float* y, int64_t n) {
  pdl_begin();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = __bfloat162float(x[i]);
}

}  // namespace

template <class T>
void swiglu(const T* gate_up, int64_t ld, T* out, int64_t ldo, int64_t tokens, int64_t inter,
            cudaStream_t stream) {
  if (tokens * inter == 0) return;
  if (tokens > INT32_MAX || inter > INT32_MAX / 2)
    fail_message("swiglu: " + std::to_string(tokens) + " tokens x " + std::to_string(inter) +
                 " columns is too large");
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const bool vec = std::is_same_v<T, bf16> && ld % 8 == 0 && ldo % 8 == 0 && inter % 8 == 0 &&
                   aligned(gate_up) && aligned(out);
  const dim3 grid(
      static_cast<unsigned>(tokens),
      static_cast<unsigned>((inter + kThreads * kSwigluPer - 1) / (kThreads * kSwigluPer)));
  launch_kernel(swiglu_kernel<T>, grid, kThreads, 0, stream, gate_up, ld, out, ldo,
                static_cast<int>(inter), vec);
}

template <class T>
void sigmoid_mul(T* x, int64_t ldx, const T* gate, int64_t ldg, int64_t rows, int64_t cols,
                 cudaStream_t stream) {
  if (rows * cols == 0) return;
  launch_kernel(sigmoid_mul_kernel<T>, grid_1d(rows * cols, kThreads), kThreads, 0, stream, x, ldx,
                gate, ldg, rows, cols);
}

template <class T>
void gdn_gates(const T* a, int64_t lda, const T* b, int64_t ldb, const float* A,
               const float* dt_bias, float* g, float* beta, int64_t tokens, int64_t hv,
               cudaStream_t stream) {
  if (tokens * hv == 0) return;
  launch_kernel(gdn_gates_kernel<T>, grid_1d(tokens * hv, kThreads), kThreads, 0, stream, a, lda, b,
                ldb, A, dt_bias, g, beta, tokens, hv);
}

template <class T>
void embedding_lookup(const void* table, DType table_type, int64_t hidden, const int32_t* ids,
                      int64_t n, T* out, int64_t ldo, cudaStream_t stream) {
  if (n * hidden == 0) return;
  const unsigned grid = grid_1d(n * hidden, kThreads);
  if (table_type == DType::BF16) {
    launch_kernel(embedding_kernel<T, bf16>, grid, kThreads, 0, stream,
                  static_cast<const bf16*>(table), hidden, ids, n, out, ldo);
  } else if (table_type == DType::F32) {
    launch_kernel(embedding_kernel<T, float>, grid, kThreads, 0, stream,
                  static_cast<const float*>(table), hidden, ids, n, out, ldo);
  } else {
    fail_message("embedding_lookup: table dtype " + std::string(dtype_name(table_type)) +
                 " is not supported (expected BF16 or F32)");
  }
}

void argmax_rows(const float* logits, int64_t ld, int64_t rows, int64_t vocab, int32_t* ids,
                 float* margin, cudaStream_t stream) {
  if (rows == 0) return;
  launch_kernel(argmax_kernel, static_cast<unsigned>(rows), 1024, 0, stream, logits, ld, vocab, ids,
                margin);
}

void convert_f32_to_bf16(const float* x, bf16* y, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  launch_kernel(f32_to_bf16_kernel, grid_1d(n, kThreads), kThreads, 0, stream, x, y, n);
}
void convert_bf16_to_f32(const bf16* x, float* y, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  launch_kernel(bf16_to_f32_kernel, grid_1d(n, kThreads), kThreads, 0, stream, x, y, n);
}

#define QTK_INSTANTIATE(T)                                                                      \
  template void swiglu<T>(const T*, int64_t, T*, int64_t, int64_t, int64_t, cudaStream_t);      \
  template void sigmoid_mul<T>(T*, int64_t, const T*, int64_t, int64_t, int64_t, cudaStream_t); \
  template void gdn_gates<T>(const T*, int64_t, const T*, int64_t, const float*, const float*,  \
                             float*, float*, int64_t, int64_t, cudaStream_t);                   \
  template void embedding_lookup<T>(const void*, DType, int64_t, const int32_t*, int64_t, T*,   \
                                    int64_t, cudaStream_t);
QTK_INSTANTIATE(float)
QTK_INSTANTIATE(bf16)
#undef QTK_INSTANTIATE

}  // namespace qtk::cuda
