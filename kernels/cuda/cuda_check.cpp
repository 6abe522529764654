#include "kernels/cuda/cuda_check.h"

#include "core/error.h"

namespace qtk::cuda {

void fail_cuda(cudaError_t e, const char* call, const char* file, int line) {
  fail("CUDA call {} failed at {}:{}: {} ({})", call, file, line, cudaGetErrorString(e),
       cudaGetErrorName(e));
}

void fail_cublas(cublasStatus_t s, const char* call, const char* file, int line) {
  fail("cuBLAS call {} failed at {}:{}: status {}", call, file, line, static_cast<int>(s));
}

void fail_message(const std::string& message) { throw Error(message); }

}  // namespace qtk::cuda
