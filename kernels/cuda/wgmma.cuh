// The warpgroup tensor-core instruction of sm_90, wgmma: the pieces that
// every kernel using it shares (the shared-memory operand descriptor, the
// fences, the group commit / wait) and the two shapes the decode products
// read both operands of from shared memory. Device code.
#pragma once

#include <cstdint>

// The wgmma instructions exist in sm_90a machine code only; the compute_80
// PTX of the library gets an empty kernel (the host launches it on
// compute capability 9.0 only: wgmma_device()).
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define QTK_WGMMA 1
#else
#define QTK_WGMMA 0
#endif

namespace qtk::cuda::dev {

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

// d = A * B + d: one k16 step of 64 rows of A (the descriptor a) against N
// = 8 * kN8 rows of B (the descriptor b), both K-major bf16 in shared
// memory; f32 accumulators. d[4i + q] is column 8i + 2t + q % 2 of row
// 16 * warp + g + 8 (q / 2) (lane = 4g + t of the warpgroup's warp).
template <int kN8>
__device__ __forceinline__ void wgmma_m64nk16_ss(float (&d)[4 * kN8], uint64_t a, uint64_t b) {
  static_assert(kN8 == 1 || kN8 == 2, "N 8 or 16");
#if QTK_WGMMA
  if constexpr (kN8 == 1) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3}, %4, %5, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "l"(a), "l"(b), "r"(1)
        : "memory");
  } else {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
          "+f"(d[7])
        : "l"(a), "l"(b), "r"(1)
        : "memory");
  }
#endif
}

}  // namespace qtk::cuda::dev
