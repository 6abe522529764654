// Qwen3.5 hybrid: Gated DeltaNet (linear attention) layers and gated full
// attention layers with partial rotary M-RoPE, reading like transformers'
// modeling_qwen3_5 (text model; the multimodal layout converts to the same
// pack names). Qwen3.5-MoE (modeling_qwen3_5_moe) is the same model with the
// mixture-of-experts block (runtime/moe_block.h) as every layer's MLP.
#pragma once

#include <cstdint>
#include <vector>

#include "loaders/tensor_view.h"
#include "runtime/model.h"
#include "runtime/moe_block.h"
#include "runtime/tiled_weights.h"

namespace qtk {

// "mat" = the pack's matrix dtype (bf16, f16, f32, or f8_e4m3 with float32
// block scales beside it in the pack: Pack::fp8_scales). Norm weights marked
// (1+w) hold Qwen3.5's x * (1 + w) factor folded in by convert.
struct Qwen3_5FullAttention {
  TensorView qkv_proj;  // mat [(2*Hq + 2*Hkv)*head_dim, hidden]: rows query, gate, k, v
  TensorView q_norm;    // f32 [head_dim] (1+w)
  TensorView k_norm;    // f32 [head_dim] (1+w)
  TensorView o_proj;    // mat [hidden, Hq*head_dim]
};

struct Qwen3_5LinearAttention {
  TensorView in_proj;  // mat [conv_dim + Hv*Dv + 2*Hv, hidden]: rows q,k,v (conv_dim); z; b; a
  // note: FP8 packs with the split_gdn_in_proj_ba transform hold the b and a
  // rows apart (bf16 beside F8_E4M3 q,k,v,z); then in_proj has only the
  // conv_dim + Hv*Dv rows. data is nullptr otherwise.
  TensorView in_proj_ba;  // mat [2*Hv, hidden]: rows b; a
  TensorView conv1d;      // f32 [conv_dim, conv_kernel]
  TensorView dt_bias;     // f32 [Hv]
  TensorView A;           // f32 [Hv] = -exp(A_log)
  TensorView norm;        // f32 [Dv] plain w (gated norm: w * norm(x) * silu(z))
  TensorView out_proj;    // mat [hidden, Hv*Dv]
};

struct Qwen3_5LayerWeights {
  LayerKind kind = LayerKind::kFull;
  TensorView input_layernorm;           // f32 [hidden] (1+w)
  Qwen3_5FullAttention attn;            // when kind == kFull
  Qwen3_5LinearAttention gdn;           // when kind == kLinear
  TensorView post_attention_layernorm;  // f32 [hidden] (1+w)
  // Feed-forward: a dense SwiGLU MLP, or (Qwen3.5-MoE) a mixture of experts
  // with a gated shared expert.
  bool is_moe = false;
  TensorView gate_up_proj;  // mat [2*intermediate, hidden]: rows gate, up (dense)
  TensorView down_proj;     // mat [hidden, intermediate] (dense)
  MoeWeights moe;           // when is_moe
};

struct Qwen3_5Weights {
  TensorView embed_tokens;  // mat [vocab, hidden]
  std::vector<Qwen3_5LayerWeights> layers;
  TensorView norm;     // f32 [hidden] (1+w)
  TensorView lm_head;  // mat [vocab, hidden] (embed_tokens when tied)
};

class Qwen3_5 : public Model {
 public:
  Qwen3_5(const Pack& pack, ThreadPool* pool);

  const ModelConfig& config() const override { return cfg_; }
  CacheSpec cache_spec() const override;
  void reserve(int64_t max_tokens, int64_t max_seqs, int64_t max_context) override;
  void forward(const StepBatch& batch, KvCache& kv, StatePool& states, float* logits) override;

 private:
  void full_attention(const Qwen3_5FullAttention& w, int64_t attn_index, const StepBatch& b,
                      KvCache& kv, const float* h, float* out);
  void linear_attention(const Qwen3_5LinearAttention& w, int64_t gdn_index, const StepBatch& b,
                        StatePool& states, const float* h, float* out);

  ModelConfig cfg_;
  Qwen3_5Weights w_;
  TiledWeights tiled_;  // tile-order copies of the matrices (avx512 path), see tiled_weights.h
  ThreadPool* pool_;
  int64_t attn_layers_ = 0, gdn_layers_ = 0;
  std::vector<int64_t> kind_index_;  // layer -> index among layers of its kind
  // note: per slot and GDN layer: conv state f32 [conv_dim, K-1] then the
  // recurrent state f32 [Hv, Dk, Dv]. float32, not bf16: the delta rule
  // accumulates into it over every token of the sequence, and the goldens
  // are float64 references.
  int64_t conv_state_floats_ = 0, rec_state_floats_ = 0;

  // Scratch, sized by reserve(); T = max tokens per step.
  std::vector<float> x_;         // f32 [T, hidden] residual stream
  std::vector<float> h_;         // f32 [T, hidden]
  std::vector<float> mix_;       // f32 [T, hidden] attention / GDN block output
  std::vector<float> proj_;      // f32 [T, max(qkv width, in_proj width)]
  std::vector<float> conv_;      // f32 [T, conv_dim]
  std::vector<float> core_;      // f32 [T, max(Hq*D, Hv*Dv)]
  std::vector<float> g_, beta_;  // f32 [T, Hv]
  std::vector<float> gate_up_;   // f32 [T, 2*intermediate]
  std::vector<float> act_;       // f32 [T, intermediate]
  std::vector<float> last_;      // f32 [max_seqs, hidden]
  std::vector<float> attn_scratch_;
  std::vector<float*> conv_states_, rec_states_;  // [max_seqs] per-step pointers
  MoeBlock moe_;  // mixture-of-experts scratch (unused by dense models)
};

}  // namespace qtk
