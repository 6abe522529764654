// Fuzz entry: config.json (strict JSON, then the HF config parser), the
// pack manifest's config round trip, and generation_config.json parsing.
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json.h"
#include "loaders/generation_config.h"
#include "loaders/model_config.h"
#include "tests/fuzz/fuzz_entries.h"
#include "tests/fuzz/fuzz_util.h"

namespace qtk::fuzz {

int hf_config(const uint8_t* data, size_t size) {
  nlohmann::json doc;
  try {
    doc = parse_json_strict(as_text(data, size), "config.json");
  } catch (const Error&) {
    return 0;
  }
  try {
    (void)parse_generation_config(doc, "generation_config.json");
  } catch (const Error&) {
  }
  ModelConfig c;
  try {
    c = parse_hf_config(doc, "config.json");
  } catch (const Error&) {
    return 0;
  }
  // Accepted: the invariants every consumer relies on hold...
  try {
    validate_model_config(c, "config.json");
  } catch (const Error& e) {
    fuzz_check_failed(
        std::string("parse_hf_config accepted a config validate_model_config rejects: ") +
        e.what());
  }
  fuzz_check(static_cast<int64_t>(c.layer_plan.size()) == c.num_layers, "layer_plan length");
  fuzz_check(c.moe.mlp_plan.empty() == (c.moe.num_experts == 0), "mlp_plan without experts");
  fuzz_check(c.moe.mlp_plan.empty() || static_cast<int64_t>(c.moe.mlp_plan.size()) == c.num_layers,
             "mlp_plan length");
  // ...and the manifest round trip gives the same config back.
  const nlohmann::json j = config_to_json(c);
  ModelConfig back;
  try {
    back = config_from_json(j, "manifest.json");
  } catch (const Error& e) {
    fuzz_check_failed(std::string("manifest round trip rejected an accepted config: ") + e.what());
  }
  fuzz_check(config_to_json(back) == j, "manifest round trip changed the config");
  return 0;
}

}  // namespace qtk::fuzz
