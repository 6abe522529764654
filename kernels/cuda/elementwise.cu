// Elementwise kernels: SwiGLU, sigmoid gate, GDN gates, embedding lookup,
// argmax with margin, dtype conversions.
#include <algorithm>
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
                                 const int32_t* __restrict__ ids, int64_t n, T* out, int64_t ldo,
                                 const int32_t* __restrict__ feed,
                                 const int32_t* __restrict__ fed_ids) {
  pdl_begin();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n * hidden) return;
  const int64_t r = i / hidden, c = i % hidden;
  const int32_t f = feed != nullptr ? feed[r] : -1;
  const int32_t id = f >= 0 ? fed_ids[f] : ids[r];
  out[r * ldo + c] = from_f<T>(to_f(table[static_cast<int64_t>(id) * hidden + c]));
}

struct Top2 {
  float best;
  int id;
  float second;
};

// note: a non-finite logit (NaN, +inf, -inf) never wins; it marks its row
// by a NaN `second`, which every later fold and merge keeps, so the row's
// margin comes out NaN, as the host's argmax_rows gives (kernels/argmax.h).
// Finite rows take exactly the comparisons they took without the marker.

// Merges two candidates; ties keep the lower id. Exact, so the result does not
// depend on the order of merging.
__device__ __forceinline__ Top2 merge(Top2 x, Top2 y) {
  const bool x_wins = x.best > y.best || (x.best == y.best && x.id < y.id);
  Top2 t = x_wins ? Top2{x.best, x.id, fmaxf(x.second, y.best)}
                  : Top2{y.best, y.id, fmaxf(y.second, x.best)};
  if (isnan(x.second) || isnan(y.second)) t.second = x.second + y.second;  // NaN
  return t;
}

// Folds logit v of column c into t: the same rule as merge(), so the result
// does not depend on the order in which a thread visits its columns.
__device__ __forceinline__ void fold(Top2& t, float v, int c) {
  if (!(fabsf(v) <= FLT_MAX)) {
    t.second = __int_as_float(0x7fffffff);  // NaN: the row's marker
  } else if (v > t.best || (v == t.best && c < t.id)) {
    if (!isnan(t.second)) t.second = t.best;
    t.best = v;
    t.id = c;
  } else if (!isnan(t.second)) {
    t.second = fmaxf(t.second, v);
  }
}

// The id a row's result stores: a row of only non-finite logits has no
// finite winner (id INT32_MAX, margin NaN); 0 keeps the id a valid token for
// the step a pipelined decode has already queued on it.
__device__ __forceinline__ int32_t stored_id(const Top2& t) { return t.id == INT32_MAX ? 0 : t.id; }

// This thread's top two of columns c0 .. c1-1 of a row: float4 groups,
// kUnroll of them (16 logits) in flight per iteration, when the row is
// 16-byte aligned and c0 a multiple of 4; then the rest one by one.
// note: a row of 151,936 logits took 32 us with one dependent 4-byte load
// per thread per iteration (latency-bound).
__device__ __forceinline__ Top2 scan_columns(const float* __restrict__ row, int64_t c0,
                                             int64_t c1) {
  constexpr int kUnroll = 4;
  Top2 t{-FLT_MAX, INT32_MAX, -FLT_MAX};
  int64_t scalar_from = c0;
  if (reinterpret_cast<uintptr_t>(row) % 16 == 0 && c0 % 4 == 0) {
    const int64_t g1 = c1 / 4;
    const float4* row4 = reinterpret_cast<const float4*>(row);
    const int64_t step = static_cast<int64_t>(blockDim.x);
    int64_t g = c0 / 4 + threadIdx.x;
    for (; g + (kUnroll - 1) * step < g1; g += kUnroll * step) {
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
    for (; g < g1; g += step) {
      const float4 v = row4[g];
      const int c = static_cast<int>(g * 4);
      fold(t, v.x, c);
      fold(t, v.y, c + 1);
      fold(t, v.z, c + 2);
      fold(t, v.w, c + 3);
    }
    scalar_from = g1 * 4;
  }
  for (int64_t c = scalar_from + threadIdx.x; c < c1; c += blockDim.x)
    fold(t, row[c], static_cast<int>(c));
  return t;
}

__device__ __forceinline__ Top2 warp_merge(Top2 t) {
  for (int o = 16; o > 0; o >>= 1) {
    Top2 u{__shfl_xor_sync(0xffffffffu, t.best, o), __shfl_xor_sync(0xffffffffu, t.id, o),
           __shfl_xor_sync(0xffffffffu, t.second, o)};
    t = merge(t, u);
  }
  return t;
}

// Block (blockIdx.x, row blockIdx.y): the top two of its seg columns; with
// one block per row the row's id and margin, else its part of the row.
// note: the parts exist for small batches: one block reading a 151,936-logit
// row from one SM took 12.8 us at batch 1, the split over 32 blocks ~3 us;
// merge() is exact and order-free, so the split changes no result.
__global__ void argmax_kernel(const float* __restrict__ logits, int64_t ld, int64_t vocab,
                              int64_t seg, int32_t* ids, float* margin, Top2* parts) {
  pdl_begin();
  __shared__ Top2 part[32];
  const float* row = logits + blockIdx.y * ld;
  const int64_t c0 = blockIdx.x * seg;
  Top2 t = warp_merge(scan_columns(row, c0, min(vocab, c0 + seg)));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) part[warp] = t;
  __syncthreads();
  if (threadIdx.x == 0) {
    Top2 r = part[0];
    for (int w = 1; w < static_cast<int>(blockDim.x >> 5); ++w) r = merge(r, part[w]);
    if (gridDim.x == 1) {
      ids[blockIdx.y] = stored_id(r);
      margin[blockIdx.y] = r.best - r.second;
    } else {
      parts[blockIdx.y * gridDim.x + blockIdx.x] = r;
    }
  }
}

// One warp per row: its `split` parts merged.
__global__ void argmax_merge_kernel(const Top2* __restrict__ parts, int split, int32_t* ids,
                                    float* margin) {
  pdl_begin();
  Top2 t{-FLT_MAX, INT32_MAX, -FLT_MAX};
  for (int s = threadIdx.x; s < split; s += 32) t = merge(t, parts[blockIdx.x * split + s]);
  t = warp_merge(t);
  if (threadIdx.x == 0) {
    ids[blockIdx.x] = stored_id(t);
    margin[blockIdx.x] = t.best - t.second;
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
                      int64_t n, T* out, int64_t ldo, cudaStream_t stream, const int32_t* feed,
                      const int32_t* fed_ids) {
  if (n * hidden == 0) return;
  const unsigned grid = grid_1d(n * hidden, kThreads);
  if (table_type == DType::BF16) {
    launch_kernel(embedding_kernel<T, bf16>, grid, kThreads, 0, stream,
                  static_cast<const bf16*>(table), hidden, ids, n, out, ldo, feed, fed_ids);
  } else if (table_type == DType::F32) {
    launch_kernel(embedding_kernel<T, float>, grid, kThreads, 0, stream,
                  static_cast<const float*>(table), hidden, ids, n, out, ldo, feed, fed_ids);
  } else {
    fail_message("embedding_lookup: table dtype " + std::string(dtype_name(table_type)) +
                 " is not supported (expected BF16 or F32)");
  }
}

namespace {
constexpr int64_t kArgmaxMaxSplit = 32;
// Blocks per row: enough for ~2 per SM of the H100 over the batch, each at
// least 4,096 logits.
int64_t argmax_split(int64_t rows, int64_t vocab) {
  return std::clamp<int64_t>(std::min(256 / rows, vocab / 4096), 1, kArgmaxMaxSplit);
}
}  // namespace

int64_t argmax_work_bytes(int64_t rows) {
  return rows * kArgmaxMaxSplit * static_cast<int64_t>(sizeof(Top2));
}

void argmax_rows(const float* logits, int64_t ld, int64_t rows, int64_t vocab, int32_t* ids,
                 float* margin, cudaStream_t stream, void* work) {
  if (rows == 0) return;
  if (rows > 65535) fail_message("argmax_rows: " + std::to_string(rows) + " rows is too many");
  const int64_t split = work != nullptr ? argmax_split(rows, vocab) : 1;
  if (split == 1) {
    launch_kernel(argmax_kernel, dim3(1, static_cast<unsigned>(rows)), 1024, 0, stream, logits, ld,
                  vocab, vocab, ids, margin, static_cast<Top2*>(nullptr));
    return;
  }
  // Segments a multiple of 4 columns, so aligned rows keep their float4 loads.
  const int64_t seg = ((vocab + split - 1) / split + 3) / 4 * 4;
  const int64_t blocks = (vocab + seg - 1) / seg;
  Top2* parts = static_cast<Top2*>(work);
  launch_kernel(argmax_kernel, dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(rows)),
                256, 0, stream, logits, ld, vocab, seg, ids, margin, parts);
  launch_kernel(argmax_merge_kernel, static_cast<unsigned>(rows), 32, 0, stream,
                static_cast<const Top2*>(parts), static_cast<int>(blocks), ids, margin);
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
                                    int64_t, cudaStream_t, const int32_t*, const int32_t*);
QTK_INSTANTIATE(float)
QTK_INSTANTIATE(bf16)
#undef QTK_INSTANTIATE

}  // namespace qtk::cuda
