// The split kernel's sum (kernels/cuda/mma_matmul.cuh) on sm_90's
// warpgroup tensor-core instruction, wgmma: a form of more than 16 rows
// without groups where the GPU has it (QTK_MMA_WIDE=90). Device code,
// included by warp_matmul.cuh only.
//
// A block is one or two warpgroups over 128 output columns (weight rows,
// the wgmma's N) and one of the 4 K ranges; warpgroup w takes token rows
// 64w .. 64w + 63 of the block's pass (the wgmma's M). The 4 blocks of a
// column block's pass (one per range) run as a thread-block cluster, and at
// the end each block adds a quarter of the outputs' 4 range sums in range
// order through the cluster's shared memory.
// Per chunk of 64 k:
//   1. 16-byte cp.async copies bring the pass's token rows and the block's
//      128 weight rows into a stage of a ring, in memory order;
//   2. the block converts the stage's weight rows (e4m3 or bf16) into a
//      bf16 tile of wgmma's "core matrices" (8 x 8, K-major, no swizzle),
//      the B operand, in the chunk's k order (wg_convert);
//   3. each thread loads its token rows' A fragments from the stage: the
//      A operand comes from registers, where the chunk's k order is the
//      narrow kernel's fragment order (lane t's 16 contiguous k of rows g
//      and g + 8 feed its 4 steps), so the token rows need no reordering;
//   4. 4 wgmma.m64n128k16 run the chunk's k16 steps.
// The products of one chunk run while the block copies, waits for and
// converts the next.
// note: the arithmetic is the other kernels', element for element: each
// output is the same chain of k16 tensor-core steps over the same k
// positions (a k16 step's result depends on its 16 products, their
// positions and the accumulator only; which operand is A and which is B,
// or how many rows and columns share the instruction, does not enter it),
// the same chain restarts and scale folds (fmaf(chain, scale, acc)) and
// the same range additions. Tested bit for bit against the split and
// narrow kernels (MmaMatmul.WarpgroupFormGivesTheOtherFormsBits,
// MmaMatmul.RowBitsDoNotDependOnTheBatch).
// note: an FP8 chain's first step ignores the accumulator registers
// (wgmma's scale-d = 0) instead of adding the +0.0 of zeroed ones. The two
// differ only where the 16 products sum to -0.0 (-0.0 against +0.0), and
// the fold erases that: fmaf(+-0.0, s, acc) is acc for acc != 0, and acc is
// never -0.0 (it starts at +0.0 and a round-to-nearest sum that is exactly
// zero is +0.0). A dense range sum, which is never folded, starts from
// zeroed registers.
// note: why the token rows are the A operand. With the weights as A, the
// token rows had to be B in shared memory, in core matrices holding the
// chunk's k order, i.e. copied 4 bytes at a time; with the weights as
// register A, ptxas serialised the products. Here the copies are 16 bytes,
// the A registers are rewritten only after the chunk's products are
// waited for, and one converted weight tile serves 64 or 128 token rows.
// note: speed. Not the per-shape choice: on an H200 it beats the split
// kernel on some FP8 shapes (128 x 6144 x 4096 40.2 vs 44.5 us, 512 x
// 24576 x 4096 520 vs 542) and loses on others (128 x 4096 x 12288 93.6 vs
// 66.2: 32 clusters where 30 fit at once), and the Qwen3-8B FP8 decode at
// batch 128 is slower with it. The products alone, without copies or
// conversion, take 30.5 us at 128 x 6144 x 4096 (cuBLASLt's whole bf16
// product: 17.6): with 2 warps a scheduler each chunk is a serial chain
// (products, their wait, the fold, fragment loads, barriers), and removing
// any one part saves a fifth. Warp-specialised copy / conversion warps and
// persistent blocks are what it lacks (bench/cuda/RESULTS.md).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/mma_matmul.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace qtk::cuda::dev {

constexpr int kWgCols = 128;            // output columns per block: the wgmma's N
constexpr int kWgGroupRows = 64;        // token rows per warpgroup: the wgmma's M
constexpr int kWgGroupThreads = 128;    // threads per warpgroup
constexpr int kWgCluster = kMmaRanges;  // blocks per cluster: one per K range

// One block's shared memory for kWGs warpgroups (passes of 64 kWGs token
// rows): two converted weight tiles, then the ring of chunk stages (a
// stage: the pass's token rows, then the block's 128 weight rows as the
// narrow kernel stages them).
// note: token rows kXStride = 144 bytes apart: a quarter warp's 16-byte
// fragment loads (rows g, g + 1, lanes t = 0..3 at 32t) hit 32 banks; the
// tile's core columns kTStride = 128 * 16 + 16 bytes apart.
// note: 4 stages: 137 KB a block for FP8 at two warpgroups, one block an SM
// (the 64 + 64 accumulators of 256 threads take most of the registers).
template <bool kFp8, int kWGs>
struct WgLayout {
  static constexpr int kThreads = kWgGroupThreads * kWGs;
  static constexpr int kRows = kWgGroupRows * kWGs;  // token rows per pass
  static constexpr int kXStride = 2 * kMmaChunk + 16;
  static constexpr int kXBytes = kRows * kXStride;
  static constexpr int kStage = kXBytes + kWgCols * w_stride<kFp8>();
  static constexpr int kStages = 4;
  static constexpr int kTStride = kWgCols * 16 + 16;  // weight tile: core column stride
  static constexpr int kTile = 8 * kTStride;
  static constexpr int kRing = 2 * kTile;  // the ring follows the two weight tiles
  static constexpr int kBlockBytes = kRing + kStages * kStage;
  static constexpr int kAcc = kWgCols / 2;                              // accumulators a thread
  static constexpr int kXPieces = kRows * 8 / kThreads;                 // token pieces a thread
  static constexpr int kWPieces = kWgCols * (kFp8 ? 4 : 8) / kThreads;  // weight pieces
  static_assert(kThreads * kAcc * 4 <= kBlockBytes, "the range sums fit");
};

// d = A * B + (accumulate ? d : 0): one k16 step for the warpgroup's 64
// token rows (A, from registers: the m16n8k16 fragment layout per warp)
// and 128 weight rows (B, read from shared memory through its
// descriptor); d[4i + q] is column 8i + 2t + q % 2 of row 16 * warp + g +
// 8 (q / 2).
__device__ __forceinline__ void wgmma_m64n128k16(float (&d)[64], const uint32_t (&a)[4], uint64_t b,
                                                 int accumulate) {
#if QTK_WGMMA
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
      "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "
      "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "
      "%56, %57, %58, %59, %60, %61, %62, %63}, "
      "{%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
        "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
        "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate)
      : "memory");
#endif
}

// The stage's 128 weight rows (w: row n at n * w_stride) into a tile of
// core matrices, the layout wgmma reads its B operand from (K-major, no
// swizzle), in the chunk's k order: thread tid takes the 16 k at 16t of
// rows tid / 4 + kThreads / 4 * h (t = tid % 4); their pair p (k 16t + 2p,
// +1) is position 2t of step p / 2, half p % 2: core column c = p, row n,
// word t, at byte c * kTStride + n * 16 + 4t.
// note: a warp's 32 lanes read 512 contiguous bytes (FP8) and write 32
// consecutive words per pair: no bank conflicts.
template <bool kFp8, int kTStride, int kThreads>
__device__ __forceinline__ void wg_convert(const unsigned char* w, unsigned char* tile, int tid) {
  constexpr int kWs = w_stride<kFp8>();
  const int t = tid & 3;
#pragma unroll
  for (int h = 0; h < kWgCols * 4 / kThreads; ++h) {
    const int n = (tid >> 2) + kThreads / 4 * h;
    RawPiece<kFp8> p;
#pragma unroll
    for (int v = 0; v < (kFp8 ? 1 : 2); ++v)
      p.v[v] = reinterpret_cast<const uint4*>(w + n * kWs + (kFp8 ? 16 : 32) * t)[v];
    uint32_t pairs[8];
    piece_pairs<kFp8>(p, pairs);
#pragma unroll
    for (int q = 0; q < 8; ++q)
      *reinterpret_cast<uint32_t*>(tile + q * kTStride + n * 16 + 4 * t) = pairs[q];
  }
}

// The copies of one block's chunks, 16 bytes each: token piece i of this
// thread is k 8 (tid % 8) .. + 7 of pass row tid / 8 + kThreads / 8 * i
// (rows past the pass repeat its last row: a token row reaches only its
// own outputs, which are not stored), weight piece i the 16 bytes at
// (tid % P) * 16 of weight row tid / P + kThreads / P * i (P pieces a
// row); their sources and stage offsets worked out once.
template <bool kFp8, int kWGs>
struct WgCopies {
  using L = WgLayout<kFp8, kWGs>;
  static constexpr int kP = kFp8 ? 4 : 8;  // pieces per weight row
  const unsigned char* xsrc[L::kXPieces];  // token piece i at chunk 0
  const unsigned char* wsrc[L::kWPieces];  // weight piece i at chunk 0
  uint32_t wrows_ok;                       // bit i: weight piece i has a row
  uint32_t xdst, wdst;                     // pieces 0's offsets in a stage
  int xk, wk;                              // the thread's first k within a chunk

  __device__ __forceinline__ WgCopies(const MmaOperands& o, int rb, int r1, int n_block, int tid) {
    xk = 8 * (tid & 7);
#pragma unroll
    for (int i = 0; i < L::kXPieces; ++i) {
      const int r = min(rb + (tid >> 3) + L::kThreads / 8 * i, r1 - 1);
      xsrc[i] = reinterpret_cast<const unsigned char*>(o.x + static_cast<int64_t>(r) * o.ldx + xk);
    }
    xdst = (tid >> 3) * L::kXStride + 16 * (tid & 7);
    wk = (tid % kP) * (kFp8 ? 16 : 8);
    wdst = L::kXBytes + (tid / kP) * w_stride<kFp8>() + 16 * (tid % kP);
    wrows_ok = 0;
#pragma unroll
    for (int i = 0; i < L::kWPieces; ++i) {
      const int n = n_block + tid / kP + L::kThreads / kP * i;
      const int64_t w = static_cast<int64_t>(n) * o.K + wk;
      wrows_ok |= n < o.N ? 1u << i : 0u;
      wsrc[i] = n >= o.N ? reinterpret_cast<const unsigned char*>(o.x)
                : kFp8   ? o.wq + w
                         : reinterpret_cast<const unsigned char*>(o.wd + w);
    }
  }
  // Chunk c into the stage at shared address st; past K both operands are
  // zeros.
  __device__ __forceinline__ void issue(const MmaOperands& o, int c, uint32_t st) const {
    const int k0 = c * kMmaChunk;
    const bool xk_ok = k0 + xk < o.K, wk_ok = k0 + wk < o.K;
#pragma unroll
    for (int i = 0; i < L::kXPieces; ++i)
      cp_async_16(st + xdst + i * (L::kThreads / 8) * L::kXStride, xsrc[i] + 2 * k0, xk_ok);
    const int64_t wk0 = static_cast<int64_t>(k0) * (kFp8 ? 1 : 2);
#pragma unroll
    for (int i = 0; i < L::kWPieces; ++i)
      cp_async_16(st + wdst + i * (L::kThreads / kP) * w_stride<kFp8>(), wsrc[i] + wk0,
                  wk_ok && (wrows_ok >> i & 1u));
  }
};

// Block x: range x % 4 (its rank in the cluster) of pass (x / 4) % passes
// (token rows pass * 64 kWGs ..) of column block x / 4 / passes (columns
// * 128 ..). 128 kWGs threads; dynamic shared memory:
// WgLayout<kFp8, kWGs>::kBlockBytes; launched in clusters of 4 along x.
template <class Y, bool kFp8, int kWGs>
__global__ void __launch_bounds__(kWgGroupThreads* kWGs, 1)
    mma_wgmma_kernel(MmaOperands o, Y* __restrict__ y, int64_t ldy, int rows, int passes) {
#if QTK_WGMMA
  extern __shared__ __align__(128) unsigned char wg_smem_buf[];
  using L = WgLayout<kFp8, kWGs>;
  constexpr int S = L::kStages, A = L::kAcc, T = L::kThreads;
  const int range = blockIdx.x % kWgCluster, rest = blockIdx.x / kWgCluster;
  const int rb = (rest % passes) * L::kRows, r1 = min(rows, rb + L::kRows);
  const int n_block = (rest / passes) * kWgCols;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  int c0, c1;
  chunk_range(o.K, range, c0, c1);
  const WgCopies<kFp8, kWGs> copies(o, rb, r1, n_block, tid);
  // FP8: where a scale block's rows cover the whole column block, one
  // scale a chain for every output (read when the chain starts).
  const bool one_scale = kFp8 && o.br % kWgCols == 0;
  const float* srow =
      one_scale ? o.scale + static_cast<int64_t>(n_block / o.br) * o.ld_scale : nullptr;
  pdl_begin();
  const uint32_t base = smem_addr(wg_smem_buf), ring = base + L::kRing;
#pragma unroll
  for (int s = 0; s < S - 1; ++s) {
    if (c0 + s < c1) copies.issue(o, c0 + s, ring + s * L::kStage);
    cp_async_commit();
  }
  float acc[A], chain[A];
#pragma unroll
  for (int e = 0; e < A; ++e) acc[e] = chain[e] = 0.0f;
  float(&d)[A] = kFp8 ? chain : acc;  // what the products add into
  uint32_t a[4][4];                   // the chunk's A fragments, step j in a[j]
  const auto load_a = [&](int slot) {
    const unsigned char* st = wg_smem_buf + L::kRing + slot * L::kStage + 32 * t;
    const uint4* plo = reinterpret_cast<const uint4*>(st + (16 * warp + g) * L::kXStride);
    const uint4* phi = reinterpret_cast<const uint4*>(st + (16 * warp + g + 8) * L::kXStride);
    uint32_t lo[8], hi[8];
    unpack_pairs(plo[0], plo[1], lo);
    unpack_pairs(phi[0], phi[1], hi);
    chunk_fragments(lo, hi, a);
  };
  const auto convert = [&](int slot, int tile) {
    wg_convert<kFp8, L::kTStride, T>(wg_smem_buf + L::kRing + slot * L::kStage + L::kXBytes,
                                     wg_smem_buf + tile * L::kTile, tid);
  };
  // acc = fmaf(chain, scale, acc) where an FP8 chain ends (scale block kb).
  float s_chain = 0.0f;
  const auto fold = [&](int kb) {
    if (one_scale) {
#pragma unroll
      for (int e = 0; e < A; ++e) acc[e] = fmaf(chain[e], s_chain, acc[e]);
      return;
    }
#pragma unroll
    for (int i = 0; i < A / 4; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int n = n_block + 8 * i + 2 * t + h;
        const float s =
            n < o.N ? __ldg(o.scale + static_cast<int64_t>(n / o.br) * o.ld_scale + kb) : 0.0f;
        acc[4 * i + h] = fmaf(chain[4 * i + h], s, acc[4 * i + h]);
        acc[4 * i + h + 2] = fmaf(chain[4 * i + h + 2], s, acc[4 * i + h + 2]);
      }
  };
  BlockCursor cur(c0, kFp8 ? o.bc : kMmaChunk);  // FP8: where the chains end
  if (c1 > c0) {
    cp_async_wait<S - 2>();
    __syncthreads();  // chunk c0 is in
    convert(0, 0);
    load_a(0);
    fence_proxy_async_shared();
    __syncthreads();  // its tile is written
  }
  // note: chunk c's products run while the block copies chunk c + S - 1
  // into the slot chunk c - 1 left, waits for chunk c + 1 and converts its
  // weights into the other tile (chunk c - 1's, whose products are done);
  // the A registers are reloaded only after chunk c's products are waited
  // for.
  int slot = 0;
  for (int c = c0; c < c1; ++c) {
    const int next = slot + 1 == S ? 0 : slot + 1;
    bool start = false, ends = false;
    int kb = 0;
    if constexpr (kFp8) {
      // A chain starts at the range's first chunk and at each scale block's.
      start = c == c0 || cur.left == cur.cpb;
      kb = cur.kb;
      ends = cur.step() || c + 1 == c1;
      if (start && one_scale) s_chain = __ldg(srow + kb);
    }
    const uint32_t ws = base + ((c - c0) & 1) * L::kTile;
    wg_fence();
#pragma unroll
    for (int j = 0; j < 4; ++j)
      wgmma_m64n128k16(d, a[j], wg_descriptor(ws + 2 * j * L::kTStride, L::kTStride, 128),
                       j == 0 && start ? 0 : 1);
    wg_commit();
    if (c + 1 < c1) {
      if (c + S - 1 < c1) copies.issue(o, c + S - 1, ring + (slot + S - 1) % S * L::kStage);
      cp_async_commit();
      cp_async_wait<S - 2>();
      __syncthreads();  // chunk c + 1 is in
      convert(next, (c + 1 - c0) & 1);
    }
    wg_wait<0>();
    wg_settle(d);
    if constexpr (kFp8) {
      if (ends) fold(kb);
    }
    if (c + 1 < c1) {
      load_a(next);
      fence_proxy_async_shared();
      __syncthreads();  // chunk c + 1's tile is written
    }
    slot = next;
  }
  cp_async_wait<0>();
  __syncthreads();  // the ring is free
  // The range sums added in range order, a quarter of the outputs a block:
  // ((a0 + a1) + a2) + a3, as the split kernel adds them.
  float* red = reinterpret_cast<float*>(wg_smem_buf);
#pragma unroll
  for (int e = 0; e < A; ++e) red[e * T + tid] = acc[e];
  cluster_barrier();
  // note: every remote load is issued before the first addition (they
  // would otherwise wait one after another: the loads are volatile).
  constexpr int kQuarter = A / kWgCluster;
  const int e0 = kQuarter * range;
  float part[kWgCluster][kQuarter];
#pragma unroll
  for (int r = 0; r < kWgCluster; ++r)
#pragma unroll
    for (int k = 0; k < kQuarter; ++k)
      part[r][k] = cluster_load(red + (e0 + k) * T + tid, static_cast<unsigned>(r));
#pragma unroll
  for (int k = 0; k < kQuarter; ++k) {
    float v = part[0][k];
#pragma unroll
    for (int r = 1; r < kWgCluster; ++r) v = v + part[r][k];
    const int i = (e0 + k) >> 2, q = (e0 + k) & 3;
    const int r = rb + 16 * warp + g + 8 * (q >> 1), n = n_block + 8 * i + 2 * t + (q & 1);
    if (r < r1 && n < o.N) y[static_cast<int64_t>(r) * ldy + n] = from_f<Y>(v);
  }
  cluster_barrier();  // no block leaves while another reads its shared memory
#endif
}

}  // namespace qtk::cuda::dev
