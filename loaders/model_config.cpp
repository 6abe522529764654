// ModelConfig helpers: the layer plan string, invariant checks and the
// pack manifest's JSON form.
#include "loaders/model_config.h"

#include <nlohmann/json.hpp>

#include "loaders/error.h"

namespace qtk {

using nlohmann::json;

std::string ModelConfig::plan_string() const {
  std::string s;
  s.reserve(layer_plan.size());
  for (LayerKind k : layer_plan) s += static_cast<char>(k);
  return s;
}

const char* arch_name(Arch a) { return a == Arch::kQwen3 ? "qwen3" : "qwen3_5"; }

void validate_model_config(const ModelConfig& c, const std::string& source) {
  auto positive = [&](int64_t v, const char* field) {
    if (v <= 0) fail("{}: field '{}': expected a positive integer, found {}", source, field, v);
  };
  positive(c.vocab_size, "vocab_size");
  positive(c.hidden_size, "hidden_size");
  positive(c.intermediate_size, "intermediate_size");
  positive(c.num_layers, "num_hidden_layers");
  positive(c.num_attention_heads, "num_attention_heads");
  positive(c.num_kv_heads, "num_key_value_heads");
  positive(c.head_dim, "head_dim");
  if (c.num_attention_heads % c.num_kv_heads != 0)
    fail(
        "{}: field 'num_key_value_heads': expected a divisor of num_attention_heads ({}), found {}",
        source, c.num_attention_heads, c.num_kv_heads);
  if (static_cast<int64_t>(c.layer_plan.size()) != c.num_layers)
    fail("{}: field 'layer_types': expected {} layers (num_hidden_layers), found {}", source,
         c.num_layers, c.layer_plan.size());
  bool any_linear = false;
  for (LayerKind k : c.layer_plan) {
    if (k != LayerKind::kFull && k != LayerKind::kLinear)
      fail("{}: field 'layer_types': unknown layer kind '{}'", source, static_cast<char>(k));
    any_linear |= k == LayerKind::kLinear;
  }
  if (c.arch == Arch::kQwen3) {
    if (any_linear)
      fail("{}: field 'layer_types': Qwen3 has only full attention layers, found plan {}", source,
           c.plan_string());
  } else {
    positive(c.linear_num_key_heads, "linear_num_key_heads");
    positive(c.linear_num_value_heads, "linear_num_value_heads");
    positive(c.linear_key_head_dim, "linear_key_head_dim");
    positive(c.linear_value_head_dim, "linear_value_head_dim");
    positive(c.linear_conv_kernel, "linear_conv_kernel_dim");
    if (c.linear_num_value_heads % c.linear_num_key_heads != 0)
      fail(
          "{}: field 'linear_num_value_heads': expected a multiple of linear_num_key_heads ({}), "
          "found {}",
          source, c.linear_num_key_heads, c.linear_num_value_heads);
  }
  const int64_t rd = c.rope.rotary_dim;
  if (rd <= 0 || rd % 2 != 0 || rd > c.head_dim)
    fail(
        "{}: field 'partial_rotary_factor': rotary dim head_dim {} x {} = {} must be even, "
        "positive and <= head_dim",
        source, c.head_dim, c.rope.partial_factor, rd);
  if (!c.rope.mrope_section.empty() && !c.rope.mrope_interleaved) {
    int64_t sum = 0;
    for (int64_t s : c.rope.mrope_section) sum += s;
    if (sum != rd / 2)
      fail(
          "{}: field 'mrope_section': expected entries summing to rotary_dim / 2 = {}, found {} "
          "(sum {})",
          source, rd / 2, json(c.rope.mrope_section).dump(), sum);
  }
  if (!(c.rms_norm_eps > 0))
    fail("{}: field 'rms_norm_eps': expected a positive number, found {}", source, c.rms_norm_eps);
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
  validate_model_config(c, source);
  return c;
}

}  // namespace qtk
