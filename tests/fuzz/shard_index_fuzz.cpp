// Fuzz entry: model.safetensors.index.json of a sharded checkpoint. The
// directory holds links to the qwen3-tiny-sharded-f32 fixture's config.json
// and five shards, so a well-formed index opens the real checkpoint.
#include <sys/stat.h>

#include <set>

#include "core/error.h"
#include "loaders/checkpoint.h"
#include "tests/fuzz/fuzz_entries.h"
#include "tests/fuzz/fuzz_util.h"

namespace qtk::fuzz {

namespace {

const std::string& checkpoint_dir() {
  static const std::string dir = [] {
    const std::string src =
        std::string(QTK_SOURCE_DIR) + "/tests/data/models/qwen3-tiny-sharded-f32/";
    const std::string d = scratch_dir() + "/ckpt";
    (void)::mkdir(d.c_str(), 0700);
    link_scratch_file("ckpt/config.json", src + "config.json");
    for (int i = 1; i <= 5; ++i) {
      const std::string shard = "model-0000" + std::to_string(i) + "-of-00005.safetensors";
      link_scratch_file("ckpt/" + shard, src + shard);
    }
    return d;
  }();
  return dir;
}

}  // namespace

int shard_index(const uint8_t* data, size_t size) {
  const std::string& dir = checkpoint_dir();
  write_scratch_file("ckpt/model.safetensors.index.json", data, size);
  std::unique_ptr<Checkpoint> ck;
  try {
    ck = Checkpoint::open(dir);
  } catch (const Error&) {
    return 0;
  }
  // Accepted: every tensor's file is one of the shards, no name twice.
  std::set<std::string> names;
  for (const CheckpointTensor& t : ck->tensors()) {
    fuzz_check(is_plain_file_name(t.file), "tensor file is not a plain file name");
    fuzz_check(ck->shards().count(t.file) == 1, "tensor points at a shard that was not opened");
    fuzz_check(names.insert(t.name).second, "canonical tensor listed twice");
    fuzz_check(ck->find(t.name) == &t, "find() does not return the listed tensor");
  }
  return 0;
}

}  // namespace qtk::fuzz
