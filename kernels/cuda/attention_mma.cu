// Tensor-core (mma.sync bf16 -> f32) paged causal attention over a varlen
// batch: the --precision bf16 path of paged_attention (attention.cu keeps the
// CUDA-core kernel for f32 and for shapes this one does not take).
//
// Work split: a block owns one kv head and a tile of 64 query rows of ONE
// sequence, a row being a (token, query head of the kv head's group) pair, so
// K and V are read once per kv head for the whole GQA group. Keys are walked
// in tiles of 64 at absolute positions 0, 64, 128, ... of the sequence.
//
// note: batch invariance. The value of a row depends only on its query, its
// sequence's keys and its number of keys:
//  - S = Q K^T per 16x8 tile: mma k-steps over dims 0..D-1 in order of 16;
//  - online softmax per key tile (64 keys, absolute positions): row max over
//    the thread's 16 scores in order, then the quad (xor 1, xor 2); p =
//    exp2(s*scale*log2e - max); the row sum kept per thread and reduced over
//    the quad at the end (xor 1, xor 2); O and the sums rescaled per tile;
//  - O += P V with P rounded to bf16 (the usual flash-attention choice for
//    bf16 activations), key k-steps of 16 in order.
// A masked key (past the row's causal end) gets p = 0 exactly, and keys past
// the block's last row are zero-filled, so a row computed inside a 64-row
// prefill tile equals, bit for bit, the same row computed alone in a decode
// step: mma computes each output element from its own row and column only.
// Nothing depends on the batch, the block size, the block table, or where a
// prompt was split.
#include <cmath>
#include <mutex>
#include <string>

#include "kernels/cuda/attention_mma.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/mma.cuh"

namespace qtk::cuda {
namespace {

using namespace dev;

constexpr int kRows = 64;     // query rows per block: 4 warps x 16
constexpr int kKeys = 64;     // keys per tile
constexpr int kThreads = 128;
constexpr int kPad = 8;       // bf16 padding per shared row: ldmatrix rows hit distinct banks
constexpr int kVec = 8;       // bf16 per 16-byte copy

template <int D>
constexpr size_t smem_bytes() {
  return static_cast<size_t>(kRows + 2 * kKeys) * (D + kPad) * sizeof(bf16);
}

// The (sequence, row tile) of block `b`: sequence s has ceil(q_len /
// tokens_per_tile) tiles, numbered after those of sequences 0..s-1. Each warp
// scans the sequences 32 at a time (prefix sums by shuffles). Returns false
// for a block past the last tile.
__device__ bool find_tile(const int32_t* q_start, int num_seqs, int tokens_per_tile, int b,
                          int& seq, int& tile) {
  const int lane = threadIdx.x & 31;
  int before = 0;
  for (int s0 = 0; s0 < num_seqs; s0 += 32) {
    const int s = s0 + lane;
    const int n = s < num_seqs ? (q_start[s + 1] - q_start[s] + tokens_per_tile - 1) / tokens_per_tile
                               : 0;
    int incl = n;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int y = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += y;
    }
    const int total = __shfl_sync(0xffffffffu, incl, 31);
    const int target = b - before;
    if (target < total) {
      const int hit = __ffs(__ballot_sync(0xffffffffu, incl > target)) - 1;
      seq = s0 + hit;
      tile = target - __shfl_sync(0xffffffffu, incl - n, hit);
      return true;
    }
    before += total;
  }
  return false;
}

template <int D>
__global__ void __launch_bounds__(kThreads, D <= 128 ? 4 : 2)
    attention_mma_kernel(const bf16* __restrict__ q, int64_t ldq, const bf16* __restrict__ k_cache,
                         const bf16* __restrict__ v_cache, bf16* __restrict__ out, int64_t ldo,
                         const int32_t* __restrict__ q_start, const int32_t* __restrict__ seq_len,
                         const int32_t* __restrict__ block_table, int num_seqs, int64_t max_blocks,
                         int block_size, int hkv, int group, float scale_log2) {
  constexpr int kLd = D + kPad;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* qs = reinterpret_cast<bf16*>(smem_raw);  // bf16 [kRows][kLd]
  bf16* ks = qs + kRows * kLd;                   // bf16 [kKeys][kLd]
  bf16* vs = ks + kKeys * kLd;                   // bf16 [kKeys][kLd]

  const int tokens_per_tile = kRows / group;
  int s, tile;
  if (!find_tile(q_start, num_seqs, tokens_per_tile, blockIdx.x, s, tile)) return;
  const int kvh = blockIdx.y;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int q0 = q_start[s], q_len = q_start[s + 1] - q0;
  const int t_begin = tile * tokens_per_tile;
  const int rows = min(tokens_per_tile, q_len - t_begin) * group;
  const int hist = seq_len[s] - q_len;             // cached keys before the first query
  const int max_keys = hist + t_begin + (rows - 1) / group + 1;  // keys of the last row
  const int n_tiles = (max_keys + kKeys - 1) / kKeys;
  const int32_t* bt = block_table + static_cast<int64_t>(s) * max_blocks;
  const int64_t width = static_cast<int64_t>(hkv) * D;

  // Q tile: row r = (token t_begin + r / group, head kvh * group + r % group);
  // rows past `rows` up to the last active warp's 16 are zeros, the rest are
  // never read.
  const int q_rows = (rows + 15) / 16 * 16;
  for (int i = tid; i < q_rows * (D / kVec); i += kThreads) {
    const int r = i / (D / kVec), cv = i % (D / kVec);
    uint4 val = make_uint4(0u, 0u, 0u, 0u);
    if (r < rows) {
      const int64_t t = q0 + t_begin + r / group;
      const int64_t h = static_cast<int64_t>(kvh) * group + r % group;
      val = *reinterpret_cast<const uint4*>(q + t * ldq + h * D + cv * kVec);
    }
    *reinterpret_cast<uint4*>(qs + r * kLd + cv * kVec) = val;
  }
  auto load_tile = [&](bf16* dst, const bf16* cache, int kt) {
    for (int i = tid; i < kKeys * (D / kVec); i += kThreads) {
      const int r = i / (D / kVec), cv = i % (D / kVec);
      const int j = kt * kKeys + r;
      const bool valid = j < max_keys;
      const bf16* src = cache;
      if (valid) {
        const int64_t slot = static_cast<int64_t>(bt[j / block_size]) * block_size + j % block_size;
        src = cache + slot * width + static_cast<int64_t>(kvh) * D + cv * kVec;
      }
      cp_async_16(smem_addr(dst + r * kLd + cv * kVec), src, valid);
    }
  };
  load_tile(ks, k_cache, 0);
  cp_async_commit();
  load_tile(vs, v_cache, 0);
  cp_async_commit();

  const int g = lane >> 2, c = lane & 3;
  const int r0 = warp * 16 + g, r1 = r0 + 8;
  const int nk0 = r0 < rows ? hist + t_begin + r0 / group + 1 : 0;  // keys of row r0
  const int nk1 = r1 < rows ? hist + t_begin + r1 / group + 1 : 0;
  const bool active = warp * 16 < rows;  // warp-uniform

  float o[D / 8][4];
#pragma unroll
  for (int i = 0; i < D / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;

  for (int kt = 0; kt < n_tiles; ++kt) {
    cp_async_wait<1>();  // K tile kt landed (V tile kt may be in flight)
    __syncthreads();
    float sc[kKeys / 8][4];
#pragma unroll
    for (int i = 0; i < kKeys / 8; ++i) sc[i][0] = sc[i][1] = sc[i][2] = sc[i][3] = 0.0f;
    if (active) {
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t a[4];
        ldmatrix_x4(a, smem_addr(qs + (warp * 16 + (lane & 15)) * kLd + kk * 16 + (lane >> 4) * 8));
#pragma unroll
        for (int nn = 0; nn < kKeys / 16; ++nn) {
          uint32_t b[4];
          const int key = nn * 16 + (lane & 7) + ((lane >> 4) << 3);
          ldmatrix_x4(b, smem_addr(ks + key * kLd + kk * 16 + ((lane >> 3) & 1) * 8));
          mma_bf16(sc[2 * nn], a, b[0], b[1]);
          mma_bf16(sc[2 * nn + 1], a, b[2], b[3]);
        }
      }
    }
    __syncthreads();  // every warp is done with K tile kt
    const bool more = kt + 1 < n_tiles;
    if (more) {
      load_tile(ks, k_cache, kt + 1);
      cp_async_commit();
    }
    if (active) {
      float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
      for (int n = 0; n < kKeys / 8; ++n) {
        const int j = kt * kKeys + n * 8 + 2 * c;
        sc[n][0] = j < nk0 ? sc[n][0] * scale_log2 : -INFINITY;
        sc[n][1] = j + 1 < nk0 ? sc[n][1] * scale_log2 : -INFINITY;
        sc[n][2] = j < nk1 ? sc[n][2] * scale_log2 : -INFINITY;
        sc[n][3] = j + 1 < nk1 ? sc[n][3] * scale_log2 : -INFINITY;
        mx0 = fmaxf(mx0, fmaxf(sc[n][0], sc[n][1]));
        mx1 = fmaxf(mx1, fmaxf(sc[n][2], sc[n][3]));
      }
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
      const float new0 = fmaxf(m0, mx0), new1 = fmaxf(m1, mx1);
      // note: a row with no key yet keeps base 0, so exp2(-inf - 0) = 0
      // everywhere instead of NaN.
      const float base0 = new0 == -INFINITY ? 0.0f : new0;
      const float base1 = new1 == -INFINITY ? 0.0f : new1;
      const float alpha0 = exp2f(m0 - base0), alpha1 = exp2f(m1 - base1);
      float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
      for (int n = 0; n < kKeys / 8; ++n) {
        sc[n][0] = exp2f(sc[n][0] - base0);
        sc[n][1] = exp2f(sc[n][1] - base0);
        sc[n][2] = exp2f(sc[n][2] - base1);
        sc[n][3] = exp2f(sc[n][3] - base1);
        sum0 += sc[n][0] + sc[n][1];
        sum1 += sc[n][2] + sc[n][3];
      }
      l0 = l0 * alpha0 + sum0;
      l1 = l1 * alpha1 + sum1;
      m0 = new0;
      m1 = new1;
#pragma unroll
      for (int i = 0; i < D / 8; ++i) {
        o[i][0] *= alpha0;
        o[i][1] *= alpha0;
        o[i][2] *= alpha1;
        o[i][3] *= alpha1;
      }
    }
    if (more)
      cp_async_wait<1>();  // V tile kt landed (K tile kt+1 may be in flight)
    else
      cp_async_wait<0>();
    __syncthreads();
    if (active) {
#pragma unroll
      for (int kk = 0; kk < kKeys / 16; ++kk) {
        const uint32_t a[4] = {pack_bf16(sc[2 * kk][0], sc[2 * kk][1]),
                               pack_bf16(sc[2 * kk][2], sc[2 * kk][3]),
                               pack_bf16(sc[2 * kk + 1][0], sc[2 * kk + 1][1]),
                               pack_bf16(sc[2 * kk + 1][2], sc[2 * kk + 1][3])};
        const int key = kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll
        for (int nd = 0; nd < D / 16; ++nd) {
          uint32_t b[4];
          ldmatrix_x4_trans(b, smem_addr(vs + key * kLd + nd * 16 + (lane >> 4) * 8));
          mma_bf16(o[2 * nd], a, b[0], b[1]);
          mma_bf16(o[2 * nd + 1], a, b[2], b[3]);
        }
      }
    }
    __syncthreads();  // every warp is done with V tile kt
    if (more) {
      load_tile(vs, v_cache, kt + 1);
      cp_async_commit();
    }
  }
  if (!active) return;
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  const float inv0 = l0 > 0.0f ? 1.0f / l0 : 0.0f, inv1 = l1 > 0.0f ? 1.0f / l1 : 0.0f;
  auto store = [&](int r, int col, float x, float y) {
    const int64_t t = q0 + t_begin + r / group;
    const int64_t h = static_cast<int64_t>(kvh) * group + r % group;
    *reinterpret_cast<__nv_bfloat162*>(out + t * ldo + h * D + col) = __floats2bfloat162_rn(x, y);
  };
#pragma unroll
  for (int i = 0; i < D / 8; ++i) {
    const int col = i * 8 + 2 * c;
    if (r0 < rows) store(r0, col, o[i][0] * inv0, o[i][1] * inv0);
    if (r1 < rows) store(r1, col, o[i][2] * inv1, o[i][3] * inv1);
  }
}

template <int D>
void launch(const bf16* q, int64_t ldq, const bf16* k_cache, const bf16* v_cache, bf16* out,
            int64_t ldo, const AttentionBatch& b, int64_t hkv, int group, float scale,
            cudaStream_t stream) {
  static std::once_flag once;
  std::call_once(once, [] {
    QTK_CUDA_CHECK(cudaFuncSetAttribute(attention_mma_kernel<D>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(smem_bytes<D>())));
  });
  // note: sum over sequences of ceil(q_len / tokens_per_tile) is at most
  // total_tokens (q_len >= 1) and at most total_tokens / tpt + num_seqs;
  // blocks past the last tile return at once.
  const int64_t tpt = kRows / group;
  const int64_t blocks =
      std::min<int64_t>(b.total_tokens, (b.total_tokens + tpt - 1) / tpt + b.num_seqs);
  const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(hkv));
  constexpr float kLog2e = 1.4426950408889634f;
  attention_mma_kernel<D><<<grid, kThreads, smem_bytes<D>(), stream>>>(
      q, ldq, k_cache, v_cache, out, ldo, b.q_start, b.seq_len, b.block_table,
      static_cast<int>(b.num_seqs), b.max_blocks, static_cast<int>(b.block_size),
      static_cast<int>(hkv), group, scale * kLog2e);
  QTK_CUDA_CHECK_LAUNCH();
}

}  // namespace

bool attention_mma_supported(const bf16* q, int64_t ldq, const bf16* out, int64_t ldo, int64_t hq,
                             int64_t hkv, int64_t d) {
  if (d != 32 && d != 64 && d != 128 && d != 256) return false;
  if (hkv <= 0 || hq % hkv != 0 || kRows % (hq / hkv) != 0) return false;
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return aligned(q) && aligned(out) && ldq % kVec == 0 && ldo % 2 == 0;
}

void paged_attention_mma(const bf16* q, int64_t ldq, const bf16* k_cache, const bf16* v_cache,
                         bf16* out, int64_t ldo, const AttentionBatch& b, int64_t hq, int64_t hkv,
                         int64_t d, float scale, cudaStream_t stream) {
  const int group = static_cast<int>(hq / hkv);
  switch (d) {
    case 32:
      return launch<32>(q, ldq, k_cache, v_cache, out, ldo, b, hkv, group, scale, stream);
    case 64:
      return launch<64>(q, ldq, k_cache, v_cache, out, ldo, b, hkv, group, scale, stream);
    case 128:
      return launch<128>(q, ldq, k_cache, v_cache, out, ldo, b, hkv, group, scale, stream);
    case 256:
      return launch<256>(q, ldq, k_cache, v_cache, out, ldo, b, hkv, group, scale, stream);
    default:
      fail_message("paged_attention_mma: head_dim " + std::to_string(d) + " is not supported");
  }
}

}  // namespace qtk::cuda
