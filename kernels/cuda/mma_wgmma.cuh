// The split kernel's sum (kernels/cuda/mma_matmul.cuh) on sm_90's
// warpgroup tensor-core instruction, wgmma: the form of more than 16 rows
// without groups where the GPU has it. Device code, included by
// warp_matmul.cuh only.
//
// A block is one warpgroup: 64 output columns (weight rows), one pass of up
// to 64 token rows and one of the 4 K ranges; the 4 blocks of a column
// block's pass (one per range) run as a thread-block cluster, and at the
// end each block adds a quarter of the outputs' 4 range sums in range order
// through the cluster's shared memory.
// Per chunk the warpgroup
//   1. builds the A operand, its 64 weight rows, in registers exactly as the
//      narrow kernel builds its fragments (a lane's 16 contiguous k of rows
//      g and g + 8, converted from e4m3 in registers: weight_fragments);
//   2. runs the chunk's 4 k16 steps as 4 wgmma.m64n64k16 whose B operand,
//      the pass's 64 token rows, the chunk's cp.async copies wrote straight
//      into shared memory as wgmma's "core matrices" (8 x 8 bf16, K-major,
//      no swizzle) in the chunk's k order: core column c = 2j + h holds,
//      for step j, positions 8h .. 8h+7 = k 16t + 4j + 2h + {0, 1} for
//      t = 0..3, i.e. 32-bit word c + 8t of the token's 64-k chunk at word
//      t of the core row; so a token row's word w goes to column w % 8,
//      word w / 8 (one 4-byte copy each: lane w of a warp copies word w of a
//      row, 128 contiguous bytes a copy instruction).
// note: the arithmetic is the other kernels', element for element: each
// output is the same chain of k16 tensor-core steps over the same k
// positions (a k16 step's result depends on its 16 products, their
// positions and the accumulator only; which operand is A and which is B,
// or how many rows and columns share the instruction, does not enter it),
// the same chain restarts and scale folds (fmaf(chain, scale, acc)) and
// the same range additions. Tested bit for bit against the narrow kernel
// (MmaMatmul.RowBitsDoNotDependOnTheBatch).
// note: an FP8 chain's first step ignores the accumulator registers
// (wgmma's scale-d = 0) instead of adding the +0.0 of zeroed ones. The two
// differ only where the 16 products sum to -0.0 (-0.0 against +0.0), and
// the fold erases that: fmaf(+-0.0, s, acc) is acc for acc != 0, and acc is
// never -0.0 (it starts at +0.0 and a round-to-nearest sum that is exactly
// zero is +0.0). A dense range sum, which is never folded, starts from
// zeroed registers.
// note: why the weights are the A side. A from registers lets the
// conversion write the wgmma's operand directly: no converted tile in
// shared memory, no proxy fence and barrier between converting and
// multiplying; the activations need no conversion, so wgmma reads them
// from where the copies put them.
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

constexpr int kWgRows = 64;             // token rows per pass: the wgmma's N
constexpr int kWgCols = 64;             // output columns per block: its M
constexpr int kWgThreads = 128;         // one warpgroup
constexpr int kWgCluster = kMmaRanges;  // blocks per cluster: one per K range
constexpr int kWgXRows = kWgRows / 4;   // token rows a thread copies per chunk

// One block's ring of chunk stages: a stage is the pass's 64 token rows as
// core matrices, then the block's 64 weight rows (as the narrow kernel
// stages them).
// note: core columns kCStride = 64 * 16 + 16 bytes apart: the 16 bytes of
// padding put the 8 columns' words of one token row in 8 different bank
// quads, so a warp's 32 word copies of a row hit 32 banks.
// note: 4 (FP8) or 3 (bf16) stages: ~50 KB a block, 3 blocks an SM.
template <bool kFp8>
struct WgLayout {
  static constexpr int kCStride = kWgRows * 16 + 16;
  static constexpr int kXBytes = 8 * kCStride;
  static constexpr int kStage = kXBytes + kWgCols * w_stride<kFp8>();
  static constexpr int kStages = kFp8 ? 4 : 3;
  static constexpr int kBlockBytes = kStages * kStage;
  static_assert(kWgCols * kWgRows * 4 <= kBlockBytes, "the range sum fits the ring");
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
// The copies' shared-memory writes (generic proxy) made visible to wgmma's
// reads (the async proxy).
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

// d = a * B + (accumulate ? d : 0): one k16 step for the warpgroup's 64
// rows (a: this warp's 16, mma.m16n8k16's A layout) and B's 64 columns;
// d[4i + q] is column 8i + 2t + q % 2 of row g + 8 (q / 2).
__device__ __forceinline__ void wgmma_m64n64k16(float (&d)[32], const uint32_t (&a)[4], uint64_t b,
                                                int accumulate) {
#if QTK_WGMMA
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "{%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate)
      : "memory");
#endif
}

// The copies of one block's chunks: this thread's 4-byte words of the
// pass's token rows and 16-byte pieces of the block's weight rows, their
// sources and stage offsets worked out once.
// note: thread (warp wq, lane l) copies word l of token rows wq + 4i,
// i = 0..15 (rows past the pass repeat its last row: a token column
// reaches only its own outputs, which are not stored), and weight piece
// p % P of rows p / P for p = tid + 128 i (P pieces a row).
template <bool kFp8>
struct WgCopies {
  static constexpr int kP = kFp8 ? 4 : 8;               // pieces per weight row
  static constexpr int kW = kWgCols * kP / kWgThreads;  // weight pieces a thread
  const __nv_bfloat16* xsrc;                            // word l of token row 0 of the x rows
  uint32_t xoff[kWgXRows];        // each copied row's element offset from xsrc
  uint32_t xdst;                  // row wq's word l in a stage
  const unsigned char* wsrc[kW];  // piece i's bytes at chunk 0
  uint32_t wrows_ok;              // bit i: weight piece i has a row
  int xk, wk;                     // the thread's first k within a chunk

  __device__ __forceinline__ WgCopies(const MmaOperands& o, int rb, int r1, int n_block, int tid) {
    using L = WgLayout<kFp8>;
    const int lane = tid & 31, wq = tid >> 5;
    xk = 2 * lane;
    xsrc = o.x + xk;
#pragma unroll
    for (int i = 0; i < kWgXRows; ++i)
      xoff[i] = static_cast<uint32_t>(min(rb + wq + 4 * i, r1 - 1) * o.ldx);
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
    using L = WgLayout<kFp8>;
    const int k0 = c * kMmaChunk;
    const bool xk_ok = k0 + xk < o.K, wk_ok = k0 + wk < o.K;
    const __nv_bfloat16* x = xsrc + k0;
#pragma unroll
    for (int i = 0; i < kWgXRows; ++i) cp_async_4z(st + xdst + 64 * i, x + xoff[i], xk_ok);
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
// (token rows pass * 64 ..) of column block x / 4 / passes (columns
// * 64 ..). Dynamic shared memory: WgLayout<kFp8>::kBlockBytes; launched in
// clusters of 4 along x.
template <class Y, bool kFp8>
__global__ void __launch_bounds__(kWgThreads, 3)
    mma_wgmma_kernel(MmaOperands o, Y* __restrict__ y, int64_t ldy, int rows, int passes) {
#if QTK_WGMMA
  extern __shared__ __align__(128) unsigned char wg_smem_buf[];
  using L = WgLayout<kFp8>;
  constexpr int S = L::kStages;
  const int range = blockIdx.x % kWgCluster, rest = blockIdx.x / kWgCluster;
  const int rb = (rest % passes) * kWgRows, r1 = min(rows, rb + kWgRows);
  const int n_block = (rest / passes) * kWgCols;
  const int tid = threadIdx.x, lane = tid & 31, wq = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  int c0, c1;
  chunk_range(o.K, range, c0, c1);
  const WgCopies<kFp8> copies(o, rb, r1, n_block, tid);
  const ScaleRows sr(o, 0, n_block + 16 * wq, lane);
  pdl_begin();
  const uint32_t base = smem_addr(wg_smem_buf);
#pragma unroll
  for (int s = 0; s < S - 1; ++s) {
    if (c0 + s < c1) copies.issue(o, c0 + s, base + s * L::kStage, tid);
    cp_async_commit();
  }
  float acc[32], chain[32];
#pragma unroll
  for (int e = 0; e < 32; ++e) acc[e] = chain[e] = 0.0f;
  BlockCursor cur(c0, kFp8 ? o.bc : kMmaChunk);  // FP8: where the chains end
  constexpr int kWs = w_stride<kFp8>();
  const int w_off = (16 * wq + g) * kWs + (kFp8 ? 16 : 32) * t;
  int slot = 0;
  for (int c = c0; c < c1; ++c) {
    cp_async_wait<S - 2>();
    fence_proxy_async_shared();
    __syncthreads();  // chunk c is in; every warp is done with chunk c - 1's slot
    const int next = c + S - 1;
    if (next < c1) copies.issue(o, next, base + (slot == 0 ? S - 1 : slot - 1) * L::kStage, tid);
    cp_async_commit();
    const unsigned char* wl = wg_smem_buf + slot * L::kStage + L::kXBytes + w_off;
    RawPiece<kFp8> plo, phi;
#pragma unroll
    for (int v = 0; v < (kFp8 ? 1 : 2); ++v) {
      plo.v[v] = reinterpret_cast<const uint4*>(wl)[v];
      phi.v[v] = reinterpret_cast<const uint4*>(wl + 8 * kWs)[v];
    }
    uint32_t a[4][4];
    weight_fragments<kFp8>(plo, phi, a);
    const uint32_t xs = base + slot * L::kStage;
    // The chunk's 4 k16 steps into d, waited for.
    const auto steps = [&](float(&d)[32], int first) {
      wg_fence();
#pragma unroll
      for (int j = 0; j < 4; ++j)
        wgmma_m64n64k16(d, a[j], wg_descriptor(xs + 2 * j * L::kCStride, L::kCStride, 128),
                        j == 0 ? first : 1);
      wg_commit();
      wg_wait_all();
      wg_settle(d);
    };
    if constexpr (kFp8) {
      // A chain starts at the range's first chunk and at each scale block's.
      const bool start = c == c0 || cur.left == cur.cpb;
      const int kb = cur.kb;
      const bool end = cur.step() || c + 1 == c1;
      float s_lo = 0.0f, s_hi = 0.0f;
      if (end) sr.get(kb, s_lo, s_hi);  // loaded under the products
      steps(chain, start ? 0 : 1);
      if (end)
#pragma unroll
        for (int e = 0; e < 32; ++e) acc[e] = fmaf(chain[e], (e & 2) ? s_hi : s_lo, acc[e]);
    } else {
      steps(acc, 1);
    }
    slot = slot + 1 == S ? 0 : slot + 1;
  }
  cp_async_wait<0>();
  __syncthreads();  // the ring is free
  // The range sums added in range order, a quarter of the outputs a block:
  // ((a0 + a1) + a2) + a3, as the split kernel adds them.
  float* red = reinterpret_cast<float*>(wg_smem_buf);
#pragma unroll
  for (int e = 0; e < 32; ++e) red[e * kWgThreads + tid] = acc[e];
  cluster_barrier();
  for (int e = 8 * range; e < 8 * range + 8; ++e) {
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
