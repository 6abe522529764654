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

#include "core/tensor_view.h"
#include "loaders/model_config.h"

namespace qtk {

class Pack;
struct PackFp8Scales;

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
  // note: under tensor parallelism these are the rank's scales
  // (tp_slice_experts), not the pack's: backends read them from here.
  const PackFp8Scales* gate_up_fp8 = nullptr;
  const PackFp8Scales* down_fp8 = nullptr;
  const PackFp8Scales* router_fp8 = nullptr;  // the scales of router when F8_E4M3
  bool has_shared = false;
  TensorView shared_gate_up_proj;  // mat [2*S, hidden]: gate rows then up rows
  TensorView shared_down_proj;     // mat [hidden, S]
  TensorView shared_expert_gate;   // mat [1, hidden]
  // The scales of the shared expert's matrices when F8_E4M3 (else nullptr).
  const PackFp8Scales* shared_gate_up_fp8 = nullptr;
  const PackFp8Scales* shared_down_fp8 = nullptr;
  const PackFp8Scales* shared_expert_gate_fp8 = nullptr;
};

// Binds layer `prefix` ("layers.3.") of `pack`; throws qtk::Error naming the
// pack, the tensor, the expected and found dtype or shape.
MoeWeights load_moe_weights(const Pack& pack, const ModelConfig& c, const std::string& prefix);

// Fills expert_gate_up / expert_down with each expert's slice of the stacked
// gate_up_proj / down_proj.
void index_experts(MoeWeights& w);

// Appends every 2-D matrix of `w` the matmuls read (for TiledWeights::build).
void append_moe_matrices(const MoeWeights& w, std::vector<TensorView>& mats);

// Appends the block scales of those matrices that are F8_E4M3 (the stacked
// experts' scales, which expert_matmul reads per expert, are not among them).
void append_moe_fp8_scales(const MoeWeights& w, std::vector<const PackFp8Scales*>& scales);

}  // namespace qtk
