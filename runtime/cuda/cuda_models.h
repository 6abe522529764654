// Constructors of the CUDA models (internal to runtime/cuda; callers use
// load_cuda_model).
#pragma once

#include <memory>

#include "runtime/cuda/cuda_model.h"

namespace qtk {

std::unique_ptr<CudaModel> make_cuda_qwen3(const Pack& pack, CudaPrecision precision);
std::unique_ptr<CudaModel> make_cuda_qwen3_5(const Pack& pack, CudaPrecision precision);

}  // namespace qtk
