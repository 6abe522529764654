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

}  // namespace qtk::cuda
