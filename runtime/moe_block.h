// The sparse mixture-of-experts feed-forward block shared by the Qwen3-MoE
// and Qwen3.5-MoE layers (transformers' Qwen3MoeSparseMoeBlock and
// Qwen3_5MoeSparseMoeBlock):
//
//   p        = softmax(router(h))                      float32, over all E experts
//   top-k    = the k largest p (ties to the lower expert index), renormalised
//              to sum 1 when norm_topk_prob (always for Qwen3.5-MoE)
//   out      = sum over the chosen experts e, in increasing e, of
//              w_e * down_e(silu(gate_e(h)) * up_e(h))
//   out     += sigmoid(shared_expert_gate(h)) * shared_expert(h)   (Qwen3.5-MoE)
//
// note: batch invariance. The tokens routed to one expert are gathered into
// consecutive rows and go through that expert's two matmuls together; the
// matmul kernels give each row the same bits whatever the number of rows
// (kernels/matmul.h), so a token's expert outputs do not depend on which or
// how many other tokens chose the same expert. Each token then adds its
// experts' weighted outputs in increasing expert index, one fixed order.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loaders/model_config.h"
#include "loaders/tensor_view.h"

namespace qtk {

class Pack;
struct PackFp8Scales;
class ThreadPool;
class TiledWeights;

// One MoE layer's weights, views into the mapped pack. "mat" = the pack's
// matrix dtype; E experts of width Ie, shared expert of width S.
struct MoeWeights {
  TensorView router;        // mat [E, hidden]
  TensorView gate_up_proj;  // mat [E, 2*Ie, hidden]: per expert, gate rows then up rows
  TensorView down_proj;     // mat [E, hidden, Ie]
  std::vector<TensorView> expert_gate_up;  // mat [2*Ie, hidden] each: slices of gate_up_proj
  std::vector<TensorView> expert_down;     // mat [hidden, Ie] each: slices of down_proj
  // The block scales of gate_up_proj / down_proj when they are F8_E4M3
  // (nullptr otherwise): [E*rows/block_rows, ceil(cols/block_cols)], expert
  // e's rows starting at scale row e*rows/block_rows.
  const PackFp8Scales* gate_up_fp8 = nullptr;
  const PackFp8Scales* down_fp8 = nullptr;
  bool has_shared = false;
  TensorView shared_gate_up_proj;  // mat [2*S, hidden]: gate rows then up rows
  TensorView shared_down_proj;     // mat [hidden, S]
  TensorView shared_expert_gate;   // mat [1, hidden]
};

// Binds layer `prefix` ("layers.3.") of `pack`; throws qtk::Error naming the
// pack, the tensor, the expected and found dtype or shape.
MoeWeights load_moe_weights(const Pack& pack, const ModelConfig& c, const std::string& prefix);

// Appends every 2-D matrix of `w` the matmuls read (for TiledWeights::build).
void append_moe_matrices(const MoeWeights& w, std::vector<TensorView>& mats);

class MoeBlock {
 public:
  explicit MoeBlock(const ModelConfig& c);
  // Scratch for up to `max_tokens` tokens per call.
  void reserve(int64_t max_tokens);
  // out[t] = the block's output for h[t] (see the top of this file).
  //   h: f32 [T, hidden] row stride hidden; out: f32 [T, hidden], not aliasing h.
  void forward(const MoeWeights& w, const float* h, int64_t T, float* out,
               const TiledWeights& tiled, ThreadPool* pool);

 private:
  int64_t H_, E_, k_, I_, S_;
  bool renormalize_;
  // Scratch, sized by reserve(); T = max tokens per call.
  std::vector<float> probs_;        // f32 [T, E] router logits, then probabilities
  std::vector<int32_t> ids_;        // i32 [T, k] chosen experts
  std::vector<float> weights_;      // f32 [T, k] their weights
  std::vector<int64_t> offsets_;    // [E + 1] start of each expert's rows in rows_
  std::vector<int64_t> cursor_;     // [E] next free row of each expert while grouping
  std::vector<int32_t> rows_;       // i32 [T*k] token of each routed row, grouped by expert
  std::vector<float> row_weight_;   // f32 [T*k] weight of each routed row
  std::vector<float> xg_;           // f32 [T, hidden] gathered inputs of one expert
  std::vector<float> gate_up_;      // f32 [T, 2*max(Ie, S)]
  std::vector<float> act_;          // f32 [T, max(Ie, S)]
  std::vector<float> y_;            // f32 [T, hidden] one expert's (or the shared) output
  std::vector<float> shared_gate_;  // f32 [T] shared expert gate logits
};

}  // namespace qtk
