#include "runtime/models/architecture.h"

#include <algorithm>

#include "core/error.h"
#include "pack/pack.h"
#include "runtime/models/qwen3.h"
#include "runtime/models/qwen3_5.h"
#include "runtime/models/weight_binder.h"

namespace qtk {

int64_t Architecture::conv_state_floats() const {
  const ModelConfig& c = config();
  return c.linear_conv_dim() * std::max<int64_t>(0, c.linear_conv_kernel - 1);
}

int64_t Architecture::rec_state_floats() const {
  const ModelConfig& c = config();
  return c.linear_num_value_heads * c.linear_key_head_dim * c.linear_value_head_dim;
}

// note: the recurrent state is float32, not bf16, on every backend: the
// delta rule accumulates into it over every token of the sequence, and the
// goldens are float64 references.
CacheSpec Architecture::cache_spec() const {
  CacheSpec s;
  s.attention_layers = attention_layers();
  s.kv_heads = config().num_kv_heads;
  s.head_dim = config().head_dim;
  s.state_floats = delta_net_layers() * (conv_state_floats() + rec_state_floats());
  return s;
}

FeedForward bind_feed_forward(WeightBinder& w, int64_t layer, const std::string& p) {
  const ModelConfig& c = w.config();
  FeedForward f;
  f.is_moe = c.is_moe_layer(layer);
  if (f.is_moe) {
    f.moe = w.experts(p);
  } else {
    f.mlp.gate_up = w.matrix(p + "mlp.gate_up_proj", 2 * c.intermediate_size, c.hidden_size);
    f.mlp.down = w.matrix(p + "mlp.down_proj", c.hidden_size, c.intermediate_size);
  }
  return f;
}

void feed_forward(Blocks& b, Vector norm, const FeedForward& ff) {
  if (ff.is_moe)
    b.norm_moe(norm, ff.moe);
  else
    b.norm_mlp(norm, ff.mlp);
}

std::unique_ptr<Architecture> bind_architecture(WeightBinder& w) {
  const ModelConfig& c = w.config();
  switch (c.arch) {
    case Arch::kQwen3:
      return std::make_unique<Qwen3>(w);
    case Arch::kQwen3_5:
      return std::make_unique<Qwen3_5>(w);
  }
  fail("{}: unsupported architecture '{}'", w.pack().path(), c.hf_architecture);
}

}  // namespace qtk
