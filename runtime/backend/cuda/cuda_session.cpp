// The CUDA side of runtime/backend/backend.h: the model on the GPU
// (load_cuda_model) and its GEMM plan cache and start-up timings
// (cuda_startup.h).
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"
#include "pack/pack.h"
#include "runtime/backend/backend.h"
#include "runtime/backend/cuda/cuda_model.h"
#include "runtime/backend/cuda/cuda_startup.h"
#include "runtime/backend/cuda/nccl.h"
#include "runtime/parallel/rank_group.h"
#include "runtime/parallel/tp_model.h"

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

// A model split over GPUs 0..N-1 (runtime/parallel/tensor_parallel.h): one
// rank per GPU, each built and run in a thread of its own with its device
// current, the ranks' partial sums added over NCCL (nccl.h).
// note: the GEMM plan cache. The key holds the model's shapes, here the
// rank's, so the N ranks of a TP-N run share one file (apart from the
// one-GPU model's): every rank preloads it, rank 0 alone writes it back.
// Every candidate algorithm a rank may pick gives the same bits (cuda::Gemm
// verifies them), so the ranks' choices need not agree.
class CudaTensorParallelSession final : public BackendSession {
 public:
  CudaTensorParallelSession(const Pack& pack, const BackendChoice& c)
      : nccl_(devices(c.tensor_parallel)), group_(c.tensor_parallel) {
    const CudaPrecision precision = parse_cuda_precision(c.precision);
    model_ = std::make_unique<TensorParallelModel>(group_, pack.config(), [&](int r) {
      QTK_CUDA_CHECK(cudaSetDevice(nccl_.device(r)));
      return std::unique_ptr<Model>(
          load_cuda_model(pack, precision, TpRank{r, c.tensor_parallel}, &nccl_.rank(r)));
    });
    plans_.resize(c.tensor_parallel);
    model_->run_on_ranks([&](int r) {
      if (r == 0) device_name_ = cuda_device_name();
      auto* rank = dynamic_cast<CudaModel*>(&model_->rank(r));
      if (rank == nullptr) fail("internal error: a tensor-parallel CUDA rank is not a CudaModel");
      plans_[r].emplace(*rank, pack, c.precision, c.plan_cache);
    });
  }
  Model& model() override { return *model_; }
  std::string device_name() const override {
    return fmt::format("{} x {} (tensor parallel over NCCL {})", group_.size(), device_name_,
                       cuda::nccl_version());
  }
  // note: --tune-only steps the synthetic request through the whole split
  // model (its ranks step together: their all-reduces), then each rank
  // tunes the ranges it has not decided on its own GPU, and rank 0 writes
  // the file the ranks share (their shapes are the same).
  void tune_only() override {
    if (plans_[0]->tunes()) {
      CudaStartup::run_tuning_request(*model_);
      model_->run_on_ranks([&](int r) { plans_[r]->tune_remaining(); });
    }
    model_->run_on_ranks([&](int r) {
      if (r == 0) plans_[0]->save_and_report();
    });
  }
  // Rank 0's plan cache written; "gemm_plan", "startup" and the NCCL used.
  void finish(nlohmann::json& header) override {
    model_->run_on_ranks([&](int r) {
      if (r == 0) plans_[0]->finish(header);
    });
    header["nccl"] = {{"library", cuda::nccl_library_path()}, {"version", cuda::nccl_version()}};
  }

 private:
  // GPUs 0..n-1 of this process (CUDA_VISIBLE_DEVICES picks which).
  static std::vector<int> devices(int n) {
    int have = 0;
    if (cudaGetDeviceCount(&have) != cudaSuccess) have = 0;
    if (have < n) fail("--tensor-parallel {}: expected {} CUDA devices, found {}", n, n, have);
    std::vector<int> d(n);
    for (int i = 0; i < n; ++i) d[i] = i;
    return d;
  }

  // note: destroyed in reverse order: the ranks (in their threads) before
  // the communicators they use.
  cuda::NcclGroup nccl_;
  RankGroup group_;
  std::unique_ptr<TensorParallelModel> model_;
  std::vector<std::optional<CudaStartup>> plans_;  // per rank; uses the rank models
  std::string device_name_;
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
  if (choice.tensor_parallel > 1) return std::make_unique<CudaTensorParallelSession>(pack, choice);
  return std::make_unique<CudaSession>(pack, choice);
}

}  // namespace qtk
