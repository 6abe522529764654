#include "kernels/matmul.h"

#include <cstdlib>
#include <vector>

#include "core/error.h"
#include "core/tuning.h"
#include "kernels/cpu/matmul_paths.h"

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
    case CpuPath::kAmx:  // f16 / f32 weights; bf16 goes to matmul_amx
      return cpu::matmul_cols_avx512;
  }
  return cpu::matmul_cols_scalar;
}

// note: AMX workspace (packed activations + one column-tail scratch per
// thread), per calling thread, grown to the largest call seen and then
// reused: no allocation on the hot path once the model's shapes have run.
// Its size is about 1.6x the f32 activations of the largest call (3 bf16
// parts, 16 columns per 15) plus 32 * K bytes per thread.
uint16_t* amx_workspace(size_t u16) {
  thread_local std::vector<uint16_t> buffer;
  constexpr size_t kAlign = 32;  // elements: 64 bytes
  if (buffer.size() < u16 + kAlign) buffer.resize(u16 + kAlign);
  uintptr_t p = reinterpret_cast<uintptr_t>(buffer.data());
  return buffer.data() + ((64 - p % 64) % 64) / 2;
}

// note: QTK_AMX_PREFETCH=0..4 (core/tuning.h) picks the AMX kernel's weight
// prefetch (matmul_paths.h; a measurement knob, read once; results are
// identical). The default, 1, was the only mode never far behind at M = 1 and the best
// at M = 8 on the AMX host (bench/kernels/RESULTS.md, the AMX section).
int amx_prefetch_mode() {
  static const int mode = tuning().amx_prefetch;
  return mode;
}

void matmul_amx(const float* x, int64_t ldx, const void* w, float* y, int64_t ldy, int64_t M,
                int64_t N, int64_t K, ThreadPool* pool) {
  const int64_t packed_u16 = cpu::amx_packed_u16(M, K);
  const int64_t scratch_u16 = (cpu::amx_scratch_u16(K) + 31) / 32 * 32;
  const int threads = pool_size(pool);
  uint16_t* packed = amx_workspace(static_cast<size_t>(packed_u16 + scratch_u16 * threads));
  uint16_t* scratch = packed + packed_u16;
  const int prefetch = amx_prefetch_mode();
  // note: packing is M x K work against the matmul's M x N x K; spread over
  // the pool only when there are enough groups to share.
  const int64_t groups = cpu::amx_groups(M);
  if (groups >= 8) {
    parallel_for(pool, groups,
                 [&](int64_t g0, int64_t g1) { cpu::amx_pack_x(x, ldx, M, K, packed, g0, g1); });
  } else {
    cpu::amx_pack_x(x, ldx, M, K, packed, 0, groups);
  }
  int64_t units = (N + kColumnUnit - 1) / kColumnUnit;
  parallel_for_tid(pool, units, [&](int64_t begin, int64_t end, int tid) {
    int64_t n0 = begin * kColumnUnit;
    int64_t n1 = end * kColumnUnit < N ? end * kColumnUnit : N;
    cpu::matmul_cols_amx(packed, M, K, w, y, ldy, n0, n1, scratch + tid * scratch_u16, prefetch);
  });
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
  if (path == CpuPath::kAmx && wtype == DType::BF16) {
    matmul_amx(x, ldx, w, y, ldy, M, N, K, pool);
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
