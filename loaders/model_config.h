// Hyperparameters of a Qwen3 or Qwen3.5 text model, as read from an HF
// config.json (loaders/hf_config.cpp) or from a pack's manifest.json
// (to_json / from_json below). The runtime reads only this struct.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace qtk {

enum class Arch { kQwen3, kQwen3_5 };

enum class LayerKind : char { kFull = 'F', kLinear = 'L' };

// What a layer's feed-forward block is: a dense SwiGLU MLP or a sparse
// mixture of experts.
enum class MlpKind : char { kDense = 'D', kMoe = 'E' };

// Mixture-of-experts hyperparameters (Qwen3-MoE, Qwen3.5-MoE); num_experts
// is 0 for dense models.
struct MoeConfig {
  int64_t num_experts = 0;                 // E (num_experts or num_local_experts)
  std::string num_experts_field;           // the config.json field E was read from, for messages
  int64_t top_k = 0;                       // num_experts_per_tok
  int64_t expert_intermediate_size = 0;    // moe_intermediate_size, per routed expert
  bool norm_topk_prob = false;             // renormalise the top-k weights to sum to 1
  int64_t shared_expert_intermediate = 0;  // shared_expert_intermediate_size; 0: none
  std::vector<MlpKind> mlp_plan;           // one per layer; empty for dense models
};

struct RopeConfig {
  double theta = 10000.0;
  double partial_factor = 1.0;         // rotary_dim = head_dim * partial_factor
  int64_t rotary_dim = 0;              // even, <= head_dim
  std::vector<int64_t> mrope_section;  // empty for plain RoPE; (t, h, w) frequency pairs
  // note: interleaved (Qwen3.5): frequency j takes axis a in {1, 2} when
  // j % 3 == a and j < 3 * section[a], else the temporal axis; sections need
  // not sum to rotary_dim / 2 (transformers does not require it).
  // Contiguous: sections [t][h][w] summing to rotary_dim / 2.
  bool mrope_interleaved = false;
};

// Block-FP8 weights (config.json quantization_config with quant_method
// "fp8"). A weight is FP8 exactly when its tensor is F8_E4M3 with a float32
// `<name>_scale_inv` sibling: real weight = fp8 value x its block's scale.
struct Fp8Quantization {
  bool enabled = false;           // quantization_config present with quant_method "fp8"
  int64_t block_rows = 0;         // weight_block_size[0] (rows of the [out, in] matrix)
  int64_t block_cols = 0;         // weight_block_size[1]
  std::string activation_scheme;  // as given ("dynamic"); informational
  std::vector<std::string> modules_to_not_convert;  // as given; informational (dtype decides)
};

struct ModelConfig {
  Arch arch = Arch::kQwen3;
  std::string hf_architecture;  // "Qwen3ForCausalLM", "Qwen3_5ForCausalLM", ...
  std::string model_type;       // "qwen3", "qwen3_5_text", ...

  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_layers = 0;
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;

  // Full (softmax) attention.
  int64_t num_attention_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  bool attn_output_gate = false;  // Qwen3.5: q_proj yields [query, gate] per head

  // Gated DeltaNet (Qwen3.5 linear attention); zero for Qwen3.
  int64_t linear_num_key_heads = 0;
  int64_t linear_num_value_heads = 0;
  int64_t linear_key_head_dim = 0;
  int64_t linear_value_head_dim = 0;
  int64_t linear_conv_kernel = 0;

  // note: Qwen3.5's RMSNorm computes x * (1 + w); Qwen3's computes x * w.
  // A pack may fold the 1 into the stored weights; see the manifest transforms.
  bool norm_adds_one = false;

  RopeConfig rope;
  std::vector<LayerKind> layer_plan;  // one per layer
  MoeConfig moe;

  // note: read from config.json only; a pack records its quantised tensors
  // in the manifest's "quantization" section, not in this struct.
  Fp8Quantization fp8;

  std::vector<int64_t> eos_token_ids;
  int64_t bos_token_id = -1;  // -1 when absent
  int64_t pad_token_id = -1;

  // How values found in more than one place of config.json (or absent) were
  // resolved, one line each: "rope_theta: 1e+07 from rope_parameters
  // ('rope_theta' 10000 ignored)". The rules: loaders/hf_config.cpp.
  std::vector<std::string> resolution;

  // Derived sizes.
  int64_t q_dim() const { return num_attention_heads * head_dim; }
  int64_t kv_dim() const { return num_kv_heads * head_dim; }
  int64_t linear_key_dim() const { return linear_num_key_heads * linear_key_head_dim; }
  int64_t linear_value_dim() const { return linear_num_value_heads * linear_value_head_dim; }
  int64_t linear_conv_dim() const { return 2 * linear_key_dim() + linear_value_dim(); }
  std::string plan_string() const;  // "LLLF LLLF" without spaces: "LLLFLLLF"
  bool has_moe() const { return moe.num_experts > 0; }
  bool is_moe_layer(int64_t layer) const {
    const auto i = static_cast<size_t>(layer);
    return i < moe.mlp_plan.size() && moe.mlp_plan[i] == MlpKind::kMoe;
  }
  bool has_dense_mlp() const;           // some layer has a dense MLP (intermediate_size used)
  std::string mlp_plan_string() const;  // "DEEE": D dense MLP, E mixture of experts
};

// Parses an HF config.json document. `source` names the file in messages.
// Rejects unsupported architectures and features with a message naming the
// field and the value.
ModelConfig parse_hf_config(const nlohmann::json& doc, const std::string& source);
ModelConfig load_hf_config(const std::string& path);

// Checks the invariants every consumer relies on (heads divisible by kv
// heads, value heads by key heads, layer_plan length, rotary_dim even and
// <= head_dim, mrope_section summing to rotary_dim / 2, token ids < vocab).
// Throws qtk::Error naming `source` and the field (as `prefix` + its name:
// "text_config." for a config.json that nests the text model's fields).
void validate_model_config(const ModelConfig& c, const std::string& source,
                           const std::string& prefix = "");

// "qwen3" / "qwen3_5"
const char* arch_name(Arch a);

// Round trip through the pack manifest's "config" object.
// note: doubles are written with 17 significant digits, so the round trip
// is exact; config_from_json runs validate_model_config.
nlohmann::json config_to_json(const ModelConfig& c);
ModelConfig config_from_json(const nlohmann::json& j, const std::string& source);

}  // namespace qtk
