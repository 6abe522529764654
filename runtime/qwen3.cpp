#include "runtime/qwen3.h"

#include <cmath>

#include "kernels/activation.h"
#include "kernels/attention.h"
#include "kernels/embedding.h"
#include "kernels/matmul.h"
#include "kernels/norm.h"
#include "kernels/rope.h"
#include "loaders/error.h"
#include "runtime/kv_cache.h"
#include "runtime/pack.h"

namespace qtk {

namespace {

// Residual add; element-wise, so trivially batch invariant.
void add_inplace(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

// note: F8_E4M3 matrices come with block scales (Pack::fp8_scales, checked
// when the pack opened); TiledWeights::matmul reads both.
bool is_matrix_dtype(DType t) {
  return t == DType::BF16 || t == DType::F16 || t == DType::F32 || t == DType::F8_E4M3;
}

void check_shape(const Pack& pack, const std::string& name, const TensorView& v,
                 std::initializer_list<int64_t> dims) {
  bool ok = v.ndim == static_cast<int>(dims.size());
  int i = 0;
  for (int64_t d : dims) ok = ok && v.shape[i++] == d;
  if (!ok) {
    std::string want = "[";
    for (int64_t d : dims) want += (want.size() > 1 ? ", " : "") + std::to_string(d);
    fail("{}: tensor '{}' has shape {}; expected {} from the config", pack.path(), name,
         v.shape_string(), want + "]");
  }
}

}  // namespace

TensorView pack_matrix(const Pack& pack, const std::string& name, int64_t rows, int64_t cols) {
  const TensorView& v = pack.tensor(name);
  if (!is_matrix_dtype(v.dtype)) {
    fail("{}: tensor '{}' has dtype {}; expected BF16, F16, F32 or F8_E4M3", pack.path(), name,
         dtype_name(v.dtype));
  }
  check_shape(pack, name, v, {rows, cols});
  return v;
}

TensorView pack_vector(const Pack& pack, const std::string& name, int64_t n) {
  const TensorView& v = pack.tensor(name);
  if (v.dtype != DType::F32) {
    fail("{}: tensor '{}' has dtype {}; expected F32 (small tensors are always f32 in a pack)",
         pack.path(), name, dtype_name(v.dtype));
  }
  check_shape(pack, name, v, {n});
  return v;
}

Qwen3::Qwen3(const Pack& pack, ThreadPool* pool)
    : cfg_(pack.config()), pool_(pool), moe_(pack.config()) {
  const ModelConfig& c = cfg_;
  if (c.arch != Arch::kQwen3) fail("{}: Qwen3 model built from a non-Qwen3 pack", pack.path());
  const int64_t H = c.hidden_size, D = c.head_dim, I = c.intermediate_size;
  w_.embed_tokens = pack_matrix(pack, "embed_tokens", c.vocab_size, H);
  w_.norm = pack_vector(pack, "norm", H);
  w_.lm_head = pack.find_tensor("lm_head") != nullptr
                   ? pack_matrix(pack, "lm_head", c.vocab_size, H)
                   : w_.embed_tokens;
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string p = "layers." + std::to_string(i) + ".";
    Qwen3LayerWeights l;
    l.input_layernorm = pack_vector(pack, p + "input_layernorm", H);
    l.qkv_proj = pack_matrix(pack, p + "self_attn.qkv_proj", c.q_dim() + 2 * c.kv_dim(), H);
    l.q_norm = pack_vector(pack, p + "self_attn.q_norm", D);
    l.k_norm = pack_vector(pack, p + "self_attn.k_norm", D);
    l.o_proj = pack_matrix(pack, p + "self_attn.o_proj", H, c.q_dim());
    l.post_attention_layernorm = pack_vector(pack, p + "post_attention_layernorm", H);
    l.is_moe = c.is_moe_layer(i);
    if (l.is_moe) {
      l.moe = load_moe_weights(pack, c, p);
    } else {
      l.gate_up_proj = pack_matrix(pack, p + "mlp.gate_up_proj", 2 * I, H);
      l.down_proj = pack_matrix(pack, p + "mlp.down_proj", H, I);
    }
    w_.layers.push_back(l);
  }
  // note: every weight is read by the first forward pass anyway; reading
  // them here keeps disk reads and page faults out of the timed steps.
  std::vector<TensorView> mats{w_.lm_head};
  for (const Qwen3LayerWeights& l : w_.layers) {
    mats.insert(mats.end(), {l.qkv_proj, l.o_proj});
    if (l.is_moe)
      append_moe_matrices(l.moe, mats);
    else
      mats.insert(mats.end(), {l.gate_up_proj, l.down_proj});
  }
  tiled_.build(pack, mats, pool_);
}

CacheSpec Qwen3::cache_spec() const {
  CacheSpec s;
  s.attention_layers = cfg_.num_layers;
  s.kv_heads = cfg_.num_kv_heads;
  s.head_dim = cfg_.head_dim;
  return s;
}

void Qwen3::reserve(int64_t max_tokens, int64_t max_seqs, int64_t max_context) {
  const ModelConfig& c = cfg_;
  const int64_t T = max_tokens;
  x_.resize(T * c.hidden_size);
  h_.resize(T * c.hidden_size);
  qkv_.resize(T * (c.q_dim() + 2 * c.kv_dim()));
  attn_.resize(T * c.q_dim());
  gate_up_.resize(T * 2 * c.intermediate_size);
  act_.resize(T * c.intermediate_size);
  last_.resize(std::max(T, max_seqs) * c.hidden_size);
  attn_scratch_.resize(paged_attention_scratch_floats(max_context, pool_size(pool_)));
  if (c.has_moe()) {
    moe_.reserve(T);
    moe_out_.resize(T * c.hidden_size);
  }
}

void Qwen3::forward(const StepBatch& b, KvCache& kv, StatePool& /*states*/, float* logits) {
  const ModelConfig& c = cfg_;
  const int64_t T = b.num_tokens, H = c.hidden_size, D = c.head_dim, I = c.intermediate_size;
  const int64_t Hq = c.num_attention_heads, Hkv = c.num_kv_heads;
  const int64_t qkv_ld = c.q_dim() + 2 * c.kv_dim();
  const float eps = static_cast<float>(c.rms_norm_eps);
  float* x = x_.data();
  float* h = h_.data();
  float* qkv = qkv_.data();
  float* q = qkv;
  float* k = qkv + c.q_dim();
  float* v = qkv + c.q_dim() + c.kv_dim();

  AttentionBatch ab;
  ab.num_seqs = b.num_seqs;
  ab.q_start = b.q_start;
  ab.seq_len = b.seq_len;
  ab.block_table = b.block_table;
  ab.max_blocks = b.max_blocks;
  ab.block_size = kv.block_size();
  ab.num_blocks = kv.num_blocks();
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
  const int64_t rotary = c.rope.rotary_dim > 0 ? c.rope.rotary_dim : D;

  tiled_.embedding(w_.embed_tokens, b.token_ids, T, x);
  if (hook_) hook_(-1, x, T, H, H);
  for (int64_t li = 0; li < c.num_layers; ++li) {
    const Qwen3LayerWeights& l = w_.layers[li];
    // Self-attention block.
    rmsnorm(x, H, l.input_layernorm.as<float>(), h, H, T, H, eps);
    tiled_.matmul(h, H, l.qkv_proj, qkv, qkv_ld, T, qkv_ld, H, pool_);
    rmsnorm_heads(q, qkv_ld, l.q_norm.as<float>(), q, qkv_ld, T, Hq, D, eps);
    rmsnorm_heads(k, qkv_ld, l.k_norm.as<float>(), k, qkv_ld, T, Hkv, D, eps);
    rope_apply(q, T, Hq, D, qkv_ld, b.positions, rotary, c.rope.theta, nullptr, 0, false);
    rope_apply(k, T, Hkv, D, qkv_ld, b.positions, rotary, c.rope.theta, nullptr, 0, false);
    kv_cache_write(k, qkv_ld, v, qkv_ld, T, Hkv, D, b.slot_mapping, kv.block_size(),
                   kv.num_blocks(), kv.k(li), kv.v(li));
    paged_attention(q, qkv_ld, kv.k(li), kv.v(li), attn_.data(), c.q_dim(), ab, Hq, Hkv, D, scale,
                    attn_scratch_.data(), pool_);
    tiled_.matmul(attn_.data(), c.q_dim(), l.o_proj, h, H, T, H, c.q_dim(), pool_);
    add_inplace(x, h, T * H);
    // MLP block: dense SwiGLU, or the sparse mixture of experts.
    rmsnorm(x, H, l.post_attention_layernorm.as<float>(), h, H, T, H, eps);
    if (l.is_moe) {
      moe_.forward(l.moe, h, T, moe_out_.data(), tiled_, pool_);
      add_inplace(x, moe_out_.data(), T * H);
    } else {
      tiled_.matmul(h, H, l.gate_up_proj, gate_up_.data(), 2 * I, T, 2 * I, H, pool_);
      swiglu(gate_up_.data(), 2 * I, act_.data(), I, T, I);
      tiled_.matmul(act_.data(), I, l.down_proj, h, H, T, H, I, pool_);
      add_inplace(x, h, T * H);
    }
    if (hook_) hook_(li, x, T, H, H);
  }

  if (hook_) {
    rmsnorm(x, H, w_.norm.as<float>(), h, H, T, H, eps);
    hook_(c.num_layers, h, T, H, H);
  }
  // Final norm and logits only for the last token of sequences that sample.
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
