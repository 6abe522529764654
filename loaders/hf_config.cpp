// parse_hf_config: Hugging Face config.json -> ModelConfig.
//
// Where each value comes from, exactly as transformers 5.17 reads a saved
// config (PreTrainedConfig.__post_init__, RotaryEmbeddingConfigMixin and the
// Qwen3 / Qwen3.5 config and rotary classes). One rule per field; each
// function below that applies a rule names it. Where a value is found in
// more than one place, ModelConfig::resolution says which was used and
// which was ignored (`inspect` prints it).
//
//  R1 text fields        Multimodal layout (*ForConditionalGeneration):
//                        every text-model field comes from text_config; a
//                        top-level field of the same name is ignored
//                        (transformers builds the text model from
//                        text_config alone). Token ids (eos/bos/pad) fall
//                        back to the top level: they do not change the
//                        forward pass.
//  R2 RoPE dict          `rope_scaling` (4.x name), when a non-empty object,
//                        replaces `rope_parameters` wholesale; else
//                        `rope_parameters`; else {}.
//  R3 rope_theta         the RoPE dict's value; else the top-level
//                        `rope_theta`; else 10000 (the mixin's default_theta).
//  R4 partial_rotary_    the RoPE dict's value; else the top-level field;
//     factor             else 0.25 for Qwen3.5 (Qwen3_5TextConfig's default)
//                        and 1.0 for Qwen3. rotary_dim = int(head_dim *
//                        factor), truncated as Python's int() does.
//  R5 mrope_section      Qwen3.5: the RoPE dict's value, else [11, 11, 10]
//                        (the rotary class's default); a top-level field is
//                        ignored. Qwen3 has no M-RoPE: ignored.
//  R6 mrope_interleaved  ignored: Qwen3.5's rotary embedding always
//                        interleaves (recomposition_frequencies); recorded
//                        as interleaved.
//  R7 rope_type          "default" (or absent) only; any other type changes
//                        the frequencies and is refused.
//  R8 head_dim           the field; absent: the class default (128 for
//                        Qwen3, 256 for Qwen3.5), never hidden_size / heads.
//  R9 tie_word_          multimodal layout: text_config's or the top level's,
//     embeddings         whichever is given; both given and different is
//                        refused as ambiguous (which one ties the weights
//                        has changed between transformers versions).
//                        Absent: false (both classes' default).
#include <cmath>
#include <optional>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json.h"
#include "loaders/model_config.h"

namespace qtk {

using nlohmann::json;

namespace {

// Where the text model's fields live: `text` is text_config for the
// multimodal layout, else the top-level object.
struct ConfigDoc {
  const json& top;
  const json& text;
  std::string source;
  bool nested;

  // The text model's field (R1: text_config only in the multimodal layout);
  // nullptr if absent.
  const json* find(const char* field) const {
    return text.contains(field) ? &text[field] : nullptr;
  }
  // A token id field: text_config first, then the top level (R1).
  const json* find_token_ids(const char* field) const {
    if (text.contains(field)) return &text[field];
    if (nested && top.contains(field)) return &top[field];
    return nullptr;
  }
  // A text-model field's name for messages: "text_config.hidden_size" in
  // the multimodal layout (R1: read there only, also when it is missing),
  // else "hidden_size".
  std::string name(const char* field) const {
    return nested ? fmt::format("text_config.{}", field) : field;
  }
  // A token id field's name: where find_token_ids found it (text_config
  // first, then the top level).
  std::string token_id_name(const char* field) const {
    return nested && !text.contains(field) && top.contains(field) ? std::string(field)
                                                                  : name(field);
  }

  // note: sizes above 2^40 are refused: a product of two of them (a
  // tensor's element count) must stay far from int64 overflow.
  static constexpr uint64_t kMaxSize = uint64_t{1} << 40;
  int64_t positive_int(const char* field) const {
    const json* v = find(field);
    if (!v) fail("{}: missing field '{}' (expected a positive integer)", source, name(field));
    const bool positive = v->is_number_unsigned() ? v->get<uint64_t>() > 0
                                                  : v->is_number_integer() && v->get<int64_t>() > 0;
    if (!positive)
      fail("{}: field '{}': expected a positive integer, found {}", source, name(field),
           shown_json(*v));
    const uint64_t n =
        v->is_number_unsigned() ? v->get<uint64_t>() : static_cast<uint64_t>(v->get<int64_t>());
    if (n > kMaxSize)
      fail("{}: field '{}': expected a positive integer of at most 2^40 = {}, found {}", source,
           name(field), kMaxSize, shown_json(*v));
    return v->get<int64_t>();
  }
  std::optional<bool> optional_bool(const char* field) const {
    const json* v = find(field);
    if (!v || v->is_null()) return std::nullopt;
    if (!v->is_boolean())
      fail("{}: field '{}': expected true or false, found {}", source, name(field), shown_json(*v));
    return v->get<bool>();
  }
  // A number field of the text model (R1), absent or null: nullopt.
  std::optional<double> optional_text_number(const char* field) const {
    const json* v = find(field);
    if (!v || v->is_null()) return std::nullopt;
    if (!v->is_number())
      fail("{}: field '{}': expected a number, found {}", source, name(field), shown_json(*v));
    return v->get<double>();
  }
  std::optional<double> optional_number(const json& obj, const char* field,
                                        const std::string& shown_name) const {
    if (!obj.contains(field) || obj[field].is_null()) return std::nullopt;
    const json& v = obj[field];
    if (!v.is_number())
      fail("{}: field '{}': expected a number, found {}", source, shown_name, shown_json(v));
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
           source, field, shown_json(*v));
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
  const auto ids = token_ids(d.find_token_ids(field), d.source, d.token_id_name(field));
  if (ids.size() > 1)
    fail("{}: field '{}': expected one token id, found {}", d.source, d.token_id_name(field),
         ids.size());
  return ids.empty() ? -1 : ids[0];
}

void reject_unsupported(const ConfigDoc& d, bool moe_architecture) {
  if (auto bias = d.optional_bool("attention_bias"); bias && *bias)
    fail("{}: field '{}': attention_bias true is not supported (expected false)", d.source,
         d.name("attention_bias"));
  if (auto sw = d.optional_bool("use_sliding_window"); sw && *sw) {
    const json* w = d.find("sliding_window");
    fail(
        "{}: field '{}': an active sliding window is not supported (use_sliding_window true, "
        "sliding_window {})",
        d.source, d.name("use_sliding_window"), w ? shown_json(*w) : "absent");
  }
  if (const json* act = d.find("hidden_act"); act && !(act->is_string() && *act == "silu"))
    fail("{}: field '{}': expected \"silu\", found {}", d.source, d.name("hidden_act"),
         shown_json(*act));
  if (!moe_architecture) {
    for (const char* moe : {"num_experts", "num_local_experts", "n_routed_experts",
                            "num_experts_per_tok", "moe_intermediate_size"}) {
      const json* v = d.find(moe);
      if (v && !v->is_null() && !(v->is_number() && v->get<double>() == 0))
        fail(
            "{}: field '{}': mixture-of-experts models are not supported for {}, found {} "
            "(expected Qwen3MoeForCausalLM or a Qwen3_5Moe architecture)",
            d.source, d.name(moe), d.top["architectures"][0].get<std::string>(), shown_json(*v));
    }
  }
}

// Where two JSON objects first differ, for a message that shows both: " (at
// key 'fmt': "e4m3" vs absent)"; "" when they are not both objects.
// note: shown_json cuts a long value, which can hide the difference.
std::string first_difference(const json& a, const json& b) {
  if (!a.is_object() || !b.is_object()) return "";
  const auto shown = [](const json& o, const std::string& k) {
    return o.contains(k) ? shown_json(o[k]) : std::string("absent");
  };
  std::set<std::string> keys;
  for (const auto& [k, v] : a.items()) keys.insert(k);
  for (const auto& [k, v] : b.items()) keys.insert(k);
  for (const std::string& k : keys) {
    if (!a.contains(k) || !b.contains(k) || a[k] != b[k])
      return fmt::format(" (at key '{}': {} vs {})", k, shown(a, k), shown(b, k));
  }
  return "";
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
      fail(
          "{}: fields 'quantization_config' ({}) and 'text_config.quantization_config' ({}) "
          "disagree{}",
          d.source, shown_json(*q), shown_json((*obj)["quantization_config"]),
          first_difference(*q, (*obj)["quantization_config"]));
    q = &(*obj)["quantization_config"];
    where = name;
  }
  if (!q) return;
  if (!q->is_object())
    fail("{}: field '{}': expected an object, found {}", d.source, where, shown_json(*q));
  if (!q->contains("quant_method") || !(*q)["quant_method"].is_string())
    fail("{}: field '{}.quant_method': expected a string (\"fp8\"), found {}", d.source, where,
         q->contains("quant_method") ? shown_json((*q)["quant_method"]) : "nothing");
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
         shown_json((*q)["fmt"]));
  c.fp8.activation_scheme = "dynamic";
  if (q->contains("activation_scheme") && !(*q)["activation_scheme"].is_null()) {
    const json& a = (*q)["activation_scheme"];
    if (a != "dynamic")
      fail(
          "{}: field '{}.activation_scheme': not supported: expected \"dynamic\" (static "
          "activation scales are not read), found {}",
          d.source, where, shown_json(a));
    c.fp8.activation_scheme = a.get<std::string>();
  }
  c.fp8.block_rows = c.fp8.block_cols = 128;
  if (q->contains("weight_block_size") && !(*q)["weight_block_size"].is_null()) {
    const json& b = (*q)["weight_block_size"];
    if (b != json::array({128, 128}))
      fail("{}: field '{}.weight_block_size': not supported: expected [128, 128], found {}",
           d.source, where, shown_json(b));
  }
  if (q->contains("modules_to_not_convert") && !(*q)["modules_to_not_convert"].is_null()) {
    const json& m = (*q)["modules_to_not_convert"];
    if (!m.is_array())
      fail("{}: field '{}.modules_to_not_convert': expected a list of names, found {}", d.source,
           where, shown_json(m));
    for (const json& x : m) {
      if (!x.is_string())
        fail("{}: field '{}.modules_to_not_convert': expected a list of names, found {}", d.source,
             where, shown_json(m));
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
           d.name("layer_types"), shown_json(*types));
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
             shown_json(t));
      }
    }
    return;
  }
  if (c.arch == Arch::kQwen3) {
    c.layer_plan.assign(static_cast<size_t>(c.num_layers), LayerKind::kFull);
    return;
  }
  if (!d.find("full_attention_interval"))
    fail("{}: missing field '{}' (or '{}') for {}", d.source, d.name("layer_types"),
         d.name("full_attention_interval"), c.hf_architecture);
  const int64_t interval = d.positive_int("full_attention_interval");
  // note: transformers' rule: layer i is full attention when (i + 1) % interval == 0.
  for (int64_t i = 0; i < c.num_layers; ++i)
    c.layer_plan.push_back((i + 1) % interval == 0 ? LayerKind::kFull : LayerKind::kLinear);
}

// Mixture-of-experts fields of Qwen3MoeForCausalLM and the Qwen3_5Moe
// classes, and which layers are MoE.
void read_moe(const ConfigDoc& d, ModelConfig& c) {
  MoeConfig& m = c.moe;
  // note: transformers 5.x writes Qwen3-MoE's expert count as
  // num_local_experts, the Hub's files say num_experts: either is read, and
  // both must agree when both are given.
  const json* ne = d.find("num_experts");
  const json* nl = d.find("num_local_experts");
  if (ne && ne->is_null()) ne = nullptr;
  if (nl && nl->is_null()) nl = nullptr;
  if (!ne && !nl)
    fail("{}: missing field '{}' (or '{}') for {}", d.source, d.name("num_experts"),
         d.name("num_local_experts"), c.hf_architecture);
  if (ne) {
    m.num_experts = d.positive_int("num_experts");
    m.num_experts_field = d.name("num_experts");
  }
  if (nl) {
    const int64_t local = d.positive_int("num_local_experts");
    if (ne && local != m.num_experts)
      fail("{}: fields '{}' ({}) and '{}' ({}) disagree", d.source, d.name("num_experts"),
           m.num_experts, d.name("num_local_experts"), local);
    m.num_experts = local;
    if (!ne) m.num_experts_field = d.name("num_local_experts");
  }
  m.top_k = d.positive_int("num_experts_per_tok");
  if (m.top_k > m.num_experts)
    fail("{}: field '{}': expected at most num_experts = {}, found {}", d.source,
         d.name("num_experts_per_tok"), m.num_experts, m.top_k);
  m.expert_intermediate_size = d.positive_int("moe_intermediate_size");

  if (c.arch == Arch::kQwen3_5) {
    // note: Qwen3_5MoeSparseMoeBlock always divides the top-k weights by
    // their sum and has no norm_topk_prob, decoder_sparse_step or
    // mlp_only_layers: every layer is MoE, with a shared expert.
    m.norm_topk_prob = true;
    m.shared_expert_intermediate = d.positive_int("shared_expert_intermediate_size");
    m.mlp_plan.assign(static_cast<size_t>(c.num_layers), MlpKind::kMoe);
    // note: said, since a checkpoint that sets them expects an effect.
    for (const char* field : {"norm_topk_prob", "decoder_sparse_step", "mlp_only_layers"})
      if (const json* v = d.find(field); v && !v->is_null())
        c.resolution.push_back(fmt::format(
            "'{}' ({}) ignored ({} has no such switch: every layer is MoE and the top-k "
            "weights are always renormalised)",
            d.name(field), shown_json(*v), c.hf_architecture));
    return;
  }
  // Qwen3-MoE: Qwen3MoeConfig defaults norm_topk_prob false, step 1, no dense layers.
  const std::optional<bool> norm = d.optional_bool("norm_topk_prob");
  m.norm_topk_prob = norm.value_or(false);
  if (!norm)
    c.resolution.push_back(
        "norm_topk_prob: absent, false used (Qwen3MoeConfig's default: the top-k weights are "
        "not renormalised; the Qwen3-MoE releases set true)");
  int64_t step = 1;
  if (const json* v = d.find("decoder_sparse_step"); v && !v->is_null())
    step = d.positive_int("decoder_sparse_step");
  else
    c.resolution.push_back("decoder_sparse_step: absent, 1 used (Qwen3MoeConfig's default)");
  std::vector<bool> dense(static_cast<size_t>(c.num_layers), false);
  if (const json* v = d.find("mlp_only_layers"); v && !v->is_null()) {
    if (!v->is_array())
      fail("{}: field '{}': expected a list of layer indices, found {}", d.source,
           d.name("mlp_only_layers"), shown_json(*v));
    for (const json& x : *v) {
      if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() >= c.num_layers)
        fail("{}: field '{}': expected layer indices in [0, {}), found {}", d.source,
             d.name("mlp_only_layers"), c.num_layers, shown_json(x));
      dense[static_cast<size_t>(x.get<int64_t>())] = true;
    }
  }
  // note: transformers' rule (Qwen3MoeDecoderLayer): layer i is MoE when it
  // is not in mlp_only_layers and (i + 1) % decoder_sparse_step == 0.
  for (int64_t i = 0; i < c.num_layers; ++i)
    m.mlp_plan.push_back(!dense[static_cast<size_t>(i)] && (i + 1) % step == 0 ? MlpKind::kMoe
                                                                               : MlpKind::kDense);
  // note: a plan with no MoE layer at all is still a Qwen3-MoE model
  // (transformers builds it); it runs as dense layers only.
}

std::string number_text(double v) { return fmt::format("{}", v); }

// R2, R7: the RoPE parameter object transformers keeps, and its name.
std::pair<const json*, std::string> rope_dict(const ConfigDoc& d, ModelConfig& c) {
  const json* params = d.find("rope_parameters");
  const json* scaling = d.find("rope_scaling");
  for (const auto& [obj, field] :
       {std::pair{params, "rope_parameters"}, {scaling, "rope_scaling"}}) {
    if (obj && !obj->is_null() && !obj->is_object())
      fail("{}: field '{}': expected an object or null, found {}", d.source, d.name(field),
           shown_json(*obj));
  }
  const bool use_scaling = scaling && scaling->is_object() && !scaling->empty();
  const json* dict = use_scaling ? scaling : (params && params->is_object() ? params : nullptr);
  const std::string name = d.name(use_scaling ? "rope_scaling" : "rope_parameters");
  if (use_scaling && params && params->is_object() && !params->empty() && *params != *scaling)
    c.resolution.push_back(
        fmt::format("{} used; {} ignored (transformers lets the 4.x rope_scaling replace it)", name,
                    d.name("rope_parameters")));
  if (dict) {
    for (const char* type_key : {"rope_type", "type"}) {
      if (!dict->contains(type_key)) continue;
      const json& t = (*dict)[type_key];
      if (t != "default")
        fail("{}: field '{}.{}': only \"default\" RoPE is supported, found {}", d.source, name,
             type_key, shown_json(t));
    }
  }
  return {dict, name};
}

// R3, R4: a number from the RoPE dict, else the top level, else `fallback`;
// records a disagreeing duplicate as ignored. `from` gets the field's name as
// it is in the file ("rope_parameters.rope_theta", "rope_theta"), for
// messages about the value.
double rope_number(const ConfigDoc& d, ModelConfig& c, const json* dict,
                   const std::string& dict_name, const char* field, double fallback,
                   const char* fallback_why, std::string& from) {
  from = d.name(field);
  const auto top = d.optional_text_number(field);
  std::optional<double> in_dict;
  if (dict && dict->contains(field) && !(*dict)[field].is_null()) {
    const json& v = (*dict)[field];
    if (!v.is_number())
      fail("{}: field '{}.{}': expected a number, found {}", d.source, dict_name, field,
           shown_json(v));
    in_dict = v.get<double>();
  }
  if (in_dict) {
    from = fmt::format("{}.{}", dict_name, field);
    if (top && *top != *in_dict)
      c.resolution.push_back(fmt::format("{}: {} from {} ('{}' {} ignored)", field,
                                         number_text(*in_dict), dict_name, d.name(field),
                                         number_text(*top)));
    return *in_dict;
  }
  if (top) return *top;
  c.resolution.push_back(
      fmt::format("{}: absent, {} used ({})", field, number_text(fallback), fallback_why));
  return fallback;
}

void read_rope(const ConfigDoc& d, ModelConfig& c) {
  const auto [dict, dict_name] = rope_dict(d, c);

  std::string from;
  c.rope.theta = rope_number(d, c, dict, dict_name, "rope_theta", 10000.0,
                             "transformers' default_theta", from);
  if (!(c.rope.theta > 0) || !std::isfinite(c.rope.theta))
    fail("{}: field '{}': expected a positive number, found {}", d.source, from, c.rope.theta);

  const bool qwen35 = c.arch == Arch::kQwen3_5;
  c.rope.partial_factor =
      rope_number(d, c, dict, dict_name, "partial_rotary_factor", qwen35 ? 0.25 : 1.0,
                  qwen35 ? "Qwen3_5TextConfig's default" : "full rotary, as Qwen3 computes", from);
  if (!(c.rope.partial_factor > 0 && c.rope.partial_factor <= 1))
    fail("{}: field '{}': expected a number in (0, 1], found {}", d.source, from,
         c.rope.partial_factor);
  // note: transformers takes int(head_dim * partial_rotary_factor): the
  // product in double precision, truncated (an odd result is refused by
  // validate_model_config: rotate_half needs pairs).
  c.rope.rotary_dim = static_cast<int64_t>(static_cast<double>(c.head_dim) * c.rope.partial_factor);

  // R5, R6: M-RoPE.
  const json* section =
      dict && dict->contains("mrope_section") && !(*dict)["mrope_section"].is_null()
          ? &(*dict)["mrope_section"]
          : nullptr;
  const std::string section_name = dict_name + ".mrope_section";
  if (const json* top = d.find("mrope_section"); top && !top->is_null())
    c.resolution.push_back(fmt::format("'{}' ignored (transformers reads {} only)",
                                       d.name("mrope_section"), section_name));
  if (!qwen35) {
    if (section)
      c.resolution.push_back(
          fmt::format("'{}' ignored ({} has no M-RoPE)", section_name, c.hf_architecture));
    return;
  }
  if (section) {
    if (!section->is_array() || section->size() != 3)
      fail("{}: field '{}': expected 3 integers (temporal, height, width), found {}", d.source,
           section_name, shown_json(*section));
    for (const json& x : *section) {
      if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() > (1 << 20))
        fail("{}: field '{}': expected 3 integers in [0, 2^20 = 1048576], found {}", d.source,
             section_name, shown_json(*section));
      c.rope.mrope_section.push_back(x.get<int64_t>());
    }
  } else {
    c.rope.mrope_section = {11, 11, 10};
    c.resolution.push_back(
        fmt::format("mrope_section: absent, [11, 11, 10] used (Qwen3.5's rotary default)"));
  }
  c.rope.mrope_interleaved = true;
  for (const json* obj : {dict, d.find("mrope_interleaved") ? &d.text : nullptr}) {
    if (!obj || !obj->contains("mrope_interleaved")) continue;
    const json& v = (*obj)["mrope_interleaved"];
    if (v != true)
      c.resolution.push_back(fmt::format(
          "mrope_interleaved {} ignored (Qwen3.5's rotary embedding always interleaves)",
          shown_json(v)));
  }
}

}  // namespace

ModelConfig parse_hf_config(const json& doc, const std::string& source) {
  if (!doc.is_object()) fail("{}: expected a JSON object, found {}", source, doc.type_name());
  ModelConfig c;
  const json* archs = doc.contains("architectures") ? &doc["architectures"] : nullptr;
  if (!archs || !archs->is_array() || archs->size() != 1 || !(*archs)[0].is_string())
    fail("{}: field 'architectures': expected a list with one architecture name, found {}", source,
         archs ? shown_json(*archs) : "nothing");
  c.hf_architecture = (*archs)[0].get<std::string>();
  bool nested = false;
  bool moe = false;  // a mixture-of-experts class
  if (c.hf_architecture == "Qwen3ForCausalLM") {
    c.arch = Arch::kQwen3;
  } else if (c.hf_architecture == "Qwen3_5ForCausalLM") {
    c.arch = Arch::kQwen3_5;
  } else if (c.hf_architecture == "Qwen3_5ForConditionalGeneration") {
    c.arch = Arch::kQwen3_5;
    nested = true;
  } else if (c.hf_architecture == "Qwen3MoeForCausalLM") {
    c.arch = Arch::kQwen3;
    moe = true;
  } else if (c.hf_architecture == "Qwen3_5MoeForCausalLM") {
    c.arch = Arch::kQwen3_5;
    moe = true;
  } else if (c.hf_architecture == "Qwen3_5MoeForConditionalGeneration") {
    c.arch = Arch::kQwen3_5;
    nested = true;
    moe = true;
  } else {
    fail(
        "{}: field 'architectures': expected Qwen3ForCausalLM, Qwen3_5ForCausalLM, "
        "Qwen3_5ForConditionalGeneration, Qwen3MoeForCausalLM, Qwen3_5MoeForCausalLM or "
        "Qwen3_5MoeForConditionalGeneration, found \"{}\"",
        source, c.hf_architecture);
  }
  if (nested && !(doc.contains("text_config") && doc["text_config"].is_object()))
    fail("{}: field 'text_config': expected an object for {}, found {}", source, c.hf_architecture,
         doc.contains("text_config") ? shown_json(doc["text_config"]) : "nothing");
  const ConfigDoc d{doc, nested ? doc["text_config"] : doc, source, nested};

  if (const json* mt = d.find("model_type"); mt && mt->is_string()) c.model_type = *mt;
  reject_unsupported(d, moe);
  read_fp8_quantization(d, c);

  c.vocab_size = d.positive_int("vocab_size");
  c.hidden_size = d.positive_int("hidden_size");
  c.num_layers = d.positive_int("num_hidden_layers");
  // note: every reader builds per-layer tables from this count before it
  // meets the tensors; a damaged or huge value (10^9) would exhaust memory
  // first. The largest Qwen3 / Qwen3.5 models have 94 layers.
  constexpr int64_t kMaxLayers = 65536;
  if (c.num_layers > kMaxLayers)
    fail("{}: field '{}': expected at most {} layers, found {}", d.source,
         d.name("num_hidden_layers"), kMaxLayers, c.num_layers);
  // note: an MoE config may omit intermediate_size (Qwen3.5-MoE has no dense
  // MLP); validate_model_config requires it when a layer is dense.
  if (const json* v = d.find("intermediate_size"); !moe || (v && !v->is_null()))
    c.intermediate_size = d.positive_int("intermediate_size");
  c.num_attention_heads = d.positive_int("num_attention_heads");
  c.num_kv_heads = d.find("num_key_value_heads") && !d.find("num_key_value_heads")->is_null()
                       ? d.positive_int("num_key_value_heads")
                       : c.num_attention_heads;
  if (const json* hd = d.find("head_dim"); hd && !hd->is_null()) {
    c.head_dim = d.positive_int("head_dim");
  } else {
    // R8: transformers uses the config class's default, not hidden_size / heads.
    c.head_dim = c.arch == Arch::kQwen3_5 ? 256 : 128;
    c.resolution.push_back(fmt::format(
        "head_dim: absent, {} used ({}'s default; hidden_size / num_attention_heads would be {})",
        c.head_dim, c.arch == Arch::kQwen3_5 ? "Qwen3_5TextConfig" : "Qwen3Config",
        c.hidden_size / c.num_attention_heads));
  }
  if (d.find("max_position_embeddings"))
    c.max_position_embeddings = d.positive_int("max_position_embeddings");
  if (const json* eps = d.find("rms_norm_eps")) {
    if (!eps->is_number() || !(eps->get<double>() > 0))
      fail("{}: field '{}': expected a positive number, found {}", source, d.name("rms_norm_eps"),
           shown_json(*eps));
    c.rms_norm_eps = eps->get<double>();
  }

  // R9: tie_word_embeddings may sit at either level of the multimodal layout.
  {
    std::optional<bool> tie_text, tie_top;
    auto read_tie = [&](const json& obj, const char* where) -> std::optional<bool> {
      if (!obj.contains("tie_word_embeddings") || obj["tie_word_embeddings"].is_null())
        return std::nullopt;
      if (!obj["tie_word_embeddings"].is_boolean())
        fail("{}: field '{}': expected true or false, found {}", source, where,
             shown_json(obj["tie_word_embeddings"]));
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
  if (moe) read_moe(d, c);
  read_rope(d, c);

  c.eos_token_ids =
      token_ids(d.find_token_ids("eos_token_id"), source, d.token_id_name("eos_token_id"));
  c.bos_token_id = single_token_id(d, "bos_token_id");
  c.pad_token_id = single_token_id(d, "pad_token_id");

  validate_model_config(c, source, d.name(""));
  return c;
}

ModelConfig load_hf_config(const std::string& path) {
  return parse_hf_config(load_json_file(path), path);
}

}  // namespace qtk
