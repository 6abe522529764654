// What a backend needs from an architecture (runtime/models/qwen3.h,
// qwen3_5.h): its cache needs, its rotary embedding, and its forward pass
// written in blocks (runtime/backend/blocks.h). One object per loaded model;
// it holds only handles, so one definition serves every backend.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "loaders/model_config.h"
#include "runtime/backend/blocks.h"
#include "runtime/model.h"

namespace qtk {

class WeightBinder;

// A decoder layer's feed-forward block, as the config's MLP plan says: a
// dense SwiGLU MLP or the mixture of experts (moe_weights.h).
struct FeedForward {
  bool is_moe = false;
  MlpLayer mlp;  // dense: gate_up mat [2*intermediate, hidden], down mat [hidden, intermediate]
  Experts moe;   // when is_moe
};

// Binds the feed-forward block of layer `layer` (prefix "layers.N.").
FeedForward bind_feed_forward(WeightBinder& w, int64_t layer, const std::string& prefix);

// x = x + ff(norm(x)): the block's norm_mlp or norm_moe.
void feed_forward(Blocks& b, Vector norm, const FeedForward& ff);

// The rotary embedding of the attention layers.
struct RopeSpec {
  int64_t rotary_dim = 0;  // leading dims of each head that rotate (the rest pass through)
  double theta = 10000.0;
  // M-RoPE: the rotary pairs split into (temporal, height, width) sections,
  // each reading its own row of StepBatch::positions; empty: plain RoPE.
  std::vector<int64_t> mrope_section;
  bool mrope_interleaved = false;
};

class Architecture {
 public:
  virtual ~Architecture() = default;
  virtual const ModelConfig& config() const = 0;
  // Attention layers (paged K/V), Gated DeltaNet layers (recurrent state).
  virtual int64_t attention_layers() const = 0;
  virtual int64_t delta_net_layers() const { return 0; }
  virtual RopeSpec rope() const = 0;
  // One step: the decoder over the step's tokens, then the logits.
  virtual void forward(Blocks& b) const = 0;

  // Floats of one sequence's recurrent state (every GDN layer's conv state,
  // then its recurrent state) and the cache spec the scheduler allocates by.
  int64_t conv_state_floats() const;  // per GDN layer: f32 [conv_dim, K-1]
  int64_t rec_state_floats() const;   // per GDN layer: f32 [Hv, Dk, Dv]
  CacheSpec cache_spec() const;
};

// Binds the pack's architecture (its config's arch) through `w`. Throws
// qtk::Error for an architecture this build cannot run or a pack missing a
// tensor.
std::unique_ptr<Architecture> bind_architecture(WeightBinder& w);

}  // namespace qtk
