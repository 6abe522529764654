#include "convert/manifest.h"

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json.h"
#include "pack/pack.h"
#include "pack/pack_checksum.h"
#include "pack/pack_zip.h"

namespace qtk {

using nlohmann::json;

std::string build_manifest(const ManifestInputs& in) {
  const ModelConfig& c = *in.config;
  const auto& written = *in.written;
  const auto& tensors = in.plan->tensors;
  if (written.size() < tensors.size())
    fail("internal error: manifest has fewer entries than tensors");

  json m = json::object();
  m["format"] = kPackFormatName;
  m["version"] = fmt::format("{}.{}", kPackFormatMajor, kPackFormatMinor);
  m["tool_version"] = std::string("qtk ") + QTK_VERSION;
  m["checksum_algorithm"] = kChecksumAlgorithm;

  json files = json::array();
  for (const auto& f : in.source_files)
    files.push_back({{"name", f.name}, {"bytes", f.bytes}, {"xxh64", checksum_hex(f.xxh64)}});
  m["source"] = {{"architecture", c.hf_architecture},
                 {"model_type", c.model_type},
                 {"digest_algorithm", kChecksumAlgorithm},
                 {"files", files}};

  m["config"] = config_to_json(c);
  m["layer_plan"] = c.plan_string();
  m["rope"] = {{"theta", c.rope.theta},
               {"rotary_dim", c.rope.rotary_dim},
               {"partial_rotary_factor", c.rope.partial_factor},
               {"mrope_section", c.rope.mrope_section},
               {"mrope_interleaved", c.rope.mrope_interleaved},
               {"text_positions", c.rope.mrope_section.empty() ? "one position per token"
                                                               : "equal on all three axes"}};
  m["eos_token_ids"] = c.eos_token_ids;
  m["bos_token_id"] = c.bos_token_id >= 0 ? json(c.bos_token_id) : json(nullptr);
  json gen = json::object();
  if (in.max_new_tokens >= 0) gen["max_new_tokens"] = in.max_new_tokens;
  m["generation"] = gen;

  json tt = json::array();
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& t = tensors[i];
    const auto& w = written[i];
    if (w.name != tensor_entry_name(t.name) || w.size != t.nbytes())
      fail("internal error: entry {} is \"{}\" ({} bytes), expected tensor \"{}\" ({} bytes)", i,
           w.name, w.size, t.name, t.nbytes());
    tt.push_back({{"name", t.name},
                  {"dtype", std::string(dtype_name(t.dtype))},
                  {"shape", t.shape},
                  {"entry", w.name},
                  {"bytes", w.size},
                  {"checksum", checksum_hex(w.checksum)}});
  }
  m["tensors"] = tt;
  json ff = json::array();
  for (size_t i = tensors.size(); i < written.size(); ++i)
    ff.push_back({{"entry", written[i].name},
                  {"bytes", written[i].size},
                  {"checksum", checksum_hex(written[i].checksum)}});
  m["files"] = ff;

  json tr = json::array();
  for (const auto& t : in.plan->transforms)
    tr.push_back({{"name", t.name}, {"description", t.description}, {"tensors", t.tensors}});
  m["transforms"] = tr;
  if (!in.plan->quantized.empty()) {
    // note: which tensors are FP8 and how their scales are laid out; the
    // runtime reads "tensors" (Pack::fp8_scales), the rest says where they
    // came from and what is computed.
    json qt = json::array();
    for (const auto& q : in.plan->quantized)
      qt.push_back(
          {{"name", q.tensor}, {"scale", q.scale}, {"block", {q.block_rows, q.block_cols}}});
    m["quantization"] = {
        {"method", "fp8"},
        {"fmt", "e4m3"},
        {"source_weight_block_size", {in.plan->source_block_rows, in.plan->source_block_cols}},
        {"weights", "real weight = fp8 value x the float32 scale of its block"},
        {"tensors", qt}};
  }
  return json_file_text(m, 1) + "\n";
}

}  // namespace qtk
