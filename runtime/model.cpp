#include "runtime/model.h"

#include "runtime/backend/cpu/cpu_model.h"

namespace qtk {

std::unique_ptr<Model> load_model(const Pack& pack, ThreadPool* pool) {
  return make_cpu_model(pack, pool);
}

}  // namespace qtk
