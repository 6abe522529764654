// The CUDA backend: a CudaModel (cuda_model.h) that runs an architecture's
// blocks (runtime/backend/blocks.h, runtime/models/*) with the CUDA kernels.
// Weights are uploaded once (CudaWeights), the K/V cache and the per-slot
// conv / recurrent state live in device memory, and a decode step's blocks
// run inside one CUDA graph (decode_graphs.h).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <optional>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "core/tuning.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/gdn_chunked.h"
#include "kernels/cuda/gemm.h"
#include "pack/pack.h"
#include "runtime/backend/blocks.h"
#include "runtime/backend/cuda/cuda_model.h"
#include "runtime/backend/cuda/cuda_moe.h"
#include "runtime/backend/cuda/decode_graphs.h"
#include "runtime/backend/cuda/device_memory.h"
#include "runtime/backend/cuda/device_upload.h"
#include "runtime/backend/cuda/device_weight.h"
#include "runtime/backend/cuda/fused_steps.h"
#include "runtime/backend/cuda/nccl.h"
#include "runtime/backend/cuda/process_memory.h"
#include "runtime/backend/cuda/step_io.h"
#include "runtime/kv_cache.h"
#include "runtime/models/architecture.h"
#include "runtime/models/weight_binder.h"

namespace qtk {
namespace {

using cuda::bf16;
using cuda::DeviceMemory;
using cuda::dtype_of;
using cuda::ensure;

// The most sequences whose decode step runs Qwen3.5's gated norm inside the
// recurrent GDN launch (delta_net).
constexpr int64_t kGdnNormFusedMaxSeqs = 16;

// The CUDA backend's weights: each pack tensor uploaded once (Act = the
// precision's matrix type, f32 or bf16; block-FP8 matrices stay e4m3 with
// their scales, device_weight.h; vectors and tables stay f32). A name bound
// twice (a tied lm_head is embed_tokens again) gets the id of its first
// upload.
template <class Act>
class CudaWeights final : public WeightBinder {
 public:
  CudaWeights(const Pack& pack, TpRank tp) : WeightBinder(pack, tp) {}
  using WeightBinder::release_slices;
  bool copies_on_adopt() const override { return true; }  // every adopt_* uploads

  const cuda::DeviceWeight& matrix(Matrix m) const { return matrices_[m.id]; }
  const float* vector(Vector v) const { return vectors_[v.id].as<float>(); }
  const cuda::CudaMoeWeights& experts(Experts e) const { return experts_[e.id]; }

 protected:
  int32_t adopt_matrix(const std::string& name, const TensorView& v, const PackFp8Scales* fp8,
                       MatrixUse use) override {
    if (use == MatrixUse::kEmbedding && v.dtype == DType::F8_E4M3)
      fail(
          "{}: tensor '{}' is F8_E4M3; an FP8 embedding table is not supported (expected BF16, "
          "F16 or F32)",
          pack().path(), name);
    if (auto it = matrix_ids_.find(name); it != matrix_ids_.end()) return it->second;
    matrices_.push_back(cuda::upload_weight<Act>(pack(), name, v, fp8));
    const auto id = static_cast<int32_t>(matrices_.size() - 1);
    matrix_ids_.emplace(name, id);
    return id;
  }
  // Vectors f32 [n] and tables f32 [rows, cols] (the conv1d weights), as they are.
  int32_t adopt_vector(const std::string& name, const TensorView& v) override {
    if (auto it = vector_ids_.find(name); it != vector_ids_.end()) return it->second;
    const size_t bytes = static_cast<size_t>(v.numel()) * sizeof(float);
    DeviceMemory d(bytes);
    cuda::upload_pack_bytes(pack(), d.as(), v.data, bytes);
    vectors_.push_back(std::move(d));
    const auto id = static_cast<int32_t>(vectors_.size() - 1);
    vector_ids_.emplace(name, id);
    return id;
  }
  int32_t adopt_experts(const std::string& prefix, const MoeWeights& w) override {
    experts_.push_back(cuda::upload_moe_weights<Act>(pack(), prefix, w));
    return static_cast<int32_t>(experts_.size() - 1);
  }

 private:
  std::vector<cuda::DeviceWeight> matrices_;   // Act or FP8 [rows, cols], by Matrix::id
  std::vector<cuda::CudaMoeWeights> experts_;  // by Experts::id
  std::vector<DeviceMemory> vectors_;          // f32, by Vector::id
  std::unordered_map<std::string, int32_t> matrix_ids_, vector_ids_;
};

// Rows of the GDN in_proj: q, k, v (the conv channels), z, b, a.
int64_t in_proj_rows(const ModelConfig& c) {
  return c.linear_conv_dim() + c.linear_value_dim() + 2 * c.linear_num_value_heads;
}
// Rows of a gated full-attention qkv_proj: q and its output gate, k, v (the
// widest attention projection; a plain one has no gate rows).
int64_t full_proj_rows(const ModelConfig& c) { return 2 * c.q_dim() + 2 * c.kv_dim(); }

template <class Act>
class CudaBackend final : public CudaModel, private Blocks {
 public:
  // tp, comm: rank tp.rank of a tensor-parallel model (runtime/parallel),
  // on the current device; comm adds the ranks' partial sums.
  CudaBackend(const Pack& pack, TpRank tp, cuda::DeviceCollective* comm)
      : weights_(pack, tp), tp_(tp), comm_(comm) {
    arch_ = bind_architecture(weights_);
    weights_.release_slices();  // uploaded: the host copies of a rank's slices can go
    cfg_ = arch_->config();
    attn_layers_ = arch_->attention_layers();
    gdn_layers_ = arch_->delta_net_layers();
    conv_floats_ = arch_->conv_state_floats();
    rec_floats_ = arch_->rec_state_floats();
    const RopeSpec r = arch_->rope();
    rope_.rotary_dim = r.rotary_dim;
    rope_.theta = r.theta;
    rope_.n_sections = static_cast<int>(r.mrope_section.size());
    for (int a = 0; a < rope_.n_sections; ++a)
      rope_.sections[a] = static_cast<int>(r.mrope_section[a]);
    rope_.interleaved = r.mrope_interleaved;
    if (cfg_.has_moe()) moe_.emplace(cfg_);
    QTK_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    cuda::release_upload_staging();  // the weights are up: its pinned buffers can go
  }
  ~CudaBackend() override { cudaStreamDestroy(stream_); }

  const ModelConfig& config() const override { return cfg_; }
  CacheSpec cache_spec() const override { return arch_->cache_spec(); }
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

  void forward(const StepBatch& step, KvCache& kv, StatePool& /*states*/, float* logits) override {
    run_step(step, kv, logits, nullptr, nullptr);
  }

  bool forward_greedy(const StepBatch& step, KvCache& kv, StatePool& /*states*/, int32_t* ids,
                      float* margins) override {
    run_step(step, kv, nullptr, ids, margins);
    return true;
  }

  // note: pipelined steps. The step is launched and its ids and margins are
  // queued for the host (page-locked slot submitted_ % 2, an event behind
  // them); the next step's fed tokens read the same device ids in its
  // embedding, in stream order after this step's argmax and before its own.
  // Tensor-parallel ranks take the synchronous path (the TP model drives
  // them step by step).
  bool greedy_submit(const StepBatch& step, KvCache& kv, StatePool& /*states*/) override {
    if (comm_ != nullptr) return false;
    if (queued_.size() >= 2)
      fail("CUDA backend: greedy_submit with two steps queued (collect one first)");
    const auto [rows, r] = launch_step(step, kv, true);
    const int slot = static_cast<int>(submitted_++ % 2);
    greedy_.queue(rows, slot, stream_);
    queued_.push_back({slot, r});
    return true;
  }
  void greedy_collect(int32_t* ids, float* margins) override {
    if (queued_.empty()) fail("CUDA backend: greedy_collect with no step queued");
    const Queued q = queued_.front();
    queued_.pop_front();
    greedy_.finish(q.slot, q.n, ids, margins);
  }

 private:
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
    grew |= greedy_.reserve(max_seqs, stream_);
    if constexpr (std::is_same_v<Act, bf16>) {
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
    if (moe_) grew |= moe_->reserve(T);
    if (comm_ != nullptr) {
      const int64_t bytes = T * c.hidden_size * static_cast<int64_t>(a);
      if (bytes > comm_->reserved_bytes_per_rank()) {
        comm_->reserve(bytes);
        grew = true;
      }
    }
    if (grew) graphs_.clear();
  }

  // One step; logits to the host, or the greedy ids and margins.
  void run_step(const StepBatch& step, KvCache& kv, float* logits, int32_t* ids, float* margins) {
    if (!queued_.empty())
      fail("CUDA backend: a synchronous step with pipelined steps queued (collect them first)");
    const bool greedy = ids != nullptr;
    const auto [rows, r] = launch_step(step, kv, greedy);
    if (r > 0 && logits != nullptr)
      QTK_CUDA_CHECK(cudaMemcpyAsync(logits, logits_.as(), r * cfg_.vocab_size * sizeof(float),
                                     cudaMemcpyDeviceToHost, stream_));
    if (r > 0 && greedy) {
      greedy_.read(rows, r, ids, margins, stream_);
      return;
    }
    QTK_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  // Uploads and launches one step (a decode graph or eager kernels), up to
  // its logits and, when greedy, their argmax on the device. Returns the
  // logit rows the step computed (a padded graph's included) and how many of
  // them are the real sequences' (the first ones).
  std::pair<int64_t, int64_t> launch_step(const StepBatch& step, KvCache& kv, bool greedy) {
    const int64_t S0 = step.num_seqs;
    if (gdn_layers_ > 0) {
      for (int64_t s = 0; s < S0; ++s)
        if (step.state_slot[s] < 0 || step.state_slot[s] >= slots_)
          fail("CUDA backend: state slot {} outside the {} reserved", step.state_slot[s], slots_);
    }
    const int64_t max_len = *std::max_element(step.seq_len, step.seq_len + S0);
    const bool graph = cuda::decode_graphs_enabled() && cuda::is_decode_step(step) &&
                       cuda::context_bucket(max_len) <= cuda::paged_attention_max_context();
    StepBatch padded;
    if (graph)
      padded = cuda::pad_decode(step, cuda::decode_bucket(S0), static_cast<int32_t>(slots_), pad_);
    const StepBatch& b = graph ? padded : step;
    ensure_buffers(b.num_tokens, b.num_seqs);
    ensure_kv(kv);
    // note: graphs size attention's shared memory by a context bucket, so
    // that one graph serves many steps; eager steps use the exact maximum.
    const int64_t ctx = graph ? cuda::context_bucket(max_len) : max_len;
    // (a decode step has no chunked tokens; its padded copy's array is short)
    upload_step(b, graph ? nullptr : step.aligned_tokens);
    if (graph) {
      const cuda::DecodeGraphs::Key key{b.num_seqs,     b.max_blocks, kv_blocks_,
                                        kv_block_size_, ctx,          greedy};
      graphs_.run(key, stream_, [&] { run_blocks(b, ctx, greedy); });
    } else {
      run_blocks(b, ctx, greedy);
    }
    // The real sequences' rows (padding rows come after them).
    const int64_t rows = static_cast<int64_t>(logit_rows_.size());
    return {rows, graph ? S0 : rows};
  }

  // Everything between the step upload and the logits copy (what a decode
  // graph captures): the architecture's forward pass over the blocks below.
  void run_blocks(const StepBatch& b, int64_t max_seq_len, bool greedy) {
    step_b_ = &b;
    max_seq_len_ = max_seq_len;
    greedy_step_ = greedy;
    arch_->forward(*this);
    step_b_ = nullptr;
  }

  // ---- blocks (runtime/backend/blocks.h) ----
  // The pending sublayer output d is mix_; the residual stream x is rs_ (two
  // buffers: the fused add + norm launches write the new residual into the
  // spare one).

  const cuda::DeviceWeight& weight(Matrix m) const { return weights_.matrix(m); }
  // A dense matrix's device pointer (the fused paths take only those).
  const void* mat(Matrix m) const { return weights_.matrix(m).data.as(); }
  // A tensor-parallel rank's sublayer output is its partial sum: add the
  // ranks' partials (runtime/backend/cuda/nccl.h: an all-gather, then the
  // sum in rank order, the same bits on every rank) before anything reads it.
  void reduce_pending() {
    if (comm_ != nullptr)
      comm_->all_reduce_sum<Act>(mix_.as<Act>(), step_b_->num_tokens * cfg_.hidden_size, stream_);
  }
  bool fp8(Matrix m) const { return weights_.matrix(m).fp8; }
  // y = x w^T for any weight (device_weight.h: cuBLASLt, or the FP8 product).
  template <class Y = Act>
  void project(const Act* x, int64_t ldx, Matrix w, Y* y, int64_t ldy, int64_t rows) {
    cuda::project<Act, Y>(gemm_, x, ldx, weight(w), y, ldy, rows, stream_);
  }
  const float* vec(Vector v) const { return weights_.vector(v); }
  float eps() const { return static_cast<float>(cfg_.rms_norm_eps); }

  void embed(Matrix table) override {
    const int64_t T = step_b_->num_tokens, H = cfg_.hidden_size;
    rs_ = cuda::ResidualStream<Act>{x_.as<Act>(), x2_.as<Act>()};
    cuda::embedding_lookup<Act>(mat(table), dtype_of<Act>(), H, token_ids_, T, rs_.x, H, stream_,
                                feed_, greedy_.ids());
    pending_ = false;
  }

  // The mixer's input projection of the input norm of x, into proj_ (its
  // matrices' columns side by side).
  void norm_project(Vector norm, std::span<const Matrix> w) override {
    const int64_t T = step_b_->num_tokens, H = cfg_.hidden_size;
    const DType dt = dtype_of<Act>();
    Act* h = h_.as<Act>();
    Act* mix = mix_.as<Act>();
    proj_ld_ = 0;
    for (const Matrix& m : w) proj_ld_ += m.rows;
    if (w.size() == 1 && !fp8(w[0])) {
      if (!pending_) {  // the first layer: x is the embedding
        cuda::rmsnorm<Act>(rs_.x, H, vec(norm), h, H, T, H, eps(), stream_);
        gemm_.run(h, H, mat(w[0]), H, proj_.as(), proj_ld_, T, proj_ld_, H, dt, dt, stream_);
      } else {  // x += the previous layer's MLP output (in mix) first
        cuda::add_norm_gemm<Act>(gemm_, rs_, mix, vec(norm), eps(), h, mat(w[0]), proj_.as(),
                                 proj_ld_, T, proj_ld_, H, stream_);
      }
    } else {
      // Several matrices (FP8 packs' split in_proj) or an FP8 one: the norm
      // once, then one product per matrix into its columns.
      if (pending_)
        cuda::add_rmsnorm<Act>(rs_.x, H, mix, H, vec(norm), h, H, T, H, eps(), stream_);
      else
        cuda::rmsnorm<Act>(rs_.x, H, vec(norm), h, H, T, H, eps(), stream_);
      int64_t col = 0;
      for (const Matrix& m : w) {
        project(h, H, m, proj_.as<Act>() + col, proj_ld_, T);
        col += m.rows;
      }
    }
    pending_ = false;
  }

  cuda::AttentionBatch attention_batch() const {
    const StepBatch& b = *step_b_;
    cuda::AttentionBatch ab;
    ab.num_seqs = b.num_seqs;
    ab.q_start = q_start_;
    ab.seq_len = seq_len_;
    ab.block_table = block_table_;
    ab.max_blocks = b.max_blocks;
    ab.block_size = kv_block_size_;
    ab.total_tokens = b.num_tokens;
    ab.max_seq_len = max_seq_len_;
    ab.partials = partials_.as<float>();
    ab.partial_rows = partial_rows_;
    return ab;
  }

  void attention(const AttentionLayer& l) override {
    const ModelConfig& c = cfg_;
    const int64_t T = step_b_->num_tokens, H = c.hidden_size, D = c.head_dim;
    const int64_t Hq = c.num_attention_heads, Hkv = c.num_kv_heads;
    const int64_t ld = proj_ld_;
    Act* q = proj_.as<Act>();
    const Act* gate = q + c.q_dim();  // gated layouts only
    Act* k = q + (l.gated ? 2 : 1) * c.q_dim();
    const Act* v = k + c.kv_dim();
    Act* kc = kv_k(l.cache_layer);
    Act* vc = kv_v(l.cache_layer);
    const cuda::AttentionBatch ab = attention_batch();
    const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
    Act* core = core_.as<Act>();
    if (!l.gated) {
      // q/k norms, RoPE, the K/V cache write and the attention: one launch
      // at decode in bf16 (cuda::decode_attention), else two.
      if (!decode_attention(l, ab, scale)) {
        cuda::qkv_rope_cache<Act>(q, ld, T, Hq, Hkv, D, vec(l.q_norm), vec(l.k_norm), eps(),
                                  positions_, rope_, slot_mapping_, kc, vc, stream_);
        cuda::paged_attention<Act>(q, ld, kc, vc, core, c.q_dim(), ab, Hq, Hkv, D, scale, stream_);
      }
    } else {
      bool fused = false;
      if constexpr (std::is_same_v<Act, bf16>) {
        // A bf16 decode step: norms, RoPE, the cache write, the attention and
        // the output gate in one launch, the same values as the steps below.
        cuda::DecodeAttentionInput in;
        in.q = q;
        in.k = k;
        in.v = v;
        in.gate = gate;
        in.ldq = in.ldk = in.ldv = in.ldg = ld;
        in.q_norm = vec(l.q_norm);
        in.k_norm = vec(l.k_norm);
        in.eps = eps();
        in.positions = positions_;
        in.rope = rope_;
        in.slot_mapping = slot_mapping_;
        fused = cuda::decode_attention(in, kc, vc, core, c.q_dim(), ab, Hq, Hkv, D, scale, stream_);
      }
      if (!fused) {
        cuda::qk_norm_rope<Act>(q, ld, T, Hq, D, vec(l.q_norm), eps(), positions_, rope_, stream_);
        cuda::qk_norm_rope<Act>(k, ld, T, Hkv, D, vec(l.k_norm), eps(), positions_, rope_, stream_);
        cuda::kv_cache_write<Act>(k, ld, v, ld, T, Hkv, D, slot_mapping_, kc, vc, stream_);
        cuda::paged_attention<Act>(q, ld, kc, vc, core, c.q_dim(), ab, Hq, Hkv, D, scale, stream_);
        // Gated attention: each head's output times sigmoid(its gate).
        cuda::sigmoid_mul<Act>(core, c.q_dim(), gate, ld, T, c.q_dim(), stream_);
      }
    }
    project(core, c.q_dim(), l.o_proj, mix_.as<Act>(), H, T);
    reduce_pending();
    pending_ = true;
  }

  // The whole attention of a bf16 decode step of a plain (ungated) layer in
  // one launch, from the raw q, k, v rows in proj_; false (nothing launched)
  // where it does not apply.
  // note: only up to kMaxFusedSeqs sequences, or more where the kernel walks
  // each (sequence, kv head) in one block (cuda::decode_attention_walks: up
  // to 4 blocks an SM), which norms its query rows once. H100, Qwen3-0.6B,
  // ms per decode step fused (split over key tiles) vs separate: batch 1
  // 1.10 vs 1.19, batch 32 1.65 vs 1.75-1.81, batch 128 2.76-2.79 vs 2.70;
  // at 128 the split kernel is bound by the K/V reads and each block's extra
  // q-norm work (once per key tile) costs more than the launch it saves.
  // The values are the same either way.
  static constexpr int64_t kMaxFusedSeqs = 64;
  bool decode_attention(const AttentionLayer& l, const cuda::AttentionBatch& ab, float scale) {
    if constexpr (!std::is_same_v<Act, bf16>) {
      return false;
    } else {
      const ModelConfig& c = cfg_;
      if (ab.num_seqs > kMaxFusedSeqs &&
          !cuda::decode_attention_walks(ab, c.num_attention_heads, c.num_kv_heads, c.head_dim))
        return false;
      cuda::DecodeAttentionInput in;
      in.q = proj_.as<bf16>();
      in.k = in.q + c.q_dim();
      in.v = in.k + c.kv_dim();
      in.ldq = in.ldk = in.ldv = proj_ld_;
      in.q_norm = vec(l.q_norm);
      in.k_norm = vec(l.k_norm);
      in.eps = eps();
      in.positions = positions_;
      in.rope = rope_;
      in.slot_mapping = slot_mapping_;
      return cuda::decode_attention(in, kv_k(l.cache_layer), kv_v(l.cache_layer), core_.as<bf16>(),
                                    c.q_dim(), ab, c.num_attention_heads, c.num_kv_heads,
                                    c.head_dim, scale, stream_);
    }
  }

  void delta_net(const DeltaNetLayer& l) override {
    const ModelConfig& c = cfg_;
    const int64_t T = step_b_->num_tokens, S = step_b_->num_seqs, H = c.hidden_size;
    const int64_t Hk = c.linear_num_key_heads, Hv = c.linear_num_value_heads;
    const int64_t Dk = c.linear_key_head_dim, Dv = c.linear_value_head_dim;
    const int64_t C = c.linear_conv_dim(), K = c.linear_conv_kernel, Vd = c.linear_value_dim();
    const int64_t ld = proj_ld_;
    Act* proj = proj_.as<Act>();
    const Act* z = proj + C;
    const Act* bcol = z + Vd;
    const Act* acol = bcol + Hv;
    // note: the pools are [slot][GDN layer][...]; slot s of layer gi is
    // "virtual slot" s * gdn_layers + gi of a pool with per-layer stride.
    const int32_t* vslot = layer_slots_ + l.state_layer * S;
    Act* conv = conv_.as<Act>();
    cuda::causal_conv1d<Act>(proj, ld, conv, C, C, vec(l.conv1d), K, conv_state_.as<float>(), vslot,
                             q_start_, S, T, max_run_, true, stream_);
    Act* q = conv;
    Act* k = conv + Hk * Dk;
    const Act* v = conv + 2 * Hk * Dk;
    const float q_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(Dk)));
    Act* core = core_.as<Act>();
    bool normed = false;  // the gated norm applied by the recurrent launch
    if (n_items_ == 0) {
      // Every token recurrent (decode steps, short prompts): the l2norms and
      // the gates inside the recurrent kernel's launch (same bits).
      cuda::GdnRawInput<Act> raw;
      raw.a = acol;
      raw.b = bcol;
      raw.lda = raw.ldb = ld;
      raw.A = vec(l.A);
      raw.dt_bias = vec(l.dt_bias);
      raw.eps = 1e-6f;
      raw.q_scale = q_scale;
      // note: the gated norm in the same launch (same bits) up to 16
      // sequences: at batch 1 it saves a dependent launch per GDN layer
      // (Qwen3.5-0.8B 1,186-1,192 -> 1,246-1,253 tok/s, H200); at 128 the
      // clusters' barriers cost more than the launch (40,385-40,770 ->
      // 39,567-39,677); at 32 no difference was measured.
      if (S <= kGdnNormFusedMaxSeqs && cuda::gdn_norm_fusable(Dv)) {
        raw.z = z;
        raw.ldz = ld;
        raw.norm = vec(l.norm);
        raw.norm_eps = eps();
        normed = true;
      }
      cuda::gated_delta_rule_fused<Act>(q, C, k, C, v, C, raw, rec_state_.as<float>(), vslot,
                                        q_start_, S, T, core, Vd, Hk, Hv, Dk, Dv, stream_);
    } else if constexpr (std::is_same_v<Act, bf16>) {
      cuda::l2norm_heads<Act>(q, C, T, Hk, Dk, 1e-6f, q_scale, stream_);
      cuda::l2norm_heads<Act>(k, C, T, Hk, Dk, 1e-6f, 1.0f, stream_);
      cuda::gdn_gates<Act>(acol, ld, bcol, ld, vec(l.A), vec(l.dt_bias), g_.as<float>(),
                           beta_.as<float>(), T, Hv, stream_);
      // note: prompt tokens in full aligned chunks go through the chunked
      // form first (they are the leading tokens of each sequence's run), then
      // the rest of each run (prompt tail, generated tokens) through the
      // recurrent kernel on a compact copy of those rows, continuing from the
      // state the chunked kernel left: each token takes the same kernel, with
      // the same arithmetic, however the prompt was scheduled.
      cuda::gated_delta_rule_chunked(q, C, k, C, v, C, g_.as<float>(), beta_.as<float>(),
                                     rec_state_.as<float>(), item_slots_ + l.state_layer * n_items_,
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
    if (!normed)
      cuda::gated_rmsnorm<Act>(core, Vd, z, ld, vec(l.norm), core, Vd, T, Hv, Dv, eps(), stream_);
    project(core, Vd, l.out_proj, mix_.as<Act>(), H, T);
    reduce_pending();
    pending_ = true;
  }

  // MLP block: x += the mixer's output; the post-attention norm of x,
  // projected to gate and up; SwiGLU; down.
  void norm_mlp(Vector norm, const MlpLayer& m) override {
    if (!pending_) fail("CUDA backend: norm_mlp without a pending sublayer output");
    const int64_t T = step_b_->num_tokens, H = cfg_.hidden_size, I = m.down.cols;
    Act* mix = mix_.as<Act>();
    if (!fp8(m.gate_up) && !fp8(m.down)) {
      cuda::add_norm_mlp<Act>(gemm_, rs_, mix, vec(norm), eps(), h_.as<Act>(), mat(m.gate_up),
                              gate_up_.as<Act>(), act_.as<Act>(), mat(m.down), mix, T, I, H,
                              stream_);
    } else {  // FP8 weights: the same steps; SwiGLU in the gate_up launch where it can
      Act* h = h_.as<Act>();
      cuda::add_rmsnorm<Act>(rs_.x, H, mix, H, vec(norm), h, H, T, H, eps(), stream_);
      const cuda::DeviceWeight& gu = weight(m.gate_up);
      // note: only an FP8 gate_up: project() gives it to warp_matmul, whose
      // bits warp_matmul_swiglu keeps (a bf16 one goes to cuBLASLt).
      if (!gu.fp8 || !cuda::warp_matmul_swiglu<Act>(h, H, gu.ref<Act>(), act_.as<Act>(), I, T, I, H,
                                                    stream_)) {
        project(h, H, m.gate_up, gate_up_.as<Act>(), 2 * I, T);
        cuda::swiglu<Act>(gate_up_.as<Act>(), 2 * I, act_.as<Act>(), I, T, I, stream_);
      }
      project(act_.as<Act>(), I, m.down, mix, H, T);
    }
    reduce_pending();
    pending_ = true;
  }

  // Mixture of experts (cuda_moe.h): x += the mixer's output; the
  // post-attention norm of x through the experts.
  void norm_moe(Vector norm, Experts e) override {
    if (!pending_) fail("CUDA backend: norm_moe without a pending sublayer output");
    const int64_t T = step_b_->num_tokens, H = cfg_.hidden_size;
    Act* h = h_.as<Act>();
    cuda::add_rmsnorm<Act>(rs_.x, H, mix_.as<Act>(), H, vec(norm), h, H, T, H, eps(), stream_);
    moe_->forward(weights_.experts(e), h, T, mix_.as<Act>(), gemm_, stream_);
    reduce_pending();
    pending_ = true;
  }

  // note: the CUDA backend has no per-layer activation hook (Model::set_layer_hook).
  void layer_end(int64_t) override {}

  void logits(Vector norm, Matrix lm_head) override {
    if (!pending_) fail("CUDA backend: logits without a pending sublayer output");
    const int64_t T = step_b_->num_tokens, H = cfg_.hidden_size, V = lm_head.rows;
    const DType dt = dtype_of<Act>();
    Act* h = h_.as<Act>();
    // x += the last MLP output; h = the final norm of x.
    cuda::add_rmsnorm<Act>(rs_.x, H, mix_.as<Act>(), H, vec(norm), h, H, T, H, eps(), stream_);
    pending_ = false;
    // Logits only for the last row of each sequence that samples: gather the
    // final-normed rows (embedding_lookup over h as a table), then lm_head.
    const int64_t r = static_cast<int64_t>(logit_rows_.size());
    if (r > 0) {
      cuda::embedding_lookup<Act>(h, dt, H, rows_, r, last_.as<Act>(), H, stream_);
      project<float>(last_.as<Act>(), H, lm_head, logits_.as<float>(), V, r);
      if (greedy_step_) greedy_.argmax(logits_.as<float>(), V, r, stream_);
    }
  }
  // ---- end blocks ----

  // The K/V cache mirrors the scheduler's KvCache geometry (blocks, block
  // size) in device memory, in Act.
  // note: f32 precision keeps f32 K/V as the CPU runtime does (exactness
  // against the float64 goldens); bf16 precision stores bf16 K/V.
  void ensure_kv(const KvCache& kv) {
    if (kv_blocks_ == kv.num_blocks() && kv_block_size_ == kv.block_size()) return;
    kv_blocks_ = kv.num_blocks();
    kv_block_size_ = kv.block_size();
    kv_layer_elems_ = kv_blocks_ * kv_block_size_ * cfg_.kv_dim();
    k_cache_ = DeviceMemory(std::max<int64_t>(attn_layers_, 1) * kv_layer_elems_ * sizeof(Act));
    v_cache_ = DeviceMemory(std::max<int64_t>(attn_layers_, 1) * kv_layer_elems_ * sizeof(Act));
    graphs_.clear();
  }
  Act* kv_k(int64_t layer) { return k_cache_.as<Act>() + layer * kv_layer_elems_; }
  Act* kv_v(int64_t layer) { return v_cache_.as<Act>() + layer * kv_layer_elems_; }

  // Step arrays to the device in one copy; zeroes the state of sequences
  // that start at position 0 (starts_sequence). aligned:
  // StepBatch::aligned_tokens of b (nullptr: none).
  // Layout (int32 units): slot_mapping (int64, first for alignment),
  // token_ids, positions [3][T], q_start, seq_len, block_table, logit rows,
  // then with GDN layers the per-layer state slots [L][S], and in steps with
  // chunked GDN tokens the item arrays.
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
    max_run_ = 0;
    for (int64_t s = 0; s < S; ++s) {
      const int64_t q_len = b.q_start[s + 1] - b.q_start[s];
      max_run_ = std::max(max_run_, q_len);
      const int64_t a = A > 1 && aligned != nullptr ? aligned[s] : 0;
      if (a < 0 || a > q_len || a % A != 0)
        fail(
            "CUDA backend: sequence {} of the step has {} aligned tokens of {} (expected a "
            "multiple of {} up to its tokens)",
            s, a, q_len, A);
      if (a > 0) items_.push_back(static_cast<int32_t>(s));
      for (int64_t t = b.q_start[s] + a; t < b.q_start[s + 1]; ++t)
        tail_rows_host_.push_back(static_cast<int32_t>(t));
      tail_start_host_.push_back(static_cast<int32_t>(tail_rows_host_.size()));
    }
    n_items_ = static_cast<int64_t>(items_.size());
    n_tail_ = static_cast<int64_t>(tail_rows_host_.size());
    const int64_t n_chunk_arrays = n_items_ > 0 ? (L + 2) * n_items_ + 1 + n_tail_ + S + 1 : 0;
    const int64_t n32 =
        2 * T + T + 3 * T + (S + 1) + S + S * b.max_blocks + n_rows + L * S + n_chunk_arrays + T;
    // note: two staging buffers, alternating: with pipelined steps the
    // previous step's copy from its buffer may still be queued.
    cuda::PinnedVector<int32_t>& host_step = host_step_[uploads_++ % 2];
    host_step.resize(n32);
    int32_t* p = host_step.data();
    std::memcpy(p, b.slot_mapping, T * sizeof(int64_t));
    p += 2 * T;
    std::vector<int64_t> offsets;
    auto put = [&](const int32_t* src, int64_t n) {
      offsets.push_back(p - host_step.data());
      std::memcpy(p, src, n * sizeof(int32_t));
      p += n;
    };
    put(b.token_ids, T);
    put(b.positions, 3 * T);
    put(b.q_start, S + 1);
    put(b.seq_len, S);
    put(b.block_table, S * b.max_blocks);
    put(logit_rows_.data(), n_rows);
    offsets.push_back(p - host_step.data());
    for (int64_t gi = 0; gi < L; ++gi)
      for (int64_t s = 0; s < S; ++s) *p++ = static_cast<int32_t>(b.state_slot[s] * L + gi);
    if (n_items_ > 0) {
      offsets.push_back(p - host_step.data());  // [7] item slots per GDN layer
      for (int64_t gi = 0; gi < L; ++gi)
        for (int32_t s : items_) *p++ = static_cast<int32_t>(b.state_slot[s] * L + gi);
      offsets.push_back(p - host_step.data());  // [8] item first rows
      for (int32_t s : items_) *p++ = b.q_start[s];
      offsets.push_back(p - host_step.data());  // [9] item chunk starts (prefix sums)
      n_chunks_ = 0;
      *p++ = 0;
      for (int32_t s : items_) *p++ = static_cast<int32_t>(n_chunks_ += aligned[s] / A);
      put(tail_rows_host_.data(), n_tail_);  // [10]
      put(tail_start_host_.data(), S + 1);   // [11]
    }
    // note: always a feed array (all -1 without one), so that a decode graph
    // captured for a step without fed tokens serves one with them.
    const int64_t feed_at = p - host_step.data();
    if (b.feed != nullptr) {
      put(b.feed, T);
    } else {
      std::fill(p, p + T, -1);
      p += T;
    }
    if (ensure(step_, n32 * sizeof(int32_t))) graphs_.clear();
    if (L > 0) {
      for (int64_t s = 0; s < S; ++s) {
        // (the padding rows' scratch slot is never cleared: their results are dropped)
        if (starts_sequence(b, s) && b.state_slot[s] != slots_) {
          const int64_t slot = b.state_slot[s];
          QTK_CUDA_CHECK(cudaMemsetAsync(conv_state_.as<float>() + slot * L * conv_floats_, 0,
                                         L * conv_floats_ * sizeof(float), stream_));
          QTK_CUDA_CHECK(cudaMemsetAsync(rec_state_.as<float>() + slot * L * rec_floats_, 0,
                                         L * rec_floats_ * sizeof(float), stream_));
        }
      }
    }
    QTK_CUDA_CHECK(cudaMemcpyAsync(step_.as(), host_step.data(), n32 * sizeof(int32_t),
                                   cudaMemcpyHostToDevice, stream_));
    int32_t* base = step_.as<int32_t>();
    feed_ = base + feed_at;
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

  CudaWeights<Act> weights_;
  TpRank tp_;                               // this rank (size 1: the whole model)
  cuda::DeviceCollective* comm_ = nullptr;  // the ranks' all-reduce (tensor parallel)
  std::unique_ptr<Architecture> arch_;
  ModelConfig cfg_;
  const bool chunked_enabled_ = tuning().gdn_chunked;
  cudaStream_t stream_ = nullptr;
  cuda::DecodeGraphs graphs_;
  cuda::PaddedDecode pad_;
  int64_t max_context_ = 0;
  cuda::Gemm gemm_;
  std::optional<cuda::CudaMoe<Act>> moe_;  // mixture-of-experts scratch (MoE models only)
  cuda::RopeParams rope_;
  DeviceMemory rope_table_;  // f32x2 [max_context, rotary_dim / 2] RoPE (cos, sin)
  int64_t attn_layers_ = 0, gdn_layers_ = 0;

  int64_t kv_blocks_ = -1, kv_block_size_ = -1, kv_layer_elems_ = 0;
  DeviceMemory k_cache_, v_cache_;  // Act [attention layers][num_blocks, block_size, Hkv, D]
  // note: f32 state in both precisions: the delta rule accumulates into it
  // over every token of a sequence.
  int64_t slots_ = 0, conv_floats_ = 0, rec_floats_ = 0;
  DeviceMemory conv_state_;  // f32 [slots + 1][GDN layers][conv_dim, K-1]
  DeviceMemory rec_state_;   // f32 [slots + 1][GDN layers][Hv, Dk, Dv]

  // This step, while its blocks run (run_blocks).
  const StepBatch* step_b_ = nullptr;
  int64_t max_seq_len_ = 0;  // attention's context bound (a bucket in graphs)
  bool greedy_step_ = false;
  cuda::ResidualStream<Act> rs_{nullptr, nullptr};
  bool pending_ = false;  // mix_ holds a sublayer output not yet added to x
  int64_t proj_ld_ = 0;   // columns of proj_ (the last norm_project's products)

  // Scratch (T = tokens of the largest step).
  DeviceMemory x_, x2_, h_, mix_;  // Act [T, hidden]: residual (two: cuda::ResidualStream),
                                   // normed input, sublayer output d
  DeviceMemory proj_;              // Act [T, widest input projection]
  DeviceMemory conv_;              // Act [T, conv_dim]
  DeviceMemory core_;              // Act [T, max(Hq*D, Hv*Dv)] attention / GDN output
  DeviceMemory g_, beta_;          // f32 [T, Hv]
  DeviceMemory gate_up_;           // Act [T, 2*intermediate]
  DeviceMemory act_;               // Act [T, intermediate]
  DeviceMemory last_;              // Act [seqs, hidden] rows that get logits
  DeviceMemory logits_;            // f32 [seqs, vocab]
  cuda::GreedyReadback greedy_;    // ids and margins of forward_greedy
  // bf16 steps with chunked GDN tokens: the recurrent kernel's compact batch.
  DeviceMemory tail_conv_;  // Act [T, conv_dim]: q, k, v rows
  DeviceMemory tail_core_;  // Act [T, Hv*Dv]: its output
  DeviceMemory tail_gb_;    // f32 [T, Hv] g, then f32 [T, Hv] beta
  DeviceMemory gdn_ws_;     // the chunked kernel's workspace (T / 64 chunks)
  DeviceMemory partials_;   // f32 attention split workspace (bf16 only), partial_rows_ rows
  int64_t partial_rows_ = 0;
  DeviceMemory step_;                         // int32 step arrays (see upload_step)
  cuda::PinnedVector<int32_t> host_step_[2];  // the step arrays on their way up (alternating)
  int64_t uploads_ = 0;
  const int32_t* feed_ = nullptr;  // the step's StepBatch::feed on the device (-1s without one)
  // Pipelined steps queued and not collected: their readback slot and real rows.
  struct Queued {
    int slot;
    int64_t n;
  };
  std::deque<Queued> queued_;
  int64_t submitted_ = 0;
  std::vector<int32_t> logit_rows_;
  // This step's chunked GDN items (sequence indices) and the other rows.
  std::vector<int32_t> items_, tail_rows_host_, tail_start_host_;
  int64_t n_items_ = 0, n_tail_ = 0, n_chunks_ = 0;
  int64_t max_run_ = 0;  // the most tokens of one sequence in the step
  const int32_t *item_slots_ = nullptr, *item_first_ = nullptr, *item_chunk_start_ = nullptr,
                *tail_rows_ = nullptr, *tail_start_ = nullptr;
  const int64_t* slot_mapping_ = nullptr;
  const int32_t *token_ids_ = nullptr, *positions_ = nullptr, *q_start_ = nullptr,
                *seq_len_ = nullptr, *block_table_ = nullptr, *rows_ = nullptr,
                *layer_slots_ = nullptr;
};

std::unique_ptr<CudaModel> make_cuda_model(const Pack& pack, CudaPrecision precision, TpRank tp,
                                           cuda::DeviceCollective* comm) {
  const ModelConfig& c = pack.config();
  if (c.arch == Arch::kQwen3_5 && c.norm_adds_one && !pack.has_transform("norm_plus_one_folded"))
    fail(
        "{}: Qwen3.5 pack without the 'norm_plus_one_folded' transform; the CUDA backend "
        "computes x * rsqrt(..) * w and needs the norms stored as 1 + w (re-run convert)",
        pack.path());
  if (precision == CudaPrecision::kF32) return std::make_unique<CudaBackend<float>>(pack, tp, comm);
  return std::make_unique<CudaBackend<bf16>>(pack, tp, comm);
}

}  // namespace

CudaPrecision parse_cuda_precision(const std::string& text) {
  if (text == "f32") return CudaPrecision::kF32;
  if (text == "bf16") return CudaPrecision::kBF16;
  fail("--precision: expected f32 or bf16, got '{}'", text);
}

bool cuda_device_available() { return cuda_visible_device_count() > 0; }

int cuda_visible_device_count() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

std::string cuda_device_name() {
  int dev = 0;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess)
    return "unknown CUDA device";
  return fmt::format("{} (sm_{}{})", prop.name, prop.major, prop.minor);
}

std::unique_ptr<CudaModel> load_cuda_model(const Pack& pack, CudaPrecision precision, TpRank tp,
                                           cuda::DeviceCollective* comm) {
  if (!cuda_device_available()) fail("--device cuda: no CUDA device is available");
  using Clock = std::chrono::steady_clock;
  auto since = [](Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
  };
  // note: cudaFree(nullptr) creates the context now, so that its cost is
  // reported apart from the upload's.
  const auto t0 = Clock::now();
  QTK_CUDA_CHECK(cudaFree(nullptr));
  const double init = since(t0);
  const ProcessMemory after_init = process_memory();
  const auto t1 = Clock::now();
  auto model = make_cuda_model(pack, precision, tp, comm);
  CudaLoadTimes& lt = model->load_times;
  lt.init_seconds = init;
  lt.upload_seconds = since(t1);
  const ProcessMemory after_upload = process_memory();
  lt.rss_after_init_bytes = after_init.rss_bytes;
  lt.rss_after_upload_bytes = after_upload.rss_bytes;
  lt.anon_after_upload_bytes = after_upload.anon_bytes;
  lt.file_after_upload_bytes = after_upload.file_bytes;
  return model;
}

}  // namespace qtk
