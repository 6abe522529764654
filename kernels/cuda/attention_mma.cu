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
// sequence's keys and its number of keys. Per key tile (64 keys, absolute
// positions):
//  - S = Q K^T per 16x8 fragment: mma k-steps over dims 0..D-1 in order of 16;
//  - masked keys (past the row's causal end) get -inf, so p = 0 exactly;
//    keys past the block's last row are zero-filled;
//  - "merged tiles" (every D): the tile's own softmax: m_t = row max (the
//    thread's 16 scores in order, then the quad xor 1, xor 2), p =
//    exp2(s*scale*log2e - m_t), l_t = row sum (thread's scores in order, then
//    the quad xor 1, xor 2), O_t = P V from zero with P rounded to bf16 (the
//    usual flash-attention choice for bf16), key k-steps of 16 in order; then
//    the row's running (m, l, O) absorbs (m_t, l_t, O_t), tile by tile in key
//    order: m' = max(m, m_t), a = exp2(m - m'), b = exp2(m_t - m'),
//    l' = l*a + l_t*b, O' = O*a + O_t*b (each product and sum rounded once,
//    no FMA). Tiles past a row's last key are skipped. D = 256 forms O_t and
//    absorbs it 64 columns at a time (the same per-element chains);
// A row therefore has the same value inside a 64-row prefill tile, alone in
// a decode block, or as per-tile partials computed by separate
// blocks and absorbed by attention_merge_kernel in the same order with the
// same arithmetic: mma computes each output element from its own row and
// column only. Nothing depends on the batch, the block size, the block
// table, the workspace, or where a prompt was split.
#include <cmath>
#include <mutex>
#include <string>

#include "kernels/cuda/attention_mma.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/rope.cuh"

namespace qtk::cuda {
namespace {

using namespace dev;

constexpr int kRows = 64;  // query rows per block: 4 warps x 16
constexpr int kKeys = 64;  // keys per tile
constexpr int kThreads = 128;
constexpr int kPad = 8;  // bf16 padding per shared row: ldmatrix rows hit distinct banks
constexpr int kVec = 8;  // bf16 per 16-byte copy
constexpr int64_t kMaxSplitTiles = kAttentionSplitTiles;

// Output columns per P V pass of the row kernel.
template <int D>
__host__ __device__ constexpr int pv_chunk() {
  return D <= 128 ? D : 64;
}

template <int D>
constexpr size_t smem_bytes() {
  return static_cast<size_t>(kRows + 2 * kKeys) * (D + kPad) * sizeof(bf16);
}
// The split kernel's K and V tiles, `group` query rows plus a zero row, and
// the f32 scores of the `group` rows.
template <int D>
constexpr size_t split_smem_bytes(int group) {
  return static_cast<size_t>(2 * kKeys + group + 1) * (D + kPad) * sizeof(bf16) +
         static_cast<size_t>(group) * (kKeys + 4) * sizeof(float);
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
    const int n =
        s < num_seqs ? (q_start[s + 1] - q_start[s] + tokens_per_tile - 1) / tokens_per_tile : 0;
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

// ---- one warp's 16 rows against one key tile ---------------------------------

// sc = Q K^T for 16 query rows (q_rows: shared, row stride D + kPad) and a K
// tile of kKeys keys (ks: shared).
template <int D>
__device__ __forceinline__ void tile_scores(float (&sc)[kKeys / 8][4], const bf16* q_rows,
                                            const bf16* ks, int lane) {
  constexpr int kLd = D + kPad;
#pragma unroll
  for (int i = 0; i < kKeys / 8; ++i) sc[i][0] = sc[i][1] = sc[i][2] = sc[i][3] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t a[4];
    ldmatrix_x4(a, smem_addr(q_rows + (lane & 15) * kLd + kk * 16 + (lane >> 4) * 8));
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

// o += P V for the NC output columns starting at vs (a V tile of head
// dimension D; NC = D, or a warp's share in the split kernel), P = the
// probabilities in sc rounded to bf16 (as A fragments).
template <int D, int NC = D>
__device__ __forceinline__ void tile_pv(float (&o)[NC / 8][4], const float (&sc)[kKeys / 8][4],
                                        const bf16* vs, int lane) {
  constexpr int kLd = D + kPad;
#pragma unroll
  for (int kk = 0; kk < kKeys / 16; ++kk) {
    const uint32_t a[4] = {pack_bf16(sc[2 * kk][0], sc[2 * kk][1]),
                           pack_bf16(sc[2 * kk][2], sc[2 * kk][3]),
                           pack_bf16(sc[2 * kk + 1][0], sc[2 * kk + 1][1]),
                           pack_bf16(sc[2 * kk + 1][2], sc[2 * kk + 1][3])};
    const int key = kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll
    for (int nd = 0; nd < NC / 16; ++nd) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, smem_addr(vs + key * kLd + nd * 16 + (lane >> 4) * 8));
      mma_bf16(o[2 * nd], a, b[0], b[1]);
      mma_bf16(o[2 * nd + 1], a, b[2], b[3]);
    }
  }
}

// Masks keys at or past each row's key count (rows g and g+8 of the
// fragment: nk0, nk1) with -inf and scales the rest by scale*log2(e).
__device__ __forceinline__ void mask_scale(float (&sc)[kKeys / 8][4], int kt, int c, int nk0,
                                           int nk1, float scale_log2) {
#pragma unroll
  for (int n = 0; n < kKeys / 8; ++n) {
    const int j = kt * kKeys + n * 8 + 2 * c;
    sc[n][0] = j < nk0 ? __fmul_rn(sc[n][0], scale_log2) : -INFINITY;
    sc[n][1] = j + 1 < nk0 ? __fmul_rn(sc[n][1], scale_log2) : -INFINITY;
    sc[n][2] = j < nk1 ? __fmul_rn(sc[n][2], scale_log2) : -INFINITY;
    sc[n][3] = j + 1 < nk1 ? __fmul_rn(sc[n][3], scale_log2) : -INFINITY;
  }
}

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// The tile's own softmax over masked, scaled scores: mt = row max (-inf when
// the row has no key in the tile), sc = exp2(s - mt), lt = row sum.
__device__ __forceinline__ void tile_softmax(float (&sc)[kKeys / 8][4], float& mt0, float& mt1,
                                             float& lt0, float& lt1) {
  float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
  for (int n = 0; n < kKeys / 8; ++n) {
    mx0 = fmaxf(mx0, fmaxf(sc[n][0], sc[n][1]));
    mx1 = fmaxf(mx1, fmaxf(sc[n][2], sc[n][3]));
  }
  mt0 = quad_max(mx0);
  mt1 = quad_max(mx1);
  const float base0 = mt0 == -INFINITY ? 0.0f : mt0, base1 = mt1 == -INFINITY ? 0.0f : mt1;
  float sum0 = 0.0f, sum1 = 0.0f;
  // note: explicit roundings (no FMA contraction) so the row kernel and the
  // split kernel compile this to the same arithmetic.
#pragma unroll
  for (int n = 0; n < kKeys / 8; ++n) {
    sc[n][0] = exp2f(__fsub_rn(sc[n][0], base0));
    sc[n][1] = exp2f(__fsub_rn(sc[n][1], base0));
    sc[n][2] = exp2f(__fsub_rn(sc[n][2], base1));
    sc[n][3] = exp2f(__fsub_rn(sc[n][3], base1));
    sum0 += sc[n][0] + sc[n][1];
    sum1 += sc[n][2] + sc[n][3];
  }
  lt0 = quad_sum(sum0);
  lt1 = quad_sum(sum1);
}

// The absorption of a tile partial (mt finite) into a running state: the
// factors of the old state (a) and of the tile (b), and the new max.
__device__ __forceinline__ void absorb_factors(float m, float mt, float& m_new, float& a,
                                               float& b) {
  m_new = fmaxf(m, mt);
  a = exp2f(__fsub_rn(m, m_new));  // m = -inf before the first tile: 0
  b = exp2f(__fsub_rn(mt, m_new));
}
__device__ __forceinline__ float absorb(float x, float a, float xt, float b) {
  return __fadd_rn(__fmul_rn(x, a), __fmul_rn(xt, b));
}

// ---- the row kernel: 64 rows of one sequence per block -----------------------

template <int D>
__global__ void __launch_bounds__(kThreads, 2)
    attention_mma_kernel(const bf16* __restrict__ q, int64_t ldq, const bf16* __restrict__ k_cache,
                         const bf16* __restrict__ v_cache, bf16* __restrict__ out, int64_t ldo,
                         const int32_t* __restrict__ q_start, const int32_t* __restrict__ seq_len,
                         const int32_t* __restrict__ block_table, int num_seqs, int64_t max_blocks,
                         int block_size, int hkv, int group, float scale_log2) {
  pdl_begin();
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
  const int hist = seq_len[s] - q_len;  // cached keys before the first query
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
    if (active) tile_scores<D>(sc, qs + warp * 16 * kLd, ks, lane);
    __syncthreads();  // every warp is done with K tile kt
    const bool more = kt + 1 < n_tiles;
    if (more) {
      load_tile(ks, k_cache, kt + 1);
      cp_async_commit();
    }
    float mt0 = 0.0f, mt1 = 0.0f, lt0 = 0.0f, lt1 = 0.0f;
    if (active) {
      mask_scale(sc, kt, c, nk0, nk1, scale_log2);
      tile_softmax(sc, mt0, mt1, lt0, lt1);
    }
    if (more)
      cp_async_wait<1>();  // V tile kt landed (K tile kt+1 may be in flight)
    else
      cp_async_wait<0>();
    __syncthreads();
    if (active) {
      // The tile holds keys of row r0 (h0) / r1 (h1): absorb its partial.
      const bool h0 = kt * kKeys < nk0, h1 = kt * kKeys < nk1;
      float mn0 = 0.0f, a0 = 0.0f, b0 = 0.0f, mn1 = 0.0f, a1 = 0.0f, b1 = 0.0f;
      if (h0) {
        absorb_factors(m0, mt0, mn0, a0, b0);
        l0 = absorb(l0, a0, lt0, b0);
      }
      if (h1) {
        absorb_factors(m1, mt1, mn1, a1, b1);
        l1 = absorb(l1, a1, lt1, b1);
      }
      constexpr int kC = pv_chunk<D>();
#pragma unroll
      for (int c0 = 0; c0 < D; c0 += kC) {
        float ot[kC / 8][4];
#pragma unroll
        for (int i = 0; i < kC / 8; ++i) ot[i][0] = ot[i][1] = ot[i][2] = ot[i][3] = 0.0f;
        tile_pv<D, kC>(ot, sc, vs + c0, lane);
#pragma unroll
        for (int i = 0; i < kC / 8; ++i) {
          if (h0) {
            o[c0 / 8 + i][0] = absorb(o[c0 / 8 + i][0], a0, ot[i][0], b0);
            o[c0 / 8 + i][1] = absorb(o[c0 / 8 + i][1], a0, ot[i][1], b0);
          }
          if (h1) {
            o[c0 / 8 + i][2] = absorb(o[c0 / 8 + i][2], a1, ot[i][2], b1);
            o[c0 / 8 + i][3] = absorb(o[c0 / 8 + i][3], a1, ot[i][3], b1);
          }
        }
      }
      if (h0) m0 = mn0;
      if (h1) m1 = mn1;
    }
    __syncthreads();  // every warp is done with V tile kt
    if (more) {
      load_tile(vs, v_cache, kt + 1);
      cp_async_commit();
    }
  }
  if (!active) return;
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

// ---- decode steps: one block per (sequence, kv head, key tile) --------------

// Warps of a split block: each computes the scores of kKeys / W keys and the
// P V columns D / W (at least one 16-column group).
template <int D>
__host__ __device__ constexpr int split_warps() {
  return D / 16 >= 4 ? 4 : D / 16;
}
constexpr int kScoreLd = kKeys + 4;  // f32 row stride of the shared score tile

// Partial of row R (token t, query head h; R = t * hq + h) for key tile kt:
// f32 [D + 2] at partials + (R * kMaxSplitTiles + kt) * (D + 2): O_t, m_t, l_t.
//
// note: the arithmetic is the row kernel's, spread over W warps: warp w
// computes S for keys [w*64/W, (w+1)*64/W) (each score is the same mma chain
// over dims 0..D-1), masks and scales them and stores them in shared memory
// (f32, exact); then every warp reloads the whole 16 x 64 score tile in the
// row kernel's register layout and runs the same tile_softmax (so m_t, l_t
// and the bf16 P are the row kernel's, summed in its order), and computes
// P V for its own D / W output columns (each output element the same chain
// over key k-steps 0..3 from zero). Four warps per block instead of one put
// four times as many warps on each SM for the same shared memory.
// Row R's tile partials absorbed in key order, exactly as the row kernel
// absorbs its tiles, then O / l rounded to bf16 (times sigmoid(gate) when
// gate is given: sigmoid_mul's formula on that bf16) into out_row; by one
// warp. p: the row's tile 0 partial, the next tiles `stride` floats apart,
// in global memory (kShared false) or shared memory (true).
// note: each tile's loads are issued before the previous tile is absorbed
// (the absorbs stay in order): the partials come from L2, and a walk that
// waited for each tile's loads in turn cost one L2 round trip per tile.
template <int D, bool kShared = false>
__device__ __forceinline__ void merge_row(const float* p, int n_tiles, int64_t stride,
                                          bf16* out_row, const bf16* gate_row) {
  const int lane = threadIdx.x & 31;
  constexpr int kPer = (D + 31) / 32;
  float o[kPer], x[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) o[i] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  auto ld = [](const float* a) {
    if constexpr (kShared)
      return *a;
    else
      return __ldcg(a);
  };
  auto fetch = [&](const float* pt, float(&xv)[kPer], float& mt, float& lt) {
#pragma unroll
    for (int i = 0; i < kPer; ++i) xv[i] = lane + 32 * i < D ? ld(pt + lane + 32 * i) : 0.0f;
    mt = ld(pt + D);
    lt = ld(pt + D + 1);
  };
  float mt, lt;
  fetch(p, x, mt, lt);
  for (int kt = 0; kt < n_tiles; ++kt) {
    float xn[kPer], mtn = 0.0f, ltn = 0.0f;
    if (kt + 1 < n_tiles) fetch(p + (kt + 1) * stride, xn, mtn, ltn);
    float mn, a, b;
    absorb_factors(m, mt, mn, a, b);
    l = absorb(l, a, lt, b);
#pragma unroll
    for (int i = 0; i < kPer; ++i) o[i] = absorb(o[i], a, x[i], b);
    m = mn;
#pragma unroll
    for (int i = 0; i < kPer; ++i) x[i] = xn[i];
    mt = mtn;
    lt = ltn;
  }
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int d = lane + 32 * i;
    if (d >= D) continue;
    bf16 y = __float2bfloat16_rn(o[i] * inv);
    if (gate_row != nullptr) y = from_f<bf16>(to_f(y) * sigmoid(to_f(gate_row[d])));
    out_row[d] = y;
  }
}

// The fused form's inputs (decode_attention): the step's raw rows and its
// token count (the row stride of positions).
struct FusedInput {
  DecodeAttentionInput in;
  int64_t tokens = 0;
};

// What the fused rows need that no launch of the step writes, per lane:
// the step's cache slot of token t, its (cos, sin) pairs, the norm weights.
template <int D>
struct FusedLane {
  static constexpr int kPer = D / 32;
  int64_t slot;
  LaneRope<kPer> rope;
  float qn[kPer], kn[kPer];
};
template <int D>
__device__ __forceinline__ FusedLane<D> fused_lane(const FusedInput& fi, int64_t t) {
  FusedLane<D> f;
  const DecodeAttentionInput& in = fi.in;
  f.slot = in.slot_mapping[t];
  f.rope = lane_rope<D / 32>(in.positions, fi.tokens, t, in.rope);
  if (in.q_norm != nullptr) lane_norm_weights(f.qn, in.q_norm, D);
  if (in.k_norm != nullptr) lane_norm_weights(f.kn, in.k_norm, D);
  return f;
}

// The fused rows, after the dependency wait: the group's query rows
// (q_norm + RoPE) into qs and, when new_k is given, the step's key (k_norm +
// RoPE) and value into new_k / new_v and into the cache slot. One warp per
// row (warp, warp + warps, ...; kRowsPerWarp >= (group + 2) / warps), with
// qk_norm_rope's arithmetic (dev::norm_lane, dev::rope_lane) and its bf16
// rounding, so the values are the ones the unfused kernels store.
// note: every row of the warp is loaded before any is normed (one L2 round
// trip for all of them instead of one per row).
template <int D, int kRowsPerWarp>
__device__ __forceinline__ void fused_rows(const FusedInput& fi, const FusedLane<D>& f,
                                           const bf16* q, int64_t ldq, int64_t t, int kvh,
                                           int group, int64_t width, bf16* k_cache, bf16* v_cache,
                                           bf16* qs, bf16* new_k, bf16* new_v, int warp, int warps,
                                           int lane) {
  static_assert(D % 32 == 0, "fused rows: D / 32 columns per lane");
  constexpr int kPer = D / 32, kLd = D + kPad;
  const DecodeAttentionInput& in = fi.in;
  const int rows = group + (new_k != nullptr ? 2 : 0);
  auto source = [&](int r) {
    return r < group    ? q + t * ldq + (static_cast<int64_t>(kvh) * group + r) * D
           : r == group ? in.k + t * in.ldk + static_cast<int64_t>(kvh) * D
                        : in.v + t * in.ldv + static_cast<int64_t>(kvh) * D;
  };
  float v[kRowsPerWarp][kPer];
#pragma unroll
  for (int j = 0; j < kRowsPerWarp; ++j) {
    const int r = warp + warps * j;
    if (r >= rows) continue;
    const bf16* src = source(r);
#pragma unroll
    for (int i = 0; i < kPer; ++i) v[j][i] = to_f(src[lane + 32 * i]);
  }
#pragma unroll
  for (int j = 0; j < kRowsPerWarp; ++j) {
    const int r = warp + warps * j;
    if (r >= rows) continue;
    if (r <= group) {
      const float* nw = r < group ? in.q_norm : in.k_norm;
      if (nw != nullptr) norm_lane<kPer>(v[j], D, r < group ? f.qn : f.kn, in.eps);
      rope_lane<kPer>(v[j], f.rope);
    }
    bf16* dst = r < group ? qs + r * kLd : r == group ? new_k : new_v;
    bf16* cache = r < group || f.slot < 0 ? nullptr
                                          : (r == group ? k_cache : v_cache) + f.slot * width +
                                                static_cast<int64_t>(kvh) * D;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const bf16 y = from_f<bf16>(v[j][i]);
      dst[lane + 32 * i] = y;
      if (cache != nullptr) cache[lane + 32 * i] = y;
    }
  }
}

// One key tile's partial by the kW = split_warps<D>() warps of a group
// (`warp` its index in the group): the arithmetic of the note above
// merge_row. k_ready() / v_ready() wait until the tile's K / V copies (and
// every write of the group before them) are visible to the group; part(r)
// is where row r's partial [O_t (D), m_t, l_t] goes.
template <int D, class KReady, class VReady, class Part>
__device__ __forceinline__ void tile_partial(const bf16* qs, const bf16* ks, const bf16* vs,
                                             float* ss, int group, int n_keys, int kt,
                                             float scale_log2, int warp, int lane, KReady&& k_ready,
                                             VReady&& v_ready, Part&& part) {
  constexpr int kW = split_warps<D>();
  constexpr int kWarpKeys = kKeys / kW;  // scores per warp
  constexpr int kWarpCols = D / kW;      // output columns per warp
  constexpr int kLd = D + kPad;
  k_ready();
  const int g = lane >> 2, c = lane & 3;
  const int nk0 = g < group ? n_keys : 0, nk1 = g + 8 < group ? n_keys : 0;
  {
    // This warp's scores, then masked and scaled, into the shared tile.
    const int key0 = warp * kWarpKeys;
    float sp[kWarpKeys / 8][4];
#pragma unroll
    for (int i = 0; i < kWarpKeys / 8; ++i) sp[i][0] = sp[i][1] = sp[i][2] = sp[i][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t a[4];
      ldmatrix_x4(a, smem_addr(qs + min(lane & 15, group) * kLd + kk * 16 + (lane >> 4) * 8));
#pragma unroll
      for (int nn = 0; nn < kWarpKeys / 16; ++nn) {
        uint32_t b[4];
        const int key = key0 + nn * 16 + (lane & 7) + ((lane >> 4) << 3);
        ldmatrix_x4(b, smem_addr(ks + key * kLd + kk * 16 + ((lane >> 3) & 1) * 8));
        mma_bf16(sp[2 * nn], a, b[0], b[1]);
        mma_bf16(sp[2 * nn + 1], a, b[2], b[3]);
      }
    }
#pragma unroll
    for (int n = 0; n < kWarpKeys / 8; ++n) {
      const int col = key0 + n * 8 + 2 * c, j = kt * kKeys + col;
      if (g < group) {
        ss[g * kScoreLd + col] = j < nk0 ? __fmul_rn(sp[n][0], scale_log2) : -INFINITY;
        ss[g * kScoreLd + col + 1] = j + 1 < nk0 ? __fmul_rn(sp[n][1], scale_log2) : -INFINITY;
      }
      if (g + 8 < group) {
        ss[(g + 8) * kScoreLd + col] = j < nk1 ? __fmul_rn(sp[n][2], scale_log2) : -INFINITY;
        ss[(g + 8) * kScoreLd + col + 1] =
            j + 1 < nk1 ? __fmul_rn(sp[n][3], scale_log2) : -INFINITY;
      }
    }
  }
  v_ready();  // V landed, and every warp's scores are in ss
  float sc[kKeys / 8][4];
#pragma unroll
  for (int n = 0; n < kKeys / 8; ++n) {
    const float2 none = make_float2(-INFINITY, -INFINITY);
    const float2 r0 =
        g < group ? *reinterpret_cast<const float2*>(ss + g * kScoreLd + n * 8 + 2 * c) : none;
    const float2 r1 =
        g + 8 < group ? *reinterpret_cast<const float2*>(ss + (g + 8) * kScoreLd + n * 8 + 2 * c)
                      : none;
    sc[n][0] = r0.x;
    sc[n][1] = r0.y;
    sc[n][2] = r1.x;
    sc[n][3] = r1.y;
  }
  float mt0, mt1, lt0, lt1;
  tile_softmax(sc, mt0, mt1, lt0, lt1);
  float ot[kWarpCols / 8][4];
#pragma unroll
  for (int i = 0; i < kWarpCols / 8; ++i) ot[i][0] = ot[i][1] = ot[i][2] = ot[i][3] = 0.0f;
  const int col0 = warp * kWarpCols;
  tile_pv<D, kWarpCols>(ot, sc, vs + col0, lane);
  if (g < group) {
    float* p = part(g) + col0;
#pragma unroll
    for (int i = 0; i < kWarpCols / 8; ++i)
      *reinterpret_cast<float2*>(p + i * 8 + 2 * c) = make_float2(ot[i][0], ot[i][1]);
    if (warp == 0 && c == 0) {
      part(g)[D] = mt0;
      part(g)[D + 1] = lt0;
    }
  }
  if (g + 8 < group) {
    float* p = part(g + 8) + col0;
#pragma unroll
    for (int i = 0; i < kWarpCols / 8; ++i)
      *reinterpret_cast<float2*>(p + i * 8 + 2 * c) = make_float2(ot[i][2], ot[i][3]);
    if (warp == 0 && c == 0) {
      part(g + 8)[D] = mt1;
      part(g + 8)[D + 1] = lt1;
    }
  }
}

// The cache row offset of key j of sequence s's context (kvh's columns), -1
// past the context (zero-filled), -2 for the fused step's new key (which
// the block computes and stores itself).
__device__ __forceinline__ int64_t key_offset(int j, int n_keys, int new_key, const int32_t* bt,
                                              int block_size, int64_t width, int kvh, int d) {
  return j == new_key ? -2
         : j < n_keys
             ? (static_cast<int64_t>(bt[j / block_size]) * block_size + j % block_size) * width +
                   static_cast<int64_t>(kvh) * d
             : -1;
}

// 16-byte copies of a tile's rows (offsets `off`, see key_offset) into
// dst by `n` threads (`i0` this thread's index among them); kFused: rows
// at -2 are left alone (the unfused kernel: no test in this loop).
template <int D, bool kFused>
__device__ __forceinline__ void load_tile(bf16* dst, const bf16* cache, const int64_t* off, int i0,
                                          int n) {
  constexpr int kLd = D + kPad;
  for (int i = i0; i < kKeys * (D / kVec); i += n) {
    const int r = i / (D / kVec), cv = i % (D / kVec);
    const int64_t o = off[r];
    if (kFused && o == -2) continue;
    cp_async_16(smem_addr(dst + r * kLd + cv * kVec), cache + (o < 0 ? 0 : o + cv * kVec), o >= 0);
  }
}

template <int D, bool kFused>
__global__ void __launch_bounds__(32 * split_warps<D>())
    attention_split_kernel(const bf16* __restrict__ q, int64_t ldq, bf16* k_cache, bf16* v_cache,
                           float* __restrict__ partials, const int32_t* __restrict__ q_start,
                           const int32_t* __restrict__ seq_len,
                           const int32_t* __restrict__ block_table, int64_t max_blocks,
                           int block_size, int hkv, int group, int max_tiles, float scale_log2,
                           FusedInput fi) {
  // note: the fused form computes the step's new key itself, and every other
  // key of the context was stored by an earlier step; the step's arrays
  // (q_start, seq_len, the block table) are uploaded before its first
  // kernel. So it reads them, and issues its K and V tile copies, before the
  // dependency wait, while the qkv projection still runs; only the rows
  // that projection writes (q, the new key and value) wait.
  if constexpr (!kFused) pdl_begin();
  constexpr int kW = split_warps<D>();
  constexpr int kLd = D + kPad;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  // note: only the group's rows of Q and of the scores are stored (rows g >=
  // group of the 16-row mma fragments read a zero Q row and are masked to
  // -inf, as in the row kernel): 43.5 -> 36.7 KB for group 2, 6 blocks per
  // SM instead of 5.
  bf16* ks = reinterpret_cast<bf16*>(smem_raw);                  // bf16 [kKeys][kLd]
  bf16* vs = ks + kKeys * kLd;                                   // bf16 [kKeys][kLd]
  bf16* qs = vs + kKeys * kLd;                                   // bf16 [group + 1][kLd]
  float* ss = reinterpret_cast<float*>(qs + (group + 1) * kLd);  // f32 [group][kScoreLd]
  const int s = blockIdx.x / max_tiles, kt = blockIdx.x % max_tiles, kvh = blockIdx.y;
  __shared__ int64_t key_off[kKeys];  // each key's row offset in the cache (key_offset)
  const int n_keys = seq_len[s];
  if (kt * kKeys >= n_keys) {
    if constexpr (kFused) pdl_begin();
    return;
  }
  const int n_tiles = (n_keys + kKeys - 1) / kKeys;
  // fused: the last tile's block owns the step's new key (tile row new_key).
  const bool new_here = kFused && kt == n_tiles - 1;
  const int new_key = n_keys - 1 - kt * kKeys;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t t = q_start[s];  // the step's one token of sequence s
  const int32_t* bt = block_table + static_cast<int64_t>(s) * max_blocks;
  const int64_t width = static_cast<int64_t>(hkv) * D;
  // The query rows (fused: only the zero row here, the rows below).
  for (int i = kFused ? group * (D / kVec) + tid : tid; i < (group + 1) * (D / kVec);
       i += 32 * kW) {
    const int r = i / (D / kVec), cv = i % (D / kVec);
    uint4 val = make_uint4(0u, 0u, 0u, 0u);
    if (r < group)
      val = *reinterpret_cast<const uint4*>(
          q + t * ldq + (static_cast<int64_t>(kvh) * group + r) * D + cv * kVec);
    *reinterpret_cast<uint4*>(qs + r * kLd + cv * kVec) = val;
  }
  // note: each key's cache offset (block table lookup, division by the
  // block size) is computed once, by one thread, not once per 16-byte copy:
  // the copies were instruction-bound (ncu: DRAM 48 % of peak at batch 128).
  if (tid < kKeys)
    key_off[tid] = key_offset(kt * kKeys + tid, n_keys, new_here ? n_keys - 1 : -1, bt, block_size,
                              width, kvh, D);
  __syncthreads();
  load_tile<D, kFused>(ks, k_cache, key_off, tid, 32 * kW);
  cp_async_commit();
  load_tile<D, kFused>(vs, v_cache, key_off, tid, 32 * kW);
  cp_async_commit();
  if constexpr (kFused) {
    // While the tiles load: the fused rows (the last tile's block also
    // the new key and value, into its tile row new_key).
    // note: before the wait, what no launch of this step writes: the slot
    // and positions (step arrays, uploaded before its first kernel), the
    // norm weights, and this lane's (cos, sin) pairs, which every row of
    // the token shares: at batch 1 each of these was a dependent L2 round
    // trip per row, behind the wait.
    const FusedLane<D> f = fused_lane<D>(fi, t);
    pdl_begin();
    fused_rows<D, (16 + 2 + kW - 1) / kW>(fi, f, q, ldq, t, kvh, group, width, k_cache, v_cache, qs,
                                          new_here ? ks + new_key * kLd : nullptr,
                                          vs + new_key * kLd, warp, kW, lane);
  }
  const int hq = hkv * group;
  tile_partial<D>(
      qs, ks, vs, ss, group, n_keys, kt, scale_log2, warp, lane,
      [] {
        cp_async_wait<1>();  // K landed (V may be in flight)
        __syncthreads();
      },
      [] {
        cp_async_wait<0>();
        __syncthreads();
      },
      [&](int r) {
        const int64_t row = t * hq + static_cast<int64_t>(kvh) * group + r;
        return partials + (row * kMaxSplitTiles + kt) * (D + 2);
      });
}

// ---- decode steps at small batch: one block walks a row's key tiles ----------

// note: the walk. When a decode step's contexts are short (at most
// kWalkTiles key tiles) and its (sequence, kv head) pairs fit the GPU at
// once (walk_groups says when it pays), one block per pair computes every
// tile and the merge: kG groups of kW warps
// take the tiles g, g + kG, g + 2 kG, ..., each with the split kernel's
// arithmetic (tile_partial) into a partial in shared memory, and after a
// block barrier the rows absorb the partials in key order with merge_row's
// arithmetic. The same bits as split + merge, from one launch instead of
// two and with no partials through global memory (when to walk:
// walk_groups). Each group holds two tiles' K and V (a ring); its first
// two are copied before the dependency wait, the next ones as the group
// frees a slot. The step's new key and value are kept in rows of their own
// and copied into their tile's slot when the group reaches it (the tile
// copy skips that row).
constexpr int kWalkTiles = 8;       // contexts up to 512 keys (the graphs' 512 bucket)
constexpr int kWalkShortTiles = 2;  // up to 128 keys: a tile per group, one round

template <int D>
__host__ __device__ constexpr size_t walk_tile_elems() {
  return static_cast<size_t>(kKeys) * (D + kPad);
}
// kG groups' K/V slots, the query rows and a zero row, the new key and
// value rows, each group's f32 scores, and the partials of kWalkTiles tiles.
template <int D>
constexpr size_t walk_smem_bytes(int groups, int group) {
  return (static_cast<size_t>(groups) * 4 * walk_tile_elems<D>() +
          static_cast<size_t>(group + 3) * (D + kPad)) *
             sizeof(bf16) +
         (static_cast<size_t>(groups) * group * kScoreLd +
          static_cast<size_t>(kWalkTiles) * group * (D + 2)) *
             sizeof(float);
}

// Named barrier `id` over `threads` threads (a group of warps; ids from 1:
// 0 is __syncthreads').
__device__ __forceinline__ void group_barrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

template <int D, int kG>
__global__ void __launch_bounds__(32 * split_warps<D>() * kG)
    attention_walk_kernel(const bf16* __restrict__ q, int64_t ldq, bf16* k_cache, bf16* v_cache,
                          bf16* __restrict__ out, int64_t ldo, const bf16* __restrict__ gate,
                          int64_t ldg, const int32_t* __restrict__ q_start,
                          const int32_t* __restrict__ seq_len,
                          const int32_t* __restrict__ block_table, int64_t max_blocks,
                          int block_size, int hkv, int group, float scale_log2, FusedInput fi) {
  constexpr int kW = split_warps<D>(), kGroupThreads = 32 * kW;
  constexpr int kLd = D + kPad;
  constexpr size_t kTile = walk_tile_elems<D>();
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* kv = reinterpret_cast<bf16*>(smem_raw);       // bf16 [kG][2 slots][K, V][kKeys][kLd]
  bf16* qs = kv + kG * 4 * kTile;                     // bf16 [group + 1][kLd]
  bf16* new_k = qs + (group + 1) * kLd;               // bf16 [kLd]: the step's key
  bf16* new_v = new_k + kLd;                          // bf16 [kLd]: and value
  float* ss = reinterpret_cast<float*>(new_v + kLd);  // f32 [kG][group][kScoreLd]
  float* ps = ss + kG * group * kScoreLd;             // f32 [kWalkTiles][group][D + 2]
  __shared__ int64_t key_off[kG][2][kKeys];
  const int s = blockIdx.x, kvh = blockIdx.y;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int gi = warp / kW, gw = warp % kW, gt = tid % kGroupThreads;
  const int n_keys = seq_len[s];
  const int n_tiles = (n_keys + kKeys - 1) / kKeys;
  const int64_t t = q_start[s];
  const int32_t* bt = block_table + static_cast<int64_t>(s) * max_blocks;
  const int64_t width = static_cast<int64_t>(hkv) * D;
  auto k_slot = [&](int i) { return kv + (gi * 4 + (i & 1) * 2) * kTile; };
  // Slot i & 1 of this group gets its i-th tile, g + i kG (an empty copy
  // group past the last tile keeps the wait counts below uniform).
  auto issue = [&](int i) {
    const int kt = gi + i * kG;
    if (kt < n_tiles) {
      int64_t* off = key_off[gi][i & 1];
      if (gt < kKeys)
        off[gt] = key_offset(kt * kKeys + gt, n_keys, n_keys - 1, bt, block_size, width, kvh, D);
      group_barrier(1 + gi, kGroupThreads);
      load_tile<D, true>(k_slot(i), k_cache, off, gt, kGroupThreads);
      cp_async_commit();
      load_tile<D, true>(k_slot(i) + kTile, v_cache, off, gt, kGroupThreads);
    } else {
      cp_async_commit();
    }
    cp_async_commit();
  };
  for (int i = tid; i < D / kVec; i += blockDim.x)  // the zero query row
    *reinterpret_cast<uint4*>(qs + group * kLd + i * kVec) = make_uint4(0u, 0u, 0u, 0u);
  issue(0);
  issue(1);
  const FusedLane<D> f = fused_lane<D>(fi, t);
  pdl_begin();
  if (n_tiles > 0)
    fused_rows<D, (16 + 2 + kG * kW - 1) / (kG * kW)>(fi, f, q, ldq, t, kvh, group, width, k_cache,
                                                      v_cache, qs, new_k, new_v, warp, kG * kW,
                                                      lane);
  __syncthreads();  // the query rows and the new key and value
  for (int i = 0; gi + i * kG < n_tiles; ++i) {
    const int kt = gi + i * kG;
    bf16* ks = k_slot(i);
    bf16* vs = ks + kTile;
    tile_partial<D>(
        qs, ks, vs, ss + gi * group * kScoreLd, group, n_keys, kt, scale_log2, gw, lane,
        [&] {
          if (kt == n_tiles - 1 && gt < 2 * (D / kVec)) {  // the new key and value rows
            const int r = n_keys - 1 - kt * kKeys, half = gt / (D / kVec), cv = gt % (D / kVec);
            *reinterpret_cast<uint4*>((half == 0 ? ks : vs) + r * kLd + cv * kVec) =
                *reinterpret_cast<const uint4*>((half == 0 ? new_k : new_v) + cv * kVec);
          }
          cp_async_wait<3>();  // this tile's K (its V and the next tile may be in flight)
          group_barrier(1 + gi, kGroupThreads);
        },
        [&] {
          cp_async_wait<2>();
          group_barrier(1 + gi, kGroupThreads);
        },
        [&](int r) { return ps + (static_cast<size_t>(kt) * group + r) * (D + 2); });
    group_barrier(1 + gi, kGroupThreads);  // the slot and the scores are free again
    issue(i + 2);
  }
  cp_async_wait<0>();
  __syncthreads();  // every tile's partial
  for (int r = warp; r < group; r += kG * kW) {
    const int64_t col = static_cast<int64_t>(kvh * group + r) * D;
    merge_row<D, true>(ps + static_cast<size_t>(r) * (D + 2), n_tiles, group * (D + 2),
                       out + t * ldo + col, gate != nullptr ? gate + t * ldg + col : nullptr);
  }
}

template <int D>
__global__ void attention_merge_kernel(const float* __restrict__ partials, bf16* __restrict__ out,
                                       int64_t ldo, const bf16* __restrict__ gate, int64_t ldg,
                                       const int32_t* __restrict__ seq_len, int64_t rows, int hq) {
  pdl_begin();
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + (threadIdx.x >> 5);
  if (row >= rows) return;
  const int64_t t = row / hq, col = (row % hq) * D;
  merge_row<D>(partials + row * kMaxSplitTiles * (D + 2), (seq_len[t] + kKeys - 1) / kKeys, D + 2,
               out + t * ldo + col, gate != nullptr ? gate + t * ldg + col : nullptr);
}

constexpr float kLog2e = 1.4426950408889634f;

// True when a decode step (one token per sequence) with short contexts
// splits each row's key tiles over blocks (latency: one tile per block
// instead of a walk): the caller gave a workspace and the contexts fit it.
// The values are the row kernel's (header note), so this choice may depend
// on the batch.
bool split_applies(const AttentionBatch& b, int64_t hq, int group) {
  const int64_t max_tiles = (b.max_seq_len + kKeys - 1) / kKeys;
  return b.partials != nullptr && b.total_tokens == b.num_seqs && group <= 16 &&
         max_tiles <= kMaxSplitTiles && b.total_tokens * hq <= b.partial_rows;
}

// The split kernel (fused or not) with its merge; needs split_applies().
template <int D, bool kFused>
void launch_split(const bf16* q, int64_t ldq, bf16* k_cache, bf16* v_cache, bf16* out, int64_t ldo,
                  const bf16* gate, int64_t ldg, const AttentionBatch& b, int64_t hkv, int group,
                  float scale, const FusedInput& fi, cudaStream_t stream) {
  set_max_dynamic_smem(attention_split_kernel<D, kFused>,
                       static_cast<int>(split_smem_bytes<D>(16)));
  const int64_t max_tiles = (b.max_seq_len + kKeys - 1) / kKeys;
  const dim3 grid(static_cast<unsigned>(b.num_seqs * max_tiles), static_cast<unsigned>(hkv));
  launch_kernel(attention_split_kernel<D, kFused>, grid, 32 * split_warps<D>(),
                split_smem_bytes<D>(group), stream, q, ldq, k_cache, v_cache, b.partials, b.q_start,
                b.seq_len, b.block_table, b.max_blocks, static_cast<int>(b.block_size),
                static_cast<int>(hkv), group, static_cast<int>(max_tiles), scale * kLog2e, fi);
  const int64_t rows = b.total_tokens * hkv * group;
  launch_kernel(attention_merge_kernel<D>, grid_1d(rows, 4), 128, 0, stream, b.partials, out, ldo,
                gate, ldg, b.seq_len, rows, static_cast<int>(hkv * group));
}

template <int D>
void launch(const bf16* q, int64_t ldq, const bf16* k_cache, const bf16* v_cache, bf16* out,
            int64_t ldo, const AttentionBatch& b, int64_t hkv, int group, float scale,
            cudaStream_t stream) {
  if (split_applies(b, hkv * group, group))
    // (the unfused kernel only reads the cache)
    return launch_split<D, false>(q, ldq, const_cast<bf16*>(k_cache), const_cast<bf16*>(v_cache),
                                  out, ldo, nullptr, 0, b, hkv, group, scale, FusedInput{}, stream);
  set_max_dynamic_smem(attention_mma_kernel<D>, static_cast<int>(smem_bytes<D>()));
  // note: sum over sequences of ceil(q_len / tokens_per_tile) is at most
  // total_tokens (q_len >= 1) and at most total_tokens / tpt + num_seqs;
  // blocks past the last tile return at once.
  const int64_t tpt = kRows / group;
  const int64_t blocks =
      std::min<int64_t>(b.total_tokens, (b.total_tokens + tpt - 1) / tpt + b.num_seqs);
  const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(hkv));
  launch_kernel(attention_mma_kernel<D>, grid, kThreads, smem_bytes<D>(), stream, q, ldq, k_cache,
                v_cache, out, ldo, b.q_start, b.seq_len, b.block_table,
                static_cast<int>(b.num_seqs), b.max_blocks, static_cast<int>(b.block_size),
                static_cast<int>(hkv), group, scale * kLog2e);
}

}  // namespace

bool attention_mma_supported(const bf16* q, int64_t ldq, const bf16* out, int64_t ldo, int64_t hq,
                             int64_t hkv, int64_t d) {
  if (d != 32 && d != 64 && d != 128 && d != 256) return false;
  if (hkv <= 0 || hq % hkv != 0 || kRows % (hq / hkv) != 0) return false;
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return aligned(q) && aligned(out) && ldq % kVec == 0 && ldo % 2 == 0;
}

namespace {

// note: the walk (attention_walk_kernel) rather than split + merge when
// every context fits kWalkTiles tiles and either fits kWalkShortTiles (two
// groups of warps, one round of tiles; the smaller block of 2 x 2 K / V
// slots, which can share an SM with a block of the qkv projection, measured
// as fast as three groups or faster)
// or the step's (sequence, kv head) blocks fill half to all of the SMs (one
// block an SM), or, for D <= 128, they number one to kWideWalkBlocksPerSm
// blocks an SM (one group of warps a block: two blocks share an SM, and
// the blocks run in waves). max_seq_len is, in captured graphs, the context
// bucket (decode_graphs.h), so a graph keeps its form. Decode tok/s walk /
// split (bench/cuda/RESULTS.md): H200, Qwen3-0.6B contexts <= 96 keys batch
// 1-8 +3-5%, contexts <= 384 batch 12-16 (128 blocks) +5%; Qwen3-30B-A3B
// batch 32 +1%; H100, one group a block, Qwen3-0.6B batch 24 +3%, 32 +8%,
// 64 +4%, the 30B-A3B batch 48-64 +1-2%. Not at batch 1 past 2 tiles (-3%):
// the few SMs holding the blocks then fetch up to 8 tiles' K and V each
// where the split spreads them over a block a tile; not past 4 blocks an SM
// (Qwen3-0.6B batch 128, 8 blocks an SM: -12%, the split's many small
// blocks keep more loads in flight), nor D 256 (Qwen3.5-0.8B batch 32-128:
// no faster). Both give the same bits, so the choice may depend on the
// batch; b.decode_form forces one (tests: kWalk takes one group a block
// past one block an SM).
constexpr int64_t kWideWalkBlocksPerSm = 4;

template <int D>
int walk_groups(const AttentionBatch& b, int64_t hkv, int group) {
  using Form = AttentionBatch::DecodeForm;
  const int64_t max_tiles = (b.max_seq_len + kKeys - 1) / kKeys;
  const int64_t blocks = b.num_seqs * hkv;
  if (b.decode_form == Form::kSplit || max_tiles > kWalkTiles) return 0;
  if (blocks > sm_count()) {
    const bool wide = b.decode_form == Form::kWalk || (b.decode_form == Form::kAuto && D <= 128 &&
                                                       blocks <= kWideWalkBlocksPerSm * sm_count());
    const size_t key_offsets = 2 * kKeys * sizeof(int64_t);
    return wide && walk_smem_bytes<D>(1, group) + key_offsets <=
                       static_cast<size_t>(max_dynamic_smem())
               ? 1
               : 0;
  }
  const bool short_contexts = max_tiles <= kWalkShortTiles;
  if (b.decode_form == Form::kAuto && !short_contexts && 2 * blocks < sm_count()) return 0;
  for (const int g : {3, 2}) {
    if (short_contexts && g == 3) continue;
    const size_t key_offsets = static_cast<size_t>(g) * 2 * kKeys * sizeof(int64_t);
    if (walk_smem_bytes<D>(g, group) + key_offsets <= static_cast<size_t>(max_dynamic_smem()))
      return g;
  }
  return 0;
}

template <int D, int kG>
void launch_walk(const DecodeAttentionInput& in, bf16* k_cache, bf16* v_cache, bf16* out,
                 int64_t ldo, const AttentionBatch& b, int64_t hkv, int group, float scale,
                 const FusedInput& fi, cudaStream_t stream) {
  const size_t smem = walk_smem_bytes<D>(kG, group);
  set_max_dynamic_smem(attention_walk_kernel<D, kG>, static_cast<int>(smem));
  const dim3 grid(static_cast<unsigned>(b.num_seqs), static_cast<unsigned>(hkv));
  launch_kernel(attention_walk_kernel<D, kG>, grid, 32 * split_warps<D>() * kG, smem, stream, in.q,
                in.ldq, k_cache, v_cache, out, ldo, in.gate, in.ldg, b.q_start, b.seq_len,
                b.block_table, b.max_blocks, static_cast<int>(b.block_size), static_cast<int>(hkv),
                group, scale * kLog2e, fi);
}

template <int D>
void launch_decode(const DecodeAttentionInput& in, bf16* k_cache, bf16* v_cache, bf16* out,
                   int64_t ldo, const AttentionBatch& b, int64_t hkv, int group, float scale,
                   const FusedInput& fi, cudaStream_t stream) {
  switch (walk_groups<D>(b, hkv, group)) {
    case 3:
      return launch_walk<D, 3>(in, k_cache, v_cache, out, ldo, b, hkv, group, scale, fi, stream);
    case 2:
      return launch_walk<D, 2>(in, k_cache, v_cache, out, ldo, b, hkv, group, scale, fi, stream);
    case 1:
      return launch_walk<D, 1>(in, k_cache, v_cache, out, ldo, b, hkv, group, scale, fi, stream);
    default:
      return launch_split<D, true>(in.q, in.ldq, k_cache, v_cache, out, ldo, in.gate, in.ldg, b,
                                   hkv, group, scale, fi, stream);
  }
}

bool decode_applies(const DecodeAttentionInput& in, bf16* out, int64_t ldo, const AttentionBatch& b,
                    int64_t hq, int64_t hkv, int64_t d) {
  return attention_mma_supported(in.q, in.ldq, out, ldo, hq, hkv, d) && d % 32 == 0 &&
         dev::rope_pairs_in_lane(in.rope) && in.rope.rotary_dim <= d &&
         split_applies(b, hq, static_cast<int>(hq / hkv));
}

}  // namespace

bool decode_attention_walks(const AttentionBatch& b, int64_t hq, int64_t hkv, int64_t d) {
  if (hkv <= 0 || hq % hkv != 0 || !split_applies(b, hq, static_cast<int>(hq / hkv))) return false;
  const int group = static_cast<int>(hq / hkv);
  switch (d) {
    case 64:
      return walk_groups<64>(b, hkv, group) > 0;
    case 128:
      return walk_groups<128>(b, hkv, group) > 0;
    case 256:
      return walk_groups<256>(b, hkv, group) > 0;
    default:
      return false;
  }
}

bool decode_attention(const DecodeAttentionInput& in, bf16* k_cache, bf16* v_cache, bf16* out,
                      int64_t ldo, const AttentionBatch& b, int64_t hq, int64_t hkv, int64_t d,
                      float scale, cudaStream_t stream) {
  if (!decode_applies(in, out, ldo, b, hq, hkv, d)) return false;
  const int group = static_cast<int>(hq / hkv);
  const FusedInput fi{in, b.total_tokens};
  switch (d) {
    case 64:
      launch_decode<64>(in, k_cache, v_cache, out, ldo, b, hkv, group, scale, fi, stream);
      return true;
    case 128:
      launch_decode<128>(in, k_cache, v_cache, out, ldo, b, hkv, group, scale, fi, stream);
      return true;
    case 256:
      launch_decode<256>(in, k_cache, v_cache, out, ldo, b, hkv, group, scale, fi, stream);
      return true;
    default:
      return false;
  }
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
