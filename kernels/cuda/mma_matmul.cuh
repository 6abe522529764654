// The tensor-core form of the weight product of kernels/cuda/warp_matmul.h
// for bf16 activations: block-FP8 or bf16 weights, f32 accumulation, one
// fixed reduction order per shape. Device code, included by
// warp_matmul.cuh only (launch_warp_matmul picks it; see the note there).
//
// The arithmetic of one output y[r, n] (x = the row's bf16 activations,
// w = weight row n):
//   K is cut into 64-element chunks, and the chunks into W = 4 contiguous
//   ranges (range r: chunks r * nchunks / W .. (r+1) * nchunks / W - 1),
//   each summed on its own from zero.
//   A chunk is four k16 steps of mma.sync.m16n8k16 (bf16 in, f32 chained
//   accumulator). Step j of a chunk holds k = 16t + 4j + {0,1,2,3} of the
//   chunk for t = 0..3: thread t's 16 contiguous k land in its four steps,
//   so a lane reads 16 contiguous bytes of weights (FP8) per row and chunk.
//   Dense bf16 weights: one chain runs over the whole range.
//   Block-FP8: the chain restarts from 0 in each scale block (block_cols a
//   multiple of 64, so a chunk never straddles two) and ends in
//   acc = fmaf(chain, scale[n / block_rows][block], acc): the e4m3 values
//   enter the tensor core exactly (every e4m3 value is a bf16 value) and
//   the scale is applied once per block.
//   The W range sums are added in range order: ((a0 + a1) + a2) + a3.
// note: batch invariance. Nothing above depends on M, on the row's place
// in its pass or group, or on the other rows: a tensor-core output element
// depends on its own A row, B column and accumulator only, and the chunks,
// steps, K split and additions are functions of K (and the scale blocks).
// The token rows per pass (8, 16, 32 or 64) and the three kernel forms
// below change which rows share an instruction and who computes a range,
// never a row's bits; a chain's first step taking +0.0 as its accumulator
// (mma_bf16_from_zero) is the same as a chain started from zeroed
// registers.
//
// Three kernels compute that sum:
//   narrow (up to 16 rows a group): a block is 16 output columns and 4
//     warps, warp r computing range r for every row, each warp streaming
//     its chunks of weights and activations through its own cp.async ring
//     in shared memory: the decode form, bound by the weight reads, which
//     need many warps per column. With SwiGLU pairs (MmaOperands::pair) a
//     block is 8 gate rows and their 8 up rows, and stores silu(gate) * up.
//   split (more rows, the default on sm_90): a block is 64 output columns
//     and 16 warps, 4 per range; each range's warps stream that range's
//     chunks of activations (a pass of up to 64 or 32 rows) and of the
//     block's 64 weight rows through their own cp.async ring, and the 4
//     range sums meet in shared memory at the end of the pass.
//   wide (more rows, QTK_MMA_WIDE=4 or GPUs with less shared memory per
//     block): a block is 64 output columns, 4 warps of 16 each walking the
//     4 ranges in turn through one 4-stage ring.
// So a row gets the same bits in a call of 1 row or of 5,000, in a group of
// 1 or of 500 (tested: MmaMatmul.* in tests/cuda/test_warp_matmul.cpp,
// MoeBlockTest.* in tests/cuda/test_moe.cpp).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/row_groups.cuh"

namespace qtk::cuda::dev {

constexpr int kMmaRanges = 4;  // the K split: ranges summed apart (the narrow kernel's warps)
constexpr int kMmaChunk = 64;  // K elements per chunk

// Two e4m3 values (lo: the lower k) as a bf16 pair, exactly.
// note: the hardware converts e4m3 pairs to f16 pairs exactly; f16 -> f32
// is exact, and f32 -> bf16 is exact for these values (at most 4
// significant bits, exponents -9 .. 8, all normal in bf16). 4 instructions
// a pair: the unpack, two f16 -> f32 and one pack.
__device__ __forceinline__ uint32_t e4m3x2_to_bf16x2(uint32_t pair) {
  const __half2_raw h2 =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(pair), __NV_E4M3);
  const float2 f = __half22float2(__half2(h2));
  const __nv_bfloat162 v = __float22bfloat162_rn(f);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// The A fragments of one chunk for a warp's 16 weight rows: a[j] for step
// j (kernels/cuda/mma.cuh's layout: a0 row g, a1 row g+8 with the step's
// k pair 0..1, a2 / a3 the pair 2..3), from the lane's 16 contiguous k of
// rows g and g+8 as 8 bf16 pairs each (pair p = k 2p, 2p+1).
__device__ __forceinline__ void chunk_fragments(const uint32_t (&lo)[8], const uint32_t (&hi)[8],
                                                uint32_t (&a)[4][4]) {
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    a[j][0] = lo[2 * j];
    a[j][1] = hi[2 * j];
    a[j][2] = lo[2 * j + 1];
    a[j][3] = hi[2 * j + 1];
  }
}

// One weight row's 16 k of a chunk, raw: 16 e4m3 bytes (one uint4) or 16
// bf16 (two uint4).
template <bool kFp8>
struct RawPiece {
  uint4 v[kFp8 ? 1 : 2];
};

// Two 16-byte pieces as 8 32-bit words (bf16 pairs), in memory order.
__device__ __forceinline__ void unpack_pairs(const uint4& v0, const uint4& v1, uint32_t (&w)[8]) {
  w[0] = v0.x, w[1] = v0.y, w[2] = v0.z, w[3] = v0.w;
  w[4] = v1.x, w[5] = v1.y, w[6] = v1.z, w[7] = v1.w;
}

template <bool kFp8>
__device__ __forceinline__ void piece_pairs(const RawPiece<kFp8>& p, uint32_t (&w)[8]) {
  if constexpr (kFp8) {
    const uint32_t b[4] = {p.v[0].x, p.v[0].y, p.v[0].z, p.v[0].w};
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      w[2 * q] = e4m3x2_to_bf16x2(b[q] & 0xFFFFu);
      w[2 * q + 1] = e4m3x2_to_bf16x2(b[q] >> 16);
    }
  } else {
    unpack_pairs(p.v[0], p.v[1], w);
  }
}

// What a kernel reads: the weights (one of wd / wq), the scales, the rows.
struct MmaOperands {
  const __nv_bfloat16* x;
  int64_t ldx;
  const __nv_bfloat16* wd;  // bf16 [G * N, K]
  const uint8_t* wq;        // e4m3 [G * N, K]
  const float* scale;       // f32 [ceil(G*N / br), ld_scale]
  int br, bc, ld_scale;
  int N, K;
  // SwiGLU pairs (narrow kernel only): 0, or I = N / 2 when the weight is
  // gate rows 0..I-1 over up rows I..2I-1 and y gets silu(gate) * up.
  int pair;
};

// The row (within its group) of local weight row rl (0..15) of a narrow
// block whose first output column is n0; false past the matrix. In SwiGLU
// pairs, rows 0..7 are the gates of columns n0..n0+7 and rows 8..15 their
// ups, so a lane's rows g and g + 8 meet in its own accumulators.
__device__ __forceinline__ bool block_row(const MmaOperands& o, int n0, int rl, int& n) {
  if (o.pair == 0) {
    n = n0 + rl;
    return n < o.N;
  }
  const int j = n0 + (rl & 7);
  n = j + (rl < 8 ? 0 : o.pair);
  return j < o.pair;
}

// The chunks of range r (of kMmaRanges) of K.
__device__ __forceinline__ void chunk_range(int K, int r, int& c0, int& c1) {
  const int nchunks = (K + kMmaChunk - 1) / kMmaChunk;
  c0 = r * nchunks / kMmaRanges;
  c1 = (r + 1) * nchunks / kMmaRanges;
}

// The scale rows of a lane's weight rows g and g + 8 of n0 .. n0 + 15 in
// group grp (FP8; rows past N get none).
struct ScaleRows {
  const float* lo;
  const float* hi;

  __device__ __forceinline__ ScaleRows(const MmaOperands& o, int grp, int n0, int lane) {
    const int g = lane >> 2;
    const int64_t wlo = static_cast<int64_t>(grp) * o.N + n0 + g, whi = wlo + 8;
    lo = o.scale != nullptr && n0 + g < o.N ? o.scale + (wlo / o.br) * o.ld_scale : nullptr;
    hi = o.scale != nullptr && n0 + g + 8 < o.N ? o.scale + (whi / o.br) * o.ld_scale : nullptr;
  }
  // The scales of block kb for rows g and g + 8.
  __device__ __forceinline__ void get(int kb, float& s_lo, float& s_hi) const {
    s_lo = lo != nullptr ? __ldg(lo + kb) : 0.0f;
    s_hi = hi != nullptr ? __ldg(hi + kb) : 0.0f;
  }
};

// Where the FP8 chains of a run of chunks end: the scale block of the
// current chunk (kb) and its chunks left, counted rather than divided per
// chunk (block_cols is a multiple of the chunk).
struct BlockCursor {
  int cpb, kb, left;
  __device__ __forceinline__ BlockCursor(int c0, int bc)
      : cpb(bc / kMmaChunk), kb(c0 / cpb), left(cpb - c0 % cpb) {}
  // Past one chunk: true when it was its block's last.
  __device__ __forceinline__ bool step() {
    if (--left != 0) return false;
    ++kb;
    left = cpb;
    return true;
  }
};

// One token tile's 4 steps of a chunk: b = the tile's 8 bf16 pairs of this
// lane's token row (pair p = k 16t + 2p, +1), into d. With kFromZero the
// chunk starts a chain: its first step adds +0.0 rather than d (what d = 0
// before the chunk would give, without the zeroing).
template <bool kFromZero = false>
__device__ __forceinline__ void tile_steps(const uint32_t (&a)[4][4], const uint32_t (&b)[8],
                                           float (&d)[4]) {
#pragma unroll
  for (int j = 0; j < 4; ++j)
    if (kFromZero && j == 0)
      mma_bf16_from_zero(d, a[0], b[0], b[1]);
    else
      mma_bf16(d, a[j], b[2 * j], b[2 * j + 1]);
}

// One chunk's products for NT token tiles, into acc (dense) or the block
// chain (FP8).
template <int NT>
__device__ __forceinline__ void chunk_products(const uint32_t (&a)[4][4],
                                               const uint32_t (&b)[NT][8], float (&sum)[NT][4]) {
#pragma unroll
  for (int i = 0; i < NT; ++i) tile_steps(a, b[i], sum[i]);
}

// A pass's range sum and FP8 chain, from zero.
template <int NT>
__device__ __forceinline__ void zero_sums(float (&acc)[NT][4], float (&chain)[NT][4]) {
#pragma unroll
  for (int i = 0; i < NT; ++i)
#pragma unroll
    for (int q = 0; q < 4; ++q) acc[i][q] = chain[i][q] = 0.0f;
}

// Where a scale block or the range ends: acc = fmaf(chain, scale, acc)
// (rows g: s_lo, g + 8: s_hi); with kReset the chain restarts from zeros
// (without, the next chunk must start it: tile_steps<true>).
template <int NT, bool kReset = true>
__device__ __forceinline__ void fold_chain(float (&chain)[NT][4], float (&acc)[NT][4], float s_lo,
                                           float s_hi) {
#pragma unroll
  for (int i = 0; i < NT; ++i) {
    acc[i][0] = fmaf(chain[i][0], s_lo, acc[i][0]);
    acc[i][1] = fmaf(chain[i][1], s_lo, acc[i][1]);
    acc[i][2] = fmaf(chain[i][2], s_hi, acc[i][2]);
    acc[i][3] = fmaf(chain[i][3], s_hi, acc[i][3]);
    if constexpr (kReset)
#pragma unroll
      for (int q = 0; q < 4; ++q) chain[i][q] = 0.0f;
  }
}

// A chunk's A fragments from the lane's raw pieces of weight rows g and g + 8.
template <bool kFp8>
__device__ __forceinline__ void weight_fragments(const RawPiece<kFp8>& plo,
                                                 const RawPiece<kFp8>& phi, uint32_t (&a)[4][4]) {
  uint32_t lo[8], hi[8];
  piece_pairs<kFp8>(plo, lo);
  piece_pairs<kFp8>(phi, hi);
  chunk_fragments(lo, hi, a);
}

// One chunk on a warp: the weights' A fragments from rows g and g + 8, then
// the products into sum (the FP8 block chain, or the dense range sum).
template <int NT, bool kFp8>
__device__ __forceinline__ void chunk_mma(const RawPiece<kFp8>& plo, const RawPiece<kFp8>& phi,
                                          const uint32_t (&b)[NT][8], float (&sum)[NT][4]) {
  uint32_t a[4][4];
  weight_fragments<kFp8>(plo, phi, a);
  chunk_products<NT>(a, b, sum);
}

// C element q of tile i: weight row g + 8*(q/2), token row 8i + 2t + q%2.
template <class Y>
__device__ __forceinline__ void store_element(Y* y, int64_t ldy, int rb, int r1, int n0, int N,
                                              int lane, int i, int q, float v) {
  const int g = lane >> 2, t = lane & 3;
  const int r = rb + 8 * i + 2 * t + (q & 1), n = n0 + g + 8 * (q >> 1);
  if (r < r1 && n < N) y[static_cast<int64_t>(r) * ldy + n] = from_f<Y>(v);
}

// note: row strides in shared memory: 144 bytes for 64 bf16 (16 bytes of
// padding) and 64 bytes for 64 e4m3: the 8 lanes of a 16-byte
// shared-memory phase (rows g, g+1, t = 0..3, 16 or 32 bytes apart) hit 8
// distinct 16-byte bank groups.
constexpr int kXStride = 144;  // bytes per staged activation row (bf16)
template <bool kFp8>
constexpr int w_stride() {  // bytes per staged weight row
  return kFp8 ? 64 : 144;
}

// ---- narrow: 16 columns a block, warp r = range r --------------------------

// Each warp streams its range through its own ring of chunk stages in
// shared memory (cp.async, no block barrier): a stage holds the chunk of
// the block's 16 weight rows, of the pass's 8 * kMaxNT activation rows and,
// for FP8, the 16 rows' scales of the chunk's block.
// note: copies into shared memory hold no registers while in flight, so the
// ring can be deep (the FP8 decode form keeps 5 chunks of weights in flight
// per warp at 4 blocks per SM), and a lane's instructions per chunk are the
// copies, 4 fragment loads, the conversions and 4 mma steps.
// The ring depth of FP8 products of many groups of up to 8 rows, and the
// least groups a launch has for it (warp_matmul.cuh says why).
constexpr int kNarrowShallowDepth = 4;
constexpr int64_t kNarrowShallowGroups = 16;
// kD: the stages a warp (0: the default below).
template <bool kFp8, int kMaxNT, int kD = 0>
struct NarrowLayout {
  static constexpr bool kFp8Decode = kFp8 && kMaxNT == 1;
  static constexpr int kDepth = kD > 0 ? kD : kFp8Decode ? 6 : 4;  // stages per warp
  static constexpr int kXOff = 16 * w_stride<kFp8>();
  static constexpr int kSOff = kXOff + 8 * kMaxNT * kXStride;
  static constexpr int kStage = kSOff + (kFp8 ? 16 * 4 : 0);
  static constexpr int kBlockBytes = kMmaRanges * kDepth * kStage;
  static constexpr int kPieces = kFp8 ? 4 : 8;           // 16-byte pieces per weight row and chunk
  static constexpr int kLanePieces = 16 * kPieces / 32;  // of them per lane: 2 or 4
};

// The copies of one warp's weight chunks: this lane's 16-byte pieces of
// the 16 rows and (FP8, lanes 0..15) row n0 + lane's scale of the chunk's
// block. Chunks are issued in increasing order from start().
template <bool kFp8, int kMaxNT>
struct NarrowWeights {
  using L = NarrowLayout<kFp8, kMaxNT>;
  const unsigned char* src[L::kLanePieces];  // piece i's bytes at chunk 0
  bool row_ok[L::kLanePieces];
  int k_piece;                    // the pieces' first k within a chunk
  const float* srow;              // FP8: the scale row of row n0 + lane (lanes 0..15), or nullptr
  BlockCursor cur{0, kMmaChunk};  // FP8: the scale block of the next chunk issued

  __device__ __forceinline__ NarrowWeights(const MmaOperands& o, int grp, int n0, int lane) {
    const int row0 = lane / L::kPieces, piece = lane % L::kPieces;
    k_piece = piece * (kFp8 ? 16 : 8);
#pragma unroll
    for (int i = 0; i < L::kLanePieces; ++i) {
      int n;
      row_ok[i] = block_row(o, n0, row0 + i * (32 / L::kPieces), n);
      const int64_t w = (static_cast<int64_t>(grp) * o.N + n) * o.K + k_piece;
      src[i] = kFp8 ? o.wq + w : reinterpret_cast<const unsigned char*>(o.wd + w);
    }
    srow = nullptr;
    int n;
    if (kFp8 && lane < 16 && block_row(o, n0, lane, n))
      srow = o.scale + ((static_cast<int64_t>(grp) * o.N + n) / o.br) * o.ld_scale;
  }
  __device__ __forceinline__ void start(const MmaOperands& o, int c0) {
    if constexpr (kFp8) cur = BlockCursor(c0, o.bc);
  }
  // Chunk c's weights (and scales) into the stage at shared address st.
  __device__ __forceinline__ void issue(const MmaOperands& o, int c, uint32_t st, int lane) {
    constexpr int kRowStep = 32 / L::kPieces;  // rows between a lane's pieces
    const uint32_t dst = st + (lane / L::kPieces) * w_stride<kFp8>() + (lane % L::kPieces) * 16;
    const bool k_ok = c * kMmaChunk + k_piece < o.K;
    const int64_t off = static_cast<int64_t>(c) * kMmaChunk * (kFp8 ? 1 : 2);
#pragma unroll
    for (int i = 0; i < L::kLanePieces; ++i) {
      const bool ok = row_ok[i] && k_ok;
      cp_async_16(dst + i * kRowStep * w_stride<kFp8>(), ok ? src[i] + off : src[0], ok);
    }
    if constexpr (kFp8) {
      if (srow != nullptr) cp_async_4(st + L::kSOff + 4 * lane, srow + cur.kb);
      cur.step();
    }
  }
};

// Rows rb .. rb + 8*NT - 1 (those below r1) of the block's 16 columns: this
// warp's range sum into red[warp] (f32 [NT][4][32] per warp). ring: the
// warp's stages; weights_issued: the prologue's weight chunks are already
// on their way (requested by the kernel before it read the rows).
template <int NT, int kMaxNT, bool kFp8, int kD = 0>
__device__ __forceinline__ void narrow_pass(const MmaOperands& o, const int32_t* row_source, int rb,
                                            int r1, NarrowWeights<kFp8, kMaxNT>& nw, int c0, int c1,
                                            bool weights_issued, unsigned char* ring, float* red) {
  using L = NarrowLayout<kFp8, kMaxNT, kD>;
  constexpr int D = L::kDepth;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  // This lane's activation copies: 16 bytes of rows lane/8 + 4i of the pass
  // (rows at or past r1 are not copied: a B column reaches only its own
  // output column, and those are never stored).
  const __nv_bfloat16* xsrc[2 * NT];
#pragma unroll
  for (int i = 0; i < 2 * NT; ++i) {
    const int r = rb + (lane >> 3) + 4 * i;
    xsrc[i] = r < r1
                  ? o.x + static_cast<int64_t>(row_source != nullptr ? row_source[r] : r) * o.ldx +
                        8 * (lane & 7)
                  : nullptr;
  }
  const uint32_t base = smem_addr(ring);
  const uint32_t xdst = L::kXOff + (lane >> 3) * kXStride + 16 * (lane & 7);
  const auto issue_x = [&](int c, uint32_t st) {
    const bool k_ok = c * kMmaChunk + 8 * (lane & 7) < o.K;
#pragma unroll
    for (int i = 0; i < 2 * NT; ++i)
      if (xsrc[i] != nullptr)
        cp_async_16(st + xdst + i * 4 * kXStride, k_ok ? xsrc[i] + c * kMmaChunk : o.x, k_ok);
  };
  if (!weights_issued) nw.start(o, c0);
#pragma unroll
  for (int s = 0; s < D - 1; ++s) {
    if (c0 + s < c1) {
      if (!weights_issued) nw.issue(o, c0 + s, base + s * L::kStage, lane);
      issue_x(c0 + s, base + s * L::kStage);
    }
    cp_async_commit();
  }
  float acc[NT][4], chain[NT][4];
  zero_sums(acc, chain);
  BlockCursor cur(c0, kFp8 ? o.bc : kMmaChunk);  // FP8: where the chains end
  int slot = 0;
  for (int c = c0; c < c1; ++c) {
    cp_async_wait<D - 2>();
    __syncwarp();  // every lane's copies of chunk c are in; all are done with chunk c - 1
    const int next = c + D - 1;
    const int next_slot = slot == 0 ? D - 1 : slot - 1;  // chunk c - 1's slot
    if (next < c1) {
      nw.issue(o, next, base + next_slot * L::kStage, lane);
      issue_x(next, base + next_slot * L::kStage);
    }
    cp_async_commit();
    const unsigned char* st = ring + slot * L::kStage;
    RawPiece<kFp8> plo, phi;
    constexpr int kWs = w_stride<kFp8>();
#pragma unroll
    for (int v = 0; v < (kFp8 ? 1 : 2); ++v) {
      plo.v[v] = reinterpret_cast<const uint4*>(st + g * kWs + (kFp8 ? 16 : 32) * t)[v];
      phi.v[v] = reinterpret_cast<const uint4*>(st + (g + 8) * kWs + (kFp8 ? 16 : 32) * t)[v];
    }
    uint32_t b[NT][8];
#pragma unroll
    for (int i = 0; i < NT; ++i) {
      const uint4* xs =
          reinterpret_cast<const uint4*>(st + L::kXOff + (8 * i + g) * kXStride + 32 * t);
      unpack_pairs(xs[0], xs[1], b[i]);
    }
    if constexpr (kFp8) {
      chunk_mma<NT, kFp8>(plo, phi, b, chain);
      if (cur.step() || c + 1 == c1)
        fold_chain<NT>(chain, acc, *reinterpret_cast<const float*>(st + L::kSOff + 4 * g),
                       *reinterpret_cast<const float*>(st + L::kSOff + 4 * (g + 8)));
    } else {
      chunk_mma<NT, kFp8>(plo, phi, b, acc);
    }
    slot = slot + 1 == D ? 0 : slot + 1;
  }
#pragma unroll
  for (int i = 0; i < NT; ++i)
#pragma unroll
    for (int q = 0; q < 4; ++q) red[((warp * NT + i) * 4 + q) * 32 + lane] = acc[i][q];
}

// Element q of tile i of lane's accumulators: the 4 range sums added in
// range order.
template <int NT>
__device__ __forceinline__ float range_sum(const float* red, int lane, int i, int q) {
  float s = red[(i * 4 + q) * 32 + lane];
#pragma unroll
  for (int r = 1; r < kMmaRanges; ++r) s += red[((r * NT + i) * 4 + q) * 32 + lane];
  return s;
}

// The sums stored; in SwiGLU pairs, silu(gate) * up of the pair, each
// rounded to Y first as gate_up would be stored, exactly the arithmetic of
// the swiglu kernel (kernels/cuda/elementwise.cu).
template <int NT, class Y>
__device__ __forceinline__ void narrow_store(const MmaOperands& o, const float* red, int rb, int r1,
                                             int n0, Y* y, int64_t ldy) {
  if (o.pair == 0) {
    for (int e = threadIdx.x; e < NT * 4 * 32; e += blockDim.x) {
      const int lane = e & 31, q = (e >> 5) & 3, i = e >> 7;
      store_element(y, ldy, rb, r1, n0, o.N, lane, i, q, range_sum<NT>(red, lane, i, q));
    }
    return;
  }
  for (int e = threadIdx.x; e < NT * 2 * 32; e += blockDim.x) {
    const int lane = e & 31, q = (e >> 5) & 1, i = e >> 6;
    const float gate = to_f(from_f<Y>(range_sum<NT>(red, lane, i, q)));
    const float up = to_f(from_f<Y>(range_sum<NT>(red, lane, i, q + 2)));
    const int r = rb + 8 * i + 2 * (lane & 3) + q, j = n0 + (lane >> 2);
    if (r < r1 && j < o.pair) y[static_cast<int64_t>(r) * ldy + j] = from_f<Y>(silu(gate) * up);
  }
}

template <int NT, int kMaxNT, class Y, bool kFp8, int kD = 0>
__device__ __forceinline__ void narrow_block_pass(const MmaOperands& o, const int32_t* row_source,
                                                  int rb, int r1, int n0,
                                                  NarrowWeights<kFp8, kMaxNT>& nw, int c0, int c1,
                                                  bool weights_issued, unsigned char* ring,
                                                  float* red, Y* y, int64_t ldy) {
  narrow_pass<NT, kMaxNT, kFp8, kD>(o, row_source, rb, r1, nw, c0, c1, weights_issued, ring, red);
  __syncthreads();
  narrow_store<NT, Y>(o, red, rb, r1, n0, y, ldy);
  __syncthreads();
}

// Group slot blockIdx.y's rows for columns blockIdx.x * 16 .. + 15 (in
// SwiGLU pairs, output columns blockIdx.x * 8 .. + 7), in passes of
// 8 * kMaxNT rows (16 or 8). Dynamic shared memory:
// NarrowLayout<kFp8, kMaxNT>::kBlockBytes. note: kMaxNT 1, for groups of up
// to 8 rows, stages half the activation rows, so the ring can be deeper; it
// changes no bits.
// note: each warp requests its first stages of weights as soon as it knows
// whose they are, before the loads that only the rows need: without groups
// before the dependency wait (dev::pdl_begin; the weights do not depend on
// the kernel before), overlapping the previous kernel's tail; with settled
// groups (the experts' down_proj: the front wrote them two launches back)
// also before the wait, right after reading the block's group through L2
// (its row span behind the requests); with other groups (gate_up, right
// behind the front) right after reading the block's group, ahead of its
// row span and the rows' sources.
template <class Y, bool kFp8, int kMaxNT, int kD = 0>
__global__ void __launch_bounds__(kMmaRanges * 32)
    mma_narrow_kernel(MmaOperands o, Y* __restrict__ y, int64_t ldy, RowGroups rg) {
  using L = NarrowLayout<kFp8, kMaxNT, kD>;
  extern __shared__ __align__(16) unsigned char narrow_smem_buf[];
  __shared__ float red[kMmaRanges * kMaxNT * 4 * 32];  // [range][tile][q][lane]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int n0 = blockIdx.x * (o.pair != 0 ? 8 : 16);  // the block's first output column
  unsigned char* ring = narrow_smem_buf + warp * L::kDepth * L::kStage;
  int c0, c1;
  chunk_range(o.K, warp, c0, c1);
  const auto request_weights = [&](NarrowWeights<kFp8, kMaxNT>& nw) {
    nw.start(o, c0);
    const uint32_t base = smem_addr(ring);
#pragma unroll
    for (int s = 0; s < L::kDepth - 1; ++s)
      if (c0 + s < c1) nw.issue(o, c0 + s, base + s * L::kStage, lane);
  };
  const bool grouped = rg.offsets != nullptr;
  NarrowWeights<kFp8, kMaxNT> nw(o, 0, n0, lane);
  int grp = 0, r0 = 0, r1 = 0;
  // The block's group, its expert's weights requested, then its row span
  // (behind the requests: one round trip before them); false: no rows.
  const auto take_group = [&] {
    if (!group_slot(rg, grp)) return false;
    if (grouped) {
      nw = NarrowWeights<kFp8, kMaxNT>(o, grp, n0, lane);
      request_weights(nw);
    }
    group_span(rg, grp, r0, r1);
    return true;
  };
  if (!grouped && rg.rows > 0) request_weights(nw);
  const bool early = grouped && rg.settled;  // settled groups: all of it before the wait
  bool has_rows = early ? take_group() : true;
  pdl_begin();
  if (!early) has_rows = take_group();
  if (!has_rows) return;
  bool issued = true;
  for (int rb = r0; rb < r1; rb += 8 * kMaxNT) {
    if (kMaxNT == 2 && r1 - rb > 8)
      narrow_block_pass<kMaxNT, kMaxNT, Y, kFp8, kD>(o, rg.row_source, rb, r1, n0, nw, c0, c1,
                                                     issued, ring, red, y, ldy);
    else
      narrow_block_pass<1, kMaxNT, Y, kFp8, kD>(o, rg.row_source, rb, r1, n0, nw, c0, c1, issued,
                                                ring, red, y, ldy);
    issued = false;
  }
  cp_async_wait<0>();  // (a block without rows leaves no copy in flight)
}

// ---- wide: 64 columns a block, each warp 16 of them over every range -------

constexpr int kWideWarps = 4;
constexpr int kWideRows = 64;                      // token rows per pass, at most
constexpr int kWideStages = 4;                     // chunks in flight (cp.async ring)
constexpr int kWideXBytes = kWideRows * kXStride;  // one chunk's activations
template <bool kFp8>
constexpr int wide_stage_bytes() {
  return kWideXBytes + 16 * kWideWarps * w_stride<kFp8>();
}
template <bool kFp8>
constexpr int wide_smem() {
  return kWideStages * wide_stage_bytes<kFp8>();
}

// The copies of one pass's chunks by 128 threads (tid 0..127): the
// activations of rows rb .. rb + 8*NT - 1 (those below r1) and the 64
// weight rows of group grp from column n_block (those below N).
// Each thread's sources and shared-memory offsets are worked out once per
// pass, so a chunk's copies cost an add and a compare each.
// note: thread tid copies 16-byte piece tid & 7 of activation rows
// tid / 8 + 16 i, and piece tid % P of weight rows tid / P + 128 / P * i
// (P = 4 pieces a row for FP8, 8 for bf16): a warp's copies fill whole
// 128-byte row segments.
template <int NT, bool kFp8>
struct StageCopies {
  static constexpr int kThreads = 128;
  static constexpr int kX = (NT * 64 + kThreads - 1) / kThreads;  // activation pieces a thread
  static constexpr int kP = kFp8 ? 4 : 8;                         // pieces per weight row
  static constexpr int kW = 64 * kP / kThreads;                   // weight pieces a thread
  const __nv_bfloat16* xsrc[kX];  // chunk 0's piece (o.x for no row)
  const unsigned char* wsrc[kW];  // likewise
  uint32_t rows_ok;               // bit i: x piece i has a row; bit 8 + i: weight piece i
  int xk, wk;                     // the pieces' first k within a chunk
  uint32_t xdst, wdst;            // piece 0's offsets in a stage

  __device__ __forceinline__ StageCopies(const MmaOperands& o, const int32_t* row_source, int rb,
                                         int r1, int grp, int n_block, int x_bytes, int tid) {
    rows_ok = 0;
    xk = (tid & 7) * 8;
#pragma unroll
    for (int i = 0; i < kX; ++i) {
      const int row = (tid >> 3) + 16 * i, r = rb + row;
      const bool ok = row < NT * 8 && r < r1;
      rows_ok |= ok ? 1u << i : 0u;
      xsrc[i] =
          ok ? o.x + static_cast<int64_t>(row_source != nullptr ? row_source[r] : r) * o.ldx + xk
             : o.x;
    }
    xdst = (tid >> 3) * kXStride + (tid & 7) * 16;
    wk = (tid % kP) * (kFp8 ? 16 : 8);
#pragma unroll
    for (int i = 0; i < kW; ++i) {
      const int n = n_block + tid / kP + kThreads / kP * i;
      const int64_t w = (static_cast<int64_t>(grp) * o.N + n) * o.K + wk;
      rows_ok |= n < o.N ? 1u << (8 + i) : 0u;
      wsrc[i] = n >= o.N ? reinterpret_cast<const unsigned char*>(o.x)
                : kFp8   ? o.wq + w
                         : reinterpret_cast<const unsigned char*>(o.wd + w);
    }
    wdst = x_bytes + (tid / kP) * w_stride<kFp8>() + (tid % kP) * 16;
  }
  // Chunk c into the stage at shared address st: every piece is one
  // cp.async, zero-filled (its source not read) where it has no row or lies
  // past K, so no thread branches. note: zeros in rows past r1 or N are not
  // needed (a B column, a token row, reaches only its own output row and an
  // A row, a weight row, its own output column, and those are never
  // stored); past K both operands must be zeros.
  __device__ __forceinline__ void issue(const MmaOperands& o, int c, uint32_t st) const {
    const int k0 = c * kMmaChunk;
    const bool xk_ok = k0 + xk < o.K, wk_ok = k0 + wk < o.K;
#pragma unroll
    for (int i = 0; i < kX; ++i)
      cp_async_16(st + xdst + i * 16 * kXStride, xsrc[i] + k0, xk_ok && (rows_ok >> i & 1u));
    const int64_t wk0 = static_cast<int64_t>(k0) * (kFp8 ? 1 : 2);
#pragma unroll
    for (int i = 0; i < kW; ++i)
      cp_async_16(st + wdst + i * (kThreads / kP) * w_stride<kFp8>(), wsrc[i] + wk0,
                  wk_ok && (rows_ok >> (8 + i) & 1u));
  }
};

// One staged chunk on a warp: xl = the stage's activations and wl = the
// warp's 16 weight rows, each already offset to this lane's first bytes
// (staged_lane_offsets); the products go into the FP8 block chain, folded
// into acc with the rows' scales where the scale block (or, last, the
// range) ends, or straight into acc (dense).
// note: each token tile's fragments are loaded right before its 4 steps,
// so 8 registers of activations are live rather than 8 per tile; the lane
// offsets are worked out once per pass, not per chunk.
template <int NT, bool kFromZero>
__device__ __forceinline__ void staged_tiles(const unsigned char* xl, const uint32_t (&a)[4][4],
                                             float (&sum)[NT][4]) {
#pragma unroll
  for (int i = 0; i < NT; ++i) {
    const uint4* xs = reinterpret_cast<const uint4*>(xl + 8 * i * kXStride);
    uint32_t b[8];
    unpack_pairs(xs[0], xs[1], b);
    tile_steps<kFromZero>(a, b, sum[i]);
  }
}

// This lane's offsets into a stage's activations (row g, k 16t..) and into
// a warp's weight rows (row g, k 16t..).
template <bool kFp8>
__device__ __forceinline__ void staged_lane_offsets(int lane, int& x_off, int& w_off) {
  const int g = lane >> 2, t = lane & 3;
  x_off = g * kXStride + 32 * t;
  w_off = g * w_stride<kFp8>() + (kFp8 ? 16 : 32) * t;
}

template <int NT, bool kFp8>
__device__ __forceinline__ void staged_chunk(const unsigned char* xl, const unsigned char* wl,
                                             const ScaleRows& sr, BlockCursor& cur,
                                             bool range_start, bool range_end,
                                             float (&chain)[NT][4], float (&acc)[NT][4]) {
  constexpr int kWs = w_stride<kFp8>();
  RawPiece<kFp8> plo, phi;
#pragma unroll
  for (int v = 0; v < (kFp8 ? 1 : 2); ++v) {
    plo.v[v] = reinterpret_cast<const uint4*>(wl)[v];
    phi.v[v] = reinterpret_cast<const uint4*>(wl + 8 * kWs)[v];
  }
  uint32_t a[4][4];
  weight_fragments<kFp8>(plo, phi, a);
  if constexpr (kFp8) {
    // A chain starts at the range's first chunk and at each scale block's.
    if (range_start || cur.left == cur.cpb)
      staged_tiles<NT, true>(xl, a, chain);
    else
      staged_tiles<NT, false>(xl, a, chain);
    const int kb = cur.kb;
    if (cur.step() || range_end) {
      float s_lo, s_hi;
      sr.get(kb, s_lo, s_hi);
      fold_chain<NT, false>(chain, acc, s_lo, s_hi);
    }
  } else {
    staged_tiles<NT, false>(xl, a, acc);
  }
}

// One pass of the block over rows rb .. rb + 8*NT - 1 (those below r1):
// every chunk of K through the ring, each warp's 16 columns summed by range
// and the ranges added in order, then stored.
template <int NT, class Y, bool kFp8>
__device__ __forceinline__ void wide_pass(const MmaOperands& o, const int32_t* row_source, int rb,
                                          int r1, int grp, int n_block, const ScaleRows& sr,
                                          unsigned char* smem, Y* y, int64_t ldy) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int n0 = n_block + warp * 16;
  const int nchunks = (o.K + kMmaChunk - 1) / kMmaChunk;
  int x_off, w_off;
  staged_lane_offsets<kFp8>(lane, x_off, w_off);
  constexpr int kStage = wide_stage_bytes<kFp8>();
  const StageCopies<NT, kFp8> copies(o, row_source, rb, r1, grp, n_block, kWideXBytes, threadIdx.x);
  const uint32_t base = smem_addr(smem);
  const auto stage = [&](int c) { copies.issue(o, c, base + (c % kWideStages) * kStage); };
#pragma unroll
  for (int s = 0; s < kWideStages - 1; ++s) {
    if (s < nchunks) stage(s);
    cp_async_commit();
  }
  float run[NT][4], acc[NT][4], chain[NT][4];
  int c = 0;
  BlockCursor cur(0, kFp8 ? o.bc : kMmaChunk);  // FP8: where the chains end (c runs on)
  for (int r = 0; r < kMmaRanges; ++r) {
    int c0, c1;
    chunk_range(o.K, r, c0, c1);
    zero_sums(acc, chain);
    for (; c < c1; ++c) {
      cp_async_wait<kWideStages - 2>();
      __syncthreads();  // chunk c is in; every warp is done with chunk c - 1's slot
      const int next = c + kWideStages - 1;
      if (next < nchunks) stage(next);
      cp_async_commit();
      const unsigned char* st = smem + (c % kWideStages) * kStage;
      staged_chunk<NT, kFp8>(st + x_off, st + kWideXBytes + warp * 16 * w_stride<kFp8>() + w_off,
                             sr, cur, c == c0, c + 1 == c1, chain, acc);
    }
    // The running sum: range 0's sum itself, then + each later range's
    // (an empty range adds 0.0, as in the narrow kernel).
#pragma unroll
    for (int i = 0; i < NT; ++i)
#pragma unroll
      for (int q = 0; q < 4; ++q) run[i][q] = r == 0 ? acc[i][q] : run[i][q] + acc[i][q];
  }
  cp_async_wait<0>();
  __syncthreads();  // the ring is free for the next pass
#pragma unroll
  for (int i = 0; i < NT; ++i)
#pragma unroll
    for (int q = 0; q < 4; ++q) store_element(y, ldy, rb, r1, n0, o.N, lane, i, q, run[i][q]);
}

// Columns blockIdx.x * 64 .. + 63 of group slot blockIdx.y: its rows in
// passes of 64, 32, 16 or 8; without groups, blockIdx.z picks the pass
// (rows z*64 .. z*64 + 63), so a batch's passes run side by side. Dynamic
// shared memory: wide_smem<kFp8>() bytes.
template <class Y, bool kFp8>
__global__ void __launch_bounds__(kWideWarps * 32)
    mma_wide_kernel(MmaOperands o, Y* __restrict__ y, int64_t ldy, RowGroups rg) {
  extern __shared__ __align__(16) unsigned char wide_smem_buf[];
  pdl_begin();
  int grp, r0, r1;
  if (!group_rows(rg, grp, r0, r1)) return;
  if (rg.offsets == nullptr) {
    r0 = blockIdx.z * kWideRows;
    r1 = min(r1, r0 + kWideRows);
  }
  const int n_block = blockIdx.x * (16 * kWideWarps);
  const ScaleRows sr(o, grp, n_block + (threadIdx.x >> 5) * 16, threadIdx.x & 31);
  for (int rb = r0; rb < r1;) {
    const int left = r1 - rb;
    if (left > 32) {
      wide_pass<8, Y, kFp8>(o, rg.row_source, rb, r1, grp, n_block, sr, wide_smem_buf, y, ldy);
      rb += 64;
    } else if (left > 16) {
      wide_pass<4, Y, kFp8>(o, rg.row_source, rb, r1, grp, n_block, sr, wide_smem_buf, y, ldy);
      rb += 32;
    } else if (left > 8) {
      wide_pass<2, Y, kFp8>(o, rg.row_source, rb, r1, grp, n_block, sr, wide_smem_buf, y, ldy);
      rb += 16;
    } else {
      wide_pass<1, Y, kFp8>(o, rg.row_source, rb, r1, grp, n_block, sr, wide_smem_buf, y, ldy);
      rb += 8;
    }
  }
}

// ---- split: 64 columns a block, the 4 ranges side by side ------------------

// The wide form with its K ranges computed at once: 16 warps, warp w taking
// range w / 4 of columns (w % 4) * 16 .. + 15. Each range's 4 warps stream
// their chunks through their own cp.async ring under their own named
// barrier; the 4 range sums then meet in shared memory, added in range
// order, as in the other two kernels.
// note: 16 warps a block and one block per SM (the 4 rings fill its shared
// memory): 4 warps per SM sub-partition to hide the chains', conversions'
// and copies' latencies, where the 4-warp wide kernel leaves one or two
// (the M = 128 products of an 8B model run 64 to 384 of its blocks).
// Without groups a column block's passes are neighbours in grid x, so they
// read the same weights close together in time (L2).
constexpr int kSplitColWarps = 4;                         // warps per range: 16 columns each
constexpr int kSplitWarps = kSplitColWarps * kMmaRanges;  // 16
constexpr int kSplitCols = 16 * kSplitColWarps;           // 64 columns a block
constexpr int kSmemOptin = 232448;                        // sm_90's shared memory per block

template <bool kFp8, int kMaxNT>
struct SplitLayout {
  static constexpr int kRows = 8 * kMaxNT;  // token rows per pass
  static constexpr int kStage = kRows * kXStride + kSplitCols * w_stride<kFp8>();
  // note: the deepest ring per range that fits (at most 6 chunks); the
  // reduction reuses range 0's ring once every range is done.
  static constexpr int kStages =
      kSmemOptin / (kMmaRanges * kStage) < 6 ? kSmemOptin / (kMmaRanges * kStage) : 6;
  static constexpr int kRing = kStages * kStage;
  static constexpr int kBlockBytes = kMmaRanges * kRing;
  static_assert(kStages >= 2, "a ring needs two stages");
  static_assert(kSplitColWarps * kMaxNT * 4 * 32 * 4 <= kRing, "the reduction fits range 0's ring");
};

// The split kernel's dynamic shared memory for passes of pass_rows (32 or
// 64) rows.
constexpr int split_block_bytes(bool fp8, int pass_rows) {
  return pass_rows == 32
             ? (fp8 ? SplitLayout<true, 4>::kBlockBytes : SplitLayout<false, 4>::kBlockBytes)
             : (fp8 ? SplitLayout<true, 8>::kBlockBytes : SplitLayout<false, 8>::kBlockBytes);
}

// Waits for the 128 threads of range group r (named barrier 1 + r; 0 is
// __syncthreads').
__device__ __forceinline__ void range_barrier(int r) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(1 + r), "n"(32 * kSplitColWarps) : "memory");
}

// One pass of the block over rows rb .. rb + 8*NT - 1 (those below r1).
template <int NT, int kMaxNT, class Y, bool kFp8>
__device__ __forceinline__ void split_pass(const MmaOperands& o, const int32_t* row_source, int rb,
                                           int r1, int grp, int n_block, const ScaleRows& sr,
                                           unsigned char* smem, Y* y, int64_t ldy) {
  using L = SplitLayout<kFp8, kMaxNT>;
  constexpr int S = L::kStages;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int range = warp / kSplitColWarps, cw = warp % kSplitColWarps;
  const int tid = threadIdx.x % (32 * kSplitColWarps);
  int x_off, w_off;
  staged_lane_offsets<kFp8>(lane, x_off, w_off);
  unsigned char* ring = smem + range * L::kRing;
  int c0, c1;
  chunk_range(o.K, range, c0, c1);
  const StageCopies<NT, kFp8> copies(o, row_source, rb, r1, grp, n_block, L::kRows * kXStride, tid);
  const uint32_t base = smem_addr(ring);
  const auto stage = [&](int c, int slot) { copies.issue(o, c, base + slot * L::kStage); };
#pragma unroll
  for (int s = 0; s < S - 1; ++s) {
    if (c0 + s < c1) stage(c0 + s, s);
    cp_async_commit();
  }
  float acc[NT][4], chain[NT][4];
  zero_sums(acc, chain);
  BlockCursor cur(c0, kFp8 ? o.bc : kMmaChunk);  // FP8: where the chains end
  int slot = 0;
  for (int c = c0; c < c1; ++c) {
    cp_async_wait<S - 2>();
    range_barrier(range);  // chunk c is in; the range's warps are done with chunk c - 1's slot
    const int next = c + S - 1;
    if (next < c1) stage(next, slot == 0 ? S - 1 : slot - 1);
    cp_async_commit();
    const unsigned char* st = ring + slot * L::kStage;
    staged_chunk<NT, kFp8>(st + x_off,
                           st + L::kRows * kXStride + cw * 16 * w_stride<kFp8>() + w_off, sr, cur,
                           c == c0, c + 1 == c1, chain, acc);
    slot = slot + 1 == S ? 0 : slot + 1;
  }
  cp_async_wait<0>();
  // The range sums added in range order through range 0's ring:
  // red = a0, red = red + a1, red = red + a2, stored red + a3.
  float* red = reinterpret_cast<float*>(smem);
  const auto at = [&](int i, int q) -> float& { return red[((cw * NT + i) * 4 + q) * 32 + lane]; };
  __syncthreads();  // every range is done with its ring
#pragma unroll
  for (int r = 0; r < kMmaRanges - 1; ++r) {
    if (range == r)
#pragma unroll
      for (int i = 0; i < NT; ++i)
#pragma unroll
        for (int q = 0; q < 4; ++q) at(i, q) = r == 0 ? acc[i][q] : at(i, q) + acc[i][q];
    __syncthreads();
  }
  if (range == kMmaRanges - 1)
#pragma unroll
    for (int i = 0; i < NT; ++i)
#pragma unroll
      for (int q = 0; q < 4; ++q)
        store_element(y, ldy, rb, r1, n_block + cw * 16, o.N, lane, i, q, at(i, q) + acc[i][q]);
  __syncthreads();  // red is read before the next pass's copies reuse the ring
}

// Columns (blockIdx.x / passes) * 64 .. + 63 of group slot blockIdx.y:
// its rows in passes of 8 * kMaxNT rows or fewer; without groups, block x
// takes pass blockIdx.x % passes (rows pass * 8 * kMaxNT ..) only, with
// groups every pass of its group (passes 1). Dynamic shared memory:
// SplitLayout<kFp8, kMaxNT>::kBlockBytes.
template <class Y, bool kFp8, int kMaxNT>
__global__ void __launch_bounds__(kSplitWarps * 32, 1)
    mma_split_kernel(MmaOperands o, Y* __restrict__ y, int64_t ldy, RowGroups rg, int passes) {
  extern __shared__ __align__(16) unsigned char split_smem_buf[];
  pdl_begin();
  int grp, r0, r1;
  if (!group_rows(rg, grp, r0, r1)) return;
  const int cb = blockIdx.x / passes;
  if (rg.offsets == nullptr) {
    r0 = (blockIdx.x % passes) * 8 * kMaxNT;
    r1 = min(r1, r0 + 8 * kMaxNT);
  }
  const int n_block = cb * kSplitCols;
  const ScaleRows sr(o, grp, n_block + ((threadIdx.x >> 5) % kSplitColWarps) * 16,
                     threadIdx.x & 31);
  for (int rb = r0; rb < r1;) {
    const int left = r1 - rb;
    if (kMaxNT == 8 && left > 32) {
      split_pass<kMaxNT, kMaxNT, Y, kFp8>(o, rg.row_source, rb, r1, grp, n_block, sr,
                                          split_smem_buf, y, ldy);
      rb += 8 * kMaxNT;
    } else if (left > 16) {
      split_pass<4, kMaxNT, Y, kFp8>(o, rg.row_source, rb, r1, grp, n_block, sr, split_smem_buf, y,
                                     ldy);
      rb += 32;
    } else if (left > 8) {
      split_pass<2, kMaxNT, Y, kFp8>(o, rg.row_source, rb, r1, grp, n_block, sr, split_smem_buf, y,
                                     ldy);
      rb += 16;
    } else {
      split_pass<1, kMaxNT, Y, kFp8>(o, rg.row_source, rb, r1, grp, n_block, sr, split_smem_buf, y,
                                     ldy);
      rb += 8;
    }
  }
}

}  // namespace qtk::cuda::dev
