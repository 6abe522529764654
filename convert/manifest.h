// manifest.json of a pack: everything the runtime needs besides the bytes
// (format version, source digests, hyperparameters, layer plan, RoPE, EOS
// ids, the tensor table with checksums, the layout transforms applied).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "convert/tensor_plan.h"
#include "loaders/model_config.h"
#include "pack/pack_writer.h"

namespace qtk {

struct SourceFileDigest {
  std::string name;  // relative to the checkpoint directory
  uint64_t bytes = 0;
  uint64_t xxh64 = 0;
};

struct ManifestInputs {
  const ModelConfig* config = nullptr;
  std::vector<SourceFileDigest> source_files;
  int64_t max_new_tokens = -1;  // from generation_config.json; -1 when unknown
  const TensorPlan* plan = nullptr;
  // Every entry written before the manifest, in order: the plan's tensors
  // first (same order), then the files listed in file_entries.
  const std::vector<WrittenEntry>* written = nullptr;
};

// The manifest as pretty-printed JSON text.
std::string build_manifest(const ManifestInputs& in);

}  // namespace qtk
