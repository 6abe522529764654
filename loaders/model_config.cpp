// ModelConfig helpers: the layer plan string, invariant checks and the
// pack manifest's JSON form.
#include "loaders/model_config.h"

#include <cmath>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace qtk {

using nlohmann::json;

std::string ModelConfig::plan_string() const {
  std::string s;
  s.reserve(layer_plan.size());
  for (LayerKind k : layer_plan) s += static_cast<char>(k);
  return s;
}

bool ModelConfig::has_dense_mlp() const {
  for (int64_t i = 0; i < num_layers; ++i)
    if (!is_moe_layer(i)) return true;
  return false;
}

std::string ModelConfig::mlp_plan_string() const {
  std::string s;
  for (int64_t i = 0; i < num_layers; ++i)
    s += static_cast<char>(is_moe_layer(i) ? MlpKind::kMoe : MlpKind::kDense);
  return s;
}

namespace {

// The mixture-of-experts fields, when the model has experts.
void validate_moe(const ModelConfig& c, const std::string& source, const std::string& prefix) {
  const MoeConfig& m = c.moe;
  if (m.num_experts == 0) {
    if (!m.mlp_plan.empty())
      fail("{}: field '{}mlp_plan': a model without experts has no MoE layer plan, found {}",
           source, prefix, c.mlp_plan_string());
    return;
  }
  if (m.num_experts < 0)
    fail("{}: field '{}num_experts': expected a positive integer, found {}", source, prefix,
         m.num_experts);
  if (m.top_k <= 0 || m.top_k > m.num_experts)
    fail(
        "{}: field '{}num_experts_per_tok': expected an integer in [1, num_experts = {}], found {}",
        source, prefix, m.num_experts, m.top_k);
  if (m.expert_intermediate_size <= 0)
    fail("{}: field '{}moe_intermediate_size': expected a positive integer, found {}", source,
         prefix, m.expert_intermediate_size);
  if (m.shared_expert_intermediate < 0)
    fail("{}: field '{}shared_expert_intermediate_size': expected an integer >= 0, found {}",
         source, prefix, m.shared_expert_intermediate);
  if (static_cast<int64_t>(m.mlp_plan.size()) != c.num_layers)
    fail("{}: field '{}mlp_plan': expected {} layers (num_hidden_layers), found {}", source, prefix,
         c.num_layers, m.mlp_plan.size());
  for (MlpKind k : m.mlp_plan)
    if (k != MlpKind::kDense && k != MlpKind::kMoe)
      fail("{}: field '{}mlp_plan': unknown MLP kind '{}'", source, prefix, static_cast<char>(k));
}

}  // namespace

const char* arch_name(Arch a) { return a == Arch::kQwen3 ? "qwen3" : "qwen3_5"; }

void validate_model_config(const ModelConfig& c, const std::string& source,
                           const std::string& prefix) {
  auto positive = [&](int64_t v, const char* field) {
    if (v <= 0)
      fail("{}: field '{}{}': expected a positive integer, found {}", source, prefix, field, v);
  };
  positive(c.vocab_size, "vocab_size");
  positive(c.hidden_size, "hidden_size");
  positive(c.num_layers, "num_hidden_layers");
  // note: every tensor shape is a product of these sizes (heads x head_dim,
  // experts x width x hidden, vocab x hidden); a damaged value must not make
  // such a product wrap around int64 and pass a shape check by accident (a
  // pack with 4 + 2^59 heads did, then crashed generate). The bounds are far
  // above any real model's (hidden 16384, vocab 248320, 512 experts).
  auto at_most = [&](int64_t v, int64_t max, const char* field) {
    if (v > max)
      fail("{}: field '{}{}': expected at most {}, found {}", source, prefix, field, max, v);
  };
  constexpr int64_t k16 = int64_t{1} << 16, k20 = int64_t{1} << 20, k24 = int64_t{1} << 24;
  at_most(c.vocab_size, k24, "vocab_size");
  at_most(c.hidden_size, k20, "hidden_size");
  at_most(c.intermediate_size, k24, "intermediate_size");
  at_most(c.num_attention_heads, k16, "num_attention_heads");
  at_most(c.num_kv_heads, k16, "num_key_value_heads");
  at_most(c.head_dim, k16, "head_dim");
  at_most(c.linear_num_key_heads, k16, "linear_num_key_heads");
  at_most(c.linear_num_value_heads, k16, "linear_num_value_heads");
  at_most(c.linear_key_head_dim, k16, "linear_key_head_dim");
  at_most(c.linear_value_head_dim, k16, "linear_value_head_dim");
  at_most(c.linear_conv_kernel, k16, "linear_conv_kernel_dim");
  // (num_experts: a checkpoint's is bounded by the tensors it holds, with a
  // message naming its router, checkpoint.cpp; a pack's below)
  at_most(c.moe.expert_intermediate_size, k24, "moe_intermediate_size");
  at_most(c.moe.shared_expert_intermediate, k24, "shared_expert_intermediate_size");
  validate_moe(c, source, prefix);
  // note: a model whose every layer is a mixture of experts (Qwen3.5-MoE)
  // has no dense MLP and need not say intermediate_size.
  if (c.has_dense_mlp()) positive(c.intermediate_size, "intermediate_size");
  positive(c.num_attention_heads, "num_attention_heads");
  positive(c.num_kv_heads, "num_key_value_heads");
  positive(c.head_dim, "head_dim");
  if (c.num_attention_heads % c.num_kv_heads != 0)
    fail(
        "{}: field '{}num_key_value_heads': expected a divisor of num_attention_heads ({}), found "
        "{}",
        source, prefix, c.num_attention_heads, c.num_kv_heads);
  if (static_cast<int64_t>(c.layer_plan.size()) != c.num_layers)
    fail("{}: field '{}layer_types': expected {} layers (num_hidden_layers), found {}", source,
         prefix, c.num_layers, c.layer_plan.size());
  bool any_linear = false;
  for (LayerKind k : c.layer_plan) {
    if (k != LayerKind::kFull && k != LayerKind::kLinear)
      fail("{}: field '{}layer_types': unknown layer kind '{}'", source, prefix,
           static_cast<char>(k));
    any_linear |= k == LayerKind::kLinear;
  }
  if (c.arch == Arch::kQwen3) {
    if (any_linear)
      fail("{}: field '{}layer_types': Qwen3 has only full attention layers, found plan {}", source,
           prefix, c.plan_string());
  } else {
    positive(c.linear_num_key_heads, "linear_num_key_heads");
    positive(c.linear_num_value_heads, "linear_num_value_heads");
    positive(c.linear_key_head_dim, "linear_key_head_dim");
    positive(c.linear_value_head_dim, "linear_value_head_dim");
    positive(c.linear_conv_kernel, "linear_conv_kernel_dim");
    if (c.linear_num_value_heads % c.linear_num_key_heads != 0)
      fail(
          "{}: field '{}linear_num_value_heads': expected a multiple of linear_num_key_heads ({}), "
          "found {}",
          source, prefix, c.linear_num_key_heads, c.linear_num_value_heads);
  }
  const int64_t rd = c.rope.rotary_dim;
  if (rd <= 0 || rd % 2 != 0 || rd > c.head_dim)
    fail(
        "{}: field '{}partial_rotary_factor': rotary dim head_dim {} x {} = {} must be even, "
        "positive and <= head_dim",
        source, prefix, c.head_dim, c.rope.partial_factor, rd);
  if (!c.rope.mrope_section.empty() && !c.rope.mrope_interleaved) {
    int64_t sum = 0;
    for (int64_t s : c.rope.mrope_section) sum += s;
    if (sum != rd / 2)
      fail(
          "{}: field '{}mrope_section': expected entries summing to rotary_dim / 2 = {}, found {} "
          "(sum {})",
          source, prefix, rd / 2, json(c.rope.mrope_section).dump(), sum);
  }
  // note: an eps of 1 or more would swamp any hidden state's mean square
  // (every model uses 1e-6 or 1e-5); a zero, negative or infinite RoPE base
  // gives no usable rotation.
  if (!(c.rms_norm_eps > 0 && c.rms_norm_eps < 1))
    fail("{}: field '{}rms_norm_eps': expected a positive number below 1, found {}", source, prefix,
         c.rms_norm_eps);
  if (!(c.rope.theta > 0 && std::isfinite(c.rope.theta)))
    fail("{}: field '{}rope_theta': expected a positive finite number, found {}", source, prefix,
         c.rope.theta);
  positive(c.max_position_embeddings, "max_position_embeddings");
  for (int64_t s : c.rope.mrope_section)
    if (s < 0)
      fail("{}: field '{}mrope_section': expected entries of 0 or more, found {}", source, prefix,
           json(c.rope.mrope_section).dump());
  for (int64_t id : c.eos_token_ids)
    if (id < 0 || id >= c.vocab_size)
      fail("{}: field 'eos_token_id': expected ids below vocab_size {}, found {}", source,
           c.vocab_size, id);
  if (c.bos_token_id >= c.vocab_size)
    fail("{}: field 'bos_token_id': expected an id below vocab_size {}, found {}", source,
         c.vocab_size, c.bos_token_id);
}

json config_to_json(const ModelConfig& c) {
  json j = json::object();
  j["arch"] = arch_name(c.arch);
  j["hf_architecture"] = c.hf_architecture;
  j["model_type"] = c.model_type;
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_layers"] = c.num_layers;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_kv_heads"] = c.num_kv_heads;
  j["head_dim"] = c.head_dim;
  j["attn_output_gate"] = c.attn_output_gate;
  j["linear_num_key_heads"] = c.linear_num_key_heads;
  j["linear_num_value_heads"] = c.linear_num_value_heads;
  j["linear_key_head_dim"] = c.linear_key_head_dim;
  j["linear_value_head_dim"] = c.linear_value_head_dim;
  j["linear_conv_kernel"] = c.linear_conv_kernel;
  j["norm_adds_one"] = c.norm_adds_one;
  j["rope"] = {{"theta", c.rope.theta},
               {"partial_factor", c.rope.partial_factor},
               {"rotary_dim", c.rope.rotary_dim},
               {"mrope_section", c.rope.mrope_section},
               {"mrope_interleaved", c.rope.mrope_interleaved}};
  j["layer_plan"] = c.plan_string();
  j["eos_token_ids"] = c.eos_token_ids;
  j["bos_token_id"] = c.bos_token_id;
  j["pad_token_id"] = c.pad_token_id;
  if (!c.resolution.empty()) j["resolution"] = c.resolution;
  // note: written only for models with experts, so dense packs keep the
  // manifest they always had (and older readers' view of them).
  if (c.has_moe())
    j["moe"] = {{"num_experts", c.moe.num_experts},
                {"top_k", c.moe.top_k},
                {"expert_intermediate_size", c.moe.expert_intermediate_size},
                {"norm_topk_prob", c.moe.norm_topk_prob},
                {"shared_expert_intermediate_size", c.moe.shared_expert_intermediate},
                {"mlp_plan", c.mlp_plan_string()}};
  return j;
}

namespace {

struct Reader {
  const json& j;
  const std::string& source;
  std::string prefix;

  const json& at(const char* field) const {
    if (!j.is_object() || !j.contains(field))
      fail("{}: missing field '{}{}'", source, prefix, field);
    return j[field];
  }
  int64_t integer(const char* field) const {
    const json& v = at(field);
    if (!v.is_number_integer())
      fail("{}: field '{}{}': expected an integer, found {}", source, prefix, field, v.dump());
    return v.get<int64_t>();
  }
  double number(const char* field) const {
    const json& v = at(field);
    if (!v.is_number())
      fail("{}: field '{}{}': expected a number, found {}", source, prefix, field, v.dump());
    return v.get<double>();
  }
  bool boolean(const char* field) const {
    const json& v = at(field);
    if (!v.is_boolean())
      fail("{}: field '{}{}': expected true or false, found {}", source, prefix, field, v.dump());
    return v.get<bool>();
  }
  std::string string(const char* field) const {
    const json& v = at(field);
    if (!v.is_string())
      fail("{}: field '{}{}': expected a string, found {}", source, prefix, field, v.dump());
    return v.get<std::string>();
  }
  std::vector<int64_t> integers(const char* field) const {
    const json& v = at(field);
    std::vector<int64_t> out;
    if (!v.is_array())
      fail("{}: field '{}{}': expected a list of integers, found {}", source, prefix, field,
           v.dump());
    for (const json& x : v) {
      if (!x.is_number_integer())
        fail("{}: field '{}{}': expected a list of integers, found {}", source, prefix, field,
             v.dump());
      out.push_back(x.get<int64_t>());
    }
    return out;
  }
};

}  // namespace

ModelConfig config_from_json(const json& j, const std::string& source) {
  if (!j.is_object())
    fail("{}: field 'config': expected an object, found {}", source, j.type_name());
  const Reader r{j, source, "config."};
  ModelConfig c;
  const std::string arch = r.string("arch");
  if (arch == "qwen3")
    c.arch = Arch::kQwen3;
  else if (arch == "qwen3_5")
    c.arch = Arch::kQwen3_5;
  else
    fail("{}: field 'config.arch': expected \"qwen3\" or \"qwen3_5\", found \"{}\"", source, arch);
  c.hf_architecture = r.string("hf_architecture");
  c.model_type = r.string("model_type");
  c.vocab_size = r.integer("vocab_size");
  c.hidden_size = r.integer("hidden_size");
  c.intermediate_size = r.integer("intermediate_size");
  c.num_layers = r.integer("num_layers");
  c.max_position_embeddings = r.integer("max_position_embeddings");
  c.rms_norm_eps = r.number("rms_norm_eps");
  c.tie_word_embeddings = r.boolean("tie_word_embeddings");
  c.num_attention_heads = r.integer("num_attention_heads");
  c.num_kv_heads = r.integer("num_kv_heads");
  c.head_dim = r.integer("head_dim");
  c.attn_output_gate = r.boolean("attn_output_gate");
  c.linear_num_key_heads = r.integer("linear_num_key_heads");
  c.linear_num_value_heads = r.integer("linear_num_value_heads");
  c.linear_key_head_dim = r.integer("linear_key_head_dim");
  c.linear_value_head_dim = r.integer("linear_value_head_dim");
  c.linear_conv_kernel = r.integer("linear_conv_kernel");
  c.norm_adds_one = r.boolean("norm_adds_one");
  {
    const Reader rope{r.at("rope"), source, "config.rope."};
    c.rope.theta = rope.number("theta");
    c.rope.partial_factor = rope.number("partial_factor");
    c.rope.rotary_dim = rope.integer("rotary_dim");
    c.rope.mrope_section = rope.integers("mrope_section");
    c.rope.mrope_interleaved = rope.boolean("mrope_interleaved");
  }
  const std::string plan = r.string("layer_plan");
  for (char ch : plan) {
    if (ch != 'F' && ch != 'L')
      fail("{}: field 'config.layer_plan': expected letters F and L, found \"{}\"", source, plan);
    c.layer_plan.push_back(static_cast<LayerKind>(ch));
  }
  c.eos_token_ids = r.integers("eos_token_ids");
  c.bos_token_id = r.integer("bos_token_id");
  c.pad_token_id = r.integer("pad_token_id");
  if (j.contains("resolution")) {
    const json& res = j["resolution"];
    if (!res.is_array())
      fail("{}: field 'config.resolution': expected a list of strings, found {}", source,
           res.type_name());
    for (const json& line : res) {
      if (!line.is_string())
        fail("{}: field 'config.resolution': expected a list of strings, found {}", source,
             line.type_name());
      c.resolution.push_back(line.get<std::string>());
    }
  }
  if (j.contains("moe")) {
    const Reader moe{r.at("moe"), source, "config.moe."};
    c.moe.num_experts = moe.integer("num_experts");
    c.moe.top_k = moe.integer("top_k");
    c.moe.expert_intermediate_size = moe.integer("expert_intermediate_size");
    c.moe.norm_topk_prob = moe.boolean("norm_topk_prob");
    c.moe.shared_expert_intermediate = moe.integer("shared_expert_intermediate_size");
    const std::string mlp = moe.string("mlp_plan");
    for (char ch : mlp) {
      if (ch != 'D' && ch != 'E')
        fail("{}: field 'config.moe.mlp_plan': expected letters D and E, found \"{}\"", source,
             mlp);
      c.moe.mlp_plan.push_back(static_cast<MlpKind>(ch));
    }
    // note: bounded so that no expert tensor's shape product wraps around
    // int64 (validate_model_config bounds the widths).
    constexpr int64_t kMaxExperts = int64_t{1} << 16;
    if (c.moe.num_experts <= 0 || c.moe.num_experts > kMaxExperts)
      fail(
          "{}: field 'config.moe.num_experts': expected a positive integer of at most {}, found {}",
          source, kMaxExperts, c.moe.num_experts);
  }
  validate_model_config(c, source);
  return c;
}

}  // namespace qtk
