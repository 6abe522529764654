#include "kernels/cuda/moe.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <climits>
#include <string>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/warp_matmul.cuh"

namespace qtk::cuda {

namespace {

using namespace dev;
using bf16 = __nv_bfloat16;

constexpr int kMaxExperts = 4096;
constexpr int kMaxTopK = 32;
constexpr int kRankedExperts = 512;   // moe_route ranks up to this many experts at once
constexpr int kCombineThreads = 256;  // moe_combine's columns per block

// (p, e) is ahead of (bp, be) in the top-k order: larger probability, ties
// to the lower expert index. A total order, so any reduction tree picks the
// same winner.
__device__ __forceinline__ bool ahead(float p, int e, float bp, int be) {
  return p > bp || (p == bp && e < be);
}

// One block per token: the softmax over its E logits (fixed-order block
// reductions), then its top k (ties to the lower expert).
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
  if (E <= kRankedExperts) {
    // note: the top k by rank: an expert's rank is the number of experts
    // ahead of it (a strict total order, so the ranks are 0 .. E-1 and the
    // k chosen are those below k, in order), all experts at once instead of
    // k rounds of block-wide arg-max with their barriers.
    for (int j = threadIdx.x; j < k; j += blockDim.x) {
      // (a valid id and a weight in every slot, even if NaN logits leave a rank unused)
      ids[static_cast<int64_t>(t) * k + j] = j;
      chosen[j] = 0.0f;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
      const float pe = p[e];
      int rank = 0;
      for (int f = 0; f < E; ++f) rank += ahead(p[f], f, pe, e) ? 1 : 0;
      if (rank < k) {
        ids[static_cast<int64_t>(t) * k + rank] = e;
        chosen[rank] = pe;
      }
    }
    __syncthreads();
  } else {
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
  __shared__ int n_active;
  if (threadIdx.x < 32) {
    // Warp 0: the prefix sums and the active list, 32 experts a step.
    const int lane = threadIdx.x;
    int acc = 0, na = 0;
    for (int base = 0; base < E; base += 32) {
      const int e = base + lane;
      const int c = e < E ? counts[e] : 0;
      int incl = c;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int v = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += v;
      }
      const unsigned has = __ballot_sync(0xffffffffu, c > 0);
      if (e < E) {
        offsets[e] = acc + incl - c;
        cursor[e] = acc + incl - c;
        if (c > 0) active[na + __popc(has & ((1u << lane) - 1))] = e;
      }
      acc += __shfl_sync(0xffffffffu, incl, 31);
      na += __popc(has);
    }
    if (lane == 0) {
      offsets[E] = acc;
      n_active = na;
    }
  }
  __syncthreads();
  for (int a = n_active + threadIdx.x; a < E; a += blockDim.x) active[a] = -1;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const int e = ids[i];
    const int r = atomicAdd(&cursor[e], 1);
    row_token[r] = i / k;
    row_expert[r] = e;
    pair_row[i] = r;
  }
}

// Block (token blockIdx.x, columns blockIdx.y * kCombineThreads ..): the
// shared expert's gate (a fixed-order block dot product over all H, the
// same in every block of the token), then each column's sum over the
// token's experts in increasing expert index, plus the gated shared expert.
// note: one column per thread: a thread's k loads are independent and go
// out together (a block per token walking H in steps of 256 waited on one
// L2 round trip per step: 10 us at batch 1).
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
  __shared__ int tid[kMaxTopK], trow[kMaxTopK];
  __shared__ float tw[kMaxTopK];
  const int64_t t = blockIdx.x;
  float gate = 0.0f;
  if (shared != nullptr) {
    float s = 0.0f;
    for (int c = threadIdx.x; c < H; c += blockDim.x)
      s = fmaf(to_f(h[t * ldh + c]), to_f(gate_w[c]), s);
    gate = sigmoid(block_sum(s, red));
  }
  // The token's k choices, loaded together (not one dependent load per
  // step of the sort below).
  for (int j = threadIdx.x; j < k; j += blockDim.x) {
    tid[j] = ids[t * k + j];
    tw[j] = weights[t * k + j];
    trow[j] = pair_row[t * k + j];
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    // Insertion sort of the token's k choices by expert index.
    for (int j = 0; j < k; ++j) {
      int i = j;
      while (i > 0 && tid[order[i - 1]] > tid[j]) {
        order[i] = order[i - 1];
        --i;
      }
      order[i] = j;
    }
  }
  __syncthreads();
  const int c = blockIdx.y * blockDim.x + threadIdx.x;
  if (c < H) {
    float acc = 0.0f;
    for (int j = 0; j < k; ++j)
      acc = fmaf(tw[order[j]], y[static_cast<int64_t>(trow[order[j]]) * ldy + c], acc);
    if (shared != nullptr) acc = fmaf(gate, shared[t * lds + c], acc);
    out[t * ldo + c] = from_f<T>(acc);
  }
}

// The experts' row groups of a grouped product: x rows gathered through
// row_token (gather) or already grouped.
dev::RowGroups expert_groups(const MoeGroups& g, bool gather, int64_t rows) {
  dev::RowGroups groups;
  groups.offsets = g.offsets;
  groups.active = g.active;
  groups.row_source = gather ? g.row_token : nullptr;
  groups.rows = static_cast<int>(rows);  // all groups' rows together (a bound)
  return groups;
}

void check_sizes(const char* what, int64_t T, int64_t E, int64_t k) {
  if (E < 1 || E > kMaxExperts || k < 1 || k > kMaxTopK || k > E || T * k > INT32_MAX)
    fail_message(std::string(what) + ": unsupported sizes: " + std::to_string(T) + " tokens, " +
                 std::to_string(E) + " experts, top " + std::to_string(k) +
                 " (expected 1 <= k <= 32, k <= experts <= 4096)");
}

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
void moe_expert_matmul(const T* x, int64_t ldx, bool gather, const WeightRef<T>& w, int64_t N,
                       int64_t K, Y* y, int64_t ldy, int64_t rows, const MoeGroups& g,
                       int64_t max_active, cudaStream_t stream) {
  if (rows == 0 || N == 0) return;
  launch_warp_matmul<T, Y>("moe_expert_matmul", x, ldx, w, N, K, y, ldy,
                           expert_groups(g, gather, rows), max_active, stream);
}

template <class T>
bool moe_expert_matmul_swiglu(const T* x, int64_t ldx, bool gather, const WeightRef<T>& w,
                              int64_t I, int64_t K, T* act, int64_t lda, int64_t rows,
                              const MoeGroups& g, int64_t max_active, cudaStream_t stream) {
  if (rows == 0 || I == 0) return true;
  check_weight_operands("moe_expert_matmul_swiglu", w, 2 * I, K, max_active);
  return launch_mma_matmul<T, T>(x, ldx, w, 2 * I, K, act, lda, expert_groups(g, gather, rows),
                                 max_active, I, stream);
}

template <class T>
void moe_combine(const float* y, int64_t ldy, const int32_t* ids, const float* weights,
                 const int32_t* pair_row, int64_t tokens, int64_t k, int64_t H, const float* shared,
                 int64_t lds, const T* h, int64_t ldh, const T* gate_w, T* out, int64_t ldo,
                 cudaStream_t stream) {
  if (tokens == 0) return;
  if (k < 1 || k > kMaxTopK || H > INT32_MAX || tokens > INT32_MAX)
    fail_message("moe_combine: unsupported sizes");
  launch_kernel(moe_combine_kernel<T>,
                dim3(static_cast<unsigned>(tokens),
                     static_cast<unsigned>((H + kCombineThreads - 1) / kCombineThreads)),
                dim3(kCombineThreads), 0, stream, y, ldy, ids, weights, pair_row,
                static_cast<int>(k), static_cast<int>(H), shared, lds, h, ldh, gate_w, out, ldo);
}

#define QTK_INSTANTIATE(T, Y)                                                                     \
  template void moe_expert_matmul<T, Y>(const T*, int64_t, bool, const WeightRef<T>&, int64_t,    \
                                        int64_t, Y*, int64_t, int64_t, const MoeGroups&, int64_t, \
                                        cudaStream_t);
QTK_INSTANTIATE(float, float)
QTK_INSTANTIATE(bf16, bf16)
QTK_INSTANTIATE(bf16, float)
#undef QTK_INSTANTIATE
template bool moe_expert_matmul_swiglu<float>(const float*, int64_t, bool, const WeightRef<float>&,
                                              int64_t, int64_t, float*, int64_t, int64_t,
                                              const MoeGroups&, int64_t, cudaStream_t);
template bool moe_expert_matmul_swiglu<bf16>(const bf16*, int64_t, bool, const WeightRef<bf16>&,
                                             int64_t, int64_t, bf16*, int64_t, int64_t,
                                             const MoeGroups&, int64_t, cudaStream_t);
template void moe_combine<float>(const float*, int64_t, const int32_t*, const float*,
                                 const int32_t*, int64_t, int64_t, int64_t, const float*, int64_t,
                                 const float*, int64_t, const float*, float*, int64_t,
                                 cudaStream_t);
template void moe_combine<bf16>(const float*, int64_t, const int32_t*, const float*, const int32_t*,
                                int64_t, int64_t, int64_t, const float*, int64_t, const bf16*,
                                int64_t, const bf16*, bf16*, int64_t, cudaStream_t);

}  // namespace qtk::cuda
