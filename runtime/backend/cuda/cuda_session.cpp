// The CUDA side of runtime/backend/backend.h: the model on the GPU
// (load_cuda_model) and its GEMM plan cache and start-up timings
// (cuda_startup.h).
#include <optional>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "runtime/backend/backend.h"
#include "runtime/backend/cuda/cuda_model.h"
#include "runtime/backend/cuda/cuda_startup.h"

namespace qtk {

namespace {

class CudaSession final : public BackendSession {
 public:
  CudaSession(const Pack& pack, const BackendChoice& c)
      : model_(load_cuda_model(pack, parse_cuda_precision(c.precision))),
        device_name_(cuda_device_name()) {
    plans_.emplace(*model_, pack, c.precision, c.plan_cache);
  }
  Model& model() override { return *model_; }
  std::string device_name() const override { return device_name_; }
  void tune_only() override { plans_->tune_only(); }
  // The plan cache written; "gemm_plan" and "startup".
  void finish(nlohmann::json& header) override { plans_->finish(header); }

 private:
  // note: the plan cache uses the model: destroyed first (reverse order).
  std::unique_ptr<CudaModel> model_;
  std::string device_name_;
  std::optional<CudaStartup> plans_;
};

}  // namespace

void check_cuda_device() {
  if (!cuda_device_available()) {
    fail(
        "--device cuda: no CUDA device is available (no NVIDIA GPU, or no driver, on this "
        "machine)");
  }
}

int cuda_device_count() {
  check_cuda_device();
  return cuda_visible_device_count();
}

std::unique_ptr<BackendSession> open_cuda_backend(const Pack& pack, const BackendChoice& choice) {
  return std::make_unique<CudaSession>(pack, choice);
}

}  // namespace qtk
