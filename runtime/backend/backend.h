// The backends a run can choose (`generate --device`), behind one
// interface: generate opens a BackendSession for the pack and the flags and
// knows nothing else of the device. The CPU backend (runtime/backend/cpu) is
// always built; the CUDA backend (runtime/backend/cuda) only with QTK_CUDA
// (without it, choosing it fails with a message naming the build).
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "runtime/model.h"

namespace qtk {

class Pack;

// What the flags chose (resolved: device and precision are never empty).
struct BackendChoice {
  std::string device;      // cpu | cuda
  std::string precision;   // f32 | bf16
  std::string plan_cache;  // --plan-cache (cuda: the GEMM plan cache; "" default, "off")
  int threads = 0;         // CPU threads (cpu: the thread pool)
  // --tensor-parallel N: the model split over N ranks (runtime/parallel):
  // cuda: one rank per GPU; cpu: N ranks emulated in one process, each with
  // threads / N threads (a check of the split arithmetic, not a speed-up).
  int tensor_parallel = 1;
};

// A loaded model on its device, with the device's one-time work around it.
class BackendSession {
 public:
  virtual ~BackendSession() = default;
  virtual Model& model() = 0;
  // The device's name for the run header ("cpu", "NVIDIA H100 ... (sm_90)").
  virtual std::string device_name() const = 0;
  // generate --tune-only: what the device can prepare for later runs (cuda:
  // tune every GEMM range and write the plan cache); nothing on the CPU.
  virtual void tune_only() {}
  // At the end of a run: the device's entries of the run header (cuda: the
  // plan cache written, "gemm_plan" and "startup"); nothing on the CPU.
  virtual void finish(nlohmann::json& /*header*/) {}
};

// Throws qtk::Error when `device` ("cuda") cannot run here: no CUDA backend
// in this build, or no CUDA device. Called before any file is opened.
void check_device(const std::string& device);

// Loads the pack's model on the chosen device. Throws qtk::Error for an
// architecture or pack the device cannot run.
std::unique_ptr<BackendSession> open_backend(const Pack& pack, const BackendChoice& choice);

// The CUDA backend's side of the two (runtime/backend/cuda/cuda_session.cpp,
// or runtime/backend/no_cuda.cpp in a build without CUDA).
void check_cuda_device();
// The CUDA devices this process can use (after CUDA_VISIBLE_DEVICES), for
// `generate --devices all`. Throws qtk::Error as check_cuda_device does when
// there is none or the build has no CUDA backend.
int cuda_device_count();
std::unique_ptr<BackendSession> open_cuda_backend(const Pack& pack, const BackendChoice& choice);

}  // namespace qtk
