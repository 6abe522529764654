#include "runtime/models/qwen3_5.h"

#include <string>

#include "core/error.h"
#include "pack/pack.h"
#include "runtime/models/weight_binder.h"

namespace qtk {

Qwen3_5::Qwen3_5(WeightBinder& w) : cfg_(w.config()) {
  const ModelConfig& c = cfg_;
  const std::string& path = w.pack().path();
  if (c.arch != Arch::kQwen3_5) fail("{}: Qwen3.5 model built from a non-Qwen3.5 pack", path);
  if (static_cast<int64_t>(c.layer_plan.size()) != c.num_layers)
    fail("{}: config layer_plan has {} entries; expected num_layers = {}", path,
         c.layer_plan.size(), c.num_layers);
  if (!c.rope.mrope_section.empty() && c.rope.mrope_section.size() != 3)
    fail("{}: config rope mrope_section has {} entries; expected 3", path,
         c.rope.mrope_section.size());
  // note: the runtime computes x * rsqrt(..) * w; convert folds Qwen3.5's
  // (1 + w) into the stored norm weights and records it.
  if (c.norm_adds_one && !w.pack().has_transform("norm_plus_one_folded"))
    fail(
        "{}: Qwen3.5 pack without the 'norm_plus_one_folded' transform; this runtime computes "
        "x * rsqrt(..) * w and needs the norms stored as 1 + w (re-run convert)",
        path);
  const int64_t H = c.hidden_size, D = c.head_dim;
  const int64_t Hv = c.linear_num_value_heads, Dv = c.linear_value_head_dim;
  const int64_t qkvz = c.linear_conv_dim() + c.linear_value_dim();
  embed_tokens_ = w.matrix("embed_tokens", c.vocab_size, H, MatrixUse::kEmbedding);
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string p = "layers." + std::to_string(i) + ".";
    Qwen3_5Layer l;
    l.kind = c.layer_plan[i];
    l.input_layernorm = w.vector(p + "input_layernorm", H);
    if (l.kind == LayerKind::kFull) {
      l.in_proj[0] = w.matrix(p + "self_attn.qkv_proj", 2 * c.q_dim() + 2 * c.kv_dim(), H);
      l.self_attn.cache_layer = attention_layers_++;
      l.self_attn.gated = true;
      l.self_attn.q_norm = w.vector(p + "self_attn.q_norm", D);
      l.self_attn.k_norm = w.vector(p + "self_attn.k_norm", D);
      l.self_attn.o_proj = w.matrix(p + "self_attn.o_proj", H, c.q_dim());
    } else {
      if (w.has(p + "linear_attn.in_proj_ba")) {
        l.in_proj[0] = w.matrix(p + "linear_attn.in_proj", qkvz, H);
        l.in_proj[1] = w.matrix(p + "linear_attn.in_proj_ba", 2 * Hv, H);
        l.n_in_proj = 2;
      } else {
        l.in_proj[0] = w.matrix(p + "linear_attn.in_proj", qkvz + 2 * Hv, H);
      }
      DeltaNetLayer& g = l.linear_attn;
      g.state_layer = delta_net_layers_++;
      g.conv1d = w.table(p + "linear_attn.conv1d", c.linear_conv_dim(), c.linear_conv_kernel);
      g.dt_bias = w.vector(p + "linear_attn.dt_bias", Hv);
      g.A = w.vector(p + "linear_attn.A", Hv);
      g.norm = w.vector(p + "linear_attn.norm", Dv);
      g.out_proj = w.matrix(p + "linear_attn.out_proj", H, c.linear_value_dim());
    }
    l.post_attention_layernorm = w.vector(p + "post_attention_layernorm", H);
    l.mlp = bind_feed_forward(w, i, p);
    layers_.push_back(l);
  }
  norm_ = w.vector("norm", H);
  lm_head_ = w.matrix(w.has("lm_head") ? "lm_head" : "embed_tokens", c.vocab_size, H);
}

// note: partial rotary (head_dim * partial_rotary_factor dims) with M-RoPE:
// the rotary pairs split into (temporal, height, width) sections; Qwen3.5
// always interleaves them (config rule R6, loaders/hf_config.cpp).
RopeSpec Qwen3_5::rope() const {
  RopeSpec r;
  r.rotary_dim = cfg_.rope.rotary_dim > 0 ? cfg_.rope.rotary_dim : cfg_.head_dim;
  r.theta = cfg_.rope.theta;
  r.mrope_section = cfg_.rope.mrope_section;
  r.mrope_interleaved = cfg_.rope.mrope_interleaved;
  return r;
}

void Qwen3_5::forward(Blocks& b) const {
  b.embed(embed_tokens_);
  for (size_t i = 0; i < layers_.size(); ++i) {
    const Qwen3_5Layer& l = layers_[i];
    // x = x + token_mixer(input_layernorm(x))
    b.norm_project(l.input_layernorm, {l.in_proj, static_cast<size_t>(l.n_in_proj)});
    if (l.kind == LayerKind::kFull)
      b.attention(l.self_attn);
    else
      b.delta_net(l.linear_attn);
    // x = x + mlp(post_attention_layernorm(x))
    feed_forward(b, l.post_attention_layernorm, l.mlp);
    b.layer_end(static_cast<int64_t>(i));
  }
  b.logits(norm_, lm_head_);
}

}  // namespace qtk
