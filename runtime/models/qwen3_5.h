// Qwen3.5 and Qwen3.5-MoE: transformers' modeling_qwen3_5 /
// modeling_qwen3_5_moe text model. Gated DeltaNet (linear attention) layers
// and gated full-attention layers with partial, interleaved M-RoPE, as the
// config's layer plan says; the MoE variant has the mixture of experts
// (moe_weights.h) as every layer's feed-forward block. The multimodal layout
// converts to the same pack names.
#pragma once

#include <vector>

#include "runtime/models/architecture.h"

namespace qtk {

// "mat" = the pack's matrix dtype (bf16, f16, f32, or f8_e4m3 with float32
// block scales beside it in the pack). Norm weights marked (1+w) hold
// Qwen3.5's x * (1 + w) factor folded in by convert.
struct Qwen3_5Layer {
  LayerKind kind = LayerKind::kFull;
  Vector input_layernorm;  // f32 [hidden] (1+w)
  // The mixer's input projection (one or two matrices, columns side by side):
  //   full:   self_attn.qkv_proj mat [(2*Hq + 2*Hkv)*D, hidden]: rows q, gate, k, v
  //   linear: linear_attn.in_proj mat [conv_dim + Hv*Dv + 2*Hv, hidden]: rows q,k,v; z; b; a
  // note: FP8 packs with the split_gdn_in_proj_ba transform hold the b and a
  // rows apart (bf16 beside the F8_E4M3 q, k, v, z rows): in_proj then has
  // conv_dim + Hv*Dv rows and linear_attn.in_proj_ba [2*Hv, hidden] follows.
  Matrix in_proj[2];
  int n_in_proj = 1;
  AttentionLayer self_attn;         // when full: q_norm, k_norm f32 [D] (1+w); o_proj
  DeltaNetLayer linear_attn;        // when linear
  Vector post_attention_layernorm;  // f32 [hidden] (1+w)
  FeedForward mlp;  // dense SwiGLU or mixture of experts, as the config's MLP plan says
};

class Qwen3_5 final : public Architecture {
 public:
  explicit Qwen3_5(WeightBinder& w);
  const ModelConfig& config() const override { return cfg_; }
  int64_t attention_layers() const override { return attention_layers_; }
  int64_t delta_net_layers() const override { return delta_net_layers_; }
  RopeSpec rope() const override;
  void forward(Blocks& b) const override;

 private:
  ModelConfig cfg_;
  Matrix embed_tokens_;  // mat [vocab, hidden]
  std::vector<Qwen3_5Layer> layers_;
  Vector norm_;     // f32 [hidden] (1+w)
  Matrix lm_head_;  // mat [vocab, hidden] (embed_tokens when tied)
  int64_t attention_layers_ = 0, delta_net_layers_ = 0;
};

}  // namespace qtk
