// The steps in front of a projection that the CUDA backend's blocks fuse
// into the projection's launch where that keeps every bit: "add, then norm" between
// two sublayers, and the MLP's SwiGLU.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>
#include <utility>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/gemm.h"
#include "runtime/backend/cuda/device_upload.h"

namespace qtk::cuda {

// The residual stream of a step: two buffers, x the current one.
template <class T>
struct ResidualStream {
  T* x;      // T [tokens, hidden]: the residual
  T* spare;  // T [tokens, hidden]: where a fused step writes the next one
};

// The fused add + RMSNorm's input for a step of the residual stream: the
// rows of x plus delta, the new residual into rs.spare (every row hidden wide).
inline AddRmsNormInput add_rmsnorm_input(const ResidualStream<bf16>& rs, const bf16* delta,
                                         const float* norm_w, float eps, int64_t hidden) {
  return AddRmsNormInput{.residual = rs.x,
                         .ldr = hidden,
                         .delta = delta,
                         .ldd = hidden,
                         .weight = norm_w,
                         .eps = eps,
                         .residual_out = rs.spare,
                         .ldo = hidden};
}

// x += delta (rounded to T); h = rmsnorm(x) * norm_w; y = h w^T (n outputs
// of hidden inputs, w in the HF layout with row stride hidden). Exactly
// add_rmsnorm followed by gemm.run.
// note: at M <= QTK_FUSED_MAX_M (default 1: decode at batch 1; see
// gemm.cpp) in bf16, where the own skinny kernel serves the product
// bit-equal to the plan algorithm, the three run as one launch
// (Gemm::run_add_rmsnorm): the add and the norm in front of the product,
// with add_rmsnorm's arithmetic and order, so the bits are the same either
// way and a sequence's tokens do not depend on the path. That launch leaves
// h unwritten and the new residual in rs.spare (its blocks still read the
// old one), and the two buffers swap. delta may be h.
template <class T>
void add_norm_gemm(Gemm& gemm, ResidualStream<T>& rs, const T* delta, const float* norm_w,
                   float eps, T* h, const void* w, void* y, int64_t ldy, int64_t rows, int64_t n,
                   int64_t hidden, cudaStream_t stream) {
  if constexpr (std::is_same_v<T, bf16>) {
    const AddRmsNormInput an = add_rmsnorm_input(rs, delta, norm_w, eps, hidden);
    if (gemm.run_add_rmsnorm(an, w, hidden, y, ldy, rows, n, hidden, DType::BF16, stream)) {
      std::swap(rs.x, rs.spare);
      return;
    }
  }
  add_rmsnorm<T>(rs.x, hidden, delta, hidden, norm_w, h, hidden, rows, hidden, eps, stream);
  gemm.run(h, hidden, w, hidden, y, ldy, rows, n, hidden, dtype_of<T>(), dtype_of<T>(), stream);
}

// The MLP block after a sublayer: x += delta (rounded to T); h =
// rmsnorm(x) * norm_w; act = swiglu(h gate_up^T) (w_gate_up [2 inter,
// hidden]: gate rows, then up rows); y = act down^T (hidden outputs, row
// stride hidden). Exactly add_rmsnorm, gemm.run into gate_up, swiglu and
// gemm.run. delta and y may be h.
// note: in bf16 at M <= 16, where the own skinny kernel serves the gate_up
// product bit-equal to its plan algorithm, the SwiGLU is that launch's
// epilogue (Gemm::run_swiglu_out: no gate_up buffer, no swiglu launch), and
// at M <= QTK_FUSED_MAX_M the add + norm its prologue too; down_proj then
// reads act like any product. Same bits on every path (tested).
// note: this is faster than the SwiGLU as the prologue of down_proj's
// launch (every block recomputing it): same call on the H100,
// ms per step new / old, Qwen3-0.6B batch 1 1.08 / 1.06-1.07, 2 1.17-1.18 /
// 1.24-1.28, 8 1.26 / 1.34, 16 1.41 / 1.47; Qwen3.5-0.8B batch 1 1.16-1.17 /
// 1.19-1.20, 2 1.31-1.34 / 1.37-1.40, 8 1.49 / 1.59, 16 1.74 / 1.85.
template <class T>
void add_norm_mlp(Gemm& gemm, ResidualStream<T>& rs, const T* delta, const float* norm_w, float eps,
                  T* h, const void* w_gate_up, T* gate_up, T* act, const void* w_down, T* y,
                  int64_t rows, int64_t inter, int64_t hidden, cudaStream_t stream) {
  const DType dt = dtype_of<T>();
  bool fused = false;  // add + norm + gate_up + SwiGLU in one launch
  if constexpr (std::is_same_v<T, bf16>) {
    const AddRmsNormInput an = add_rmsnorm_input(rs, delta, norm_w, eps, hidden);
    fused = gemm.run_add_rmsnorm_swiglu_out(an, w_gate_up, hidden, act, inter, rows, inter, hidden,
                                            2 * inter, stream);
    if (fused) std::swap(rs.x, rs.spare);
  }
  if (!fused) {
    add_rmsnorm<T>(rs.x, hidden, delta, hidden, norm_w, h, hidden, rows, hidden, eps, stream);
    bool epilogue = false;  // the SwiGLU as the gate_up launch's epilogue
    if constexpr (std::is_same_v<T, bf16>)
      epilogue = gemm.run_swiglu_out(h, hidden, w_gate_up, hidden, act, inter, rows, inter, hidden,
                                     2 * inter, stream);
    if (!epilogue) {
      gemm.run(h, hidden, w_gate_up, hidden, gate_up, 2 * inter, rows, 2 * inter, hidden, dt, dt,
               stream);
      swiglu<T>(gate_up, 2 * inter, act, inter, rows, inter, stream);
    }
  }
  // note: behind the fused launch (batch 1), down_proj runs on the own
  // kernel where it is bit-equal (Gemm::run_own); by its timing alone
  // cuBLASLt's was faster, but the step was not.
  if (fused && gemm.run_own(act, inter, w_down, inter, y, hidden, rows, hidden, inter, dt, stream))
    return;
  gemm.run(act, inter, w_down, inter, y, hidden, rows, hidden, inter, dt, dt, stream);
}

}  // namespace qtk::cuda
