// The split kernel's sum (kernels/cuda/mma_matmul.cuh) on sm_90's
// warpgroup tensor-core instruction, wgmma: a form of more than 16 rows
// without groups where the GPU has it, opt-in (QTK_MMA_WIDE=90). Device
// code, included by warp_matmul.cuh only.
//
// A block is one warpgroup: 64 output columns (weight rows), one pass of up
// to 64 or 128 token rows (the wgmma's N) and one of the 4 K ranges; the 4
// blocks of a column block's pass (one per range) run as a thread-block
// cluster, and at the end each block adds a quarter of the outputs' 4
// range sums in range order through the cluster's shared memory.
// Per chunk the warpgroup
//   1. converts the stage's 64 weight rows (e4m3 or bf16) into a bf16 tile
//      of wgmma's "core matrices" (8 x 8, K-major, no swizzle), the A
//      operand, in the chunk's k order (wg_convert);
//   2. runs the chunk's 4 k16 steps as 4 wgmma.m64nNk16 whose B operand,
//      the pass's token rows, the chunk's cp.async copies wrote straight
//      into core matrices in the same k order: core column c = 2j + h holds,
//      for step j, positions 8h .. 8h+7 = k 16t + 4j + 2h + {0, 1} for
//      t = 0..3, i.e. 32-bit word c + 8t of the token's 64-k chunk at word
//      t of the core row; so a token row's word w goes to column w % 8,
//      word w / 8 (one 4-byte copy each: lane w of a warp copies word w of a
//      row, 128 contiguous bytes a copy instruction).
// The products of one chunk run while the warpgroup converts the next into
// the other of two tiles.
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
// note: speed. Not the per-shape choice: on an H200 it is as fast as the
// split kernel at M = 128 on the Qwen3-8B shapes at best (FP8 6144 x 4096
// 42.4 vs 44.6 us, 24576 x 4096 149 vs 140, 4096 x 12288 89.5 vs 64.6;
// bench/cuda/RESULTS.md). Three forms of the loop measured the same within
// 10%: the weights as wgmma's register A operand waited for chunk by
// chunk, the same with 128-row passes, and this one (products overlapping
// the next conversion), though the second issues 1.7x fewer instructions
// per product than the first: the time is not the instructions or the
// tensor pipe. A chunk takes ~1.8 us where its products take ~0.3, and the
// largest stall (ncu) is the wait for the copies (long scoreboard, 44% of
// the samples) with 2 chunks in flight a block; but a 9-stage ring (7 in
// flight, one block an SM) was 1.3-1.5x slower: with one warpgroup an SM
// the loop's own work (conversion, barriers, the fold's waits) shows, so
// more warpgroups per SM sharing the token rows, not more copies in
// flight, is what the form lacks.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/mma_matmul.cuh"

// The wgmma instructions exist in sm_90a machine code only; the compute_80
// PTX of the library gets an empty kernel (the host launches it on
// compute capability 9.0 only: wgmma_device()).
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define QTK_WGMMA 1
#else
#define QTK_WGMMA 0
#endif

namespace qtk::cuda::dev {

constexpr int kWgCols = 64;             // output columns per block: the wgmma's M
constexpr int kWgThreads = 128;         // one warpgroup
constexpr int kWgCluster = kMmaRanges;  // blocks per cluster: one per K range

// One block's shared memory for passes of kRows token rows (the wgmma's
// N, 64 or 128): two converted weight tiles, then the ring of chunk stages
// (a stage: the pass's token rows as core matrices, then the block's 64
// weight rows as the narrow kernel stages them).
// note: core columns kCStride = kRows * 16 + 16 bytes apart (kTStride for
// the tile): the 16 bytes of padding put the 8 columns' words of one row in
// 8 different bank quads, so a warp's 32 word copies of a token row, or
// its conversion's stores, hit 32 banks.
// note: 4 stages (3 for bf16 weights): 64-row passes ~66 KB a block, 3
// blocks an SM; 128-row passes ~99 KB, 2 blocks an SM (their 64 + 64
// accumulators need the registers of 2).
template <bool kFp8, int kRows>
struct WgLayout {
  static constexpr int kTStride = kWgCols * 16 + 16;  // weight tile: core column stride
  static constexpr int kTile = 8 * kTStride;
  static constexpr int kCStride = kRows * 16 + 16;  // token rows: core column stride
  static constexpr int kXBytes = 8 * kCStride;
  static constexpr int kStage = kXBytes + kWgCols * w_stride<kFp8>();
  static constexpr int kStages = kFp8 ? 4 : 3;
  static constexpr int kRing = 2 * kTile;  // the ring follows the two weight tiles
  static constexpr int kBlockBytes = kRing + kStages * kStage;
  static constexpr int kAcc = kRows / 2;    // accumulators a thread
  static constexpr int kXRows = kRows / 4;  // token rows a thread copies per chunk
  static_assert(kWgCols * kRows * 4 <= kBlockBytes, "the range sum fits");
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
// Until at most N of the warpgroup's committed groups of products are
// still running.
template <int N>
__device__ __forceinline__ void wg_wait() {
#if QTK_WGMMA
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
// The copies' shared-memory writes (generic proxy) made visible to wgmma's
// reads (the async proxy).
__device__ __forceinline__ void fence_proxy_async_shared() {
#if QTK_WGMMA
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
// After the wait: the compiler may not move a read of d above it.
template <int N>
__device__ __forceinline__ void wg_settle(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// d = A * B + (accumulate ? d : 0): one k16 step for 64 rows (A, the
// weight tile) and B's 64 or 128 columns (the token rows), both read from
// shared memory through their descriptors; d[4i + q] is column
// 8i + 2t + q % 2 of row 16 * warp + g + 8 (q / 2).
__device__ __forceinline__ void wgmma_m64n64k16(float (&d)[32], uint64_t a, uint64_t b,
                                                int accumulate) {
#if QTK_WGMMA
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
      "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "%32, %33, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(a), "l"(b), "r"(accumulate)
      : "memory");
#endif
}

__device__ __forceinline__ void wgmma_m64n128k16(float (&d)[64], uint64_t a, uint64_t b,
                                                 int accumulate) {
#if QTK_WGMMA
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
      "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "
      "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "
      "%56, %57, %58, %59, %60, %61, %62, %63}, "
      "%64, %65, p, 1, 1, 0, 0;\n}\n"
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
      : "l"(a), "l"(b), "r"(accumulate)
      : "memory");
#endif
}

template <int N>
__device__ __forceinline__ void wgmma_k16(float (&d)[N], uint64_t a, uint64_t b, int accumulate) {
  if constexpr (N == 32)
    wgmma_m64n64k16(d, a, b, accumulate);
  else
    wgmma_m64n128k16(d, a, b, accumulate);
}

// The stage's 64 weight rows (w: row n at n * w_stride) into a tile of
// core matrices, the layout wgmma reads its A operand from (K-major, no
// swizzle), in the chunk's k order: thread tid takes the 16 k at 16t of
// rows tid / 4 and 32 + tid / 4 (t = tid % 4); their pair p (k 16t + 2p,
// +1) is position 2t of step p / 2, half p % 2: core column c = p, row n,
// word t, at byte c * kTStride + n * 16 + 4t.
// note: a warp's 32 lanes read 512 contiguous bytes (FP8) and write 32
// consecutive words per pair: no bank conflicts.
template <bool kFp8, int kTStride>
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
      *reinterpret_cast<uint32_t*>(tile + q * kTStride + n * 16 + 4 * t) = pairs[q];
  }
}

// The copies of one block's chunks: this thread's 4-byte words of the
// pass's token rows and 16-byte pieces of the block's weight rows, their
// sources and stage offsets worked out once.
// note: thread (warp wq, lane l) copies word l of token rows wq + 4i
// (rows past the pass repeat its last row: a token column reaches only its
// own outputs, which are not stored), and weight piece p % P of rows p / P
// for p = tid + 128 i (P pieces a row). A token row's address is a 32-bit
// byte offset from the chunk's base, one add a copy.
template <bool kFp8, int kRows>
struct WgCopies {
  using L = WgLayout<kFp8, kRows>;
  static constexpr int kP = kFp8 ? 4 : 8;               // pieces per weight row
  static constexpr int kW = kWgCols * kP / kWgThreads;  // weight pieces a thread
  const unsigned char* xsrc;                            // word l of x row 0, chunk 0
  uint32_t xoff[L::kXRows];                             // each copied row's byte offset from xsrc
  uint32_t xdst;                                        // row wq's word l in a stage
  const unsigned char* wsrc[kW];                        // piece i's bytes at chunk 0
  uint32_t wrows_ok;                                    // bit i: weight piece i has a row
  int xk, wk;                                           // the thread's first k within a chunk

  __device__ __forceinline__ WgCopies(const MmaOperands& o, int rb, int r1, int n_block, int tid) {
    const int lane = tid & 31, wq = tid >> 5;
    xk = 2 * lane;
    xsrc = reinterpret_cast<const unsigned char*>(o.x + xk);
#pragma unroll
    for (int i = 0; i < L::kXRows; ++i)
      xoff[i] = static_cast<uint32_t>(min(rb + wq + 4 * i, r1 - 1) * o.ldx * 2);
    xdst = (lane & 7) * L::kCStride + wq * 16 + (lane >> 3) * 4;
    wk = (tid % kP) * (kFp8 ? 16 : 8);
    wrows_ok = 0;
#pragma unroll
    for (int i = 0; i < kW; ++i) {
      const int n = n_block + (tid + kWgThreads * i) / kP;
      const int64_t w = static_cast<int64_t>(n) * o.K + wk;
      wrows_ok |= n < o.N ? 1u << i : 0u;
      wsrc[i] = n >= o.N ? reinterpret_cast<const unsigned char*>(o.x)
                : kFp8   ? o.wq + w
                         : reinterpret_cast<const unsigned char*>(o.wd + w);
    }
  }
  // Chunk c into the stage at shared address st; past K both operands are
  // zeros.
  __device__ __forceinline__ void issue(const MmaOperands& o, int c, uint32_t st, int tid) const {
    const int k0 = c * kMmaChunk;
    const bool xk_ok = k0 + xk < o.K, wk_ok = k0 + wk < o.K;
    const unsigned char* x = xsrc + 2 * k0;
#pragma unroll
    for (int i = 0; i < L::kXRows; ++i) cp_async_4z(st + xdst + 64 * i, x + xoff[i], xk_ok);
    const int64_t wk0 = static_cast<int64_t>(k0) * (kFp8 ? 1 : 2);
#pragma unroll
    for (int i = 0; i < kW; ++i) {
      const int p = tid + kWgThreads * i;
      cp_async_16(st + L::kXBytes + (p / kP) * w_stride<kFp8>() + (p % kP) * 16, wsrc[i] + wk0,
                  wk_ok && (wrows_ok >> i & 1u));
    }
  }
};

// Block x: range x % 4 (its rank in the cluster) of pass (x / 4) % passes
// (token rows pass * kRows ..) of column block x / 4 / passes (columns
// * 64 ..). Dynamic shared memory: WgLayout<kFp8, kRows>::kBlockBytes;
// launched in clusters of 4 along x.
template <class Y, bool kFp8, int kRows>
__global__ void __launch_bounds__(kWgThreads, kRows == 64 ? 3 : 2)
    mma_wgmma_kernel(MmaOperands o, Y* __restrict__ y, int64_t ldy, int rows, int passes) {
#if QTK_WGMMA
  extern __shared__ __align__(128) unsigned char wg_smem_buf[];
  using L = WgLayout<kFp8, kRows>;
  constexpr int S = L::kStages, A = L::kAcc;
  const int range = blockIdx.x % kWgCluster, rest = blockIdx.x / kWgCluster;
  const int rb = (rest % passes) * kRows, r1 = min(rows, rb + kRows);
  const int n_block = (rest / passes) * kWgCols;
  const int tid = threadIdx.x, lane = tid & 31, wq = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  int c0, c1;
  chunk_range(o.K, range, c0, c1);
  const WgCopies<kFp8, kRows> copies(o, rb, r1, n_block, tid);
  const ScaleRows sr(o, 0, n_block + 16 * wq, lane);
  pdl_begin();
  const uint32_t base = smem_addr(wg_smem_buf), ring = base + L::kRing;
#pragma unroll
  for (int s = 0; s < S - 2; ++s) {
    if (c0 + s < c1) copies.issue(o, c0 + s, ring + s * L::kStage, tid);
    cp_async_commit();
  }
  float acc[A], chain[A];
#pragma unroll
  for (int e = 0; e < A; ++e) acc[e] = chain[e] = 0.0f;
  BlockCursor cur(c0, kFp8 ? o.bc : kMmaChunk);  // FP8: where the chains end
  // note: the products of chunk c run while the warpgroup waits for chunk
  // c + 1 and converts its weights into the other tile; the wait after
  // issuing them retires chunk c - 1's, whose tile and stage slot the next
  // chunk rewrites (the ring holds chunk c - 1 being multiplied, c, and
  // S - 2 chunks in flight). An FP8 chain is folded into acc once its last
  // products are done: right before the next chain's first products, or
  // after the loop.
  float s_lo = 0.0f, s_hi = 0.0f;  // FP8: the scales of the chain to fold
  const auto fold = [&] {
#pragma unroll
    for (int e = 0; e < A; ++e) acc[e] = fmaf(chain[e], (e & 2) ? s_hi : s_lo, acc[e]);
  };
  int slot = 0;
  for (int c = c0; c < c1; ++c) {
    cp_async_wait<S - 3>();
    fence_proxy_async_shared();
    __syncthreads();  // chunk c is in; every warp is past chunk c - 1
    if (c + S - 2 < c1) copies.issue(o, c + S - 2, ring + (slot + S - 2) % S * L::kStage, tid);
    cp_async_commit();
    const int tile = ((c - c0) & 1) * L::kTile;
    wg_convert<kFp8, L::kTStride>(wg_smem_buf + L::kRing + slot * L::kStage + L::kXBytes,
                                  wg_smem_buf + tile, tid);
    fence_proxy_async_shared();
    __syncthreads();  // the tile is written
    const uint32_t xs = ring + slot * L::kStage, ws = base + tile;
    // The chunk's 4 k16 steps into d, committed as one group.
    const auto steps = [&](float(&d)[A], int first) {
      wg_fence();
#pragma unroll
      for (int j = 0; j < 4; ++j)
        wgmma_k16(d, wg_descriptor(ws + 2 * j * L::kTStride, L::kTStride, 128),
                  wg_descriptor(xs + 2 * j * L::kCStride, L::kCStride, 128), j == 0 ? first : 1);
      wg_commit();
    };
    if constexpr (kFp8) {
      // A chain starts at the range's first chunk and at each scale block's.
      const bool start = c == c0 || cur.left == cur.cpb;
      if (start && c != c0) {  // the chain before ended with chunk c - 1
        wg_wait<0>();
        wg_settle(chain);
        fold();
      }
      const int kb = cur.kb;
      if (cur.step() || c + 1 == c1) sr.get(kb, s_lo, s_hi);  // this chain ends here
      steps(chain, start ? 0 : 1);
    } else {
      steps(acc, 1);
    }
    wg_wait<1>();  // chunk c - 1's products are done: its tile and slot are free
    slot = slot + 1 == S ? 0 : slot + 1;
  }
  wg_wait<0>();
  if constexpr (kFp8) {
    wg_settle(chain);
    if (c1 > c0) fold();
  } else {
    wg_settle(acc);
  }
  cp_async_wait<0>();
  __syncthreads();  // the ring is free
  // The range sums added in range order, a quarter of the outputs a block:
  // ((a0 + a1) + a2) + a3, as the split kernel adds them.
  float* red = reinterpret_cast<float*>(wg_smem_buf);
#pragma unroll
  for (int e = 0; e < A; ++e) red[e * kWgThreads + tid] = acc[e];
  cluster_barrier();
  constexpr int kQuarter = A / kWgCluster;
  for (int e = kQuarter * range; e < kQuarter * (range + 1); ++e) {
    const float* p = red + e * kWgThreads + tid;
    float v = cluster_load(p, 0);
#pragma unroll
    for (unsigned r = 1; r < kWgCluster; ++r) v = v + cluster_load(p, r);
    const int i = e >> 2, q = e & 3;
    const int n = n_block + 16 * wq + g + 8 * (q >> 1), r = rb + 8 * i + 2 * t + (q & 1);
    if (r < r1 && n < o.N) y[static_cast<int64_t>(r) * ldy + n] = from_f<Y>(v);
  }
  cluster_barrier();  // no block leaves while another reads its shared memory
#endif
}

}  // namespace qtk::cuda::dev
