#include "runtime/backend/backend.h"

#include <algorithm>
#include <optional>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "kernels/thread_pool.h"
#include "pack/pack.h"
#include "runtime/backend/cpu/cpu_model.h"
#include "runtime/parallel/rank_group.h"
#include "runtime/parallel/tp_model.h"

namespace qtk {

namespace {

// The CPU backend: the model (runtime/backend/cpu) on a thread pool of its own.
// note: members are destroyed in reverse order: the model before the pool
// it points to.
class CpuSession final : public BackendSession {
 public:
  CpuSession(const Pack& pack, int threads) : pool_(threads), model_(load_model(pack, &pool_)) {}
  Model& model() override { return *model_; }
  std::string device_name() const override { return "cpu"; }

 private:
  ThreadPool pool_;
  std::unique_ptr<Model> model_;
};

// N emulated tensor-parallel ranks on the CPU: rank r has a thread pool of
// threads / N threads (at least 1) and its own slices, caches and thread.
class CpuTensorParallelSession final : public BackendSession {
 public:
  CpuTensorParallelSession(const Pack& pack, int threads, int ranks) : group_(ranks) {
    // note: the ranks bind their weights concurrently; the pack's one-time
    // move onto huge pages (Pack::load_for_cpu, which each backend's load
    // otherwise starts) must happen before, in this thread, not in a race.
    pack.load_for_cpu();
    for (int r = 0; r < ranks; ++r)
      pools_.push_back(std::make_unique<ThreadPool>(std::max(1, threads / ranks)));
    model_ = std::make_unique<TensorParallelModel>(group_, pack.config(), [&](int r) {
      return make_cpu_model(pack, pools_[r].get(), TpRank{r, ranks}, &group_);
    });
  }
  Model& model() override { return *model_; }
  std::string device_name() const override {
    return fmt::format("cpu (tensor parallel: {} emulated ranks)", group_.size());
  }

 private:
  RankGroup group_;
  std::vector<std::unique_ptr<ThreadPool>> pools_;
  std::unique_ptr<TensorParallelModel> model_;
};

}  // namespace

void check_device(const std::string& device) {
  if (device == "cuda") check_cuda_device();
}

std::unique_ptr<BackendSession> open_backend(const Pack& pack, const BackendChoice& choice) {
  if (choice.device == "cuda") return open_cuda_backend(pack, choice);
  if (choice.device != "cpu") fail("--device: expected cpu or cuda, found '{}'", choice.device);
  if (choice.tensor_parallel < 1)
    fail("--tensor-parallel: expected a rank count >= 1, found {}", choice.tensor_parallel);
  if (choice.tensor_parallel > 1)
    return std::make_unique<CpuTensorParallelSession>(pack, choice.threads, choice.tensor_parallel);
  return std::make_unique<CpuSession>(pack, choice.threads);
}

}  // namespace qtk
