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
// The token rows per pass (8, 16, 32 or 64) and the two kernel forms below
// change which rows share an instruction and who computes a range, never a
// row's bits.
//
// Two kernels compute that sum:
//   narrow (up to 16 rows a group): a block is 16 output columns and 4
//     warps, warp r computing range r for every row, each warp streaming
//     its chunks of weights and activations through its own cp.async ring
//     in shared memory: the decode form, bound by the weight reads, which
//     need many warps per column. With SwiGLU pairs (MmaOperands::pair) a
//     block is 8 gate rows and their 8 up rows, and stores silu(gate) * up.
//   wide (more rows): a block is 64 output columns, 4 warps of 16 each
//     walking the 4 ranges in turn; each chunk's activations (up to 64
//     rows) and the block's 64 weight rows go through a 4-stage cp.async
//     ring in shared memory, so the activations are read once per 64
//     columns instead of once per 16 and the loads run 3 chunks ahead.
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

// One chunk's products for NT token tiles: b[i] = tile i's 8 bf16 pairs of
// this lane's token row (pair p = k 16t + 2p, +1), into acc (dense) or the
// block chain (FP8).
template <int NT>
__device__ __forceinline__ void chunk_products(const uint32_t (&a)[4][4],
                                               const uint32_t (&b)[NT][8], float (&sum)[NT][4]) {
#pragma unroll
  for (int i = 0; i < NT; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) mma_bf16(sum[i], a[j], b[i][2 * j], b[i][2 * j + 1]);
}

// Where a scale block or the range ends: acc = fmaf(chain, scale, acc)
// (rows g: s_lo, g + 8: s_hi) and the chain restarts.
template <int NT>
__device__ __forceinline__ void fold_chain(float (&chain)[NT][4], float (&acc)[NT][4], float s_lo,
                                           float s_hi) {
#pragma unroll
  for (int i = 0; i < NT; ++i) {
    acc[i][0] = fmaf(chain[i][0], s_lo, acc[i][0]);
    acc[i][1] = fmaf(chain[i][1], s_lo, acc[i][1]);
    acc[i][2] = fmaf(chain[i][2], s_hi, acc[i][2]);
    acc[i][3] = fmaf(chain[i][3], s_hi, acc[i][3]);
#pragma unroll
    for (int q = 0; q < 4; ++q) chain[i][q] = 0.0f;
  }
}

// One chunk on a warp: the weights' A fragments from rows g and g + 8, then
// the products into sum (the FP8 block chain, or the dense range sum).
template <int NT, bool kFp8>
__device__ __forceinline__ void chunk_mma(const RawPiece<kFp8>& plo, const RawPiece<kFp8>& phi,
                                          const uint32_t (&b)[NT][8], float (&sum)[NT][4]) {
  uint32_t lo[8], hi[8], a[4][4];
  piece_pairs<kFp8>(plo, lo);
  piece_pairs<kFp8>(phi, hi);
  chunk_fragments(lo, hi, a);
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
template <bool kFp8, int kMaxNT>
struct NarrowLayout {
  static constexpr int kDepth = kFp8 && kMaxNT == 1 ? 6 : 4;  // stages per warp
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
template <int NT, int kMaxNT, bool kFp8>
__device__ __forceinline__ void narrow_pass(const MmaOperands& o, const int32_t* row_source, int rb,
                                            int r1, NarrowWeights<kFp8, kMaxNT>& nw, int c0, int c1,
                                            bool weights_issued, unsigned char* ring, float* red) {
  using L = NarrowLayout<kFp8, kMaxNT>;
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
#pragma unroll
  for (int i = 0; i < NT; ++i)
#pragma unroll
    for (int q = 0; q < 4; ++q) acc[i][q] = chain[i][q] = 0.0f;
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

template <int NT, int kMaxNT, class Y, bool kFp8>
__device__ __forceinline__ void narrow_block_pass(const MmaOperands& o, const int32_t* row_source,
                                                  int rb, int r1, int n0,
                                                  NarrowWeights<kFp8, kMaxNT>& nw, int c0, int c1,
                                                  bool weights_issued, unsigned char* ring,
                                                  float* red, Y* y, int64_t ldy) {
  narrow_pass<NT, kMaxNT, kFp8>(o, row_source, rb, r1, nw, c0, c1, weights_issued, ring, red);
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
// the kernel before), overlapping the previous kernel's tail; with groups
// (experts) right after reading the block's group, ahead of its row span
// and the rows' sources.
template <class Y, bool kFp8, int kMaxNT>
__global__ void __launch_bounds__(kMmaRanges * 32)
    mma_narrow_kernel(MmaOperands o, Y* __restrict__ y, int64_t ldy, RowGroups rg) {
  using L = NarrowLayout<kFp8, kMaxNT>;
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
  if (!grouped && rg.rows > 0) request_weights(nw);
  pdl_begin();
  int grp;
  if (!group_slot(rg, grp)) return;
  if (grouped) {
    nw = NarrowWeights<kFp8, kMaxNT>(o, grp, n0, lane);
    request_weights(nw);
  }
  int r0, r1;
  group_span(rg, grp, r0, r1);
  bool issued = true;
  for (int rb = r0; rb < r1; rb += 8 * kMaxNT) {
    if (kMaxNT == 2 && r1 - rb > 8)
      narrow_block_pass<kMaxNT, kMaxNT, Y, kFp8>(o, rg.row_source, rb, r1, n0, nw, c0, c1, issued,
                                                 ring, red, y, ldy);
    else
      narrow_block_pass<1, kMaxNT, Y, kFp8>(o, rg.row_source, rb, r1, n0, nw, c0, c1, issued, ring,
                                            red, y, ldy);
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

// Stages chunk c of the pass's activations (rows rb .. rb + 8*NT - 1) and of
// the block's 64 weight rows (group grp, columns n_block ..) into `stage`;
// zeros past r1, N and K.
template <int NT, bool kFp8>
__device__ __forceinline__ void wide_stage(const MmaOperands& o, const int32_t* row_source, int rb,
                                           int r1, int grp, int n_block, int c,
                                           unsigned char* stage) {
  for (int p = threadIdx.x; p < NT * 8 * 8; p += blockDim.x) {
    const int row = p >> 3, piece = p & 7;
    const int r = rb + row, k = c * kMmaChunk + piece * 8;
    const bool ok = r < r1 && k < o.K;
    const __nv_bfloat16* src =
        ok ? o.x + static_cast<int64_t>(row_source != nullptr ? row_source[r] : r) * o.ldx + k
           : o.x;
    cp_async_16(smem_addr(stage + row * kXStride + piece * 16), src, ok);
  }
  constexpr int kPieces = kFp8 ? 4 : 8;  // 16-byte pieces per weight row and chunk
  unsigned char* ws = stage + kWideXBytes;
  for (int p = threadIdx.x; p < 16 * kWideWarps * kPieces; p += blockDim.x) {
    const int row = p / kPieces, piece = p % kPieces;
    const int n = n_block + row;
    const int k = c * kMmaChunk + piece * (kFp8 ? 16 : 8);
    const bool ok = n < o.N && k < o.K;
    const int64_t wrow = static_cast<int64_t>(grp) * o.N + n;
    const void* src = !ok    ? static_cast<const void*>(o.x)
                      : kFp8 ? static_cast<const void*>(o.wq + wrow * o.K + k)
                             : static_cast<const void*>(o.wd + wrow * o.K + k);
    cp_async_16(smem_addr(ws + row * w_stride<kFp8>() + piece * 16), src, ok);
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
  const int g = lane >> 2, t = lane & 3;
  const int n0 = n_block + warp * 16;
  const int nchunks = (o.K + kMmaChunk - 1) / kMmaChunk;
  constexpr int kStage = wide_stage_bytes<kFp8>();
#pragma unroll
  for (int s = 0; s < kWideStages - 1; ++s) {
    if (s < nchunks)
      wide_stage<NT, kFp8>(o, row_source, rb, r1, grp, n_block, s, smem + s * kStage);
    cp_async_commit();
  }
  float run[NT][4], acc[NT][4], chain[NT][4];
  int c = 0;
  BlockCursor cur(0, kFp8 ? o.bc : kMmaChunk);  // FP8: where the chains end (c runs on)
  for (int r = 0; r < kMmaRanges; ++r) {
    int c0, c1;
    chunk_range(o.K, r, c0, c1);
#pragma unroll
    for (int i = 0; i < NT; ++i)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[i][q] = chain[i][q] = 0.0f;
    for (; c < c1; ++c) {
      cp_async_wait<kWideStages - 2>();
      __syncthreads();  // chunk c is in; every warp is done with chunk c - 1's slot
      const int next = c + kWideStages - 1;
      if (next < nchunks)
        wide_stage<NT, kFp8>(o, row_source, rb, r1, grp, n_block, next,
                             smem + (next % kWideStages) * kStage);
      cp_async_commit();
      const unsigned char* st = smem + (c % kWideStages) * kStage;
      RawPiece<kFp8> plo, phi;
      const unsigned char* wst = st + kWideXBytes + (warp * 16 + g) * w_stride<kFp8>();
#pragma unroll
      for (int v = 0; v < (kFp8 ? 1 : 2); ++v) {
        plo.v[v] = reinterpret_cast<const uint4*>(wst + (kFp8 ? 16 : 32) * t)[v];
        phi.v[v] =
            reinterpret_cast<const uint4*>(wst + 8 * w_stride<kFp8>() + (kFp8 ? 16 : 32) * t)[v];
      }
      uint32_t b[NT][8];
#pragma unroll
      for (int i = 0; i < NT; ++i) {
        const uint4* xs = reinterpret_cast<const uint4*>(st + (8 * i + g) * kXStride + 32 * t);
        unpack_pairs(xs[0], xs[1], b[i]);
      }
      if constexpr (kFp8) {
        chunk_mma<NT, kFp8>(plo, phi, b, chain);
        const int kb = cur.kb;
        if (cur.step() || c + 1 == c1) {
          float s_lo, s_hi;
          sr.get(kb, s_lo, s_hi);
          fold_chain<NT>(chain, acc, s_lo, s_hi);
        }
      } else {
        chunk_mma<NT, kFp8>(plo, phi, b, acc);
      }
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

}  // namespace qtk::cuda::dev
