// The CUDA side of runtime/backend/backend.h in a build without the CUDA
// backend (QTK_CUDA off, or no nvcc): choosing it fails with a message.
#include "core/error.h"
#include "runtime/backend/backend.h"

namespace qtk {

void check_cuda_device() {
  fail(
      "--device cuda: this build has no CUDA backend (expected a build configured with "
      "-DQTK_CUDA=ON where nvcc exists; this one runs --device cpu only)");
}

int cuda_device_count() {
  check_cuda_device();
  return 0;
}

std::unique_ptr<BackendSession> open_cuda_backend(const Pack&, const BackendChoice&) {
  check_cuda_device();
  return nullptr;
}

}  // namespace qtk
