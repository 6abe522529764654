// Kernel launches with programmatic dependent launch (PDL, sm_90).
//
// note: a batch-1 decode step is a chain of ~300 kernels that each run a few
// microseconds; without PDL each one starts only after its predecessor has
// finished and its launch has been processed. With PDL the next kernel of
// the stream is launched while the current one runs (it is allowed as soon
// as every block of the current kernel has passed dev::pdl_begin), its
// blocks become resident, and they wait at their own dev::pdl_begin until
// the current kernel has completed and its memory is visible. Work that
// reads nothing a predecessor writes (the GEMV's weight prefetch) may run
// before that wait. Every kernel launched through launch_kernel() calls
// dev::pdl_begin() before its first global read or write of activations and
// before it can exit, so completion stays transitive along the chain; the
// arithmetic and its order are untouched (the outputs are the same bits with
// PDL on or off). A launch that fails throws (QTK_CUDA_CHECK on
// cudaLaunchKernelEx), so callers need no check of their own. Kernels
// launched otherwise (cuBLASLt, the chunked GDN) are ordinary full
// dependencies. QTK_PDL=0 turns it off.
#pragma once

#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>
#include <utility>

#include "kernels/cuda/cuda_check.h"

namespace qtk::cuda {

// True when launches carry the PDL attribute: QTK_PDL is not "0" and the
// current device is compute capability 9.0, the one architecture this
// library has machine code for (sm_90a). note: on any other GPU the
// compute_80 PTX runs, where dev::pdl_begin is compiled out, so the
// attribute must not be set there.
bool pdl_enabled();

template <class... Params, class... Args>
void launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                   cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = pdl_enabled() ? 1 : 0;
  QTK_CUDA_CHECK(
      cudaLaunchKernelEx(&cfg, kernel, static_cast<Params>(std::forward<Args>(args))...));
}

}  // namespace qtk::cuda
