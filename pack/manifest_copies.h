// The values a pack's manifest holds twice. convert writes the model config
// once under "config" (what the runtime reads) and copies some of its values
// at the top level ("layer_plan", "rope", "eos_token_ids", "bos_token_id",
// "source"), for readers that do not parse "config"; "generation" holds
// max_new_tokens read from the generation_config.json the pack carries,
// whose eos ids are also the config's. A pack whose copies disagree was
// edited or damaged, and which of the two values was meant cannot be told.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "loaders/model_config.h"

namespace qtk {

// Fails (qtk::Error naming `path`, both fields and both values) when a copy
// present in `manifest`, or in the pack's `generation_config` entry, differs
// from `config` (the manifest's "config", already read). An absent copy is
// not a disagreement.
void check_manifest_copies(const nlohmann::json& manifest, const ModelConfig& config,
                           std::optional<std::string_view> generation_config,
                           const std::string& path);

}  // namespace qtk
