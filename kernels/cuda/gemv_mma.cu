// Skinny tensor-core products (declared in kernels/cuda/gemv_mma.h).
#include <mutex>
#include <string>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/gemv_mma.h"
#include "kernels/cuda/mma.cuh"

namespace qtk::cuda {
namespace {

using namespace dev;
using bf16 = __nv_bfloat16;

constexpr int kKT = 128;      // k per pipeline stage
constexpr int kLd = kKT + 8;  // bf16 per shared row: ldmatrix rows hit distinct banks
constexpr int kVec = 8;       // bf16 per 16-byte copy

// note: one warp owns 16 output columns (weight rows) and walks K alone: the
// accumulation is one chain, so the only parallelism is N / 16 warps (64 for
// N = 1024). To stream a weight tile of 16 x K fast anyway, a warp keeps
// kStages - 1 stages of 16 x 128 weights (4 KiB each) in flight with
// cp.async: 44 KiB per warp for NT = 1.
template <int NT>
__host__ __device__ constexpr int stages() {
  return NT == 1 ? 12 : 8;
}
template <int NT>
constexpr size_t smem_bytes() {
  return static_cast<size_t>(stages<NT>()) * (16 + 8 * NT) * kLd * sizeof(bf16);
}

// NT token tiles of 8 (m <= 8 * NT).
template <int NT, class OUT>
__global__ void __launch_bounds__(32)
    gemv_kernel(const bf16* __restrict__ x, int64_t ldx, const bf16* __restrict__ w, int64_t ldw,
                OUT* __restrict__ y, int64_t ldy, int m, int n, int k) {
  constexpr int kS = stages<NT>();
  constexpr int kRows = 16 + 8 * NT;  // weight rows, then token rows, per stage
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* sm = reinterpret_cast<bf16*>(smem_raw);  // bf16 [kS][kRows][kLd]
  const int lane = threadIdx.x;
  const int n0 = blockIdx.x * 16;
  const int tiles = (k + kKT - 1) / kKT;

  auto issue = [&](int kt) {
    bf16* st = sm + (kt % kS) * kRows * kLd;
    const int k0 = kt * kKT;
    for (int i = lane; i < kRows * (kKT / kVec); i += 32) {
      const int r = i / (kKT / kVec), cv = i % (kKT / kVec);
      const int kk = k0 + cv * kVec;
      const bf16* src = w;
      bool valid = kk < k;
      if (r < 16) {
        valid = valid && n0 + r < n;
        if (valid) src = w + static_cast<int64_t>(n0 + r) * ldw + kk;
      } else {
        valid = valid && r - 16 < m;
        if (valid) src = x + static_cast<int64_t>(r - 16) * ldx + kk;
      }
      cp_async_16(smem_addr(st + r * kLd + cv * kVec), src, valid);
    }
  };

  float acc[NT][4];
#pragma unroll
  for (int t = 0; t < NT; ++t) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.0f;
#pragma unroll
  for (int s = 0; s < kS - 1; ++s) {
    if (s < tiles) issue(s);
    cp_async_commit();
  }
  for (int kt = 0; kt < tiles; ++kt) {
    cp_async_wait<kS - 2>();                      // stage kt landed (this lane's copies)
    __syncwarp();                                 // ... and every lane's
    if (kt + kS - 1 < tiles) issue(kt + kS - 1);  // into the stage read at kt - 1
    cp_async_commit();
    const bf16* ws = sm + (kt % kS) * kRows * kLd;
    const bf16* xs = ws + 16 * kLd;
    // note: zero-filled k past the end add +0 products, as any kernel's
    // zero-padded K tail does.
#pragma unroll
    for (int kk = 0; kk < kKT / 16; ++kk) {
      uint32_t a[4];
      ldmatrix_x4(a, smem_addr(ws + (lane & 15) * kLd + kk * 16 + (lane >> 4) * 8));
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        uint32_t b[2];
        ldmatrix_x2(b,
                    smem_addr(xs + (t * 8 + (lane & 7)) * kLd + kk * 16 + ((lane >> 3) & 1) * 8));
        mma_bf16(acc[t], a, b[0], b[1]);
      }
    }
    __syncwarp();  // every lane is done with stage kt before it is refilled
  }
  cp_async_wait<0>();
  const int g = lane >> 2, c = lane & 3;
  auto put = [&](int row, int col, float v) {
    if (row < m && n0 + col < n) {
      if constexpr (std::is_same_v<OUT, float>)
        y[static_cast<int64_t>(row) * ldy + n0 + col] = v;
      else
        y[static_cast<int64_t>(row) * ldy + n0 + col] = __float2bfloat16_rn(v);
    }
  };
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    // C fragment: d0 (col g, token 2c), d1 (g, 2c+1), d2 (g+8, 2c), d3 (g+8, 2c+1).
    put(t * 8 + 2 * c, g, acc[t][0]);
    put(t * 8 + 2 * c + 1, g, acc[t][1]);
    put(t * 8 + 2 * c, g + 8, acc[t][2]);
    put(t * 8 + 2 * c + 1, g + 8, acc[t][3]);
  }
}

template <int NT, class OUT>
void launch(const bf16* x, int64_t ldx, const bf16* w, int64_t ldw, OUT* y, int64_t ldy, int64_t m,
            int64_t n, int64_t k, cudaStream_t stream) {
  static std::once_flag once;
  std::call_once(once, [] {
    QTK_CUDA_CHECK(cudaFuncSetAttribute(gemv_kernel<NT, OUT>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(smem_bytes<NT>())));
  });
  const unsigned blocks = static_cast<unsigned>((n + 15) / 16);
  gemv_kernel<NT, OUT><<<blocks, 32, smem_bytes<NT>(), stream>>>(
      x, ldx, w, ldw, y, ldy, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k));
  QTK_CUDA_CHECK_LAUNCH();
}

}  // namespace

using bf16 = __nv_bfloat16;

bool gemv_bf16_supported(const void* x, int64_t ldx, const void* w, int64_t ldw, int64_t m,
                         int64_t k) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return m >= 1 && m <= kGemvMaxM && k % kVec == 0 && ldx % kVec == 0 && ldw % kVec == 0 &&
         aligned(x) && aligned(w) && k < (int64_t{1} << 30);
}

template <class OUT>
void gemv_bf16(const bf16* x, int64_t ldx, const bf16* w, int64_t ldw, OUT* y, int64_t ldy,
               int64_t m, int64_t n, int64_t k, cudaStream_t stream) {
  if (m <= 0 || n <= 0) return;
  if (!gemv_bf16_supported(x, ldx, w, ldw, m, k))
    fail_message("gemv_bf16: unsupported call (m " + std::to_string(m) + ", k " +
                 std::to_string(k) + "; m <= 16, k and strides multiples of 8, aligned pointers)");
  if (m <= 8)
    launch<1, OUT>(x, ldx, w, ldw, y, ldy, m, n, k, stream);
  else
    launch<2, OUT>(x, ldx, w, ldw, y, ldy, m, n, k, stream);
}

template void gemv_bf16<float>(const __nv_bfloat16*, int64_t, const bf16*, int64_t, float*, int64_t,
                               int64_t, int64_t, int64_t, cudaStream_t);
template void gemv_bf16<bf16>(const bf16*, int64_t, const bf16*, int64_t, bf16*, int64_t, int64_t,
                              int64_t, int64_t, cudaStream_t);

}  // namespace qtk::cuda
