#include "runtime/qwen3_5.h"

#include <algorithm>
#include <cmath>

#include "kernels/activation.h"
#include "kernels/attention.h"
#include "kernels/embedding.h"
#include "kernels/gdn.h"
#include "kernels/matmul.h"
#include "kernels/norm.h"
#include "kernels/rope.h"
#include "loaders/error.h"
#include "runtime/kv_cache.h"
#include "runtime/pack.h"
#include "runtime/qwen3.h"

namespace qtk {

namespace {

void add_inplace(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

int64_t in_proj_rows(const ModelConfig& c) {
  return c.linear_conv_dim() + c.linear_value_dim() + 2 * c.linear_num_value_heads;
}

}  // namespace

Qwen3_5::Qwen3_5(const Pack& pack, ThreadPool* pool)
    : cfg_(pack.config()), pool_(pool), moe_(pack.config()) {
  const ModelConfig& c = cfg_;
  if (c.arch != Arch::kQwen3_5)
    fail("{}: Qwen3.5 model built from a non-Qwen3.5 pack", pack.path());
  if (static_cast<int64_t>(c.layer_plan.size()) != c.num_layers) {
    fail("{}: config layer_plan has {} entries; expected num_layers = {}", pack.path(),
         c.layer_plan.size(), c.num_layers);
  }
  if (!c.rope.mrope_section.empty() && c.rope.mrope_section.size() != 3) {
    fail("{}: config rope mrope_section has {} entries; expected 3", pack.path(),
         c.rope.mrope_section.size());
  }
  const int64_t H = c.hidden_size, D = c.head_dim, I = c.intermediate_size;
  const int64_t Hv = c.linear_num_value_heads, Dv = c.linear_value_head_dim;
  w_.embed_tokens = pack_matrix(pack, "embed_tokens", c.vocab_size, H);
  w_.norm = pack_vector(pack, "norm", H);
  w_.lm_head = pack.find_tensor("lm_head") != nullptr
                   ? pack_matrix(pack, "lm_head", c.vocab_size, H)
                   : w_.embed_tokens;
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string p = "layers." + std::to_string(i) + ".";
    Qwen3_5LayerWeights l;
    l.kind = c.layer_plan[i];
    l.input_layernorm = pack_vector(pack, p + "input_layernorm", H);
    l.post_attention_layernorm = pack_vector(pack, p + "post_attention_layernorm", H);
    l.is_moe = c.is_moe_layer(i);
    if (l.is_moe) {
      l.moe = load_moe_weights(pack, c, p);
    } else {
      l.gate_up_proj = pack_matrix(pack, p + "mlp.gate_up_proj", 2 * I, H);
      l.down_proj = pack_matrix(pack, p + "mlp.down_proj", H, I);
    }
    if (l.kind == LayerKind::kFull) {
      l.attn.qkv_proj =
          pack_matrix(pack, p + "self_attn.qkv_proj", 2 * c.q_dim() + 2 * c.kv_dim(), H);
      l.attn.q_norm = pack_vector(pack, p + "self_attn.q_norm", D);
      l.attn.k_norm = pack_vector(pack, p + "self_attn.k_norm", D);
      l.attn.o_proj = pack_matrix(pack, p + "self_attn.o_proj", H, c.q_dim());
      kind_index_.push_back(attn_layers_++);
    } else {
      if (pack.find_tensor(p + "linear_attn.in_proj_ba") != nullptr) {
        l.gdn.in_proj = pack_matrix(pack, p + "linear_attn.in_proj",
                                    c.linear_conv_dim() + c.linear_value_dim(), H);
        l.gdn.in_proj_ba = pack_matrix(pack, p + "linear_attn.in_proj_ba", 2 * Hv, H);
      } else {
        l.gdn.in_proj = pack_matrix(pack, p + "linear_attn.in_proj", in_proj_rows(c), H);
      }
      const TensorView& conv = pack.tensor(p + "linear_attn.conv1d");
      if (conv.dtype != DType::F32 || conv.ndim != 2 || conv.shape[0] != c.linear_conv_dim() ||
          conv.shape[1] != c.linear_conv_kernel) {
        fail("{}: tensor '{}' is {} {}; expected F32 [{}, {}]", pack.path(),
             p + "linear_attn.conv1d", dtype_name(conv.dtype), conv.shape_string(),
             c.linear_conv_dim(), c.linear_conv_kernel);
      }
      l.gdn.conv1d = conv;
      l.gdn.dt_bias = pack_vector(pack, p + "linear_attn.dt_bias", Hv);
      l.gdn.A = pack_vector(pack, p + "linear_attn.A", Hv);
      l.gdn.norm = pack_vector(pack, p + "linear_attn.norm", Dv);
      l.gdn.out_proj = pack_matrix(pack, p + "linear_attn.out_proj", H, c.linear_value_dim());
      kind_index_.push_back(gdn_layers_++);
    }
    w_.layers.push_back(l);
  }
  conv_state_floats_ = c.linear_conv_dim() * std::max<int64_t>(0, c.linear_conv_kernel - 1);
  rec_state_floats_ = Hv * c.linear_key_head_dim * Dv;
  // note: see Qwen3::Qwen3 (weights read now, not in the first timed step).
  std::vector<TensorView> mats{w_.lm_head};
  for (const Qwen3_5LayerWeights& l : w_.layers) {
    if (l.kind == LayerKind::kFull) {
      mats.insert(mats.end(), {l.attn.qkv_proj, l.attn.o_proj});
    } else {
      mats.insert(mats.end(), {l.gdn.in_proj, l.gdn.out_proj});
      if (l.gdn.in_proj_ba.data != nullptr) mats.push_back(l.gdn.in_proj_ba);
    }
    if (l.is_moe)
      append_moe_matrices(l.moe, mats);
    else
      mats.insert(mats.end(), {l.gate_up_proj, l.down_proj});
  }
  tiled_.build(pack, mats, pool_);
}

CacheSpec Qwen3_5::cache_spec() const {
  CacheSpec s;
  s.attention_layers = attn_layers_;
  s.kv_heads = cfg_.num_kv_heads;
  s.head_dim = cfg_.head_dim;
  s.state_floats = gdn_layers_ * (conv_state_floats_ + rec_state_floats_);
  return s;
}

void Qwen3_5::reserve(int64_t max_tokens, int64_t max_seqs, int64_t max_context) {
  const ModelConfig& c = cfg_;
  const int64_t T = max_tokens;
  x_.resize(T * c.hidden_size);
  h_.resize(T * c.hidden_size);
  mix_.resize(T * c.hidden_size);
  proj_.resize(T * std::max(2 * c.q_dim() + 2 * c.kv_dim(), in_proj_rows(c)));
  conv_.resize(T * c.linear_conv_dim());
  core_.resize(T * std::max(c.q_dim(), c.linear_value_dim()));
  g_.resize(T * c.linear_num_value_heads);
  beta_.resize(T * c.linear_num_value_heads);
  gate_up_.resize(T * 2 * c.intermediate_size);
  act_.resize(T * c.intermediate_size);
  last_.resize(std::max(T, max_seqs) * c.hidden_size);
  attn_scratch_.resize(paged_attention_scratch_floats(max_context, pool_size(pool_)));
  conv_states_.resize(max_seqs);
  rec_states_.resize(max_seqs);
  if (c.has_moe()) moe_.reserve(T);
}

void Qwen3_5::full_attention(const Qwen3_5FullAttention& w, int64_t ai, const StepBatch& b,
                             KvCache& kv, const float* h, float* out) {
  const ModelConfig& c = cfg_;
  const int64_t T = b.num_tokens, H = c.hidden_size, D = c.head_dim;
  const int64_t Hq = c.num_attention_heads, Hkv = c.num_kv_heads;
  const int64_t ld = 2 * c.q_dim() + 2 * c.kv_dim();
  const float eps = static_cast<float>(c.rms_norm_eps);
  float* proj = proj_.data();
  float* q = proj;
  const float* gate = proj + c.q_dim();
  float* k = proj + 2 * c.q_dim();
  const float* v = k + c.kv_dim();
  tiled_.matmul(h, H, w.qkv_proj, proj, ld, T, ld, H, pool_);
  rmsnorm_heads(q, ld, w.q_norm.as<float>(), q, ld, T, Hq, D, eps);
  rmsnorm_heads(k, ld, w.k_norm.as<float>(), k, ld, T, Hkv, D, eps);
  const auto& sec = c.rope.mrope_section;
  const int64_t rotary = c.rope.rotary_dim > 0 ? c.rope.rotary_dim : D;
  rope_apply(q, T, Hq, D, ld, b.positions, rotary, c.rope.theta, sec.empty() ? nullptr : sec.data(),
             static_cast<int>(sec.size()), c.rope.mrope_interleaved);
  rope_apply(k, T, Hkv, D, ld, b.positions, rotary, c.rope.theta,
             sec.empty() ? nullptr : sec.data(), static_cast<int>(sec.size()),
             c.rope.mrope_interleaved);
  kv_cache_write(k, ld, v, ld, T, Hkv, D, b.slot_mapping, kv.block_size(), kv.num_blocks(),
                 kv.k(ai), kv.v(ai));
  AttentionBatch ab;
  ab.num_seqs = b.num_seqs;
  ab.q_start = b.q_start;
  ab.seq_len = b.seq_len;
  ab.block_table = b.block_table;
  ab.max_blocks = b.max_blocks;
  ab.block_size = kv.block_size();
  ab.num_blocks = kv.num_blocks();
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
  float* core = core_.data();
  paged_attention(q, ld, kv.k(ai), kv.v(ai), core, c.q_dim(), ab, Hq, Hkv, D, scale,
                  attn_scratch_.data(), pool_);
  // Gated attention: the output of each head times sigmoid(its gate).
  sigmoid_mul_heads(core, c.q_dim(), gate, ld, D, T, Hq, D);
  tiled_.matmul(core, c.q_dim(), w.o_proj, out, H, T, H, c.q_dim(), pool_);
}

void Qwen3_5::linear_attention(const Qwen3_5LinearAttention& w, int64_t gi, const StepBatch& b,
                               StatePool& states, const float* h, float* out) {
  const ModelConfig& c = cfg_;
  const int64_t T = b.num_tokens, H = c.hidden_size;
  const int64_t Hk = c.linear_num_key_heads, Hv = c.linear_num_value_heads;
  const int64_t Dk = c.linear_key_head_dim, Dv = c.linear_value_head_dim;
  const int64_t C = c.linear_conv_dim(), K = c.linear_conv_kernel;
  const int64_t ld = in_proj_rows(c);
  float* proj = proj_.data();
  if (w.in_proj_ba.data != nullptr) {
    const int64_t qkvz = C + c.linear_value_dim();
    tiled_.matmul(h, H, w.in_proj, proj, ld, T, qkvz, H, pool_);
    tiled_.matmul(h, H, w.in_proj_ba, proj + qkvz, ld, T, 2 * Hv, H, pool_);
  } else {
    tiled_.matmul(h, H, w.in_proj, proj, ld, T, ld, H, pool_);
  }
  const float* z = proj + C;
  const float* bcol = z + c.linear_value_dim();
  const float* acol = bcol + Hv;

  const int64_t per_layer = conv_state_floats_ + rec_state_floats_;
  for (int64_t s = 0; s < b.num_seqs; ++s) {
    float* base = states.slot(b.state_slot[s]) + gi * per_layer;
    conv_states_[s] = base;
    rec_states_[s] = base + conv_state_floats_;
  }
  // Causal depthwise conv over [q, k, v] continuing each sequence's state, then SiLU.
  float* conv = conv_.data();
  causal_conv1d_varlen(proj, ld, b.num_seqs, b.q_start, C, w.conv1d.as<float>(), K,
                       conv_states_.data(), conv, C, true, pool_);
  float* q = conv;
  float* k = conv + Hk * Dk;
  const float* v = conv + 2 * Hk * Dk;
  // note: q and k are L2-normalised per head (eps 1e-6) and q is scaled by
  // Dk^-1/2, as transformers does before the delta rule.
  l2norm_heads(q, C, T, Hk, Dk, 1e-6f,
               static_cast<float>(1.0 / std::sqrt(static_cast<double>(Dk))));
  l2norm_heads(k, C, T, Hk, Dk, 1e-6f, 1.0f);
  gdn_gates(acol, bcol, ld, w.A.as<float>(), w.dt_bias.as<float>(), g_.data(), beta_.data(), T, Hv);
  float* core = core_.data();
  gated_delta_rule_varlen(q, C, k, C, v, C, g_.data(), beta_.data(), Hv, b.num_seqs, b.q_start,
                          rec_states_.data(), core, c.linear_value_dim(), Hk, Hv, Dk, Dv, pool_);
  gated_rmsnorm(core, c.linear_value_dim(), z, ld, w.norm.as<float>(), core, c.linear_value_dim(),
                T, Hv, Dv, static_cast<float>(c.rms_norm_eps));
  tiled_.matmul(core, c.linear_value_dim(), w.out_proj, out, H, T, H, c.linear_value_dim(), pool_);
}

void Qwen3_5::forward(const StepBatch& b, KvCache& kv, StatePool& states, float* logits) {
  const ModelConfig& c = cfg_;
  const int64_t T = b.num_tokens, H = c.hidden_size, I = c.intermediate_size;
  const float eps = static_cast<float>(c.rms_norm_eps);
  float* x = x_.data();
  float* h = h_.data();
  float* mix = mix_.data();

  tiled_.embedding(w_.embed_tokens, b.token_ids, T, x);
  if (hook_) hook_(-1, x, T, H, H);
  for (int64_t li = 0; li < c.num_layers; ++li) {
    const Qwen3_5LayerWeights& l = w_.layers[li];
    rmsnorm(x, H, l.input_layernorm.as<float>(), h, H, T, H, eps);
    if (l.kind == LayerKind::kFull) {
      full_attention(l.attn, kind_index_[li], b, kv, h, mix);
    } else {
      linear_attention(l.gdn, kind_index_[li], b, states, h, mix);
    }
    add_inplace(x, mix, T * H);
    rmsnorm(x, H, l.post_attention_layernorm.as<float>(), h, H, T, H, eps);
    if (l.is_moe) {
      moe_.forward(l.moe, h, T, mix, tiled_, pool_);
    } else {
      tiled_.matmul(h, H, l.gate_up_proj, gate_up_.data(), 2 * I, T, 2 * I, H, pool_);
      swiglu(gate_up_.data(), 2 * I, act_.data(), I, T, I);
      tiled_.matmul(act_.data(), I, l.down_proj, mix, H, T, H, I, pool_);
    }
    add_inplace(x, mix, T * H);
    if (hook_) hook_(li, x, T, H, H);
  }

  if (hook_) {
    rmsnorm(x, H, w_.norm.as<float>(), h, H, T, H, eps);
    hook_(c.num_layers, h, T, H, H);
  }
  int64_t r = 0;
  for (int64_t s = 0; s < b.num_seqs; ++s) {
    if (!b.want_logits[s]) continue;
    const int64_t t = b.q_start[s + 1] - 1;
    rmsnorm(x + t * H, H, w_.norm.as<float>(), last_.data() + r * H, H, 1, H, eps);
    ++r;
  }
  if (r > 0) {
    tiled_.matmul(last_.data(), H, w_.lm_head, logits, c.vocab_size, r, c.vocab_size, H, pool_);
  }
}

}  // namespace qtk
