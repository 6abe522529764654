// generation_config.json: the ids and limits Hugging Face uses when
// generating. Optional; a checkpoint's eos ids come from here when this file
// names them, else from config.json.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace qtk {

struct GenerationConfig {
  bool has_eos = false;                // eos_token_id present and not null
  std::vector<int64_t> eos_token_ids;  // int or list in the file
  int64_t bos_token_id = -1;           // -1 when absent or null
  int64_t pad_token_id = -1;
  int64_t max_new_tokens = -1;  // -1 when absent
  int64_t max_length = -1;
};

// `source` names the file in messages. Throws qtk::Error naming the field.
GenerationConfig parse_generation_config(const nlohmann::json& doc, const std::string& source);
GenerationConfig load_generation_config(const std::string& path);

}  // namespace qtk
