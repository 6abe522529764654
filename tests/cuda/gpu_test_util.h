// Helpers for the GPU tests: device buffers, random inputs, error measures.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <type_traits>
#include <vector>

#include "kernels/cuda/cuda_check.h"

namespace qtk::cuda::test {

using bf16 = __nv_bfloat16;

inline float to_float(float x) { return x; }
inline float to_float(bf16 x) { return __bfloat162float(x); }
template <class T>
T from_float(float x) {
  if constexpr (std::is_same_v<T, float>)
    return x;
  else
    return __float2bfloat16_rn(x);
}

// Device memory of n elements; poisoned with 0xFF bytes (NaN for f32 and bf16)
// so that an element the kernel forgets to write fails the comparison.
template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t n) : n_(n) {
    QTK_CUDA_CHECK(cudaMalloc(&p_, std::max<size_t>(n, 1) * sizeof(T)));
    QTK_CUDA_CHECK(cudaMemset(p_, 0xFF, std::max<size_t>(n, 1) * sizeof(T)));
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) { upload(host); }
  ~DeviceBuffer() {
    if (p_) cudaFree(p_);
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }
  void upload(const std::vector<T>& host) {
    QTK_CUDA_CHECK(cudaMemcpy(p_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    QTK_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<T> h(n_);
    QTK_CUDA_CHECK(cudaMemcpy(h.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
  T* get() { return p_; }
  const T* get() const { return p_; }
  size_t size() const { return n_; }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

inline std::vector<float> random_floats(size_t n, float lo, float hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Rounds through T (so that the reference sees exactly what the kernel reads).
template <class T>
std::vector<T> to_device_type(const std::vector<float>& v) {
  std::vector<T> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = from_float<T>(v[i]);
  return r;
}
template <class T>
std::vector<double> to_double(const std::vector<T>& v) {
  std::vector<double> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = to_float(v[i]);
  return r;
}

// ||out - ref|| / ||ref||; infinity when out holds a NaN (an unwritten element).
template <class T>
double rel_error(const std::vector<T>& out, const std::vector<double>& ref) {
  EXPECT_EQ(out.size(), ref.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size() && i < out.size(); ++i) {
    const double o = to_float(out[i]);
    if (std::isnan(o)) return INFINITY;
    num += (o - ref[i]) * (o - ref[i]);
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

template <class T>
bool bitwise_equal(const T* a, const T* b, size_t n) {
  return std::memcmp(a, b, n * sizeof(T)) == 0;
}

// Tolerances by activation type.
// note: f32: float32 arithmetic against a float64 reference lands far below
// 1e-5 for these sizes. bf16: inputs are rounded to bf16 before the reference
// sees them, so the error is the bf16 rounding of the outputs (relative 2^-9
// per element) plus rounding of bf16 intermediates stored between stages:
// 1e-2 covers it with margin, and a wrong formula is off by far more.
template <class T>
constexpr double tolerance() {
  return std::is_same_v<T, float> ? 1e-5 : 1e-2;
}

}  // namespace qtk::cuda::test
