// Qwen3 and Qwen3-MoE: the transformers Qwen3ForCausalLM / Qwen3MoeForCausalLM
// forward pass over a scheduler step (prefill chunks and decode tokens of many
// sequences at once). A layer's feed-forward block is a dense MLP or the
// shared mixture-of-experts block (runtime/moe_block.h), as the config says.
#pragma once

#include <cstdint>
#include <vector>

#include "loaders/tensor_view.h"
#include "runtime/model.h"
#include "runtime/moe_block.h"
#include "runtime/tiled_weights.h"

namespace qtk {

// Weights of one decoder layer, all views into the mapped pack.
// "mat" = the pack's matrix dtype (bf16, f16 or f32; or f8_e4m3, whose
// float32 block scales the pack holds beside it: Pack::fp8_scales).
struct Qwen3LayerWeights {
  TensorView input_layernorm;           // f32 [hidden]
  TensorView qkv_proj;                  // mat [(Hq + 2*Hkv)*head_dim, hidden]: rows q, k, v
  TensorView q_norm;                    // f32 [head_dim]
  TensorView k_norm;                    // f32 [head_dim]
  TensorView o_proj;                    // mat [hidden, Hq*head_dim]
  TensorView post_attention_layernorm;  // f32 [hidden]
  // Feed-forward: a dense SwiGLU MLP, or (Qwen3-MoE, per the config's mlp
  // plan) a mixture of experts.
  bool is_moe = false;
  TensorView gate_up_proj;  // mat [2*intermediate, hidden]: rows gate, up (dense)
  TensorView down_proj;     // mat [hidden, intermediate] (dense)
  MoeWeights moe;           // when is_moe
};

struct Qwen3Weights {
  TensorView embed_tokens;  // mat [vocab, hidden]
  std::vector<Qwen3LayerWeights> layers;
  TensorView norm;     // f32 [hidden]
  TensorView lm_head;  // mat [vocab, hidden] (embed_tokens when tied)
};

// Looks up a pack tensor and checks its dtype class and shape; throws
// qtk::Error naming the pack, the tensor, the expected and found shape.
TensorView pack_matrix(const Pack& pack, const std::string& name, int64_t rows, int64_t cols);
TensorView pack_vector(const Pack& pack, const std::string& name, int64_t n);

class Qwen3 : public Model {
 public:
  Qwen3(const Pack& pack, ThreadPool* pool);

  const ModelConfig& config() const override { return cfg_; }
  CacheSpec cache_spec() const override;
  void reserve(int64_t max_tokens, int64_t max_seqs, int64_t max_context) override;
  void forward(const StepBatch& batch, KvCache& kv, StatePool& states, float* logits) override;

 private:
  ModelConfig cfg_;
  Qwen3Weights w_;
  TiledWeights tiled_;  // tile-order copies of the matrices (avx512 path), see tiled_weights.h
  ThreadPool* pool_;

  // Scratch, sized by reserve(); T = max tokens per step.
  std::vector<float> x_;        // f32 [T, hidden] residual stream
  std::vector<float> h_;        // f32 [T, hidden] normed input of a block
  std::vector<float> qkv_;      // f32 [T, (Hq + 2*Hkv)*head_dim]
  std::vector<float> attn_;     // f32 [T, Hq*head_dim]
  std::vector<float> gate_up_;  // f32 [T, 2*intermediate]
  std::vector<float> act_;      // f32 [T, intermediate]
  std::vector<float> last_;     // f32 [max_seqs, hidden] final-normed last rows
  std::vector<float> attn_scratch_;
  MoeBlock moe_;                // mixture-of-experts scratch (unused by dense models)
  std::vector<float> moe_out_;  // f32 [T, hidden] MoE block output (MoE models only)
};

}  // namespace qtk
