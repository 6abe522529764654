#include "runtime/backend/cpu/cpu_model.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <vector>

#include "core/error.h"
#include "kernels/activation.h"
#include "kernels/attention.h"
#include "kernels/gdn.h"
#include "kernels/norm.h"
#include "kernels/rope.h"
#include "pack/pack.h"
#include "runtime/backend/cpu/moe_block.h"
#include "runtime/backend/cpu/tiled_weights.h"
#include "runtime/kv_cache.h"
#include "runtime/models/architecture.h"
#include "runtime/models/moe_weights.h"
#include "runtime/models/weight_binder.h"
#include "runtime/parallel/rank_group.h"

namespace qtk {

namespace {

// The CPU backend's weights: views into the mapped pack.
class CpuWeights final : public WeightBinder {
 public:
  CpuWeights(const Pack& pack, TpRank tp) : WeightBinder(pack, tp) {}

  std::vector<TensorView> matrices;  // by Matrix::id
  std::vector<TensorView> vectors;   // by Vector::id
  std::vector<MoeWeights> experts;   // by Experts::id
  // Every matrix a matmul reads (what TiledWeights copies to tile order).
  std::vector<TensorView> matmul_views;
  // The block scales of the F8_E4M3 ones (the rank's under tensor
  // parallelism), for TiledWeights::matmul.
  std::vector<const PackFp8Scales*> fp8_scales;

 protected:
  int32_t adopt_matrix(const std::string&, const TensorView& v, const PackFp8Scales* fp8,
                       MatrixUse use) override {
    if (use == MatrixUse::kMatmul) matmul_views.push_back(v);
    if (fp8 != nullptr) fp8_scales.push_back(fp8);
    matrices.push_back(v);
    return static_cast<int32_t>(matrices.size() - 1);
  }
  int32_t adopt_vector(const std::string&, const TensorView& v) override {
    vectors.push_back(v);
    return static_cast<int32_t>(vectors.size() - 1);
  }
  int32_t adopt_experts(const std::string&, const MoeWeights& w) override {
    append_moe_matrices(w, matmul_views);
    append_moe_fp8_scales(w, fp8_scales);
    experts.push_back(w);
    return static_cast<int32_t>(experts.size() - 1);
  }
};

// Residual add; element-wise, so trivially batch invariant.
void add_inplace(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

class CpuModel final : public Model, private Blocks {
 public:
  CpuModel(const Pack& pack, ThreadPool* pool, TpRank tp, RankGroup* group)
      : weights_(pack, tp), pool_(pool), tp_(tp), group_(group) {
    arch_ = bind_architecture(weights_);
    cfg_ = arch_->config();
    rope_ = arch_->rope();
    if (cfg_.has_moe()) moe_.emplace(cfg_);
    // note: every weight is read by the first forward pass anyway; reading
    // them here keeps disk reads and page faults out of the timed steps.
    tiled_.build(pack, weights_.matmul_views, weights_.fp8_scales, pool_);
  }

  const ModelConfig& config() const override { return cfg_; }
  CacheSpec cache_spec() const override { return arch_->cache_spec(); }

  void reserve(int64_t max_tokens, int64_t max_seqs, int64_t max_context) override {
    const ModelConfig& c = cfg_;
    const int64_t T = max_tokens, H = c.hidden_size;
    x_.resize(T * H);
    h_.resize(T * H);
    d_.resize(T * H);
    const int64_t in_proj =
        c.linear_conv_dim() + c.linear_value_dim() + 2 * c.linear_num_value_heads;
    proj_.resize(T * std::max(2 * c.q_dim() + 2 * c.kv_dim(), in_proj));
    core_.resize(T * std::max(c.q_dim(), c.linear_value_dim()));
    gate_up_.resize(T * 2 * c.intermediate_size);
    act_.resize(T * c.intermediate_size);
    last_.resize(std::max(T, max_seqs) * H);
    attn_scratch_.resize(paged_attention_scratch_floats(max_context, pool_size(pool_)));
    if (arch_->delta_net_layers() > 0) {
      conv_.resize(T * c.linear_conv_dim());
      g_.resize(T * c.linear_num_value_heads);
      beta_.resize(T * c.linear_num_value_heads);
      conv_states_.resize(max_seqs);
      rec_states_.resize(max_seqs);
    }
    if (moe_) moe_->reserve(T);
  }

  void forward(const StepBatch& b, KvCache& kv, StatePool& states, float* logits) override {
    step_ = &b;
    kv_ = &kv;
    states_ = &states;
    logits_ = logits;
    // A sequence that starts at position 0 (new, or recomputed after
    // preemption) starts from the empty recurrent state.
    if (arch_->delta_net_layers() > 0) {
      for (int64_t s = 0; s < b.num_seqs; ++s)
        if (starts_sequence(b, s))
          std::fill_n(states.slot(b.state_slot[s]), states.floats_per_slot(), 0.0f);
    }
    arch_->forward(*this);
  }

 private:
  const TensorView& mat(Matrix m) const { return weights_.matrices[m.id]; }
  const float* vec(Vector v) const { return weights_.vectors[v.id].as<float>(); }
  float eps() const { return static_cast<float>(cfg_.rms_norm_eps); }
  int64_t tokens() const { return step_->num_tokens; }

  // A tensor-parallel rank's sublayer output is its partial sum: add the
  // ranks' partials (rank_group.h: rank order, float32, the same bits on
  // every rank) before anything reads d.
  void reduce_pending() {
    if (tp_.split()) group_->all_reduce_sum(tp_.rank, d_.data(), tokens() * cfg_.hidden_size);
  }

  // x += d when a sublayer's output is pending.
  void settle() {
    if (pending_) add_inplace(x_.data(), d_.data(), tokens() * cfg_.hidden_size);
    pending_ = false;
  }

  void embed(Matrix table) override {
    const int64_t T = tokens(), H = cfg_.hidden_size;
    tiled_.embedding(mat(table), step_->token_ids, T, x_.data());
    pending_ = false;
    if (hook_) hook_(-1, x_.data(), T, H, H);
  }

  void norm_project(Vector norm, std::span<const Matrix> w) override {
    const int64_t T = tokens(), H = cfg_.hidden_size;
    settle();
    rmsnorm(x_.data(), H, vec(norm), h_.data(), H, T, H, eps());
    proj_ld_ = 0;
    for (const Matrix& m : w) proj_ld_ += m.rows;
    int64_t col = 0;
    for (const Matrix& m : w) {
      tiled_.matmul(h_.data(), H, mat(m), proj_.data() + col, proj_ld_, T, m.rows, H, pool_);
      col += m.rows;
    }
  }

  void attention(const AttentionLayer& l) override {
    const ModelConfig& c = cfg_;
    const StepBatch& b = *step_;
    const int64_t T = b.num_tokens, H = c.hidden_size, D = c.head_dim;
    const int64_t Hq = c.num_attention_heads, Hkv = c.num_kv_heads, ld = proj_ld_;
    float* q = proj_.data();
    const float* gate = q + c.q_dim();  // gated layouts only
    float* k = q + (l.gated ? 2 : 1) * c.q_dim();
    const float* v = k + c.kv_dim();
    rmsnorm_heads(q, ld, vec(l.q_norm), q, ld, T, Hq, D, eps());
    rmsnorm_heads(k, ld, vec(l.k_norm), k, ld, T, Hkv, D, eps());
    const auto& sec = rope_.mrope_section;
    const int64_t* sections = sec.empty() ? nullptr : sec.data();
    const int n_sections = static_cast<int>(sec.size());
    rope_apply(q, T, Hq, D, ld, b.positions, rope_.rotary_dim, rope_.theta, sections, n_sections,
               rope_.mrope_interleaved);
    rope_apply(k, T, Hkv, D, ld, b.positions, rope_.rotary_dim, rope_.theta, sections, n_sections,
               rope_.mrope_interleaved);
    KvCache& kv = *kv_;
    float* kc = kv.k(l.cache_layer);
    float* vc = kv.v(l.cache_layer);
    kv_cache_write(k, ld, v, ld, T, Hkv, D, b.slot_mapping, kv.block_size(), kv.num_blocks(), kc,
                   vc);
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
    paged_attention(q, ld, kc, vc, core, c.q_dim(), ab, Hq, Hkv, D, scale, attn_scratch_.data(),
                    pool_);
    // Gated attention: the output of each head times sigmoid(its gate).
    if (l.gated) sigmoid_mul_heads(core, c.q_dim(), gate, ld, D, T, Hq, D);
    tiled_.matmul(core, c.q_dim(), mat(l.o_proj), d_.data(), H, T, H, c.q_dim(), pool_);
    reduce_pending();
    pending_ = true;
  }

  void delta_net(const DeltaNetLayer& l) override {
    const ModelConfig& c = cfg_;
    const StepBatch& b = *step_;
    const int64_t T = b.num_tokens, H = c.hidden_size;
    const int64_t Hk = c.linear_num_key_heads, Hv = c.linear_num_value_heads;
    const int64_t Dk = c.linear_key_head_dim, Dv = c.linear_value_head_dim;
    const int64_t C = c.linear_conv_dim(), K = c.linear_conv_kernel, Vd = c.linear_value_dim();
    const int64_t ld = proj_ld_;
    const float* proj = proj_.data();
    const float* z = proj + C;
    const float* bcol = z + Vd;
    const float* acol = bcol + Hv;
    const int64_t conv_floats = arch_->conv_state_floats();
    const int64_t per_layer = conv_floats + arch_->rec_state_floats();
    for (int64_t s = 0; s < b.num_seqs; ++s) {
      float* base = states_->slot(b.state_slot[s]) + l.state_layer * per_layer;
      conv_states_[s] = base;
      rec_states_[s] = base + conv_floats;
    }
    // Causal depthwise conv over [q, k, v] continuing each sequence's state, then SiLU.
    float* conv = conv_.data();
    causal_conv1d_varlen(proj, ld, b.num_seqs, b.q_start, C, vec(l.conv1d), K, conv_states_.data(),
                         conv, C, true, pool_);
    float* q = conv;
    float* k = conv + Hk * Dk;
    const float* v = conv + 2 * Hk * Dk;
    // note: q and k are L2-normalised per head (eps 1e-6) and q is scaled by
    // Dk^-1/2, as transformers does before the delta rule.
    l2norm_heads(q, C, T, Hk, Dk, 1e-6f,
                 static_cast<float>(1.0 / std::sqrt(static_cast<double>(Dk))));
    l2norm_heads(k, C, T, Hk, Dk, 1e-6f, 1.0f);
    gdn_gates(acol, bcol, ld, vec(l.A), vec(l.dt_bias), g_.data(), beta_.data(), T, Hv);
    float* core = core_.data();
    gated_delta_rule_varlen(q, C, k, C, v, C, g_.data(), beta_.data(), Hv, b.num_seqs, b.q_start,
                            rec_states_.data(), core, Vd, Hk, Hv, Dk, Dv, pool_);
    gated_rmsnorm(core, Vd, z, ld, vec(l.norm), core, Vd, T, Hv, Dv, eps());
    tiled_.matmul(core, Vd, mat(l.out_proj), d_.data(), H, T, H, Vd, pool_);
    reduce_pending();
    pending_ = true;
  }

  void norm_mlp(Vector norm, const MlpLayer& m) override {
    const int64_t T = tokens(), H = cfg_.hidden_size, I = m.down.cols;
    settle();
    rmsnorm(x_.data(), H, vec(norm), h_.data(), H, T, H, eps());
    tiled_.matmul(h_.data(), H, mat(m.gate_up), gate_up_.data(), 2 * I, T, 2 * I, H, pool_);
    swiglu(gate_up_.data(), 2 * I, act_.data(), I, T, I);
    tiled_.matmul(act_.data(), I, mat(m.down), d_.data(), H, T, H, I, pool_);
    reduce_pending();
    pending_ = true;
  }

  void norm_moe(Vector norm, Experts e) override {
    const int64_t T = tokens(), H = cfg_.hidden_size;
    settle();
    rmsnorm(x_.data(), H, vec(norm), h_.data(), H, T, H, eps());
    moe_->forward(weights_.experts[e.id], h_.data(), T, d_.data(), tiled_, pool_);
    reduce_pending();
    pending_ = true;
  }

  void layer_end(int64_t layer) override {
    if (!hook_) return;
    settle();
    hook_(layer, x_.data(), tokens(), cfg_.hidden_size, cfg_.hidden_size);
  }

  void logits(Vector norm, Matrix lm_head) override {
    const StepBatch& b = *step_;
    const int64_t T = b.num_tokens, H = cfg_.hidden_size, V = lm_head.rows;
    settle();
    if (hook_) {
      rmsnorm(x_.data(), H, vec(norm), h_.data(), H, T, H, eps());
      hook_(cfg_.num_layers, h_.data(), T, H, H);
    }
    // The final norm and the logits only for the last token of the sequences
    // that sample.
    int64_t r = 0;
    for (int64_t s = 0; s < b.num_seqs; ++s) {
      if (!b.want_logits[s]) continue;
      const int64_t t = b.q_start[s + 1] - 1;
      rmsnorm(x_.data() + t * H, H, vec(norm), last_.data() + r * H, H, 1, H, eps());
      ++r;
    }
    if (r > 0) tiled_.matmul(last_.data(), H, mat(lm_head), logits_, V, r, V, H, pool_);
  }

  CpuWeights weights_;
  std::unique_ptr<Architecture> arch_;
  ModelConfig cfg_;
  RopeSpec rope_;
  TiledWeights tiled_;  // tile-order copies of the matrices (avx512 path)
  ThreadPool* pool_;
  TpRank tp_;                    // this rank of the tensor-parallel model (size 1: unsplit)
  RankGroup* group_;             // the ranks' all-reduce (tensor parallel only)
  std::optional<MoeBlock> moe_;  // mixture-of-experts scratch (MoE models only)

  // This step (set by forward).
  const StepBatch* step_ = nullptr;
  KvCache* kv_ = nullptr;
  StatePool* states_ = nullptr;
  float* logits_ = nullptr;
  bool pending_ = false;  // d_ holds a sublayer output not yet added to x_
  int64_t proj_ld_ = 0;   // columns of proj_ (the last norm_project's products)

  // Scratch, sized by reserve(); T = max tokens per step.
  std::vector<float> x_;         // f32 [T, hidden] residual stream
  std::vector<float> h_;         // f32 [T, hidden] normed input of a block
  std::vector<float> d_;         // f32 [T, hidden] the pending sublayer output
  std::vector<float> proj_;      // f32 [T, widest input projection]
  std::vector<float> core_;      // f32 [T, max(Hq*D, Hv*Dv)] attention / GDN output
  std::vector<float> conv_;      // f32 [T, conv_dim]
  std::vector<float> g_, beta_;  // f32 [T, Hv]
  std::vector<float> gate_up_;   // f32 [T, 2*intermediate]
  std::vector<float> act_;       // f32 [T, intermediate]
  std::vector<float> last_;      // f32 [max_seqs, hidden] final-normed last rows
  std::vector<float> attn_scratch_;
  std::vector<float*> conv_states_, rec_states_;  // [max_seqs] per-step pointers
};

}  // namespace

std::unique_ptr<Model> make_cpu_model(const Pack& pack, ThreadPool* pool, TpRank tp,
                                      RankGroup* group) {
  return std::make_unique<CpuModel>(pack, pool, tp, group);
}

}  // namespace qtk
