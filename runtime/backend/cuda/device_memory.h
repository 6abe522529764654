// Owning device allocations of the CUDA backend.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <utility>

#include "kernels/cuda/cuda_check.h"

namespace qtk::cuda {

// One cudaMalloc'd block; freed on destruction. Never managed memory.
class DeviceMemory {
 public:
  DeviceMemory() = default;
  explicit DeviceMemory(size_t bytes) : bytes_(bytes) {
    if (bytes > 0) QTK_CUDA_CHECK(cudaMalloc(&p_, bytes));
  }
  ~DeviceMemory() {
    if (p_) cudaFree(p_);
  }
  DeviceMemory(DeviceMemory&& o) noexcept
      : p_(std::exchange(o.p_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  DeviceMemory& operator=(DeviceMemory&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  template <class T = void>
  T* as() const {
    return static_cast<T*>(p_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace qtk::cuda
