// The device collective of tensor parallelism: N GPUs of one node, one rank
// per GPU, all ranks in this process, each rank driven by its own host thread
// (with its device current) and its own stream.
//
// NCCL is loaded at run time (dlopen), so nothing is needed to build, and a
// build without NCCL runs everything but tensor parallelism. Search order:
// the file named by QTK_NCCL_LIBRARY, then "libnccl.so.2" on the library
// search path, then the copy in a Python environment's NVIDIA wheel
// (site-packages/nvidia/nccl/lib/libnccl.so.2 under the usual prefixes,
// PyTorch's dependency). Not found: qtk::Error "tensor parallel needs NCCL
// (libnccl.so.2): not found in ...; set QTK_NCCL_LIBRARY to its path".
//
// Usage (main thread, then one thread per rank):
//   NcclGroup group({0, 1});                     // ncclCommInitAll
//   // rank r's thread: cudaSetDevice(group.device(r)), its own stream s
//   DeviceCollective& c = group.rank(r);
//   c.reserve(max_tokens * hidden * sizeof(Act));  // once, outside capture
//   c.all_reduce_sum(d, n, s);                   // d: this rank's partial -> the sum
//
// note: the sum is an all-gather of the partials followed by sum_ranks
// (kernels/cuda/rank_sum.h), not ncclAllReduce, whose order of additions is
// not specified: every rank gets the bits of
// ((d_0 + d_1) + d_2) + ... + d_{N-1} in float32, rounded once, on every run.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/backend/cuda/device_memory.h"

// NCCL's opaque communicator (ncclComm_t is a pointer to it); declared here
// so that this header needs no NCCL header.
struct ncclComm;

namespace qtk::cuda {

// Loads NCCL if not loaded yet (throws qtk::Error when it cannot be found)
// and returns the path of the file loaded / its version ("2.27.3") for the
// run header.
const std::string& nccl_library_path();
std::string nccl_version();

class NcclGroup;

// One rank's side of the collective. Used only from that rank's thread, with
// the rank's device current (each call checks that it is).
class DeviceCollective {
 public:
  ~DeviceCollective();
  DeviceCollective(const DeviceCollective&) = delete;
  DeviceCollective& operator=(const DeviceCollective&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  int device() const { return device_; }

  // Makes the gather workspace (size() rows of max_bytes_per_rank bytes) on
  // this rank's device. Call before the first all_reduce_sum and outside any
  // CUDA-graph capture; growing it frees the old workspace, so graphs
  // captured before must be dropped. A smaller request keeps the workspace.
  void reserve(int64_t max_bytes_per_rank);
  int64_t reserved_bytes_per_rank() const { return reserved_; }

  // d [n] (device, this rank's partial) := the sum over ranks 0..size()-1 of
  // every rank's d, in rank order (see the top of the file); the same bits
  // on every rank. Act = float or __nv_bfloat16. Collective: every rank calls
  // it with the same n, in the same order relative to its other collectives.
  // Enqueued on s (ncclAllGather into the workspace, then sum_ranks back into
  // d); no allocation and no synchronisation, so it may be captured into a
  // CUDA graph (every rank captures it; capture with
  // cudaStreamCaptureModeThreadLocal, since each rank's thread captures its
  // own stream). n * sizeof(Act) must not exceed the reserved bytes.
  // note: NCCL may connect the ranks at their first collective; run one
  // eager all_reduce_sum on every rank before the first capture (the decode
  // graphs run every step eagerly once before capturing it).
  template <class Act>
  void all_reduce_sum(Act* d, int64_t n, cudaStream_t s);

 private:
  friend class NcclGroup;
  DeviceCollective(ncclComm* comm, int rank, int size, int device)
      : comm_(comm), rank_(rank), size_(size), device_(device) {}
  void check_device(const char* what) const;

  ncclComm* comm_;
  int rank_, size_, device_;
  DeviceMemory workspace_;  // [size_][reserved_ bytes]
  int64_t reserved_ = 0;
};

// One NCCL communicator per device (ncclCommInitAll), rank r on devices[r].
// Create it and destroy it from one thread, with no rank's work in flight.
class NcclGroup {
 public:
  // devices: distinct CUDA device ordinals, at least one. Loads NCCL.
  explicit NcclGroup(std::vector<int> devices);
  ~NcclGroup();
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;

  int size() const { return static_cast<int>(devices_.size()); }
  int device(int rank) const { return devices_.at(rank); }
  DeviceCollective& rank(int r) { return *ranks_.at(r); }

 private:
  std::vector<int> devices_;
  std::vector<std::unique_ptr<DeviceCollective>> ranks_;
};

}  // namespace qtk::cuda
