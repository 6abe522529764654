// A weight matrix in device memory as the CUDA backend multiplies it: in the
// precision's activation type (bf16 or f32), or, for a block-FP8 pack
// tensor, as its e4m3 bytes with the float32 block scales (weight-only FP8:
// half the bytes of bf16, dequantised inside the product).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "core/error.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/warp_matmul.h"
#include "pack/pack.h"
#include "runtime/backend/cuda/device_upload.h"

namespace qtk::cuda {

struct DeviceWeight {
  DeviceMemory data;   // Act [rows, cols], or e4m3 bytes [rows, cols]
  DeviceMemory scale;  // f32 [ceil(rows/block_rows), ceil(cols/block_cols)] (FP8 only)
  int64_t rows = 0, cols = 0;
  bool fp8 = false;
  int64_t block_rows = 0, block_cols = 0;

  template <class Act>
  WeightRef<Act> ref() const {
    WeightRef<Act> r;
    if (fp8) {
      r.fp8 = data.as<uint8_t>();
      r.scale = scale.as<float>();
      r.block_rows = block_rows;
      r.block_cols = block_cols;
    } else {
      r.dense = data.as<Act>();
    }
    return r;
  }
};

// Uploads pack tensor `name` (view `v`: [rows, cols], or stacked experts
// [E, rows, cols] taken as [E*rows, cols]; the pack's tensor or a
// tensor-parallel rank's slice of it). An F8_E4M3 tensor goes up as it is,
// with its block scales `q` (the binder's: the pack's own, or the rank's
// slice of them; nullptr for other dtypes).
template <class Act>
DeviceWeight upload_weight(const Pack& pack, const std::string& name, const TensorView& v,
                           const PackFp8Scales* q) {
  DeviceWeight w;
  w.cols = v.shape[v.ndim - 1];
  w.rows = v.numel() / std::max<int64_t>(w.cols, 1);
  if (v.dtype != DType::F8_E4M3) {
    w.data = upload_view<Act>(pack, name, v);
    return w;
  }
  if (q == nullptr)
    fail("{}: tensor '{}' is F8_E4M3 but has no block scales in the manifest", pack.path(), name);
  const int64_t srows = (w.rows + q->block_rows - 1) / q->block_rows;
  const int64_t scols = (w.cols + q->block_cols - 1) / q->block_cols;
  if (q->scale.numel() != srows * scols)
    fail("{}: tensor '{}' [{} x {}] has {} block scales; expected {} x {}", pack.path(), name,
         w.rows, w.cols, q->scale.numel(), srows, scols);
  w.fp8 = true;
  w.block_rows = q->block_rows;
  w.block_cols = q->block_cols;
  w.data = DeviceMemory(v.numel());
  upload_pack_bytes(pack, w.data.as(), v.data, static_cast<size_t>(v.numel()));
  w.scale = DeviceMemory(q->scale.numel() * sizeof(float));
  upload_pack_bytes(pack, w.scale.as(), q->scale.data, q->scale.numel() * sizeof(float));
  return w;
}

// y[M, n_out] = x[M, cols] w^T: cuBLASLt (Gemm, its fixed algorithms) for a
// dense weight, the fixed-order warp product for an FP8 one. Y = Act or f32.
template <class Act, class Y>
void project(Gemm& gemm, const Act* x, int64_t ldx, const DeviceWeight& w, Y* y, int64_t ldy,
             int64_t M, cudaStream_t stream) {
  if (w.fp8) {
    warp_matmul<Act, Y>(x, ldx, w.ref<Act>(), y, ldy, M, w.rows, w.cols, stream);
    return;
  }
  gemm.run(x, ldx, w.data.as(), w.cols, y, ldy, M, w.rows, w.cols, dtype_of<Act>(), dtype_of<Y>(),
           stream);
}

}  // namespace qtk::cuda
