#include "kernels/cuda/launch.cuh"

#include "core/tuning.h"

namespace qtk::cuda {

bool pdl_enabled() {
  static const bool on = [] {
    if (!tuning().pdl) return false;
    int dev = 0, major = 0, minor = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
      cudaGetLastError();  // no device yet: launches will report it
      return false;
    }
    return major == 9 && minor == 0;
  }();
  return on;
}

namespace {

// A device attribute of the current device, read once per device and thread.
template <cudaDeviceAttr kAttr>
int device_attribute() {
  thread_local int device = -1, value = 0;
  int d = 0;
  QTK_CUDA_CHECK(cudaGetDevice(&d));
  if (d != device) {
    QTK_CUDA_CHECK(cudaDeviceGetAttribute(&value, kAttr, d));
    device = d;
  }
  return value;
}

}  // namespace

int max_dynamic_smem() { return device_attribute<cudaDevAttrMaxSharedMemoryPerBlockOptin>(); }

int sm_count() { return device_attribute<cudaDevAttrMultiProcessorCount>(); }

bool wgmma_device() {
  return device_attribute<cudaDevAttrComputeCapabilityMajor>() == 9 &&
         device_attribute<cudaDevAttrComputeCapabilityMinor>() == 0;
}

}  // namespace qtk::cuda
