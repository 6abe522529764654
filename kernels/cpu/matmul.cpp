#include "kernels/matmul.h"

#include "kernels/cpu/matmul_paths.h"
#include "loaders/error.h"

namespace qtk {

namespace {

// note: threads get contiguous runs of kColumnUnit columns; the unit only
// balances work, results do not depend on it.
constexpr int64_t kColumnUnit = 16;

int weight_code(DType t) {
  switch (t) {
    case DType::BF16:
      return cpu::kWeightBf16;
    case DType::F16:
      return cpu::kWeightF16;
    case DType::F32:
      return cpu::kWeightF32;
    default:
      break;
  }
  fail("matmul: weight dtype: expected BF16, F16 or F32, found {}", dtype_name(t));
}

cpu::MatmulColsFn path_function(CpuPath path) {
  if (!cpu_path_supported(path)) {
    fail("matmul: CPU path '{}' is not supported on this machine", cpu_path_name(path));
  }
  switch (path) {
    case CpuPath::kScalar:
      return cpu::matmul_cols_scalar;
    case CpuPath::kAvx2:
      return cpu::matmul_cols_avx2;
    case CpuPath::kAvx512:
      return cpu::matmul_cols_avx512;
  }
  return cpu::matmul_cols_scalar;
}

}  // namespace

void matmul_on_path(CpuPath path, const float* x, int64_t ldx, const void* w, DType wtype, float* y,
                    int64_t ldy, int64_t M, int64_t N, int64_t K, ThreadPool* pool) {
  int code = weight_code(wtype);
  cpu::MatmulColsFn fn = path_function(path);
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {
    for (int64_t m = 0; m < M; ++m) {
      for (int64_t n = 0; n < N; ++n) y[m * ldy + n] = 0.0f;
    }
    return;
  }
  int64_t units = (N + kColumnUnit - 1) / kColumnUnit;
  parallel_for(pool, units, [&](int64_t begin, int64_t end) {
    int64_t n0 = begin * kColumnUnit;
    int64_t n1 = end * kColumnUnit < N ? end * kColumnUnit : N;
    fn(x, ldx, w, code, y, ldy, M, K, n0, n1);
  });
}

void matmul(const float* x, int64_t ldx, const void* w, DType wtype, float* y, int64_t ldy,
            int64_t M, int64_t N, int64_t K, ThreadPool* pool) {
  matmul_on_path(active_cpu_path(), x, ldx, w, wtype, y, ldy, M, N, K, pool);
}

}  // namespace qtk
