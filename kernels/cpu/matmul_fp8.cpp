#include <cmath>

#include "core/error.h"
#include "kernels/cpu/matmul_fp8_paths.h"
#include "kernels/matmul_fp8.h"

namespace qtk {

namespace {

// note: threads get contiguous runs of kColumnUnit columns, as in matmul();
// results do not depend on the split.
constexpr int64_t kColumnUnit = 16;

cpu::MatmulFp8ColsFn path_function(CpuPath path) {
  if (!cpu_path_supported(path)) {
    fail("matmul_fp8: CPU path '{}' is not supported on this machine", cpu_path_name(path));
  }
  switch (path) {
    case CpuPath::kScalar:
      return cpu::matmul_fp8_cols_scalar;
    case CpuPath::kAvx2:
      return cpu::matmul_fp8_cols_avx2;
    case CpuPath::kAvx512:
    case CpuPath::kAmx:  // as f32 weights: the amx path runs the avx512 kernel
      return cpu::matmul_fp8_cols_avx512;
  }
  return cpu::matmul_fp8_cols_scalar;
}

// Whether some scale has |s| >= 2^8 (or is not finite), where s * 2^120
// would overflow float32 (see matmul_fp8_avx512.cpp).
bool has_big_scales(const float* scale, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (!(std::fabs(scale[i]) < 256.0f)) return true;
  return false;
}

}  // namespace

void matmul_fp8_on_path(CpuPath path, const float* x, int64_t ldx, const uint8_t* wq,
                        const float* scale, int64_t br, int64_t bc, float* y, int64_t ldy,
                        int64_t M, int64_t N, int64_t K, ThreadPool* pool) {
  cpu::MatmulFp8ColsFn fn = path_function(path);
  if (br <= 0 || bc <= 0 || bc % 16 != 0)
    fail("matmul_fp8: block size [{}, {}]: expected positive sizes, the width a multiple of 16", br,
         bc);
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {
    for (int64_t m = 0; m < M; ++m) {
      for (int64_t n = 0; n < N; ++n) y[m * ldy + n] = 0.0f;
    }
    return;
  }
  const int64_t sld = (K + bc - 1) / bc;
  const bool big = has_big_scales(scale, ((N + br - 1) / br) * sld);
  const int64_t units = (N + kColumnUnit - 1) / kColumnUnit;
  parallel_for(pool, units, [&](int64_t begin, int64_t end) {
    const int64_t n0 = begin * kColumnUnit;
    const int64_t n1 = end * kColumnUnit < N ? end * kColumnUnit : N;
    fn(x, ldx, wq, scale, sld, br, bc, y, ldy, M, K, n0, n1, big);
  });
}

void matmul_fp8(const float* x, int64_t ldx, const uint8_t* wq, const float* scale, int64_t br,
                int64_t bc, float* y, int64_t ldy, int64_t M, int64_t N, int64_t K,
                ThreadPool* pool) {
  matmul_fp8_on_path(active_cpu_path(), x, ldx, wq, scale, br, bc, y, ldy, M, N, K, pool);
}

}  // namespace qtk
