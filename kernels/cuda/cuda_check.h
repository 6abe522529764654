// Error checking for CUDA runtime and cuBLAS calls.
//
// QTK_CUDA_CHECK(call) throws qtk::Error naming the call, the file, the line
// and the driver's message; QTK_CUDA_CHECK_LAUNCH() does the same for the last
// kernel launch. Library code throws; programs decide what to print.
// note: this header stays free of fmt so that nvcc-compiled .cu files can use
// it (nvcc's front end rejects fmt's consteval format checks); the throwing
// functions live in cuda_check.cpp.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <string>

namespace qtk::cuda {

[[noreturn]] void fail_cuda(cudaError_t e, const char* call, const char* file, int line);
[[noreturn]] void fail_cublas(cublasStatus_t s, const char* call, const char* file, int line);
// Throws qtk::Error with the message (for .cu files, which cannot use fmt).
[[noreturn]] void fail_message(const std::string& message);

}  // namespace qtk::cuda

#define QTK_CUDA_CHECK(call)                                            \
  do {                                                                  \
    const cudaError_t qtk_cuda_err_ = (call);                           \
    if (qtk_cuda_err_ != cudaSuccess)                                   \
      ::qtk::cuda::fail_cuda(qtk_cuda_err_, #call, __FILE__, __LINE__); \
  } while (0)

// Checks the last launch (configuration errors) without synchronizing.
#define QTK_CUDA_CHECK_LAUNCH() QTK_CUDA_CHECK(cudaGetLastError())

#define QTK_CUBLAS_CHECK(call)                                             \
  do {                                                                     \
    const cublasStatus_t qtk_cublas_st_ = (call);                          \
    if (qtk_cublas_st_ != CUBLAS_STATUS_SUCCESS)                           \
      ::qtk::cuda::fail_cublas(qtk_cublas_st_, #call, __FILE__, __LINE__); \
  } while (0)
