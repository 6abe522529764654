#include "kernels/cuda/moe.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <climits>
#include <string>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.cuh"

namespace qtk::cuda {

namespace {

using namespace dev;
using bf16 = __nv_bfloat16;

constexpr int kMaxExperts = 4096;
constexpr int kMaxTopK = 32;

// (p, e) is ahead of (bp, be) in the top-k order: larger probability, ties
// to the lower expert index. A total order, so any reduction tree picks the
// same winner.
__device__ __forceinline__ bool ahead(float p, int e, float bp, int be) {
  return p > bp || (p == bp && e < be);
}

// One block per token: the softmax over its E logits (fixed-order block
// reductions), then k rounds of a block-wide arg-max.
__global__ void moe_route_kernel(const float* __restrict__ logits, int64_t ld, int E, int k,
                                 bool renormalize, int32_t* __restrict__ ids,
                                 float* __restrict__ weights) {
  pdl_begin();
  extern __shared__ float p[];  // [E] probabilities; -1 once chosen
  __shared__ float red[32];
  __shared__ int red_e[32];
  __shared__ float chosen[kMaxTopK];
  const int t = blockIdx.x;
  const float* row = logits + static_cast<int64_t>(t) * ld;
  float mx = -INFINITY;
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    p[e] = row[e];
    mx = fmaxf(mx, p[e]);
  }
  mx = block_max(mx, red);
  float s = 0.0f;
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    p[e] = expf(p[e] - mx);
    s += p[e];
  }
  s = block_sum(s, red);
  for (int e = threadIdx.x; e < E; e += blockDim.x) p[e] = p[e] / s;
  __syncthreads();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  for (int j = 0; j < k; ++j) {
    float bp = -2.0f;
    int be = INT_MAX;
    for (int e = threadIdx.x; e < E; e += blockDim.x)
      if (ahead(p[e], e, bp, be)) {
        bp = p[e];
        be = e;
      }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float op = __shfl_xor_sync(0xffffffffu, bp, o);
      const int oe = __shfl_xor_sync(0xffffffffu, be, o);
      if (ahead(op, oe, bp, be)) {
        bp = op;
        be = oe;
      }
    }
    if (lane == 0) {
      red[warp] = bp;
      red_e[warp] = be;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int w = 1; w < nw; ++w)
        if (ahead(red[w], red_e[w], bp, be)) {
          bp = red[w];
          be = red_e[w];
        }
      ids[static_cast<int64_t>(t) * k + j] = be;
      chosen[j] = bp;
      p[be] = -1.0f;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    float sum = 0.0f;
    for (int j = 0; j < k; ++j) sum += chosen[j];
    for (int j = 0; j < k; ++j)
      weights[static_cast<int64_t>(t) * k + j] = renormalize ? chosen[j] / sum : chosen[j];
  }
}

// One block: per-expert counts (shared-memory atomics), their prefix sums and
// the list of experts with rows (thread 0, in expert order), then each pair's
// row in its expert's group.
__global__ void moe_group_kernel(const int32_t* __restrict__ ids, int n, int k, int E,
                                 int32_t* __restrict__ offsets, int32_t* __restrict__ active,
                                 int32_t* __restrict__ row_token, int32_t* __restrict__ row_expert,
                                 int32_t* __restrict__ pair_row) {
  pdl_begin();
  extern __shared__ int32_t counts[];  // [E] counts, then [E] cursors
  int32_t* cursor = counts + E;
  for (int e = threadIdx.x; e < E; e += blockDim.x) counts[e] = 0;
  __syncthreads();
  for (int i = threadIdx.x; i < n; i += blockDim.x) atomicAdd(&counts[ids[i]], 1);
  __syncthreads();
  if (threadIdx.x == 0) {
    int acc = 0, na = 0;
    for (int e = 0; e < E; ++e) {
      offsets[e] = acc;
      cursor[e] = acc;
      if (counts[e] > 0) active[na++] = e;
      acc += counts[e];
    }
    offsets[E] = acc;
    for (int a = na; a < E; ++a) active[a] = -1;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const int e = ids[i];
    const int r = atomicAdd(&cursor[e], 1);
    row_token[r] = i / k;
    row_expert[r] = e;
    pair_row[i] = r;
  }
}

// Rows of one expert a warp takes at a time (one pass over the weight row).
constexpr int kRowsPerPass = 8;
constexpr int kWarpsPerBlock = 8;

// note: one warp per (expert, output column n). Lane l reads elements
// l*V .. l*V+V-1 of every 32*V-element stretch of K (V = 16 bytes of T),
// then the stretches' tail one element per lane; each row's partial sums
// are accumulated with fmaf in increasing k, and the 32 partials added by a
// xor butterfly. A row's arithmetic is the same in every pass and every
// grid, so its bits do not depend on its group (batch invariance).
template <class T, class Y>
__global__ void moe_expert_matmul_kernel(const T* __restrict__ x, int64_t ldx, bool gather,
                                         const T* __restrict__ w, int N, int K, Y* __restrict__ y,
                                         int64_t ldy, const int32_t* __restrict__ offsets,
                                         const int32_t* __restrict__ active,
                                         const int32_t* __restrict__ row_token, bool vec) {
  pdl_begin();
  const int e = active[blockIdx.y];
  if (e < 0) return;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int n = blockIdx.x * kWarpsPerBlock + warp;
  if (n >= N) return;
  const int r0 = offsets[e], r1 = offsets[e + 1];
  const T* wr = w + (static_cast<int64_t>(e) * N + n) * K;
  constexpr int V = 16 / sizeof(T);
  const int kvec = vec ? K / (32 * V) * (32 * V) : 0;
  for (int rb = r0; rb < r1; rb += kRowsPerPass) {
    const int nr = min(kRowsPerPass, r1 - rb);
    const T* xr[kRowsPerPass];
#pragma unroll
    for (int i = 0; i < kRowsPerPass; ++i) {
      const int r = rb + min(i, nr - 1);  // short passes repeat the last row (not written)
      xr[i] = x + static_cast<int64_t>(gather ? row_token[r] : r) * ldx;
    }
    float acc[kRowsPerPass];
#pragma unroll
    for (int i = 0; i < kRowsPerPass; ++i) acc[i] = 0.0f;
    for (int k0 = lane * V; k0 < kvec; k0 += 32 * V) {
      const uint4 wv = *reinterpret_cast<const uint4*>(wr + k0);
      const T* wh = reinterpret_cast<const T*>(&wv);
#pragma unroll
      for (int i = 0; i < kRowsPerPass; ++i) {
        const uint4 xv = *reinterpret_cast<const uint4*>(xr[i] + k0);
        const T* xh = reinterpret_cast<const T*>(&xv);
#pragma unroll
        for (int j = 0; j < V; ++j) acc[i] = fmaf(to_f(xh[j]), to_f(wh[j]), acc[i]);
      }
    }
    for (int kk = kvec + lane; kk < K; kk += 32) {
      const float wk = to_f(wr[kk]);
#pragma unroll
      for (int i = 0; i < kRowsPerPass; ++i) acc[i] = fmaf(to_f(xr[i][kk]), wk, acc[i]);
    }
#pragma unroll
    for (int i = 0; i < kRowsPerPass; ++i) {
      const float v = warp_sum(acc[i]);
      if (lane == i && i < nr) y[static_cast<int64_t>(rb + i) * ldy + n] = from_f<Y>(v);
    }
  }
}

// One block per token: the shared expert's gate (a fixed-order block dot
// product), then each column's sum over the token's experts in increasing
// expert index, plus the gated shared expert.
template <class T>
__global__ void moe_combine_kernel(const float* __restrict__ y, int64_t ldy,
                                   const int32_t* __restrict__ ids,
                                   const float* __restrict__ weights,
                                   const int32_t* __restrict__ pair_row, int k, int H,
                                   const float* __restrict__ shared, int64_t lds,
                                   const T* __restrict__ h, int64_t ldh,
                                   const T* __restrict__ gate_w, T* __restrict__ out, int64_t ldo) {
  pdl_begin();
  __shared__ float red[32];
  __shared__ int order[kMaxTopK];
  const int64_t t = blockIdx.x;
  float gate = 0.0f;
  if (shared != nullptr) {
    float s = 0.0f;
    for (int c = threadIdx.x; c < H; c += blockDim.x)
      s = fmaf(to_f(h[t * ldh + c]), to_f(gate_w[c]), s);
    gate = sigmoid(block_sum(s, red));
  }
  if (threadIdx.x == 0) {
    // Insertion sort of the token's k choices by expert index.
    for (int j = 0; j < k; ++j) {
      int i = j;
      while (i > 0 && ids[t * k + order[i - 1]] > ids[t * k + j]) {
        order[i] = order[i - 1];
        --i;
      }
      order[i] = j;
    }
  }
  __syncthreads();
  for (int c = threadIdx.x; c < H; c += blockDim.x) {
    float acc = 0.0f;
    for (int j = 0; j < k; ++j) {
      const int64_t pair = t * k + order[j];
      acc = fmaf(weights[pair], y[static_cast<int64_t>(pair_row[pair]) * ldy + c], acc);
    }
    if (shared != nullptr) acc = fmaf(gate, shared[t * lds + c], acc);
    out[t * ldo + c] = from_f<T>(acc);
  }
}

void check_sizes(const char* what, int64_t T, int64_t E, int64_t k) {
  if (E < 1 || E > kMaxExperts || k < 1 || k > kMaxTopK || k > E || T * k > INT32_MAX)
    fail_message(std::string(what) + ": unsupported sizes: " + std::to_string(T) + " tokens, " +
                 std::to_string(E) + " experts, top " + std::to_string(k) +
                 " (expected 1 <= k <= 32, k <= experts <= 4096)");
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

void moe_route(const float* logits, int64_t ld, int64_t T, int64_t E, int64_t k, bool renormalize,
               int32_t* ids, float* weights, cudaStream_t stream) {
  if (T == 0) return;
  check_sizes("moe_route", T, E, k);
  launch_kernel(moe_route_kernel, dim3(static_cast<unsigned>(T)), dim3(128),
                static_cast<size_t>(E) * sizeof(float), stream, logits, ld, static_cast<int>(E),
                static_cast<int>(k), renormalize, ids, weights);
}

void moe_group(const int32_t* ids, int64_t T, int64_t k, int64_t E, const MoeGroups& g,
               cudaStream_t stream) {
  if (T == 0) return;
  check_sizes("moe_group", T, E, k);
  launch_kernel(moe_group_kernel, dim3(1), dim3(1024), static_cast<size_t>(2 * E) * sizeof(int32_t),
                stream, ids, static_cast<int>(T * k), static_cast<int>(k), static_cast<int>(E),
                g.offsets, g.active, g.row_token, g.row_expert, g.pair_row);
}

template <class T, class Y>
void moe_expert_matmul(const T* x, int64_t ldx, bool gather, const T* w, int64_t N, int64_t K,
                       Y* y, int64_t ldy, int64_t rows, const MoeGroups& g, int64_t max_active,
                       cudaStream_t stream) {
  if (rows == 0 || N == 0) return;
  if (N > INT32_MAX || K > INT32_MAX || max_active < 1 || max_active > 65535)
    fail_message("moe_expert_matmul: unsupported sizes N " + std::to_string(N) + ", K " +
                 std::to_string(K) + ", " + std::to_string(max_active) + " active experts");
  constexpr int V = 16 / sizeof(T);
  // note: the vector path needs every row start 16-byte aligned; which path
  // runs depends on the shapes and buffers only, never on the rows.
  const bool vec = K % V == 0 && ldx % V == 0 && aligned16(x) && aligned16(w);
  const dim3 grid(static_cast<unsigned>((N + kWarpsPerBlock - 1) / kWarpsPerBlock),
                  static_cast<unsigned>(max_active));
  launch_kernel(moe_expert_matmul_kernel<T, Y>, grid, dim3(32 * kWarpsPerBlock), 0, stream, x, ldx,
                gather, w, static_cast<int>(N), static_cast<int>(K), y, ldy,
                static_cast<const int32_t*>(g.offsets), static_cast<const int32_t*>(g.active),
                static_cast<const int32_t*>(g.row_token), vec);
}

template <class T>
void moe_combine(const float* y, int64_t ldy, const int32_t* ids, const float* weights,
                 const int32_t* pair_row, int64_t tokens, int64_t k, int64_t H, const float* shared,
                 int64_t lds, const T* h, int64_t ldh, const T* gate_w, T* out, int64_t ldo,
                 cudaStream_t stream) {
  if (tokens == 0) return;
  if (k < 1 || k > kMaxTopK || H > INT32_MAX || tokens > INT32_MAX)
    fail_message("moe_combine: unsupported sizes");
  launch_kernel(moe_combine_kernel<T>, dim3(static_cast<unsigned>(tokens)), dim3(256), 0, stream, y,
                ldy, ids, weights, pair_row, static_cast<int>(k), static_cast<int>(H), shared, lds,
                h, ldh, gate_w, out, ldo);
}

#define QTK_INSTANTIATE(T, Y)                                                                    \
  template void moe_expert_matmul<T, Y>(const T*, int64_t, bool, const T*, int64_t, int64_t, Y*, \
                                        int64_t, int64_t, const MoeGroups&, int64_t, cudaStream_t);
QTK_INSTANTIATE(float, float)
QTK_INSTANTIATE(bf16, bf16)
QTK_INSTANTIATE(bf16, float)
#undef QTK_INSTANTIATE
template void moe_combine<float>(const float*, int64_t, const int32_t*, const float*,
                                 const int32_t*, int64_t, int64_t, int64_t, const float*, int64_t,
                                 const float*, int64_t, const float*, float*, int64_t,
                                 cudaStream_t);
template void moe_combine<bf16>(const float*, int64_t, const int32_t*, const float*,
                                const int32_t*, int64_t, int64_t, int64_t, const float*, int64_t,
                                const bf16*, int64_t, const bf16*, bf16*, int64_t, cudaStream_t);

}  // namespace qtk::cuda
