// The CPU implementation of the mixture-of-experts block
// (runtime/models/moe_weights.h has the arithmetic and the weights).
#pragma once

#include <cstdint>
#include <vector>

#include "loaders/model_config.h"
#include "runtime/models/moe_weights.h"

namespace qtk {

class ThreadPool;
class TiledWeights;

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
