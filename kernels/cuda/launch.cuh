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
#include <vector>

#include "kernels/cuda/cuda_check.h"

namespace qtk::cuda {

// True when launches carry the PDL attribute: QTK_PDL is not "0" and the
// current device is compute capability 9.0, the one architecture this
// library has machine code for (sm_90a). note: on any other GPU the
// compute_80 PTX runs, where dev::pdl_begin is compiled out, so the
// attribute must not be set there.
bool pdl_enabled();

// The most dynamic shared memory a block may opt in to on the current
// device (cudaDevAttrMaxSharedMemoryPerBlockOptin: 227 KB on sm_90, less on
// the GPUs that run the compute_80 PTX).
int max_dynamic_smem();

// The current device's multiprocessors.
int sm_count();

// True when the current device is compute capability 9.0, whose sm_90a
// machine code has the warpgroup (wgmma) kernels; the compute_80 PTX that
// other GPUs run compiles them empty.
bool wgmma_device();

// Lets `kernel` use up to `bytes` of dynamic shared memory on the current
// device (cudaFuncAttributeMaxDynamicSharedMemorySize). note: the attribute
// belongs to the device it was set on, so it is set once per device, not
// once per process: a process that drives several GPUs (tensor parallel, one
// thread per GPU) needs it on each. The record is per thread (each rank's
// thread keeps its device), so no lock is taken on the launch path.
template <class Kernel>
void set_max_dynamic_smem(Kernel kernel, int bytes) {
  struct Done {
    const void* kernel;
    int device, bytes;
  };
  thread_local std::vector<Done> done;
  int device = 0;
  QTK_CUDA_CHECK(cudaGetDevice(&device));
  const void* k = reinterpret_cast<const void*>(kernel);
  for (const Done& d : done)
    if (d.kernel == k && d.device == device && d.bytes >= bytes) return;
  QTK_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  done.push_back({k, device, bytes});
}

// launch_kernel with the grid in clusters of `cluster` blocks (sm_90; the
// grid a multiple of it in each dimension): the blocks of a cluster run at
// once on one GPC and may read each other's shared memory (dev::cluster_load).
template <class... Params, class... Args>
void launch_kernel_clusters(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                            dim3 cluster, cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute attr[2];
  unsigned n = 0;
  if (cluster.x * cluster.y * cluster.z > 1) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = cluster.x;
    attr[n].val.clusterDim.y = cluster.y;
    attr[n].val.clusterDim.z = cluster.z;
    ++n;
  }
  if (pdl_enabled()) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = n;
  QTK_CUDA_CHECK(
      cudaLaunchKernelEx(&cfg, kernel, static_cast<Params>(std::forward<Args>(args))...));
}

template <class... Params, class... Args>
void launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                   cudaStream_t stream, Args&&... args) {
  launch_kernel_clusters(kernel, grid, block, smem, dim3(1, 1, 1), stream,
                         std::forward<Args>(args)...);
}

}  // namespace qtk::cuda
