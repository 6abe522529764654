// GPU test entry point. Without a CUDA device the binary prints one SKIPPED
// line and exits 77, which ctest reports as skipped (SKIP_RETURN_CODE).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdio>

int main(int argc, char** argv) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    std::printf("SKIPPED: no CUDA device (%s)\n",
                e != cudaSuccess ? cudaGetErrorString(e) : "device count 0");
    return 77;
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  std::printf("device: %s, %d SMs, compute %d.%d\n", prop.name, prop.multiProcessorCount,
              prop.major, prop.minor);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
