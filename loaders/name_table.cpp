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
  // note: an FP8 checkpoint may quantise the head too (its scales beside it).
  if (hf == "lm_head.weight" || hf == "lm_head.weight_scale_inv") {
    out.kind = HfName::Kind::kModel;
    out.canonical = std::string(hf);
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

ExpertLayout hub_expert_layout(const ModelConfig& c) {
  return c.arch == Arch::kQwen3_5 ? ExpertLayout::kFused : ExpertLayout::kPerExpert;
}

std::vector<ExpectedTensor> expected_tensors(const ModelConfig& c) {
  return expected_tensors(c, hub_expert_layout(c));
}

std::vector<ExpectedTensor> expected_tensors(const ModelConfig& c, ExpertLayout experts) {
  // note: shapes are the HF ones ([out, in] for projections), read the way
  // the transformers modeling code builds each module.
  const int64_t H = c.hidden_size, I = c.intermediate_size, V = c.vocab_size;
  std::vector<ExpectedTensor> out;
  auto add = [&out](std::string name, std::vector<int64_t> shape) {
    out.push_back({std::move(name), std::move(shape)});
  };
  add("embed_tokens.weight", {V, H});
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string p = "layers." + std::to_string(i) + ".";
    add(p + "input_layernorm.weight", {H});
    if (c.layer_plan[static_cast<size_t>(i)] == LayerKind::kFull) {
      // note: Qwen3.5's q_proj yields [query; gate] per head: twice the query width.
      const int64_t q_rows = (c.attn_output_gate ? 2 : 1) * c.q_dim();
      add(p + "self_attn.q_proj.weight", {q_rows, H});
      add(p + "self_attn.k_proj.weight", {c.kv_dim(), H});
      add(p + "self_attn.v_proj.weight", {c.kv_dim(), H});
      add(p + "self_attn.o_proj.weight", {H, c.q_dim()});
      add(p + "self_attn.q_norm.weight", {c.head_dim});
      add(p + "self_attn.k_norm.weight", {c.head_dim});
    } else {
      // Gated DeltaNet: qkv = [q (Hk*Dk); k (Hk*Dk); v (Hv*Dv)] also feeds the
      // depthwise conv, so conv channels == qkv rows.
      const int64_t hv = c.linear_num_value_heads;
      add(p + "linear_attn.in_proj_qkv.weight", {c.linear_conv_dim(), H});
      add(p + "linear_attn.in_proj_z.weight", {c.linear_value_dim(), H});
      add(p + "linear_attn.in_proj_b.weight", {hv, H});
      add(p + "linear_attn.in_proj_a.weight", {hv, H});
      add(p + "linear_attn.conv1d.weight", {c.linear_conv_dim(), 1, c.linear_conv_kernel});
      add(p + "linear_attn.dt_bias", {hv});
      add(p + "linear_attn.A_log", {hv});
      add(p + "linear_attn.norm.weight", {c.linear_value_head_dim});
      add(p + "linear_attn.out_proj.weight", {H, c.linear_value_dim()});
    }
    add(p + "post_attention_layernorm.weight", {H});
    if (!c.is_moe_layer(i)) {
      add(p + "mlp.gate_proj.weight", {I, H});
      add(p + "mlp.up_proj.weight", {I, H});
      add(p + "mlp.down_proj.weight", {H, I});
      continue;
    }
    // Mixture of experts: router [E, H], routed experts, optional shared expert.
    const int64_t E = c.moe.num_experts, EI = c.moe.expert_intermediate_size;
    add(p + "mlp.gate.weight", {E, H});
    if (experts == ExpertLayout::kFused) {
      add(p + "mlp.experts.gate_up_proj", {E, 2 * EI, H});
      add(p + "mlp.experts.down_proj", {E, H, EI});
    } else {
      for (int64_t e = 0; e < E; ++e) {
        const std::string x = p + "mlp.experts." + std::to_string(e) + ".";
        add(x + "gate_proj.weight", {EI, H});
        add(x + "up_proj.weight", {EI, H});
        add(x + "down_proj.weight", {H, EI});
      }
    }
    if (const int64_t S = c.moe.shared_expert_intermediate; S > 0) {
      add(p + "mlp.shared_expert.gate_proj.weight", {S, H});
      add(p + "mlp.shared_expert.up_proj.weight", {S, H});
      add(p + "mlp.shared_expert.down_proj.weight", {H, S});
      add(p + "mlp.shared_expert_gate.weight", {1, H});
    }
  }
  add("norm.weight", {H});
  if (!c.tie_word_embeddings) add("lm_head.weight", {V, H});
  return out;
}

}  // namespace qtk
