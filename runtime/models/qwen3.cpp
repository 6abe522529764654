#include "runtime/models/qwen3.h"

#include <string>

#include "core/error.h"
#include "pack/pack.h"
#include "runtime/models/weight_binder.h"

namespace qtk {

Qwen3::Qwen3(WeightBinder& w) : cfg_(w.config()) {
  const ModelConfig& c = cfg_;
  if (c.arch != Arch::kQwen3) fail("{}: Qwen3 model built from a non-Qwen3 pack", w.pack().path());
  const int64_t H = c.hidden_size, D = c.head_dim;
  embed_tokens_ = w.matrix("embed_tokens", c.vocab_size, H, MatrixUse::kEmbedding);
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string p = "layers." + std::to_string(i) + ".";
    Qwen3Layer l;
    l.input_layernorm = w.vector(p + "input_layernorm", H);
    l.qkv_proj = w.matrix(p + "self_attn.qkv_proj", c.q_dim() + 2 * c.kv_dim(), H);
    l.self_attn.cache_layer = i;
    l.self_attn.q_norm = w.vector(p + "self_attn.q_norm", D);
    l.self_attn.k_norm = w.vector(p + "self_attn.k_norm", D);
    l.self_attn.o_proj = w.matrix(p + "self_attn.o_proj", H, c.q_dim());
    l.post_attention_layernorm = w.vector(p + "post_attention_layernorm", H);
    l.mlp = bind_feed_forward(w, i, p);
    layers_.push_back(l);
  }
  norm_ = w.vector("norm", H);
  lm_head_ = w.matrix(w.has("lm_head") ? "lm_head" : "embed_tokens", c.vocab_size, H);
}

// note: Qwen3 rotates head_dim * partial_rotary_factor dims with plain RoPE
// (position row 0); an mrope_section in its config is ignored, as
// transformers ignores it (config rule R5, loaders/hf_config.cpp).
RopeSpec Qwen3::rope() const {
  RopeSpec r;
  r.rotary_dim = cfg_.rope.rotary_dim > 0 ? cfg_.rope.rotary_dim : cfg_.head_dim;
  r.theta = cfg_.rope.theta;
  return r;
}

void Qwen3::forward(Blocks& b) const {
  b.embed(embed_tokens_);
  for (size_t i = 0; i < layers_.size(); ++i) {
    const Qwen3Layer& l = layers_[i];
    // x = x + self_attn(input_layernorm(x))
    b.norm_project(l.input_layernorm, {&l.qkv_proj, 1});
    b.attention(l.self_attn);
    // x = x + mlp(post_attention_layernorm(x))
    feed_forward(b, l.post_attention_layernorm, l.mlp);
    b.layer_end(static_cast<int64_t>(i));
  }
  b.logits(norm_, lm_head_);
}

}  // namespace qtk
