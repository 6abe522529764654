#include "pack/manifest_copies.h"

#include <fmt/format.h>

#include "core/error.h"
#include "core/json.h"
#include "loaders/generation_config.h"

namespace qtk {

using nlohmann::json;

namespace {

// A value or "absent" (nullptr), for a message.
std::string shown(const json* v) { return v != nullptr ? shown_json(*v) : "absent"; }

// nullptr: the field is absent (the same on both sides is no disagreement).
void expect_same(const json* copy, const std::string& copy_field, const json* value,
                 const std::string& value_field, const std::string& where) {
  if (copy == nullptr ? value == nullptr : value != nullptr && *copy == *value) return;
  fail("{}: fields '{}' ({}) and '{}' ({}) disagree; expected the same value in both", where,
       copy_field, shown(copy), value_field, shown(value));
}

// `obj`[key], when `obj` is an object holding it.
const json* member(const json& obj, const char* key) {
  if (!obj.is_object()) return nullptr;
  auto it = obj.find(key);
  return it == obj.end() ? nullptr : &*it;
}

// A top-level section holding copies ("rope", "source"): an object when present.
const json* section(const json& m, const char* key, const std::string& where) {
  const json* s = member(m, key);
  if (s != nullptr && !s->is_object())
    fail("{}: field '{}': expected an object, found {}", where, key, shown_json(*s));
  return s;
}

struct Copy {
  const char* key;           // in the section
  json value;                // from the config
  const char* config_field;  // where the config keeps it
};

void check_section(const json* s, const std::string& name, const std::vector<Copy>& copies,
                   const std::string& where) {
  if (s == nullptr) return;
  for (const Copy& c : copies)
    if (const json* v = member(*s, c.key))
      expect_same(v, name.empty() ? c.key : name + "." + c.key, &c.value, c.config_field, where);
}

// generation_config.json's max_new_tokens is "generation"'s; its eos ids,
// when it names any, are the config's (they win over config.json's).
void check_generation(const json& m, const ModelConfig& c, std::string_view text,
                      const std::string& path, const std::string& where) {
  const std::string gwhere = path + ": generation_config.json";
  const GenerationConfig g = parse_generation_config(parse_json_strict(text, gwhere), gwhere);
  const json limit(g.max_new_tokens);
  const json* gen = section(m, "generation", where);
  expect_same(gen != nullptr ? member(*gen, "max_new_tokens") : nullptr,
              "generation.max_new_tokens", g.max_new_tokens >= 0 ? &limit : nullptr,
              "generation_config.json max_new_tokens", where);
  const json config_eos(c.eos_token_ids), file_eos(g.eos_token_ids);
  if (g.has_eos)
    expect_same(&config_eos, "config.eos_token_ids", &file_eos,
                "generation_config.json eos_token_id", where);
}

}  // namespace

void check_manifest_copies(const json& m, const ModelConfig& c,
                           std::optional<std::string_view> generation_config,
                           const std::string& path) {
  const std::string where = path + ": manifest.json";
  const json bos = c.bos_token_id >= 0 ? json(c.bos_token_id) : json(nullptr);
  check_section(&m, "",
                {{"layer_plan", c.plan_string(), "config.layer_plan"},
                 {"eos_token_ids", c.eos_token_ids, "config.eos_token_ids"},
                 {"bos_token_id", bos, "config.bos_token_id"}},
                where);
  check_section(section(m, "rope", where), "rope",
                {{"theta", c.rope.theta, "config.rope.theta"},
                 {"rotary_dim", c.rope.rotary_dim, "config.rope.rotary_dim"},
                 {"partial_rotary_factor", c.rope.partial_factor, "config.rope.partial_factor"},
                 {"mrope_section", c.rope.mrope_section, "config.rope.mrope_section"},
                 {"mrope_interleaved", c.rope.mrope_interleaved, "config.rope.mrope_interleaved"}},
                where);
  check_section(section(m, "source", where), "source",
                {{"architecture", c.hf_architecture, "config.hf_architecture"},
                 {"model_type", c.model_type, "config.model_type"}},
                where);
  if (generation_config) check_generation(m, c, *generation_config, path, where);
}

}  // namespace qtk
