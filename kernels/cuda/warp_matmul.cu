#include "kernels/cuda/warp_matmul.h"

#include <cuda_bf16.h>

#include "kernels/cuda/warp_matmul.cuh"

namespace qtk::cuda {
namespace {

// One group of M rows (no experts).
dev::RowGroups whole_rows(const char* what, int64_t M) {
  if (M > INT32_MAX)
    fail_message(std::string(what) + ": " + std::to_string(M) + " rows is too many");
  dev::RowGroups rows;
  rows.rows = static_cast<int>(M);
  return rows;
}

}  // namespace

int mma_wide_form(int64_t N, int64_t rows, bool grouped, bool fp8) {
  return wide_form(N, rows, grouped, fp8);
}

template <class T, class Y>
void warp_matmul(const T* x, int64_t ldx, const WeightRef<T>& w, Y* y, int64_t ldy, int64_t M,
                 int64_t N, int64_t K, cudaStream_t stream) {
  if (M == 0 || N == 0) return;
  launch_warp_matmul<T, Y>("warp_matmul", x, ldx, w, N, K, y, ldy, whole_rows("warp_matmul", M), 1,
                           stream);
}

template <class T>
bool warp_matmul_swiglu(const T* x, int64_t ldx, const WeightRef<T>& w, T* act, int64_t lda,
                        int64_t M, int64_t I, int64_t K, cudaStream_t stream) {
  if (M == 0 || I == 0) return true;
  const dev::RowGroups rows = whole_rows("warp_matmul_swiglu", M);
  check_weight_operands("warp_matmul_swiglu", w, 2 * I, K, 1);
  return launch_mma_matmul<T, T>(x, ldx, w, 2 * I, K, act, lda, rows, 1, I, stream);
}

template bool warp_matmul_swiglu<float>(const float*, int64_t, const WeightRef<float>&, float*,
                                        int64_t, int64_t, int64_t, int64_t, cudaStream_t);
template bool warp_matmul_swiglu<__nv_bfloat16>(const __nv_bfloat16*, int64_t,
                                                const WeightRef<__nv_bfloat16>&, __nv_bfloat16*,
                                                int64_t, int64_t, int64_t, int64_t, cudaStream_t);

template void warp_matmul<float, float>(const float*, int64_t, const WeightRef<float>&, float*,
                                        int64_t, int64_t, int64_t, int64_t, cudaStream_t);
template void warp_matmul<__nv_bfloat16, __nv_bfloat16>(const __nv_bfloat16*, int64_t,
                                                        const WeightRef<__nv_bfloat16>&,
                                                        __nv_bfloat16*, int64_t, int64_t, int64_t,
                                                        int64_t, cudaStream_t);
template void warp_matmul<__nv_bfloat16, float>(const __nv_bfloat16*, int64_t,
                                                const WeightRef<__nv_bfloat16>&, float*, int64_t,
                                                int64_t, int64_t, int64_t, cudaStream_t);

}  // namespace qtk::cuda
