#include "loaders/name_table.h"

#include <array>

namespace qtk {

namespace {

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

// Skipped groups: the multimodal checkpoint's vision tower and MTP head.
// note: "model.mtp." is listed because some exports nest the MTP head under
// model.; both are dropped, and each is counted under its own prefix.
const std::vector<std::string> kSkippedGroups = {"model.visual", "mtp", "model.mtp"};

// Prefixes that wrap the language model, longest first.
constexpr std::array<std::string_view, 2> kModelPrefixes = {"model.language_model.", "model."};

// Which layers a per-layer tensor belongs to.
enum class LayerSet { kAll, kFull, kLinear };

using ShapeFn = std::vector<int64_t> (*)(const ModelConfig&);

struct LayerTensor {
  const char* suffix;  // after "layers.N."
  LayerSet layers;
  ShapeFn shape;
};

// note: shapes are the HF ones ([out, in] for projections). Qwen3.5's full
// attention q_proj holds [query; gate] per head, so twice the query width.
const LayerTensor kLayerTensors[] = {
    {"input_layernorm.weight", LayerSet::kAll, [](const ModelConfig& c) -> std::vector<int64_t> { return {c.hidden_size}; }},
    {"self_attn.q_proj.weight", LayerSet::kFull, [](const ModelConfig& c) -> std::vector<int64_t> {
       return {(c.attn_output_gate ? 2 : 1) * c.q_dim(), c.hidden_size}; }},
    {"self_attn.k_proj.weight", LayerSet::kFull, [](const ModelConfig& c) -> std::vector<int64_t> { return {c.kv_dim(), c.hidden_size}; }},
    {"self_attn.v_proj.weight", LayerSet::kFull, [](const ModelConfig& c) -> std::vector<int64_t> { return {c.kv_dim(), c.hidden_size}; }},
    {"self_attn.o_proj.weight", LayerSet::kFull, [](const ModelConfig& c) -> std::vector<int64_t> { return {c.hidden_size, c.q_dim()}; }},
    {"self_attn.q_norm.weight", LayerSet::kFull, [](const ModelConfig& c) -> std::vector<int64_t> { return {c.head_dim}; }},
    {"self_attn.k_norm.weight", LayerSet::kFull, [](const ModelConfig& c) -> std::vector<int64_t> { return {c.head_dim}; }},
    {"linear_attn.in_proj_qkv.weight", LayerSet::kLinear, [](const ModelConfig& c) -> std::vector<int64_t> {
       return {c.linear_conv_dim(), c.hidden_size}; }},
    {"linear_attn.in_proj_z.weight", LayerSet::kLinear, [](const ModelConfig& c) -> std::vector<int64_t> {
       return {c.linear_value_dim(), c.hidden_size}; }},
    {"linear_attn.in_proj_b.weight", LayerSet::kLinear, [](const ModelConfig& c) -> std::vector<int64_t> {
       return {c.linear_num_value_heads, c.hidden_size}; }},
    {"linear_attn.in_proj_a.weight", LayerSet::kLinear, [](const ModelConfig& c) -> std::vector<int64_t> {
       return {c.linear_num_value_heads, c.hidden_size}; }},
    {"linear_attn.conv1d.weight", LayerSet::kLinear, [](const ModelConfig& c) -> std::vector<int64_t> {
       return {c.linear_conv_dim(), 1, c.linear_conv_kernel}; }},
    {"linear_attn.dt_bias", LayerSet::kLinear, [](const ModelConfig& c) -> std::vector<int64_t> { return {c.linear_num_value_heads}; }},
    {"linear_attn.A_log", LayerSet::kLinear, [](const ModelConfig& c) -> std::vector<int64_t> { return {c.linear_num_value_heads}; }},
    {"linear_attn.norm.weight", LayerSet::kLinear, [](const ModelConfig& c) -> std::vector<int64_t> { return {c.linear_value_head_dim}; }},
    {"linear_attn.out_proj.weight", LayerSet::kLinear, [](const ModelConfig& c) -> std::vector<int64_t> {
       return {c.hidden_size, c.linear_value_dim()}; }},
    {"post_attention_layernorm.weight", LayerSet::kAll, [](const ModelConfig& c) -> std::vector<int64_t> { return {c.hidden_size}; }},
    {"mlp.gate_proj.weight", LayerSet::kAll, [](const ModelConfig& c) -> std::vector<int64_t> { return {c.intermediate_size, c.hidden_size}; }},
    {"mlp.up_proj.weight", LayerSet::kAll, [](const ModelConfig& c) -> std::vector<int64_t> { return {c.intermediate_size, c.hidden_size}; }},
    {"mlp.down_proj.weight", LayerSet::kAll, [](const ModelConfig& c) -> std::vector<int64_t> { return {c.hidden_size, c.intermediate_size}; }},
};

}  // namespace

const std::vector<std::string>& skipped_group_prefixes() { return kSkippedGroups; }

HfName map_hf_name(std::string_view hf) {
  HfName out;
  // Groups first, so "model.visual." is not taken for a "model." tensor.
  for (const std::string& g : kSkippedGroups) {
    if (starts_with(hf, g + ".")) {
      out.kind = HfName::Kind::kSkipped;
      out.group = g;
      return out;
    }
  }
  if (hf == "lm_head.weight") {
    out.kind = HfName::Kind::kModel;
    out.canonical = "lm_head.weight";
    return out;
  }
  for (std::string_view p : kModelPrefixes) {
    if (starts_with(hf, p) && hf.size() > p.size()) {
      out.kind = HfName::Kind::kModel;
      out.canonical = std::string(hf.substr(p.size()));
      return out;
    }
  }
  return out;
}

std::vector<ExpectedTensor> expected_tensors(const ModelConfig& c) {
  std::vector<ExpectedTensor> out;
  out.push_back({"embed_tokens.weight", {c.vocab_size, c.hidden_size}});
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const LayerKind kind = c.layer_plan[static_cast<size_t>(i)];
    for (const LayerTensor& t : kLayerTensors) {
      if (t.layers == LayerSet::kFull && kind != LayerKind::kFull) continue;
      if (t.layers == LayerSet::kLinear && kind != LayerKind::kLinear) continue;
      out.push_back({"layers." + std::to_string(i) + "." + t.suffix, t.shape(c)});
    }
  }
  out.push_back({"norm.weight", {c.hidden_size}});
  if (!c.tie_word_embeddings) out.push_back({"lm_head.weight", {c.vocab_size, c.hidden_size}});
  return out;
}

}  // namespace qtk
