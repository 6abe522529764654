// The CUDA backend of the runtime: a Model (runtime/model.h) whose weights,
// K/V cache and scratch live in device memory. The scheduler, the step
// description and the outputs are the CPU runtime's; only the kernels and the
// memory change.
//
// One class runs every architecture of runtime/models over the blocks
// (cuda_backend.cpp). generate --device cuda opens it through
// runtime/backend/backend.h (cuda_session.cpp: load_cuda_model, the plan
// cache); the scheduler uses forward_greedy.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "runtime/model.h"
#include "runtime/parallel/tensor_parallel.h"

namespace qtk {

class Pack;
namespace cuda {
class Gemm;
class DeviceCollective;
}  // namespace cuda

// Seconds of load_cuda_model's one-time work, for the run header, and the
// process's resident memory after each part (process_memory.h; -1: unknown).
struct CudaLoadTimes {
  double init_seconds = 0;    // creating the CUDA context (the first runtime call that needs it)
  double upload_seconds = 0;  // the model's constructor: weights to the device, handles, streams
  int64_t rss_after_init_bytes = -1, rss_after_upload_bytes = -1;
  int64_t anon_after_upload_bytes = -1, file_after_upload_bytes = -1;
};

enum class CudaPrecision {
  kF32,   // f32 weights (converted once at upload), activations and K/V cache
  kBF16,  // bf16 weights, activations and K/V cache; f32 accumulation, norms, GDN state
};

// A model on the GPU. Besides Model::forward (logits to the host), it picks
// the greedy tokens on the device: forward_greedy (Model's hook, always
// implemented here, returns true) writes, per sequence with want_logits, the
// argmax id (ties to the lowest id) and the top-1 margin (top1 - top2 logit),
// the same values the scheduler computes from the logits, without copying
// [seqs, vocab] floats to the host.
class CudaModel : public Model {
 public:
  // K/V cache and GDN state live in device memory (the host ones are only
  // the scheduler's block and slot bookkeeping).
  bool uses_host_cache() const override { return false; }

  // The GEMM wrapper whose tuned choices the plan cache keeps
  // (runtime/backend/cuda/cuda_startup.h); null for a model without one.
  virtual cuda::Gemm* gemm() { return nullptr; }
  // Decode graphs captured and instantiated so far, and the seconds it took.
  virtual int64_t graphs_captured() const { return 0; }
  virtual double graph_capture_seconds() const { return 0; }

  CudaLoadTimes load_times;  // set by load_cuda_model
};

// "f32" or "bf16"; throws qtk::Error naming the flag for anything else.
CudaPrecision parse_cuda_precision(const std::string& text);

// True when a CUDA device can be used (driver and device present).
bool cuda_device_available();

// How many CUDA devices this process sees (0 without a driver or device).
int cuda_visible_device_count();

// The device's name and compute capability, e.g. "NVIDIA H100 80GB HBM3
// (sm_90)", for run headers (results are bit-reproducible per GPU type).
std::string cuda_device_name();

// Uploads the pack's weights once (converted to the precision's dtype) to
// the current device and returns the model. Throws qtk::Error for an
// architecture the CUDA backend does not run yet, or without a device.
// tp, comm: rank tp.rank of a tensor-parallel model (runtime/parallel): the
// rank's slices only, and comm (runtime/backend/cuda/nccl.h) adds the ranks'
// partial sums after every block.
std::unique_ptr<CudaModel> load_cuda_model(const Pack& pack, CudaPrecision precision,
                                           TpRank tp = {}, cuda::DeviceCollective* comm = nullptr);

}  // namespace qtk
