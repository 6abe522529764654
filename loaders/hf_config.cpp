// parse_hf_config: Hugging Face config.json -> ModelConfig.
//
// Spellings differ between transformers 4.x files (rope_theta and
// rope_scaling at the top level) and 5.x files (rope_parameters), and the
// multimodal Qwen3.5 layout nests the text model under text_config. Every
// field is read through one lookup that knows those places, so each
// variant is handled in exactly one spot.
#include <cmath>
#include <optional>

#include <nlohmann/json.hpp>

#include "loaders/error.h"
#include "loaders/model_config.h"
#include "loaders/strict_json.h"

namespace qtk {

using nlohmann::json;

namespace {

std::string shown(const json& j) {
  std::string s = j.dump(-1, ' ', false, json::error_handler_t::replace);
  if (s.size() > 80) s = s.substr(0, 77) + "...";
  return s;
}

// Where the text model's fields live: `text` is text_config for the
// multimodal layout, else the top-level object.
struct ConfigDoc {
  const json& top;
  const json& text;
  std::string source;
  bool nested;

  // The field from text_config, else from the top level; nullptr if absent.
  const json* find(const char* field) const {
    if (text.contains(field)) return &text[field];
    if (nested && top.contains(field)) return &top[field];
    return nullptr;
  }
  // "text_config.hidden_size" or "hidden_size", for messages.
  std::string name(const char* field) const {
    return nested && text.contains(field) ? fmt::format("text_config.{}", field) : field;
  }

  int64_t positive_int(const char* field) const {
    const json* v = find(field);
    if (!v) fail("{}: missing field '{}' (expected a positive integer)", source, name(field));
    if (!v->is_number_integer() || v->get<int64_t>() <= 0 ||
        (v->is_number_unsigned() && v->get<uint64_t>() > (1ull << 40)))
      fail("{}: field '{}': expected a positive integer, found {}", source, name(field), shown(*v));
    return v->get<int64_t>();
  }
  std::optional<bool> optional_bool(const char* field) const {
    const json* v = find(field);
    if (!v || v->is_null()) return std::nullopt;
    if (!v->is_boolean())
      fail("{}: field '{}': expected true or false, found {}", source, name(field), shown(*v));
    return v->get<bool>();
  }
  // A number read through find(): text_config first, then the top level.
  std::optional<double> optional_top_number(const char* field) const {
    const json* v = find(field);
    if (!v || v->is_null()) return std::nullopt;
    if (!v->is_number())
      fail("{}: field '{}': expected a number, found {}", source, name(field), shown(*v));
    return v->get<double>();
  }
  std::optional<double> optional_number(const json& obj, const char* field,
                                        const std::string& shown_name) const {
    if (!obj.contains(field) || obj[field].is_null()) return std::nullopt;
    const json& v = obj[field];
    if (!v.is_number())
      fail("{}: field '{}': expected a number, found {}", source, shown_name, shown(v));
    return v.get<double>();
  }
};

// A token id field: an integer, a list of integers, or null.
std::vector<int64_t> token_ids(const json* v, const std::string& source, const std::string& field) {
  std::vector<int64_t> ids;
  if (!v || v->is_null()) return ids;
  auto one = [&](const json& x) {
    if (!x.is_number_integer() || x.get<int64_t>() < 0)
      fail("{}: field '{}': expected a token id (integer >= 0), a list of them or null, found {}",
           source, field, shown(*v));
    ids.push_back(x.get<int64_t>());
  };
  if (v->is_array()) {
    for (const json& x : *v) one(x);
  } else {
    one(*v);
  }
  return ids;
}

int64_t single_token_id(const ConfigDoc& d, const char* field) {
  const auto ids = token_ids(d.find(field), d.source, d.name(field));
  if (ids.size() > 1)
    fail("{}: field '{}': expected one token id, found {}", d.source, d.name(field), ids.size());
  return ids.empty() ? -1 : ids[0];
}

void reject_unsupported(const ConfigDoc& d) {
  if (auto bias = d.optional_bool("attention_bias"); bias && *bias)
    fail("{}: field '{}': attention_bias true is not supported (expected false)", d.source,
         d.name("attention_bias"));
  if (auto sw = d.optional_bool("use_sliding_window"); sw && *sw) {
    const json* w = d.find("sliding_window");
    fail(
        "{}: field '{}': an active sliding window is not supported (use_sliding_window true, "
        "sliding_window {})",
        d.source, d.name("use_sliding_window"), w ? shown(*w) : "absent");
  }
  if (const json* act = d.find("hidden_act"); act && !(act->is_string() && *act == "silu"))
    fail("{}: field '{}': expected \"silu\", found {}", d.source, d.name("hidden_act"),
         shown(*act));
  for (const char* moe : {"num_experts", "num_local_experts", "n_routed_experts",
                          "num_experts_per_tok", "moe_intermediate_size"}) {
    const json* v = d.find(moe);
    if (v && !v->is_null() && !(v->is_number() && v->get<double>() == 0))
      fail("{}: field '{}': mixture-of-experts models are not supported, found {}", d.source,
           d.name(moe), shown(*v));
  }
}

// quantization_config: block-FP8 (quant_method "fp8", the format of Qwen's
// FP8 releases) is read; every other method is refused by name.
void read_fp8_quantization(const ConfigDoc& d, ModelConfig& c) {
  const json* q = nullptr;
  std::string where = "quantization_config";
  for (const auto& [obj, name] :
       {std::pair{&d.top, "quantization_config"}, {&d.text, "text_config.quantization_config"}}) {
    if (!obj->contains("quantization_config") || (*obj)["quantization_config"].is_null()) continue;
    if (!d.nested && obj == &d.text && std::string_view(name) != "quantization_config")
      continue;  // d.text is d.top
    if (q && *q != (*obj)["quantization_config"])
      fail("{}: fields 'quantization_config' and 'text_config.quantization_config' disagree",
           d.source);
    q = &(*obj)["quantization_config"];
    where = name;
  }
  if (!q) return;
  if (!q->is_object())
    fail("{}: field '{}': expected an object, found {}", d.source, where, shown(*q));
  if (!q->contains("quant_method") || !(*q)["quant_method"].is_string())
    fail("{}: field '{}.quant_method': expected a string (\"fp8\"), found {}", d.source, where,
         q->contains("quant_method") ? shown((*q)["quant_method"]) : "nothing");
  const std::string method = (*q)["quant_method"].get<std::string>();
  if (method != "fp8")
    fail(
        "{}: field '{}.quant_method': not supported: quant_method \"{}\" (only \"fp8\" "
        "block-quantised checkpoints are)",
        d.source, where, method);
  // note: FineGrainedFP8Config's defaults (fmt e4m3, dynamic activations,
  // 128x128 blocks) apply when a field is absent, as transformers does.
  if (q->contains("fmt") && !(*q)["fmt"].is_null() && (*q)["fmt"] != "e4m3")
    fail("{}: field '{}.fmt': not supported: expected \"e4m3\", found {}", d.source, where,
         shown((*q)["fmt"]));
  c.fp8.activation_scheme = "dynamic";
  if (q->contains("activation_scheme") && !(*q)["activation_scheme"].is_null()) {
    const json& a = (*q)["activation_scheme"];
    if (a != "dynamic")
      fail(
          "{}: field '{}.activation_scheme': not supported: expected \"dynamic\" (static "
          "activation scales are not read), found {}",
          d.source, where, shown(a));
    c.fp8.activation_scheme = a.get<std::string>();
  }
  c.fp8.block_rows = c.fp8.block_cols = 128;
  if (q->contains("weight_block_size") && !(*q)["weight_block_size"].is_null()) {
    const json& b = (*q)["weight_block_size"];
    if (b != json::array({128, 128}))
      fail("{}: field '{}.weight_block_size': not supported: expected [128, 128], found {}",
           d.source, where, shown(b));
  }
  if (q->contains("modules_to_not_convert") && !(*q)["modules_to_not_convert"].is_null()) {
    const json& m = (*q)["modules_to_not_convert"];
    if (!m.is_array())
      fail("{}: field '{}.modules_to_not_convert': expected a list of names, found {}", d.source,
           where, shown(m));
    for (const json& x : m) {
      if (!x.is_string())
        fail("{}: field '{}.modules_to_not_convert': expected a list of names, found {}", d.source,
             where, shown(m));
      c.fp8.modules_to_not_convert.push_back(x.get<std::string>());
    }
  }
  c.fp8.enabled = true;
}

void read_layer_plan(const ConfigDoc& d, ModelConfig& c) {
  const json* types = d.find("layer_types");
  if (types && !types->is_null()) {
    if (!types->is_array())
      fail("{}: field '{}': expected a list of layer types, found {}", d.source,
           d.name("layer_types"), shown(*types));
    if (static_cast<int64_t>(types->size()) != c.num_layers)
      fail("{}: field '{}': expected {} entries (num_hidden_layers), found {}", d.source,
           d.name("layer_types"), c.num_layers, types->size());
    for (size_t i = 0; i < types->size(); ++i) {
      const json& t = (*types)[i];
      if (t == "full_attention") {
        c.layer_plan.push_back(LayerKind::kFull);
      } else if (t == "linear_attention" && c.arch == Arch::kQwen3_5) {
        c.layer_plan.push_back(LayerKind::kLinear);
      } else {
        fail("{}: field '{}[{}]': expected {}, found {}", d.source, d.name("layer_types"), i,
             c.arch == Arch::kQwen3_5 ? "\"full_attention\" or \"linear_attention\""
                                      : "\"full_attention\"",
             shown(t));
      }
    }
    return;
  }
  if (c.arch == Arch::kQwen3) {
    c.layer_plan.assign(static_cast<size_t>(c.num_layers), LayerKind::kFull);
    return;
  }
  if (!d.find("full_attention_interval"))
    fail("{}: missing field 'layer_types' (or 'full_attention_interval') for {}", d.source,
         c.hf_architecture);
  const int64_t interval = d.positive_int("full_attention_interval");
  // note: transformers' rule: layer i is full attention when (i + 1) % interval == 0.
  for (int64_t i = 0; i < c.num_layers; ++i)
    c.layer_plan.push_back((i + 1) % interval == 0 ? LayerKind::kFull : LayerKind::kLinear);
}

void read_rope(const ConfigDoc& d, ModelConfig& c) {
  // 5.x: rope_parameters {rope_type, rope_theta, partial_rotary_factor, mrope_*};
  // 4.x: rope_theta and partial_rotary_factor at the top, rope_scaling {type, mrope_*} or null.
  const json kEmpty = json::object();
  const json* params = d.find("rope_parameters");
  const json* scaling = d.find("rope_scaling");
  for (const auto& [obj, field] :
       {std::pair{params, "rope_parameters"}, {scaling, "rope_scaling"}}) {
    if (!obj || obj->is_null()) continue;
    if (!obj->is_object())
      fail("{}: field '{}': expected an object or null, found {}", d.source, d.name(field),
           shown(*obj));
    for (const char* type_key : {"rope_type", "type"}) {
      if (!obj->contains(type_key)) continue;
      const json& t = (*obj)[type_key];
      if (t != "default")
        fail("{}: field '{}.{}': only \"default\" RoPE is supported, found {}", d.source,
             d.name(field), type_key, shown(t));
    }
  }
  const json& p = params && params->is_object() ? *params : kEmpty;
  const json& s = scaling && scaling->is_object() ? *scaling : kEmpty;
  const std::string pname = d.name("rope_parameters");
  const std::string sname = d.name("rope_scaling");

  // theta
  const auto theta_top = d.optional_top_number("rope_theta");
  const auto theta_p = d.optional_number(p, "rope_theta", pname + ".rope_theta");
  if (theta_top && theta_p && *theta_top != *theta_p)
    fail("{}: fields '{}' ({}) and '{}.rope_theta' ({}) disagree", d.source, d.name("rope_theta"),
         *theta_top, pname, *theta_p);
  if (!theta_top && !theta_p)
    fail("{}: missing field 'rope_theta' (expected at the top level or in rope_parameters)",
         d.source);
  c.rope.theta = theta_p ? *theta_p : *theta_top;
  if (!(c.rope.theta > 0) || !std::isfinite(c.rope.theta))
    fail("{}: field 'rope_theta': expected a positive number, found {}", d.source, c.rope.theta);

  // partial rotary factor
  const auto f_top = d.optional_top_number("partial_rotary_factor");
  const auto f_p = d.optional_number(p, "partial_rotary_factor", pname + ".partial_rotary_factor");
  if (f_top && f_p && *f_top != *f_p)
    fail("{}: fields '{}' ({}) and '{}.partial_rotary_factor' ({}) disagree", d.source,
         d.name("partial_rotary_factor"), *f_top, pname, *f_p);
  c.rope.partial_factor = f_p ? *f_p : (f_top ? *f_top : 1.0);
  if (!(c.rope.partial_factor > 0 && c.rope.partial_factor <= 1))
    fail("{}: field 'partial_rotary_factor': expected a number in (0, 1], found {}", d.source,
         c.rope.partial_factor);
  const double rd = static_cast<double>(c.head_dim) * c.rope.partial_factor;
  c.rope.rotary_dim = static_cast<int64_t>(std::llround(rd));
  if (std::fabs(rd - static_cast<double>(c.rope.rotary_dim)) > 1e-9)
    fail(
        "{}: field 'partial_rotary_factor': head_dim {} x {} = {} is not a whole rotary "
        "dimension",
        d.source, c.head_dim, c.rope.partial_factor, rd);

  // M-RoPE
  const json* section = nullptr;
  std::string section_name;
  const json* interleaved = nullptr;
  for (const auto& [obj, oname] : {std::pair{&p, pname}, {&s, sname}}) {
    if (obj->contains("mrope_section") && !(*obj)["mrope_section"].is_null()) {
      if (section && *section != (*obj)["mrope_section"])
        fail("{}: fields '{}' and '{}.mrope_section' disagree", d.source, section_name, oname);
      section = &(*obj)["mrope_section"];
      section_name = oname + ".mrope_section";
    }
    if (obj->contains("mrope_interleaved") && !(*obj)["mrope_interleaved"].is_null()) {
      interleaved = &(*obj)["mrope_interleaved"];
      if (!interleaved->is_boolean())
        fail("{}: field '{}.mrope_interleaved': expected true or false, found {}", d.source, oname,
             shown(*interleaved));
    }
  }
  if (section) {
    if (c.arch != Arch::kQwen3_5)
      fail("{}: field '{}': M-RoPE is not supported for {}", d.source, section_name,
           c.hf_architecture);
    if (!section->is_array() || section->empty())
      fail("{}: field '{}': expected a list of positive integers, found {}", d.source, section_name,
           shown(*section));
    int64_t sum = 0;
    for (const json& x : *section) {
      if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() > (1 << 20))
        fail("{}: field '{}': expected a list of integers >= 0, found {}", d.source, section_name,
             shown(*section));
      c.rope.mrope_section.push_back(x.get<int64_t>());
      sum += x.get<int64_t>();
    }
    if (c.rope.mrope_section.size() != 3)
      fail("{}: field '{}': expected 3 entries (temporal, height, width), found {}", d.source,
           section_name, c.rope.mrope_section.size());
    c.rope.mrope_interleaved = interleaved && interleaved->get<bool>();
    // checked against rotary_dim / 2 in validate_model_config
    (void)sum;
  } else if (interleaved && interleaved->get<bool>()) {
    fail("{}: field 'mrope_interleaved' is true but no mrope_section is given", d.source);
  }
}

}  // namespace

ModelConfig parse_hf_config(const json& doc, const std::string& source) {
  if (!doc.is_object()) fail("{}: expected a JSON object, found {}", source, doc.type_name());
  ModelConfig c;
  const json* archs = doc.contains("architectures") ? &doc["architectures"] : nullptr;
  if (!archs || !archs->is_array() || archs->size() != 1 || !(*archs)[0].is_string())
    fail("{}: field 'architectures': expected a list with one architecture name, found {}", source,
         archs ? shown(*archs) : "nothing");
  c.hf_architecture = (*archs)[0].get<std::string>();
  bool nested = false;
  if (c.hf_architecture == "Qwen3ForCausalLM") {
    c.arch = Arch::kQwen3;
  } else if (c.hf_architecture == "Qwen3_5ForCausalLM") {
    c.arch = Arch::kQwen3_5;
  } else if (c.hf_architecture == "Qwen3_5ForConditionalGeneration") {
    c.arch = Arch::kQwen3_5;
    nested = true;
  } else {
    fail(
        "{}: field 'architectures': expected Qwen3ForCausalLM, Qwen3_5ForCausalLM or "
        "Qwen3_5ForConditionalGeneration, found \"{}\"",
        source, c.hf_architecture);
  }
  if (nested && !(doc.contains("text_config") && doc["text_config"].is_object()))
    fail("{}: field 'text_config': expected an object for {}, found {}", source, c.hf_architecture,
         doc.contains("text_config") ? shown(doc["text_config"]) : "nothing");
  const ConfigDoc d{doc, nested ? doc["text_config"] : doc, source, nested};

  if (const json* mt = d.find("model_type"); mt && mt->is_string()) c.model_type = *mt;
  reject_unsupported(d);
  read_fp8_quantization(d, c);

  c.vocab_size = d.positive_int("vocab_size");
  c.hidden_size = d.positive_int("hidden_size");
  c.intermediate_size = d.positive_int("intermediate_size");
  c.num_layers = d.positive_int("num_hidden_layers");
  c.num_attention_heads = d.positive_int("num_attention_heads");
  c.num_kv_heads = d.find("num_key_value_heads") && !d.find("num_key_value_heads")->is_null()
                       ? d.positive_int("num_key_value_heads")
                       : c.num_attention_heads;
  if (!d.find("head_dim"))
    fail(
        "{}: missing field 'head_dim' (expected it explicitly; it is not hidden_size / heads "
        "for these models)",
        source);
  c.head_dim = d.positive_int("head_dim");
  if (d.find("max_position_embeddings"))
    c.max_position_embeddings = d.positive_int("max_position_embeddings");
  if (const json* eps = d.find("rms_norm_eps")) {
    if (!eps->is_number() || !(eps->get<double>() > 0))
      fail("{}: field '{}': expected a positive number, found {}", source, d.name("rms_norm_eps"),
           shown(*eps));
    c.rms_norm_eps = eps->get<double>();
  }

  // tie_word_embeddings may sit at either level of the multimodal layout.
  {
    std::optional<bool> tie_text, tie_top;
    auto read_tie = [&](const json& obj, const char* where) -> std::optional<bool> {
      if (!obj.contains("tie_word_embeddings") || obj["tie_word_embeddings"].is_null())
        return std::nullopt;
      if (!obj["tie_word_embeddings"].is_boolean())
        fail("{}: field '{}': expected true or false, found {}", source, where,
             shown(obj["tie_word_embeddings"]));
      return obj["tie_word_embeddings"].get<bool>();
    };
    tie_top = read_tie(doc, "tie_word_embeddings");
    if (nested) tie_text = read_tie(d.text, "text_config.tie_word_embeddings");
    if (tie_top && tie_text && *tie_top != *tie_text)
      fail(
          "{}: fields 'tie_word_embeddings' ({}) and 'text_config.tie_word_embeddings' ({}) "
          "disagree",
          source, *tie_top, *tie_text);
    // note: Qwen3Config and Qwen3_5TextConfig default to untied embeddings.
    c.tie_word_embeddings = tie_text ? *tie_text : (tie_top ? *tie_top : false);
  }

  if (c.arch == Arch::kQwen3_5) {
    c.linear_num_key_heads = d.positive_int("linear_num_key_heads");
    c.linear_num_value_heads = d.positive_int("linear_num_value_heads");
    c.linear_key_head_dim = d.positive_int("linear_key_head_dim");
    c.linear_value_head_dim = d.positive_int("linear_value_head_dim");
    c.linear_conv_kernel = d.positive_int("linear_conv_kernel_dim");
    if (auto gate = d.optional_bool("attn_output_gate"); gate && !*gate)
      fail("{}: field '{}': false is not supported (Qwen3.5 attention has an output gate)", source,
           d.name("attn_output_gate"));
    c.attn_output_gate = true;
    c.norm_adds_one = true;
  }

  read_layer_plan(d, c);
  read_rope(d, c);

  c.eos_token_ids = token_ids(d.find("eos_token_id"), source, d.name("eos_token_id"));
  c.bos_token_id = single_token_id(d, "bos_token_id");
  c.pad_token_id = single_token_id(d, "pad_token_id");

  validate_model_config(c, source);
  return c;
}

ModelConfig load_hf_config(const std::string& path) {
  return parse_hf_config(load_json_file(path), path);
}

}  // namespace qtk
