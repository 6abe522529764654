// The split kernel's sum (kernels/cuda/mma_matmul.cuh) on sm_90's
// warpgroup tensor-core instruction, wgmma: the form of more than 16 rows a
// group where the GPU has it. Device code, included by warp_matmul.cuh only.
//
// A block is 64 output columns (weight rows) and one pass of up to 64 token
// rows; its 4 warpgroups (16 warps) compute the 4 K ranges side by side,
// each streaming its range's chunks through its own cp.async ring (the
// split kernel's stages and copies), and the 4 range sums meet in shared
// memory at the end of the pass, added in range order.
// Per chunk a warpgroup
//   1. converts the stage's 64 weight rows (e4m3 or bf16) into a bf16 tile
//      of 8 x 8 "core matrices" in shared memory, the layout wgmma reads
//      its B operand from (no swizzle, K-major), with the chunk's k order:
//      core matrix column c = 2j + h holds, for step j, positions 8h .. 8h+7
//      = k 16t + 4j + 2h + {0, 1} for t = 0..3, so lane (row n, t)'s 8
//      bf16 pairs of k 16t .. 16t+15 go to columns c = 0..7, word t;
//   2. builds the A operand, its warp's 16 token rows, in registers exactly
//      as the other kernels build theirs (chunk_fragments: a lane's 16
//      contiguous k of rows g and g + 8);
//   3. runs the chunk's 4 k16 steps as 4 wgmma.m64n64k16 into the chain.
// note: the arithmetic is the other kernels', element for element: each
// output is the same chain of k16 tensor-core steps over the same k
// positions (a k16 step's result depends on its 16 products, their
// positions and the accumulator only; which operand is A and which is B,
// or how many rows and columns share the instruction, does not enter it),
// the same chain restarts and scale folds (fmaf(chain, scale, acc)) and
// the same range additions. Tested bit for bit against the narrow kernel
// (MmaMatmul.RowBitsDoNotDependOnTheBatch).
// note: tokens are the A side (M = 64 a warpgroup) and weights the B side
// (N = 64): the weights are converted once per block into the tile all 4
// warps read, instead of once per warp, and a warp's A fragments come from
// the same 16-byte loads as before.
// note: speed. Not the per-shape choice: on an H100 it is 5-11% slower than
// the split kernel (FP8, M = 128: 6144 x 4096 48.0 vs 43.5 us, 4096 x 12288
// 71.4 vs 66.3 us; bench/cuda/RESULTS.md). Like the split kernel it is bound
// by latency, not by a unit: DRAM 13% and L2 37% of peak, one instruction
// issued every 2 cycles per scheduler at 4 warps each (ncu). Each chunk's
// steps run one after another within a warpgroup (copy wait, conversion,
// barrier, products, their wait), and leaving out the conversion, the
// activation copies or the products alone each saves only 12-14%. What
// would speed it up: the products of one chunk overlapping the conversion
// of the next (two tiles), a deeper ring, and fewer instructions per
// converted pair (the e4m3 -> f16 -> f32 -> bf16 route is ~8 a pair; an
// integer route with an exact NaN check measured slower).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/mma_matmul.cuh"
#include "kernels/cuda/row_groups.cuh"

// The wgmma instructions exist in sm_90a machine code only; the compute_80
// PTX of the library gets an empty kernel (the host launches it on
// compute capability 9.0 only: wgmma_device()).
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define QTK_WGMMA 1
#else
#define QTK_WGMMA 0
#endif

namespace qtk::cuda::dev {

constexpr int kWgRows = 64;  // token rows per pass: the wgmma's M
constexpr int kWgCols = 64;  // output columns per block: its N

// One warpgroup's region of shared memory: the converted weight tile, then
// its ring of stages (a stage: the pass's 64 activation rows, the block's
// 64 weight rows and, FP8, the 64 columns' scales of the chunk's block).
template <bool kFp8>
struct WgLayout {
  static constexpr int kTile = kWgCols * kMmaChunk * 2;  // bf16 core matrices
  static constexpr int kXBytes = kWgRows * kXStride;
  static constexpr int kSOff = kXBytes + kWgCols * w_stride<kFp8>();
  static constexpr int kStage = kSOff + (kFp8 ? kWgCols * 4 : 0);
  // note: the deepest ring per range that fits (at most 6 chunks): 3 for
  // FP8, 2 for bf16 weights.
  static constexpr int kFit = (kSmemOptin / kMmaRanges - kTile) / kStage;
  static constexpr int kStages = kFit < 6 ? kFit : 6;
  static constexpr int kRange = kTile + kStages * kStage;
  static constexpr int kBlockBytes = kMmaRanges * kRange;
  static_assert(kStages >= 2, "a ring needs two stages");
  static_assert(kWgRows * kWgCols * 4 <= kStages * kStage, "the reduction fits range 0's ring");
};

// The shared-memory descriptor of a K-major bf16 operand without swizzle:
// core matrices (8 rows x 16 bytes, 128 contiguous bytes) lbo bytes apart
// along K and sbo bytes apart along the rows.
__device__ __forceinline__ uint64_t wg_descriptor(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | static_cast<uint64_t>(lbo >> 4) << 16 |
         static_cast<uint64_t>(sbo >> 4) << 32;
}

__device__ __forceinline__ void wg_fence() {
#if QTK_WGMMA
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wg_commit() {
#if QTK_WGMMA
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wg_wait_all() {
#if QTK_WGMMA
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#endif
}
// Generic-proxy writes to shared memory (the converted tile) made visible
// to the wgmma's reads (the async proxy).
__device__ __forceinline__ void fence_proxy_async_shared() {
#if QTK_WGMMA
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
// After the wait: the compiler may not move a read of d above it.
__device__ __forceinline__ void wg_settle(float (&d)[32]) {
#pragma unroll
  for (int i = 0; i < 32; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// d += a * B: one k16 step for the warpgroup's 64 rows (a: this warp's 16,
// mma.m16n8k16's A layout) and the tile's 64 columns; d[4i + q] is column
// 8i + 2t + q % 2 of row g + 8 (q / 2).
__device__ __forceinline__ void wgmma_m64n64k16(float (&d)[32], const uint32_t (&a)[4],
                                                uint64_t b) {
#if QTK_WGMMA
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "{%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b)
      : "memory");
#endif
}

// The stage's 64 weight rows (w: row n at n * w_stride) into the tile as
// core matrices: thread tid (0..127) takes the 16 k at 16t of rows
// tid / 4 and 32 + tid / 4 (t = tid % 4); pair p of them goes to column
// c = p, row n, word t: byte (p * 64 + n) * 16 + 4t.
// note: a warp's 32 lanes read 512 contiguous bytes (FP8) and write 32
// consecutive words per pair: no bank conflicts.
template <bool kFp8>
__device__ __forceinline__ void wg_convert(const unsigned char* w, unsigned char* tile, int tid) {
  constexpr int kWs = w_stride<kFp8>();
  const int t = tid & 3;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int n = (tid >> 2) + 32 * h;
    RawPiece<kFp8> p;
#pragma unroll
    for (int v = 0; v < (kFp8 ? 1 : 2); ++v)
      p.v[v] = reinterpret_cast<const uint4*>(w + n * kWs + (kFp8 ? 16 : 32) * t)[v];
    uint32_t pairs[8];
    piece_pairs<kFp8>(p, pairs);
#pragma unroll
    for (int q = 0; q < 8; ++q)
      *reinterpret_cast<uint32_t*>(tile + (q * kWgCols + n) * 16 + 4 * t) = pairs[q];
  }
}

// One pass of the block over rows rb .. rb + 63 (those below r1).
template <class Y, bool kFp8>
__device__ __forceinline__ void wg_pass(const MmaOperands& o, const int32_t* row_source, int rb,
                                        int r1, int grp, int n_block, unsigned char* smem, Y* y,
                                        int64_t ldy) {
  using L = WgLayout<kFp8>;
  constexpr int S = L::kStages;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int range = warp / 4, wq = warp % 4;  // the range and the warp's 16 token rows
  const int tid = threadIdx.x & 127;
  unsigned char* tile = smem + range * L::kRange;
  unsigned char* ring = tile + L::kTile;
  int c0, c1;
  chunk_range(o.K, range, c0, c1);
  const StageCopies<8, kFp8> copies(o, row_source, rb, r1, grp, n_block, L::kXBytes, tid);
  // FP8: threads 0..63 copy column n_block + tid's scale of each chunk's block.
  const float* srow = nullptr;
  if (kFp8 && tid < kWgCols && n_block + tid < o.N)
    srow = o.scale + ((static_cast<int64_t>(grp) * o.N + n_block + tid) / o.br) * o.ld_scale;
  const uint32_t base = smem_addr(ring);
  const auto stage = [&](int c, int slot) {
    const uint32_t st = base + slot * L::kStage;
    copies.issue(o, c, st);
    if (kFp8 && srow != nullptr) cp_async_4(st + L::kSOff + 4 * tid, srow + c * kMmaChunk / o.bc);
  };
#pragma unroll
  for (int s = 0; s < S - 1; ++s) {
    if (c0 + s < c1) stage(c0 + s, s);
    cp_async_commit();
  }
  float acc[32], chain[32];
#pragma unroll
  for (int e = 0; e < 32; ++e) acc[e] = chain[e] = 0.0f;
  BlockCursor cur(c0, kFp8 ? o.bc : kMmaChunk);  // FP8: where the chains end
  const uint32_t tile_addr = smem_addr(tile);
  int slot = 0;
  for (int c = c0; c < c1; ++c) {
    cp_async_wait<S - 2>();
    // Chunk c is in; the range's warps are done with chunk c - 1 (its slot,
    // its tile: each waited for its products).
    range_barrier(range);
    const int next = c + S - 1;
    if (next < c1) stage(next, slot == 0 ? S - 1 : slot - 1);
    cp_async_commit();
    const unsigned char* st = ring + slot * L::kStage;
    wg_convert<kFp8>(st + L::kXBytes, tile, tid);
    fence_proxy_async_shared();
    range_barrier(range);  // the tile is written
    uint32_t a[4][4];
    {
      const unsigned char* xl = st + (16 * wq + g) * kXStride + 32 * t;
      const uint4* lo = reinterpret_cast<const uint4*>(xl);
      const uint4* hi = reinterpret_cast<const uint4*>(xl + 8 * kXStride);
      uint32_t plo[8], phi[8];
      unpack_pairs(lo[0], lo[1], plo);
      unpack_pairs(hi[0], hi[1], phi);
      chunk_fragments(plo, phi, a);
    }
    // The chunk's 4 k16 steps into d, waited for.
    const auto steps = [&](float(&d)[32]) {
      wg_fence();
#pragma unroll
      for (int j = 0; j < 4; ++j)
        wgmma_m64n64k16(d, a[j],
                        wg_descriptor(tile_addr + j * 2 * kWgCols * 16, kWgCols * 16, 128));
      wg_commit();
      wg_wait_all();
      wg_settle(d);
    };
    if constexpr (kFp8) {
      // A chain starts at the range's first chunk and at each scale block's
      // (zeroed registers, as the other kernels' chains).
      if (c == c0 || cur.left == cur.cpb)
#pragma unroll
        for (int e = 0; e < 32; ++e) chain[e] = 0.0f;
      steps(chain);
      if (cur.step() || c + 1 == c1) {
        const float* sc = reinterpret_cast<const float*>(st + L::kSOff);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const float2 s = *reinterpret_cast<const float2*>(sc + 8 * i + 2 * t);
#pragma unroll
          for (int q = 0; q < 4; ++q)
            acc[4 * i + q] = fmaf(chain[4 * i + q], (q & 1) ? s.y : s.x, acc[4 * i + q]);
        }
      }
    } else {
      steps(acc);
    }
    slot = slot + 1 == S ? 0 : slot + 1;
  }
  cp_async_wait<0>();
  // The range sums added in range order through range 0's ring:
  // red = a0, red = red + a1, red = red + a2, stored red + a3.
  float* red = reinterpret_cast<float*>(smem + L::kTile);
  const auto at = [&](int e) -> float& { return red[(wq * 32 + e) * 32 + lane]; };
  __syncthreads();  // every range is done with its ring
#pragma unroll
  for (int r = 0; r < kMmaRanges - 1; ++r) {
    if (range == r)
#pragma unroll
      for (int e = 0; e < 32; ++e) at(e) = r == 0 ? acc[e] : at(e) + acc[e];
    __syncthreads();
  }
  if (range == kMmaRanges - 1)
#pragma unroll
    for (int e = 0; e < 32; ++e) {
      const int i = e >> 2, q = e & 3;
      const int r = rb + 16 * wq + g + 8 * (q >> 1), n = n_block + 8 * i + 2 * t + (q & 1);
      if (r < r1 && n < o.N) y[static_cast<int64_t>(r) * ldy + n] = from_f<Y>(at(e) + acc[e]);
    }
  __syncthreads();  // red is read before the next pass's copies reuse the ring
}

// Columns (blockIdx.x / passes) * 64 .. + 63 of group slot blockIdx.y: its
// rows in passes of 64; without groups, block x takes pass
// blockIdx.x % passes only (rows pass * 64 ..), with groups every pass of
// its group (passes 1). Dynamic shared memory: WgLayout<kFp8>::kBlockBytes.
template <class Y, bool kFp8>
__global__ void __launch_bounds__(kMmaRanges * 128, 1)
    mma_wgmma_kernel(MmaOperands o, Y* __restrict__ y, int64_t ldy, RowGroups rg, int passes) {
#if QTK_WGMMA
  extern __shared__ __align__(128) unsigned char wg_smem_buf[];
  pdl_begin();
  int grp, r0, r1;
  if (!group_rows(rg, grp, r0, r1)) return;
  if (rg.offsets == nullptr) {
    r0 = (blockIdx.x % passes) * kWgRows;
    r1 = min(r1, r0 + kWgRows);
  }
  const int n_block = (blockIdx.x / passes) * kWgCols;
  for (int rb = r0; rb < r1; rb += kWgRows)
    wg_pass<Y, kFp8>(o, rg.row_source, rb, r1, grp, n_block, wg_smem_buf, y, ldy);
#endif
}

}  // namespace qtk::cuda::dev
