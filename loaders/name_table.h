// The one table from Hugging Face tensor names to checkpoint canonical names,
// and the tensors (with shapes) a config implies.
//
// HF names come in two layouts:
//   plain        model.embed_tokens.weight, model.layers.N.*, model.norm.weight, lm_head.weight
//   multimodal   model.language_model.{embed_tokens,layers.N,norm}.*, lm_head.weight,
//                model.visual.* (vision tower), mtp.* (multi-token prediction head)
// Canonical names drop the prefix: "embed_tokens.weight", "layers.0.self_attn.q_proj.weight",
// "norm.weight", "lm_head.weight". The vision tower and the MTP head are
// recognised and skipped (counted per group); anything else is rejected.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "loaders/model_config.h"

namespace qtk {

struct HfName {
  enum class Kind {
    kModel,    // canonical holds the canonical name
    kSkipped,  // group holds the skipped group's prefix ("model.visual", "mtp")
    kUnknown,  // neither: the checkpoint is rejected
  };
  Kind kind = Kind::kUnknown;
  std::string canonical;
  std::string group;
};

// Classifies one HF tensor name.
HfName map_hf_name(std::string_view hf_name);

// The prefixes of the skipped groups, in report order.
const std::vector<std::string>& skipped_group_prefixes();

struct ExpectedTensor {
  std::string name;            // canonical
  std::vector<int64_t> shape;  // as the config implies, HF layout [out, in]
};

// How a checkpoint stores a mixture-of-experts layer's routed experts:
//   kPerExpert  mlp.experts.{e}.{gate,up,down}_proj.weight, [I, H] / [I, H] / [H, I]
//               (Qwen3-MoE on the Hub; Qwen3.5-MoE FP8 releases)
//   kFused      mlp.experts.gate_up_proj [E, 2I, H] (gate rows first) and
//               mlp.experts.down_proj [E, H, I] (Qwen3.5-MoE bf16 on the Hub)
enum class ExpertLayout { kPerExpert, kFused };

// The layout the Hub's bf16 checkpoints of this architecture use.
ExpertLayout hub_expert_layout(const ModelConfig& c);

// Every tensor a model with config `c` needs, in canonical order: embed,
// layers in order (norms, attention or GDN, MLP or experts), final norm,
// lm_head (only when embeddings are not tied). MoE layers list their
// experts in `experts` layout.
std::vector<ExpectedTensor> expected_tensors(const ModelConfig& c, ExpertLayout experts);
std::vector<ExpectedTensor> expected_tensors(const ModelConfig& c);

}  // namespace qtk
