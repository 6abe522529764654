#include "convert/inspect_pack.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdio>
#include <map>

#include "core/stdout_check.h"
#include "pack/pack.h"
#include "runtime/pack_load_check.h"

namespace qtk {

int inspect_pack(const std::string& path, bool verify, bool tensors) {
  const auto pack = Pack::open(path);
  const auto& m = pack->manifest();
  const ModelConfig& c = pack->config();
  std::string out;
  auto line = [&](const std::string& text) {
    out += text;
    out += '\n';
  };
  line(fmt::format("pack:          {}", path));
  line(fmt::format("format:        {} {} (written by {})", m.value("format", "?"),
                   m.value("version", "?"), m.value("tool_version", "?")));
  line(fmt::format("architecture:  {} ({})", c.hf_architecture, c.model_type));
  line(fmt::format("layers:        {}  plan {}", c.num_layers, c.plan_string()));
  line(fmt::format("sizes:         hidden {}, intermediate {}, vocab {}, heads {}/{} x {}",
                   c.hidden_size, c.intermediate_size, c.vocab_size, c.num_attention_heads,
                   c.num_kv_heads, c.head_dim));
  if (c.has_moe()) {
    std::vector<int64_t> dense;
    for (int64_t i = 0; i < c.num_layers; ++i)
      if (!c.is_moe_layer(i)) dense.push_back(i);
    line(fmt::format("experts:       {} x width {}, top-{}, {}, shared expert {}",
                     c.moe.num_experts, c.moe.expert_intermediate_size, c.moe.top_k,
                     c.moe.norm_topk_prob ? "renormalised" : "not renormalised",
                     c.moe.shared_expert_intermediate > 0
                         ? fmt::format("width {} (sigmoid gate)", c.moe.shared_expert_intermediate)
                         : std::string("none")));
    line(fmt::format("mlp plan:      {}  dense layers: {}", c.mlp_plan_string(),
                     dense.empty() ? "none" : fmt::format("{}", fmt::join(dense, ", "))));
  }
  if (c.linear_num_value_heads > 0)
    line(fmt::format("linear attn:   key heads {} x {}, value heads {} x {}, conv kernel {}",
                     c.linear_num_key_heads, c.linear_key_head_dim, c.linear_num_value_heads,
                     c.linear_value_head_dim, c.linear_conv_kernel));
  line(
      fmt::format("context:       {} positions (max_position_embeddings: a prompt plus its "
                  "output stops there)",
                  c.max_position_embeddings));
  line(fmt::format("rope:          theta {}, rotary dim {}, mrope section [{}]{}", c.rope.theta,
                   c.rope.rotary_dim, fmt::join(c.rope.mrope_section, ", "),
                   c.rope.mrope_interleaved ? " interleaved" : ""));
  for (const std::string& r : c.resolution) line(fmt::format("config:        {}", r));
  line(fmt::format("eos ids:       [{}]  tied embeddings: {}", fmt::join(c.eos_token_ids, ", "),
                   c.tie_word_embeddings ? "yes" : "no"));

  std::map<std::string, std::pair<size_t, uint64_t>> per_dtype;
  uint64_t total = 0;
  for (const auto& t : pack->tensors()) {
    auto& d = per_dtype[std::string(dtype_name(t.view.dtype))];
    d.first += 1;
    d.second += static_cast<uint64_t>(t.view.nbytes());
    total += static_cast<uint64_t>(t.view.nbytes());
  }
  line(fmt::format("tensors:       {} ({:.2f} MB)", pack->tensors().size(),
                   static_cast<double>(total) / 1e6));
  for (const auto& [name, d] : per_dtype)
    line(fmt::format("  {:<5} {:>5} tensors {:>14} bytes", name, d.first, d.second));
  std::string transforms;
  if (m.contains("transforms") && m["transforms"].is_array())
    for (const auto& t : m["transforms"])
      if (t.is_object() && t.contains("name"))
        transforms += (transforms.empty() ? "" : ", ") + t["name"].get<std::string>();
  line(fmt::format("transforms:    {}", transforms.empty() ? "none" : transforms));
  if (!pack->fp8_tensors().empty()) {
    // Block heights in use ("128 x 6, 64 x 2").
    std::map<int64_t, int, std::greater<>> heights;
    uint64_t scale_bytes = 0;
    for (const auto& q : pack->fp8_tensors()) {
      heights[q.block_rows] += 1;
      scale_bytes += static_cast<uint64_t>(q.scale.nbytes());
    }
    std::string h;
    for (const auto& [rows, n] : heights)
      h += fmt::format("{}{} rows x {}", h.empty() ? "" : ", ", rows, n);
    line(fmt::format(
        "fp8:           {} F8_E4M3 (e4m3fn) matrices with f32 block scales ({} bytes), block "
        "width {}, block heights: {}",
        pack->fp8_tensors().size(), scale_bytes, pack->fp8_tensors().front().block_cols, h));
  }
  line(fmt::format("tokenizer:     {}", pack->entry("tokenizer.json") ? "present" : "absent"));
  line(fmt::format("digest:        {}", pack->digest()));
  if (tensors) {
    std::map<std::string, const PackFp8Scales*> scales_of;
    for (const PackFp8Scales& q : pack->fp8_tensors()) scales_of[q.tensor] = &q;
    line("tensor list:   name, dtype, shape, bytes (FP8: its f32 block scales)");
    for (const auto& t : pack->tensors()) {
      std::string text = fmt::format("  {} {} {} {}", t.name, dtype_name(t.view.dtype),
                                     t.view.shape_string(), t.view.nbytes());
      if (const auto q = scales_of.find(t.name); q != scales_of.end())
        text += fmt::format("  scales {} {} of {} x {} blocks", q->second->scale_name,
                            q->second->scale.shape_string(), q->second->block_rows,
                            q->second->block_cols);
      line(text);
    }
  }
  write_stdout(out);
  if (verify) {
    // note: every check generate makes at load, not only the checksums: a
    // pack that passes --verify must load.
    const size_t n = check_pack_loads(*pack);
    write_stdout(fmt::format("verify: {} entries OK; the model loads as generate loads it\n", n));
  }
  // (inspect's main flushes stdout and reports a failed write)
  return 0;
}

}  // namespace qtk
