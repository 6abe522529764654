// Qwen3.5 hybrid on the GPU: the forward pass of runtime/qwen3_5.cpp (gated
// full attention with partial M-RoPE, Gated DeltaNet layers) with the CUDA
// kernels; K/V cache and the per-slot conv / recurrent state in device memory.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/gdn_chunked.h"
#include "kernels/cuda/gemm.h"
#include "runtime/cuda/cuda_model.h"
#include "runtime/cuda/cuda_models.h"
#include "runtime/cuda/decode_graphs.h"
#include "runtime/cuda/device_upload.h"
#include "runtime/cuda/fused_steps.h"
#include "runtime/cuda/step_io.h"
#include "runtime/kv_cache.h"

namespace qtk {
namespace {

using cuda::DeviceMemory;
using cuda::dtype_of;
using cuda::ensure;
using cuda::upload_matrix;
using cuda::upload_vector;

// Rows of the GDN in_proj: q, k, v (the conv channels), z, b, a.
int64_t in_proj_rows(const ModelConfig& c) {
  return c.linear_conv_dim() + c.linear_value_dim() + 2 * c.linear_num_value_heads;
}
// Rows of the full-attention qkv_proj: q and its output gate, k, v.
int64_t full_proj_rows(const ModelConfig& c) { return 2 * c.q_dim() + 2 * c.kv_dim(); }

// One decoder layer in device memory (Act = f32 or bf16 by precision).
struct Qwen3_5DeviceLayer {
  LayerKind kind = LayerKind::kFull;
  int64_t kind_index = 0;                 // among layers of its kind
  DeviceMemory input_layernorm;           // f32 [hidden] (1+w folded)
  DeviceMemory post_attention_layernorm;  // f32 [hidden] (1+w folded)
  DeviceMemory gate_up_proj;              // Act [2*intermediate, hidden]: rows gate, up
  DeviceMemory down_proj;                 // Act [hidden, intermediate]
  // Full attention.
  DeviceMemory qkv_proj;        // Act [(2*Hq + 2*Hkv)*D, hidden]: query, gate, k, v
  DeviceMemory q_norm, k_norm;  // f32 [D] (1+w folded)
  DeviceMemory o_proj;          // Act [hidden, Hq*D]
  // Gated DeltaNet.
  DeviceMemory in_proj;     // Act [conv_dim + Hv*Dv + 2*Hv, hidden]: qkv, z, b, a
  DeviceMemory conv1d;      // f32 [conv_dim, K]
  DeviceMemory dt_bias, A;  // f32 [Hv] (A = -exp(A_log))
  DeviceMemory norm;        // f32 [Dv] plain w
  DeviceMemory out_proj;    // Act [hidden, Hv*Dv]
};

DeviceMemory upload_conv(const Pack& pack, const std::string& name, int64_t c, int64_t k) {
  const TensorView& v = pack.tensor(name);
  if (v.dtype != DType::F32 || v.ndim != 2 || v.shape[0] != c || v.shape[1] != k)
    fail("{}: tensor '{}' is {} {}; expected F32 [{}, {}]", pack.path(), name, dtype_name(v.dtype),
         v.shape_string(), c, k);
  DeviceMemory d(c * k * sizeof(float));
  cuda::upload_pack_bytes(pack, d.as(), v.data, c * k * sizeof(float));
  return d;
}

template <class Act>
class CudaQwen3_5 final : public CudaModel {
 public:
  explicit CudaQwen3_5(const Pack& pack) : cfg_(pack.config()) {
    const ModelConfig& c = cfg_;
    const int64_t H = c.hidden_size, D = c.head_dim, I = c.intermediate_size;
    const int64_t Hv = c.linear_num_value_heads, Dv = c.linear_value_head_dim;
    if (static_cast<int64_t>(c.layer_plan.size()) != c.num_layers)
      fail("{}: config layer_plan has {} entries; expected num_layers = {}", pack.path(),
           c.layer_plan.size(), c.num_layers);
    if (!c.rope.mrope_section.empty() && c.rope.mrope_section.size() != 3)
      fail("{}: config rope mrope_section has {} entries; expected 3", pack.path(),
           c.rope.mrope_section.size());
    QTK_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    embed_ = upload_matrix<Act>(pack, "embed_tokens", c.vocab_size, H);
    tied_ = pack.find_tensor("lm_head") == nullptr;
    if (!tied_) lm_head_ = upload_matrix<Act>(pack, "lm_head", c.vocab_size, H);
    norm_ = upload_vector(pack, "norm", H);
    for (int64_t i = 0; i < c.num_layers; ++i) {
      const std::string p = "layers." + std::to_string(i) + ".";
      Qwen3_5DeviceLayer l;
      l.kind = c.layer_plan[i];
      l.input_layernorm = upload_vector(pack, p + "input_layernorm", H);
      l.post_attention_layernorm = upload_vector(pack, p + "post_attention_layernorm", H);
      l.gate_up_proj = upload_matrix<Act>(pack, p + "mlp.gate_up_proj", 2 * I, H);
      l.down_proj = upload_matrix<Act>(pack, p + "mlp.down_proj", H, I);
      if (l.kind == LayerKind::kFull) {
        l.qkv_proj = upload_matrix<Act>(pack, p + "self_attn.qkv_proj", full_proj_rows(c), H);
        l.q_norm = upload_vector(pack, p + "self_attn.q_norm", D);
        l.k_norm = upload_vector(pack, p + "self_attn.k_norm", D);
        l.o_proj = upload_matrix<Act>(pack, p + "self_attn.o_proj", H, c.q_dim());
        l.kind_index = attn_layers_++;
      } else {
        l.in_proj = upload_matrix<Act>(pack, p + "linear_attn.in_proj", in_proj_rows(c), H);
        l.conv1d =
            upload_conv(pack, p + "linear_attn.conv1d", c.linear_conv_dim(), c.linear_conv_kernel);
        l.dt_bias = upload_vector(pack, p + "linear_attn.dt_bias", Hv);
        l.A = upload_vector(pack, p + "linear_attn.A", Hv);
        l.norm = upload_vector(pack, p + "linear_attn.norm", Dv);
        l.out_proj = upload_matrix<Act>(pack, p + "linear_attn.out_proj", H, c.linear_value_dim());
        l.kind_index = gdn_layers_++;
      }
      layers_.push_back(std::move(l));
    }
    rope_.rotary_dim = c.rope.rotary_dim > 0 ? c.rope.rotary_dim : D;
    rope_.theta = c.rope.theta;
    rope_.n_sections = static_cast<int>(c.rope.mrope_section.size());
    for (int a = 0; a < rope_.n_sections; ++a)
      rope_.sections[a] = static_cast<int>(c.rope.mrope_section[a]);
    rope_.interleaved = c.rope.mrope_interleaved;
    conv_floats_ = c.linear_conv_dim() * std::max<int64_t>(0, c.linear_conv_kernel - 1);
    rec_floats_ = Hv * c.linear_key_head_dim * Dv;
  }
  ~CudaQwen3_5() override { cudaStreamDestroy(stream_); }

  const ModelConfig& config() const override { return cfg_; }
  cuda::Gemm* gemm() override { return &gemm_; }
  int64_t graphs_captured() const override { return graphs_.captured(); }
  double graph_capture_seconds() const override { return graphs_.capture_seconds(); }

  // note: bf16 computes a prompt's full 64-token chunks (anchored at
  // position 0) with the chunked GDN kernel, so the scheduler must not split
  // them; f32 (the exactness mode, goldens) stays token by token everywhere.
  // QTK_GDN_CHUNKED=0 turns the chunked form off (A/B measurements).
  int64_t prefill_alignment() const override {
    const int64_t dk = cfg_.linear_key_head_dim;
    const bool chunked_dk = dk == 16 || dk == 32 || dk == 64 || dk == 128;
    return std::is_same_v<Act, float> || gdn_layers_ == 0 || !chunked_dk || !chunked_enabled_
               ? 1
               : cuda::kGdnChunk;
  }

  CacheSpec cache_spec() const override {
    CacheSpec s;
    s.attention_layers = attn_layers_;
    s.kv_heads = cfg_.num_kv_heads;
    s.head_dim = cfg_.head_dim;
    s.state_floats = gdn_layers_ * (conv_floats_ + rec_floats_);
    return s;
  }

  void reserve(int64_t max_tokens, int64_t max_seqs, int64_t max_context) override {
    ensure_buffers(max_tokens, max_seqs);
    if (max_seqs > slots_) {  // only before the first step (the scheduler reserves once)
      slots_ = max_seqs;
      // note: one more slot than sequences: the scratch slot of the padding
      // rows of decode graphs.
      conv_state_ = DeviceMemory((slots_ + 1) * gdn_layers_ * conv_floats_ * sizeof(float));
      rec_state_ = DeviceMemory((slots_ + 1) * gdn_layers_ * rec_floats_ * sizeof(float));
      graphs_.clear();
    }
    if (cuda::ensure_rope_table(rope_table_, rope_, max_context, stream_)) graphs_.clear();
    max_context_ = std::max(max_context_, max_context);
  }

  // Scratch for steps of up to max_tokens tokens and max_seqs sequences.
  void ensure_buffers(int64_t max_tokens, int64_t max_seqs) {
    const ModelConfig& c = cfg_;
    const int64_t T = std::max<int64_t>(max_tokens, max_seqs);
    const size_t a = sizeof(Act);
    bool grew = false;
    grew |= ensure(x_, T * c.hidden_size * a);
    grew |= ensure(x2_, T * c.hidden_size * a);
    grew |= ensure(h_, T * c.hidden_size * a);
    grew |= ensure(mix_, T * c.hidden_size * a);
    grew |= ensure(proj_, T * std::max(full_proj_rows(c), in_proj_rows(c)) * a);
    grew |= ensure(conv_, T * c.linear_conv_dim() * a);
    grew |= ensure(core_, T * std::max(c.q_dim(), c.linear_value_dim()) * a);
    grew |= ensure(g_, T * c.linear_num_value_heads * sizeof(float));
    grew |= ensure(beta_, T * c.linear_num_value_heads * sizeof(float));
    grew |= ensure(gate_up_, T * 2 * c.intermediate_size * a);
    grew |= ensure(act_, T * c.intermediate_size * a);
    grew |= ensure(last_, max_seqs * c.hidden_size * a);
    grew |= ensure(logits_, max_seqs * c.vocab_size * sizeof(float));
    grew |= greedy_.reserve(max_seqs);
    if constexpr (std::is_same_v<Act, cuda::bf16>) {
      // Decode steps (padded to power-of-two buckets) may split each row's
      // key tiles over blocks: cuda::AttentionBatch::partials.
      grew |=
          cuda::ensure_attention_partials(partials_, partial_rows_, cuda::decode_bucket(max_seqs),
                                          c.num_attention_heads, c.head_dim);
    }
    if (prefill_alignment() > 1) {
      // The compact batch of the tokens the recurrent kernel takes in a step
      // with chunked tokens: q, k, v rows, g and beta, and its output.
      grew |= ensure(tail_conv_, T * c.linear_conv_dim() * a);
      grew |= ensure(tail_core_, T * c.linear_value_dim() * a);
      grew |= ensure(tail_gb_, 2 * T * c.linear_num_value_heads * sizeof(float));
      // The chunked kernel's per-chunk products: at most T / 64 chunks a step.
      grew |= ensure(gdn_ws_,
                     static_cast<size_t>(cuda::gdn_chunked_workspace_bytes(
                         T / cuda::kGdnChunk, c.linear_num_value_heads, c.linear_key_head_dim)));
    }
    if (grew) graphs_.clear();
  }

  void forward(const StepBatch& step, KvCache& kv, StatePool& /*states*/, float* logits) override {
    run_step(step, kv, logits, nullptr, nullptr);
  }

  bool forward_greedy(const StepBatch& step, KvCache& kv, StatePool& /*states*/, int32_t* ids,
                      float* margins) override {
    run_step(step, kv, nullptr, ids, margins);
    return true;
  }

  // One step; logits to the host, or the greedy ids and margins.
  void run_step(const StepBatch& step, KvCache& kv, float* logits, int32_t* ids, float* margins) {
    const int64_t S0 = step.num_seqs;
    const bool greedy = ids != nullptr;
    for (int64_t s = 0; s < S0; ++s)
      if (step.state_slot[s] < 0 || step.state_slot[s] >= slots_)
        fail("CUDA Qwen3.5: state slot {} outside the {} reserved", step.state_slot[s], slots_);
    const int64_t max_len = *std::max_element(step.seq_len, step.seq_len + S0);
    const bool graph = cuda::decode_graphs_enabled() && cuda::is_decode_step(step) &&
                       cuda::context_bucket(max_len) <= cuda::paged_attention_max_context();
    StepBatch padded;
    if (graph)
      padded = cuda::pad_decode(step, cuda::decode_bucket(S0), static_cast<int32_t>(slots_), pad_);
    const StepBatch& b = graph ? padded : step;
    ensure_buffers(b.num_tokens, b.num_seqs);
    ensure_kv(kv);
    const int64_t ctx = graph ? cuda::context_bucket(max_len) : max_len;
    // (a decode step has no chunked tokens; its padded copy's array is short)
    upload_step(b, graph ? nullptr : step.aligned_tokens);
    if (graph) {
      const cuda::DecodeGraphs::Key key{b.num_seqs,     b.max_blocks, kv_blocks_,
                                        kv_block_size_, ctx,          greedy};
      graphs_.run(key, stream_, [&] { run_layers(b, ctx, greedy); });
    } else {
      run_layers(b, ctx, greedy);
    }
    // The real sequences' rows (padding rows come after them).
    const int64_t rows = static_cast<int64_t>(logit_rows_.size());
    const int64_t r = graph ? S0 : rows;
    if (r > 0 && logits != nullptr)
      QTK_CUDA_CHECK(cudaMemcpyAsync(logits, logits_.as(), r * cfg_.vocab_size * sizeof(float),
                                     cudaMemcpyDeviceToHost, stream_));
    if (r > 0 && greedy) {
      greedy_.read(rows, r, ids, margins, stream_);
      return;
    }
    QTK_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  // Everything between the step upload and the logits copy: what a decode
  // graph captures.
  void run_layers(const StepBatch& b, int64_t max_seq_len, bool greedy) {
    const ModelConfig& c = cfg_;
    const int64_t T = b.num_tokens, H = c.hidden_size, I = c.intermediate_size;
    const float eps = static_cast<float>(c.rms_norm_eps);
    const DType dt = dtype_of<Act>();
    Act* h = h_.as<Act>();
    Act* mix = mix_.as<Act>();

    cuda::ResidualStream<Act> rs{x_.as<Act>(), x2_.as<Act>()};
    cuda::embedding_lookup<Act>(embed_.as(), dt, H, token_ids_, T, rs.x, H, stream_);
    for (int64_t li = 0; li < c.num_layers; ++li) {
      const Qwen3_5DeviceLayer& l = layers_[li];
      // The mixer's input projection (full attention: q+gate, k, v; GDN:
      // in_proj) of the input norm of x, into proj_.
      const bool full = l.kind == LayerKind::kFull;
      const void* w_in = full ? l.qkv_proj.as() : l.in_proj.as();
      const int64_t n_in = full ? full_proj_rows(c) : in_proj_rows(c);
      if (li == 0) {
        cuda::rmsnorm<Act>(rs.x, H, l.input_layernorm.as<float>(), h, H, T, H, eps, stream_);
        gemm_.run(h, H, w_in, H, proj_.as(), n_in, T, n_in, H, dt, dt, stream_);
      } else {  // x += the previous layer's MLP output (in mix) first
        cuda::add_norm_gemm<Act>(gemm_, rs, mix, l.input_layernorm.as<float>(), eps, h, w_in,
                                 proj_.as(), n_in, T, n_in, H, stream_);
      }
      if (full)
        full_attention(l, b, max_seq_len, mix);
      else
        linear_attention(l, b, mix);
      // MLP block: x += the mixer's output; the post-attention norm of x,
      // projected to gate and up.
      cuda::add_norm_mlp<Act>(gemm_, rs, mix, l.post_attention_layernorm.as<float>(), eps, h,
                              l.gate_up_proj.as(), gate_up_.as<Act>(), act_.as<Act>(),
                              l.down_proj.as(), mix, T, I, H, stream_);
    }
    // x += the last MLP output; h = the final norm of x.
    cuda::add_rmsnorm<Act>(rs.x, H, mix, H, norm_.as<float>(), h, H, T, H, eps, stream_);
    const int64_t r = static_cast<int64_t>(logit_rows_.size());
    if (r > 0) {
      cuda::embedding_lookup<Act>(h, dt, H, rows_, r, last_.as<Act>(), H, stream_);
      const void* head = tied_ ? embed_.as() : lm_head_.as();
      gemm_.run(last_.as(), H, head, H, logits_.as(), c.vocab_size, r, c.vocab_size, H, dt,
                DType::F32, stream_);
      if (greedy) greedy_.argmax(logits_.as<float>(), c.vocab_size, r, stream_);
    }
  }

 private:
  // Both mixers start from their input projection in proj_ (run_layers).
  void full_attention(const Qwen3_5DeviceLayer& l, const StepBatch& b, int64_t max_seq_len,
                      Act* out) {
    const ModelConfig& c = cfg_;
    const int64_t T = b.num_tokens, H = c.hidden_size, D = c.head_dim;
    const int64_t Hq = c.num_attention_heads, Hkv = c.num_kv_heads;
    const int64_t ld = full_proj_rows(c);
    const float eps = static_cast<float>(c.rms_norm_eps);
    const DType dt = dtype_of<Act>();
    Act* q = proj_.as<Act>();
    const Act* gate = q + c.q_dim();
    Act* k = q + 2 * c.q_dim();
    const Act* v = k + c.kv_dim();
    Act* kc = k_cache_.as<Act>() + l.kind_index * kv_layer_elems_;
    Act* vc = v_cache_.as<Act>() + l.kind_index * kv_layer_elems_;
    cuda::AttentionBatch ab;
    ab.num_seqs = b.num_seqs;
    ab.q_start = q_start_;
    ab.seq_len = seq_len_;
    ab.block_table = block_table_;
    ab.max_blocks = b.max_blocks;
    ab.block_size = kv_block_size_;
    ab.total_tokens = T;
    ab.max_seq_len = max_seq_len;
    ab.partials = partials_.as<float>();
    ab.partial_rows = partial_rows_;
    const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
    Act* core = core_.as<Act>();
    bool fused = false;
    if constexpr (std::is_same_v<Act, cuda::bf16>) {
      // A bf16 decode step: norms, RoPE, the cache write, the attention and
      // the output gate in one launch, the same values as the steps below.
      cuda::DecodeAttentionInput in;
      in.q = q;
      in.k = k;
      in.v = v;
      in.gate = gate;
      in.ldq = in.ldk = in.ldv = in.ldg = ld;
      in.q_norm = l.q_norm.as<float>();
      in.k_norm = l.k_norm.as<float>();
      in.eps = eps;
      in.positions = positions_;
      in.rope = rope_;
      in.slot_mapping = slot_mapping_;
      fused = cuda::decode_attention(in, kc, vc, core, c.q_dim(), ab, Hq, Hkv, D, scale, stream_);
    }
    if (!fused) {
      cuda::qk_norm_rope<Act>(q, ld, T, Hq, D, l.q_norm.as<float>(), eps, positions_, rope_,
                              stream_);
      cuda::qk_norm_rope<Act>(k, ld, T, Hkv, D, l.k_norm.as<float>(), eps, positions_, rope_,
                              stream_);
      cuda::kv_cache_write<Act>(k, ld, v, ld, T, Hkv, D, slot_mapping_, kc, vc, stream_);
      cuda::paged_attention<Act>(q, ld, kc, vc, core, c.q_dim(), ab, Hq, Hkv, D, scale, stream_);
      // Gated attention: each head's output times sigmoid(its gate).
      cuda::sigmoid_mul<Act>(core, c.q_dim(), gate, ld, T, c.q_dim(), stream_);
    }
    gemm_.run(core, c.q_dim(), l.o_proj.as(), c.q_dim(), out, H, T, H, c.q_dim(), dt, dt, stream_);
  }

  void linear_attention(const Qwen3_5DeviceLayer& l, const StepBatch& b, Act* out) {
    const ModelConfig& c = cfg_;
    const int64_t T = b.num_tokens, S = b.num_seqs, H = c.hidden_size;
    const int64_t Hk = c.linear_num_key_heads, Hv = c.linear_num_value_heads;
    const int64_t Dk = c.linear_key_head_dim, Dv = c.linear_value_head_dim;
    const int64_t C = c.linear_conv_dim(), K = c.linear_conv_kernel, Vd = c.linear_value_dim();
    const int64_t ld = in_proj_rows(c);
    const DType dt = dtype_of<Act>();
    Act* proj = proj_.as<Act>();
    const Act* z = proj + C;
    const Act* bcol = z + Vd;
    const Act* acol = bcol + Hv;
    // note: the pools are [slot][GDN layer][...]; slot s of layer gi is
    // "virtual slot" s * gdn_layers + gi of a pool with per-layer stride.
    const int32_t* vslot = layer_slots_ + l.kind_index * S;
    Act* conv = conv_.as<Act>();
    cuda::causal_conv1d<Act>(proj, ld, conv, C, C, l.conv1d.as<float>(), K, conv_state_.as<float>(),
                             vslot, q_start_, S, T, true, stream_);
    Act* q = conv;
    Act* k = conv + Hk * Dk;
    const Act* v = conv + 2 * Hk * Dk;
    const float q_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(Dk)));
    Act* core = core_.as<Act>();
    if (n_items_ == 0) {
      // Every token recurrent (decode steps, short prompts): the l2norms and
      // the gates inside the recurrent kernel's launch (same bits).
      cuda::GdnRawInput<Act> raw;
      raw.a = acol;
      raw.b = bcol;
      raw.lda = raw.ldb = ld;
      raw.A = l.A.as<float>();
      raw.dt_bias = l.dt_bias.as<float>();
      raw.eps = 1e-6f;
      raw.q_scale = q_scale;
      cuda::gated_delta_rule_fused<Act>(q, C, k, C, v, C, raw, rec_state_.as<float>(), vslot,
                                        q_start_, S, T, core, Vd, Hk, Hv, Dk, Dv, stream_);
    } else if constexpr (std::is_same_v<Act, cuda::bf16>) {
      cuda::l2norm_heads<Act>(q, C, T, Hk, Dk, 1e-6f, q_scale, stream_);
      cuda::l2norm_heads<Act>(k, C, T, Hk, Dk, 1e-6f, 1.0f, stream_);
      cuda::gdn_gates<Act>(acol, ld, bcol, ld, l.A.as<float>(), l.dt_bias.as<float>(),
                           g_.as<float>(), beta_.as<float>(), T, Hv, stream_);
      // note: prompt tokens in full aligned chunks go through the chunked
      // form first (they are the leading tokens of each sequence's run), then
      // the rest of each run (prompt tail, generated tokens) through the
      // recurrent kernel on a compact copy of those rows, continuing from the
      // state the chunked kernel left: each token takes the same kernel, with
      // the same arithmetic, however the prompt was scheduled.
      cuda::gated_delta_rule_chunked(q, C, k, C, v, C, g_.as<float>(), beta_.as<float>(),
                                     rec_state_.as<float>(), item_slots_ + l.kind_index * n_items_,
                                     item_first_, item_chunk_start_, n_items_, n_chunks_,
                                     gdn_ws_.as(), core, Vd, Hk, Hv, Dk, Dv, stream_);
      if (n_tail_ > 0) {
        Act* tq = tail_conv_.as<Act>();
        float* tg = tail_gb_.as<float>();
        float* tb = tg + n_tail_ * Hv;
        Act* tcore = tail_core_.as<Act>();
        cuda::copy_rows<Act>(conv, C, tail_rows_, tq, C, nullptr, n_tail_, C, stream_);
        cuda::copy_rows<float>(g_.as<float>(), Hv, tail_rows_, tg, Hv, nullptr, n_tail_, Hv,
                               stream_);
        cuda::copy_rows<float>(beta_.as<float>(), Hv, tail_rows_, tb, Hv, nullptr, n_tail_, Hv,
                               stream_);
        cuda::gated_delta_rule<Act>(tq, C, tq + Hk * Dk, C, tq + 2 * Hk * Dk, C, tg, tb,
                                    rec_state_.as<float>(), vslot, tail_start_, S, n_tail_, tcore,
                                    Vd, Hk, Hv, Dk, Dv, stream_);
        cuda::copy_rows<Act>(tcore, Vd, nullptr, core, Vd, tail_rows_, n_tail_, Vd, stream_);
      }
    }
    cuda::gated_rmsnorm<Act>(core, Vd, z, ld, l.norm.as<float>(), core, Vd, T, Hv, Dv,
                             static_cast<float>(c.rms_norm_eps), stream_);
    gemm_.run(core, Vd, l.out_proj.as(), Vd, out, H, T, H, Vd, dt, dt, stream_);
  }

  void ensure_kv(const KvCache& kv) {
    if (kv_blocks_ == kv.num_blocks() && kv_block_size_ == kv.block_size()) return;
    kv_blocks_ = kv.num_blocks();
    kv_block_size_ = kv.block_size();
    kv_layer_elems_ = kv_blocks_ * kv_block_size_ * cfg_.kv_dim();
    k_cache_ = DeviceMemory(std::max<int64_t>(attn_layers_, 1) * kv_layer_elems_ * sizeof(Act));
    v_cache_ = DeviceMemory(std::max<int64_t>(attn_layers_, 1) * kv_layer_elems_ * sizeof(Act));
    graphs_.clear();
  }

  // Step arrays to the device in one copy; zeroes the state of sequences
  // that start at position 0 (new, or recomputed after preemption).
  // aligned: StepBatch::aligned_tokens of b (nullptr: none).
  void upload_step(const StepBatch& b, const int32_t* aligned) {
    const int64_t T = b.num_tokens, S = b.num_seqs, L = gdn_layers_;
    logit_rows_.clear();
    for (int64_t s = 0; s < S; ++s)
      if (b.want_logits[s]) logit_rows_.push_back(b.q_start[s + 1] - 1);
    const int64_t n_rows = static_cast<int64_t>(logit_rows_.size());
    // Chunked GDN items (sequences with aligned tokens) and the other rows.
    items_.clear();
    tail_rows_host_.clear();
    tail_start_host_.assign(1, 0);
    const int64_t A = prefill_alignment();
    for (int64_t s = 0; s < S; ++s) {
      const int64_t q_len = b.q_start[s + 1] - b.q_start[s];
      const int64_t a = A > 1 && aligned != nullptr ? aligned[s] : 0;
      if (a < 0 || a > q_len || a % A != 0)
        fail(
            "CUDA Qwen3.5: sequence {} of the step has {} aligned tokens of {} (expected a "
            "multiple of {} up to its tokens)",
            s, a, q_len, A);
      if (a > 0) items_.push_back(s);
      for (int64_t t = b.q_start[s] + a; t < b.q_start[s + 1]; ++t)
        tail_rows_host_.push_back(static_cast<int32_t>(t));
      tail_start_host_.push_back(static_cast<int32_t>(tail_rows_host_.size()));
    }
    n_items_ = static_cast<int64_t>(items_.size());
    n_tail_ = static_cast<int64_t>(tail_rows_host_.size());
    const int64_t n_chunk_arrays = n_items_ > 0 ? (L + 2) * n_items_ + 1 + n_tail_ + S + 1 : 0;
    const int64_t n32 =
        2 * T + T + 3 * T + (S + 1) + S + S * b.max_blocks + n_rows + L * S + n_chunk_arrays;
    host_step_.resize(n32);
    int32_t* p = host_step_.data();
    std::memcpy(p, b.slot_mapping, T * sizeof(int64_t));
    p += 2 * T;
    std::vector<int64_t> offsets;
    auto put = [&](const int32_t* src, int64_t n) {
      offsets.push_back(p - host_step_.data());
      std::memcpy(p, src, n * sizeof(int32_t));
      p += n;
    };
    put(b.token_ids, T);
    put(b.positions, 3 * T);
    put(b.q_start, S + 1);
    put(b.seq_len, S);
    put(b.block_table, S * b.max_blocks);
    put(logit_rows_.data(), n_rows);
    offsets.push_back(p - host_step_.data());
    for (int64_t gi = 0; gi < L; ++gi)
      for (int64_t s = 0; s < S; ++s) *p++ = static_cast<int32_t>(b.state_slot[s] * L + gi);
    if (n_items_ > 0) {
      offsets.push_back(p - host_step_.data());  // [7] item slots per GDN layer
      for (int64_t gi = 0; gi < L; ++gi)
        for (int32_t s : items_) *p++ = static_cast<int32_t>(b.state_slot[s] * L + gi);
      offsets.push_back(p - host_step_.data());  // [8] item first rows
      for (int32_t s : items_) *p++ = b.q_start[s];
      offsets.push_back(p - host_step_.data());  // [9] item chunk starts (prefix sums)
      n_chunks_ = 0;
      *p++ = 0;
      for (int32_t s : items_) *p++ = static_cast<int32_t>(n_chunks_ += aligned[s] / A);
      put(tail_rows_host_.data(), n_tail_);  // [10]
      put(tail_start_host_.data(), S + 1);   // [11]
    }
    if (ensure(step_, n32 * sizeof(int32_t))) graphs_.clear();
    for (int64_t s = 0; s < S; ++s) {
      const int64_t q_len = b.q_start[s + 1] - b.q_start[s];
      // (the padding rows' scratch slot is never cleared: their results are dropped)
      if (L > 0 && b.seq_len[s] == q_len && b.state_slot[s] != slots_) {  // starts at position 0
        const int64_t slot = b.state_slot[s];
        QTK_CUDA_CHECK(cudaMemsetAsync(conv_state_.as<float>() + slot * L * conv_floats_, 0,
                                       L * conv_floats_ * sizeof(float), stream_));
        QTK_CUDA_CHECK(cudaMemsetAsync(rec_state_.as<float>() + slot * L * rec_floats_, 0,
                                       L * rec_floats_ * sizeof(float), stream_));
      }
    }
    QTK_CUDA_CHECK(cudaMemcpyAsync(step_.as(), host_step_.data(), n32 * sizeof(int32_t),
                                   cudaMemcpyHostToDevice, stream_));
    int32_t* base = step_.as<int32_t>();
    slot_mapping_ = reinterpret_cast<const int64_t*>(base);
    token_ids_ = base + offsets[0];
    positions_ = base + offsets[1];
    q_start_ = base + offsets[2];
    seq_len_ = base + offsets[3];
    block_table_ = base + offsets[4];
    rows_ = base + offsets[5];
    layer_slots_ = base + offsets[6];
    if (n_items_ > 0) {
      item_slots_ = base + offsets[7];
      item_first_ = base + offsets[8];
      item_chunk_start_ = base + offsets[9];
      tail_rows_ = base + offsets[10];
      tail_start_ = base + offsets[11];
    }
  }

  ModelConfig cfg_;
  const bool chunked_enabled_ = tuning().gdn_chunked;
  cudaStream_t stream_ = nullptr;
  cuda::DecodeGraphs graphs_;
  cuda::PaddedDecode pad_;
  int64_t max_context_ = 0;
  cuda::Gemm gemm_;
  cuda::RopeParams rope_;
  bool tied_ = false;
  DeviceMemory embed_;       // Act [vocab, hidden]
  DeviceMemory lm_head_;     // Act [vocab, hidden] (absent when tied)
  DeviceMemory norm_;        // f32 [hidden] (1+w folded)
  DeviceMemory rope_table_;  // f32x2 [max_context, rotary_dim / 2] RoPE (cos, sin)
  std::vector<Qwen3_5DeviceLayer> layers_;
  int64_t attn_layers_ = 0, gdn_layers_ = 0;

  int64_t kv_blocks_ = -1, kv_block_size_ = -1, kv_layer_elems_ = 0;
  DeviceMemory k_cache_, v_cache_;  // Act [attention layers][num_blocks, block_size, Hkv, D]
  // note: f32 state in both precisions: the delta rule accumulates into it
  // over every token of a sequence.
  int64_t slots_ = 0, conv_floats_ = 0, rec_floats_ = 0;
  DeviceMemory conv_state_;  // f32 [slots][GDN layers][conv_dim, K-1]
  DeviceMemory rec_state_;   // f32 [slots][GDN layers][Hv, Dk, Dv]

  DeviceMemory x_, x2_, h_, mix_;  // Act [T, hidden]: residual (two: cuda::ResidualStream),
                                   // normed input, block output
  DeviceMemory proj_;              // Act [T, max(qkv width, in_proj width)]
  DeviceMemory conv_;              // Act [T, conv_dim]
  DeviceMemory core_;              // Act [T, max(Hq*D, Hv*Dv)]
  DeviceMemory g_, beta_;          // f32 [T, Hv]
  DeviceMemory gate_up_;           // Act [T, 2*intermediate]
  DeviceMemory act_;               // Act [T, intermediate]
  DeviceMemory last_;              // Act [seqs, hidden]
  DeviceMemory logits_;            // f32 [seqs, vocab]
  cuda::GreedyReadback greedy_;    // ids and margins of forward_greedy
  // bf16 steps with chunked GDN tokens: the recurrent kernel's compact batch.
  DeviceMemory tail_conv_;  // Act [T, conv_dim]: q, k, v rows
  DeviceMemory tail_core_;  // Act [T, Hv*Dv]: its output
  DeviceMemory tail_gb_;    // f32 [T, Hv] g, then f32 [T, Hv] beta
  DeviceMemory gdn_ws_;     // the chunked kernel's workspace (T / 64 chunks)
  DeviceMemory partials_;   // f32 attention split workspace (bf16 only), partial_rows_ rows
  DeviceMemory step_;       // int32 step arrays
  int64_t partial_rows_ = 0;
  cuda::PinnedVector<int32_t> host_step_;  // the step arrays on their way up
  std::vector<int32_t> logit_rows_;
  // This step's chunked GDN items (sequence indices) and the other rows.
  std::vector<int32_t> items_, tail_rows_host_, tail_start_host_;
  int64_t n_items_ = 0, n_tail_ = 0, n_chunks_ = 0;
  const int32_t *item_slots_ = nullptr, *item_first_ = nullptr, *item_chunk_start_ = nullptr,
                *tail_rows_ = nullptr, *tail_start_ = nullptr;
  const int64_t* slot_mapping_ = nullptr;
  const int32_t *token_ids_ = nullptr, *positions_ = nullptr, *q_start_ = nullptr,
                *seq_len_ = nullptr, *block_table_ = nullptr, *rows_ = nullptr,
                *layer_slots_ = nullptr;
};

}  // namespace

std::unique_ptr<CudaModel> make_cuda_qwen3_5(const Pack& pack, CudaPrecision precision) {
  if (precision == CudaPrecision::kF32) return std::make_unique<CudaQwen3_5<float>>(pack);
  return std::make_unique<CudaQwen3_5<cuda::bf16>>(pack);
}

}  // namespace qtk
