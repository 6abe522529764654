// The one non-owning tensor view passed between loaders, the pack, the
// runtime and tests. Memory is owned elsewhere (a file mapping, an arena, a
// device buffer); a view never frees anything.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>

#include "core/dtype.h"

namespace qtk {

// note: safetensors allows any rank; no Qwen tensor has more than 3 dims, and
// loaders reject rank > kMaxDims with a clear message instead of truncating.
inline constexpr int kMaxDims = 8;

struct TensorView {
  const void* data = nullptr;
  DType dtype = DType::F32;
  int ndim = 0;
  int64_t shape[kMaxDims] = {};
  int64_t stride[kMaxDims] = {};  // in elements; row-major contiguous by default

  TensorView() = default;
  TensorView(const void* d, DType t, std::span<const int64_t> dims) : data(d), dtype(t) {
    set_shape(dims);
  }
  TensorView(const void* d, DType t, std::initializer_list<int64_t> dims)
      : TensorView(d, t, std::span<const int64_t>(dims.begin(), dims.size())) {}

  void set_shape(std::span<const int64_t> dims) {
    ndim = static_cast<int>(dims.size());
    int64_t s = 1;
    for (int i = ndim - 1; i >= 0; --i) {
      shape[i] = dims[i];
      stride[i] = s;
      s *= dims[i];
    }
  }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i) n *= shape[i];
    return n;
  }
  int64_t nbytes() const { return numel() * dtype_size(dtype); }
  int64_t dim(int i) const { return shape[i < 0 ? ndim + i : i]; }
  template <typename T>
  const T* as() const {
    return static_cast<const T*>(data);
  }
  // "[4, 64]"
  std::string shape_string() const;
};

}  // namespace qtk
