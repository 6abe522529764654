// Qwen3 and Qwen3-MoE: transformers' Qwen3ForCausalLM / Qwen3MoeForCausalLM.
// A layer's feed-forward block is a dense SwiGLU MLP or the mixture of
// experts (moe_weights.h), as the config's MLP plan says.
#pragma once

#include <vector>

#include "runtime/models/architecture.h"

namespace qtk {

// "mat" = the pack's matrix dtype (bf16, f16, f32, or f8_e4m3 with float32
// block scales beside it in the pack).
struct Qwen3Layer {
  Vector input_layernorm;           // f32 [hidden]
  Matrix qkv_proj;                  // mat [(Hq + 2*Hkv)*head_dim, hidden]: rows q, k, v
  AttentionLayer self_attn;         // q_norm, k_norm f32 [head_dim]; o_proj mat [hidden, Hq*D]
  Vector post_attention_layernorm;  // f32 [hidden]
  FeedForward mlp;  // dense SwiGLU or mixture of experts, as the config's MLP plan says
};

class Qwen3 final : public Architecture {
 public:
  explicit Qwen3(WeightBinder& w);
  const ModelConfig& config() const override { return cfg_; }
  int64_t attention_layers() const override { return cfg_.num_layers; }
  RopeSpec rope() const override;
  void forward(Blocks& b) const override;

 private:
  ModelConfig cfg_;
  Matrix embed_tokens_;  // mat [vocab, hidden]
  std::vector<Qwen3Layer> layers_;
  Vector norm_;     // f32 [hidden]
  Matrix lm_head_;  // mat [vocab, hidden] (embed_tokens when tied)
};

}  // namespace qtk
