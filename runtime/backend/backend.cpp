#include "runtime/backend/backend.h"

#include <optional>

#include "core/error.h"
#include "kernels/thread_pool.h"

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

}  // namespace

void check_device(const std::string& device) {
  if (device == "cuda") check_cuda_device();
}

std::unique_ptr<BackendSession> open_backend(const Pack& pack, const BackendChoice& choice) {
  if (choice.device == "cuda") return open_cuda_backend(pack, choice);
  if (choice.device != "cpu") fail("--device: expected cpu or cuda, found '{}'", choice.device);
  return std::make_unique<CpuSession>(pack, choice.threads);
}

}  // namespace qtk
