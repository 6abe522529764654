// A Hugging Face checkpoint directory, validated against its config.
//
// Checkpoint::open(dir) reads config.json (parse_hf_config), the optional
// generation_config.json, and the weights: model.safetensors, or the shards
// listed by model.safetensors.index.json. Shard names must be plain file
// names inside the directory; every indexed tensor must be in its shard, no
// tensor may be in two shards and no shard may hold an unindexed tensor.
// HF names go through the one name table (loaders/name_table.h); the vision
// tower and MTP head are skipped and counted. Every tensor the config
// implies must be present with the implied shape and a float dtype (BF16,
// F16, F32), or, for a 2-D weight of a checkpoint whose quantization_config
// is fp8, F8_E4M3 with its float32 `_scale_inv` sibling (validated: shape,
// dtype, finite values); any other tensor is rejected by name. All views point into the
// mapped files owned by the Checkpoint.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor_view.h"
#include "loaders/generation_config.h"
#include "loaders/model_config.h"
#include "loaders/safetensors.h"

namespace qtk {

struct CheckpointTensor {
  std::string hf_name;  // "model.language_model.layers.0.linear_attn.A_log"
  std::string name;     // canonical: "layers.0.linear_attn.A_log"
  std::string file;     // the shard's file name inside dir()
  TensorView view;      // into the shard's mapping
  // The block scales of an F8_E4M3 weight (HF `<hf_name>_scale_inv`, the
  // multiplier: real weight = fp8 value x scale): f32 [ceil(rows/block_rows),
  // ceil(cols/block_cols)] with the config's weight_block_size; data is
  // nullptr for every other tensor.
  TensorView scale;
  std::string scale_hf_name;  // "model.layers.0.mlp.down_proj.weight_scale_inv"
};

struct SkippedGroup {
  std::string prefix;  // "model.visual", "mtp", ...
  int64_t count = 0;
  int64_t bytes = 0;
};

class Checkpoint {
 public:
  static std::unique_ptr<Checkpoint> open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  // eos ids come from generation_config.json when it names them.
  const ModelConfig& config() const { return config_; }
  // Present only when the directory has generation_config.json.
  const GenerationConfig* generation() const { return has_generation_ ? &generation_ : nullptr; }

  // Canonical order: embed_tokens, layers in order, norm, lm_head (untied only).
  const std::vector<CheckpointTensor>& tensors() const { return tensors_; }
  const CheckpointTensor* find(std::string_view canonical_name) const;
  // Groups recognised and dropped, in the order of skipped_group_prefixes();
  // only groups with tensors are listed. A tied checkpoint's redundant
  // lm_head.weight is listed as "lm_head (tied)".
  const std::vector<SkippedGroup>& skipped_groups() const { return skipped_; }

  // Full paths of config.json, generation_config.json (when present), the
  // index (when sharded) and every shard, in that order: the inputs whose
  // digests identify the checkpoint.
  const std::vector<std::string>& source_files() const { return source_files_; }
  // Whether dir()/name is a regular file (e.g. "tokenizer.json").
  bool has_file(const std::string& name) const;
  std::string file_path(const std::string& name) const;

  // The opened safetensors files, by file name.
  const std::map<std::string, std::unique_ptr<SafetensorsFile>>& shards() const { return shards_; }

 private:
  // Canonical name -> (shard file name, tensor), the tensors not yet claimed.
  using TensorsByName = std::map<std::string, std::pair<std::string, const SafetensorsTensor*>>;
  Checkpoint() = default;
  // The parts of open(), in order.
  void read_configs();
  void open_weights();
  void open_indexed_shards();
  TensorsByName canonical_tensors(std::map<std::string, SkippedGroup>& skipped) const;
  void claim_expected_tensors(TensorsByName& by_canonical);
  // Adds a config resolution line for FP8 tensors that
  // quantization_config.modules_to_not_convert names.
  void note_fp8_in_modules_not_converted();
  std::string dir_;
  ModelConfig config_;
  GenerationConfig generation_;
  bool has_generation_ = false;
  std::map<std::string, std::unique_ptr<SafetensorsFile>> shards_;
  std::vector<CheckpointTensor> tensors_;
  std::map<std::string, size_t, std::less<>> index_;
  std::vector<SkippedGroup> skipped_;
  std::vector<std::string> source_files_;
};

// The rule for shard names in an index: a plain file name (non-empty, no
// '/' or '\\', not "." or "..", no control characters).
bool is_plain_file_name(std::string_view name);

}  // namespace qtk
