// The steps in front of a projection that both CUDA models fuse into the
// projection's launch where that keeps every bit: "add, then norm" between
// two sublayers, and the MLP's SwiGLU.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>
#include <utility>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/gemm.h"
#include "runtime/cuda/device_upload.h"

namespace qtk::cuda {

// The residual stream of a step: two buffers, x the current one.
template <class T>
struct ResidualStream {
  T* x;      // T [tokens, hidden]: the residual
  T* spare;  // T [tokens, hidden]: where a fused step writes the next one
};

// x += delta (rounded to T); h = rmsnorm(x) * norm_w; y = h w^T (n outputs
// of hidden inputs, w in the HF layout with row stride hidden). Exactly
// add_rmsnorm followed by gemm.run.
// note: at M <= QTK_FUSED_MAX_M (default 1: decode at batch 1; see
// gemm.cpp) in bf16, where the own skinny kernel serves the product
// bit-equal to the plan algorithm, the three run as one launch
// (Gemm::run_add_rmsnorm): the add and the norm in front of the product, with add_rmsnorm's
// arithmetic and order, so the bits are the same either way and a sequence's tokens do not depend
// on the path. That launch leaves h unwritten and the new residual in rs.spare (its blocks still
// read the old one), and the two buffers swap. delta may be h.
template <class T>
void add_norm_gemm(Gemm& gemm, ResidualStream<T>& rs, const T* delta, const float* norm_w,
                   float eps, T* h, const void* w, void* y, int64_t ldy, int64_t rows, int64_t n,
                   int64_t hidden, cudaStream_t stream) {
  if constexpr (std::is_same_v<T, bf16>) {
    const AddRmsNormInput an{.residual = rs.x,
                             .ldr = hidden,
                             .delta = delta,
                             .ldd = hidden,
                             .weight = norm_w,
                             .eps = eps,
                             .residual_out = rs.spare,
                             .ldo = hidden};
    if (gemm.run_add_rmsnorm(an, w, hidden, y, ldy, rows, n, hidden, DType::BF16, stream)) {
      std::swap(rs.x, rs.spare);
      return;
    }
  }
  add_rmsnorm<T>(rs.x, hidden, delta, hidden, norm_w, h, hidden, rows, hidden, eps, stream);
  gemm.run(h, hidden, w, hidden, y, ldy, rows, n, hidden, dtype_of<T>(), dtype_of<T>(), stream);
}

// act = swiglu(gate_up) (bf16 [rows, 2 inter] -> act [rows, inter]); y =
// act w^T (n outputs). Exactly swiglu followed by gemm.run; at M <= QTK_FUSED_MAX_M in
// bf16 one launch (Gemm::run_swiglu, same bits) that leaves act unwritten.
template <class T>
void swiglu_gemm(Gemm& gemm, const T* gate_up, T* act, const void* w, void* y, int64_t ldy,
                 int64_t rows, int64_t n, int64_t inter, cudaStream_t stream) {
  if constexpr (std::is_same_v<T, bf16>)
    if (gemm.run_swiglu(gate_up, 2 * inter, inter, w, inter, y, ldy, rows, n, inter, DType::BF16,
                        stream))
      return;
  swiglu<T>(gate_up, 2 * inter, act, inter, rows, inter, stream);
  gemm.run(act, inter, w, inter, y, ldy, rows, n, inter, dtype_of<T>(), dtype_of<T>(), stream);
}

}  // namespace qtk::cuda
