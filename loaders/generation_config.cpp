#include "loaders/generation_config.h"

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json.h"

namespace qtk {

using nlohmann::json;

namespace {

// An id field: integer >= 0, a list of them, or null / absent.
std::vector<int64_t> ids(const json& doc, const char* field, const std::string& source) {
  std::vector<int64_t> out;
  if (!doc.contains(field) || doc[field].is_null()) return out;
  const json& v = doc[field];
  auto one = [&](const json& x) {
    if (!x.is_number_integer() || x.get<int64_t>() < 0)
      fail("{}: field '{}': expected a token id (integer >= 0), a list of them or null, found {}",
           source, field, v.dump());
    out.push_back(x.get<int64_t>());
  };
  if (v.is_array()) {
    for (const json& x : v) one(x);
  } else {
    one(v);
  }
  return out;
}

int64_t single(const json& doc, const char* field, const std::string& source) {
  const auto v = ids(doc, field, source);
  if (v.size() > 1)
    fail("{}: field '{}': expected one token id, found {}", source, field, v.size());
  return v.empty() ? -1 : v[0];
}

int64_t limit(const json& doc, const char* field, const std::string& source) {
  if (!doc.contains(field) || doc[field].is_null()) return -1;
  const json& v = doc[field];
  if (!v.is_number_integer() || v.get<int64_t>() <= 0)
    fail("{}: field '{}': expected a positive integer, found {}", source, field, v.dump());
  return v.get<int64_t>();
}

}  // namespace

GenerationConfig parse_generation_config(const json& doc, const std::string& source) {
  if (!doc.is_object()) fail("{}: expected a JSON object, found {}", source, doc.type_name());
  GenerationConfig g;
  g.has_eos = doc.contains("eos_token_id") && !doc["eos_token_id"].is_null();
  g.eos_token_ids = ids(doc, "eos_token_id", source);
  g.bos_token_id = single(doc, "bos_token_id", source);
  g.pad_token_id = single(doc, "pad_token_id", source);
  g.max_new_tokens = limit(doc, "max_new_tokens", source);
  g.max_length = limit(doc, "max_length", source);
  return g;
}

GenerationConfig load_generation_config(const std::string& path) {
  return parse_generation_config(load_json_file(path), path);
}

}  // namespace qtk
