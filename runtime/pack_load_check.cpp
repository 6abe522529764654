#include "runtime/pack_load_check.h"

#include "core/tuning.h"
#include "kernels/thread_pool.h"
#include "pack/pack.h"
#include "runtime/model.h"
#include "tokenizer/tokenizer.h"

namespace qtk {

size_t check_pack_loads(const Pack& pack) {
  const size_t checked = pack.verify();
  if (auto tj = pack.entry("tokenizer.json")) {
    (void)Tokenizer::from_json_text(*tj, pack.path() + ":tokenizer.json");
  }
  // note: the model is built for its checks only; the tile-order copy and
  // the huge-page move change no check and would cost seconds per GB, so
  // they are switched off (the same switches a user has, see README).
  Tuning t = tuning();
  t.tiled = false;
  t.hugepages = false;
  set_tuning(t);
  ThreadPool pool(1);
  (void)load_model(pack, &pool);
  return checked;
}

}  // namespace qtk
