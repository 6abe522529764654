#include "runtime/model.h"

#include "loaders/error.h"
#include "runtime/pack.h"
#include "runtime/qwen3.h"
#include "runtime/qwen3_5.h"

namespace qtk {

std::unique_ptr<Model> load_model(const Pack& pack, ThreadPool* pool) {
  const ModelConfig& c = pack.config();
  switch (c.arch) {
    case Arch::kQwen3:
      return std::make_unique<Qwen3>(pack, pool);
    case Arch::kQwen3_5:
      if (c.norm_adds_one && !pack.has_transform("norm_plus_one_folded")) {
        fail(
            "{}: Qwen3.5 pack without the 'norm_plus_one_folded' transform; this runtime computes "
            "x * rsqrt(..) * w and needs the norms stored as 1 + w (re-run convert)",
            pack.path());
      }
      return std::make_unique<Qwen3_5>(pack, pool);
  }
  fail("{}: unsupported architecture '{}'", pack.path(), c.hf_architecture);
}

}  // namespace qtk
