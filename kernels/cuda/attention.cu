// Paged causal attention over a varlen batch, and the KV cache write.
#include <algorithm>
#include <climits>
#include <cmath>
#include <mutex>

#include <string>
#include <type_traits>

#include "kernels/cuda/attention_mma.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/launch.cuh"

namespace qtk::cuda {
namespace {

using namespace dev;

constexpr int kAttnThreads = 128;
// note: the scores of one query live in shared memory (exact two-pass softmax
// needs them all); 48K keys * 4 bytes = 192 KB fits Hopper's 227 KB. Longer
// contexts are walked in tiles of 48K keys (see the kernel), same bits.
constexpr int64_t kMaxContext = 48 * 1024;
constexpr int kMaxHeadDim = 256;

template <class T>
__global__ void kv_cache_write_kernel(const T* __restrict__ k, int64_t ldk, const T* __restrict__ v,
                                      int64_t ldv, int64_t tokens, int64_t width,
                                      const int64_t* __restrict__ slot_mapping, T* k_cache,
                                      T* v_cache) {
  pdl_begin();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= tokens * width) return;
  const int64_t t = i / width, e = i % width;
  const int64_t slot = slot_mapping[t];
  if (slot < 0) return;  // a padding row (graph buckets) writes nothing
  k_cache[slot * width + e] = k[t * ldk + e];
  v_cache[slot * width + e] = v[t * ldv + e];
}

// One block per (query row, query head), 4 warps.
// note: the reduction order of every output depends only on the number of
// keys of that query and on D:
//  - scores: key j is scored by lane group (j % 16) (8 lanes; warp (j%16)/4),
//    lane l of the group summing dims l, l+8, ... in order, then a fixed
//    3-step xor butterfly inside the group;
//  - max, then sum of exp: thread i adds keys i, i+128, ... in order, then
//    block_sum's fixed tree;
//  - output: warp w accumulates p_j * v_j[c] over its keys j = w, w+4, ... in
//    increasing j, and the 4 warp partials are added warp 0 + 1 + 2 + 3.
// Nothing depends on the batch, the block size, the block table or how the
// prompt was chunked, and there is no online-softmax rescaling at block
// boundaries.
constexpr int kGroup = 8;  // lanes per key in the score pass
constexpr int kKeysPerPass = kAttnThreads / kGroup;
constexpr int kMaxDimsPerLane = kMaxHeadDim / 32;
constexpr int kUnroll = 4;

template <class T>
__global__ void __launch_bounds__(kAttnThreads)
    paged_attention_kernel(const T* __restrict__ q, int64_t ldq, const T* __restrict__ k_cache,
                           const T* __restrict__ v_cache, T* __restrict__ out, int64_t ldo,
                           const int32_t* __restrict__ q_start, const int32_t* __restrict__ seq_len,
                           const int32_t* __restrict__ block_table, int num_seqs,
                           int64_t max_blocks, int block_size, int hkv, int d, int group,
                           float scale) {
  pdl_begin();
  extern __shared__ float smem[];
  constexpr int kWarps = kAttnThreads / 32;
  float* qs = smem;              // [d]
  float* red = qs + d;           // [32]
  float* part = red + 32;        // [kWarps][d] output partials
  float* p = part + kWarps * d;  // [n_keys]: scores, then exp(score - max)
  const int t = blockIdx.x, h = blockIdx.y;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int s = find_seq(q_start, num_seqs, t);
  const int q_len = q_start[s + 1] - q_start[s];
  const int n_keys = seq_len[s] - q_len + (t - q_start[s]) + 1;
  const int kvh = h / group;
  const int64_t width = static_cast<int64_t>(hkv) * d;
  const int32_t* bt = block_table + s * max_blocks;
  auto key_row = [&](const T* cache, int j) {
    const int64_t slot = static_cast<int64_t>(bt[j / block_size]) * block_size + j % block_size;
    return cache + slot * width + kvh * d;
  };

  for (int c = tid; c < d; c += kAttnThreads) qs[c] = to_f(q[t * ldq + h * d + c]);
  __syncthreads();

  // note: kUnroll key passes are loaded before any is reduced (latency
  // hiding); each key's dot still runs over its dims in order. Keys jb ..
  // je-1 land in p[j - jb].
  const int g = tid / kGroup, gl = tid % kGroup;
  const auto score_tile = [&](int jb, int je) {
    for (int j0 = jb; j0 < je; j0 += kUnroll * kKeysPerPass) {
      float dot[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int j = j0 + u * kKeysPerPass + g;
        dot[u] = 0.0f;
        if (j < je) {
          const T* kr = key_row(k_cache, j);
          for (int c = gl; c < d; c += kGroup) dot[u] += qs[c] * to_f(kr[c]);
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
        for (int o = kGroup / 2; o > 0; o >>= 1) dot[u] += __shfl_xor_sync(0xffffffffu, dot[u], o);
        const int j = j0 + u * kKeysPerPass + g;
        if (j < je && gl == 0) p[j - jb] = dot[u] * scale;
      }
    }
  };

  // note: contexts longer than kMaxContext keys go through shared memory in
  // tiles of kMaxContext (a multiple of 128): the max over a first pass of
  // every tile's scores, then per tile the scores again (the same bits: a
  // key's dot depends on the key alone), exp, sum and the weighted V sum.
  // Each thread and warp meets its keys in the same increasing order as in
  // one tile, so every sum is the one-tile sum: the tiling changes no bits.
  const bool tiled = n_keys > kMaxContext;
  float m = -INFINITY;
  for (int jb = 0; jb < n_keys; jb += kMaxContext) {
    const int je = min(n_keys, jb + static_cast<int>(kMaxContext));
    score_tile(jb, je);
    __syncthreads();
    for (int j = jb + tid; j < je; j += kAttnThreads) m = fmaxf(m, p[j - jb]);
    if (tiled) __syncthreads();  // the next tile overwrites p
  }
  m = block_max(m, red);

  float sum = 0.0f;
  float acc[kMaxDimsPerLane];
#pragma unroll
  for (int i = 0; i < kMaxDimsPerLane; ++i) acc[i] = 0.0f;
  for (int jb = 0; jb < n_keys; jb += kMaxContext) {
    const int je = min(n_keys, jb + static_cast<int>(kMaxContext));
    if (tiled) {
      score_tile(jb, je);
      __syncthreads();
    }
    for (int j = jb + tid; j < je; j += kAttnThreads) {
      const float e = expf(p[j - jb] - m);
      p[j - jb] = e;
      sum += e;
    }
    __syncthreads();  // publishes p[]
    // note: kUnroll keys of the warp are loaded before they are accumulated,
    // still added in increasing key order (j, j+4, j+8, ...).
    for (int j0 = jb + warp; j0 < je; j0 += kUnroll * kWarps) {
      float vals[kUnroll][kMaxDimsPerLane];
      float pj[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int j = j0 + u * kWarps;
        pj[u] = j < je ? p[j - jb] : 0.0f;
        const T* vr = j < je ? key_row(v_cache, j) : nullptr;
#pragma unroll
        for (int i = 0; i < kMaxDimsPerLane; ++i) {
          const int c = lane + 32 * i;
          vals[u][i] = (vr != nullptr && c < d) ? to_f(vr[c]) : 0.0f;
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (j0 + u * kWarps >= je) break;
#pragma unroll
        for (int i = 0; i < kMaxDimsPerLane; ++i) acc[i] += pj[u] * vals[u][i];
      }
    }
    if (tiled) __syncthreads();  // the next tile overwrites p
  }
  sum = block_sum(sum, red);
  const float inv = 1.0f / sum;

#pragma unroll
  for (int i = 0; i < kMaxDimsPerLane; ++i) {
    const int c = lane + 32 * i;
    if (c < d) part[warp * d + c] = acc[i];
  }
  __syncthreads();
  for (int c = tid; c < d; c += kAttnThreads) {
    float o = part[c];
    for (int w = 1; w < kWarps; ++w) o += part[w * d + c];
    out[t * ldo + h * d + c] = from_f<T>(o * inv);
  }
}

template <class T>
void enable_large_smem() {
  set_max_dynamic_smem(paged_attention_kernel<T>,
                       static_cast<int>((5 * kMaxHeadDim + 32 + kMaxContext) * sizeof(float)));
}

}  // namespace

int64_t paged_attention_max_context() { return kMaxContext; }

template <class T>
void kv_cache_write(const T* k, int64_t ldk, const T* v, int64_t ldv, int64_t tokens, int64_t hkv,
                    int64_t d, const int64_t* slot_mapping, T* k_cache, T* v_cache,
                    cudaStream_t stream) {
  const int64_t n = tokens * hkv * d;
  if (n == 0) return;
  launch_kernel(kv_cache_write_kernel<T>, grid_1d(n, 256), 256, 0, stream, k, ldk, v, ldv, tokens,
                hkv * d, slot_mapping, k_cache, v_cache);
}

template <class T>
void paged_attention(const T* q, int64_t ldq, const T* k_cache, const T* v_cache, T* out,
                     int64_t ldo, const AttentionBatch& b, int64_t hq, int64_t hkv, int64_t d,
                     float scale, cudaStream_t stream) {
  if (b.total_tokens == 0) return;
  if constexpr (std::is_same_v<T, bf16>) {
    // note: bf16 activations go to the tensor-core kernel (attention_mma.cu)
    // whenever the model's shapes allow it; the choice never depends on the
    // batch, so every row of a model goes through the same kernel.
    if (attention_mma_supported(q, ldq, out, ldo, hq, hkv, d))
      return paged_attention_mma(q, ldq, k_cache, v_cache, out, ldo, b, hq, hkv, d, scale, stream);
  }
  if (d > kMaxHeadDim || d % 8 != 0 || hkv <= 0 || hq % hkv != 0)
    fail_message("paged_attention: head_dim " + std::to_string(d) + " (at most " +
                 std::to_string(kMaxHeadDim) + ", a multiple of 8) with " + std::to_string(hq) +
                 " query heads over " + std::to_string(hkv) +
                 " kv heads (must divide) is not supported");
  if (b.max_seq_len <= 0 || b.max_seq_len > INT32_MAX)
    fail_message("paged_attention: max_seq_len " + std::to_string(b.max_seq_len) +
                 " is outside 1.." + std::to_string(INT32_MAX));
  enable_large_smem<T>();
  const size_t smem =
      static_cast<size_t>(5 * d + 32 + std::min(b.max_seq_len, kMaxContext)) * sizeof(float);
  const dim3 grid(static_cast<unsigned>(b.total_tokens), static_cast<unsigned>(hq));
  launch_kernel(paged_attention_kernel<T>, grid, kAttnThreads, smem, stream, q, ldq, k_cache,
                v_cache, out, ldo, b.q_start, b.seq_len, b.block_table,
                static_cast<int>(b.num_seqs), b.max_blocks, static_cast<int>(b.block_size),
                static_cast<int>(hkv), static_cast<int>(d), static_cast<int>(hq / hkv), scale);
}

#define QTK_INSTANTIATE(T)                                                                         \
  template void kv_cache_write<T>(const T*, int64_t, const T*, int64_t, int64_t, int64_t, int64_t, \
                                  const int64_t*, T*, T*, cudaStream_t);                           \
  template void paged_attention<T>(const T*, int64_t, const T*, const T*, T*, int64_t,             \
                                   const AttentionBatch&, int64_t, int64_t, int64_t, float,        \
                                   cudaStream_t);
QTK_INSTANTIATE(float)
QTK_INSTANTIATE(bf16)
#undef QTK_INSTANTIATE

}  // namespace qtk::cuda
